"""Host time of one WTConv layer call (forward + backward) on each launch path.

Usage (any CUDA GPU)::

    python benchmarks/host_overhead.py [--out results/host.json] [--iters 300] [--rounds 7] [--no-compile]
                                       [--kernel-time] [--cprofile N]

At B=1 every kernel finishes in microseconds, so the wall time of an iteration is the host's: Python, torch's
allocations and autograd, and the kernel launches. For each WTConvNeXt-T stage shape (channels_last, bf16) it
times forward + backward of the fused WTConv with every launch through ``kernel[grid](...)`` ("triton"), through
the compiled kernels kept after their first launch ("kept"; ``_launch`` in ``wtconvnext/ops/triton_kernels.py``),
with launch plans replayed through Triton's runners ("planned"), calling the launchers directly ("direct") and
so with the intermediates in one workspace allocation per pass ("workspace"; ``wtconvnext/ops/launch_plan.py``;
``host_us`` is the default one of these), replaying each pass's launches as a CUDA graph keyed by its pointers
("graphs", ``launch_plan.GRAPHS``, the default since session 52), and
compiled with static sizes (Inductor's code launches the kernels), in alternating rounds so that drifts of the
host hit all alike, with cuDNN's depthwise 7x7, eager and compiled, for scale. Prints the median per iteration and
writes JSON.

``shell`` is the floor under any autograd Function with this layer's interface: a Function of the same six inputs
that only allocates its output in the forward and the six gradients in the backward, launching nothing (so
default - shell is what the passes themselves cost on the host: plan lookup, workspace, launches).

A single layer's ``torch.autograd.grad`` also pays the autograd engine's fixed cost of a backward call (its graph
task and the hand-off to its device thread), which a model pays once per step, not once per layer. So the default
path and cuDNN's dw7 are also timed as a chain of ``--chain`` layers of the shape (each with its own parameters)
with one backward: ``chain_us`` and ``dw7_chain_us`` are per layer, the host time a layer adds to a model's step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_layer import SHAPES  # noqa: E402
from benchmarks.common import (device_time_us, gpu_env, layer_chain, report, wall_us, write_json,  # noqa: E402
                               wtconv_inputs)
from wtconvnext.ops import launch_plan  # noqa: E402
from wtconvnext.ops import triton_kernels as tk  # noqa: E402
from wtconvnext.ops import wtconv2d  # noqa: E402


# Launch paths timed side by side: (triton_kernels._FAST_LAUNCH, launch_plan.ENABLED, launch_plan.DIRECT,
# launch_plan.WORKSPACE, launch_plan.GRAPHS).
MODES = {"triton": (False, False, False, False, False), "kept": (True, False, False, False, False),
         "planned": (True, True, False, False, False), "direct": (True, True, True, False, False),
         "workspace": (True, True, True, True, False), "graphs": (True, True, True, True, True)}


class _Shell(torch.autograd.Function):
    """The layer's autograd interface with no work: y allocated in the forward, dx and the five parameter gradients
    in the backward (``shell`` rows: the host floor of an autograd Function with these inputs)."""

    @staticmethod
    def forward(ctx, x, *params):
        ctx.save_for_backward(x, *params)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        return tuple(torch.empty_like(t) for t in ctx.saved_tensors)


def _shell(x, *params):
    return _Shell.apply(x, *params)


def _flags() -> tuple[bool, ...]:
    return tk._FAST_LAUNCH, launch_plan.ENABLED, launch_plan.DIRECT, launch_plan.WORKSPACE, launch_plan.GRAPHS


def _set_flags(flags: tuple[bool, ...]) -> None:
    tk._FAST_LAUNCH, launch_plan.ENABLED, launch_plan.DIRECT, launch_plan.WORKSPACE, launch_plan.GRAPHS = flags


def set_mode(mode: str) -> None:
    _set_flags(MODES[mode])


def default_mode() -> str:
    """The launch path a layer call takes with the module defaults."""
    now = _flags()
    # WORKSPACE and GRAPHS only matter with DIRECT, DIRECT only with plans: the first mode whose effective flags
    # match.
    effective = lambda f: (f[0], f[1], f[1] and f[2], f[1] and f[2] and f[3], f[1] and f[2] and f[4])  # noqa: E731
    return next(m for m, flags in MODES.items() if effective(flags) == effective(now))


def kernel_us(fn, iters: int) -> float:
    """Microseconds of GPU kernel (and copy) time per call of ``fn``, by torch.profiler's CUDA activity: set beside a
    wall time, whether the calls are host-bound (wall above it) or GPU-bound (wall at it)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    return sum(device_time_us(e) for e in prof.key_averages()) / iters


