"""Sweep the launch shapes of the fused WTConv kernels on the current GPU and write the best as a tuning file.

    python benchmarks/tune_tiles.py [--out results/tune.json] [--best-out tuned.json] [--dtypes bf16 fp32]

Times the forward (pyramid + level kernels) and the weight gradients (kernels + the streamed pyramid of x)
separately at each WTConvNeXt-T stage shape for every configuration, prints the best per shape, and writes to
``--best-out`` the configuration with the least total time over the shapes (forward and weight-gradient chosen
independently). Use it with ``WTCONVNEXT_TUNING=<best-out>`` or copy it into ``TUNING`` in
``wtconvnext/ops/triton_kernels.py``; fixed shapes keep the weight gradients bitwise reproducible.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_layer import DTYPES, SHAPES, _bench  # noqa: E402
from benchmarks.common import gpu_env, write_json  # noqa: E402
from wtconvnext.ops import triton_kernels as tk  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/tune.json")
    ap.add_argument("--best-out", default=None, help="write the best configuration here (JSON for WTCONVNEXT_TUNING)")
    ap.add_argument("--dtypes", nargs="+", default=["bf16"])
    ap.add_argument("--fwd-positions", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--fwd-block-c", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--fwd-warps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--fwd-stages", type=int, nargs="+", default=[3], help="software-pipelining depth (num_stages)")
    ap.add_argument("--wgrad-positions", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--wgrad-block-c", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--wgrad-warps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--wgrad-stages", type=int, nargs="+", default=[3])
    args = ap.parse_args(argv)
    default = dict(tk.TUNING)
    rows = []
    k = 5
    for dname in args.dtypes:
        dtype = DTYPES[dname]
        for b, c, h, w, levels in SHAPES[:4]:
            x = torch.randn(b, c, h, w, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
            dy = torch.randn_like(x)
            p = [torch.randn(c, 1, k, k, device="cuda", dtype=dtype) * 0.1, torch.zeros(c, device="cuda", dtype=dtype),
                 torch.ones(c, device="cuda", dtype=dtype), torch.randn(levels, c, 4, k, k, device="cuda", dtype=dtype),
                 torch.full((levels, c, 4), 0.1, device="cuda", dtype=dtype)]
            folded = tk.folded_weights(*p)
            out = torch.empty_like(x)
            gpyr = tk.ll_pyramid(dy, levels)

            def fwd():
                tk.wtconv_forward(tk.ll_pyramid(x, levels), out, *folded, 1)

            def wgrad():
                tk.wtconv_weight_grads(x, gpyr, k, levels)

            sweeps = (("fwd", fwd, (args.fwd_positions, args.fwd_block_c, args.fwd_warps, args.fwd_stages)),
                      ("wgrad", wgrad, (args.wgrad_positions, args.wgrad_block_c, args.wgrad_warps,
                                        args.wgrad_stages)))
            for kern, fn, space in sweeps:
                for pos, bc, warps, stages in itertools.product(*space):
                    tk.TUNING.update({f"{kern}_positions": pos, f"{kern}_block_c": bc, f"{kern}_warps": warps,
                                      f"{kern}_stages": stages})
                    fn()  # compile outside the timing
                    rows.append(dict(kernel=kern, dtype=dname, C=c, H=h, levels=levels, positions=pos, block_c=bc,
                                     warps=warps, stages=stages, ms=_bench(fn, warmup=5, rep=20)))
                    print(rows[-1], flush=True)
                tk.TUNING.update(default)
    best = {}
    knobs = ("positions", "block_c", "warps", "stages")
    print("\nbest per shape (default in brackets):")
    for kern in ("fwd", "wgrad"):
        sel = [r for r in rows if r["kernel"] == kern]
        dflt = tuple(default[f"{kern}_{n}"] for n in knobs)
        for key in sorted({(r["dtype"], r["C"]) for r in sel}):
            cand = [r for r in sel if (r["dtype"], r["C"]) == key]
            b = min(cand, key=lambda r: r["ms"])
            d = [r for r in cand if tuple(r[n] for n in knobs) == dflt]
            dms = f"{d[0]['ms']:.3f}" if d else "n/a"
            print(f"  {kern:5} {key}: {b['ms']:.3f} ms @ " + " ".join(f"{n}={b[n]}" for n in knobs) + f" [{dms}]")
        # The configuration with the least total time over all shapes and dtypes.
        totals: dict[tuple[int, ...], float] = {}
        for r in sel:
            cfg = tuple(r[n] for n in knobs)
            totals[cfg] = totals.get(cfg, 0.0) + r["ms"]
        cfg = min(totals, key=totals.get)
        best.update({f"{kern}_{n}": v for n, v in zip(knobs, cfg)})
        print(f"  {kern:5} best overall: " + " ".join(f"{n}={v}" for n, v in zip(knobs, cfg))
              + f", total {totals[cfg]:.3f} ms")
    write_json(args.out, dict(env=gpu_env(), rows=rows, best=best, default=default))
    if args.best_out:
        write_json(args.best_out, best)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
