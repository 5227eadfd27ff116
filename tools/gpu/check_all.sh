#!/usr/bin/env bash
# Every GPU check of siiRL in one command, for one call on a lent GPU machine (one H100 or
# H200, no package registry): install the carried wheels and the four packages without
# network, run each part under its own time limit, record a failing part and go on, print
# one summary table. Each part writes JSON under $OUT (default gpu_check/).
#
#   bash tools/gpu/wheels.sh                 # here, once: .gpu-wheels (carry it)
#   bash tools/gpu/check_all.sh              # there: python3 is the image's CUDA torch
#   bash tools/gpu/check_all.sh --dry-run    # here, on the CPU: every part at tiny size,
#                                            # in a clean venv that has only torch,
#                                            # transformers and peft, like the image
#
# Parts: main_job (the main job on CUDA, FSDP2 + hf rollout, 100 steps), train_mfu (FSDP
# and Megatron bf16 on the 0.5B-shaped random model), step_floor (the step against its
# floor), megatron (bridge, log-prob parity and GRPO steps on CUDA), logprobs (the Megatron
# TP1 actor against FSDP on the same batch), offload (FSDP2 offload, megatron offload),
# async_sync (asynchronous training's NCCL weight channel and a two-GPU run; 2+ GPUs).
# Results: docs/gpu_benchmarks.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
dry=0
[[ "${1:-}" == "--dry-run" ]] && dry=1
out=${OUT:-$repo/gpu_check}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d /tmp/siirl-gpu-check.XXXXXX)
log=$out/check_all.log
: > "$log"
say() { echo "$*" | tee -a "$log"; }

if (( dry )); then
    # The image's stand-in: a fresh venv with torch, transformers (the image's version) and
    # peft, plus the image's packages siiRL imports (tools/gpu/image_packages.txt lists them
    # all); everything else comes from wheels.sh's set for this Python, as on the GPU.
    venv=${SIIRL_DRY_VENV:-/tmp/siirl-gpu-dry-venv}
    if [[ ! -x "$venv/bin/python" ]]; then
        say "dry run: making $venv (torch, transformers 5.17.0, peft and the image's packages)"
        python3 -m venv "$venv" && "$venv/bin/python" -m pip install -q \
            torch==2.13.0 transformers==5.17.0 peft pyarrow psutil matplotlib cloudpickle \
            accelerate tabulate einops pyyaml tqdm >>"$log" 2>&1 || { say "venv failed"; exit 1; }
    fi
    python=$venv/bin/python
    wheels=$work/wheels
    pyver=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    bash tools/gpu/wheels.sh --python "$pyver" --dest "$wheels" 2>&1 | tee -a "$log"
else
    python=${PYTHON:-python3}
    wheels=${SIIRL_GPU_WHEELS:-$repo/.gpu-wheels}
fi

# --- install: carried wheels and the four packages, no index, into one target folder
site=$work/site
start=$SECONDS
if ! "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --no-build-isolation --target "$site" "$wheels"/*.whl packages/siirl-data \
        packages/siirl-core packages/siirl-engine packages/siirl-envs >>"$log" 2>&1; then
    say "install failed (see $log)"
    tail -20 "$log"
    exit 1
fi
export PYTHONPATH=$site PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
say "installed the wheels and siirl-{data,core,engine,envs} into $site in $((SECONDS - start)) s"
"$python" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', \
torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '', \
'transformers', transformers.__version__)" 2>&1 | tee -a "$log"

# --- the parts: name, time limit (s), command; each writes $out/<name>.json
status_file=$work/status.tsv
: > "$status_file"
part() {
    local name=$1 limit=$2
    shift 2
    local shown="$*"
    say "=== $name (limit ${limit} s): ${shown:0:160}"
    local begin=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - begin))" >> "$status_file"
    say "=== $name: exit $rc after $((SECONDS - begin)) s"
}
export python work out
main_job() {  # the main job, then its summary (validation gain, step times)
    local steps=$1 device=$2 begin=$SECONDS
    "$python" -m siirl.main_dag trainer.device="$device" trainer.total_training_steps="$steps" \
        trainer.default_local_dir="$work/main_job" trainer.resume_mode=disable \
        trainer.test_freq=$(( steps / 2 )) || return $?
    "$python" tools/bench/run_summary.py "$work/main_job" --wall-s $((SECONDS - begin)) \
        --json "$out/main_job.json"
}
if (( dry )); then
    part main_job 300 bash -c "$(declare -f main_job); main_job 4 cpu"
    part train_mfu 300 "$python" tools/gpu/train_mfu.py --tiny --device cpu --steps 2 \
        --seq 64 --rows 2 --profile 12 --out "$out/train_mfu.json"
    part step_floor 300 "$python" tools/bench/step_floor.py --rounds 2 \
        --out "$out/step_floor.json" trainer.device=cpu
    part megatron 600 "$python" tools/gpu/check_megatron.py --cpu --steps 2 --batch 8 \
        --out "$out/megatron.json"
    part logprobs 300 "$python" tools/gpu/megatron_fsdp_logprobs.py --tiny --device cpu \
        --out "$out/logprobs.json"
    part offload 300 "$python" tools/gpu/check_offload.py --cpu --out "$out/offload.json"
    part async_sync 300 "$python" tools/gpu/async_weight_sync_check.py --cpu \
        --out "$out/async_sync.json"
else
    part main_job 110 bash -c "$(declare -f main_job); main_job 100 cuda"
    part train_mfu 130 "$python" tools/gpu/train_mfu.py --profile 12 --out "$out/train_mfu.json"
    part step_floor 60 env PYTHON="$python" OUT="$out/step_floor.json" \
        bash tools/gpu/step_floor_gpu.sh --rounds 6
    part megatron 180 "$python" tools/gpu/check_megatron.py --out "$out/megatron.json"
    part logprobs 45 "$python" tools/gpu/megatron_fsdp_logprobs.py --out "$out/logprobs.json"
    part offload 240 "$python" tools/gpu/check_offload.py --out "$out/offload.json"
    part async_sync 240 "$python" tools/gpu/async_weight_sync_check.py \
        --out "$out/async_sync.json"
fi
"$python" tools/gpu/check_summary.py "$status_file" "$out" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
rm -rf "$work"
exit "$rc"
