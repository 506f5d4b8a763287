"""RL algorithms: the ``Algorithm`` base, loss objectives, the clipped-policy and group-relative families,
dynamic sampling and the reference reset."""
