"""Host-side cost of one fused WTConv layer call (forward + backward), measured on the CPU with no kernel run.

Usage (any machine; no GPU needed)::

    python benchmarks/host_cpu.py [--out results/host_cpu.json] [--iters 2000] [--shapes 4]

The eager triton backend's host work per layer call is Python and torch: argument checks, autocast and autograd,
the allocations, layout checks and shape arithmetic around the kernel launches (5 forward and 6 backward; 2 and 4
for maps of at most ``TUNING['small_max']``), and the launches' own bookkeeping. This script times
``wtconv2d(..., backend='triton')`` forward + backward on CPU tensors (Triton's interpreter lets the backend take
them; it is switched on here before wtconvnext is imported) at the WTConvNeXt-T stage shapes, B=1 bf16
channels_last, in five modes, so that no kernel runs:

- ``stub``: ``triton_kernels._launch`` is a no-op; only the work around the launches is timed;
- ``kept``: ``_launch`` runs its kept-kernel path (the cache key of every launch and its lookup, as on a GPU) up to
  the compiled kernel's launcher, which is a no-op here (the kernels are stand-ins and the device index is 0);
- ``planned``: as ``kept``, with launch plans (``launch_plan.py``): after the first call of a shape, each pass
  replays its recorded allocations and launches through the kept launchers' runners;
- ``direct``: as ``planned``, the replay calling the compiled kernels' launchers itself, tensors passed as their data pointers. (The stand-in runner is a bare lambda, cheaper than Triton's, so
  ``planned`` - ``direct`` here understates what the GPU path saves.)
- ``workspace``: as ``direct``, the intermediates of each pass in one workspace allocation
  (``launch_plan.WORKSPACE``; the default path on a GPU before graph mode);
- ``graphs``: as ``workspace``, in graph mode (``launch_plan.GRAPHS``, the default on a GPU): each pass looks up a
  graph by its pointers and replays it instead of launching; the graph is a stand-in whose replay does nothing, so
  this times the work around it (on a GPU the replay itself, ``cudaGraphLaunch``, adds its own microseconds; and
  where the CPU allocator hands a pass new addresses, the pass misses its graph and calls the stand-in launchers);
- ``op``: as ``workspace``, through the opaque custom ops that compiled code with dynamic sizes calls per layer:
  forward ``torch.ops.wtconvnext.wtconv2d``, then ``wtconv2d_backward`` (no autograd; bf16 parameters), so the
  difference to ``workspace`` is the ops' dispatch and the backward op's
  refolding against the Function's saved kernels and autograd.

``stub`` and ``kept`` run with launch plans off.

``chain_us``: per layer of ``--chain`` layers of the shape run in a chain with one backward (benchmarks.common
.layer_chain), the host time a layer adds to a model's step: a single layer's ``torch.autograd.grad`` also pays the
engine's fixed cost of a backward call, which a step pays once (``op``: none, it has no autograd).

The launch outputs are left uninitialised. Per mode and shape it prints the median wall time of one forward and
of one forward + backward over ``--iters`` timed iterations (in ``--rounds`` rounds, the modes alternating) and
writes JSON. CPU figures: the absolute times are this machine's, torch's CPU allocator stands in for the CUDA
caching allocator, and the device-index lookup is a stand-in; compare runs on one machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

os.environ["TRITON_INTERPRET"] = "1"  # before wtconvnext: the triton backend accepts CPU tensors only then

import contextlib  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import layer_chain, report, wtconv_inputs  # noqa: E402
from wtconvnext.ops import launch_plan  # noqa: E402
from wtconvnext.ops import small_kernels as sk  # noqa: E402
from wtconvnext.ops import triton_kernels as tk  # noqa: E402
from wtconvnext.ops import wtconv2d  # noqa: E402

MODES = ("stub", "kept", "planned", "direct", "workspace", "graphs", "op")
STAGES = [(96, 56, 56, 5), (192, 28, 28, 4), (384, 14, 14, 3), (768, 7, 7, 2)]  # C, H, W, levels (WTConvNeXt-T)


class _NoOpCompiled:
    """Stands in for Triton's compiled kernel: the attributes ``_launch`` checks, and a launcher that does nothing."""

    function = packed_metadata = None

    @staticmethod
    def run(*args: object) -> None:  # the launcher a direct replay calls
        return None

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        return lambda *args: None


