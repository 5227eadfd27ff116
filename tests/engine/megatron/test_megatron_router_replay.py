"""verl's router replay, mode R2, on the megatron actor (``siirl.engine.megatron.router_replay``):
the old-log-prob pass records each token's experts per MoE layer into the batch, and a
forward that replays them routes through exactly those experts (replaying the routing a
forward would choose itself changes nothing; replaying another one changes the log-probs).
Packed rows (``use_remove_padding``) record and replay the same routing as padded ones.
"""

import json
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("megatron.core")

from test_megatron_bridge import free_port  # noqa: E402

from siirl.data_coordinator.fields import OLD_LOG_PROBS, ROUTED_EXPERTS  # noqa: E402
from siirl_rollout_rows import rollout_rows  # noqa: E402
from siirl_spawn import finish_rank, join_spawned, start_gloo_rank  # noqa: E402

ACTOR = "actor_rollout_ref.actor"
MOE = ["actor_rollout_ref.model.path=builtin:tiny-moe", "actor_rollout_ref.rollout.n=1"]
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning:megatron"),
              pytest.mark.filterwarnings("ignore:Apex is not installed:UserWarning")]


def _batch():
    return rollout_rows(vocab=58)  # the model's vocabulary


def _actor(*extra):
    from siirl.engine.megatron.engines import megatron_actor
    from siirl.params.parser import parse_config

    return megatron_actor(parse_config([
        "trainer.device=cpu", f"{ACTOR}.strategy=megatron", *MOE,
        f"{ACTOR}.ppo_mini_batch_size=4", f"{ACTOR}.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
        f"{ACTOR}.use_kl_loss=false", f"{ACTOR}.router_replay.mode=R2", *extra]))


@pytest.fixture(scope="module")
def actor():
    return _actor()


def _logprobs(actor, batch, routed=None):
    """The actor's log-probs of ``batch``, routing through ``routed`` where given."""
    from siirl.engine.megatron.heads import megatron_logprobs

    model, replay = actor.backend.schedule_model, actor.backend.routing
    args = (batch["input_ids"], batch["attention_mask"], batch["position_ids"],
            batch["responses"].shape[-1])
    with torch.no_grad():
        if routed is None:
            return megatron_logprobs(model, *args)[0]
        with replay.replaying(routed):
            return megatron_logprobs(model, *args)[0]


def test_the_old_log_prob_pass_records_every_tokens_experts(actor):
    batch = actor.compute_log_prob(_batch()).batch
    routed = batch[ROUTED_EXPERTS]
    # rows x tokens x the model's 3 MoE layers x top-2, in micro-batches of 3 put back in
    # row order
    assert routed.shape == (4, 12, 3, 2) and routed.dtype == torch.uint8
    assert int(routed.max()) < 4 and bool((routed[..., 0] != routed[..., 1]).all())
    # fp32 rounding: the old-log-prob pass ran micro-batches of 3 rows, this one all 4
    torch.testing.assert_close(_logprobs(actor, batch), batch[OLD_LOG_PROBS], rtol=1e-5,
                               atol=1e-6)


def test_a_replayed_forward_routes_through_the_recorded_experts(actor):
    batch = actor.compute_log_prob(_batch()).batch
    before = batch[ROUTED_EXPERTS]
    # replaying what the router chooses itself changes nothing
    torch.testing.assert_close(_logprobs(actor, batch, before), _logprobs(actor, batch),
                               rtol=1e-5, atol=1e-6)
    routers = [m for m in actor.backend.schedule_model.modules()
               if getattr(m, "router_replay", None) is not None]
    saved = [r.weight.detach().clone() for r in routers]
    try:
        with torch.no_grad():  # the update moved the routers: other experts now win
            for router in routers:
                router.weight.add_(torch.randn(router.weight.shape,
                                               generator=torch.Generator().manual_seed(1)))
        after = actor.compute_log_prob(_batch()).batch[ROUTED_EXPERTS]
        assert bool((after != before).any())
        fresh, replayed = _logprobs(actor, batch), _logprobs(actor, batch, before)
        assert (fresh - replayed).abs().max() > 1e-4  # the old experts, not today's
        torch.testing.assert_close(_logprobs(actor, batch, after), fresh, rtol=1e-5, atol=1e-6)
    finally:
        with torch.no_grad():
            for router, weight in zip(routers, saved, strict=True):
                router.weight.copy_(weight)


def test_the_update_routes_through_the_batchs_experts(actor):
    _update_follows_the_batchs_experts(actor)


PACKING = "actor_rollout_ref.model.use_remove_padding=true"


def test_packed_rows_record_the_padded_rows_routing_and_replay_it():
    """One packed row per micro-batch: its routing goes back to each token's place in the
    padded rows (where the padded actor puts the same experts), and the update routes the
    packed row through the batch's experts."""
    padded, packed = _actor(), _actor(PACKING)  # untrained, as the module's actor is not
    want = padded.compute_log_prob(_batch()).batch[ROUTED_EXPERTS]
    got = packed.compute_log_prob(_batch()).batch[ROUTED_EXPERTS]
    attended = _batch()["attention_mask"].bool()
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got[attended], want[attended])
    # row 0's two left-padding tokens: experts nothing reads, still two distinct ones
    assert torch.equal(got[0, :2], torch.tensor([0, 1], dtype=got.dtype).expand(2, 3, 2))
    _update_follows_the_batchs_experts(packed)


