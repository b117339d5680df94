#!/usr/bin/env bash
# The main job on phantom data, on a fresh machine: venv, install, synthesize a phantom bundle, load it
# with load_dataset and print its composition, run the baselines and a tiny local model through the
# benchmark's conversations, score them and build the HTML report. Output goes to ./demo (DEMO_DIR).
# Phantom data tests software; its scores say nothing about any model.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
. "$ROOT/scripts/setup_env.sh" "hf,report"
DEMO_DIR="${DEMO_DIR:-$ROOT/demo}"
PER_CELL="${PER_CELL:-2}"
rm -rf "$DEMO_DIR/bundle" "$DEMO_DIR/runs" "$DEMO_DIR/report"

echo "== 1. phantom release bundle (synth-sources + generate, morphology deformer)"
chexpercept synth --output-dir "$DEMO_DIR/bundle" --per-cell "$PER_CELL" --seed 0 --num-proc 2

echo "== 2. validate it, count what load_dataset gives, and load it with load_dataset"
chexpercept validate "$DEMO_DIR/bundle"
chexpercept inspect "$DEMO_DIR/bundle"
python -c "import sys; from datasets import load_dataset; print(load_dataset('chexpercept', data_dir=sys.argv[1]))" \
  "$DEMO_DIR/bundle"

echo "== 3. baselines and a tiny random VLM through the conversations (implicit oracle)"
for model in baseline:oracle baseline:prior baseline:random; do
  python eval/run.py --data-dir "$DEMO_DIR/bundle" --model "$model" --oracle implicit \
    --output-dir "$DEMO_DIR/runs" --no-progress
done
[ -f "$DEMO_DIR/tiny-vlm/config.json" ] || chexpercept make-tiny-model --output-dir "$DEMO_DIR/tiny-vlm"
python eval/run.py --data-dir "$DEMO_DIR/bundle" --model "$DEMO_DIR/tiny-vlm" --backend transformers \
  --oracle implicit --max-tokens 8 --output-dir "$DEMO_DIR/runs" --no-progress
echo "(the tiny model's WARNING is expected: random weights never write 'Answer: <n>' in 8 tokens)"

echo "== 4. report (tables, plots, HTML case viewer)"
chexpercept report --results "$DEMO_DIR/runs" --output-dir "$DEMO_DIR/report"
