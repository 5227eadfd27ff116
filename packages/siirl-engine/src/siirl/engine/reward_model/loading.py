"""Loading the reward model named by ``reward_model.model``: its path, tokenizer and
sequence classifier (``AutoModelForSequenceClassification``, one output).

``reward_model.model.path`` may be ``builtin:tiny-reward`` (the tiny reward model for the
built-in arithmetic task, shipped in ``siirl/engine/assets/tiny_reward/``, made by
``tools/make_tiny_reward_model.py``), a local Hugging Face directory, or a hub id already in
the local cache. Nothing is downloaded.
"""

from __future__ import annotations

import importlib
import importlib.resources
import os
import re
from pathlib import Path
from typing import Any, Tuple

import torch

from siirl.errors import ConfigError

BUILTIN_TINY_REWARD = "builtin:tiny-reward"
PATH_KEY = "reward_model.model.path"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def tiny_reward_dir() -> Path:
    """Directory of the built-in tiny reward model."""
    return Path(str(importlib.resources.files("siirl.engine") / "assets" / "tiny_reward"))


def resolve_path(path: Any, key: str = PATH_KEY) -> str:
    """A local directory, or a hub id (read from the local cache only), for ``path``
    (``key`` names it in errors)."""
    text = str(path)
    if text == BUILTIN_TINY_REWARD:
        where = tiny_reward_dir()
        if not (where / "config.json").is_file():
            raise ConfigError(f"{key}={text!r}: the built-in reward model is missing at "
                              f"{where} (reinstall siirl-engine)")
        return str(where)
    local = Path(os.path.expandvars(os.path.expanduser(text)))
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ConfigError(f"{key}={text!r} is a directory without config.json (not a "
                              "saved Hugging Face model)")
        return str(local)
    if _HUB_ID.match(text) and not local.exists():
        return text
    raise ConfigError(f"{key}: no model at {text!r} (expected {BUILTIN_TINY_REWARD!r}, a "
                      "local Hugging Face directory, or a hub id already in the local cache)")


def load_tokenizer(path: Any, trust_remote_code: bool = False, key: str = PATH_KEY) -> Any:
    """The tokenizer at ``path``, with a pad token (EOS when it has none, as verl)."""
    from transformers import AutoTokenizer

    where = resolve_path(path, key)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code,
                                                  local_files_only=True)
    except OSError as err:
        raise ConfigError(f"{key}: cannot load a tokenizer from {where!r}: {err}") from err
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_classifier(model_cfg: Any, device: torch.device) -> Tuple[torch.nn.Module, Any]:
    """(the frozen sequence classifier of ``reward_model.model`` in fp32 on ``device``, its
    tokenizer). ``external_lib`` is imported first (it may register the architecture)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from siirl.engine.models.loader import apply_override_config

    if model_cfg.external_lib:
        importlib.import_module(str(model_cfg.external_lib))
    trust = bool(model_cfg.trust_remote_code)
    tokenizer = load_tokenizer(model_cfg.path, trust)
    where = resolve_path(model_cfg.path)
    try:
        config = apply_override_config(AutoConfig.from_pretrained(
            where, num_labels=1, trust_remote_code=trust, local_files_only=True),
            model_cfg.override_config)
        module = AutoModelForSequenceClassification.from_pretrained(
            where, config=config, trust_remote_code=trust, local_files_only=True,
            dtype=torch.float32)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{PATH_KEY}: cannot load a sequence-classification reward model "
                          f"(one output) from {where!r}: {err}") from err
    if getattr(module.config, "pad_token_id", None) is None:  # its pooling needs one
        module.config.pad_token_id = tokenizer.pad_token_id
    module.requires_grad_(False)
    module.eval()
    return module.to(device), tokenizer


def load_causal_lm(model_cfg: Any, device: torch.device) -> Tuple[torch.nn.Module, Any]:
    """(a frozen causal LM at ``reward_model.model.path`` on ``device``, its tokenizer): the
    generative judge's own model. Any path the policy takes works (``builtin:tiny-arith``,
    a GGUF file, ...): it is loaded by the policy's loader."""
    from siirl.engine.models.loader import load_model_and_tokenizer

    settings = {"path": model_cfg.path, "trust_remote_code": bool(model_cfg.trust_remote_code),
                "external_lib": model_cfg.external_lib, "enable_gradient_checkpointing": False,
                "override_config": model_cfg.override_config}
    try:
        module, tokenizer = load_model_and_tokenizer(settings, device_type=device.type)
    except ConfigError as err:  # it names the policy's key: say which key was meant
        raise ConfigError(f"{PATH_KEY} (the judge, reward_model.judge.source=model): "
                          f"{err}") from None
    module.requires_grad_(False)
    module.eval()
    return module.to(device), tokenizer


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether ids of ``a`` mean the same text in ``b`` and both render chats alike, so the
    actor's ids can be fed to the reward model as they are."""
    if a is b:
        return True
    if a is None or b is None:
        return False
    if getattr(a, "chat_template", None) != getattr(b, "chat_template", None):
        return False
    try:
        return a.get_vocab() == b.get_vocab()
    except (AttributeError, NotImplementedError):
        return False
