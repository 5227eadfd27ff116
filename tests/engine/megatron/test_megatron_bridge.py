"""HF <-> megatron-core weight bridge and HF-equivalence of the megatron GPT model, on CPU.

Tiny Llama / Qwen2 models are built from configs (no downloads). The conversions are pure
slicing, so round trips must be bit-exact for every TP/PP layout; the megatron model must
give HF's log-probs (float32, left-padded batch) once the bridge has loaded HF's weights,
which also proves the fused QKV / SwiGLU layouts match megatron's. TP=2 over real gloo
ranks is in test_megatron_tp_gloo.py; the helpers here are shared with it.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

import torch.distributed as dist  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from siirl.engine.megatron.bridge import (  # noqa: E402
    hf_to_megatron,
    iter_hf_weights,
    load_hf_weights,
    megatron_to_hf,
)
from siirl.execution.scheduler.process_group_manager import free_port  # noqa: E402
from siirl_numerics import (  # noqa: E402
    assert_close,
    rounding,
    scale_of,
    transformer_terms,
)

FAMILIES = ("llama", "qwen2")
pytestmark = [  # megatron-core's own notices about missing apex / upcoming API changes
    pytest.mark.filterwarnings("ignore::DeprecationWarning:megatron"),
    pytest.mark.filterwarnings("ignore:Apex is not installed:UserWarning"),
]


def tiny_config(family: str, num_layers: int = 2):
    """Llama: untied head, vocab 101 (padded under TP 2). Qwen2: tied, qkv bias, vocab 99.
    initializer_range 0.1 makes attention far from uniform, so RoPE/masking errors show."""
    common = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=num_layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  initializer_range=0.1, rms_norm_eps=1e-6)
    if family == "llama":
        return LlamaConfig(vocab_size=101, tie_word_embeddings=False, **common)
    return Qwen2Config(vocab_size=99, tie_word_embeddings=True, rope_theta=1e6, **common)


def tiny_hf_model(family: str, num_layers: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    config = tiny_config(family, num_layers)
    model_cls = LlamaForCausalLM if family == "llama" else Qwen2ForCausalLM
    model = model_cls(config).eval()
    with torch.no_grad():  # HF initialises norms to 1 and biases to 0: make them count
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                param.add_(0.1 * torch.randn_like(param))
    return model


def expected_hf(model) -> dict[str, torch.Tensor]:
    """HF tensors the bridge reproduces: all but a tied ``lm_head.weight``."""
    tied = model.config.tie_word_embeddings
    return {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}


def left_padded_batch(vocab_size: int, seed: int = 1):
    """Three rows, left-padded as the rollout produces them; positions = cumsum(mask)-1."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (3, 10), generator=gen)
    attention_mask = torch.ones(3, 10, dtype=torch.long)
    attention_mask[0, :4] = 0
    attention_mask[2, :1] = 0
    input_ids[attention_mask == 0] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def assert_logprobs_close(logits: torch.Tensor, ref: torch.Tensor, attention_mask,
                          config, what: str = "") -> None:
    """Megatron's and HF's forwards sum the same terms in another order (fused kernels,
    split heads): log-probs of the real positions within float32 rounding of the model's
    reductions."""
    valid = attention_mask.bool()
    got = logits.detach().float().log_softmax(-1)[valid]
    want = ref.detach().float().log_softmax(-1)[valid]
    tol = rounding(torch.float32, transformer_terms(config, attention_mask.shape[1]),
                   scale_of(want), want.numel())
    assert_close(got, want, tol, f"{what} log-probs".strip())


def assert_grads_close(got, want, attention_mask, config, what: str = "") -> None:
    """Gradients of the token loss: float32 rounding of the reductions forward and back,
    summed over the batch's tokens."""
    terms = transformer_terms(config, attention_mask.shape[1], backward=True,
                              tokens=int(attention_mask.numel()))
    assert_close(got, want, rounding(torch.float32, terms, scale_of(want), want.numel()),
                 f"{what} gradient".strip())


def token_loss(logits: torch.Tensor, input_ids, attention_mask) -> torch.Tensor:
    """-mean log-prob of each real token given a real predecessor (the actor's loss shape)."""
    logp = logits.float().log_softmax(-1)[:, :-1].gather(-1, input_ids[:, 1:, None])
    mask = (attention_mask[:, 1:] * attention_mask[:, :-1]).float()
    return -(logp.squeeze(-1) * mask).sum() / mask.sum()


def init_megatron(tp: int, pp: int, seed: int = 1, vpp: int = 1) -> None:
    from megatron.core import parallel_state, tensor_parallel

    from siirl.engine.megatron.cpu_compat import enable_cpu_mode

    enable_cpu_mode()
    parallel_state.initialize_model_parallel(
        tp, pp, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def check_buckets(buckets, expected: dict[str, torch.Tensor], bound: int) -> None:
    """Every expected tensor exactly once and bit-equal; buckets within ``bound`` bytes
    unless a single tensor alone exceeds it."""
    seen = []
    for bucket in buckets:
        sizes = [t.numel() * t.element_size() for _, t in bucket]
        assert sum(sizes) <= bound or len(bucket) == 1, [n for n, _ in bucket]
        for name, tensor in bucket:
            assert torch.equal(tensor, expected[name]), name
            seen.append(name)
    assert sorted(seen) == sorted(expected)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gloo_world_of_one():
    """Megatron's model-parallel state (TP=PP=1) on a one-rank gloo group; torn down after."""
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    from megatron.core import parallel_state

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    init_megatron(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tp,pp,layers", [(1, 1, 4), (2, 1, 4), (1, 2, 4), (2, 2, 4),
                                           (1, 2, 3), (2, 3, 7)])
