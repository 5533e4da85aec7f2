"""Sweep the launch shapes of the fused WTConv kernels (tile elements x warps) on the current GPU.

    python benchmarks/tune_tiles.py [--out results/tune.json] [--dtypes bf16 fp32]

Times the forward (all level kernels) and the weight-gradient kernels separately at each WTConvNeXt-T stage shape
for every configuration and prints the best. The chosen values go into ``TUNING`` in
``wtconvnext/ops/triton_kernels.py`` (fixed tiles keep the weight gradients bitwise reproducible).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_layer import DTYPES, SHAPES, _bench  # noqa: E402
from wtconvnext.ops import triton_kernels as tk  # noqa: E402
from wtconvnext.ops import wtconv2d  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/tune.json")
    ap.add_argument("--dtypes", nargs="+", default=["bf16"])
    ap.add_argument("--elems", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8])
    args = ap.parse_args(argv)
    rows = []
    default = dict(tk.TUNING)
    for dname in args.dtypes:
        dtype = DTYPES[dname]
        for b, c, h, w, levels in SHAPES[:4]:
            x = torch.randn(b, c, h, w, device="cuda", dtype=dtype)
            dy = torch.randn_like(x)
            k = 5
            p = [torch.randn(c, 1, k, k, device="cuda", dtype=dtype) * 0.1, torch.zeros(c, device="cuda", dtype=dtype),
                 torch.ones(c, device="cuda", dtype=dtype), torch.randn(levels, c, 4, k, k, device="cuda", dtype=dtype),
                 torch.full((levels, c, 4), 0.1, device="cuda", dtype=dtype)]
            xpyr = tk.ll_pyramid(x, levels)
            gpyr = tk.ll_pyramid(dy, levels)
            for elems, warps in itertools.product(args.elems, args.warps):
                tk.TUNING.update(fwd_elems=elems, fwd_small_elems=elems, fwd_warps=warps, wgrad_elems=elems, wgrad_warps=warps)
                fwd = lambda: wtconv2d(x, *p, backend="triton")  # noqa: E731
                wgrad = lambda: tk.wtconv_weight_grads(xpyr, gpyr, k, levels)  # noqa: E731
                fwd()
                wgrad()
                row = dict(dtype=dname, C=c, H=h, levels=levels, elems=elems, warps=warps,
                           fwd_ms=_bench(fwd, rep=30), wgrad_ms=_bench(wgrad, rep=30))
                rows.append(row)
                print(row, flush=True)
            tk.TUNING.update(default)
    print("\nbest per shape:")
    for key in sorted({(r["dtype"], r["C"]) for r in rows}):
        sel = [r for r in rows if (r["dtype"], r["C"]) == key]
        bf = min(sel, key=lambda r: r["fwd_ms"])
        bw = min(sel, key=lambda r: r["wgrad_ms"])
        d = [r for r in sel if r["elems"] == default["fwd_elems"] and r["warps"] == 4]
        print(f"{key}: fwd best {bf['fwd_ms']:.3f} ms @ elems={bf['elems']} warps={bf['warps']}"
              f" (1024/4: {d[0]['fwd_ms'] if d else float('nan'):.3f}); wgrad best {bw['wgrad_ms']:.3f} ms @ "
              f"elems={bw['elems']} warps={bw['warps']} (1024/4: {d[0]['wgrad_ms'] if d else float('nan'):.3f})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
