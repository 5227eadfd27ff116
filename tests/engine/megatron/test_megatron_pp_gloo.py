"""Pipeline-parallel training step (PP=2, two gloo ranks on CPU) against Hugging Face.

``pipeline_logprob_step`` runs megatron-core's own 1F1B schedule over two micro-batches of a
left-padded batch (response tokens partly masked). Checked in one spawn, for Llama (untied
head) and Qwen2 (tied embeddings: the first and last stage each hold a copy):

* forward-only log-probs of the response equal HF's within float32 rounding;
* with a token-mean loss over both micro-batches, each stage's gradients, mapped back to HF
  names with the bridge, equal HF's gradients of the same loss within float32 rounding, and
  the two stages together cover every HF parameter.

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
    expected_hf,
    free_port,
    init_megatron,
    tiny_hf_model,
)

from siirl_numerics import assert_close, rounding, scale_of, transformer_terms  # noqa: E402

RESPONSE = 4
MICRO = 2


def split_micro_batches(input_ids, attention_mask, position_ids, count: int = MICRO) -> list:
    """The rows as ``count`` equal schedule micro-batches."""
    rows = input_ids.shape[0] // count
    return [{"input_ids": input_ids[i * rows:(i + 1) * rows],
             "attention_mask": attention_mask[i * rows:(i + 1) * rows],
             "position_ids": position_ids[i * rows:(i + 1) * rows]} for i in range(count)]


def _batch(vocab_size: int, seed: int = 3):
    """Four rows of 10 tokens: left-padded prompts, one response with a right pad."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (4, 10), generator=gen)
    attention_mask = torch.ones(4, 10, dtype=torch.long)
    attention_mask[0, :4] = 0
    attention_mask[2, :1] = 0
    attention_mask[3, :5] = 0
    attention_mask[1, -1] = 0  # response padding
    input_ids[attention_mask == 0] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def logprob_tolerance(config, want):
    """Megatron's pipeline and HF sum the same terms in another order: float32 rounding of
    the model's reductions over the 10 positions."""
    return rounding(torch.float32, transformer_terms(config, 10), scale_of(want), want.numel())


def _check_family(family: str, rank: int) -> None:
    import torch.distributed as dist

    from siirl.engine.megatron.bridge import megatron_to_hf
    from siirl.engine.megatron.chunks import model_chunks, stage_of
    from siirl.engine.megatron.pipeline import pipeline_logprob_step
    from siirl.engine.megatron_workers import build_megatron_model
    from siirl.engine.models.logprob import logprobs_from_logits

    hf = tiny_hf_model(family, num_layers=4)
    stage = build_megatron_model(hf, torch.device("cpu"))  # with VPP: this rank's chunks
    from megatron.core import parallel_state

    vpp = parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1
    assert len(model_chunks(stage)) == vpp

    input_ids, attention_mask, position_ids = _batch(hf.config.vocab_size)
    micro_batches = split_micro_batches(input_ids, attention_mask, position_ids)
    rows = micro_batches[0]["input_ids"].shape[0]
    response_mask = attention_mask[:, -RESPONSE:].float()
    tokens = response_mask.sum()

    ref_logits = hf(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=position_ids).logits
    ref_log_probs, _ = logprobs_from_logits(ref_logits, input_ids, RESPONSE)
    (-(ref_log_probs * response_mask).sum() / tokens).backward()

    out = pipeline_logprob_step(stage, micro_batches, RESPONSE, 1.0, None, forward_only=True)
    if rank == 1:
        got = torch.cat([o["log_probs"] for o in out])
        assert got.shape == ref_log_probs.shape
        assert_close(got, ref_log_probs.detach(), logprob_tolerance(hf.config, ref_log_probs),
                     f"{family} log-probs")
        assert all(o["loss"] is None for o in out)
    else:
        assert out == []
    assert all(p.grad is None for p in stage.parameters())
    # one micro-batch of all rows (the interleaved schedule pads it to a group of PP)
    whole = [{"input_ids": input_ids, "attention_mask": attention_mask,
              "position_ids": position_ids}]
    out = pipeline_logprob_step(stage, whole, RESPONSE, 1.0, None, forward_only=True)
    if rank == 1:
        assert len(out) == 1
        assert_close(out[0]["log_probs"], ref_log_probs.detach(),
                     logprob_tolerance(hf.config, ref_log_probs), f"{family} log-probs")

    def loss_fn(index: int, log_probs: torch.Tensor) -> torch.Tensor:
        mask = response_mask[index * rows:(index + 1) * rows]
        return -(log_probs * mask).sum() / tokens

    stage.train()
    out = pipeline_logprob_step(stage, micro_batches, RESPONSE, 1.0, loss_fn)
    if rank == 1:
        total = sum(o["loss"] for o in out)
        ref_loss = -(ref_log_probs * response_mask).sum() / tokens
        assert_close(total.item(), ref_loss.item(), rounding(
            torch.float32, transformer_terms(hf.config, input_ids.shape[1]) + int(tokens),
            max(abs(ref_loss.item()), 1.0)), f"{family} loss")
    hf_grads = {}
    for index, chunk in enumerate(model_chunks(stage)):
        grads = {name: param.grad for name, param in chunk.named_parameters()}
        assert all(grad is not None for grad in grads.values()), family
        pp_rank, pp_size = stage_of(stage, index)
        hf_grads.update(megatron_to_hf([grads], hf.config, pp_rank=pp_rank, pp_size=pp_size))
    params = dict(hf.named_parameters())
    for name, grad in hf_grads.items():
        assert_grads_close(grad, params[name].grad, attention_mask, hf.config,
                           f"{family} {name}")
    per_stage = [None, None]
    dist.all_gather_object(per_stage, sorted(hf_grads))
    assert sorted(per_stage[0] + per_stage[1]) == sorted(expected_hf(hf)), family


def rank_main(rank: int, world_size: int, port: int, vpp: int) -> None:

    from megatron.core import parallel_state

    start_gloo_rank(rank, world_size, port)
    init_megatron(tp=1, pp=2, vpp=vpp)
    for family in ("llama", "qwen2"):
        _check_family(family, rank)
    parallel_state.destroy_model_parallel()
    finish_rank()  # a failing rank raises instead


@pytest.mark.parametrize("vpp", [1, 2], ids=["pp2", "pp2-vpp2"])
def test_pp2_training_step_over_gloo_matches_hf(vpp):
    """vpp=2: each rank holds two chunks of one layer (rank 0: layers 0 and 2), megatron's
    interleaved 1F1B schedule runs them."""
    context = mp.start_processes(rank_main, args=(2, free_port(), vpp), nprocs=2, join=False,
                                 start_method="spawn")
    join_spawned(context, "the 2-rank megatron pipeline run")
