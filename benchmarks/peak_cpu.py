"""Peak memory of one fused WTConv layer call (forward + backward) by its allocations, on the CPU, no kernel run.

Usage (any machine; no GPU needed)::

    python benchmarks/peak_cpu.py [--out results/peak_cpu.json] [--batch 128] [--shapes 4]

The fused backend's buffers and outputs all come from ``torch.empty`` (launch plans' allocations included). With
the kernels replaced by stand-ins (``host_cpu.no_kernels``: nothing runs, buffers stay uninitialised) this script
counts the bytes of every ``torch.empty`` storage alive at once during ``y = wtconv2d(x, ...)`` and
``torch.autograd.grad(y, [x, *params], dy)`` at the WTConvNeXt-T stage shapes, bf16 channels_last, y held
throughout (as ``bench_layer``'s peak measures it: allocations above x and dy). It prints the peak in MiB and in
units of x's size, for the default path (direct launches, the intermediates in one workspace per pass), without the
workspace (``no_workspace``), also without it with level 1 analysed into the coefficient buffers as before TUNING
l1_onload (``no_onload``) and with the input gradient in a map of its own as well (``separate_dx``, the layout
before ``input_grad_buffer``). No allocator rounding or cuDNN workspace: on the H200 ``bench_layer``'s
peak at 56 x 56 was 361 MiB where this count gives 344 for the same layout; cuDNN's dw7 took 172.8 MiB (2.35 x x).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import weakref
from pathlib import Path
from typing import Any, Callable

os.environ["TRITON_INTERPRET"] = "1"  # before wtconvnext: the triton backend accepts CPU tensors only then

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import report, wtconv_inputs  # noqa: E402
from benchmarks.host_cpu import STAGES, no_kernels  # noqa: E402
from wtconvnext.ops import triton_kernels as tk  # noqa: E402
from wtconvnext.ops import wtconv2d, wtconv_triton  # noqa: E402


class AllocationCounter:
    """Inside ``with``: ``torch.empty`` and ``torch.empty_strided`` count the bytes of the storages they made that
    are still alive, and their peak."""

    def __init__(self) -> None:
        self.live = self.peak = 0
        self._empty: Callable[..., torch.Tensor] = torch.empty
        self._empty_strided: Callable[..., torch.Tensor] = torch.empty_strided

    def _freed(self, n: int) -> None:
        self.live -= n

    def empty(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._count(self._empty(*args, **kwargs))

    def empty_strided(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._count(self._empty_strided(*args, **kwargs))

    def _count(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        n = storage.nbytes()
        self.live += n
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._freed, n)  # torch keeps one Python object per storage while it lives
        return t

    def __enter__(self) -> "AllocationCounter":
        # empty_strided: launch_plan.empty's channels-last buffers where a pass is not replayed (recorded, or
        # chunked: a view of a tensor it did not make).
        torch.empty, torch.empty_strided = self.empty, self.empty_strided
        return self

    def __exit__(self, *exc: object) -> None:
        torch.empty, torch.empty_strided = self._empty, self._empty_strided


def layer_peak(b: int, c: int, h: int, w: int, levels: int, separate_dx: bool, mode: str = "workspace",
               tuning: dict[str, int] | None = None) -> int:
    """Peak bytes of ``torch.empty`` storages alive at once in one forward + backward (y held until the end), the
    launches on ``mode``'s path (``host_cpu.MODES``), with ``tuning`` over the kernels' TUNING."""
    x, dy, p = wtconv_inputs(b, c, h, w, levels, torch.bfloat16, device="cpu")
    x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    dy = dy.contiguous(memory_format=torch.channels_last)
    ps = [t.requires_grad_() for t in p]
    chosen = wtconv_triton.input_grad_buffer
    saved = dict(tk.TUNING)
    tk.TUNING.update(tuning or {})
    try:
        if separate_dx:
            wtconv_triton.input_grad_buffer = lambda dys, coef, lv: torch.empty(
                dys.shape, dtype=dys.dtype, memory_format=torch.channels_last)
        # The counter first: launch plans bind torch.empty when they are recorded.
        with AllocationCounter() as counter, no_kernels(mode):
            torch.autograd.grad(wtconv2d(x, *ps, backend="triton"), [x, *ps], dy)  # records the plans
            counter.live = counter.peak = 0
            y = wtconv2d(x, *ps, backend="triton")
            grads = torch.autograd.grad(y, [x, *ps], dy)
            del grads, y
    finally:
        wtconv_triton.input_grad_buffer = chosen
        tk.TUNING.clear()
        tk.TUNING.update(saved)
    return counter.peak


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/peak_cpu.json")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--shapes", type=int, default=len(STAGES), help="the first N stage shapes")
    args = ap.parse_args(argv)
    rows = []
    for c, h, w, levels in STAGES[: args.shapes]:
        x_bytes = args.batch * c * h * w * 2
        row = dict(B=args.batch, C=c, H=h, W=w, levels=levels, dtype="bf16", x_mib=x_bytes / 2**20)
        for name, separate, mode, tuning in (("peak", False, "workspace", None),
                                             ("no_workspace", False, "direct", None),
                                             ("no_onload", False, "direct", {"l1_onload": 0}),
                                             ("separate_dx", True, "direct", {"l1_onload": 0})):
            row[f"{name}_mib"] = layer_peak(args.batch, c, h, w, levels, separate, mode, tuning) / 2**20
        rows.append(row)
    hdr = (f"{'B, C, H, L':18} {'x MiB':>8} {'peak MiB':>9} {'peak / x':>9} {'no workspace MiB':>17} "
           f"{'l1_onload 0 MiB':>16} {'/ x':>6} {'+ separate dx MiB':>18}")
    lines = [f"{r['B']:>4}, {r['C']:>4}, {r['H']:>3}, {r['levels']:<3} {r['x_mib']:8.1f} {r['peak_mib']:9.1f} "
             f"{r['peak_mib'] / r['x_mib']:9.2f} {r['no_workspace_mib']:17.1f} {r['no_onload_mib']:16.1f} "
             f"{r['no_onload_mib'] / r['x_mib']:6.2f} {r['separate_dx_mib']:18.1f}"
             for r in rows]
    env = dict(cpu=platform.processor() or platform.machine(), torch=torch.__version__,
               python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M:%S"))
    report(args.out, env, hdr, lines, rows,
           note="peak bytes of torch.empty storages alive at once, fwd + bwd, y held; bf16 channels_last; no kernel run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
