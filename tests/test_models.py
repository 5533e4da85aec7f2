"""The timm model family: golden checkpoints, checkpoint formats, parameter counts and the timm model API.

Cost: every registered model runs forward + backward on the CPU at 1x3x64x64, except wtconvnext_large and
wtconvnext_xlarge (205M / 360M parameters: ~25 s each just to initialise and run on 2 cores), which are checked on
the meta device only (construction, parameter names and counts, feature shapes); their code path is the same as
the smaller variants', only dims differ.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import load_file
from timm.optim import param_groups_layer_decay, param_groups_weight_decay
from torch import Tensor, nn

from conftest import GOLDEN, GOLDEN_INDEX, rel_err
from wtconvnext import WTConv2d, WTConvNeXt, checkpoint_filter_fn, unwrap_checkpoint

GOLDEN_MODEL = GOLDEN_INDEX["models"][0]
REGISTERED = timm.list_models("wtconvnext_*")
META_ONLY = {"wtconvnext_large", "wtconvnext_xlarge"}
RUN_ON_CPU = [n for n in REGISTERED if n not in META_ONLY] + ["test_wtconvnext"]
ALL_MODELS = REGISTERED + ["test_wtconvnext"]
INPUT = (1, 3, 64, 64)


def test_registry() -> None:
    sizes = ("atto", "femto", "pico", "nano", "tiny", "small", "base", "large", "xlarge")
    expected = {f"wtconvnext_{s}" for s in sizes}
    assert set(REGISTERED) == expected
    assert "test_wtconvnext" in timm.list_models("test_wtconvnext")
    cfg = timm.create_model("wtconvnext_tiny", device="meta").pretrained_cfg
    assert cfg["tag"] == "in1k"
    assert (cfg["input_size"], cfg["crop_pct"], cfg["interpolation"]) == ((3, 224, 224), 0.875, "bicubic")
    assert (cfg["first_conv"], cfg["classifier"]) == ("stem.0", "head.fc")
    assert cfg["mean"] == timm.data.IMAGENET_DEFAULT_MEAN and cfg["std"] == timm.data.IMAGENET_DEFAULT_STD


# ----------------------------------------------------------------------------------------------------------------
# Golden checkpoint, in every checkpoint format
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def golden() -> dict:
    io = load_file(GOLDEN / GOLDEN_MODEL["io"])
    raw = torch.load(GOLDEN / GOLDEN_MODEL["checkpoint"], map_location="cpu", weights_only=True)
    return dict(x=io["x"].float(), x64=io["x"], logits=io["logits"], features=io["features"], raw=raw)


def _create_golden_model(path: Path | str, **extra) -> nn.Module:
    return timm.create_model(
        "wtconvnext_tiny",
        pretrained=True,
        pretrained_cfg_overlay=dict(file=str(path), num_classes=GOLDEN_MODEL["kwargs"]["num_classes"]),
        **GOLDEN_MODEL["kwargs"],
        **extra,
    ).eval()


def _check_golden_outputs(model: nn.Module, golden: dict, tol: float = 1e-5) -> None:
    with torch.no_grad():
        features = model.forward_features(golden["x"])
        logits = model.forward_head(features)
    assert rel_err(features, golden["features"]) <= tol
    assert rel_err(logits, golden["logits"]) <= tol


def _fold_reference(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Multiply every WTConv scale into its weights (reference layout) and drop the scale keys."""
    out = dict(sd)
    for key in [k for k in sd if k.endswith("base_scale.weight")]:
        p = key[: -len("base_scale.weight")]
        scale = out.pop(key).reshape(-1)
        out[p + "base_conv.weight"] = sd[p + "base_conv.weight"] * scale.reshape(-1, 1, 1, 1)
        out[p + "base_conv.bias"] = sd[p + "base_conv.bias"] * scale
    for key in [k for k in sd if re.search(r"wavelet_scale\.\d+\.weight$", k)]:
        wkey = key.replace("wavelet_scale", "wavelet_convs")
        out[wkey] = sd[wkey] * out.pop(key).reshape(-1, 1, 1, 1)
    return out


