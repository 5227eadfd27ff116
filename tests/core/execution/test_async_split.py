"""Asynchronous training as a placement: the planned graph cut into the rollout
sub-graph (rollout, reward) and the training sub-graph, trainers first, and what
``--print-dag`` says about the stream and the weight sync between them."""

import subprocess
import sys

import pytest

from siirl.errors import PipelineError
from siirl.execution.dag import builtin_pipelines as bp
from siirl.execution.dag.async_split import assignments, split_graph
from siirl.execution.dag.planner import plan_graph
from siirl.params.typed import to_typed

ASYNC = {"async_training": {"enable": True}, "trainer": {"n_gpus_per_node": 2}}


def test_grpo_streams_scored_rows_from_the_rollout_to_the_advantage():
    split = split_graph(plan_graph(bp.grpo_pipeline(), {}))
    assert split.rollout.get_execution_order() == ["rollout_actor", "function_reward"]
    assert split.trainer.get_execution_order() == ["calculate_advantages", "actor_train"]
    assert split.trainer.nodes["calculate_advantages"].dependencies == []
    assert (split.stream_from, split.stream_to) == ("function_reward",
                                                    ["calculate_advantages"])
    # the weights travel by the async channel, not the in-process sync steps
    assert split.trainer.weight_syncs == [] and split.rollout.weight_syncs == []


def test_ppo_keeps_the_critic_and_everything_after_the_reward_on_the_trainers():
    split = split_graph(plan_graph(bp.ppo_pipeline(), {"algorithm": {"adv_estimator": "gae"}}))
    assert "rollout_actor" in split.rollout.nodes
    assert not any(n in split.rollout.nodes for n in ("critic_value", "critic_train",
                                                      "actor_train"))


def test_a_graph_without_a_rollout_cannot_run_asynchronously():
    graph = plan_graph(bp.grpo_pipeline(), {})
    graph.nodes.pop("rollout_actor")
    graph.nodes["function_reward"].dependencies = []
    with pytest.raises(PipelineError, match="rollout node"):
        split_graph(graph)


def test_trainers_take_the_first_ranks_and_rollout_workers_the_next():
    config = to_typed(ASYNC)
    plan, lines = assignments(plan_graph(bp.grpo_pipeline(), config, 2), config)
    assert [(a.rank, a.group, a.group_ranks) for a in plan] == \
        [(0, 0, [0, 1]), (1, 0, [0, 1]), (2, 1, [2])]
    assert lines[0].startswith("stream: function_reward (workers [2]) -> "
                               "calculate_advantages (workers [0, 1])")
    assert "from worker 0 to workers [2]" in lines[1]


def test_print_dag_shows_both_sub_graphs_their_workers_and_the_stream():
    out = subprocess.run([sys.executable, "-m", "siirl.main_dag", "--print-dag",
                          "async_training.enable=true", "trainer.device=cpu"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert "group 0: workers [0]" in text and "group 1: workers [1]" in text
    assert "'grpo_training_pipeline/rollout'" in text
    assert "'grpo_training_pipeline/trainer'" in text
    assert "stream: function_reward (workers [1]) -> calculate_advantages" in text
