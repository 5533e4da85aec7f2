"""Issue 14 A/B: the row-streaming kernel models against today's kernels and cuDNN, pass by pass.

Usage (CUDA GPU)::

    python benchmarks/ab_rows.py [--out results/ab_rows.json] [--shapes 0 2] [--configs 8,32,4 16,32,4]

For each WTConvNeXt-T stage shape (B=128, bf16, channels-last) it times, separately, the forward, the input
gradient and the weight gradient of:

- ``dw5`` / ``dw7``: cuDNN's depthwise convolution (``aten.convolution_backward`` for the two gradients);
- ``v7``: today's kernels (``triton_kernels``: LL pyramid, butterfly recomputed per tap);
- ``A``: coefficients stored once per level, plain row-streaming depthwise convolutions over them;
- ``B``: LL pyramid stored, the butterfly computed once per shifted window on chip;

each pass including the analysis it needs (A's backward analyses dy once for both gradients: counted in the input
gradient). Every candidate is first checked against today's kernels on the same inputs (bf16: max error relative to
the output's max). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import gpu_env, report, wtconv_inputs  # noqa: E402
from wtconvnext.ops import triton_kernels as tk  # noqa: E402
from wtconvnext.ops import triton_rows as tr  # noqa: E402

SHAPES = [(128, 96, 56, 56, 5), (128, 192, 28, 28, 4), (128, 384, 14, 14, 3), (128, 768, 7, 7, 2)]


def _bench(fn, rep: int) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median"))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/ab_rows.json")
    ap.add_argument("--shapes", nargs="+", type=int, default=[0, 1, 2, 3])
    ap.add_argument("--configs", nargs="*", default=["8,16,4", "8,32,8"],
                    help="BW,BC,warps of the row kernels")
    ap.add_argument("--imgs", nargs="+", type=int, default=[4], help="images per weight-gradient program")
    ap.add_argument("--models", nargs="+", default=["A", "B"])
    ap.add_argument("--a2-configs", nargs="*", default=["8,32,1,4", "8,64,2,4", "8,64,1,4"],
                    help="BW,BC,warps,images-per-weight-gradient-program of the explicit-column kernels (model A2)")
    ap.add_argument("--profile", action="store_true", help="kernel table of A2's first config")
    ap.add_argument("--rep", type=int, default=60)
    args = ap.parse_args(argv)
    torch.backends.cudnn.benchmark = True
    dt = torch.bfloat16
    rows = []
    lines = []

    def add(shape, impl, cfg, fwd=None, dgrad=None, wgrad=None, err=""):
        b, c, h, w, lv = shape
        r = dict(B=b, C=c, H=h, W=w, levels=lv, impl=impl, cfg=cfg, fwd_ms=fwd, dgrad_ms=dgrad, wgrad_ms=wgrad,
                 total_ms=sum(v for v in (fwd, dgrad, wgrad) if v is not None), check=err)
        rows.append(r)
        f = lambda v: f"{v:8.3f}" if v is not None else f"{'-':>8}"  # noqa: E731
        lines.append(f"{c:4},{h:3}²,L{lv} {impl:4} {cfg:10} {f(fwd)} {f(dgrad)} {f(wgrad)} {f(r['total_ms'])}  {err}")
        print(lines[-1], flush=True)

    for si in args.shapes:
        shape = SHAPES[si]
        b, c, h, w, lv = shape
        x, dy, p = wtconv_inputs(b, c, h, w, lv, dt, "cuda", 5)
        x = x.contiguous(memory_format=torch.channels_last)
        dy = dy.contiguous(memory_format=torch.channels_last)
        weight, bias, base_scale, ww, ws = p
        k = 5
        for kk in (5, 7):
            wt = (torch.randn(c, 1, kk, kk, device="cuda") * 0.1).to(dt)
            fwd = lambda: F.conv2d(x, wt, None, padding=kk // 2, groups=c)  # noqa: E731
            conv_bwd = torch.ops.aten.convolution_backward

            def dg():
                return conv_bwd(dy, x, wt, None, [1, 1], [kk // 2] * 2, [1, 1], False, [0, 0], c, [True, False, False])

            def wg():
                return conv_bwd(dy, x, wt, None, [1, 1], [kk // 2] * 2, [1, 1], False, [0, 0], c, [False, True, False])

            dg(), wg()
            add(shape, f"dw{kk}", "cudnn", _bench(fwd, args.rep), _bench(dg, args.rep), _bench(wg, args.rep))

        # Today's kernels.
        base_w, base_b, level_w = tk.folded_weights(weight, bias, base_scale, ww, ws)
        y_ref = torch.empty_like(x)

        def v7_fwd():
            tk.wtconv_forward(tk.ll_pyramid(x, lv), y_ref, base_w, base_b, level_w, 1)

        dx_ref = torch.empty_like(x)

        def v7_dgrad():
            tk.wtconv_forward(tk.ll_pyramid(dy, lv), dx_ref, base_w, None, level_w, 1, flip=True)

        def v7_wgrad():
            return tk.correlations(tk.ll_pyramid(x, lv), tk.ll_pyramid(dy, lv), k, lv)

        v7_fwd(), v7_dgrad()
        corr = v7_wgrad()  # (L + 1, 4, TP, C)
        add(shape, "v7", "today", _bench(v7_fwd, args.rep), _bench(v7_dgrad, args.rep), _bench(v7_wgrad, args.rep))

        for cfg in args.a2_configs:
            fcfg, _, wcfg = cfg.partition(":")  # forward shape, and optionally the weight gradient's own
            bw, bc, warps, imgs = (int(v) for v in fcfg.split(","))
            wbw, wbc, wwarps = (int(v) for v in wcfg.split(",")) if wcfg else (bw, bc, warps)
            try:
                def a2_fwd():
                    return tr.forward_cols(x, base_w, base_b, level_w, 1, bw=bw, bc=bc, warps=warps)

                def a2_dgrad():
                    return tr.forward_cols(dy, base_w, None, level_w, 1, flip=True, bw=bw, bc=bc, warps=warps)

                gsrc = tr.coefficients(dy, lv)

                def a2_wgrad():
                    return tr.weight_grads_cols(x, dy, lv, k, bw=wbw, bc=wbc, imgs=imgs, warps=wwarps, gsrc=gsrc)

                y, dx = a2_fwd(), a2_dgrad()
                base_g, lev_g = a2_wgrad()
                e_b = _rel(base_g, corr[0, 0, : k * k])
                e_l = max(_rel(lev_g[i], corr[i + 1, :, : k * k]) for i in range(lv))
                add(shape, "A2", cfg, _bench(a2_fwd, args.rep), _bench(a2_dgrad, args.rep), _bench(a2_wgrad, args.rep),
                    f"y {_rel(y, y_ref):.1e} dx {_rel(dx, dx_ref):.1e} dW {e_b:.1e} dWl {e_l:.1e}")
                if args.profile and cfg == args.a2_configs[0]:
                    from torch.profiler import ProfilerActivity, profile

                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(5):
                            a2_fwd(), a2_wgrad()
                        torch.cuda.synchronize()
                    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=40))
            except Exception as e:
                add(shape, "A2", cfg, err=f"failed: {type(e).__name__}: {str(e)[:300]}")

        for model in args.models:
            from_ll = model == "B"
            for cfg in args.configs:
                bw, bc, warps = (int(v) for v in cfg.split(","))
                try:
                    def m_fwd():
                        return tr.forward(x, base_w, base_b, level_w, 1, from_ll=from_ll, bw=bw, bc=bc, warps=warps)

                    def m_dgrad():
                        return tr.forward(dy, base_w, None, level_w, 1, flip=True, from_ll=from_ll, bw=bw, bc=bc,
                                          warps=warps)

                    y = m_fwd()
                    dx = m_dgrad()
                    err = f"y {_rel(y, y_ref):.1e} dx {_rel(dx, dx_ref):.1e}"
                    t_f, t_d = _bench(m_fwd, args.rep), _bench(m_dgrad, args.rep)
                except Exception as e:  # a config that does not compile or run is a result too
                    add(shape, model, cfg, err=f"failed: {type(e).__name__}: {str(e)[:200]}")
                    continue
                for imgs in args.imgs:
                    try:
                        if from_ll:
                            def m_wgrad():
                                return tr.weight_grads(x, dy, lv, k, from_ll=True, bw=bw, bc=bc, imgs=imgs,
                                                       warps=warps)
                        else:
                            # The backward analyses dy once for both gradients (timed in the input gradient's
                            # own analysis above); the weight gradient pays x's analysis.
                            gsrc = tr.coefficients(dy, lv)

                            def m_wgrad():
                                return tr.weight_grads(x, dy, lv, k, bw=bw, bc=bc, imgs=imgs, warps=warps,
                                                       gsrc=gsrc)
                        base_g, lev_g = m_wgrad()
                        e_b = _rel(base_g, corr[0, 0, : k * k])
                        e_l = max(_rel(lev_g[i], corr[i + 1, :, : k * k]) for i in range(lv))
                        t_w = _bench(m_wgrad, args.rep)
                        add(shape, model, f"{cfg}/{imgs}", t_f, t_d, t_w, err + f" dW {e_b:.1e} dWl {e_l:.1e}")
                    except Exception as e:
                        add(shape, model, f"{cfg}/{imgs}", t_f, t_d, None, err + f" wgrad failed: {str(e)[:200]}")
        del x, dy
        torch.cuda.empty_cache()

    hdr = f"{'shape':14} {'impl':4} {'config':10} {'fwd ms':>8} {'dgrad ms':>8} {'wgrad ms':>8} {'total':>8}  check"
    report(args.out, gpu_env(), hdr, lines, rows,
           note="bf16 channels-last, B=128; check: max error relative to max |today's result|")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
