"""Session 39: the operator-matrix path's parts, one at a time, with launch-shape variants, beside today's layer
and cuDNN dw7 (bf16, channels-last). Prints a table, writes JSON to argv[1]."""
import json
import os
import sys

CPU = os.environ.get("PARTS_CPU") == "1"  # a dry run of the plumbing under the interpreter
if CPU:
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, ".")
from benchmarks.common import wtconv_inputs  # noqa: E402
from wtconvnext.ops import matrix_kernels as mk  # noqa: E402
from wtconvnext.ops import triton_kernels as tk  # noqa: E402
from wtconvnext.ops import wtconv2d  # noqa: E402

extra = {}
try:
    sys.path.insert(0, "tmp_call")
    import cand  # noqa: E402  candidate kernels

    extra = cand.CANDIDATES
except ImportError as e:
    print("no candidates:", e)

rows = []


def bench(name, fn, shape):
    try:
        fn()
        if CPU:
            print(f"{shape:22s} {name:48s} ran", flush=True)
            return
        torch.cuda.synchronize()
        ms = float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    except Exception as e:  # a variant that does not compile
        print(f"{shape:22s} {name:48s} FAILED {type(e).__name__}: {str(e)[:200]}")
        rows.append({"shape": shape, "part": name, "ms": None, "error": str(e)[:300]})
        return
    print(f"{shape:22s} {name:48s} {ms:8.4f} ms", flush=True)
    rows.append({"shape": shape, "part": name, "ms": ms})


DEV = "cpu" if CPU else "cuda"
for (b, c, h, w, L) in ([(2, 8, 14, 14, 3), (2, 8, 7, 7, 2)] if CPU else [(128, 384, 14, 14, 3), (128, 768, 7, 7, 2)]):
    shape = f"{b},{c},{h}x{w},L{L}"
    dt = torch.bfloat16
    x, dy, p = wtconv_inputs(b, c, h, w, L, dt, DEV, 5)
    x = x.contiguous(memory_format=torch.channels_last)
    dy = dy.contiguous(memory_format=torch.channels_last)
    bw, bb, lw = tk.folded_weights(*p, round_to=None)
    n = h * w
    m = mk._build(bw, lw, h, w, dt)
    ns = m.shape[-1]
    mu = torch.empty((c, n, n), dtype=dt, device=DEV)  # unpadded rows (session 38's layout)
    tk._launch(mk._matrix_build_kernel, (tk._cdiv(n * n, 256), tk._cdiv(c, 8)), (bw, lw, mu, n, w, n), 4,
               C=c, K=5, LEVELS=L, BPQ=256, BC=8, COMPUTE=tk._compute_dtype(dt))
    y = torch.empty_like(x)
    bench("fold", lambda: tk.folded_weights(*p, round_to=None), shape)
    for bpq, bc, wp in [(256, 8, 4), (512, 8, 8), (256, 16, 4), (1024, 2, 4)]:
        def f(bpq=bpq, bc=bc, wp=wp):
            tk._launch(mk._matrix_build_kernel, (tk._cdiv(ns * ns, bpq), tk._cdiv(c, bc)), (bw, lw, m, n, w, ns), wp,
                       C=c, K=5, LEVELS=L, BPQ=bpq, BC=bc, COMPUTE=tk._compute_dtype(dt))
        bench(f"build BPQ={bpq} BC={bc} w={wp}", f, shape)
    for trans in (False, True):
        for mm, tag in ((m, ""), (mu, " unpadded")):
            for bbt, bn, bk, wp in [(64, 64, 32, 4), (64, 64, 64, 4), (128, 64, 32, 8), (64, 32, 32, 4),
                                    (32, 64, 32, 4)]:
                if tag and (bbt, bn, bk, wp) != (64, 64, 32, 4):
                    continue
                def f(bbt=bbt, bn=bn, bk=bk, wp=wp, trans=trans, mm=mm):
                    grid = (tk._cdiv(b, bbt) * tk._cdiv(n, bn), tk._cdiv(c, 4))
                    tk._launch(mk._matrix_apply_kernel, grid, (x, mm, bb if not trans else mm, y, b, n, mm.shape[-1]),
                               wp, C=c, TRANS=trans, HAS_BIAS=not trans and bb is not None, BB=bbt, BN=bn, BK=bk,
                               COMPUTE=tk._compute_dtype(dt))
                bench(f"apply{' T' if trans else ''}{tag} BB={bbt} BN={bn} BK={bk} w={wp}", f, shape)
    def wgrad():
        cdy, cx = tk.coefficient_pair(dy, x, L)
        parts = tk.weight_partials(x, dy, cx, cdy, 5, L, None, 0, b)
        return tk.param_grads(parts, tuple(x.shape), *p, None)
    bench("weight grads (coefficient_pair + weight_partials + param_grads)", wgrad, shape)
    for name, fn in extra.items():
        bench(name, fn(x, dy, p, bw, bb, lw, m), shape)
    # whole layers, same run
    xr = x.detach().requires_grad_()
    ps = [t.detach().requires_grad_() for t in p]
    fwd = lambda: wtconv2d(xr, *ps, stride=1)  # noqa: E731
    bench("layer today fwd", fwd, shape)
    bench("layer today f+b", lambda: torch.autograd.grad(fwd(), [xr, *ps], dy), shape)
    with torch.no_grad():
        bench("layer today infer (no_grad)", lambda: wtconv2d(x, *p, stride=1), shape)
    saved = dict(tk.TUNING)
    tk.TUNING.update(matrix_max=16, matrix_min_b=1)
    bench("layer matrix fwd", fwd, shape)
    bench("layer matrix f+b", lambda: torch.autograd.grad(fwd(), [xr, *ps], dy), shape)
    with torch.no_grad():
        bench("layer matrix infer (no_grad, cached M)", lambda: wtconv2d(x, *p, stride=1), shape)
    tk.TUNING.clear()
    tk.TUNING.update(saved)
    w7 = (torch.randn(c, 1, 7, 7, device=DEV) * 0.1).to(dt).requires_grad_()
    b7 = torch.zeros(c, device=DEV, dtype=dt).requires_grad_()
    f7 = lambda: F.conv2d(xr, w7, b7, padding=3, groups=c)  # noqa: E731
    bench("dw7 fwd", f7, shape)
    bench("dw7 f+b", lambda: torch.autograd.grad(f7(), [xr, w7, b7], dy), shape)
    with torch.no_grad():
        bench("dw7 infer (no_grad)", lambda: F.conv2d(x, w7, b7, padding=3, groups=c), shape)

json.dump({"gpu": "cpu" if CPU else torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "rows": rows}, open(sys.argv[1], "w"), indent=1)
