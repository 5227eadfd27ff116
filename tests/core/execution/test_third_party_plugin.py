"""A third-party distribution registers a rollout engine through entry points, exactly as an
installed package would (a ``*.dist-info`` with ``entry_points.txt`` on sys.path), and the
worker imports it only when the config selects it."""

import sys
import textwrap

import pytest
import torch

from siirl.dag_worker.dagworker import DAGWorker
from siirl.data_coordinator.protocol import make_batch
from siirl.execution.dag.builtin_pipelines import grpo_pipeline
from siirl.plugins import available, load_plugin

MODULE = "acme_siirl_rollout"


@pytest.fixture
def third_party(tmp_path, monkeypatch):
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent('''
        from siirl.dag_worker.data_structures import NodeOutput

        class AcmeRollout:
            def __init__(self, role, config, worker):
                self.role, self.worker = role, worker

            def generate(self, batch, validate=False):
                batch["responses"] = batch["input_ids"].flip(-1)
                return NodeOutput(batch=batch, metrics={"acme/generated": len(batch)})
    '''))
    dist = tmp_path / "acme_siirl_rollout-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-siirl-rollout\n"
                                   "Version: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[siirl.rollouts]\nacme = {MODULE}:AcmeRollout\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(MODULE, None)
    yield
    sys.modules.pop(MODULE, None)


def test_entry_point_plugin_is_listed_and_loaded_lazily(third_party):
    assert "acme" in available("siirl.rollouts")
    assert MODULE not in sys.modules  # listing does not import the plugin
    factory = load_plugin("siirl.rollouts", "acme")
    assert factory.__name__ == "AcmeRollout" and MODULE in sys.modules


def test_worker_uses_the_third_party_engine(third_party):
    config = {"actor_rollout_ref": {"rollout": {"name": "acme"}}}
    worker = DAGWorker(grpo_pipeline(), config)
    assert MODULE not in sys.modules
    batch = make_batch({"input_ids": torch.tensor([[1, 2, 3], [4, 5, 6]])})
    output = worker.generate(batch)
    assert torch.equal(output.batch["responses"], torch.tensor([[3, 2, 1], [6, 5, 4]]))
    assert worker.engines.get("rollout").worker is worker
