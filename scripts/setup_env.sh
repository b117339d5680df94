#!/usr/bin/env bash
# Create (once) the project's virtual environment in .venv and install the package with the given extras.
# Sourced by scripts/test.sh and scripts/demo.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CHEXPERCEPT_VENV:-$ROOT/.venv}"
EXTRAS="${1:-hf,test}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
if ! python -c "import torch" 2>/dev/null; then
  # torch 2.13.0 resolves to the CPU build on the project's CI machines; on a GPU box install the CUDA
  # build of your choice first and this step is skipped.
  python -m pip install -q "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
fi
python -m pip install -q -e "$ROOT[$EXTRAS]" 2>&1 | grep -v "is ignored" || true
# Everything Hugging Face writes stays inside the project's build area, and nothing goes online.
export HF_HOME="$ROOT/.cache/hf"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_EVALUATE_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
