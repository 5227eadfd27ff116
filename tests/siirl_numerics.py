"""Tolerances for numerical comparisons, derived from the dtype and the operation, and
assertions that say the worst difference, where, and the tolerance used when they fail.

Two computations of the same numbers that differ only in rounding (another summation
order: threads, ranks, packed instead of padded rows, split attention heads) are compared
with :func:`rounding`. Adam's update divides by ``sqrt(v) + eps``, which turns a rounding
difference in a near-zero gradient into a weight difference of up to ``lr * dg / eps``:
weights after an Adam step are compared with :func:`assert_adam_step_close`, which allows
exactly what the two runs' gradients explain.

Every failure message carries torch's report (mismatched elements, greatest absolute and
relative difference and their index) and the tolerance's derivation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping

import torch

# Chance that a correct comparison fails anyway, in the probabilistic bound below.
FALSE_FAILURE_PROBABILITY = 1e-6
# Roundings in one Adam(W) update of one weight on either side of a comparison: the two
# moments, sqrt, the bias corrections, + eps, the division, the step size and the
# subtraction from the weight.
ADAM_ROUNDINGS = 8


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    why: str

    def __str__(self) -> str:
        return f"atol={self.atol:.3g}, rtol={self.rtol:.3g} ({self.why})"


def unit_roundoff(dtype: torch.dtype) -> float:
    """u: the largest relative error of one rounding (half of torch.finfo's eps)."""
    return torch.finfo(dtype).eps / 2


def rounding(dtype: torch.dtype, terms: int, magnitude: float = 1.0,
             elements: int = 1) -> Tolerance:
    """Two computations of the same values whose roundings differ.

    A value that went through ``terms`` roundings (the summed lengths of the reductions on
    its path) is within ``lam * sqrt(terms) * u * magnitude`` of the exact value, where
    ``magnitude`` is the size of the summed terms (Higham & Mary, "A new approach to
    probabilistic rounding error analysis", SIAM J. Sci. Comput. 2019, Thm 3.1: rounding
    errors as independent mean-zero variables). The bound fails with probability at most
    ``2 * terms * exp(-lam**2 / 2)`` per value; ``lam`` is chosen so that all ``elements``
    compared fail together with probability below FALSE_FAILURE_PROBABILITY. Two
    computations may each be off by the bound: twice it is allowed.
    """
    u = unit_roundoff(dtype)
    trials = 2 * max(terms, 1) * max(elements, 1)
    lam = math.sqrt(2 * math.log(trials / FALSE_FAILURE_PROBABILITY))
    bound = 2 * lam * math.sqrt(max(terms, 1)) * u
    return Tolerance(atol=bound * magnitude, rtol=bound,
                     why=f"{dtype} rounding over {terms} terms of size {magnitude:.3g}, "
                         f"{elements} values: 2 * {lam:.2f} * sqrt({terms}) * u")


def transformer_terms(config: Any, positions: int, backward: bool = False,
                      tokens: int | None = None) -> int:
    """The summed reduction lengths on a decoder's path from input to log-probs: per layer
    the attention projections (hidden), scores (head_dim) and their weighted values
    (positions), the output projection (heads * head_dim), the MLP's gate/up (hidden) and
    down (intermediate) projections; then the head (hidden) and the log-softmax (vocab).
    Gradients come back through the same reductions and sum over the ``tokens`` of the
    batch (default: ``positions``)."""
    hidden = int(config.hidden_size)
    head_dim = int(getattr(config, "head_dim", None) or hidden // config.num_attention_heads)
    heads = int(config.num_attention_heads)
    layer = hidden + head_dim + positions + heads * head_dim + hidden + \
        int(config.intermediate_size)
    forward = int(config.num_hidden_layers) * layer + hidden + int(config.vocab_size)
    return 2 * forward + (positions if tokens is None else tokens) if backward else forward


def vla_terms(config: Any, positions: int) -> int:
    """transformer_terms of a VLA's decoder plus its image encoder's reductions: 3x3
    convolutions over their input channels and 2 coordinate channels (CoordConv), then the
    projection (siiRL's builtin tiny VLA)."""
    vision, width = 0, 3
    for out in config.image_channels:
        vision, width = vision + 9 * (width + 2), int(out)
    return transformer_terms(config, positions) + vision + width


def assert_metrics_close(got: Mapping[str, float], want: Mapping[str, float], keys: Any,
                         terms: Callable[[str], int], what: str = "") -> None:
    """Scalar metrics of two runs (losses, norms, fractions), each within the float32
    rounding of the ``terms(key)`` roundings behind it."""
    for key in keys:
        tol = rounding(torch.float32, terms(key), max(abs(want[key]), 1.0))
        assert_close(got[key], want[key], tol, f"{what}{key}")


def scale_of(tensor: torch.Tensor) -> float:
    """The largest |value|: the size of the terms a value of ``tensor`` sums (the terms of a
    normalised network's reductions are of the size of its outputs)."""
    return float(tensor.detach().abs().max()) if tensor.numel() else 0.0


def _message(what: str, tol: Tolerance) -> Callable[[str], str]:
    return lambda report: f"{what}: {report}\nTolerance: {tol}"


def assert_close(got: Any, want: Any, tol: Tolerance, what: str = "values") -> None:
    """torch.testing.assert_close with ``tol``; the failure keeps torch's report of the
    worst differences and adds ``what`` and the tolerance's derivation."""
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol,
                               msg=_message(what, tol))


def assert_all_close(got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor],
                     tolerance: Callable[[torch.Tensor], Tolerance], what: str = "") -> None:
    """Every tensor of ``want`` (same keys in ``got``), each with ``tolerance(want[key])``."""
    assert got.keys() == want.keys(), (sorted(got.keys() ^ want.keys()), what)
    for key in want:
        assert_close(got[key], want[key], tolerance(want[key]), f"{what}{key}")


