"""The built-in EMBODIED workflow prints its DAG but refuses to run, naming what is
missing, before anything loads (it used to fail at its first embodied node)."""

import pytest

from siirl.errors import ConfigError
from siirl.launch import job
from siirl.params.parser import parse_config


def test_the_embodied_workflow_is_refused_before_loading(tmp_path, capsys):
    config = parse_config(["algorithm.workflow_type=EMBODIED",
                           f"trainer.default_local_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="rollout that plays it in embodied environments"):
        job.run(config)
    assert not any(tmp_path.iterdir())  # nothing written
    job.run(config, print_dag=True)
    assert "embodied_grpo_training_pipeline" in capsys.readouterr().out
