#!/usr/bin/env bash
# lmms-eval's environment for the CheXpercept tasks (eval/harnesses/lmms_eval, docs/lmms-eval.md): a
# copy of the vLLM environment with lmms-eval beside vLLM.
#
#   bash scripts/setup_lmms_eval.sh [VENV] [BASE]     # defaults: .venv-lmms-eval, .venv-vllm
#
# BASE is an environment where `import vllm` works: .venv-vllm of scripts/setup_vllm_cpu.sh (built
# here when missing), or on a CUDA machine the one with the project's vllm extra. It is copied with
# hard links (seconds, next to no disk) rather than changed, so the real-engine tests keep the
# environment they were built in. Into the copy goes lmms-eval==$LMMS_EVAL_VERSION with the packages
# its evaluation of these tasks imports, every package already there kept at its version (pip
# constraints) except filelock: lmms-eval 0.7.3 imports filelock._api, which filelock 4 removed.
# lmms-eval's full requirements (pip install lmms-eval) add about 60 packages (wandb,
# sentence-transformers, yt-dlp, pre-commit...) that these tasks never import, and wandb's
# protobuf<7 clashes with vLLM's protobuf 7 (installing them all took 3.4 minutes on a busy 2-core
# machine). A second call finds everything in place (a few seconds).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-lmms-eval}"
BASE="${2:-$ROOT/.venv-vllm}"
# keep in step with LMMS_EVAL_VERSION in eval/harnesses/lmms_eval/__init__.py
LMMS_EVAL_VERSION="${LMMS_EVAL_VERSION:-0.7.3}"
# what lmms-eval 0.7.3's evaluation of these tasks imports, at the versions tested (their own
# requirements come with them)
REQUIREMENTS=(
  "filelock<4"
  "av==15.1.0"
  "nltk==3.10.4"
  "numexpr==2.14.2"
  "pytablewriter==0.38.0"
  "sacrebleu==2.6.0"
  "scikit-learn==1.9.1"
  "tenacity==9.2.1"
  "zstandard==0.25.0"
  "qwen-vl-utils==0.0.14"
)

quiet_pip() {  # pip without the local mirrors' "is ignored" lines; pip's exit status (pipefail)
  "$VENV/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored" || true; }
}

installed() {  # lmms-eval at the pinned version beside vLLM and this project (no imports: quick)
  "$VENV/bin/python" - "$LMMS_EVAL_VERSION" >/dev/null 2>&1 <<'PY'
import sys
from importlib.metadata import version
from importlib.util import find_spec

sys.exit(version("lmms_eval") != sys.argv[1] or not find_spec("vllm") or not find_spec("chexpercept"))
PY
}

if [ -x "$VENV/bin/python" ] && installed; then
  echo "setup_lmms_eval: lmms-eval $LMMS_EVAL_VERSION in place in $VENV" >&2
  exit 0
fi
if [ ! -x "$BASE/bin/python" ]; then
  bash "$ROOT/scripts/setup_vllm_cpu.sh" "$BASE"
fi
BASE="$(cd "$BASE" && pwd)"
echo "setup_lmms_eval: copying $BASE to $VENV and installing lmms-eval==$LMMS_EVAL_VERSION (about a minute)" >&2
rm -rf "$VENV"
cp -al "$BASE" "$VENV" 2>/dev/null || { rm -rf "$VENV"; cp -a "$BASE" "$VENV"; }
VENV="$(cd "$VENV" && pwd)"
# the copy's scripts (activate, pip's and the other entry points) name the environment they were made
# in: BASE, or the folder BASE was itself copied from; sed writes new files, so the hard-linked
# originals are left as they are
MADE_IN="$(sed -n 's/^VIRTUAL_ENV="\(.*\)"$/\1/p' "$BASE/bin/activate" | head -n 1)"
for OLD in "$BASE" ${MADE_IN:+"$MADE_IN"}; do
  # grep finds nothing the second time when BASE was made where it lies (MADE_IN = BASE): not an error
  { grep -rlI --null -F "$OLD" "$VENV/bin" || true; } | xargs -0 -r sed -i "s#$OLD/#$VENV/#g; s#\"$OLD\"#\"$VENV\"#g"
done

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
"$VENV/bin/python" -m pip freeze --exclude-editable 2>/dev/null | grep -v -i -E "^(filelock|chexpercept)[=@ ]" > "$CONSTRAINTS"
quiet_pip install -q --no-deps "lmms-eval==$LMMS_EVAL_VERSION"
quiet_pip install -q --no-warn-conflicts -c "$CONSTRAINTS" "${REQUIREMENTS[@]}"
"$VENV/bin/python" - "$VENV" <<'PY'
import sys
from importlib.metadata import version

import lmms_eval.evaluator  # noqa: F401
import lmms_eval.models.chat.vllm  # noqa: F401
import vllm

print(f"setup_lmms_eval: lmms-eval {version('lmms_eval')} beside vllm {vllm.__version__} in {sys.argv[1]}")
PY
