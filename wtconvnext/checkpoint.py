"""Reading checkpoints safely, and what they record about the model and the data they were trained for.

One loader serves the whole package: ``wtconvnext-convert``, ``validate.py --checkpoint``, ``train.py --resume`` /
``--initial-checkpoint`` and :func:`wtconvnext.convert.create_model_from_converted` all read files through
:func:`load_checkpoint_file`, so a missing, truncated, corrupt or unsafe file gets the same one-line
:class:`CheckpointError` everywhere.

Safety: ``.safetensors`` content is read with safetensors; anything else with ``torch.load(weights_only=True)``, with
``argparse.Namespace`` allow-listed (timm's own train.py pickles its arguments as one; the weights-only unpickler
only sets its attributes, and their values are restricted like everything else). No other Python object is ever
unpickled: a file that references one is refused, naming the object.

What a checkpoint records (:func:`recorded_config`):

* a file written by ``wtconvnext-convert``: safetensors metadata ``architecture``, ``model_kwargs``,
  ``num_classes`` and, when its source had one, ``data_config``;
* a checkpoint written by ``train.py``: ``args`` (``model``, ``model_kwargs``, ``num_classes`` and the
  preprocessing flags) and ``data_config`` (the resolved input size, crop, interpolation, mean and std its
  evaluation used);
* a checkpoint written by timm's train.py: ``args`` (an ``argparse.Namespace`` with the same names).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import pickle
import re
import struct
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

import torch
from torch import Tensor, nn

__all__ = [
    "DATA_CONFIG_KEYS",
    "CheckpointError",
    "RecordedConfig",
    "data_config_from_args",
    "describe_nonfinite",
    "format_key_mismatch",
    "key_mismatch",
    "load_checkpoint_file",
    "load_weights",
    "nonfinite_tensors",
    "plain_data_config",
    "recorded_config",
]

# The preprocessing a model was trained and evaluated with, as timm's resolve_data_config returns it.
DATA_CONFIG_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
# Flags of train.py / validate.py (and timm's scripts) that resolve_data_config reads.
_DATA_ARG_KEYS = ("input_size", "img_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
# OSErrors of torch.load that mean the file could not be read, rather than that its content is damaged.
_IO_ERRNOS = (errno.EACCES, errno.EPERM, errno.EIO, errno.ENOENT, errno.EISDIR, errno.ENXIO)
# Constructor kwargs that say how a model ran, not what it is: a record drops them, so that weights trained with,
# say, the Triton backend on a GPU rebuild anywhere (flags can still set them).
RUNTIME_KWARGS = ("wtconv_backend", "drop_rate", "drop_path_rate", "device", "dtype", "pretrained_cfg_overlay")
# Error messages name at most this many keys of each kind (missing / unexpected / mis-shaped).
MAX_NAMED_KEYS = 5


class CheckpointError(Exception):
    """A checkpoint cannot be used: unreadable, truncated, corrupt, unsafe, or not what the caller needs.

    The message is one line, meant to be printed as it is; ``exit_code`` is the status a command line exits with.
    """

    exit_code = 2


# ----------------------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------------------


def _is_safetensors(path: Path) -> bool:
    """Sniff the safetensors format: an 8-byte little-endian header length, then a JSON object."""
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) < 9:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return head[8:9] == b"{" and 0 < n <= path.stat().st_size - 8


def _refused_global(err: Exception) -> Optional[str]:
    """The Python object a weights_only load refused, read off torch's (long, multi-line) message; None if none."""
    m = re.search(r"GLOBAL ([\w.]+)", str(err)) or re.search(r"Unsupported global: ([\w.]+)", str(err))
    return m.group(1) if m else None


def _first_sentence(err: BaseException) -> str:
    return str(err).strip().split("\n")[0].split(". ")[0] or type(err).__name__


