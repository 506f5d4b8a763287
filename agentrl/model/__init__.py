"""The policy model: loading, per-token logprobs, packing, precision, LoRA, activation checkpointing,
sharding and the processes that train it."""
