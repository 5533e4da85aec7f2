"""Convert WTConvNeXt checkpoints to this project's layout, with the WTConv scales folded into the weights.

Command line (also ``python -m wtconvnext.convert``)::

    wtconvnext-convert INPUT OUTPUT [--model NAME] [--model-kwargs JSON] [--no-ema] [--allow-nonfinite]
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

The architecture needs no flags (:func:`infer_architecture`): a checkpoint that records its model (a converted file's
metadata; the ``args`` of a ``train.py`` or timm training checkpoint: ``model``, ``model_kwargs``) is built as
recorded; otherwise every key and shape is matched against each registered ``*wtconvnext*`` variant (instantiated on
the meta device, so nothing is allocated), and a configuration no registered variant has is built from what its
tensors show (depths, dims, WTConv levels and kernel sizes per stage, classes, input channels, ...) on top of
:data:`CUSTOM_BASE`'s defaults. ``--model NAME [--model-kwargs JSON]`` overrides all of this. The name and kwargs
are stored in the output's metadata so a loader can rebuild the model (:func:`create_model_from_converted`).

Output metadata (safetensors string metadata): ``format`` = ``wtconvnext``, ``architecture``, ``model_kwargs``
(JSON), ``model_source`` (which rule chose the architecture), ``num_classes``, ``folded`` = ``true``,
``source_file``, ``source_sha256``, ``source_layout`` (``reference`` / ``fused`` / ``native``), ``source_wrapper``
(``state_dict_ema``, ``model_ema``, ``state_dict``, ``model``, or ``none`` for a flat state dict), ``ema``
(``true`` / ``false`` / ``unknown`` for a flat state dict), ``converter_version``, and ``data_config`` (JSON:
``input_size``, ``interpolation``, ``mean``, ``std``, ``crop_pct``, ``crop_mode``) when the source records the
preprocessing its model was trained with (``train.py`` checkpoints do; validate.py then evaluates with it).

Non-finite weights (NaN / Inf in the source, or a folded product past the dtype's range) are an error naming the
tensor, with or without ``--verify``; ``--allow-nonfinite`` converts them as they are.

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
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

from .checkpoint import (
    CheckpointError,
    RecordedConfig,
    describe_nonfinite,
    format_key_mismatch,
    key_mismatch,
    load_checkpoint_file,
    nonfinite_tensors,
    plain_data_config,
    recorded_config,
)

__all__ = [
    "ConversionError",
    "VerificationError",
    "build_parser",
    "convert_checkpoint",
    "create_model_from_converted",
    "describe_state_dict",
    "detect_layout",
    "fold_scales",
    "infer_architecture",
    "infer_model_kwargs",
    "infer_variant",
    "load_checkpoint_file",
    "main",
    "normalize_state_dict",
    "select_state_dict",
    "verify_checkpoint",
]

FORMAT_NAME = "wtconvnext"
CONVERTER_VERSION = "2"

# Wrapper keys of timm-style training checkpoints, in the order timm's own loader prefers them.
_EMA_WRAPPERS = ("state_dict_ema", "model_ema")
_PLAIN_WRAPPERS = ("state_dict", "model")
# Prefixes DistributedDataParallel / ModelEmaV2 ("module.") and torch.compile ("_orig_mod.") leave on keys.
_PREFIXES = ("module.", "_orig_mod.")
# Scale keys of a WTConv layer in this project's layout; the only keys that may be filled in (with ones).
_SCALE_SUFFIXES = (".base_scale", ".wavelet_scale")


class ConversionError(CheckpointError):
    """An expected failure: bad input, bad arguments or a refused write. ``main`` prints it as one line.

    Unreadable input raises the shared loader's :class:`~wtconvnext.checkpoint.CheckpointError`, this class's base.
    """

    exit_code = 2


class VerificationError(ConversionError):
    """``--verify`` found the converted model's logits further from the source's than the tolerance."""

    exit_code = 1


# ----------------------------------------------------------------------------------------------------------------
# Reading checkpoints (the file itself is read by wtconvnext.checkpoint.load_checkpoint_file, shared with the scripts)
# ----------------------------------------------------------------------------------------------------------------


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
# Entry point whose defaults a configuration read off a checkpoint overrides: the reference's own ConvNeXt
# defaults (LayerNorm eps 1e-6, GELU, ...), which every registered variant but the CI model ``test_wtconvnext`` uses.
CUSTOM_BASE = "wtconvnext_tiny"


def describe_state_dict(state_dict: Mapping[str, Tensor]) -> dict[str, Any]:
    """Read a WTConvNeXt configuration off a state dict in this project's layout (for messages and matching).

    Returns:
        A dict with whichever of ``depths``, ``dims``, ``wt_levels``, ``kernel_sizes`` (per stage),
        ``kernel_size`` (when all stages agree), ``num_classes``, ``in_chans`` can be read.
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
        desc["kernel_sizes"] = ks
        if len(set(ks)) == 1:
            desc["kernel_size"] = ks[0]
    fc = state_dict.get("head.fc.weight")
    desc["num_classes"] = int(fc.shape[0]) if fc is not None else 0
    return desc


