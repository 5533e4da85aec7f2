"""WTConvNeXt: ConvNeXt with wavelet convolutions.

Paper: `Wavelet Convolutions for Large Receptive Fields` (Finder, Amoyal, Treister, Freifeld; ECCV 2024).
Reference implementation: https://github.com/BGU-CS-VIL/WTConv (a timm v1.0.7 ConvNeXt whose depthwise convs are
WTConv layers).

This file follows timm's ``convnext.py`` layout: building blocks, the model class, weight init, the checkpoint
filter, the builder, pretrained cfgs and the registered entry points. Parameter names match the reference
checkpoints (``stem.*``, ``stages.i.downsample.*``, ``stages.i.blocks.j.{gamma,conv_dw,norm,mlp}``, ``head.*``),
except inside ``conv_dw``, which uses :class:`~wtconvnext.layers.WTConv2d`'s native names;
:func:`checkpoint_filter_fn` maps reference, fused-backend and folded checkpoints onto them.
"""

import inspect
from functools import partial
from typing import Any, Callable, Mapping, Optional, Union

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import (
    ClassifierHead,
    DropPath,
    GlobalResponseNormMlp,
    LayerNorm,
    LayerNorm2d,
    Mlp,
    NormMlpClassifierHead,
    RmsNorm,
    RmsNorm2d,
    SimpleNorm,
    SimpleNorm2d,
    create_conv2d,
    get_act_layer,
    get_device_dtype,
    get_norm_layer,
    make_divisible,
    to_ntuple,
    trunc_normal_,
)
from timm.layers.fast_norm import fast_layer_norm
from timm.models import (
    build_model_with_cfg,
    checkpoint_seq,
    generate_default_cfgs,
    named_apply,
    register_model,
    register_notrace_module,
)
from timm.models._features import feature_take_indices

from ..layers import REFERENCE_ONLY_KEYS, WTConv2d, remap_reference_state_dict
from ..ops import BACKENDS

# torch.fx cannot trace the layer's shape-dependent padding nor the fused op's launch logic: keep it a leaf, so timm's
# FX feature extraction (features_only=True, feature_cls="fx") and torchvision's create_feature_extractor work.
register_notrace_module(WTConv2d)

__all__ = [
    "RowsLayerNorm2d", "WTConvNeXt", "WTConvNeXtBlock", "WTConvNeXtStage", "checkpoint_filter_fn", "unwrap_checkpoint",
]


class RowsLayerNorm2d(LayerNorm2d):
    """timm's ``LayerNorm2d`` (same parameters, same bits), normalising the (B, H*W, C) view of the NHWC map rather
    than (B, H, W, C): compiled, Inductor's layout optimisation lays 4-D tensors upstream of a convolution out
    channels-last, the norm's saved (B, H, W, 1) statistics included, and their strided stores make the norm a
    looped reduction (see ``WTConvNeXtBlock.forward``)."""

    def forward(self, x: Tensor) -> Tensor:
        # timm's LayerNorm.forward on the rows would say this once, but TorchScript (timm's suite scripts the model)
        # cannot call another class's method on self.
        y = x.permute(0, 2, 3, 1)
        if self._fast_norm:
            z = fast_layer_norm(y.flatten(1, 2), self.normalized_shape, self.weight, self.bias, self.eps)
        else:
            z = F.layer_norm(y.flatten(1, 2), self.normalized_shape, self.weight, self.bias, self.eps)
        return z.view_as(y).permute(0, 3, 1, 2)


# timm ConvNeXt's norm names: (channels-first norm for stem / downsample / head, channels-last norm for the blocks)
_NORM_LAYERS: dict[str, tuple[type[nn.Module], type[nn.Module]]] = {
    "layernorm": (RowsLayerNorm2d, LayerNorm),
    "layernorm2d": (RowsLayerNorm2d, LayerNorm),
    "simplenorm": (SimpleNorm2d, SimpleNorm),
    "simplenorm2d": (SimpleNorm2d, SimpleNorm),
    "rmsnorm": (RmsNorm2d, RmsNorm),
    "rmsnorm2d": (RmsNorm2d, RmsNorm),
}
STEM_TYPES = ("patch", "overlap", "overlap_tiered", "overlap_act")


