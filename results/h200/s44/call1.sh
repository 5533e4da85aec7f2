#!/usr/bin/env bash
# Session 44 call 1: compile stage 0-3 bf16 train kernels (default = level 1 on load, and l1_onload=0), then the
# layer A/B (bf16, B=128) vs cuDNN dw7/dw5 channels_last, and the bitwise on-load check on the GPU.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
python -c "import torch,triton;print(torch.__version__,triton.__version__)"
timeout 270 python benchmarks/warm_kernels.py --jobs 15 --batches 128 --dtypes bf16 --stages 0 1 2 3 --modes train \
  --variants l1_onload=0 > $R/warm.txt 2>&1; echo "warm rc=$? at $((SECONDS-t0)) s"; tail -12 $R/warm.txt
timeout 170 python benchmarks/bench_layer.py --quick --dtypes bf16 --shapes 0 1 2 3 --variants l1_onload=0 \
  --impls wtconv_triton_cl wtconv_triton_cl+l1_onload=0 dw7_cl dw5_cl --out $R/layer.json > $R/layer.txt 2>&1
echo "layer rc=$? at $((SECONDS-t0)) s"; grep -v "^#" $R/layer.txt | tail -20
timeout 60 python tmp_call/check_onload.py > $R/check.txt 2>&1; echo "check rc=$? at $((SECONDS-t0)) s"; grep -v Warn $R/check.txt | tail
