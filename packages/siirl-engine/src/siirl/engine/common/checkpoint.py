"""Engine checkpoints: weights as safetensors, optimizer and the rest with ``torch.save``.

A checkpoint is a directory written under a temporary name and renamed into place when
every file is written, so a directory with the final name is always complete; a crash
mid-write leaves only a ``*.tmp-*`` directory behind.

Sharded (FSDP2) modules are saved with ``torch.distributed.checkpoint`` under ``dcp/``:
every rank writes its own shard of the weights and optimizer state (``__<rank>_0.distcp``)
and rank 0 the index (``.metadata``), so no rank ever holds the whole model to save it.
Loading reshards: a ``dcp/`` checkpoint written by N ranks loads into M ranks, or into
one unsharded module. Unsharded modules write ``model.safetensors`` + ``optimizer.pt``;
those load into a sharded module as well (each rank takes its shard of the full state).

Loading checks before it changes anything: every piece asked for is there, every file
reads (``torch.load(weights_only=True)``, safetensors), and the weights' names and shapes
are the module's. A damaged or incomplete checkpoint raises ``DamagedCheckpointError``
(the trainer then falls back to an older one), another model's ``CheckpointError``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
import uuid
import warnings
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch

from siirl.dag_worker.checkpoint.errors import CheckpointError, DamagedCheckpointError

MODEL_FILE = "model.safetensors"
SHARDED_DIR = "dcp"  # torch.distributed.checkpoint: one file per rank + .metadata
OPTIMIZER_FILE = "optimizer.pt"
EXTRA_FILE = "extra.pt"
ADAPTER_CONFIG = "adapter_config.json"  # a LoRA run's checkpoint (siirl.engine.models.lora)
_ALIASES_KEY = "siirl_aliases"  # safetensors metadata: {alias: stored name} of tied weights


@contextlib.contextmanager
def atomic_dir(final_dir: str) -> Iterator[str]:
    """Yield a fresh temporary directory that replaces ``final_dir`` once the block ends."""
    final_dir = os.path.abspath(final_dir)
    parent = os.path.dirname(final_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = f"{final_dir}.tmp-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if os.path.exists(final_dir):
        # Move the old copy aside first: os.replace cannot swap over a non-empty directory.
        old = f"{final_dir}.old-{uuid.uuid4().hex[:8]}"
        os.replace(final_dir, old)
    os.replace(tmp, final_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_tensors(state_dict: Dict[str, torch.Tensor], path: str) -> None:
    """safetensors file of ``state_dict``; tensors sharing storage (tied weights) are stored
    once and recorded as aliases, since safetensors refuses shared storage."""
    from safetensors.torch import save_file

    tensors: Dict[str, torch.Tensor] = {}
    aliases: Dict[str, str] = {}
    seen: Dict[Tuple, str] = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tensor.stride(), tensor.dtype)
        if tensor.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = tensor.cpu().contiguous().clone()
    save_file(tensors, path, metadata={_ALIASES_KEY: json.dumps(aliases)})


def load_tensors(path: str) -> Dict[str, torch.Tensor]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(path, framework="pt") as handle:
            aliases = json.loads((handle.metadata() or {}).get(_ALIASES_KEY, "{}"))
        tensors = load_file(path)
    except Exception as exc:  # SafetensorError: truncated, bad header
        raise _damaged(os.path.dirname(path), os.path.basename(path), exc) from exc
    for alias, name in aliases.items():
        tensors[alias] = tensors[name]
    return tensors


def _dcp_options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kwargs)


def model_state_dict(module: torch.nn.Module, sharded: bool) -> Dict[str, torch.Tensor]:
    """Full weights (collective when sharded: every rank must call; rank 0 gets them)."""
    if not sharded:
        return module.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(module, options=_dcp_options(full_state_dict=True,
                                                             cpu_offload=True))


def optimizer_state_dict(module: torch.nn.Module,
                         optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    """Unsharded optimizer state keyed by parameter names (not positions), so it loads
    into a sharded copy of the module too."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(module, optimizer)


def load_model_state(module: torch.nn.Module, state: Dict[str, torch.Tensor],
                     sharded: bool) -> None:
    if not sharded:
        module.load_state_dict(state, strict=True)
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(module, state, options=_dcp_options(full_state_dict=True))


def load_optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         state: Dict[str, Any], sharded: bool) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    if not sharded and all(isinstance(k, int) for k in state.get("state", {})):
        optimizer.load_state_dict(state)  # positional keys: optimizer.state_dict()'s own
        return
    set_optimizer_state_dict(module, optimizer, state,
                             options=_dcp_options(full_state_dict=sharded))