def load_checkpoint_file(path: str | os.PathLike) -> tuple[Any, dict[str, str]]:
    """Read a checkpoint without executing any code from it.

    Args:
        path: a safetensors file, or a file written by ``torch.save`` (zip or legacy format). The format is
            sniffed from the content, not the name.

    Returns:
        ``(obj, metadata)``: the loaded object (a dict of tensors for safetensors) and the safetensors metadata
        (empty for torch files).

    Raises:
        CheckpointError: the path cannot be read, or its content is truncated, corrupt or not weights-only.
    """
    path = Path(path)
    try:
        if not path.exists():
            raise CheckpointError(f"cannot read checkpoint '{path}': no such file")
        if path.is_dir():
            raise CheckpointError(f"cannot read checkpoint '{path}': it is a directory")
        is_st = _is_safetensors(path)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint '{path}': {e.strerror or e}") from None
    if is_st:
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                metadata = dict(f.metadata() or {})
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:  # noqa: BLE001  (SafetensorError, OSError, ...: the file is unreadable either way)
            raise CheckpointError(
                f"cannot read '{path}': truncated or corrupt safetensors file ({_first_sentence(e)})"
            ) from None
        return tensors, metadata
    try:
        # The weights_only unpickler warns about pickle protocols it was not written for; the outcome is what
        # matters and is reported below, so keep stderr to the one error line.
        with warnings.catch_warnings(), torch.serialization.safe_globals([argparse.Namespace]):
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        obj_name = _refused_global(e)
        if obj_name:
            raise CheckpointError(
                f"refusing to load '{path}': it references the Python object '{obj_name}', and only tensors and "
                "plain containers are loaded (torch.load weights_only=True); re-save the state dict alone"
            ) from None
        raise CheckpointError(
            f"cannot read '{path}': not a valid checkpoint (corrupt, or neither a torch nor a safetensors file)"
        ) from None
    except OSError as e:
        if e.errno in _IO_ERRNOS:  # the file could be opened a moment ago: access or device trouble
            raise CheckpointError(f"cannot read checkpoint '{path}': {e.strerror or e}") from None
        # zipfile's errors carry no errno; a truncated zip makes torch's reader seek past the end (EINVAL)
        raise CheckpointError(f"cannot read '{path}': truncated or corrupt checkpoint "
                              f"({e.strerror or _first_sentence(e)})") from None
    except Exception as e:  # noqa: BLE001
        # Whatever a loader raises on a damaged file (EOFError, RuntimeError from the zip reader, ...), the file is
        # unreadable; say so in one line.
        raise CheckpointError(f"cannot read '{path}': truncated or corrupt checkpoint ({_first_sentence(e)})") from None
    return obj, {}


# ----------------------------------------------------------------------------------------------------------------
# What a checkpoint records
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class RecordedConfig:
    """The model and preprocessing a checkpoint says it belongs to.

    Attributes:
        model: timm model name (None when the checkpoint does not name one).
        model_kwargs: constructor kwargs beyond the name (not ``num_classes``, nor :data:`RUNTIME_KWARGS`).
        num_classes: classifier size, when recorded.
        data_config: the arguments for timm's ``resolve_data_config`` that the source had set (any of
            ``input_size``, ``img_size``, ``crop_pct``, ``crop_mode``, ``interpolation``, ``mean``, ``std``);
            empty when the checkpoint records none.
        source: where this came from, for messages (``'converted-file metadata'``, ``'train.py checkpoint'``...).
    """

    model: Optional[str] = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    num_classes: Optional[int] = None
    data_config: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def _as_dict(args: Any) -> Optional[dict[str, Any]]:
    if isinstance(args, argparse.Namespace):
        return vars(args)
    return dict(args) if isinstance(args, Mapping) else None


def plain_data_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`DATA_CONFIG_KEYS` of a data config as JSON-able values (tuples as lists), in a fixed order."""
    out = {}
    for key in DATA_CONFIG_KEYS:
        value = config.get(key)
        if value is None or value == "":
            continue
        out[key] = [v for v in value] if isinstance(value, (tuple, list)) else value
    return out


def data_config_from_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """The preprocessing arguments a run's flags set explicitly (None / '' are unset and left to the model)."""
    out = {}
    for key in _DATA_ARG_KEYS:
        value = args.get(key)
        if value is None or value == "" or value == []:
            continue
        out[key] = list(value) if isinstance(value, tuple) else value
    return out


def _architecture_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k not in RUNTIME_KWARGS and k != "num_classes"}


def recorded_config(obj: Any, metadata: Optional[Mapping[str, str]] = None) -> Optional[RecordedConfig]:
    """What a loaded checkpoint records about its model and data (see the module docstring); None if nothing.

    Args:
        obj: what :func:`load_checkpoint_file` returned.
        metadata: the safetensors metadata it returned.

    Raises:
        CheckpointError: the converter's metadata is malformed.
    """
    metadata = metadata or {}
    if metadata.get("format") == "wtconvnext":
        try:
            kwargs = json.loads(metadata.get("model_kwargs") or "{}")
            data = json.loads(metadata.get("data_config") or "{}")
            num_classes = int(metadata["num_classes"]) if "num_classes" in metadata else None
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"malformed wtconvnext metadata: {e}") from None
        return RecordedConfig(metadata.get("architecture"), _architecture_kwargs(kwargs), num_classes, dict(data),
                              "converted-file metadata")
    if not isinstance(obj, Mapping):
        return None
    args = _as_dict(obj.get("args"))
    if args is None:
        return None
    name = args.get("model")
    kwargs = args.get("model_kwargs") or {}
    num_classes = args.get("num_classes")
    data = data_config_from_args(args)
    if isinstance(obj.get("data_config"), Mapping):
        # Written by this repository's train.py: the exact config its evaluation resolved.
        data = plain_data_config(obj["data_config"])
    source = "train.py checkpoint" if "next_epoch" in obj else "training checkpoint arguments"
    return RecordedConfig(
        name if isinstance(name, str) and name else None,
        _architecture_kwargs(kwargs) if isinstance(kwargs, Mapping) else {},
        int(num_classes) if isinstance(num_classes, int) and num_classes > 0 else None,
        data,
        source,
    )


