"""One loss scale for megatron's chained optimizers (fp16 on a mixture-of-experts model).

Megatron steps the dense and the expert parameters with two optimizers, each built with its
own grad scaler, while the schedule scales the loss by the first one's scale. Left apart,
an overflow in the expert gradients alone would back the expert scaler off and not the
dense one: from then on the expert gradients would be unscaled by the wrong factor. Here
every optimizer of the chain unscales by one scaler, and the scaler moves once per step,
after all of them have checked their gradients, on whether any found an inf or NaN (the
chain then skips the step for all of them). The flags agree on every rank: each optimizer
reduces its own over its model-parallel group, and the dense and expert gradients are equal
across the data-parallel ranks that share them.
"""

from __future__ import annotations

from typing import Any, Dict, List


class JointGradScaler:
    """Megatron's grad-scaler interface over one scaler shared by ``count`` optimizers."""

    def __init__(self, scaler: Any, count: int):
        self.scaler, self.count = scaler, count
        self._flags: List[bool] = []

    @property
    def scale(self) -> Any:
        return self.scaler.scale

    @property
    def inv_scale(self) -> Any:
        return self.scaler.inv_scale

    def update(self, found_inf: bool) -> None:
        """One optimizer's verdict; the scale moves when the last of the step's arrives."""
        self._flags.append(bool(found_inf))
        if len(self._flags) == self.count:
            found, self._flags = any(self._flags), []
            self.scaler.update(found)

    def state_dict(self) -> Dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        # every optimizer of the chain saved the same state; loading it again is harmless
        self.scaler.load_state_dict(state_dict)


def share_loss_scale(megatron_optimizer: Any) -> None:
    """Give every optimizer of megatron's chain the first one's scaler (no-op for one
    optimizer, or without loss scaling)."""
    chain = getattr(megatron_optimizer, "chained_optimizers", None) or []
    scalers = [getattr(sub, "grad_scaler", None) for sub in chain]
    if len(chain) < 2 or scalers[0] is None:
        return
    joint = JointGradScaler(scalers[0], len(chain))
    for sub in chain:
        sub.grad_scaler = joint
