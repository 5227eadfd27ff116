"""Log-prob parity of siiRL's megatron actor (TP 1) with its fsdp actor on one GPU.

    .venv/bin/python tools/gpu/megatron_fsdp_logprobs.py [--rows 4] [--seq 512] \
        [--out megatron_fsdp_logprobs.json]
    .venv/bin/python tools/gpu/megatron_fsdp_logprobs.py --tiny --device cpu

One randomly initialised Qwen2-shaped model (hidden 896, 4 layers, 14/2 heads, vocab
151936: Qwen2.5-0.5B's width with 4 of its 24 layers; ``--tiny``: the small model of
tools/gpu/mfu_model.py) is copied into each of four actor engines, built by the factories a
training run uses (tools/gpu/mfu_engines.py), which compute the old log-probs of the same
rollout batch (``--rows`` full sequences of ``--seq`` tokens, half response):

* fsdp fp32 (the reference) and megatron fp32 (GPTModel, TP 1): TF32 is off, so the two
  must agree to fp32 rounding (max |diff| over response tokens within ``FP32_TOLERANCE``).
* fsdp bf16 (``fsdp_config.model_dtype=bf16``: bf16 autocast over fp32 weights) and
  megatron bf16 (``megatron.dtype=bfloat16``: bf16 weights and compute): each one's error
  against the fp32 reference; megatron passes when its mean error is at most twice fsdp's
  plus one bf16 rounding of the logits (2**-8 x the spread of the reference log-probs).
  Their direct difference is reported too.

Both megatron engines run in this process: the engine initialises megatron's parallel
state once and reuses it for the next engine of the same sizes. A case that fails is
recorded (error and traceback tail) and the others still run. Prints a table, writes JSON
(device, date, versions, shapes, every number, ``passed``); exit 0 when passed, 1 when
not, 2 when it cannot run here (no CUDA without ``--tiny``; megatron-core missing).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import sys
import traceback
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "bench"))
# cuBLAS and cuDNN read this when they load: no TF32 in any library (megatron's kernels
# included), not only in torch's own matmuls
os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")

import torch  # noqa: E402
from bench_info import run_facts  # noqa: E402
from mfu_engines import (  # noqa: E402
    engine_config,
    fsdp_actor_engine,
    megatron_actor_engine,
    rollout_batch,
)
from mfu_model import QWEN25_05B, TINY, build_model  # noqa: E402
from train_mfu import megatron_unavailable  # noqa: E402

NEEDS_GPU = ("megatron_fsdp_logprobs.py needs a CUDA GPU for the mid-size model "
             "(or --tiny for the CPU check)")
MID = dict(QWEN25_05B, num_hidden_layers=4)
CASES = (("fsdp", "fp32"), ("megatron", "fp32"), ("fsdp", "bf16"), ("megatron", "bf16"))
REFERENCE = "fsdp fp32"
# Two fp32 forwards of the same weights differ only in summation order (megatron's
# fused/linear layers and attention vs HF's). Each reduction of length K (hidden 896,
# intermediate 4864, the 151936-way log-sum-exp) can move a value by up to ~K * eps
# relative in the worst case, ~sqrt(K) * eps typically: ~1e-5 relative per layer, a few
# layers deep, on log-probs of size log(vocab) ~ 12 gives ~1e-4 typical, ~1e-3 worst.
# A real mismatch (rope, qkv bias, norm eps, tied head, position ids) moves log-probs by
# 1e-2 or more. 8192 fp32 eps = 9.8e-4 on the max |diff|.
FP32_TOLERANCE = 8192 * torch.finfo(torch.float32).eps
# bf16 keeps 8 significant bits: 2**-8 relative is its spacing at 1 (twice its rounding
# error). The epsilon is one such rounding of the logits: a log-prob is the logit minus a
# log-sum-exp, so its part that logits move is its spread around the mean (the -log(vocab)
# offset of a near-uniform random model is exact); 2**-8 x the std of the reference
# log-probs over response tokens. It keeps the rule meaningful when fsdp's error is ~0.
BF16_RELATIVE = 2.0 ** -8
BF16_FACTOR = 2.0  # megatron bf16 (bf16 weights too) may err twice as much as autocast


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=None, help="sequences (4; --tiny: 2)")
    parser.add_argument("--seq", type=int, default=None, help="tokens per sequence "
                        "(512; --tiny: 64), half of them response")
    parser.add_argument("--micro", type=int, default=None,
                        help="rows per log-prob micro-batch (default: --rows)")
    parser.add_argument("--tiny", action="store_true", help="small model of the same family")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="default: cuda when available")
    parser.add_argument("--seed", type=int, default=0, help="model and batch seed")
    parser.add_argument("--out", default="megatron_fsdp_logprobs.json")
    args = parser.parse_args(argv)
    args.rows = args.rows or (2 if args.tiny else 4)
    args.seq = args.seq or (64 if args.tiny else 512)
    args.micro = args.micro or args.rows
    if args.rows % args.micro:
        parser.error(f"--micro {args.micro} must divide --rows {args.rows}")
    if args.seq < 4:
        parser.error("--seq must be at least 4")
    return args


def hf_config(tiny: bool, seq: int):
    from transformers import Qwen2Config

    return Qwen2Config(**(TINY if tiny else MID), max_position_embeddings=max(32768, seq))


def case_config(backend: str, dtype: str, args, device: torch.device):
    cfg = engine_config(backend, args.rows, args.micro, device.type, 1)
    actor = cfg.actor_rollout_ref.actor
    if backend == "fsdp":  # engine_config asks for bf16 autocast; None is plain fp32
        actor.fsdp_config.model_dtype = "bf16" if dtype == "bf16" else None
    else:
        actor.megatron.dtype = "bfloat16" if dtype == "bf16" else "float32"
    return cfg


def log_probs(backend: str, dtype: str, model, batch, args, device) -> torch.Tensor:
    """The engine's ``old_log_probs`` of ``batch`` (fp32, on the CPU); the engine is freed."""
    cfg = case_config(backend, dtype, args, device)
    build = fsdp_actor_engine if backend == "fsdp" else megatron_actor_engine
    engine = build(copy.deepcopy(model), cfg)  # each engine starts from the same weights
    try:
        out = engine.compute_log_prob(batch.clone()).batch["old_log_probs"]
        return out.detach().float().cpu()
    finally:
        del engine
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def run_case(backend, dtype, model, batch, args, device) -> dict:
    name = f"{backend} {dtype}"
    try:
        values = log_probs(backend, dtype, model, batch, args, device)
    except Exception as err:  # noqa: BLE001  (out of memory included: report, run the rest)
        return {"case": name, "error": f"{type(err).__name__}: {err}"[:2000],
                "traceback": traceback.format_exc()[-4000:]}
    return {"case": name, "values": values, "finite": bool(torch.isfinite(values).all())}


def diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict:
    """Max and mean |a - b| over the response tokens ``mask`` selects."""
    gap = (a - b).abs()[mask]
    return {"max_abs": float(gap.max()), "mean_abs": float(gap.mean())}


def compare(values: dict, mask: torch.Tensor) -> dict:
    """The checks over the cases that ran; a missing case fails the check needing it."""
    checks = {}
    ref = values.get(REFERENCE)
    if ref is not None and "megatron fp32" in values:
        d = diff(values["megatron fp32"], ref, mask)
        checks["fp32"] = {**d, "tolerance_max_abs": FP32_TOLERANCE,
                          "passed": d["max_abs"] <= FP32_TOLERANCE}
    if ref is not None and {"fsdp bf16", "megatron bf16"} <= set(values):
        fsdp_err = diff(values["fsdp bf16"], ref, mask)
        megatron_err = diff(values["megatron bf16"], ref, mask)
        epsilon = BF16_RELATIVE * float(ref[mask].std())
        bound = BF16_FACTOR * fsdp_err["mean_abs"] + epsilon
        checks["bf16"] = {
            "fsdp_bf16_vs_fsdp_fp32": fsdp_err, "megatron_bf16_vs_fsdp_fp32": megatron_err,
            "megatron_bf16_vs_fsdp_bf16": diff(values["megatron bf16"], values["fsdp bf16"],
                                               mask),
            "epsilon": epsilon, "bound_mean_abs": bound,
            "rule": f"megatron mean error <= {BF16_FACTOR:g} * fsdp mean error "
                    f"+ 2**-8 * std of the reference log-probs",
            "passed": megatron_err["mean_abs"] <= bound}
    return checks


def versions() -> dict:
    def version(dist: str):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None
    return {"torch": torch.__version__, "megatron-core": version("megatron-core"),
            "transformers": version("transformers"),
            "transformer-engine": version("transformer-engine") or version("transformer_engine")}


