#!/usr/bin/env bash
# Create .venv and install the four distributions (editable) with the test tools.
# Torch goes first and pinned: a looser range would let pip pick a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==${SIIRL_TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install -q -r requirements-dev.txt \
    -e packages/siirl-data -e packages/siirl-core -e packages/siirl-engine -e packages/siirl-envs
echo "siiRL installed in .venv (activate with: . .venv/bin/activate)"