def host_profile(fn, iters: int, top: int) -> str:
    """cProfile of ``iters`` calls of ``fn``: the ``top`` functions by own time (where the host time goes; the
    launchers and torch's C functions appear as built-ins). Autograd runs the backward on the calling thread here
    (``set_multithreading_enabled(False)``): on its CUDA device thread, which cProfile does not see, the whole
    backward's Python counted as the engine's own time."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    with torch.autograd.set_multithreading_enabled(False):
        prof.enable()
        for _ in range(iters):
            fn()
        prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/host.json")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--shapes", nargs="+", type=int, default=[0, 1, 2, 3], choices=range(4), metavar="I",
                    help="stage shapes, by index, in this order")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled rows (their compiles take minutes)")
    ap.add_argument("--chain", type=int, default=8, metavar="N",
                    help="layers in the chained rows (per-layer host time with one backward per chain; 0: none)")
    ap.add_argument("--kernel-time", action="store_true",
                    help="also the GPU kernel time per call of the default path, single and per layer in the chain "
                         "(torch.profiler): at B=1 a chain may be GPU-bound rather than host-bound")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="also print a cProfile of N default-path calls per shape (top 25 functions by own time)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_overhead.py needs a CUDA GPU", file=sys.stderr)
        return 2
    cl = torch.channels_last
    env = gpu_env()
    rows = []
    for _, c, h, w, levels in (SHAPES[i] for i in args.shapes):
        x, dy, p = wtconv_inputs(1, c, h, w, levels, torch.bfloat16)
        x = x.contiguous(memory_format=cl).requires_grad_()
        dy = dy.contiguous(memory_format=cl)
        ps = [t.detach().requires_grad_() for t in p]
        w7 = (torch.randn(c, 1, 7, 7, device="cuda") * 0.1).to(torch.bfloat16).requires_grad_()

        def wt():
            torch.autograd.grad(wtconv2d(x, *ps), [x, *ps], dy)

        def dw7():
            torch.autograd.grad(F.conv2d(x, w7, padding=3, groups=c), [x, w7], dy)

        def shell():
            torch.autograd.grad(_shell(x, *ps), [x, *ps], dy)

        # Chains of args.chain layers, one backward each (module docs): per layer, what a model's step pays.
        n = args.chain
        chained = {"chain": layer_chain(wtconv2d, x, ps, dy, n),
                   "dw7_chain": layer_chain(lambda a, b: F.conv2d(a, b, padding=3, groups=c), x, [w7], dy, n),
                   "shell_chain": layer_chain(_shell, x, ps, dy, n),
                   } if n else {}

        # Compiled (static sizes): Inductor's code launches the kernels (the triton_op path), no CUDA graphs.
        wt_graph = torch.compile(lambda *a: wtconv2d(*a), fullgraph=True, dynamic=False)
        dw7_graph = torch.compile(lambda a, b: F.conv2d(a, b, padding=3, groups=c), fullgraph=True, dynamic=False)

        def wt_compiled():
            torch.autograd.grad(wt_graph(x, *ps), [x, *ps], dy)

        def dw7_compiled():
            torch.autograd.grad(dw7_graph(x, w7), [x, w7], dy)

        defaults = _flags()
        default = default_mode()
        times: dict[str, list[float]] = {m: [] for m in (*MODES, "dw7", "shell", "compiled", "dw7_compiled",
                                                         "chain", "dw7_chain", "shell_chain",
                                                         "workspace_chain", "graphs_chain")}
        try:
            for mode in MODES:  # compile / fill the caches and record the plans outside the timing
                set_mode(mode)
                for _ in range(3):  # graphs: recorded, seen, captured
                    wt()
            compiled = {"dw7": dw7, "shell": shell} if args.no_compile else {
                "dw7": dw7, "shell": shell, "compiled": wt_compiled, "dw7_compiled": dw7_compiled}
            for mode in ("workspace", "graphs") if n else ():  # the chain's plans recorded, graphs captured
                set_mode(mode)
                for _ in range(3):
                    chained["chain"]()
            set_mode(default)
            for fn in (*compiled.values(), *chained.values()):
                fn()
                fn()
            for _ in range(args.rounds):
                for mode in MODES:
                    set_mode(mode)
                    times[mode].append(wall_us(wt, args.iters))
                set_mode(default)
                for name, fn in compiled.items():
                    times[name].append(wall_us(fn, args.iters))
                for name, fn in chained.items():
                    times[name].append(wall_us(fn, max(args.iters // n, 1)) / n)
                for mode in ("workspace", "graphs") if n else ():  # both in a chain, as a model's step runs them
                    if mode == default:
                        times[f"{mode}_chain"].append(times["chain"][-1])
                        continue
                    set_mode(mode)
                    times[f"{mode}_chain"].append(wall_us(chained["chain"], max(args.iters // n, 1)) / n)
                    set_mode(default)
            kernels = {}
            if args.kernel_time:
                set_mode(default)
                kernels["kernel_us"] = kernel_us(wt, 20)
                if n:
                    kernels["chain_kernel_us"] = kernel_us(chained["chain"], 5) / n
                print(f"kernel time, C={c} {h}x{w}: " + ", ".join(f"{k} {v:.1f}" for k, v in kernels.items()),
                      flush=True)
            if args.cprofile:
                set_mode(default)
                print(f"=== cProfile, C={c} {h}x{w} L={levels}, B=1 bf16 f+b, {args.cprofile} calls ({default})")
                print(host_profile(wt, args.cprofile, 25))
                # What autograd's hand-off of the backward to its device thread costs each (the profile's setting).
                with torch.autograd.set_multithreading_enabled(False):
                    print(f"backward on the calling thread: ours {wall_us(wt, args.iters):.1f} us, "
                          f"dw7 {wall_us(dw7, args.iters):.1f} us per f+b (table: on autograd's device thread)")
        finally:
            _set_flags(defaults)
        med = {k: statistics.median(v) if v else None for k, v in times.items()}
        rows.append(dict(C=c, H=h, W=w, levels=levels, dtype="bf16", B=1, iters=args.iters, rounds=args.rounds,
                         triton_us=med["triton"], kept_us=med["kept"], planned_us=med["planned"],
                         direct_us=med["direct"], workspace_us=med["workspace"], graphs_us=med["graphs"],
                         dw7_us=med["dw7"], shell_us=med["shell"], shell_chain_us=med["shell_chain"],
                         workspace_chain_us=med["workspace_chain"], graphs_chain_us=med["graphs_chain"],
                         host_us=med[default], default_path=default, compiled_us=med["compiled"],
                         dw7_compiled_us=med["dw7_compiled"], chain=args.chain, chain_us=med["chain"],
                         dw7_chain_us=med["dw7_chain"], **kernels,
                         samples=times))
        # Each shape's medians as they come, printed and written (a call cut by its time limit keeps them).
        print(f"row C={c} H={h} L={levels}: " + ", ".join(f"{k} {v:.1f} us" for k, v in med.items() if v), flush=True)
        write_json(args.out, dict(env=env, rows=rows, partial=True))
    hdr = (f"{'C, H, L':14} {'triton launch us':>17} {'kept kernels us':>16} {'planned us':>11} {'direct us':>10} "
           f"{'workspace us':>13} {'graphs us':>10} {'dw7 us':>8} {'shell us':>9} {'default/dw7':>12} "
           f"{'compiled us':>12} "
           f"{'dw7 compiled us':>16} "
           f"{'ratio':>6} {'chain us/layer':>15} {'dw7 chain':>10} {'ratio':>6} {'shell chain':>12} "
           f"{'workspace chain':>16} {'graphs chain':>13}")
    lines = [f"{r['C']:>4}, {r['H']:>3}, {r['levels']:<3} {r['triton_us']:17.1f} {r['kept_us']:16.1f} "
             f"{r['planned_us']:11.1f} {r['direct_us']:10.1f} {r['workspace_us']:13.1f} {r['graphs_us']:10.1f} "
             f"{r['dw7_us']:8.1f} {r['shell_us']:9.1f} "
             f"{r['host_us'] / r['dw7_us']:12.2f} "
             + (f"{r['compiled_us']:12.1f} {r['dw7_compiled_us']:16.1f} {r['compiled_us'] / r['dw7_compiled_us']:6.2f}"
                if r["compiled_us"] is not None else f"{'-':>12} {'-':>16} {'-':>6}")
             + (f" {r['chain_us']:15.1f} {r['dw7_chain_us']:10.1f} {r['chain_us'] / r['dw7_chain_us']:6.2f}"
                f" {r['shell_chain_us']:12.1f} {r['workspace_chain_us']:16.1f} {r['graphs_chain_us']:13.1f}"
                if r["chain_us"] is not None else f" {'-':>15} {'-':>10} {'-':>6} {'-':>12} {'-':>16} {'-':>13}")
             for r in rows]
    report(args.out, env, hdr, lines, rows,
           note="median wall per forward + backward, B=1 bf16 channels_last (host-bound); shell: the same autograd "
                "interface with no work (allocations only); chain: per layer of "
                f"{args.chain} chained layers with one backward (the default path)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
