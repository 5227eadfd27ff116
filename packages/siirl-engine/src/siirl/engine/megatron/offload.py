"""Megatron offload between a role's verbs: verl's ``megatron.param_offload``,
``grad_offload`` and ``optimizer_offload``.

FSDP2's offload streams layers to the device during compute; megatron's works by phases.
While a role computes, its weights (and, for an update, its gradients and optimizer state)
are on the device; between its verbs they wait in host memory, so the rollout and the other
roles get the device memory. Engine verbs hold the device (:meth:`Offloader.hold`); backend
verbs fetch what they touch (:meth:`Offloader.fetch`), so a verb called outside a hold is
still correct, only not offloaded afterwards.

Every tensor keeps its identity. A storage's bytes go to a host buffer (pinned for a GPU)
and the device storage is resized to nothing; a fetch resizes it back and copies the bytes
in. So every view into a storage (megatron DDP's parameter and gradient buffers,
``main_grad``, the distributed optimizer's shards) stays valid without re-pointing.
Gradients hold nothing between updates (each update starts by zeroing them), so
``grad_offload`` frees them without a copy and a fetch gives zeros.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

import torch

from siirl.engine.megatron.config import OFFLOAD_ON_CPU
from siirl.errors import ConfigError

KINDS = ("params", "grads", "optimizer")
KEYS = {"params": "param_offload", "grads": "grad_offload", "optimizer": "optimizer_offload"}


@dataclass(frozen=True)
class OffloadSettings:
    """What a role keeps in host memory between its verbs."""

    params: bool = False
    grads: bool = False
    optimizer: bool = False

    @classmethod
    def of(cls, megatron_section: Any, trains: bool = True) -> OffloadSettings:
        """A role's ``megatron`` keys (a frozen role has no gradients or optimizer)."""
        return cls(*(bool(getattr(megatron_section, KEYS[kind]))
                     and (trains or kind == "params") for kind in KINDS))

    def __bool__(self) -> bool:
        return self.params or self.grads or self.optimizer


def role_offload(megatron_section: Any, key: str, device: torch.device,
                 trains: bool = True) -> OffloadSettings:
    """A role's offload settings (``key``: its megatron section); refused on a CPU run,
    where there is no device memory to free (the validation pass refuses it before loading
    where the workers run on the launching machine; here for the others)."""
    settings = OffloadSettings.of(megatron_section, trains)
    if settings and torch.device(device).type == "cpu":
        first = next(kind for kind in KINDS if getattr(settings, kind))
        raise ConfigError(f"{key}.{KEYS[first]}=true: {OFFLOAD_ON_CPU}")
    return settings


def torch_optimizers(optimizer: Any) -> List[torch.optim.Optimizer]:
    """The torch optimizers inside ``optimizer``: siiRL's MegatronOptimizer (megatron's
    chain, one per parameter kind), megatron's mixed-precision wrapper, or torch's own."""
    if optimizer is None:
        return []
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    inner = getattr(optimizer, "megatron", optimizer)
    return [sub.optimizer for sub in getattr(inner, "chained_optimizers", [inner])]


