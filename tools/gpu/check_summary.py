"""The summary table of ``tools/gpu/check_all.sh``: one line per part (its exit status,
seconds and headline numbers, read from the JSON it wrote), written as summary.json.

    python tools/gpu/check_summary.py STATUS_TSV OUT_DIR

STATUS_TSV has one line per part: name, exit status, seconds (124/137: its time limit).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def _f(value, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)


def main_job(r: dict) -> str:
    return (f"{r['steps']} steps, median step {_f(r['step_s_median'])} s, validation "
            f"{_f(r['val_first'])} -> {_f(r['val_last'])} (best {_f(r['val_best'])}), "
            f"wall {_f(r.get('wall_s'))} s")


def train_mfu(r: dict) -> str:
    parts = []
    for b in r["results"]:
        if "tokens_per_s" not in b:
            parts.append(f"{b['backend']}: {(b.get('skipped') or b.get('error'))[:80]}")
            continue
        mfu = f"{b['mfu']:.1%}" if b["mfu"] is not None else "n/a"
        parts.append(f"{b['backend']} ({b['compute_dtype']}) {b['tokens_per_s']:.0f} tok/s, "
                     f"MFU {mfu}, {b['peak_memory_gib']:.1f} GiB")
    return "; ".join(parts)


def step_floor(r: dict) -> str:
    return (f"siiRL step {_f(r['siirl_step_s'])} s / floor {_f(r['floor_step_s'])} s = "
            f"{_f(r['ratio_median'], '.2f')}")


def megatron(r: dict) -> str:
    worst = max((p["logprob_max_abs_diff"] for p in r["parity"].values()), default=None)
    runs = [f"{k} {r[k]['actor_tokens_per_s']:.0f} tok/s" if "error" not in r[k]
            else f"{k} failed" for k in ("grpo", "grpo_bf16", "grpo_fp16", "grpo_moe_bf16",
                                         "grpo_moe_bf16_r2") if k in r]
    return (f"fp32 log-prob vs HF max |diff| {_f(worst)}, MoE bf16 "
            f"{_f(r['moe_parity_bf16']['logprob_max_abs_diff'])}; " + ", ".join(runs))


def logprobs(r: dict) -> str:
    cases = [f"{c['case']} {_f(c['max_abs_vs_ref'])} / {_f(c['mean_abs_vs_ref'])}"
             if "max_abs_vs_ref" in c else f"{c['case']} {c.get('error', '')[:60]}"
             for c in r["cases"] if c["case"] != r["reference"]]
    return (f"passed {r.get('passed')}; max / mean |diff| vs {r['reference']}: "
            + ", ".join(cases))


def offload(r: dict) -> str:
    checks = {f"{part}: {what}": ok for part, v in r.items() if isinstance(v, dict)
              for what, ok in v.get("checks", {}).items()}
    failed = [k for k, ok in checks.items() if not ok]
    return f"{len(checks) - len(failed)}/{len(checks)} checks" + \
        (f"; failed: {'; '.join(failed)}" if failed else "")


def async_sync(r: dict) -> str:
    c = r["channel"]
    words = (f"{c['backend']} channel {'exact' if c.get('exact') else 'NOT exact'}, "
             f"{c.get('bytes', 0) / 1e9:.2f} GB at {c.get('gbps', 0):.1f} GB/s")
    run = r.get("run")
    if run is None:
        return words + f"; two-GPU run skipped ({r['gpus']} GPU)"
    return words + (f"; run {run['steps']} steps, lag max {run['lag_max']:g}, median step "
                    f"{run['step_s']:.3f} s" if run.get("ok") else "; run FAILED")


HEADLINES = {"main_job": main_job, "train_mfu": train_mfu, "step_floor": step_floor,
             "megatron": megatron, "logprobs": logprobs, "offload": offload,
             "async_sync": async_sync}


def main(argv=None) -> int:
    status_tsv, out = (argv or sys.argv[1:])[:2]
    out = Path(out)
    rows = []
    for line in Path(status_tsv).read_text().splitlines():
        name, rc, seconds = line.split("\t")
        rc = int(rc)
        state = "ok" if rc == 0 else ("time limit" if rc in (124, 137) else f"exit {rc}")
        result_file = out / f"{name}.json"
        try:
            headline = HEADLINES[name](json.loads(result_file.read_text()))
        except FileNotFoundError:
            headline = "no result written (see check_all.log)"
        except Exception as err:  # noqa: BLE001  (a partial JSON: say so, keep the table)
            headline = f"result unreadable: {type(err).__name__}: {err}"
        rows.append({"part": name, "state": state, "exit": rc, "seconds": int(seconds),
                     "headline": headline})
    print(f"\n{'part':<12}{'state':<12}{'s':>5}  result")
    for row in rows:
        print(f"{row['part']:<12}{row['state']:<12}{row['seconds']:>5}  {row['headline']}")
    (out / "summary.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "parts": rows}, indent=1))
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
