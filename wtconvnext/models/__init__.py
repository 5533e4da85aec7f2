"""Models: the WTConvNeXt family, registered with timm on import."""

from .wtconvnext import WTConvNeXt, WTConvNeXtBlock, WTConvNeXtStage, checkpoint_filter_fn, unwrap_checkpoint

__all__ = ["WTConvNeXt", "WTConvNeXtBlock", "WTConvNeXtStage", "checkpoint_filter_fn", "unwrap_checkpoint"]
