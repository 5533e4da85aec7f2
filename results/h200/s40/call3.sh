#!/usr/bin/env bash
# Session 40 call 3: rows below the map skipped in the conv strips (new) against HEAD 4fb9c04's kernels (old),
# same machine, one call: warm both, GPU tests of the new kernels, then layer wall times and per-kernel CUDA times.
set -u
export PYTHONUNBUFFERED=1
NEW=$PWD; OLD=$PWD/tmp_call/old
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
(cd $OLD && PYTHONPATH=$OLD timeout 220 python benchmarks/warm_kernels.py --jobs 3 --batches 128 --dtypes bf16 --modes train --stages 0 2 3 > $OUT/warm_old.txt 2>&1) &
(PYTHONPATH=$NEW timeout 220 python benchmarks/warm_kernels.py --jobs 3 --batches 128 --dtypes bf16 --modes train --stages 0 2 3 > $OUT/warm_new.txt 2>&1) &
site=$(mktemp -d); pip install -q --no-deps --no-index --target "$site" .shared/wheels/*.whl
PYTHONPATH=$NEW:$site timeout 250 python -m pytest -v -rfE --tb=short -n 6 --timeout 240 \
  tests/gpu/test_gpu.py::test_stage_shapes_low_precision tests/gpu/test_gpu.py::test_stage_shapes_fp32_vs_float64 \
  tests/gpu/test_gpu.py::test_weight_grads_bitwise_deterministic > $OUT/gpu_tests.log 2>&1
echo "tests rc $?" >> $OUT/gpu_tests.log
wait
tail -2 $OUT/warm_old.txt $OUT/warm_new.txt
for t in new old; do
  d=$NEW; [[ $t == old ]] && d=$OLD
  (cd $d && PYTHONPATH=$d timeout 90 python benchmarks/bench_layer.py --quick --dtypes bf16 --shapes 2 3 0 --impls wtconv_triton_cl dw7_cl dw5_cl --out $OUT/layer_$t.json > $OUT/layer_$t.txt 2>&1)
  (cd $d && PYTHONPATH=$d timeout 70 python benchmarks/profile_layer.py --shapes 2 3 0 --dtypes bf16 --cl > $OUT/profile_$t.txt 2>&1)
done
grep -E "PASSED|FAILED|passed|failed" $OUT/gpu_tests.log | tail -20
grep -A25 "^E \|Error" $OUT/gpu_tests.log | head -40
cat $OUT/layer_new.txt $OUT/layer_old.txt | grep -v "^#"
grep -E "Self CUDA|_small|_conv|_wgrad|_analysis|_synth|_param|_fold|shape|total" $OUT/profile_new.txt $OUT/profile_old.txt | head -60
