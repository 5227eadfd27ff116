"""Megatron offload between a role's verbs (``megatron.param_offload``, ``grad_offload``,
``optimizer_offload``; siirl.engine.megatron.offload).

A CPU run refuses the keys (no device memory to free), so these tests attach the
offloader to engines built on the CPU, where "host memory" is a second CPU buffer: after
every engine verb the role's weights, gradient buffers and optimizer state are really gone
(their storages hold 0 bytes, and a verb that touched one without fetching it would fail),
and the next verb brings them back bit for bit. The offloaded engines then train exactly
like resident ones: the actor on megatron's DDP + distributed optimizer (fp32 and bf16),
the critic on torch AdamW with megatron's bf16 main weights, the reference, and a
checkpoint saved and loaded while parked. tools/gpu/check_offload.py checks the same path
on a GPU, where it frees device memory.
"""

from __future__ import annotations

import pytest
import torch

from siirl_rollout_rows import rollout_rows

pytest.importorskip("megatron.core")

ACTOR, CRITIC = "actor_rollout_ref.actor", "critic"
EVERYTHING = dict(params=True, grads=True, optimizer=True)


def _config(dtype: str, *extra: str):
    from siirl.params.parser import parse_config

    return parse_config([
        "trainer.device=cpu", f"{ACTOR}.strategy=megatron", "actor_rollout_ref.ref.strategy"
        "=megatron", f"{CRITIC}.strategy=megatron", "algorithm.adv_estimator=gae",
        "actor_rollout_ref.rollout.n=1", f"{ACTOR}.ppo_mini_batch_size=2",
        f"{ACTOR}.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        f"{ACTOR}.use_kl_loss=false", f"{ACTOR}.optim.lr=0.01", f"{CRITIC}.optim.lr=0.01",
        f"{CRITIC}.ppo_mini_batch_size=2", f"{CRITIC}.ppo_micro_batch_size_per_gpu=1",
        *(f"{role}.megatron.dtype={dtype}" for role in (ACTOR, "actor_rollout_ref.ref",
                                                        CRITIC)), *extra])


def _offloaded(engine, **kinds):
    """``engine`` with an offloader on its backend (what the factory builds on a GPU)."""
    from siirl.engine.megatron.offload import OffloadSettings, backend_offloader

    backend = engine.backend
    backend.offload = backend_offloader(OffloadSettings(**kinds), backend.module,
                                        backend.optimizer, torch.device("cpu"))
    return engine


def _storages(tensors):
    return [t.untyped_storage() for t in tensors if t is not None]


def _parked(tensors) -> bool:
    storages = _storages(tensors)
    return bool(storages) and all(s.nbytes() == 0 for s in storages)


def _optimizer_state(engine):
    from siirl.engine.megatron.offload import torch_optimizers

    return [value for optimizer in torch_optimizers(engine.backend.optimizer)
            for state in optimizer.state.values() for value in state.values()
            if torch.is_tensor(value)]


def _weights(engine) -> dict:
    """The HF-named weights the rollout would receive (the export fetches and re-parks)."""
    return {name: tensor.clone() for bucket in engine.export_weights(1 << 20)
            for name, tensor in bucket}


