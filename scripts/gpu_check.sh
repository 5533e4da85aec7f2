#!/usr/bin/env bash
# GPU tests and benchmarks in one go (for a CUDA machine with torch, triton, timm, safetensors and pytest installed).
#   bash scripts/gpu_check.sh [OUTDIR] [tune] [tests|layer|model|all ...]
# Writes the test log and the benchmark JSON / tables under OUTDIR (default results/gpu). "tune" first sweeps the
# kernels' launch shapes and runs everything after it with the best (WTCONVNEXT_TUNING=OUTDIR/tuned.json).
# LAYER_ARGS / MODEL_ARGS pass extra flags to the benchmarks (e.g. LAYER_ARGS=--quick MODEL_ARGS=--compile-amp-only).
# The golden data must be reachable: ../shared beside the repo, or WTCONVNEXT_SHARED=<dir holding golden/>.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/gpu}"; shift || true
what="${*:-all}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
"$py" -c 'import torch, triton, timm; print("torch", torch.__version__, "triton", triton.__version__, "timm", timm.__version__)' | tee -a "$out/gpu.txt"
if [[ "$what" == *tune* ]]; then
  "$py" benchmarks/tune_tiles.py --out "$out/tune.json" --best-out "$out/tuned.json" 2>&1 | tee "$out/tune.txt" || rc=1
  [[ -f "$out/tuned.json" ]] && export WTCONVNEXT_TUNING="$out/tuned.json"
fi
if [[ "$what" == *tests* || "$what" == all ]]; then
  "$py" -m pytest -q -rs tests/test_ops_triton.py tests/test_benchmarks.py tests/gpu 2>&1 | tee "$out/gpu_tests.log" || rc=1
fi
if [[ "$what" == *layer* || "$what" == all ]]; then
  "$py" benchmarks/bench_layer.py ${LAYER_ARGS:-} --out "$out/layer.json" 2>&1 | tee "$out/bench_layer.txt" || rc=1
fi
if [[ "$what" == *model* || "$what" == all ]]; then
  "$py" benchmarks/bench_model.py ${MODEL_ARGS:-} --out "$out/model.json" 2>&1 | tee "$out/bench_model.txt" || rc=1
fi
exit $rc
