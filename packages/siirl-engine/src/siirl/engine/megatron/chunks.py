"""Virtual pipeline parallelism: the model chunks one pipeline rank holds.

With ``virtual_pipeline_model_parallel_size = V`` the model is cut into ``P * V`` virtual
stages; pipeline rank ``r`` holds chunks ``c = 0 .. V-1``, chunk ``c`` being virtual stage
``c * P + r`` (megatron's interleaved 1F1B schedule runs them). :class:`ModelChunks` keeps
the chunks together as one module, so the engines' optimizer, gradient averaging, norm
clipping and checkpointing see all of them, and the bridge and the pipeline schedule can ask
for the list.
"""

from __future__ import annotations

from typing import Any

import torch


class ModelChunks(torch.nn.ModuleList):
    """This rank's GPTModel chunks in schedule order."""

    @property
    def chunks(self) -> list[torch.nn.Module]:
        return list(self)

    def virtual_stage(self, chunk: int) -> tuple[int, int]:
        """(virtual stage index, number of virtual stages) of ``chunk`` on this rank."""
        from megatron.core import parallel_state as ps

        pp = ps.get_pipeline_model_parallel_world_size()
        return chunk * pp + ps.get_pipeline_model_parallel_rank(), pp * len(self)

    def sharded_state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        # sharded tensors carry global layer offsets, so a checkpoint written with chunks
        # loads into a model without them (and back): dist_checkpointing matches by key
        return {f"chunk{i}": chunk.sharded_state_dict(*args, **kwargs)
                for i, chunk in enumerate(self)}

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True):
        if not all(f"chunk{i}" in state_dict for i in range(len(self))):
            return super().load_state_dict(state_dict, strict)
        for i, chunk in enumerate(self):
            chunk.load_state_dict(state_dict[f"chunk{i}"], strict=strict)
        return None


def model_chunks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The chunks of ``model`` (a ModelChunks, or a single stage as a one-item list)."""
    return model.chunks if isinstance(model, ModelChunks) else [model]


def stage_of(model: torch.nn.Module, chunk: int) -> tuple[int, int]:
    """(stage index, number of stages) that the bridge maps ``chunk`` of ``model`` to."""
    if isinstance(model, ModelChunks):
        return model.virtual_stage(chunk)
    from megatron.core import parallel_state as ps

    return ps.get_pipeline_model_parallel_rank(), ps.get_pipeline_model_parallel_world_size()
