"""The run directory on disk: its location and lock, checkpoint and state file formats, metrics and plots."""
