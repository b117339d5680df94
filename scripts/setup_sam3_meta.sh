#!/usr/bin/env bash
# An environment for Meta's SAM 3 package (`--deformer sam3 --sam3-impl meta`): torch 2.13.0 (the CPU
# build on the project's machines), this project with its hf and test extras, and the sam3-meta extra
# (sam3==0.1.4, triton, psutil, torchvision). sam3 pins numpy<2.4 and huggingface-hub<2, which is why
# it lives in its own environment rather than in .venv. On a CPU torch, PyPI's torchvision (a CUDA
# build) cannot load its operators; the same import shim as the vLLM CPU environment
# (scripts/vllm_cpu/chexpercept_torchvision_cpu_shim.py) is installed here, for this environment only.
#
#   bash scripts/setup_sam3_meta.sh [VENV]          # default VENV: .venv-sam3
#
# A second call finds everything in place and only checks it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-sam3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PYTHON="${PYTHON:-python3}"

quiet_pip() {  # pip without the local mirrors' "is ignored" lines; pip's exit status (pipefail)
  "$VENV/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored" || true; }
}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  quiet_pip install -q --upgrade pip
fi
if ! "$VENV/bin/python" -c "import chexpercept, sam3" >/dev/null 2>&1; then
  echo "setup_sam3_meta: installing torch==$TORCH_VERSION, sam3 and the project into $VENV (a few minutes)" >&2
  # torch first, so that the project's resolution keeps this build (the CPU one here; on a GPU machine
  # install the CUDA build of your choice into VENV first and this keeps it)
  "$VENV/bin/python" -c "import torch" >/dev/null 2>&1 || quiet_pip install -q "torch==$TORCH_VERSION"
  # Keep that torch: unconstrained, pip would take the newest torchvision and with it a newer (CUDA)
  # torch. The constraint pins torch to the installed version (its local label, e.g. +cpu, kept).
  CONSTRAINTS="$(mktemp)"
  trap 'rm -f "$CONSTRAINTS"' EXIT
  "$VENV/bin/python" -W ignore -c "import torch; print('torch==' + torch.__version__.split('+')[0])" 2>/dev/null > "$CONSTRAINTS"
  quiet_pip install -q -c "$CONSTRAINTS" -e "$ROOT[hf,test,sam3-meta]"
  # torchaudio and torchcodec, if anything pulled them in, are CUDA builds that cannot load beside a CPU
  # torch, and transformers imports torchaudio whenever it is installed; nothing here uses them.
  quiet_pip uninstall -q -y torchaudio torchcodec
fi
# The torchvision shim (see its docstring): active in every process of this environment only.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cp "$ROOT/scripts/vllm_cpu/chexpercept_torchvision_cpu_shim.py" "$SITE/"
echo "import chexpercept_torchvision_cpu_shim" > "$SITE/chexpercept_torchvision_cpu_shim.pth"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md

import sam3  # noqa: F401
import torch
import torchvision
import transformers
from sam3.model_builder import build_sam3_image_model  # noqa: F401

print(
    f"setup_sam3_meta: sam3 {md.version('sam3')}, torch {torch.__version__}, "
    f"torchvision {torchvision.__version__}, transformers {transformers.__version__}"
)
PY
