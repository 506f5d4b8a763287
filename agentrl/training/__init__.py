"""The training loop: building a run, the rollout and learning phases, asynchronous rollouts, evaluation,
saving and interrupts."""
