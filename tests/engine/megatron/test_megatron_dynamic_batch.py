"""Dynamic batch size on the megatron backend: micro-batches cut by a token plan (rows of
different counts) through megatron's schedule, at PP=1 and at PP=2 over two gloo ranks
(``variable_seq_lengths``: stages send each activation's shape first).

The plan's micro-batches hold the same rows as fixed 2-row micro-batches, in another order
and grouping, so the forward-only log-probs (put back into row order) and the gradients of
a token-mean loss over the batch equal the fixed run's within float32 rounding.
Assertions run inside the ranks; a failure there fails the test with the rank's traceback.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from siirl_spawn import finish_rank, join_spawned, start_gloo_rank

pytest.importorskip("megatron.core")

from test_megatron_bridge import free_port, init_megatron, tiny_hf_model  # noqa: E402

from siirl_numerics import assert_close, rounding, scale_of, transformer_terms  # noqa: E402

RESPONSE = 4
ROWS, LENGTH = 6, 10


def _batch(vocab_size: int):
    """Six left-padded rows of 10 tokens with 10, 9, 6, 5, 8, 7 real tokens (one response
    padded on the right)."""
    from tensordict import TensorDict

    gen = torch.Generator().manual_seed(5)
    input_ids = torch.randint(0, vocab_size, (ROWS, LENGTH), generator=gen)
    attention_mask = torch.ones(ROWS, LENGTH, dtype=torch.long)
    for row, pad in enumerate((0, 1, 4, 5, 2, 3)):
        attention_mask[row, :pad] = 0
    attention_mask[1, -1] = 0
    input_ids[attention_mask == 0] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return TensorDict({"input_ids": input_ids, "attention_mask": attention_mask,
                       "position_ids": position_ids, "responses": input_ids[:, -RESPONSE:]},
                      batch_size=[ROWS])


def _run(backend, data, micro, tokens, tp_group=None):
    """Forward-only log-probs, then the gradients of the token-mean response loss (with
    sequence parallelism the norms' partial gradients summed over ``tp_group``)."""
    from siirl.engine.megatron.heads import logprob_heads
    from siirl.engine.megatron.sequence_parallel import sum_sequence_parallel_grads

    head = logprob_heads(RESPONSE, 1.0, False)
    log_probs = backend.forward_backward_batch(data, micro, head, forward_only=True)
    log_probs = log_probs["log_probs"]

    def loss_fn(part, outputs):
        mask = part["attention_mask"][:, -RESPONSE:].float()
        return -(outputs["log_probs"] * mask).sum() / tokens

    backend.module.train()
    backend.module.zero_grad(set_to_none=True)
    backend.forward_backward_batch(data, micro, head, loss_fn)
    sum_sequence_parallel_grads(backend.module, tp_group)
    grads = {name: param.grad.detach().clone()
             for name, param in backend.module.named_parameters()}
    return log_probs, grads


def rank_main(rank: int, world_size: int, port: int) -> None:

    from megatron.core import parallel_state

    from siirl.engine.common.dynamic_batch import TokenBudget, token_plan
    from siirl.engine.megatron.backend import MegatronBackend
    from siirl.engine.megatron_workers import build_megatron_model

    start_gloo_rank(rank, world_size, port)
    init_megatron(tp=1, pp=world_size)
    hf = tiny_hf_model("llama", num_layers=4)
    backend = MegatronBackend(build_megatron_model(hf, torch.device("cpu")))
    data = _batch(hf.config.vocab_size)
    tokens = data["attention_mask"][:, -RESPONSE:].sum()

    plan = token_plan(data, TokenBudget(12, "test.max_token_len"))
    sizes = sorted(len(part) for part in plan)
    assert len(set(sizes)) > 1 and sum(sizes) == ROWS, plan  # rows differ between micros
    fixed_log_probs, fixed_grads = _run(backend, data, 2, tokens)
    plan_log_probs, plan_grads = _run(backend, data, plan, tokens)

    # same rows, other batch neighbours: float32 rounding of the model's reductions
    terms = transformer_terms(hf.config, LENGTH)
    assert_close(plan_log_probs, fixed_log_probs,
                 rounding(torch.float32, terms, scale_of(fixed_log_probs),
                          fixed_log_probs.numel()), "log-probs of a token plan")
    worst = max((plan_log_probs - fixed_log_probs).abs().max().item(), 0.0)
    back = transformer_terms(hf.config, LENGTH, backward=True, tokens=ROWS * LENGTH)
    for name, want in fixed_grads.items():
        assert_close(plan_grads[name], want,
                     rounding(torch.float32, back, scale_of(want), want.numel()),
                     f"{name} gradient of a token plan")
        worst_grad = (plan_grads[name] - want).abs().max().item()
        worst = max(worst, worst_grad)
    print(f"rank {rank}: max |plan - fixed| = {worst:.3g}", flush=True)
    parallel_state.destroy_model_parallel()
    finish_rank()  # a failing rank raises instead


@pytest.mark.parametrize("pp", [1, 2], ids=["pp1", "pp2"])
def test_token_plan_matches_fixed_micro_batches(pp):
    context = mp.start_processes(rank_main, args=(pp, free_port()), nprocs=pp, join=False,
                                 start_method="spawn")
    join_spawned(context, f"the {pp}-rank megatron dynamic-batch run")
