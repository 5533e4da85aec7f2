"""wtconvnext: WTConvNeXt models for timm, with the wavelet convolution as fused Triton kernels.

``import wtconvnext`` registers the ``wtconvnext_*`` models with timm.
"""

from .layers import WTConv2d, remap_reference_state_dict
from .models import WTConvNeXt, checkpoint_filter_fn, unwrap_checkpoint
from .ops import wtconv2d, wtconv2d_reference

__version__ = "0.1.0"

__all__ = [
    "WTConv2d",
    "WTConvNeXt",
    "checkpoint_filter_fn",
    "remap_reference_state_dict",
    "unwrap_checkpoint",
    "wtconv2d",
    "wtconv2d_reference",
    "__version__",
]
