"""The range and choice of each configuration key on its own: sizes and counts at least 1,
probabilities in [0, 1], finite learning rates, names from a fixed set...

Each rule names keys (dotted, or fnmatch globs), a test of one value and the rule in words
("must be at least 1"). ``siirl.params.validation`` applies them to every leaf, together
with the rules tying keys to each other (``siirl.params.constraints``). A value of None is
left alone unless a rule says otherwise (optional keys are null by default). Every number
must also be finite: a NaN or an infinity anywhere in the schema is refused.

Names chosen from a registry that user code may extend (advantage estimators, policy
losses, loss aggregation, KL estimators...) are read from the registries themselves
(``registries()``): a name outside them is refused only when no user code is configured
that could register it (else the registry checks it at start-up). Plugin names (engines,
rollouts, reward managers) are checked by the plugin registry; the lr schedules are the
installed backends' (their config sections' ``"lr_schedules"`` name table).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
from typing import Any, Callable, Collection, Tuple, Union

from siirl.data_coordinator.tasks import TASK_NAMES
from siirl.params.rollout_correction import IS_LEVELS, LOSS_TYPES, RS_OPTIONS, rs_options
from siirl.params.sections import installed_names
from siirl.params.training_args import DEVICES

Test = Callable[[Any], bool]


@dataclasses.dataclass(frozen=True)
class ValueRule:
    patterns: Tuple[str, ...]  # dotted keys or fnmatch globs
    test: Callable[[Any], bool]  # True: the value is fine
    # what the value must be, in words ("must be at least 1"); a function for a rule over
    # names that plugins extend, so the words list them as they are when a value fails
    rule: Union[str, Callable[[], str]]
    optional: bool = True  # None passes

    @property
    def words(self) -> str:
        return self.rule() if callable(self.rule) else self.rule


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


def _rule(patterns, test: Test, rule: Union[str, Callable[[], str]],
          optional: bool = True) -> ValueRule:
    patterns = (patterns,) if isinstance(patterns, str) else tuple(patterns)
    return ValueRule(patterns, test, rule, optional)


def at_least(low: float, patterns, note: str = "") -> ValueRule:
    return _rule(patterns, lambda v: finite(v) and v >= low, f"must be at least {low}{note}")


def above(low: float, patterns, note: str = "") -> ValueRule:
    return _rule(patterns, lambda v: finite(v) and v > low,
                 f"must be a finite number above {low}{note}")


def within(low: float, high: float, patterns, low_open: bool = False,
           high_open: bool = False) -> ValueRule:
    def test(v: Any) -> bool:
        return finite(v) and (v > low if low_open else v >= low) and \
            (v < high if high_open else v <= high)

    span = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    return _rule(patterns, test, f"must be in {span}")


def one_of(choices: Union[Collection[str], Callable[[], Collection[str]]],
           patterns) -> ValueRule:
    """``choices``: the names, or a function returning them (read at each check: a table
    that plugins extend)."""
    names = choices if callable(choices) else (lambda: choices)

    def allowed(value: Any) -> bool:
        # an empty table: no installed package provides it (siirl-core alone, no engine);
        # the missing engine stops the run where it is needed, not this check
        known = names()
        return not known or value in known

    return _rule(patterns, allowed, lambda: f"must be one of: {', '.join(names())}")


def _lr_schedules() -> Collection[str]:
    return installed_names("lr_schedules")


def _ip_address(value: Any) -> bool:
    try:
        ipaddress.ip_address(str(value))
    except ValueError:
        return False
    return True


def _paths(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    return isinstance(value, (list, tuple)) and bool(value) and \
        all(isinstance(p, str) and p.strip() for p in value)


def _betas(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 2 and \
        all(finite(b) and 0 <= b < 1 for b in value)


def _rs_criteria(value: Any) -> bool:
    try:
        rs_options(value)
    except ValueError:
        return False
    return True


A, R, C = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "critic"

RULES: Tuple[ValueRule, ...] = (
    # -- sizes and counts
    at_least(1, ("data.train_batch_size", "data.gen_batch_size", "data.max_prompt_length",
                 "data.max_response_length", "data.filter_overlong_prompts_workers",
                 f"{A}.ppo_mini_batch_size", f"{A}.ppo_epochs", f"{C}.ppo_mini_batch_size",
                 f"{C}.ppo_epochs", f"{C}.rollout_n", f"{R}.n", f"{R}.val_kwargs.n",
                 f"{R}.prompt_length", f"{R}.response_length", f"{R}.max_num_seqs",
                 f"{R}.update_weights_bucket_megabytes", f"{R}.model_update_frequency",
                 "*_max_token_len_per_gpu", "*.ulysses_sequence_parallel_size",
                 "*tensor_model_parallel_size",
                 "trainer.total_epochs", "trainer.nnodes", "trainer.n_gpus_per_node",
                 "rollout.nnodes", "rollout.n_gpus_per_node",
                 "async_training.trigger_parameter_sync_step", "async_training.require_batches",
                 "trainer.dist_timeout_s", "trainer.ray_wait_register_center_timeout",
                 "algorithm.kl_ctrl.horizon", "reward_model.sandbox_fusion.max_concurrent",
                 "reward_model.sandbox_fusion.memory_limit_mb")),
    # optional sizes: null means "not set", but a number must be a real size
    at_least(1, ("data.val_batch_size", "*micro_batch_size", "*micro_batch_size_per_gpu",
                 "reward_model.max_length",
                 "trainer.total_training_steps", "trainer.cpu_threads"), " (or null)"),
    at_least(0, ("data.dataloader_num_workers", "trainer.critic_warmup",
                 "async_training.staleness_threshold",
                 "trainer.log_val_generations", "reward_model.max_failed_steps",
                 "reward_model.overlong_buffer.len", "*.lora_rank")),
    at_least(-1, ("trainer.save_freq", "trainer.test_freq"),
             " (a number of steps; -1 or 0: never)"),
    at_least(-1, (f"{R}.top_k", f"{R}.val_kwargs.top_k"), " (-1 or 0: off)"),
    # -- probabilities and fractions
    within(0, 1, ("algorithm.gamma", "algorithm.lam", "algorithm.embodied_sampling.*_bound",
                  "*.optim.lr_warmup_steps_ratio", "*.optim.min_lr_ratio",
                  f"{A}.clip_ratio_low")),
    within(0, 1, (f"{R}.top_p", f"{R}.val_kwargs.top_p", f"{A}.policy_loss.clip_cov_ratio",
                  f"{A}.policy_loss.kl_cov_ratio"), low_open=True),
    _rule("*.optim.betas", _betas, "must be two numbers in [0, 1) (Adam's beta1, beta2)"),
    # -- rates, coefficients, clips: finite, and not negative where a sign makes no sense
    at_least(0, ("*.optim.lr", "*.optim.weight_decay", "*.optim.num_cycles",
                 f"{R}.temperature", f"{R}.val_kwargs.temperature", f"{A}.clip_ratio",
                 f"{A}.clip_ratio_high", f"{A}.kl_loss_coef", f"{A}.policy_loss.clip_cov_lb",
                 f"{A}.policy_loss.clip_cov_ub", f"{A}.policy_loss.ppo_kl_coef",
                 "algorithm.kl_ctrl.kl_coef", "algorithm.pf_ppo.weight_pow",
                 "reward_model.overlong_buffer.penalty_factor")),
    above(0, (f"{A}.grad_clip", f"{C}.grad_clip", f"{C}.cliprange_value",
              "algorithm.kl_ctrl.target_kl",
              "trainer.heartbeat_timeout_s", "trainer.ray_connect_timeout_s",
              "reward_model.step_timeout_s")),
    above(1, f"{A}.clip_ratio_c", " (the dual-clip bound on negative advantages)"),
    above(0, "algorithm.rollout_correction.rollout_is_threshold",
          " (the importance weights' truncation)"),
    # -- closed sets of names
    one_of(("error", "left", "right"), "data.truncation"),
    one_of(TASK_NAMES, "data.builtin_task"),
    one_of(("auto", "disable", "resume_path"), "trainer.resume_mode"),
    one_of(DEVICES, "trainer.device"),
    one_of(_lr_schedules, ("*.optim.warmup_style", "*.optim.lr_scheduler_type")),
    one_of(("error", "warn"), "algorithm.filter_groups.on_exhausted"),
    one_of(IS_LEVELS, "algorithm.rollout_correction.rollout_is"),
    one_of(LOSS_TYPES, "algorithm.rollout_correction.loss_type"),
    _rule("algorithm.rollout_correction.rollout_rs", _rs_criteria,
          "must be comma-separated criteria, each of " + ", ".join(RS_OPTIONS)),
    one_of(("discriminative", "generative"), "reward_model.style"),
    one_of(("register", "importlib"), "reward_manager.source"),
    # -- keys typed Any in the schema
    _rule(("data.train_files", "data.val_files"), _paths,
          "must be a file path or a list of file paths (or null: the built-in task)"),
    _rule("trainer.ray_node_ip", _ip_address,
          "must be an IP address (what `ray start --node-ip-address` was given)"),
    _rule("data.prompt_key", lambda v: isinstance(v, str) and bool(v.strip()),
          "must name the prompt column", optional=False),
)

# The keys whose value names an entry of a registry user code may extend
# (siirl.dag_worker.core_algos register_*), with that registry's name in
# siirl.dag_worker.core_algos.names, where the built-in names are listed without torch.
# A name outside the registry is refused only when the configuration imports no user code
# that could have registered it.
REGISTRY_KEYS = (
    (("algorithm.adv_estimator",), "ADV_ESTIMATORS"),
    ((f"{A}.loss_agg_mode", f"{C}.loss_agg_mode"), "AGG_MODES"),
    ((f"{A}.policy_loss.loss_mode",), "POLICY_LOSSES"),
    ((f"{A}.kl_loss_type", "algorithm.kl_penalty"), "KL_ESTIMATORS"),
    (("algorithm.kl_ctrl.type",), "KL_CONTROLLERS"),
    (("algorithm.weight_factor_in_cpgd",), "CPGD_WEIGHTS"),
)


def registries() -> Tuple[Tuple[Tuple[str, ...], Any], ...]:
    """(keys, registry) for each of ``REGISTRY_KEYS``: the live registries, so a name
    registered in this process (a test, a notebook) is valid as well."""
    from siirl.dag_worker.core_algos import names

    return tuple((keys, getattr(names, registry)) for keys, registry in REGISTRY_KEYS)
# keys naming user code, imported before the registries are read
USER_CODE_KEYS = ("dag.custom_pipeline_fn", "dag.workflow_path", "dag.pipeline",
                  "custom_reward_function.path", "actor_rollout_ref.model.external_lib",
                  "reward_manager.module.path")
