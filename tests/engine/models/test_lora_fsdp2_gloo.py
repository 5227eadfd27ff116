"""LoRA on FSDP2 over two gloo ranks: each rank trains the sharded adapters on half of the
batch and must match one process on the whole batch (loss, gradient norm, the adapters'
gradients and Adam step, the merged weights), writing one whole copy of the adapters as its
checkpoint."""

import os
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from siirl_lora_testlib import (
    LORA_RANK,
    PROMPT,
    RESPONSE,
    lora_actor,
    rollout_batch,
    trainable,
)

from siirl.data_coordinator.protocol import make_batch
from siirl.engine.common.checkpoint import EXTRA_FILE, OPTIMIZER_FILE
from siirl.engine.fsdp.engines import fsdp_reference
from siirl.engine.models import lora
from siirl.execution.scheduler.process_group_manager import free_port
from siirl_numerics import (
    assert_adam_step_close,
    assert_close,
    assert_metrics_close,
    optimizer_settings,
    rounding,
    scale_of,
    transformer_terms,
)
from siirl_spawn import finish_rank, join_spawned

peft = pytest.importorskip("peft", reason='peft is not installed: pip install '
                                          '"siirl-engine[lora]"')

ONE_MINI_BATCH = ["actor_rollout_ref.actor.ppo_mini_batch_size=8"]  # 8 rows, one step


@pytest.fixture(autouse=True)
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors; the test machine's cores are shared
    yield
    torch.set_num_threads(threads)


def merged_bound(module, merged_name, got, want):
    """How far a merged weight W + s * B @ A may move when the adapters differ by what
    their Adam step explains: s * (|dB| @ |A| + |B| @ |dA| + |dB| @ |dA|), plus float32
    rounding of the rank-r product and the sum."""
    prefix = "base_model.model." + merged_name.removesuffix(".weight")
    a_name, b_name = f"{prefix}.lora_A.default.weight", f"{prefix}.lora_B.default.weight"
    if a_name not in want:
        return None  # not adapted: the base weight, unchanged
    scaling = module.get_submodule(prefix).scaling["default"]
    a, b = want[a_name].double().abs(), want[b_name].double().abs()
    da = (got[a_name] - want[a_name]).double().abs()
    db = (got[b_name] - want[b_name]).double().abs()
    return scaling * (db @ a + b @ da + db @ da)


def _rank_main(rank: int, port: int, workdir: str) -> None:
    """One rank: a sharded LoRA actor and its reference update on half the batch, then
    write metrics, the merged weights and a checkpoint (then load it back)."""
    import torch.distributed as dist

    from siirl.engine.common.sharded_modules import fsdp_modules

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    worker = SimpleNamespace(rank=rank, world_size=2, engines={})
    config, actor = lora_actor(*ONE_MINI_BATCH, worker=worker)
    assert actor.sharded
    # each decoder layer (found through peft's wrapper) and the root are FSDP2 units
    assert len(fsdp_modules(actor.module)) == 3
    reference = fsdp_reference(config, worker, actor=actor)
    assert reference.module is actor.module
    batch = torch.load(os.path.join(workdir, "batch.pt"), weights_only=True)
    local = make_batch({k: batch[k][rank * 4:(rank + 1) * 4] for k in batch.keys()})
    # the reference's forward first, as when the old log-probs are deferred to the
    # update: FSDP2 initialises while the adapters are off, and must still train them
    local = reference.compute_ref_log_prob(local).batch
    local.set("old_log_probs", batch["old_log_probs"][rank * 4:(rank + 1) * 4])
    metrics = actor.update_policy(local).metrics
    merged = dict(lora.merged_weights(actor.module))  # collective
    adapters, grads = trainable(actor.module), trainable(actor.module, grads=True)
    actor.save_checkpoint(os.path.join(workdir, "ckpt"))
    before = lora.adapter_state(actor.module)
    actor.load_checkpoint(os.path.join(workdir, "ckpt"))
    assert all(torch.equal(before[k], v) for k, v in lora.adapter_state(actor.module).items())
    if rank == 0:
        torch.save({"metrics": metrics, "merged": merged, "ref": local["ref_log_prob"],
                    "adapters": adapters, "grads": grads},
                   os.path.join(workdir, "result.pt"))
    finish_rank()  # a failing rank raises instead


@pytest.mark.skipif(not (torch.distributed.is_available()
                         and torch.distributed.is_gloo_available()), reason="no gloo")
def test_two_sharded_ranks_train_like_one_process(tmp_path):
    config, single = lora_actor(*ONE_MINI_BATCH)
    batch = single.compute_log_prob(rollout_batch(rows=8)).batch
    reference = fsdp_reference(config, actor=single)
    batch = reference.compute_ref_log_prob(batch).batch
    want = single.update_policy(batch).metrics
    torch.save({k: batch[k] for k in batch.keys() if k != "ref_log_prob"},
               tmp_path / "batch.pt")
    context = mp.start_processes(_rank_main, args=(free_port(), str(tmp_path)), nprocs=2,
                                 join=False, start_method="spawn")
    join_spawned(context, "the 2-rank FSDP2 LoRA run")
    got = torch.load(tmp_path / "result.pt", weights_only=True)
    assert torch.equal(got["ref"], batch["ref_log_prob"][:4])
    config = single.module.config
    forward = transformer_terms(config, PROMPT + RESPONSE)
    backward = 2 * forward + 8 * (PROMPT + RESPONSE)  # the gradients sum over the tokens
    assert_metrics_close(got["metrics"], want, ("actor/pg_loss", "actor/grad_norm",
                                                "actor/kl_loss"),
                         lambda key: backward + sum(p.numel() for p in trainable(
                             single.module).values()) if key.endswith("grad_norm")
                         else forward + 8 * (PROMPT + RESPONSE))
    assert got["metrics"]["actor/grad_norm"] > 0
    want_adapters = trainable(single.module)
    want_grads = trainable(single.module, grads=True)
    for name, grad in want_grads.items():
        assert_close(got["grads"][name], grad, rounding(torch.float32, backward,
                                                        scale_of(grad), grad.numel()), name)
    # Adam's first step turns a rounding difference in a gradient near its eps into up to
    # lr * difference / eps: the adapters may differ by what their gradients explain
    assert_adam_step_close(got["adapters"], want_adapters, got["grads"], want_grads,
                           **optimizer_settings(single.optimizer))
    merged = dict(lora.merged_weights(single.module))
    for name, tensor in merged.items():
        bound = merged_bound(single.module, name, got["adapters"], want_adapters)
        tol = rounding(torch.float32, LORA_RANK + 1, scale_of(tensor), tensor.numel())
        diff = (got["merged"][name] - tensor).double().abs()
        allowed = tol.atol + (0 if bound is None else bound)
        assert bool((diff <= allowed).all()), (
            f"merged {name}: largest difference {diff.max().item():.3g}, allowed there "
            f"{(allowed if bound is None else allowed.flatten()[int(diff.argmax())]):.3g} "
            f"(the adapters' differences through s * B @ A, and {tol})")
    folder = tmp_path / "ckpt"  # one whole copy of the adapters, written by rank 0
    assert sorted(os.listdir(folder)) == sorted(
        [lora.ADAPTER_CONFIG, lora.ADAPTER_WEIGHTS, OPTIMIZER_FILE, EXTRA_FILE])