def _metrics(output) -> dict:
    return {k: v for k, v in output.metrics.items() if not k.startswith("perf/")}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_offloaded_actor_parks_between_verbs_and_trains_like_a_resident_one(dtype):
    from siirl.engine.megatron.engines import megatron_actor

    resident = megatron_actor(_config(dtype))
    offloaded = _offloaded(megatron_actor(_config(dtype)), **EVERYTHING)
    params = list(offloaded.backend.module.parameters())
    main_grads = [getattr(p, "main_grad", None) for p in params]
    assert all(g is not None for g in main_grads)  # megatron's DDP gradient buffers
    for round_ in range(2):
        want_batch = resident.compute_log_prob(rollout_rows(vocab=20, seed=round_)).batch
        got_batch = offloaded.compute_log_prob(rollout_rows(vocab=20, seed=round_)).batch
        assert torch.equal(got_batch["old_log_probs"], want_batch["old_log_probs"])
        assert _parked(params)
        want = _metrics(resident.update_policy(want_batch))
        got = _metrics(offloaded.update_policy(got_batch))
        assert got == want, round_
        assert _parked(params) and _parked(main_grads) and _parked(_optimizer_state(offloaded))
        moved = offloaded.backend.offload.moved_bytes
        assert moved["params"] > 0 and moved["grads"] > 0 and moved["optimizer"] > 0
    want, got = _weights(resident), _weights(offloaded)
    assert _parked(params)
    assert want.keys() == got.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_an_offloaded_critic_and_reference_compute_like_resident_ones():
    """The critic (torch AdamW in megatron's bf16 optimizer: fp32 main copies, plain .grad
    fields) and the reference (weights only) of a PPO run in bf16."""
    from siirl.engine.megatron.engines import megatron_critic, megatron_reference

    config = _config("bfloat16", f"{ACTOR}.use_kl_loss=true")  # a reference is built
    runs = {}
    for name, kinds in (("resident", None), ("offloaded", EVERYTHING)):
        critic, reference = megatron_critic(config), megatron_reference(config)
        if kinds:
            critic, reference = _offloaded(critic, **kinds), _offloaded(reference, params=True)
        batch = rollout_rows(vocab=20)
        batch.set("returns", batch["advantages"])
        out = {"ref": reference.compute_ref_log_prob(batch).batch["ref_log_prob"].clone(),
               "metrics": []}
        for _ in range(2):
            critic.compute_values(batch)
            out["metrics"].append(_metrics(critic.update_critic(batch)))
        out["values"] = critic.compute_values(batch).batch["values"].clone()
        if kinds:
            critic_params = list(critic.backend.module.parameters())
            assert _parked(critic_params) and _parked(_optimizer_state(critic))
            assert all(p.grad is None for p in critic_params)  # gradients dropped
            assert _parked(reference.backend.module.parameters())
        runs[name] = out
    want, got = runs["resident"], runs["offloaded"]
    assert torch.equal(got["ref"], want["ref"])
    assert got["metrics"] == want["metrics"]
    assert torch.equal(got["values"], want["values"])


def test_a_checkpoint_of_a_parked_actor_loads_into_a_parked_actor(tmp_path):
    from siirl.engine.megatron.engines import megatron_actor

    actor = _offloaded(megatron_actor(_config("bfloat16")), **EVERYTHING)
    actor.update_policy(actor.compute_log_prob(rollout_rows(vocab=20)).batch)
    actor.save_checkpoint(str(tmp_path / "ckpt"))
    assert _parked(actor.backend.module.parameters())
    fresh = _offloaded(megatron_actor(_config("bfloat16")), **EVERYTHING)
    fresh.compute_log_prob(rollout_rows(vocab=20))  # park its weights first
    fresh.load_checkpoint(str(tmp_path / "ckpt"))
    assert _parked(fresh.backend.module.parameters()) and _parked(_optimizer_state(fresh))
    batch = rollout_rows(vocab=20, seed=1)
    want = _metrics(actor.update_policy(actor.compute_log_prob(batch).batch))
    got = _metrics(fresh.update_policy(fresh.compute_log_prob(rollout_rows(
        vocab=20, seed=1)).batch))
    assert got == want


def test_offload_is_refused_on_a_cpu_run_naming_the_key():
    """Before loading (the key rules) and, for workers elsewhere, by the engine."""
    from types import SimpleNamespace

    from siirl.engine.megatron.offload import role_offload
    from siirl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"critic\.megatron\.optimizer_offload=True: .*"
                                          "nothing to free"):
        _config("float32", "critic.megatron.optimizer_offload=true")
    section = SimpleNamespace(param_offload=False, grad_offload=True, optimizer_offload=True)
    with pytest.raises(ConfigError, match=r"^critic\.megatron\.grad_offload=true: .*"
                                          "nothing to free"):
        role_offload(section, "critic.megatron", torch.device("cpu"))
    assert not role_offload(section, "actor_rollout_ref.ref.megatron", torch.device("cpu"),
                            trains=False)  # a frozen role offloads no gradients
