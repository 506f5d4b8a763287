"""The run config: ``TrainConfig``, the LoRA section, and the rules and checks every config value passes."""
