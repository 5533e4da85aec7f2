"""Cold compile time and step time of compiled (or ``--eager``) AMP training: ConvNeXt against WTConvNeXt.

Each case runs in a fresh process with empty Inductor and Triton caches, so its first step pays the whole compile
(dynamo, AOTAutograd, Inductor, Triton), as a user's first run does. Then milliseconds per step (median of
CUDA-event-timed steps) and peak memory, as ``bench_model.py`` measures them.

    python benchmarks/bench_compile.py [--models convnext_tiny wtconvnext_tiny] [--opaque] [--batch 128]
                                       [--out results/compile.json]

``--stacks S``: every S seconds each case's process writes every thread's Python stack to
``<out>.<model>.stacks.txt`` (beside ``--out``), so a case cut by ``--timeout`` still shows where its compile was.
A diagnostic only: faulthandler reads the other threads' frames while they run, and on the H200 (session 29) the
case died during its third dump; the rows of such a run are not timings.

``--eager``: no ``torch.compile``; the first step then pays only the Triton kernels' compiles, which
``wtconvnext/ops/compile_ahead.py`` runs side by side in threads. ``--compile-threads N ...`` adds a WTConvNeXt row per
value of ``WTCONVNEXT_COMPILE_THREADS`` (0, the default: each kernel compiles at its first launch, in series).

``--opaque`` adds a WTConvNeXt row compiled on the opaque custom ops (WTCONVNEXT_TRITON_OP=0) instead of the
default ``triton_op`` path. ``--tuning KEY=V ...`` adds WTConvNeXt rows whose kernels take other TUNING entries (one row per
argument, e.g. ``wgrad_pair=0`` or ``wgrad_pair=0,wgrad_unroll=0``): variants that compile faster, side by side. Rows also give the compile phases torch records (AOTAutograd trace, Inductor lowering,
waiting on Triton compiles) and, for WTConvNeXt, how often the memo of ``wtconvnext/ops/ttir_memo.py`` answered.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.common import Refuse, tuning_entries  # noqa: E402

PHASES = ("aot_collect_metadata", "aot_trace_joint_graph", "GraphLowering.run", "async_compile.wait")


def _case(name: str, batch: int) -> dict:
    """Run in the child process: compile and time one model."""
    import torch

    import benchmarks.bench_model as bm

    compiled = os.environ.get("BENCH_COMPILE_EAGER", "0") != "1"
    start = time.perf_counter()
    step = bm._train_step(name, True, compiled, batch)
    x = bm._input(batch, 224)
    step(x)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - start
    peak = bm._peak_gb(lambda: step(x))
    ms = bm._time_steps(lambda: step(x), 3, 15)
    bm._assert_fused(name, lambda: step(x))  # after timing: a profiler session would tax the timed launches
    from torch._dynamo.utils import compile_times, counters

    phases = {}
    for line in compile_times(repr="str", aggregate=True).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in PHASES:
            phases[parts[0]] = float(parts[1])
    row = dict(model=name, batch=batch, first_step_s=first_s, ms=ms, img_s=batch / ms * 1000, peak_gb=peak,
               graphs=counters["stats"].get("unique_graphs", 0), graph_breaks=sum(counters["graph_break"].values()),
               phases_s=phases, traced=os.environ.get("WTCONVNEXT_TRITON_OP", "1") != "0", compiled=compiled,
               compile_threads=os.environ.get("WTCONVNEXT_COMPILE_THREADS", ""))
    if name.startswith("wtconvnext"):
        import torch._higher_order_ops.triton_kernel_wrap as tkw

        from wtconvnext.ops.ttir_memo import MEMOISED

        row["memo"] = {n: dict(hits=getattr(tkw, n).hits, misses=getattr(tkw, n).misses)
                       for n in MEMOISED if getattr(getattr(tkw, n, None), "wtconvnext_memo", False)}
    return row


def _spawn(name: str, batch: int, traced: bool, timeout: int, tuning: str = "", stacks: int = 0,
           stacks_file: Optional[Path] = None, eager: bool = False, threads: Optional[int] = None) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(), TRITON_CACHE_DIR=tempfile.mkdtemp(),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               BENCH_COMPILE_EAGER="1" if eager else "0")
    if threads is not None:
        env["WTCONVNEXT_COMPILE_THREADS"] = str(threads)
    if stacks and stacks_file is not None:
        env["BENCH_COMPILE_STACKS"] = f"{stacks}:{stacks_file}"
    env["WTCONVNEXT_TRITON_OP"] = "1" if traced else "0"
    if tuning:
        path = Path(tempfile.mkdtemp()) / "tuning.json"
        path.write_text(json.dumps(tuning_entries(Refuse, tuning)))
        env["WTCONVNEXT_TUNING"] = str(path)
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", name, "--batch", str(batch)], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(model=name, batch=batch, traced=traced, tuning=tuning,
                    error=f"no first step within {timeout} s")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROW ")]
    if proc.returncode != 0 or not lines:
        return dict(model=name, batch=batch, traced=traced, tuning=tuning, error=proc.stderr.strip()[-600:])
    return dict(json.loads(lines[-1][4:]), tuning=tuning)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["convnext_tiny", "wtconvnext_tiny"])
    ap.add_argument("--opaque", action="store_true", help="also WTConvNeXt on the opaque custom ops")
    ap.add_argument("--tuning", nargs="*", default=[], metavar="KEY=V[,KEY=V]",
                    help="also WTConvNeXt rows with these TUNING entries, one row each")
    ap.add_argument("--eager", action="store_true", help="eager training (the kernels' compiles only)")
    ap.add_argument("--compile-threads", nargs="*", type=int, default=[], metavar="N",
                    help="also WTConvNeXt rows with WTCONVNEXT_COMPILE_THREADS=N, one row each")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--timeout", type=int, default=400, help="seconds per case")
    ap.add_argument("--out", default="results/compile.json")
    ap.add_argument("--stacks", type=int, default=0, metavar="S",
                    help="every S seconds, dump each case's Python stacks beside --out (0: off)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        dump = os.environ.get("BENCH_COMPILE_STACKS")
        if dump:  # where the compile spends its time, even if the parent's timeout kills this process
            import faulthandler

            every, path = dump.split(":", 1)
            faulthandler.dump_traceback_later(int(every), repeat=True, file=open(path, "w"))  # noqa: SIM115
        print("ROW " + json.dumps(_case(args.child, args.batch)), flush=True)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_compile.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from benchmarks.common import gpu_env, report

    for spec in args.tuning:
        tuning_entries(Refuse, spec)  # a malformed entry fails before any case runs
    wt = [m for m in args.models if m.startswith("wtconvnext")]
    cases = [(m, True, "", None) for m in args.models]
    if args.opaque:
        cases += [(m, False, "", None) for m in wt]
    cases += [(m, True, t, None) for t in args.tuning for m in wt]
    cases += [(m, True, "", n) for n in args.compile_threads for m in wt]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, traced, tuning, threads in cases:
        tag = name + ("" if traced else "_opaque") + (f"_{tuning.replace(',', '_')}" if tuning else "")
        tag += "" if threads is None else f"_threads{threads}"
        stacks_file = Path(args.out).with_suffix(f".{tag}.stacks.txt")
        rows.append(_spawn(name, args.batch, traced, args.timeout, tuning, args.stacks, stacks_file, args.eager,
                           threads))
        print("  ", rows[-1], flush=True)
    base = next((r for r in rows if r["model"].startswith("convnext") and "error" not in r), None)
    lines = []
    for r in rows:
        label = r["model"] + (" (opaque ops)" if r["model"].startswith("wtconvnext") and not r.get("traced", True)
                              else "")
        label += f" {r['tuning']}" if r.get("tuning") else ""
        label += f" threads={r['compile_threads']}" if r.get("compile_threads") else ""
        if "error" in r:
            lines.append(f"{label:<44} error: {r['error'][:200]}")
            continue
        ratio = f"{base['ms'] / r['ms']:.2f}x" if base else "-"
        p = r["phases_s"]
        lines.append(f"{label:<44} {r['first_step_s']:8.1f} {r['ms']:8.2f} {ratio:>7} {r['peak_gb']:7.2f} "
                     + " ".join(f"{p.get(k, 0):7.1f}" for k in PHASES))
    header = (f"{'AMP train, ' + ('eager' if args.eager else 'compiled') + ', B=' + str(args.batch):<44} {'1st s':>8} {'ms/step':>8} {'img/s x':>7} "
              f"{'peak GB':>7} " + " ".join(f"{k.split('.')[0][:7]:>7}" for k in PHASES))
    report(args.out, gpu_env(), header, lines, rows,
           note="1st s: the first step, cold caches (compile included); img/s x: against the ConvNeXt row")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
