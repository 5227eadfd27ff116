"""Packing (``use_remove_padding``) on the megatron backend: each micro-batch runs as one
packed row with a block-diagonal causal mask and per-sequence positions (megatron's THD
packing needs Transformer Engine's attention). At PP=1, at PP=2 over two gloo ranks
(packed rows of different lengths between stages) and at TP=2 with sequence parallelism
(packed rows filled to even lengths with tokens nothing attends to), the response log-probs and the
gradients of a token-mean loss equal the padded path's within float32 rounding; positions
that score no response token hold 0, as on fsdp.
Assertions run inside the ranks; a failure there fails the test with the rank's traceback.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from siirl_spawn import finish_rank, join_spawned, start_gloo_rank

pytest.importorskip("megatron.core")

from test_megatron_bridge import free_port, init_megatron, tiny_hf_model  # noqa: E402
from test_megatron_dynamic_batch import LENGTH, RESPONSE, ROWS, _batch, _run  # noqa: E402

from siirl_numerics import assert_close, rounding, scale_of, transformer_terms  # noqa: E402


def _values(backend, data, response_mask, tp_group):
    """The critic's forward-only values, then the gradients of a masked value sum."""
    from siirl.engine.megatron.heads import value_heads
    from siirl.engine.megatron.sequence_parallel import sum_sequence_parallel_grads

    head = value_heads(backend.module)(RESPONSE)
    values = backend.forward_backward_batch(data, 2, head, forward_only=True)["values"]

    def loss_fn(part, outputs):
        mask = part["attention_mask"][:, -RESPONSE:].float()
        return (outputs["values"] * mask).sum() / response_mask.sum()

    backend.module.zero_grad(set_to_none=True)
    backend.forward_backward_batch(data, 2, head, loss_fn)
    sum_sequence_parallel_grads(backend.module, tp_group)
    # at PP 2 the value head sits on the last stage: the first's copy gets no gradient
    return values, {name: param.grad.detach().clone()
                    for name, param in backend.module.named_parameters()
                    if param.grad is not None}


def _check_values(model, config, data, response_mask, tp_group, rank):
    """A megatron critic: its value head on the packed row's hidden states."""
    from siirl.engine.critic.value_model import ValueModel
    from siirl.engine.megatron.backend import MegatronBackend
    from siirl.engine.megatron.heads import MegatronBackbone

    critic = ValueModel(MegatronBackbone(model), config.hidden_size, seed=0)
    padded = _values(MegatronBackend(critic, schedule_model=model), data, response_mask,
                     tp_group)
    packed = _values(MegatronBackend(critic, schedule_model=model, packing=True), data,
                     response_mask, tp_group)
    assert bool((packed[0][~response_mask] == 0).all())
    want = padded[0] * response_mask
    terms = transformer_terms(config, LENGTH)
    assert_close(packed[0], want, rounding(torch.float32, terms, scale_of(want), want.numel()),
                 "packed values")
    worst = (packed[0] - want).abs().max().item()
    back = transformer_terms(config, LENGTH, backward=True, tokens=ROWS * LENGTH)
    assert packed[1].keys() == padded[1].keys()
    for name, grad in padded[1].items():
        assert_close(packed[1][name], grad,
                     rounding(torch.float32, back, scale_of(grad), grad.numel()),
                     f"critic {name} gradient of packed rows")
        worst = max(worst, (packed[1][name] - grad).abs().max().item())
    print(f"rank {rank}: critic max |packed - padded| = {worst:.3g}", flush=True)


def rank_main(rank: int, world_size: int, port: int, tp: int) -> None:

    from megatron.core import parallel_state

    from siirl.engine.megatron.backend import MegatronBackend
    from siirl.engine.megatron_workers import build_megatron_model

    start_gloo_rank(rank, world_size, port)
    init_megatron(tp=tp, pp=world_size // tp)
    hf = tiny_hf_model("qwen2", num_layers=4)  # tied embeddings: both copies' gradients
    # TP 2 with sequence parallelism: packed rows filled to even lengths
    model = build_megatron_model(hf, torch.device("cpu"), sequence_parallel=tp > 1)
    tp_group = parallel_state.get_tensor_model_parallel_group() if tp > 1 else None
    data = _batch(hf.config.vocab_size)
    response_mask = data["attention_mask"][:, -RESPONSE:].bool()
    tokens = response_mask.sum()

    padded = _run(MegatronBackend(model), data, 2, tokens, tp_group)
    packed = _run(MegatronBackend(model, packing=True), data, 2, tokens, tp_group)
    assert bool((packed[0][~response_mask] == 0).all())  # unscored: 0, as on fsdp
    want = padded[0] * response_mask
    terms = transformer_terms(hf.config, LENGTH)
    assert_close(packed[0], want, rounding(torch.float32, terms, scale_of(want), want.numel()),
                 "packed log-probs")
    worst = (packed[0] - want).abs().max().item()
    print(f"rank {rank}: max |packed - padded| log-probs = {worst:.3g}", flush=True)
    back = transformer_terms(hf.config, LENGTH, backward=True, tokens=ROWS * LENGTH)
    for name, grad in padded[1].items():
        assert_close(packed[1][name], grad,
                     rounding(torch.float32, back, scale_of(grad), grad.numel()),
                     f"{name} gradient of packed rows")
        worst = max(worst, (packed[1][name] - grad).abs().max().item())
    print(f"rank {rank}: max |packed - padded| with gradients = {worst:.3g}", flush=True)
    _check_values(model, hf.config, data, response_mask, tp_group, rank)
    parallel_state.destroy_model_parallel()
    finish_rank()  # a failing rank raises instead


@pytest.mark.parametrize("tp,pp", [(1, 1), (1, 2), (2, 1)],
                         ids=["pp1", "pp2", "tp2-sequence-parallel"])
def test_packed_rows_match_the_padded_path(tp, pp):
    context = mp.start_processes(rank_main, args=(tp * pp, free_port(), tp), nprocs=tp * pp,
                                 join=False, start_method="spawn")
    join_spawned(context, f"the TP {tp} x PP {pp} megatron packing run")
