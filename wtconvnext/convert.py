"""Convert WTConvNeXt checkpoints to this project's layout, with the WTConv scales folded into the weights.

Command line (also ``python -m wtconvnext.convert``)::

    wtconvnext-convert INPUT OUTPUT [--model NAME] [--model-kwargs JSON] [--no-ema]
                       [--verify] [--tolerance 1e-5] [--image-size 64] [--force]

INPUT may be a released reference checkpoint (a flat state dict, e.g. ``WTConvNeXt_tiny_5_300e_ema.pth``), a
timm-style training checkpoint (``state_dict`` / ``state_dict_ema`` / ``model`` / ``model_ema``, with or without
``module.`` / ``_orig_mod.`` prefixes), a checkpoint of the same authors' fused backends (``base_weight``,
``wt_weights.{i}``...) or a checkpoint already in this project's layout; ``.pth`` / ``.pt`` / ``.bin`` files are
read with ``torch.load(weights_only=True)`` (no arbitrary Python object is ever unpickled) and ``.safetensors``
files with safetensors (the format is sniffed from the content, not the name). OUTPUT is a ``.safetensors`` file
in this project's layout (:func:`wtconvnext.layers.wtconv2d.remap_reference_state_dict`).

Folding. A WTConv layer's scales are per channel, so ``scale * (conv(z, w) + b) == conv(z, scale * w) + scale * b``:
the converter writes

    weight'            = base_scale * weight                       (per channel c)
    bias'              = base_scale * bias
    wavelet_weight'[i, c, s] = wavelet_scale[i, c, s] * wavelet_weight[i, c, s]
    base_scale' = wavelet_scale' = 1

computed in float64 and rounded once to the checkpoint's dtype. The scale keys are kept (as ones) rather than
dropped, so a converted file loads strictly into the ordinary model, and **a folded model trained further is an
ordinary WTConvNeXt whose scales are trainable parameters starting at 1** (not frozen, not removed): the function it
computes at step 0 is the source's, only the parametrisation differs. The tradeoff of that choice: the scales'
original values (and hence e.g. a per-level learning-rate effect of the 0.1 wavelet scale init) are not recoverable
from a folded file; keep the source checkpoint if you need them.

The architecture is inferred by matching every key and shape against each registered ``*wtconvnext*`` variant
(instantiated on the meta device, so nothing is allocated). Configurations no registered variant fits need
``--model NAME --model-kwargs JSON``; both are stored in the output's metadata so a loader can rebuild the model
(:func:`create_model_from_converted`).

Output metadata (safetensors string metadata): ``format`` = ``wtconvnext``, ``architecture``, ``model_kwargs``
(JSON), ``num_classes``, ``folded`` = ``true``, ``source_file``, ``source_sha256``, ``source_layout``
(``reference`` / ``fused`` / ``native``), ``source_wrapper`` (``state_dict_ema``, ``model_ema``, ``state_dict``,
``model``, or ``none`` for a flat state dict), ``ema`` (``true`` / ``false`` / ``unknown`` for a flat state dict),
``converter_version``.

Safety. The output is written to a temporary file beside OUTPUT and moved into place atomically (no existing file
is replaced without ``--force``); with ``--verify`` it is moved only after the check passes. Every expected failure
(unreadable / truncated / corrupt input, a pickle with non-tensor objects, a state dict of another architecture,
an existing OUTPUT, a failed verification) is one line on stderr and a non-zero exit (2 for bad input or usage,
1 for a failed verification), and leaves neither OUTPUT nor a temporary file behind.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import pickle
import re
import struct
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

__all__ = [
    "ConversionError",
    "VerificationError",
    "build_parser",
    "convert_checkpoint",
    "create_model_from_converted",
    "describe_state_dict",
    "detect_layout",
    "fold_scales",
    "infer_variant",
    "load_checkpoint_file",
    "main",
    "normalize_state_dict",
    "select_state_dict",
    "verify_checkpoint",
]

FORMAT_NAME = "wtconvnext"
CONVERTER_VERSION = "1"

# Wrapper keys of timm-style training checkpoints, in the order timm's own loader prefers them.
_EMA_WRAPPERS = ("state_dict_ema", "model_ema")
_PLAIN_WRAPPERS = ("state_dict", "model")
# Prefixes DistributedDataParallel / ModelEmaV2 ("module.") and torch.compile ("_orig_mod.") leave on keys.
_PREFIXES = ("module.", "_orig_mod.")
# Scale keys of a WTConv layer in this project's layout; the only keys that may be filled in (with ones).
_SCALE_SUFFIXES = (".base_scale", ".wavelet_scale")
# Error messages name at most this many keys of each kind (missing / unexpected / mis-shaped).
_MAX_NAMED_KEYS = 5


class ConversionError(Exception):
    """An expected failure: bad input, bad arguments or a refused write. ``main`` prints it as one line."""

    exit_code = 2


class VerificationError(ConversionError):
    """``--verify`` found the converted model's logits further from the source's than the tolerance."""

    exit_code = 1


# ----------------------------------------------------------------------------------------------------------------
# Reading checkpoints
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


def load_checkpoint_file(path: str | os.PathLike) -> tuple[Any, dict[str, str]]:
    """Read a checkpoint without executing any code from it.

    Args:
        path: a safetensors file, or a file written by ``torch.save`` (zip or legacy format).

    Returns:
        ``(obj, metadata)``: the loaded object (a dict of tensors for safetensors) and the safetensors metadata
        (empty for torch files).

    Raises:
        ConversionError: the path cannot be read, or its content is truncated, corrupt or not weights-only.
    """
    path = Path(path)
    try:
        if not path.exists():
            raise ConversionError(f"cannot read input '{path}': no such file")
        if path.is_dir():
            raise ConversionError(f"cannot read input '{path}': it is a directory")
        is_st = _is_safetensors(path)
    except OSError as e:
        raise ConversionError(f"cannot read input '{path}': {e.strerror or e}") from None
    if is_st:
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                metadata = dict(f.metadata() or {})
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:  # noqa: BLE001  (SafetensorError, OSError, ...: the file is unreadable either way)
            raise ConversionError(f"cannot read '{path}': truncated or corrupt safetensors file ({e})") from None
        return tensors, metadata
    try:
        # The weights_only unpickler warns about pickle protocols it was not written for; the outcome is what
        # matters and is reported below, so keep stderr to the one error line.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        obj_name = _refused_global(e)
        if obj_name:
            raise ConversionError(
                f"refusing to load '{path}': it references the Python object '{obj_name}', and only tensors and "
                "plain containers are loaded (torch.load weights_only=True); re-save the state dict alone"
            ) from None
        raise ConversionError(
            f"cannot read '{path}': not a valid checkpoint (corrupt, or neither a torch nor a safetensors file)"
        ) from None
    except OSError as e:
        if e.errno is None:  # e.g. zipfile's errors derive from OSError without an errno: a corrupt file
            raise ConversionError(f"cannot read '{path}': truncated or corrupt checkpoint ({e})") from None
        raise ConversionError(f"cannot read input '{path}': {e.strerror or e}") from None
    except Exception as e:  # noqa: BLE001
        # Whatever a loader raises on a damaged file (EOFError, RuntimeError from the zip reader, safetensors'
        # errors when torch.load dispatches on the suffix, ...), the file is unreadable; say so in one line.
        detail = str(e).strip().split("\n")[0].split(". ")[0] or type(e).__name__
        raise ConversionError(f"cannot read '{path}': truncated or corrupt checkpoint ({detail})") from None
    return obj, {}


def select_state_dict(obj: Any, prefer_ema: bool = True) -> tuple[dict[str, Tensor], str]:
    """Pick the weights out of a loaded checkpoint, as timm's loader and ``unwrap_checkpoint`` do.

    A timm-style training checkpoint holds ``state_dict_ema`` / ``model_ema`` (taken first when ``prefer_ema``)
    and ``state_dict`` / ``model``, possibly nested; anything else must itself be a flat state dict. Non-tensor
    entries (e.g. an ``epoch`` counter beside flat weights) are dropped.

    Args:
        obj: what :func:`load_checkpoint_file` returned.
        prefer_ema: take the EMA weights when the checkpoint has them.

    Returns:
        ``(state_dict, wrapper)`` where ``wrapper`` names the key(s) the weights came from (``'state_dict_ema'``,
        ``'model/state_dict'`` for nested wrappers...) or is ``'none'`` for a flat state dict.

    Raises:
        ConversionError: no state dict of tensors is found, or ``prefer_ema=False`` and only EMA weights exist.
    """
    if not isinstance(obj, Mapping):
        raise ConversionError(f"checkpoint holds a {type(obj).__name__}, not a state dict")
    order = (_EMA_WRAPPERS if prefer_ema else ()) + _PLAIN_WRAPPERS
    path: list[str] = []
    sd = obj
    for _ in range(4):  # wrappers nest at most a couple of levels
        key = next((k for k in order if isinstance(sd.get(k), Mapping)), None)
        if key is None:
            if not prefer_ema and any(isinstance(sd.get(k), Mapping) for k in _EMA_WRAPPERS):
                # Falling back to the EMA weights would silently give the user what they asked not to get.
                raise ConversionError("--no-ema was given but the checkpoint holds only EMA weights")
            break
        path.append(key)
        sd = sd[key]
    tensors = {k: v for k, v in sd.items() if isinstance(v, Tensor)}
    if not tensors:
        top = ", ".join(map(str, list(obj)[:8]))
        raise ConversionError(f"checkpoint does not contain a state dict of tensors (top-level keys: {top})")
    return tensors, "/".join(path) or "none"


def _strip_prefixes(key: str) -> str:
    """Remove leading ``module.`` / ``_orig_mod.`` (in any order and number)."""
    changed = True
    while changed:
        changed = False
        for p in _PREFIXES:
            if key.startswith(p):
                key, changed = key[len(p) :], True
    return key


def detect_layout(state_dict: Mapping[str, Tensor]) -> str:
    """Name the WTConv parameter layout of a (prefix-stripped) state dict.

    Returns:
        ``'reference'``, ``'fused'``, ``'native'``, ``'mixed(a,b)'`` or ``'none'`` when no WTConv layer is found.
    """
    found = []
    keys = list(state_dict)
    if any(".base_conv." in k or ".wavelet_convs." in k for k in keys):
        found.append("reference")
    if any(k.endswith(".base_weight") or ".wt_weights." in k for k in keys):
        found.append("fused")
    if any(k.endswith(".wavelet_weight") for k in keys):
        found.append("native")
    if not found:
        return "none"
    return found[0] if len(found) == 1 else f"mixed({','.join(found)})"


def normalize_state_dict(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Strip wrapper prefixes and map every WTConv layer to this project's layout (no model needed).

    Raises:
        ConversionError: the WTConv level tensors are inconsistent (see ``remap_reference_state_dict``).
    """
    from .layers.wtconv2d import remap_reference_state_dict

    stripped: dict[str, Tensor] = {}
    for k, v in state_dict.items():
        stripped[_strip_prefixes(k)] = v
    try:
        return remap_reference_state_dict(stripped)
    except ValueError as e:
        raise ConversionError(f"malformed WTConv parameters: {e}") from None


