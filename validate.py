#!/usr/bin/env python3
"""Evaluate a WTConvNeXt (or any timm model) checkpoint: top-1, top-5, loss and throughput.

``--checkpoint`` takes a reference-format ``.pth`` (a flat state dict, or a timm-saver dict with ``state_dict`` /
``state_dict_ema``), a converted ``.safetensors`` file, or a checkpoint written by ``train.py``. Every one goes
through :func:`wtconvnext.models.wtconvnext.checkpoint_filter_fn`, which timm's own ``load_checkpoint`` would skip,
and is read by the package's one safe loader (:func:`wtconvnext.checkpoint.load_checkpoint_file`).

What the command line does not say comes from the checkpoint: the model name, its kwargs and classes (a train.py
checkpoint's arguments, a converted file's metadata, or, for a reference checkpoint that records nothing, the
WTConvNeXt configuration its tensors show) and the preprocessing it was trained with (input size, crop,
interpolation, mean, std: recorded by train.py and carried over by wtconvnext-convert); else the model's defaults.
The input size and crop used are printed, and where they came from.

Examples::

    python validate.py --checkpoint WTConvNeXt_tiny_5_300e_ema.pth --data-dir /imagenet    # wtconvnext_tiny, 224 px
    python validate.py --checkpoint output/train/<run>/model_best.pth.tar        # digits val split, args from the run
    python validate.py --checkpoint converted.safetensors --data-dir /data         # model and data config from metadata
    python validate.py --model wtconvnext_tiny --checkpoint golden.pth --num-classes 10 --img-size 96 \\
        --model-kwargs '{"depths": [1, 1, 2, 1], "dims": [16, 32, 64, 128]}'

With no ``--data-dir`` the embedded digits val split is used (see ``wtconvnext.data.prepare_digits``). Ordinary
mistakes (a missing data directory or checkpoint, an unknown model, weights that do not fit) are one line on stderr
and exit status 2.
"""

from __future__ import annotations

import argparse
import ast
import csv
import difflib
import json
import logging
import os
import sys
import time
from contextlib import nullcontext
from functools import partial
from typing import Any, Callable, NoReturn, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import timm
from timm.data import create_loader, resolve_data_config

import wtconvnext  # noqa: F401  (registers the wtconvnext_* models with timm)
from wtconvnext.checkpoint import CheckpointError, RecordedConfig, load_checkpoint_file, load_weights, recorded_config
from wtconvnext.data import DIGITS_NUM_CLASSES, DataError, create_dataset_checked, prepare_digits

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


