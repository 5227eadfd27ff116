"""The speed section of docs/speed.md, rendered from the benchmarks' JSON results in docs/bench/.

    .venv/bin/python tools/bench/speed_report.py            # print the section
    .venv/bin/python tools/bench/speed_report.py --write    # replace it in docs/speed.md
    .venv/bin/python tools/bench/speed_report.py --check    # exit 1 if docs/speed.md differs

Each JSON file is what a benchmark wrote with ``--out docs/bench/<name>.json``; each
records its date, machine and command line, which the section quotes. The section lives
between the two ``speed-report`` comment lines in docs/speed.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "bench"
PAGE = ROOT / "docs" / "speed.md"
BEGIN = "<!-- speed-report: begin (tools/bench/speed_report.py --write) -->"
END = "<!-- speed-report: end -->"


def _load(name: str) -> Optional[dict]:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _source(result: dict) -> str:
    run = result.get("run", {})
    return (f"Measured {run.get('date', '?')} on {run.get('machine', '?')}: "
            f"`{run.get('command', '?')}`.")


def _table(intro: str, columns: list, rows: list, notes: list) -> list:
    """A section: its intro, a markdown table (one "| ... |" line per row) and the notes
    (a bullet each) naming where the numbers come from."""
    return [intro, "", f"| {' | '.join(columns)} |", "|" + "---|" * len(columns), *rows, "",
            *[f"- {note}" for note in notes], ""]


def _step_row(label: str, result: dict) -> str:
    nodes = result["nodes"]
    step = result["siirl_step_s"]
    reward = sum(v["seconds"] for k, v in nodes.items() if "reward" in k)
    old = nodes.get("actor_old_log_prob", {}).get("seconds", 0.0)
    return (f"| {label} | {step:.3f} s | {result['floor_step_s']:.3f} s | "
            f"**{result['ratio_median']:.2f}x** | {reward / step:.1%} | {old:.4f} s |")


def _step_note(label: str, result: dict) -> str:
    s = result["startup_s"]
    return (f"{label.split(' (')[0]}: {_source(result)} Start-up in the same process: "
            f"imports {s['imports']:.1f} s, set-up {s['setup']:.1f} s, first step "
            f"{s['first_step']:.1f} s; peak RSS {result['peak_rss_mb']:.0f} MB (siiRL and "
            "floor together).")


def step_section() -> list:
    rows = [(label, result) for label, result in (
        ("main job (built-in tiny model, 32 prompts x 8, 8 new tokens)", _load("step_floor")),
        ("SmolLM2-135M-Instruct (8 prompts x 4, 32 new tokens)",
         _load("step_floor_smollm2"))) if result]
    if not rows:
        return []
    return _table("**One GRPO step against its floor** (`tools/bench/step_floor.py`: the "
                  "floor is one plain transformers `generate` of the same batch plus one eager "
                  "forward/backward without activation checkpointing and one fused AdamW "
                  "step; rounds alternate in one process, medians):",
                  ["setting", "siiRL step", "floor step", "siiRL / floor", "reward share",
                   "old-log-prob node"],
                  [_step_row(label, result) for label, result in rows],
                  [_step_note(label, result) for label, result in rows])


def sampler_section() -> list:
    rows = [(label, result) for label, result in (
        ("main job", _load("sampler")), ("SmolLM2-135M", _load("sampler_smollm2"))) if result]
    if not rows:
        return []
    lines = []
    for label, result in rows:
        gen, new = result["methods"]["generate"], result["methods"]["sampler"]
        same = result["sampler_equals_reference"]
        lines.append(f"| {label}: {result['rows']} rows, {result['new_tokens']} new tokens "
                     f"| {gen['median_s']:.4f} s | {new['median_s']:.4f} s | "
                     f"**{new['ratio_to_generate']:.2f}x** | {new['cpu_ratio_to_generate']:.2f}x"
                     f" | {same['identical']}/{same['rounds']} rounds |")
    return _table("**The rollout's sampler** (`tools/bench/sampler.py`: the same prompts "
                  "through plain `generate`, the plain KV-cached loop and the sampler the `hf` "
                  "rollout uses, alternating in one process; medians; the sampler's tokens "
                  "equal the plain loop's in every round):",
                  ["setting", "generate", "sampler", "sampler / generate", "CPU time ratio",
                   "same tokens"], lines,
                  [f"{label}: {_source(result)}" for label, result in rows])


def vllm_rollout_section() -> list:
    result = _load("rollout")
    if not result:
        return []
    methods, ratios = result["methods"], result["ratios"]
    lines = [f"| {name} | {m['median_s'] * 1e3:.1f} ms | {m['tokens_per_s']:,.0f} |"
             for name, m in methods.items()]
    return _table(f"**The vllm rollout** (`tools/bench/rollout.py`, vLLM {result['vllm']}: "
                  f"{result['model']}, {result['prompts']} prompts x {result['n']} samples, "
                  f"{result['new_tokens']} new tokens, the same engine called directly and "
                  "through the rollout node, alternating in one process; medians): the node "
                  f"gets **{ratios['vllm node / standalone vllm']:.2f}** of standalone vLLM's "
                  "tokens/s with a seed per prompt (the default; vLLM's per-request "
                  "generators cost the difference), "
                  f"**{ratios['vllm node, seed per call / standalone vllm']:.2f}** with "
                  "`rollout.seed_per_prompt=false` (on this 3-layer model vLLM's per-step "
                  "engine work outweighs the model, so the hf rollout is faster here):",
                  ["method", "per batch", "tokens/s"], lines, [_source(result)])


def startup_section() -> list:
    result = _load("startup")
    if not result:
        return []
    lines = []
    for workers, entry in sorted(result["workers"].items()):
        m = entry["median"]
        lines.append(f"| {workers} | {m['start']:.1f} s | {m['setup']:.1f} s | "
                     f"{m['validation']:.1f} s | {m['first_step']:.2f} s | "
                     f"**{m['to_first_step']:.1f} s** | {m['command']:.1f} s |")
    return _table("**Start-up** (`tools/bench/startup.py`: the real `siirl-train` command for "
                  "one step in a fresh process, medians; \"start\" is interpreter, imports, "
                  "configuration and, with 2 workers, Ray and the worker processes):",
                  ["workers", "start", "set-up", "validation", "first step", "to first step",
                   "whole command"], lines, [_source(result)])


def databuffer_section() -> list:
    result = _load("databuffer")
    if not result:
        return []
    lines = []
    for workers, res in sorted(result["workers"].items(), key=lambda kv: int(kv[0])):
        n = int(workers)
        lines.append(f"| DP{n} -> DP{n // 2} ({n} processes) | **{res['ratio_to_memcpy']:.2f}**"
                     f" | {res['gloo_ratio_to_memcpy']:.2f} | {res['ratio_to_centralized']:.2f}x"
                     f" | {int(res['databuffer']['driver_bytes'])} |")
    return _table("**DataBuffer redistribution** (`tools/bench/databuffer.py`: "
                  f"{result['rows']} rows x {result['width']} tokens, "
                  f"{result['batch_bytes'] / 1e6:.0f} MB, between worker processes on one "
                  "node; bandwidth relative to one process copying the whole batch, medians):",
                  ["layout change", "DataBuffer / memcpy", "DataBuffer over gloo / memcpy",
                   "DataBuffer / centralized driver", "bytes through a driver"], lines,
                  [_source(result)])


def scaling_section() -> list:
    result = _load("scaling")
    if not result:
        return []
    s = result["summary"]
    lines = []
    for name, lay in s["layouts"].items():
        cpu = f"{lay['cpu_efficiency']:.2f}" if lay.get("cpu_efficiency") else "n/a"
        fsdp_size = "`fsdp_size=1`" if name == "replicate" else "`fsdp_size=-1`, the default"
        lines.append(f"| {name} ({fsdp_size}) | **{lay['efficiency']:.2f}** | "
                     f"{lay['relative_to_probe']:.2f} | {cpu} | "
                     f"{lay['step_s'] * 1e3:.0f} ms | {lay['to_first_step_s']:.1f} s |")
    return _table("**Scaling** (`tools/bench/scaling.py`: the main job at "
                  f"{result['args']['prompts_per_worker']} prompts per worker, 1 -> 2 CPU "
                  f"workers; one worker's step {s['step_s_1'] * 1e3:.0f} ms; efficiency = "
                  "step time 1 worker / 2 workers; the machine itself gave two processes "
                  f"{s['probe_efficiency']:.2f}):",
                  ["2-worker layout", "efficiency", "efficiency / machine",
                   "CPU-time efficiency", "2-worker step", "2-worker start-up to step 1"],
                  lines, [_source(result)])


def cluster_traffic_section() -> list:
    result = _load("cluster_traffic")
    if not result:
        return []
    lines = [f"| {name} | {r['databuffer_bytes_sent'] / 1024:.1f} KB | "
             f"{r['databuffer_shared_bytes'] / 1024:.1f} KB | "
             f"{r['weight_sync_bytes'] / 2**20:.2f} MB | "
             f"{(r['loopback_bytes_per_step'] or 0) / 2**20:.2f} MB |"
             for name, r in result["rows"].items()]
    return _table("**Traffic per step across nodes** (`tools/bench/cluster_traffic.py`: the "
                  "same 2-worker GRPO job, rollout at tensor-parallel size 2, on one Ray node "
                  "and on two Ray nodes of this machine; means over "
                  f"{result['steps']} steps; see docs/cluster.md):",
                  ["run", "DataBuffer over gloo", "DataBuffer through shared memory",
                   "weight sync", "all loopback traffic"], lines, [_source(result)])


def packing_section() -> list:
    result = _load("packing")
    if not result:
        return []
    lines = [f"| {c['model']} ({c['params'] / 1e6:.1f}M) | {c['tokens_run']['padded']} | "
             f"{c['tokens_run']['packed']} | {c['median_s']['padded']:.3f} s | "
             f"{c['median_s']['packed']:.3f} s | **{c['packed_over_padded']:.2f}x** | "
             f"{c['max_abs_logprob_diff']:.1e} |" for c in result["cases"]]
    return _table("**Remove-padding** (`tools/bench/packing.py`: " + result["what"] + "; "
                  + result["batch"] + "):",
                  ["model", "tokens run padded", "packed", "padded", "packed",
                   "packed / padded", "max log-prob difference"], lines, [_source(result)])


def lora_memory_section() -> list:
    result = _load("lora_memory")
    if not result:
        return []
    lines = [f"| {c['case']} | {c['trainable'] / 1e6:.2f}M of {c['params'] / 1e6:.1f}M | "
             f"{c['optimizer_mb']:.0f} MB | {c['peak_mb']:.0f} MB |" for c in result["cases"]]
    ratio = result["lora_over_full"]["peak_mb"]
    return _table("**LoRA memory** (`tools/bench/lora_memory.py`: " + result["model"] + "; "
                  + result["batch"] + f"; {result['steps']} steps, each case in a fresh "
                  f"process; peak RSS, LoRA / full = **{ratio:.2f}x**):",
                  ["case", "trainable", "optimizer state", "peak memory"], lines,
                  [_source(result)])


def megatron_bf16_section() -> list:
    result = _load("megatron_bf16")
    if not result:
        return []
    lines = [f"| `{key}` | {diff:.4f} | {result['at_step'][key]} |"
             for key, diff in result["max_abs_diff"].items()]
    return _table("**Megatron bf16 vs fp32** (`tools/bench/megatron_bf16_curve.py`: the main "
                  f"job under `strategy=megatron`, {result['steps']} steps each; fp32 "
                  f"{result['fp32_wall_s']:.0f} s, bf16 {result['bf16_wall_s']:.0f} s; the "
                  f"loss curve's target is {result['target']}):",
                  ["curve", "max abs(bf16 - fp32)", "at step"], lines, [_source(result)])


def megatron_backends_section() -> list:
    result = _load("megatron")
    if not result:
        return []
    lines = []
    for model, cases in result["results"].items():
        ratios = result["megatron_over_fsdp"].get(model, {})
        for case in (c for c in cases if "error" not in c):
            r = ratios.get(case["dtype"], {}) if case["backend"] == "megatron" else {}
            ratio = f"**{r['tokens_per_s']:.2f}x** / {r['peak_rss_mb']:.2f}x" if r else ""
            lines.append(f"| {model} | {case['dtype']} | {case['backend']} | "
                         f"{case['tokens_per_s']:.0f} | {case['peak_rss_mb']:.0f} MB | {ratio} |")
    models = "; ".join(f"{k}: {v}" for k, v in result["models"].items())
    return _table("**Megatron vs FSDP actor update** (`tools/bench/megatron_vs_fsdp.py`: " + models
                  + "; " + result["batch"] + f"; median of {result['repeats']} updates after "
                  f"{result['warmup']} warm-up, each case in a fresh process with "
                  f"{result['threads']} torch thread(s); memory: "
                  + result["memory"] + "; this machine is shared with other jobs):",
                  ["model", "dtype", "backend", "tokens/s", "peak memory",
                   "megatron / fsdp (tokens/s / memory)"], lines,
                  ["bf16: megatron `megatron.dtype=bfloat16` (bf16 weights, fp32 main weights "
                   "in the optimizer); fsdp `fsdp_config.model_dtype=bfloat16` (fp32 weights, "
                   "bf16 autocast).", _source(result)])


def async_section() -> list:
    result = _load("async_cpu")
    if not result:
        return []
    lines = []
    for i, r in enumerate(result["rounds"], 1):
        lines.append(f"| {i} | {r['async']['steps_per_s']:.2f} | {r['sync']['steps_per_s']:.2f} "
                     f"| {r['ratio']:.2f} | {r['async']['wait_share']:.1%} | "
                     f"{r['val_gap_mean']:.3f} / {r['val_gap_last']:.3f} |")
    m = result["summary"]
    lines.append(f"| median | {m['async_steps_per_s']:.2f} | {m['sync_steps_per_s']:.2f} | "
                 f"**{m['ratio']:.2f}** | {m['wait_share']:.1%} | "
                 f"{m['val_gap_mean']:.3f} / {m['val_gap_last']:.3f} |")
    return _table("**Asynchronous against synchronous training** (`tools/bench/async.py`: "
                  f"`{result['config']}`, one rollout and one trainer worker, against the same "
                  "preset with `async_training.enable=false` on 2 workers; see "
                  "[docs/async.md](async.md)):",
                  ["round", "async steps/s", "sync steps/s", "ratio", "trainer waiting",
                   "validation gap mean / last"], lines, [_source(result)])


SECTIONS: list = [step_section, sampler_section, vllm_rollout_section, startup_section,
                  databuffer_section,
                  scaling_section, cluster_traffic_section, packing_section,
                  lora_memory_section, megatron_bf16_section, megatron_backends_section,
                  async_section]


def render(sections: list = SECTIONS) -> str:
    lines: list = []
    for section in sections:
        lines += section()
    body = "\n".join(lines).rstrip("\n")
    return f"{BEGIN}\n{body}\n{END}"


def replace_in(text: str, block: str) -> str:
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        raise SystemExit(f"{PAGE}: the speed-report markers are missing")
    return text[:start] + block + text[stop + len(END):]


def main(argv=None, render_fn: Callable[[], str] = render) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    block = render_fn()
    if not (args.write or args.check):
        print(block)
        return 0
    text = PAGE.read_text()
    updated = replace_in(text, block)
    if args.check:
        if updated != text:
            print("docs/speed.md's speed section is stale: run tools/bench/speed_report.py "
                  "--write", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
