#!/usr/bin/env bash
# The kernels' GPU checks, A/Bs and benchmarks (issue 14 on), step by step in device calls of at most 10 minutes.
#   bash scripts/gpu_ab.sh [OUTDIR] [tests] [abrows] [abtune] [absmall] [layer] [profile] [compiled] [pmodel]
#                          [graphs] [host] [launch] [pair] [pgrad] [eager] [warm] [parity] [patch] [cmodel]
#                          [sizes] [dense] [trainbench] [cold] [ahead] [level1] [planmode] [bits] [variants]
# TCACHE=DIR: Triton's compiled kernels and Inductor's cache are unpacked from DIR first and packed into OUTDIR last
# (scripts/triton_cache.sh; carry DIR in the next call), so later calls skip the compiles. The parts (binaries only,
# 15 MiB each) must come back as files of their own: with $OUT set (the device machine) they are copied there, beside
# the results' tarball (which should leave them out); here, put them into an ignored folder (e.g. .tcache) to carry.
# (default: tests abtune layer profile, into results/gpu_ab; about 4 (tests), 2.5 (abrows), 6 (abtune), 2.5 (layer),
# 2 (profile), 3 (compiled), 4.5 (pmodel), 5.5 (graphs) and 3 (host) minutes on an H200, layer and profile timed
# with the tensor-core rows since removed: device calls of at most 10 minutes, e.g. "compiled pmodel",
# "abrows abtune", "tests layer profile", "graphs host").
# Needs the golden data (see gpu_check.sh).
# 1. correctness on the GPU (golden data, the op contract, stage shapes),
# 2. pass by pass (forward, input gradient, weight gradients) at every stage shape: "abrows", today's kernels against
#    $AB_BASELINE; "abtune", the kernels' loop variants (TUNING syn1, wgrad_unroll off) against today's launches;
#    "absmall", the small maps' one-launch pass against the multi-launch one and its launch variants,
# 3. the layer table (bench_layer.py --quick --dtypes bf16),
# 4. per-kernel CUDA time of the layer at every stage (profile_layer.py --cl).
# Each step has its own time limit and writes under OUTDIR as it goes, so a cut call keeps what ran.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/gpu_ab}"
shift || true
what="${*:-tests abtune layer profile}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
rc=0
step() {  # step SECONDS LOG command...
  local limit=$1 log=$2
  shift 2
  timeout "$limit" "$@" 2>&1 | tee "$out/$log" || rc=1
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
if [[ -n "${TCACHE:-}" ]]; then
  bash scripts/triton_cache.sh unpack "$TCACHE"
  # On the device machine ($OUT set) the parts are also copied there: files of their own, as the return needs.
  trap 'bash scripts/triton_cache.sh pack "$out" && if [[ -n "${OUT:-}" ]]; then cp "$out"/triton_cache.tgz.part* "$out"/inductor.tgz.part* "$OUT"/ 2>/dev/null; fi' EXIT
fi
more="level1_on_load or traced_op or compiled_ or synthesising or wgrad_rows or compile_fullgraph or one_launch or ttir or small_maps or launch_plan or replay or graph_mode or compiled_static or compile_once_in_the_pool"
if [[ "$what" == *warm* ]]; then
  # Compile the layer's kernel specialisations for the steps below in parallel processes (warm_kernels.py): one
  # process compiling them one after another spent the steps' time limits (session 22). In the background, beside
  # the tests' own compiles; the benchmarks wait for it.
  # WARM_VARIANTS: TUNING entries whose specialisations are compiled too (e.g. "pgrad_bc=8 pgrad_bc=16").
  timeout "${WARM_LIMIT:-240}" "$py" benchmarks/warm_kernels.py --jobs "${WARM_JOBS:-10}" --batches 128 --dtypes bf16 \
    --modes train ${WARM_VARIANTS:+--variants $WARM_VARIANTS} --group="--batches 1 --dtypes bf16 --modes train" \
    --group="--batches 128 --dtypes amp fp32 --modes train" --group="--batches 256 --dtypes amp fp32 --modes infer" \
    > "$out/warm.txt" 2>&1 &
  warm_pid=$!
fi
if [[ "$what" == *bits* ]]; then
  # The CPU-suite tests that compare two kernel paths bit for bit, on the GPU, with tracebacks. The case
  # test_level1_on_load_changes_no_bit[fp16-L1] (K = 7) "failed" in session 49's suite, most likely at gpu_tests.sh's
  # 300 s per-test limit: its 16 kernels take 301 s to compile for sm_90 on the CPU machine, and sessions 50-52 cut
  # it in its compiles at 120-500 s. It runs alone in the background with its own limit (BITS_FP16_LIMIT, default
  # 570 s: pytest prints nothing before the test ends), beside every other bitwise comparison in pytest-xdist
  # workers (compiles are most of the time). The step waits for that case before the next step starts: with
  # "tests" after it in one call, the suite got about 30 s (session 54: 1 test passed). Give "bits" its own call.
  step "${BITS_FP16_LIMIT:-570}" bits_fp16.txt "$py" -m pytest -q -rs --tb=long -p no:timeout tests/test_ops_triton.py \
    -k "level1_on_load_changes_no_bit and fp16" &
  fp16_pid=$!
  step 240 bits.txt "$py" -m pytest -q -rs --tb=short -n "${TESTS_WORKERS:-12}" tests/test_ops_triton.py \
    -k "(no_bit or bitwise) and not fp16-L1"
  wait "$fp16_pid"
  grep -q " passed" "$out/bits_fp16.txt" && ! grep -q " failed" "$out/bits_fp16.txt" || rc=1
fi
if [[ "$what" == *tests* ]]; then
  # pytest-xdist workers side by side (scripts/gpu_tests.sh): compiling the kernels' specialisations (CPU-bound)
  # is most of the time.
  sel="${TESTS_K:-past_2_pow_31 or amp_training or golden or dtypes or low_precision or deterministic or fast_launch or $more}"
  LIMIT=${TESTS_LIMIT:-420} bash scripts/gpu_tests.sh "$out" "${TESTS_WORKERS:-12}" -k "$sel" > /dev/null || rc=1
  tail -15 "$out/gpu_tests.log"
  grep -E "(FAILED|ERROR) tests/" "$out/gpu_tests.log" | sed "s/^.*\] //" | sort -u | head -30
fi
if [[ -n "${warm_pid:-}" ]]; then
  wait "$warm_pid" || rc=1
  tail -2 "$out/warm.txt"
fi
if [[ "$what" == *level1* ]]; then
  # Level 1 on load (issue 14): its weight gradients staged through dx's buffer (the default) against stored
  # level 1 (l1_onload=0) and cuDNN, bf16 B=128, at LEVEL1_SHAPES (default 56^2 and 28^2, where it applies; about
  # 4 minutes on an H100 with the compiles); then the GPU test that the two agree bit for bit.
  # Session 47: the staged path 1.451 ms against stored level 1's 1.305 at 56^2 (H100). Session 48: more programs
  # in the staged walk made it slower. Session 49 (H100, one process): stored level 1 in batch chunks (chunk_kb
  # 16384, 13 chunks, 101 launches) 5.74 ms against dw7's 1.343; by the profiler the staged path's 0.14 ms over
  # stored level 1 are in the backward (results/h200/level1.txt).
  shapes="${LEVEL1_SHAPES:-0 1}"
  l1vars="${LEVEL1_VARIANTS:-l1_onload=0}"
  step 170 level1_warm.txt "$py" benchmarks/warm_kernels.py --jobs 15 --batches 128 --dtypes bf16 --stages $shapes \
    --modes train --variants $l1vars
  # The per-kernel profiles first (a cut call keeps them).
  step 120 level1_profile.txt "$py" benchmarks/profile_layer.py --shapes $shapes --dtypes bf16 --cl
  step 120 level1_profile_stored.txt "$py" benchmarks/profile_layer.py --shapes $shapes --dtypes bf16 --cl \
    --tuning l1_onload=0
  step 150 level1_layer.txt "$py" benchmarks/bench_layer.py --quick --dtypes bf16 --shapes $shapes \
    --variants $l1vars --impls wtconv_triton_cl $(printf 'wtconv_triton_cl+%s ' $l1vars) dw7_cl dw5_cl \
    --out "$out/level1_layer.json"
  step 150 level1_test.txt "$py" -m pytest -q -rs tests/gpu/test_gpu.py -k level1_on_load
fi
if [[ "$what" == *variants* ]]; then
  # TUNING variants of the layer (loop variants, register caps, strip widths), each against the default and cuDNN,
  # bf16 B=128, at VARIANT_SHAPES (bench_layer's shape indices, default all four stages), in one process after
  # their compiles (VARIANT_WARM seconds, default 300: session 50's 200 s compiled 3 of 12 specialisations beside a
  # test), then per-kernel CUDA time (profile_layer.py) of the default and of each of VARIANT_PROFILE, then their
  # bitwise tests (VARIANT_TESTS=0: not). VARIANTS: space-separated, each KEY=V[,KEY=V]. About 10-13 minutes with
  # the defaults: split it over two calls with VARIANT_SHAPES. Timed before (results/h200/summary.md): session
  # 50 the level-1 kernel's instruction cuts and unrolled convolution rows (reverted), session 51 the register caps
  # (wgrad_maxnreg 168 the default since; conv_maxnreg 128 and l1_maxnreg 144 lost 3-10 %), session 52 l1_half
  # (removed), session 53 conv_pair and wgrad_narrow (the defaults since; small_narrow mixed, wgrad_inner and
  # wgrad_maxnreg=152 slower), session 54 dx_maxnreg=168 (the default since: one row). The default list switches
  # the newer defaults off again, against the default, and repeats the mixed ones.
  vars="${VARIANTS:-conv_pair=0 wgrad_narrow=0 small_narrow=1 dx_maxnreg=0 wgrad_inner=1}"
  vshapes="${VARIANT_SHAPES:-0 1 2 3}"
  # (Shape 4, bench_layer's 96 x 128^2 at B=16, is warm_kernels' stage 4 at batch 16.)
  stages=$(for s in $vshapes; do [[ $s != 4 ]] && echo -n "$s "; done)
  warm=()
  [[ -n "$stages" ]] && warm=(--batches 128 --stages $stages)
  if [[ " $vshapes " == *" 4 "* ]]; then
    if [[ -z "$stages" ]]; then
      warm=(--batches 16 --stages 4)
    else
      warm+=("--group=--batches 16 --dtypes bf16 --modes train --stages 4 --variants $vars")
    fi
  fi
  step "${VARIANT_WARM:-300}" variants_warm.txt "$py" benchmarks/warm_kernels.py --jobs 15 --dtypes bf16 --modes train \
    --variants $vars "${warm[@]}"
  step 300 variants_layer.txt "$py" benchmarks/bench_layer.py --quick --dtypes bf16 --shapes $vshapes \
    --variants $vars --impls wtconv_triton_cl $(printf 'wtconv_triton_cl+%s ' $vars) dw7_cl \
    --out "$out/variants_layer.json"
  for t in "" ${VARIANT_PROFILE-conv_pair=1,wgrad_narrow=4,small_narrow=1}; do
    step 90 "variants_profile_${t:-default}.txt" "$py" benchmarks/profile_layer.py --shapes $vshapes --dtypes bf16 \
      --cl ${t:+--tuning ${t//,/ }}
  done
  if [[ "${VARIANT_TESTS:-1}" != 0 ]]; then  # (the same tests run in the "bits" step)
    step 150 variants_test.txt "$py" -m pytest -q -rs --tb=short tests/test_ops_triton.py \
      -k "loop_variants or narrow_level or paired_channel"
  fi
fi
if [[ "$what" == *planmode* ]]; then
  # Graph mode (launch_plan.GRAPHS, the default since session 52; issue 15): its GPU test, then the host-bound layer
  # rows at 14^2 / 7^2 without and with it, each process against cuDNN (session 52, B=1 host: 327 / 268 us without
  # at 56^2 / 7^2, 247 / 237 with).
  step 150 planmode_test.txt "$py" -m pytest -q -rs tests/test_launch_plan.py -k graph_mode
  # Session 49: without warm kernels the first row's compiles spent its 120 s (the 7^2 rows were cut).
  step 150 planmode_warm.txt "$py" benchmarks/warm_kernels.py --jobs 15 --batches 128 --dtypes bf16 --stages 2 3 \
    --modes train
  step 120 planmode_off.txt env WTCONVNEXT_PLAN_GRAPHS=0 "$py" benchmarks/bench_layer.py --quick --dtypes bf16 \
    --shapes 2 3 --impls wtconv_triton_cl dw7_cl --out "$out/planmode_off.json"
  step 120 planmode_on.txt env WTCONVNEXT_PLAN_GRAPHS=1 "$py" benchmarks/bench_layer.py --quick --dtypes bf16 \
    --shapes 2 3 --impls wtconv_triton_cl dw7_cl --out "$out/planmode_on.json"
fi
if [[ "$what" == *abrows* ]]; then  # today's FMA kernels against an earlier copy ($AB_BASELINE, e.g. of 123b293)
  if [[ -f "${AB_BASELINE:-}" ]]; then
    # AB_SHAPES / AB_DTYPES: bench_layer's shape indices (default all) and dtypes (default bf16 fp32).
    step 150 ab_rows.txt "$py" benchmarks/ab_kernels.py --baseline "$AB_BASELINE" --dtypes ${AB_DTYPES:-bf16 fp32} \
      ${AB_SHAPES:+--shapes $AB_SHAPES} --out "$out/ab_rows.json"
  else
    echo "abrows: set AB_BASELINE to a copy of an earlier wtconvnext/ops/triton_kernels.py" | tee "$out/ab_rows.txt"
  fi
fi
if [[ "$what" == *abtune* ]]; then  # the FMA kernels' loop variants (AB_TUNES), each against today's defaults
  for t in ${AB_TUNES:-syn1=0 wgrad_unroll=0}; do
    tag=$(echo "$t" | tr ' =' '_-')
    step 120 "ab_$tag.txt" "$py" benchmarks/ab_kernels.py --tuning $t --dtypes bf16 ${AB_SHAPES:+--shapes $AB_SHAPES} \
      --out "$out/ab_$tag.json"
  done
fi
if [[ "$what" == *absmall* ]]; then
  # The one-launch passes of small maps (small_kernels.py, default) against the multi-launch ones (small_max=0:
  # speedups below 1 favour the default), and the small path's launch variants, at stages 3-4.
  for t in "small_max=0" "small_bc=32 small_warps=1" "small_bc=128 small_warps=4" "syn1=0"; do
    tag=$(echo "$t" | tr ' =' '_-')
    step 150 "ab_$tag.txt" "$py" benchmarks/ab_kernels.py --tuning $t --shapes 2 3 --dtypes bf16 \
      --out "$out/ab_$tag.json"
  done
fi
if [[ "$what" == *layer* ]]; then
  step 150 layer.txt "$py" benchmarks/bench_layer.py --quick --dtypes bf16 --out "$out/layer.json"
fi
if [[ "$what" == *profile* ]]; then
  step 60 profile_fma.txt "$py" benchmarks/profile_layer.py --shapes 0 1 2 3 --dtypes bf16 --cl
fi
# The compiled model (issue 15): ConvNeXt-T and WTConvNeXt-T compiled side by side, each from cold caches (compile
# time, step time, memory: about 3 minutes), the compiled
# WTConvNeXt step kernel by kernel (layout copies or clones around the fused op would show here), then with CUDA
# graphs; and the host time per eager layer call (its compiled rows build four graphs: about 3 minutes).
if [[ "$what" == *compiled* ]]; then  # COMPILE_TIMEOUT: seconds per case (a cold WTConvNeXt-T took > 340 s, session 29)
  ct=${COMPILE_TIMEOUT:-200}
  step $((2 * ct + 60)) compile.txt "$py" benchmarks/bench_compile.py --timeout "$ct" --out "$out/compile.json"
fi
if [[ "$what" == *pmodel* ]]; then  # both models: whether a step is GPU-bound (kernel sum ~ wall), and where they differ
  step 200 profile_model.txt "$py" benchmarks/profile_model.py --compile --rows 60
  step 100 profile_model_convnext.txt "$py" benchmarks/profile_model.py --model convnext_tiny --compile --rows 40
fi
if [[ "$what" == *graphs* ]]; then
  step 330 model_cudagraphs.txt "$py" benchmarks/bench_model.py --sizes tiny --compiled-only --compile-amp-only \
    --compile-mode reduce-overhead --out "$out/model_cudagraphs.json"
fi
if [[ "$what" == *host* ]]; then  # HOST_ARGS=--no-compile: the eager launch paths only (no compiles)
  step 240 host.txt "$py" benchmarks/host_overhead.py --iters 100 --rounds 3 ${HOST_ARGS:-} --out "$out/host.json"
fi
# Issue 15's host split: microseconds per launch, per torch op and per layer call with and without its launches.
if [[ "$what" == *launch* ]]; then
  step 150 launch_cost.txt "$py" benchmarks/launch_cost.py --iters 200 --rounds 3 --out "$out/launch_cost.json"
fi
# The weight-gradient walks in one launch (TUNING wgrad_pair) against two, at every stage shape.
if [[ "$what" == *pair* ]]; then
  # (wgrad_pair=0 is the default again, timed after the other: the order's bias shows.)
  step 300 layer_pair.txt "$py" benchmarks/bench_layer.py --quick --dtypes bf16 --shapes 2 3 0 1 \
    --variants wgrad_pair=1 wgrad_pair=0 --impls wtconv_triton_cl dw7_cl wtconv_triton_cl+wgrad_pair=1 \
    wtconv_triton_cl+wgrad_pair=0 dw5_cl --out "$out/layer_pair.json"
fi
# TUNING variants by CUDA time per kernel at every stage shape, each against the defaults in the same call
# (PGRAD_VARIANTS: space-separated variants, each KEY=V[,KEY=V]; default the chain rule's channels per program).
# Warm them first (WARM_VARIANTS, the same list).
if [[ "$what" == *pgrad* ]]; then
  for t in "" ${PGRAD_VARIANTS:-pgrad_bc=16 pgrad_bc=8}; do
    step 90 "profile_${t:-default}.txt" "$py" benchmarks/profile_layer.py --shapes 0 1 2 3 --dtypes bf16 --cl \
      ${t:+--tuning ${t//,/ }}
  done
fi
# TUNING syn1_ahead 0 / 1 (default) / 2 (session 41; 2 not yet measured): CUDA time per kernel at every stage shape,
# then the layer rows side by side in one process. At 14 x 14 and 7 x 7 only the small pass reads it. Warm them first
# ("warm" with WARM_VARIANTS="syn1_ahead=0 syn1_ahead=2").
if [[ "$what" == *ahead* ]]; then
  for t in "" syn1_ahead=0 syn1_ahead=2; do
    step 90 "profile_ahead_${t:-default}.txt" "$py" benchmarks/profile_layer.py --shapes 0 1 2 3 --dtypes bf16 --cl \
      ${t:+--tuning $t}
  done
  step 240 layer_ahead.txt "$py" benchmarks/bench_layer.py --quick --dtypes bf16 --variants syn1_ahead=0 syn1_ahead=2 \
    --impls wtconv_triton_cl wtconv_triton_cl+syn1_ahead=0 wtconv_triton_cl+syn1_ahead=2 dw7_cl dw5_cl \
    --out "$out/layer_ahead.json"
fi
# Does a compiled layer give eager's results, on each op path, compile mode and dtype (compiled_parity.py: about 3
# minutes for 8 cases)? PARITY_ARGS: e.g. "--paths traced" (the default path's 6 cases only).
if [[ "$what" == *parity* ]]; then
  step 330 parity.txt "$py" benchmarks/compiled_parity.py ${PARITY_ARGS:-} --out "$out/parity.json"
fi
# The patch kernels' launch shapes (analysis / synthesis: at 56 x 56 the analysis took 0.248 ms of 1.340, about 2x
# its memory floor, session 29): CUDA time per kernel at stages 1-2 for each variant against the defaults, in one
# call (PATCH_VARIANTS, as PGRAD_VARIANTS; the variants' kernels compiled first in parallel).
if [[ "$what" == *patch* ]]; then
  pv="${PATCH_VARIANTS:-patch_chunk=128 patch_chunk=256,patch_warps=8 patch_chunk=128,patch_warps=8 patch_bc=64 patch_bc=16 patch_warps=8 patch_warps=2}"
  step 200 warm_patch.txt "$py" benchmarks/warm_kernels.py --jobs 14 --batches 128 --dtypes bf16 --modes train \
    --stages 0 1 --variants $pv
  for t in "" $pv; do
    step 60 "profile_patch_${t:-default}.txt" "$py" benchmarks/profile_layer.py --shapes 0 1 --dtypes bf16 --cl \
      ${t:+--tuning ${t//,/ }}
  done
fi
# Issue 15's other rows: the compiled model without CUDA graphs and multi-scale compiled training (cmodel), the
# bigger models eager (sizes), the eager table with dense prediction (dense), train.py as users run it
# (trainbench). Each needs the machine to itself (compiles are CPU-bound; a row is the ratio of two models timed
# one after the other).
if [[ "$what" == *cmodel* ]]; then
  step 480 model_compiled.txt "$py" benchmarks/bench_model.py --sizes tiny --compiled-only --compile-amp-only \
    --multiscale --out "$out/model_compiled.json"
fi
# What the compiled graphs launch (Inductor's generated wrappers in its cache): by kernel, and the fills of
# uninitialised buffers that Inductor clones before a WTConv kernel writes them (after cmodel, pmodel or graphs).
if [[ "$what" == *cmodel* || "$what" == *pmodel* || "$what" == *graphs* ]]; then
  step 60 inductor_launches.txt "$py" benchmarks/inductor_launches.py --match _conv_kernel --json "$out/inductor_launches.json"
fi
if [[ "$what" == *sizes* ]]; then
  step 400 model_sizes.txt "$py" benchmarks/bench_model.py --sizes small base --no-compile --out "$out/model_sizes.json"
fi
if [[ "$what" == *dense* ]]; then
  step 420 model_dense.txt "$py" benchmarks/bench_model.py --sizes tiny --no-compile --dense \
    --out "$out/model_dense.json"
fi
# Cold start, eager (compile_ahead.py): the first AMP training step with empty Triton caches, ConvNeXt-T, then
# WTConvNeXt-T with each kernel compiled at its launch (the default) and with its kernels compiled ahead in 8
# threads (opt-in). Session 32: neither WTConvNeXt case finished within 250 s (a case's timeout covers its timing
# steps too): give each its own call, or a longer limit.
if [[ "$what" == *cold* ]]; then
  step 570 cold.txt "$py" benchmarks/bench_compile.py --eager --models convnext_tiny wtconvnext_tiny \
    --compile-threads 8 --timeout 330 --out "$out/cold.json"
fi
if [[ "$what" == *trainbench* ]]; then
  step 420 train.txt "$py" benchmarks/bench_train.py --sizes tiny --out "$out/train.json"
fi
# The current model table (issue 15), eager: AMP and fp32 training and inference against ConvNeXt-T.
if [[ "$what" == *eager* ]]; then
  step "${EAGER_LIMIT:-330}" model.txt "$py" benchmarks/bench_model.py --sizes tiny --no-compile --out "$out/model.json"
fi
exit $rc
