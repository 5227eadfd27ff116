"""The actor update under ``strategy=megatron`` against ``strategy=fsdp``: same model, same
batch, tokens/s and peak memory, fp32 and bf16, a dense and a mixture-of-experts model.

    python tools/bench/megatron_vs_fsdp.py [--repeats 5] [--warmup 1] [--threads 1] \
        [--out docs/bench/megatron.json]

Each case runs in a fresh process (megatron's parallel state is one per process, and the
peak resident memory, ``ru_maxrss``, is then the case's own): the actor is built from a
randomly initialised model saved with the built-in tokenizer, then ``--warmup`` + ``--repeats``
actor updates (forward, backward, optimizer step; one mini-batch of 8 rows of 64 prompt +
64 response tokens, micro-batches of 4) run on the same batch; old log-probs are computed
before each update and not timed. tokens/s counts every token of the batch (prompt and
response) over the median update time, warm-up excluded. Memory is the process's resident
set (torch's CPU allocator keeps no peak): once built, and its peak over the updates.

bf16 means: megatron ``megatron.dtype=bfloat16`` (bf16 weights and compute, fp32 main
weights in megatron's distributed optimizer); fsdp ``fsdp_config.model_dtype=bfloat16``
(fp32 weights, the forward under bf16 autocast). The models are a Llama (hidden 256,
4 layers, GQA 4/2 heads) and a Mixtral of the same shape with 4 experts, top-2 (experts of
half the dense MLP's width). The table gives megatron / fsdp ratios per model and dtype.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_info import write_result  # tools/bench is on sys.path when run as a script

# This file bears megatron-core's package name: its folder must not shadow that package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

ROWS, PROMPT, RESPONSE, MICRO = 8, 64, 64, 4
SHAPE = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
             tie_word_embeddings=False)
MODELS = {"dense": "Llama, hidden 256, MLP 704, 4 layers, 4/2 heads, untied head",
          "moe": "Mixtral, hidden 256, 4 experts of MLP 352, top-2, 4 layers, 4/2 heads"}
BACKENDS = ("fsdp", "megatron")
DTYPES = ("fp32", "bf16")
CHECKED = ("actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac")


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def save_model(kind: str, directory: Path) -> Path:
    """A randomly initialised ``kind`` model with the built-in tokenizer, in ``directory``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    from siirl.engine.models.loader import tiny_arith_dir

    source = Path(tiny_arith_dir())
    vocab = json.loads((source / "config.json").read_text())
    ids = {k: vocab[k] for k in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")}
    torch.manual_seed(0)
    if kind == "dense":
        model = LlamaForCausalLM(LlamaConfig(**SHAPE, **ids, intermediate_size=704))
    else:
        model = MixtralForCausalLM(MixtralConfig(**SHAPE, **ids, intermediate_size=352,
                                                 num_local_experts=4, num_experts_per_tok=2))
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(source / name, directory / name)
    return directory


def _batch(vocab: int):
    import torch

    from siirl.data_coordinator.protocol import make_batch

    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, vocab, (ROWS, PROMPT + RESPONSE), generator=g)
    attention_mask = torch.ones_like(input_ids)
    response_mask = torch.ones(ROWS, RESPONSE)
    return make_batch({
        "input_ids": input_ids, "attention_mask": attention_mask,
        "position_ids": attention_mask.cumsum(-1) - 1, "prompts": input_ids[:, :PROMPT],
        "responses": input_ids[:, PROMPT:], "response_mask": response_mask,
        "advantages": response_mask * torch.linspace(-1.0, 1.0, ROWS)[:, None],
    })


def _overrides(backend: str, dtype: str, model_dir: str) -> list:
    actor = "actor_rollout_ref.actor"
    out = [f"actor_rollout_ref.model.path={model_dir}", f"{actor}.strategy={backend}",
           f"{actor}.ppo_mini_batch_size={ROWS}", f"{actor}.ppo_micro_batch_size_per_gpu={MICRO}",
           f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
           "actor_rollout_ref.rollout.n=1", f"{actor}.use_kl_loss=false",
           f"{actor}.optim.lr=1e-5", "trainer.device=cpu"]
    if dtype == "bf16":
        out.append(f"{actor}.megatron.dtype=bfloat16" if backend == "megatron"
                   else f"{actor}.fsdp_config.model_dtype=bfloat16")
    return out


