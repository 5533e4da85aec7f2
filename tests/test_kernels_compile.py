"""Every Triton kernel compiles for an sm_90 GPU (Hopper, the H200), on any machine.

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
    yield tk._ll_kernel, dict(src_ptr=bf16, out_ptr=f32, Hs=i32, Ws=i32, TILES_N=i32, TILES=i32), \
        dict(C=96, BLOCK_M=4, BLOCK_N=4, BLOCK_C=64, COMPUTE=fp)
    for last, flip, stride in ((True, False, 1), (False, True, 1), (True, False, 2)):
        yield tk._level_fwd_kernel, dict(src_ptr=bf16, acc_ptr=f32, out_ptr=bf16, lw_ptr=f32, bw_ptr=f32, bb_ptr=f32,
                                         Hs=i32, Ws=i32, TILES_N=i32, TILES=i32), \
            dict(C=96, K=5, STRIDE=stride, HAS_LEVEL=True, HAS_ACC=True, IS_LAST=last, HAS_BIAS=last, FLIP=flip,
                 BLOCK_M=4, BLOCK_N=4, BLOCK_C=32, COMPUTE=fp)
    for base in (True, False):
        yield tk._wgrad_kernel, dict(xs_ptr=bf16, gs_ptr=bf16, part_ptr=f32, Hs=i32, Ws=i32, ROWS=i32, ROWS_PER=i32), \
            dict(C=96, K=5, TP=32, BASE=base, BLOCK_S=1, BLOCK_C=64, COMPUTE=fp)
    params = dict(w_ptr=f32, b_ptr=f32, bs_ptr=f32, ww_ptr=f32, ws_ptr=f32)
    grads = dict(dw_ptr=f32, db_ptr=f32, dbs_ptr=f32, dww_ptr=f32, dws_ptr=f32)
    for round_to in (None, tl.bfloat16, tl.float16):
        consts = dict(C=96, K=5, TP=32, HAS_BIAS=True, BLOCK_C=64, COMPUTE=fp, ROUND=round_to)
        yield tk._fold_kernel, dict(**params, bw_ptr=f32, bb_ptr=f32, lw_ptr=f32), consts
        yield tk._param_grads_kernel, dict(corr_ptr=f32, **params, **grads), consts
    yield tk._param_grads_kernel, dict(corr_ptr=f32, **{k: bf16 for k in [*params, *grads]}), \
        dict(C=96, K=5, TP=32, HAS_BIAS=False, BLOCK_C=64, COMPUTE=fp, ROUND=None)


def _row_cases():
    """The explicit-column kernels of issue 14's model A2 (``triton_rows``)."""
    import triton.language as tl

    from wtconvnext.ops import triton_rows as tr

    f32, bf16, i32, fp = "*fp32", "*bf16", "i32", tl.float32
    yield tr._analysis_kernel, dict(src_ptr=bf16, out_ptr=bf16, Hs=i32, Ws=i32, hc=i32, wc=i32, TILES_N=i32,
                                    TILES=i32), dict(C=96, PIX=384, LL_ONLY=False, BM=4, BN=4, BC=64, COMPUTE=fp)
    for flip, stride in ((False, 1), (True, 2)):
        yield tr._dw_cols_kernel, dict(x_ptr=bf16, acc_ptr=bf16, y_ptr=bf16, w_ptr=f32, b_ptr=f32, H=i32, W=i32,
                                       STRIPS=i32), \
            dict(CC=96, K=5, BW=4, BC=32, STRIDE=stride, HAS_ACC=True, HAS_BIAS=True, FLIP=flip, COMPUTE=fp)
    yield tr._wgrad_cols_kernel, dict(x_ptr=bf16, g_ptr=bf16, part_ptr=f32, H=i32, W=i32, STRIPS=i32, IMGS=i32,
                                      B=i32), dict(CC=384, K=5, BW=7, BC=64, COMPUTE=fp)
    yield tr._synth_kernel, dict(t_ptr=bf16, accin_ptr=bf16, dst_ptr=bf16, Hs=i32, Ws=i32, hc=i32, wc=i32,
                                 TILES_N=i32, TILES=i32), dict(C=96, HAS_ACC=True, BM=4, BN=4, BC=64, COMPUTE=fp)


def _compile_all() -> int:
    from benchmarks.common import compile_sm90

    failed = 0
    for fn, signature, constexprs in [*_cases(), *_row_cases()]:
        try:
            compile_sm90(fn, signature, constexprs)
        except Exception as e:  # report every failing kernel, then fail
            failed += 1
            print(f"FAILED {fn.__name__} {constexprs}:\n{e}\n", file=sys.stderr)
    return failed


def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]


if __name__ == "__main__":
    raise SystemExit(1 if _compile_all() else 0)
