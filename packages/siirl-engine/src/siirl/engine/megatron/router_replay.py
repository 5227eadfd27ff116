"""verl's MoE router replay, mode R2, on the megatron actor (``actor.router_replay.mode``).

The old-log-prob pass records, per token and MoE layer, the experts megatron's router chose
(its ``RouterReplay``, built into each router with ``moe_enable_routing_replay``); the update's
forwards then route every token through those same experts while the routing weights are
computed afresh from the live router (so the router still learns). Without it, an update
that has moved the router scores a token through other experts than the policy that
sampled it, and the importance ratio compares two different sub-networks.

Where the planner leaves the old-log-prob pass out (``siirl.engine.actor.on_policy``: each
row is forwarded once, by the policy that gave its old log-probs) there is nothing to
replay and the update routes as it is.

Layout: the router sees a micro-batch's tokens sequence-major (``[S, B]`` flattened, after
the schedule's left padding); with sequence parallelism (tensor parallelism on an MoE
model) TP rank r sees the r-th contiguous slice of the sequence, so the slices are gathered
over the TP group to record and each rank replays its own. The batch keeps the routing per
row, ``[B, S, layers, top-k]``, as uint8 (int16 above 256 experts), the same on every TP
rank, so rows can be regrouped into other micro-batches for the update. A packed
micro-batch (``use_remove_padding``: one row of its rows' attended tokens, filled to a TP
multiple) is recorded as that row and put back at each token's place in the padded rows;
its replay gathers the rows' routing at the attended tokens in the same order. With
pipeline stages each stage records and replays its own MoE layers around its forward of
each micro-batch (:func:`~siirl.engine.megatron.pipeline.run_pipeline`'s
``around_forward``); after a forward-only pass the stages' layers are gathered, so every
stage keeps the whole routing (every worker of a pipeline hands the same rows on). With
virtual pipeline stages each chunk does so for its own layers.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Optional

import torch

from siirl.data_coordinator.fields import ROUTED_EXPERTS
from siirl.engine.megatron.packing import ROW_MASK

__all__ = ["ROUTED_EXPERTS", "RoutingReplay", "replay_settings"]


class RoutingReplay:
    """Records the routers' choices in forward-only passes and replays them in the
    micro-batches of an update. The routing's layer axis runs over the whole model's MoE
    layers in their order: virtual stage ``chunk * PP + stage`` after virtual stage."""

    def __init__(self, model: torch.nn.Module, num_experts: int, top_k: int,
                 tp_group: Any = None, pp_group: Any = None):
        from siirl.engine.megatron.chunks import model_chunks
        from siirl.engine.megatron.model import unwrap_model

        self.top_k = top_k
        chunks = model_chunks(model)
        self.chunk_of = {id(unwrap_model(chunk)): index for index, chunk in enumerate(chunks)}
        self.chunk_replays = [[m.router_replay for m in chunk.modules()
                               if getattr(m, "router_replay", None) is not None]
                              for chunk in chunks]
        self.replays = [replay for replays in self.chunk_replays for replay in replays]
        # every stage's MoE layers per chunk, and where each (stage, chunk) starts
        counts = [len(replays) for replays in self.chunk_replays]
        self.pp_group, self.stage, self.table = pp_group, 0, [counts]
        if pp_group is not None:
            self.stage = torch.distributed.get_rank(pp_group)
            self.table = [None] * torch.distributed.get_world_size(pp_group)
            torch.distributed.all_gather_object(self.table, counts, group=pp_group)
        self.first, self.layers = {}, 0
        for chunk in range(len(counts)):
            for stage, stage_counts in enumerate(self.table):
                self.first[stage, chunk] = self.layers
                self.layers += stage_counts[chunk]
        # sequence parallelism: this rank's routers see 1 / TP of each sequence
        self.tp_group = tp_group
        self.tp_size = torch.distributed.get_world_size(tp_group) if tp_group is not None else 1
        self.tp_rank = torch.distributed.get_rank(tp_group) if tp_group is not None else 0
        if not self.layers:
            raise ValueError("router replay needs a model built with moe_enable_routing_replay")
        self.dtype = torch.uint8 if num_experts <= 256 else torch.int16
        self._recorded: Optional[torch.Tensor] = None

    @contextlib.contextmanager
    def _acting(self, action: str, replays: List[Any]) -> Iterator[None]:
        """Within: the ``replays``' routers record (``"RECORD"``) or replay their target
        indices (``"REPLAY_FORWARD"``); after, they route as usual and hold no indices."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        for replay in replays:
            replay.set_router_replay_action(RouterReplayAction[action])
        try:
            yield
        finally:
            for replay in replays:
                replay.clear_router_replay_action()
                replay.clear_indices()

    def recording(self, chunk: int = 0) -> contextlib.AbstractContextManager:
        """Within: ``chunk``'s routers record; :meth:`record_micro_batch` reads them."""
        return self._acting("RECORD", self.chunk_replays[chunk])

    def record_micro_batch(self, batch: dict, parts: List[torch.Tensor], chunk: int = 0
                           ) -> None:
        """After ``chunk``'s forward of schedule dict ``batch``: its rows' routing through
        the chunk's layers as one ``[B, S, L, k]`` part (a packed row's put back in its
        padded rows)."""
        rows = batch["input_ids"].shape[0]
        recorded = [replay.get_recorded_indices() for replay in self.chunk_replays[chunk]]
        # [S*B, k] sequence-major -> [S, B, k] (the whole sequence) -> [B, S, k]
        per_layer = [self._whole_sequence(idx.reshape(-1, rows, idx.shape[-1]))
                     .transpose(0, 1) for idx in recorded]
        if per_layer:
            routing = torch.stack(per_layer, dim=2).to(self.dtype).cpu()
        else:  # a chunk of dense layers only
            routing = torch.empty((rows, batch["input_ids"].shape[1], 0, self.top_k),
                                  dtype=self.dtype)
        if ROW_MASK in batch:
            routing = unpacked_routing(routing[0], batch[ROW_MASK].cpu())
        parts.append(routing)

    def replaying(self, routed: torch.Tensor, batch: Optional[dict] = None, chunk: int = 0
                  ) -> contextlib.AbstractContextManager:
        """Within: ``chunk``'s forward of the micro-batch (schedule dict ``batch``; None:
        padded) whose rows' routing is ``routed`` ``[B, S, L, k]`` routes through it."""
        batch = batch or {}
        if ROW_MASK in batch:
            routed = packed_routing(routed, batch[ROW_MASK].cpu(), batch["input_ids"].shape[1])
        if routed.shape[2] != self.layers:
            raise ValueError(f"{ROUTED_EXPERTS} holds {routed.shape[2]} MoE layers, the model "
                             f"{self.layers}")
        replays = self.chunk_replays[chunk]
        first = self.first[self.stage, chunk]
        for layer, replay in enumerate(replays):
            # [B, S, k] -> this rank's slice of the sequence -> sequence-major [S*B, k]
            tokens = routed[:, :, first + layer].transpose(0, 1)
            step = tokens.shape[0] // self.tp_size
            tokens = tokens[self.tp_rank * step:(self.tp_rank + 1) * step]
            replay.set_target_indices(tokens.reshape(-1, routed.shape[-1]).long())
        return self._acting("REPLAY_FORWARD", replays)

    def _whole_sequence(self, local: torch.Tensor) -> torch.Tensor:
        """``[S / TP, B, k]`` of this rank -> ``[S, B, k]`` (the TP ranks' slices in order)."""
        if self.tp_size == 1:
            return local
        parts = [torch.empty_like(local) for _ in range(self.tp_size)]
        torch.distributed.all_gather(parts, local.contiguous(), group=self.tp_group)
        return torch.cat(parts)

    def new_record(self) -> List[List[torch.Tensor]]:
        """Where a forward-only pass records: one list of parts per chunk."""
        return [[] for _ in self.chunk_replays]

    def keep(self, parts: List[List[torch.Tensor]], rows: int,
             restore: Optional[torch.Tensor] = None) -> None:
        """A forward-only pass's routing (``rows`` rows, in plan order undone by
        ``restore``) with every stage's layers (collective over the pipeline stages)."""
        local = [torch.cat(chunk_parts)[:rows] for chunk_parts in parts]
        if restore is not None:
            local = [routing[restore] for routing in local]
        pieces = {(self.stage, chunk): routing for chunk, routing in enumerate(local)}
        if self.pp_group is not None:
            for chunk, routing in enumerate(local):
                # stages may hold different numbers of MoE layers: pad to the most
                most = max(counts[chunk] for counts in self.table)
                mine = torch.nn.functional.pad(routing, (0, 0, 0, most - routing.shape[2]))
                stages = [torch.empty_like(mine) for _ in self.table]
                torch.distributed.all_gather(stages, mine.contiguous(), group=self.pp_group)
                for stage, part in enumerate(stages):
                    pieces[stage, chunk] = part[:, :, :self.table[stage][chunk]]
        self._recorded = torch.cat([pieces[key] for key in sorted(
            pieces, key=lambda key: self.first[key])], dim=2)

    def take(self) -> Optional[torch.Tensor]:
        """The last forward-only pass's routing, ``[B, S, L, k]`` in the batch's row order."""
        routing, self._recorded = self._recorded, None
        return routing

    def around_forward(self, parts: Optional[List[List[torch.Tensor]]]) -> Any:
        """``run_pipeline``'s ``around_forward``: each chunk's forward of a micro-batch
        records its routing into ``parts`` (a forward-only pass, :meth:`new_record`), or
        replays the micro-batch's ``routed_experts`` (an update)."""
        from siirl.engine.megatron.model import unwrap_model

        @contextlib.contextmanager
        def around(batch: dict, module: torch.nn.Module) -> Iterator[None]:
            chunk = self.chunk_of[id(unwrap_model(module))]
            if parts is not None:
                with self.recording(chunk):
                    yield
                    self.record_micro_batch(batch, parts[chunk], chunk)
            elif ROUTED_EXPERTS in batch:
                with self.replaying(batch[ROUTED_EXPERTS], batch, chunk):
                    yield
            else:
                yield
        return around


