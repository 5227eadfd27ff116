"""Shared pieces of the actor-engine tests: a tiny Llama, a tinier pure-torch causal LM, a
rollout-shaped batch, configs, and a private reference implementation of the response
log-prob math (the tests inject it, so they do not depend on siirl.engine.models).

transformers is imported only inside the functions that need it: the 2-rank test's
spawned processes import this module, and a transformers import costs them seconds.
"""

from collections import namedtuple
from types import SimpleNamespace

import pytest
import torch

from siirl.data_coordinator.protocol import make_batch
from siirl.engine.actor.engine import ActorEngine
from siirl.engine.fsdp.engines import fsdp_actor, fsdp_reference
from siirl.execution.scheduler.process_group_manager import free_port  # noqa: F401 (shared by the tests)
from siirl.params.parser import parse_config
from siirl_spawn import finish_rank

VOCAB, PROMPT, RESPONSE = 32, 4, 5


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny tensors gain nothing from threads, and OpenMP workers spin-waiting against
    other processes on a small machine slow these tests several-fold (autouse in each test
    module that imports it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                       eos_token_id=2)


def tiny_model(seed: int = 0):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config()).float()


# A pytree node, like HF's ModelOutput (a dict): FSDP2 hooks backward through the tensors
# it finds in the root module's output, and finds none inside an opaque object.
CausalLMOutput = namedtuple("CausalLMOutput", ["logits"])


def tiny_tokenizer():
    """A word-level fast tokenizer over tokens t0..t31 (t0 doubles as pad and unk)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")), pad_token="t0")


class TinyBlock(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(2 * dim, dim))

    def forward(self, hidden):
        return hidden + self.mlp(self.norm(hidden))


class TinyCausalLM(torch.nn.Module):
    """HF-shaped call and output (``.logits``); context enters through a causal running
    mean of the (masked) token embeddings. Names its block in ``_no_split_modules`` like
    HF models, which is how the engine finds the layers to shard."""

    _no_split_modules = ["TinyBlock"]

    def __init__(self, vocab: int = VOCAB, dim: int = 32, layers: int = 2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(64, dim)
        self.layers = torch.nn.ModuleList(TinyBlock(dim) for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        mask = attention_mask.unsqueeze(-1).float()
        tokens = self.embed(input_ids) * mask
        context = tokens.cumsum(1) / mask.cumsum(1).clamp_min(1)
        hidden = tokens + context + self.pos(position_ids)
        for layer in self.layers:
            hidden = layer(hidden)
        return CausalLMOutput(logits=self.head(hidden))


def tiny_model_terms(rows: int, key: str = "") -> int:
    """Roundings behind a value of ``tiny_model`` (the HF Llama) on ``rows`` rows, as
    tiny_torch_terms counts them (siirl_numerics.transformer_terms per path)."""
    from siirl_numerics import transformer_terms

    config, positions = tiny_llama_config(), PROMPT + RESPONSE
    if key == "grads":
        return 2 * transformer_terms(config, positions) + rows * positions
    if key.endswith("grad_norm"):
        return tiny_model_terms(rows, "grads") + sum(p.numel()
                                                     for p in tiny_model().parameters())
    return transformer_terms(config, positions) + rows * positions


def tiny_torch_terms(rows: int, key: str = "") -> int:
    """Roundings behind a value of TinyCausalLM on ``rows`` rows (siirl_numerics.rounding):
    the context's running sum (the row's positions), per block the LayerNorm (dim) and the
    MLP (dim, 2 dim), the head (dim) and the log-softmax (vocab); a gradient comes back the
    same way and sums over every token; the gradient norm sums over every parameter."""
    dim, layers, positions = 32, 2, PROMPT + RESPONSE
    forward = positions + layers * (dim + dim + 2 * dim) + dim + VOCAB
    backward = 2 * forward + rows * positions
    if key == "grads":
        return backward
    if key.endswith("grad_norm"):
        return backward + sum(p.numel() for p in TinyCausalLM().parameters())
    return forward + rows * positions  # log-probs, and means over the tokens


def tiny_torch_model(seed: int = 0) -> TinyCausalLM:
    torch.manual_seed(seed)
    return TinyCausalLM()


def ref_logprobs(model, input_ids, attention_mask, position_ids, response_length,
                 temperature=1.0, calculate_entropy=False):
    """log p(response token | prefix) / entropy at each response position, in fp32."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids, use_cache=False).logits
    logits = logits[:, -response_length - 1:-1].float() / temperature
    log_softmax = torch.log_softmax(logits, dim=-1)
    targets = input_ids[:, -response_length:]
    log_probs = log_softmax.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if calculate_entropy:
        entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_probs, entropy