class _NoOpGraph:
    """Stands in for a captured CUDA graph (graph mode): its replay does nothing."""

    @staticmethod
    def replay() -> None:
        return None


class _StandInKernel:
    """Stands in for a ``@triton.jit`` kernel: its parameter names, and a first launch that "compiles" it."""

    def __init__(self, fn: Any) -> None:
        self.arg_names, self.__name__, self.fn = fn.arg_names, fn.__name__, fn.fn  # (its defaults)

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., _NoOpCompiled]:
        return lambda *args, **kwargs: _NoOpCompiled()


@contextlib.contextmanager
def no_kernels(mode: str) -> Iterator[None]:
    """Inside: every launch of the fused WTConv does no work (``mode`` one of MODES, see the module
    docs)."""
    # Every kernel module: the launchers reach the small-map kernels through their module (a real kernel left in
    # place would run in the interpreter, on uninitialised data, for minutes).
    saved_mods = {mod: dict(vars(mod)) for mod in (tk, sk)}
    saved, const_info = saved_mods[tk], dict(tk._CONSTS)
    plans_on, direct_on, direct_env = launch_plan.ENABLED, launch_plan.DIRECT, launch_plan._direct_env
    workspace_on, graphs_on, graph_env = launch_plan.WORKSPACE, launch_plan.GRAPHS, launch_plan._graph_env
    launch_plan.clear()  # plans hold launchers: none may outlive the mode that recorded it
    launch_plan.ENABLED = mode in ("planned", "direct", "workspace", "graphs", "op")
    launch_plan.DIRECT = mode in ("direct", "workspace", "graphs", "op")
    launch_plan.WORKSPACE = mode in ("workspace", "graphs", "op")
    launch_plan._direct_env = (lambda: 0, lambda: True)  # the stand-in stream; no launch hooks
    # Graph mode: a capture that returns a graph whose replay does nothing (the stand-in launchers do nothing
    # either), and no stream is ever being captured.
    launch_plan.GRAPHS = mode == "graphs"
    launch_plan._graph_env = (lambda launches: _NoOpGraph(), lambda: False)
    try:
        if mode == "stub":
            tk._launch = lambda *args, **kwargs: None
        else:
            for mod, kernels in saved_mods.items():
                for name, value in kernels.items():
                    if name.endswith("_kernel") and hasattr(value, "arg_names"):
                        setattr(mod, name, _StandInKernel(value))
            tk._FAST_LAUNCH = True
            tk._device_index = lambda: 0  # no CUDA device here: Triton's driver would ask for one
            tk._COMPILED.clear()
            tk._CONSTS.clear()  # keyed by id(): a stand-in's id may be a freed one's
        yield
    finally:
        for name in ("_launch", "_FAST_LAUNCH", "_device_index"):
            setattr(tk, name, saved[name])
        for mod, kernels in saved_mods.items():
            for name in [n for n in kernels if n.endswith("_kernel")]:
                setattr(mod, name, kernels[name])
        tk._COMPILED.clear()
        tk._CONSTS.clear()
        tk._CONSTS.update(const_info)
        launch_plan.clear()
        launch_plan.ENABLED, launch_plan.DIRECT, launch_plan._direct_env = plans_on, direct_on, direct_env
        launch_plan.WORKSPACE, launch_plan.GRAPHS, launch_plan._graph_env = workspace_on, graphs_on, graph_env