def _get_norm_layers(
    norm_layer: Union[str, Callable, None], conv_mlp: bool, norm_eps: Optional[float]
) -> tuple[Callable, Callable]:
    """(channels-first norm, block norm) as timm's ConvNeXt picks them: a name from ``_NORM_LAYERS`` works with
    either MLP; any other norm (a callable or another timm name) takes channels-first input, so it needs conv_mlp."""
    norm_layer = norm_layer or "layernorm"
    if isinstance(norm_layer, str) and norm_layer in _NORM_LAYERS:
        norm_2d, norm_cl = _NORM_LAYERS[norm_layer]
        norm_block = norm_2d if conv_mlp else norm_cl
    else:
        if not conv_mlp:
            raise ValueError(
                f"norm_layer must be one of {sorted(_NORM_LAYERS)}, or any norm with conv_mlp=True (the blocks then "
                f"normalise channels-first input), got {norm_layer!r}"
            )
        norm_2d = norm_block = get_norm_layer(norm_layer)
    if norm_eps is not None:
        norm_2d, norm_block = partial(norm_2d, eps=norm_eps), partial(norm_block, eps=norm_eps)
    return norm_2d, norm_block


def _check_backend(backend: Optional[str]) -> None:
    if backend is not None and (not isinstance(backend, str) or backend.lower() not in BACKENDS):
        raise ValueError(f"wtconv_backend must be one of {BACKENDS} or None, got {backend!r}")


