"""The bridge for Qwen3 (QK-norm) and the MoE models Qwen3-MoE and Mixtral, on CPU.

Tiny randomly initialised models (no downloads): HF -> megatron -> HF round trips are
bit-exact for every TP/PP layout, expert shards follow megatron's SequentialMLP layout, and
once the bridge has loaded HF's weights megatron's model (local spec: QK-norm, router and
SequentialMLP experts behind the alltoall token dispatcher) gives HF's log-probs and
gradients within float32 rounding at TP=1 here, at TP=2 and PP=2 over two gloo ranks in
:func:`test_tp2_and_pp2_over_gloo_match_hf`. The top-k choice must be HF's for the log-probs
to match at all: a wrongly routed token would be off by far more than rounding.
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
    gloo_world_of_one,  # noqa: F401 (fixture)
    init_megatron,
    left_padded_batch,
    token_loss,
)

from siirl.engine.megatron.bridge import (  # noqa: E402
    hf_to_megatron,
    iter_hf_weights,
    load_hf_weights,
    megatron_to_hf,
)

# qwen3_moe: full-softmax top-k weights (norm_topk_prob=False, megatron's pre-softmax);
# qwen3_moe_norm and mixtral: renormalised top-k (softmax over the chosen logits)
# qwen2_moe: Qwen3-MoE's routing plus a gated shared expert and biased q/k/v;
# qwen2_moe_mixed: dense layers mixed in (decoder_sparse_step=2: layers 1, 3, ... have
# experts; mlp_only_layers=[3] makes layer 3 dense too)
FAMILIES = ("qwen3", "qwen3_moe", "qwen3_moe_norm", "mixtral", "qwen2_moe", "qwen2_moe_mixed")
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning:megatron"),
    pytest.mark.filterwarnings("ignore:Apex is not installed:UserWarning"),
]
BOUND = 20_000  # bytes per bucket; the embedding and head (~26 kB) get buckets of their own


def tiny_model(family: str, num_layers: int = 2, seed: int = 0):
    """Qwen3: tied embeddings, head_dim 16 (its own key). MoE: 4 experts, top-2, untied.
    Norms (QK-norms too) are moved off 1 so that they count; initializer_range 0.1 makes
    attention and routing far from uniform."""
    from transformers import (
        MixtralConfig,
        MixtralForCausalLM,
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    common = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=num_layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  initializer_range=0.1, rms_norm_eps=1e-6, vocab_size=101)
    torch.manual_seed(seed)
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, tie_word_embeddings=True,
                                             rope_theta=1e6, **common))
    elif family.startswith("qwen3_moe"):
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
            moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
            norm_topk_prob=family.endswith("norm"), **common))
    elif family.startswith("qwen2_moe"):
        mixed = dict(decoder_sparse_step=2, mlp_only_layers=[3]) if family.endswith("mixed") \
            else {}
        model = Qwen2MoeForCausalLM(Qwen2MoeConfig(
            moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4,
            num_experts_per_tok=2, **mixed, **common))
    else:
        model = MixtralForCausalLM(MixtralConfig(num_local_experts=4, num_experts_per_tok=2,
                                                 **common))
    model.eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
    return model


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tp,pp,layers", [(1, 1, 2), (2, 1, 2), (1, 2, 2), (2, 2, 4),
                                           (1, 2, 3)])
def test_round_trip_is_bit_exact(family, tp, pp, layers):
    model = tiny_model(family, num_layers=layers)
    config, state = model.config, model.state_dict()
    back = {}
    for pp_rank in range(pp):
        shards = [hf_to_megatron(state, config, tp_rank, tp, pp_rank, pp) for tp_rank in range(tp)]
        stage = megatron_to_hf(shards, config, pp_rank, pp)
        assert not set(stage) & set(back), "PP stages must hold disjoint HF tensors"
        back.update(stage)
    want = expected_hf(model)
    assert sorted(back) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(back[name], tensor), name


def test_expert_and_qk_norm_layouts():
    """Expert e of HF's fused tensors is local expert e, split over TP like a dense MLP:
    rank r holds [gate_r; up_r] of gate_up_proj[e] and columns r of down_proj[e]; the
    router and the QK-norms are replicated."""
    model = tiny_model("qwen3_moe")
    config, state = model.config, model.state_dict()
    rank1 = hf_to_megatron(state, config, tp_rank=1, tp_size=2)
    layer, hf = "decoder.layers.1.", "model.layers.1."
    gate_up, down = state[hf + "mlp.experts.gate_up_proj"], state[hf + "mlp.experts.down_proj"]
    gate, up = gate_up[2].chunk(2)  # expert 2, moe_intermediate_size 32: 16 rows per rank
    assert torch.equal(rank1[layer + "mlp.experts.local_experts.2.linear_fc1.weight"],
                       torch.cat([gate[16:], up[16:]]))
    assert torch.equal(rank1[layer + "mlp.experts.local_experts.2.linear_fc2.weight"],
                       down[2][:, 16:])
    assert torch.equal(rank1[layer + "mlp.router.weight"], state[hf + "mlp.gate.weight"])
    for n in "qk":
        assert torch.equal(rank1[f"{layer}self_attention.{n}_layernorm.weight"],
                           state[f"{hf}self_attn.{n}_norm.weight"])


@pytest.mark.parametrize("family", ("qwen3_moe", "qwen2_moe_mixed"))
@pytest.mark.parametrize("tp,expert_tp,ep", [(2, 1, 2), (2, 1, 1), (1, 2, 1), (2, 2, 1)])
def test_round_trip_with_expert_tp_other_than_tp_is_bit_exact(family, tp, expert_tp, ep):
    """Rank ``r`` of ``tp x ep`` ranks (siiRL's order: TP fastest) holds dense TP shard
    ``r % tp`` and the experts of EP rank ``r // expert_tp % ep`` split over expert TP
    (shard ``r % expert_tp``; megatron's expert layout: expert TP fastest, then EP)."""
    model = tiny_model(family)
    config, state = model.config, model.state_dict()
    world = max(tp, expert_tp * ep)
    shards = [hf_to_megatron(state, config, r % tp, tp, ep_rank=r // expert_tp % ep,
                             ep_size=ep, expert_tp_rank=r % expert_tp,
                             expert_tp_size=expert_tp) for r in range(world)]
    expert = "decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.weight"
    assert shards[0][expert].shape[1] == config.moe_intermediate_size // expert_tp
    back = megatron_to_hf(shards, config, ep_size=ep, tp_size=tp, expert_tp_size=expert_tp)
    want = expected_hf(model)
    assert sorted(back) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(back[name], tensor), name


def test_expert_layers_follow_hf():
    from siirl.engine.megatron.model import transformer_config_from_hf
    from siirl.engine.megatron.moe import expert_layers

    config = tiny_model("qwen2_moe_mixed", num_layers=4).config
    assert expert_layers(config) == [False, True, False, False]
    assert transformer_config_from_hf(config).moe_layer_freq == [0, 1, 0, 0]
    assert transformer_config_from_hf(tiny_model("mixtral").config).moe_layer_freq == 1


def test_unsupported_moe_variants_are_refused():
    from siirl.engine.megatron.model import transformer_config_from_hf

    config = tiny_model("qwen3_moe").config
    config.mlp_only_layers = [0, 1]  # no expert layer left: the dense architecture's
    with pytest.raises(NotImplementedError, match="without one expert layer"):
        transformer_config_from_hf(config)
    config = tiny_model("mixtral").config
    config.router_jitter_noise = 0.1
    with pytest.raises(NotImplementedError, match="router_jitter_noise"):
        transformer_config_from_hf(config)
    with pytest.raises(ValueError, match="needs sequence_parallel=true"):
        transformer_config_from_hf(tiny_model("mixtral").config, tp=2)


def _check_logprobs_and_grads(family: str, megatron, hf, gather_grads) -> float:
    """HF's log-probs and token-loss gradients from ``megatron`` (already loaded); returns
    the largest log-prob difference. ``gather_grads`` maps this rank's gradients to the TP
    ranks' state dicts."""
    from siirl.engine.megatron.model import forward_logits

    input_ids, attention_mask, position_ids = left_padded_batch(hf.config.vocab_size)
    logits = forward_logits(megatron, input_ids, position_ids, attention_mask)
    ref = hf(input_ids=input_ids, attention_mask=attention_mask,
             position_ids=position_ids).logits
    assert_logprobs_close(logits, ref, attention_mask, hf.config, family)
    valid = attention_mask.bool()
    worst = float((logits.detach().log_softmax(-1)[valid]
                   - ref.detach().log_softmax(-1)[valid]).abs().max())
    token_loss(logits, input_ids, attention_mask).backward()
    token_loss(ref, input_ids, attention_mask).backward()
    grads = megatron_to_hf(gather_grads({n: p.grad for n, p in megatron.named_parameters()}),
                           hf.config)
    params = dict(hf.named_parameters())
    assert sorted(grads) == sorted(expected_hf(hf)), family
    for name, grad in grads.items():
        assert_grads_close(grad, params[name].grad, attention_mask, hf.config,
                           f"{family} {name}")
    return worst


@pytest.mark.parametrize("family", FAMILIES)
def test_logprobs_and_grads_match_hf_at_tp1(family, gloo_world_of_one):  # noqa: F811
    from siirl.engine.megatron.model import build_gpt_model

    hf = tiny_model(family)
    megatron = build_gpt_model(hf.config)
    load_hf_weights(megatron, hf.state_dict(), hf.config)  # strict: same keys and shapes
    worst = _check_logprobs_and_grads(family, megatron, hf, lambda grads: [grads])
    assert worst < 1e-5, worst
    with torch.no_grad():
        check_buckets(iter_hf_weights(megatron, hf.config, bucket_bytes=BOUND),
                      expected_hf(hf), BOUND)


def _tp2_checks(family: str) -> None:
    import torch.distributed as dist

    from siirl.engine.megatron.model import build_gpt_model
    from siirl.engine.megatron.sequence_parallel import sum_sequence_parallel_grads

    hf = tiny_model(family)
    # TP=2, expert TP 2; megatron's MoE layer trains under TP with sequence parallelism only
    megatron = build_gpt_model(hf.config, sequence_parallel=family != "qwen3")
    load_hf_weights(megatron, hf.state_dict(), hf.config)

    def gather(local):
        # QK-norm (and sequence-parallel norm) gradients are partial per rank: summed first
        sum_sequence_parallel_grads(megatron, dist.group.WORLD)
        shards = [{} for _ in range(dist.get_world_size())]
        for name, param in megatron.named_parameters():
            gathered = [torch.empty_like(param.grad) for _ in shards]
            dist.all_gather(gathered, param.grad.contiguous())
            for shard, tensor in zip(shards, gathered, strict=True):
                shard[name] = tensor
        return shards

    worst = _check_logprobs_and_grads(f"TP=2 {family}", megatron, hf, gather)
    assert worst < 1e-5, (family, worst)
    with torch.no_grad():
        check_buckets(iter_hf_weights(megatron, hf.config, bucket_bytes=BOUND),
                      expected_hf(hf), BOUND)


def _pp2_checks(family: str, rank: int) -> None:
    import torch.distributed as dist

    from siirl.engine.megatron.model import (
        build_gpt_model,
        forward_logits,
        megatron_attention_mask,
    )

    hf = tiny_model(family, num_layers=4)
    stage = build_gpt_model(hf.config, pre_process=rank == 0, post_process=rank == 1)
    load_hf_weights(stage, hf.state_dict(), hf.config)
    stage.eval()
    input_ids, attention_mask, position_ids = left_padded_batch(hf.config.vocab_size)
    with torch.no_grad():
        if rank == 0:
            hidden = stage(input_ids, position_ids, megatron_attention_mask(attention_mask))
            dist.send(hidden.contiguous(), dst=1)  # [S, B, H]
        else:
            hidden = torch.empty(input_ids.shape[1], input_ids.shape[0], hf.config.hidden_size)
            dist.recv(hidden, src=0)
            stage.set_input_tensor(hidden)
            logits = forward_logits(stage, input_ids, position_ids, attention_mask)
            ref = hf(input_ids=input_ids, attention_mask=attention_mask,
                     position_ids=position_ids).logits
            assert_logprobs_close(logits, ref, attention_mask, hf.config, f"PP=2 {family}")
            valid = attention_mask.bool()
            worst = (logits.log_softmax(-1)[valid] - ref.log_softmax(-1)[valid]).abs().max()
            assert worst < 1e-5, (family, float(worst))
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
    for family in FAMILIES:
        _tp2_checks(family)
    parallel_state.destroy_model_parallel()
    init_megatron(tp=1, pp=2)
    for family in FAMILIES:
        _pp2_checks(family, rank)
    parallel_state.destroy_model_parallel()
    finish_rank()  # a failing rank raises instead


def test_tp2_and_pp2_over_gloo_match_hf():
    context = mp.start_processes(rank_main, args=(2, free_port()), nprocs=2, join=False,
                                 start_method="spawn")
    join_spawned(context, "the 2-rank megatron Qwen3 / MoE run")


def _ep2_checks(family: str, rank: int) -> float:
    """EP=2 (megatron's alltoall dispatcher over gloo): each rank holds 2 of the 4 experts.
    Rank r scores its own rows (the other rank's tokens reach its experts through the
    all-to-all) and both ranks then score the whole batch: log-probs equal HF's. With the
    whole batch on both ranks an expert's gradient sums both ranks' tokens: twice HF's,
    while every other gradient is this rank's own (megatron's DDP averages those over data
    parallelism). The HF export gathers the experts over EP."""
    import torch.distributed as dist

    from siirl.engine.megatron.model import build_gpt_model, forward_logits

    hf = tiny_model(family)
    megatron = build_gpt_model(hf.config)
    load_hf_weights(megatron, hf.state_dict(), hf.config)
    input_ids, attention_mask, position_ids = left_padded_batch(hf.config.vocab_size)
    rows = slice(rank, rank + 2)  # uneven: rank 0 rows 0-1, rank 1 rows 1-2
    with torch.no_grad():
        own = forward_logits(megatron, input_ids[rows], position_ids[rows], attention_mask[rows])
    ref = hf(input_ids=input_ids, attention_mask=attention_mask,
             position_ids=position_ids).logits
    assert_logprobs_close(own, ref[rows], attention_mask[rows], hf.config, f"EP=2 {family}")
    logits = forward_logits(megatron, input_ids, position_ids, attention_mask)
    assert_logprobs_close(logits, ref, attention_mask, hf.config, f"EP=2 {family}")
    valid = attention_mask.bool()
    worst = float((logits.detach().log_softmax(-1)[valid]
                   - ref.detach().log_softmax(-1)[valid]).abs().max())
    assert worst < 1e-5, (family, worst)

    token_loss(logits, input_ids, attention_mask).backward()
    token_loss(ref, input_ids, attention_mask).backward()
    grads = {n: p.grad for n, p in megatron.named_parameters()}
    shards = [{}, {}]
    for name, grad in grads.items():  # only the experts differ between the EP ranks
        gathered = [torch.empty_like(grad) for _ in shards]
        dist.all_gather(gathered, grad.contiguous())
        for shard, tensor in zip(shards, gathered, strict=True):
            shard[name] = tensor
    params = dict(hf.named_parameters())
    for name, grad in megatron_to_hf(shards, hf.config, ep_size=2).items():
        want = params[name].grad * (2 if ".experts." in name else 1)
        assert_grads_close(grad, want, attention_mask, hf.config, f"EP=2 {family} {name}")
    with torch.no_grad():
        check_buckets(iter_hf_weights(megatron, hf.config, bucket_bytes=BOUND),
                      expected_hf(hf), BOUND)
    return worst


def _whole_experts_checks(family: str) -> None:
    """TP 2 (sequence parallel) x expert TP 1 x EP 2: the dense layers split over both
    ranks, each rank 2 whole experts. Log-probs equal HF's; the HF export (dense tensors
    gathered over TP, experts over EP only) is bit-exact."""
    from siirl.engine.megatron.model import build_gpt_model, forward_logits

    hf = tiny_model(family)
    megatron = build_gpt_model(hf.config, sequence_parallel=True)
    load_hf_weights(megatron, hf.state_dict(), hf.config)
    expert = dict(megatron.named_parameters())[
        "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight"]
    assert expert.shape[0] == 2 * _expert_ffn(hf.config), "expert TP 1: whole experts"
    input_ids, attention_mask, position_ids = left_padded_batch(hf.config.vocab_size)
    with torch.no_grad():
        logits = forward_logits(megatron, input_ids, position_ids, attention_mask)
        ref = hf(input_ids=input_ids, attention_mask=attention_mask,
                 position_ids=position_ids).logits
        assert_logprobs_close(logits, ref, attention_mask, hf.config, f"ETP=1 {family}")
        check_buckets(iter_hf_weights(megatron, hf.config, bucket_bytes=BOUND),
                      expected_hf(hf), BOUND)


def _expert_ffn(hf_config) -> int:
    return int(getattr(hf_config, "moe_intermediate_size", 0) or hf_config.intermediate_size)


def ep_rank_main(rank: int, world_size: int, port: int) -> None:

    from megatron.core import parallel_state, tensor_parallel

    from siirl.engine.megatron.cpu_compat import enable_cpu_mode

    start_gloo_rank(rank, world_size, port)
    enable_cpu_mode()
    parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=2)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    for family in FAMILIES[1:]:
        _ep2_checks(family, rank)
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(2, 1, expert_model_parallel_size=2,
                                             expert_tensor_parallel_size=1,
                                             order="tp-cp-ep-pp-dp")
    for family in ("qwen3_moe", "mixtral", "qwen2_moe"):
        _whole_experts_checks(family)
    parallel_state.destroy_model_parallel()
    finish_rank()  # a failing rank raises instead


def test_expert_parallel_ep2_over_gloo_matches_hf():
    """EP 2 (expert TP = TP = 1), then TP 2 x expert TP 1 x EP 2."""
    context = mp.start_processes(ep_rank_main, args=(2, free_port()), nprocs=2, join=False,
                                 start_method="spawn")
    join_spawned(context, "the 2-rank megatron expert-parallel run")
