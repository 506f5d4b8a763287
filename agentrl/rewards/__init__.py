"""Rewards: reward specs and schemes, scoring trajectories, and process (step-level) rewards."""
