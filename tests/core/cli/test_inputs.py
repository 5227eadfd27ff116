"""Missing input files stop a job before anything loads, naming key and path (issue 13)."""

import pytest

from siirl.errors import ConfigError
from siirl.launch.inputs import check_inputs, missing_inputs
from siirl.params.typed import to_typed


def config(data=None, model=None, nnodes=1):
    return to_typed({"data": data or {}, "actor_rollout_ref": {"model": {"path": model}},
                     "trainer": {"nnodes": nnodes}})


def test_missing_data_and_model_are_named(tmp_path):
    there = tmp_path / "train.parquet"
    there.write_text("")
    cfg = config(data={"train_files": [str(there), str(tmp_path / "gone.parquet")],
                       "val_files": str(tmp_path / "val.parquet")},
                 model=str(tmp_path / "no_model"))
    with pytest.raises(ConfigError) as info:
        check_inputs(cfg)
    message = str(info.value)
    for needle in (f"data.train_files={tmp_path / 'gone.parquet'}",
                   f"data.val_files={tmp_path / 'val.parquet'}",
                   f"actor_rollout_ref.model.path={tmp_path / 'no_model'}"):
        assert needle in message
    assert str(there) + "," not in message


@pytest.mark.parametrize("model", [None, "builtin:tiny-arith", "smollm2", "Qwen/Qwen2.5-0.5B"])
def test_model_names_the_loader_resolves_are_left_to_it(model):
    assert missing_inputs(config(model=model)) == []


def test_a_multi_node_job_leaves_the_check_to_its_workers(tmp_path):
    check_inputs(config(data={"train_files": str(tmp_path / "gone")}, nnodes=2))
