"""Does a compiled WTConv layer give eager's results? Each launch path under torch.compile, side by side.

    python benchmarks/compiled_parity.py [--out results/compiled_parity.json] [--calls 4] [--jobs 8]

Cases: the op path (``traced``: the ``triton_op`` pair, the default; ``opaque``: the custom ops, with
WTCONVNEXT_TRITON_OP=0) x the compile mode (``default``, ``reduce-overhead``: CUDA graphs) x the dtype (bf16, fp32,
and ``amp``: fp32 input and parameters under bf16 autocast).
Each case runs in a process of its own (the op path is read at import) on one layer (B=4, C=96, 29 x 31, 4 levels,
5 x 5: odd sizes, the multi-launch path), and compares y, dx and the five parameter gradients of ``sum(y * dy)`` with
the same process's eager ones, for ``--calls`` compiled calls in a row (under reduce-overhead: warm-up, recording,
replays). It prints per case the largest relative difference (norm of the difference over the eager norm) of each
call and whether every output was bitwise eager's; JSON rows keep every figure. Session 30 found the traced path
0.3-0.8 off on the H200 (results/h200/summary.md) with this check's first form.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
NAMES = ("y", "dx", "d_weight", "d_bias", "d_base_scale", "d_wavelet_weight", "d_wavelet_scale")


def _case(mode: str, dtype_name: str, calls: int) -> dict:
    """In the child: eager, then ``calls`` compiled calls, each compared with eager."""
    import torch

    from benchmarks.common import wtconv_inputs
    from wtconvnext.ops import wtconv2d
    from wtconvnext.ops.wtconv_triton import traced_op_applies

    # "amp": fp32 input and parameters under bf16 autocast (the parameters rounded inside the kernels).
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "amp": torch.float32}[dtype_name]
    x, dy, params = wtconv_inputs(4, 96, 29, 31, 4, dtype)
    if dtype_name == "amp":
        dy = dy.to(torch.bfloat16)
    x, dy = x.contiguous(memory_format=torch.channels_last), dy.contiguous(memory_format=torch.channels_last)
    params = [p.requires_grad_() for p in params]

    def grads(fn):
        xg = x.detach().requires_grad_()
        y = fn(xg)
        return [y.detach().clone(), *(g.clone() for g in torch.autograd.grad(y, [xg, *params], dy))]

    def layer(t):
        with torch.autocast("cuda", torch.bfloat16, enabled=dtype_name == "amp"):
            return wtconv2d(t, *params)

    eager = grads(layer)
    compiled = torch.compile(layer, fullgraph=True, dynamic=False, mode=None if mode == "default" else mode)
    rel = []
    bitwise = True
    for _ in range(calls):
        got = grads(compiled)
        rel.append([((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()
                    for a, b in zip(got, eager)])
        bitwise = bitwise and all(torch.equal(a, b) for a, b in zip(got, eager))
    return dict(traced=traced_op_applies(x), mode=mode, dtype=dtype_name, rel=rel, bitwise=bitwise)


def _spawn(path: str, mode: str, dtype: str, calls: int, timeout: int) -> dict:
    env = dict(os.environ, WTCONVNEXT_TRITON_OP="1" if path == "traced" else "0",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    row = dict(path=path, mode=mode, dtype=dtype)
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", f"{mode},{dtype},{calls}"], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(row, error=f"not done within {timeout} s")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROW ")]
    if proc.returncode != 0 or not lines:
        return dict(row, error=proc.stderr.strip()[-600:])
    return dict(row, **json.loads(lines[-1][4:]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--paths", nargs="+", default=["opaque", "traced"], choices=["opaque", "traced"])
    ap.add_argument("--modes", nargs="+", default=["default", "reduce-overhead"])
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32", "amp"], choices=["bf16", "fp32", "amp"])
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=8, help="cases compiled side by side (CPU-bound)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per case")
    ap.add_argument("--out", default="results/compiled_parity.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        mode, dtype, calls = args.child.split(",")
        print("ROW " + json.dumps(_case(mode, dtype, int(calls))), flush=True)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("compiled_parity.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from benchmarks.common import gpu_env, report

    cases = list(itertools.product(args.paths, args.modes, args.dtypes))
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        rows = list(pool.map(lambda c: _spawn(*c, args.calls, args.timeout), cases))
    lines = []
    for r in rows:
        label = f"{r['path']:<7} {r['mode']:<16} {r['dtype']:<5}"
        if "error" in r:
            lines.append(f"{label} error: {r['error'][:200]}")
            continue
        if r["path"] == "traced" and not r["traced"]:
            label += " (traced path did not apply)"
        worst = " ".join(f"{max(c):9.2e}" for c in r["rel"])
        lines.append(f"{label} {worst}   {'yes' if r['bitwise'] else 'no'}")
    header = f"{'path':<7} {'mode':<16} {'dtype':<5} largest rel. difference per compiled call   bitwise"
    report(args.out, gpu_env(), header, lines, rows,
           note=f"vs eager in the same process: {', '.join(NAMES)}; one WTConv layer B=4 C=96 29x31 L=4 K=5")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
