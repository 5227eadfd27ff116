#!/usr/bin/env bash
# tools/bench/step_floor.py on a CUDA GPU: siiRL's real training step against its floor
# (one plain transformers generate + one eager forward/backward/AdamW step) on one device.
#
#   tools/gpu/step_floor_gpu.sh [MODEL_DIR] [--rounds N] [key=value ...]
#   OUT=floor_h100.json tools/gpu/step_floor_gpu.sh ~/models/Qwen2.5-0.5B-Instruct
#
# MODEL_DIR: a local HF directory (loading never downloads); default: the built-in tiny
# model. step_floor.py needs no change for CUDA: the worker's engines and rollout run on
# trainer.device (default auto, i.e. CUDA when present; set to cuda here so a GPU that
# goes missing fails loudly instead of falling back to the CPU), and the floor step
# moves its batch to the device of the policy it copies.
#
# Caveats of the figures on a GPU:
# - Clocks are host clocks. The floor's train part ends without torch.cuda.synchronize(),
#   so kernels still queued then are counted in the next round's generate (which waits
#   for them); step totals are right, the floor's generate/train split is approximate.
# - peak_rss_mb is host memory, not GPU memory.
# - siiRL turns activation checkpointing on for CUDA; the floor never recomputes. Add
#   actor_rollout_ref.model.enable_gradient_checkpointing=false for like-for-like.
# - The floor keeps a second copy of the policy and its AdamW state on the GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
python="${PYTHON:-.venv/bin/python}"
model=()
if [[ $# -gt 0 && "$1" != -* && "$1" != *=* ]]; then
    model=(--model "$1")
    shift
fi
exec "$python" tools/bench/step_floor.py ${model[@]+"${model[@]}"} \
    --out "${OUT:-bench_step_floor_gpu.json}" trainer.device=cuda "$@"
