"""Sampling: the generation engine interface, the request queue episodes share, and token-exact chats."""
