"""siiRL's own actor engines around an in-memory model, and the rollout batch they train on.

Both backends are built by the engine factories a training run uses (``fsdp_actor``,
``megatron_actor``), so ``update_policy`` runs the real PPO update: one mini-batch of
``rows`` rows, micro-batches of ``micro`` rows, on-policy (the update's first forward
gives the old log-probs, so each row costs exactly one forward and one backward).
"""

from __future__ import annotations

from typing import Any

import torch

from siirl.data_coordinator.protocol import make_batch


def engine_config(backend: str, rows: int, micro: int, device: str,
                  world_size: int, megatron_dtype: str = "float32") -> Any:
    """The run config of a one-mini-batch, one-epoch, unshuffled update on ``backend``."""
    from siirl.params.parser import parse_config

    actor = "actor_rollout_ref.actor"
    # fsdp: bf16 autocast over fp32 master weights; megatron: ``megatron_dtype`` weights and
    # compute (bfloat16: fp32 main weights in megatron's distributed optimizer)
    dtype = [f"{actor}.fsdp_config.model_dtype=bf16"] if backend == "fsdp" else \
        [f"{actor}.megatron.dtype={megatron_dtype}"]
    return parse_config([
        f"trainer.device={device}", f"{actor}.strategy={backend}",
        # rollout.n=1: ppo_mini_batch_size counts rows, over all data-parallel ranks
        "actor_rollout_ref.rollout.n=1",
        f"{actor}.ppo_mini_batch_size={rows * world_size}",
        f"{actor}.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"{actor}.ppo_epochs=1", f"{actor}.shuffle=false", f"{actor}.use_kl_loss=false",
        f"{actor}.optim.lr=1e-6", *dtype,
    ])


def checkpoint_activations(model: torch.nn.Module) -> None:
    """Activation checkpointing as siiRL's model loader turns it on (non-reentrant; the
    method was renamed in transformers 5)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def fsdp_actor_engine(model: torch.nn.Module, cfg: Any):
    """The fsdp actor with an injected module (as tests/engine/actor do); FSDP2 shards it
    when torch.distributed has more than one rank (torchrun), else it trains as is."""
    from siirl.engine.fsdp.engines import fsdp_actor

    return fsdp_actor(cfg, None, module=model)


def megatron_actor_engine(model: torch.nn.Module, cfg: Any):
    """The megatron actor's factory, unchanged, with the model it loads swapped for ours.

    ``megatron_actor`` takes no injected module; writing GBs of random weights to disk
    only to read them back through ``model.path`` would add nothing to what is measured.
    """
    from unittest import mock

    from siirl.engine.megatron import engines

    with mock.patch.object(engines, "load_policy", lambda _cfg: (model, None)):
        return engines.megatron_actor(cfg)


def rollout_batch(rows: int, seq: int, vocab: int, seed: int = 0) -> Any:
    """``rows`` full-length sequences (no padding: every position is a trained token),
    half prompt, half response, with random advantages."""
    g = torch.Generator().manual_seed(seed)
    response = seq // 2
    input_ids = torch.randint(0, vocab, (rows, seq), generator=g)
    attention_mask = torch.ones(rows, seq, dtype=torch.long)
    response_mask = torch.ones(rows, response)
    return make_batch({
        "prompts": input_ids[:, :seq - response].clone(),
        "responses": input_ids[:, seq - response:].clone(),
        "input_ids": input_ids, "attention_mask": attention_mask,
        "position_ids": torch.arange(seq).expand(rows, seq).clone(),
        "response_mask": response_mask,
        "advantages": torch.randn(rows, response, generator=g) * response_mask,
    })
