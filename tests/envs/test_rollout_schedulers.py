"""ROLL's rollout schedulers: at most max_env_num_per_worker environments in flight, tags
shared out by num_groups_partition, validation on its own tags and group size."""

import json
import os
import subprocess
import sys
import tempfile

from test_trajectory_manager import char_tokenizer, scripted

from siirl.environment import make_env, sokoban
from siirl.environment.agentic import TrajectoryEnvManager
from siirl.environment.agentic.rollout_node import tag_of


def test_episodes_start_as_room_frees_up_and_play_as_if_all_ran_at_once():
    tokenizer = char_tokenizer(False)
    alive, most = set(), [0]

    def run(in_flight):
        manager = TrajectoryEnvManager(tokenizer, max_actions_per_traj=30,
                                       max_episode_tokens=8192)
        scripts, starts = {}, []
        for seed in range(6):
            def start(seed=seed):
                env = make_env("sokoban", {"dim_room": [5, 5]})
                episode = manager.start(env, seed=seed, group=str(seed))
                scripts[tuple(episode.ids)] = [f"<answer>{a}</answer>" for a in
                                               sokoban.solve(episode.env)]
                alive.add(id(env))
                most[0] = max(most[0], len(alive))
                return episode
            starts.append(start)

        def finished(episode):
            alive.discard(id(episode.env))
            episode.env.close()
        return manager.run_scheduled(starts, scripted(tokenizer, scripts), in_flight,
                                     finished)

    capped = run(2)
    assert most[0] == 2 and not alive  # never more than 2 environments; all released
    most[0] = 0
    everything = run(0)
    assert most[0] == 6
    assert [e.ids for e in capped] == [e.ids for e in everything]  # the same episodes
    assert all(e.success for e in capped)


def test_num_groups_partition_shares_the_rows_out_by_sample_id():
    tags = ["A", "B"]
    assert [tag_of(i, tags, None) for i in range(4)] == ["A", "B", "A", "B"]
    assert [tag_of(i, tags, [3, 1]) for i in range(8)] == ["A", "A", "A", "B"] * 2


def test_training_and_validation_play_their_own_tags(tmp_path):
    cmd = [sys.executable, "-m", "siirl.main_dag", "algorithm.workflow_type=AGENTIC",
           "+custom_envs.Sok.env_type=sokoban", "+custom_envs.Sok.env_config.dim_room=[5,5]",
           "+custom_envs.Calc.env_type=tool_math", "env_manager.max_actions_per_traj=2",
           "train_env_manager.tags=[Sok]", "train_env_manager.max_env_num_per_worker=3",
           "val_env_manager.tags=[Sok,Calc]", "val_env_manager.num_groups_partition=[1,1]",
           "val_env_manager.group_size=2", "data.max_response_length=8",
           "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
           "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.total_training_steps=1",
           f"trainer.default_local_dir={tmp_path}", "trainer.val_before_train=true",
           "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[]",
           "trainer.device=cpu", f"trainer.rollout_data_dir={tmp_path}/rollouts",
           f"trainer.validation_data_dir={tmp_path}/val", "trainer.log_val_generations=2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, RAY_AUTH_MODE="disabled"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    val, train = [json.loads(line) for line in
                  (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "val/Sok/success_rate" in val and "val/Calc/success_rate" in val
    assert "env/Sok/success_rate" in train and "env/Calc/success_rate" not in train
    # generations as text: every training row, every validation episode with its render
    rollouts = [json.loads(line) for line in
                (tmp_path / "rollouts/1.jsonl").read_text().splitlines()]
    assert len(rollouts) == 8 and {r["data_source"] for r in rollouts} == {"Sok"}
    assert all(r["step"] == 1 and r["input"] and r["output"] for r in rollouts)
    episodes = [json.loads(line) for line in (tmp_path / "val/0.jsonl").read_text().splitlines()]
    assert {e["data_source"] for e in episodes} == {"Sok", "Calc"}
    assert all(e["render"] for e in episodes if e["data_source"] == "Sok")
    assert proc.stdout.count("val sample (score") == 2


def test_a_training_group_size_other_than_rollout_n_is_refused(tmp_path):
    cmd = [sys.executable, "-m", "siirl.main_dag", "algorithm.workflow_type=AGENTIC",
           "+custom_envs.Sok.env_type=sokoban", "train_env_manager.group_size=4",
           "actor_rollout_ref.rollout.n=2", f"trainer.default_local_dir={tmp_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, RAY_AUTH_MODE="disabled"))
    assert proc.returncode == 2
    assert "train_env_manager.group_size=4 differs from" in proc.stderr


def test_step_mode_runs_on_two_workers(tmp_path):
    """Each worker's turns give it a different number of rows: they are padded to the
    largest count with rows that train nothing, so the workers' updates pair up."""
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    cmd = [sys.executable, "-m", "siirl.main_dag", "algorithm.workflow_type=AGENTIC",
           "+custom_envs.FrozenLake.env_type=frozen_lake",
           "+custom_envs.FrozenLake.env_instruction=frozenlake",
           "actor_rollout_ref.model.path=builtin:tiny-agent", "env_manager.mode=step",
           "env_manager.max_actions_per_traj=4", "env_manager.max_tokens_per_step=8",
           "data.max_response_length=8", "data.train_batch_size=8",
           "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
           "trainer.total_training_steps=2", "trainer.val_before_train=false",
           "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[]",
           "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.ray_address=local",
           f"trainer.ray_temp_dir={ray_dir}", f"trainer.default_local_dir={tmp_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all("actor/pg_loss" in r and r["env/turns/mean"] >= 1 for r in records)


def test_a_missing_environment_extra_stops_instead_of_failing_every_episode():
    import pytest

    from siirl.environment.base import TextEnv
    from siirl.errors import PluginNotFoundError

    class NeedsExtra(TextEnv):
        def reset(self, seed=None):
            raise PluginNotFoundError('environment x needs gymnasium: '
                                      'pip install "siirl-envs[gym]"')

        def step(self, action):
            raise AssertionError("never reached")

    manager = TrajectoryEnvManager(char_tokenizer(False))
    with pytest.raises(PluginNotFoundError, match="siirl-envs\\[gym\\]"):
        manager.start(NeedsExtra(), seed=1, group="1")
