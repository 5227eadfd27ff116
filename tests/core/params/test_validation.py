"""One validation pass before anything loads (issue 16): each bad setting is named with its
key, its value and the rule; every problem of a command comes out at once; the shipped
presets and the README's commands still pass."""

import fnmatch
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from siirl.errors import ConfigError
from siirl.params.parser import parse_config
from siirl.params.validation import InvalidConfigError, config_problems

REPO = Path(__file__).resolve().parents[3]
A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"


def problems_of(*overrides, config_file=None):
    with pytest.raises(InvalidConfigError) as info:
        parse_config(list(overrides), config_file, validate=True)
    return info.value.problems, str(info.value)


# (override(s), the key the message must name, the value as it must appear)
BAD = [
    # sizes and counts
    ("data.train_batch_size=0", "data.train_batch_size", "0"),
    ("data.train_batch_size=-16", "data.train_batch_size", "-16"),
    ("data.max_prompt_length=-1", "data.max_prompt_length", "-1"),
    ("data.max_response_length=0", "data.max_response_length", "0"),
    ("data.val_batch_size=0", "data.val_batch_size", "0"),
    ("data.gen_batch_size=0", "data.gen_batch_size", "0"),
    ("data.dataloader_num_workers=-1", "data.dataloader_num_workers", "-1"),
    (f"{R}.n=0", f"{R}.n", "0"),
    (f"{R}.n=-4", f"{R}.n", "-4"),
    (f"{A}.ppo_mini_batch_size=0", f"{A}.ppo_mini_batch_size", "0"),
    (f"{A}.ppo_micro_batch_size_per_gpu=0", f"{A}.ppo_micro_batch_size_per_gpu", "0"),
    (f"{A}.ppo_epochs=0", f"{A}.ppo_epochs", "0"),
    (f"{R}.log_prob_micro_batch_size_per_gpu=-2", f"{R}.log_prob_micro_batch_size_per_gpu",
     "-2"),
    ("critic.ppo_micro_batch_size_per_gpu=0", "critic.ppo_micro_batch_size_per_gpu", "0"),
    ("trainer.total_epochs=0", "trainer.total_epochs", "0"),
    ("trainer.total_training_steps=-5", "trainer.total_training_steps", "-5"),
    ("trainer.n_gpus_per_node=0", "trainer.n_gpus_per_node", "0"),
    ("trainer.nnodes=0", "trainer.nnodes", "0"),
    ("trainer.save_freq=-2", "trainer.save_freq", "-2"),
    ("trainer.cpu_threads=0", "trainer.cpu_threads", "0"),
    ("trainer.dist_timeout_s=0", "trainer.dist_timeout_s", "0"),
    ("trainer.heartbeat_timeout_s=-1", "trainer.heartbeat_timeout_s", "-1.0"),
    # probabilities and fractions
    (f"{R}.top_p=1.5", f"{R}.top_p", "1.5"),
    (f"{R}.top_p=-0.1", f"{R}.top_p", "-0.1"),
    (f"{R}.val_kwargs.top_p=0", f"{R}.val_kwargs.top_p", "0.0"),
    (f"{R}.gpu_memory_utilization=1.5", f"{R}.gpu_memory_utilization", "1.5"),
    (f"{R}.top_k=-2", f"{R}.top_k", "-2"),
    ("algorithm.gamma=1.5", "algorithm.gamma", "1.5"),
    ("algorithm.lam=-0.5", "algorithm.lam", "-0.5"),
    (f"{A}.optim.lr_warmup_steps_ratio=1.5", f"{A}.optim.lr_warmup_steps_ratio", "1.5"),
    (f"{A}.optim.betas=[0.9,1.5]", f"{A}.optim.betas", "1.5"),
    # rates, coefficients and clips
    (f"{R}.temperature=-1", f"{R}.temperature", "-1.0"),
    (f"{A}.optim.lr=nan", f"{A}.optim.lr", "nan"),
    (f"{A}.optim.lr=inf", f"{A}.optim.lr", "inf"),
    (f"{A}.optim.lr=-0.001", f"{A}.optim.lr", "-0.001"),
    ("critic.optim.lr=nan", "critic.optim.lr", "nan"),
    (f"{A}.optim.weight_decay=-0.01", f"{A}.optim.weight_decay", "-0.01"),
    (f"{A}.clip_ratio=-0.2", f"{A}.clip_ratio", "-0.2"),
    (f"{A}.clip_ratio_low=-0.1", f"{A}.clip_ratio_low", "-0.1"),
    (f"{A}.clip_ratio_high=-0.1", f"{A}.clip_ratio_high", "-0.1"),
    (f"{A}.clip_ratio_c=0.5", f"{A}.clip_ratio_c", "0.5"),
    (f"{A}.clip_ratio_c=1.0", f"{A}.clip_ratio_c", "1.0"),
    (f"{A}.grad_clip=-1", f"{A}.grad_clip", "-1.0"),
    (f"{A}.kl_loss_coef=-0.001", f"{A}.kl_loss_coef", "-0.001"),
    (f"{A}.entropy_coeff=inf", f"{A}.entropy_coeff", "inf"),
    # closed sets and registered names
    ("data.truncation=middle", "data.truncation", "'middle'"),
    ("trainer.resume_mode=sometimes", "trainer.resume_mode", "'sometimes'"),
    ("trainer.device=tpu", "trainer.device", "'tpu'"),
    (f"{A}.optim.warmup_style=linear", f"{A}.optim.warmup_style", "'linear'"),
    ("algorithm.adv_estimator=magic", "algorithm.adv_estimator", "'magic'"),
    (f"{A}.loss_agg_mode=average", f"{A}.loss_agg_mode", "'average'"),
    (f"{A}.policy_loss.loss_mode=ppo2", f"{A}.policy_loss.loss_mode", "'ppo2'"),
    # relations between keys
    ((f"{A}.ppo_mini_batch_size=12", "data.train_batch_size=16"), f"{A}.ppo_mini_batch_size",
     "12"),
    ((f"{A}.ppo_mini_batch_size=32", "data.train_batch_size=16"), f"{A}.ppo_mini_batch_size",
     "32"),
    ((f"{A}.ppo_micro_batch_size_per_gpu=3", f"{A}.ppo_mini_batch_size=4", f"{R}.n=2",
      "data.train_batch_size=8"), f"{A}.ppo_micro_batch_size_per_gpu", "3"),
    (("data.train_batch_size=15", f"{A}.ppo_mini_batch_size=15", "trainer.n_gpus_per_node=2"),
     "data.train_batch_size", "15"),
    ((f"{R}.max_model_len=100", "data.max_prompt_length=64", "data.max_response_length=64"),
     f"{R}.max_model_len", "100"),
    ((f"{R}.tensor_model_parallel_size=2",), f"{R}.tensor_model_parallel_size", "2"),
    ((f"{A}.policy_loss.clip_cov_lb=6.0", f"{A}.policy_loss.clip_cov_ub=1.0"),
     f"{A}.policy_loss.clip_cov_lb", "6.0"),
    (("algorithm.embodied_sampling.accuracy_lower_bound=0.9",
      "algorithm.embodied_sampling.accuracy_upper_bound=0.1"),
     "algorithm.embodied_sampling.accuracy_lower_bound", "0.9"),
    (("trainer.resume_mode=resume_path",), "trainer.resume_mode", "resume_path"),
    (("reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=9",
      "data.max_response_length=8"), "reward_model.overlong_buffer.len", "9"),
    # a refused key, in the same pass
    (f"{R}.response_length=16", f"{R}.response_length", "16"),
]


