"""The public WTConv function: argument checks and the choice of backend.

``wtconv2d`` is what :class:`wtconvnext.layers.WTConv2d` calls. The backend is chosen per call:

- ``'triton'``: the fused Triton kernels (:mod:`wtconvnext.ops.wtconv_triton`), a ``torch.library`` custom op with
  its own autograd. Runs on CUDA tensors, and on CPU tensors when ``TRITON_INTERPRET=1`` is set.
- ``'reference'``: the pure-PyTorch reference (:mod:`wtconvnext.ops.reference`), differentiable through autograd.
- ``'auto'`` (default): Triton for CUDA tensors when Triton is importable, the reference otherwise. Graph captures
  for deployment (``torch.export``, the ONNX exporters, TorchScript) always get the reference: plain convolutions
  that every runtime has.

The default comes from the environment variable ``WTCONVNEXT_BACKEND`` (``auto`` | ``triton`` | ``reference``),
read at each call so tests and scripts can switch it; a per-call / per-layer ``backend`` argument wins over it.
"""

from __future__ import annotations

import os
import warnings
from typing import Optional

import torch
from torch import Tensor

from .reference import wtconv2d_reference

__all__ = ["wtconv2d", "check_layer_args", "check_wtconv_inputs", "resolve_backend", "BACKENDS"]

BACKENDS = ("auto", "triton", "reference")
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_layer_args(
    in_channels: int, out_channels: int, kernel_size: int, stride: int, wt_levels: int, wt_type: str
) -> None:
    """Raise ValueError for constructor arguments the layer does not support."""
    if wt_type != "db1":
        raise ValueError(f"WTConv2d supports only the Haar wavelet wt_type='db1', got wt_type={wt_type!r}")
    if in_channels != out_channels:
        raise ValueError(
            f"WTConv2d is depthwise: in_channels must equal out_channels, got {in_channels} and {out_channels}"
        )
    if in_channels < 1:
        raise ValueError(f"WTConv2d needs in_channels >= 1, got {in_channels}")
    if not isinstance(kernel_size, int) or kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(
            f"WTConv2d needs an odd integer kernel_size >= 1 ('same' padding is symmetric only for odd K), "
            f"got {kernel_size!r}"
        )
    if not isinstance(stride, int) or stride < 1:
        raise ValueError(f"WTConv2d needs an integer stride >= 1, got {stride!r}")
    if not isinstance(wt_levels, int) or wt_levels < 0:
        raise ValueError(f"WTConv2d needs an integer wt_levels >= 0, got {wt_levels!r}")


def check_wtconv_inputs(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    base_scale: Tensor,
    wavelet_weight: Tensor,
    wavelet_scale: Tensor,
    stride: int,
) -> None:
    """Raise a ValueError naming the problem when the arguments of :func:`wtconv2d` do not fit together."""
    if _inputs_fit(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride):
        return
    _explain_misfit(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride)


def _inputs_fit(x: Tensor, weight: Tensor, bias: Optional[Tensor], base_scale: Tensor, wavelet_weight: Tensor,
                wavelet_scale: Tensor, stride: int) -> bool:
    """Whether the arguments fit together, in as few steps as a per-call check can take (host time per layer call
    is what small inputs pay); False may be wrong only towards caution: :func:`_explain_misfit` then decides."""
    xs, ws, wws = x.shape, weight.shape, wavelet_weight.shape
    if len(xs) != 4 or len(ws) != 4 or len(wws) != 5 or x.dtype not in SUPPORTED_DTYPES:
        return False
    c, k, levels = xs[1], ws[3], wws[0]
    if (ws != (c, 1, k, k) or k % 2 == 0 or wws != (levels, c, 4, k, k) or wavelet_scale.shape != (levels, c, 4)
            or base_scale.shape != (c,) or (bias is not None and bias.shape != (c,))
            or type(stride) is not int or stride < 1):
        return False
    if x.is_cuda:  # the common case: every parameter on the same GPU (integer comparisons, no device objects)
        i = x.get_device()
        return (weight.is_cuda and base_scale.is_cuda and wavelet_weight.is_cuda and wavelet_scale.is_cuda
                and weight.get_device() == i and base_scale.get_device() == i and wavelet_weight.get_device() == i
                and wavelet_scale.get_device() == i and (bias is None or (bias.is_cuda and bias.get_device() == i)))
    dev = x.device
    return all(t is None or t.device == dev for t in (weight, bias, base_scale, wavelet_weight, wavelet_scale))


