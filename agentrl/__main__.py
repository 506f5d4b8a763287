"""``python -m agentrl ...`` runs the CLI (``accelerate launch -m agentrl train ...`` uses this)."""

from agentrl.cli.app import app

if __name__ == "__main__":
    app(prog_name="agentrl")
