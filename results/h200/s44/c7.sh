#!/usr/bin/env bash
# Session 44 call: level-1 wgrad staged through dx (l1_stage, default) vs walked on load (l1_stage=0) vs
# l1_onload=0 vs cuDNN, bf16 B=128, all stages; per-kernel profile 56^2/28^2; bitwise check; host probe 14^2/7^2.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
timeout 180 python benchmarks/warm_kernels.py --jobs 15 --batches 128 --dtypes bf16 --stages 0 1 --modes train \
  --variants l1_onload=0 l1_stage=0 --group '--batches 128 --dtypes bf16 --stages 2 3 --modes train' > $R/warm.txt 2>&1; echo "warm rc=$? at $((SECONDS-t0)) s"; tail -3 $R/warm.txt
timeout 100 python benchmarks/bench_layer.py --quick --dtypes bf16 --shapes 0 1 2 3 --variants l1_onload=0 l1_stage=0 \
  --impls wtconv_triton_cl wtconv_triton_cl+l1_onload=0 wtconv_triton_cl+l1_stage=0 dw7_cl dw5_cl \
  --out $R/layer.json > $R/layer.txt 2>&1
echo "layer rc=$? at $((SECONDS-t0)) s"; grep -v "^#" $R/layer.txt | tail -24
timeout 45 python tmp_call/check_onload.py > $R/check.txt 2>&1; echo "check rc=$? at $((SECONDS-t0)) s"; grep -v Warn $R/check.txt | tail -4
for t in ""; do
  timeout 35 python benchmarks/profile_layer.py --shapes 0 1 --dtypes bf16 --cl --iters 20 --tuning $t >> $R/prof.txt 2>&1
done; echo "prof at $((SECONDS-t0)) s"; grep -v Warn $R/prof.txt
left=$((360 - (SECONDS - t0)))
[ $left -gt 30 ] && timeout $left python tmp_call/hostprobe.py 0 1 > $R/host.txt 2>&1; echo "host rc=$? at $((SECONDS-t0)) s"; grep -v Warn $R/host.txt
