"""The ``agentrl`` command: thin commands that parse, call the library and print."""
