#!/usr/bin/env python3
"""Evaluate a WTConvNeXt (or any timm model) checkpoint: top-1, top-5, loss and throughput.

``--checkpoint`` takes a reference-format ``.pth`` (a flat state dict, or a timm-saver dict with ``state_dict`` /
``state_dict_ema``), a converted ``.safetensors`` file, or a checkpoint written by ``train.py``. Every one goes
through :func:`wtconvnext.models.wtconvnext.checkpoint_filter_fn`, which timm's own ``load_checkpoint`` would skip.

Examples::

    python validate.py --model wtconvnext_tiny --checkpoint WTConvNeXt_tiny_5_300e_ema.pth --data-dir /imagenet
    python validate.py --checkpoint output/train/<run>/model_best.pth.tar        # digits val split, args from the run
    python validate.py --model wtconvnext_tiny --checkpoint golden.pth --num-classes 10 --img-size 96 \\
        --model-kwargs '{"depths": [1, 1, 2, 1], "dims": [16, 32, 64, 128]}'

With no ``--data-dir`` the embedded digits val split is used (see ``wtconvnext.data.prepare_digits``).
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import logging
import os
import pickle
import sys
import time
from contextlib import nullcontext
from functools import partial
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import timm
from timm.data import create_dataset, create_loader, resolve_data_config

import wtconvnext  # noqa: F401  (registers the wtconvnext_* models with timm)
from wtconvnext.data import DIGITS_NUM_CLASSES, prepare_digits

_logger = logging.getLogger("validate")


class ModelKwargsAction(argparse.Action):
    """``--model-kwargs`` as one JSON object (``'{"dims": [16, 32, 64, 128]}'``) or timm-style ``key=value`` pairs
    (``depths="(1,1,2,1)" dims=...``, values read with ``ast.literal_eval``, plain strings otherwise)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        kwargs: dict[str, Any] = {}
        for value in values:
            value = value.strip()
            if not value:
                continue
            if value.startswith("{"):
                try:
                    kwargs.update(json.loads(value))
                except json.JSONDecodeError as e:
                    parser.error(f"{option_string}: invalid JSON ({e})")
                continue
            if "=" not in value:
                parser.error(f"{option_string}: expected key=value or a JSON object, got {value!r}")
            key, raw = value.split("=", 1)
            try:
                kwargs[key] = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                kwargs[key] = raw
        setattr(namespace, self.dest, kwargs)


def load_checkpoint_file(path: str | os.PathLike) -> Any:
    """Read a checkpoint without executing arbitrary pickled code.

    ``.safetensors`` files are read with safetensors; everything else with ``torch.load(weights_only=True)``.
    Checkpoints from timm's own train.py pickle an ``argparse.Namespace`` under ``args``, which is allow-listed;
    anything else that needs full unpickling is refused with an explanation rather than loaded unsafely.
    """
    path = str(path)
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path, device="cpu")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as first_error:
        try:
            with torch.serialization.safe_globals([argparse.Namespace]):
                return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise RuntimeError(
                f"{path} holds pickled objects other than tensors and plain containers; refusing to unpickle it. "
                f"Re-save its state dict (torch.save(ckpt['state_dict'], ...)) or convert it to safetensors."
            ) from first_error


def load_model_weights(
        model: nn.Module,
        checkpoint: str | os.PathLike | dict[str, Any],
        use_ema: bool = True,
        strict: bool = True,
) -> str:
    """Load any supported checkpoint into ``model`` through the family's ``checkpoint_filter_fn``.

    Args:
        model: the freshly created model.
        checkpoint: path of a reference ``.pth``, a converted ``.safetensors`` or a ``train.py`` checkpoint, or
            what :func:`load_checkpoint_file` returned for one.
        use_ema: take ``state_dict_ema`` when the checkpoint has one (released weights are EMA weights).
        strict: require every key to match.

    Returns:
        Which weights were loaded (``"ema"`` or ``"model"``), for the log.
    """
    # Imported here so that train.py's other paths keep working while the model module is being replaced.
    from wtconvnext.models.wtconvnext import checkpoint_filter_fn, unwrap_checkpoint

    obj = checkpoint if isinstance(checkpoint, dict) else load_checkpoint_file(checkpoint)
    which = "ema" if use_ema and isinstance(obj, dict) and obj.get("state_dict_ema") else "model"
    state_dict = unwrap_checkpoint(obj, prefer_ema=use_ema)
    state_dict = checkpoint_filter_fn(state_dict, model)
    incompatible = model.load_state_dict(state_dict, strict=strict)
    if not strict and (incompatible.missing_keys or incompatible.unexpected_keys):
        _logger.warning(f"Non-strict load: {incompatible}")
    return which


