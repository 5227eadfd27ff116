"""A third training backend is one package: ``toy_backend`` registers an engine
(``siirl.engines: toy``) and its config section (``siirl.config: toy``, mounted at
``actor_rollout_ref.actor.toy``) from a dist-info folder, as pip would install it, and the
main job's first step trains through it with no edit in siirl-core (about 10 s on CPU).

The toy backend is a single-process actor (and reference) over the plain-torch path of
siirl-engine's pieces; its section holds the gradient-clipping norm it reads, and a rule
that refuses Ulysses sequence parallelism. The steps are those of "Add a backend" in
docs/architecture.md."""

import json
import os
import subprocess
import sys
import textwrap

# its config section: read while siiRL composes its schema, so it imports only the
# section and rule modules of siirl.params (no engine module)
TOY_CONFIG = textwrap.dedent('''
    from dataclasses import dataclass

    from siirl.params.key_rule_kinds import refused
    from siirl.params.sections import ConfigSection, Mount


    @dataclass
    class ToyArguments:
        """The toy backend: one process, plain torch."""

        max_grad_norm: float = 1.0  # the actor's gradients are clipped to this norm


    SECTION = ConfigSection(
        schema=ToyArguments,
        mounts=(Mount("actor_rollout_ref.actor.toy", "actor",
                      "actor_rollout_ref.actor.strategy"),),
        applies_to=("toy",),
        label="toy backend",
        rules=lambda mount: [refused(
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size", "one process",
            "the toy backend runs each role in one process: no sequence parallelism.")],
    )
''')

# its engine: the actor and the reference in one process, on siirl-engine's plain-torch
# pieces (FSDPBackend unsharded is a plain module with its optimizer)
TOY_ENGINE = textwrap.dedent('''
    import sys

    import torch

    from siirl.engine.actor.engine import ActorEngine
    from siirl.engine.actor.on_policy import update_gives_old_log_probs
    from siirl.engine.actor.reference import ReferenceEngine, initial_policy
    from siirl.engine.common.config import typed_config
    from siirl.engine.common.model_loading import load_policy
    from siirl.engine.common.optim import build_optimizer
    from siirl.engine.fsdp.backend import FSDPBackend
    from siirl.engine.fsdp.engines import logprob_heads
    from siirl.errors import ConfigError
    from siirl.execution.dag.planner import reference_needed


    def toy_engine(role, config, worker=None, peers=None):
        cfg = typed_config(config)
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            raise ConfigError("the toy backend runs in one process")
        heads = logprob_heads()
        if role == "actor":
            module, tokenizer = load_policy(cfg)
            actor = cfg.actor_rollout_ref.actor
            backend = FSDPBackend(module, build_optimizer(module.parameters(), actor.optim),
                                  grad_clip=actor.toy.max_grad_norm)
            print(f"toy backend: actor, max_grad_norm={actor.toy.max_grad_norm}",
                  file=sys.stderr)
            return ActorEngine(backend, cfg, heads, tokenizer=tokenizer)
        if role == "reference":
            if not reference_needed(cfg):
                return ReferenceEngine(cfg)
            module = initial_policy((peers or {}).get("actor"), lambda: load_policy(cfg)[0])
            module.requires_grad_(False)
            return ReferenceEngine(cfg, FSDPBackend(module.eval()), heads)
        raise ConfigError(f"the toy backend serves the actor and the reference, not {role}")


    # the planner's on-policy question, answered as for one data-parallel worker group
    toy_engine.old_log_probs_from_update = update_gives_old_log_probs
''')


def install_plugin(root):
    """What `pip install toy-backend` leaves on sys.path: the module and its dist-info."""
    package = root / "toy_backend"
    package.mkdir()
    (package / "__init__.py").write_text('"""A single-process training backend: strategy=toy."""\n')
    (package / "config.py").write_text(TOY_CONFIG)
    (package / "engine.py").write_text(TOY_ENGINE)
    info = root / "toy_backend-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-backend\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(
        "[siirl.engines]\ntoy = toy_backend.engine:toy_engine\n\n"
        "[siirl.config]\ntoy = toy_backend.config:SECTION\n")


def _env(plugin):
    return dict(os.environ, RAY_AUTH_MODE="disabled", CUDA_VISIBLE_DEVICES="",
                PYTHONPATH=os.pathsep.join(p for p in (str(plugin),
                                                       os.environ.get("PYTHONPATH")) if p))


def _first_step(strategy, run_dir):
    """The main job's first step (the built-in model and task) on ``strategy``."""
    return [sys.executable, "-m", "siirl.main_dag", f"actor_rollout_ref.actor.strategy={strategy}",
            "data.train_batch_size=8", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.total_training_steps=1",
            f"trainer.default_local_dir={run_dir}", "trainer.val_before_train=false",
            "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[]",
            "trainer.device=cpu"]


def test_a_toy_backend_from_a_plugin_folder_trains_the_first_step(tmp_path):
    plugin = tmp_path / "site"
    plugin.mkdir()
    install_plugin(plugin)
    env, run_dir = _env(plugin), tmp_path / "run"
    job = _first_step("toy", run_dir)

    # the section is in the schema, read where the key says, and the fsdp section of a
    # role on strategy=toy does not apply (one notice)
    proc = subprocess.run(job + ["actor_rollout_ref.actor.toy.max_grad_norm=0.5",
                                 "actor_rollout_ref.actor.fsdp_config.forward_prefetch=true"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "toy backend: actor, max_grad_norm=0.5" in proc.stderr
    assert ("actor_rollout_ref.actor.fsdp_config.forward_prefetch=True has no effect in this "
            "run: FSDP settings apply only when actor_rollout_ref.actor.strategy=fsdp."
            ) in proc.stderr
    step = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert step["step"] == 1 and "actor/pg_loss" in step

    # the same step on the fsdp backend (one process: plain torch as well) reads the same
    # scores, entropy and gradient norm (taken before clipping)
    fsdp_dir = tmp_path / "fsdp"
    proc = subprocess.run(_first_step("fsdp", fsdp_dir), capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fsdp_step = json.loads((fsdp_dir / "metrics.jsonl").read_text().splitlines()[0])
    for key in ("critic/score/mean", "actor/entropy", "actor/pg_loss", "actor/grad_norm"):
        assert step[key] == fsdp_step[key], key

    # the section's own rule refuses before anything loads
    proc = subprocess.run(job + ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "the toy backend runs each role in one process" in proc.stderr

    # without the plugin folder the key and the strategy are unknown
    proc = subprocess.run(job[:3] + ["actor_rollout_ref.actor.toy.max_grad_norm=0.5"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=dict(env, PYTHONPATH=os.environ.get("PYTHONPATH", "")))
    assert proc.returncode != 0 and "actor_rollout_ref.actor.toy.max_grad_norm" in proc.stderr
