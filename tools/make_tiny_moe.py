"""Build siiRL's built-in tiny mixture-of-experts model (``siirl/engine/assets/tiny_moe``,
``builtin:tiny-moe``): tiny-arith upcycled into a Mixtral with 4 experts, top-2.

    python tools/make_tiny_moe.py     # a few seconds on a CPU

It is not trained: training a MoE from scratch to the main job's task would be a second
recipe to keep honest, while upcycling keeps what tiny-arith learnt. Every weight outside the
MLPs (embeddings, attention, norms) is tiny-arith's; each layer's dense SwiGLU MLP becomes 4
experts, each a copy of it times ``1 + noise * N(0, 1)`` elementwise (distinct experts, so a
wrong expert placement under expert parallelism shows), and the router is drawn from
``N(0, router_std)``. Mixtral renormalises the top-2 weights, so with exact copies the MoE
would be tiny-arith itself; the noise moves it a little (the card records its accuracy).

Seeded, one CPU thread: a re-run gives the same weights on the same torch build.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

import torch
from tiny_build import command_line, finish, remake, seeded, timed_log

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "packages" / "siirl-engine" / "src" / "siirl" / "engine" / "assets"
EXPERTS, TOP_K = 4, 2
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def upcycle(source: Path, seed: int, noise: float, router_std: float):
    """tiny-arith's ``LlamaForCausalLM`` in ``source`` as a ``MixtralForCausalLM``."""
    from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM

    dense = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    c = dense.config
    config = MixtralConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        rope_theta=10000.0, tie_word_embeddings=c.tie_word_embeddings,
        num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, bos_token_id=c.bos_token_id,
        eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id)
    seeded(seed)
    moe = MixtralForCausalLM(config)
    dense_state, state = dense.state_dict(), moe.state_dict()
    with torch.no_grad():
        for name, tensor in state.items():
            if name in dense_state:
                tensor.copy_(dense_state[name])
        for layer in range(c.num_hidden_layers):
            mlp = f"model.layers.{layer}.mlp."
            gate_up = torch.cat([dense_state[mlp + "gate_proj.weight"],
                                 dense_state[mlp + "up_proj.weight"]])
            down = dense_state[mlp + "down_proj.weight"]
            for expert in range(EXPERTS):
                state[mlp + "experts.gate_up_proj"][expert].copy_(
                    gate_up * (1 + noise * torch.randn_like(gate_up)))
                state[mlp + "experts.down_proj"][expert].copy_(
                    down * (1 + noise * torch.randn_like(down)))
            state[mlp + "gate.weight"].normal_(0, router_std)
    moe.load_state_dict(state)
    return moe.eval()


def greedy_accuracy(model, tokenizer) -> float:
    """Greedy exact-answer accuracy over the task's 672 prompts."""
    problems = [(f"{a}{op}{b}=", a + b if op == "+" else a - b)
                for a in range(21) for b in range(21) for op in "+-" if op == "+" or a >= b]
    enc = tokenizer([p for p, _ in problems], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=6, do_sample=False)
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    hits = sum(bool(re.fullmatch(r"-?\d+", t)) and int(t) == a
               for t, (_, a) in zip(texts, problems, strict=True))
    return hits / len(problems)


CARD = """# tiny_moe

A tiny character-level mixture of experts ({params:,} parameters, float32) for siiRL's
built-in arithmetic task, to exercise the megatron backend's MoE path (router, experts,
expert parallelism) on a CPU. `siirl-train actor_rollout_ref.model.path=builtin:tiny-moe`
runs GRPO on it. It is not useful for anything else.

* Model: `MixtralForCausalLM`, {experts} experts per layer, top-{top_k} (weights
  renormalised), hidden 64, 3 layers, 4 heads of dimension 16, expert intermediate 256,
  tied embeddings, vocab 58. Tokenizer and task: `tiny_arith`'s (the same files).

## How it was made

Not trained. `tools/make_tiny_moe.py` upcycles `tiny_arith` (the default job's model):
every weight outside the MLPs is tiny-arith's; each layer's MLP becomes {experts} experts,
each the dense MLP's weights times `1 + {noise} * N(0, 1)` elementwise (so the experts
differ), and the router is drawn from `N(0, {router_std})` (seed {seed}). With exact copies
the renormalised top-{top_k} mixture would be tiny-arith itself; the noise moves it a little:

| measure | value |
| --- | --- |
| greedy accuracy, all 672 prompts (tiny_arith's) | {dense_acc:.3f} |
| greedy accuracy, all 672 prompts (this model) | {moe_acc:.3f} |

{remake}"""


def main(argv: list | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=ASSETS / "tiny_arith")
    parser.add_argument("--out", type=Path, default=ASSETS / "tiny_moe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise", type=float, default=0.05)
    parser.add_argument("--router-std", type=float, default=0.5)
    args = parser.parse_args(argv)
    log = timed_log()
    moe = upcycle(args.source, args.seed, args.noise, args.router_std)
    args.out.mkdir(parents=True, exist_ok=True)
    moe.save_pretrained(args.out)
    for name in TOKENIZER_FILES:
        shutil.copy(args.source / name, args.out / name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.source)
    dense = AutoModelForCausalLM.from_pretrained(args.source, dtype=torch.float32).eval()
    card = CARD.format(
        params=sum(p.numel() for p in moe.parameters()), experts=EXPERTS, top_k=TOP_K,
        noise=args.noise, router_std=args.router_std, seed=args.seed,
        dense_acc=greedy_accuracy(dense, tokenizer), moe_acc=greedy_accuracy(moe, tokenizer),
        remake=remake(command_line("make_tiny_moe.py", argv), "a few seconds"))
    finish(args.out, card, log)


if __name__ == "__main__":
    main()
