"""Layer-level benchmark: fused WTConv vs the reference path vs PyTorch's depthwise convs, side by side.

Usage (any CUDA GPU)::

    python benchmarks/bench_layer.py [--out results/layer.json] [--dtypes fp32 bf16] [--quick]
    python benchmarks/bench_layer.py --rows-from LOG --env '{"gpu": ...}' --out layer.json   # a cut run's rows

For every WTConvNeXt-T stage shape at B=128 and a high-resolution one, in each dtype, it times forward and
forward + backward (median of ``triton.testing.do_bench``) and measures the peak memory of forward + backward
(``max_memory_allocated`` above what was allocated before), then prints a table with the ratios to the faster
layout of depthwise 7x7 (cuDNN) and writes everything as JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import gpu_env, report, tuning_entries, with_entries, write_json, wtconv_inputs  # noqa: E402
from wtconvnext.ops import launch_plan  # noqa: E402
from wtconvnext.ops import triton_kernels as tk  # noqa: E402
from wtconvnext.ops import wtconv2d  # noqa: E402

SHAPES = [  # B, C, H, W, levels
    (128, 96, 56, 56, 5),
    (128, 192, 28, 28, 4),
    (128, 384, 14, 14, 3),
    (128, 768, 7, 7, 2),
    (16, 96, 128, 128, 5),
]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _bench(fn, warmup: int = 25, rep: int = 100) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def _peak_mb(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def _cases(b, c, h, w, levels, dtype, k=5, variants=()):
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device=dev, generator=g) * scale).to(dtype)

    x, dy, p = wtconv_inputs(b, c, h, w, levels, dtype, dev, k, generator=g)
    dw7 = [rnd(c, 1, 7, 7, scale=0.1), rnd(c, scale=0.1)]
    dw5 = [rnd(c, 1, 5, 5, scale=0.1), rnd(c, scale=0.1)]
    cl = torch.channels_last
    cases = {}

    def wt(backend, fmt):
        xi = x.contiguous(memory_format=fmt).requires_grad_()
        dyi = dy.contiguous(memory_format=fmt)
        ps = [t.detach().requires_grad_() for t in p]
        fwd = lambda: wtconv2d(xi, *ps, stride=1, backend=backend)  # noqa: E731
        return fwd, (lambda: torch.autograd.grad(fwd(), [xi, *ps], dyi)), xi

    def dw(wb, fmt):
        xi = x.contiguous(memory_format=fmt).requires_grad_()
        dyi = dy.contiguous(memory_format=fmt)
        ws = [t.detach().requires_grad_() for t in wb]
        kk = ws[0].shape[-1]
        fwd = lambda: F.conv2d(xi, ws[0], ws[1], padding=kk // 2, groups=c)  # noqa: E731
        return fwd, (lambda: torch.autograd.grad(fwd(), [xi, *ws], dyi)), xi

    cases["wtconv_triton_nchw"] = wt("triton", torch.contiguous_format)
    cases["wtconv_triton_cl"] = wt("triton", cl)
    for v, entries in variants:  # the channels-last layer with TUNING overrides (an A/B of a knob, same run)
        fwd, fwdbwd, xi = wt("triton", cl)
        cases[f"wtconv_triton_cl+{v}"] = (with_entries(fwd, tk.TUNING, entries),
                                          with_entries(fwdbwd, tk.TUNING, entries), xi)
    cases["wtconv_reference"] = wt("reference", torch.contiguous_format)
    cases["dw7_nchw"] = dw(dw7, torch.contiguous_format)
    cases["dw7_cl"] = dw(dw7, cl)
    cases["dw5_nchw"] = dw(dw5, torch.contiguous_format)
    cases["dw5_cl"] = dw(dw5, cl)
    return cases


def row_line(r: dict) -> str:
    """The line a run prints per row as it goes; :func:`rows_from_log` reads it back (``_ROW``)."""
    return (f"{r['dtype']} {r['B']},{r['C']},{r['H']},{r['W']},{r['levels']} {r['impl']}: fwd {r['fwd_ms']:.3f} ms, "
            f"fwd+bwd {r['fwdbwd_ms']:.3f} ms, {r['peak_mb']:.1f} MB")


_ROW = re.compile(r"^(\w+) (\d+),(\d+),(\d+),(\d+),(\d+) (\S+): fwd ([\d.]+) ms, fwd\+bwd ([\d.]+) ms, ([\d.]+) MB$")


def rows_from_log(path: str) -> list[dict]:
    """The rows a run printed one by one (its per-row lines), e.g. of a run its time limit cut before the table."""
    rows = []
    for line in Path(path).read_text().splitlines():
        m = _ROW.match(line.strip())
        if m:
            d, b, c, h, w, lv, impl, f, fb, mb = m.groups()
            rows.append(dict(dtype=d, B=int(b), C=int(c), H=int(h), W=int(w), levels=int(lv), impl=impl,
                             fwd_ms=float(f), fwdbwd_ms=float(fb), peak_mb=float(mb)))
    return rows


def write_table(out: str, env: dict, rows: list[dict], quiet: bool = False) -> None:
    """Ratios of every row to the faster depthwise 7x7 (cuDNN) layout of its dtype and shape; the table and the JSON
    at ``out``, where a shape without a dw7 row (a cut run) is left out. ``quiet``: a partial write of every row so
    far, JSON only (marked ``partial``)."""
    def key(r):
        return (r["dtype"], r["B"], r["C"], r["H"], r["W"])

    best_dw7 = {}
    for r in rows:
        if r["impl"].startswith("dw7"):
            k = key(r)
            if k not in best_dw7 or r["fwdbwd_ms"] < best_dw7[k]["fwdbwd_ms"]:
                best_dw7[k] = r
    for r in rows:
        ref = best_dw7.get(key(r))
        if ref is not None:
            r["fwdbwd_vs_best_dw7"] = r["fwdbwd_ms"] / ref["fwdbwd_ms"]
            r["peak_vs_best_dw7"] = r["peak_mb"] / ref["peak_mb"] if ref["peak_mb"] > 0 else float("nan")
            r["best_dw7_layout"] = ref["impl"]
    if quiet:  # a partial write (after every row): every row so far
        write_json(out, dict(env=env, rows=rows, partial=True))
        return
    rows = [r for r in rows if key(r) in best_dw7]
    hdr = f"{'dtype':5} {'shape (B,C,H,W,L)':22} {'impl':22} {'fwd ms':>8} {'f+b ms':>8} {'peak MB':>9} {'f+b/dw7*':>9} {'mem/dw7*':>9}"
    lines = []
    for r in rows:
        shape = f"{r['B']},{r['C']},{r['H']},{r['W']},{r['levels']}"
        lines.append(f"{r['dtype']:5} {shape:22} {r['impl']:22} {r['fwd_ms']:8.3f} {r['fwdbwd_ms']:8.3f} "
                     f"{r['peak_mb']:9.1f} {r['fwdbwd_vs_best_dw7']:9.2f} {r['peak_vs_best_dw7']:9.2f}")
    report(out, env, hdr, lines, rows,
           note="* ratio to the faster layout of depthwise 7x7 (cuDNN) in the same dtype and shape")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/layer.json")
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, and skip the slow reference path")
    ap.add_argument("--shapes", nargs="+", type=int, default=None, choices=range(len(SHAPES)), metavar="I",
                    help=f"indices into {SHAPES} (default: all)")
    ap.add_argument("--impls", nargs="+", default=None, metavar="NAME",
                    help="time only these rows (e.g. wtconv_triton_cl dw7_cl; default: all)")
    ap.add_argument("--variants", nargs="+", default=[], metavar="KEY=V[,KEY=V]",
                    help="extra channels-last rows with these TUNING entries (row wtconv_triton_cl+KEY=V)")
    ap.add_argument("--rows-from", metavar="LOG", default=None,
                    help="no timing: the table of the per-row lines a run printed (e.g. one cut by a time limit)")
    ap.add_argument("--env", default="{}", help="with --rows-from: JSON object of the run's environment")
    args = ap.parse_args(argv)
    if args.rows_from:
        write_table(args.out, json.loads(args.env), rows_from_log(args.rows_from))
        return 0
    variants = [(v, tuning_entries(ap, v, "--variants")) for v in args.variants]  # (row suffix, TUNING entries)
    if args.impls and not any(name.startswith("dw7") for name in args.impls):
        ap.error("--impls needs a dw7 row (dw7_cl or dw7_nchw): the ratios are to depthwise 7x7")
    if not torch.cuda.is_available():
        print("bench_layer.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = True
    rep = 40 if args.quick else 100
    env = gpu_env()
    rows = []
    for dname in args.dtypes:
        dtype = DTYPES[dname]
        for b, c, h, w, levels in [SHAPES[i] for i in args.shapes] if args.shapes else SHAPES:
            cases = _cases(b, c, h, w, levels, dtype, variants=variants)
            unknown = [n for n in args.impls or () if n not in cases]
            if unknown:  # a misspelt row would otherwise be left out without a word
                ap.error(f"--impls: no row {unknown} in {dname}; the rows are {sorted(cases)}")
            # cuDNN's rows first: the ratios' denominators are in hand when a time limit cuts the shape short.
            for name, (fwd, fwdbwd, _) in sorted(cases.items(), key=lambda kv: not kv[0].startswith("dw")):
                if (args.quick and name == "wtconv_reference") or (args.impls and name not in args.impls):
                    continue
                before = launch_plan.graph_stats()
                fwdbwd()  # compile / autotune outside the timing
                row = dict(dtype=dname, B=b, C=c, H=h, W=w, levels=levels, impl=name,
                           fwd_ms=_bench(fwd, rep=rep), fwdbwd_ms=_bench(fwdbwd, rep=rep), peak_mb=_peak_mb(fwdbwd))
                rows.append(row)
                print(row_line(row), flush=True)
                if name.startswith("wtconv_triton"):
                    # Graph mode over the row (launch_plan.graph_stats): passes launched without a graph beyond
                    # the first sights are pointer sets that did not settle (a suspect for session 53's and 54's
                    # slow first rows at 7 x 7).
                    after = launch_plan.graph_stats()
                    row["graphs"] = {k: after[k] - before[k] for k in ("captures", "dropped", "misses", "closed")}
                    # (plans not in graph mode, graph_plans < plans, replay their launches one by one.)
                    print(f"  graph mode over the row: {row['graphs']}; plans {after['plans']}, in graph mode "
                          f"{after['graph_plans']}, graphs held {after['graphs']}", flush=True)
                # After every row: a run cut by a time limit keeps what it timed (a shape's rows can take minutes
                # of compiles: session 48's call lost every row of its first shape).
                write_table(args.out, env, rows, quiet=True)
            del cases
            torch.cuda.empty_cache()
    write_table(args.out, env, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
