"""Kernel A/B: a baseline copy of the kernels against the current ones, side by side in one run.

    git show REV:wtconvnext/ops/triton_kernels.py > /tmp/base_kernels.py
    python benchmarks/ab_kernels.py --baseline /tmp/base_kernels.py [--dtypes bf16 fp32] [--out results/ab.json]

For each WTConvNeXt-T stage shape and the high-resolution one, it times both versions' forward (pyramid + level
kernels), input-gradient pass (the same with rotated kernels, from dy's pyramid) and weight gradients (x's pyramid
included), checks that both give the same results, and prints the speedups. The baseline needs the launcher API of
``wtconvnext/ops/triton_kernels.py`` since the channels-last kernels (commit eeb26e7 on); older signatures of the
rotated pass and of the weight-gradient entry (x's pyramid instead of x) are recognised.
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
from benchmarks.common import gpu_env, write_json, wtconv_inputs  # noqa: E402
from wtconvnext.ops import triton_kernels as current  # noqa: E402


def _load(path: str) -> ModuleType:
    if not Path(path).is_file():
        raise SystemExit(f"--baseline {path!r}: no such file")
    spec = importlib.util.spec_from_file_location("baseline_triton_kernels", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--baseline {path!r}: not a Python file")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _parts(mod: ModuleType, x, dy, params, k: int, levels: int):
    """The three timed callables of one version, each returning what it computed."""
    out = torch.empty_like(x)
    dx = torch.empty_like(x)
    fwd_w = mod.folded_weights(*params)
    if "flip" in inspect.signature(mod.wtconv_forward).parameters:
        rot_w, rot_kw = fwd_w, dict(flip=True)
    else:  # older launchers: the rotated kernels came from folded_weights(..., flip=True)
        rot_w, rot_kw = mod.folded_weights(*params, flip=True), {}
    gpyr = mod.ll_pyramid(dy, levels)
    takes_pyramid = next(iter(inspect.signature(mod.wtconv_weight_grads).parameters)) == "xpyr"

    def fwd():
        return mod.wtconv_forward(mod.ll_pyramid(x, levels), out, *fwd_w, 1)

    def dgrad():
        return mod.wtconv_forward(mod.ll_pyramid(dy, levels), dx, rot_w[0], None, rot_w[2], 1, **rot_kw)

    def wgrad():
        return mod.wtconv_weight_grads(mod.ll_pyramid(x, levels) if takes_pyramid else x, gpyr, k, levels)

    return {"fwd": fwd, "dx": dgrad, "wgrad": wgrad}


def _max_rel(a, b) -> float:
    if isinstance(a, (tuple, list)):
        return max(_max_rel(p, q) for p, q in zip(a, b))
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, help="a copy of wtconvnext/ops/triton_kernels.py to compare with")
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=list(DTYPES))
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--check", action="store_true", help="one small shape, run once: checks the script")
    args = ap.parse_args(argv)
    base = _load(args.baseline)
    on_gpu = args.device == "cuda"
    if on_gpu and not torch.cuda.is_available():
        print("ab_kernels.py needs a CUDA GPU (or --check --device cpu with TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    timed = on_gpu and not args.check
    shapes = SHAPES if timed else [(2, 8, 9, 10, 2)]
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
            for part in ("fwd", "dx", "wgrad"):
                results = [p[part]() for p in parts]  # also compiles outside the timing
                diff = _max_rel(results[1], results[0])
                if timed:
                    ms = [_bench(p[part]) for p in parts]
                else:
                    ms = []
                    for p in parts:
                        start = time.perf_counter()
                        p[part]()
                        ms.append((time.perf_counter() - start) * 1000)
                rows.append(dict(dtype=dname, B=b, C=c, H=h, W=w, levels=levels, part=part, baseline_ms=ms[0],
                                 current_ms=ms[1], speedup=ms[0] / ms[1], max_rel_diff=diff))
                print(f"{dname:5} {f'{b},{c},{h},{w},{levels}':18} {part:6} {ms[0]:12.3f} {ms[1]:11.3f} "
                      f"{ms[0] / ms[1]:7.2f}x {diff:13.1e}", flush=True)
    if args.out:
        write_json(args.out, dict(env=gpu_env(baseline=args.baseline) if on_gpu else {}, rows=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
