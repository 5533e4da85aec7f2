"""Layers: the ``WTConv2d`` module."""

from .wtconv2d import REFERENCE_ONLY_KEYS, WTConv2d, remap_reference_state_dict

__all__ = ["REFERENCE_ONLY_KEYS", "WTConv2d", "remap_reference_state_dict"]
