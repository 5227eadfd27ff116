#!/usr/bin/env bash
# The sglang rollout against a real SGLang server on a CUDA GPU: after a weight sync from
# the fsdp actor, SGLang's greedy responses equal the hf rollout's and its log-probs the
# actor's (tests/engine/rollout/test_sglang_server.py, marker `sglang`), plus the protocol
# tests against the fake server, which run everywhere.
#
#   tools/gpu/sglang_check.sh [pytest args ...]
#   PYTHON=.venv-sglang/bin/python tools/gpu/sglang_check.sh -x
#
# Needs a venv with SGLang (CUDA only; it pins its own torch): e.g.
#   python -m venv .venv-sglang && .venv-sglang/bin/pip install -e packages/siirl-data \
#       -e packages/siirl-core -e "packages/siirl-engine[sglang]" -e packages/siirl-envs pytest
# The real-server test is skipped, with the reason, where sglang is not importable or no
# GPU is visible; this script fails instead, so a GPU run cannot pass without it.
# Record the outcome (date, device, SGLang version) in docs/rollout_engines.md ("The vllm rollout").
set -euo pipefail
cd "$(dirname "$0")/../.."
python="${PYTHON:-.venv/bin/python}"
"$python" - <<'PY'
import sys

import torch

try:
    import sglang
except ImportError as exc:
    sys.exit(f"sglang is not importable ({exc}): pip install \"siirl-engine[sglang]\"")
if not torch.cuda.is_available():
    sys.exit("no CUDA GPU is visible: SGLang is CUDA-only")
print(f"SGLang {sglang.__version__}, torch {torch.__version__}, "
      f"{torch.cuda.get_device_name(0)}", flush=True)
PY
exec "$python" -m pytest -q -rs tests/engine/rollout/test_sglang_server.py "$@"
