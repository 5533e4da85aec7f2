#!/usr/bin/env bash
# Session 44 short call: layer A/B (level-1 wgrad staged = default, on-load walk l1_stage=0, l1_onload=0, cuDNN),
# bf16 B=128, all stages; bitwise check at B=16.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
timeout 165 python benchmarks/warm_kernels.py --jobs 15 --batches 128 --dtypes bf16 --stages 0 1 --modes train \
  --variants l1_onload=0 l1_stage=0 --group '--batches 128 --dtypes bf16 --stages 2 3 --modes train' > $R/warm.txt 2>&1
echo "warm rc=$? at $((SECONDS-t0)) s"; tail -3 $R/warm.txt
timeout 90 python benchmarks/bench_layer.py --quick --dtypes bf16 --shapes 0 1 2 3 --variants l1_onload=0 l1_stage=0 \
  --impls wtconv_triton_cl wtconv_triton_cl+l1_onload=0 wtconv_triton_cl+l1_stage=0 dw7_cl dw5_cl \
  --out $R/layer.json > $R/layer.txt 2>&1
echo "layer rc=$? at $((SECONDS-t0)) s"; grep -v "^#" $R/layer.txt | tail -24
left=$((300 - (SECONDS - t0)))
[ $left -gt 15 ] && timeout $left python tmp_call/check_onload.py > $R/check.txt 2>&1; echo "check rc=$? at $((SECONDS-t0)) s"; grep -v Warn $R/check.txt | tail -4
