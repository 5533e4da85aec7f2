"""Every Triton kernel compiles for an sm_90 GPU (Hopper, the H200), on any machine, and the FMA kernels' row loops
carry every rolling value in the compiler's IR.

Triton's interpreter, which runs the kernels in the CPU tests, accepts code that its GPU compiler rejects (a
constexpr assigned twice in a static loop did): this compiles each kernel, in the specialisations the launchers
use, to a cubin without needing a GPU. It runs in a subprocess, since the kernels must be decorated without
TRITON_INTERPRET (which conftest sets for the CPU tests).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _cases():
    import triton.language as tl

    from wtconvnext.ops import triton_kernels as tk

    f32, bf16, i32, fp = "*fp32", "*bf16", "i32", tl.float32
    for nl, m in ((5, 1), (2, 4), (1, 64)):
        yield tk._analysis_kernel, dict(src_ptr=bf16, coef_ptr=bf16, src2_ptr=bf16, coef2_ptr=bf16, src_off=i32,
                                        coef_off="i64", H0=i32, W0=i32, B=i32, PATCHES_W=i32, PATCHES=i32), \
            dict(C=96, SRC_PIX=96, NL=nl, M=m, BC=32, CHUNK=64, COMPUTE=fp)
        yield tk._synthesis_kernel, dict(t_ptr=bf16, acc_ptr=bf16, first_off="i64", H0=i32, W0=i32, B=i32,
                                         PATCHES_W=i32, PATCHES=i32), \
            dict(C=96, NL=nl, M=m, HAS_ACC=nl == 2, BC=32, CHUNK=64, COMPUTE=fp)
    conv = dict(x_ptr=bf16, acc_ptr=bf16, acc2_ptr=bf16, y_ptr=bf16, w_ptr=f32, b_ptr=f32, acc2_off=i32, H=i32, W=i32,
                B=i32)
    no_syn = dict(SYN1=False, HAS_ACC2=False)
    yield tk._conv_kernel, conv, dict(CC=384, K=5, LEVELS=5, BW=4, BC=32, STRIDE=1, HAS_ACC=False, HAS_BIAS=False,
                                      FLIP=True, COMPUTE=fp, **no_syn, SYN_AHEAD=0)
    for k, stride in ((5, 1), (3, 2), (7, 1), (7, 2)):
        yield tk._conv_kernel, conv, dict(CC=96, K=k, LEVELS=0, BW=4, BC=32, STRIDE=stride, HAS_ACC=True,
                                          HAS_BIAS=True, FLIP=False, COMPUTE=fp, **no_syn, SYN_AHEAD=0)
    # The base convolution synthesising level 1 itself (SYN_AHEAD, TUNING syn1_ahead: its values a row ahead).
    for acc2, stride, ahead in ((True, 1, 0), (False, 2, 1), (True, 1, 1), (True, 2, 2)):
        yield tk._conv_kernel, conv, dict(CC=96, K=5, LEVELS=0, BW=4, BC=64 if ahead and acc2 else 32, STRIDE=stride,
                                          HAS_ACC=True, HAS_BIAS=True, FLIP=False, COMPUTE=fp, SYN1=True,
                                          HAS_ACC2=acc2, SYN_AHEAD=ahead)
    wg = dict(x_ptr=bf16, g_ptr=bf16, part_ptr=f32, H=i32, W=i32, B=i32, IMGS=i32, G0=i32, GT=i32)
    # The unrolled row walks (a minute each to compile) once, in the pair kernel below: it runs the same noinline
    # _wgrad_program as _wgrad_kernel, for the base and for the levels.
    yield tk._wgrad_kernel, wg, dict(CC=96, K=5, TP=32, LEVELS=0, BW=7, BC=32, DSUM=True, COMPUTE=fp, UNROLL=False)
    yield tk._wgrad_kernel, wg, dict(CC=384, K=5, TP=32, LEVELS=4, BW=7, BC=64, DSUM=False, COMPUTE=fp,
                                     UNROLL=False)
    # (K = 7 unrolled compiles for 160 s here; the loop-carry check takes K = 5 as far as the IR.)
    yield tk._wgrad_kernel, wg, dict(CC=96, K=3, TP=16, LEVELS=0, BW=7, BC=32, DSUM=True, COMPUTE=fp, UNROLL=True)
    pair = dict(x_ptr=bf16, g_ptr=bf16, bpart_ptr=f32, cx_ptr=bf16, cg_ptr=bf16, lpart_ptr=f32, H=i32, W=i32, B=i32,
                IMGS=i32, G0=i32, GT=i32, R0=i32)
    # (With TUNING wgrad_narrow's strips of 4 and 2 columns for the narrow levels.)
    yield tk._wgrad_pair_kernel, pair, dict(C=96, K=5, TP=32, LEVELS=5, BW=7, BC0=32, BC=64, COMPUTE=fp, UNROLL=True,
                                            NARROW=4)
    # Triton specialises an int argument equal to 1 as a constant: every kernel must compile with them all 1.
    one = dict(H0=1, W0=1, B=1, PATCHES_W=1, PATCHES=1)
    yield tk._analysis_kernel, dict(src_ptr=bf16, coef_ptr=bf16, src2_ptr=bf16, coef2_ptr=bf16, src_off=i32,
                                    coef_off=i32), \
        dict(**one, C=96, SRC_PIX=96, NL=2, M=1, BC=32, CHUNK=64, COMPUTE=fp)
    yield tk._synthesis_kernel, dict(t_ptr=bf16, acc_ptr=bf16), \
        dict(**one, first_off=1, C=96, NL=2, M=1, HAS_ACC=True, BC=32, CHUNK=64, COMPUTE=fp)
    for levels in (0, 2):
        yield tk._conv_kernel, dict(x_ptr=bf16, acc_ptr=bf16, acc2_ptr=bf16, y_ptr=bf16, w_ptr=f32, b_ptr=f32), \
            dict(acc2_off=1, H=1, W=1, B=1, CC=96, K=5, LEVELS=levels, BW=4, BC=32, STRIDE=1, HAS_ACC=True,
                 HAS_BIAS=True, FLIP=False, COMPUTE=fp, SYN1=levels == 0, HAS_ACC2=levels == 0, SYN_AHEAD=1)
        # The base's walk, and level 1's of stored subbands (level1_partials, staged): both unrolled, level 1's with
        # its inner strips unmasked (TUNING wgrad_inner).
        yield tk._wgrad_kernel, dict(x_ptr=bf16, g_ptr=bf16, part_ptr=f32), \
            dict(H=1, W=1, B=1, IMGS=1, G0=1, GT=1, CC=96, K=5, TP=32, LEVELS=min(levels, 1), BW=7, BC=32,
                 DSUM=levels == 0, COMPUTE=fp, UNROLL=True, INNER=levels > 0)
    yield from _onload_cases()
    params = dict(w_ptr=f32, b_ptr=f32, bs_ptr=f32, ww_ptr=f32, ws_ptr=f32)
    grads = dict(dw_ptr=f32, db_ptr=f32, dbs_ptr=f32, dww_ptr=f32, dws_ptr=f32)
    ints = dict(R0=i32, H=i32, W=i32, B=i32, IMGS=i32)
    for round_to in (None, tl.bfloat16, tl.float16):
        yield tk._fold_kernel, dict(**params, bw_ptr=f32, bb_ptr=f32, lw_ptr=f32), \
            dict(C=96, K=5, TP=32, HAS_BIAS=True, BLOCK_C=64, COMPUTE=fp, ROUND=round_to)
        yield tk._param_grads_kernel, dict(bpart_ptr=f32, lpart_ptr=f32, **params, **grads, **ints), \
            dict(C=96, K=5, TP=32, LEVELS=5, BW=7, HAS_BIAS=True, BLOCK_C=32, COMPUTE=fp, ROUND=round_to, RB=16)
    for split in (0, 1, 2):  # 1, 2: level 1's partial rows apart (level 1 on load)
        yield tk._param_grads_kernel, dict(bpart_ptr=f32, lpart_ptr=f32, **params, **grads), \
            dict(R0=1, H=1, W=1, B=1, IMGS=1, C=96, K=5, TP=32, LEVELS=2, BW=7, HAS_BIAS=True, BLOCK_C=32,
                 COMPUTE=fp, ROUND=None, RB=16, SPLIT=split)
    yield tk._param_grads_kernel, dict(bpart_ptr=f32, lpart_ptr=f32, **{k: bf16 for k in [*params, *grads]}, **ints), \
        dict(C=96, K=5, TP=64, LEVELS=2, BW=7, HAS_BIAS=False, BLOCK_C=32, COMPUTE=fp, ROUND=None, RB=8)
    yield from _small_cases()


def _onload_cases():
    """TUNING l1_onload's specialisations: level 1 on load (forward and rotated), the analysis from level 2, the
    level convolutions from level 2, the in-place base convolution (SYN1 == 2) and the weight-gradient walk of
    levels 2.. (alone and paired with the base's)."""
    import triton.language as tl

    from wtconvnext.ops import triton_kernels as tk

    f32, bf16, i32, fp = "*fp32", "*bf16", "i32", tl.float32
    for k, flip, x in ((5, False, bf16), (7, True, bf16), (3, False, "*fp16")):
        yield tk._level1_kernel, dict(x_ptr=x, y_ptr=x, w_ptr=f32, H=i32, W=i32), \
            dict(C=96, K=k, BW=2, BC=32, FLIP=flip, COMPUTE=fp)
    yield tk._analysis_kernel, dict(src_ptr=bf16, coef_ptr=bf16, src2_ptr=bf16, coef2_ptr=bf16, src_off=i32,
                                    coef_off="i64", H0=i32, W0=i32, B=i32, PATCHES_W=i32, PATCHES=i32), \
        dict(C=96, SRC_PIX=96, NL=4, M=1, BC=32, CHUNK=64, COMPUTE=fp, SKIP1=True)
    conv = dict(x_ptr=bf16, acc_ptr=bf16, acc2_ptr=bf16, y_ptr=bf16, w_ptr=f32, b_ptr=f32, acc2_off=i32, H=i32, W=i32,
                B=i32)
    yield tk._conv_kernel, conv, dict(CC=384, K=5, LEVELS=4, BW=4, BC=64, STRIDE=1, HAS_ACC=False, HAS_BIAS=False,
                                      FLIP=False, COMPUTE=fp, SYN1=False, HAS_ACC2=False, SYN_AHEAD=0, LV0=1)
    for acc2, bias in ((True, True), (False, False)):
        # (The second with TUNING conv_pair's two images in the last channel block.)
        yield tk._conv_kernel, conv, dict(CC=96, K=5, LEVELS=0, BW=4, BC=64, STRIDE=1, HAS_ACC=True, HAS_BIAS=bias,
                                          FLIP=not bias, COMPUTE=fp, SYN1=2, HAS_ACC2=acc2, SYN_AHEAD=1, LV0=0,
                                          PAIR=not bias)
    wg = dict(x_ptr=bf16, g_ptr=bf16, part_ptr=f32, H=i32, W=i32, B=i32, IMGS=i32, G0=i32, GT=i32)
    yield tk._wgrad_kernel, wg, dict(CC=384, K=3, TP=16, LEVELS=4, BW=7, BC=64, DSUM=False, COMPUTE=fp,
                                     UNROLL=False, SKIP1=True)


def _small_cases():
    """The one-launch pass of small maps (wtconvnext/ops/small_kernels.py): forward and input gradient, levels 0
    to 4, a stride, K = 3 / 5 / 7, and every int argument 1."""
    import triton.language as tl

    from wtconvnext.ops import small_kernels as sk

    bf16, f32, i32 = "*bf16", "*fp32", "i32"
    ptrs = dict(x_ptr=bf16, coef_ptr=bf16, filt_ptr=bf16, y_ptr=bf16, bw_ptr=f32, bb_ptr=f32,
                lw_ptr=f32)
    for k, levels, hm, stride, fwd, ahead in ((5, 3, 16, 1, True, 0), (5, 2, 8, 1, False, 0), (3, 4, 16, 2, True, 0),
                                              (7, 1, 4, 1, True, 0), (5, 0, 8, 1, True, 0), (5, 3, 16, 1, True, 1),
                                              (7, 2, 8, 1, False, 0), (5, 2, 8, 1, True, 2)):
        yield sk._small_kernel, dict(**ptrs, H=i32, W=i32, B=i32), dict(
            C=384, K=k, LEVELS=levels, HM=hm, WM=hm, BW=4, BC=32, CHUNK=16, STRIDE=stride, HAS_BIAS=fwd,
            FLIP=not fwd, HAS_COEF=not fwd, COMPUTE=tl.float32, SYN1=int(levels != 4), SYN_AHEAD=ahead,
            NARROW=hm == 8)  # (TUNING small_narrow)
    for ahead in (0, 1):
        yield sk._small_kernel, dict(**ptrs), dict(H=1, W=1, B=1, C=96, K=5, LEVELS=2, HM=1, WM=1, BW=4, BC=32,
                                                   CHUNK=16, STRIDE=1, HAS_BIAS=True, FLIP=False, HAS_COEF=False,
                                                   COMPUTE=tl.float32, SYN1=1, SYN_AHEAD=ahead)


def _compile_all() -> int:
    from benchmarks.common import compile_sm90

    failed = 0
    for fn, signature, constexprs in _cases():
        try:
            warps = 2 if fn.__name__.startswith("_small") else 8 if fn.__name__ == "_param_grads_kernel" else 4
            compile_sm90(fn, signature, constexprs, warps)
        except Exception as e:  # report every failing kernel, then fail
            failed += 1
            print(f"FAILED {fn.__name__} {constexprs}:\n{e}\n", file=sys.stderr)
    return failed


def _loop_carries() -> int:
    """Every row loop of the FMA convolution and weight-gradient kernels carries exactly the values it must, in the
    GPU compiler's IR: the interpreter cannot see a rolling value the compiler drops (PERF.md's trap). The
    convolution carries its K - 1 rows of BW accumulators in flight (the newest row starts at zero: a constant,
    folded) and the next input row's NI values (the padding rows below the map, which load nothing, only the
    accumulators); the weight gradient its K x K sums (+ dy's), the K - 1 dy rows a
    row pairs with, the next dy row and the next x row (in each strip width it walks); level 1 on load its four
    subbands' K - 1 rows."""
    import re

    import triton.language as tl

    from benchmarks.common import ttir_sm90
    from wtconvnext.ops import triton_kernels as tk

    bf16, f32, i32 = "*bf16", "*fp32", "i32"
    conv = dict(x_ptr=bf16, acc_ptr=bf16, acc2_ptr=bf16, y_ptr=bf16, w_ptr=f32, b_ptr=f32, acc2_off=i32, H=i32,
                W=i32, B=i32)
    wg = dict(x_ptr=bf16, g_ptr=bf16, part_ptr=f32, H=i32, W=i32, B=i32, IMGS=i32, G0=i32, GT=i32)
    failed = 0
    # (The syn1_ahead cases: HAS_ACC2 with the unrolled ones.)
    # (Strips of 2 columns: TUNING small_narrow's last strips in the one-launch pass, the same _conv_strip.)
    for k, bw, unroll in ((5, 4, False), (5, 4, True), (3, 6, True), (5, 2, False)):
        ni = bw + k - 1
        cases = [
            (tk._conv_kernel, conv, dict(CC=96, K=k, LEVELS=0, BW=bw, BC=32, STRIDE=1, HAS_ACC=True, HAS_BIAS=True,
                                         FLIP=False, COMPUTE=tl.float32, SYN1=False, HAS_ACC2=False, SYN_AHEAD=0),
             {(k - 1) * bw + ni, (k - 1) * bw}),
        ]
        # SYN_AHEAD: level 1's values for the next output row ride along (ns of them), in the padding rows too:
        # raw (1), or acc_1 itself, bw of them (2).
        for ahead in (1, 2):
            ns = bw if ahead == 2 else bw // 2 * (5 if unroll else 4)
            cases.append((tk._conv_kernel, conv, dict(CC=96, K=k, LEVELS=0, BW=bw, BC=32, STRIDE=1, HAS_ACC=True,
                                                      HAS_BIAS=True, FLIP=False, COMPUTE=tl.float32, SYN1=True,
                                                      HAS_ACC2=unroll, SYN_AHEAD=ahead),
                          {(k - 1) * bw + ni + ns, (k - 1) * bw + ns}))
        # TUNING conv_pair: two images in the last channel block's lanes (C = 96 in blocks of 64) carry the same.
        cases.append((tk._conv_kernel, conv, dict(CC=96, K=k, LEVELS=0, BW=bw, BC=64, STRIDE=1, HAS_ACC=True,
                                                  HAS_BIAS=True, FLIP=False, COMPUTE=tl.float32, SYN1=2,
                                                  HAS_ACC2=True, SYN_AHEAD=1, PAIR=True),
                      {(k - 1) * bw + ni + bw // 2 * 5, (k - 1) * bw + bw // 2 * 5}))
        for dsum in (False, True):
            sums = k * k + dsum
            cases.append((tk._wgrad_kernel, wg, dict(CC=384, K=k, TP=32, LEVELS=4, BW=bw + 3, BC=64, DSUM=dsum,
                                                     COMPUTE=tl.float32, UNROLL=unroll),
                          {sums, sums + k * (bw + 3) + (bw + 3 + k - 1)}))
        # TUNING wgrad_narrow: the level walks' strips of 4 and 2 columns (rolled) beside the full width's. A narrow
        # strip starts at column 0, so its K // 2 x columns left of the map are constant zeros, not carried.
        if unroll:
            cases.append((tk._wgrad_kernel, wg, dict(CC=384, K=k, TP=32, LEVELS=4, BW=7, BC=64, DSUM=False,
                                                     COMPUTE=tl.float32, UNROLL=True, NARROW=4),
                          {k * k, k * k + k * 7 + (7 + k - 1),
                           *(k * k + k * b + (b + k - 1) - k // 2 for b in (4, 2))}))
        # Level 1 on load: four subbands' K - 1 rows of BW accumulators in flight, nothing else (its loads are
        # not carried: it loads the row it computes).
        cases.append((tk._level1_kernel, dict(x_ptr=bf16, y_ptr=bf16, w_ptr=f32, H=i32, W=i32),
                      dict(C=96, K=k, BW=2, BC=32, FLIP=unroll, COMPUTE=tl.float32), {4 * (k - 1) * 2}))
        for fn, sig, const, want in cases:
            ttir = ttir_sm90(fn, sig, const, 1)  # the IR the check reads, without the minutes of later stages
            got = {m.group(1).count("=") for m in re.finditer(r"scf\.for .*? iter_args\((.*?)\) ->", ttir)}
            if got != want:
                failed += 1
                print(f"FAILED loop carries of {fn.__name__} {const}: {sorted(got)}, expected {sorted(want)}",
                      file=sys.stderr)
    return failed


def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]


def _register_cap() -> int:
    """TUNING conv_maxnreg reaches the compile: the levels' convolution (168 registers uncapped, sm_90 bf16) within
    a cap of 128."""
    from benchmarks.sass_stats import analyse
    from wtconvnext.ops import triton_kernels as tk

    regs = {}
    for cap in (0, 128):
        tk.TUNING["conv_maxnreg"] = cap
        regs[cap] = analyse("conv_levels", 96, "bf16")["registers"]
    tk.TUNING["conv_maxnreg"] = 0
    if not (regs[128] <= 128 < regs[0]):
        print(f"FAILED register cap: {regs} registers uncapped / capped at 128", file=sys.stderr)
        return 1
    # dx_maxnreg: the input gradient's base convolution in bf16 takes it, in fp32 not (it would spill there).
    saved = tk.TUNING["dx_maxnreg"]
    dx = {}
    for cap, dtype in ((0, "bf16"), (128, "bf16"), (128, "fp32")):
        tk.TUNING["dx_maxnreg"] = cap
        dx[cap, dtype] = analyse("dx_base_onload", 96, dtype)["registers"]
    tk.TUNING["dx_maxnreg"] = saved
    if not (dx[128, "bf16"] <= 128 < min(dx[0, "bf16"], dx[128, "fp32"])):
        print(f"FAILED dx register cap: {dx} registers (cap, dtype)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(1 if _compile_all() + _loop_carries() + _register_cap() else 0)