def _sharded_state(module: torch.nn.Module, optimizer: Any, contents: Tuple[str, ...]
                   ) -> Dict[str, Any]:
    """The state DCP saves/loads in place: DTensor shards when sharded, plain tensors
    otherwise (DCP then reads the full tensors out of the shards)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    state: Dict[str, Any] = {}
    if "model" in contents:
        state["model"] = get_model_state_dict(module)
    if "optimizer" in contents and optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(module, optimizer)
    return state


def save_checkpoint(directory: str, module: torch.nn.Module, optimizer: Any, extra: Dict,
                    *, sharded: bool = False, rank: int = 0, group: Any = None,
                    contents: Tuple[str, ...] = ("model", "optimizer", "extra")) -> None:
    """Write ``contents`` of an engine to ``directory``; sharded: every rank of ``group``
    calls this and writes its own shard, rank 0 the extra state."""
    if sharded:
        import torch.distributed.checkpoint as dcp

        os.makedirs(directory, exist_ok=True)
        state = _sharded_state(module, optimizer, contents)
        if state:
            dcp.save(state, checkpoint_id=os.path.join(directory, SHARDED_DIR),
                     process_group=group)
        if rank == 0 and "extra" in contents:
            torch.save(extra, os.path.join(directory, EXTRA_FILE))
        torch.distributed.barrier(group=group)
        return
    weights = module.state_dict() if "model" in contents else None
    optim = optimizer_state_dict(module, optimizer) \
        if "optimizer" in contents and optimizer is not None else None
    with atomic_dir(directory) as tmp:
        if weights is not None:
            save_tensors(weights, os.path.join(tmp, MODEL_FILE))
        if optim is not None:
            torch.save(optim, os.path.join(tmp, OPTIMIZER_FILE))
        if "extra" in contents:
            torch.save(extra, os.path.join(tmp, EXTRA_FILE))


def load_checkpoint(directory: str, module: torch.nn.Module, optimizer: Any, *,
                    sharded: bool = False, group: Any = None,
                    contents: Tuple[str, ...] = ("model", "optimizer", "extra")) -> Dict:
    """Restore what ``directory`` holds of ``contents``; returns the extra dict.

    Every rank reads the files itself (the directory must be visible to all ranks). Each
    piece ``contents`` asks for must be there (a missing optimizer would resume with a
    fresh one and diverge), and the files are read and checked against the module before
    anything is changed: a damaged or foreign checkpoint is refused, never half-loaded.
    """
    if not os.path.isdir(directory):
        raise DamagedCheckpointError(f"no checkpoint directory at {directory}")
    wants_optimizer = "optimizer" in contents and optimizer is not None
    extra = read_extra(directory) if "extra" in contents else {}
    dcp_dir = os.path.join(directory, SHARDED_DIR)
    if os.path.isdir(dcp_dir):
        _check_sharded(dcp_dir, module, contents, wants_optimizer)
        _load_sharded(dcp_dir, module, optimizer, contents, sharded, group)
    else:
        weights, optim = _read_full(directory, module, contents, wants_optimizer)
        if weights is not None:
            load_model_state(module, weights, sharded)
        if optim is not None:
            try:
                load_optimizer_state(module, optimizer, optim, sharded)
            except (ValueError, KeyError, RuntimeError) as exc:
                raise CheckpointError(f"checkpoint {directory}: {OPTIMIZER_FILE} does not "
                                      f"match this run's optimizer ({_first_line(exc)})"
                                      ) from exc
    if sharded:
        torch.distributed.barrier(group=group)
    return extra


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _damaged(directory: str, name: str, exc: BaseException) -> DamagedCheckpointError:
    return DamagedCheckpointError(f"checkpoint {directory}: {name} cannot be read "
                                  f"({_first_line(exc)})")


def _require(directory: str, name: str, what: str) -> str:
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        raise DamagedCheckpointError(f"checkpoint {directory} has no {name} ({what}); "
                                     "resuming without it would not continue the run")
    return path


def _read_torch_file(directory: str, name: str, what: str) -> Any:
    path = _require(directory, name, what)
    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:  # truncated zip, refused pickle: the file is damaged
        raise _damaged(directory, name, exc) from exc


def read_extra(directory: str) -> Dict:
    """``extra.pt`` of a checkpoint (lr schedule, update count), checked to read."""
    return _read_torch_file(directory, EXTRA_FILE, "lr schedule and update count")


def read_optimizer(directory: str) -> Dict:
    """``optimizer.pt`` of a checkpoint, checked to read."""
    return _read_torch_file(directory, OPTIMIZER_FILE, "the optimizer state")


def _read_full(directory: str, module: torch.nn.Module, contents: Tuple[str, ...],
               wants_optimizer: bool) -> Tuple[Optional[Dict], Optional[Dict]]:
    weights = optim = None
    if "model" in contents:
        if os.path.exists(os.path.join(directory, ADAPTER_CONFIG)):
            raise CheckpointError(f"checkpoint {directory} holds LoRA adapters only "
                                  f"({ADAPTER_CONFIG}), but this run trains all weights; "
                                  "resume it with the LoRA settings it was written with "
                                  "(actor_rollout_ref.model.lora_rank > 0)")
        if not os.path.exists(os.path.join(directory, MODEL_FILE)):
            raise DamagedCheckpointError(f"checkpoint {directory} has no {MODEL_FILE} and "
                                         f"no {SHARDED_DIR}/ (the model weights)")
        weights = load_tensors(os.path.join(directory, MODEL_FILE))
        _check_fits(directory, module, {k: tuple(v.shape) for k, v in weights.items()})
    if wants_optimizer:
        optim = read_optimizer(directory)
    return weights, optim


def _check_fits(directory: str, module: torch.nn.Module, saved: Dict[str, Tuple]) -> None:
    """Refuse weights written for another model before any of them is copied."""
    wanted = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    problems = [f"{k} is {list(saved[k])} in the checkpoint, {list(shape)} in the model"
                for k, shape in wanted.items() if k in saved and saved[k] != shape]
    missing = [k for k in wanted if k not in saved]
    unexpected = [k for k in saved if k not in wanted]
    if missing:
        problems.append(f"{len(missing)} tensor(s) missing, e.g. {missing[0]}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensor(s), e.g. {unexpected[0]}")
    if problems:
        raise CheckpointError(f"checkpoint {directory} does not match this run's model "
                              f"(shape mismatch): {'; '.join(problems[:3])}. It was written "
                              "for another model or architecture (actor_rollout_ref.model."
                              "path)")


def _check_sharded(dcp_dir: str, module: torch.nn.Module, contents: Tuple[str, ...],
                   wants_optimizer: bool) -> None:
    """The DCP index must list the model's tensors at their shapes, and optimizer state
    when the run needs it."""
    from torch.distributed.checkpoint import FileSystemReader

    directory = os.path.dirname(dcp_dir)
    try:
        listed = FileSystemReader(dcp_dir).read_metadata().state_dict_metadata
    except Exception as exc:
        raise _damaged(directory, f"{SHARDED_DIR}/.metadata", exc) from exc
    if "model" in contents:
        saved = {k[len("model."):]: tuple(v.size)
                 for k, v in listed.items() if k.startswith("model.") and hasattr(v, "size")}
        _check_fits(directory, module, saved)
    if wants_optimizer and not any(k.startswith("optimizer.") for k in listed):
        raise DamagedCheckpointError(f"checkpoint {directory}: {SHARDED_DIR}/ holds no "
                                     "optimizer state; resuming without it would not "
                                     "continue the run")


def _load_sharded(dcp_dir: str, module: torch.nn.Module, optimizer: Any,
                  contents: Tuple[str, ...], sharded: bool, group: Any) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state = _sharded_state(module, optimizer, contents)
    if not state:
        return
    with warnings.catch_warnings():  # "assuming ... a single process": yes, deliberately
        warnings.filterwarnings("ignore", message=".*single process.*")
        try:
            dcp.load(state, checkpoint_id=dcp_dir, process_group=group if sharded else None,
                     no_dist=not sharded)
        except Exception as exc:  # a shard file truncated or lost
            raise _damaged(os.path.dirname(dcp_dir), f"{SHARDED_DIR}/", exc) from exc
    if "model" in state:
        set_model_state_dict(module, state["model"])
    if "optimizer" in state:
        set_optimizer_state_dict(module, optimizer, state["optimizer"])


@contextlib.contextmanager
def as_plain_model(module: torch.nn.Module) -> Iterator[None]:
    """A GGUF model is de-quantized when transformers loads it, but keeps its quantizer
    and ``quantization_config``, so ``save_pretrained`` refuses it ("quantized with gguf
    and is not serializable"). Its weights are plain tensors: save it as the plain model
    it is, then put the attributes back."""
    quantizer = getattr(module, "hf_quantizer", None)
    config = getattr(module, "config", None)
    method = getattr(getattr(config, "quantization_config", None), "quant_method", None)
    if quantizer is None or str(getattr(method, "value", method)).lower() != "gguf":
        yield
        return
    if any(not p.is_floating_point() for p in module.parameters()):  # still GGUF blocks
        raise CheckpointError("the model still holds GGUF-quantized weights, which cannot "
                              "be trained or exported; load it de-quantized (without a "
                              "GGUF kernel)")
    saved = {name: getattr(module, name) for name in ("hf_quantizer", "is_quantized",
                                                       "quantization_method")
             if name in vars(module)}
    had_config = "quantization_config" in vars(config)
    quant_config = getattr(config, "quantization_config", None)
    for name in saved:
        delattr(module, name)
    if had_config:
        delattr(config, "quantization_config")
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
        if had_config:
            config.quantization_config = quant_config


def save_pretrained_dir(directory: str, module: torch.nn.Module,
                        state: Dict[str, torch.Tensor], tokenizer: Any = None,
                        finish: Optional[Callable[[str], None]] = None) -> None:
    """A plain transformers directory (config, safetensors ``state``, tokenizer), written
    atomically; ``finish(tmp_dir)`` may fix files before the directory appears."""
    with atomic_dir(directory) as tmp:
        kwargs: Dict[str, Any] = {"state_dict": state}
        if "safe_serialization" in inspect.signature(module.save_pretrained).parameters:
            kwargs["safe_serialization"] = True  # transformers 4.x
        with as_plain_model(module):
            module.save_pretrained(tmp, **kwargs)
        if finish is not None:
            finish(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
