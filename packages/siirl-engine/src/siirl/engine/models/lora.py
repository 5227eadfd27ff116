"""LoRA adapters through peft (``actor_rollout_ref.model.lora_rank > 0``).

The actor's transformers model is wrapped with peft's LoRA layers; the base weights are
frozen and only the adapters train. Everything else reads the one wrapped module:

- the reference policy is the same module inside peft's ``disable_adapter()``, so the base
  weights are never copied (:func:`without_adapters`);
- a rollout that receives weights (vLLM, SGLang) gets the merged weights ``W + s * B @ A``
  under the base model's names, computed out of place (:func:`merged_weights`);
- checkpoints hold the adapters only, in peft's file format (:func:`adapter_state`,
  :func:`save_adapter`, :func:`read_adapter`).

Functions that read weights take full tensors out of FSDP2 shards (``full_tensor()``):
under sharding every rank must call them, in the same order.

peft is imported only here and only when LoRA is asked for; it ships as the extra
``siirl-engine[lora]``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Any, Callable, Dict, Iterator, Tuple

import torch

from siirl.engine.common.checkpoint import ADAPTER_CONFIG  # noqa: F401  (peft's name)
from siirl.errors import ConfigError

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # with adapter_config.json: a folder that
# PeftModel.from_pretrained loads on top of the base model
_KEY = "actor_rollout_ref.model"
_PIP = 'pip install "siirl-engine[lora]"'


def lora_enabled(model_cfg: Any) -> bool:
    return int(getattr(model_cfg, "lora_rank", 0) or 0) > 0


def import_peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        raise ConfigError(
            f"{_KEY}.lora_rank > 0 trains LoRA adapters with the peft library, which is not "
            f"installed in this environment ({exc}). Install it with: {_PIP} (or pip "
            f"install peft), or train all weights with {_KEY}.lora_rank=0.") from exc
    return peft


def is_lora(module: Any) -> bool:
    """Whether ``module`` is a peft-wrapped model (never imports peft itself)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(module, peft.PeftModel)


def _plain(value: Any) -> Any:
    """OmegaConf lists (``target_modules=[q_proj,v_proj]``) as plain Python lists."""
    if value is None or isinstance(value, str):
        return value
    return [str(v) for v in value]


