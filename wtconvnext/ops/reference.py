"""Pure-PyTorch reference of the WTConv math (Haar / db1 wavelet).

This is the single definition of what a WTConv layer computes. It serves the CPU path of :class:`WTConv2d`, the
oracle of every kernel test, the converter's ``--verify``, TorchScript and every exporter (ONNX, ``torch.export``).
Gradients come from autograd.

Parameter layout (this project's, see :func:`wtconvnext.layers.wtconv2d.remap_reference_state_dict` for the
mapping from the reference implementation's names):

- ``weight``: (C, 1, K, K) depthwise kernel of the base branch, ``bias``: (C,) or None, ``base_scale``: (C,)
- ``wavelet_weight``: (L, C, 4, K, K) depthwise kernels of level i, subband s (s = 0 is the low-pass LL)
- ``wavelet_scale``: (L, C, 4) per-channel, per-subband scales

The Haar analysis of a 2x2 block [[a, b], [c, d]] is s0 = (a+b+c+d)/2, s1 = (a+b-c-d)/2, s2 = (a-b+c-d)/2,
s3 = (a-b-c+d)/2; synthesis is its exact (orthonormal) inverse. The reference implementation zero-pads odd maps
bottom / right before each analysis and crops back after each synthesis; level i's maps then have
``ceil(H / 2^i)`` rows.

How this code gets the same numbers with shapes that a graph capture can keep symbolic: level i's coefficient maps
are stored with ``max(2, ceil(H / 2^i))`` rows (likewise columns), a closed form of the input size, and every level
map is zero-extended bottom / right to twice the next level's size before its analysis. Zero-padding at every level
is the same as zero-extending the input (the Haar transform of zeros is zero), so the extra rows hold zero
coefficients inside each level's valid region and 'same'-padded convs read exactly the zeros the reference pads
with; whatever the convs leave in the extra rows only ever synthesises into rows past the reference's crop. So the
output is the reference's, while no size is tested for parity, no map is ever one pixel wide (a size-1 dimension is
special-cased by PyTorch's shape logic) and no crop leaves a view whose contiguity depends on the size: under
``torch.export`` with dynamic H and W the program holds for every input size (checked in ``tests/test_export.py``).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["haar_analysis", "haar_synthesis", "wtconv2d_reference"]


def _at_least(n: int, low: int) -> int:
    """``max(n, low)`` for a size that is an int (eager, TorchScript), a SymInt (``torch.export``, ``torch.compile``)
    or a traced 0-d tensor (the legacy ONNX exporter), without turning a symbolic size into a constant."""
    if torch.jit.is_scripting():
        return max(n, low)
    else:
        if isinstance(n, Tensor):
            return n.clamp(min=low)
        if isinstance(n, int):  # a plain int (torch 2.11's dynamo breaks the graph on sym_max of two ints)
            return max(n, low)
        return torch.sym_max(n, low)


def _level_size(n: int, level: int) -> int:
    """Rows (or columns) of level ``level``'s coefficient maps for an ``n``-row input: ceil(n / 2^level), at least 2."""
    step = 1 << level
    return _at_least((n + step - 1) // step, 2)


def _crop(y: Tensor, size: Tuple[int, int]) -> Tensor:
    """The top-left (h, w) = size of y (B, C, H', W'), h <= H', w <= W'."""
    h, w = size[0], size[1]
    if torch.jit.is_scripting():
        return y[:, :, :h, :w]
    else:
        if torch.jit.is_tracing():
            return y[:, :, :h, :w]  # the legacy ONNX exporter records slicing with traced bounds
        # A new tensor of exactly (h, w): later ops would test a view's contiguity, which depends on the parity of
        # the size and would pin it under torch.export. A negative pad crops into a new tensor (narrow_copy has no
        # derivative in torch 2.11; a clone of a narrowed view adds size guards under torch.export).
        return F.pad(y, (0, w - y.shape[3], 0, h - y.shape[2]))


def haar_analysis(x: Tensor, size: Optional[Tuple[int, int]] = None) -> Tensor:
    """One level of the 2-D Haar transform.

    Args:
        x: (B, C, H, W) input.
        size: (h, w) of the output subbands, at least (ceil(H/2), ceil(W/2)); x is zero-padded bottom / right to
            (2h, 2w). Default (ceil(H/2), ceil(W/2)): odd H / W are padded by one row / column, as the reference does.

    Returns:
        (B, C, 4, h, w) subbands LL, top-minus-bottom, left-minus-right, diagonal.
    """
    bsz, ch, rows, cols = x.shape[0], x.shape[1], x.shape[2], x.shape[3]
    if size is None:
        h, w = (rows + 1) // 2, (cols + 1) // 2
    else:
        h, w = size[0], size[1]
    x = F.pad(x, (0, 2 * w - cols, 0, 2 * h - rows)).reshape(bsz, ch, h, 2, w, 2)
    # The butterfly on every 2x2 block [[a, b], [c, d]], columns first: [a + b; c + d] and [a - b; c - d], then rows.
    left, right = x.unbind(5)  # (B, C, h, 2, w): [a; c], [b; d]
    top, bottom = torch.stack((left + right, left - right), dim=2).unbind(4)  # (B, C, 2, h, w): [a+b, a-b], [c+d, c-d]
    # (B, C, 2, 2, h, w): [[(a+b) + (c+d), (a+b) - (c+d)], [(a-b) + (c-d), (a-b) - (c-d)]] = [[s0, s1], [s2, s3]]
    return torch.stack((top + bottom, top - bottom), dim=3).flatten(2, 3) * 0.5


def haar_synthesis(coeffs: Tensor, size: Tuple[int, int]) -> Tensor:
    """Inverse of :func:`haar_analysis`.

    Args:
        coeffs: (B, C, 4, h, w) subbands.
        size: (H, W) to crop the (2h, 2w) result back to; H <= 2h, W <= 2w.

    Returns:
        (B, C, H, W).
    """
    ch = coeffs.shape[1]
    y = F.conv_transpose2d(coeffs.flatten(1, 2), _haar_filters(ch, coeffs), stride=2, groups=ch)
    return _crop(y, size)


# The analysis table of the module docstring: subband s's 2x2 pattern (times 1/2 in _haar_filters). A module
# constant, which tracers and torch.export record as a constant (a torch.tensor call would make the legacy ONNX
# exporter warn); TorchScript, which cannot read a global tensor, builds it in place.
_HAAR = torch.tensor([[[1.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [-1.0, -1.0]], [[1.0, -1.0], [1.0, -1.0]],
                      [[1.0, -1.0], [-1.0, 1.0]]])


def _haar_filters(ch: int, like: Tensor) -> Tensor:
    """(4C, 1, 2, 2) Haar filters in ``like``'s dtype and device: channel 4c + s holds subband s's pattern. The
    transform is orthonormal and the patterns symmetric, so a transposed conv with them synthesises."""
    if torch.jit.is_scripting():
        haar = torch.tensor(
            [[[1.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [-1.0, -1.0]], [[1.0, -1.0], [1.0, -1.0]], [[1.0, -1.0], [-1.0, 1.0]]],
            dtype=like.dtype,
            device=like.device,
        )
    else:
        haar = _HAAR.to(dtype=like.dtype, device=like.device)
    return (haar * 0.5).repeat(ch, 1, 1).unsqueeze(1)


def _depthwise(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """Depthwise K x K conv with zero 'same' padding (K odd); weight (C, 1, K, K). The group count comes from the
    weight, so an exporter sees a kernel of known shape whatever the input's shape is."""
    return F.conv2d(x, weight, bias, padding=weight.shape[-1] // 2, groups=weight.shape[0])


def wtconv2d_reference(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    base_scale: Tensor,
    wavelet_weight: Tensor,
    wavelet_scale: Tensor,
    stride: int = 1,
) -> Tensor:
    """WTConv forward in plain PyTorch (differentiable through autograd; scriptable and exportable).

    Args:
        x: (B, C, H, W) input.
        weight: (C, 1, K, K) base depthwise kernel.
        bias: (C,) base bias, or None.
        base_scale: (C,) scale of the base branch, applied after the bias.
        wavelet_weight: (L, C, 4, K, K) per-level depthwise kernels.
        wavelet_scale: (L, C, 4) per-level scales.
        stride: output subsampling factor.

    Returns:
        (B, C, ceil(H/stride), ceil(W/stride)).
    """
    # Channel counts and kernel sizes come from the parameters, map sizes from x: an exporter sees kernels of
    # constant shape and map sizes that follow the input's.
    ch, k = weight.shape[0], weight.shape[-1]
    levels = wavelet_weight.shape[0]
    rows, cols = x.shape[2], x.shape[3]
    ll = x
    sizes: List[Tuple[int, int]] = []  # level i's input map size, what its synthesis is cropped back to
    filtered: List[Tensor] = []  # level i's filtered, scaled coefficients, (B, 4C, h_i, w_i)
    for i in range(levels):
        sizes.append((ll.shape[2], ll.shape[3]))
        coeffs = haar_analysis(ll, (_level_size(rows, i + 1), _level_size(cols, i + 1)))
        t = _depthwise(coeffs.flatten(1, 2), wavelet_weight.select(0, i).reshape(4 * ch, 1, k, k))
        filtered.append(t * wavelet_scale.select(0, i).reshape(1, 4 * ch, 1, 1))
        ll = coeffs.select(2, 0)  # the raw low-pass feeds the next level

    y = _depthwise(x, weight, bias) * base_scale.reshape(1, ch, 1, 1)
    if len(filtered) > 0:  # (levels is a traced tensor under the legacy ONNX exporter)
        # Coarse to fine, acc = the synthesis of level i with the coarser levels' acc added to its LL subband. The
        # synthesis is linear: that is the synthesis of t_i plus that of acc alone in the LL subband (acc / 2 on
        # every pixel of its 2x2 block).
        filters = _haar_filters(ch, x)
        ll_filters = torch.full((ch, 1, 2, 2), 0.5, dtype=x.dtype, device=x.device)  # the LL pattern
        acc = _crop(F.conv_transpose2d(filtered[levels - 1], filters, stride=2, groups=ch), sizes[levels - 1])
        for j in range(1, levels):
            i = levels - 1 - j
            up = F.conv_transpose2d(filtered[i], filters, stride=2, groups=ch)
            acc = _crop(up + F.conv_transpose2d(acc, ll_filters, stride=2, groups=ch), sizes[i])
        y = y + acc
    if stride > 1:
        y = y[:, :, ::stride, ::stride]
    return y
