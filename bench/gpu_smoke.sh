#!/usr/bin/env bash
# GPU smoke test of the runner, on tiny random models (built locally, no download) over a phantom
# bundle. Phantom data and random weights: this checks software and speed, never models.
#
# * always: the transformers backend on the GPU in bfloat16, turn cache on (its setup check decides
#   whether it is used, and run.json says why), batched, then one conversation at a time;
# * where vLLM is installed: the vllm backend, batched, then one conversation at a time.
#
# * where vLLM is installed, the runner's own work against the engine (issue 31;
#   bench/runner_overlap.py, the same table as bench/RESULTS.md's "The runner's own work"): ours
#   against raw LLM.chat waves (images decoded beforehand, and decoded inside the timing) and the
#   reference's one-call-at-a-time runner, alternated on one engine, with wall time, iterations, the
#   engine's idle seconds and peak memory; the same with answers of varied lengths; then the whole release size (FULL_PER_CELL=100: 2,100
#   cases) through the run command, timed: how long the release takes on this GPU with this model.
#
# Prints cases per second of every run and the transformers backend's turn-cache decision.
# MODEL=/path/to/a/small/vlm uses that model (a local folder) instead of the tiny random Gemma 3
# for the vLLM parts. About 10 minutes on one H200 with the defaults (not run yet: no GPU lent).
#
#   bash bench/gpu_smoke.sh                 # 10 cases per (lesion, path) cell = 210 cases
#   PER_CELL=3 bash bench/gpu_smoke.sh
#   GPU_SMOKE_ALLOW_CPU=1 PER_CELL=1 bash bench/gpu_smoke.sh   # try the script itself on a CPU
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
WORK="${WORK:-$(mktemp -d /tmp/chexpercept-gpu-smoke-XXXXXX)}"
PER_CELL="${PER_CELL:-10}"
export HF_HOME="${HF_HOME:-$WORK/hf}"

if ! python -c "import chexpercept.eval" >/dev/null 2>&1; then
  # a machine with torch and transformers but without the project: install it without fetching anything
  python -m pip install -q --no-deps --no-build-isolation -e . || {
    echo "gpu_smoke: cannot install the project here (pip install -e .)" >&2; exit 1; }
fi
HAS_VLLM="$(python - <<'EOF'
import os, sys
import torch
import transformers
if not torch.cuda.is_available() and os.environ.get("GPU_SMOKE_ALLOW_CPU") != "1":
    sys.exit("gpu_smoke: no CUDA GPU visible (GPU_SMOKE_ALLOW_CPU=1 runs it on the CPU)")
try:
    import vllm
    has = f"vllm {vllm.__version__}"
except ImportError:
    has = ""
device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
print(f"torch {torch.__version__}, transformers {transformers.__version__}, {has or 'no vLLM'}, {device}", file=sys.stderr)
print("yes" if has else "")
EOF
)"

chexpercept make-tiny-model --output-dir "$WORK/tiny-vlm" --arch gemma3
python -c "from chexpercept.testing import write_fixture_bundle as w; w('$WORK/bundle', per_cell=$PER_CELL, image_size=512)"
chexpercept validate "$WORK/bundle"

report() {  # report FOLDER START END: cases/s from run.json, and the backend's notes
  python - "$@" <<'EOF'
import json, sys
folder, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
info = json.load(open(f"{folder}/run.json"))
s = info["last_session"]
settings = info.get("backend_settings", {})
print(f"{folder}: {s['cases']} cases, {s['model_calls_main_process']} model calls in "
      f"{s['rounds_main_process']} rounds; engine {s['seconds_main_process']:.1f} s = "
      f"{s['cases'] / s['seconds_main_process']:.2f} cases/s (whole command {end - start:.1f} s)")
for key in ("turn_cache", "dtype", "device", "platform", "prefix_cache", "schedule"):
    if key in settings:
        print(f"  {key}: {settings[key]}")
EOF
}