def _id(case):
    overrides = case[0] if isinstance(case[0], tuple) else (case[0],)
    return overrides[0]


@pytest.mark.parametrize("overrides,key,value", BAD, ids=[_id(c) for c in BAD])
def test_a_bad_setting_is_named_with_its_value_and_rule(overrides, key, value):
    overrides = overrides if isinstance(overrides, tuple) else (overrides,)
    problems, message = problems_of(*overrides)
    assert len(problems) == 1, problems  # named once, not again at the keys that follow it
    line = problems[0]
    assert key in line and re.search(rf"(?<![\w.-]){re.escape(value)}(?![\w.])", line), line
    assert "must" in line or "needs" in line or "would ignore" in line, line  # the rule
    assert message == line and "\n" not in message


def test_every_problem_comes_out_at_once_as_a_numbered_list():
    problems, message = problems_of("data.train_batch_size=0", f"{R}.n=0", f"{A}.optim.lr=nan",
                                    "trainer.totl_training_steps=5", "trainer.total_epochs=x")
    assert len(problems) == 5
    lines = message.splitlines()
    assert lines[0] == "5 problems in the configuration (nothing was started):"
    assert [line.split(".", 1)[0].strip() for line in lines[1:]] == ["1", "2", "3", "4", "5"]
    for needle in ("data.train_batch_size=0", f"{R}.n=0", f"{A}.optim.lr=nan",
                   "did you mean trainer.total_training_steps", "trainer.total_epochs"):
        assert needle in message, needle


