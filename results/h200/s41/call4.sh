#!/usr/bin/env bash
# Session 41 call 4: the model's eager AMP rows with today's defaults (syn1_ahead, conv_base_bc 64).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
git log --oneline -1 > $R/commit.txt 2>/dev/null
t0=$SECONDS
timeout 130 python benchmarks/warm_kernels.py --jobs 8 --batches 128 --dtypes amp --modes train \
  --group="--batches 256 --dtypes amp --modes infer" > $R/warm.txt 2>&1
echo "warm rc $? at $((SECONDS-t0)) s" | tee -a $R/warm.txt
timeout 170 python benchmarks/bench_model.py --sizes tiny --no-compile --eager-amp-only --out $R/model.json > $R/model.txt 2>&1
echo "model rc $? at $((SECONDS-t0)) s"
grep -v "^#" $R/model.txt | tail -15
cd $OUT && tar czf r.tgz r && rm -rf r