class ScriptError(Exception):
    """An ordinary mistake in the arguments (unknown model, missing file, ...): printed as one line, exit 2."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line naming it (and --help), not the usage block above the message."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def exit_on_error(prog: str, error: BaseException) -> NoReturn:
    """Print ``prog: error: <one line>`` on stderr and exit with status 2 (1 for a failed check)."""
    message = " ".join(str(error).split()) or type(error).__name__
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(getattr(error, "exit_code", 2))


# What the scripts report as one line instead of a traceback.
USER_ERRORS = (ScriptError, CheckpointError, DataError)


def check_device(name: str) -> torch.device:
    """``torch.device(name)``, refusing a device this machine does not have."""
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ScriptError(f"--device {name!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ScriptError(f"--device {name}: no CUDA device is available (use --device cpu)")
    return device


def check_model_name(name: str) -> None:
    """Refuse a model name timm does not know, suggesting close ones."""
    if name.startswith(("hf-hub:", "hf_hub:", "local-dir:", "timm/")) or timm.is_model(name):
        return
    close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
    raise ScriptError(f"unknown model '{name}'" + (f"; did you mean {', '.join(close)}?" if close else ""))


def create_model_checked(name: str, **kwargs: Any) -> nn.Module:
    """``timm.create_model`` with an unknown name or a constructor argument it rejects reported as one line."""
    check_model_name(name)
    try:
        return timm.create_model(name, **kwargs)
    except (TypeError, ValueError) as e:
        shown = {k: v for k, v in kwargs.items() if k not in ("pretrained_cfg_overlay",)}
        raise ScriptError(f"cannot build {name} with {shown}: {' '.join(str(e).split())}") from None


def infer_num_classes(dataset) -> Optional[int]:
    """Class count of an ImageFolder-style timm dataset or a torchvision dataset, None if unknown."""
    reader = getattr(dataset, "reader", None)
    mapping = getattr(reader, "class_to_idx", None) or getattr(dataset, "class_to_idx", None)
    if mapping:
        return len(mapping)
    classes = getattr(dataset, "classes", None)
    return len(classes) if classes else None


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
            the object :func:`wtconvnext.checkpoint.load_checkpoint_file` returned for one.
        use_ema: take ``state_dict_ema`` when the checkpoint has one (released weights are EMA weights).
        strict: require every key to match.

    Returns:
        Which weights were loaded (``"ema"`` or ``"model"``), for the log.

    Raises:
        CheckpointError: the file is unreadable, holds no state dict, or its weights do not fit ``model`` (the
            message names the differing keys).
    """
    # Imported here so that train.py's other paths keep working while the model module is being replaced.
    from wtconvnext.models.wtconvnext import checkpoint_filter_fn, unwrap_checkpoint

    obj = checkpoint if isinstance(checkpoint, dict) else load_checkpoint_file(checkpoint)[0]
    which = "ema" if use_ema and isinstance(obj, dict) and (obj.get("state_dict_ema") or obj.get("model_ema")) \
        else "model"
    try:
        state_dict = unwrap_checkpoint(obj, prefer_ema=use_ema)
    except TypeError as e:
        raise CheckpointError(f"checkpoint holds no state dict: {e}") from None
    if not state_dict:
        raise CheckpointError("checkpoint holds no tensors")
    try:
        state_dict = checkpoint_filter_fn(state_dict, model)
    except ValueError as e:  # inconsistent WTConv tensors in a reference / fused layout
        raise CheckpointError(f"malformed WTConv parameters: {e}") from None
    incompatible = load_weights(model, state_dict, strict=strict,
                                what=getattr(model, "default_cfg", {}).get("architecture", ""))
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
    p = OneLineArgumentParser(prog="validate.py", description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data-dir", default=None, help="dataset root (ImageFolder with a val/ folder); "
                   "default: the embedded digits")
    p.add_argument("--dataset", default="", help="timm dataset type, '' for folders (e.g. torch/cifar10), "
                   "'digits' for the embedded digits")
    p.add_argument("--split", default="validation", help="split to evaluate (timm also finds 'val')")
    p.add_argument("--dataset-download", action="store_true", help="allow download for torch/ datasets")
    p.add_argument("--class-map", default="", help="path to a class-to-index mapping file")
    p.add_argument("--model", default=None, help="model name; default: the one the checkpoint records (train.py "
                   "checkpoint, converted file), else the WTConvNeXt configuration its tensors show")
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


# Preprocessing flags, in resolve_data_config's names; recorded values fill in the ones not given.
_DATA_FLAGS = ("img_size", "input_size", "crop_pct", "crop_mode", "mean", "std", "interpolation")


def resolve_model(args: argparse.Namespace, obj: Any, recorded: Optional[RecordedConfig]
                  ) -> tuple[str, dict[str, Any], Optional[int], str]:
    """``(model name, kwargs, num_classes, where they came from)``: the flags first, then what the checkpoint
    records, then (for a WTConvNeXt checkpoint that records nothing) what its tensors show."""
    if args.model or (recorded is not None and recorded.model):
        name = args.model or recorded.model
        same = recorded is not None and recorded.model == name
        kwargs = dict(recorded.model_kwargs) if same else {}
        kwargs.update(args.model_kwargs)
        num_classes = args.num_classes or (recorded.num_classes if same else None)
        source = "command line" if args.model and not same else recorded.source
        return name, kwargs, num_classes, source
    if obj is None:
        raise ScriptError("--model is required without a --checkpoint that records or shows its model")
    from wtconvnext.convert import _build_kwargs, infer_architecture, normalize_state_dict
    from wtconvnext.models.wtconvnext import unwrap_checkpoint

    try:
        state_dict = normalize_state_dict(unwrap_checkpoint(obj, prefer_ema=args.use_ema))
        name, kwargs, how = infer_architecture(state_dict)
    except (TypeError, CheckpointError) as e:
        raise ScriptError(f"cannot tell the model from the checkpoint ({e}); pass --model") from None
    kwargs = _build_kwargs(state_dict, kwargs)
    num_classes = kwargs.pop("num_classes")
    kwargs.update(args.model_kwargs)
    kind = "a registered variant" if how == "registered variant" else "a custom configuration"
    return name, kwargs, args.num_classes or num_classes, f"checkpoint's tensors: {kind}"


