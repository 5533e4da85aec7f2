"""One process vs N processes (torchrun, DDP) at the same global batch: same losses, and the throughput scaling.

    python scripts/ddp_check.py --nproc 2 --out results/ddp            # on a machine with >= 2 GPUs (NCCL)
    python scripts/ddp_check.py --device cpu --model test_wtconvnext --img-size 32 --images 64 --global-batch 16

Writes a generated ImageFolder (random images; the point is equal arithmetic, not accuracy), runs train.py once
with the whole global batch and once under torchrun with global_batch / N per process, then prints per-epoch train
and eval losses of both, their relative difference, and images/s of each run (train.py's last reported rate), and
writes everything as JSON.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _make_folder(root: Path, images: int, classes: int, size: int) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", images), ("val", max(images // 4, classes))):
        for i in range(n):
            d = root / split / f"class{i % classes:02d}"
            d.mkdir(parents=True, exist_ok=True)
            # A class-dependent mean so the loss moves; noise so every image differs.
            base = (i % classes) * (200 // classes)
            img = np.clip(base + rng.normal(0, 40, (size, size, 3)), 0, 255).astype("uint8")
            Image.fromarray(img).save(d / f"{i:05d}.png")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], log: Path) -> float:
    start = time.time()
    with log.open("w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
    if proc.returncode:
        sys.stderr.write(log.read_text()[-4000:])
        raise SystemExit(f"ddp_check: {' '.join(cmd[:6])}... failed with exit code {proc.returncode}")
    return time.time() - start


def _summary(run_dir: Path) -> list[dict[str, float]]:
    with (run_dir / "summary.csv").open() as f:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]


def _last_rate(log: Path) -> float:
    rates = re.findall(r"([0-9.]+) img/s", log.read_text())
    return float(rates[-1]) if rates else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--model", default="wtconvnext_tiny")
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu (gloo)")
    ap.add_argument("--amp", action="store_true", help="bf16 autocast")
    ap.add_argument("--out", default="results/ddp")
    args = ap.parse_args(argv)
    if args.global_batch % args.nproc:
        raise SystemExit("ddp_check: --global-batch must be divisible by --nproc")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        _make_folder(data, args.images, args.classes, args.img_size)
        common = ["--data-dir", str(data), "--model", args.model, "--img-size", str(args.img_size),
                  "--num-classes", str(args.classes), "--epochs", str(args.epochs), "--warmup-epochs", "0",
                  "--lr", "1e-3", "--drop-path", "0", "--mixup", "0", "--cutmix", "0", "--seed", "0",
                  "--workers", str(args.workers), "--no-progress", "--output", str(out), "--log-interval", "5",
                  "--val-split", "val"]
        if args.device:
            common += ["--device", args.device]
        if args.amp:
            common += ["--amp", "--amp-dtype", "bfloat16"]
        one_log, n_log = out / "one.log", out / f"n{args.nproc}.log"
        t1 = _run([sys.executable, str(REPO / "train.py"), *common, "-b", str(args.global_batch),
                   "--experiment", "one"], one_log)
        tn = _run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.nproc}",
                   "--master-addr=127.0.0.1", f"--master-port={_free_port()}", str(REPO / "train.py"), *common,
                   "-b", str(args.global_batch // args.nproc), "--experiment", f"n{args.nproc}"], n_log)
    one, many = _summary(out / "one"), _summary(out / f"n{args.nproc}")
    rows = []
    print(f"{'epoch':>5} {'train_loss 1p':>14} {f'train_loss {args.nproc}p':>14} {'rel diff':>9} "
          f"{'eval_loss 1p':>13} {f'eval_loss {args.nproc}p':>13}")
    for a, b in zip(one, many):
        rel = abs(a["train_loss"] - b["train_loss"]) / max(abs(a["train_loss"]), 1e-12)
        rows.append(dict(epoch=a["epoch"], train_loss_1=a["train_loss"], train_loss_n=b["train_loss"], rel=rel,
                         eval_loss_1=a.get("eval_loss"), eval_loss_n=b.get("eval_loss")))
        print(f"{int(a['epoch']):5d} {a['train_loss']:14.6f} {b['train_loss']:14.6f} {rel:9.2e} "
              f"{a.get('eval_loss', float('nan')):13.6f} {b.get('eval_loss', float('nan')):13.6f}")
    r1, rn = _last_rate(one_log), _last_rate(n_log)
    print(f"img/s: 1 process {r1:.1f}, {args.nproc} processes {rn:.1f} (x{rn / r1:.2f}); wall {t1:.0f} s vs {tn:.0f} s")
    result = dict(args=vars(args), epochs=rows, img_s_1=r1, img_s_n=rn, scaling=rn / r1, wall_1=t1, wall_n=tn,
                  env={k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE",)})
    (out / "ddp.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
