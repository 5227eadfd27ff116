"""verl's ``<role>.megatron.override_transformer_config``: megatron ``TransformerConfig``
fields set on top of the config the bridge derives from the Hugging Face model.

Any field of megatron-core's ``TransformerConfig`` may be set (activation recompute:
``recompute_granularity``, ``recompute_method``, ``recompute_num_layers``,
``recompute_modules``; fusions; ``attention_backend``, by name; dropout; the MoE router's
settings and losses, checked by :func:`siirl.engine.megatron.router_loss.router_overrides`),
except the ones that define the weights or the parallel layout
(:data:`siirl.engine.megatron.config.DERIVED_TRANSFORMER_KEYS`: the validation pass refuses
those before anything loads). A name that is no field is refused here, with the closest
field names.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
from typing import Any, Dict

from siirl.engine.megatron.config import DERIVED_TRANSFORMER_KEYS, ROUTER_OVERRIDE_KEYS
from siirl.engine.megatron.router_loss import router_overrides
from siirl.errors import ConfigError

__all__ = ["optimizer_overrides", "transformer_overrides"]

# OptimizerConfig fields siiRL sets from the role's own keys (optim.*, grad_clip,
# megatron.dtype, megatron.use_distributed_optimizer): not for override_optimizer_config
OWN_OPTIMIZER_KEYS = ("optimizer", "lr", "min_lr", "weight_decay", "adam_beta1", "adam_beta2",
                      "clip_grad", "params_dtype", "bf16", "fp16", "use_distributed_optimizer",
                      "decoupled_weight_decay")


def _field_types() -> Dict[str, Any]:
    from megatron.core.transformer import TransformerConfig

    return {f.name: f.type for f in dataclasses.fields(TransformerConfig)}


def _converted(name: str, value: Any, kind: Any, key: str) -> Any:
    """YAML gives enum-typed fields (``attention_backend``) as names: the enum member."""
    if isinstance(kind, type) and issubclass(kind, enum.Enum) and isinstance(value, str):
        try:
            return kind[value]
        except KeyError:
            raise ConfigError(f"{key}.{name}={value!r}: use one of "
                              f"{', '.join(m.name for m in kind)}") from None
    return value


def transformer_overrides(overrides: Any, is_moe: bool, key: str) -> Dict[str, Any]:
    """The TransformerConfig fields of ``overrides`` (the mapping at ``key``), checked."""
    given = dict(overrides or {})
    derived = sorted(set(given) & set(DERIVED_TRANSFORMER_KEYS))
    if derived:  # the validation pass refuses these first; here for engines built directly
        raise ConfigError(f"{key}: {', '.join(derived)} define the model's weights or its "
                          "parallel layout, which come from the Hugging Face config and the "
                          "megatron section's own keys: change them there.")
    router = router_overrides({k: v for k, v in given.items() if k in ROUTER_OVERRIDE_KEYS},
                              is_moe, key)
    fields = _field_types()
    rest = {k: v for k, v in given.items() if k not in ROUTER_OVERRIDE_KEYS}
    _refuse_unknown(rest, fields, key, "TransformerConfig")
    return {**{name: _converted(name, value, fields[name], key)
               for name, value in rest.items()}, **router}


def optimizer_overrides(overrides: Any, key: str) -> Dict[str, Any]:
    """The megatron ``OptimizerConfig`` fields of verl's ``<role>.optim.
    override_optimizer_config`` (``key``), checked: not those siiRL sets from the role's own
    keys, nor a name that is no field."""
    from megatron.core.optimizer import OptimizerConfig

    given = dict(overrides or {})
    own = sorted(set(given) & set(OWN_OPTIMIZER_KEYS))
    if own:
        raise ConfigError(f"{key}: {', '.join(own)} come from the role's own keys (optim.lr, "
                          "optim.weight_decay, optim.betas, grad_clip, megatron.dtype, "
                          "megatron.use_distributed_optimizer): set them there.")
    _refuse_unknown(given, {f.name for f in dataclasses.fields(OptimizerConfig)}, key,
                    "OptimizerConfig")
    return given


def _refuse_unknown(given: Dict[str, Any], fields: Any, key: str, config: str) -> None:
    """Refuse the names of ``given`` that are no field of megatron's ``config``, each with
    the closest field names."""
    unknown = sorted(set(given) - set(fields))
    if unknown:
        hints = [f"{name} (did you mean {', '.join(close)}?)" if close else name
                 for name in unknown
                 for close in [difflib.get_close_matches(name, list(fields), n=2)]]
        raise ConfigError(f"{key}: {'; '.join(hints)} is no field of megatron-core's "
                          f"{config}.")
