"""The ``fsdp`` training backend: torch modules, plain in one process, FSDP2-sharded over
a process group otherwise. Entry point ``siirl.engines: fsdp`` is
:func:`siirl.engine.fsdp.engines.fsdp_engine` (also at ``siirl.engine.fsdp_workers``)."""
