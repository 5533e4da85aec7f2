"""Model-level benchmark: ``wtconvnext_<size>`` against timm's ``convnext_<size>``, side by side in one run.

Usage (any CUDA GPU)::

    python benchmarks/bench_model.py [--out results/model.json] [--no-compile | --compile-amp-only] [--batch 128]
        [--sizes tiny small base] [--dense] [--eager-tasks [train] [infer]]
        [--eager-amp-only] [--multiscale]

Measures, for each pair: AdamW training step images/s at 224^2 under bf16 autocast and in fp32, eager and (unless
--no-compile) torch.compile; inference images/s under bf16 autocast and fp32; peak memory of a training step.
``--dense``: ``features_only`` backbones under AMP at 512^2 (B=16) and 1024^2 (B=4), inference and forward +
backward (the detection / segmentation use). ``--multiscale``: compiled AMP training at B=16 over 224, 256, 192,
320, 224 pixels, milliseconds per step at each size and the number of graphs compiled. Every model runs
channels_last, as timm's train.py does with --channels-last (cuDNN's fast depthwise kernels are NHWC). Prints a
table with the ratios WTConvNeXt / ConvNeXt and writes JSON. ``--check`` runs the smallest case of every task once
on the CPU (``test_convnext`` vs ``test_wtconvnext``, 64 px): it checks the script, it does not time anything.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import timm  # noqa: E402

import wtconvnext  # noqa: E402,F401  (registers the models)
from benchmarks.common import gpu_env, report  # noqa: E402

COMPILE_MODE = "default"  # --compile-mode; "reduce-overhead" replays CUDA graphs (no per-launch host cost)
DEVICE = "cuda"  # "cpu" under --check
# --check: one block per stage (every stage's WTConv, its own level count, is still traced; the dynamic-size
# tracing of the reference WTConv is most of the check's time: 114 of 162 s with timm's (1, 2, 4, 2), session 46).
MODEL_KWARGS: dict = {}
MULTISCALE = (224, 256, 192, 320, 224)
DENSE = ((512, 16), (1024, 4))  # resolution, batch


def _pair(size: str) -> tuple[str, str]:
    """(ConvNeXt, WTConvNeXt) model names of one size; "test" is timm's and our CI-sized models."""
    return ("test_convnext", "test_wtconvnext") if size == "test" else (f"convnext_{size}", f"wtconvnext_{size}")


def _compile(model):
    if DEVICE == "cpu":  # --check: trace and run without building C++ kernels
        return torch.compile(model, backend="aot_eager")
    return torch.compile(model, mode=None if COMPILE_MODE == "default" else COMPILE_MODE)


def _step_begin(compile_: bool) -> None:
    if compile_ and COMPILE_MODE == "reduce-overhead":
        torch.compiler.cudagraph_mark_step_begin()


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _time_steps(step, warmup: int, iters: int) -> float:
    """Median milliseconds of ``step()`` over ``iters`` CUDA-event-timed runs after ``warmup`` runs."""
    import time

    for _ in range(warmup):
        step()
    _sync()
    times = []
    for _ in range(iters):
        if DEVICE == "cpu":
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1000)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def _peak_gb(step) -> float:
    """Peak memory of one ``step()`` (0 on the CPU)."""
    if DEVICE == "cpu":
        step()
        return 0.0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


def _free() -> None:
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def _input(batch: int, res: int) -> torch.Tensor:
    return torch.randn(batch, 3, res, res, device=DEVICE).to(memory_format=torch.channels_last)


