"""The training loop: building a run, the rollout and learning phases, the batches of a step (collected
now or ahead by a rollout thread), evaluation, saving and interrupts."""