def assert_adam_step_close(got_weights: Mapping[str, torch.Tensor],
                           want_weights: Mapping[str, torch.Tensor],
                           got_grads: Mapping[str, torch.Tensor],
                           want_grads: Mapping[str, torch.Tensor], lr: float,
                           eps: float, what: str = "weights after one Adam step: ") -> None:
    """Weights after one Adam(W) step (no weight decay) from the same weights, with the
    gradients each run stepped on.

    The first step moves a weight by ``lr * g / (|g| + eps)`` (the moments' bias
    corrections cancel); two runs whose gradients differ by rounding therefore differ by
    ``lr * |f(g1) - f(g2)|`` (at most ``lr * |g1 - g2| / eps`` near g = 0), computed here in
    float64 for every element, plus ADAM_ROUNDINGS roundings of the update and the weight
    on each side. Gradients are compared on their own with :func:`rounding`.
    """
    assert got_weights.keys() == want_weights.keys(), sorted(got_weights.keys() ^
                                                             want_weights.keys())
    for key, want in want_weights.items():
        got = got_weights[key]
        explained = torch.zeros_like(want, dtype=torch.float64)
        if key in want_grads:
            g1, g2 = got_grads[key].double(), want_grads[key].double()
            explained = lr * (g1 / (g1.abs() + eps) - g2 / (g2.abs() + eps)).abs()
        u = unit_roundoff(want.dtype)
        bound = explained + 2 * ADAM_ROUNDINGS * u * (want.double().abs() + lr)
        diff = (got.double() - want.double()).abs()
        if bool((diff <= bound).all()):
            continue
        worst = int((diff - bound).argmax())
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), want.shape))
        raise AssertionError(
            f"{what}{key}: {int((diff > bound).sum())} of {want.numel()} elements differ by "
            f"more than Adam's first step explains; worst at {index}: got "
            f"{got.flatten()[worst].item():.9g}, want {want.flatten()[worst].item():.9g}, "
            f"difference {diff.flatten()[worst].item():.3g} > allowed "
            f"{bound.flatten()[worst].item():.3g} (lr={lr:g} * |g/(|g|+eps) difference| "
            f"{explained.flatten()[worst].item():.3g} for gradients "
            f"{got_grads[key].flatten()[worst].item() if key in got_grads else 0:.3g} / "
            f"{want_grads[key].flatten()[worst].item() if key in want_grads else 0:.3g}, "
            f"eps={eps:g}, plus {ADAM_ROUNDINGS} roundings of the update on each side); "
            f"the largest difference is {diff.max().item():.3g}")


def optimizer_settings(optimizer: torch.optim.Optimizer) -> Dict[str, float]:
    """lr and eps of an optimizer's (single) parameter group, as the step used them."""
    group = optimizer.param_groups[0]
    steps = {int(state["step"]) for state in optimizer.state.values() if "step" in state}
    assert steps == {1}, f"the Adam bound holds for the first step; the optimizer took {steps}"
    assert float(group.get("weight_decay", 0.0)) == 0.0, "the Adam bound assumes no decay"
    return {"lr": float(group["lr"]), "eps": float(group["eps"])}