def test_without_validate_parse_config_stays_lenient():
    # engine tests build deliberately partial configurations to reach the engines' checks
    parse_config([f"{A}.ppo_micro_batch_size_per_gpu=3", f"{R}.server_timeout_s=0"])
    with pytest.raises(ConfigError):  # the overlong buffer was always checked (issue 13)
        parse_config(["reward_model.overlong_buffer.enable=true",
                      "reward_model.overlong_buffer.len=0"])


def test_the_critic_is_checked_when_it_runs_and_named_once():
    assert parse_config(["critic.ppo_micro_batch_size_per_gpu=3"], validate=True)  # no critic
    problems, _ = problems_of("algorithm.adv_estimator=gae",
                              "critic.ppo_micro_batch_size_per_gpu=3")
    assert len(problems) == 1 and problems[0].startswith("critic.ppo_micro_batch_size_per_gpu=3")
    problems, _ = problems_of(f"{A}.ppo_mini_batch_size=0")  # critic's follows: named once
    assert len(problems) == 1 and problems[0].startswith(f"{A}.ppo_mini_batch_size=0")


def test_each_worker_loads_whole_prompts_of_every_mini_batch():
    """N workers train like one with several mini-batches per step only if each worker
    loads an equal share of every mini-batch (siirl.params.mini_batch_layout)."""
    two = ["trainer.n_gpus_per_node=2", "data.train_batch_size=4", f"{R}.n=2"]
    problems, _ = problems_of(*two, f"{A}.ppo_mini_batch_size=1")
    assert problems == [f"{A}.ppo_mini_batch_size=1 does not split evenly over the 2 workers "
                        "that load prompts (2 = trainer.nnodes x trainer.n_gpus_per_node): "
                        "each worker loads an equal share of every PPO mini-batch, so that N "
                        "workers train each optimizer step on the same rows as one worker; "
                        "use a mini-batch size that is a multiple of 2"]
    # a training critic's mini-batches count too: runs of gcd(2, 3) = 1 prompt
    problems, _ = problems_of("trainer.n_gpus_per_node=2", "data.train_batch_size=6", f"{R}.n=2",
                              "algorithm.adv_estimator=gae", f"{A}.ppo_mini_batch_size=2",
                              "critic.ppo_mini_batch_size=3")
    assert len(problems) == 1 and problems[0].startswith(
        f"{A}.ppo_mini_batch_size=2 and critic.ppo_mini_batch_size=3 cut each step into runs "
        "of 1 prompts (their gcd), which do not split evenly over the 2 workers")
    parse_config([*two, f"{A}.ppo_mini_batch_size=2"], validate=True)  # 1 prompt each
    parse_config([*two[1:], f"{A}.ppo_mini_batch_size=1"], validate=True)  # one worker
    # dynamic sampling loads data.gen_batch_size prompts a round: no layout to keep
    parse_config([*two, f"{A}.ppo_mini_batch_size=1", "algorithm.workflow_type=DAPO",
                  "algorithm.filter_groups.enable=true"], validate=True)


