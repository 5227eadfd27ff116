"""verl's spellings that this schema names otherwise: the DAPO recipe's overlong buffer
under reward_kwargs lands in reward_model.overlong_buffer; siiRL's implied CPGD loss."""

import pytest

from siirl.errors import ConfigError
from siirl.params.parser import parse_config

KW = "+reward_model.reward_kwargs"


def test_overlong_buffer_cfg_is_the_overlong_buffer():
    cfg = parse_config([f"{KW}.overlong_buffer_cfg.enable=true",
                        f"{KW}.overlong_buffer_cfg.len=4",
                        f"{KW}.overlong_buffer_cfg.penalty_factor=1.0",
                        f"{KW}.overlong_buffer_cfg.log=false",
                        f"{KW}.max_resp_len=8", "data.max_response_length=8"])
    buffer = cfg.reward_model.overlong_buffer
    assert (buffer.enable, buffer.len, buffer.penalty_factor, buffer.log) == (True, 4, 1.0,
                                                                              False)
    assert dict(cfg.reward_model.reward_kwargs) == {}  # nothing left for the manager


def test_an_unknown_buffer_key_and_a_different_max_resp_len_are_named():
    with pytest.raises(ConfigError) as info:
        parse_config([f"{KW}.overlong_buffer_cfg.size=4", f"{KW}.max_resp_len=9",
                      "data.max_response_length=8"])
    message = str(info.value)
    assert "reward_model.reward_kwargs.overlong_buffer_cfg.size: unknown" in message
    assert "max_resp_len=9 differs from data.max_response_length=8" in message


def test_the_aliased_buffer_is_checked_like_the_real_one():
    with pytest.raises(ConfigError, match="overlong_buffer.len=64"):
        parse_config([f"{KW}.overlong_buffer_cfg.enable=true",
                      f"{KW}.overlong_buffer_cfg.len=64", "data.max_response_length=8"])


@pytest.mark.parametrize("estimator, on", [("cpgd", True), ("grpo", False)])
def test_the_cpgd_estimator_implies_the_cpgd_loss(estimator, on):
    cfg = parse_config([f"algorithm.adv_estimator={estimator}"])
    assert cfg.actor_rollout_ref.actor.use_cpgd_loss is on
