"""``use_remove_padding=true`` end to end (CPU, the built-in tiny model): one PPO step with
the actor, reference and critic running packed rows logs the metrics of the padded run,
within float tolerance (the rollout is the same; only the forwards' layout differs)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

SMALL = ["algorithm.adv_estimator=gae", "data.train_batch_size=8",
         "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
         "critic.ppo_micro_batch_size_per_gpu=4",
         "actor_rollout_ref.actor.use_kl_loss=true",  # a reference forward too
         "trainer.logger=[]", "trainer.val_before_train=false", "trainer.test_freq=-1",
         "trainer.save_freq=-1", "trainer.device=cpu", "trainer.total_training_steps=1"]
PACKED = ["actor_rollout_ref.model.use_remove_padding=true",
          "critic.model.use_remove_padding=true"]
IGNORED = ("timing_s/", "perf/", "timing/")
# Loaded by the run's python (PYTHONPATH): counts the micro-batches that ran packed.
SPY = """
import atexit, os
import siirl.engine.models.packing as packing
_pack, _count = packing.pack, [0]
def _counting(*args, **kwargs):
    packed = _pack(*args, **kwargs)
    _count[0] += packed is not None
    return packed
packing.pack = _counting
atexit.register(lambda: open(os.environ["PACKED_COUNT"], "w").write(str(_count[0])))
"""


def first_step(run_dir, *overrides, env=None):
    script = Path(sys.executable).with_name("siirl-train")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "siirl.main_dag"]
    proc = subprocess.run([*command, f"trainer.default_local_dir={run_dir}", *SMALL,
                           *overrides], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text()
               .splitlines()]
    (step,) = [r for r in records if "critic/score/mean" in r]
    return {k: v for k, v in step.items()
            if not k.startswith(IGNORED) and isinstance(v, (int, float))}


def test_a_packed_step_logs_the_padded_steps_metrics(tmp_path):
    padded = first_step(tmp_path / "padded")
    (tmp_path / "spy").mkdir()
    (tmp_path / "spy" / "sitecustomize.py").write_text(SPY)
    count = tmp_path / "packed_count"
    packed = first_step(tmp_path / "packed", *PACKED,
                        env={"PYTHONPATH": str(tmp_path / "spy"), "PACKED_COUNT": str(count)})
    # old log-probs come from the update's first forward here: 2 actor micro-batches, 2
    # reference, 2 critic values, 2 critic updates
    assert int(count.read_text()) >= 8
    assert packed.keys() == padded.keys()
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "critic/vf_loss",
                "critic/values/mean"):
        assert key in padded, key
    differ = {k: (padded[k], packed[k]) for k in padded
              if not math.isclose(packed[k], padded[k], rel_tol=1e-4, abs_tol=1e-5)}
    assert not differ