def _update_follows_the_batchs_experts(actor):
    # the update's forwards (one optimizer step: before it, the old-log-prob weights) route
    # through the recorded experts: the old log-probs come back (fp32 rounding of other
    # micro-batch sizes)
    batch = actor.compute_log_prob(_batch()).batch
    metrics = actor.update_policy(batch).metrics
    assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-5)
    # other experts in the batch: the update's forward follows them, not the router
    batch = actor.compute_log_prob(_batch()).batch
    batch.set(ROUTED_EXPERTS, (batch[ROUTED_EXPERTS] + 1) % 4)  # still two distinct experts
    assert abs(actor.update_policy(batch).metrics["actor/ppo_kl"]) > 1e-3


LAYOUTS = {
    "tp2-sp-padded": [f"{ACTOR}.megatron.tensor_model_parallel_size=2",
                      f"{ACTOR}.megatron.sequence_parallel=true"],
    "tp2-sp-packed": [f"{ACTOR}.megatron.tensor_model_parallel_size=2",
                      f"{ACTOR}.megatron.sequence_parallel=true", PACKING],
    # 2 + 1 MoE layers per stage; micro-batches of 3 of 4 rows: the short one is filled
    "pp2": [f"{ACTOR}.megatron.pipeline_model_parallel_size=2"],
}
VIRTUAL = {"pp2-vpp2": [f"{ACTOR}.megatron.pipeline_model_parallel_size=2",
                        f"{ACTOR}.megatron.virtual_pipeline_model_parallel_size=2"]}


def four_layer_moe(directory) -> str:
    """A random 4-layer Mixtral (4 experts, top-2) with the built-in tokenizer: 2 pipeline
    stages x 2 virtual chunks of one MoE layer each (the built-in tiny MoE has 3 layers)."""
    import json
    import shutil
    from pathlib import Path

    from transformers import MixtralConfig, MixtralForCausalLM

    from siirl.engine.models.loader import tiny_arith_dir

    source, directory = Path(tiny_arith_dir()), Path(directory)
    vocab = json.loads((source / "config.json").read_text())
    torch.manual_seed(0)
    MixtralForCausalLM(MixtralConfig(
        hidden_size=32, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, num_local_experts=4,
        num_experts_per_tok=2, tie_word_embeddings=False,
        initializer_range=0.5,  # outputs that feel which experts a token goes through
        **{k: vocab[k] for k in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")}
    )).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(source / name, directory / name)
    return str(directory)


def _two_rank(rank: int, world_size: int, port: int, layout: str, model: str = "") -> None:

    import torch.distributed as dist
    from megatron.core import parallel_state

    start_gloo_rank(rank, world_size, port)
    path = [f"actor_rollout_ref.model.path={model}"] if model else []
    actor = _actor(*{**LAYOUTS, **VIRTUAL}[layout], *path)
    routed = actor.compute_log_prob(_batch()).batch[ROUTED_EXPERTS]
    layers = 4 if model else 3
    # each rank's routers saw half of every sequence (TP) or of the layers (PP); both keep
    # the whole routing
    assert routed.shape == (4, 12, layers, 2)
    both = [torch.empty_like(routed) for _ in range(world_size)]
    dist.all_gather(both, routed)
    assert torch.equal(both[0], both[1])
    _update_follows_the_batchs_experts(actor)  # each rank replays its half
    dist.barrier()
    parallel_state.destroy_model_parallel()
    finish_rank()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_r2_on_two_gloo_ranks(layout):
    """TP 2 + SP: each rank's routers see half of every sequence (packed: half of the packed
    row, filled to a multiple of 2); PP 2: each stage records and replays its own layers."""
    context = mp.start_processes(_two_rank, args=(2, free_port(), layout), nprocs=2,
                                 join=False, start_method="spawn")
    join_spawned(context, f"the 2-rank router replay run ({layout})")


def test_r2_with_virtual_pipeline_stages_over_gloo(tmp_path):
    """PP 2 x 2 virtual chunks: each chunk records and replays its own MoE layer."""
    model = four_layer_moe(tmp_path / "moe")
    context = mp.start_processes(_two_rank, args=(2, free_port(), "pp2-vpp2", model),
                                 nprocs=2, join=False, start_method="spawn")
    join_spawned(context, "the 2-rank router replay run (pp2-vpp2)")


def test_r2_trains_grpo_on_the_megatron_actor(tmp_path):
    """Two epochs per step keep the old-log-prob pass (the planner cannot take it from the
    update), so the routing travels in the batch from that node to the update's; rows run
    packed."""
    proc = subprocess.run(
        [sys.executable, "-m", "siirl.main_dag", f"trainer.default_local_dir={tmp_path}",
         f"{ACTOR}.strategy=megatron", "actor_rollout_ref.model.path=builtin:tiny-moe",
         f"{ACTOR}.router_replay.mode=R2", f"{ACTOR}.ppo_epochs=2", PACKING,
         "data.train_batch_size=8", "actor_rollout_ref.rollout.n=2",
         f"{ACTOR}.ppo_mini_batch_size=8", "trainer.total_training_steps=2",
         "trainer.logger=[]", "trainer.val_before_train=false", "trainer.test_freq=-1"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
             if "actor/pg_loss" in line]
    assert len(steps) == 2 and all(abs(s["actor/pg_loss"]) < 10 for s in steps)
    assert any(key.startswith("timing_s/") and "old_log_prob" in key for key in steps[0]), steps[0]


def test_r2_is_refused_where_it_cannot_replay():
    from siirl.errors import ConfigError
    from siirl.params.parser import parse_config

    for extra, reason in (([], "strategy=megatron"),
                          ([f"{ACTOR}.strategy=megatron", f"{ACTOR}.router_replay.mode=R3"],
                           "rollout that reports")):
        overrides = [f"{ACTOR}.router_replay.mode=R2", *extra]
        with pytest.raises(ConfigError, match=reason):
            parse_config(overrides, validate=True)
