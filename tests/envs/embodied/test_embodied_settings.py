"""The EMBODIED workflow refuses, before any episode, the backends it cannot run: the VLA's
log-prob head runs on the fsdp backend, which verl's ``strategy=fsdp2`` names too (the
configuration writes it as ``fsdp``: siirl.params.aliases)."""

import pytest

from siirl.environment.embodied.rollout_node import check_settings
from siirl.errors import ConfigError
from siirl.params.parser import parse_config
from siirl.params.typed import to_typed


def _config(strategy):
    return to_typed(parse_config([f"actor_rollout_ref.actor.strategy={strategy}"],
                                 check_support=False))


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_the_fsdp_backend_under_either_name_runs_episodes(strategy):
    check_settings(_config(strategy))


def test_megatron_is_refused_by_name():
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.strategy=megatron is not "
                                          "supported"):
        check_settings(_config("megatron"))
