"""A training step scored by the user's own reward manager class, loaded from a file with
verl's ``reward_manager.source=importlib`` keys (about 7 s on CPU)."""

import json
import subprocess
import sys
import textwrap

MANAGER = textwrap.dedent("""
    from siirl.engine.reward_manager import RewardManagerBase
    from siirl.engine.reward_manager.outcome import Scored


    class ExactMatchRewardManager(RewardManagerBase):
        # a wrong answer costs -1: no built-in manager scores below 0 on the built-in task
        def _score_rows(self, rows, deadline):
            return [Scored(1.0 if solution.strip() == str(truth) else -1.0)
                    for _, solution, truth, _ in rows]
""")


def test_a_step_is_scored_by_the_class_in_reward_manager_module_path(tmp_path):
    (tmp_path / "my_manager.py").write_text(MANAGER)
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "siirl.main_dag", f"trainer.default_local_dir={run}",
         "data.train_batch_size=8", "actor_rollout_ref.rollout.n=2",
         "actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.logger=[]",
         "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
         "trainer.total_training_steps=1", "reward_manager.source=importlib",
         f"reward_manager.module.path={tmp_path / 'my_manager.py'}",
         "reward_manager.name=ExactMatchRewardManager"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    step = next(r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                if "critic/score/mean" in r)
    assert step["critic/score/min"] == -1.0 and step["critic/score/max"] <= 1.0
