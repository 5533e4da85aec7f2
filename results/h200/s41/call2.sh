#!/usr/bin/env bash
# Session 41 call 2 (HEAD 86414ce kernels, warm caches from call 1): the edge variants' profiles, the layer rows.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
t0=$SECONDS
found=$(find / -path /proc -prune -o -name 'profile_*edge*=1*.txt' -print 2>/dev/null | head -5)
echo "found: $found"
for t in edge_taps=1 wgrad_edge=1 edge_taps=1,wgrad_edge=1; do
  tag=$(echo $t | tr '=,' '-_')
  f=$(echo "$found" | grep -F "profile_$t.txt" | head -1)
  if [[ -n "$f" ]]; then cp "$f" $R/profile_$tag.txt; else
    timeout 100 python benchmarks/profile_layer.py --shapes 0 1 2 3 --dtypes bf16 --cl --tuning ${t//,/ } > $R/profile_$tag.txt 2>&1; fi
  echo "profile $t at $((SECONDS-t0)) s"
done
timeout 240 python benchmarks/bench_layer.py --quick --dtypes bf16 --variants edge_taps=1,wgrad_edge=1 \
  --impls wtconv_triton_cl dw7_cl dw5_cl wtconv_triton_cl+edge_taps=1,wgrad_edge=1 --out $R/layer_edge.json > $R/layer_edge.txt 2>&1
echo "layer done at $((SECONDS-t0)) s"
grep -v "^#" $R/layer_edge.txt | tail -30
for f in $R/profile_*.txt; do echo "== $f"; grep -E "===|ms " $f; done
cd $OUT && tar czf r.tgz r && rm -rf r
