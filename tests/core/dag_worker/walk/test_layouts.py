"""Node layouts: which rows each worker holds at each node of the built-in pipelines."""

import pytest

from siirl.dag_worker.walk.layouts import entry_layout, node_layouts
from siirl.data_coordinator.data_buffer import Layout
from siirl.errors import ConfigError
from siirl.execution.dag.builtin_pipelines import grpo_pipeline
from siirl.params.typed import to_typed


def _config(tp):
    return to_typed({"actor_rollout_ref": {"rollout": {"tensor_model_parallel_size": tp}}})


def test_default_layout_is_data_parallel_everywhere():
    graph = grpo_pipeline()
    layouts = node_layouts(graph, _config(1), (0, 1, 2, 3))
    assert set(layouts.values()) == {Layout((0, 1, 2, 3), 1)}


def test_tensor_parallel_rollout_and_its_compute_children():
    graph = grpo_pipeline()
    layouts = node_layouts(graph, _config(2), (0, 1, 2, 3))
    rollout = Layout((0, 1, 2, 3), 2)
    assert entry_layout(graph, layouts) == rollout
    order = graph.get_execution_order()
    for node_id in order:
        role = graph.nodes[node_id].node_role.value
        expected = rollout if role in ("rollout", "reward", "advantage") else Layout(
            (0, 1, 2, 3), 1)
        assert layouts[node_id] == expected, node_id


def test_tensor_parallel_size_must_divide_the_workers():
    with pytest.raises(ConfigError, match="tensor_model_parallel_size=2"):
        node_layouts(grpo_pipeline(), _config(2), (0, 1, 2))
