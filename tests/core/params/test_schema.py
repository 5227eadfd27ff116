"""Tests of the structured configuration schema in ``siirl.params``."""

import dataclasses

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from siirl import params
from siirl.params import SiiRLArguments

ROOT_GROUPS = [
    "algorithm",
    "data",
    "actor_rollout_ref",
    "critic",
    "reward_model",
    "custom_reward_function",
    "reward_manager",
    "trainer",
    "dag",
    "profiler",
    "custom_envs",
    "env_manager",
    "train_env_manager",
    "val_env_manager",
    "async_training",
    "rollout",
]

# Override paths commonly used in verl example scripts.
VERL_OVERRIDE_PATHS = [
    "data.train_files",
    "data.val_files",
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "data.filter_overlong_prompts",
    "data.truncation",
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.use_remove_padding",
    "actor_rollout_ref.model.enable_gradient_checkpointing",
    "actor_rollout_ref.actor.optim.lr",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.use_kl_loss",
    "actor_rollout_ref.actor.kl_loss_coef",
    "actor_rollout_ref.actor.kl_loss_type",
    "actor_rollout_ref.actor.entropy_coeff",
    "actor_rollout_ref.actor.fsdp_config.param_offload",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
    "actor_rollout_ref.actor.policy_loss.loss_mode",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.name",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.val_kwargs.do_sample",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.fsdp_config.param_offload",
    "critic.optim.lr",
    "critic.model.path",
    "critic.ppo_micro_batch_size_per_gpu",
    "reward_model.reward_manager",
    "reward_model.overlong_buffer.enable",
    "custom_reward_function.path",
    "custom_reward_function.name",
    "algorithm.adv_estimator",
    "algorithm.kl_ctrl.kl_coef",
    "algorithm.filter_groups.enable",
    "trainer.critic_warmup",
    "trainer.logger",
    "trainer.project_name",
    "trainer.experiment_name",
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
    "trainer.save_freq",
    "trainer.test_freq",
    "trainer.total_epochs",
    "dag.custom_pipeline_fn",
    "dag.workflow_path",
]

VERL_DEFAULTS = {
    "data.max_prompt_length": 512,
    "data.prompt_key": "prompt",
    "actor_rollout_ref.actor.strategy": "fsdp",
    "actor_rollout_ref.actor.clip_ratio": 0.2,
    "actor_rollout_ref.actor.clip_ratio_c": 3.0,
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.top_k": -1,
    "actor_rollout_ref.rollout.val_kwargs.do_sample": False,
    "critic.optim.lr": 1e-3,  # siiRL main-job default (verl: 1e-5)
    "critic.cliprange_value": 0.5,
    "reward_model.enable": False,
    "reward_model.reward_manager": "naive",
    "custom_reward_function.path": None,
    "custom_reward_function.name": "compute_score",
    "algorithm.gamma": 1.0,
    "algorithm.lam": 1.0,
    "algorithm.kl_ctrl.kl_coef": 0.001,
    "algorithm.kl_ctrl.type": "fixed",
    "algorithm.norm_adv_by_std_in_grpo": True,
    "trainer.resume_mode": "auto",
    "trainer.val_before_train": True,
}

# Where siiRL's defaults are the main job's (GRPO on the built-in model on a CPU) instead of
# verl's placeholders for multi-billion models; the key names stay verl's.
MAIN_JOB_DEFAULTS = {
    "data.max_response_length": 8,
    "data.train_batch_size": 32,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
    "actor_rollout_ref.actor.optim.lr": 2e-4,
    "actor_rollout_ref.rollout.n": 8,
    "trainer.total_epochs": 8,
    "trainer.save_freq": 100,
    "trainer.test_freq": 50,
    "actor_rollout_ref.model.path": None,
    "data.train_files": None,
}


@pytest.mark.parametrize("key,expected", sorted(MAIN_JOB_DEFAULTS.items()))
def test_main_job_defaults(cfg, key, expected):
    assert OmegaConf.select(cfg, key) == expected

SIIRL_DEFAULTS = {
    "algorithm.adv_estimator": "grpo",
    "algorithm.workflow_type": "DEFAULT",
    "actor_rollout_ref.rollout.name": "hf",
    "trainer.n_gpus_per_node": 1,
    "trainer.nnodes": 1,
    "trainer.logger": ["console"],
    "dag.custom_pipeline_fn": None,
    "dag.workflow_path": None,
    "dag.enable_perf": False,
}

_MISSING = object()


@pytest.fixture()
def cfg():
    return OmegaConf.structured(SiiRLArguments())


def test_structured_builds_from_instance_and_class(cfg):
    assert list(cfg.keys()) == ROOT_GROUPS
    assert cfg == OmegaConf.structured(SiiRLArguments)


