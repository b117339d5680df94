#!/usr/bin/env bash
# The main job on phantom data, on a fresh machine: venv, install, write a bundle, load it with
# load_dataset and print its composition. Output goes to ./demo (override with DEMO_DIR).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
. "$ROOT/scripts/setup_env.sh" "hf,report"
DEMO_DIR="${DEMO_DIR:-$ROOT/demo}"
PER_CELL="${PER_CELL:-2}"
rm -rf "$DEMO_DIR/bundle"
python -c "from chexpercept.testing import write_fixture_bundle as w; w('$DEMO_DIR/bundle', per_cell=$PER_CELL, image_size=256)"
chexpercept validate "$DEMO_DIR/bundle"
chexpercept inspect "$DEMO_DIR/bundle"