def report(result: dict) -> None:
    print(f"{result['device']}: {result['rows']} rows x {result['seq']} tokens "
          f"({result['response_tokens']} response tokens), model {result['model']['shape']}")
    print(f"{'case':<16}{'mean log-prob':>15}{'max |d| vs ref':>16}{'mean |d| vs ref':>17}")
    for case in result["cases"]:
        if "error" in case:
            print(f"{case['case']:<16}{case['error'][:200]}")
            continue
        gaps = (f"{case['max_abs_vs_ref']:>16.3e}{case['mean_abs_vs_ref']:>17.3e}"
                if "max_abs_vs_ref" in case else f"{'(reference)':>16}")
        print(f"{case['case']:<16}{case['mean_log_prob']:>15.5f}{gaps}")
    checks = result["checks"]
    if "fp32" in checks:
        c = checks["fp32"]
        print(f"fp32: megatron vs fsdp max |d| {c['max_abs']:.3e} (tolerance "
              f"{c['tolerance_max_abs']:.3e}), mean {c['mean_abs']:.3e}: "
              f"{'ok' if c['passed'] else 'FAILED'}")
    if "bf16" in checks:
        c = checks["bf16"]
        print(f"bf16: megatron mean error {c['megatron_bf16_vs_fsdp_fp32']['mean_abs']:.3e} "
              f"<= bound {c['bound_mean_abs']:.3e} (2 x fsdp "
              f"{c['fsdp_bf16_vs_fsdp_fp32']['mean_abs']:.3e} + {c['epsilon']:.3e}): "
              f"{'ok' if c['passed'] else 'FAILED'}; megatron bf16 vs fsdp bf16 max |d| "
              f"{c['megatron_bf16_vs_fsdp_bf16']['max_abs']:.3e}, mean "
              f"{c['megatron_bf16_vs_fsdp_bf16']['mean_abs']:.3e}")
    print("passed" if result["passed"] else "FAILED")


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    kind = args.device or ("cuda" if cuda else "cpu")
    if (kind == "cuda" and not cuda) or (kind == "cpu" and not args.tiny):
        print(NEEDS_GPU)
        return 2
    device = torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else \
        torch.device("cpu")
    if megatron_unavailable(device):
        print(f"megatron_fsdp_logprobs.py: {megatron_unavailable(device)}")
        return 2
    # the fp32 comparison must be fp32: no TF32 (also forced off for cuBLAS above)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    config = hf_config(args.tiny, args.seq)
    model = build_model(config, device, seed=args.seed)
    batch = rollout_batch(args.rows, args.seq, config.vocab_size, seed=args.seed)
    mask = batch["response_mask"].bool()
    ran = [run_case(backend, dtype, model, batch, args, device) for backend, dtype in CASES]
    del model
    values = {c["case"]: c.pop("values") for c in ran if "values" in c}
    for case in ran:
        if case["case"] in values:
            case["mean_log_prob"] = float(values[case["case"]][mask].mean())
            if REFERENCE in values and case["case"] != REFERENCE:
                d = diff(values[case["case"]], values[REFERENCE], mask)
                case["max_abs_vs_ref"], case["mean_abs_vs_ref"] = d["max_abs"], d["mean_abs"]
    checks = compare(values, mask)
    passed = (all("error" not in c and c["finite"] for c in ran)
              and {"fp32", "bf16"} <= set(checks)
              and all(c["passed"] for c in checks.values()))
    name = torch.cuda.get_device_name(device) if kind == "cuda" else \
        f"cpu ({platform.processor() or platform.machine()})"
    result = {
        "run": run_facts(argv), "device": name, "versions": versions(),
        "tf32": False, "seed": args.seed,
        "model": {"shape": "tiny qwen2" if args.tiny else "Qwen2.5-0.5B width, 4 layers",
                  "hidden": config.hidden_size, "layers": config.num_hidden_layers,
                  "heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads,
                  "intermediate": config.intermediate_size, "vocab": config.vocab_size,
                  "tied_embeddings": bool(config.tie_word_embeddings)},
        "rows": args.rows, "seq": args.seq, "micro": args.micro,
        "response_tokens": int(mask.sum()), "reference": REFERENCE,
        "cases": ran, "checks": checks, "passed": passed,
    }
    report(result)
    for case in ran:
        if "error" in case:
            print(f"\n{case['case']} failed:\n{case['traceback']}")
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
