"""Every refusal that depends only on the configuration and the machine stops ``siirl-train``
in its validation pass, within 2 s of its start and before anything loads.

Each REFUSED rule of ``siirl.params.key_rules`` gets a configuration built from its patterns
and conditions (a context below plus one of its keys set); the checks that tie keys to the
worker count, the device and the installed packages get their own. Each runs through the
command's own entry (``siirl.launch.cli.main``) with the job's start replaced by a failure:
a refusal that only the workers would reach fails the test, whatever the time. Two
examples from the issue also run as a fresh ``siirl-train`` process, timed from its start.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import json
import os
import subprocess
import sys
import time

import pytest
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from siirl.launch import cli
from siirl.params import SiiRLArguments, machine
from siirl.params.key_rules import REFUSED, RULES
from siirl.params.key_support import changed_keys, leaf_defaults, rule_for

LIMIT_S = 2.0
LEAVES = leaf_defaults()
# the contexts in which the rules' conditions hold; a rule no context triggers fails
# test_every_refused_rule_has_a_trigger: add the context it needs here
CONTEXTS = {
    "defaults": [],
    "cpu": ["trainer.device=cpu"],
    "megatron": ["actor_rollout_ref.actor.strategy=megatron",
                 "actor_rollout_ref.ref.strategy=megatron", "critic.strategy=megatron"],
    # what a CPU run cannot do for a megatron role (offload)
    "megatron on the CPU": ["actor_rollout_ref.actor.strategy=megatron",
                            "actor_rollout_ref.ref.strategy=megatron", "critic.strategy=megatron",
                            "reward_model.enable=true", "reward_model.strategy=megatron",
                            "trainer.device=cpu"],
    # a rule of the actor's expert parallelism that needs pipeline stages
    "megatron pipeline": ["actor_rollout_ref.actor.strategy=megatron", "trainer.device=cpu",
                          "trainer.n_gpus_per_node=4",
                          "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"],
    # the megatron section's rules at the reference's mount (the actor's shadow them above)
    "megatron reference": ["actor_rollout_ref.ref.strategy=megatron"],
    # a dict key's refused entries (the search below tries other values, not these keys)
    "megatron shape overrides": [
        "actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.ref.strategy=megatron",
        "critic.strategy=megatron", "reward_model.enable=true", "reward_model.strategy=megatron",
        *(f"{role}.megatron.override_transformer_config={{num_layers: 2}}"
          for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic",
                       "reward_model"))],
    # router replay R2: refused off megatron
    "router replay R2": ["actor_rollout_ref.actor.router_replay.mode=R2"],
    "packing": ["actor_rollout_ref.model.use_remove_padding=true",
                "critic.model.use_remove_padding=true"],
    "gae": ["algorithm.adv_estimator=gae"],
    "reward model": ["reward_model.enable=true"],
    "megatron reward model": ["reward_model.enable=true", "reward_model.strategy=megatron"],
    "megatron judge": ["reward_model.enable=true", "reward_model.strategy=megatron",
                       "reward_model.style=generative"],
    "embodied rewards": ["reward_model.reward_manager=embodied", "reward_model.enable=true"],
    "vllm, clip-cov loss": ["actor_rollout_ref.rollout.name=vllm",
                            "actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov"],
    # asynchronous training's layouts and modes not built yet
    "async": ["async_training.enable=true", "trainer.device=cpu"],
    "async vllm": ["async_training.enable=true", "trainer.device=cpu",
                   "actor_rollout_ref.rollout.name=vllm"],
    "async sglang": ["async_training.enable=true", "trainer.device=cpu",
                     "actor_rollout_ref.rollout.name=sglang",
                     "actor_rollout_ref.rollout.mode=server"],
    "async dapo": ["async_training.enable=true", "trainer.device=cpu",
                   "algorithm.workflow_type=DAPO"],
    "async megatron reward model": ["async_training.enable=true", "trainer.device=cpu",
                                    "reward_model.enable=true",
                                    "reward_model.strategy=megatron"],
    # rollout correction where the rollout reports no log-probs of its own
    "multi-turn rollout": ["actor_rollout_ref.rollout.multi_turn.enable=true"],
}


def _config(overrides):
    """The schema with ``key=value`` overrides (YAML values, as the command line's)."""
    config = OmegaConf.structured(SiiRLArguments)
    for text in overrides:
        key, value = text.split("=", 1)
        OmegaConf.update(config, key, yaml.safe_load(value), merge=False)
    return config


def _other_values(value):
    """Values unlike ``value`` to try (a key that defaults to null: by its type)."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, (int, float)):
        return [value + (1 if isinstance(value, int) else 0.5)]
    if isinstance(value, str):
        return [value + "_x"]
    if isinstance(value, list):
        return [["x"]]
    return [2, {"siirl_test": 1}, "x"]


def _hydra(value):
    """``value`` as a command-line override writes it."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_hydra(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_hydra(v) for v in value) + "]"
    return json.dumps(value)


