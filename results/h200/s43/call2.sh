#!/usr/bin/env bash
# Session 43 call 2 (short, the budget's rest): compile level 1 on load's kernels first (warm_kernels, parallel),
# then the layer A/B at 56^2 / 28^2 (bf16, B=128) and the bitwise check on the GPU.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
timeout 185 python benchmarks/warm_kernels.py --jobs 14 --batches 128 --dtypes bf16 --stages 0 1 --modes train \
  --variants l1_onload=0 > $R/warm.txt 2>&1; echo "warm at $((SECONDS-t0)) s"; grep " s " $R/warm.txt | tail -8
timeout 100 python benchmarks/bench_layer.py --quick --dtypes bf16 --shapes 0 1 --variants l1_onload=0 \
  --impls wtconv_triton_cl wtconv_triton_cl+l1_onload=0 dw7_cl --out $R/layer.json > $R/layer.txt 2>&1
echo "layer at $((SECONDS-t0)) s"; grep -v "^#" $R/layer.txt | tail -12
timeout 30 python tmp_call/check_onload.py > $R/check.txt 2>&1; echo "check at $((SECONDS-t0)) s"; cat $R/check.txt | grep -v Warn
cd $OUT && tar czf r.tgz r && rm -rf r
