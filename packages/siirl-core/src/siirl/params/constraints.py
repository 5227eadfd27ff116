"""Value constraints that tie one key to another, checked when the configuration is parsed.

The schema catches unknown keys and wrong types, ``value_rules`` the range of each key on its
own, ``key_support`` keys this release would ignore. A value that is well typed and in range
but impossible together with another key (a mini-batch that does not divide the batch, a
context shorter than a prompt plus its response) is caught here, so the run stops before
any model loads. Each check returns one line per problem naming the keys, their values and
the rule; a check whose inputs are themselves out of range says nothing (``value_rules``
names those). The engines keep their own checks for configurations built without the
parser.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from siirl.errors import ConfigError
from siirl.params.key_paths import value_at
from siirl.params.mini_batch_layout import critic_trains, mini_batch_share_problems
from siirl.params.rollout_correction import rollout_correction_problems
from siirl.params.run_shape import size as _size
from siirl.params.run_shape import workers as _workers
from siirl.params.run_shape import workers_text as _workers_text
from siirl.params.sections import section_constraints, section_selected_by

A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
_OVERLONG = "reward_model.overlong_buffer"


def _get(config: Any, key: str) -> Any:
    return value_at(config, key)


def _number(config: Any, key: str) -> Optional[float]:
    value = _get(config, key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    return value if ok else None


# ---- the checks ----------------------------------------------------------------------------

def _overlong_buffer_fits(config: Any) -> List[str]:
    if not _get(config, f"{_OVERLONG}.enable"):
        return []
    length = _get(config, f"{_OVERLONG}.len")
    max_len = _get(config, "data.max_response_length")
    if max_len is None or not 1 <= int(length or 0) <= int(max_len):
        return [f"{_OVERLONG}.len={length} must be in 1..data.max_response_length ({max_len}) "
                f"when {_OVERLONG}.enable is set: the penalty ramps over the last len tokens "
                "a response may have (lower the buffer, or raise data.max_response_length)"]
    return []


def _batch_splits_over_workers(config: Any) -> List[str]:
    workers, batch = _workers(config), _size(config, "data.train_batch_size")
    if workers and batch and batch % workers:
        return [f"data.train_batch_size={batch} must be divisible by {_workers_text(workers)}: "
                "every worker takes an equal slice of each batch"]
    return []


def _rollout_parallel_fits(config: Any) -> List[str]:
    workers = _workers(config)
    if not workers:
        return []
    problems = []
    tp = _size(config, f"{R}.tensor_model_parallel_size")
    if tp and workers % tp:
        problems.append(f"{R}.tensor_model_parallel_size={tp} must divide "
                        f"{_workers_text(workers)}")
    return problems


def _data_parallel(config: Any, prefix: str) -> Optional[int]:
    workers = _workers(config)
    section = section_selected_by(f"{prefix}.strategy", config)
    if not workers or section is None or section.model_parallel is None:
        return workers
    group = section.model_parallel(config)
    return workers // group if group and workers % group == 0 else None


def _role_batches(config: Any, prefix: str, check_mini: bool = True) -> List[str]:
    """A role's PPO batch arithmetic (siirl.engine.common.ppo_update): whole mini-batches
    per step, an equal share of each per data-parallel worker, whole micro-batches."""
    batch = _size(config, "data.train_batch_size")
    mini = _size(config, f"{prefix}.ppo_mini_batch_size")
    n, dp = _size(config, f"{R}.n"), _data_parallel(config, prefix)
    if not (batch and mini and n and dp):
        return []
    if check_mini and batch % mini:
        return [f"{prefix}.ppo_mini_batch_size={mini} must divide data.train_batch_size="
                f"{batch} (and so be at most that): each step's prompts are split into whole "
                "PPO mini-batches"]
    rows = mini * n
    if check_mini and rows % dp:
        return [f"{prefix}.ppo_mini_batch_size={mini} x {R}.n={n} = {rows} samples must split "
                f"evenly over the {dp} data-parallel workers"]
    micro = _size(config, f"{prefix}.ppo_micro_batch_size_per_gpu")
    if micro and rows % dp == 0 and (rows // dp) % micro:
        return [f"{prefix}.ppo_micro_batch_size_per_gpu={micro} must divide the {rows // dp} "
                f"samples of each worker's mini-batch ({prefix}.ppo_mini_batch_size={mini} x "
                f"{R}.n={n} / {dp} data-parallel workers)"]
    return []


def _update_batches(config: Any) -> List[str]:
    problems = _role_batches(config, A)
    if critic_trains(config):
        # the critic's mini-batch follows the actor's by default: name it only when it differs
        same = _get(config, "critic.ppo_mini_batch_size") == \
            _get(config, f"{A}.ppo_mini_batch_size")
        problems += _role_batches(config, "critic", check_mini=not same)
    return problems


def _ordered(low_key: str, high_key: str, what: str) -> Callable[[Any], List[str]]:
    def check(config: Any) -> List[str]:
        low, high = _number(config, low_key), _number(config, high_key)
        if low is not None and high is not None and low > high:
            return [f"{low_key}={low} must not exceed {high_key}={high} ({what})"]
        return []

    return check


LOGGERS = ("console", "tensorboard", "wandb")  # metrics.jsonl is always written


def logger_problems(config: Any) -> List[str]:
    return unknown_logger_problems(_get(config, "trainer.logger") or [])


def unknown_logger_problems(names: Any) -> List[str]:
    """The refusal of ``trainer.logger`` names no logger has (a name or a list of them)."""
    names = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        return [f"trainer.logger: unknown logger(s) {unknown}; available: "
                f"{', '.join(sorted(LOGGERS))} (metrics.jsonl is always written)"]
    return []


def _resume_path_given(config: Any) -> List[str]:
    if _get(config, "trainer.resume_mode") == "resume_path" and \
            not _get(config, "trainer.resume_from_path"):
        return ["trainer.resume_mode=resume_path needs trainer.resume_from_path (the "
                "checkpoint folder global_step_N to resume from)"]
    return []


def _rollout_rs_thresholds(config: Any) -> List[str]:
    section = _get(config, "algorithm.rollout_correction")
    return rollout_correction_problems(section) if section is not None else []


CHECKS: List[Callable[[Any], List[str]]] = [
    _batch_splits_over_workers,
    _rollout_parallel_fits,
    section_constraints,  # the backends' own (siirl.params.sections)
    _update_batches,
    mini_batch_share_problems,
    _overlong_buffer_fits,
    _ordered(f"{A}.policy_loss.clip_cov_lb", f"{A}.policy_loss.clip_cov_ub",
             "the bounds of the clip-cov token range"),
    _ordered("algorithm.embodied_sampling.accuracy_lower_bound",
             "algorithm.embodied_sampling.accuracy_upper_bound",
             "the success rates a task group may have to be kept"),
    _resume_path_given,
    _rollout_rs_thresholds,
    logger_problems,
]


# Checked by every parse_config call; the rest only in the validation pass
# (siirl.params.validation), so that tests and tools may still build a deliberately partial
# configuration with parse_config and exercise the engines' own checks.
ALWAYS: List[Callable[[Any], List[str]]] = [_overlong_buffer_fits]


def constraint_problems(config: Any) -> List[str]:
    """One line per constraint ``config`` breaks (empty: none)."""
    return [problem for check in CHECKS for problem in check(config)]


def check_constraints(config: Any) -> None:
    """Raise ``ConfigError`` for the first of the ``ALWAYS`` constraints ``config`` breaks."""
    problems = [problem for check in ALWAYS for problem in check(config)]
    if problems:
        raise ConfigError(problems[0])