# ----------------------------------------------------------------------------------------------------------------
# Folding
# ----------------------------------------------------------------------------------------------------------------


def fold_scales(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Fold every WTConv layer's ``base_scale`` and ``wavelet_scale`` into its weights; a pure function.

    For each layer ``p`` (found by its ``p.wavelet_weight`` key, this project's layout)::

        p.weight         <- base_scale[c] * weight[c]          p.bias <- base_scale[c] * bias[c]
        p.wavelet_weight <- wavelet_scale[i, c, s] * wavelet_weight[i, c, s]
        p.base_scale, p.wavelet_scale <- ones

    The products are taken in float64 and rounded once to each tensor's dtype. The input is not modified; keys
    that do not belong to a WTConv layer are passed through (the same tensor objects). Folding a folded state
    dict changes nothing.

    Args:
        state_dict: a state dict in this project's layout (see :func:`normalize_state_dict`).

    Returns:
        A new state dict with the same keys and shapes.

    Raises:
        ValueError: a layer lacks its ``weight`` / ``base_scale`` / ``wavelet_scale`` or their shapes disagree.
    """
    out = dict(state_dict)
    for key in state_dict:
        if key != "wavelet_weight" and not key.endswith(".wavelet_weight"):
            continue  # a layer is found by its level weights ("wavelet_weight" alone: a bare layer's state dict)
        p = key[: -len("wavelet_weight")]
        need = [p + n for n in ("weight", "base_scale", "wavelet_scale")]
        missing = [k for k in need if k not in state_dict]
        if missing:
            raise ValueError(f"WTConv layer '{p[:-1] or '<root>'}' lacks {', '.join(missing)}")
        ww, ws = state_dict[key], state_dict[p + "wavelet_scale"]
        w, bs = state_dict[p + "weight"], state_dict[p + "base_scale"]
        if ws.shape != ww.shape[:3] or bs.shape != (w.shape[0],):
            raise ValueError(
                f"WTConv layer '{p[:-1]}': scale shapes {tuple(bs.shape)} / {tuple(ws.shape)} do not fit "
                f"weights {tuple(w.shape)} / {tuple(ww.shape)}"
            )
        out[p + "weight"] = (w.double() * bs.double().view(-1, 1, 1, 1)).to(w.dtype)
        out[key] = (ww.double() * ws.double()[..., None, None]).to(ww.dtype)
        bias = state_dict.get(p + "bias")
        if bias is not None:
            out[p + "bias"] = (bias.double() * bs.double()).to(bias.dtype)
        out[p + "base_scale"] = torch.ones_like(bs)
        out[p + "wavelet_scale"] = torch.ones_like(ws)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Architecture
# ----------------------------------------------------------------------------------------------------------------

_BLOCK_KEY = re.compile(r"^stages\.(\d+)\.blocks\.(\d+)\.")


def describe_state_dict(state_dict: Mapping[str, Tensor]) -> dict[str, Any]:
    """Read a WTConvNeXt configuration off a state dict in this project's layout (for messages and matching).

    Returns:
        A dict with whichever of ``depths``, ``dims``, ``wt_levels``, ``kernel_size``, ``num_classes``,
        ``in_chans`` can be read.
    """
    desc: dict[str, Any] = {}
    stem = state_dict.get("stem.0.weight")
    if stem is not None and stem.dim() == 4:
        desc["in_chans"] = int(stem.shape[1])
    blocks: dict[int, set[int]] = {}
    for k in state_dict:
        m = _BLOCK_KEY.match(k)
        if m:
            blocks.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    if blocks:
        stages = range(max(blocks) + 1)
        desc["depths"] = [len(blocks.get(i, ())) for i in stages]
        dims, levels, ks = [], [], []
        for i in stages:
            w = state_dict.get(f"stages.{i}.blocks.0.conv_dw.weight")
            ww = state_dict.get(f"stages.{i}.blocks.0.conv_dw.wavelet_weight")
            dims.append(int(w.shape[0]) if w is not None else None)
            levels.append(int(ww.shape[0]) if ww is not None and ww.dim() == 5 else None)
            ks.append(int(w.shape[-1]) if w is not None else None)
        desc["dims"] = dims
        desc["wt_levels"] = levels
        if len(set(ks)) == 1:
            desc["kernel_size"] = ks[0]
    fc = state_dict.get("head.fc.weight")
    desc["num_classes"] = int(fc.shape[0]) if fc is not None else 0
    return desc


def _registered_variants() -> list[str]:
    import timm

    from . import models as _models  # noqa: F401  (registers the wtconvnext_* entry points with timm)

    return sorted(timm.list_models("*wtconvnext*"))


def _meta_model(name: str, kwargs: Mapping[str, Any]) -> nn.Module:
    """The model built on the meta device: shapes only, no memory allocated, no real initialisation."""
    import timm

    with torch.device("meta"):
        return timm.create_model(name, pretrained=False, **kwargs)


@functools.lru_cache(maxsize=32)
def _meta_shapes_cached(name: str, kwargs_json: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    model = _meta_model(name, json.loads(kwargs_json))
    return tuple((k, tuple(v.shape)) for k, v in model.state_dict().items())


def _meta_shapes(name: str, kwargs: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Key -> shape of a model's state dict (cached: matching and filling ask for the same model twice)."""
    return dict(_meta_shapes_cached(name, json.dumps(kwargs, sort_keys=True)))


def _build_kwargs(state_dict: Mapping[str, Tensor], model_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Constructor kwargs the checkpoint itself dictates (classes, input channels), overridden by the user's."""
    desc = describe_state_dict(state_dict)
    kw: dict[str, Any] = {"num_classes": desc["num_classes"]}
    if desc.get("in_chans", 3) != 3:
        kw["in_chans"] = desc["in_chans"]
    kw.update(model_kwargs)
    return kw


def _fillable(key: str, state_dict: Mapping[str, Tensor]) -> bool:
    """A missing scale whose layer's weights are present: a folded checkpoint that dropped it; ones are exact."""
    for suffix, partner in ((".base_scale", ".weight"), (".wavelet_scale", ".wavelet_weight")):
        if key.endswith(suffix) and key[: -len(suffix)] + partner in state_dict:
            return True
    return False


def _diff(state_dict: Mapping[str, Tensor], expected: Mapping[str, tuple[int, ...]]):
    missing = [k for k in expected if k not in state_dict and not _fillable(k, state_dict)]
    unexpected = [k for k in state_dict if k not in expected]
    misshaped = [k for k in expected if k in state_dict and tuple(state_dict[k].shape) != expected[k]]
    return missing, unexpected, misshaped


def _format_diff(state_dict: Mapping[str, Tensor], expected: Mapping[str, tuple[int, ...]]) -> str:
    missing, unexpected, misshaped = _diff(state_dict, expected)
    parts = []

    def names(keys: list[str], fmt: Callable[[str], str]) -> str:
        more = f" (+{len(keys) - _MAX_NAMED_KEYS} more)" if len(keys) > _MAX_NAMED_KEYS else ""
        return ", ".join(fmt(k) for k in keys[:_MAX_NAMED_KEYS]) + more

    if missing:
        parts.append(f"{len(missing)} missing key(s): " + names(missing, str))
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key(s): " + names(unexpected, str))
    if misshaped:
        parts.append(
            f"{len(misshaped)} mis-shaped key(s): "
            + names(misshaped, lambda k: f"{k} {tuple(state_dict[k].shape)} vs model {expected[k]}")
        )
    return "; ".join(parts)


def infer_variant(
    state_dict: Mapping[str, Tensor],
    model_name: Optional[str] = None,
    model_kwargs: Optional[Mapping[str, Any]] = None,
) -> str:
    """Find the registered variant whose every key and shape matches a state dict in this project's layout.

    Args:
        state_dict: normalised state dict (:func:`normalize_state_dict`).
        model_name: check this variant only (with ``model_kwargs``) instead of searching.
        model_kwargs: constructor overrides (e.g. ``depths`` / ``dims``); ``num_classes`` and ``in_chans`` are
            taken from the state dict unless given here.

    Returns:
        The variant name.

    Raises:
        ConversionError: ``model_name`` is unknown or does not fit (the message names the differing keys), or no
            registered variant fits, or several do.
    """
    model_kwargs = dict(model_kwargs or {})
    names = _registered_variants()
    kw = _build_kwargs(state_dict, model_kwargs)
    if model_name is not None:
        if model_name not in names:
            raise ConversionError(f"unknown model '{model_name}'; registered: {', '.join(names)}")
        try:
            expected = _meta_shapes(model_name, kw)
        except Exception as e:  # a bad --model-kwargs value surfaces as any constructor error
            raise ConversionError(f"cannot build {model_name} with kwargs {json.dumps(kw)}: {e}") from None
        if any(_diff(state_dict, expected)):
            raise ConversionError(
                f"checkpoint does not fit {model_name}"
                + (f" with kwargs {json.dumps(model_kwargs)}" if model_kwargs else "")
                + ": "
                + _format_diff(state_dict, expected)
            )
        return model_name
    if not names:
        raise ConversionError("no *wtconvnext* model is registered with timm")
    fits, scores, build_errors = [], [], []
    for name in names:
        try:
            expected = _meta_shapes(name, kw)
        except Exception as e:  # a variant that cannot take these kwargs cannot be the checkpoint's architecture
            build_errors.append(f"{name}: {e}")
            continue
        missing, unexpected, misshaped = _diff(state_dict, expected)
        if not (missing or unexpected or misshaped):
            fits.append(name)
        scores.append((len(missing) + len(unexpected) + len(misshaped), name, expected))
    if len(fits) == 1:
        return fits[0]
    if len(fits) > 1:
        raise ConversionError(f"checkpoint fits several variants ({', '.join(fits)}); choose one with --model")
    if not scores:
        raise ConversionError(f"no registered variant can be built with {json.dumps(kw)}: {build_errors[0]}")
    desc = describe_state_dict(state_dict)
    hint = {k: desc[k] for k in ("depths", "dims") if k in desc}
    msg = (
        "no registered WTConvNeXt variant fits the checkpoint "
        f"(depths {desc.get('depths')}, dims {desc.get('dims')}, wt_levels {desc.get('wt_levels')}, "
        f"kernel_size {desc.get('kernel_size')}, num_classes {desc.get('num_classes')})"
    )
    if scores:
        _, closest, expected = min(scores, key=lambda t: t[0])
        msg += f"; closest is {closest}: {_format_diff(state_dict, expected)}"
    msg += f"; for a custom configuration pass --model NAME --model-kwargs '{json.dumps(hint)}'"
    raise ConversionError(msg)


def _fill_scales(state_dict: dict[str, Tensor], expected: Mapping[str, tuple[int, ...]]) -> list[str]:
    """Add ones for scale keys a folded checkpoint left out; returns the keys added."""
    added = []
    for k, shape in expected.items():
        if k not in state_dict and _fillable(k, state_dict):
            ref = state_dict[k[: k.rfind(".")] + (".weight" if k.endswith(".base_scale") else ".wavelet_weight")]
            state_dict[k] = torch.ones(shape, dtype=ref.dtype)
            added.append(k)
    return added


# ----------------------------------------------------------------------------------------------------------------
# Models built from checkpoints
# ----------------------------------------------------------------------------------------------------------------


def _force_reference_backend(model: nn.Module) -> nn.Module:
    """Run every WTConv layer on the pure-PyTorch reference, whatever the device or environment says."""
    from .layers.wtconv2d import WTConv2d

    layers = [m for m in model.modules() if isinstance(m, WTConv2d)]
    if not layers:
        raise ConversionError(f"{type(model).__name__} has no WTConv2d layer")
    for m in layers:
        m.backend = "reference"
    return model


def create_model_from_converted(path: str | os.PathLike, **kwargs: Any) -> nn.Module:
    """Build the model a converted file describes and load it through timm's pretrained path.

    Reads ``architecture``, ``model_kwargs`` and ``num_classes`` from the file's metadata, then calls
    ``timm.create_model(architecture, pretrained=True, pretrained_cfg_overlay=dict(file=path,
    num_classes=num_classes), num_classes=num_classes, **model_kwargs, **kwargs)``.

    Args:
        path: a file written by :func:`convert_checkpoint`.
        **kwargs: further ``create_model`` arguments (they override the stored ones).
    """
    import timm
    from safetensors import safe_open

    from . import models as _models  # noqa: F401  (registers the entry points)

    with safe_open(str(path), framework="pt", device="cpu") as f:
        meta = dict(f.metadata() or {})
    if meta.get("format") != FORMAT_NAME:
        raise ValueError(f"'{path}' was not written by wtconvnext-convert (metadata format={meta.get('format')!r})")
    build = json.loads(meta.get("model_kwargs", "{}"))
    build["num_classes"] = int(meta["num_classes"])
    build.update(kwargs)
    overlay = dict(file=str(path), num_classes=build["num_classes"])
    return timm.create_model(meta["architecture"], pretrained=True, pretrained_cfg_overlay=overlay, **build)


def verify_checkpoint(
    source_state_dict: Mapping[str, Tensor],
    converted_path: str | os.PathLike,
    model_name: str,
    model_kwargs: Optional[Mapping[str, Any]] = None,
    image_size: int = 64,
    batch_size: int = 2,
    seed: int = 0,
) -> tuple[float, float]:
    """Compare the source checkpoint (unfolded) with a converted file on one random input.

    The source goes through the model's ``checkpoint_filter_fn`` and a strict ``load_state_dict``; the converted
    file goes through timm's pretrained loading (``pretrained_cfg_overlay=dict(file=...)``), the path users take.
    Both models run in eval mode, float32, on CPU, with every WTConv layer on the pure-PyTorch reference.

    Args:
        source_state_dict: the source weights, any supported layout and prefixes.
        converted_path: the ``.safetensors`` file to check.
        model_name: registered variant.
        model_kwargs: constructor kwargs (``num_classes`` / ``in_chans`` default to the checkpoint's).
        image_size: square input size.
        batch_size: input batch.
        seed: seed of the input.

    Returns:
        ``(max_abs_err, max_rel_err)`` of the logits, the relative error being max |a - b| / max |a| over the
        batch (element-wise ratios are meaningless for logits near zero).
    """
    import timm

    from .models.wtconvnext import checkpoint_filter_fn

    kw = _build_kwargs(normalize_state_dict(source_state_dict), model_kwargs or {})
    # The source model is built on the meta device and takes the checkpoint's tensors as its parameters
    # (assign=True): initialising a model only to overwrite every weight costs seconds at full size. A buffer the
    # checkpoint does not hold would stay on meta and fail loudly in forward, never silently.
    src = _meta_model(model_name, kw)
    try:
        src.load_state_dict(checkpoint_filter_fn(dict(source_state_dict), src), strict=True, assign=True)
    except RuntimeError as e:
        raise ConversionError(f"verify: the source does not load into {model_name}: {e}") from None
    overlay = dict(file=str(converted_path), num_classes=kw["num_classes"])
    dst = timm.create_model(model_name, pretrained=True, pretrained_cfg_overlay=overlay, **kw)
    for m in (src, dst):
        _force_reference_backend(m).float().eval()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, kw.get("in_chans", 3), image_size, image_size, generator=g)
    with torch.no_grad():
        a, b = src(x).double(), dst(x).double()
    max_abs = (a - b).abs().max().item()
    return max_abs, max_abs / max(a.abs().max().item(), torch.finfo(torch.float32).tiny)


# ----------------------------------------------------------------------------------------------------------------
# Conversion
# ----------------------------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_output(dst: Path, force: bool) -> None:
    """Refuse a bad OUTPUT before any expensive work."""
    if dst.suffix != ".safetensors":
        # timm picks the reader by this suffix; safetensors bytes under another name would not load.
        raise ConversionError(f"output '{dst}' must end in .safetensors")
    if not dst.parent.is_dir():
        raise ConversionError(f"output directory '{dst.parent}' does not exist")
    if dst.is_dir():
        raise ConversionError(f"output '{dst}' is a directory")
    if dst.exists() and not force:
        raise ConversionError(f"output '{dst}' exists; pass --force to overwrite it")


def _independent(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Contiguous tensors with no shared storage, as safetensors requires (torch.load may return views)."""
    seen: set[int] = set()
    out = {}
    for k, v in state_dict.items():
        v = v.detach()
        ptr = v.untyped_storage().data_ptr()
        if ptr in seen or not v.is_contiguous() or v.storage_offset() or v.untyped_storage().nbytes() != v.nbytes:
            v = v.contiguous().clone()
        seen.add(v.untyped_storage().data_ptr())
        out[k] = v
    return out


@contextlib.contextmanager
def _temp_beside(dst: Path) -> Iterator[Path]:
    """A temporary file in dst's directory (so the final rename is atomic), removed on every exit path."""
    try:
        fd, name = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.stem}.", suffix=".tmp.safetensors")
    except OSError as e:
        raise ConversionError(f"cannot write to '{dst.parent}': {e.strerror or e}") from None
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _publish(tmp: Path, dst: Path, force: bool) -> None:
    """Move the finished file into place atomically; without ``force`` never replace a file that appeared meanwhile."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the output the permissions a plain open() would
    if force:
        os.replace(tmp, dst)
        return
    try:
        os.link(tmp, dst)  # atomic create-if-absent
    except FileExistsError:
        raise ConversionError(f"output '{dst}' exists; pass --force to overwrite it") from None
    except OSError:
        # No hard links on this filesystem: the check-then-rename race is the best we can do.
        if dst.exists():
            raise ConversionError(f"output '{dst}' exists; pass --force to overwrite it") from None
        os.replace(tmp, dst)
        return
    tmp.unlink()


def _ema_flag(wrapper: str) -> str:
    """'true' / 'false' from the wrapper path; 'unknown' for a flat state dict (released files are EMA weights,
    but nothing in a flat file says so)."""
    if wrapper == "none":
        return "unknown"
    return "true" if any(part in _EMA_WRAPPERS for part in wrapper.split("/")) else "false"


def convert_checkpoint(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    model_name: Optional[str] = None,
    model_kwargs: Optional[Mapping[str, Any]] = None,
    prefer_ema: bool = True,
    verify: bool = False,
    tolerance: float = 1e-5,
    image_size: int = 64,
    force: bool = False,
    log: Optional[Callable[[str], None]] = None,
) -> dict[str, str]:
    """Convert a checkpoint to a folded ``.safetensors`` file in this project's layout.

    Args:
        src: input checkpoint (``.pth`` / ``.pt`` / ``.bin`` / ``.safetensors``; any supported layout/wrapper).
        dst: output path, must end in ``.safetensors``.
        model_name: registered variant; inferred from the shapes when None.
        model_kwargs: constructor overrides for configurations no registered variant has (stored in metadata).
        prefer_ema: take ``state_dict_ema`` / ``model_ema`` when present.
        verify: check the converted file against the unfolded source before moving it into place.
        tolerance: largest accepted relative logit error for ``verify``.
        image_size: input size for ``verify``.
        force: replace an existing ``dst``.
        log: receives progress lines (``main`` prints them); silent when None.

    Returns:
        The metadata written to the file.

    Raises:
        ConversionError: bad input or arguments (nothing is written).
        VerificationError: ``verify`` found an error above ``tolerance`` (nothing is written).
    """
    say = log or (lambda _msg: None)
    src, dst = Path(src), Path(dst)
    _check_output(dst, force)
    obj, src_meta = load_checkpoint_file(src)
    raw, wrapper = select_state_dict(obj, prefer_ema=prefer_ema)
    del obj  # an optimizer state can be as large as the weights; do not hold it through the conversion
    layout = detect_layout({_strip_prefixes(k): v for k, v in raw.items()})
    sd = normalize_state_dict(raw)

    # A file this tool wrote knows its own architecture; use it unless the caller says otherwise.
    if model_name is None and model_kwargs is None and src_meta.get("format") == FORMAT_NAME:
        model_name = src_meta.get("architecture")
        model_kwargs = json.loads(src_meta.get("model_kwargs", "{}"))
    model_kwargs = dict(model_kwargs or {})
    if model_kwargs and model_name is None:
        raise ConversionError("--model-kwargs needs --model")
    name = infer_variant(sd, model_name, model_kwargs)
    kw = _build_kwargs(sd, model_kwargs)
    filled = _fill_scales(sd, _meta_shapes(name, kw))
    say(
        f"{src.name}: {layout} layout, weights from "
        + (f"'{wrapper}'" if wrapper != "none" else "a flat state dict")
        + f", architecture {name}"
        + (f" {json.dumps(model_kwargs)}" if model_kwargs else "")
        + (f", {len(filled)} missing scale(s) set to 1" if filled else "")
    )
    try:
        folded = fold_scales(sd)
    except ValueError as e:
        raise ConversionError(f"cannot fold scales: {e}") from None

    stored_kwargs = {k: v for k, v in kw.items() if k != "num_classes"}
    metadata = {
        "format": FORMAT_NAME,
        "architecture": name,
        "model_kwargs": json.dumps(stored_kwargs, sort_keys=True),
        "num_classes": str(kw["num_classes"]),
        "folded": "true",
        "source_file": src.name,
        "source_sha256": _sha256(src),
        "source_layout": layout,
        "source_wrapper": wrapper,
        "ema": _ema_flag(wrapper),
        "converter_version": CONVERTER_VERSION,
    }
    from safetensors.torch import save_file

    with _temp_beside(dst) as tmp:
        try:
            save_file(_independent(folded), str(tmp), metadata=metadata)
        except OSError as e:
            raise ConversionError(f"cannot write '{dst}': {e.strerror or e}") from None
        if verify:
            max_abs, max_rel = verify_checkpoint(raw, tmp, name, stored_kwargs, image_size=image_size)
            say(f"verify: logits max abs err {max_abs:.3e}, max rel err {max_rel:.3e} (tolerance {tolerance:g})")
            if not max_rel <= tolerance:  # also catches NaN
                raise VerificationError(
                    f"verification failed: max rel err {max_rel:.3e} > tolerance {tolerance:g}; nothing written"
                )
        _publish(tmp, dst, force)
    say(f"wrote {dst}")
    return metadata


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------


def _parse_kwargs(text: Optional[str]) -> Optional[dict[str, Any]]:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConversionError(f"--model-kwargs is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ConversionError("--model-kwargs must be a JSON object, e.g. '{\"depths\": [1, 1, 2, 1]}'")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``wtconvnext-convert`` argument parser."""
    p = argparse.ArgumentParser(
        prog="wtconvnext-convert",
        description="Convert a WTConvNeXt checkpoint (reference, fused-backend or timm training layout) to a "
        ".safetensors file in this project's layout, with the WTConv scales folded into the weights.",
    )
    p.add_argument("input", help="checkpoint to convert (.pth / .pt / .bin / .safetensors)")
    p.add_argument("output", help="file to write (.safetensors)")
    p.add_argument("--model", help="registered variant (default: inferred from the tensor shapes)")
    p.add_argument(
        "--model-kwargs",
        metavar="JSON",
        help="constructor overrides for a configuration no registered variant has, e.g. "
        "'{\"depths\": [1, 1, 2, 1], \"dims\": [16, 32, 64, 128]}' (needs --model; stored in the metadata)",
    )
    p.add_argument("--no-ema", action="store_true", help="take 'state_dict' / 'model' even if EMA weights exist")
    p.add_argument("--verify", action="store_true", help="check the result against the unfolded source first")
    p.add_argument("--tolerance", type=float, default=1e-5, help="--verify: max relative logit error (1e-5)")
    p.add_argument("--image-size", type=int, default=64, help="--verify: input size (64)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``wtconvnext-convert``; returns the exit status (0 ok, 1 verification failed, 2 error)."""
    args = build_parser().parse_args(argv)
    try:
        if args.image_size < 1:
            raise ConversionError("--image-size must be positive")
        convert_checkpoint(
            args.input,
            args.output,
            model_name=args.model,
            model_kwargs=_parse_kwargs(args.model_kwargs),
            prefer_ema=not args.no_ema,
            verify=args.verify,
            tolerance=args.tolerance,
            image_size=args.image_size,
            force=args.force,
            log=lambda msg: print(msg, flush=True),
        )
    except ConversionError as e:
        print(f"wtconvnext-convert: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
