"""The megatron section's expert-parallel keys: accepted where the engine runs them (the actor
under megatron's DDP, the reference in the actor's state, a megatron critic averaging by
hand, with pipeline stages too), refused with the reason where it would not, and sized
against the workers the experts are split over."""

import pytest

from siirl.errors import ConfigError
from siirl.params.parser import parse_config

ACTOR = "actor_rollout_ref.actor"
EP2 = [f"{ACTOR}.strategy=megatron", f"{ACTOR}.megatron.expert_model_parallel_size=2",
       "trainer.device=cpu", "trainer.n_gpus_per_node=2"]


def _refusal(overrides):
    with pytest.raises(ConfigError) as info:
        parse_config(overrides, validate=True)
    return str(info.value)


def test_expert_parallelism_of_the_actor_is_accepted():
    config = parse_config(EP2 + ["actor_rollout_ref.ref.megatron.expert_model_parallel_size=2"],
                          validate=True)
    assert config.actor_rollout_ref.actor.megatron.expert_model_parallel_size == 2
    parse_config(EP2 + [f"{ACTOR}.megatron.expert_tensor_parallel_size=1"], validate=True)


def test_expert_tensor_parallelism_other_than_tp_is_accepted():
    """TP 2 with whole experts (expert TP 1), spread by EP 2 or replicated (EP 1)
    (tests/engine/megatron/test_megatron_expert_tp.py trains them)."""
    tp2 = [f"{ACTOR}.megatron.tensor_model_parallel_size=2",
           f"{ACTOR}.megatron.sequence_parallel=true",
           f"{ACTOR}.megatron.expert_tensor_parallel_size=1"]
    for experts in ("1", "2"):
        config = parse_config(EP2[:1] + EP2[2:] + tp2 + [
            f"{ACTOR}.megatron.expert_model_parallel_size={experts}"], validate=True)
        assert config.actor_rollout_ref.actor.megatron.expert_tensor_parallel_size == 1


def test_expert_tensor_parallelism_must_fit_the_workers():
    text = _refusal(EP2 + [f"{ACTOR}.megatron.expert_tensor_parallel_size=2"])
    assert "expert_tensor_parallel_size=2 x expert_model_parallel_size=2" in text, text
    assert "must divide the number of workers (2 " in text, text


def test_expert_tensor_parallelism_other_than_tp_with_pipeline_stages_is_accepted():
    """megatron lays experts out in its pipeline-last order, translated to siiRL's workers
    (siirl.engine.megatron.rank_order; trained in test_megatron_rank_order.py)."""
    config = parse_config([f"{ACTOR}.strategy=megatron", "trainer.device=cpu",
                           "trainer.n_gpus_per_node=4",
                           f"{ACTOR}.megatron.tensor_model_parallel_size=2",
                           f"{ACTOR}.megatron.sequence_parallel=true",
                           f"{ACTOR}.megatron.pipeline_model_parallel_size=2",
                           f"{ACTOR}.megatron.expert_tensor_parallel_size=1"], validate=True)
    assert config.actor_rollout_ref.actor.megatron.expert_tensor_parallel_size == 1


def test_expert_parallelism_of_a_megatron_critic_is_accepted():
    """The critic averages expert gradients over their expert data-parallel group by hand
    (siirl.engine.megatron.engines.grad_averager)."""
    config = parse_config(EP2 + ["critic.strategy=megatron", "algorithm.adv_estimator=gae"],
                          validate=True)
    assert config.critic.strategy == "megatron"


@pytest.mark.parametrize("virtual", [[], [f"{ACTOR}.megatron.virtual_pipeline_model_parallel_size"
                                          "=2"]], ids=["pp", "vpp"])
def test_expert_parallelism_with_pipeline_stages_is_accepted(virtual):
    config = parse_config(EP2 + ["trainer.n_gpus_per_node=4",
                                 f"{ACTOR}.megatron.pipeline_model_parallel_size=2", *virtual],
                          validate=True)
    assert config.actor_rollout_ref.actor.megatron.pipeline_model_parallel_size == 2


def test_the_reference_follows_the_actors_expert_parallel_size():
    text = _refusal(EP2 + ["actor_rollout_ref.ref.megatron.expert_model_parallel_size=4"] +
                    ["actor_rollout_ref.ref.strategy=megatron"])
    assert f"{ACTOR}.megatron" in text, text


def test_expert_parallel_size_must_divide_the_data_parallel_ranks():
    text = _refusal(EP2 + [f"{ACTOR}.megatron.tensor_model_parallel_size=2",
                           f"{ACTOR}.megatron.sequence_parallel=true"])
    assert "expert_model_parallel_size=2 must divide the data-parallel size 1" in text, text


OVERRIDES = f"+{ACTOR}.megatron.override_transformer_config"


def test_verl_router_loss_overrides_are_accepted_and_shape_overrides_refused():
    config = parse_config([f"{ACTOR}.strategy=megatron", f"{OVERRIDES}.moe_aux_loss_coeff=0.01",
                           f"{OVERRIDES}.moe_z_loss_coeff=0.001",
                           f"{OVERRIDES}.moe_router_load_balancing_type=aux_loss"], validate=True)
    assert config.actor_rollout_ref.actor.megatron.override_transformer_config == {
        "moe_aux_loss_coeff": 0.01, "moe_z_loss_coeff": 0.001,
        "moe_router_load_balancing_type": "aux_loss"}
    text = _refusal([f"{ACTOR}.strategy=megatron", f"{OVERRIDES}.moe_aux_loss_coeff=0.01",
                     f"{OVERRIDES}.num_moe_experts=8"])
    assert "override_transformer_config" in text and "Hugging Face config" in text, text


def test_router_overrides_are_checked_where_the_model_is_known():
    from siirl.engine.megatron.router_loss import router_overrides

    key = f"{ACTOR}.megatron.override_transformer_config"
    assert router_overrides({"moe_aux_loss_coeff": 0.01}, True, key) == {
        "moe_aux_loss_coeff": 0.01, "moe_router_load_balancing_type": "aux_loss"}
    assert router_overrides({}, False, key) == {}
    with pytest.raises(ConfigError, match="dense model"):
        router_overrides({"moe_aux_loss_coeff": 0.01}, False, key)
    with pytest.raises(ConfigError, match="sinkhorn"):
        router_overrides({"moe_router_load_balancing_type": "sinkhorn"}, True, key)
    # the other keys are transformer_overrides' (tests/engine/megatron/test_megatron_overrides.py)
    assert router_overrides({"recompute_granularity": "full"}, False, key) == {}


@pytest.mark.parametrize("key,value", [(f"{ACTOR}.router_replay.mode", "R3"),
                                       ("actor_rollout_ref.ref.router_replay.mode", "R2"),
                                       ("actor_rollout_ref.rollout.enable_rollout_routing_replay",
                                        "true")])
def test_router_replay_is_refused_with_the_reason(key, value):
    """verl's R3 keys (and the reference's replay) are known and refused: no rollout here
    reports its routing; R2 (tests/engine/megatron/test_megatron_router_replay.py) is not."""
    text = _refusal([f"{key}={value}"])
    assert key in text and "router replay R3" in text and "do not" in text, text
    parse_config([f"{ACTOR}.router_replay.mode=disabled"], validate=True)
