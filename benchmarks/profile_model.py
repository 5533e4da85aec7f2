"""Per-kernel CUDA time of one model training step (AdamW, bf16 AMP, channels_last), eager or compiled.

For finding where a model's step goes: the kernels by CUDA time, grouped by name, with the count per step (and
the launches per step in all: a compiled step whose kernels take less than its wall time waits on the host's
launches), the wall time per step without the profiler, the host's time to issue one step (timed from an idle GPU
to the step's return, before its kernels finish: a step is host-bound where this is near the wall time), with
``--host-profile N`` the N costliest Python functions of issuing a step (cProfile), and (compiled) dynamo's graph
and graph-break counts.

    python benchmarks/profile_model.py --model wtconvnext_tiny [--compile] [--batch 128] [--fp32]

WTCONVNEXT_TRITON_OP=0 in the environment keeps a compiled WTConv on the opaque custom op (see
``wtconvnext/ops/wtconv_triton.py``), for comparing the two compiled paths.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchmarks.bench_model as bm  # noqa: E402
import wtconvnext  # noqa: E402,F401  (registers the models)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="wtconvnext_tiny")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--fp32", action="store_true", help="no autocast")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rows", type=int, default=30)
    ap.add_argument("--host-profile", type=int, default=0, metavar="N",
                    help="print the N functions with the most cumulative host time of issuing a step (cProfile)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_model.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from torch.profiler import ProfilerActivity, profile

    step = bm._train_step(args.model, not args.fp32, args.compile, args.batch)
    x = bm._input(args.batch, 224)
    for _ in range(3):
        step(x)
    ms = bm._time_steps(lambda: step(x), 3, 10)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.iters):
            step(x)
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append((t / args.iters / 1000, e.count / args.iters, e.key))
    rows.sort(reverse=True)
    mode = "compiled" if args.compile else "eager"
    print(f"=== {args.model} {mode} {'fp32' if args.fp32 else 'bf16-amp'} B={args.batch}: {ms:.2f} ms per step "
          f"(no profiler); CUDA time per step by kernel")
    for t, n, k in rows[: args.rows]:
        print(f"{t:8.3f} ms  x{n:<6.1f} {k[:110]}")
    print(f"{sum(r[0] for r in rows):8.3f} ms  all kernels ({len(rows)} names, {sum(r[1] for r in rows):.0f} launches "
          "and memsets per step)")
    print(f"host time to issue a step (idle GPU at its start, median of 10): {_issue_ms(step, x):.2f} ms")
    if args.host_profile:
        prof_host = cProfile.Profile()
        _issue_ms(step, x, 3, prof_host)
        print("host functions of issuing 3 steps, by cumulative time:")
        pstats.Stats(prof_host, stream=sys.stdout).sort_stats("cumulative").print_stats(args.host_profile)
    if args.compile:
        from torch._dynamo.utils import counters

        print("dynamo stats:", dict(counters["stats"]), "graph breaks:", dict(counters["graph_break"]))
    print(f"peak memory of a step: {bm._peak_gb(lambda: step(x)):.2f} GB")
    return 0


def _issue_ms(step, x, n: int = 10, prof: Optional[cProfile.Profile] = None) -> float:
    """Median host time of one ``step(x)`` started on an idle GPU: the time to issue its work, as long as nothing
    in the step waits on the GPU and its launches fit in the launch queue. ``prof``: profiles the n issues."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        if prof is not None:
            prof.enable()
        t0 = time.perf_counter()
        step(x)
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.disable()
    torch.cuda.synchronize()
    return statistics.median(times) * 1000


if __name__ == "__main__":
    raise SystemExit(main())
