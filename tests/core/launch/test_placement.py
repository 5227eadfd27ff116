"""The job's worker pools and each rank's placement-group bundle (``launch.placement``)."""

import pytest

from siirl.launch.placement import Pool, bundle_of, worker_pools
from siirl.params.parser import parse_config


def test_a_synchronous_job_is_one_pool_of_trainer_nodes():
    config = parse_config(["trainer.nnodes=2", "trainer.n_gpus_per_node=4"])
    assert worker_pools(config, 8) == [Pool("trainer", 2, 4)]


def test_an_asynchronous_job_has_the_rollout_pool_after_the_trainers():
    config = parse_config(["async_training.enable=true", "trainer.nnodes=2",
                           "trainer.n_gpus_per_node=2", "rollout.nnodes=3",
                           "rollout.n_gpus_per_node=1", "trainer.device=cpu"])
    pools = worker_pools(config, 7)
    assert pools == [Pool("trainer", 2, 2), Pool("rollout", 3, 1)]
    assert [bundle_of(rank, pools) for rank in range(7)] == \
        [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (3, 0), (4, 0)]
    with pytest.raises(ValueError, match="beyond the workers"):
        bundle_of(7, pools)
