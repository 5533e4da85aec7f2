#!/usr/bin/env bash
# Session 41 call 3: TUNING syn1_ahead / conv_base_bc at 56^2 and 28^2 (layer rows, one process), edge_taps /
# wgrad_edge at 14^2 and 7^2 (kernel CUDA time), syn1_ahead's bitwise test on the GPU.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
t0=$SECONDS
timeout 200 python benchmarks/warm_kernels.py --jobs 14 --batches 128 --dtypes bf16 --modes train --stages 0 1 \
  --variants syn1_ahead=1 conv_base_bc=64 syn1_ahead=1,conv_base_bc=64 \
  --group="--batches 128 --dtypes bf16 --modes train --stages 2 3 --variants edge_taps=1 wgrad_edge=1" > $R/warm.txt 2>&1 &
wp=$!
site=$(mktemp -d); pip install -q --no-deps --no-index --target "$site" .shared/wheels/*.whl 2>/dev/null
(PYTHONPATH=$PWD:$site timeout 300 python -m pytest -v -rfE --tb=short -n 2 -p no:cacheprovider \
  tests/test_ops_triton.py -k "test_edge_rows_change_no_bit and syn1_ahead" > $R/gpu_test.log 2>&1; echo "rc $?" >> $R/gpu_test.log) &
wait $wp; echo "warm rc $? at $((SECONDS-t0)) s" | tee -a $R/warm.txt
timeout 150 python benchmarks/bench_layer.py --quick --dtypes bf16 --shapes 0 1 \
  --variants syn1_ahead=1 conv_base_bc=64 syn1_ahead=1,conv_base_bc=64 \
  --impls wtconv_triton_cl wtconv_triton_cl+syn1_ahead=1 wtconv_triton_cl+conv_base_bc=64 \
  wtconv_triton_cl+syn1_ahead=1,conv_base_bc=64 dw7_cl --out $R/layer_syn.json > $R/layer_syn.txt 2>&1
echo "layer at $((SECONDS-t0)) s"; grep -v "^#" $R/layer_syn.txt | tail -12
for t in "" edge_taps=1 wgrad_edge=1; do
  tag=$(echo ${t:-default} | tr '=,' '-_')
  timeout 60 python benchmarks/profile_layer.py --shapes 2 3 --dtypes bf16 --cl ${t:+--tuning ${t//,/ }} > $R/profile_small_$tag.txt 2>&1
  echo "profile $tag at $((SECONDS-t0)) s"; grep -E "===|ms " $R/profile_small_$tag.txt
done
wait
tail -6 $R/gpu_test.log
cd $OUT && tar czf r.tgz r && rm -rf r
