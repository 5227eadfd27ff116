"""Values that contradict another key stop the run when the config is parsed (issue 13)."""

import pytest

from siirl.errors import ConfigError
from siirl.params.parser import parse_config

BUFFER = "reward_model.overlong_buffer"


@pytest.mark.parametrize("length", [0, 9, 512])
def test_overlong_buffer_must_fit_the_response(length):
    with pytest.raises(ConfigError) as info:
        parse_config([f"{BUFFER}.enable=true", f"{BUFFER}.len={length}",
                      "data.max_response_length=8"])
    message = str(info.value)
    assert f"{BUFFER}.len={length}" in message  # the key and its value
    assert "1..data.max_response_length (8)" in message  # the constraint
    assert "\n" not in message


def test_overlong_buffer_in_range_or_disabled_is_fine():
    parse_config([f"{BUFFER}.enable=true", f"{BUFFER}.len=8", "data.max_response_length=8"])
    parse_config([f"{BUFFER}.enable=false", f"{BUFFER}.len=512"])
