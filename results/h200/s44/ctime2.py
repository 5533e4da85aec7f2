"""Compile time (sm_90, this machine's triton) of each level-1-on-load specialisation, one process each."""
import multiprocessing as mp, sys, time
sys.path.insert(0, ".")

def cases():
    import triton.language as tl
    from wtconvnext.ops import triton_kernels as tk
    f32, bf16, i32, fp = "*fp32", "*bf16", "i32", tl.float32
    wg = dict(x_ptr=bf16, g_ptr=bf16, part_ptr=f32, H=i32, W=i32, B=i32, IMGS=i32, G0=i32, GT=i32)
    pair = dict(x_ptr=bf16, g_ptr=bf16, bpart_ptr=f32, cx_ptr=bf16, cg_ptr=bf16, lpart_ptr=f32, H=i32, W=i32, B=i32,
                IMGS=i32, G0=i32, GT=i32, R0=i32)
    conv = dict(x_ptr=bf16, acc_ptr=bf16, acc2_ptr=bf16, y_ptr=bf16, w_ptr=f32, b_ptr=f32, acc2_off=i32, H=i32, W=i32, B=i32)
    pg = dict(bpart_ptr=f32, lpart_ptr=f32, w_ptr=f32, b_ptr=f32, bs_ptr=f32, ww_ptr=f32, ws_ptr=f32, dw_ptr=f32, db_ptr=f32, dbs_ptr=f32, dww_ptr=f32, dws_ptr=f32, R0=i32, H=i32, W=i32, B=i32, IMGS=i32)
    return {
        "wgrad level1 stored K5 unroll": (tk._wgrad_kernel, wg, dict(CC=384, K=5, TP=32, LEVELS=1, BW=7, BC=64, DSUM=False, COMPUTE=fp, UNROLL=True, SKIP1=False, ONLOAD=False), 2),
        "pair skip1 K5 unroll": (tk._wgrad_pair_kernel, pair, dict(C=96, K=5, TP=32, LEVELS=5, BW=7, BC0=32, BC=64, COMPUTE=fp, UNROLL=True, SKIP1=True), 2),
        "pgrad split1": (tk._param_grads_kernel, pg, dict(C=96, K=5, TP=32, LEVELS=5, BW=7, HAS_BIAS=True, BLOCK_C=8, COMPUTE=fp, ROUND=None, RB=16, SPLIT=1), 8),
        "pgrad split2": (tk._param_grads_kernel, pg, dict(C=96, K=5, TP=32, LEVELS=5, BW=7, HAS_BIAS=True, BLOCK_C=8, COMPUTE=fp, ROUND=None, RB=16, SPLIT=2), 8),
        "analysis NL1": (tk._analysis_kernel, dict(src_ptr=bf16, coef_ptr=bf16, src2_ptr=bf16, coef2_ptr=bf16, src_off=i32, coef_off=i32, H0=i32, W0=i32, B=i32, PATCHES_W=i32, PATCHES=i32), dict(C=96, SRC_PIX=96, NL=1, M=4, BC=32, CHUNK=64, COMPUTE=fp), 4),
    }

def one(name):
    from benchmarks.common import compile_sm90
    fn, sig, c, w = cases()[name]
    t = time.time()
    compile_sm90(fn, sig, c, w)
    return name, time.time() - t

if __name__ == "__main__":
    t0 = time.time()
    with mp.Pool(2) as pool:
        for name, dt in pool.imap_unordered(one, list(cases())):
            print(f"{dt:7.1f} s  {name}  (at {time.time() - t0:.0f} s)", flush=True)
