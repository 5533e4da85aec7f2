"""train.py as users run it: images/s of ``wtconvnext_<size>`` against ``convnext_<size>`` with the same flags.

Usage (a CUDA machine)::

    python benchmarks/bench_train.py [--out results/train.json] [--sizes tiny] [--images 5120] [--batch 128]
        [--workers 16] [--no-compile]

Writes a generated ImageFolder (random JPEGs, 256 px; the point is the pipeline and the step, not accuracy), then for
each model runs ``train.py --amp --amp-dtype bfloat16 --channels-last`` for two epochs, eager and with
``--torchcompile``, and reads train.py's own images/s at the end of the second epoch (its rate counts from the
epoch's start, so the first epoch takes the compilation and the loader's start-up). It also times the data pipeline
alone (timm's training loader over the same folder with the model's data config, no model): when a model's rate is
close to that ceiling, the run is bound by the data pipeline, not by the model, and the table says so. Prints the
table and writes JSON. ``--check`` runs the smallest case once on the CPU (``test_convnext`` vs ``test_wtconvnext``
at 32 px, one worker): it checks the script, it does not time anything.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import report  # noqa: E402

DATA_BOUND = 0.9  # a model rate at this fraction of the pipeline's own rate or above: bound by the data pipeline
_RATE = re.compile(r"Train (\d+) \[(\d+)/(\d+)\].* ([0-9.]+) img/s")


def _write_class(args: tuple[Path, int, int, int, int]) -> None:
    import numpy as np
    from PIL import Image

    root, cls, count, size, seed = args
    rng = np.random.default_rng(seed + cls)
    d = root / f"class{cls:02d}"
    d.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        img = np.clip(cls * 20 + rng.normal(0, 60, (size, size, 3)), 0, 255).astype("uint8")
        Image.fromarray(img).save(d / f"{i:05d}.jpg", quality=90)


def make_folder(root: Path, images: int, classes: int = 10, size: int = 256, workers: int = 8) -> None:
    """An ImageFolder of ``images`` random JPEGs in ``classes`` classes under ``root/train``."""
    per = -(-images // classes)
    jobs = [(root / "train", c, per, size, 0) for c in range(classes)]
    with ProcessPoolExecutor(max(1, min(workers, classes))) as pool:
        list(pool.map(_write_class, jobs))


def last_epoch_rate(log: str) -> float:
    """train.py's images/s at the last log line of the last epoch it logged (nan when it logged none)."""
    rows = [(int(e), float(r)) for e, _, _, r in _RATE.findall(log)]
    if not rows:
        return float("nan")
    last = max(e for e, _ in rows)
    return [r for e, r in rows if e == last][-1]


def pipeline_rate(data: Path, model: str, batch: int, workers: int, batches: int, device: str) -> float:
    """Images/s of timm's training loader alone (train.py's augmentation defaults, the model's data config)."""
    import timm
    import torch
    from timm.data import create_dataset, create_loader, resolve_data_config

    import wtconvnext  # noqa: F401  (registers the models)

    cfg = resolve_data_config({}, model=timm.create_model(model, pretrained=False))
    ds = create_dataset("", root=str(data), split="train", is_training=True)
    loader = create_loader(ds, input_size=cfg["input_size"], batch_size=batch, is_training=True,
                           interpolation="random", mean=cfg["mean"], std=cfg["std"], num_workers=workers,
                           device=torch.device(device), pin_memory=device == "cuda", persistent_workers=False)
    it = iter(loader)
    next(it)  # the workers' start-up
    start, n = time.perf_counter(), 0
    for _ in range(batches):
        try:
            x, _ = next(it)
        except StopIteration:
            break
        n += x.shape[0]
    if device == "cuda":
        torch.cuda.synchronize()
    return n / max(time.perf_counter() - start, 1e-9)


def run_train(data: Path, out: Path, model: str, batch: int, workers: int, compile_: bool, device: str,
              img_size: int | None, log: Path) -> float:
    """One train.py run of two epochs; returns its images/s at the end of the second."""
    cmd = [sys.executable, str(REPO / "train.py"), "--data-dir", str(data), "--model", model, "-b", str(batch),
           "--epochs", "2", "--warmup-epochs", "0", "--val-split", "", "--num-classes", "10", "--workers",
           str(workers), "--log-interval", "5", "--no-progress", "--no-plot", "--output", str(out), "--experiment",
           f"{model}-{'compiled' if compile_ else 'eager'}", "--channels-last", "--device", device, "--seed", "0"]
    if device == "cuda":
        cmd += ["--amp", "--amp-dtype", "bfloat16"]
    if img_size:
        cmd += ["--img-size", str(img_size)]
    if compile_:
        cmd += ["--torchcompile"] + (["aot_eager"] if device == "cpu" else [])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        sys.stderr.write((proc.stdout + proc.stderr)[-3000:])
        raise SystemExit(f"bench_train: train.py --model {model} failed with exit code {proc.returncode}")
    return last_epoch_rate(proc.stdout + proc.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/train.json")
    ap.add_argument("--sizes", nargs="+", default=["tiny"], choices=["tiny", "small", "base"])
    ap.add_argument("--images", type=int, default=5120, help="images per epoch (40 updates at B=128)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--no-compile", action="store_true", help="eager runs only")
    ap.add_argument("--data-dir", default=None, help="reuse this generated folder (written when missing)")
    ap.add_argument("--check", action="store_true", help="the smallest case once, on the CPU (checks the script)")
    args = ap.parse_args(argv)
    device, img_size = "cuda", None
    pairs = [(f"convnext_{s}", f"wtconvnext_{s}") for s in args.sizes]
    if args.check:
        device, img_size, pairs = "cpu", 32, [("test_convnext", "test_wtconvnext")]
        args.images, args.batch, args.workers = 40, 8, 1
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(args.data_dir) if args.data_dir else Path(tmp) / "data"
        if not (data / "train").is_dir():
            make_folder(data, args.images, size=48 if args.check else 256, workers=args.workers)
        rows = []
        for base, wt in pairs:
            ceiling = pipeline_rate(data, base, args.batch, args.workers, 2 if args.check else 30, device)
            for compile_ in (False,) if args.no_compile or args.check else (False, True):
                rates = {m: run_train(data, Path(tmp) / "runs", m, args.batch, args.workers, compile_, device,
                                      img_size, Path(tmp) / f"{m}-{compile_}.log") for m in (base, wt)}
                for m in (base, wt):
                    rows.append(dict(model=m, compile=compile_, img_s=rates[m], pipeline_img_s=ceiling,
                                     vs_convnext=rates[m] / rates[base], batch=args.batch, workers=args.workers,
                                     data_bound=rates[m] >= DATA_BOUND * ceiling, device=device))
    hdr = f"{'model':18} {'mode':9} {'img/s':>8} {'vs ConvNeXt':>12} {'pipeline img/s':>15}  bound"
    lines = [f"{r['model']:18} {'compiled' if r['compile'] else 'eager':9} {r['img_s']:8.1f} {r['vs_convnext']:12.2f} "
             f"{r['pipeline_img_s']:15.1f}  {'data pipeline' if r['data_bound'] else 'model'}" for r in rows]
    env: dict = {"device": device}
    if device == "cuda":
        from benchmarks.common import gpu_env

        env = gpu_env()
    report(args.out, env, hdr, lines, rows, note="train.py --amp --amp-dtype bfloat16 --channels-last "
           "[--torchcompile], images/s at the end of epoch 2; pipeline: timm's training loader alone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
