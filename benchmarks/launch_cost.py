"""Host cost of one kernel launch on this machine, against a Python call and a tiny torch op.

Usage (any CUDA GPU)::

    python benchmarks/launch_cost.py [--out results/launch_cost.json] [--iters 2000]

A WTConv layer call is host-bound at small batches and small maps, and its host time is mostly launches (the
kernels finish in microseconds there). This times, back to back with the GPU never the limit: an empty Python
function call; ``torch.empty`` of a small CUDA tensor; a tiny in-place torch op (one launch through the
dispatcher); a trivial Triton kernel through ``kernel[grid](...)`` and through the compiled kernel kept by
``triton_kernels._launch`` (the layer's default path), with 1 and 16 runtime arguments; then one WTConv layer
call (forward + backward, B=1 bf16 channels-last, 56 x 56 and 14 x 14) as it runs (launch plans replayed), without
launch plans, and with every launch replaced by a no-op and no plans (what is left is Python, autograd and
allocations), against cuDNN's depthwise 7x7. Medians of
``--rounds`` rounds, microseconds per call; JSON rows as the other benchmarks write them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import gpu_env, report, wall_us, wtconv_inputs  # noqa: E402
from wtconvnext.ops import launch_plan  # noqa: E402
from wtconvnext.ops import triton_kernels as tk  # noqa: E402
from wtconvnext.ops import wtconv2d  # noqa: E402


@triton.jit
def _touch1(p, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(p + i, tl.load(p + i) + 1)


@triton.jit
def _touch16(p, a1, a2, a3, a4, a5, a6, a7, n1, n2, n3, n4, n5, n6, n7, n8, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(p + i, tl.load(p + i) + n1 + n2 + n3 + n4 + n5 + n6 + n7 + n8)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/launch_cost.json")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("launch_cost.py needs a CUDA GPU", file=sys.stderr)
        return 2
    t = torch.zeros(32, device="cuda")
    ptrs = [torch.zeros(32, device="cuda") for _ in range(7)]
    ints = (3, 5, 7, 11, 13, 17, 19, 23)

    def nothing():
        return None

    cases = {
        "python call": nothing,
        "torch.empty (32 floats)": lambda: torch.empty(32, device="cuda"),
        "torch op (t.add_(1))": lambda: t.add_(1),
        "triton kernel[grid], 1 arg": lambda: _touch1[(1,)](t, N=32),
        "kept launch, 1 arg": lambda: tk._launch(_touch1, (1, 1), (t,), 1, N=32),
        "triton kernel[grid], 16 args": lambda: _touch16[(1,)](t, *ptrs, *ints, N=32),
        "kept launch, 16 args": lambda: tk._launch(_touch16, (1, 1), (t, *ptrs, *ints), 1, N=32),
    }
    for c, h, levels in ((96, 56, 5), (384, 14, 3)):
        x, dy, p = wtconv_inputs(1, c, h, h, levels, torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        dy = dy.contiguous(memory_format=torch.channels_last)
        ps = [q.detach().requires_grad_() for q in p]
        w7 = (torch.randn(c, 1, 7, 7, device="cuda") * 0.1).to(torch.bfloat16).requires_grad_()

        def layer(x=x, dy=dy, ps=ps):
            torch.autograd.grad(wtconv2d(x, *ps, backend="triton"), [x, *ps], dy)

        def stubbed(layer=layer):
            real, plans = tk._launch, launch_plan.ENABLED
            tk._launch = lambda *a, **k: None
            launch_plan.ENABLED = False  # a replayed plan would launch past the stub
            try:
                layer()
            finally:
                tk._launch, launch_plan.ENABLED = real, plans

        def unplanned(layer=layer):
            launch_plan.ENABLED = False
            try:
                layer()
            finally:
                launch_plan.ENABLED = True

        cases[f"WTConv f+b {c}x{h}^2 L{levels}"] = layer
        cases[f"WTConv f+b {c}x{h}^2, no plans"] = unplanned
        cases[f"WTConv f+b {c}x{h}^2, no launches"] = stubbed
        cases[f"cuDNN dw7 f+b {c}x{h}^2"] = lambda x=x, dy=dy, w7=w7, c=c: torch.autograd.grad(
            F.conv2d(x, w7, padding=3, groups=c), [x, w7], dy)
    for name, fn in cases.items():  # compile, fill the caches (minutes on a slow host: say where it is)
        fn()
        fn()
        torch.cuda.synchronize()
        print(f"warm: {name}", flush=True)
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for r in range(args.rounds):
        for name, fn in cases.items():
            samples[name].append(wall_us(fn, args.iters))
            print(f"round {r}: {name:36} {samples[name][-1]:10.2f} us", flush=True)
    rows = [dict(case=name, us=statistics.median(v), samples=v) for name, v in samples.items()]
    hdr = f"{'case':36} {'us per call':>12}"
    lines = [f"{r['case']:36} {r['us']:12.2f}" for r in rows]
    report(args.out, gpu_env(), hdr, lines, rows, note="median wall per call, back to back (host-bound)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
