"""``algorithm.rollout_correction``: verl's correction for training on samples that another
policy drew (an older policy under asynchronous training, or an inference engine whose
numerics differ from the trainer's), from the log-probs the rollout reports
(``rollout_log_probs``).

The keys, defaults and meanings are verl's (``RolloutCorrectionConfig``); the arithmetic
is ``siirl.dag_worker.core_algos.rollout_correction``. This module stays free of torch: the
validation pass reads it before anything loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

KEY = "algorithm.rollout_correction"
IS_LEVELS = ("token", "sequence")
LOSS_TYPES = ("ppo_clip", "reinforce")
# rejection criteria: where (one token, or a sequence's sum / mean / max of token values)
# and which divergence of r = pi_train / pi_rollout per token: k1 = -log r (kept between a
# lower and an upper ratio bound), k2 = (log r)^2 / 2, k3 = r - 1 - log r (upper bound)
# the policy losses whose per-token loss is positively homogeneous in the advantage
# (l(w A) = w l(A) for w >= 0), so that weighting the advantage weights the loss as verl does
WEIGHTED_LOSSES = ("vanilla", "gspo", "cpgd", "gpg")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


@dataclass
class RolloutCorrectionArguments:
    """verl's rollout correction: importance weights and rejection of tokens or sequences
    by how far the rollout's log-probs are from the trainer's."""

    rollout_is: Optional[str] = field(
        default=None,
        metadata={"help": "Importance weights pi_old / pi_rollout on the policy loss: token "
                          "(one per token) or sequence (the product over the response); "
                          "null: none."})
    rollout_is_threshold: float = field(
        default=2.0, metadata={"help": "Upper bound the importance weights are truncated at."})
    rollout_is_batch_normalize: bool = field(
        default=False,
        metadata={"help": "Divide the truncated weights by their mean over the batch."})
    rollout_rs: Optional[str] = field(
        default=None,
        metadata={"help": "Rejection sampling: comma-separated criteria, each of "
                          + ", ".join(RS_OPTIONS) + "; a token or sequence that fails one "
                          "leaves the loss. null: none."})
    rollout_rs_threshold: Any = field(
        default=None,
        metadata={"help": "One bound per rollout_rs criterion (comma-separated, or one for "
                          "all): k1 criteria take lower_upper ratio bounds (one number u "
                          "means 1/u_u), k2/k3 an upper bound."})
    bypass_mode: bool = field(
        default=False,
        metadata={"help": "Take the rollout's log-probs as the old log-probs: the "
                          "old-log-prob pass is left out and the loss compares the current "
                          "policy with the rollout's."})
    loss_type: str = field(
        default="ppo_clip",
        metadata={"help": "Loss in bypass mode: ppo_clip (the PPO ratio against the "
                          "rollout's policy) or reinforce (-w A log pi, w the importance "
                          "weights)."})

    @property
    def corrects(self) -> bool:
        """Whether weights or a rejection act on the loss (or the bypass replaces the old
        log-probs)."""
        return self.bypass_mode or self.rollout_is is not None or self.rollout_rs is not None

    @property
    def decoupled(self) -> bool:
        """verl's decoupled mode with a correction: weights and rejection are computed
        once per batch, before the update, from the old log-probs."""
        return self.corrects and not self.bypass_mode


def rs_options(spec: Any) -> List[str]:
    """The criteria of ``rollout_rs`` in order, duplicates dropped; ValueError names a bad
    one."""
    if not isinstance(spec, str):
        raise ValueError(f"rollout_rs must be a string of criteria, got {spec!r}")
    options: List[str] = []
    for name in (part.strip() for part in spec.split(",")):
        if not name:
            continue
        if name not in RS_OPTIONS:
            raise ValueError(f"unknown rollout_rs criterion {name!r}; the criteria are "
                             f"{', '.join(RS_OPTIONS)}")
        if name not in options:
            options.append(name)
    if not options:
        raise ValueError("rollout_rs names no criterion")
    return options


def _positive(text: str, option: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"rollout_rs_threshold {text!r} for {option} is not a number") from None
    if not value > 0:
        raise ValueError(f"rollout_rs_threshold for {option} must be positive, got {text}")
    return value


def rs_thresholds(options: List[str], spec: Any) -> Dict[str, Tuple[Optional[float], float]]:
    """``{criterion: (lower, upper)}`` from ``rollout_rs_threshold``: one entry per criterion
    or one for all; a k1 criterion's entry is ``lower_upper`` ratio bounds (a single number
    u is the upper bound, with 1/u as the lower), the others' an upper bound (lower None)."""
    if spec is None:
        raise ValueError("rollout_rs needs rollout_rs_threshold")
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"rollout_rs_threshold must be a number or a string, got {spec!r}")
    entries = [str(spec)] if not isinstance(spec, str) else \
        [part.strip() for part in spec.split(",") if part.strip()]
    if len(entries) == 1:
        entries = entries * len(options)
    if len(entries) != len(options):
        raise ValueError(f"rollout_rs_threshold has {len(entries)} entries for "
                         f"{len(options)} rollout_rs criteria: give one, or one per criterion")
    bounds: Dict[str, Tuple[Optional[float], float]] = {}
    for option, entry in zip(options, entries, strict=True):
        if option.endswith("k1"):
            lower_text, upper_text = entry.split("_", 1) if "_" in entry else ("", entry)
            upper = _positive(upper_text, option)
            lower = _positive(lower_text, option) if lower_text else 1.0 / upper
            bounds[option] = (lower, upper)
        elif "_" in entry:
            raise ValueError(f"rollout_rs_threshold for {option} is one upper bound, "
                             f"without '_' (got {entry!r})")
        else:
            bounds[option] = (None, _positive(entry, option))
    return bounds


def rollout_correction_problems(section: RolloutCorrectionArguments) -> List[str]:
    """One line per problem among the rejection keys (the validation pass's constraint)."""
    if section.rollout_rs is None:
        return []
    try:
        rs_thresholds(rs_options(section.rollout_rs), section.rollout_rs_threshold)
    except ValueError as err:
        return [f"{KEY}.rollout_rs={section.rollout_rs!r} with {KEY}.rollout_rs_threshold="
                f"{section.rollout_rs_threshold!r}: {err}"]
    return []
