"""Rollout (generation) engines; ``hf`` is the built-in transformers sampler."""
