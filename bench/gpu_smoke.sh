#!/usr/bin/env bash
# GPU smoke test of the vllm backend: a tiny random Gemma3 VLM (built locally, no download) over a
# phantom bundle, run by the batched engine, then the same cases one conversation at a time.
# Prints cases per second for both. Needs a CUDA GPU and vLLM in the active environment
# (pip install -e ".[vllm]"). Phantom data and random weights: this checks software, not models.
#
#   bash bench/gpu_smoke.sh                 # 10 cases per (lesion, path) cell = 210 cases
#   PER_CELL=3 bash bench/gpu_smoke.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
WORK="${WORK:-$(mktemp -d /tmp/chexpercept-gpu-smoke-XXXXXX)}"
PER_CELL="${PER_CELL:-10}"
export HF_HOME="${HF_HOME:-$WORK/hf}"

python - <<'EOF'
import sys
try:
    import vllm
    import torch
except ImportError as e:
    sys.exit(f"gpu_smoke: vLLM is not installed here ({e}); pip install -e '.[vllm]' on a CUDA machine")
if not torch.cuda.is_available():
    sys.exit("gpu_smoke: no CUDA GPU visible")
print(f"vllm {vllm.__version__}, torch {torch.__version__}, GPU: {torch.cuda.get_device_name(0)}")
EOF

chexpercept make-tiny-model --out "$WORK/tiny-vlm" --profile gpu
python -c "from chexpercept.testing import write_fixture_bundle as w; w('$WORK/bundle', per_cell=$PER_CELL, image_size=512)"
chexpercept validate "$WORK/bundle"

ENGINE='{"max_model_len": 4096, "enable_prefix_caching": true}'
run() {  # run NAME [extra args...]: one run of the vllm backend, prints cases/s from run.json
  local name="$1"; shift
  local start end
  start=$(date +%s.%N)
  python eval/run.py --data-dir "$WORK/bundle" --model "$WORK/tiny-vlm" --backend vllm \
    --run-name "$name" --output-dir "$WORK/runs" --max-tokens 16 --gpu-memory-utilization 0.3 \
    --engine-args "$ENGINE" --no-progress "$@"
  end=$(date +%s.%N)
  python - "$WORK/runs/$name/oracle_implicit" "$start" "$end" <<'EOF'
import json, sys
folder, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
info = json.load(open(f"{folder}/run.json"))
s = info["last_session"]
print(f"{folder}: {s['cases']} cases, {s['model_calls_main_process']} model calls in "
      f"{s['batches_main_process']} batches; engine {s['seconds_main_process']:.1f} s = "
      f"{s['cases'] / s['seconds_main_process']:.2f} cases/s (whole command {end - start:.1f} s)")
EOF
}

run batched --batch-size 256
run one-at-a-time --batch-size 1 --limit 42
echo "results under $WORK/runs"
