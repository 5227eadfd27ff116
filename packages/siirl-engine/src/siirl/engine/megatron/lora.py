"""LoRA adapters on a megatron GPT stage (``actor_rollout_ref.model.lora_rank > 0`` under
``strategy=megatron``), named and scaled as peft names and scales them on the HF model.

Each adapted megatron linear gets one adapter per HF projection it fuses (``linear_qkv``:
q/k/v_proj; ``linear_fc1``: gate/up_proj; ``linear_proj``: o_proj; ``linear_fc2``:
down_proj); its output gains ``scaling * B @ A @ x`` (``scaling = lora_alpha / rank``, peft's)
through a forward hook, so the base module, its state-dict keys and the bridge are unchanged.
Split over tensor parallelism like the base weight:

* column-parallel (qkv, fc1): ``A`` replicated, ``B`` split on the output dim as the bridge
  splits the HF weight; ``A @ x`` goes through megatron's copy-to-TP region so ``A``'s
  gradient is summed over the output shards;
* row-parallel (proj, fc2): ``A`` split on the input dim, ``B`` replicated; the partial
  ``A @ x`` is all-reduced over TP before ``B``.

With sequence parallelism a column-parallel layer reads this rank's sequence slice (megatron
all-gathers it inside the layer) and a row-parallel one reduce-scatters its output to it, so
the rank-r ``A @ x`` is all-gathered along the sequence (column) or reduce-scattered (row)
instead; the replicated ``A`` (column) or ``B`` (row) then sees only the slice, and its
gradient, marked ``sequence_parallel`` like the norms', is summed over TP with theirs.

The base weights are frozen (only the adapters reach the optimizer). The adapters start as
peft's (``A`` kaiming-uniform from a generator seeded with ``seed``, ``B`` zero), so at
init the model is the base model; every rank draws every layer's ``A`` in one order, and
each pipeline stage (each virtual-pipeline chunk) keeps its own layers' adapters.
:func:`adapters_disabled` runs the base model (the reference policy);
``siirl.engine.megatron.lora_state`` gathers the adapters as peft's
``adapter_model.safetensors`` keys of the HF model and the merged weights
(``W + s * B @ A``, what the rollout gets through the bridge) from every stage.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from siirl.errors import ConfigError

_KEY = "actor_rollout_ref.model"
# megatron module -> (HF module dir, the HF projections it fuses, how it is TP-split)
FUSED = {
    "self_attention.linear_qkv": ("self_attn", ("q_proj", "k_proj", "v_proj"), "column"),
    "self_attention.linear_proj": ("self_attn", ("o_proj",), "row"),
    "mlp.linear_fc1": ("mlp", ("gate_proj", "up_proj"), "column"),
    "mlp.linear_fc2": ("mlp", ("down_proj",), "row"),
}
ALL_LINEAR = tuple(name for _, names, _ in FUSED.values() for name in names)


def target_projections(target_modules: Any) -> Tuple[str, ...]:
    """The HF projections ``target_modules`` selects (peft's names or ``all-linear``)."""
    if target_modules is None or (isinstance(target_modules, str)
                                  and target_modules == "all-linear"):
        return ALL_LINEAR
    names = [target_modules] if isinstance(target_modules, str) else [str(t) for t in
                                                                      target_modules]
    if "all-linear" in names:
        return ALL_LINEAR
    unknown = sorted(set(names) - set(ALL_LINEAR))
    if unknown:
        raise ConfigError(f"{_KEY}.target_modules={names}: {unknown} name no linear layer the "
                          f"megatron LoRA adapts; use peft's names {list(ALL_LINEAR)} or "
                          "all-linear")
    return tuple(n for n in ALL_LINEAR if n in names)


@dataclass(frozen=True)
class LoraSettings:
    rank: int
    alpha: float
    targets: Tuple[str, ...]

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank  # peft's default (no rsLoRA)


def settings_of(model_cfg: Any) -> LoraSettings:
    """``actor_rollout_ref.model``'s LoRA keys; what megatron's LoRA cannot honour refused."""
    if getattr(model_cfg, "exclude_modules", None):
        raise ConfigError(f"{_KEY}.exclude_modules is not applied by the megatron LoRA "
                          f"(it adapts whole projection kinds): select them with "
                          f"{_KEY}.target_modules and leave exclude_modules null")
    return LoraSettings(int(model_cfg.lora_rank), float(model_cfg.lora_alpha),
                        target_projections(getattr(model_cfg, "target_modules", None)))


class LoraAdapters(torch.nn.Module):
    """The adapters of one megatron linear: per HF projection ``name``, ``lora_A[name]``
    and ``lora_B[name]`` (this TP rank's parts)."""

    def __init__(self, kind: str, slices: Dict[str, Tuple[int, int]], scaling: float,
                 qkv_groups: Optional[Tuple[int, int, int]] = None,
                 sequence_parallel: bool = False):
        super().__init__()
        self.kind, self.scaling, self.qkv_groups = kind, scaling, qkv_groups
        self.sequence_parallel = sequence_parallel
        self.out_sizes = {name: rows for name, (rows, _) in slices.items()}  # local rows
        self.lora_A = torch.nn.ParameterDict()
        self.lora_B = torch.nn.ParameterDict()
        self.enabled = True

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """``scaling * B @ A @ x`` in the base layer's local output layout (one collective
        for all the layer's adapters: their ``A`` stacked)."""
        names = [name for name in self.out_sizes if name in self.lora_A]
        a = torch.cat([self.lora_A[name] for name in names])
        hidden = self._over_tp(x.to(a.dtype) @ a.t()).split(
            [self.lora_A[name].shape[0] for name in names], dim=-1)
        products = {name: h @ self.lora_B[name].t() * self.scaling
                    for name, h in zip(names, hidden, strict=True)}
        return self.fuse([products.get(name) for name in self.out_sizes],
                         hidden[0].shape[:-1], x.dtype, x.device, dim=-1)

    def _over_tp(self, hidden: torch.Tensor) -> torch.Tensor:
        """``A @ x`` in the layout ``B`` reads (autograd-correct megatron collectives)."""
        from megatron.core.tensor_parallel import mappings

        if self.kind == "column":  # backward: A's gradient summed over output shards
            if self.sequence_parallel:  # the slice's rows -> the whole sequence
                return mappings.gather_from_sequence_parallel_region(
                    hidden, tensor_parallel_output_grad=True)
            return mappings.copy_to_tensor_model_parallel_region(hidden)
        # each rank holds some input columns: sum the partial products
        if self.sequence_parallel:  # ... keeping this rank's slice of the sequence
            return mappings.reduce_scatter_to_sequence_parallel_region(hidden)
        return mappings.reduce_from_tensor_model_parallel_region(hidden)

    def fuse(self, parts: List[Optional[torch.Tensor]], lead: Sequence[int], dtype, device,
             dim: int) -> torch.Tensor:
        """The per-projection parts (None: not adapted, zero) in the fused local layout."""
        if dim == 0:  # weights [out, in]: fuse along rows like activations' last dim
            return self.fuse([None if p is None else p.t() for p in parts], lead, dtype,
                             device, dim=-1).t()
        parts = [p if p is not None else torch.zeros(*lead, rows, dtype=dtype, device=device)
                 for p, rows in zip(parts, self.out_sizes.values(), strict=True)]
        if self.qkv_groups is None:
            return torch.cat(parts, dim=-1)
        groups, per_group, head = self.qkv_groups  # local groups: [q of g; k_g; v_g]
        q, k, v = parts
        fused = torch.cat([q.reshape(*lead, groups, per_group * head),
                           k.reshape(*lead, groups, head), v.reshape(*lead, groups, head)],
                          dim=-1)
        return fused.reshape(*lead, -1)

    def weight_delta(self) -> torch.Tensor:
        """``scaling * B @ A`` of this rank's part of the base weight (no communication)."""
        a0 = next(iter(self.lora_A.values()))
        parts = [None if n not in self.lora_A else
                 (self.lora_B[n] @ self.lora_A[n]) * self.scaling for n in self.out_sizes]
        return self.fuse(parts, (a0.shape[1],), a0.dtype, a0.device, dim=0)


def _hook(module: torch.nn.Module, inputs: Tuple[Any, ...], output: Any) -> Any:
    adapters = module.lora
    if not adapters.enabled:
        return output
    out, bias = output if isinstance(output, tuple) else (output, None)
    out = out + adapters.delta(inputs[0]).to(out.dtype)
    return (out, bias) if isinstance(output, tuple) else out


def tp_layout() -> Tuple[int, int]:
    """(this rank's tensor-parallel rank, the tensor-parallel size)."""
    from megatron.core import parallel_state as ps

    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()


def adapted_layers(model: torch.nn.Module) -> Dict[str, torch.nn.Module]:
    """megatron module name -> linear carrying adapters."""
    from siirl.engine.megatron.model import unwrap_model

    return {name: m for name, m in unwrap_model(model).named_modules()
            if isinstance(getattr(m, "lora", None), LoraAdapters)}


def has_adapters(model: torch.nn.Module) -> bool:
    return bool(adapted_layers(model))


MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def _check_layout(model: torch.nn.Module, hf_config, settings: LoraSettings) -> None:
    from siirl.engine.megatron.moe import is_moe

    problems = []
    mlp = [proj for proj in settings.targets if proj in MLP_PROJECTIONS]
    if is_moe(hf_config) and mlp:  # the attention projections are adapted as on dense ones
        problems.append(f"the MLP projections ({', '.join(mlp)}) of a mixture-of-experts "
                        "model (adapters on the experts are not built; target_modules="
                        "[q_proj,k_proj,v_proj,o_proj] adapts its attention)")
    if any(k.endswith("layer_norm_weight") for k in model.state_dict()):
        problems.append("Transformer Engine's fused norm+linear layers")
    if problems:
        raise ConfigError(f"{_KEY}.lora_rank > 0 under strategy=megatron does not run with "
                          f"{'; '.join(problems)}: use strategy=fsdp for LoRA there, or "
                          "train all weights (lora_rank=0)")


def hf_name(layer: int, hf_dir: str, proj: str, which: str) -> str:
    """peft's ``adapter_model.safetensors`` key of an adapter on the HF model."""
    return f"base_model.model.model.layers.{layer}.{hf_dir}.{proj}.lora_{which}.weight"


def _slices(hf_config, proj: str) -> Tuple[int, int]:
    """(out, in) of an HF projection."""
    from siirl.engine.megatron.model import head_dim

    hidden, ffn = hf_config.hidden_size, hf_config.intermediate_size
    heads = hf_config.num_attention_heads
    kv = hf_config.num_key_value_heads or heads
    dim = head_dim(hf_config)
    return {"q_proj": (heads * dim, hidden), "k_proj": (kv * dim, hidden),
            "v_proj": (kv * dim, hidden), "o_proj": (hidden, heads * dim),
            "gate_proj": (ffn, hidden), "up_proj": (ffn, hidden),
            "down_proj": (hidden, ffn)}[proj]


def _own_layers(model: torch.nn.Module, hf_config) -> Dict[int, Tuple[torch.nn.Module, int]]:
    """HF layer index -> (the GPT chunk holding it on this rank, its index in the chunk),
    for this pipeline stage's layers (every virtual-pipeline chunk's)."""
    from siirl.engine.megatron.bridge import layer_range
    from siirl.engine.megatron.chunks import model_chunks, stage_of
    from siirl.engine.megatron.model import unwrap_model

    model = unwrap_model(model)
    owners = {}
    for index, chunk in enumerate(model_chunks(model)):
        stage, stages = stage_of(model, index)
        for local, layer in enumerate(layer_range(hf_config.num_hidden_layers, stage, stages)):
            owners[layer] = (unwrap_model(chunk), local)
    return owners


def add_adapters(model: torch.nn.Module, hf_config, settings: LoraSettings,
                 seed: int = 0) -> None:
    """Freeze ``model`` (weights already loaded) and give its targeted linears adapters;
    every rank draws the full ``A`` of each HF projection of every layer in the same order
    from a generator seeded with ``seed`` and keeps its stage's layers and its TP part (so
    the adapters are the same at any TP and PP size)."""
    from siirl.engine.megatron.model import unwrap_model

    _check_layout(unwrap_model(model), hf_config, settings)
    unwrap_model(model).requires_grad_(False)
    owners = _own_layers(model, hf_config)
    generator = torch.Generator().manual_seed(int(seed))
    for layer in range(hf_config.num_hidden_layers):
        for suffix, (_, projections, _) in FUSED.items():
            drawn = {}
            for proj in projections:
                if proj in settings.targets:
                    drawn[proj] = torch.empty(settings.rank, _slices(hf_config, proj)[1])
                    torch.nn.init.kaiming_uniform_(drawn[proj], a=math.sqrt(5),
                                                   generator=generator)
            if drawn and layer in owners:
                gpt, local = owners[layer]
                linear = gpt.get_submodule(f"decoder.layers.{local}.{suffix}")
                linear.lora = _adapters_of(linear.weight, hf_config, settings, suffix, drawn,
                                           bool(gpt.config.sequence_parallel))
                linear.lora_layer = layer  # the HF layer index the adapter names use
                linear.lora_suffix = suffix
                linear.register_forward_hook(_hook)


def _adapters_of(weight: torch.Tensor, hf_config, settings: LoraSettings, suffix: str,
                 full_a: Dict[str, torch.Tensor], sequence_parallel: bool) -> LoraAdapters:
    """The adapters of the megatron linear ``suffix`` (this TP rank's parts) from the full
    ``A`` of each adapted projection; ``B`` zero."""
    from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes

    from siirl.engine.megatron.model import head_dim

    tp_rank, tp = tp_layout()
    _, projections, kind = FUSED[suffix]
    groups = None
    if suffix.endswith("linear_qkv"):
        kv = hf_config.num_key_value_heads or hf_config.num_attention_heads
        groups = (kv // tp, hf_config.num_attention_heads // kv, head_dim(hf_config))
    slices = {p: (_slices(hf_config, p)[0] // (tp if kind == "column" else 1),
                  _slices(hf_config, p)[1]) for p in projections}
    adapters = LoraAdapters(kind, slices, settings.scaling, groups, sequence_parallel)
    for proj, a in full_a.items():
        out = _slices(hf_config, proj)[0]
        if kind == "row":
            a, b = a.chunk(tp, dim=1)[tp_rank], torch.zeros(out, settings.rank)
        else:
            b = torch.zeros(out // tp, settings.rank)
        a = torch.nn.Parameter(a.to(weight.device, weight.dtype).contiguous())
        b = torch.nn.Parameter(b.to(weight.device, weight.dtype))
        split, dim = (b, 0) if kind == "column" else (a, 1)
        set_tensor_model_parallel_attributes(split, True, dim, 1)
        # the replicated one sees this rank's sequence slice: summed over TP
        (a if kind == "column" else b).sequence_parallel = sequence_parallel
        adapters.lora_A[proj], adapters.lora_B[proj] = a, b
    return adapters


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """The base model's forward (the reference policy) inside the block."""
    layers = list(adapted_layers(model).values())
    before = [linear.lora.enabled for linear in layers]  # nested blocks restore theirs
    for linear in layers:
        linear.lora.enabled = False
    try:
        yield
    finally:
        for linear, enabled in zip(layers, before, strict=True):
            linear.lora.enabled = enabled
