"""Pure-PyTorch reference of the WTConv math (Haar / db1 wavelet).

This is the single definition of what a WTConv layer computes. It serves the CPU path of :class:`WTConv2d`, the
oracle of every kernel test and the converter's ``--verify``. Gradients come from autograd.

Parameter layout (this project's, see :func:`wtconvnext.layers.wtconv2d.remap_reference_state_dict` for the
mapping from the reference implementation's names):

- ``weight``: (C, 1, K, K) depthwise kernel of the base branch, ``bias``: (C,) or None, ``base_scale``: (C,)
- ``wavelet_weight``: (L, C, 4, K, K) depthwise kernels of level i, subband s (s = 0 is the low-pass LL)
- ``wavelet_scale``: (L, C, 4) per-channel, per-subband scales

The Haar analysis of a 2x2 block [[a, b], [c, d]] is s0 = (a+b+c+d)/2, s1 = (a+b-c-d)/2, s2 = (a-b+c-d)/2,
s3 = (a-b-c+d)/2; synthesis is its exact (orthonormal) inverse. Odd maps are zero-padded bottom / right before each
analysis and cropped back after each synthesis, exactly as the reference implementation does.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["haar_analysis", "haar_synthesis", "wtconv2d_reference"]


def haar_analysis(x: Tensor) -> Tensor:
    """One level of the 2-D Haar transform.

    Args:
        x: (B, C, H, W); odd H / W are zero-padded on the bottom / right.

    Returns:
        (B, C, 4, ceil(H/2), ceil(W/2)) subbands LL, top-minus-bottom, left-minus-right, diagonal.
    """
    h, w = x.shape[-2:]
    if h % 2 or w % 2:
        x = F.pad(x, (0, w % 2, 0, h % 2))
    a = x[..., 0::2, 0::2]
    b = x[..., 0::2, 1::2]
    c = x[..., 1::2, 0::2]
    d = x[..., 1::2, 1::2]
    ab, cd = a + b, c + d
    amb, cmd = a - b, c - d
    return torch.stack(((ab + cd) * 0.5, (ab - cd) * 0.5, (amb + cmd) * 0.5, (amb - cmd) * 0.5), dim=2)


def haar_synthesis(coeffs: Tensor, size: tuple[int, int]) -> Tensor:
    """Inverse of :func:`haar_analysis`.

    Args:
        coeffs: (B, C, 4, h, w) subbands.
        size: (H, W) to crop the (2h, 2w) result back to; H in {2h - 1, 2h}, likewise W.

    Returns:
        (B, C, H, W).
    """
    s0, s1, s2, s3 = coeffs.unbind(2)
    p, q = s0 + s1, s0 - s1
    r, t = s2 + s3, s2 - s3
    a, b, c, d = (p + r) * 0.5, (p - r) * 0.5, (q + t) * 0.5, (q - t) * 0.5
    top = torch.stack((a, b), dim=-1)  # (B, C, h, w, 2)
    bottom = torch.stack((c, d), dim=-1)
    y = torch.stack((top, bottom), dim=-3)  # (B, C, h, 2, w, 2)
    bsz, ch, h, _, w, _ = y.shape
    y = y.reshape(bsz, ch, 2 * h, 2 * w)
    return y[..., : size[0], : size[1]]


def _depthwise(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """Depthwise K x K conv with zero 'same' padding (K odd); weight (C, 1, K, K)."""
    return F.conv2d(x, weight, bias, padding=weight.shape[-1] // 2, groups=x.shape[1])


def wtconv2d_reference(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    base_scale: Tensor,
    wavelet_weight: Tensor,
    wavelet_scale: Tensor,
    stride: int = 1,
) -> Tensor:
    """WTConv forward in plain PyTorch (differentiable through autograd).

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
    bsz, ch = x.shape[:2]
    levels, k = wavelet_weight.shape[0], weight.shape[-1]
    ll = x
    sizes: list[tuple[int, int]] = []
    filtered: list[Tensor] = []
    for i in range(levels):
        sizes.append((ll.shape[-2], ll.shape[-1]))
        coeffs = haar_analysis(ll)
        h, w = coeffs.shape[-2:]
        t = _depthwise(coeffs.reshape(bsz, 4 * ch, h, w), wavelet_weight[i].reshape(4 * ch, 1, k, k))
        t = t * wavelet_scale[i].reshape(1, 4 * ch, 1, 1)
        filtered.append(t.reshape(bsz, ch, 4, h, w))
        ll = coeffs[:, :, 0]  # the raw low-pass feeds the next level

    y = _depthwise(x, weight, bias) * base_scale.reshape(1, ch, 1, 1)
    acc: Optional[Tensor] = None
    for i in reversed(range(levels)):
        t = filtered[i]
        if acc is not None:
            t = torch.cat((t[:, :, :1] + acc.unsqueeze(2), t[:, :, 1:]), dim=2)
        acc = haar_synthesis(t, sizes[i])
    if acc is not None:
        y = y + acc
    if stride > 1:
        y = y[..., ::stride, ::stride]
    return y
