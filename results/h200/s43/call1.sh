#!/usr/bin/env bash
# Session 43 call: level 1 on load (TUNING l1_onload) on the GPU: its tests and the golden tests first (beside the
# benchmarks' compiles), the layer table against l1_onload=0 and cuDNN (bf16 all stage shapes, fp32 at 56^2 / 28^2,
# peak memory), kernel CUDA times, host time per f+b with and without CUDA-graph replay, then the whole suite.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
DL=${DL:-540}
R=$OUT/r; mkdir -p $R
git log --oneline -1 > $R/commit.txt 2>/dev/null
t0=$SECONDS
left() { echo $((DL - 25 - SECONDS + t0)); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
timeout 170 python benchmarks/warm_kernels.py --jobs 10 --batches 128 --dtypes bf16 --stages 0 1 --modes train \
  --variants l1_onload=0 --group="--batches 128 --dtypes fp32 --stages 0 1 --modes train" > $R/warm.txt 2>&1 &
wp=$!
LIMIT=160 bash scripts/gpu_tests.sh $R/t1 6 -k "level1_on_load or analysis_without or golden or kernels_compile or launch_shapes" > /dev/null
grep -E " passed| failed" $R/t1/gpu_tests.log | tail -2
grep -E "(FAILED|ERROR) tests" $R/t1/gpu_tests.log | sed "s/^.*\] //" | sort -u | head -20
wait $wp; echo "tests1+warm at $((SECONDS-t0)) s"; tail -2 $R/warm.txt
timeout 100 python benchmarks/bench_layer.py --quick --dtypes bf16 --shapes 0 1 2 3 --variants l1_onload=0 \
  --impls wtconv_triton_cl wtconv_triton_cl+l1_onload=0 dw7_cl dw7_nchw dw5_cl --out $R/layer.json > $R/layer.txt 2>&1
echo "layer at $((SECONDS-t0)) s"; grep -v "^#" $R/layer.txt | tail -30
timeout 60 python benchmarks/bench_layer.py --quick --dtypes fp32 --shapes 0 1 --variants l1_onload=0 \
  --impls wtconv_triton_cl wtconv_triton_cl+l1_onload=0 dw7_cl dw7_nchw --out $R/layer_fp32.json > $R/layer_fp32.txt 2>&1
echo "layer fp32 at $((SECONDS-t0)) s"; grep -v "^#" $R/layer_fp32.txt | tail -12
timeout 75 python tmp_call/hostprobe.py 0 1 > $R/hostprobe.txt 2>&1; echo "probe at $((SECONDS-t0)) s"; grep -v Warn $R/hostprobe.txt
l=$(left); echo "tests limit $l"
if [ $l -gt 60 ]; then
  LIMIT=$l bash scripts/gpu_tests.sh $R/tests 14 -k "not (level1_on_load or analysis_without or golden or kernels_compile or launch_shapes)" > /dev/null
  grep -E " passed| failed" $R/tests/gpu_tests.log | tail -2
  grep -E "(FAILED|ERROR) tests" $R/tests/gpu_tests.log | sed "s/^.*\] //" | sort -u | head -20
fi
cd $OUT && tar czf r.tgz r && rm -rf r
ls -la $OUT
