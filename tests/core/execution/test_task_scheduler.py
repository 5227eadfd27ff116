"""TaskScheduler: every worker gets its own copy of the graph."""

import pytest
import siirl_test_pipelines as helpers

from siirl.errors import ConfigError, PipelineError
from siirl.execution.dag import builtin_pipelines as bp
from siirl.execution.dag.pipeline import Pipeline
from siirl.execution.scheduler.task_scheduler import TaskScheduler, WorkerAssignment, format_plan


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