run() {  # run BACKEND NAME [extra args...]
  local backend="$1" name="$2"; shift 2
  local start end
  start=$(date +%s.%N)
  python eval/run.py --data-dir "$WORK/bundle" --model "$WORK/tiny-vlm" --backend "$backend" \
    --run-name "$name" --output-dir "$WORK/runs" --max-tokens 16 --no-progress --no-score "$@"
  end=$(date +%s.%N)
  report "$WORK/runs/$name/oracle_implicit" "$start" "$end"
}

DTYPE="bfloat16"
run transformers transformers-batched --dtype "$DTYPE" --batch-size 64
run transformers transformers-one-at-a-time --dtype "$DTYPE" --batch-size 1 --limit 42
if [ -n "$HAS_VLLM" ]; then
  ENGINE='{"max_model_len": 4096, "enable_prefix_caching": true}'
  run vllm vllm-batched --batch-size 256 --gpu-memory-utilization 0.3 --engine-args "$ENGINE"
  run vllm vllm-one-at-a-time --batch-size 1 --limit 42 --gpu-memory-utilization 0.3 --engine-args "$ENGINE"
fi
if [ -n "$HAS_VLLM" ]; then
  VLLM_MODEL="${MODEL:-$WORK/tiny-vlm}"
  GPU_ENGINE='{"gpu_memory_utilization": 0.3, "max_model_len": 4096, "enable_prefix_caching": true}'
  # phantom releases with 1024x1024 radiograph-like X-rays, as on the CPU (bench/RESULTS.md)
  chexpercept synth --output-dir "$WORK/xray" --per-cell "${OVERLAP_PER_CELL:-4}" --num-proc "$(nproc)" --no-progress
  # the table: ours vs raw LLM.chat waves and the reference runner (84 cases by default)
  python bench/runner_overlap.py --vllm --bundle "$WORK/xray" --model "$VLLM_MODEL" \
    --engine-args "$GPU_ENGINE" --repeat "${OVERLAP_REPEAT:-2}" --json "$WORK/overlap.json" >/dev/null
  python - "$WORK/overlap.json" <<'EOF'
import json, sys
sys.path.insert(0, "bench")
from runner_overlap import markdown
print(markdown(json.load(open(sys.argv[1])), "bench/gpu_smoke.sh"))
EOF
  # the same with answers of varied lengths (as real ones): where a continuous runner beats the waves
  python bench/runner_overlap.py --vllm --bundle "$WORK/xray" --model "$VLLM_MODEL" --varied-lengths \
    --modes ours "waves, decoded" "waves, decoding" --memory-batch-sizes \
    --engine-args "$GPU_ENGINE" --repeat "${OVERLAP_REPEAT:-2}" --json "$WORK/overlap-varied.json" >/dev/null
  python - "$WORK/overlap-varied.json" <<'EOF'
import json, sys
sys.path.insert(0, "bench")
from runner_overlap import markdown
print(markdown(json.load(open(sys.argv[1])), "bench/gpu_smoke.sh (--varied-lengths)"))
EOF
  # the release's size, end to end through the command (answers of up to 32 tokens)
  FULL_PER_CELL="${FULL_PER_CELL:-100}"
  chexpercept synth --output-dir "$WORK/full" --per-cell "$FULL_PER_CELL" --num-proc "$(nproc)" --no-progress
  start=$(date +%s.%N)
  python eval/run.py --data-dir "$WORK/full" --model "$VLLM_MODEL" --backend vllm --run-name vllm-release \
    --output-dir "$WORK/runs" --max-tokens 32 --no-progress --no-score --batch-size 256 \
    --oracle implicit --engine-args "$GPU_ENGINE"
  end=$(date +%s.%N)
  report "$WORK/runs/vllm-release/oracle_implicit" "$start" "$end"
fi
echo "results under $WORK/runs"
