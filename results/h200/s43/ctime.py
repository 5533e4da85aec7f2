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
    return {
        "level1 K5": (tk._level1_kernel, dict(x_ptr=bf16, y_ptr=bf16, w_ptr=f32, H=i32, W=i32), dict(C=96, K=5, BW=2, BC=32, FLIP=False, COMPUTE=fp), 1),
        "wgrad onload K5 unroll": (tk._wgrad_kernel, wg, dict(CC=384, K=5, TP=32, LEVELS=1, BW=7, BC=64, DSUM=False, COMPUTE=fp, UNROLL=True, SKIP1=False, ONLOAD=True), 2),
        "wgrad onload K5 rows": (tk._wgrad_kernel, wg, dict(CC=384, K=5, TP=32, LEVELS=1, BW=7, BC=64, DSUM=False, COMPUTE=fp, UNROLL=False, SKIP1=False, ONLOAD=True), 2),
        "pair skip1 K5 unroll": (tk._wgrad_pair_kernel, pair, dict(C=96, K=5, TP=32, LEVELS=5, BW=7, BC0=32, BC=64, COMPUTE=fp, UNROLL=True, SKIP1=True), 2),
        "pair K5 unroll (today)": (tk._wgrad_pair_kernel, pair, dict(C=96, K=5, TP=32, LEVELS=5, BW=7, BC0=32, BC=64, COMPUTE=fp, UNROLL=True, SKIP1=False), 2),
        "conv syn1=2 acc2": (tk._conv_kernel, conv, dict(CC=96, K=5, LEVELS=0, BW=4, BC=64, STRIDE=1, HAS_ACC=True, HAS_BIAS=True, FLIP=False, COMPUTE=fp, SYN1=2, HAS_ACC2=True, SYN_AHEAD=1, LV0=0), 1),
        "analysis skip1": (tk._analysis_kernel, dict(src_ptr=bf16, coef_ptr=bf16, src2_ptr=bf16, coef2_ptr=bf16, src_off=i32, coef_off="i64", H0=i32, W0=i32, B=i32, PATCHES_W=i32, PATCHES=i32), dict(C=96, SRC_PIX=96, NL=4, M=1, BC=32, CHUNK=64, COMPUTE=fp, SKIP1=True), 4),
    }

def one(name):
    from benchmarks.common import compile_sm90
    fn, sig, c, w = cases()[name]
    t = time.time()
    compile_sm90(fn, sig, c, w)
    return name, time.time() - t

if __name__ == "__main__":
    t0 = time.time()
    with mp.Pool(7) as pool:
        for name, dt in pool.imap_unordered(one, list(cases())):
            print(f"{dt:7.1f} s  {name}  (at {time.time() - t0:.0f} s)", flush=True)