@pytest.mark.parametrize("path", VERL_OVERRIDE_PATHS)
def test_verl_override_path_exists(cfg, path):
    assert OmegaConf.select(cfg, path, default=_MISSING) is not _MISSING


@pytest.mark.parametrize(("path", "expected"), sorted({**VERL_DEFAULTS, **SIIRL_DEFAULTS}.items()))
def test_defaults(cfg, path, expected):
    assert OmegaConf.select(cfg, path) == expected


def test_interpolations_resolve(cfg):
    resolved = OmegaConf.to_container(cfg, resolve=True)
    rollout = resolved["actor_rollout_ref"]["rollout"]
    assert rollout["prompt_length"] == 512
    assert rollout["response_length"] == 8
    assert resolved["critic"]["rollout_n"] == 8
    assert resolved["critic"]["loss_agg_mode"] == "token-mean"
    assert resolved["trainer"]["default_local_dir"] == "checkpoints/siirl_examples/arithmetic_grpo"
    ckpt = resolved["actor_rollout_ref"]["actor"]["checkpoint"]
    assert ckpt["save_contents"] == ckpt["load_contents"] == ["model", "optimizer", "extra"]


def test_yaml_round_trip(cfg):
    text = OmegaConf.to_yaml(cfg)
    reloaded = OmegaConf.create(text)
    assert reloaded == cfg
    assert OmegaConf.merge(OmegaConf.structured(SiiRLArguments), reloaded) == cfg


def test_merge_dotlist_override(cfg):
    overrides = [
        "actor_rollout_ref.rollout.n=8",
        "data.train_batch_size=256",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "algorithm.kl_ctrl.kl_coef=0.002",
        "trainer.total_epochs=15",
        "critic.optim.lr=2e-5",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "custom_reward_function.path=/tmp/reward.py",
        "reward_model.reward_manager=dapo",
        "trainer.logger=[console,wandb]",
        "data.train_files=[a.parquet,b.parquet]",
        "actor_rollout_ref.model.override_config.attention_dropout=0.0",
    ]
    merged = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    assert merged.actor_rollout_ref.rollout.n == 8
    assert merged.critic.rollout_n == 8  # interpolation follows the override
    assert merged.data.train_batch_size == 256
    assert merged.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 4
    assert merged.algorithm.kl_ctrl.kl_coef == pytest.approx(0.002)
    assert merged.trainer.total_epochs == 15
    assert merged.critic.optim.lr == pytest.approx(2e-5)
    assert merged.actor_rollout_ref.rollout.val_kwargs.do_sample is True
    assert merged.custom_reward_function.path == "/tmp/reward.py"
    assert merged.reward_model.reward_manager == "dapo"
    assert list(merged.trainer.logger) == ["console", "wandb"]
    assert list(merged.data.train_files) == ["a.parquet", "b.parquet"]
    assert merged.actor_rollout_ref.model.override_config.attention_dropout == 0.0


@pytest.mark.parametrize(
    "override", ["foo.bar=1", "trainer.no_such_key=1", "actor_rollout_ref.rollout.nn=8"]
)
def test_unknown_key_raises(cfg, override):
    with pytest.raises(ConfigKeyError):
        OmegaConf.merge(cfg, OmegaConf.from_dotlist([override]))


def test_wrong_type_raises(cfg):
    with pytest.raises(ValidationError):
        OmegaConf.merge(cfg, OmegaConf.from_dotlist(["trainer.total_epochs=abc"]))


def test_every_dataclass_has_docstring_and_is_exported():
    # core's groups are exported by siirl.params; a section a package registers
    # (siirl.config) is the schema of the section mounted there
    from siirl.params.sections import mounted_at

    seen = set()

    def walk(cls, path, in_section):
        section = mounted_at(path)
        if section is not None:
            assert section.schema is cls, path
        in_section = in_section or section is not None
        if cls in seen:
            return
        seen.add(cls)
        doc = (cls.__doc__ or "").strip()
        assert doc and not doc.startswith(cls.__name__ + "("), cls.__name__
        if not in_section:
            assert getattr(params, cls.__name__, None) is cls, cls.__name__
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(f.type):
                walk(f.type, f"{path}.{f.name}".lstrip("."), in_section)

    walk(SiiRLArguments, "", False)
    assert len(seen) > 20


def test_no_mutable_class_defaults():
    # Two instances must not share nested lists/dicts.
    a, b = SiiRLArguments(), SiiRLArguments()
    a.trainer.logger.append("wandb")
    a.actor_rollout_ref.model.override_config["x"] = 1
    assert b.trainer.logger == ["console"]
    assert b.actor_rollout_ref.model.override_config == {}
