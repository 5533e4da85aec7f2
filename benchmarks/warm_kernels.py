"""Compile the fused WTConv's kernel specialisations a benchmark run will need, in parallel processes.

Usage (any CUDA GPU)::

    python benchmarks/warm_kernels.py [--jobs 14] [--batches 1 128] [--dtypes bf16 fp32 amp] [--stages 0 1 2 3]
                                      [--modes train infer] [--variants wgrad_pair=1] [--group 'OPTIONS' ...]

A fresh GPU machine compiles every kernel specialisation on its host the first time a shape, dtype or tuning meets
it (a stage shape's kernels took more than 100 s on the H200 machine's host, one process), so benchmarks spent
their time limits compiling. Triton's on-disk cache is shared between processes and written atomically: this runs
one forward + backward (``train``) and one forward without autograd (``infer``) per case in a pool of processes,
after which every benchmark process finds its kernels compiled. Cases: WTConvNeXt-T's stage shapes (C, H, L; stage
4: the first stage at 512²) x batch x dtype (``amp``: fp32 tensors under bf16 autocast, as the model benchmarks
run) x tuning variant (``default`` and each ``--variants`` entry, ``key=value[,key=value]`` of
``triton_kernels.TUNING``), channels-last.
Prints one line per case with its wall time; the exit status is 1 when a case failed.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

# C, H (= W), levels: WTConvNeXt-T's stages at 224 x 224, then its first stage at 512 x 512 (bench_layer.py's
# dense-prediction shape, run there at B=16: --stages 4 --batches 16)
STAGES = [(96, 56, 5), (192, 28, 4), (384, 14, 3), (768, 7, 2), (96, 128, 5)]


def _run_case(case: tuple[int, int, int, int, str, str, str]) -> tuple[str, float, str]:
    """Compile (by running) one case's kernels; returns (label, seconds, error or '')."""
    c, h, levels, b, dtype_name, mode, variant = case
    label = f"{dtype_name} B={b} {c}x{h}^2 L{levels} {mode} {variant}"
    t0 = time.perf_counter()
    try:
        import torch

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from benchmarks.common import Refuse, tuning_entries, with_entries, wtconv_inputs
        from wtconvnext.ops import triton_kernels as tk
        from wtconvnext.ops import wtconv2d

        dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
        x, dy, ps = wtconv_inputs(b, c, h, h, levels, dtype)
        x = x.contiguous(memory_format=torch.channels_last)
        dy = dy.contiguous(memory_format=torch.channels_last)
        entries = {} if variant == "default" else tuning_entries(Refuse, variant, "--variants")

        def once() -> None:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype_name == "amp"):
                if mode == "infer":
                    with torch.no_grad():
                        wtconv2d(x, *ps, backend="triton")
                else:
                    xs = x.detach().requires_grad_()
                    pg = [p.detach().requires_grad_() for p in ps]
                    y = wtconv2d(xs, *pg, backend="triton")
                    torch.autograd.grad(y, [xs, *pg], dy.to(y.dtype))

        with_entries(once, tk.TUNING, entries)()
        torch.cuda.synchronize()
        return label, time.perf_counter() - t0, ""
    except Exception as e:  # report and go on: one bad case must not hide the others' compiles
        return label, time.perf_counter() - t0, f"{type(e).__name__}: {e}"


def _group_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 128])
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32", "amp"], choices=["bf16", "fp32", "amp"])
    ap.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3], choices=range(len(STAGES)))
    ap.add_argument("--modes", nargs="+", default=["train", "infer"], choices=["train", "infer"])
    ap.add_argument("--variants", nargs="*", default=[], help="TUNING entries, e.g. wgrad_pair=1 (plus the default)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], parents=[_group_parser()])
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--group", action="append", default=[], metavar="'OPTIONS'",
                    help="a further set of cases, e.g. --group '--batches 256 --dtypes amp --modes infer' (repeatable;"
                         " all groups share one pool of processes)")
    args = ap.parse_args(argv)
    groups = [args] + [_group_parser().parse_args(g.split()) for g in args.group]
    cases = list(dict.fromkeys(  # in order, without repeats
        (*STAGES[s], b, d, m, v) for g in groups for v in ["default", *g.variants] for d in g.dtypes
        for b in g.batches for s in g.stages for m in g.modes))
    t0 = time.perf_counter()
    failed = 0
    # spawn: each worker starts its own CUDA context (a forked one cannot).
    with mp.get_context("spawn").Pool(min(args.jobs, len(cases))) as pool:
        for label, secs, err in pool.imap_unordered(_run_case, cases):
            failed += bool(err)
            print(f"{secs:7.1f} s  {label}{'  FAILED ' + err if err else ''}", flush=True)
    print(f"warm_kernels: {len(cases)} cases, {failed} failed, {time.perf_counter() - t0:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
