"""Check the megatron engine on a CUDA machine: weight-bridge round trip, log-prob parity
with Hugging Face, and GRPO steps with ``strategy=megatron`` in fp32, in bf16
(``megatron.dtype=bfloat16``: megatron's mixed-precision distributed optimizer on CUDA) and
in fp16 (its dynamic loss scaling) (tokens/s, model FLOPs use); then the same in bf16 for a
mixture-of-experts model (a random Mixtral, 4 experts, top-2, EP 1 on one GPU): bridge
round trip, bf16 log-probs against the HF model's fp32 ones within bf16 rounding, GRPO
steps with finite losses and tokens/s, without and with router replay R2.

    python tools/gpu/check_megatron.py [--steps 6] [--batch 64] [--out megatron_gpu.json]
    python tools/gpu/check_megatron.py --cpu --steps 2 --batch 8   # dry run on the CPU

The same checks run on CPU in CI (tests/engine/megatron/); this script runs them on CUDA
with NCCL, where megatron-core's own kernels and code paths are used (the CPU adapters
switch themselves off when CUDA is available). Needs torch with CUDA, megatron-core
(``pip install "siirl-engine[megatron]"``) and the repo's packages. Prints a table and
writes JSON; record the output in docs/megatron.md with the date and the device.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def tiny_models():
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    common = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                  max_position_embeddings=64)
    return {"llama": LlamaForCausalLM(LlamaConfig(**common)).eval(),
            "qwen2": Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True)).eval()}


def parity_checks(device: torch.device) -> dict:
    from siirl.engine.common.config import typed_config
    from siirl.engine.megatron.bridge import hf_to_megatron, megatron_to_hf
    from siirl.engine.megatron_workers import (
        build_megatron_model,
        init_megatron,
        megatron_logprobs,
    )
    from siirl.engine.models.logprob import response_logprobs

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 parity, not TF32
    torch.backends.cudnn.allow_tf32 = False
    init_megatron(typed_config({"trainer": {"seed": 1}}), seed=1)
    out = {}
    for name, hf in tiny_models().items():
        state = {k: v for k, v in hf.state_dict().items()}
        shard = hf_to_megatron(state, hf.config, 0, 1, 0, 1)
        back = megatron_to_hf([shard], hf.config)
        exact = all(torch.equal(back[k], state[k]) for k in back)
        hf = hf.to(device)
        model = build_megatron_model(hf, device).eval()
        ids = torch.randint(0, 128, (4, 24), device=device)
        mask = torch.ones_like(ids)
        mask[0, :5] = 0  # a left-padded row
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            want, _ = response_logprobs(hf, ids, mask, pos, 8)
            got, _ = megatron_logprobs(model, ids, mask, pos, 8)
        out[name] = {"round_trip_bit_exact": exact,
                     "logprob_max_abs_diff": float((want - got).abs().max())}
    return out


def bf16_tolerance(config, scale: float) -> float:
    """Largest log-prob difference bf16 rounding explains in the worst case: bf16's unit
    roundoff (half its epsilon) per rounding on a value's path (21 per decoder layer: each
    weight met and each op output, plus 5 outside the layers), times the values' scale."""
    roundings = int(config.num_hidden_layers) * 21 + 5
    return torch.finfo(torch.bfloat16).eps / 2 * roundings * max(scale, 1.0)


