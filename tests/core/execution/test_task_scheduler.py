"""TaskScheduler: copies of a connected graph, or its components split over workers."""

import pytest
import siirl_test_pipelines as helpers

from siirl.errors import ConfigError, PipelineError
from siirl.execution.dag import builtin_pipelines as bp
from siirl.execution.dag.pipeline import Pipeline
from siirl.execution.scheduler.task_scheduler import (
    TaskScheduler,
    WorkerAssignment,
    apportion,
    format_plan,
)


def test_each_worker_gets_an_equal_copy():
    graph = bp.grpo_pipeline()
    plan = TaskScheduler(3).schedule(graph)
    assert [a.rank for a in plan] == [0, 1, 2]
    for assignment in plan:
        assert assignment.graph == graph
        assert assignment.graph is not graph
        assert assignment.graph.nodes["actor_train"] is not graph.nodes["actor_train"]
    assert len({id(a.graph) for a in plan}) == 3


def test_single_worker():
    plan = TaskScheduler(1).schedule(bp.ppo_pipeline())
    assert len(plan) == 1 and plan[0].rank == 0


def test_format_plan_mentions_ranks_and_nodes():
    text = format_plan(TaskScheduler(3).schedule(bp.dapo_pipeline()))
    assert "3 worker(s)" in text and "1 distinct graph(s)" in text
    assert "workers [0, 1, 2]" in text
    for node_id in bp.dapo_pipeline().get_execution_order():
        assert node_id in text


def test_format_plan_groups_distinct_graphs():
    plan = [WorkerAssignment(0, bp.grpo_pipeline()), WorkerAssignment(1, bp.ppo_pipeline()),
            WorkerAssignment(2, bp.grpo_pipeline())]
    text = format_plan(plan)
    assert "2 distinct graph(s)" in text
    assert "workers [0, 2]" in text and "workers [1]" in text


@pytest.mark.parametrize("count", [0, -1])
def test_no_workers_is_a_config_error(count):
    with pytest.raises(ConfigError, match="at least one worker"):
        TaskScheduler(count)


def test_schedule_validates_the_graph():
    pipeline = Pipeline("p").add_node("a", func=helpers.noop)
    graph = pipeline.build()
    graph.nodes["a"].dependencies.append("ghost")
    with pytest.raises(PipelineError, match="ghost"):
        TaskScheduler(2).schedule(graph)


# --- independent branches: split into components, workers apportioned by weight ---

def _chains(*heads, length=2):
    """Independent chains ``h -> h_1 -> ...`` (one weakly connected component per head)."""
    pipeline = Pipeline("multi", "independent chains")
    for head in heads:
        pipeline.add_node(head, func=helpers.noop)
        for i in range(1, length):
            prev = head if i == 1 else f"{head}_{i - 1}"
            pipeline.add_node(f"{head}_{i}", func=helpers.noop, deps=[prev])
    return pipeline.build()


def test_connected_graph_gives_every_worker_the_same_graph():
    graph = bp.grpo_pipeline()
    plan = TaskScheduler(4, {"actor_train": 7.0}).schedule(graph)
    assert all(a.graph == graph and a.graph.graph_id == graph.graph_id for a in plan)
    assert {a.group for a in plan} == {0}
    assert all(a.group_ranks == [0, 1, 2, 3] for a in plan)
    assert plan[0].weight == 7.0


def test_two_chains_split_by_model_size():
    graph = _chains("a", "b")
    plan = TaskScheduler(8, {"a": 7, "b": 1}).schedule(graph)
    assert [a.rank for a in plan] == list(range(8))
    assert [a.group for a in plan] == [0] * 7 + [1]
    assert plan[0].group_ranks == list(range(7)) and plan[7].group_ranks == [7]
    first, second = plan[0].graph, plan[7].graph
    assert first.graph_id == "multi/a" and second.graph_id == "multi/b"
    assert list(first.nodes) == ["a", "a_1"] and list(second.nodes) == ["b", "b_1"]
    assert first.get_execution_order() == ["a", "a_1"]
    assert first.nodes["a_1"].dependencies == ["a"]
    assert first.nodes["a"].executable is helpers.noop
    assert first.nodes["a"] is not graph.nodes["a"]
    assert plan[1].graph is not first and plan[1].graph == first
    for sub in (first, second):
        sub.validate_graph()
    assert (plan[0].weight, plan[7].weight) == (7.0, 1.0)


def test_component_weight_sums_node_sizes():
    plan = TaskScheduler(4, {"a": 1, "a_1": 2, "b_1": 1}).schedule(_chains("a", "b"))
    assert [a.group for a in plan] == [0, 0, 0, 1]
    assert plan[0].weight == 3.0


def test_components_follow_execution_order_with_interleaved_nodes():
    graph = (Pipeline("mixed").add_node("x", func=helpers.noop)
             .add_node("y", func=helpers.noop)
             .add_node("x2", func=helpers.noop, deps=["x"])
             .add_node("y2", func=helpers.noop, deps=["y"]).build())
    plan = TaskScheduler(2).schedule(graph)
    assert list(plan[0].graph.nodes) == ["x", "x2"] and list(plan[1].graph.nodes) == ["y", "y2"]


def test_more_components_than_workers_is_a_config_error():
    with pytest.raises(ConfigError, match="3 independent components but only 2 worker"):
        TaskScheduler(2).schedule(_chains("a", "b", "c"))


def test_equal_weights_largest_remainder_ties_to_first():
    plan = TaskScheduler(5).schedule(_chains("a", "b"))
    assert [a.group for a in plan] == [0, 0, 0, 1, 1]
    assert plan[3].group_ranks == [3, 4]


@pytest.mark.parametrize("weights, workers, expected", [
    ([7, 1], 8, [7, 1]),
    ([1, 1], 5, [3, 2]),
    ([100, 1, 1], 4, [2, 1, 1]),   # a tiny component still gets one worker
    ([1, 1, 1], 3, [1, 1, 1]),
    ([5, 3, 2], 7, [4, 2, 1]),     # quotas 3.5 / 2.1 / 1.4: the spare seat to the largest remainder
    ([0.5, 0.25], 3, [2, 1]),
])
def test_apportion(weights, workers, expected):
    seats = apportion(weights, workers)
    assert seats == expected and sum(seats) == workers


def test_bad_model_sizes_are_config_errors():
    with pytest.raises(ConfigError, match="ghost"):
        TaskScheduler(2, {"ghost": 1}).schedule(_chains("a", "b"))
    with pytest.raises(ConfigError, match="positive"):
        TaskScheduler(2, {"a": 0})


def test_format_plan_mentions_each_group():
    text = format_plan(TaskScheduler(8, {"a": 7, "b": 1}).schedule(_chains("a", "b")))
    assert "8 worker(s), 2 distinct graph(s)" in text
    assert "group 0: workers [0, 1, 2, 3, 4, 5, 6]" in text and "weight 7" in text
    assert "group 1: workers [7]" in text and "weight 1" in text
    assert "TaskGraph 'multi/a'" in text and "TaskGraph 'multi/b'" in text


def test_old_style_assignment_defaults():
    item = WorkerAssignment(3, bp.grpo_pipeline())
    assert (item.group, item.group_ranks, item.weight) == (0, [], 1.0)
