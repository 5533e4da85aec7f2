"""WTConv operators: the pure-PyTorch reference, the fused Triton op, and the dispatching ``wtconv2d``."""

from .reference import haar_analysis, haar_synthesis, wtconv2d_reference
from .wtconv import BACKENDS, check_layer_args, check_wtconv_inputs, resolve_backend, wtconv2d

__all__ = [
    "BACKENDS",
    "check_layer_args",
    "check_wtconv_inputs",
    "haar_analysis",
    "haar_synthesis",
    "resolve_backend",
    "wtconv2d",
    "wtconv2d_reference",
]
