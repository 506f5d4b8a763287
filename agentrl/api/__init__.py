"""The Python API: :func:`agentrl.train` and :class:`agentrl.Trainer` (the CLI is a layer over it)."""