class WTConvNeXtBlock(nn.Module):
    """ConvNeXt block with a WTConv as its depthwise conv.

    WTConv2d -> NHWC -> norm -> Linear(mlp_ratio x) -> act -> Linear -> layer scale ``gamma`` -> drop path -> +x,
    or with ``conv_mlp`` the same in NCHW with 1x1 convs (timm's ConvNeXtBlock, both forms).

    Args:
        dim: channels.
        kernel_size: odd kernel size of every depthwise conv inside the WTConv.
        wt_levels: Haar levels of the WTConv.
        mlp_ratio: hidden width of the MLP relative to ``dim``.
        conv_mlp: NCHW block: channels-first norm and 1x1-conv MLP instead of NHWC with Linear layers.
        conv_bias: whether the WTConv's base conv has a bias.
        use_grn: Global Response Norm in the MLP (ConvNeXt-V2).
        ls_init_value: initial layer scale; None disables it.
        act_layer: MLP activation.
        norm_layer: the block's norm (channels-last, or channels-first with ``conv_mlp``); None: LayerNorm.
        drop_path: stochastic depth probability.
        wtconv_backend: ``'auto'``, ``'triton'``, ``'reference'`` or None (read ``WTCONVNEXT_BACKEND``).
    """

    def __init__(
        self,
        dim: int,
        kernel_size: int = 5,
        wt_levels: int = 1,
        mlp_ratio: float = 4.0,
        conv_mlp: bool = False,
        conv_bias: bool = True,
        use_grn: bool = False,
        ls_init_value: Optional[float] = 1e-6,
        act_layer: Union[str, Callable] = "gelu",
        norm_layer: Optional[Callable] = None,
        drop_path: float = 0.0,
        wtconv_backend: Optional[str] = None,
        device: Any = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        self.conv_dw = WTConv2d(
            dim, dim, kernel_size=kernel_size, bias=conv_bias, wt_levels=wt_levels, backend=wtconv_backend, **dd
        )
        if norm_layer is None:
            norm_layer = RowsLayerNorm2d if conv_mlp else LayerNorm
        mlp_layer = GlobalResponseNormMlp if use_grn else Mlp
        self.use_conv_mlp = conv_mlp
        # Norm and MLP over (B, H*W, C) rows (see forward); GRN needs the map's two spatial dims.
        self.rows = not conv_mlp and not use_grn
        self.norm = norm_layer(dim, **dd)
        self.mlp = mlp_layer(dim, int(mlp_ratio * dim), act_layer=get_act_layer(act_layer), use_conv=conv_mlp, **dd)
        self.gamma = nn.Parameter(torch.full((dim,), ls_init_value, **dd)) if ls_init_value is not None else None
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        shortcut = x
        x = self.conv_dw(x)
        if self.use_conv_mlp:
            x = self.mlp(self.norm(x))
            if self.gamma is not None:
                x = x * self.gamma.reshape(1, -1, 1, 1)
        else:
            # Norm and MLP over the (B, H*W, C) view of NHWC rather than (B, H, W, C): the same rows, but compiled
            # with convolutions in the graph, Inductor gives 4-D intermediates channels-last strides, the norm's
            # saved (B, H, W, 1) statistics too, and their strided stores make the norm a looped reduction.
            y = x.permute(0, 2, 3, 1)
            x = self.mlp(self.norm(y.flatten(1, 2) if self.rows else y))
            if self.gamma is not None:
                x = x * self.gamma  # broadcasts over the channel (last) dim
            x = x.view_as(y).permute(0, 3, 1, 2)
        return self.drop_path(x) + shortcut


class WTConvNeXtStage(nn.Module):
    """Optional downsample (norm + 2x2 conv) followed by ``depth`` blocks.

    Args:
        in_chs: input channels.
        out_chs: output channels.
        stride: stride of the downsample conv (1 keeps the resolution: output_stride < 32).
        depth: number of blocks.
        drop_path_rates: per-block stochastic depth probabilities.
        norm_layer: channels-first norm of the downsample.
        norm_layer_cl: norm of the blocks (channels-last, or channels-first with ``conv_mlp``).
        conv_bias: bias on the downsample conv and the WTConvs.
        **block_kwargs: passed to every :class:`WTConvNeXtBlock`.
    """

    def __init__(
        self,
        in_chs: int,
        out_chs: int,
        stride: int = 2,
        depth: int = 2,
        drop_path_rates: Optional[list[float]] = None,
        norm_layer: Callable = RowsLayerNorm2d,
        norm_layer_cl: Callable = LayerNorm,
        conv_bias: bool = True,
        device: Any = None,
        dtype: Optional[torch.dtype] = None,
        **block_kwargs: Any,
    ) -> None:
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        self.grad_checkpointing = False
        if in_chs != out_chs or stride > 1:
            # A 2x2 conv either way, so the parameters match the stride-2 checkpoints; 'same' padding keeps the
            # resolution when the stride was traded away for a smaller output_stride.
            self.downsample = nn.Sequential(
                norm_layer(in_chs, **dd),
                create_conv2d(
                    in_chs, out_chs, kernel_size=2, stride=stride, padding=0 if stride > 1 else "same",
                    bias=conv_bias, **dd,
                ),
            )
        else:
            self.downsample = nn.Identity()
        rates = drop_path_rates or [0.0] * depth
        self.blocks = nn.Sequential(*[
            WTConvNeXtBlock(out_chs, drop_path=rates[i], norm_layer=norm_layer_cl, conv_bias=conv_bias, **block_kwargs,
                            **dd)
            for i in range(depth)
        ])

    def forward(self, x: Tensor) -> Tensor:
        x = self.downsample(x)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint_seq(self.blocks, x)
        return self.blocks(x)


class WTConvNeXt(nn.Module):
    """WTConvNeXt: timm's ConvNeXt (v1 layout) with every depthwise conv a WTConv.

    Args:
        in_chans: input image channels.
        num_classes: classifier outputs; 0 for no classifier.
        global_pool: global pooling type of the head.
        output_stride: 32, 16 or 8. Below 32 the last downsample convs keep the resolution; the WTConvs are not
            dilated (the reference has no dilation), so a pretrained model's receptive field shrinks relative to
            the map there.
        depths: blocks per stage.
        dims: channels per stage.
        kernel_sizes: WTConv kernel size, one for all stages or one per stage (odd).
        wt_levels: WTConv Haar levels, one for all stages or one per stage.
        ls_init_value: layer scale init; None disables layer scale.
        stem_type: ``'patch'`` (a patch_size x patch_size conv of stride patch_size), or two stride-2 3x3 convs:
            ``'overlap'``, ``'overlap_tiered'`` (half the width in between), ``'overlap_act'`` (an activation in
            between), as timm's ConvNeXt.
        patch_size: stem patch size (stride of the patch stem).
        head_init_scale: factor on the initial classifier weights and biases.
        head_norm_first: norm -> pool -> fc head (``norm_pre`` + ClassifierHead) instead of pool -> norm -> fc.
        head_hidden_size: hidden width of an MLP pre-logits layer in the head (pool -> norm -> fc only).
        mlp_ratio: hidden width of the block MLPs relative to the stage width.
        conv_mlp: NCHW blocks with 1x1-conv MLPs instead of NHWC blocks with Linear layers (same function).
        conv_bias: biases on the stem, downsample convs and the WTConvs' base convs.
        use_grn: Global Response Norm in the block MLPs (ConvNeXt-V2).
        act_layer: block MLP activation.
        norm_layer: ``'layernorm'``, ``'simplenorm'`` or ``'rmsnorm'`` (``'...2d'`` aliases too); with ``conv_mlp``
            also any timm norm name or norm layer class, as timm's ConvNeXt.
        norm_eps: norm epsilon; None keeps the norm's default (1e-6 for timm's LayerNorm).
        drop_rate: dropout before the classifier.
        drop_path_rate: stochastic depth, increasing linearly over the blocks to this value.
        wtconv_backend: backend of every WTConv2d (``'auto'``, ``'triton'``, ``'reference'``; None reads
            ``WTCONVNEXT_BACKEND`` at each call).
        device: device of the parameters.
        dtype: dtype of the parameters.
    """

    def __init__(
        self,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        output_stride: int = 32,
        depths: tuple[int, ...] = (3, 3, 9, 3),
        dims: tuple[int, ...] = (96, 192, 384, 768),
        kernel_sizes: Union[int, tuple[int, ...]] = 5,
        wt_levels: Union[int, tuple[int, ...]] = (5, 4, 3, 2),
        ls_init_value: Optional[float] = 1e-6,
        stem_type: str = "patch",
        patch_size: int = 4,
        head_init_scale: float = 1.0,
        head_norm_first: bool = False,
        head_hidden_size: Optional[int] = None,
        mlp_ratio: float = 4.0,
        conv_mlp: bool = False,
        conv_bias: bool = True,
        use_grn: bool = False,
        act_layer: Union[str, Callable] = "gelu",
        norm_layer: Union[str, Callable, None] = "layernorm",
        norm_eps: Optional[float] = None,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        wtconv_backend: Optional[str] = None,
        device: Any = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        if output_stride not in (8, 16, 32):
            raise ValueError(f"output_stride must be 8, 16 or 32, got {output_stride}")
        if len(depths) != len(dims):
            raise ValueError(f"depths and dims need one entry per stage, got {len(depths)} and {len(dims)}")
        if stem_type not in STEM_TYPES:
            raise ValueError(f"stem_type must be one of {STEM_TYPES}, got {stem_type!r}")
        _check_backend(wtconv_backend)
        num_stages = len(depths)
        kernel_sizes = to_ntuple(num_stages)(kernel_sizes)
        wt_levels = to_ntuple(num_stages)(wt_levels)
        norm_2d, norm_cl = _get_norm_layers(norm_layer, conv_mlp, norm_eps)

        self.num_classes = num_classes
        self.in_chans = in_chans
        self.drop_rate = drop_rate
        self.feature_info = []

        if stem_type == "patch":
            self.stem = nn.Sequential(
                nn.Conv2d(in_chans, dims[0], kernel_size=patch_size, stride=patch_size, bias=conv_bias, **dd),
                norm_2d(dims[0], **dd),
            )
            stem_stride = patch_size
        else:
            mid_chs = make_divisible(dims[0] // 2) if "tiered" in stem_type else dims[0]
            self.stem = nn.Sequential(*filter(None, [
                nn.Conv2d(in_chans, mid_chs, kernel_size=3, stride=2, padding=1, bias=conv_bias, **dd),
                get_act_layer(act_layer)() if "act" in stem_type else None,
                nn.Conv2d(mid_chs, dims[0], kernel_size=3, stride=2, padding=1, bias=conv_bias, **dd),
                norm_2d(dims[0], **dd),
            ]))
            stem_stride = 4
        # Stochastic depth grows linearly over all blocks, split per stage (as timm's ConvNeXt).
        dp_rates = torch.linspace(0, drop_path_rate, sum(depths), device="cpu").split(list(depths))
        stages = []
        prev_chs, curr_stride = dims[0], stem_stride
        for i in range(num_stages):
            stride = 2 if curr_stride == 2 or i > 0 else 1  # a stride-2 stem leaves the first downsample to stage 0
            if curr_stride * stride > output_stride:
                stride = 1
            curr_stride *= stride
            stages.append(WTConvNeXtStage(
                prev_chs,
                dims[i],
                stride=stride,
                depth=depths[i],
                drop_path_rates=dp_rates[i].tolist(),
                norm_layer=norm_2d,
                norm_layer_cl=norm_cl,
                conv_bias=conv_bias,
                kernel_size=kernel_sizes[i],
                wt_levels=wt_levels[i],
                mlp_ratio=mlp_ratio,
                conv_mlp=conv_mlp,
                use_grn=use_grn,
                ls_init_value=ls_init_value,
                act_layer=act_layer,
                wtconv_backend=wtconv_backend,
                **dd,
            ))
            prev_chs = dims[i]
            self.feature_info.append(dict(num_chs=prev_chs, reduction=curr_stride, module=f"stages.{i}"))
        self.stages = nn.Sequential(*stages)
        self.num_features = prev_chs

        if head_norm_first:
            if head_hidden_size:
                raise ValueError("head_hidden_size is only supported with head_norm_first=False")
            self.norm_pre = norm_2d(self.num_features, **dd)
            self.head = ClassifierHead(self.num_features, num_classes, pool_type=global_pool, drop_rate=drop_rate, **dd)
        else:
            # pool -> norm -> fc: the reference (and FB ConvNeXt) ordering, parameters head.norm / head.fc
            self.norm_pre = nn.Identity()
            self.head = NormMlpClassifierHead(
                self.num_features,
                num_classes,
                hidden_size=head_hidden_size,
                pool_type=global_pool,
                drop_rate=drop_rate,
                norm_layer=norm_2d,
                act_layer="gelu",
                **dd,
            )
        # timm <= 1.0.29's ClassifierHead has no num_features (the GPU image runs 1.0.29)
        self.head_hidden_size = getattr(self.head, "num_features", self.num_features)
        named_apply(partial(_init_weights, head_init_scale=head_init_scale), self)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Full names of the WTConv scale parameters, which the reference trains without weight decay."""
        return {n for n, _ in self.named_parameters() if n.endswith((".base_scale", ".wavelet_scale"))}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Regexes grouping parameters by depth (stem, then stage / block), for layer-wise lr decay."""
        return dict(
            stem=r"^stem",
            blocks=r"^stages\.(\d+)" if coarse else [
                (r"^stages\.(\d+)\.downsample", (0,)),  # the downsample joins the first block of its stage
                (r"^stages\.(\d+)\.blocks\.(\d+)", None),
                (r"^norm_pre", (99999,)),
            ],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute every block's activations in the backward pass instead of storing them."""
        for s in self.stages:
            s.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        """The final linear layer."""
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None, reset_other: bool = False) -> None:
        """Replace the classifier, sized for the current features (``num_features``, which pruning changes).

        Args:
            num_classes: new number of classes (0: no classifier, the head returns pooled features).
            global_pool: new pooling type, None keeps the current one.
            reset_other: also drop the head's norm and pre-logits layers.
        """
        dd = get_device_dtype(self)
        self.num_classes = num_classes
        head, params = self.head, inspect.signature(self.head.reset).parameters
        kwargs: dict[str, Any] = dict(dd)
        # timm's heads learnt reset_other and in_features over 1.0.x (1.0.29, the GPU image's, has neither): pass
        # them where the head takes them, else do what newer timm does, before the head builds its new classifier.
        if "reset_other" in params:
            kwargs["reset_other"] = reset_other
        elif reset_other and isinstance(head, NormMlpClassifierHead):
            head.norm = nn.Identity().train(head.training)
            head.pre_logits = nn.Identity().train(head.training)
            head.hidden_size = None
            head.num_features = head.in_features
        if "in_features" in params:
            kwargs["in_features"] = self.num_features
        elif self.num_features != head.in_features:
            if isinstance(head, NormMlpClassifierHead):
                if not isinstance(head.norm, nn.Identity):
                    raise ValueError("the head's input width can only change with its norm removed (reset_other)")
                if not head.hidden_size:
                    head.num_features = self.num_features
            head.in_features = self.num_features
        head.reset(num_classes, global_pool, **kwargs)
        # timm <= 1.0.29's ClassifierHead (head_norm_first) has no num_features: its features are its input's.
        self.head_hidden_size = getattr(head, "num_features", self.num_features)

    def forward_intermediates(
        self,
        x: Tensor,
        indices: Optional[Union[int, list[int]]] = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> Union[list[Tensor], tuple[Tensor, list[Tensor]]]:
        """Forward features, also returning the outputs of selected stages.

        Args:
            x: (B, C, H, W) images.
            indices: last n stages if an int, all if None, else the stage indices to return (negative from end).
            norm: apply ``norm_pre`` to the last stage's output if it is returned.
            stop_early: stop after the last requested stage.
            output_fmt: only ``'NCHW'``.
            intermediates_only: return only the intermediates.

        Returns:
            The intermediates, or (final features, intermediates).
        """
        if output_fmt != "NCHW":
            raise ValueError(f"output_fmt must be 'NCHW', got {output_fmt!r}")
        intermediates = []
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        last_idx = len(self.stages) - 1
        stages = self.stages if torch.jit.is_scripting() or not stop_early else self.stages[: max_index + 1]

        x = self.stem(x)
        feat_idx = -1
        for feat_idx, stage in enumerate(stages):
            x = stage(x)
            if feat_idx in take_indices:
                intermediates.append(self.norm_pre(x) if norm and feat_idx == last_idx else x)
        if intermediates_only:
            return intermediates
        if feat_idx == last_idx:
            x = self.norm_pre(x)
        return x, intermediates

    def prune_intermediate_layers(
        self,
        indices: Union[int, list[int]] = 1,
        prune_norm: bool = False,
        prune_head: bool = True,
    ) -> list[int]:
        """Drop the stages (and head / final norm) not needed to produce the given intermediates.

        Args:
            indices: stages to keep producing, as in :meth:`forward_intermediates`.
            prune_norm: drop ``norm_pre``.
            prune_head: drop the classifier (always done when trailing stages are dropped).

        Returns:
            The absolute indices of the kept intermediates.
        """
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
        prune_end = max_index < len(self.stages) - 1
        if prune_norm or prune_end:
            self.norm_pre = nn.Identity()  # sized for the last stage only
        self.stages = self.stages[: max_index + 1]
        if prune_end:
            self.num_features = self.head_hidden_size = self.feature_info[max_index]["num_chs"]
        if prune_head or prune_end:
            self.reset_classifier(0, "", reset_other=True)
        return take_indices

    def forward_features(self, x: Tensor) -> Tensor:
        """Stem, stages and ``norm_pre``: (B, in_chans, H, W) -> (B, num_features, H/32, W/32)."""
        x = self.stem(x)
        x = self.stages(x)
        return self.norm_pre(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Pool, norm and classify features; ``pre_logits`` stops before the final linear layer."""
        return self.head(x, pre_logits=True) if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


def _init_weights(module: nn.Module, name: Optional[str] = None, head_init_scale: float = 1.0) -> None:
    """Reference init: trunc_normal(.02) on every conv / linear weight (WTConv's inner convs too), zero biases.

    The WTConv scales keep the layer's own init (1.0 base, 0.1 per level), as in the reference, where they are not
    convolutions.
    """
    if isinstance(module, WTConv2d):
        trunc_normal_(module.weight, std=0.02)
        trunc_normal_(module.wavelet_weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Conv2d):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
        if name and "head." in name:
            module.weight.data.mul_(head_init_scale)
            if module.bias is not None:
                module.bias.data.mul_(head_init_scale)


_WRAPPER_KEYS_EMA = ("state_dict_ema", "model_ema")
_WRAPPER_KEYS = ("state_dict", "model")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")
# Last key component of a WTConv parameter in the reference or fused-backend layouts (never in the native one).
_FOREIGN_WTCONV_PARTS = ("base_conv", "wavelet_convs", "wt_weights", "wt_scales", "base_weight", "base_bias")


def unwrap_checkpoint(obj: Any, prefer_ema: bool = True) -> dict[str, Tensor]:
    """Get the model state dict out of a loaded checkpoint.

    Unwraps timm-saver / DeiT-style wrappers (``state_dict_ema`` / ``model_ema`` first when ``prefer_ema``, then
    ``state_dict`` / ``model``; falling back to the EMA weights when they are all there is), takes the state dict
    of a pickled ``nn.Module``, strips the ``module.`` (DDP) and ``_orig_mod.`` (torch.compile) prefixes in any
    order, and drops non-tensor entries.

    Args:
        obj: what ``torch.load`` returned: a flat state dict, a wrapper dict, or a module.
        prefer_ema: take the EMA weights when both they and the raw weights are present.

    Returns:
        A flat ``{name: tensor}`` dict (a new dict; the tensors are not copied).

    Raises:
        TypeError: if no mapping of tensors can be found.
    """
    order = _WRAPPER_KEYS_EMA + _WRAPPER_KEYS if prefer_ema else _WRAPPER_KEYS + _WRAPPER_KEYS_EMA
    for _ in range(4):  # wrappers nest at most a couple of levels (e.g. {'model': module})
        if isinstance(obj, nn.Module):
            obj = obj.state_dict()
        if not isinstance(obj, Mapping):
            break
        inner = next((obj[k] for k in order if isinstance(obj.get(k), (Mapping, nn.Module))), None)
        if inner is None:
            break
        obj = inner
    if not isinstance(obj, Mapping):
        raise TypeError(f"expected a state dict or a checkpoint dict wrapping one, got {type(obj).__name__}")
    out: dict[str, Tensor] = {}
    for key, value in obj.items():
        if not isinstance(value, Tensor):
            continue
        while key.startswith(_WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


def _is_foreign_wtconv_key(key: str, value: Tensor) -> bool:
    """True for a WTConv key in the reference or fused-backend layout."""
    parts = key.split(".")
    if parts[-1] in REFERENCE_ONLY_KEYS or any(p in _FOREIGN_WTCONV_PARTS for p in parts):
        return True
    if "wavelet_scale" in parts[:-1] or (len(parts) > 1 and parts[-2] == "base_scale"):
        return True  # reference ``wavelet_scale.{i}.weight`` / ``base_scale.weight``
    return parts[-1] == "base_scale" and value.dim() == 4  # fused layout: (1, C, 1, 1) under the native name


def checkpoint_filter_fn(state_dict: Mapping[str, Any], model: nn.Module) -> dict[str, Tensor]:
    """Turn any supported checkpoint into a state dict of this model.

    Handles wrapper dicts and DDP / torch.compile prefixes (:func:`unwrap_checkpoint`, EMA preferred), the
    reference and fused-backend WTConv layouts (:func:`~wtconvnext.layers.remap_reference_state_dict`), and
    folded checkpoints: a WTConv layer present without its ``base_scale`` / ``wavelet_scale`` gets scales of
    ones (the scales were multiplied into the weights). Other keys pass unchanged, so strict loading still
    reports anything missing or unexpected.

    Args:
        state_dict: a loaded checkpoint (flat or wrapped).
        model: the model to load into (shapes of filled-in scales come from it).

    Returns:
        A flat state dict in this model's layout.
    """
    sd = unwrap_checkpoint(state_dict)
    if any(_is_foreign_wtconv_key(k, v) for k, v in sd.items()):
        sd = remap_reference_state_dict(sd)
    for name, module in model.named_modules():
        if not isinstance(module, WTConv2d):
            continue
        prefix = f"{name}." if name else ""
        weight = sd.get(prefix + "weight")
        if weight is None:
            continue  # layer absent from the checkpoint: leave it for strict loading to report
        for attr in ("base_scale", "wavelet_scale"):
            if prefix + attr not in sd:
                sd[prefix + attr] = torch.ones(getattr(module, attr).shape, dtype=weight.dtype, device=weight.device)
    return sd


def _create_wtconvnext(variant: str, pretrained: bool = False, **kwargs: Any) -> WTConvNeXt:
    return build_model_with_cfg(
        WTConvNeXt,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=(0, 1, 2, 3), flatten_sequential=True),
        **kwargs,
    )


def _cfg(url: str = "", **kwargs: Any) -> dict[str, Any]:
    return {
        "url": url,
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": (7, 7),
        "crop_pct": 0.875,
        "interpolation": "bicubic",
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "stem.0",
        "classifier": "head.fc",
        "paper_name": "Wavelet Convolutions for Large Receptive Fields",
        "origin_url": "https://github.com/BGU-CS-VIL/WTConv",
        **kwargs,
    }


# No weights are hosted: load released / converted checkpoints with
# pretrained=True, pretrained_cfg_overlay=dict(file=...) so that checkpoint_filter_fn runs.
default_cfgs = generate_default_cfgs({
    "wtconvnext_tiny.in1k": _cfg(),
    "wtconvnext_small.in1k": _cfg(),
    "wtconvnext_base.in1k": _cfg(),
    "wtconvnext_atto.untrained": _cfg(),
    "wtconvnext_femto.untrained": _cfg(),
    "wtconvnext_pico.untrained": _cfg(),
    "wtconvnext_nano.untrained": _cfg(),
    "wtconvnext_large.untrained": _cfg(),
    "wtconvnext_xlarge.untrained": _cfg(),
    "test_wtconvnext.untrained": _cfg(input_size=(3, 160, 160), pool_size=(5, 5)),
})


@register_model
def wtconvnext_atto(pretrained: bool = False, **kwargs: Any) -> WTConvNeXt:
    model_args = dict(depths=(2, 2, 6, 2), dims=(40, 80, 160, 320))
    return _create_wtconvnext("wtconvnext_atto", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def wtconvnext_femto(pretrained: bool = False, **kwargs: Any) -> WTConvNeXt:
    model_args = dict(depths=(2, 2, 6, 2), dims=(48, 96, 192, 384))
    return _create_wtconvnext("wtconvnext_femto", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def wtconvnext_pico(pretrained: bool = False, **kwargs: Any) -> WTConvNeXt:
    model_args = dict(depths=(2, 2, 6, 2), dims=(64, 128, 256, 512))
    return _create_wtconvnext("wtconvnext_pico", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def wtconvnext_nano(pretrained: bool = False, **kwargs: Any) -> WTConvNeXt:
    model_args = dict(depths=(2, 2, 8, 2), dims=(80, 160, 320, 640))
    return _create_wtconvnext("wtconvnext_nano", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def wtconvnext_tiny(pretrained: bool = False, **kwargs: Any) -> WTConvNeXt:
    model_args = dict(depths=(3, 3, 9, 3), dims=(96, 192, 384, 768))
    return _create_wtconvnext("wtconvnext_tiny", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def wtconvnext_small(pretrained: bool = False, **kwargs: Any) -> WTConvNeXt:
    model_args = dict(depths=(3, 3, 27, 3), dims=(96, 192, 384, 768))
    return _create_wtconvnext("wtconvnext_small", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def wtconvnext_base(pretrained: bool = False, **kwargs: Any) -> WTConvNeXt:
    model_args = dict(depths=(3, 3, 27, 3), dims=(128, 256, 512, 1024))
    return _create_wtconvnext("wtconvnext_base", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def wtconvnext_large(pretrained: bool = False, **kwargs: Any) -> WTConvNeXt:
    model_args = dict(depths=(3, 3, 27, 3), dims=(192, 384, 768, 1536))
    return _create_wtconvnext("wtconvnext_large", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def wtconvnext_xlarge(pretrained: bool = False, **kwargs: Any) -> WTConvNeXt:
    model_args = dict(depths=(3, 3, 27, 3), dims=(256, 512, 1024, 2048))
    return _create_wtconvnext("wtconvnext_xlarge", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def test_wtconvnext(pretrained: bool = False, **kwargs: Any) -> WTConvNeXt:
    """A tiny model for fast CI."""
    model_args = dict(
        depths=(1, 2, 4, 2), dims=(24, 32, 48, 64), norm_eps=kwargs.pop("norm_eps", 1e-5), act_layer="gelu_tanh"
    )
    return _create_wtconvnext("test_wtconvnext", pretrained=pretrained, **dict(model_args, **kwargs))
