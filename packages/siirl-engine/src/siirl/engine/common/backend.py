"""The verbs a training backend offers the role engines (actor, critic, reference).

A backend owns a model and how it runs: FSDP2 over torch modules (``siirl.engine.fsdp``)
or megatron-core's pipeline schedule (``siirl.engine.megatron``). What a role computes is
handed in: a :class:`Head` (the model's named outputs for a micro-batch: log-probs and
entropy, or values) and a loss function. So the PPO update loop
(:mod:`siirl.engine.common.ppo_update`) is written once for every role and backend.
"""

from __future__ import annotations

import functools
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict, Optional, Protocol, Tuple, TypeVar

import torch

from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    INPUT_IDS,
    POSITION_IDS,
    RESPONSES,
    ROUTED_EXPERTS,
    model_extra_inputs,
)

# what a head reads of a batch: the sequences and where the response starts
FORWARD_KEYS = (INPUT_IDS, ATTENTION_MASK, POSITION_IDS, RESPONSES)


def forward_keys(batch: Any, keys: tuple = FORWARD_KEYS) -> tuple:
    """``keys`` and the extra model inputs the batch carries (a VLA's images)."""
    return tuple(keys) + tuple(k for k in model_extra_inputs if k in batch.keys())


def take_routing(backend: Any) -> Optional[torch.Tensor]:
    """The routing a backend recorded in its last forward-only pass (router replay R2:
    ``[B, S, layers, top-k]``, siirl.engine.megatron.router_replay), else None."""
    routing = getattr(backend, "routing", None)
    return routing.take() if routing is not None else None


def keep_routing(batch: Any, backend: Any) -> None:
    """Put the routing of the forward-only pass just run into ``batch`` (if any)."""
    routing = take_routing(backend)
    if routing is not None:
        batch.set(ROUTED_EXPERTS, routing)


def holding(backend: Any) -> ContextManager:
    """What an engine verb runs in: a backend that offloads between verbs (megatron's
    param / grad / optimizer offload) parks what its verbs fetched when the outermost engine
    verb ends; other backends keep everything where it is."""
    hold = getattr(backend, "holding", None)
    return hold() if hold is not None else nullcontext()


Verb = TypeVar("Verb", bound=Callable[..., Any])


def engine_verb(method: Verb) -> Verb:
    """An engine method (of an object with ``backend``) run inside :func:`holding`."""
    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with holding(self.backend):
            return method(self, *args, **kwargs)
    return run  # type: ignore[return-value]


# head(module, micro_batch) -> {name: [rows, response_length] tensor or None}
HeadFn = Callable[[torch.nn.Module, Any], Dict[str, Optional[torch.Tensor]]]
# loss(micro_batch, outputs) -> this micro-batch's share of the mini-batch loss
MicroLoss = Callable[[Any, Dict[str, torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class Head:
    """What the model computes for a micro-batch: ``fn`` returns the ``outputs`` (fp32,
    ``[rows, response_length]`` each) read from the batch's ``input_ids``,
    ``attention_mask`` and ``position_ids``."""

    fn: HeadFn
    outputs: Tuple[str, ...]


class TrainBackend(Protocol):
    """``module`` is what trains (its ``train()``/``eval()`` set the mode); ``device``
    where micro-batches go; ``dp_size``/``dp_group`` the data-parallel ranks over which
    loss normalisers and metrics are summed."""

    module: torch.nn.Module
    optimizer: Any
    device: torch.device
    dp_size: int
    dp_group: Any

    def forward_backward_batch(self, data: Any, micro_rows: int, head: Head,
                               loss_fn: Optional[MicroLoss] = None,
                               forward_only: bool = False) -> Optional[Dict[str, torch.Tensor]]:
        """Run ``data`` in micro-batches of ``micro_rows`` rows. ``forward_only``: return
        the head's outputs for all rows, on the CPU, on every rank. Otherwise backward
        ``loss_fn(micro_batch, outputs)`` of each micro-batch (gradients accumulate)."""

    def zero_grad(self) -> None: ...

    def optimizer_step(self) -> float:
        """Reduce and clip gradients, step; the global grad norm (not finite: the step
        was skipped and the gradients dropped)."""

    def share_metrics(self, metrics: Dict[str, float]) -> Dict[str, float]:
        """The metrics every rank should report (pipeline stages take the last one's)."""


def concat_outputs(parts: list, names: Tuple[str, ...]) -> Dict[str, torch.Tensor]:
    """Per-micro-batch outputs joined along the rows, on the CPU."""
    return {name: torch.cat([part[name] for part in parts]).cpu() for name in names}
