"""Shared pieces of the critic tests: a pure-torch backbone wrapped as a ValueModel, a
rollout-shaped batch with values/returns, configs, and one rank of the 2-process gloo run.

transformers is not imported here: the 2-rank test's spawned processes import this
module, and a transformers import would cost each of them seconds.
"""

from types import SimpleNamespace

import torch

from siirl.data_coordinator.protocol import make_batch
from siirl.engine.critic.engine import CriticEngine
from siirl.engine.critic.value_model import ValueModel
from siirl.engine.fsdp.engines import fsdp_critic
from siirl.execution.scheduler.process_group_manager import free_port  # noqa: F401 (shared by the tests)
from siirl.params.parser import parse_config
from siirl_spawn import finish_rank

VOCAB, PROMPT, RESPONSE, DIM = 32, 4, 5, 32


class TinyBlock(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(2 * dim, dim))

    def forward(self, hidden):
        return hidden + self.mlp(self.norm(hidden))


class TinyBackbone(torch.nn.Module):
    """HF-shaped call, hidden states out; context enters through a causal running mean of
    the (masked) token embeddings, so position ``i`` sees tokens ``<= i`` only."""

    def __init__(self, vocab: int = VOCAB, dim: int = DIM, layers: int = 2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(64, dim)
        self.layers = torch.nn.ModuleList(TinyBlock(dim) for _ in range(layers))

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        mask = attention_mask.unsqueeze(-1).float()
        tokens = self.embed(input_ids) * mask
        context = tokens.cumsum(1) / mask.cumsum(1).clamp_min(1)
        hidden = tokens + context + self.pos(position_ids)
        for layer in self.layers:
            hidden = layer(hidden)
        return hidden


def tiny_value_terms(rows: int, key: str = "") -> int:
    """Roundings behind a value of the tiny critic on ``rows`` rows (siirl_numerics.rounding):
    the context's running sum (the row's positions), per block the LayerNorm (dim) and the
    MLP (dim, 2 dim), the value head (dim); a gradient comes back the same way and sums over
    every token; the gradient norm sums over every parameter."""
    layers, positions = 2, PROMPT + RESPONSE
    forward = positions + layers * 4 * DIM + DIM
    backward = 2 * forward + rows * positions
    if key == "grads":
        return backward
    if key.endswith("grad_norm"):
        return backward + sum(p.numel() for p in tiny_value_model().parameters())
    return forward + rows * positions  # values, and means over the tokens


def tiny_value_model(seed: int = 0) -> ValueModel:
    torch.manual_seed(seed)
    return ValueModel(TinyBackbone(), DIM, no_split_modules=["TinyBlock"], seed=seed)


def rollout_batch(rows: int = 4, seed: int = 0):
    """Left-padded prompts + right-padded responses (lengths 5, 4, 3, ...), with
    ``values`` (as the critic node leaves them) and fixed ``returns`` to regress to."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = [PROMPT - (i % 2) for i in range(rows)]
    lengths = [RESPONSE - (i % RESPONSE) for i in range(rows)]
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
    returns = torch.randn(rows, RESPONSE, generator=g) * response_mask
    return make_batch({
        "prompts": prompts, "responses": responses, "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp_min(0), "returns": returns,
    })


def critic_config(*overrides):
    base = ["critic.ppo_mini_batch_size=4", "critic.ppo_micro_batch_size_per_gpu=2",
            "critic.optim.lr=0.01", "critic.optim.weight_decay=0.0",
            "actor_rollout_ref.rollout.n=1"]
    return parse_config(base + list(overrides))


def critic_engine(config, module=None, worker=None) -> CriticEngine:
    return fsdp_critic(config, worker,
                       module=module if module is not None else tiny_value_model())


def with_values(engine, batch):
    return engine.compute_values(batch).batch


def dp_rank_main(rank: int, world_size: int, port: int, workdir: str) -> None:
    """One rank of the 2-process gloo test: FSDP2-shard the critic, compute values on this
    rank's half of the batch, then update on it with the batch's ``old_values`` as the
    clip anchor; write metrics, values, full gradients and weights to ``workdir``, and
    round-trip a sharded checkpoint (``workdir/ckpt``)."""
    import json
    import os

    import torch.distributed as dist

    from siirl.engine.common import checkpoint

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # two ranks share the test machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    inputs = torch.load(os.path.join(workdir, "inputs.pt"), weights_only=True)
    model = tiny_value_model()
    model.load_state_dict(inputs["weights"])
    worker = SimpleNamespace(rank=rank, world_size=world_size, engines={})
    engine = critic_engine(critic_config(*inputs["overrides"]), module=model,
                           worker=worker)
    assert engine.sharded
    rows = inputs["batch"]["input_ids"].shape[0] // world_size
    local = make_batch({k: v[rank * rows:(rank + 1) * rows]
                        for k, v in inputs["batch"].items()})
    values = with_values(engine, local)["values"]
    local.set("values", local["old_values"])  # perturbed: the value clip is exercised
    metrics = engine.update_critic(local).metrics
    grads = {n: p.grad.full_tensor() for n, p in engine.module.named_parameters()}
    weights = checkpoint.model_state_dict(engine.module, sharded=True)
    engine.save_checkpoint(os.path.join(workdir, "ckpt"))
    engine.load_checkpoint(os.path.join(workdir, "ckpt"))
    reloaded = checkpoint.model_state_dict(engine.module, sharded=True)
    assert all(torch.equal(reloaded[k], weights[k]) for k in weights)
    assert engine.critic.update_count == 1
    with open(os.path.join(workdir, f"metrics{rank}.json"), "w") as handle:
        json.dump(metrics, handle)
    torch.save(values, os.path.join(workdir, f"values{rank}.pt"))
    if rank == 0:
        torch.save({"grads": grads, "weights": weights},
                   os.path.join(workdir, "result.pt"))
    finish_rank()  # a failing rank raises instead