def infer_model_kwargs(state_dict: Mapping[str, Tensor]) -> dict[str, Any]:
    """The constructor kwargs of a WTConvNeXt read off its state dict (this project's layout), on top of
    :data:`CUSTOM_BASE`'s defaults.

    Always ``depths``, ``dims``, ``wt_levels`` and ``kernel_sizes`` (so that the result, printed as a hint, is
    complete); the other shape-visible choices only where they differ from the defaults: ``patch_size``,
    ``mlp_ratio``, ``conv_bias``, ``head_norm_first``, ``head_hidden_size``, ``norm_layer='rmsnorm'``.
    ``num_classes`` and ``in_chans`` are not included (the converter takes them from the state dict). What the
    tensors cannot show (activation, norm epsilon, drop rates) keeps the defaults. (A model without layer scale
    cannot be built through ``timm.create_model``, which drops ``ls_init_value=None`` like every None kwarg.)
    """
    desc = describe_state_dict(state_dict)
    ks = desc.get("kernel_sizes") or []
    kw: dict[str, Any] = {
        "depths": desc.get("depths"),
        "dims": desc.get("dims"),
        "wt_levels": desc.get("wt_levels"),
        "kernel_sizes": ks[0] if ks and len(set(ks)) == 1 else ks,
    }
    stem = state_dict.get("stem.0.weight")
    if stem is not None and stem.dim() == 4 and stem.shape[-1] != 4:
        kw["patch_size"] = int(stem.shape[-1])
    fc1 = state_dict.get("stages.0.blocks.0.mlp.fc1.weight")
    dims = desc.get("dims") or [None]
    if fc1 is not None and dims[0]:
        ratio = fc1.shape[0] / dims[0]
        if ratio != 4.0:
            kw["mlp_ratio"] = ratio
    if stem is not None and "stem.0.bias" not in state_dict:
        kw["conv_bias"] = False
    if "norm_pre.weight" in state_dict:
        kw["head_norm_first"] = True
    pre = state_dict.get("head.pre_logits.fc.weight")
    if pre is not None:
        kw["head_hidden_size"] = int(pre.shape[0])
    if "stem.1.weight" in state_dict and "stem.1.bias" not in state_dict:
        kw["norm_layer"] = "rmsnorm"
    return kw


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