def sample_ns(fn: Callable[[], object], iters: int) -> list[int]:
    """Wall-clock nanoseconds of each of ``iters`` calls of ``fn``, after a few warm-up calls, GC off."""
    for _ in range(3):
        fn()
    times = []
    gc.disable()
    try:
        for _ in range(iters):
            t0 = time.perf_counter_ns()
            fn()
            times.append(time.perf_counter_ns() - t0)
    finally:
        gc.enable()
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/host_cpu.json")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=20, help="the iterations split into rounds, modes alternating")
    ap.add_argument("--shapes", type=int, default=len(STAGES), help="the first N stage shapes")
    ap.add_argument("--chain", type=int, default=8, help="layers in the chained rows (0: none)")
    ap.add_argument("--tiny", action="store_true", help="one tiny shape (C=8, 9x9, 2 levels): a check of the script")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    shapes = [(8, 9, 9, 2)] if args.tiny else STAGES[: args.shapes]
    rows = []
    for c, h, w, levels in shapes:
        x, dy, p = wtconv_inputs(1, c, h, w, levels, torch.bfloat16, device="cpu")
        x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        dy = dy.contiguous(memory_format=torch.channels_last)
        ps = [t.requires_grad_() for t in p]

        def fwd() -> None:
            with torch.no_grad():
                wtconv2d(x, *ps, backend="triton")

        def fwd_bwd() -> None:
            torch.autograd.grad(wtconv2d(x, *ps, backend="triton"), [x, *ps], dy)

        chain = layer_chain(lambda *a: wtconv2d(*a, backend="triton"), x, ps, dy, args.chain) if args.chain else None
        xd, low = x.detach(), [t.detach() for t in ps]

        def op_fwd() -> None:
            torch.ops.wtconvnext.wtconv2d(xd, *low, 1)

        def op_fwd_bwd() -> None:
            torch.ops.wtconvnext.wtconv2d(xd, *low, 1)
            torch.ops.wtconvnext.wtconv2d_backward(dy, xd, *low, 1)

        # Short rounds, the modes alternating, so that slow phases of a shared machine hit both alike.
        times: dict[tuple[str, str], list[int]] = {}
        for _ in range(args.rounds):
            for mode in MODES:
                with no_kernels(mode):
                    fns = (("fwd", op_fwd), ("fwd_bwd", op_fwd_bwd)) if mode == "op" else (("fwd", fwd), ("fwd_bwd", fwd_bwd))
                    for name, fn in fns:
                        times.setdefault((mode, name), []).extend(sample_ns(fn, -(-args.iters // args.rounds)))
                    if chain is not None and mode != "op":
                        per = -(-args.iters // (args.rounds * args.chain))
                        times.setdefault((mode, "chain"), []).extend(t / args.chain for t in sample_ns(chain, per))
        for mode in MODES:
            rows.append(dict(mode=mode, C=c, H=h, W=w, levels=levels, B=1, dtype="bf16",
                             iters=len(times[mode, "fwd"]),
                             **{f"{name}_us": statistics.median(times[mode, name]) / 1e3 for name in ("fwd", "fwd_bwd")},
                             chain=args.chain,
                             chain_us=(statistics.median(times[mode, "chain"]) / 1e3 if (mode, "chain") in times
                                       else None)))
    hdr = f"{'mode':9} {'C, H, L':14} {'fwd us':>8} {'fwd+bwd us':>11} {'chain us/layer':>15}"
    lines = [f"{r['mode']:9} {r['C']:>4}, {r['H']:>3}, {r['levels']:<3} {r['fwd_us']:8.1f} {r['fwd_bwd_us']:11.1f} "
             + (f"{r['chain_us']:15.1f}" if r["chain_us"] is not None else f"{'-':>15}") for r in rows]
    env = dict(cpu=platform.processor() or platform.machine(), torch=torch.__version__, python=platform.python_version(),
               date=time.strftime("%Y-%m-%d %H:%M:%S"))
    report(args.out, env, hdr, lines, rows,
           note=f"median host time per call, B=1 bf16 channels_last, CPU, no kernel run; chain: per layer of "
                f"{args.chain} chained layers with one backward")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
