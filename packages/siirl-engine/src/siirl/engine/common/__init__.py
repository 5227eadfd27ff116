"""What every backend shares: run settings (device, seed, typed config), optimizers and lr
schedules, checkpoint I/O, micro-batched PPO updates, gradient and metric reductions,
weight export in buckets. Nothing here imports a backend (``fsdp``, ``megatron``,
``rollout``)."""
