"""Kernel A/B: a baseline copy of the kernels against the current ones, side by side in one run.

    git show REV:wtconvnext/ops/triton_kernels.py > /tmp/base_kernels.py
    python benchmarks/ab_kernels.py --baseline /tmp/base_kernels.py [--dtypes bf16 fp32] [--out results/ab.json]
    python benchmarks/ab_kernels.py --tuning syn1=0 [--dtypes bf16] [--parts wgrad]  # today's TUNING vs these

For each WTConvNeXt-T stage shape and the high-resolution one, it times both versions' forward, input-gradient
pass (the same with rotated kernels, on dy) and parameter gradients, each with the analyses of x or dy it needs,
checks that both give the same results, and prints the speedups. Either version may have today's launcher API
(``coefficients`` / ``wtconv_forward`` / ``weight_partials`` / ``param_grads``) or the low-pass-pyramid API of
v5 to v7 (``ll_pyramid`` / ``wtconv_forward`` / ``correlations`` / ``param_grads``).
``--tuning KEY=VALUE ...`` compares the current kernels with themselves, under today's ``TUNING`` (baseline) and
with those entries changed (e.g. ``syn1=0``: level 1 synthesised by its own launch, not by the base convolution);
``--parts`` times only the passes named (``wgrad`` alone compiles no convolution).
``--check`` runs one small shape once, to check the script, not to time it (with ``--device cpu`` and
``TRITON_INTERPRET=1`` on a machine without a GPU).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_layer import DTYPES, SHAPES, _bench  # noqa: E402
from benchmarks.common import gpu_env, tuning_entries, with_entries, write_json, wtconv_inputs  # noqa: E402
from wtconvnext.ops import triton_kernels as current  # noqa: E402


def _load(path: str) -> ModuleType:
    if not Path(path).is_file():
        raise SystemExit(f"--baseline {path!r}: no such file")
    # Named inside the package, so that a copy's relative imports (launch_plan, small_kernels) resolve.
    spec = importlib.util.spec_from_file_location("wtconvnext.ops._baseline_triton_kernels", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--baseline {path!r}: not a Python file")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _parts(mod: ModuleType, x, dy, params, k: int, levels: int):
    """The timed callables of one version, each returning what it computed: the forward, the input gradient, the
    parameters' gradients, each with the analyses of x or dy it needs, and (versions with coefficient buffers) the
    whole backward as the op runs it."""
    out = torch.empty_like(x)
    dx = torch.empty_like(x)
    fold = mod.folded_weights(*params)
    if hasattr(mod, "coefficients"):  # coefficient-buffer kernels (issue 14 on)
        takes_onload = "onload" in inspect.signature(mod.wtconv_forward).parameters

        def onload() -> bool:
            # Level 1 on load (TUNING l1_onload, session 43 on), as the op decides it: at the call, under its TUNING.
            return hasattr(mod, "onload_applies") and mod.onload_applies(x, levels, 1)

        def forward(*args, **kwargs):  # (the caller passes the decision since session 44)
            return mod.wtconv_forward(*args, **kwargs, **({"onload": onload()} if takes_onload else {}))

        def fwd():
            return forward(x, out, *fold, 1)

        def dgrad():
            return forward(dy, dx, fold[0], None, fold[2], 1, flip=True)

        def wgrad():
            parts = mod.weight_partials(x, dy, mod.coefficients(x, levels), mod.coefficients(dy, levels), k, levels)
            return mod.param_grads(parts, tuple(x.shape), *params)

        def bwd():  # the whole backward as the op runs it
            pair = getattr(mod, "coefficient_pair", None)
            if onload():  # buffers of levels 2..L, as the op's backward
                cx, cdy = pair(x, dy, levels, True)
                parts = mod.weight_partials(x, dy, cx, cdy, k, levels, onload=True)
                if hasattr(mod, "level1_partials"):  # session 44 on: level 1's rows apart, staged through dx
                    grads = mod.param_grads(parts, tuple(x.shape), *params, split=1)
                    lev1 = mod.level1_partials(x, dy, k, dx)
                    mod.param_grads((lev1, lev1), tuple(x.shape), *params, split=2, grads=grads)
                else:
                    grads = mod.param_grads(parts, tuple(x.shape), *params)
            else:
                cx, cdy = pair(x, dy, levels) if pair else (mod.coefficients(x, levels), mod.coefficients(dy, levels))
                parts = mod.weight_partials(x, dy, cx, cdy, k, levels)
                grads = mod.param_grads(parts, tuple(x.shape), *params)
            forward(dy, dx, fold[0], None, fold[2], 1, flip=True, coef=cdy)
            return grads, dx

        return {"fwd": fwd, "dx": dgrad, "wgrad": wgrad, "bwd": bwd}
    else:  # low-pass-pyramid kernels (v5 to v7)
        def fwd():
            return mod.wtconv_forward(mod.ll_pyramid(x, levels), out, *fold, 1)

        def dgrad():
            return mod.wtconv_forward(mod.ll_pyramid(dy, levels), dx, fold[0], None, fold[2], 1, flip=True)

        def wgrad():
            corr = mod.correlations(mod.ll_pyramid(x, levels), mod.ll_pyramid(dy, levels), k, levels)
            return mod.param_grads(corr, *params)

    return {"fwd": fwd, "dx": dgrad, "wgrad": wgrad}


PARTS = ("fwd", "dx", "wgrad", "bwd")


def _max_rel(a, b) -> float:
    if isinstance(a, (tuple, list)):
        return max(_max_rel(p, q) for p, q in zip(a, b))
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", help="a copy of wtconvnext/ops/triton_kernels.py to compare with")
    ap.add_argument("--tuning", nargs="+", metavar="KEY=VALUE",
                    help="baseline: today's TUNING; current: with these entries changed")
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=list(DTYPES))
    ap.add_argument("--shapes", nargs="+", type=int, default=None, choices=range(len(SHAPES)),
                    help=f"indices into bench_layer's shapes {SHAPES} (default: all)")
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS),
                    help="which passes to time (default: all; e.g. wgrad alone compiles no convolution)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--check", action="store_true", help="one small shape, run once: checks the script")
    args = ap.parse_args(argv)
    if bool(args.baseline) + bool(args.tuning) != 1:
        ap.error("give one of --baseline FILE or --tuning KEY=VALUE ...")
    overrides = tuning_entries(ap, args.tuning or [])
    base = _load(args.baseline) if args.baseline else current
    on_gpu = args.device == "cuda"
    if on_gpu and not torch.cuda.is_available():
        print("ab_kernels.py needs a CUDA GPU (or --check --device cpu with TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    timed = on_gpu and not args.check
    shapes = [SHAPES[i] for i in args.shapes] if args.shapes else SHAPES
    if not timed:
        shapes = [(2, 8, 9, 10, 2)]
    k = 5
    rows = []
    print(f"{'dtype':5} {'B,C,H,W,L':18} {'part':6} {'baseline ms':>12} {'current ms':>11} {'speedup':>8} "
          f"{'max rel diff':>13}")
    for dname in args.dtypes:
        dtype = DTYPES[dname]
        for b, c, h, w, levels in shapes:
            x, dy, params = wtconv_inputs(b, c, h, w, levels, dtype, args.device, k)
            x, dy = x.contiguous(memory_format=torch.channels_last), dy.contiguous(memory_format=torch.channels_last)
            parts = [_parts(mod, x, dy, params, k, levels) for mod in (base, current)]
            if overrides:
                parts[1] = {name: with_entries(fn, current.TUNING, overrides) for name, fn in parts[1].items()}
            for part in [p for p in args.parts if all(p in q for q in parts)]:
                results, ms = [], []
                for p in parts:  # on a GPU this run also compiles, outside the timing
                    start = time.perf_counter()
                    results.append(p[part]())
                    ms.append((time.perf_counter() - start) * 1000)  # --check: once, what it took (not a timing)
                diff = _max_rel(results[1], results[0])
                if timed:
                    ms = [_bench(p[part]) for p in parts]
                rows.append(dict(dtype=dname, B=b, C=c, H=h, W=w, levels=levels, part=part, baseline_ms=ms[0],
                                 current_ms=ms[1], speedup=ms[0] / ms[1], max_rel_diff=diff))
                print(f"{dname:5} {f'{b},{c},{h},{w},{levels}':18} {part:6} {ms[0]:12.3f} {ms[1]:11.3f} "
                      f"{ms[0] / ms[1]:7.2f}x {diff:13.1e}", flush=True)
    if args.out:
        if overrides:
            what = dict(baseline=f"TUNING {current.TUNING}", current=f"TUNING with {overrides}")
        else:
            what = dict(baseline=args.baseline)
        write_json(args.out, dict(env=gpu_env(**what) if on_gpu else {}, rows=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
