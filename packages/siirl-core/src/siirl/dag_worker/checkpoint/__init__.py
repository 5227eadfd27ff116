"""Checkpoints: saving and resuming a run (manager), its files' manifest, the trainer state,
the storage checks, and their errors (which the engines raise too)."""
