"""The MoE router's auxiliary losses, as set by verl's keys and logged as actor metrics.

verl configures them through ``<role>.megatron.override_transformer_config`` (applied by
:mod:`siirl.engine.megatron.transformer_overrides`); the router's keys
(:data:`ROUTER_OVERRIDE_KEYS`) are checked here: ``moe_aux_loss_coeff`` and
``moe_router_load_balancing_type`` (megatron's load-balancing loss, added to the gradient
by its ``MoEAuxLossAutoScaler``) and ``moe_z_loss_coeff`` (the router z-loss).

Megatron records each MoE layer's unscaled loss in its layer-wise tracker
(``moe_utils.get_moe_layer_wise_logging_tracker``) during training forwards;
:class:`RouterLossLog` reads it after each optimizer step's micro-batches as megatron's
``track_moe_metrics`` does (reduced over pipeline stages and data parallelism, summed over
layers / MoE layers, averaged over micro-batches) and reports the mean over the update's
steps as ``<prefix>/moe_aux_loss`` and ``<prefix>/moe_z_loss``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, List

from siirl.engine.megatron.config import ROUTER_OVERRIDE_KEYS
from siirl.errors import ConfigError

# megatron's load-balancing losses (CPU-capable ones) and the router z-loss
LOAD_BALANCING_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")
# tracker name -> metric name
_TRACKED = {"load_balancing_loss": "moe_aux_loss", "seq_load_balancing_loss": "moe_aux_loss",
            "global_load_balancing_loss": "moe_aux_loss", "z_loss": "moe_z_loss"}


def router_overrides(overrides: Any, is_moe: bool, key: str) -> Dict[str, Any]:
    """The router's TransformerConfig keys of ``<role>.megatron.override_transformer_config``
    (``key``; the others are :func:`siirl.engine.megatron.transformer_overrides`'), checked;
    a coefficient without a load-balancing type selects megatron's ``aux_loss`` (HF's
    Switch-Transformer loss)."""
    given = {k: v for k, v in dict(overrides or {}).items() if k in ROUTER_OVERRIDE_KEYS}
    if not given:
        return {}
    if not is_moe:
        raise ConfigError(f"{key}: {', '.join(sorted(given))} configure a mixture-of-experts "
                          "router, and the model has none (a dense model); remove them.")
    kind = given.get("moe_router_load_balancing_type")
    if kind is not None and kind not in LOAD_BALANCING_TYPES:
        raise ConfigError(f"{key}.moe_router_load_balancing_type={kind!r}: use one of "
                          f"{', '.join(LOAD_BALANCING_TYPES)} (sinkhorn balancing is not "
                          "wired here).")
    for name in ("moe_aux_loss_coeff", "moe_z_loss_coeff"):
        if name in given and given[name] is not None:
            if float(given[name]) < 0:
                raise ConfigError(f"{key}.{name}={given[name]} must be >= 0")
            given[name] = float(given[name])
    if kind is None and given.get("moe_aux_loss_coeff"):
        given["moe_router_load_balancing_type"] = "aux_loss"
    return given


class RouterLossLog:
    """The router losses of each optimizer step's micro-batches, until the update reports."""

    def __init__(self, moe_layer_freq: Any = 1) -> None:
        self.steps: List[Dict[str, float]] = []
        self.moe_layer_freq = moe_layer_freq  # the model's pattern of expert layers

    def moe_layers(self, layers: int) -> int:
        """How many of ``layers`` are expert layers (megatron's ``moe_layer_freq``)."""
        if isinstance(self.moe_layer_freq, int):
            return len(range(0, layers, self.moe_layer_freq))
        return max(1, sum(int(x) for x in self.moe_layer_freq))

    def record(self, num_micro_batches: int) -> None:
        """Read and clear megatron's tracker (collective over pipeline stages and data
        parallelism; every rank of the run calls it after the same micro-batches)."""
        from megatron.core.transformer.moe.moe_utils import (
            clear_aux_losses_tracker,
            get_moe_layer_wise_logging_tracker,
            reduce_aux_losses_tracker_across_ranks,
        )

        tracker = get_moe_layer_wise_logging_tracker()
        names = sorted(name for name in tracker if name in _TRACKED)
        if not names:
            return
        reduce_aux_losses_tracker_across_ranks(names)
        step: Dict[str, float] = defaultdict(float)
        for name in names:
            values = tracker[name]["values"]  # one entry per layer; dense layers stay 0
            step[_TRACKED[name]] += float(values.sum()) / self.moe_layers(values.numel()) \
                / num_micro_batches
        clear_aux_losses_tracker()
        self.steps.append(dict(step))

    def take(self, prefix: str) -> Dict[str, float]:
        """``<prefix>/moe_aux_loss`` (and ``moe_z_loss``): means over the recorded steps."""
        sums: Dict[str, List[float]] = defaultdict(list)
        for step in self.steps:
            for name, value in step.items():
                sums[name].append(value)
        self.steps = []
        return {f"{prefix}/{name}": sum(values) / len(values) for name, values in sums.items()}
