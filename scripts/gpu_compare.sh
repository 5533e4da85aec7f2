#!/usr/bin/env bash
# Side-by-side GPU comparison of this tree with another copy of the repository (e.g. main), in one call:
#   git archive main | tar -x -C .scratch/base_tree      # on the development machine; carry .scratch to the GPU
#   bash scripts/gpu_compare.sh .scratch/base_tree OUTDIR [tests]
# Writes to OUTDIR: both trees' op-file hashes and the versions, the kernel A/B (ab_kernels.py, this tree's
# kernels vs the base tree's), per-layer kernel and wall times of both trees (profile_layer.py), the layer
# benchmark of both (bench_layer.py --quick: time and peak memory against cuDNN), the eager model benchmark of both
# (bench_model.py --no-compile), and with "tests" the GPU suite of this tree first.
# Each step has its own time limit (seconds; override with the environment variables named below).
set -uo pipefail
cd "$(dirname "$0")/.."
base="${1:?usage: gpu_compare.sh BASE_TREE OUTDIR [tests]}"
out="${2:?usage: gpu_compare.sh BASE_TREE OUTDIR [tests]}"
mkdir -p "$out" && out=$(cd "$out" && pwd)
[[ -f "$base/wtconvnext/ops/triton_kernels.py" ]] || { echo "$base is not a copy of the repository" >&2; exit 2; }
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
t0=$(date +%s)
step() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
{ sha256sum wtconvnext/ops/*.py "$base"/wtconvnext/ops/*.py
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$py" -c 'import torch, triton, timm; print("torch", torch.__version__, "triton", triton.__version__, "timm", timm.__version__)'
} > "$out/env_and_code.txt"
if [[ "${3:-}" == tests ]]; then
  step "GPU tests"
  PYTHONPATH=$PWD timeout "${TESTS_S:-400}" "$py" -m pytest -q -rs tests/test_ops_triton.py tests/test_benchmarks.py tests/gpu \
    > "$out/gpu_tests.log" 2>&1; echo "rc=$?" >> "$out/gpu_tests.log"; tail -2 "$out/gpu_tests.log"
fi
step "kernel A/B"
timeout "${AB_S:-150}" "$py" benchmarks/ab_kernels.py --baseline "$base/wtconvnext/ops/triton_kernels.py" \
  --dtypes bf16 fp32 --out "$out/ab_kernels.json" > "$out/ab_kernels.txt" 2>&1
grep -v Warn "$out/ab_kernels.txt" | tail -31
for tree in base current; do
  dir=.; [[ $tree == base ]] && dir="$base"
  step "layer profile, $tree"
  (cd "$dir" && timeout "${PROFILE_S:-90}" "$py" benchmarks/profile_layer.py --shapes 0 1 2 3 --dtypes bf16 fp32 --cl \
    --iters 20) > "$out/profile_$tree.txt" 2>&1
  grep "===\|wall\|total of" "$out/profile_$tree.txt" | paste - - -
done
for tree in base current; do
  dir=.; [[ $tree == base ]] && dir="$base"
  step "layer benchmark (time and peak memory vs cuDNN), $tree"
  (cd "$dir" && timeout "${LAYER_S:-120}" "$py" benchmarks/bench_layer.py --quick --out "$out/layer_$tree.json") \
    > "$out/layer_$tree.txt" 2>&1
  grep "wtconv_triton_cl" "$out/layer_$tree.txt"
done
for tree in base current; do
  dir=.; [[ $tree == base ]] && dir="$base"
  step "model, eager, $tree"
  (cd "$dir" && timeout "${MODEL_S:-150}" "$py" benchmarks/bench_model.py --no-compile --out "$out/model_$tree.json") \
    > "$out/model_$tree.txt" 2>&1
  tail -8 "$out/model_$tree.txt"
done
step done