def lora_config(model_cfg: Any) -> Any:
    """peft's ``LoraConfig`` for ``actor_rollout_ref.model`` (verl's keys)."""
    peft = import_peft()
    return peft.LoraConfig(
        r=int(model_cfg.lora_rank), lora_alpha=float(model_cfg.lora_alpha),
        target_modules=_plain(model_cfg.target_modules),
        exclude_modules=_plain(model_cfg.exclude_modules),
        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")


def wrap(module: torch.nn.Module, model_cfg: Any, seed: int = 0) -> torch.nn.Module:
    """``module`` with LoRA adapters (a ``PeftModelForCausalLM``); only they require grad.

    The adapters' random init is drawn from a generator seeded with ``seed`` alone, so every
    worker (and a resumed run) starts from the same adapters, and the global RNG stream is
    left as it was."""
    peft = import_peft()
    config = lora_config(model_cfg)
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # peft asks transformers 5 for a renamed attribute: its deprecation notice
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
            torch.default_generator.manual_seed(int(seed))
            wrapped = peft.get_peft_model(module, config)
    except ValueError as exc:  # no module matched, all-linear on a non-transformers model
        raise ConfigError(f"LoRA cannot wrap the model with {_KEY}.target_modules="
                          f"{config.target_modules!r} and exclude_modules="
                          f"{config.exclude_modules!r}: {exc}") from exc
    others = [name for name, layer in wrapped.named_modules()
              if isinstance(layer, peft.tuners.lora.LoraLayer)
              and not isinstance(layer, peft.tuners.lora.Linear)]
    if others:
        raise ConfigError(f"LoRA here adapts linear layers only, but {_KEY}.target_modules="
                          f"{config.target_modules!r} selects {others[0]} "
                          f"({len(others)} such layer(s)); list linear layers or use "
                          "all-linear.")
    return wrapped


# ---- the reference policy: the same module with its adapters off -------------------------

def adapters_disabled(module: torch.nn.Module) -> Any:
    """peft's ``disable_adapter()`` context: the forward is the base model's."""
    return module.disable_adapter() if is_lora(module) else contextlib.nullcontext()


def without_adapters(heads: Callable[..., Any],
                     disabled: Callable[[torch.nn.Module], Any] = adapters_disabled
                     ) -> Callable[..., Any]:
    """A head factory (``logprob_heads(...)``) whose heads run with the adapters off;
    ``disabled(module)``: the context that switches them off (peft's; a backend's own)."""
    from siirl.engine.common.backend import Head

    def factory(*args: Any, **kwargs: Any) -> Head:
        head = heads(*args, **kwargs)

        def fn(module: torch.nn.Module, micro: Any) -> Dict[str, Any]:
            with disabled(module):
                return head.fn(module, micro)

        return Head(fn, head.outputs)

    return factory


# ---- reading the weights --------------------------------------------------------------

def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP2 shard (collective), a plain tensor as it is."""
    tensor = tensor.detach()
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _lora_layers(module: torch.nn.Module) -> Dict[str, Any]:
    peft = import_peft()
    return {name: layer for name, layer in module.named_modules()
            if isinstance(layer, peft.tuners.lora.Linear)}


def adapter_parameters(module: torch.nn.Module) -> Dict[str, torch.nn.Parameter]:
    """The adapters' parameters by the module's own names (``...lora_A.default.weight``);
    found by structure, not by ``requires_grad``, which peft clears while they are off."""
    return {f"{name}.{key}": param for name, layer in _lora_layers(module).items()
            for key, param in layer.named_parameters() if not key.startswith("base_layer.")}


def saved_name(name: str, adapter: str = "default") -> str:
    """peft's file key of a parameter: the adapter's name dropped, as
    ``get_peft_model_state_dict`` does (``...lora_A.default.weight`` -> ``...lora_A.weight``)."""
    return name.replace(f".{adapter}", "")


def adapter_state(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """The adapters' full tensors on the CPU, keyed as peft's ``adapter_model.safetensors``
    (collective when sharded)."""
    return {saved_name(name): _full(param).cpu()
            for name, param in adapter_parameters(module).items()}


def _base_name(name: str) -> str:
    """A PeftModel's name of a base weight as the plain model names it."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


@torch.no_grad()
def merged_weights(module: torch.nn.Module) -> Iterator[Tuple[str, torch.Tensor]]:
    """The base model's named full tensors with each adapter merged in, ``W + s * (B @ A)``
    (transposed for fan-in-fan-out layers), as peft's ``merge_and_unload`` computes them;
    new tensors: the trained module is never changed (collective when sharded)."""
    layers = _lora_layers(module)
    adapters = adapter_parameters(module)
    for name, tensor in module.state_dict().items():
        if name in adapters:
            continue  # lora_A / lora_B: merged into their base weight below
        weight = _full(tensor)
        layer = layers.get(name.removesuffix(".base_layer.weight"))
        if layer is not None:
            weight = weight.clone()
            for adapter in layer.active_adapters:
                delta = _full(layer.lora_B[adapter].weight) @ _full(layer.lora_A[adapter].weight)
                if layer.fan_in_fan_out:
                    delta = delta.T
                weight += (delta * layer.scaling[adapter]).to(weight.dtype)
        yield _base_name(name), weight


# ---- adapter files ------------------------------------------------------------------------

def save_adapter(directory: str, module: torch.nn.Module,
                 state: Dict[str, torch.Tensor]) -> None:
    """``adapter_config.json`` + ``adapter_model.safetensors`` (``state`` from
    :func:`adapter_state`) into ``directory``: a folder ``PeftModel.from_pretrained``
    loads on top of the base model."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    module.peft_config[module.active_adapter].save_pretrained(directory)
    save_file({k: v.contiguous() for k, v in state.items()},
              os.path.join(directory, ADAPTER_WEIGHTS), metadata={"format": "pt"})


def read_adapter(directory: str, module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """The adapters of ``directory`` keyed by the module's own parameter names, checked
    against the module's adapters (names, shapes) before anything is changed."""
    from siirl.dag_worker.checkpoint.errors import CheckpointError, DamagedCheckpointError
    from siirl.engine.common.checkpoint import MODEL_FILE, SHARDED_DIR, load_tensors

    path = os.path.join(directory, ADAPTER_WEIGHTS)
    if not os.path.exists(path):
        if os.path.exists(os.path.join(directory, MODEL_FILE)) or \
                os.path.isdir(os.path.join(directory, SHARDED_DIR)):
            raise CheckpointError(
                f"checkpoint {directory} holds full model weights (written without LoRA), "
                f"but this run trains LoRA adapters ({_KEY}.lora_rank > 0); resume it "
                f"with {_KEY}.lora_rank=0, or start a new run")
        raise DamagedCheckpointError(f"checkpoint {directory} has no {ADAPTER_WEIGHTS} "
                                     "(the LoRA adapter weights)")
    saved = load_tensors(path)
    params = adapter_parameters(module)
    wanted = {saved_name(name): name for name in params}
    problems = [f"{key} is {list(saved[key].shape)} in the checkpoint, "
                f"{list(params[name].shape)} in the model"
                for key, name in wanted.items()
                if key in saved and tuple(saved[key].shape) != tuple(params[name].shape)]
    missing = sorted(set(wanted) - set(saved))
    unexpected = sorted(set(saved) - set(wanted))
    if missing:
        problems.append(f"{len(missing)} adapter tensor(s) missing, e.g. {missing[0]}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensor(s), e.g. {unexpected[0]}")
    if problems:
        raise CheckpointError(f"checkpoint {directory} does not match this run's LoRA "
                              f"adapters: {'; '.join(problems[:3])}. It was written with "
                              f"another model or other {_KEY}.lora_rank / target_modules")
    return {name: saved[key] for key, name in wanted.items()}


@torch.no_grad()
def load_adapter_state(module: torch.nn.Module, state: Dict[str, torch.Tensor]) -> None:
    """Copy full adapter tensors (module names) into the module; an FSDP2-sharded parameter
    takes its own rows of the full tensor (no communication)."""
    params = adapter_parameters(module)
    for name, full in state.items():
        param = params[name]
        full = full.to(param.device, param.dtype)
        if hasattr(param, "device_mesh"):  # a DTensor: cut this rank's shard locally
            from torch.distributed.tensor import distribute_tensor

            full = distribute_tensor(full, param.device_mesh, param.placements,
                                     src_data_rank=None)
        param.copy_(full)
