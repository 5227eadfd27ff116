"""The AGENTIC workflow: episodes become rows whose loss mask excludes every environment
token, and a short run on the built-in model goes through the whole DAG."""

import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch
from test_trajectory_manager import char_tokenizer, scripted

from siirl.dag_worker.core_algos.policy_losses import compute_policy_loss_vanilla
from siirl.environment import make_env, sokoban
from siirl.environment.agentic import TrajectoryEnvManager
from siirl.environment.agentic.rollout_node import _rows, episode_seed


def solved_episodes():
    tokenizer = char_tokenizer(False)
    manager = TrajectoryEnvManager(tokenizer, max_actions_per_traj=20, max_episode_tokens=4096)
    episodes, scripts = [], {}
    for seed in (1, 2):
        episode = manager.start(make_env("sokoban"), seed=seed, group=str(seed))
        scripts[tuple(episode.ids)] = [f"<answer>{a}</answer>"
                                             for a in sokoban.solve(episode.env)]
        episodes.append(episode)
    manager.run(episodes, scripted(tokenizer, scripts))
    return tokenizer, episodes


def test_no_gradient_flows_from_environment_tokens():
    tokenizer, episodes = solved_episodes()
    rows = _rows(episodes, tokenizer.pad_token_id)
    mask = rows["response_mask"]
    env_tokens = (mask == 0) & (rows["attention_mask"][:, rows["prompts"].shape[1]:] == 1)
    assert env_tokens.any() and mask.any()  # both kinds are in the rows
    log_prob = torch.randn(mask.shape, requires_grad=True)
    advantages = torch.randn(mask.shape)
    loss = compute_policy_loss_vanilla(log_prob.detach() + 0.1, log_prob, advantages, mask)[0]
    loss.backward()
    assert log_prob.grad[env_tokens].abs().max() == 0  # environment tokens: no gradient
    assert log_prob.grad[mask.bool()].abs().sum() > 0  # agent tokens: trained
    scores = rows["token_level_scores"]
    for row, episode in enumerate(episodes):  # the reward on the last agent token only
        last = max(i for i, m in enumerate(episode.mask) if m)
        assert scores[row, last] == episode.reward and scores[row].count_nonzero() == 1


def test_episode_seeds_are_fresh_per_step_and_replayable():
    assert episode_seed(1, 5, 3) == episode_seed(1, 5, 3)
    assert len({episode_seed(1, 5, step) for step in range(10)}) == 10


def test_an_agentic_run_goes_through_the_dag(tmp_path):
    cmd = [sys.executable, "-m", "siirl.main_dag", "algorithm.workflow_type=AGENTIC",
           "+custom_envs.Sok.env_type=sokoban", "+custom_envs.Sok.env_config.dim_room=[5,5]",
           "+custom_envs.Calc.env_type=tool_math", "env_manager.max_actions_per_traj=2",
           "env_manager.env_processes=2",
           "data.max_response_length=8", "data.train_batch_size=4",
           "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
           "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path}",
           "trainer.val_before_train=true", "trainer.test_freq=2", "trainer.save_freq=-1",
           "trainer.logger=[console]", "trainer.device=cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, RAY_AUTH_MODE="disabled"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the console leads with the episodes' success rate and score, validation's too
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert [line.split("  ")[0].split("=")[0] for line in lines] == [
        "step 0: val/success_rate", "step 1: env/success_rate", "step 2: env/success_rate",
        "step 2: val/success_rate"], proc.stdout
    assert all("env/score/mean=" in line for line in lines[1:3])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in records if "val/score/mean" in r]
    train = [r for r in records if "val/score/mean" not in r]
    assert [r["step"] for r in train] == [1, 2] and [r["step"] for r in val] == [0, 2]
    for record in val:  # validation episodes, scored by the environments themselves
        assert 0.0 <= record["val/success_rate"] <= 1.0
        assert "val/Sok/success_rate" in record and "val/Calc/success_rate" in record
    for record in train:
        assert record["env/turns/mean"] <= 2
        assert "env/Sok/success_rate" in record and "env/Calc/success_rate" in record
        assert "actor/pg_loss" in record


