"""Peak memory of the actor's training steps with LoRA against full fine-tuning.

    python tools/bench/lora_memory.py [--steps 3] [--rank 16] [--out docs/bench/lora_memory.json]

Each case runs in a fresh process, so its peak resident memory (``ru_maxrss``) is its own:
a Llama of about 60M parameters built from a config (hidden 512, 8 layers, vocabulary
32000, untied head, fp32) becomes the fsdp actor and its reference policy (KL loss on, as
in verl's GRPO examples), then ``--steps`` times: old log-probs, reference log-probs and
one actor update on a batch of 8 rows of 64 prompt + 64 response tokens (micro-batches of
4). Full fine-tuning keeps a copy of the weights as the reference, gradients and two Adam
moments for every weight; LoRA (rank ``--rank`` on all linear layers) keeps them for the
adapters only and its reference is the same module with the adapters off.

The table shows per case the trainable parameters, the optimizer state, the resident
memory once the model is built, the peak over the steps, the growth between the two, and
the seconds per step; then the LoRA / full ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from bench_info import write_result  # tools/bench is on sys.path when run as a script

ROWS, PROMPT, RESPONSE, VOCAB = 8, 64, 64, 32000


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=512, intermediate_size=1376,
                         num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                         max_position_embeddings=256, tie_word_embeddings=False)
    return LlamaForCausalLM(config).float()


def _batch():
    import torch

    from siirl.data_coordinator.protocol import make_batch

    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, VOCAB, (ROWS, PROMPT + RESPONSE), generator=g)
    attention_mask = torch.ones_like(input_ids)
    response_mask = torch.ones(ROWS, RESPONSE)
    return make_batch({
        "input_ids": input_ids, "attention_mask": attention_mask,
        "position_ids": attention_mask.cumsum(-1) - 1, "prompts": input_ids[:, :PROMPT],
        "responses": input_ids[:, PROMPT:], "response_mask": response_mask,
        "advantages": response_mask * torch.linspace(-1.0, 1.0, ROWS)[:, None],
    })


def run_case(rank: int, steps: int) -> dict:
    """One case in this process: build, ``steps`` steps, measure."""
    import torch

    from siirl.engine.fsdp.engines import fsdp_actor, fsdp_reference
    from siirl.params.parser import parse_config

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    overrides = ["actor_rollout_ref.actor.ppo_mini_batch_size=8",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                 "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
                 "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
                 "actor_rollout_ref.rollout.n=1", "actor_rollout_ref.actor.use_kl_loss=true",
                 "actor_rollout_ref.actor.optim.lr=1e-5", "trainer.device=cpu"]
    if rank:
        overrides += [f"actor_rollout_ref.model.lora_rank={rank}",
                      f"actor_rollout_ref.model.lora_alpha={2 * rank}",
                      "actor_rollout_ref.model.target_modules=all-linear"]
    config = parse_config(overrides)
    actor = fsdp_actor(config, module=_model())
    reference = fsdp_reference(config, actor=actor)
    built = _rss_mb()
    params = sum(p.numel() for p in actor.module.parameters())
    trainable = sum(p.numel() for p in actor.module.parameters() if p.requires_grad)
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        batch = actor.compute_log_prob(_batch()).batch
        batch = reference.compute_ref_log_prob(batch).batch
        actor.update_policy(batch)
        seconds.append(time.perf_counter() - start)
    moments = sum(t.numel() * t.element_size() for state in actor.optimizer.state.values()
                  for t in state.values() if torch.is_tensor(t))
    peak = _peak_mb()
    return {"case": f"lora r={rank}" if rank else "full", "params": params,
            "trainable": trainable, "optimizer_mb": moments / 2**20, "built_mb": built,
            "peak_mb": peak, "growth_mb": peak - built,
            "s_per_step": sorted(seconds)[len(seconds) // 2]}


def _in_fresh_process(rank: int, steps: int) -> dict:
    cmd = [sys.executable, __file__, "--case", str(rank), "--steps", str(steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"case rank={rank} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank of the LoRA case")
    parser.add_argument("--out", default="docs/bench/lora_memory.json")
    parser.add_argument("--case", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case is not None:  # a child: one case, its result as the last stdout line
        print(json.dumps(run_case(args.case, args.steps)))
        return
    cases = [_in_fresh_process(0, args.steps), _in_fresh_process(args.rank, args.steps)]
    head = f"{'case':<12}{'params':>12}{'trainable':>12}{'optim MB':>10}{'built MB':>10}" \
           f"{'peak MB':>10}{'growth MB':>11}{'s/step':>8}"
    print(head)
    for c in cases:
        print(f"{c['case']:<12}{c['params']:>12,}{c['trainable']:>12,}{c['optimizer_mb']:>10.1f}"
              f"{c['built_mb']:>10.0f}{c['peak_mb']:>10.0f}{c['growth_mb']:>11.0f}"
              f"{c['s_per_step']:>8.2f}")
    full, adapted = cases
    ratios = {key: adapted[key] / full[key] for key in ("peak_mb", "growth_mb", "built_mb",
                                                        "s_per_step")}
    print(f"{'lora / full':<12}{'':>34}{ratios['built_mb']:>10.2f}{ratios['peak_mb']:>10.2f}"
          f"{ratios['growth_mb']:>11.2f}{ratios['s_per_step']:>8.2f}")
    result = {"model": "Llama, hidden 512, 8 layers, vocab 32000, untied head, fp32",
              "batch": f"{ROWS} rows x ({PROMPT} prompt + {RESPONSE} response) tokens, "
                       "micro-batches of 4, KL loss (reference forward) on",
              "steps": args.steps, "cases": cases, "lora_over_full": ratios}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_result(result, args.out, argv)


if __name__ == "__main__":
    main()
