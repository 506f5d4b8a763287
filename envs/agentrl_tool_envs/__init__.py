"""agentrl built-in plugin (being written)."""