def _explain_misfit(x: Tensor, weight: Tensor, bias: Optional[Tensor], base_scale: Tensor, wavelet_weight: Tensor,
                    wavelet_scale: Tensor, stride: int) -> None:
    """The checks one by one, raising for the first that fails (after :func:`_inputs_fit` found a misfit)."""
    if x.dim() != 4:
        raise ValueError(f"WTConv2d expects a 4-D input (B, C, H, W), got shape {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"WTConv2d supports float32, float16, bfloat16 and float64 inputs, got {x.dtype}")
    c = x.shape[1]
    if weight.dim() != 4 or weight.shape[0] != c or weight.shape[1] != 1 or weight.shape[2] != weight.shape[3]:
        raise ValueError(
            f"WTConv2d input has {c} channels but the base weight has shape {tuple(weight.shape)} "
            f"(expected ({c}, 1, K, K))"
        )
    k = weight.shape[-1]
    if k % 2 == 0:
        raise ValueError(f"WTConv2d needs an odd kernel size, got K={k}")
    if wavelet_weight.dim() != 5 or tuple(wavelet_weight.shape[1:]) != (c, 4, k, k):
        raise ValueError(
            f"WTConv2d wavelet_weight has shape {tuple(wavelet_weight.shape)}, expected (L, {c}, 4, {k}, {k})"
        )
    levels = wavelet_weight.shape[0]
    if tuple(wavelet_scale.shape) != (levels, c, 4):
        raise ValueError(f"WTConv2d wavelet_scale has shape {tuple(wavelet_scale.shape)}, expected ({levels}, {c}, 4)")
    if tuple(base_scale.shape) != (c,):
        raise ValueError(f"WTConv2d base_scale has shape {tuple(base_scale.shape)}, expected ({c},)")
    if bias is not None and tuple(bias.shape) != (c,):
        raise ValueError(f"WTConv2d bias has shape {tuple(bias.shape)}, expected ({c},)")
    if not isinstance(stride, int) or stride < 1:
        raise ValueError(f"WTConv2d needs an integer stride >= 1, got {stride!r}")
    for name, t in (("weight", weight), ("bias", bias), ("base_scale", base_scale),
                    ("wavelet_weight", wavelet_weight), ("wavelet_scale", wavelet_scale)):
        if t is not None and t.device != x.device:
            raise ValueError(f"WTConv2d input is on {x.device} but {name} is on {t.device}")


def resolve_backend(x: Tensor, backend: Optional[str] = None) -> str:
    """Pick 'triton' or 'reference' for input ``x`` (see the module docstring)."""
    choice = backend if backend is not None else os.environ.get("WTCONVNEXT_BACKEND", "auto")
    choice = choice.lower()
    if choice not in BACKENDS:
        raise ValueError(f"WTConv backend must be one of {BACKENDS}, got {choice!r}")
    if choice == "auto":
        if x.is_cuda and x.dtype != torch.float64 and not _exporting():
            from . import wtconv_triton

            if wtconv_triton.TRITON_AVAILABLE:
                return "triton"
        return "reference"
    return choice


def _exporting() -> bool:
    """True while torch.export (also under the dynamo ONNX exporter) or the legacy ONNX exporter's tracer runs."""
    if torch.jit.is_tracing():
        return True
    # The flag torch.export sets, read directly: dynamo folds a call of torch.compiler.is_exporting() inside a
    # compiled function to True on some releases (torch 2.11 does), which sent every torch.compile'd WTConv on the
    # GPU to the reference path. A plain module attribute is read, and guarded on, at its real value.
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    if flag is not None:
        return bool(flag)
    is_exporting = getattr(torch.compiler, "is_exporting", None)  # torch >= 2.5
    return is_exporting is not None and is_exporting()


def wtconv2d(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    base_scale: Tensor,
    wavelet_weight: Tensor,
    wavelet_scale: Tensor,
    stride: int = 1,
    backend: Optional[str] = None,
) -> Tensor:
    """Wavelet convolution (Haar), forward and backward.

    Shapes as in :func:`wtconvnext.ops.reference.wtconv2d_reference`. Under autocast the weights are cast to the
    autocast dtype, as for a convolution.

    Args:
        x: (B, C, H, W) input, any memory format; the output keeps it.
        weight, bias, base_scale, wavelet_weight, wavelet_scale: the layer's parameters.
        stride: output subsampling factor.
        backend: 'auto', 'triton' or 'reference'; None reads ``WTCONVNEXT_BACKEND``.

    Returns:
        (B, C, ceil(H / stride), ceil(W / stride)).
    """
    if torch.jit.is_tracing():
        # The checks compare sizes, which the tracer records as tensors: it would warn that each comparison becomes a
        # constant of the trace, which is what a check is.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            check_wtconv_inputs(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride)
    else:
        check_wtconv_inputs(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride)
    if resolve_backend(x, backend) == "triton":
        if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                f"the 'triton' WTConv backend runs on CUDA tensors (input is on {x.device}); set TRITON_INTERPRET=1 "
                "before importing wtconvnext to run the kernels on the CPU, or use backend='reference'"
            )
        return _triton_impl()(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride)
    return wtconv2d_reference(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride)


def _triton_impl():
    """``wtconv_triton.wtconv2d_triton``, imported at the first call (triton is optional; an import statement per
    layer call cost host time)."""
    global _triton_impl
    from .wtconv_triton import wtconv2d_triton

    _triton_impl = lambda: wtconv2d_triton  # noqa: E731
    return wtconv2d_triton
