"""verl's reward-loop keys (``reward_model.use_reward_loop`` and the rest of verl's
``reward_model`` section at its current head): every one is a known key here, read or
named with the reason it does not apply or is refused."""

import json
from pathlib import Path

import pytest

from siirl.errors import ConfigError
from siirl.params.key_support import leaf_defaults
from siirl.params.parser import parse_config

ROOT = Path(__file__).resolve().parents[3]
ON = ["reward_model.enable=true", "reward_model.model.path=builtin:tiny-reward"]
# the reward_model lines of verl's examples/ppo_trainer/run_qwen2-7b_rm.sh (model path ours)
VERL_RM_SCRIPT = ON + ["reward_model.use_reward_loop=True", "reward_model.rollout.name=vllm",
                       "reward_model.rollout.gpu_memory_utilization=0.8",
                       "reward_model.rollout.tensor_model_parallel_size=1",
                       "reward_model.rollout.prompt_length=2048",
                       "reward_model.rollout.response_length=1024",
                       "reward_model.num_workers=8"]


def test_every_key_of_verls_reward_model_section_is_known_here():
    verl = json.loads((ROOT / "docs/verl_defaults.json").read_text())["defaults"]
    section = sorted(k for k in verl if k.startswith("reward_model."))
    assert "reward_model.use_reward_loop" in section and len(section) > 50
    leaves = leaf_defaults()

    def known(key):  # a leaf, or inside a free-form mapping leaf (fsdp_config.wrap_policy)
        parts = key.split(".")
        return any(".".join(parts[:end]) in leaves and
                   (end == len(parts) or isinstance(leaves[".".join(parts[:end])], dict))
                   for end in range(len(parts), 0, -1))
    assert [k for k in section if not known(k)] == []


def test_verls_reward_model_script_runs_with_a_notice_per_reason(capsys):
    parse_config(VERL_RM_SCRIPT, validate=True)
    err = capsys.readouterr().err
    assert "reward_model.rollout.name='vllm'" in err and "inference server" in err
    assert "reward_model.num_workers=8" in err and "reward_manager=parallel" in err
    assert "use_reward_loop" not in err  # True is verl's default: nothing asked for


@pytest.mark.parametrize("overrides,words", [
    (ON + ["reward_model.use_reward_loop=false"], ["use_reward_loop", "same rows"]),
    (ON + ["reward_model.n_gpus_per_node=4", "reward_model.nnodes=1"],
     ["reward_model.n_gpus_per_node=4", "reward_model.nnodes=1", "separate reward-model pool"]),
    (ON + ["reward_model.profiler.enable=true"], ["reward_model.profiler.enable", "profiler"]),
    (ON + ["reward_model.reward_loop_class_name=X"], ["reward_loop_class_name", "importlib"]),
    (["reward_model.rollout.name=vllm"], ["reward_model.rollout.name", "reward_model.enable"]),
])
def test_not_applying_keys_say_why(overrides, words, capsys):
    parse_config(overrides, validate=True)
    err = capsys.readouterr().err
    assert all(word in err for word in words), err


def test_the_parallel_manager_reads_num_workers_without_a_notice(capsys):
    parse_config(["reward_model.reward_manager=parallel", "reward_model.num_workers=3"],
                 validate=True)
    assert "num_workers" not in capsys.readouterr().err


@pytest.mark.parametrize("overrides,match", [
    (ON + ["reward_model.enable_resource_pool=true"], "enable_resource_pool.*colocated"),
    (["reward_model.reward_loop_source=importlib"], "reward_loop_source.*registered"),
])
def test_refused_keys_stop_the_run_naming_them(overrides, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(overrides, validate=True)