def _train_step(name: str, amp: bool, compile_: bool, batch: int, patch=None):
    """An AdamW training step of ``name`` (and what it holds), classification at 1000 classes; ``patch``: a
    function that changes the model in place first (a prototype's A/B)."""
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=1000, **MODEL_KWARGS).to(DEVICE)
    model = model.to(memory_format=torch.channels_last)
    if patch is not None:
        patch(model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, fused=DEVICE == "cuda")
    fwd = _compile(model) if compile_ else model
    loss_fn = torch.nn.CrossEntropyLoss()
    target = torch.randint(0, 1000, (batch,), device=DEVICE)

    def step(x):
        _step_begin(compile_)
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(fwd(x), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _assert_fused(name: str, step) -> None:
    """Raise unless a WTConvNeXt ``step()`` runs the fused WTConv kernels on the GPU: a silent fallback to the
    reference's convolutions (as torch 2.11's ``is_exporting()`` inside compiled code once caused) must not
    produce a row."""
    if DEVICE != "cuda" or not name.startswith(("wtconvnext", "test_wtconvnext")):
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    if not any("_conv_kernel" in e.key for e in prof.key_averages()):
        raise RuntimeError(f"{name}: the step ran no fused WTConv kernel (a fallback to the reference path); "
                           "its figures would not measure this project's kernels")


def _train_case(name: str, amp: bool, compile_: bool, batch: int, warmup: int, iters: int, res: int = 224,
                patch=None) -> dict:
    train = _train_step(name, amp, compile_, batch, patch)
    x = _input(batch, res)
    train(x)  # compile / allocate outside the memory and time measurements
    peak = _peak_gb(lambda: train(x))
    ms = _time_steps(lambda: train(x), warmup, iters)
    _assert_fused(name, lambda: train(x))  # after timing: the row is timed with no profiler ever run before it
    del train
    _free()
    return dict(ms=ms, img_s=batch / ms * 1000, peak_gb=peak)


def _infer_case(name: str, amp: bool, compile_: bool, batch: int, warmup: int, iters: int, res: int = 224,
                patch=None) -> dict:
    model = timm.create_model(name, num_classes=1000, **MODEL_KWARGS).to(DEVICE).eval()
    model = model.to(memory_format=torch.channels_last)
    if patch is not None:
        patch(model)
    fwd = _compile(model) if compile_ else model
    x = _input(batch, res)

    def step():
        _step_begin(compile_)
        with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=amp):
            fwd(x)

    step()
    ms = _time_steps(step, warmup, iters)
    _assert_fused(name, step)  # after timing (see _train_case)
    del model, fwd
    _free()
    return dict(ms=ms, img_s=batch / ms * 1000)


def _dense_case(name: str, train: bool, batch: int, res: int, warmup: int, iters: int) -> dict:
    """``features_only`` backbone under bf16 AMP: inference, or forward + backward of the sum of its maps."""
    model = timm.create_model(name, features_only=True, **MODEL_KWARGS).to(DEVICE)
    model = model.to(memory_format=torch.channels_last)
    model.train(train)
    x = _input(batch, res)

    def step():
        with torch.autocast(DEVICE, dtype=torch.bfloat16), torch.set_grad_enabled(train):
            feats = model(x)
        if train:
            sum(f.float().mean() for f in feats).backward()

    step()
    peak = _peak_gb(step)
    ms = _time_steps(step, warmup, iters)
    del model
    _free()
    return dict(ms=ms, img_s=batch / ms * 1000, peak_gb=peak)


