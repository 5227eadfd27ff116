"""ReMax (algorithm.adv_estimator=remax): the estimator's numbers (verl's semantics), the
greedy-baseline nodes with recording engines, and the workflow the estimator selects."""

from types import SimpleNamespace

import pytest
import torch

from siirl.dag_worker.core_algos import get_adv_estimator_fn
from siirl.dag_worker.dagworker import DAGWorker
from siirl.dag_worker.data_structures import NodeOutput
from siirl.dag_worker.nodes import remax_baseline
from siirl.data_coordinator.protocol import get_non_tensor, make_batch
from siirl.errors import ConfigError, PipelineError
from siirl.execution.dag.pipeline import Pipeline
from siirl.execution.dag.task_loader import builtin_pipeline_name, load_pipeline
from siirl.params.typed import to_typed

REWARDS = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0], [0.0, 0.0, 0.0], [0.0, 2.0, -1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
BASELINES = torch.tensor([0.25, 1.0, -0.5, 0.0])


def test_remax_is_reward_to_go_minus_the_greedy_score():
    advantages, returns = get_adv_estimator_fn("remax")(
        token_level_rewards=REWARDS, reward_baselines=BASELINES, response_mask=MASK)
    expected_returns = torch.tensor([[1.0, 1.0, 1.0], [0.5, 0.5, 0.0], [0.0, 0.0, 0.0],
                                     [1.0, 1.0, -1.0]])
    expected = torch.tensor([[0.75, 0.75, 0.75], [-0.5, -0.5, 0.0], [0.5, 0.0, 0.0],
                             [1.0, 1.0, -1.0]])
    assert torch.equal(returns, expected_returns)
    assert torch.equal(advantages, expected)


def _advantage_worker():
    graph = Pipeline("adv").add_node("adv", node_type="COMPUTE", node_role="ADVANTAGE").build()
    return DAGWorker(graph, config={"algorithm": {"adv_estimator": "remax"}})


def test_the_advantage_node_reads_reward_baselines_from_the_batch():
    worker = _advantage_worker()
    batch = make_batch({"token_level_rewards": REWARDS, "response_mask": MASK,
                        "reward_baselines": BASELINES}, {"uid": ["a", "a", "b", "b"]})
    out = worker.compute_advantage(batch)
    assert torch.equal(out.batch["advantages"][0], torch.tensor([0.75, 0.75, 0.75]))
    missing = make_batch({"token_level_rewards": REWARDS, "response_mask": MASK})
    with pytest.raises(PipelineError, match="reward_baselines"):
        worker.compute_advantage(missing)


class RecordingRollout:
    """Replies with each prompt's last token + 1 and a fixed length, recording its settings."""

    def __init__(self):
        self.settings, self.calls = {}, []

    def overridden(self, **settings):
        import contextlib

        @contextlib.contextmanager
        def block():
            previous, self.settings = self.settings, dict(settings)
            try:
                yield
            finally:
                self.settings = previous
        return block()

    def generate(self, batch, validate=False):
        self.calls.append(dict(self.settings))
        prompts = batch["input_ids"]
        responses = torch.stack([prompts[:, -1] + 1, prompts[:, -1] + 2], dim=1)
        mask = torch.ones_like(responses, dtype=torch.float32)
        out = batch.clone()
        for key, value in (("prompts", prompts), ("responses", responses),
                           ("response_mask", mask),
                           ("input_ids", torch.cat([prompts, responses], 1)),
                           ("attention_mask", torch.cat([batch["attention_mask"],
                                                         mask.long()], 1)),
                           ("position_ids", torch.arange(6).expand(len(prompts), 6))):
            out.set(key, value)
        return NodeOutput(batch=out, metrics={"response_length/mean": 2.0})


class ScoreIsFirstResponseToken:
    def __init__(self):
        self.seen = []

    def compute_reward(self, batch):
        self.seen.append(batch)
        scores = torch.zeros_like(batch["responses"], dtype=torch.float32)
        scores[:, -1] = batch["responses"][:, 0].float()
        batch.set("token_level_scores", scores)
        return NodeOutput(batch=batch, metrics={"reward/errors": 0.0})


def _worker():
    engines = SimpleNamespace(rollout=RecordingRollout(), reward=ScoreIsFirstResponseToken(),
                              reward_model_enabled=lambda: False)
    return SimpleNamespace(engines=engines)


def _prompts():
    return make_batch({"input_ids": torch.tensor([[0, 5, 6, 7], [3, 4, 8, 9]]),
                       "attention_mask": torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]),
                       "sample_id": torch.tensor([10, 11])},
                      {"ground_truth": ["8", "1"], "data_source": ["arithmetic"] * 2})


def test_the_baseline_nodes_score_one_greedy_reply_per_prompt_and_hand_on_the_prompts():
    worker, prompts = _worker(), _prompts()
    before = {key: prompts[key].clone() for key in ("input_ids", "attention_mask", "sample_id")}
    held = remax_baseline.greedy_baseline_rollout(worker, prompts)
    assert worker.engines.rollout.calls == [{"n": 1, "greedy": True}]
    out = remax_baseline.score_greedy_baseline(worker, held.batch)
    # the reward manager saw the greedy replies as ordinary rollout rows
    seen = worker.engines.reward.seen[0]
    assert torch.equal(seen["responses"], torch.tensor([[8, 9], [10, 11]]))
    assert seen["input_ids"].shape == (2, 6)
    assert get_non_tensor(seen, "ground_truth") == ["8", "1"]
    # the prompts go on unchanged, with the greedy score as each one's baseline
    assert sorted(out.batch.keys()) == sorted([*before, "ground_truth", "data_source",
                                               "reward_baselines"])
    for key, value in before.items():
        assert torch.equal(out.batch[key], value)
    assert torch.equal(out.batch["reward_baselines"], torch.tensor([8.0, 10.0]))
    assert float(out.metrics["remax/baseline_score/mean"]) == 9.0


def test_scoring_without_the_greedy_rollout_before_it_says_so():
    with pytest.raises(ConfigError, match="greedy_baseline_rollout"):
        remax_baseline.score_greedy_baseline(_worker(), _prompts())


def test_remax_selects_its_workflow_with_the_baseline_before_the_sampled_rollout():
    config = to_typed({"algorithm": {"adv_estimator": "remax"}})
    assert builtin_pipeline_name(config) == "remax"
    order = load_pipeline(config).get_execution_order()
    assert order[:4] == ["rollout_greedy_baseline", "reward_greedy_baseline", "rollout_actor",
                         "function_reward"]
    assert order[-1] == "actor_train"


@pytest.mark.parametrize("algorithm", [{"workflow_type": "DAPO"},
                                       {"filter_groups": {"enable": True}},
                                       {"workflow_type": "AGENTIC"}])
def test_remax_with_another_workflow_is_refused_naming_it(algorithm):
    with pytest.raises(ConfigError, match="adv_estimator=remax"):
        builtin_pipeline_name(to_typed({"algorithm": {"adv_estimator": "remax", **algorithm}}))