@functools.cache
def _context(name):
    """(configuration, its resolved values, the keys it sets) of a context."""
    config = _config(CONTEXTS[name])
    return config, OmegaConf.to_container(config, resolve=True), \
        set(changed_keys(OmegaConf.to_object(config)))


def _with(config, key, value):
    """``config`` with ``key`` set to ``value``; None where the schema's type refuses it."""
    config = copy.deepcopy(config)
    try:
        OmegaConf.update(config, key, value, merge=False)
    except ValidationError:
        return None
    return config


@functools.cache
def _trigger(rule):
    """(context name, overrides) under which ``rule`` refuses a key, or None."""
    for name, overrides in CONTEXTS.items():
        config, values, changed = _context(name)
        if any(rule_for(key, config) is rule for key in changed):
            return name, overrides
        for key in LEAVES:
            if not any(fnmatch.fnmatchcase(key, p) for p in rule.patterns):
                continue
            value = values
            for part in key.split("."):
                value = value[part]
            for other in _other_values(value):
                candidate = _with(config, key, other)
                if candidate is not None and rule_for(key, candidate) is rule:
                    return name, overrides + [f"{key}={_hydra(other)}"]
    return None


REFUSED_RULES = [rule for rule in RULES if rule.kind == REFUSED]


def _label(rule):
    return f"{rule.patterns[0]}: {rule.tag}"


@pytest.fixture
def no_job(monkeypatch):
    """The job's start (pipeline, models, datasets, workers) fails the test if reached."""
    def reached(config, print_dag=False):
        raise AssertionError("the run passed validation and reached the launcher")

    monkeypatch.setattr(cli, "run", reached)


def _refusal(argv, capsys):
    """(exit status, stderr, seconds) of ``siirl-train argv`` up to its refusal."""
    capsys.readouterr()
    start = time.perf_counter()
    status = cli.main(list(argv))
    seconds = time.perf_counter() - start
    return status, capsys.readouterr().err, seconds


def test_every_refused_rule_has_a_trigger():
    missing = [_label(rule) for rule in REFUSED_RULES if _trigger(rule) is None]
    assert missing == [], f"no context of CONTEXTS triggers these rules: {missing}"


@pytest.mark.parametrize("rule", REFUSED_RULES, ids=_label)
def test_a_refused_rule_stops_the_run_before_loading(rule, no_job, capsys, tmp_path):
    trigger = _trigger(rule)
    assert trigger is not None, f"no context triggers {_label(rule)}"
    context, overrides = trigger
    status, err, seconds = _refusal(
        overrides + [f"trainer.default_local_dir={tmp_path}"], capsys)
    assert status == 2, err
    assert rule.why[:60] in " ".join(err.split()), (context, overrides, err)
    assert seconds < LIMIT_S, f"{_label(rule)} refused after {seconds:.2f} s"


