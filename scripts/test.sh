#!/usr/bin/env bash
# One command for the tests on a fresh machine: venv, package with test extras, ruff, pytest (offline).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
. "$ROOT/scripts/setup_env.sh" "hf,test"
ruff check .
ruff format --check .
python -m pytest -n "${PYTEST_WORKERS:-2}" "$@"
