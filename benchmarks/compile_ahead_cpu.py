"""The Triton compiles of a WTConvNeXt training step, for an sm_90 GPU, in series and side by side (no GPU needed).

    python benchmarks/compile_ahead_cpu.py [--threads 2] [--stages 0 1 2 3] [--dtype bf16] [--out results/cpu/...]

A model's first eager training step on a machine with an empty Triton cache waits for every kernel specialisation
its layers launch. This script lists them as ``wtconvnext/ops/compile_ahead.py`` does (each stage's forward and
backward pass dry-run, nothing launched) for WTConvNeXt-T's four stage shapes at 224 x 224 (AMP: bf16 maps, fp32
parameters rounded on the fly), compiles each distinct one for Hopper once in series, then all of them again in a
pool of ``--threads`` threads (fresh Triton caches both times), and prints per kernel its compile time, the series
total and the pool's wall time. Approximations against a GPU run: ints are compiled as plain i32 / i64 (Triton also
specialises an int equal to 1 as a constant), B=16 stands in for any batch divisible by 16. On a GPU,
``bench_compile.py --eager --compile-threads 0`` measures the step itself.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_layer import SHAPES  # noqa: E402
from benchmarks.common import compile_sm90, report, wtconv_inputs  # noqa: E402

STAGES = [s[1:] for s in SHAPES[:4]]  # C, H, W, levels of WTConvNeXt-T's stages at 224 x 224
_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.float64: "*fp64"}


def step_launches(stage: int, dtype: torch.dtype, batch: int = 16) -> list[tuple]:
    """The launches of one layer's forward and backward pass at a stage shape, as the eager training path runs
    them (AMP: maps in ``dtype``, parameters in fp32 rounded to it), none run."""
    from wtconvnext.ops import compile_ahead
    from wtconvnext.ops.wtconv_triton import _backward_core, _forward_core

    c, h, w, levels = STAGES[stage]
    x, dy, params = wtconv_inputs(batch, c, h, w, levels, torch.float32, device="cpu")
    xc = x.to(dtype).contiguous(memory_format=torch.channels_last)
    round_to = dtype if dtype != torch.float32 else None
    found, (_, base_w, level_w) = compile_ahead.dry_run(_forward_core, (xc, *params), (1, round_to))
    dyc = dy.to(dtype).contiguous(memory_format=torch.channels_last)
    back, _ = compile_ahead.dry_run(_backward_core, (dyc, xc, *params, base_w, level_w), (round_to,))
    return found + back


def distinct(launches: list[tuple]) -> dict[tuple, tuple]:
    """One entry per compiled specialisation: key -> (kernel, signature, constexprs, warps)."""
    out = {}
    for fn, _grid, args, warps, consts in launches:
        names = fn.arg_names
        sig, const = {}, dict(consts)
        for name, a in zip(names, args):
            if isinstance(a, torch.Tensor):
                sig[name] = _TYPES[a.dtype]
            elif a is None:
                const[name] = None
            else:
                sig[name] = "i32" if -(2**31) <= a < 2**31 else "i64"
        key = (fn.__name__, warps, tuple(sig.items()), tuple((k, str(v)) for k, v in const.items()))
        out.setdefault(key, (fn, sig, const, warps))
    return out


def _timed(case: tuple) -> float:
    fn, sig, const, warps = case
    t0 = time.perf_counter()
    compile_sm90(fn, sig, const, warps)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--out", default="results/cpu/compile_ahead.json")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("compile_ahead_cpu.py compiles real kernels: run it without TRITON_INTERPRET=1")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    cases = distinct([ln for s in args.stages for ln in step_launches(s, dtype)])
    rows, series = [], 0.0
    cache = tempfile.mkdtemp()
    saved = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = cache  # an empty cache: every compile is a cold one
    try:
        for key, case in cases.items():
            secs = _timed(case)
            series += secs
            rows.append(dict(kernel=key[0], warps=key[1], constexprs=dict(key[3]), seconds=secs))
            print(f"  {key[0]:<22} {secs:6.1f} s", flush=True)
        shutil.rmtree(cache, ignore_errors=True)
        os.makedirs(cache)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(_timed, cases.values()))
        pooled = time.perf_counter() - t0
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if saved is None:
            del os.environ["TRITON_CACHE_DIR"]
        else:
            os.environ["TRITON_CACHE_DIR"] = saved
    longest = max(r["seconds"] for r in rows)
    hdr = f"{'what':<48} {'seconds':>8}"
    lines = [f"{r['kernel'] + ' ' + str(r['constexprs'].get('C', r['constexprs'].get('CC', ''))):<48} "
             f"{r['seconds']:8.1f}" for r in rows]
    lines += [f"{'in series (' + str(len(rows)) + ' specialisations)':<48} {series:8.1f}",
              f"{'pool of ' + str(args.threads) + ' threads, wall':<48} {pooled:8.1f}",
              f"{'longest single compile':<48} {longest:8.1f}"]
    env = dict(cpu=platform.processor() or platform.machine(), cores=os.cpu_count(), torch=torch.__version__,
               triton=__import__("triton").__version__, date=time.strftime("%Y-%m-%d %H:%M:%S"),
               stages=args.stages, dtype=args.dtype, threads=args.threads)
    report(args.out, env, hdr, lines, rows, note="sm_90 compiles of a WTConvNeXt-T AMP training step's kernels, CPU",
           best=dict(series_s=series, pooled_s=pooled, longest_s=longest, threads=args.threads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
