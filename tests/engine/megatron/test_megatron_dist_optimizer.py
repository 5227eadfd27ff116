"""megatron-core's DDP + distributed optimizer (ZeRO-1 Adam) on two gloo ranks on CPU.

Data parallel 2, TP = PP = 1: both ranks hold the same tiny Llama, each gets half of a
left-padded batch. Two steps of megatron's DDP + ``DistributedOptimizer`` (Adam, lr 1e-2,
no weight decay, grad clipping at 1.0, which the first step's norm exceeds) must give the
weights of a single-process reference -- the same megatron model, the full batch's
token-mean loss, ``torch.nn.utils.clip_grad_norm_`` and ``torch.optim.AdamW`` -- within
1e-5, and megatron's returned grad norm must be the one ``clip_grad_norm_`` reports. The
same for megatron's non-distributed ``FP32Optimizer`` (DDP all-reduce). Then the
distributed optimizer's state goes through ``dist_checkpointing`` and back into a fresh
optimizer, whose next step must be the original's.

Assertions run inside the ranks; a failure there fails the test with the rank's traceback.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from siirl_spawn import finish_rank, join_spawned, start_gloo_rank

pytest.importorskip("megatron.core")

from test_megatron_bridge import free_port, init_megatron, tiny_hf_model  # noqa: E402

LR, BETAS, EPS, CLIP = 1e-2, (0.9, 0.999), 1e-8, 1.0
STEPS = 2


def _batch(vocab_size: int, seed: int = 5):
    """Four left-padded rows of 10 tokens (rank r takes rows 2r, 2r+1)."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (4, 10), generator=gen)
    attention_mask = torch.ones(4, 10, dtype=torch.long)
    attention_mask[0, :4] = 0
    attention_mask[2, :1] = 0
    attention_mask[3, :6] = 0
    input_ids[attention_mask == 0] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def _token_logp_sum(model, input_ids, attention_mask, position_ids):
    """Sum of log p(token | prefix) over real tokens with a real predecessor, and their count."""
    from siirl.engine.megatron.model import forward_logits

    logits = forward_logits(model, input_ids, position_ids, attention_mask)
    logp = logits.float().log_softmax(-1)[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    mask = (attention_mask[:, 1:] * attention_mask[:, :-1]).float()
    return (logp * mask).sum(), mask.sum()


def _megatron_model(hf):
    from siirl.engine.megatron.bridge import load_hf_weights
    from siirl.engine.megatron.model import build_gpt_model

    model = build_gpt_model(hf.config)
    load_hf_weights(model, hf.state_dict(), hf.config)
    return model


def _reference(hf, batch):
    """Single process, full batch: token-mean loss, clip_grad_norm_, AdamW (no decay)."""
    model = _megatron_model(hf)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                  weight_decay=0.0)
    weights, norms = [], []
    for _ in range(STEPS):
        optimizer.zero_grad()
        logp_sum, tokens = _token_logp_sum(model, *batch)
        (-logp_sum / tokens).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item())
        optimizer.step()
        weights.append({k: v.detach().clone() for k, v in model.named_parameters()})
    return weights, norms


def _train_step(ddp_model, optimizer, rank_batch, total_tokens, dp_size):
    from siirl.engine.megatron.optimizer import finish_grad_sync, optimizer_step, zero_grad

    zero_grad(ddp_model, optimizer)
    logp_sum, _ = _token_logp_sum(ddp_model, *rank_batch)
    # DDP averages over the dp_size ranks: scale so that the average is the global token mean
    (-logp_sum / total_tokens * dp_size).backward()
    finish_grad_sync(ddp_model)
    return optimizer_step(optimizer)


def _assert_weights(model, expected, what):
    for name, param in model.named_parameters():
        name = name.removeprefix("module.")
        diff = (param.detach() - expected[name]).abs().max().item()
        assert diff < 1e-5, f"{what}: {name} differs by {diff}"


def rank_main(rank: int, world_size: int, port: int, ckpt_dir: str) -> None:

    from megatron.core import parallel_state

    from siirl.engine.megatron.optimizer import (
        build_distributed_optimizer,
        load_optimizer_checkpoint,
        save_optimizer_checkpoint,
    )

    start_gloo_rank(rank, world_size, port)
    init_megatron(tp=1, pp=1)
    assert parallel_state.get_data_parallel_world_size() == 2

    hf = tiny_hf_model("llama")
    batch = _batch(hf.config.vocab_size)
    total_tokens = (batch[1][:, 1:] * batch[1][:, :-1]).sum()
    rank_batch = tuple(t[2 * rank:2 * rank + 2] for t in batch)
    ref_weights, ref_norms = _reference(hf, batch)

    for distributed in (True, False):
        what = "DistributedOptimizer" if distributed else "FP32Optimizer"
        ddp_model, optimizer = build_distributed_optimizer(
            _megatron_model(hf), lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, clip_grad=CLIP,
            use_distributed_optimizer=distributed)
        assert type(optimizer.chained_optimizers[0]).__name__ == what
        for step in range(STEPS):
            update_ok, grad_norm, _ = _train_step(ddp_model, optimizer, rank_batch,
                                                  total_tokens, world_size)
            assert update_ok
            assert abs(grad_norm - ref_norms[step]) < 1e-5 * max(1.0, ref_norms[step]), (
                what, step, grad_norm, ref_norms[step])
            _assert_weights(ddp_model, ref_weights[step], f"{what} step {step}")
        assert ref_norms[0] > CLIP  # the clipping path really ran

    # optimizer state -> dist_checkpointing -> a fresh optimizer (of a freshly loaded model)
    ddp_model, optimizer = build_distributed_optimizer(
        _megatron_model(hf), lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, clip_grad=CLIP)
    _train_step(ddp_model, optimizer, rank_batch, total_tokens, world_size)
    save_optimizer_checkpoint(optimizer, ddp_model, ckpt_dir)
    fresh_model, fresh_optimizer = build_distributed_optimizer(
        _megatron_model(hf), lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, clip_grad=CLIP)
    load_optimizer_checkpoint(fresh_optimizer, fresh_model, ckpt_dir)
    _assert_weights(fresh_model, ref_weights[0], "weights restored from the optimizer state")
    _, norm, _ = _train_step(fresh_model, fresh_optimizer, rank_batch, total_tokens, world_size)
    assert abs(norm - ref_norms[1]) < 1e-5 * max(1.0, ref_norms[1])
    _assert_weights(fresh_model, ref_weights[1], "step after loading the optimizer state")

    parallel_state.destroy_model_parallel()
    finish_rank()  # a failing rank raises instead


def test_dp2_distributed_adam_over_gloo_matches_single_process_adamw(tmp_path):
    context = mp.start_processes(rank_main, args=(2, free_port(), str(tmp_path)), nprocs=2,
                                 join=False, start_method="spawn")
    join_spawned(context, "the 2-rank megatron DDP run")