# the config-only refusals the engines and workers made after loading, now in the
# validation pass: (overrides, a phrase of the refusal, what this machine must be)
GPU_ABSENT, PACKAGE_ABSENT = "no gpu", "package absent"
MOVED = {
    "offload on a machine without a GPU": (
        ["actor_rollout_ref.actor.fsdp_config.param_offload=true"], "nothing to offload",
        GPU_ABSENT),
    "trainer.device=cuda without a GPU": (["trainer.device=cuda"], "shows no GPU", GPU_ABSENT),
    "Ulysses size not dividing the workers": (
        ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=3",
         "actor_rollout_ref.model.use_remove_padding=true", "trainer.n_gpus_per_node=2",
         "trainer.device=cpu"], "must divide the number of workers", None),
    "critic Ulysses size not dividing the workers": (
        ["critic.ulysses_sequence_parallel_size=3", "critic.model.use_remove_padding=true",
         "algorithm.adv_estimator=gae", "trainer.n_gpus_per_node=2", "trainer.device=cpu"],
        "must divide the number of workers", None),
    "hybrid sharding": (["actor_rollout_ref.actor.fsdp_config.fsdp_size=2",
                         "trainer.n_gpus_per_node=4"], "hybrid sharding", None),
    "offload of a replicated module": (
        ["actor_rollout_ref.actor.fsdp_config.fsdp_size=1",
         "actor_rollout_ref.actor.fsdp_config.param_offload=true", "trainer.device=cuda",
         "trainer.n_gpus_per_node=2"], "keeps the whole module", None),
    "megatron context parallelism": (
        ["actor_rollout_ref.actor.strategy=megatron",
         "actor_rollout_ref.actor.megatron.context_parallel_size=2",
         "trainer.n_gpus_per_node=2", "trainer.device=cpu"], "context parallelism", None),
    "megatron virtual stages without pipeline stages": (
        ["actor_rollout_ref.actor.strategy=megatron",
         "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2"],
        "needs pipeline_model_parallel_size > 1", None),
    "vllm tensor parallelism": (
        ["actor_rollout_ref.rollout.name=vllm",
         "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2"],
        "runs one engine per worker", None),
    "vllm sleep mode on the CPU": (
        ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.free_cache_engine=true",
         "trainer.device=cpu"], "sleep mode", None),
    "sglang in sync mode": (["actor_rollout_ref.rollout.name=sglang"], "as a server only", None),
    "sglang on the CPU": (["actor_rollout_ref.rollout.name=sglang", "trainer.device=cpu"],
                          "needs a CUDA device", None),
    "unknown logger": (["trainer.logger=[console,nope]"], "unknown logger", None),
    "vllm not installed": (["actor_rollout_ref.rollout.name=vllm"], "needs the vllm package",
                           PACKAGE_ABSENT),
    "sglang not installed": (["actor_rollout_ref.rollout.name=sglang"],
                             "needs the sglang package", PACKAGE_ABSENT),
    "megatron-core not installed": (["actor_rollout_ref.actor.strategy=megatron"],
                                    "needs the megatron-core package", PACKAGE_ABSENT),
    "peft not installed": (["actor_rollout_ref.model.lora_rank=8"], "needs the peft package",
                           PACKAGE_ABSENT),
    "wandb not installed": (["trainer.logger=[console,wandb]"], "needs the wandb package",
                            PACKAGE_ABSENT),
}


@pytest.mark.parametrize("case", sorted(MOVED))
def test_a_config_only_refusal_stops_the_run_before_loading(case, no_job, capsys, tmp_path,
                                                            monkeypatch):
    overrides, phrase, machine_fact = MOVED[case]
    if machine_fact == GPU_ABSENT:  # what this machine would be without a GPU
        monkeypatch.setattr(machine, "shows_no_gpu", lambda: True)
    if machine_fact == PACKAGE_ABSENT:  # and without the optional package
        monkeypatch.setattr(machine, "_installed", lambda module: False)
    status, err, seconds = _refusal(overrides + [f"trainer.default_local_dir={tmp_path}"],
                                    capsys)
    assert status == 2 and phrase in " ".join(err.split()), err
    assert seconds < LIMIT_S, f"{case}: refused after {seconds:.2f} s"


