"""Per-kernel CUDA time of one WTConv forward + backward (torch.profiler), for finding where the time goes.

Also prints the wall time per iteration without the profiler: when it is well above the kernels' total, the layer
is bound by host-side launch overhead, not by the GPU; ``--host`` then adds a cProfile of the Python side (top
functions by own time).

    python benchmarks/profile_layer.py [--shapes 0 3] [--dtypes fp32 bf16] [--cl] [--host] [--tuning KEY=V ...]

``--tuning``: ``triton_kernels.TUNING`` entries for the run (e.g. ``wgrad_pair=1``: kernel time, not wall time,
decides an A/B of a launch-shape knob at host-bound shapes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_layer import DTYPES, SHAPES, _cases  # noqa: E402
from benchmarks.common import device_time_us, tuning_entries, wall_us  # noqa: E402
from wtconvnext.ops import triton_kernels as tk  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", type=int, nargs="+", default=[0, 3])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--cl", action="store_true", help="channels_last input")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--host", action="store_true", help="also cProfile the host side of fwd + bwd")
    ap.add_argument("--tuning", nargs="*", default=[], metavar="KEY=V", help="TUNING entries for the run")
    args = ap.parse_args(argv)
    tk.TUNING.update(tuning_entries(ap, args.tuning))
    from torch.profiler import ProfilerActivity, profile

    for si in args.shapes:
        for dname in args.dtypes:
            b, c, h, w, levels = SHAPES[si]
            cases = _cases(b, c, h, w, levels, DTYPES[dname])
            name = "wtconv_triton_cl" if args.cl else "wtconv_triton_nchw"
            _, fwdbwd, _ = cases[name]
            for _ in range(3):
                fwdbwd()
            wall = wall_us(fwdbwd, args.iters) / 1000
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.iters):
                    fwdbwd()
                torch.cuda.synchronize()
            tuned = f" {' '.join(args.tuning)}" if args.tuning else ""
            print(f"\n=== {dname} B={b} C={c} {h}x{w} L={levels} {name}{tuned}: per-iteration CUDA time by kernel")
            rows = []
            for e in prof.key_averages():
                t = device_time_us(e)
                if t > 0 and e.count >= args.iters:
                    rows.append((t / args.iters, e.count // args.iters, e.key))
            total = 0.0
            for t, n, k in sorted(rows, reverse=True)[:14]:
                print(f"{t / 1000:8.3f} ms  x{n:<3d} {k[:90]}")
                total += t
            print(f"{total / 1000:8.3f} ms  total of the rows above")
            print(f"{wall:8.3f} ms  wall time per iteration (no profiler)")
            if args.host:
                import cProfile
                import pstats

                prof_host = cProfile.Profile()
                prof_host.enable()
                for _ in range(args.iters):
                    fwdbwd()
                torch.cuda.synchronize()
                prof_host.disable()
                print(f"--- host side, {args.iters} iterations (cProfile), top functions by own time")
                pstats.Stats(prof_host).sort_stats("tottime").print_stats(22)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
