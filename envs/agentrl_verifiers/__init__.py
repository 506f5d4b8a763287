"""Adapter for the verifiers environment library (work in progress; registers nothing yet)."""