def test_round_trip_is_bit_exact(family, tp, pp, layers):
    """Uneven splits (3 layers on 2 stages, 7 on 3) put the remainder on the first and last
    stage, as megatron's num_layers_in_first/last_pipeline_stage do."""
    model = tiny_hf_model(family, num_layers=layers)
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


def test_stage_layer_counts_follow_megatron_offsets():
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from siirl.engine.megatron.bridge import layer_range
    from siirl.engine.megatron.model import transformer_config_from_hf

    for layers, pp in ((3, 2), (7, 3), (10, 4), (8, 4)):
        config = transformer_config_from_hf(tiny_config("llama", layers), pp=pp)
        for rank in range(pp):
            assert layer_range(layers, rank, pp).start == get_transformer_layer_offset(
                config, pp_rank=rank), (layers, pp, rank)


def test_shard_layouts():
    """Megatron's layouts, spelled out: per-group [q; k; v] rows split by groups, [gate; up]
    per rank, row-parallel split on dim 1, zero-padded vocab split on dim 0."""
    model = tiny_hf_model("llama")
    config, state = model.config, model.state_dict()
    rank1 = hf_to_megatron(state, config, tp_rank=1, tp_size=2)
    layer, hf_layer = "decoder.layers.0.", "model.layers.0."
    q, k, v = (state[f"{hf_layer}self_attn.{n}_proj.weight"] for n in "qkv")
    # 4 heads, 2 groups, head_dim 16: rank 1 holds group 1 = q heads 2,3 then k_1, v_1
    assert torch.equal(rank1[layer + "self_attention.linear_qkv.weight"],
                       torch.cat([q[32:64], k[16:32], v[16:32]]))
    gate, up = state[hf_layer + "mlp.gate_proj.weight"], state[hf_layer + "mlp.up_proj.weight"]
    assert torch.equal(rank1[layer + "mlp.linear_fc1.weight"], torch.cat([gate[48:], up[48:]]))
    assert torch.equal(rank1[layer + "mlp.linear_fc2.weight"],
                       state[hf_layer + "mlp.down_proj.weight"][:, 48:])
    embedding = rank1["embedding.word_embeddings.weight"]  # vocab 101 -> 102, rows 51..101
    assert embedding.shape == (51, 64)
    assert torch.equal(embedding[:50], state["model.embed_tokens.weight"][51:])
    assert not embedding[50].any()
    stage1 = hf_to_megatron(state, config, pp_rank=1, pp_size=2)
    assert "decoder.layers.0.input_layernorm.weight" in stage1
    assert torch.equal(stage1["decoder.layers.0.input_layernorm.weight"],
                       state["model.layers.1.input_layernorm.weight"])


@pytest.mark.parametrize("family", FAMILIES)
def test_logprobs_match_hf_at_tp1(family, gloo_world_of_one):
    from siirl.engine.megatron.model import build_gpt_model, forward_logits

    hf = tiny_hf_model(family)
    megatron = build_gpt_model(hf.config)
    load_hf_weights(megatron, hf.state_dict(), hf.config)  # strict: same keys and shapes
    megatron.eval()
    input_ids, attention_mask, position_ids = left_padded_batch(hf.config.vocab_size)
    with torch.no_grad():
        logits = forward_logits(megatron, input_ids, position_ids, attention_mask)
        ref = hf(input_ids=input_ids, attention_mask=attention_mask,
                 position_ids=position_ids).logits
    assert logits.shape == ref.shape
    assert_logprobs_close(logits, ref, attention_mask, hf.config, family)
    # and the weights read back out of the live model are HF's, bucket by bucket
    want = expected_hf(hf)
    bound = 20_000  # the 101x64 (25.9 kB) embedding and head exceed it: buckets of their own
    check_buckets(iter_hf_weights(megatron, hf.config, bucket_bytes=bound), want, bound)
    back = megatron_to_hf([megatron.state_dict()], hf.config)
    assert all(torch.equal(back[name], tensor) for name, tensor in want.items())


def test_backward_matches_hf_at_tp1(gloo_world_of_one):
    """Training on CPU works through the adapters: the gradients of -mean log-prob match."""
    from siirl.engine.megatron.model import build_gpt_model, forward_logits

    hf = tiny_hf_model("qwen2")
    megatron = build_gpt_model(hf.config)
    load_hf_weights(megatron, hf.state_dict(), hf.config)
    input_ids, attention_mask, position_ids = left_padded_batch(hf.config.vocab_size)
    loss = token_loss(forward_logits(megatron, input_ids, position_ids, attention_mask),
                      input_ids, attention_mask)
    loss.backward()
    ref = token_loss(hf(input_ids=input_ids, attention_mask=attention_mask,
                        position_ids=position_ids).logits, input_ids, attention_mask)
    ref.backward()
    # the loss: a mean of log-probs, within their rounding
    assert_close(loss.item(), ref.item(), rounding(
        torch.float32, transformer_terms(hf.config, 10) + int(attention_mask.sum()),
        max(abs(ref.item()), 1.0)), "loss")
    grads = megatron_to_hf([{n: p.grad for n, p in megatron.named_parameters()}], hf.config)
    for name, param in hf.named_parameters():
        if name in grads:
            assert_grads_close(grads[name], param.grad, attention_mask, hf.config, name)
