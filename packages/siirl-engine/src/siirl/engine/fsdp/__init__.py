"""The ``fsdp`` training backend: torch modules, plain in one process, FSDP2-sharded over
a process group otherwise. Entry point ``siirl.engines: fsdp`` is the light
:func:`siirl.engine.fsdp_workers.fsdp_engine`, which builds with
:func:`siirl.engine.fsdp.engines.fsdp_engine`."""
