"""The ``vllm`` rollout kept in sync with a megatron actor at tensor parallel 2 (gloo, CPU).

Two ranks each hold half of every layer of the actor, an in-process vLLM engine of their
own (TP 1, fp32) and the ``hf`` rollout's copy of the policy. The weight export is a
collective over TP, so both rollouts are synced on every rank in the same order. After
each sync (dummy start, then after 1 and 3 training steps) vLLM's greedy responses equal
the ``hf`` rollout's and its log-probs agree with the actor's own within 1e-3.
Assertions run inside the ranks; a failure there fails the test with the rank's traceback.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("vllm", reason="vLLM is not installed (tools/setup.sh --vllm)")
pytest.importorskip("megatron.core")

from test_vllm_rollout import TEXTS, prompts, run_config, save_random_model  # noqa: E402

from siirl.execution.scheduler.process_group_manager import free_port  # noqa: E402
from siirl_spawn import start_gloo_rank  # noqa: E402

pytestmark = [pytest.mark.vllm]
DEADLINE = 240  # seconds for both ranks: start-up, 3 steps and 3 checks


def sync(actor, *rollouts) -> None:
    for rollout in rollouts:  # each export is a TP collective: same order on every rank
        assert rollout.load_weights(actor.export_weights(1 << 16)) > 0  # ~12 buckets


def check(actor, vllm, hf) -> torch.Tensor:
    """vLLM's greedy responses equal hf's; its log-probs equal the actor's (TP 2)."""
    from siirl.data_coordinator.fields import ROLLOUT_LOG_PROBS

    batch = prompts(actor.tokenizer, TEXTS)
    got = vllm.generate(batch.clone(), validate=True).batch
    want = hf.generate(batch.clone(), validate=True).batch
    assert torch.equal(got["responses"], want["responses"]), (got["responses"],
                                                              want["responses"])
    assert torch.equal(got["response_mask"], want["response_mask"])
    assert got["response_mask"].sum() > len(TEXTS)  # not all stop at once
    own = actor.compute_log_prob(got.clone()).batch["old_log_probs"]
    mask = got["response_mask"]
    assert (got[ROLLOUT_LOG_PROBS] * (1 - mask)).abs().max() == 0
    diff = (got[ROLLOUT_LOG_PROBS] - own * mask).abs().max()
    assert diff < 1e-3, diff
    return got[ROLLOUT_LOG_PROBS]


def train(actor, vllm, hf, steps: int) -> None:
    import torch.distributed as dist

    for _ in range(steps):
        batch = vllm.generate(prompts(actor.tokenizer, TEXTS[:2])).batch  # sampled, n=2
        holder = [batch]  # TP ranks must train on the same rows: rank 0's samples
        dist.broadcast_object_list(holder, src=0)
        batch = actor.compute_log_prob(holder[0]).batch
        sign = torch.tensor([1.0, -1.0, -1.0, 1.0])[:, None]
        batch.set("advantages", batch["response_mask"] * sign)
        actor.update_policy(batch)
        sync(actor, vllm, hf)


def rank_main(rank: int, port: int, model_dir: str) -> None:

    import torch.distributed as dist

    from siirl.engine.megatron.engines import megatron_actor
    from siirl.engine.rollout.hf_rollout import HFRollout
    from siirl.engine.rollout.vllm_rollout import VLLMRollout

    start_gloo_rank(rank, 2, port, 120)
    config = run_config(model_dir, "actor_rollout_ref.actor.strategy=megatron",
                        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2")
    actor = megatron_actor(config)
    vllm = VLLMRollout(config=config, peers={"actor": actor})  # both ranks: vLLM's groups
    hf = HFRollout(config=config, peers={"actor": actor})
    assert vllm.needs_weights  # dummy weights until the first sync
    sync(actor, vllm, hf)
    before = check(actor, vllm, hf)
    train(actor, vllm, hf, 1)
    check(actor, vllm, hf)
    train(actor, vllm, hf, 2)
    after = check(actor, vllm, hf)
    # lr 0.01 for 3 steps moves a random model's greedy log-probs: the sync is not a no-op
    assert not torch.allclose(before, after)
    dist.barrier()  # vLLM's exit hook tears its groups and the default group down


def test_vllm_matches_hf_after_syncs_from_megatron_tp2(tmp_path):
    save_random_model(tmp_path)
    context = mp.start_processes(rank_main, args=(free_port(), str(tmp_path)), nprocs=2,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + DEADLINE
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the 2-rank megatron + vLLM run did not finish in {DEADLINE} s")
