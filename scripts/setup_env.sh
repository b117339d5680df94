#!/usr/bin/env bash
# Create (once) the project's virtual environment in .venv and install the package with the given extras.
# Sourced by scripts/test.sh and scripts/demo.sh. It says what it does while it does it (the first time
# takes a few minutes), and installs again only when the project's requirements or the extras changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CHEXPERCEPT_VENV:-$ROOT/.venv}"
EXTRAS="${1:-hf,test}"
say() { echo "setup: $*" >&2; }
quiet_pip() {  # pip without the local mirrors' "is ignored" lines nor setuptools' editable-install notice
  PYTHONWARNINGS=ignore python -m pip "$@" 2>&1 | { grep -v "is ignored" || true; }
}
if [ ! -x "$VENV/bin/python" ]; then
  say "creating the environment $VENV (the first time takes a few minutes)"
  python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
# what is installed: the project's requirements and the extras asked for (a change installs again)
STAMP="$VENV/.chexpercept-installed-${EXTRAS//,/-}"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" | sha256sum | cut -c1-16)"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]; then
  quiet_pip install -q --upgrade pip
  if ! python -c "import torch" 2>/dev/null; then
    # torch 2.13.0 resolves to the CPU build on the project's CI machines; on a GPU box install the CUDA
    # build of your choice first and this step is skipped.
    say "installing torch 2.13.0 (CPU build, about 900 MB)"
    quiet_pip install -q "torch==2.13.0"
  fi
  say "installing the project with its extras [$EXTRAS] (transformers, datasets, evaluate, ...)"
  quiet_pip install -q -e "$ROOT[$EXTRAS]"
  echo "$WANT" > "$STAMP"
  say "environment ready: $VENV (activate it in a new shell with: . .venv/bin/activate)"
fi
# Everything Hugging Face writes stays inside the project's build area, and nothing goes online.
export HF_HOME="$ROOT/.cache/hf"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_EVALUATE_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
