"""Model-level benchmark: ``wtconvnext_tiny`` against timm's ``convnext_tiny``, side by side in one run.

Usage (any CUDA GPU)::

    python benchmarks/bench_model.py [--out results/model.json] [--no-compile | --compile-amp-only] [--batch 128]

Measures, for each model: AdamW training step images/s at 224^2 under bf16 autocast and in fp32, eager and (unless
--no-compile) torch.compile; inference images/s under bf16 autocast and fp32; peak memory of a training step. Both
models run channels_last, as timm's train.py does with --channels-last (cuDNN's fast depthwise kernels are NHWC).
Prints a table with the ratios WTConvNeXt / ConvNeXt and writes JSON.
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

MODELS = ("convnext_tiny", "wtconvnext_tiny")
COMPILE_MODE = "default"  # --compile-mode; "reduce-overhead" replays CUDA graphs (no per-launch host cost)


def _compile(model):
    return torch.compile(model, mode=None if COMPILE_MODE == "default" else COMPILE_MODE)


def _step_begin(compile_: bool) -> None:
    if compile_ and COMPILE_MODE == "reduce-overhead":
        torch.compiler.cudagraph_mark_step_begin()


def _time_steps(step, warmup: int, iters: int) -> float:
    """Median milliseconds of ``step()`` over ``iters`` CUDA-event-timed runs after ``warmup`` runs."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def _train_case(name: str, amp: bool, compile_: bool, batch: int, warmup: int, iters: int) -> dict:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=1000).cuda().to(memory_format=torch.channels_last)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, fused=True)
    fwd = _compile(model) if compile_ else model
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    target = torch.randint(0, 1000, (batch,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        _step_begin(compile_)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(fwd(x), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # compile / allocate outside the memory and time measurements
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30
    ms = _time_steps(step, warmup, iters)
    del model, opt, fwd
    torch.cuda.empty_cache()
    return dict(ms=ms, img_s=batch / ms * 1000, peak_gb=peak)


def _infer_case(name: str, amp: bool, compile_: bool, batch: int, warmup: int, iters: int) -> dict:
    model = timm.create_model(name, num_classes=1000).cuda().eval().to(memory_format=torch.channels_last)
    fwd = _compile(model) if compile_ else model
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)

    def step():
        _step_begin(compile_)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            fwd(x)

    step()
    ms = _time_steps(step, warmup, iters)
    del model, fwd
    torch.cuda.empty_cache()
    return dict(ms=ms, img_s=batch / ms * 1000)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/model.json")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--infer-batch", type=int, default=256)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--compile-amp-only", action="store_true", help="torch.compile runs under bf16 AMP only")
    ap.add_argument("--compiled-only", action="store_true", help="skip the eager training and inference runs")
    ap.add_argument("--compile-mode", default="default",
                    choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
                    help="torch.compile mode for both models")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    global COMPILE_MODE
    COMPILE_MODE = args.compile_mode
    if not torch.cuda.is_available():
        print("bench_model.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True  # timm's train.py default behaviour on Ampere+ for fp32
    torch.backends.cudnn.allow_tf32 = True
    rows = []

    def run(task: str, amp: bool, compile_: bool) -> None:
        case, batch = (_train_case, args.batch) if task == "train" else (_infer_case, args.infer_batch)
        for name in MODELS:
            r = case(name, amp, compile_, batch, args.warmup, args.iters)
            rows.append(dict(model=name, task=task, amp=amp, compile=compile_, batch=batch, **r))
            print(f"  {rows[-1]}", flush=True)

    # Eager first, compiled (slow to build) last, so a time-limited run keeps the eager figures.
    if not args.compiled_only:
        for task in ("train", "infer"):
            for amp in (True, False):
                run(task, amp, False)
    if not args.no_compile:
        for amp in (True,) if args.compile_amp_only else (True, False):
            run("train", amp, True)

    by = {(r["model"], r["task"], r["amp"], r["compile"]): r for r in rows}
    for r in rows:
        base = by[("convnext_tiny", r["task"], r["amp"], r["compile"])]
        r["throughput_vs_convnext"] = r["img_s"] / base["img_s"]
        if "peak_gb" in r:
            r["peak_vs_convnext"] = r["peak_gb"] / base["peak_gb"]

    hdr = f"{'task':6} {'mode':14} {'model':16} {'ms':>8} {'img/s':>8} {'peak GB':>8} {'img/s vs ConvNeXt':>18} {'mem vs ConvNeXt':>16}"
    lines = []
    for r in rows:
        mode = ("bf16-amp" if r["amp"] else "fp32") + (" compiled" if r["compile"] else " eager")
        peak = f"{r['peak_gb']:8.2f}" if "peak_gb" in r else f"{'':8}"
        mem = f"{r['peak_vs_convnext']:16.2f}" if "peak_vs_convnext" in r else f"{'':16}"
        lines.append(f"{r['task']:6} {mode:14} {r['model']:16} {r['ms']:8.2f} {r['img_s']:8.0f} {peak} "
                     f"{r['throughput_vs_convnext']:18.2f} {mem}")
    report(args.out, gpu_env(timm=timm.__version__, channels_last=True, compile_mode=COMPILE_MODE), hdr, lines, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
