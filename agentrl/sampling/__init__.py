"""Sampling: the generation engine interface (and its version-stamping wrapper for asynchronous runs), the
rollout contract, the request queue episodes share, and token-exact chats."""