def _unused_experts(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """Routing for tokens nothing reads (padding, filler): experts 0..k-1, distinct as a
    router's top-k."""
    return torch.arange(shape[-1], dtype=dtype).expand(shape).clone()


def unpacked_routing(packed: torch.Tensor, row_mask: torch.Tensor) -> torch.Tensor:
    """A packed row's routing ``[T, L, k]`` (attended tokens, then filler) -> ``[B, S, L, k]``
    at each token's place in the padded rows of ``row_mask``."""
    out = _unused_experts((*row_mask.shape, *packed.shape[1:]), packed.dtype)
    attended = row_mask.ne(0)
    out[attended] = packed[:int(attended.sum())]
    return out


def packed_routing(routed: torch.Tensor, row_mask: torch.Tensor, length: int) -> torch.Tensor:
    """The padded rows' routing ``[B, S, L, k]`` -> the packed row's ``[1, length, L, k]``
    (the attended tokens in row-major order, then filler)."""
    tokens = routed[row_mask.ne(0)]
    filler = _unused_experts((length - tokens.shape[0], *tokens.shape[1:]), tokens.dtype)
    return torch.cat([tokens, filler])[None]


def replay_settings(cfg: Any, hf_config: Any, overrides: dict) -> bool:
    """Whether the actor replays its routing (``router_replay.mode=R2``); adds megatron's
    ``moe_enable_routing_replay`` to the TransformerConfig ``overrides`` then."""
    from siirl.engine.megatron.moe import is_moe
    from siirl.errors import ConfigError

    key = "actor_rollout_ref.actor.router_replay.mode"
    if str(cfg.actor_rollout_ref.actor.router_replay.mode) != "R2":
        return False
    if not is_moe(hf_config):
        raise ConfigError(f"{key}=R2: the model ({hf_config.model_type}) has no router to "
                          "replay; leave the mode disabled for a dense model.")
    if overrides.get("recompute_granularity"):
        raise ConfigError(f"{key}=R2 with activation recompute (override_transformer_config."
                          "recompute_granularity): the recomputed forward would route afresh; "
                          "use one or the other.")
    overrides["moe_enable_routing_replay"] = True
    return True
