"""Heavy runs the README's test command leaves to a nox session, so CI stays fast.

``megatron_full`` marks multi-worker megatron runs whose path a faster test of the same
file already covers in process or over gloo; ``SIIRL_MEGATRON=all`` (``nox -s megatron``)
runs them too.

``learning_full`` marks the learning controls' full runs (a coin-flip reward, permuted
actions, over the presets' own step counts); ``SIIRL_LEARNING=all`` (``nox -s
learning_controls``) runs them, the default ``pytest`` their short versions.

``smollm2_full`` marks the SmolLM2 preset's checkpoint, bitwise-resume and export check
(two runs that each save 1.6 GB of checkpoints); ``SIIRL_SMOLLM2=all`` (``nox -s smollm2``)
runs it, the default ``pytest`` the preset's 2 steps."""

import os

import pytest

MEGATRON_ALL = os.environ.get("SIIRL_MEGATRON") == "all"
megatron_full = pytest.mark.skipif(
    not MEGATRON_ALL, reason="a multi-worker megatron run: SIIRL_MEGATRON=all (nox -s megatron)")

LEARNING_ALL = os.environ.get("SIIRL_LEARNING") == "all"
learning_full = pytest.mark.skipif(
    not LEARNING_ALL, reason="a full learning-control run: SIIRL_LEARNING=all "
    "(nox -s learning_controls)")

SMOLLM2_ALL = os.environ.get("SIIRL_SMOLLM2") == "all"
smollm2_full = pytest.mark.skipif(
    not SMOLLM2_ALL, reason="SmolLM2 checkpoint, resume and export: SIIRL_SMOLLM2=all "
    "(nox -s smollm2)")
