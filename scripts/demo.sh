#!/usr/bin/env bash
# The main job on phantom data, on a fresh machine: venv, install, synthesize a phantom bundle, load it
# with load_dataset and print its composition. Output goes to ./demo (override with DEMO_DIR).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
. "$ROOT/scripts/setup_env.sh" "hf,report"
DEMO_DIR="${DEMO_DIR:-$ROOT/demo}"
PER_CELL="${PER_CELL:-2}"
rm -rf "$DEMO_DIR/bundle"
chexpercept synth --out "$DEMO_DIR/bundle" --per-cell "$PER_CELL" --seed 0 --num-proc 2
chexpercept validate "$DEMO_DIR/bundle"
chexpercept inspect "$DEMO_DIR/bundle"