@torch.no_grad()
def evaluate(
        model: nn.Module,
        loader: torch.utils.data.DataLoader,
        device: torch.device,
        amp_autocast: Callable[[], Any] = nullcontext,
        channels_last: bool = False,
        distributed: bool = False,
        progress: bool = False,
        desc: str = "Eval",
) -> dict[str, float]:
    """Top-1 / top-5 accuracy (percent) and mean cross-entropy over ``loader``.

    Exact counts are summed (and all-reduced when ``distributed``; give each rank a disjoint shard) rather than
    averaging per-batch percentages, so results do not depend on batch size or number of processes.
    """
    model.eval()
    # loss sum, top-1 hits, top-5 hits, samples; float64 so that counts stay exact far beyond ImageNet's 50k
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    start = time.perf_counter()
    for x, y in _progress(loader, progress, desc):
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with amp_autocast():
            logits = model(x)
        logits = logits.float()
        k = min(5, logits.shape[1])
        hits = logits.topk(k, dim=1).indices.eq(y[:, None])
        sums += torch.stack([
            F.cross_entropy(logits, y, reduction="sum").double(),
            hits[:, 0].sum().double(),
            hits.any(dim=1).sum().double(),
            torch.tensor(float(y.numel()), dtype=torch.float64, device=device),
        ])
    if distributed:
        dist.all_reduce(sums)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    loss_sum, top1, top5, n = sums.tolist()
    n = max(n, 1.0)
    return dict(loss=loss_sum / n, top1=100.0 * top1 / n, top5=100.0 * top5 / n, num_images=int(n),
                images_per_s=n / max(seconds, 1e-9))


def _progress(iterable, enabled: bool, desc: str):
    """Wrap in a tqdm bar when asked for and tqdm is installed; bars are pointless in CI logs."""
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, leave=False, dynamic_ncols=True)


def progress_enabled(flag: Optional[bool] = None) -> bool:
    """Progress bars by default only on an interactive terminal outside CI; ``flag`` forces the choice."""
    if flag is not None:
        return flag
    return sys.stderr.isatty() and not os.environ.get("CI")