def run_case(backend: str, dtype: str, model_dir: str, warmup: int, repeats: int,
             threads: int) -> dict:
    """One case in this process: build the actor, time its updates, measure memory."""
    import torch

    from siirl.params.parser import parse_config

    torch.set_num_threads(threads)
    config = parse_config(_overrides(backend, dtype, model_dir))
    if backend == "megatron":
        from siirl.engine.megatron.engines import megatron_actor as build
    else:
        from siirl.engine.fsdp.engines import fsdp_actor as build
    actor = build(config)
    built = _rss_mb()
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    seconds, first = [], None
    for _ in range(warmup + repeats):
        batch = actor.compute_log_prob(_batch(vocab)).batch
        start = time.perf_counter()
        metrics = actor.update_policy(batch).metrics
        seconds.append(time.perf_counter() - start)
        first = first or metrics  # the same weights in every case: a check the work is equal
    assert torch.get_num_threads() == threads, "building the actor changed torch's threads"
    median = statistics.median(seconds[warmup:])
    peak = _peak_mb()
    return {"backend": backend, "dtype": dtype, "tokens_per_s": ROWS * (PROMPT + RESPONSE) / median,
            "update_s_median": median, "update_s": seconds[warmup:], "built_rss_mb": built,
            "peak_rss_mb": peak, "first_update": {k: float(first[k]) for k in CHECKED}}


def _in_fresh_process(backend: str, dtype: str, model_dir: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--case", backend, dtype, str(model_dir),
           "--warmup", str(args.warmup), "--repeats", str(args.repeats),
           "--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        return {"backend": backend, "dtype": dtype, "error": proc.stderr.strip()[-1500:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _print_table(results: dict) -> None:
    print(f"{'model':<7}{'dtype':<6}{'backend':<10}{'tokens/s':>10}{'update s':>10}"
          f"{'built MB':>10}{'peak MB':>10}")
    for model, cases in results.items():
        for case in cases:
            label = f"{model:<7}{case['dtype']:<6}{case['backend']:<10}"
            if "error" in case:
                print(f"{label}failed: {case['error'].splitlines()[-1]}")
                continue
            print(f"{label}{case['tokens_per_s']:>10.0f}{case['update_s_median']:>10.3f}"
                  f"{case['built_rss_mb']:>10.0f}{case['peak_rss_mb']:>10.0f}")
    print(f"\n{'megatron / fsdp':<23}{'tokens/s':>10}{'peak MB':>10}")
    for model, ratio in _ratios(results).items():
        for dtype, r in ratio.items():
            print(f"{model:<7}{dtype:<16}{r['tokens_per_s']:>10.2f}{r['peak_rss_mb']:>10.2f}")


def _ratios(results: dict) -> dict:
    """megatron / fsdp per model and dtype, where both ran."""
    out = {}
    for model, cases in results.items():
        by = {(c["backend"], c["dtype"]): c for c in cases if "error" not in c}
        out[model] = {d: {k: by[("megatron", d)][k] / by[("fsdp", d)][k]
                          for k in ("tokens_per_s", "peak_rss_mb")}
                      for d in DTYPES if ("megatron", d) in by and ("fsdp", d) in by}
    return out


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed updates per case")
    parser.add_argument("--warmup", type=int, default=1, help="untimed updates first")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    # one by default: on a shared machine a descheduled OpenMP thread stalls every parallel
    # op, which slows HF's many small ops (fsdp) far more than megatron's fewer larger ones
    parser.add_argument("--threads", type=int, default=1, help="torch threads per case")
    parser.add_argument("--out", default="docs/bench/megatron.json")
    parser.add_argument("--case", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case is not None:  # a child: one case, its result as the last stdout line
        backend, dtype, model_dir = args.case
        print(json.dumps(run_case(backend, dtype, model_dir, args.warmup, args.repeats,
                                  args.threads)))
        return 0
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            model_dir = save_model(model, Path(tmp) / model)
            results[model] = [_in_fresh_process(b, d, model_dir, args)
                              for d in DTYPES for b in BACKENDS]
    _print_table(results)
    result = {"models": {m: MODELS[m] for m in args.models},
              "batch": f"{ROWS} rows x ({PROMPT} prompt + {RESPONSE} response) tokens, one "
                       f"mini-batch, micro-batches of {MICRO}",
              "memory": "resident set size of the case's own process (ru_maxrss)",
              "warmup": args.warmup, "repeats": args.repeats, "threads": args.threads,
              "results": results,
              "megatron_over_fsdp": _ratios(results)}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_result(result, args.out, argv)
    return 1 if any("error" in c for cases in results.values() for c in cases) else 0


if __name__ == "__main__":
    sys.exit(main())