def test_agentic_ppo_trains_a_critic(tmp_path):
    cmd = [sys.executable, "-m", "siirl.main_dag", "algorithm.workflow_type=AGENTIC",
           "algorithm.adv_estimator=gae", "+custom_envs.Sok.env_type=sokoban",
           "env_manager.max_actions_per_traj=2", "data.max_response_length=8",
           "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
           "actor_rollout_ref.actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4",
           "trainer.total_training_steps=1", f"trainer.default_local_dir={tmp_path}",
           "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
           "trainer.logger=[]", "trainer.device=cpu"]
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    proc = subprocess.run([*cmd, "--print-dag"], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "critic_value" in proc.stdout and "critic_train" in proc.stdout
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert "critic/vf_loss" in record and "env/Sok/success_rate" in record


def test_step_level_rows_score_each_turn_by_its_discounted_return():
    from siirl.environment.agentic.rollout_node import _step_rows, discounted_returns

    assert discounted_returns([-0.1, -0.1, 11.0], 0.5) == [-0.1 - 0.05 + 2.75, -0.1 + 5.5, 11.0]
    tokenizer, episodes = solved_episodes()
    rows = _step_rows(episodes, tokenizer.pad_token_id, gamma=0.9)
    turns = sum(e.turns for e in episodes)
    assert rows.batch_size[0] == turns
    row = 0
    for episode in episodes:
        returns = discounted_returns(episode.turn_rewards, 0.9)
        assert sum(episode.turn_rewards) == pytest.approx(episode.reward)
        for (start, end), value in zip(episode.turn_spans, returns, strict=True):
            reply = rows["responses"][row][rows["response_mask"][row].bool()].tolist()
            assert reply == episode.ids[start:end]  # the turn's reply, nothing else
            prompt = rows["prompts"][row][rows["attention_mask"][row, :rows["prompts"].shape[1]]
                                          .bool()].tolist()
            assert prompt == episode.ids[:start]  # the episode so far
            assert rows["token_level_scores"][row].sum() == pytest.approx(value)
            row += 1


@pytest.mark.parametrize("grouping", ["state", "batch"])
def test_score_normalization(grouping):
    from siirl.environment.agentic.rollout_node import normalize_scores

    tokenizer, episodes = solved_episodes()
    episodes[1].reward = 3.0  # two groups of one: make the scores differ
    rows = _rows(episodes, tokenizer.pad_token_id)
    before = rows["token_level_scores"].clone()
    normalize_scores(rows, grouping, "identity")
    assert torch.equal(rows["token_level_scores"], before)
    normalize_scores(rows, grouping, "mean")
    totals = rows["token_level_scores"].sum(dim=-1)
    if grouping == "state":  # each seed its own group: nothing left after the mean
        assert torch.equal(totals, torch.zeros(2))
    else:
        rewards = torch.tensor([e.reward for e in episodes])
        assert torch.allclose(totals, rewards - rewards.mean())
    # the score sits on each row's last trained token
    mask = rows["response_mask"]
    last = mask.shape[1] - 1 - mask.flip(dims=[1]).argmax(dim=-1)
    assert torch.equal(rows["token_level_scores"].sum(dim=-1),
                       rows["token_level_scores"][torch.arange(2), last])


def test_two_workers_play_the_same_episodes_as_one(tmp_path):
    """Same global batch: the episodes (seeded by row) and the first step's actor metrics
    equal the 1-worker run's; counts add up over the workers."""
    common = [sys.executable, "-m", "siirl.main_dag", "algorithm.workflow_type=AGENTIC",
              "+custom_envs.FrozenLake.env_type=frozen_lake",
              "+custom_envs.FrozenLake.env_instruction=frozenlake",
              "actor_rollout_ref.model.path=builtin:tiny-agent",
              "env_manager.max_actions_per_traj=4", "env_manager.max_tokens_per_step=8",
              "data.max_response_length=8", "data.train_batch_size=8",
              "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
              "trainer.total_training_steps=1", "trainer.val_before_train=false",
              "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[]",
              "trainer.device=cpu"]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS="")
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths
    runs = {}
    for workers, extra in ((1, []), (2, ["trainer.n_gpus_per_node=2",
                                         "trainer.ray_address=local",
                                         f"trainer.ray_temp_dir={ray_dir}"])):
        run_dir = tmp_path / str(workers)
        proc = subprocess.run([*common, f"trainer.default_local_dir={run_dir}", *extra],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[workers] = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    one, two = runs[1], runs[2]
    for key in ("env/success_rate", "env/score/mean", "env/score/min", "env/turns/mean",
                "env/format_errors", "actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert abs(one[key] - two[key]) <= 1e-5 * max(1.0, abs(one[key])), key


def test_a_resumed_agentic_run_continues_exactly(tmp_path):
    """Episodes are seeded by run, row and step, and the rollout's noise by episode: a run
    resumed from step 2's checkpoint logs steps 3-4 bitwise like the uninterrupted run."""
    common = [sys.executable, "-m", "siirl.main_dag", "algorithm.workflow_type=AGENTIC",
              "+custom_envs.FrozenLake.env_type=frozen_lake",
              "+custom_envs.FrozenLake.env_instruction=frozenlake",
              "actor_rollout_ref.model.path=builtin:tiny-agent",
              "env_manager.max_actions_per_traj=4", "env_manager.max_tokens_per_step=8",
              "data.max_response_length=8", "data.train_batch_size=8",
              "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
              "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=2",
              "trainer.logger=[]", "trainer.device=cpu"]
    env = dict(os.environ, RAY_AUTH_MODE="disabled")

    def run(run_dir, steps):
        proc = subprocess.run([*common, f"trainer.default_local_dir={run_dir}",
                               f"trainer.total_training_steps={steps}"],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(straight, 4)
    run(resumed, 2)
    assert "resumed from" in run(resumed, 4).stdout

    def steps(run_dir):
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text()
                   .splitlines()]
        return {r["step"]: {k: v for k, v in r.items() if not k.startswith(("timing_s",
                                                                            "perf/"))}
                for r in records}

    a, b = steps(straight), steps(resumed)
    assert sorted(b) == [1, 2, 3, 4]
    for step in (3, 4):
        assert a[step] == b[step], step