def resolve_eval_data_config(args: argparse.Namespace, model: nn.Module, recorded: Optional[RecordedConfig]
                             ) -> tuple[dict[str, Any], str]:
    """The evaluation data config: flags, else what the checkpoint records, else the model's defaults.

    Returns the config and a phrase saying where its input size and crop came from.
    """
    given = {k: getattr(args, k) for k in _DATA_FLAGS if getattr(args, k) not in (None, "")}
    recorded_data = dict(recorded.data_config) if recorded is not None else {}
    if "img_size" in given or "input_size" in given:  # a size on the command line beats any recorded one
        recorded_data.pop("img_size", None)
        recorded_data.pop("input_size", None)
    merged = {**recorded_data, **given}
    config = resolve_data_config(merged, model=model)
    size_crop = {"input_size", "img_size", "crop_pct"}
    if size_crop & set(given):
        source = "command line"
    elif size_crop & set(recorded_data):
        source = f"the {recorded.source}"
    else:
        source = "the model's defaults"
    return config, source


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    """Run validate.py with ``argv``; ordinary mistakes exit with one line on stderr and status 2."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = build_parser().parse_args(argv)
    try:
        return _main(args)
    except USER_ERRORS as e:
        exit_on_error("validate.py", e)


def _main(args: argparse.Namespace) -> dict[str, Any]:
    device = check_device(args.device)

    # A checkpoint may record how its model was built (a train.py checkpoint, a converted file): anything the
    # command line does not say comes from there.
    obj, recorded = None, None
    if args.checkpoint:
        obj, meta = load_checkpoint_file(args.checkpoint)
        recorded = recorded_config(obj, meta)
    model_name, model_kwargs, num_classes, model_source = resolve_model(args, obj, recorded)

    if args.dataset == "digits" or (args.data_dir is None and not args.dataset):
        args.data_dir, args.dataset = str(prepare_digits()), ""
        num_classes = num_classes or DIGITS_NUM_CLASSES
    # The data first: a wrong --data-dir is reported before any model is built.
    dataset = create_dataset_checked(args.dataset, root=args.data_dir, split=args.split,
                                     class_map=args.class_map, download=args.dataset_download)

    create_kwargs: dict[str, Any] = dict(model_kwargs)
    if num_classes is not None:
        create_kwargs["num_classes"] = num_classes
    model = create_model_checked(model_name, pretrained=args.pretrained, **create_kwargs)
    loaded = ""
    if obj is not None:
        loaded = load_model_weights(model, obj, use_ema=args.use_ema)
        del obj  # the optimizer state of a train.py checkpoint can be large
    dataset_classes = infer_num_classes(dataset)
    model_classes = getattr(model, "num_classes", None)
    if dataset_classes and model_classes and dataset_classes > model_classes:
        raise ScriptError(f"the dataset has {dataset_classes} classes but {model_name} predicts {model_classes}; "
                          "pass --num-classes (and a checkpoint with that many) or another --data-dir / --class-map")
    param_count = sum(p.numel() for p in model.parameters())
    _logger.info(f"Model {model_name} ({param_count / 1e6:.2f}M params, from the {model_source}), "
                 f"checkpoint {args.checkpoint or '-'} ({loaded or 'no weights loaded'})")

    data_config, data_source = resolve_eval_data_config(args, model, recorded)
    mean, std = (tuple(round(v, 4) for v in data_config[k]) for k in ("mean", "std"))
    print(f"Input size {tuple(data_config['input_size'])}, crop_pct {data_config['crop_pct']}"
          f" ({data_config.get('crop_mode') or 'center'}), {data_config['interpolation']} interpolation, "
          f"mean {mean}, std {std} (size and crop from {data_source})", flush=True)
    model = model.to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if args.torchcompile:
        model = torch.compile(model, backend=args.torchcompile)
    amp_dtype = torch.bfloat16 if args.amp_dtype == "bfloat16" else torch.float16
    amp_autocast = partial(torch.autocast, device_type=device.type, dtype=amp_dtype) if args.amp else nullcontext

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
        input_size=list(data_config["input_size"]),
        crop_pct=data_config["crop_pct"],
        crop_mode=data_config.get("crop_mode"),
        interpolation=data_config["interpolation"],
        data_config_source=data_source,
    )
    print(f"top-1 {results['top1']:.3f}  top-5 {results['top5']:.3f}  loss {results['loss']:.4f}  "
          f"{results['num_images']} images  {results['images_per_s']:.1f} images/s")
    if args.results_file:
        write_results(results, args.results_file)
    return results


if __name__ == "__main__":
    main()