def model_tensors(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    yield from module.parameters()
    yield from module.buffers()


def model_grads(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    """DDP's gradient buffers (``main_grad`` views into them); plain ``.grad`` fields are
    dropped by :meth:`Offloader.park` instead."""
    for param in module.parameters():
        grad = getattr(param, "main_grad", None)
        if grad is not None:
            yield grad


def optimizer_tensors(optimizer: Any) -> Iterator[torch.Tensor]:
    """The optimizer's own parameters (fp32 main copies, or the model's, which the
    parameter kind then owns) and its state (Adam's moments)."""
    for torch_optimizer in torch_optimizers(optimizer):
        for group in torch_optimizer.param_groups:
            yield from group["params"]
        for state in torch_optimizer.state.values():
            yield from (value for value in state.values() if torch.is_tensor(value))


def _live_storages(tensors: Iterable[torch.Tensor], device: torch.device,
                   taken: set) -> List[torch.UntypedStorage]:
    """The distinct non-empty storages of ``tensors`` on ``device`` not in ``taken``
    (data pointers; grows with the ones returned)."""
    out = []
    for tensor in tensors:
        if tensor.device != device:
            continue
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if storage.nbytes() == 0 or pointer in taken:
            continue
        taken.add(pointer)
        out.append(storage)
    return out


class _Parked:
    """A kind's storages in host memory (``copies``: None for gradients, dropped)."""

    def __init__(self, storages: List[torch.UntypedStorage], sizes: List[int],
                 copies: Optional[List[torch.Tensor]]):
        self.storages, self.sizes, self.copies = storages, sizes, copies

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)


class Offloader:
    """Parks a role's tensors in host memory between verbs and fetches them back.

    ``sources`` maps each kind to a function listing its tensors; a storage belongs to the
    first kind (in :data:`KINDS` order) that lists it, so the optimizer's views of the
    model's parameters stay with the parameters."""

    def __init__(self, settings: OffloadSettings, device: torch.device,
                 sources: Dict[str, Callable[[], Iterable[torch.Tensor]]],
                 drop_grads: Callable[[], None] = lambda: None):
        self.settings, self.device = settings, torch.device(device)
        self.sources = sources
        self.drop_grads = drop_grads  # plain .grad fields (no DDP buffer): set to None
        self.parked: Dict[str, _Parked] = {}
        # host buffers of fetched storages, by their device pointer: no parked storage's
        # copy is among them, so whatever storage now has the pointer may reuse one
        self._spare: Dict[int, torch.Tensor] = {}
        self._depth = 0
        self.moved_bytes = {kind: 0 for kind in KINDS}  # the last park's, for checks

    @contextmanager
    def hold(self) -> Iterator[None]:
        """An engine verb: park what the settings offload when the outermost hold ends."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.park()

    def fetch(self, grads: bool = False, optimizer: bool = False) -> None:
        """Put the parameters (and ``grads`` / ``optimizer``) back on the device."""
        for kind, wanted in zip(KINDS, (True, grads, optimizer), strict=True):
            parked = self.parked.pop(kind, None) if wanted else None
            if parked is None:
                continue
            for index, (storage, size) in enumerate(zip(parked.storages, parked.sizes,
                                                        strict=True)):
                storage.resize_(size)
                if parked.copies is None:
                    storage.fill_(0)
                    continue
                host = parked.copies[index]
                storage.copy_(host.untyped_storage(), non_blocking=True)
                # the next park may refill it (pinned buffers are slow to allocate)
                self._spare[storage.data_ptr()] = host

    def park(self) -> None:
        """Move every kind the settings offload (and not already parked) to host memory."""
        if not self.settings:
            return
        taken: set = set()
        live = {kind: _live_storages(self.sources[kind](), self.device, taken)
                for kind in KINDS if kind not in self.parked}
        if self.settings.grads:
            self.drop_grads()
        for kind in KINDS:
            if not getattr(self.settings, kind) or kind not in live:
                continue
            storages = live[kind]
            sizes = [storage.nbytes() for storage in storages]
            copies = None
            if kind != "grads":
                copies = [self._host_copy(storage) for storage in storages]
            for storage in storages:
                storage.resize_(0)
            self.parked[kind] = _Parked(storages, sizes, copies)
            self.moved_bytes[kind] = sum(sizes)
        # spares no storage took (an optimizer state replaced by a checkpoint load) go
        self._spare = {}

    def _host_copy(self, storage: torch.UntypedStorage) -> torch.Tensor:
        size = storage.nbytes()
        host = self._spare.pop(storage.data_ptr(), None)
        if host is None or host.numel() != size:
            host = torch.empty(size, dtype=torch.uint8, device="cpu",
                               pin_memory=self.device.type == "cuda")
        host.untyped_storage().copy_(storage)
        return host

    def bytes_parked(self) -> Dict[str, int]:
        """Bytes now in host memory (or dropped, for gradients), per kind."""
        return {kind: parked.nbytes for kind, parked in self.parked.items()}


def backend_offloader(settings: OffloadSettings, module: torch.nn.Module, optimizer: Any,
                      device: torch.device) -> Optional[Offloader]:
    """The offloader of a backend's ``module`` and ``optimizer``, None when nothing is
    offloaded."""
    if not settings:
        return None

    def drop_grads() -> None:
        for tensor in _plain_grad_owners(module, optimizer):
            tensor.grad = None

    return Offloader(settings, device, {
        "params": lambda: model_tensors(module),
        "grads": lambda: model_grads(module),
        "optimizer": lambda: optimizer_tensors(optimizer)}, drop_grads)


def _plain_grad_owners(module: torch.nn.Module, optimizer: Any) -> Iterator[torch.Tensor]:
    yield from module.parameters()
    for torch_optimizer in torch_optimizers(optimizer):
        for group in torch_optimizer.param_groups:
            yield from group["params"]