def _multiscale_case(name: str, batch: int, sizes: tuple[int, ...], iters: int) -> dict:
    """Compiled AMP training over ``sizes`` in turn (the first step at each size compiles, if it must): median ms
    per step of the later ones at each size, and the graphs compiled in all."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    train = _train_step(name, True, True, batch)
    per_size = []
    for res in sizes:
        x = _input(batch, res)
        train(x)
        per_size.append(_time_steps(lambda: train(x), 0, iters))
    graphs = int(counters["stats"]["unique_graphs"])
    del train
    _free()
    return dict(ms=sum(per_size) / len(per_size), img_s=batch / (sum(per_size) / len(per_size)) * 1000,
                ms_per_size=per_size, graphs=graphs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/model.json")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--infer-batch", type=int, default=256)
    ap.add_argument("--sizes", nargs="+", default=["tiny"], choices=["tiny", "small", "base", "test"],
                    help="model sizes: convnext_<size> vs wtconvnext_<size>")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--compile-amp-only", action="store_true", help="torch.compile runs under bf16 AMP only")
    ap.add_argument("--compiled-only", action="store_true", help="skip the eager training and inference runs")
    ap.add_argument("--compile-mode", default="default",
                    choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
                    help="torch.compile mode for both models")
    ap.add_argument("--dense", action="store_true", help="also features_only at 512^2 B=16 and 1024^2 B=4 (AMP)")
    ap.add_argument("--eager-tasks", nargs="*", default=["train", "infer"], choices=["train", "infer"],
                    help="the eager table's tasks (none: e.g. --dense alone, in a time-limited call)")
    ap.add_argument("--eager-amp-only", action="store_true", help="the eager table under bf16 AMP only (no fp32 rows)")
    ap.add_argument("--multiscale", action="store_true",
                    help="also compiled AMP training at B=16 over 224, 256, 192, 320, 224 px")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--check", action="store_true", help="the smallest case of every task once, on the CPU")
    args = ap.parse_args(argv)
    global COMPILE_MODE, DEVICE, MODEL_KWARGS
    COMPILE_MODE = args.compile_mode
    res, dense, multiscale = 224, DENSE, MULTISCALE
    if args.check:
        DEVICE = "cpu"
        MODEL_KWARGS = dict(depths=(1, 1, 1, 1))
        args.sizes, args.batch, args.infer_batch, args.warmup, args.iters = ["test"], 2, 2, 0, 1
        args.compile_amp_only = True
        # (96 -> 128 makes the sizes dynamic; 64 then reuses that graph unless something guards on the sizes.)
        res, dense, multiscale = 64, ((64, 2),), (96, 128, 64)
    elif not torch.cuda.is_available():
        print("bench_model.py needs a CUDA GPU (or --check)", file=sys.stderr)
        return 2
    else:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True  # timm's train.py default behaviour on Ampere+ for fp32
        torch.backends.cudnn.allow_tf32 = True
    rows = []

    def add(size: str, name: str, task: str, amp: bool, compile_: bool, batch: int, r: dict, res_: int) -> None:
        rows.append(dict(size=size, model=name, task=task, amp=amp, compile=compile_, batch=batch, res=res_, **r))
        print(f"  {rows[-1]}", flush=True)

    # Eager first, compiled (slow to build) last, so a time-limited run keeps the eager figures.
    for size in args.sizes:
        pair = _pair(size)

        def run(task: str, amp: bool, compile_: bool) -> None:
            case, batch = (_train_case, args.batch) if task == "train" else (_infer_case, args.infer_batch)
            for name in pair:
                if compile_:  # each compiled row traces from empty caches: no graph of an earlier row is reused
                    torch._dynamo.reset()
                add(size, name, task, amp, compile_, batch,
                    case(name, amp, compile_, batch, args.warmup, args.iters, res), res)

        if not args.compiled_only:
            for task in args.eager_tasks:
                for amp in (True,) if args.eager_amp_only else (True, False):
                    run(task, amp, False)
            if args.dense or args.check:
                for dres, dbatch in dense:
                    for train in (False, True):
                        for name in pair:
                            add(size, name, "dense_train" if train else "dense_infer", True, False, dbatch,
                                _dense_case(name, train, dbatch, dres, args.warmup, args.iters), dres)
        if not args.no_compile:
            for amp in (True,) if args.compile_amp_only else (True, False):
                run("train", amp, True)
            if args.multiscale or args.check:
                mbatch = 16 if not args.check else 2
                for name in pair:  # _multiscale_case resets dynamo's caches itself
                    add(size, name, "multiscale", True, True, mbatch,
                        _multiscale_case(name, mbatch, multiscale, max(args.iters // 4, 1)), 0)

    by = {(r["size"], r["model"], r["task"], r["amp"], r["compile"], r["res"]): r for r in rows}
    for r in rows:
        base = by[(r["size"], _pair(r["size"])[0], r["task"], r["amp"], r["compile"], r["res"])]
        r["throughput_vs_convnext"] = r["img_s"] / base["img_s"]
        if r.get("peak_gb"):
            r["peak_vs_convnext"] = r["peak_gb"] / base["peak_gb"]
        if "graphs" in r:
            r["graphs_vs_convnext"] = r["graphs"] / max(base["graphs"], 1)

    hdr = (f"{'task':11} {'mode':17} {'res':>5} {'model':22} {'ms':>8} {'img/s':>8} {'peak GB':>8} "
           f"{'img/s vs ConvNeXt':>18} {'mem vs ConvNeXt':>16} {'graphs':>6}")
    lines = []
    for r in rows:
        mode = ("bf16-amp" if r["amp"] else "fp32") + (" compiled" if r["compile"] else " eager")
        peak = f"{r['peak_gb']:8.2f}" if "peak_gb" in r else f"{'':8}"
        mem = f"{r['peak_vs_convnext']:16.2f}" if "peak_vs_convnext" in r else f"{'':16}"
        graphs = f"{r['graphs']:6d}" if "graphs" in r else f"{'':6}"
        lines.append(f"{r['task']:11} {mode:17} {r['res'] or '-':>5} {r['model']:22} {r['ms']:8.2f} {r['img_s']:8.0f} "
                     f"{peak} {r['throughput_vs_convnext']:18.2f} {mem} {graphs}")
    env = gpu_env(timm=timm.__version__, channels_last=True, compile_mode=COMPILE_MODE) if DEVICE == "cuda" else {}
    report(args.out, env, hdr, lines, rows,
           note="multiscale: ms is the mean over the sizes of the median step at each size (ms_per_size in the JSON)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
