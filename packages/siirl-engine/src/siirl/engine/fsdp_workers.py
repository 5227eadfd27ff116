"""The spec's path of the FSDP worker: the ``fsdp`` engine plugin lives in
:mod:`siirl.engine.fsdp.engines` (entry point ``siirl.engines: fsdp``)."""

from siirl.engine.fsdp.engines import fsdp_actor, fsdp_critic, fsdp_engine, fsdp_reference

__all__ = ["fsdp_actor", "fsdp_critic", "fsdp_engine", "fsdp_reference"]
