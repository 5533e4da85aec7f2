#!/usr/bin/env bash
# Session 45 shortest call: layer A/B at 56^2 / 28^2 (default: level-1 wgrad staged; l1_onload=0; cuDNN dw7/dw5),
# bf16 B=128, then the bitwise B=128 check with the time left.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt; git log --oneline -1 | tee -a $R/gpu.txt
timeout 140 python benchmarks/warm_kernels.py --jobs 15 --batches 128 --dtypes bf16 --stages 0 1 --modes train \
  --variants l1_onload=0 > $R/warm.txt 2>&1
echo "warm rc=$? at $((SECONDS-t0)) s"; tail -3 $R/warm.txt
timeout 60 python benchmarks/bench_layer.py --quick --dtypes bf16 --shapes 0 1 --variants l1_onload=0 \
  --impls wtconv_triton_cl wtconv_triton_cl+l1_onload=0 dw7_cl dw5_cl --out $R/layer.json > $R/layer.txt 2>&1
echo "layer rc=$? at $((SECONDS-t0)) s"; grep -v "^#" $R/layer.txt | tail -12
left=$((260 - (SECONDS - t0)))
[ $left -gt 20 ] && timeout $left python results/h200/s44/check_onload.py > $R/check.txt 2>&1; echo "check rc=$? at $((SECONDS-t0)) s"; grep -v Warn $R/check.txt | tail -6
