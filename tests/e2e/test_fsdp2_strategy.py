"""verl's launch scripts set ``strategy=fsdp2`` (verl's FSDP2; its ``fsdp`` is FSDP1) for the
actor, reference, critic and reward model. siiRL's fsdp backend is FSDP2, and both names
select it: the main job's first step with a critic and a KL loss (so the actor, reference and
critic all train or score on the backend) runs the same nodes and logs the same values, bit
for bit, under either name (wall-clock keys aside)."""

import json
import os
import subprocess
import sys

from siirl.params.aliases import backend_aliases

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "parity"))
from metrics_parity import wall_clock  # noqa: E402  (the parity tool's wall-clock keys)


def _first_step(strategy, run_dir):
    strategies = [f"{key}={strategy}" for key in sorted(backend_aliases())]
    return [sys.executable, "-m", "siirl.main_dag", *strategies, "algorithm.adv_estimator=gae",
            "actor_rollout_ref.actor.use_kl_loss=true", "data.train_batch_size=8",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "trainer.total_training_steps=1", f"trainer.default_local_dir={run_dir}",
            "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
            "trainer.logger=[]", "trainer.device=cpu"]


def _step(strategy, tmp_path):
    run_dir = tmp_path / strategy
    proc = subprocess.run(_first_step(strategy, run_dir), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path,
                          env=dict(os.environ, RAY_AUTH_MODE="disabled", CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no plugin named" not in proc.stderr and "apply only when" not in proc.stderr
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])


def test_fsdp2_runs_the_first_step_exactly_as_fsdp(tmp_path):
    fsdp, fsdp2 = _step("fsdp", tmp_path), _step("fsdp2", tmp_path)
    assert "critic/vf_loss" in fsdp and "actor/kl_loss" in fsdp  # all three roles ran
    assert sorted(fsdp2) == sorted(fsdp)  # the same nodes timed, the same metrics
    assert {k: v for k, v in fsdp2.items() if not wall_clock(k)} == \
        {k: v for k, v in fsdp.items() if not wall_clock(k)}
