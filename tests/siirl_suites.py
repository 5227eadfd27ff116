"""Heavy runs the README's test command leaves to a nox session, so CI stays fast.

``megatron_full`` marks multi-worker megatron runs whose path a faster test of the same
file already covers in process or over gloo; ``SIIRL_MEGATRON=all`` (``nox -s megatron``)
runs them too."""

import os

import pytest

MEGATRON_ALL = os.environ.get("SIIRL_MEGATRON") == "all"
megatron_full = pytest.mark.skipif(
    not MEGATRON_ALL, reason="a multi-worker megatron run: SIIRL_MEGATRON=all (nox -s megatron)")
