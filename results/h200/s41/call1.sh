#!/usr/bin/env bash
# Session 41 call 1: TUNING edge_taps / wgrad_edge A/B (CUDA time per kernel, every stage) + the layer table.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
git log --oneline -1 > $R/commit.txt 2>/dev/null
V="edge_taps=1 wgrad_edge=1 edge_taps=1,wgrad_edge=1"
t0=$SECONDS
timeout 280 python benchmarks/warm_kernels.py --jobs 14 --batches 128 --dtypes bf16 --modes train --variants $V > $R/warm.txt 2>&1 &
wp=$!
site=$(mktemp -d); pip install -q --no-deps --no-index --target "$site" .shared/wheels/*.whl
PYTHONPATH=$PWD:$site timeout 270 python -m pytest -v -rfE --tb=short -n 2 -p no:cacheprovider \
  tests/test_ops_triton.py::test_edge_rows_change_no_bit > $R/edge_test.log 2>&1
echo "edge test rc $?" >> $R/edge_test.log
wait $wp; echo "warm rc $? at $((SECONDS-t0)) s" >> $R/warm.txt
tail -3 $R/warm.txt; tail -8 $R/edge_test.log
for t in "" edge_taps=1 wgrad_edge=1 edge_taps=1,wgrad_edge=1; do
  timeout 80 python benchmarks/profile_layer.py --shapes 0 1 2 3 --dtypes bf16 --cl ${t:+--tuning ${t//,/ }} > "$R/profile_${t:-default}.txt" 2>&1
  echo "profile ${t:-default} done at $((SECONDS-t0)) s"
done
timeout 200 python benchmarks/bench_layer.py --quick --dtypes bf16 --variants edge_taps=1,wgrad_edge=1 \
  --impls wtconv_triton_cl dw7_cl dw5_cl wtconv_triton_cl+edge_taps=1,wgrad_edge=1 --out $R/layer_edge.json > $R/layer_edge.txt 2>&1
echo "layer done at $((SECONDS-t0)) s"
grep -v "^#" $R/layer_edge.txt | tail -30
for f in $R/profile_*.txt; do echo "== $f"; grep -E "===|total|wall" $f; done
cd $OUT && tar czf r.tgz r && rm -rf r