def rollout_batch(rows: int = 4, seed: int = 0, lengths=None):
    """Left-padded prompts + right-padded responses, as the rollout node leaves them."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = [PROMPT - (i % 2) for i in range(rows)]
    lengths = lengths or [RESPONSE - (i % RESPONSE) for i in range(rows)]  # 5, 4, 3, ...
    prompts = torch.randint(3, VOCAB, (rows, PROMPT), generator=g)
    responses = torch.randint(3, VOCAB, (rows, RESPONSE), generator=g)
    prompt_mask = torch.zeros(rows, PROMPT, dtype=torch.long)
    response_mask = torch.zeros(rows, RESPONSE)
    for i in range(rows):
        prompts[i, :PROMPT - prompt_lens[i]] = 0
        prompt_mask[i, PROMPT - prompt_lens[i]:] = 1
        responses[i, lengths[i]:] = 0
        response_mask[i, :lengths[i]] = 1
    attention_mask = torch.cat([prompt_mask, response_mask.long()], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    return make_batch({
        "prompts": prompts, "responses": responses, "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask, "position_ids": position_ids,
    })


def actor_config(*overrides):
    base = ["actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.optim.lr=0.01",
            "actor_rollout_ref.actor.optim.weight_decay=0.0",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.n=1"]
    return parse_config(base + list(overrides))


def actor_engine(config, module=None, worker=None) -> ActorEngine:
    return fsdp_actor(config, worker, module=module if module is not None else tiny_model(),
                      logprob_fn=ref_logprobs)


def with_advantages(engine, batch, advantage: float = 1.0):
    """old_log_probs from the engine, a constant advantage on every response token."""
    batch = engine.compute_log_prob(batch).batch
    batch.set("advantages", batch["response_mask"] * advantage)
    return batch


def params(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def max_param_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def dp_rank_main(rank: int, world_size: int, port: int, workdir: str) -> None:
    """One rank of the 2-process gloo test: FSDP2-shard (or, with ``fsdp_size=1`` among the
    overrides, replicate) the actor, update on this rank's half of the batch, write metrics,
    full gradients and full weights to ``workdir``, and round-trip a checkpoint (to
    ``workdir/ckpt``)."""
    import json
    import os

    import torch.distributed as dist

    from siirl.engine.common import checkpoint

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # two ranks share the test machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    inputs = torch.load(os.path.join(workdir, "inputs.pt"), weights_only=True)
    model = TinyCausalLM()
    model.load_state_dict(inputs["weights"])
    config = actor_config(*inputs["overrides"])
    replicated = config.actor_rollout_ref.actor.fsdp_config.fsdp_size == 1
    if replicated and rank == 1:  # replicas start from rank 0's weights, whatever given
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
    worker = SimpleNamespace(rank=rank, world_size=world_size, engines={})
    engine = actor_engine(config, module=model, worker=worker)
    sharded = engine.sharded
    assert sharded == (not replicated)
    assert (engine.initial_module is not None) == sharded
    ref = fsdp_reference(config, worker, actor=engine, logprob_fn=ref_logprobs)  # the copy
    assert engine.initial_module is None
    rows = inputs["batch"]["input_ids"].shape[0] // world_size
    local = make_batch({k: v[rank * rows:(rank + 1) * rows]
                        for k, v in inputs["batch"].items()})
    local = ref.compute_ref_log_prob(local).batch
    from siirl_numerics import assert_close, rounding, scale_of

    want = local["old_log_probs"]
    assert_close(local["ref_log_prob"], want, rounding(
        torch.float32, tiny_torch_terms(rows), scale_of(want), want.numel()),
        "ref_log_prob")
    metrics = engine.update_policy(local).metrics
    grads = {n: p.grad.full_tensor() if sharded else p.grad
             for n, p in engine.module.named_parameters()}
    weights = checkpoint.model_state_dict(engine.module, sharded=sharded)
    # checkpoint: sharded, one file per rank; replicated, rank 0 writes the whole state
    engine.save_checkpoint(os.path.join(workdir, "ckpt"))
    engine.load_checkpoint(os.path.join(workdir, "ckpt"))
    reloaded = checkpoint.model_state_dict(engine.module, sharded=sharded)
    assert all(torch.equal(reloaded[k], weights[k]) for k in weights)
    assert engine.actor.update_count == 1
    with open(os.path.join(workdir, f"metrics{rank}.json"), "w") as handle:
        json.dump(metrics, handle)
    torch.save({"grads": grads, "weights": weights},
               os.path.join(workdir, f"result{rank}.pt"))
    finish_rank()  # a failing rank raises instead