def test_a_gpu_is_not_refused_where_the_machine_may_show_one(no_job, capsys, monkeypatch):
    # auto on a machine that may have a GPU, or workers on a cluster elsewhere: the workers
    # decide (their engines refuse offload on a CPU with the same text)
    monkeypatch.setattr(machine, "shows_no_gpu", lambda: False)
    offload = "actor_rollout_ref.actor.fsdp_config.param_offload=true"
    with pytest.raises(AssertionError, match="reached the launcher"):
        cli.main([offload])
    monkeypatch.setattr(machine, "shows_no_gpu", lambda: True)
    with pytest.raises(AssertionError, match="reached the launcher"):
        cli.main([offload, "trainer.n_gpus_per_node=2"])


# the issue's two examples, as a user runs them: a fresh process, timed from its start; it
# must end refused before importing torch (which loading a model or dataset needs) or an
# engine module (the parse reads the engine package's config sections, siirl.config, and
# the light modules they import: those are loaded first and not counted)
PROBE = ("import atexit, sys\nimport importlib.metadata as md\n"
         "for ep in md.entry_points(group='siirl.config'):\n    ep.load()\n"
         "sections = set(sys.modules)\n"
         "atexit.register(lambda: print('imported:', *[m for m in sys.modules if m in "
         "('torch', 'transformers') or m.startswith('siirl.engine.') and "
         "m not in sections], file=sys.stderr))\n"
         "from siirl.launch.cli import main\n"
         "sys.argv[0] = 'siirl-train'\n"
         "sys.exit(main())\n")
EXAMPLES = {
    "offload on a CPU run": ["actor_rollout_ref.actor.fsdp_config.param_offload=true"],
    "Ulysses size not dividing the workers": [
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=3",
        "actor_rollout_ref.model.use_remove_padding=true", "trainer.n_gpus_per_node=2",
        "trainer.device=cpu"],
}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_issues_examples_are_refused_within_2_s_of_start(example, tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # a CPU run on any machine
    with open(tmp_path / "err", "w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", PROBE, *EXAMPLES[example],
                                 f"trainer.default_local_dir={tmp_path}"],
                                stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read()
    assert proc.returncode == 2, text
    assert text.splitlines()[-1] == "imported:", f"loading began before the refusal: {text}"
    # CPU time: what the refusal costs, however busy the machine (wall time says how long
    # this one waited for a core as well)
    cpu = usage.ru_utime + usage.ru_stime
    assert cpu < LIMIT_S, f"{example}: {cpu:.2f} s of CPU ({wall:.2f} s wall) to the refusal"


def test_the_machine_view_reads_auto_as_cpu_only_where_certain(monkeypatch):
    config = _config([])
    monkeypatch.setattr(machine, "shows_no_gpu", lambda: True)
    assert machine.run_device(config) == "cpu"
    typed = OmegaConf.to_object(config)
    assert machine.machine_view(typed).trainer.device == "cpu"
    assert typed.trainer.device == "auto"  # the user's is kept
    spread = _config(["trainer.n_gpus_per_node=2"])
    assert machine.run_device(spread) is None  # the workers may join a cluster elsewhere
    local = copy.deepcopy(spread)
    OmegaConf.update(local, "trainer.ray_address", "local")
    assert machine.run_device(local) == "cpu"
    monkeypatch.setattr(machine, "shows_no_gpu", lambda: False)
    assert machine.run_device(config) is None


def test_a_hidden_gpu_list_means_no_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert machine.shows_no_gpu()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert machine.shows_no_gpu()
