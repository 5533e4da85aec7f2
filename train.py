#!/usr/bin/env python3
"""Train WTConvNeXt (or any timm model) with timm's data, optimizer, scheduler and EMA utilities.

    python train.py                                                        # embedded digits, minutes on a CPU
    python train.py -c configs/wtconvnext_tiny_in1k.yaml --data-dir /imagenet
    torchrun --nproc-per-node=8 train.py -c configs/wtconvnext_tiny_in1k.yaml --data-dir /imagenet
    python train.py -c <same config> --resume output/train/<run>/last.pth.tar   # continue exactly where it stopped

With no ``--config`` and no ``--data-dir`` / ``--dataset``, ``configs/digits.yaml`` is used: a small WTConvNeXt on
scikit-learn's handwritten digits, written once as an ImageFolder under ``$WTCONVNEXT_DATA`` (default ``./data``).
Command-line flags override the config's values; flag names and meanings follow timm's train.py.

Outputs, in ``<output>/<experiment>/``: ``last.pth.tar`` (latest state, rewritten at the end of every epoch and every
``--checkpoint-interval`` updates), ``checkpoint-<epoch>.pth.tar`` (the last ``--checkpoint-hist`` epochs),
``model_best.pth.tar``, ``summary.csv`` (one row per epoch), ``summary.png`` (loss and accuracy curves) and
``args.yaml``. Every file is written to a temporary name and renamed, so a kill never leaves a torn file.

Exact resumption: the data order of an epoch is a function of ``(seed, epoch)``, each sample's augmentation of
``(seed, epoch, position)`` (see ``wtconvnext.data``), and the RNGs of every optimizer update (drop path, mixup) are
seeded from ``(seed, epoch, update, rank)``. A checkpoint therefore only needs the position within the epoch: a run
killed mid-epoch and resumed from ``last.pth.tar`` ends with the weights an uninterrupted run ends with (bitwise on
CPU; on GPU up to the nondeterminism of the kernels themselves).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import shutil
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from timm.data import Mixup, create_transform, resolve_data_config
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.models import model_parameters
from timm.optim import create_optimizer_v2
from timm.scheduler import PlateauLRScheduler, create_scheduler_v2
from timm.utils import NativeScaler, dispatch_clip_grad, init_distributed_device, update_summary

try:  # ModelEmaV3 (timm >= 1.0) takes the update count for decay warmup; V2 is the fallback for older timm
    from timm.utils import ModelEmaV3 as ModelEma
except ImportError:  # pragma: no cover - depends on the installed timm
    from timm.utils import ModelEmaV2 as ModelEma
EMA_TAKES_STEP = ModelEma.__name__ == "ModelEmaV3"

import wtconvnext  # noqa: F401  (registers the wtconvnext_* models with timm)
from validate import (
    USER_ERRORS,
    ModelKwargsAction,
    OneLineArgumentParser,
    ScriptError,
    check_device,
    create_model_checked,
    evaluate,
    exit_on_error,
    infer_num_classes,
    load_model_weights,
    progress_enabled,
)
from wtconvnext.checkpoint import load_checkpoint_file, load_weights, plain_data_config
from wtconvnext.data import (
    ResumableSampler,
    SeededDataset,
    ShardSampler,
    create_dataset_checked,
    mix_seed,
    patch_timm_posterize,
    prepare_digits,
    seed_rngs,
    seed_worker,
)

_logger = logging.getLogger("train")

REPO_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG = REPO_DIR / "configs" / "digits.yaml"
CHECKPOINT_VERSION = 2  # timm's saver layout (state_dict, state_dict_ema, optimizer, epoch, arch, args, ...)
DIGITS = "digits"  # --dataset value of the embedded dataset
EXIT_SIMULATED_KILL = 3  # exit status of --stop-after-updates


# ----------------------------------------------------------------------------------------------------------------------
# Arguments: a YAML config sets the defaults, the command line overrides them (as in timm's train.py).

config_parser = OneLineArgumentParser(prog="train.py", add_help=False)
config_parser.add_argument("-c", "--config", default="", metavar="FILE", help="YAML config whose keys are flag dests")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="train.py", description="WTConvNeXt training", parents=[config_parser],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("Dataset")
    g.add_argument("--data-dir", default=None, help="dataset root (ImageFolder with train/ and val/)")
    g.add_argument("--dataset", default="", help="timm dataset type, '' for folders (e.g. torch/cifar10); "
                   f"'{DIGITS}' for the embedded digits (written under $WTCONVNEXT_DATA, default ./data)")
    g.add_argument("--train-split", default="train", help="training split")
    g.add_argument("--val-split", default="validation", help="validation split ('' to skip evaluation)")
    g.add_argument("--dataset-download", action="store_true", help="allow download for torch/ datasets")
    g.add_argument("--class-map", default="", help="path to a class-to-index mapping file")

    g = p.add_argument_group("Model")
    g.add_argument("--model", default="wtconvnext_tiny", help="timm model name")
    g.add_argument("--pretrained", action="store_true", help="start from pretrained weights")
    g.add_argument("--pretrained-path", default=None, help="file for --pretrained (timm pretrained_cfg_overlay)")
    g.add_argument("--initial-checkpoint", default="", help="load weights (any format, through checkpoint_filter_fn)")
    g.add_argument("--resume", default="", help="resume everything from a train.py checkpoint (or its folder)")
    g.add_argument("--no-resume-opt", action="store_true", help="on --resume, do not restore the optimizer state")
    g.add_argument("--num-classes", type=int, default=None, help="classes (default: from the dataset)")
    g.add_argument("--model-kwargs", nargs="*", default={}, action=ModelKwargsAction,
                   help="extra model kwargs: a JSON object or key=value pairs")
    g.add_argument("--img-size", type=int, default=None, help="image size (default: the model's)")
    g.add_argument("--input-size", type=int, nargs=3, default=None, metavar="N", help="C H W, overrides --img-size")
    g.add_argument("--crop-pct", type=float, default=None, help="evaluation center-crop fraction")
    g.add_argument("--crop-mode", default=None, help="evaluation crop mode")
    g.add_argument("--mean", type=float, nargs="+", default=None, help="normalisation mean")
    g.add_argument("--std", type=float, nargs="+", default=None, help="normalisation std")
    g.add_argument("--interpolation", default="", help="evaluation resize interpolation")
    g.add_argument("-b", "--batch-size", type=int, default=128, help="batch size per process")
    g.add_argument("-vb", "--validation-batch-size", type=int, default=None, help="eval batch size per process")
    g.add_argument("--grad-accum-steps", type=int, default=1, help="micro-batches per optimizer update")
    g.add_argument("--drop", type=float, default=0.0, help="classifier dropout")
    g.add_argument("--drop-path", type=float, default=None, help="stochastic depth rate")
    g.add_argument("--grad-checkpointing", action="store_true", help="recompute activations in backward")
    g.add_argument("--channels-last", action="store_true", help="NHWC memory layout")
    g.add_argument("--torchcompile", nargs="?", const="inductor", default=None, help="torch.compile backend")

    g = p.add_argument_group("Optimizer")
    g.add_argument("--opt", default="adamw", help="timm optimizer name")
    g.add_argument("--opt-eps", type=float, default=None, help="optimizer epsilon")
    g.add_argument("--opt-betas", type=float, nargs="+", default=None, help="optimizer betas")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    g.add_argument("--weight-decay", type=float, default=0.05, help="weight decay (not on norms, biases, scales)")
    g.add_argument("--layer-decay", type=float, default=None, help="layer-wise lr decay (1.0 = none)")
    g.add_argument("--clip-grad", type=float, default=None, help="gradient clipping value")
    g.add_argument("--clip-mode", default="norm", help="norm, value or agc")

    g = p.add_argument_group("Learning rate schedule")
    g.add_argument("--sched", default="cosine", help="timm scheduler name")
    g.add_argument("--sched-on-updates", action=argparse.BooleanOptionalAction, default=True,
                   help="step the schedule on every optimizer update rather than every epoch")
    g.add_argument("--lr", type=float, default=None, help="learning rate (default: from --lr-base)")
    g.add_argument("--lr-base", type=float, default=4e-3, help="lr at --lr-base-size global batch")
    g.add_argument("--lr-base-size", type=int, default=4096, help="global batch of --lr-base")
    g.add_argument("--lr-base-scale", default="", help="'linear' or 'sqrt' (default: sqrt for adaptive opts)")
    g.add_argument("--warmup-lr", type=float, default=1e-6, help="lr at the start of warmup")
    g.add_argument("--min-lr", type=float, default=1e-6, help="lr floor of the schedule")
    g.add_argument("--epochs", type=int, default=300, help="epochs")
    g.add_argument("--warmup-epochs", type=int, default=20, help="linear warmup epochs")
    g.add_argument("--warmup-prefix", action="store_true", help="warmup precedes (does not overlap) the decay")
    g.add_argument("--cooldown-epochs", type=int, default=0, help="epochs at min lr after the schedule")
    g.add_argument("--decay-epochs", type=float, default=90, help="step schedule period")
    g.add_argument("--decay-rate", type=float, default=0.1, help="step / plateau schedule factor")
    g.add_argument("--patience-epochs", type=int, default=10,
                   help="plateau schedule: epochs without improvement of --eval-metric before the lr decays")

    g = p.add_argument_group("Augmentation and regularisation")
    g.add_argument("--no-aug", action="store_true", help="no training augmentation")
    g.add_argument("--scale", type=float, nargs=2, default=[0.08, 1.0], help="random-resized-crop area range")
    g.add_argument("--ratio", type=float, nargs=2, default=[3 / 4, 4 / 3], help="random-resized-crop aspect range")
    g.add_argument("--hflip", type=float, default=0.5, help="horizontal flip probability")
    g.add_argument("--vflip", type=float, default=0.0, help="vertical flip probability")
    g.add_argument("--color-jitter", type=float, default=0.4, help="color jitter (off when --aa is set)")
    g.add_argument("--aa", default=None, help="auto-augment policy, e.g. rand-m9-mstd0.5-inc1")
    g.add_argument("--reprob", type=float, default=0.0, help="random erasing probability")
    g.add_argument("--remode", default="pixel", help="random erasing mode")
    g.add_argument("--recount", type=int, default=1, help="random erasing count")
    g.add_argument("--mixup", type=float, default=0.0, help="mixup alpha (0 = off)")
    g.add_argument("--cutmix", type=float, default=0.0, help="cutmix alpha (0 = off)")
    g.add_argument("--cutmix-minmax", type=float, nargs=2, default=None, help="cutmix box ratio range")
    g.add_argument("--mixup-prob", type=float, default=1.0, help="probability of mixup or cutmix per batch")
    g.add_argument("--mixup-switch-prob", type=float, default=0.5, help="probability of cutmix over mixup")
    g.add_argument("--mixup-mode", default="batch", help="batch, pair or elem")
    g.add_argument("--mixup-off-epoch", type=int, default=0, help="turn mixup off from this epoch (0 = never)")
    g.add_argument("--smoothing", type=float, default=0.1, help="label smoothing")
    g.add_argument("--train-interpolation", default="random", help="training resize interpolation")

    g = p.add_argument_group("Model EMA")
    g.add_argument("--model-ema", action="store_true", help="keep an exponential moving average of the weights")
    g.add_argument("--model-ema-decay", type=float, default=0.9999, help="EMA decay")
    g.add_argument("--model-ema-warmup", action="store_true", help="ramp the EMA decay up (ModelEmaV3)")
    g.add_argument("--model-ema-force-cpu", action="store_true", help="keep the EMA on the CPU (not evaluated)")

    g = p.add_argument_group("Device and precision")
    g.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="device")
    g.add_argument("--dist-backend", default=None, help="torch.distributed backend (default: nccl on CUDA, gloo)")
    g.add_argument("--amp", action="store_true", help="autocast mixed precision")
    g.add_argument("--amp-dtype", default="float16", choices=["float16", "bfloat16"], help="autocast dtype")

    g = p.add_argument_group("Run")
    g.add_argument("--seed", type=int, default=42, help="seed of initialisation, data order and augmentation")
    g.add_argument("-j", "--workers", type=int, default=4, help="data loader workers per process")
    g.add_argument("--pin-mem", action="store_true", help="pin host memory")
    g.add_argument("--output", default="", help="output root (default ./output/train)")
    g.add_argument("--experiment", default="", help="run folder name (default: date-model-size)")
    g.add_argument("--eval-metric", default="top1", help="metric that selects model_best (top1, top5, loss)")
    g.add_argument("--checkpoint-hist", type=int, default=10, help="per-epoch checkpoints kept")
    g.add_argument("--checkpoint-interval", type=int, default=0,
                   help="also save last.pth.tar every N optimizer updates within an epoch (0 = epoch ends only)")
    g.add_argument("--log-interval", type=int, default=50, help="log every N updates")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars (default: only on a terminal outside CI)")
    g.add_argument("--plot", action=argparse.BooleanOptionalAction, default=True, help="write summary.png")
    g.add_argument("--stop-after-updates", type=int, default=0,
                   help="debug: exit abruptly (status 3, no cleanup) after this many updates, as a kill would")
    return p


def parse_args(argv: Optional[list[str]] = None) -> tuple[argparse.Namespace, str]:
    """Parse ``argv``: config file values become defaults, explicit flags win.

    Returns the arguments and the config file used ('' for none). With neither ``--config`` nor a dataset
    (``--data-dir`` / ``--dataset``) the digits config is the default, so plain ``python train.py`` works.

    Raises:
        ScriptError: the config file is missing, unreadable, not a YAML mapping, or has keys no flag has.
    """
    parser = build_parser()
    cfg_args, remaining = config_parser.parse_known_args(argv)
    config = cfg_args.config
    if not config:
        probe = parser.parse_args(remaining)
        if probe.data_dir is None and not probe.dataset:
            config = str(DEFAULT_CONFIG)
    if config:
        try:
            with open(config) as f:
                cfg = yaml.safe_load(f) or {}
        except FileNotFoundError:
            raise ScriptError(f"config file '{config}' does not exist") from None
        except OSError as e:
            raise ScriptError(f"cannot read config file '{config}': {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ScriptError(f"config file '{config}' is not valid YAML: {' '.join(str(e).split())}") from None
        if not isinstance(cfg, dict):
            raise ScriptError(f"config file '{config}' must hold a mapping of flag names to values")
        known = {a.dest for a in parser._actions}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise ScriptError(f"{config}: unknown keys {unknown} (keys are flag names with '_' for '-')")
        parser.set_defaults(**cfg)
    args = parser.parse_args(remaining)
    args.config = config
    return args, config


# ----------------------------------------------------------------------------------------------------------------------
# Checkpoints and run records.

def _atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary sibling, flushed to disk, then renamed over ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _atomic_link(src: Path, dst: Path) -> None:
    """Make ``dst`` hold ``src``'s bytes: a hard link (no copy) if the filesystem allows it, else a copy; either
    way via a temporary name so that ``dst`` is never half-written."""
    tmp = dst.with_name(dst.name + ".tmp")
    if tmp.exists():
        tmp.unlink()
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


class CheckpointManager:
    """Keeps ``last.pth.tar`` (always the newest state), the last ``hist`` ``checkpoint-<epoch>.pth.tar`` and
    ``model_best.pth.tar`` in ``out_dir``. Written only by the primary process."""

    def __init__(self, out_dir: Path, hist: int) -> None:
        self.out_dir = out_dir
        self.hist = hist
        self.last = out_dir / "last.pth.tar"

    def save(self, state: dict[str, Any], epoch_end: bool, is_best: bool) -> None:
        _atomic_torch_save(state, self.last)
        if not epoch_end:
            return
        if self.hist > 0:
            _atomic_link(self.last, self.out_dir / f"checkpoint-{state['epoch']}.pth.tar")
            self._prune()
        if is_best:
            _atomic_link(self.last, self.out_dir / "model_best.pth.tar")

    def _prune(self) -> None:
        def epoch_of(p: Path) -> int:
            try:
                return int(p.name[len("checkpoint-"):-len(".pth.tar")])
            except ValueError:
                return -1

        files = sorted((p for p in self.out_dir.glob("checkpoint-*.pth.tar") if epoch_of(p) >= 0), key=epoch_of)
        for p in files[:-self.hist]:
            p.unlink(missing_ok=True)


def _plain(value: Any) -> Any:
    """Arguments as JSON-able plain values, so checkpoints load with ``torch.load(weights_only=True)``."""
    return json.loads(json.dumps(value, default=str))


def truncate_summary(path: Path, before_epoch: int) -> None:
    """Drop summary rows of epochs >= ``before_epoch``: a run killed after logging an epoch but before its
    checkpoint redoes that epoch, and must not log it twice."""
    if not path.exists():
        return
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames or []
        rows = [r for r in reader if int(r["epoch"]) < before_epoch]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def plot_summary(csv_path: Path, png_path: Path) -> None:
    """Loss and top-1 curves from ``summary.csv``, written as a PNG (matplotlib's Agg backend: no display needed)."""
    try:
        import matplotlib
    except ImportError:
        _logger.warning("matplotlib is not installed: no summary.png")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    epochs = [int(r["epoch"]) for r in rows]

    def column(name: str) -> Optional[list[float]]:
        return [float(r[name]) for r in rows] if name in rows[0] and all(r.get(name) for r in rows) else None

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for name, label in (("train_loss", "train"), ("eval_loss", "eval"), ("eval_ema_loss", "eval EMA")):
        values = column(name)
        if values:
            ax_loss.plot(epochs, values, marker=".", label=label)
    for name, label in (("eval_top1", "top-1"), ("eval_top5", "top-5"), ("eval_ema_top1", "EMA top-1")):
        values = column(name)
        if values:
            ax_acc.plot(epochs, values, marker=".", label=label)
    ax_loss.set(xlabel="epoch", ylabel="loss", title="Loss")
    ax_acc.set(xlabel="epoch", ylabel="accuracy (%)", title="Validation accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    tmp = png_path.with_name(png_path.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    os.replace(tmp, png_path)


# ----------------------------------------------------------------------------------------------------------------------
# Training.

@dataclass
class Run:
    """What the training loop and the checkpointing share."""

    model: nn.Module  # the bare model: its state dict has no DDP / compile prefixes
    train_model: nn.Module  # what the training step calls: compiled and / or DDP-wrapped
    optimizer: torch.optim.Optimizer
    scheduler: Any  # a timm Scheduler
    ema: Optional[nn.Module]
    loader: torch.utils.data.DataLoader
    sampler: ResumableSampler
    loss_fn: nn.Module
    mixup_fn: Optional[Mixup]
    loss_scaler: Optional[NativeScaler]
    device: torch.device
    amp_autocast: Callable[[], Any]
    batches_per_epoch: int
    updates_per_epoch: int
    num_updates: int  # optimizer updates done since the start of training
    best_metric: Optional[float]
    best_epoch: Optional[int]
    saver: Optional["CheckpointManager"]  # primary process only
    progress: bool  # show tqdm bars
    data_config: dict[str, Any]  # the resolved preprocessing (input size, crop, interpolation, mean, std)


def resolve_output_dir(args: argparse.Namespace) -> Path:
    """``<output>/<experiment>``; a resumed run without ``--experiment`` continues in its checkpoint's folder, a
    fresh run never writes into a folder that already holds a run (a numeric suffix is added)."""
    if args.resume and not args.experiment:
        return Path(args.resume).resolve().parent
    root = Path(args.output or "output/train")
    name = args.experiment or "-".join(
        [datetime.now().strftime("%Y%m%d-%H%M%S"), args.model.replace("/", "_"), str(args.img_size or "")]).rstrip("-")
    out = root / name
    if not args.resume and out.exists() and any(out.iterdir()):
        n = 1
        while (root / f"{name}-{n}").exists():
            n += 1
        out = root / f"{name}-{n}"
    return out


def train_one_epoch(
        epoch: int,
        start_update: int,
        run: Run,
        args: argparse.Namespace,
        loss_state: torch.Tensor,
) -> None:
    """Run the optimizer updates ``start_update ..`` of ``epoch``; ``loss_state`` accumulates ``[sum, count]`` of
    micro-batch losses in place (it is carried in mid-epoch checkpoints so the epoch's mean survives a restart)."""
    model, train_model, optimizer = run.model, run.train_model, run.optimizer
    loader, sampler, scheduler, ema = run.loader, run.sampler, run.scheduler, run.ema
    loss_fn, mixup_fn, loss_scaler = run.loss_fn, run.mixup_fn, run.loss_scaler
    device, amp_autocast, accum = run.device, run.amp_autocast, args.grad_accum_steps
    batches, updates = run.batches_per_epoch, run.updates_per_epoch

    if mixup_fn is not None and args.mixup_off_epoch and epoch >= args.mixup_off_epoch:
        mixup_fn.mixup_enabled = False  # targets stay smoothed one-hot, so the soft-target loss still applies
    sampler.set_epoch(epoch, start=start_update * accum * args.batch_size)
    data = iter(loader)
    train_model.train()
    params = model_parameters(model, exclude_head="agc" in args.clip_mode)

    progress = range(start_update, updates)
    if run.progress:
        from tqdm import tqdm

        progress = tqdm(progress, desc=f"Epoch {epoch}", initial=start_update, total=updates, leave=False,
                        dynamic_ncols=True)
    tick, seen = time.perf_counter(), 0
    for update in progress:
        # Everything random in this update (drop path, mixup) depends only on (seed, epoch, update, rank).
        seed_rngs(mix_seed(args.seed, epoch, update, args.rank))
        n_micro = min(accum, batches - update * accum)  # the last update of an epoch may have fewer micro-batches
        for micro in range(n_micro):
            x, y = next(data)
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            if mixup_fn is not None:
                x, y = mixup_fn(x, y)
            if args.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            last = micro == n_micro - 1
            # Only the last micro-batch of an update all-reduces gradients across processes.
            sync = nullcontext() if last or not args.distributed else train_model.no_sync()
            with sync:
                with amp_autocast():
                    loss = loss_fn(train_model(x), y)
                scaled = loss / n_micro
                if loss_scaler is not None:
                    loss_scaler(scaled, optimizer, clip_grad=args.clip_grad, clip_mode=args.clip_mode,
                                parameters=params, need_update=last)
                else:
                    scaled.backward()
                    if last:
                        if args.clip_grad is not None:
                            dispatch_clip_grad(params, value=args.clip_grad, mode=args.clip_mode)
                        optimizer.step()
            loss_state[0] += loss.detach().double()
            loss_state[1] += 1
            seen += x.shape[0]
        optimizer.zero_grad(set_to_none=True)
        run.num_updates += 1
        if ema is not None:
            if EMA_TAKES_STEP:
                ema.update(model, step=run.num_updates)
            else:
                ema.update(model)
        if scheduler is not None and args.sched_on_updates:
            scheduler.step_update(num_updates=run.num_updates)

        done = update + 1
        if args.log_interval and (done % args.log_interval == 0 or done == updates):
            mean_loss = (loss_state[0] / loss_state[1].clamp(min=1)).item()
            rate = seen * args.world_size / max(time.perf_counter() - tick, 1e-9)
            if isinstance(progress, range):
                if args.rank == 0:
                    _logger.info(f"Train {epoch} [{done}/{updates}] loss {mean_loss:.4f} "
                                 f"lr {current_lr(optimizer):.3e} {rate:.1f} img/s")
            else:
                progress.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{current_lr(optimizer):.2e}")
        if args.checkpoint_interval and done % args.checkpoint_interval == 0 and done < updates:
            save_state(run, args, epoch=epoch, next_epoch=epoch, next_update=done, loss_state=loss_state,
                       epoch_end=False, is_best=False)
        if args.stop_after_updates and run.num_updates >= args.stop_after_updates:
            _logger.warning(f"--stop-after-updates {args.stop_after_updates}: exiting abruptly (simulated kill)")
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_SIMULATED_KILL)
    if not isinstance(progress, range):
        progress.close()


def scheduler_state(scheduler: Any) -> dict[str, Any]:
    """The scheduler's complete state as plain values.

    timm's schedulers are functions of the update / epoch count except the plateau scheduler, whose state is the
    history of the metric: its own ``state_dict`` keeps only ``best`` and ``last_epoch`` (not the patience and
    cooldown counters), so a resumed run would decay the lr at other epochs than an uninterrupted one. Here it
    keeps the whole torch ``ReduceLROnPlateau`` state.
    """
    if isinstance(scheduler, PlateauLRScheduler):
        return {"plateau": scheduler.lr_scheduler.state_dict(), "restore_lr": scheduler.restore_lr}
    return scheduler.state_dict()


def load_scheduler_state(scheduler: Any, state: dict[str, Any]) -> None:
    """Restore what :func:`scheduler_state` saved (or a timm ``state_dict`` of an older checkpoint)."""
    if isinstance(scheduler, PlateauLRScheduler) and "plateau" in state:
        scheduler.lr_scheduler.load_state_dict(state["plateau"])
        scheduler.restore_lr = state.get("restore_lr")
    else:
        scheduler.load_state_dict(state)


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    """Mean lr over parameter groups (with layer decay they differ; this is what timm logs)."""
    lrs = [g["lr"] for g in optimizer.param_groups]
    return sum(lrs) / len(lrs)


def save_state(
        run: Run,
        args: argparse.Namespace,
        epoch: int,
        next_epoch: int,
        next_update: int,
        loss_state: Optional[torch.Tensor],
        epoch_end: bool,
        is_best: bool,
        metric: Optional[float] = None,
) -> None:
    """Checkpoint everything a resumed run needs. Collective when distributed (the partial epoch loss is summed
    over ranks); only the primary process writes."""
    loss_sum = [0.0, 0.0]
    if loss_state is not None:
        totals = loss_state.clone()
        if args.distributed:
            dist.all_reduce(totals)
        loss_sum = totals.tolist()
    if args.rank != 0:
        return
    state = {
        "version": CHECKPOINT_VERSION,
        "arch": args.model,
        "epoch": epoch,  # last epoch touched; with next_update == 0 it is complete
        "next_epoch": next_epoch,
        "next_update": next_update,
        "num_updates": run.num_updates,
        "global_batch": args.batch_size * args.world_size * args.grad_accum_steps,
        "state_dict": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "scheduler": scheduler_state(run.scheduler) if run.scheduler is not None else None,
        "args": _plain(vars(args)),
        # What validate.py and wtconvnext-convert read to evaluate at the run's own input size and crop.
        "data_config": run.data_config,
        "metric": metric,
        "best_metric": run.best_metric,
        "best_epoch": run.best_epoch,
        "train_loss_state": loss_sum,
    }
    if run.ema is not None:
        state["state_dict_ema"] = run.ema.module.state_dict()
    if run.loss_scaler is not None:
        state[run.loss_scaler.state_dict_key] = run.loss_scaler.state_dict()
    run.saver.save(state, epoch_end=epoch_end, is_best=is_best)


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    """Run train.py with ``argv``; ordinary mistakes exit with one line on stderr and status 2."""
    try:
        return _main(argv)
    except USER_ERRORS as e:
        exit_on_error("train.py", e)


def _main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    args, config = parse_args(argv)
    check_device(args.device)
    device = init_distributed_device(args)  # sets args.distributed, world_size, rank, local_rank, device
    logging.basicConfig(level=logging.INFO if args.rank == 0 else logging.WARNING,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.distributed:
        _logger.info(f"Distributed: {args.world_size} processes, backend {dist.get_backend()}, device {device}")
    if config:
        _logger.info(f"Config {config}")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    patch_timm_posterize()  # the reference RandAugment policy crashes timm's posterize on Pillow >= 13

    # Data. The embedded digits are written on first use; prepare_digits is safe to race between ranks.
    if args.dataset == DIGITS:
        args.data_dir, args.dataset = str(prepare_digits()), ""
    elif args.data_dir is None and not args.dataset:
        raise ScriptError("no data: pass --data-dir (or --dataset), or run without a config for the digits default")
    dataset_train = create_dataset_checked(args.dataset, root=args.data_dir, split=args.train_split,
                                           is_training=True, class_map=args.class_map,
                                           download=args.dataset_download, batch_size=args.batch_size,
                                           seed=args.seed)
    dataset_eval = None
    if args.val_split:
        dataset_eval = create_dataset_checked(args.dataset, root=args.data_dir, split=args.val_split,
                                              is_training=False, class_map=args.class_map,
                                              download=args.dataset_download, batch_size=args.batch_size)
    if args.num_classes is None:
        args.num_classes = infer_num_classes(dataset_train)
        if args.num_classes is None:
            raise ScriptError("cannot infer the number of classes from the dataset: pass --num-classes")

    # Model: identical initialisation on every rank (DDP also broadcasts rank 0's weights).
    seed_rngs(args.seed)
    create_kwargs: dict[str, Any] = dict(args.model_kwargs, num_classes=args.num_classes, drop_rate=args.drop)
    if args.drop_path is not None:
        create_kwargs["drop_path_rate"] = args.drop_path
    if args.pretrained_path:
        create_kwargs["pretrained_cfg_overlay"] = dict(file=args.pretrained_path)
    model = create_model_checked(args.model, pretrained=args.pretrained, **create_kwargs)
    if args.initial_checkpoint:
        which = load_model_weights(model, args.initial_checkpoint, use_ema=True)
        _logger.info(f"Initial weights ({which}) from {args.initial_checkpoint}")
    if args.grad_checkpointing:
        model.set_grad_checkpointing(True)
    data_config = resolve_data_config(vars(args), model=model, verbose=args.rank == 0)
    args.img_size = args.img_size or data_config["input_size"][-1]
    _logger.info(f"Model {args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
                 f"{args.num_classes} classes, input {tuple(data_config['input_size'])}")
    model.to(device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)

    global_batch = args.batch_size * args.world_size * args.grad_accum_steps
    if args.lr is None:
        scale = args.lr_base_scale or ("sqrt" if any(s in args.opt.lower() for s in ("ada", "lamb")) else "linear")
        ratio = global_batch / args.lr_base_size
        args.lr = args.lr_base * (ratio ** 0.5 if scale == "sqrt" else ratio)
    _logger.info(f"Global batch {global_batch} = {args.batch_size} per process x {args.world_size} processes x "
                 f"{args.grad_accum_steps} accumulation steps; lr {args.lr:.3g}")
    opt_kwargs: dict[str, Any] = {}
    if args.opt_eps is not None:
        opt_kwargs["eps"] = args.opt_eps
    if args.opt_betas is not None:
        opt_kwargs["betas"] = tuple(args.opt_betas)
    optimizer = create_optimizer_v2(model, opt=args.opt, lr=args.lr, weight_decay=args.weight_decay,
                                    momentum=args.momentum, layer_decay=args.layer_decay, **opt_kwargs)

    amp_dtype = torch.bfloat16 if args.amp_dtype == "bfloat16" else torch.float16
    amp_autocast = partial(torch.autocast, device_type=device.type, dtype=amp_dtype) if args.amp else nullcontext
    # Loss scaling only matters for float16; bfloat16 has float32's range.
    loss_scaler = None
    if args.amp and amp_dtype == torch.float16:
        try:
            loss_scaler = NativeScaler(device=device.type)
        except TypeError:  # timm < 1.0.10: CUDA-only scaler without a device argument
            loss_scaler = NativeScaler()

    ema = None
    if args.model_ema:
        ema_kwargs: dict[str, Any] = dict(decay=args.model_ema_decay,
                                          device="cpu" if args.model_ema_force_cpu else None)
        if EMA_TAKES_STEP:
            ema_kwargs["use_warmup"] = args.model_ema_warmup
        ema = ModelEma(model, **ema_kwargs)

    # Loaders. Training batches come from a ResumableSampler through SeededDataset (order and augmentation are
    # functions of seed, epoch and position); timm's create_loader cannot take a custom sampler, so the DataLoader
    # is built here from timm's create_transform. Normalisation and random erasing happen in the transform (no
    # prefetcher), so CPU and GPU runs share one pipeline and every random draw is seeded per sample.
    dataset_train.transform = create_transform(
        data_config["input_size"], is_training=True, no_aug=args.no_aug, scale=args.scale, ratio=args.ratio,
        hflip=args.hflip, vflip=args.vflip, color_jitter=args.color_jitter, auto_augment=args.aa,
        interpolation=args.train_interpolation, mean=data_config["mean"], std=data_config["std"],
        re_prob=args.reprob, re_mode=args.remode, re_count=args.recount)
    sampler = ResumableSampler(len(dataset_train), seed=args.seed, shuffle=True, num_replicas=args.world_size,
                               rank=args.rank)
    loader_kwargs = dict(num_workers=args.workers, pin_memory=args.pin_mem, persistent_workers=args.workers > 0,
                         worker_init_fn=partial(seed_worker, seed=args.seed))
    loader = torch.utils.data.DataLoader(SeededDataset(dataset_train), batch_size=args.batch_size, sampler=sampler,
                                         drop_last=True, **loader_kwargs)
    batches_per_epoch = sampler.per_rank // args.batch_size
    if batches_per_epoch == 0:
        raise ScriptError(f"{sampler.per_rank} training samples per process is less than one batch of "
                         f"{args.batch_size}")
    updates_per_epoch = math.ceil(batches_per_epoch / args.grad_accum_steps)
    eval_loader = None
    if dataset_eval is not None:
        dataset_eval.transform = create_transform(
            data_config["input_size"], is_training=False, interpolation=data_config["interpolation"],
            mean=data_config["mean"], std=data_config["std"], crop_pct=data_config["crop_pct"],
            crop_mode=data_config.get("crop_mode"))
        eval_loader = torch.utils.data.DataLoader(
            dataset_eval, batch_size=args.validation_batch_size or args.batch_size,
            sampler=ShardSampler(len(dataset_eval), args.world_size, args.rank), **loader_kwargs)

    mixup_fn = None
    if args.mixup > 0 or args.cutmix > 0 or args.cutmix_minmax is not None:
        mixup_fn = Mixup(mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, cutmix_minmax=args.cutmix_minmax,
                         prob=args.mixup_prob, switch_prob=args.mixup_switch_prob, mode=args.mixup_mode,
                         label_smoothing=args.smoothing, num_classes=args.num_classes)
        loss_fn: nn.Module = SoftTargetCrossEntropy()  # mixup already folds the smoothing into the targets
    elif args.smoothing:
        loss_fn = LabelSmoothingCrossEntropy(smoothing=args.smoothing)
    else:
        loss_fn = nn.CrossEntropyLoss()

    if args.sched == "plateau" and args.sched_on_updates:
        # The plateau schedule reacts to each epoch's eval metric, so it can only step on epochs.
        _logger.info("--sched plateau steps on epochs (the eval metric's); --sched-on-updates does not apply")
        args.sched_on_updates = False
    scheduler, num_epochs = create_scheduler_v2(
        optimizer, sched=args.sched, num_epochs=args.epochs, decay_epochs=args.decay_epochs,
        decay_rate=args.decay_rate, min_lr=args.min_lr, warmup_lr=args.warmup_lr,
        warmup_epochs=args.warmup_epochs, warmup_prefix=args.warmup_prefix, cooldown_epochs=args.cooldown_epochs,
        patience_epochs=args.patience_epochs, plateau_mode="min" if args.eval_metric == "loss" else "max",
        step_on_epochs=not args.sched_on_updates, updates_per_epoch=updates_per_epoch)

    # Resume: model, optimizer, scheduler, loss scaler, EMA, best metric and the position within the epoch.
    start_epoch, start_update, num_updates = 0, 0, 0
    best_metric, best_epoch = None, None
    resume_loss = [0.0, 0.0]
    if args.resume:
        path = Path(args.resume)
        if path.is_dir():
            path = path / "last.pth.tar"
            args.resume = str(path)
        ckpt, _ = load_checkpoint_file(path)
        if not isinstance(ckpt, dict) or "next_epoch" not in ckpt:
            raise ScriptError(f"'{path}' is not a train.py checkpoint; use --initial-checkpoint to load its weights")
        what = f"{args.model} (resuming {path})"
        load_weights(model, ckpt["state_dict"], what=what)
        if not args.no_resume_opt:
            try:
                optimizer.load_state_dict(ckpt["optimizer"])
                if loss_scaler is not None and ckpt.get(loss_scaler.state_dict_key):
                    loss_scaler.load_state_dict(ckpt[loss_scaler.state_dict_key])
            except (ValueError, KeyError) as e:
                detail = " ".join(str(e).split())
                raise ScriptError(f"cannot restore the optimizer from '{path}' ({detail}): resume with the run's "
                                  "own optimizer flags (its args.yaml), or pass --no-resume-opt") from None
        if ema is not None:
            if ckpt.get("state_dict_ema") is not None:
                load_weights(ema.module, ckpt["state_dict_ema"], what=f"the EMA of {what}")
            else:
                _logger.warning("checkpoint has no EMA weights: EMA restarts from the current weights")
                ema.module.load_state_dict(ckpt["state_dict"])
        if ckpt.get("scheduler") is not None:
            load_scheduler_state(scheduler, ckpt["scheduler"])
        start_epoch, start_update = ckpt["next_epoch"], ckpt["next_update"]
        num_updates = ckpt["num_updates"]
        best_metric, best_epoch = ckpt.get("best_metric"), ckpt.get("best_epoch")
        if start_update and ckpt["global_batch"] != global_batch:
            raise ScriptError(f"{path} stopped mid-epoch with global batch {ckpt['global_batch']}; resume it with "
                             f"the same global batch (now {global_batch}) or from an epoch-end checkpoint")
        if start_update and args.rank == 0:
            resume_loss = list(ckpt.get("train_loss_state", resume_loss))
        if start_epoch >= num_epochs:
            # Nothing left to train: say so (and where the run's results are) rather than logging an empty final.
            best = "" if best_metric is None else f"; best {args.eval_metric} {best_metric:.4f} at epoch {best_epoch}"
            _logger.info(f"Nothing to do: '{path}' is the end of a finished run ({start_epoch} of {num_epochs} "
                         f"epochs done{best}); pass a larger --epochs to train further")
            if args.distributed:
                dist.destroy_process_group()
            return dict(best_metric=best_metric, best_epoch=best_epoch, final={}, finished=True,
                        output=str(Path(path).resolve().parent), seconds=0.0)
        _logger.info(f"Resumed {path}: epoch {start_epoch}, update {start_update}/{updates_per_epoch}")
        del ckpt
    if args.sched_on_updates:
        scheduler.step_update(num_updates=num_updates)
    elif not isinstance(scheduler, PlateauLRScheduler):
        scheduler.step(start_epoch)
    elif 0 < start_epoch <= scheduler.warmup_t:
        # The plateau schedule's lr lives in the optimizer's param groups (restored above) once its warmup is over;
        # stepping it to epoch 0 would even reset it to the warmup lr when there is no warmup.
        scheduler.step(start_epoch)

    # Wrappers: compile the model, then DDP around the compiled module. Evaluation uses the compiled module
    # without DDP: ranks evaluate different numbers of batches, which DDP's per-forward collectives would hang on.
    forward_model: nn.Module = model
    if args.torchcompile:
        forward_model = torch.compile(model, backend=args.torchcompile)
    train_model = forward_model
    if args.distributed:
        train_model = DistributedDataParallel(forward_model, device_ids=[device] if device.type == "cuda" else None)

    out_dir = None
    if args.rank == 0:
        out_dir = resolve_output_dir(args)
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / "args.yaml", "w") as f:
            yaml.safe_dump(_plain(vars(args)), f, sort_keys=False)
        truncate_summary(out_dir / "summary.csv", start_epoch)
        _logger.info(f"Output {out_dir}")
    run = Run(
        model=model, train_model=train_model, optimizer=optimizer, scheduler=scheduler, ema=ema, loader=loader,
        sampler=sampler, loss_fn=loss_fn, mixup_fn=mixup_fn, loss_scaler=loss_scaler, device=device,
        amp_autocast=amp_autocast, batches_per_epoch=batches_per_epoch, updates_per_epoch=updates_per_epoch,
        num_updates=num_updates, best_metric=best_metric, best_epoch=best_epoch,
        saver=CheckpointManager(out_dir, args.checkpoint_hist) if out_dir else None,
        progress=args.rank == 0 and progress_enabled(args.progress) and _has_tqdm(),
        data_config=plain_data_config(data_config),
    )
    decreasing = args.eval_metric == "loss"
    # With an evaluated EMA, the EMA's metric picks the best checkpoint (its weights are the ones released).
    ema_evaluated = ema is not None and not args.model_ema_force_cpu
    key = f"ema_{args.eval_metric}" if ema_evaluated else args.eval_metric
    eval_metrics: dict[str, float] = {}
    start_time = time.perf_counter()
    for epoch in range(start_epoch, num_epochs):
        loss_state = torch.tensor(resume_loss if epoch == start_epoch else [0.0, 0.0], dtype=torch.float64,
                                  device=device)
        train_one_epoch(epoch, start_update if epoch == start_epoch else 0, run, args, loss_state)
        if args.distributed:
            dist.all_reduce(loss_state)
        train_metrics = {"loss": (loss_state[0] / loss_state[1].clamp(min=1)).item()}

        eval_metrics = {}
        if eval_loader is not None:
            for name, net in (("", forward_model), ("ema_", ema.module if ema_evaluated else None)):
                if net is None:
                    continue
                metrics = evaluate(net, eval_loader, device, amp_autocast, args.channels_last,
                                   distributed=args.distributed, progress=run.progress, desc=f"Eval {name}")
                eval_metrics.update({f"{name}{k}": metrics[k] for k in ("loss", "top1", "top5")})
        metric = eval_metrics.get(key)
        is_best = metric is not None and (run.best_metric is None or (
            metric < run.best_metric if decreasing else metric > run.best_metric))
        if is_best:
            run.best_metric, run.best_epoch = metric, epoch
        if not args.sched_on_updates or args.sched == "plateau":
            scheduler.step(epoch + 1, metric)

        save_state(run, args, epoch=epoch, next_epoch=epoch + 1, next_update=0, loss_state=None, epoch_end=True,
                   is_best=is_best, metric=metric)
        if out_dir is not None:
            summary = out_dir / "summary.csv"
            # write_header explicitly: older timm defaults it to False rather than "when the file is new"
            update_summary(epoch, train_metrics, eval_metrics, str(summary), lr=current_lr(optimizer),
                           write_header=not summary.exists() or summary.stat().st_size == 0)
            if args.plot:
                plot_summary(summary, out_dir / "summary.png")
            shown = "  ".join(f"{k} {v:.4f}" for k, v in eval_metrics.items())
            _logger.info(f"Epoch {epoch}: train loss {train_metrics['loss']:.4f}  {shown}  "
                         f"({time.perf_counter() - start_time:.0f}s)")

    result = dict(best_metric=run.best_metric, best_epoch=run.best_epoch, final=eval_metrics,
                  output=str(out_dir) if out_dir else None, seconds=time.perf_counter() - start_time)
    if args.rank == 0 and run.best_metric is not None:
        _logger.info(f"Best {key} {run.best_metric:.4f} (epoch {run.best_epoch}); final: "
                     + "  ".join(f"{k} {v:.4f}" for k, v in eval_metrics.items()))
    if args.distributed:
        dist.barrier()
        dist.destroy_process_group()
    return result


def _has_tqdm() -> bool:
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
