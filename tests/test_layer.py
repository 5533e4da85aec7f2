"""``WTConv2d`` as a module: parameters, init, and loading the reference and fused-backend state dicts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor, nn

from conftest import GOLDEN, GOLDEN_INDEX, rel_err
from wtconvnext import WTConv2d, remap_reference_state_dict

# A golden case with odd sizes and three levels: small, and every mapping rule is exercised.
CASE = next(c for c in GOLDEN_INDEX["layers"] if c["wt_levels"] == 3)


def _golden_case() -> tuple[dict, dict[str, Tensor]]:
    data = load_file(GOLDEN / CASE["file"])
    ref_sd = {k.removeprefix("param."): v for k, v in data.items() if k.startswith("param.")}
    return data, ref_sd


def _golden_layer(**kwargs) -> WTConv2d:
    c = CASE["C"]
    return WTConv2d(
        c, c, kernel_size=CASE["kernel_size"], stride=CASE["stride"], wt_levels=CASE["wt_levels"],
        dtype=torch.float64, **kwargs,
    )


def test_parameter_shapes_and_init() -> None:
    layer = WTConv2d(6, 6, kernel_size=5, wt_levels=3)
    shapes = {k: tuple(v.shape) for k, v in layer.state_dict().items()}
    assert shapes == {
        "weight": (6, 1, 5, 5),
        "bias": (6,),
        "base_scale": (6,),
        "wavelet_weight": (3, 6, 4, 5, 5),
        "wavelet_scale": (3, 6, 4),
    }
    assert all(p.requires_grad for p in layer.parameters())
    assert torch.all(layer.base_scale == 1.0)
    assert torch.all(layer.wavelet_scale == 0.1)
    # nn.Conv2d's default init for a depthwise K x K conv: U(-1/K, 1/K)
    for t in (layer.weight, layer.bias, layer.wavelet_weight):
        assert t.abs().max() <= 1 / 5
        assert t.std() > 0.05  # actually random, not constant
    no_bias = WTConv2d(6, 6, kernel_size=5, wt_levels=3, bias=False)
    assert no_bias.bias is None and "bias" not in no_bias.state_dict()


@pytest.mark.parametrize("h, w, stride", [(9, 9, 1), (9, 9, 2), (10, 7, 3)])
def test_output_shape(h: int, w: int, stride: int) -> None:
    layer = WTConv2d(3, 3, kernel_size=3, stride=stride, wt_levels=2)
    y = layer(torch.randn(2, 3, h, w))
    assert y.shape == (2, 3, -(-h // stride), -(-w // stride))


def test_zero_levels_is_a_scaled_depthwise_conv() -> None:
    layer = WTConv2d(3, 3, kernel_size=5, wt_levels=0)
    with torch.no_grad():
        layer.base_scale.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 11, 8)
    expected = F.conv2d(x, layer.weight, layer.bias, padding=2, groups=3) * layer.base_scale.reshape(1, 3, 1, 1)
    torch.testing.assert_close(layer(x), expected)


@pytest.mark.parametrize("with_filters", [True, False], ids=["with_wt_filter", "without_wt_filter"])
def test_load_reference_layer_state_dict(with_filters: bool) -> None:
    data, ref_sd = _golden_case()
    if not with_filters:
        ref_sd = {k: v for k, v in ref_sd.items() if k not in ("wt_filter", "iwt_filter")}
    layer = _golden_layer()
    result = layer.load_state_dict(ref_sd, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    c, k = CASE["C"], CASE["kernel_size"]
    torch.testing.assert_close(layer.weight, ref_sd["base_conv.weight"], rtol=0, atol=0)
    torch.testing.assert_close(layer.bias, ref_sd["base_conv.bias"], rtol=0, atol=0)
    torch.testing.assert_close(layer.base_scale, ref_sd["base_scale.weight"].reshape(c), rtol=0, atol=0)
    for i in range(CASE["wt_levels"]):
        ref_w, ref_s = ref_sd[f"wavelet_convs.{i}.weight"], ref_sd[f"wavelet_scale.{i}.weight"]
        for ch in range(c):
            for s in range(4):  # reference channel 4c + s is subband s of channel c
                assert torch.equal(layer.wavelet_weight[i, ch, s], ref_w[4 * ch + s, 0])
                assert layer.wavelet_scale[i, ch, s] == ref_s[0, 4 * ch + s, 0, 0]
    with torch.no_grad():
        assert rel_err(layer(data["x"]), data["y"]) <= 1e-10
    assert tuple(layer.wavelet_weight.shape) == (CASE["wt_levels"], c, 4, k, k)


def _fused_layout(ref_sd: dict[str, Tensor], prefix: str = "") -> dict[str, Tensor]:
    """The same parameters under the authors' fused-backend names (no filter tensors)."""
    out = {
        prefix + "base_weight": ref_sd["base_conv.weight"],
        prefix + "base_bias": ref_sd["base_conv.bias"],
        prefix + "base_scale": ref_sd["base_scale.weight"],  # (1, C, 1, 1) in that layout
    }
    for i in range(CASE["wt_levels"]):
        out[f"{prefix}wt_weights.{i}"] = ref_sd[f"wavelet_convs.{i}.weight"]
        out[f"{prefix}wt_scales.{i}"] = ref_sd[f"wavelet_scale.{i}.weight"]
    return out


def test_fused_layout_loads_the_same() -> None:
    _, ref_sd = _golden_case()
    from_ref, from_fused = _golden_layer(), _golden_layer()
    from_ref.load_state_dict(ref_sd)
    from_fused.load_state_dict(_fused_layout(ref_sd))
    for (name, a), (_, b) in zip(from_ref.state_dict().items(), from_fused.state_dict().items()):
        assert torch.equal(a, b), name


def test_reference_layout_inside_a_parent_module() -> None:
    """The remapping also works on a layer nested in a model (what whole-model checkpoints need)."""
    data, ref_sd = _golden_case()
    c = CASE["C"]
    model = nn.Sequential(nn.Identity(), _golden_layer())
    sd = {f"1.{k}": v for k, v in ref_sd.items()}
    model.load_state_dict(sd, strict=True)
    with torch.no_grad():
        assert rel_err(model(data["x"]), data["y"]) <= 1e-10
    # remap_reference_state_dict is the documented mapping: same result, and idempotent on native keys.
    native = remap_reference_state_dict(sd)
    assert set(native) == {"1.weight", "1.bias", "1.base_scale", "1.wavelet_weight", "1.wavelet_scale"}
    assert native["1.base_scale"].shape == (c,)
    again = remap_reference_state_dict(native)
    assert set(again) == set(native) and all(torch.equal(again[k], native[k]) for k in native)


def test_mismatched_reference_state_dict_is_rejected() -> None:
    _, ref_sd = _golden_case()
    fewer_levels = WTConv2d(CASE["C"], CASE["C"], kernel_size=CASE["kernel_size"], wt_levels=CASE["wt_levels"] - 1)
    with pytest.raises(RuntimeError, match="size mismatch for wavelet_weight"):
        fewer_levels.load_state_dict(ref_sd)
    gap = {k: v for k, v in ref_sd.items() if not k.startswith("wavelet_convs.1.")}
    with pytest.raises(ValueError, match="not numbered"):
        remap_reference_state_dict(gap)
