"""verl's ``<role>.megatron.override_transformer_config``: any TransformerConfig field but
those that shape the weights or the layout applies; activation recompute, its most common
use, trains exactly like no recompute."""

import pytest
import torch

pytest.importorskip("megatron.core")

from siirl.engine.megatron.transformer_overrides import transformer_overrides  # noqa: E402
from siirl.errors import ConfigError  # noqa: E402
from siirl_rollout_rows import rollout_rows  # noqa: E402

KEY = "actor_rollout_ref.actor.megatron.override_transformer_config"
RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform",
             "recompute_num_layers": 1}


def test_fields_apply_by_their_megatron_names_and_types():
    from megatron.core.transformer.enums import AttnBackend

    got = transformer_overrides({**RECOMPUTE, "attention_backend": "local",
                                 "moe_aux_loss_coeff": 0.01}, True, KEY)
    assert got == {**RECOMPUTE, "attention_backend": AttnBackend.local,
                   "moe_aux_loss_coeff": 0.01, "moe_router_load_balancing_type": "aux_loss"}
    assert transformer_overrides({}, False, KEY) == {}


def test_unknown_names_shape_keys_and_bad_enum_values_are_refused():
    with pytest.raises(ConfigError, match=r"recompute_granularty \(did you mean "
                                          r"recompute_granularity"):
        transformer_overrides({"recompute_granularty": "full"}, False, KEY)
    with pytest.raises(ConfigError, match="hidden_size.*Hugging Face config"):
        transformer_overrides({"hidden_size": 64}, False, KEY)
    with pytest.raises(ConfigError, match="attention_backend='fast'.*flash"):
        transformer_overrides({"attention_backend": "fast"}, False, KEY)
    with pytest.raises(ConfigError, match="dense model"):
        transformer_overrides({"moe_z_loss_coeff": 0.1}, False, KEY)


def _batch():
    return rollout_rows(vocab=20)  # the model's vocabulary


def _update(*overrides):
    from siirl.engine.megatron.engines import megatron_actor
    from siirl.params.parser import parse_config

    actor = "actor_rollout_ref.actor"
    engine = megatron_actor(parse_config([
        "trainer.device=cpu", f"{actor}.strategy=megatron", "actor_rollout_ref.rollout.n=1",
        f"{actor}.ppo_mini_batch_size=4", f"{actor}.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        f"{actor}.use_kl_loss=false", f"{actor}.optim.lr=0.01", *overrides]))
    batch = engine.compute_log_prob(_batch()).batch
    metrics = engine.update_policy(batch).metrics
    after = engine.compute_log_prob(_batch()).batch["old_log_probs"]
    config = next(m.config for m in engine.backend.module.modules()
                  if type(m).__name__ == "TransformerBlock")
    return batch["old_log_probs"], metrics, after, config


def test_full_activation_recompute_trains_like_none():
    plain = _update()
    recomputed = _update(*(f"+{KEY}.{k}={v}" for k, v in RECOMPUTE.items()))
    # the same operations, run again in the backward: equal up to fp32 rounding
    tol = 8 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(recomputed[0], plain[0], atol=tol, rtol=tol)
    for name in ("actor/pg_loss", "actor/grad_norm"):
        assert recomputed[1][name] == pytest.approx(plain[1][name], rel=1e-5), name
    torch.testing.assert_close(recomputed[2], plain[2], atol=1e-5, rtol=1e-5)
    assert not torch.equal(plain[2], plain[0])  # the update moved the policy
    assert (plain[3].recompute_granularity, recomputed[3].recompute_granularity) == (None, "full")
