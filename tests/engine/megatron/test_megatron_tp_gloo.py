"""Megatron GPT on two gloo ranks (CPU): tensor parallel TP=2, then pipeline parallel PP=2.

One spawn runs every check (each rank pays several seconds importing megatron-core):

* TP=2, Llama (untied head, padded vocab) and Qwen2 (tied, qkv bias): log-probs equal HF's
  within float32 rounding on a left-padded batch; ``iter_hf_weights`` all-gathers exactly
  HF's tensors in bounded buckets; backward runs and the TP-gathered gradients match HF's.
* PP=2, Qwen2 with tied embeddings: each stage's state dict has the bridge's keys and shapes,
  and a hand-rolled two-stage forward (send/recv of the hidden states) gives HF's log-probs.

Assertions run inside the ranks; a failure there fails the test with the rank's traceback.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from siirl_spawn import finish_rank, join_spawned, start_gloo_rank

pytest.importorskip("megatron.core")

from test_megatron_bridge import (  # noqa: E402
    assert_grads_close,
    assert_logprobs_close,
    check_buckets,
    expected_hf,
    free_port,
    init_megatron,
    left_padded_batch,
    tiny_hf_model,
    token_loss,
)

BOUND = 20_000  # bytes per bucket; the embedding and head (~26 kB) get buckets of their own


def _tp2_checks(family: str, sequence_parallel: bool = False) -> None:
    """With sequence_parallel the norms and residuals see half of the (10-token) sequence
    on each rank; the norm weights' gradients are summed over TP afterwards."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from siirl.engine.megatron.bridge import iter_hf_weights, load_hf_weights, megatron_to_hf
    from siirl.engine.megatron.model import build_gpt_model, forward_logits
    from siirl.engine.megatron.sequence_parallel import sum_sequence_parallel_grads

    hf = tiny_hf_model(family)
    megatron = build_gpt_model(hf.config, sequence_parallel=sequence_parallel)  # TP=2
    load_hf_weights(megatron, hf.state_dict(), hf.config)
    input_ids, attention_mask, position_ids = left_padded_batch(hf.config.vocab_size)
    logits = forward_logits(megatron, input_ids, position_ids, attention_mask)
    ref = hf(input_ids=input_ids, attention_mask=attention_mask,
             position_ids=position_ids).logits
    assert_logprobs_close(logits, ref, attention_mask, hf.config, family)

    with torch.no_grad():
        check_buckets(iter_hf_weights(megatron, hf.config, bucket_bytes=BOUND),
                      expected_hf(hf), BOUND)

    token_loss(logits, input_ids, attention_mask).backward()
    token_loss(ref, input_ids, attention_mask).backward()
    marked = [p for p in megatron.parameters() if getattr(p, "sequence_parallel", False)]
    assert bool(marked) == sequence_parallel
    if sequence_parallel:  # before the sum, each rank's norm gradient is a partial one
        partial = marked[0].grad.clone()
    sum_sequence_parallel_grads(megatron, parallel_state.get_tensor_model_parallel_group())
    if sequence_parallel:
        assert not torch.allclose(partial, marked[0].grad)
    local = {n: p.grad for n, p in megatron.named_parameters()}
    shards = [{} for _ in range(dist.get_world_size())]
    for name, grad in local.items():  # TP group == world here
        gathered = [torch.empty_like(grad) for _ in shards]
        dist.all_gather(gathered, grad.contiguous())
        for shard, tensor in zip(shards, gathered, strict=True):
            shard[name] = tensor
    grads = megatron_to_hf(shards, hf.config)
    for name, param in hf.named_parameters():
        if name in grads:
            assert_grads_close(grads[name], param.grad, attention_mask, hf.config,
                               f"{family} {name}")


def _pp2_checks(rank: int) -> None:
    import torch.distributed as dist

    from siirl.engine.megatron.bridge import hf_to_megatron, iter_hf_weights, load_hf_weights
    from siirl.engine.megatron.model import (
        build_gpt_model,
        forward_logits,
        megatron_attention_mask,
    )

    hf = tiny_hf_model("qwen2", num_layers=4)
    first, last = rank == 0, rank == 1
    stage = build_gpt_model(hf.config, pre_process=first, post_process=last)
    own = {k: v.shape for k, v in stage.state_dict().items() if isinstance(v, torch.Tensor)}
    bridged = hf_to_megatron(hf.state_dict(), hf.config, pp_rank=rank, pp_size=2)
    assert own == {k: v.shape for k, v in bridged.items()}
    load_hf_weights(stage, hf.state_dict(), hf.config)
    stage.eval()

    input_ids, attention_mask, position_ids = left_padded_batch(hf.config.vocab_size)
    with torch.no_grad():
        if first:
            hidden = stage(input_ids, position_ids, megatron_attention_mask(attention_mask))
            dist.send(hidden.contiguous(), dst=1)  # [S, B, H]
        else:
            hidden = torch.empty(input_ids.shape[1], input_ids.shape[0], hf.config.hidden_size)
            dist.recv(hidden, src=0)
            stage.set_input_tensor(hidden)
            logits = forward_logits(stage, input_ids, position_ids, attention_mask)
            ref = hf(input_ids=input_ids, attention_mask=attention_mask,
                     position_ids=position_ids).logits
            assert_logprobs_close(logits, ref, attention_mask, hf.config, "PP=2")
        names = [name for bucket in iter_hf_weights(stage, hf.config, BOUND)
                 for name, _ in bucket]
    per_stage = [None, None]
    dist.all_gather_object(per_stage, names)
    assert not set(per_stage[0]) & set(per_stage[1])
    assert sorted(per_stage[0] + per_stage[1]) == sorted(expected_hf(hf))


def rank_main(rank: int, world_size: int, port: int) -> None:

    from megatron.core import parallel_state

    start_gloo_rank(rank, world_size, port)
    init_megatron(tp=2, pp=1)
    for family in ("llama", "qwen2"):
        _tp2_checks(family)
    _tp2_checks("qwen2", sequence_parallel=True)
    parallel_state.destroy_model_parallel()
    init_megatron(tp=1, pp=2)
    _pp2_checks(rank)
    parallel_state.destroy_model_parallel()
    finish_rank()  # a failing rank raises instead


def test_tp2_and_pp2_over_gloo_match_hf():
    context = mp.start_processes(rank_main, args=(2, free_port()), nprocs=2, join=False,
                                 start_method="spawn")
    join_spawned(context, "the 2-rank megatron run")
