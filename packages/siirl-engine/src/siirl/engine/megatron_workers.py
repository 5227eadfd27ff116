"""The spec's path of the Megatron worker: the ``megatron`` engine plugin lives in
:mod:`siirl.engine.megatron.engines` (entry point ``siirl.engines: megatron``); importing
this module imports megatron-core, so without the ``[megatron]`` extra the plugin registry
reports ``pip install "siirl-engine[megatron]"``."""

from siirl.engine.megatron.engines import megatron_engine
from siirl.engine.megatron.heads import megatron_logprobs
from siirl.engine.megatron.setup import build_megatron_model, init_megatron

__all__ = ["build_megatron_model", "init_megatron", "megatron_engine", "megatron_logprobs"]
