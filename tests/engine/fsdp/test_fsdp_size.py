"""``fsdp_config.fsdp_size``: -1 or the role's worker count shard, 1 replicates, anything
in between is refused with a message naming the key and the supported values."""

import pytest

from siirl.engine.fsdp.sharding import replicates
from siirl.errors import ConfigError

KEY = "actor_rollout_ref.actor.fsdp_config.fsdp_size"


@pytest.mark.parametrize("size, world, want", [(-1, 2, False), (2, 2, False), (4, 4, False),
                                               (1, 2, True), ("1", 4, True)])
def test_supported_sizes(size, world, want):
    assert replicates(size, world, KEY) is want


@pytest.mark.parametrize("size", [2, 3, 0, -2])
def test_hybrid_and_nonsense_sizes_are_refused(size):
    with pytest.raises(ConfigError) as err:
        replicates(size, 4, KEY)
    assert f"{KEY}={size}" in str(err.value) and "-1" in str(err.value)


def test_non_integer_is_refused():
    with pytest.raises(ConfigError, match="is not an integer"):
        replicates("half", 2, KEY)