def save_tiny_moe(directory: Path) -> Path:
    """A random Mixtral (4 experts, top-2) with the built-in tokenizer, in ``directory``."""
    import shutil

    from transformers import MixtralConfig, MixtralForCausalLM

    from siirl.engine.models.loader import tiny_arith_dir

    source = Path(tiny_arith_dir())
    vocab = json.loads((source / "config.json").read_text())
    torch.manual_seed(0)
    model = MixtralForCausalLM(MixtralConfig(
        hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, num_local_experts=4,
        num_experts_per_tok=2, tie_word_embeddings=False,
        **{k: vocab[k] for k in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")}))
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(source / name, directory / name)
    return directory


def moe_parity(model_dir: Path, device: torch.device) -> dict:
    """Bridge round trip of the MoE model, and its bf16 megatron log-probs against the HF
    model's fp32 ones (megatron's parallel state is the one parity_checks initialised)."""
    from transformers import AutoModelForCausalLM

    from siirl.engine.megatron.bridge import hf_to_megatron, megatron_to_hf
    from siirl.engine.megatron_workers import build_megatron_model, megatron_logprobs
    from siirl.engine.models.logprob import response_logprobs

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    state = dict(hf.state_dict())
    back = megatron_to_hf([hf_to_megatron(state, hf.config, 0, 1, 0, 1)], hf.config)
    exact = set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in back)
    hf = hf.to(device)
    model = build_megatron_model(hf, device, False, torch.bfloat16).eval()
    torch.manual_seed(1)
    ids = torch.randint(3, hf.config.vocab_size, (4, 24), device=device)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # a left-padded row
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want, _ = response_logprobs(hf, ids, mask, pos, 8)
        got, _ = megatron_logprobs(model, ids, mask, pos, 8)
    diff = (want.float() - got.float()).abs()
    return {"round_trip_bit_exact": exact, "logprob_max_abs_diff": float(diff.max()),
            "logprob_mean_abs_diff": float(diff.mean()), "finite": bool(got.isfinite().all()),
            "tolerance": bf16_tolerance(hf.config, float(want.abs().max()))}


# bf16 weights and compute with fp32 main weights in megatron's distributed optimizer
BF16 = ("actor_rollout_ref.actor.megatron.dtype=bfloat16",
        "actor_rollout_ref.ref.megatron.dtype=bfloat16")
# fp16: megatron's dynamic loss scaling, from a scale the tiny model's O(1) gradients fit in
# (2**16 would skip the first steps while it backs off)
FP16 = ("actor_rollout_ref.actor.megatron.dtype=float16",
        "actor_rollout_ref.ref.megatron.dtype=float16",
        "+actor_rollout_ref.actor.optim.override_optimizer_config.initial_loss_scale=256")
# router replay R2: the old-log-prob pass's expert choices replayed by the update
R2 = ("actor_rollout_ref.actor.router_replay.mode=R2",)


def grpo_steps(steps: int, device: str, overrides: tuple = (), model_path=None,
               batch: int = 64) -> dict:
    # `python -m` (not the venv's siirl-train script): the GPU image installs the packages
    # into its own Python, without a venv
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [sys.executable, "-m", "siirl.main_dag", "actor_rollout_ref.actor.strategy=megatron",
               f"trainer.device={device}",
               f"trainer.total_training_steps={steps}", "trainer.test_freq=-1",
               "trainer.val_before_train=false", "trainer.save_freq=-1",
               "trainer.logger=[console]", f"data.train_batch_size={batch}",
               f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
               f"trainer.default_local_dir={run_dir}", *overrides,
               *([f"actor_rollout_ref.model.path={model_path}"] if model_path else [])]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        if proc.returncode:
            return {"error": proc.stderr[-2000:]}
        records = [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]
    train = [r for r in records if "perf/actor_tokens_per_s" in r][1:]  # skip warm-up
    tokens_per_s = sum(r["perf/actor_tokens_per_s"] for r in train) / max(len(train), 1)
    from transformers import AutoModelForCausalLM

    from siirl.engine.models.loader import load_model_and_tokenizer
    from siirl.execution.device import model_flops_use

    model = (AutoModelForCausalLM.from_pretrained(model_path) if model_path
             else load_model_and_tokenizer(None)[0])
    # an MoE token meets only its top-k experts: FLOPs count the parameters it uses
    params = sum(p.numel() for p in model.parameters()) - _unused_expert_params(model.config)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    flops = 6.0 * params * tokens_per_s  # forward + backward of the update
    return {"steps": steps, "wall_s": time.perf_counter() - start,
            "actor_tokens_per_s": tokens_per_s, "model_params": params,
            "device_name": name,
            # against the dtype's dense peak; None where no peak is known
            "mfu": model_flops_use(flops, name, "fp32" if BF16[0] not in overrides
                                   and FP16[0] not in overrides else "bf16"),
            "critic/score/mean": [r.get("critic/score/mean") for r in records
                                  if "critic/score/mean" in r],
            "losses_finite": all(math.isfinite(r[k]) for r in records for k in LOSSES if k in r)
            and any(k in r for r in records for k in LOSSES)}


LOSSES = ("actor/pg_loss", "actor/grad_norm")


def _unused_expert_params(config) -> int:
    """Parameters of the experts a token does not visit (0 for a dense model)."""
    experts = getattr(config, "num_local_experts", None)
    if not experts:
        return 0
    per_expert = 3 * config.hidden_size * config.intermediate_size
    return (experts - config.num_experts_per_tok) * per_expert * config.num_hidden_layers


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default="megatron_gpu.json")
    parser.add_argument("--batch", type=int, default=64, help="prompts per GRPO step")
    parser.add_argument("--cpu", action="store_true",
                        help="dry run of this script on the CPU (no GPU figures)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.cpu:
        print("no CUDA device: this script checks the GPU path (CPU checks are in tests/; "
              "--cpu dry-runs the script)")
        return 2
    import megatron.core

    from siirl.execution.device import format_mfu

    device = "cpu" if args.cpu else "cuda"
    report = {"date": time.strftime("%Y-%m-%d"),
              "device": "cpu" if args.cpu else torch.cuda.get_device_name(),
              "torch": torch.__version__, "megatron_core": megatron.core.__version__,
              "parity": parity_checks(torch.device(device))}
    with tempfile.TemporaryDirectory() as tmp:
        moe_dir = save_tiny_moe(Path(tmp) / "tiny_mixtral")
        report["moe_parity_bf16"] = moe_parity(moe_dir, torch.device(device))
        report.update(grpo=grpo_steps(args.steps, device, batch=args.batch),
                      grpo_bf16=grpo_steps(args.steps, device, BF16, batch=args.batch),
                      grpo_fp16=grpo_steps(args.steps, device, FP16, batch=args.batch),
                      grpo_moe_bf16=grpo_steps(args.steps, device, BF16, moe_dir, args.batch),
                      grpo_moe_bf16_r2=grpo_steps(args.steps, device, BF16 + R2, moe_dir,
                                                  args.batch))
    print(f"{'check':<34}{'result':>20}")
    for name, result in report["parity"].items():
        print(f"{name + ' round trip bit-exact':<34}{str(result['round_trip_bit_exact']):>20}")
        print(f"{name + ' log-prob max |diff|':<34}{result['logprob_max_abs_diff']:>20.3g}")
    moe = report["moe_parity_bf16"]
    print(f"{'moe round trip bit-exact':<34}{str(moe['round_trip_bit_exact']):>20}")
    print(f"{'moe bf16 log-prob max |diff|':<34}{moe['logprob_max_abs_diff']:>20.3g}")
    print(f"{'  (bf16 tolerance)':<34}{moe['tolerance']:>20.3g}")
    for key, label in GRPO_RUNS:
        grpo = report[key]
        if "error" in grpo:
            print(f"{label} steps failed: {grpo['error']}")
            continue
        print(f"{label + ' losses finite':<34}{str(grpo['losses_finite']):>20}")
        print(f"{label + ' actor tokens/s':<34}{grpo['actor_tokens_per_s']:>20.0f}")
        mfu = format_mfu(grpo["mfu"], grpo["device_name"])
        print(f"{label + ' model FLOPs use':<34}{mfu:>20}")  # against its dtype's peak
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0 if passed(report) else 1


GRPO_RUNS = (("grpo", "GRPO"), ("grpo_bf16", "GRPO bf16"), ("grpo_fp16", "GRPO fp16"),
             ("grpo_moe_bf16", "GRPO MoE bf16"), ("grpo_moe_bf16_r2", "GRPO MoE bf16 R2"))


def passed(report: dict) -> bool:
    """fp32 parity within 1e-5, the MoE's bf16 parity within bf16 rounding, every GRPO run
    finished with finite losses."""
    moe = report["moe_parity_bf16"]
    return (all(r["round_trip_bit_exact"] and r["logprob_max_abs_diff"] < 1e-5
                for r in report["parity"].values())
            and moe["round_trip_bit_exact"] and moe["finite"]
            and moe["logprob_max_abs_diff"] <= moe["tolerance"]
            and all("error" not in report[k] and report[k]["losses_finite"]
                    for k, _ in GRPO_RUNS))


if __name__ == "__main__":
    sys.exit(main())