def write_results(results: dict[str, Any], path: str) -> None:
    """Write ``results`` as JSON, or as a one-row CSV when ``path`` ends in ``.csv`` (appending rows to an existing
    file with the same columns, so several runs can be collected in one table)."""
    if path.lower().endswith(".csv"):
        exists = os.path.exists(path) and os.path.getsize(path) > 0
        with open(path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(results))
            if not exists:
                writer.writeheader()
            writer.writerow(results)
    else:
        with open(path, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")


def build_parser() -> argparse.ArgumentParser:
    """Flags keep the names and meanings of timm's validate.py."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data-dir", default=None, help="dataset root (ImageFolder with a val/ folder); "
                   "default: the embedded digits")
    p.add_argument("--dataset", default="", help="timm dataset type, '' for folders (e.g. torch/cifar10), "
                   "'digits' for the embedded digits")
    p.add_argument("--split", default="validation", help="split to evaluate (timm also finds 'val')")
    p.add_argument("--dataset-download", action="store_true", help="allow download for torch/ datasets")
    p.add_argument("--class-map", default="", help="path to a class-to-index mapping file")
    p.add_argument("--model", default=None, help="model name; default: the one recorded in a train.py checkpoint")
    p.add_argument("--checkpoint", default="", help="reference .pth, converted .safetensors or train.py checkpoint")
    p.add_argument("--pretrained", action="store_true", help="use timm's pretrained weights for --model")
    p.add_argument("--use-ema", action=argparse.BooleanOptionalAction, default=True,
                   help="take state_dict_ema when the checkpoint has one")
    p.add_argument("--num-classes", type=int, default=None, help="classifier size (default: model's or checkpoint's)")
    p.add_argument("--model-kwargs", nargs="*", default={}, action=ModelKwargsAction,
                   help="extra model constructor kwargs: a JSON object or key=value pairs")
    p.add_argument("--img-size", type=int, default=None, help="input image size")
    p.add_argument("--input-size", type=int, nargs=3, default=None, metavar="N", help="C H W (overrides --img-size)")
    p.add_argument("--crop-pct", type=float, default=None, help="center-crop fraction")
    p.add_argument("--crop-mode", default=None, help="center, squash or border")
    p.add_argument("--mean", type=float, nargs="+", default=None, help="normalisation mean")
    p.add_argument("--std", type=float, nargs="+", default=None, help="normalisation std")
    p.add_argument("--interpolation", default="", help="resize interpolation (bilinear, bicubic, ...)")
    p.add_argument("-b", "--batch-size", type=int, default=256, help="batch size")
    p.add_argument("-j", "--workers", type=int, default=2, help="data loader workers")
    p.add_argument("--pin-mem", action="store_true", help="pin host memory for faster transfer to the GPU")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="device")
    p.add_argument("--amp", action="store_true", help="autocast mixed precision")
    p.add_argument("--amp-dtype", default="float16", choices=["float16", "bfloat16"], help="autocast dtype")
    p.add_argument("--channels-last", action="store_true", help="NHWC memory layout")
    p.add_argument("--torchcompile", nargs="?", const="inductor", default=None, help="torch.compile backend")
    p.add_argument("--results-file", default="", help="write results here (.json or .csv)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: only on a terminal outside CI)")
    return p


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = build_parser().parse_args(argv)
    device = torch.device(args.device)

    # A train.py checkpoint records how its model was built: use that for anything not given on the command line.
    ckpt = load_checkpoint_file(args.checkpoint) if args.checkpoint else None
    run_args: dict[str, Any] = {}
    if isinstance(ckpt, dict) and isinstance(ckpt.get("args"), dict):
        run_args = ckpt["args"]
    model_name = args.model or run_args.get("model")
    if not model_name:
        raise SystemExit("--model is required (the checkpoint does not record one)")
    same_model = bool(run_args) and model_name == run_args.get("model")
    num_classes = args.num_classes or (run_args.get("num_classes") if same_model else None)
    model_kwargs = dict(run_args.get("model_kwargs") or {}) if same_model else {}
    model_kwargs.update(args.model_kwargs)
    if same_model:
        # Evaluate with the run's preprocessing (e.g. the digits config's 32px, crop_pct 1.0) unless overridden.
        for key in ("img_size", "input_size", "crop_pct", "crop_mode", "mean", "std", "interpolation"):
            if getattr(args, key) in (None, "") and run_args.get(key) not in (None, ""):
                setattr(args, key, run_args[key])

    if args.dataset == "digits" or (args.data_dir is None and not args.dataset):
        args.data_dir, args.dataset = str(prepare_digits()), ""
        num_classes = num_classes or DIGITS_NUM_CLASSES

    create_kwargs: dict[str, Any] = dict(model_kwargs)
    if num_classes is not None:
        create_kwargs["num_classes"] = num_classes
    model = timm.create_model(model_name, pretrained=args.pretrained, **create_kwargs)
    loaded = ""
    if ckpt is not None:
        loaded = load_model_weights(model, ckpt, use_ema=args.use_ema)
        del ckpt  # the optimizer state of a train.py checkpoint can be large
    param_count = sum(p.numel() for p in model.parameters())
    _logger.info(f"Model {model_name} ({param_count / 1e6:.2f}M params), "
                 f"checkpoint {args.checkpoint or '-'} ({loaded or 'no weights loaded'})")

    data_config = resolve_data_config(vars(args), model=model)
    model = model.to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if args.torchcompile:
        model = torch.compile(model, backend=args.torchcompile)
    amp_dtype = torch.bfloat16 if args.amp_dtype == "bfloat16" else torch.float16
    amp_autocast = partial(torch.autocast, device_type=device.type, dtype=amp_dtype) if args.amp else nullcontext

    dataset = create_dataset(args.dataset, root=args.data_dir, split=args.split, class_map=args.class_map,
                             download=args.dataset_download)
    loader = create_loader(
        dataset,
        input_size=data_config["input_size"],
        batch_size=args.batch_size,
        use_prefetcher=False,  # normalisation in the transform: same pipeline on CPU and GPU
        interpolation=data_config["interpolation"],
        mean=data_config["mean"],
        std=data_config["std"],
        num_workers=args.workers,
        crop_pct=data_config["crop_pct"],
        crop_mode=data_config.get("crop_mode"),
        pin_memory=args.pin_mem,
        device=device,
    )
    metrics = evaluate(model, loader, device, amp_autocast, args.channels_last,
                       progress=progress_enabled(args.progress), desc="Validate")
    results = dict(
        model=model_name,
        checkpoint=args.checkpoint,
        weights=loaded or ("pretrained" if args.pretrained else "random"),
        top1=round(metrics["top1"], 4),
        top5=round(metrics["top5"], 4),
        loss=round(metrics["loss"], 6),
        num_images=metrics["num_images"],
        images_per_s=round(metrics["images_per_s"], 2),
        param_count_m=round(param_count / 1e6, 3),
        img_size=data_config["input_size"][-1],
        crop_pct=data_config["crop_pct"],
        interpolation=data_config["interpolation"],
    )
    print(f"top-1 {results['top1']:.3f}  top-5 {results['top5']:.3f}  loss {results['loss']:.4f}  "
          f"{results['num_images']} images  {results['images_per_s']:.1f} images/s")
    if args.results_file:
        write_results(results, args.results_file)
    return results


if __name__ == "__main__":
    main()
