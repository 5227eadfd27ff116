"""``reward_model.strategy=megatron``: the built-in tiny reward model (a
LlamaForSequenceClassification) as a megatron GPTModel with its score head scores every row
as the fsdp reward model does (float32), at TP=1, at TP=2 and at PP=2 over gloo, where each
rank hands in rows of its own (the reward node's rows need not be in the megatron layout).

Assertions run inside the spawned ranks; a failure there fails the test with the rank's
traceback.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from siirl_spawn import finish_rank, join_spawned, start_gloo_rank

pytest.importorskip("megatron.core")

from test_megatron_bridge import free_port  # noqa: E402

from siirl.engine.reward_model.combine import RM_SCORES  # noqa: E402
from siirl.engine.reward_model.loading import BUILTIN_TINY_REWARD, load_tokenizer  # noqa: E402
from siirl_rm_batches import rollout_batch  # noqa: E402

EOS = 2
CASES = [("13+5=", "18", True), ("2+2=", "5", True), ("20-7=", "13", False),
         ("9+9=", "1a", True), ("7*3=", "21", True), ("100-1=", "99", False)]
TOLERANCE = 1e-5  # float32: the same model, its sums in another order


def _batch(rows):
    tok = load_tokenizer(BUILTIN_TINY_REWARD)

    def ids(text):
        return tok.encode(text, add_special_tokens=False)

    return rollout_batch([ids(p) for p, _, _ in rows],
                         [ids(r) + ([EOS] if eos else []) for _, r, eos in rows],
                         tok.pad_token_id)


def _config(tp: int = 1, pp: int = 1, micro: int = 2) -> dict:
    return {"trainer": {"device": "cpu"},
            "actor_rollout_ref": {"actor": {"megatron": {
                "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp}}},
            "reward_model": {"enable": True, "strategy": "megatron",
                             "micro_batch_size_per_gpu": micro,
                             "model": {"path": BUILTIN_TINY_REWARD}}}


def _fsdp_scores(rows) -> torch.Tensor:
    from types import SimpleNamespace

    from siirl.engine.reward_model.factory import fsdp_reward_model

    tok = load_tokenizer(BUILTIN_TINY_REWARD)
    rm = fsdp_reward_model({"reward_model": {"enable": True,
                                             "model": {"path": BUILTIN_TINY_REWARD}}},
                           peers={"actor": SimpleNamespace(tokenizer=tok)})
    return rm.compute_rm_score(_batch(rows)).batch[RM_SCORES]


def rank_main(rank: int, world: int, port: int, tp: int, pp: int, want: torch.Tensor) -> None:
    from types import SimpleNamespace

    from siirl.engine.megatron_workers import megatron_engine

    start_gloo_rank(rank, world, port, 120)
    tok = load_tokenizer(BUILTIN_TINY_REWARD)
    rm = megatron_engine("reward_model", _config(tp, pp),
                         peers={"actor": SimpleNamespace(tokenizer=tok)})
    assert not any(p.requires_grad for p in rm.backend.module.parameters())
    # rank r scores rows r, r + world, ...: a share of its own, of another size at PP=2
    mine = list(range(rank, len(CASES), world)) if world > 1 else list(range(len(CASES)))
    if pp > 1 and rank == 1:
        mine = mine[:-1]
    out = rm.compute_rm_score(_batch([CASES[i] for i in mine]))
    got = out.batch[RM_SCORES]
    expected = want[mine][:, :got.shape[1]]
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert torch.count_nonzero(got) == torch.count_nonzero(expected)
    assert torch.allclose(got, expected, rtol=0.0, atol=TOLERANCE), (got, expected)
    assert out.metrics["reward/rm/mean"] == pytest.approx(expected.sum(-1).mean().item(),
                                                          abs=TOLERANCE)
    finish_rank()  # a failing rank raises instead


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2)], ids=["tp1", "tp2", "pp2"])
def test_megatron_reward_model_scores_like_the_fsdp_one(tp, pp):
    want = _fsdp_scores(CASES)
    world = tp * pp
    context = mp.start_processes(rank_main, args=(world, free_port(), tp, pp, want),
                                 nprocs=world, join=False, start_method="spawn")
    join_spawned(context, f"the megatron reward model at TP={tp} PP={pp}")