def _fold_native(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Multiply every WTConv scale into its weights (native layout) and drop the scale keys."""
    out = dict(sd)
    for key in [k for k in sd if k.endswith(".base_scale")]:
        p = key[: -len("base_scale")]
        scale = out.pop(key)
        out[p + "weight"] = sd[p + "weight"] * scale.reshape(-1, 1, 1, 1)
        out[p + "bias"] = sd[p + "bias"] * scale
        wscale = out.pop(p + "wavelet_scale")
        out[p + "wavelet_weight"] = sd[p + "wavelet_weight"] * wscale[..., None, None]
    return out


def _fused(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename reference WTConv keys to the authors' fused-backend layout (which has no filter tensors)."""
    out = {}
    for k, v in sd.items():
        if k.endswith(("wt_filter", "iwt_filter")):
            continue
        k = k.replace("base_conv.weight", "base_weight").replace("base_conv.bias", "base_bias")
        k = k.replace("base_scale.weight", "base_scale")
        k = re.sub(r"wavelet_convs\.(\d+)\.weight$", r"wt_weights.\1", k)
        k = re.sub(r"wavelet_scale\.(\d+)\.weight$", r"wt_scales.\1", k)
        out[k] = v
    return out


def _native(golden: dict) -> dict[str, Tensor]:
    model = timm.create_model("wtconvnext_tiny", **GOLDEN_MODEL["kwargs"])
    return checkpoint_filter_fn(golden["raw"], model)


# name -> function of the golden data returning the object to torch.save
CHECKPOINT_FORMATS = {
    "timm_saver_ema": lambda g: g["raw"],
    "state_dict_only": lambda g: {"state_dict": g["raw"]["state_dict"], "epoch": 3},
    "model_wrapper": lambda g: {"model": g["raw"]["state_dict"]},
    "flat": lambda g: g["raw"]["state_dict_ema"],
    "flat_module_prefix": lambda g: {f"module.{k}": v for k, v in g["raw"]["state_dict_ema"].items()},
    "compiled_ddp_prefixes": lambda g: {"state_dict": {f"_orig_mod.module.{k}": v
                                                       for k, v in g["raw"]["state_dict"].items()}},
    "fused_layout": lambda g: _fused(g["raw"]["state_dict_ema"]),
    "native": _native,
    "folded_reference": lambda g: _fold_reference(g["raw"]["state_dict_ema"]),
    "folded_native": lambda g: _fold_native(_native(g)),
}


@pytest.mark.parametrize("fmt", list(CHECKPOINT_FORMATS))
def test_golden_model_through_timm_pretrained(fmt: str, golden: dict, tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pth"
    torch.save(CHECKPOINT_FORMATS[fmt](golden), path)
    model = _create_golden_model(path)
    _check_golden_outputs(model, golden)
    if fmt.startswith("folded"):
        # The scales became ordinary parameters equal to 1, so training can go on from the folded weights.
        for m in model.modules():
            if isinstance(m, WTConv2d):
                assert torch.all(m.base_scale == 1) and torch.all(m.wavelet_scale == 1)
                assert m.base_scale.requires_grad and m.wavelet_scale.requires_grad


@pytest.mark.parametrize("fmt", list(CHECKPOINT_FORMATS))
def test_checkpoint_filter_fn_directly(fmt: str, golden: dict, tmp_path: Path) -> None:
    """The filter alone (as a converter uses it) handles the raw torch.load result, wrappers included."""
    path = tmp_path / "ckpt.pth"
    torch.save(CHECKPOINT_FORMATS[fmt](golden), path)
    model = timm.create_model("wtconvnext_tiny", **GOLDEN_MODEL["kwargs"]).eval()
    sd = checkpoint_filter_fn(torch.load(path, map_location="cpu", weights_only=True), model)
    result = model.load_state_dict(sd, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    _check_golden_outputs(model, golden)


def test_golden_model_float64_is_exact(golden: dict) -> None:
    model = _create_golden_model(GOLDEN / GOLDEN_MODEL["checkpoint"]).double()
    with torch.no_grad():
        logits = model(golden["x64"])
    assert rel_err(logits, golden["logits"]) <= 1e-10


def test_ema_weights_are_preferred(golden: dict, tmp_path: Path) -> None:
    ema = golden["raw"]["state_dict_ema"]
    perturbed = {k: v + 0.5 if v.is_floating_point() else v for k, v in ema.items()}
    ckpt = {"state_dict": perturbed, "state_dict_ema": ema, "epoch": 1}
    assert unwrap_checkpoint(ckpt)["stem.0.weight"] is ema["stem.0.weight"]
    assert unwrap_checkpoint(ckpt, prefer_ema=False)["stem.0.weight"] is perturbed["stem.0.weight"]
    assert unwrap_checkpoint({"state_dict_ema": ema}, prefer_ema=False)["stem.0.weight"] is ema["stem.0.weight"]
    path = tmp_path / "ckpt.pth"
    torch.save(ckpt, path)
    _check_golden_outputs(_create_golden_model(path), golden)


def test_unwrap_checkpoint_rejects_non_mappings() -> None:
    with pytest.raises(TypeError, match="expected a state dict"):
        unwrap_checkpoint([torch.zeros(1)])


def test_missing_layer_is_still_reported(golden: dict) -> None:
    """Scales are filled in only for layers whose weights are present: a missing layer stays missing."""
    sd = {k: v for k, v in golden["raw"]["state_dict_ema"].items() if ".blocks.0.conv_dw." not in k}
    model = timm.create_model("wtconvnext_tiny", **GOLDEN_MODEL["kwargs"])
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*stages\.0\.blocks\.0\.conv_dw\.weight"):
        model.load_state_dict(checkpoint_filter_fn(sd, model), strict=True)


@pytest.mark.parametrize("name", ["wtconvnext_tiny", "wtconvnext_small", "wtconvnext_base"])
def test_reference_keys_map_onto_the_model(name: str) -> None:
    """The released checkpoints' keys and shapes (reference_state_dict_keys.json) fit the model exactly."""
    shapes = json.loads((GOLDEN / "reference_state_dict_keys.json").read_text())[name]
    fake = {k: torch.empty(s, device="meta") for k, s in shapes.items()}
    model = timm.create_model(name, device="meta")
    mapped = checkpoint_filter_fn(fake, model)
    ours = model.state_dict()
    assert set(mapped) == set(ours)
    assert all(mapped[k].shape == ours[k].shape for k in ours)


@pytest.mark.parametrize(
    "name, count", [("wtconvnext_tiny", 30_383_656), ("wtconvnext_small", 54_015_784), ("wtconvnext_base", 93_647_592)]
)
def test_parameter_count(name: str, count: int) -> None:
    model = timm.create_model(name, device="meta")
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == count


# ----------------------------------------------------------------------------------------------------------------
# Every registered model
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", RUN_ON_CPU)
def test_forward_backward(name: str) -> None:
    model = timm.create_model(name).train()
    x = torch.randn(INPUT)
    out = model(x)
    assert out.shape == (1, model.num_classes)
    assert torch.isfinite(out).all()
    out.sum().backward()
    grads = {}
    for n, p in model.named_parameters():
        assert p.grad is not None, f"{n} got no gradient"
        assert torch.isfinite(p.grad).all(), n
        assert p.grad.abs().sum() > 0, f"{n} has an all-zero gradient"
        grads[n] = p.grad.clone()

    # Gradient checkpointing recomputes the same thing.
    model.zero_grad()
    model.set_grad_checkpointing(True)
    out_ckpt = model(x)
    out_ckpt.sum().backward()
    torch.testing.assert_close(out_ckpt, out)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-7, msg=n)
    model.set_grad_checkpointing(False)

    # forward_intermediates ends with forward_features, and its intermediates are the stage outputs.
    model.eval()
    with torch.no_grad():
        final, inter = model.forward_intermediates(x)
        torch.testing.assert_close(final, model.forward_features(x))
        assert [t.shape[1] for t in inter] == [f["num_chs"] for f in model.feature_info]
        assert [x.shape[-1] // t.shape[-1] for t in inter] == [f["reduction"] for f in model.feature_info]
        torch.testing.assert_close(inter[-1], final)
        pre = model.forward_head(final, pre_logits=True)
        assert pre.shape == (1, model.num_features)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_features_only_on_meta(name: str) -> None:
    model = timm.create_model(name, features_only=True, device="meta")
    base = timm.create_model(name, device="meta")
    dims = [f["num_chs"] for f in base.feature_info]
    assert model.feature_info.reduction() == [4, 8, 16, 32]
    assert model.feature_info.channels() == dims
    outs = model(torch.empty(2, 3, 64, 96, device="meta"))
    assert [tuple(o.shape) for o in outs] == [(2, c, 64 // r, 96 // r) for c, r in zip(dims, (4, 8, 16, 32))]


@pytest.mark.parametrize("name", ALL_MODELS)
def test_no_weight_decay_and_layer_decay_groups(name: str) -> None:
    model = timm.create_model(name, device="meta")
    nwd = model.no_weight_decay()
    expected = {n for n, _ in model.named_parameters() if n.endswith(("conv_dw.base_scale", "conv_dw.wavelet_scale"))}
    assert nwd == expected
    assert len(nwd) == 2 * sum(len(s.blocks) for s in model.stages)

    # timm's default optimizer grouping (no layer decay)
    plain = param_groups_weight_decay(model, weight_decay=0.05, no_weight_decay_list=nwd)
    no_decay = {id(p) for g in plain if g["weight_decay"] == 0.0 for p in g["params"]}
    assert all(id(p) in no_decay for n, p in model.named_parameters() if n in nwd)

    groups = param_groups_layer_decay(model, weight_decay=0.05, no_weight_decay_list=nwd, layer_decay=0.8)
    wd_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    scale_of = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    params = dict(model.named_parameters())
    assert len(wd_of) == len(params)  # every parameter in exactly one group
    for n in nwd:  # wavelet_scale is 3-D: only the explicit list keeps it out of weight decay
        assert wd_of[id(params[n])] == 0.0
    assert wd_of[id(params["stages.0.blocks.0.conv_dw.wavelet_weight"])] == 0.05
    # stem, then one layer per block (a downsample joins its stage's first block), then the head
    num_blocks = sum(len(s.blocks) for s in model.stages)
    assert len(set(scale_of.values())) == num_blocks + 2
    assert scale_of[id(params["stem.0.weight"])] == pytest.approx(0.8 ** (num_blocks + 1))
    assert scale_of[id(params["stages.1.downsample.1.weight"])] == scale_of[id(params["stages.1.blocks.0.gamma"])]
    assert scale_of[id(params["head.fc.weight"])] == 1.0


# ----------------------------------------------------------------------------------------------------------------
# The rest of the timm API, on the small test model
# ----------------------------------------------------------------------------------------------------------------


def test_features_only_real_and_output_stride() -> None:
    x = torch.randn(2, 3, 64, 64)
    model = timm.create_model("test_wtconvnext", features_only=True, out_indices=(1, 3)).eval()
    outs = model(x)
    assert [tuple(o.shape) for o in outs] == [(2, 32, 8, 8), (2, 64, 2, 2)]
    full = timm.create_model("test_wtconvnext").eval()
    # flatten_sequential names the feature model's modules stem_0, stages_1, ...; it has no head.
    result = full.load_state_dict(
        {re.sub(r"^(stem|stages)_(\d+)", r"\1.\2", k): v for k, v in model.state_dict().items()}, strict=False
    )
    assert not result.unexpected_keys and all(k.startswith("head.") for k in result.missing_keys)
    with torch.no_grad():
        inter = full.forward_intermediates(x, indices=(1, 3), intermediates_only=True)
    for a, b in zip(outs, inter):
        torch.testing.assert_close(a, b)

    os16 = timm.create_model("test_wtconvnext", features_only=True, output_stride=16)
    assert os16.feature_info.reduction() == [4, 8, 16, 16]
    assert [tuple(o.shape) for o in os16(x)] == [(2, 24, 16, 16), (2, 32, 8, 8), (2, 48, 4, 4), (2, 64, 4, 4)]
    os8 = timm.create_model("test_wtconvnext", output_stride=8)
    assert [f["reduction"] for f in os8.feature_info] == [4, 8, 8, 8]
    assert os8.forward_features(x).shape == (2, 64, 8, 8)
    with pytest.raises(ValueError, match="output_stride"):
        timm.create_model("test_wtconvnext", output_stride=4)


def test_features_fx_matches_hooks() -> None:
    """timm's FX feature extraction traces the model with WTConv2d as a leaf and returns the same maps."""
    x = torch.randn(2, 3, 64, 64)
    torch.manual_seed(0)
    fx = timm.create_model("test_wtconvnext", features_only=True, feature_cls="fx").eval()
    torch.manual_seed(0)
    hooks = timm.create_model("test_wtconvnext", features_only=True).eval()
    assert type(fx).__name__ == "FeatureGraphNet"
    leaves = [n for n in fx.graph_module.graph.nodes if n.op == "call_module" and n.target.endswith("conv_dw")]
    assert len(leaves) == sum(len(s.blocks) for s in timm.create_model("test_wtconvnext").stages)
    with torch.no_grad():
        a, b = fx(x), hooks(x)
    assert len(a) == len(b) == 4
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q)


def test_torch_export() -> None:
    model = timm.create_model("test_wtconvnext").eval()
    x = torch.randn(2, 3, 64, 64)
    ep = torch.export.export(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), model(x), rtol=0, atol=0)


def test_forward_intermediates_options() -> None:
    model = timm.create_model("test_wtconvnext").eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        _, every = model.forward_intermediates(x)
        last2 = model.forward_intermediates(x, indices=2, intermediates_only=True)
        early = model.forward_intermediates(x, indices=[0, -3], stop_early=True, intermediates_only=True)
        final, _ = model.forward_intermediates(x, indices=[0], stop_early=True)
    assert len(every) == 4
    for a, b in zip(last2, every[2:]):
        torch.testing.assert_close(a, b)
    for a, b in zip(early, every[:2]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(final, every[0])  # stopped after stage 0
    with pytest.raises(ValueError, match="output_fmt"):
        model.forward_intermediates(x, output_fmt="NHWC")


def test_prune_intermediate_layers() -> None:
    model = timm.create_model("test_wtconvnext").eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = model.forward_intermediates(x, indices=[1], intermediates_only=True)[0]
    assert model.prune_intermediate_layers(indices=[1]) == [1]
    assert len(model.stages) == 2 and model.num_features == 32
    assert isinstance(model.get_classifier(), nn.Identity)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_intermediates(x, indices=[1], intermediates_only=True)[0], expected)
        assert model(x).shape == (1, 32, 8, 8)  # head reset to no pooling, no classifier (as timm's ConvNeXt)


def test_reset_classifier_and_heads() -> None:
    model = timm.create_model("test_wtconvnext", num_classes=5).eval()
    x = torch.randn(2, 3, 64, 64)
    assert model(x).shape == (2, 5)
    model.reset_classifier(7)
    assert model.get_classifier().out_features == 7 and model.num_classes == 7
    assert model(x).shape == (2, 7)
    model.reset_classifier(0)
    assert model(x).shape == (2, model.num_features)
    model.reset_classifier(0, global_pool="")
    assert model(x).shape == (2, model.num_features, 2, 2)

    norm_first = timm.create_model("test_wtconvnext", num_classes=3, head_norm_first=True).eval()
    assert not isinstance(norm_first.norm_pre, nn.Identity)
    assert norm_first(x).shape == (2, 3)
    hidden = timm.create_model("test_wtconvnext", num_classes=3, head_hidden_size=40).eval()
    assert hidden.forward_head(hidden.forward_features(x), pre_logits=True).shape == (2, 40)
    assert hidden.head_hidden_size == 40


def test_group_matcher_coarse() -> None:
    model = timm.create_model("test_wtconvnext")
    groups = timm.models.group_parameters(model, model.group_matcher(coarse=True))
    stem = [n for n in groups[0]]
    assert stem and all(n.startswith("stem") for n in stem)
    stage_groups = [g for g in groups.values() if all(n.startswith("stages.") for n in g)]
    assert len(stage_groups) == 4


def test_init() -> None:
    model = timm.create_model("wtconvnext_atto", head_init_scale=0.5, ls_init_value=1e-6)
    dw = [m for m in model.modules() if isinstance(m, WTConv2d)]
    assert len(dw) == 12
    weights = torch.cat([torch.cat([m.weight.flatten(), m.wavelet_weight.flatten()]) for m in dw])
    assert weights.std().item() == pytest.approx(0.02, rel=0.05)
    assert all(torch.all(m.bias == 0) for m in dw)
    assert all(torch.all(m.base_scale == 1.0) and torch.all(m.wavelet_scale == 0.1) for m in dw)
    assert [m.wt_levels for m in dw] == [5] * 2 + [4] * 2 + [3] * 6 + [2] * 2
    assert all(m.kernel_size == 5 for m in dw)
    fc1 = torch.cat([b.mlp.fc1.weight.flatten() for s in model.stages for b in s.blocks])
    assert fc1.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.stem[0].weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert torch.all(model.stem[0].bias == 0)
    assert all(torch.all(b.gamma == 1e-6) for s in model.stages for b in s.blocks)
    assert model.head.fc.weight.std().item() == pytest.approx(0.01, rel=0.05)  # 0.02 * head_init_scale
    assert torch.all(model.head.fc.bias == 0)


def test_constructor_options() -> None:
    model = timm.create_model("test_wtconvnext", drop_path_rate=0.2, wtconv_backend="reference")
    blocks = [b for s in model.stages for b in s.blocks]
    assert isinstance(blocks[0].drop_path, nn.Identity)
    assert blocks[-1].drop_path.drop_prob == pytest.approx(0.2)
    assert all(b.conv_dw.backend == "reference" for b in blocks)
    custom = WTConvNeXt(depths=(1, 1), dims=(8, 16), kernel_sizes=(3, 7), wt_levels=1, num_classes=4,
                        ls_init_value=None, norm_layer="rmsnorm")
    assert [b.conv_dw.kernel_size for s in custom.stages for b in s.blocks] == [3, 7]
    assert all(b.gamma is None for s in custom.stages for b in s.blocks)
    assert custom(torch.randn(1, 3, 32, 32)).shape == (1, 4)
    with pytest.raises(ValueError, match="norm_layer"):
        WTConvNeXt(norm_layer="batchnorm")
    with pytest.raises(ValueError, match="one entry per stage"):
        WTConvNeXt(depths=(1, 1), dims=(8, 16, 32))


# ----------------------------------------------------------------------------------------------------------------
# Head width after pruning, backends checked at creation, timm ConvNeXt's constructor keywords
# ----------------------------------------------------------------------------------------------------------------


def _check_pruned_head(model: nn.Module, tap_chs: int, x: Tensor) -> None:
    model.prune_intermediate_layers([2])
    assert model.num_features == model.head_hidden_size == tap_chs
    # The pruned head pools nothing (as timm's ConvNeXt); a new classifier there takes the stage-2 width: a 1x1 conv
    # over the map in the pool -> norm -> fc head (timm's ClassifierHead, head_norm_first, cannot classify unpooled).
    model.reset_classifier(7)
    fc = model.get_classifier()
    assert (fc.in_features if isinstance(fc, nn.Linear) else fc.in_channels) == tap_chs
    assert model.head_hidden_size == tap_chs
    if isinstance(fc, nn.Conv2d):
        with torch.no_grad():
            assert model(x).shape == (x.shape[0], 7, x.shape[2] // 16, x.shape[3] // 16)
    model.reset_classifier(7, "avg")
    assert model.get_classifier().in_features == tap_chs and model.head_hidden_size == tap_chs
    with torch.no_grad():
        assert model(x).shape == (x.shape[0], 7)
        assert model.forward_head(model.forward_features(x), pre_logits=True).shape == (x.shape[0], tap_chs)
    model.reset_classifier(0)
    with torch.no_grad():
        assert model(x).shape == (x.shape[0], tap_chs)


@pytest.mark.parametrize("kwargs", [{}, dict(head_hidden_size=48), dict(head_norm_first=True)],
                         ids=["norm_mlp_head", "hidden_head", "norm_first_head"])
def test_head_width_after_pruning(kwargs: dict) -> None:
    """prune_intermediate_layers([2]) then reset_classifier(7): the new classifier takes stage 2's width."""
    x = torch.randn(2, 3, 64, 64)
    _check_pruned_head(timm.create_model("test_wtconvnext", **kwargs).eval(), 48, x)


def test_head_width_after_pruning_with_timm_1_0_29_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    """timm 1.0.29's heads (the GPU image's) take neither reset_other nor in_features: the model does both itself."""
    from timm.layers import ClassifierHead, NormMlpClassifierHead

    for cls in (ClassifierHead, NormMlpClassifierHead):
        new_reset = cls.reset

        def old_reset(self, num_classes: int, pool_type=None, device=None, dtype=None, _new=new_reset):
            return _new(self, num_classes, pool_type, device=device, dtype=dtype)  # no reset_other, no in_features

        monkeypatch.setattr(cls, "reset", old_reset)
    x = torch.randn(2, 3, 64, 64)
    for kwargs in ({}, dict(head_norm_first=True)):
        model = timm.create_model("test_wtconvnext", **kwargs).eval()
        assert "in_features" not in inspect.signature(model.head.reset).parameters
        _check_pruned_head(model, 48, x)


def test_bogus_backend_fails_at_creation() -> None:
    with pytest.raises(ValueError, match=r"wtconv_backend must be one of \('auto', 'triton', 'reference'\)"):
        timm.create_model("test_wtconvnext", wtconv_backend="bogus")
    with pytest.raises(ValueError, match="backend must be one of"):
        WTConv2d(4, 4, backend="cudnn")
    model = timm.create_model("test_wtconvnext", wtconv_backend="Reference")  # case-insensitive, as the variable
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 1000)


def test_every_timm_convnext_keyword_is_accepted() -> None:
    """The README's claim: every keyword of timm's ConvNeXt constructor is one of WTConvNeXt's."""
    theirs = set(inspect.signature(timm.models.convnext.ConvNeXt.__init__).parameters) - {"self"}
    ours = set(inspect.signature(WTConvNeXt.__init__).parameters) - {"self"}
    assert theirs <= ours, f"timm's ConvNeXt takes {sorted(theirs - ours)}, WTConvNeXt does not"


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(conv_mlp=True),
        dict(use_grn=True),
        dict(use_grn=True, conv_mlp=True),
        dict(stem_type="overlap"),
        dict(stem_type="overlap_tiered"),
        dict(stem_type="overlap_act"),
        dict(patch_size=2),
        dict(norm_layer="simplenorm"),
        dict(norm_layer="rmsnorm2d", conv_mlp=True),
        dict(norm_layer="batchnorm", conv_mlp=True),  # any timm norm with conv_mlp, as timm's ConvNeXt
        dict(in_chans=1, global_pool="max", drop_rate=0.1, norm_eps=1e-5, conv_bias=False, ls_init_value=None),
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_convnext_keywords_build_and_train(kwargs: dict) -> None:
    model = timm.create_model("test_wtconvnext", num_classes=5, **kwargs).train()
    x = torch.randn(2, kwargs.get("in_chans", 3), 64, 64)
    out = model(x)
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    out.sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing
    if "stem_type" in kwargs:
        assert [type(m).__name__ for m in model.stem][0] == "Conv2d" and model.stem[0].stride == (2, 2)
        assert model.feature_info[0]["reduction"] == 4
    if kwargs.get("use_grn"):
        assert all(hasattr(b.mlp, "grn") for s in model.stages for b in s.blocks)


def test_conv_mlp_is_the_same_function() -> None:
    """conv_mlp=True (NCHW, 1x1 convs) computes what the default NHWC block with Linear layers does."""
    torch.manual_seed(0)
    linear = timm.create_model("test_wtconvnext", ls_init_value=0.5).eval()
    conv = timm.create_model("test_wtconvnext", ls_init_value=0.5, conv_mlp=True).eval()
    sd = {k: v.reshape(conv.state_dict()[k].shape) for k, v in linear.state_dict().items()}
    conv.load_state_dict(sd, strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(conv(x), linear(x), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="conv_mlp=True"):
        timm.create_model("test_wtconvnext", norm_layer="batchnorm")
    with pytest.raises(ValueError, match="stem_type"):
        timm.create_model("test_wtconvnext", stem_type="conv7")


@pytest.mark.parametrize("use_grn", [False, True])
def test_block_norm_and_mlp_see_rows(use_grn: bool) -> None:
    """The block's norm and MLP run on the (B, H*W, C) view of the NHWC map: compiled, Inductor lays 4-D tensors of
    a graph with convolutions out channels-last, the norm's saved (B, H, W, 1) statistics included, which made it a
    looped reduction (session 36). GRN needs the spatial dims and keeps (B, H, W, C). Either way the same bits as
    timm's ConvNeXtBlock formulation over (B, H, W, C)."""
    from wtconvnext.models.wtconvnext import WTConvNeXtBlock

    torch.manual_seed(0)
    blk = WTConvNeXtBlock(16, kernel_size=3, wt_levels=2, use_grn=use_grn, ls_init_value=0.5,
                          wtconv_backend="reference")
    seen = []
    blk.norm.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    x = torch.randn(2, 16, 9, 7)
    y = blk(x)
    assert seen == [(2, 9, 7, 16) if use_grn else (2, 63, 16)]
    t = blk.conv_dw(x).permute(0, 2, 3, 1)
    ref = (blk.mlp(blk.norm(t)) * blk.gamma).permute(0, 3, 1, 2) + x
    assert torch.equal(y, ref)


def test_rows_layernorm2d_is_timms_layernorm2d_on_a_view() -> None:
    """The stem's, downsamplings' and head's norm: timm's LayerNorm2d (same parameter names, same bits) over the
    (B, H*W, C) view, for the same reason as the blocks' norms (test_block_norm_and_mlp_see_rows)."""
    from timm.layers import LayerNorm2d

    from wtconvnext.models.wtconvnext import RowsLayerNorm2d

    torch.manual_seed(0)
    ours, timms = RowsLayerNorm2d(24), LayerNorm2d(24)
    with torch.no_grad():
        ours.weight.normal_(), ours.bias.normal_()
    timms.load_state_dict(ours.state_dict())
    for x in (torch.randn(2, 24, 5, 7), torch.randn(2, 24, 5, 7).to(memory_format=torch.channels_last),
              torch.randn(3, 24, 1, 1)):
        assert torch.equal(ours(x), timms(x))
    m = timm.create_model("wtconvnext_atto")
    assert isinstance(m.stem[1], RowsLayerNorm2d) and isinstance(m.stages[1].downsample[0], RowsLayerNorm2d)
