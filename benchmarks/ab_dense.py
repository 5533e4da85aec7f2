"""Kernel model D (dense per-channel operator on the tensor cores) against the small-map FMA pass, side by side.

Usage (any CUDA GPU)::

    python benchmarks/ab_dense.py [--out results/ab_dense.json] [--shapes 2 3] [--configs BC,BM,BN,BK,WARPS ...]

For each small stage shape (bf16, B=128, channels-last) it times one forward pass and one input-gradient pass
(the flipped operator) of the dense kernel in each launch configuration, the current small-map pass
(``small_kernels``) on the same folded weights, and cuDNN's depthwise 7x7 / 5x5 forward for scale, checks each
dense result against the float64 reference, and prints a table of medians (``triton.testing.do_bench``) and the
ratios to the small pass; JSON rows as the other benchmarks write them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_layer import SHAPES  # noqa: E402
from benchmarks.common import gpu_env, report, with_entries, wtconv_inputs  # noqa: E402
from wtconvnext.ops import dense_kernels as dk  # noqa: E402
from wtconvnext.ops import triton_kernels as tk  # noqa: E402
from wtconvnext.ops.reference import wtconv2d_reference  # noqa: E402

CONFIGS = [  # bc, bm, bn, bk, warps
    (8, 32, 64, 32, 4), (8, 16, 128, 32, 4), (8, 32, 128, 32, 8), (16, 16, 64, 32, 4), (16, 32, 64, 32, 8),
    (4, 32, 128, 32, 4), (4, 64, 64, 32, 4), (8, 64, 64, 32, 8), (8, 32, 64, 16, 4), (8, 32, 64, 64, 4),
    (16, 16, 128, 16, 8), (4, 16, 128, 64, 4), (2, 32, 128, 32, 2), (8, 16, 64, 32, 2),
]


def _bench(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/ab_dense.json")
    ap.add_argument("--shapes", nargs="+", type=int, default=[2, 3])
    ap.add_argument("--configs", nargs="+", default=None, help="BC,BM,BN,BK,WARPS each (default: a built-in sweep)")
    ap.add_argument("--split", nargs="+", type=int, default=[1], help="split settings to time (1: hi + lo)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("ab_dense.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = True
    configs = [tuple(int(v) for v in s.split(",")) for s in args.configs] if args.configs else CONFIGS
    cl = torch.channels_last
    rows = []
    for si in args.shapes:
        b, c, h, w, levels = SHAPES[si]
        x, dy, p = wtconv_inputs(b, c, h, w, levels, torch.bfloat16)
        x, dy = x.contiguous(memory_format=cl), dy.contiguous(memory_format=cl)
        weight, bias, bscale, wweight, wscale = p
        base_w, base_b, level_w = tk.folded_weights(weight, bias, bscale, wweight, wscale)
        table = dk.dense_table(level_w)
        ref = wtconv2d_reference(x.double(), *[t.double() for t in p]).float()
        out = torch.empty_like(x)

        def small(flip: bool):
            return lambda: tk._small_pass(dy if flip else x, out, base_w, None if flip else base_b, level_w, 1, flip,
                                          None)

        shape = f"{b},{c},{h},{w},{levels}"
        base = {}
        for name, fn in (("small_fwd", small(False)), ("small_dx", small(True))):
            fn()
            base[name] = _bench(fn)
            rows.append(dict(shape=shape, impl=name, ms=base[name]))
        for k in (7, 5):
            wk = (torch.randn(c, 1, k, k, device="cuda") * 0.1).to(torch.bfloat16)
            fn = lambda wk=wk, k=k: F.conv2d(x, wk, None, padding=k // 2, groups=c)  # noqa: E731
            fn()
            rows.append(dict(shape=shape, impl=f"cudnn_dw{k}_fwd", ms=_bench(fn)))
        for split in args.split:
            for bc, bm, bn, bk, warps in configs:
                tuning = dict(bc=bc, bm=bm, bn=bn, bk=bk, warps=warps, split=split)
                for flip in (False, True):
                    src = dy if flip else x

                    def run(src=src, flip=flip):
                        dk.dense_pass(src, out, base_w, None if flip else base_b, table, 1, flip)

                    fn = with_entries(run, dk.DENSE_TUNING, tuning)
                    try:
                        out.fill_(float("nan"))
                        fn()
                        torch.cuda.synchronize()
                    except Exception as e:  # a configuration the compiler rejects (registers, shared memory)
                        rows.append(dict(shape=shape, impl="dense", flip=flip, **tuning, error=str(e)[:200]))
                        print(f"{shape} dense {tuning} flip={flip}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                        continue
                    rel = float("nan")
                    if not flip:
                        rel = ((out.float() - ref).norm() / ref.norm()).item()
                    ms = _bench(fn)
                    vs = base["small_dx" if flip else "small_fwd"] / ms
                    rows.append(dict(shape=shape, impl="dense", flip=flip, **tuning, ms=ms, speedup=vs, rel_err=rel))
                    print(f"{shape} dense bc{bc} bm{bm} bn{bn} bk{bk} w{warps} s{split} {'dx ' if flip else 'fwd'}: "
                          f"{ms:.4f} ms ({vs:.2f}x small) rel {rel:.2e}", flush=True)
        for r in rows:
            if r["shape"] == shape and "dense" != r["impl"]:
                print(f"{shape} {r['impl']}: {r['ms']:.4f} ms", flush=True)
        del x, dy, out, ref
        torch.cuda.empty_cache()
    hdr = f"{'shape':18} {'impl':14} {'config':28} {'ms':>8} {'vs small':>9} {'rel err':>9}"
    lines = []
    for r in rows:
        cfg = (f"bc{r['bc']} bm{r['bm']} bn{r['bn']} bk{r['bk']} w{r['warps']} s{r['split']} "
               f"{'dx' if r['flip'] else 'fwd'}") if r["impl"] == "dense" else ""
        if "error" in r:
            lines.append(f"{r['shape']:18} {r['impl']:14} {cfg:28} failed: {r['error'][:60]}")
            continue
        lines.append(f"{r['shape']:18} {r['impl']:14} {cfg:28} {r['ms']:8.4f} {r.get('speedup', float('nan')):9.2f} "
                     f"{r.get('rel_err', float('nan')):9.2e}")
    report(args.out, gpu_env(), hdr, lines, rows, note="bf16, B=128, channels-last; median ms per pass")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
