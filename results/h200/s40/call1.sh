#!/usr/bin/env bash
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
git log -1 --format=%h > $OUT/code.txt 2>/dev/null
timeout 230 python benchmarks/warm_kernels.py --jobs 12 --batches 128 --dtypes amp --modes train \
  --group="--batches 256 --dtypes amp --modes infer" --group="--batches 128 256 --dtypes bf16 --stages 2 3" > $OUT/warm.txt 2>&1 &
timeout 300 python tmp_call/bmm.py layer $OUT/layer.json > $OUT/layer.txt 2>&1
echo "layer rc $?" >> $OUT/layer.txt
wait
tail -3 $OUT/warm.txt
timeout 240 python tmp_call/bmm.py model $OUT/model.json > $OUT/model.txt 2>&1
echo "model rc $?" >> $OUT/model.txt
tail -30 $OUT/layer.txt; tail -12 $OUT/model.txt
