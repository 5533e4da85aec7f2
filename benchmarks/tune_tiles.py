"""Sweep the launch shapes of the fused WTConv kernels on the current GPU and write the best as a tuning file.

    python benchmarks/tune_tiles.py [--out results/tune.json] [--best-out tuned.json] [--dtypes bf16 fp32]

Times the forward (analysis, level and base convolutions, synthesis; the convolutions' and the analysis /
synthesis kernels' knobs swept separately, at the shapes that take the multi-launch path) and the weight-gradient
kernels at each WTConvNeXt-T stage shape for every configuration, prints the best per shape, and writes to
``--best-out`` the configuration with the least total time over the shapes (each family of knobs chosen
independently; with ``--mem-slack F``, the least peak memory among those within F of the fastest). Use it with
``WTCONVNEXT_TUNING=<best-out>`` or copy it into ``TUNING`` in ``wtconvnext/ops/triton_kernels.py``; fixed shapes
keep the weight gradients bitwise reproducible. Every knob of ``KNOBS`` has its own option, e.g.
``--conv-bw 4 7 --wgrad-imgs 2 4 8``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_layer import DTYPES, SHAPES, _bench, _peak_mb  # noqa: E402
from benchmarks.common import gpu_env, write_json, wtconv_inputs  # noqa: E402
from wtconvnext.ops import triton_kernels as tk  # noqa: E402


# The launch-shape knobs of each kernel family (TUNING keys are "<kernel>_<knob>") and the values swept by default.
# "patch": the analysis and synthesis kernels, timed in the forward with the convolutions at their defaults.
KNOBS: dict[str, dict[str, list[int]]] = {
    "conv": {"bw": [4, 7, 8], "bc": [32, 64], "warps": [1, 2]},
    "patch": {"bc": [32, 64], "warps": [4, 8], "chunk": [64, 128]},
    "wgrad": {"bw": [4, 7, 8], "bc": [32, 64], "warps": [1, 2], "imgs": [2, 4]},
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/tune.json")
    ap.add_argument("--best-out", default=None, help="write the best configuration here (JSON for WTCONVNEXT_TUNING)")
    ap.add_argument("--dtypes", nargs="+", default=["bf16"])
    ap.add_argument("--mem-slack", type=float, default=0.0,
                    help="pick the least peak memory among configurations within this fraction of the fastest")
    for kern, knobs in KNOBS.items():
        for knob, values in knobs.items():
            ap.add_argument(f"--{kern}-{knob.replace('_', '-')}", type=int, nargs="+", default=values)
    args = ap.parse_args(argv)
    default = dict(tk.TUNING)
    rows = []
    k = 5
    for dname in args.dtypes:
        dtype = DTYPES[dname]
        for b, c, h, w, levels in SHAPES[:4]:
            x, dy, p = wtconv_inputs(b, c, h, w, levels, dtype, "cuda", k)
            x, dy = x.contiguous(memory_format=torch.channels_last), dy.contiguous(memory_format=torch.channels_last)
            folded = tk.folded_weights(*p)
            out = torch.empty_like(x)
            cx, cdy = tk.coefficients(x, levels), tk.coefficients(dy, levels)

            def fwd():
                tk.wtconv_forward(x, out, *folded, 1, onload=tk.onload_applies(x, levels, 1))

            def wgrad():
                tk.weight_partials(x, dy, cx, cdy, k, levels)

            for kern, fn in (("conv", fwd), ("patch", fwd), ("wgrad", wgrad)):
                if kern != "wgrad" and tk.small_applies(x, levels):
                    continue  # a small map's pass is one launch of its own, with its own small_* knobs
                names = list(KNOBS[kern])
                for cfg in itertools.product(*(getattr(args, f"{kern}_{n}") for n in names)):
                    tk.TUNING.update({f"{kern}_{n}": v for n, v in zip(names, cfg)})
                    fn()  # compile outside the timing
                    rows.append(dict(kernel=kern, dtype=dname, C=c, H=h, levels=levels, **dict(zip(names, cfg)),
                                     ms=_bench(fn, warmup=5, rep=20), peak_mb=_peak_mb(fn)))
                    print(rows[-1], flush=True)
                tk.TUNING.update(default)
    best = {}
    print("\nbest per shape (default in brackets):")
    for kern, knobs in KNOBS.items():
        names = list(knobs)
        sel = [r for r in rows if r["kernel"] == kern]
        dflt = tuple(default[f"{kern}_{n}"] for n in names)
        for key in sorted({(r["dtype"], r["C"]) for r in sel}):
            cand = [r for r in sel if (r["dtype"], r["C"]) == key]
            b = min(cand, key=lambda r: r["ms"])
            d = [r for r in cand if tuple(r[n] for n in names) == dflt]
            dms = f"{d[0]['ms']:.3f}" if d else "n/a"
            print(f"  {kern:5} {key}: {b['ms']:.3f} ms @ " + " ".join(f"{n}={b[n]}" for n in names) + f" [{dms}]")
        # Over all shapes and dtypes: total time, and the largest peak memory of one call.
        totals: dict[tuple[int, ...], list[float]] = {}
        for r in sel:
            t = totals.setdefault(tuple(r[n] for n in names), [0.0, 0.0])
            t[0] += r["ms"]
            t[1] = max(t[1], r["peak_mb"])
        fastest = min(t[0] for t in totals.values())
        cfg = min((c for c, t in totals.items() if t[0] <= fastest * (1 + args.mem_slack)),
                  key=lambda c: (totals[c][1], totals[c][0]))
        best.update({f"{kern}_{n}": v for n, v in zip(names, cfg)})
        print(f"  {kern:5} best overall: " + " ".join(f"{n}={v}" for n, v in zip(names, cfg))
              + f", total {totals[cfg][0]:.3f} ms, peak {totals[cfg][1]:.1f} MB")
    write_json(args.out, dict(env=gpu_env(), rows=rows, best=best, default=default))
    if args.best_out:
        write_json(args.best_out, best)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