def _shapes(state_dict: Mapping[str, Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state_dict.items()}


def _diff(state_dict: Mapping[str, Tensor], expected: Mapping[str, tuple[int, ...]]):
    return key_mismatch(_shapes(state_dict), expected, lambda k: _fillable(k, state_dict))


def _format_diff(state_dict: Mapping[str, Tensor], expected: Mapping[str, tuple[int, ...]]) -> str:
    return format_key_mismatch(_shapes(state_dict), expected, lambda k: _fillable(k, state_dict))


def _custom_fit(state_dict: Mapping[str, Tensor], base: str = CUSTOM_BASE) -> tuple[dict[str, Any], str]:
    """The configuration read off the tensors (on ``base``'s defaults), and what it leaves unexplained ('' when it
    fits exactly)."""
    custom = infer_model_kwargs(state_dict)
    try:
        expected = _meta_shapes(base, _build_kwargs(state_dict, custom))
    except Exception as e:  # noqa: BLE001  (an unreadable configuration cannot be built: say why)
        return custom, f"it cannot be built ({e})"
    return custom, _format_diff(state_dict, expected)


def _hint(kwargs: Mapping[str, Any], base: str = CUSTOM_BASE) -> str:
    return f"--model {base} --model-kwargs '{json.dumps(dict(kwargs))}'"


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
        ConversionError: ``model_name`` is unknown or does not fit (the message names the differing keys and, when
            the tensors show one, the configuration that does fit), or no registered variant fits (the message
            gives the complete ``--model`` / ``--model-kwargs`` of the checkpoint's own configuration), or several
            do. :func:`infer_architecture` builds the checkpoint's own configuration instead of failing.
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
            msg = (f"checkpoint does not fit {model_name}"
                   + (f" with kwargs {json.dumps(model_kwargs)}" if model_kwargs else "")
                   + ": " + _format_diff(state_dict, expected))
            # The named entry point with the configuration the tensors show (keeping what they cannot show, e.g.
            # its activation), else the reference defaults with it.
            for base in (model_name, CUSTOM_BASE):
                custom, leftover = _custom_fit(state_dict, base)
                if not leftover:
                    msg += f"; the checkpoint's own configuration is {_hint(custom, base)}"
                    break
            raise ConversionError(msg)
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
    msg = (
        "no registered WTConvNeXt variant fits the checkpoint "
        f"(depths {desc.get('depths')}, dims {desc.get('dims')}, wt_levels {desc.get('wt_levels')}, "
        f"kernel_size {desc.get('kernel_size', desc.get('kernel_sizes'))}, num_classes {desc.get('num_classes')})"
    )
    _, closest, expected = min(scores, key=lambda t: t[0])
    msg += f"; closest is {closest}: {_format_diff(state_dict, expected)}"
    custom, leftover = _custom_fit(state_dict)
    if leftover:
        msg += f"; the configuration read off its tensors, {_hint(custom)}, does not fit either: {leftover}"
    else:
        msg += f"; its configuration is {_hint(custom)}"
    raise ConversionError(msg)


def infer_architecture(
    state_dict: Mapping[str, Tensor],
    model_name: Optional[str] = None,
    model_kwargs: Optional[Mapping[str, Any]] = None,
    recorded: Optional[RecordedConfig] = None,
) -> tuple[str, dict[str, Any], str]:
    """Decide which model a state dict (this project's layout) is, and check that it fits exactly.

    In order: ``model_name`` / ``model_kwargs`` when given; else the model a checkpoint records (a converted
    file's metadata, a training checkpoint's ``args``); else the registered variant whose every key and shape
    matches; else :data:`CUSTOM_BASE` with the configuration read off the tensors (:func:`infer_model_kwargs`).

    Returns:
        ``(name, model_kwargs, source)``; ``source`` says which rule decided: ``'arguments'``, the recorded
        config's source, ``'registered variant'`` or ``'inferred from the tensors'``.

    Raises:
        ConversionError: the chosen model does not fit (naming the keys), or nothing does.
    """
    model_kwargs = dict(model_kwargs or {})
    if model_name is None and model_kwargs:
        raise ConversionError("--model-kwargs needs --model")
    if model_name is not None:
        return infer_variant(state_dict, model_name, model_kwargs), model_kwargs, "arguments"
    if recorded is not None and recorded.model:
        try:
            infer_variant(state_dict, recorded.model, recorded.model_kwargs)
        except ConversionError as e:
            raise ConversionError(f"the {recorded.source} names model {recorded.model} "
                                  f"{json.dumps(recorded.model_kwargs)}, but: {e} (pass --model to override)") from None
        return recorded.model, dict(recorded.model_kwargs), recorded.source
    try:
        return infer_variant(state_dict), {}, "registered variant"
    except ConversionError as e:
        if not str(e).startswith("no registered WTConvNeXt variant fits"):
            raise
        custom, leftover = _custom_fit(state_dict)
        if leftover:
            raise
        return CUSTOM_BASE, custom, "inferred from the tensors"


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

    Reads ``architecture``, ``model_kwargs``, ``num_classes`` and (when recorded) ``data_config`` from the file's
    metadata, then calls ``timm.create_model(architecture, pretrained=True, pretrained_cfg_overlay=dict(file=path,
    num_classes=num_classes, **data_config), num_classes=num_classes, **model_kwargs, **kwargs)``. The recorded
    data config thus lands in ``model.pretrained_cfg``, where ``timm.data.resolve_data_config(model=model)`` finds
    the input size, crop, interpolation, mean and std the weights were trained for.

    Args:
        path: a file written by :func:`convert_checkpoint`.
        **kwargs: further ``create_model`` arguments (they override the stored ones).

    Raises:
        CheckpointError: the file is unreadable, truncated, or was not written by ``wtconvnext-convert``.
    """
    import timm

    from . import models as _models  # noqa: F401  (registers the entry points)

    obj, meta = load_checkpoint_file(path)  # the shared loader: one-line errors for any unreadable file
    del obj
    if meta.get("format") != FORMAT_NAME:
        kind = "a torch checkpoint" if not meta and not str(path).endswith(".safetensors") else (
            f"metadata format={meta.get('format')!r}")
        raise CheckpointError(
            f"'{path}' was not written by wtconvnext-convert ({kind}); convert it with wtconvnext-convert, or load "
            "it with timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay=dict(file=...))"
        )
    recorded = recorded_config(None, meta)
    build = dict(recorded.model_kwargs)
    build["num_classes"] = recorded.num_classes
    build.update(kwargs)
    overlay: dict[str, Any] = dict(file=str(path), num_classes=build["num_classes"])
    if recorded.data_config:
        data = dict(recorded.data_config)
        for key in ("input_size", "mean", "std"):
            if key in data:
                data[key] = tuple(data[key])
        overlay.update(data)
    return timm.create_model(recorded.model, pretrained=True, pretrained_cfg_overlay=overlay, **build)


def _logit_error(a: Tensor, b: Tensor) -> tuple[float, float, int]:
    """``(max_abs, max_rel, nonfinite)``: errors over the logits finite in both; ``inf`` when the non-finite
    logits (NaN, ±Inf) are not the same in both; ``nonfinite`` counts the positions where both are non-finite."""
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(fa, fb):
        return math.inf, math.inf, int((~fa).sum())
    na, nb = a[~fa], b[~fb]
    if not bool(((na == nb) | (na.isnan() & nb.isnan())).all()):
        return math.inf, math.inf, int((~fa).sum())
    if not bool(fa.any()):
        return 0.0, 0.0, int((~fa).sum())
    max_abs = (a[fa] - b[fa]).abs().max().item()
    scale = max(a[fa].abs().max().item(), torch.finfo(torch.float32).tiny)
    return max_abs, max_abs / scale, int((~fa).sum())


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
        batch (element-wise ratios are meaningless for logits near zero). Logits that are non-finite in both
        (a source with NaN / Inf weights, converted with ``allow_nonfinite``) count as equal when they are the same
        values at the same positions; any other difference in finiteness is an infinite error.
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
    max_abs, max_rel, _ = _logit_error(a, b)
    return max_abs, max_rel


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


def _resolved_data_config(recorded: Optional[RecordedConfig], name: str, kw: Mapping[str, Any]) -> dict[str, Any]:
    """The full data config the source records (resolved against the model's defaults, as its run did); {} if
    it records none."""
    if recorded is None or not recorded.data_config:
        return {}
    from timm.data import resolve_data_config

    try:
        return plain_data_config(resolve_data_config(dict(recorded.data_config), model=_meta_model(name, kw)))
    except Exception as e:  # noqa: BLE001  (a malformed record: say which)
        raise ConversionError(f"the {recorded.source} has an unusable data config "
                              f"{json.dumps(recorded.data_config)}: {e}") from None


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
    allow_nonfinite: bool = False,
    log: Optional[Callable[[str], None]] = None,
) -> dict[str, str]:
    """Convert a checkpoint to a folded ``.safetensors`` file in this project's layout.

    Args:
        src: input checkpoint (``.pth`` / ``.pt`` / ``.bin`` / ``.safetensors``; any supported layout/wrapper).
        dst: output path, must end in ``.safetensors``.
        model_name: timm entry point; by default the one the source records (a converted file's metadata, a
            training checkpoint's ``args``), else the registered variant that fits, else :data:`CUSTOM_BASE` with
            the configuration read off the tensors (:func:`infer_architecture`).
        model_kwargs: constructor overrides for ``model_name`` (stored in metadata).
        prefer_ema: take ``state_dict_ema`` / ``model_ema`` when present.
        verify: check the converted file against the unfolded source before moving it into place.
        tolerance: largest accepted relative logit error for ``verify``.
        image_size: input size for ``verify``.
        force: replace an existing ``dst``.
        allow_nonfinite: convert weights with NaN / Inf values (an error otherwise, naming the tensor).
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
    try:
        obj, src_meta = load_checkpoint_file(src)
        recorded = recorded_config(obj, src_meta)
    except CheckpointError as e:
        raise ConversionError(str(e)) from None
    raw, wrapper = select_state_dict(obj, prefer_ema=prefer_ema)
    del obj  # an optimizer state can be as large as the weights; do not hold it through the conversion
    bad = nonfinite_tensors(raw)
    if bad and not allow_nonfinite:
        raise ConversionError(f"{describe_nonfinite(bad, 'source tensor')}; pass --allow-nonfinite to convert anyway")
    if bad:
        say(f"warning: {describe_nonfinite(bad, 'source tensor')} (--allow-nonfinite: converted as they are)")
    layout = detect_layout({_strip_prefixes(k): v for k, v in raw.items()})
    sd = normalize_state_dict(raw)

    name, arch_kwargs, how = infer_architecture(sd, model_name, model_kwargs, recorded)
    kw = _build_kwargs(sd, arch_kwargs)
    filled = _fill_scales(sd, _meta_shapes(name, kw))
    say(
        f"{src.name}: {layout} layout, weights from "
        + (f"'{wrapper}'" if wrapper != "none" else "a flat state dict")
        + f", architecture {name}"
        + (f" {json.dumps(arch_kwargs)}" if arch_kwargs else "")
        + f" ({how})"
        + (f", {len(filled)} missing scale(s) set to 1" if filled else "")
    )
    try:
        folded = fold_scales(sd)
    except ValueError as e:
        raise ConversionError(f"cannot fold scales: {e}") from None
    # Folding multiplies in float64 and rounds once: a product past the dtype's range (float16's 65504) is Inf.
    already = {k for k, _, _ in nonfinite_tensors(sd)}
    overflow = [t for t in nonfinite_tensors(folded) if t[0] not in already]
    if overflow:
        what = f"folded tensor (its scale times its weight overflows {folded[overflow[0][0]].dtype})"
        if not allow_nonfinite:
            raise ConversionError(f"{describe_nonfinite(overflow, what)}; pass --allow-nonfinite to convert anyway")
        say(f"warning: {describe_nonfinite(overflow, what)} (--allow-nonfinite)")

    stored_kwargs = {k: v for k, v in kw.items() if k != "num_classes"}
    data_config = _resolved_data_config(recorded, name, kw)
    metadata = {
        "format": FORMAT_NAME,
        "architecture": name,
        "model_kwargs": json.dumps(stored_kwargs, sort_keys=True),
        "model_source": how,
        "num_classes": str(kw["num_classes"]),
        "folded": "true",
        "source_file": src.name,
        "source_sha256": _sha256(src),
        "source_layout": layout,
        "source_wrapper": wrapper,
        "ema": _ema_flag(wrapper),
        "converter_version": CONVERTER_VERSION,
    }
    if data_config:
        metadata["data_config"] = json.dumps(data_config)
        say(f"data config from the {recorded.source}: {json.dumps(data_config)}")
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
    p.add_argument("--model", help="timm entry point (default: the one the checkpoint records, else the registered "
                   "variant that fits, else a custom configuration read off the tensors)")
    p.add_argument(
        "--model-kwargs",
        metavar="JSON",
        help="constructor overrides for --model, e.g. "
        "'{\"depths\": [1, 1, 2, 1], \"dims\": [16, 32, 64, 128]}' (needs --model; stored in the metadata)",
    )
    p.add_argument("--no-ema", action="store_true", help="take 'state_dict' / 'model' even if EMA weights exist")
    p.add_argument("--verify", action="store_true", help="check the result against the unfolded source first")
    p.add_argument("--tolerance", type=float, default=1e-5, help="--verify: max relative logit error (1e-5)")
    p.add_argument("--image-size", type=int, default=64, help="--verify: input size (64)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output")
    p.add_argument("--allow-nonfinite", action="store_true",
                   help="convert weights with NaN / Inf values (by default an error naming the tensor)")
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
            allow_nonfinite=args.allow_nonfinite,
            log=lambda msg: print(msg, flush=True),
        )
    except CheckpointError as e:
        print(f"wtconvnext-convert: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