def test_megatron_groups_must_divide_the_workers():
    megatron = [f"{A}.strategy=megatron", f"{A}.megatron.pipeline_model_parallel_size=2"]
    parse_config(megatron + ["trainer.n_gpus_per_node=2"], validate=True)
    problems, _ = problems_of(*megatron, "trainer.n_gpus_per_node=3",
                              "data.train_batch_size=30")
    assert any("pipeline_model_parallel_size=2" in p and "workers (3" in p for p in problems)


def test_registered_names_are_left_to_user_code_that_may_register_them():
    parse_config(["algorithm.adv_estimator=my_estimator",
                  "dag.custom_pipeline_fn=my_module:pipeline"], validate=True)


def test_every_rule_names_schema_keys():
    from siirl.params.key_support import leaf_defaults
    from siirl.params.sections import section_value_rules
    from siirl.params.value_rules import RULES, USER_CODE_KEYS, registries

    leaves = leaf_defaults()
    for rule in (*RULES, *section_value_rules()):
        for pattern in rule.patterns:
            assert fnmatch.filter(leaves, pattern), pattern
    for key in [k for keys, _ in registries() for k in keys] + list(USER_CODE_KEYS):
        assert key in leaves, key


@pytest.mark.parametrize("key, register, registry", [
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "register_policy_loss", "POLICY_LOSSES"),
    ("algorithm.adv_estimator", "register_adv_est", "ADV_ESTIMATORS"),
])
def test_a_name_registered_in_core_algos_is_valid_without_editing_params(key, register,
                                                                        registry):
    """The validation pass reads the registries: registering a loss or an estimator under a
    new name (as user code does) is all it takes for the name to pass."""
    from siirl.dag_worker import core_algos
    from siirl.dag_worker.core_algos import names

    name = "test_only_registered_name"
    with pytest.raises(InvalidConfigError, match=f"{re.escape(key)}='{name}': must be a "
                       "registered"):
        parse_config([f"{key}={name}"], validate=True)
    try:
        getattr(core_algos, register)(name)(lambda *args, **kwargs: None)
        parse_config([f"{key}={name}"], validate=True)
    finally:
        getattr(names, registry)._entries.pop(name, None)


@pytest.fixture
def any_machine(monkeypatch):
    """The configuration alone: a machine that may show a GPU and has every optional
    package (what this one lacks is refused too, see tests/core/launch)."""
    from siirl.params import machine

    monkeypatch.setattr(machine, "shows_no_gpu", lambda: False)
    monkeypatch.setattr(machine, "_installed", lambda module: True)


def test_defaults_and_shipped_presets_validate(any_machine):
    assert config_problems(OmegaConf.to_object(parse_config([]))) == []
    presets = sorted((REPO / "configs").glob("*.yaml"))
    assert presets
    for preset in presets:
        parse_config([], str(preset), validate=True)


def _readme_commands():
    """The siirl-train commands of the README and of the reference pages in docs/."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    text = "\n".join(page.read_text() for page in pages)
    # docs/cluster.md's HEAD_IP is the reader's head node: an address from the documentation range
    text = text.replace("HEAD_IP", "192.0.2.1")
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            if "siirl-train" in line:
                yield shlex.split(line.split("siirl-train", 1)[1], comments=True)


def test_the_readme_commands_validate(any_machine):
    commands = list(_readme_commands())
    assert len(commands) >= 8
    for words in commands:
        preset, overrides, args = None, [], iter(words)
        for word in args:
            if word == "--config":
                preset = str(REPO / next(args))
            elif "=" in word and not word.startswith("-") and word != "key=value":
                overrides.append(word)
        parse_config(overrides, preset, validate=True)


def test_the_cli_exits_2_with_the_list_and_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "siirl.main_dag", "data.train_batch_size=0",
                           f"{A}.optim.lr=nan", "--print-config"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert "2 problems" in proc.stderr and "1. data.train_batch_size=0" in proc.stderr
    assert f"2. {A}.optim.lr=nan: must be a finite number" in proc.stderr
