#!/usr/bin/env bash
# Session 42 call 2 (short): the level-1 prototype against today's launches (56^2, 28^2), then host time per f+b at
# 14^2 / 7^2 (enqueue with the GPU kept busy vs do_bench wall, B=1 and 128).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
git log --oneline -1 > $R/commit.txt 2>/dev/null
timeout 125 python benchmarks/proto_level1.py --configs 2,32,1 4,32,1 2,64,2 > $R/proto_level1.txt 2>&1
echo "proto at $((SECONDS-t0)) s"; grep -v Warn $R/proto_level1.txt | tail -16
timeout 55 python tmp_call/hostprobe.py 0 1 > $R/hostprobe.txt 2>&1; echo "probe at $((SECONDS-t0)) s"; grep -v Warn $R/hostprobe.txt
cd $OUT && tar czf r.tgz r && rm -rf r
