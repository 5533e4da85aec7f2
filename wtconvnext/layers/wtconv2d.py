"""``WTConv2d``: the wavelet convolution layer, a drop-in for the reference implementation's layer.

The module is thin: it owns the parameters and calls :func:`wtconvnext.ops.wtconv2d`, which runs the fused Triton
kernels on CUDA and the pure-PyTorch reference elsewhere. It loads reference-format state dicts directly
(``base_conv.weight``, ``base_scale.weight``, ``wavelet_convs.{i}.weight``, ``wavelet_scale.{i}.weight``,
``wt_filter``, ``iwt_filter``) and the same authors' fused-backend layout (``base_weight``, ``wt_weights.{i}``...);
:func:`remap_reference_state_dict` is the one documented mapping.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Optional

import torch
from torch import Tensor, nn

from ..ops import BACKENDS, check_layer_args, wtconv2d, wtconv2d_reference

__all__ = ["WTConv2d", "remap_reference_state_dict", "REFERENCE_ONLY_KEYS"]

# Constant Haar filters the reference stores in its state dict; this project computes the transform exactly.
REFERENCE_ONLY_KEYS = ("wt_filter", "iwt_filter")

_REF_WAVELET = re.compile(r"^(.*?)(wavelet_convs|wavelet_scale|wt_weights|wt_scales)\.(\d+)(\.weight)?$")


def remap_reference_state_dict(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Map WTConv parameters in the reference or fused-backend layout to this project's layout.

    Works on a whole model's state dict: every WTConv layer found under any prefix ``p`` is rewritten, every other
    key passes through unchanged. Per layer (C channels, L levels, kernel K):

    ==================================  ==========================  ============================================
    reference key / fused-backend key   shape                       this project's key, shape
    ==================================  ==========================  ============================================
    ``p.base_conv.weight`` / ``p.base_weight``   (C, 1, K, K)       ``p.weight`` (C, 1, K, K)
    ``p.base_conv.bias`` / ``p.base_bias``       (C,)               ``p.bias`` (C,)
    ``p.base_scale.weight`` / ``p.base_scale``   (1, C, 1, 1)       ``p.base_scale`` (C,)
    ``p.wavelet_convs.{i}.weight`` / ``p.wt_weights.{i}``  (4C, 1, K, K)   ``p.wavelet_weight`` (L, C, 4, K, K)
    ``p.wavelet_scale.{i}.weight`` / ``p.wt_scales.{i}``   (1, 4C, 1, 1)   ``p.wavelet_scale`` (L, C, 4)
    ``p.wt_filter``, ``p.iwt_filter``            (4C, 1, 2, 2)      dropped (the Haar transform is exact here)
    ==================================  ==========================  ============================================

    Channel ``4c + s`` of the reference's level tensors is subband ``s`` of channel ``c``.
    Keys already in this project's layout pass through, so the function is idempotent.

    Raises:
        ValueError: if a layer's levels are not numbered 0..L-1 or their shapes disagree.
    """
    out: dict[str, Tensor] = {}
    levels: dict[tuple[str, str], dict[int, Tensor]] = {}
    for key, value in state_dict.items():
        m = _REF_WAVELET.match(key)
        if m:
            prefix, kind, idx = m.group(1), m.group(2), int(m.group(3))
            kind = "weight" if kind in ("wavelet_convs", "wt_weights") else "scale"
            levels.setdefault((prefix, kind), {})[idx] = value
            continue
        name = key.rsplit(".", 1)[-1]
        prefix = key[: len(key) - len(name)]
        if name in REFERENCE_ONLY_KEYS:
            continue
        if key.endswith("base_conv.weight") or name == "base_weight":
            prefix = key[: -len("base_conv.weight")] if key.endswith("base_conv.weight") else prefix
            out[prefix + "weight"] = value
        elif key.endswith("base_conv.bias") or name == "base_bias":
            prefix = key[: -len("base_conv.bias")] if key.endswith("base_conv.bias") else prefix
            out[prefix + "bias"] = value
        elif key.endswith("base_scale.weight"):
            out[key[: -len(".weight")]] = value.reshape(-1)
        elif name == "base_scale" and value.dim() == 4:
            out[key] = value.reshape(-1)
        else:
            out[key] = value
    for (prefix, kind), per_level in levels.items():
        n = len(per_level)
        if sorted(per_level) != list(range(n)):
            raise ValueError(f"WTConv levels under '{prefix}' are not numbered 0..{n - 1}: {sorted(per_level)}")
        tensors = [per_level[i] for i in range(n)]
        if any(t.shape != tensors[0].shape for t in tensors):
            raise ValueError(f"WTConv level tensors under '{prefix}' have different shapes")
        four_c = tensors[0].shape[0] if kind == "weight" else tensors[0].numel()
        if four_c % 4:
            raise ValueError(f"WTConv level tensor under '{prefix}' has {four_c} channels, not a multiple of 4")
        if kind == "weight":
            k = tensors[0].shape[-1]
            out[prefix + "wavelet_weight"] = torch.stack([t.reshape(four_c // 4, 4, k, k) for t in tensors])
        else:
            out[prefix + "wavelet_scale"] = torch.stack([t.reshape(four_c // 4, 4) for t in tensors])
    return out


class WTConv2d(nn.Module):
    """Wavelet convolution (Finder et al., ECCV 2024) with the Haar wavelet.

    ``y = base_scale * (dwconv(x) + bias) + IWT(per-level scale * dwconv(WT(x)))`` over ``wt_levels`` Haar levels,
    then subsampled by ``stride``. Same constructor, parametrisation and initialisation as the reference layer.

    Args:
        in_channels: number of channels C.
        out_channels: must equal ``in_channels`` (the layer is depthwise).
        kernel_size: odd kernel size K of every depthwise conv.
        stride: output subsampling factor.
        bias: whether the base conv has a bias.
        wt_levels: number of Haar levels L (any L >= 0; levels past 1x1 maps behave as in the reference).
        wt_type: wavelet; only ``'db1'`` (Haar) is supported.
        backend: ``'auto'``, ``'triton'`` or ``'reference'``; None reads ``WTCONVNEXT_BACKEND`` (default auto).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 5,
        stride: int = 1,
        bias: bool = True,
        wt_levels: int = 1,
        wt_type: str = "db1",
        backend: Optional[str] = None,
        device: Any = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        check_layer_args(in_channels, out_channels, kernel_size, stride, wt_levels, wt_type)
        if backend is not None and (not isinstance(backend, str) or backend.lower() not in BACKENDS):
            raise ValueError(f"WTConv2d backend must be one of {BACKENDS} or None, got {backend!r}")
        fk = dict(device=device, dtype=dtype)
        self.in_channels = self.out_channels = in_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.wt_levels = wt_levels
        self.backend = backend
        c, k = in_channels, kernel_size
        self.weight = nn.Parameter(torch.empty(c, 1, k, k, **fk))
        self.bias = nn.Parameter(torch.empty(c, **fk)) if bias else None
        self.base_scale = nn.Parameter(torch.empty(c, **fk))
        self.wavelet_weight = nn.Parameter(torch.empty(wt_levels, c, 4, k, k, **fk))
        self.wavelet_scale = nn.Parameter(torch.empty(wt_levels, c, 4, **fk))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise as the reference does: nn.Conv2d defaults for the convs, scales 1.0 (base) and 0.1 (levels)."""
        bound = 1.0 / math.sqrt(self.kernel_size**2)  # depthwise: fan_in = K * K
        # kaiming_uniform_(a=sqrt(5)) with this fan_in has exactly this bound, as nn.Conv2d uses.
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.wavelet_weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)
        nn.init.ones_(self.base_scale)
        nn.init.constant_(self.wavelet_scale, 0.1)

    def forward(self, x: Tensor) -> Tensor:
        if torch.jit.is_scripting():
            # TorchScript compiles only this branch: the pure-PyTorch reference (the fused op and the backend choice
            # are Python).
            return wtconv2d_reference(
                x, self.weight, self.bias, self.base_scale, self.wavelet_weight, self.wavelet_scale, self.stride
            )
        return wtconv2d(
            x,
            self.weight,
            self.bias,
            self.base_scale,
            self.wavelet_weight,
            self.wavelet_scale,
            stride=self.stride,
            backend=self.backend,
        )

    def _apply(self, fn, recurse=True):
        # nn.Module.to(memory_format=torch.channels_last) converts every 4-D and 5-D tensor and rejects 5-D ones
        # (timm's --channels-last does exactly this): the (L, C, 4, K, K) level weights go through as a 4-D view
        # and come back contiguous. Device and dtype conversions are unaffected.
        def fn_5d_safe(t):
            return fn(t.flatten(0, 1)).reshape(t.shape).contiguous() if t.dim() == 5 else fn(t)

        return super()._apply(fn_5d_safe, recurse)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        # Accept the reference / fused-backend layouts in place, so load_state_dict(reference_sd) just works.
        own = [k for k in state_dict if k.startswith(prefix) and _is_layer_key(k[len(prefix):])]
        if own:
            remapped = remap_reference_state_dict({k: state_dict.pop(k) for k in own})
            state_dict.update(remapped)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"bias={self.bias is not None}, wt_levels={self.wt_levels}"
        )


def _is_layer_key(rest: str) -> bool:
    """True for a key (relative to a layer) that belongs to a WTConv layer in any known layout."""
    head = rest.split(".", 1)[0]
    return head in ("base_conv", "base_scale", "wavelet_convs", "wavelet_scale", "wt_weights", "wt_scales") or rest in (
        "base_weight", "base_bias", "weight", "bias", "wavelet_weight") + REFERENCE_ONLY_KEYS