# ----------------------------------------------------------------------------------------------------------------
# Checking weights
# ----------------------------------------------------------------------------------------------------------------


def nonfinite_tensors(state_dict: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """``(key, NaN count, ±Inf count)`` of every floating-point tensor with a non-finite value, in key order."""
    bad = []
    for key, value in state_dict.items():
        if not isinstance(value, Tensor) or not (value.is_floating_point() or value.is_complex()):
            continue
        finite = torch.isfinite(value)
        if bool(finite.all()):
            continue
        nan = int(torch.isnan(value).sum())
        bad.append((key, nan, int((~finite).sum()) - nan))
    return bad


def describe_nonfinite(bad: list[tuple[str, int, int]], what: str = "tensor") -> str:
    """One phrase naming the first non-finite tensor and how many others there are."""
    key, nan, inf = bad[0]
    counts = ", ".join(part for part in (f"{nan} NaN" if nan else "", f"{inf} Inf" if inf else "") if part)
    more = f" (and {len(bad) - 1} more tensor(s))" if len(bad) > 1 else ""
    return f"{what} '{key}' has non-finite values ({counts}){more}"


def key_mismatch(
    shapes: Mapping[str, tuple[int, ...]],
    expected: Mapping[str, tuple[int, ...]],
    may_be_missing: Callable[[str], bool] = lambda _key: False,
) -> tuple[list[str], list[str], list[str]]:
    """``(missing, unexpected, misshaped)`` keys of a checkpoint's ``shapes`` against a model's ``expected``."""
    missing = [k for k in expected if k not in shapes and not may_be_missing(k)]
    unexpected = [k for k in shapes if k not in expected]
    misshaped = [k for k in expected if k in shapes and tuple(shapes[k]) != tuple(expected[k])]
    return missing, unexpected, misshaped


def format_key_mismatch(
    shapes: Mapping[str, tuple[int, ...]],
    expected: Mapping[str, tuple[int, ...]],
    may_be_missing: Callable[[str], bool] = lambda _key: False,
) -> str:
    """The differences :func:`key_mismatch` finds, as one phrase naming up to five keys of each kind."""
    missing, unexpected, misshaped = key_mismatch(shapes, expected, may_be_missing)

    def names(keys: list[str], fmt: Callable[[str], str]) -> str:
        more = f" (+{len(keys) - MAX_NAMED_KEYS} more)" if len(keys) > MAX_NAMED_KEYS else ""
        return ", ".join(fmt(k) for k in keys[:MAX_NAMED_KEYS]) + more

    parts = []
    if missing:
        parts.append(f"{len(missing)} missing key(s): " + names(missing, str))
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key(s): " + names(unexpected, str))
    if misshaped:
        parts.append(f"{len(misshaped)} mis-shaped key(s): "
                     + names(misshaped, lambda k: f"{k} {tuple(shapes[k])} vs model {tuple(expected[k])}"))
    return "; ".join(parts)


def _shapes(tensors: Iterable[tuple[str, Any]]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in tensors if isinstance(v, Tensor)}


def load_weights(model: nn.Module, state_dict: Mapping[str, Tensor], strict: bool = True, what: str = ""):
    """``model.load_state_dict`` whose failure is a one-line :class:`CheckpointError` naming the differing keys.

    Args:
        model: the model.
        state_dict: weights in the model's layout (after any checkpoint filter).
        strict: require the keys to match exactly (shapes must always match).
        what: how to name the model in the message (default: its class).

    Returns:
        What ``load_state_dict`` returned (the missing and unexpected keys of a non-strict load).
    """
    expected = _shapes(model.state_dict().items())
    shapes = _shapes(state_dict.items())
    missing, unexpected, misshaped = key_mismatch(shapes, expected)
    if misshaped or (strict and (missing or unexpected)):
        diff = format_key_mismatch(shapes, expected) if strict else format_key_mismatch(
            {k: shapes[k] for k in misshaped}, {k: expected[k] for k in misshaped})
        raise CheckpointError(f"checkpoint does not fit {what or type(model).__name__}: {diff}")
    try:
        return model.load_state_dict(state_dict, strict=strict)
    except RuntimeError as e:  # anything the shape check above cannot see (e.g. a dtype that cannot be copied)
        raise CheckpointError(f"checkpoint does not load into {what or type(model).__name__}: "
                              f"{' '.join(str(e).split())[:500]}") from None
