#!/usr/bin/env bash
# One command for the tests on a fresh machine: venv, package with test extras, ruff, pytest (offline),
# then the real-engine tests (marker `vllm`) with vLLM: in this venv where vLLM is installed (a CUDA
# machine with the vllm extra), else in the CPU environment of scripts/setup_vllm_cpu.sh (.venv-vllm,
# built on first use). CHEXPERCEPT_SKIP_VLLM=1 leaves them out, and says so. Then the tests of Meta's SAM 3
# package (marker `sam3_meta`) in the environment of scripts/setup_sam3_meta.sh (.venv-sam3, built on
# first use: sam3 pins numpy<2.4 and huggingface-hub<2); CHEXPERCEPT_SKIP_SAM3=1 leaves them out, and
# says so. The browser tests (marker `browser`: the HTML report and the review app in headless
# Chromium) need Debian's chromium and chromium-driver: installed with apt-get when this runs as root
# (or with passwordless sudo); otherwise it says what to run and stops before any test.
# CHEXPERCEPT_SKIP_BROWSER=1 leaves them out, and says so. Last, the lmms-eval tests (marker
# `lmms_eval`: the CheXpercept tasks of eval/harnesses/lmms_eval on lmms-eval's runner and vLLM's
# engine) in the environment of scripts/setup_lmms_eval.sh (.venv-lmms-eval, a copy of the vLLM
# environment with lmms-eval, built on first use); CHEXPERCEPT_SKIP_LMMS_EVAL=1 (or
# CHEXPERCEPT_SKIP_VLLM=1) leaves them out, and says so. This is what CI (.ci/run) runs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

MARKERS="not vllm and not sam3_meta and not lmms_eval"
if [ "${CHEXPERCEPT_SKIP_BROWSER:-0}" = "1" ]; then
  MARKERS="$MARKERS and not browser"
else
  bash "$ROOT/scripts/setup_browser.sh"
fi
# the browser tests fail, not skip, when the browser is missing after all
[ "${CHEXPERCEPT_SKIP_BROWSER:-0}" = "1" ] || export CHEXPERCEPT_REQUIRE_BROWSER=1

# ---- Inspect AI (docs/inspect.md) ---------------------------------------------------------------
# inspect-ai installs into the main environment without a clash (pip check clean), so the tests of our
# Inspect task (marker `inspect_ai`, tests/test_inspect.py) run in the main run below, with the
# `inspect` extra (inspect-ai pinned to the version they were written against); here they fail rather
# than skip when it is missing. CHEXPERCEPT_SKIP_INSPECT=1 leaves them out, and says so.
MAIN_EXTRAS="hf,test"
if [ "${CHEXPERCEPT_SKIP_INSPECT:-0}" = "1" ]; then
  MARKERS="$MARKERS and not inspect_ai"
  echo "test.sh: INSPECT TESTS NOT RUN (CHEXPERCEPT_SKIP_INSPECT=1): the Inspect AI task was not tested" >&2
else
  MAIN_EXTRAS="$MAIN_EXTRAS,inspect"
  export CHEXPERCEPT_REQUIRE_INSPECT=1
fi
# ---- end of Inspect AI ---------------------------------------------------------------------------

# shellcheck disable=SC1091
. "$ROOT/scripts/setup_env.sh" "$MAIN_EXTRAS"
ruff check .
ruff format --check .
python -m pytest -n "${PYTEST_WORKERS:-2}" -m "$MARKERS" "$@"
if [ "${CHEXPERCEPT_SKIP_BROWSER:-0}" = "1" ]; then
  echo "test.sh: BROWSER TESTS NOT RUN (CHEXPERCEPT_SKIP_BROWSER=1): the HTML report's viewer and the review app were not tested" >&2
fi

if [ "${CHEXPERCEPT_SKIP_SAM3:-0}" = "1" ]; then
  echo "test.sh: SAM3 META TESTS NOT RUN (CHEXPERCEPT_SKIP_SAM3=1): --sam3-impl meta was not tested" >&2
else
  SAM3_VENV="${CHEXPERCEPT_SAM3_VENV:-$ROOT/.venv-sam3}"
  bash "$ROOT/scripts/setup_sam3_meta.sh" "$SAM3_VENV"
  # exit status 5 = the arguments selected none
  status=0
  "$SAM3_VENV/bin/python" -m pytest -p no:xdist -m sam3_meta "$@" || status=$?
  if [ "$status" != "0" ] && [ "$status" != "5" ]; then
    exit "$status"
  fi
fi

if [ "${CHEXPERCEPT_SKIP_VLLM:-0}" = "1" ]; then
  echo "test.sh: REAL-ENGINE TESTS NOT RUN (CHEXPERCEPT_SKIP_VLLM=1): the vllm backend was not tested" >&2
  echo "test.sh: LMMS-EVAL TESTS NOT RUN (CHEXPERCEPT_SKIP_VLLM=1): the lmms-eval tasks were not tested" >&2
  exit 0
fi
if python -c "import vllm" >/dev/null 2>&1; then
  VLLM_PYTHON="python"
else
  bash "$ROOT/scripts/setup_vllm_cpu.sh" "${CHEXPERCEPT_VLLM_VENV:-$ROOT/.venv-vllm}"
  VLLM_PYTHON="${CHEXPERCEPT_VLLM_VENV:-$ROOT/.venv-vllm}/bin/python"
fi
# one engine at a time (each binds the machine's cores); exit status 5 = the arguments selected none
status=0
"$VLLM_PYTHON" -m pytest -p no:xdist -m vllm "$@" || status=$?
if [ "$status" != "0" ] && [ "$status" != "5" ]; then
  exit "$status"
fi

# --- lmms-eval (eval/harnesses/lmms_eval): its tests in a copy of the vLLM environment above with
# lmms-eval installed (scripts/setup_lmms_eval.sh); exit status 5 = the arguments selected none
if [ "${CHEXPERCEPT_SKIP_LMMS_EVAL:-0}" = "1" ]; then
  echo "test.sh: LMMS-EVAL TESTS NOT RUN (CHEXPERCEPT_SKIP_LMMS_EVAL=1): the lmms-eval tasks were not tested" >&2
else
  VLLM_ENV="$("$VLLM_PYTHON" -c 'import sys; print(sys.prefix)')"
  LMMS_EVAL_VENV="${CHEXPERCEPT_LMMS_EVAL_VENV:-$ROOT/.venv-lmms-eval}"
  bash "$ROOT/scripts/setup_lmms_eval.sh" "$LMMS_EVAL_VENV" "$VLLM_ENV"
  status=0
  "$LMMS_EVAL_VENV/bin/python" -m pytest -p no:xdist -m lmms_eval "$@" || status=$?
  if [ "$status" != "0" ] && [ "$status" != "5" ]; then
    exit "$status"
  fi
fi
