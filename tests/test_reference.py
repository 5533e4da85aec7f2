"""The WTConv math: golden data through ``WTConv2d``, and property tests of the pure-PyTorch reference.

The property tests compare :func:`wtconv2d_reference` with two formulations written here from the spec only:

- ``conv_construction``: the original implementation's construction (the wavelet transform as a stride-2 grouped
  conv with 2x2 Haar filters, per-level zero padding, depthwise convs, scales, the inverse as a grouped
  ``conv_transpose2d``, crop), working on the reference's ``(4C, 1, K, K)`` channel layout;
- ``one_pass``: the closed forms of the spec (analysis of the zero-extended input, synthesis as one sum over levels
  with sign patterns from the bits of h and w).
"""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor

from conftest import GOLDEN, GOLDEN_INDEX, rel_err
from wtconvnext import WTConv2d, wtconv2d, wtconv2d_reference

LAYER_CASES = GOLDEN_INDEX["layers"]
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}

# Haar analysis filters over a 2x2 block [[a, b], [c, d]], subbands s0..s3 (spec table). The transform is
# orthonormal and these matrices are symmetric, so the same filters serve the transposed (synthesis) conv.
HAAR = 0.5 * torch.tensor(
    [
        [[1.0, 1.0], [1.0, 1.0]],  # s0 = (a + b + c + d) / 2
        [[1.0, 1.0], [-1.0, -1.0]],  # s1 = (a + b - c - d) / 2
        [[1.0, -1.0], [1.0, -1.0]],  # s2 = (a - b + c - d) / 2
        [[1.0, -1.0], [-1.0, 1.0]],  # s3 = (a - b - c + d) / 2
    ],
    dtype=torch.float64,
)


# ----------------------------------------------------------------------------------------------------------------
# Golden data through the layer
# ----------------------------------------------------------------------------------------------------------------


def _native_grads_as_reference(layer: WTConv2d) -> dict[str, Tensor]:
    """The layer's parameter gradients, reshaped into the reference's keys and shapes (written out by hand)."""
    c, k = layer.in_channels, layer.kernel_size
    out = {
        "base_conv.weight": layer.weight.grad,
        "base_scale.weight": layer.base_scale.grad.reshape(1, c, 1, 1),
    }
    if layer.bias is not None:
        out["base_conv.bias"] = layer.bias.grad
    for i in range(layer.wt_levels):
        out[f"wavelet_convs.{i}.weight"] = layer.wavelet_weight.grad[i].reshape(4 * c, 1, k, k)
        out[f"wavelet_scale.{i}.weight"] = layer.wavelet_scale.grad[i].reshape(1, 4 * c, 1, 1)
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", LAYER_CASES, ids=[c["file"].removesuffix(".safetensors") for c in LAYER_CASES])
def test_golden_layer(case: dict, dtype: torch.dtype) -> None:
    data = load_file(GOLDEN / case["file"])
    c = case["C"]
    layer = WTConv2d(
        c, c, kernel_size=case["kernel_size"], stride=case["stride"], wt_levels=case["wt_levels"], dtype=dtype
    )
    # The reference-format state dict (constant wt_filter / iwt_filter included) loads strictly.
    layer.load_state_dict({k.removeprefix("param."): v for k, v in data.items() if k.startswith("param.")})
    x = data["x"].to(dtype).requires_grad_(True)
    y = layer(x)
    (y * data["dy"].to(dtype)).sum().backward()

    tol = TOLERANCE[dtype]
    assert y.dtype == dtype
    assert rel_err(y, data["y"]) <= tol
    assert rel_err(x.grad, data["dx"]) <= tol
    grads = _native_grads_as_reference(layer)
    expected = {k.removeprefix("grad."): v for k, v in data.items() if k.startswith("grad.")}
    assert set(grads) == set(expected)
    for key, g in grads.items():
        assert rel_err(g, expected[key]) <= tol, key


# ----------------------------------------------------------------------------------------------------------------
# Independent formulations
# ----------------------------------------------------------------------------------------------------------------


def conv_construction(
    x: Tensor, weight: Tensor, bias: Tensor | None, base_scale: Tensor, wavelet_weight: Tensor,
    wavelet_scale: Tensor, stride: int,
) -> Tensor:
    """WTConv as the original implementation builds it, from convolutions on the (B, 4C, h, w) layout."""
    c, k = x.shape[1], weight.shape[-1]
    levels = wavelet_weight.shape[0]
    filt = HAAR.to(x).repeat(c, 1, 1).unsqueeze(1)  # (4C, 1, 2, 2): channel 4c + s is subband s of channel c
    ll, shapes, filtered = x, [], []
    for i in range(levels):
        shapes.append(ll.shape[-2:])
        ll = F.pad(ll, (0, ll.shape[-1] % 2, 0, ll.shape[-2] % 2))
        coeffs = F.conv2d(ll, filt, stride=2, groups=c)  # (B, 4C, h, w)
        t = F.conv2d(coeffs, wavelet_weight[i].reshape(4 * c, 1, k, k), padding=k // 2, groups=4 * c)
        filtered.append(t * wavelet_scale[i].reshape(1, 4 * c, 1, 1))
        ll = coeffs[:, 0::4]
    acc = None
    for i in reversed(range(levels)):
        t = filtered[i]
        if acc is not None:
            t = t + F.pad(acc.unsqueeze(2), (0, 0, 0, 0, 0, 3)).reshape(t.shape)  # add acc to the LL channels
        acc = F.conv_transpose2d(t, filt, stride=2, groups=c)[..., : shapes[i][0], : shapes[i][1]]
    y = F.conv2d(x, weight, bias, padding=k // 2, groups=c) * base_scale.reshape(1, c, 1, 1)
    if acc is not None:
        y = y + acc
    return y[..., ::stride, ::stride]


def one_pass(
    x: Tensor, weight: Tensor, bias: Tensor | None, base_scale: Tensor, wavelet_weight: Tensor,
    wavelet_scale: Tensor, stride: int,
) -> Tensor:
    """WTConv from the spec's closed forms: zero-extended analysis, one-pass signed synthesis."""
    b, c, h, w = x.shape
    k, levels = weight.shape[-1], wavelet_weight.shape[0]
    y = F.conv2d(x, weight, bias, padding=k // 2, groups=c) * base_scale.reshape(1, c, 1, 1)
    # Padding at every level == zero-extending x once to a multiple of 2^L.
    m = 2**levels
    ll = F.pad(x, (0, -w % m, 0, -h % m))
    rows, cols = torch.arange(h), torch.arange(w)
    for i in range(1, levels + 1):
        hh, ww = ll.shape[-2] // 2, ll.shape[-1] // 2
        blocks = ll.reshape(b, c, hh, 2, ww, 2)
        a, bb = blocks[:, :, :, 0, :, 0], blocks[:, :, :, 0, :, 1]  # top row of each 2x2 block
        cc, d = blocks[:, :, :, 1, :, 0], blocks[:, :, :, 1, :, 1]  # bottom row
        coeffs = 0.5 * torch.stack((a + bb + cc + d, a + bb - cc - d, a - bb + cc - d, a - bb - cc + d), dim=2)
        # The filtered maps are only read where the unextended map has pixels, so cropping to ceil(H / 2^i)
        # first reproduces the per-level 'same' zero padding exactly.
        hi, wi = math.ceil(h / 2**i), math.ceil(w / 2**i)
        cropped = coeffs[..., :hi, :wi].reshape(b, 4 * c, hi, wi)
        t = F.conv2d(cropped, wavelet_weight[i - 1].reshape(4 * c, 1, k, k), padding=k // 2, groups=4 * c)
        t = (t * wavelet_scale[i - 1].reshape(1, 4 * c, 1, 1)).reshape(b, c, 4, hi, wi)
        t = t[:, :, :, rows >> i][..., cols >> i]  # (B, C, 4, H, W): t_i[h >> i, w >> i]
        sh = (1 - 2 * ((rows >> (i - 1)) & 1)).to(x).reshape(h, 1)
        sw = (1 - 2 * ((cols >> (i - 1)) & 1)).to(x).reshape(1, w)
        y = y + 2.0**-i * (t[:, :, 0] + sh * t[:, :, 1] + sw * t[:, :, 2] + sh * sw * t[:, :, 3])
        ll = coeffs[:, :, 0]
    return y[..., ::stride, ::stride]


def _random_case(i: int) -> dict:
    """Case i of the property tests: every K, level count, stride and bias setting is covered."""
    rng = random.Random(1000 + i)
    return dict(
        b=rng.randint(1, 2),
        c=rng.randint(1, 4),
        h=rng.randint(1, 23),
        w=rng.randint(1, 23),
        k=(1, 3, 5, 7)[i % 4],
        levels=i % 7,  # 0..6: often more levels than the map can halve
        stride=1 + i % 3,
        bias=i % 2 == 0,
    )


PROPERTY_CASES = [_random_case(i) for i in range(28)]


def _case_id(p: dict) -> str:
    return f"B{p['b']}C{p['c']}H{p['h']}W{p['w']}K{p['k']}L{p['levels']}s{p['stride']}{'b' if p['bias'] else ''}"


def _random_params(p: dict, dtype: torch.dtype = torch.float64) -> tuple[Tensor, list[Tensor | None]]:
    c, k, lv = p["c"], p["k"], p["levels"]
    x = torch.randn(p["b"], c, p["h"], p["w"], dtype=dtype)
    params = [
        torch.randn(c, 1, k, k, dtype=dtype),
        torch.randn(c, dtype=dtype) if p["bias"] else None,
        torch.rand(c, dtype=dtype) + 0.5,
        torch.randn(lv, c, 4, k, k, dtype=dtype),
        torch.rand(lv, c, 4, dtype=dtype) + 0.05,
    ]
    return x, params


GRAD_NAMES = ("weight", "bias", "base_scale", "wavelet_weight", "wavelet_scale")


def _forward_and_grads(fn, x: Tensor, params: list[Tensor | None], dy: Tensor, stride: int) -> dict[str, Tensor | None]:
    x = x.clone().requires_grad_(True)
    ps = [p.clone().requires_grad_(True) if p is not None else None for p in params]
    y = fn(x, *ps, stride)
    (y * dy).sum().backward()
    out = {"y": y.detach(), "dx": x.grad}
    out.update({name: p.grad for name, p in zip(GRAD_NAMES, ps) if p is not None})
    return out


@pytest.mark.parametrize("formulation", [conv_construction, one_pass], ids=["conv_construction", "one_pass"])
@pytest.mark.parametrize("p", PROPERTY_CASES, ids=_case_id)
def test_reference_matches_independent_formulation(p: dict, formulation) -> None:
    x, params = _random_params(p)
    s = p["stride"]
    out_shape = (p["b"], p["c"], math.ceil(p["h"] / s), math.ceil(p["w"] / s))
    dy = torch.randn(out_shape, dtype=torch.float64)
    ours = _forward_and_grads(wtconv2d_reference, x, params, dy, s)
    theirs = _forward_and_grads(formulation, x, params, dy, s)
    assert ours["y"].shape == out_shape
    assert set(ours) == set(theirs)
    for name, expected in theirs.items():
        if p["levels"] == 0 and name.startswith("wavelet"):
            # No level: the (empty) wavelet parameters take no part in either formulation.
            assert ours[name] is None and expected is None
            continue
        assert rel_err(ours[name], expected) <= 1e-12, name


@pytest.mark.parametrize("p", PROPERTY_CASES[:14], ids=_case_id)
def test_input_gradient_is_a_wtconv_with_rotated_kernels(p: dict) -> None:
    """Spec: dx = the same WTConv applied to dy (zero-upsampled by the stride), kernels rotated 180 deg, no bias."""
    x, (weight, bias, base_scale, wavelet_weight, wavelet_scale) = _random_params(p)
    s = p["stride"]
    x.requires_grad_(True)
    y = wtconv2d_reference(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, s)
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    dy_full = torch.zeros_like(x)
    dy_full[..., ::s, ::s] = dy
    expected = wtconv2d_reference(
        dy_full, weight.flip(-1, -2), None, base_scale, wavelet_weight.flip(-1, -2), wavelet_scale, 1
    )
    assert rel_err(dx, expected) <= 1e-12


def test_float32_close_to_float64() -> None:
    p = dict(b=2, c=3, h=29, w=18, k=5, levels=4, stride=1, bias=True)
    x, params = _random_params(p)
    y64 = wtconv2d_reference(x, *params, 1)
    y32 = wtconv2d_reference(x.float(), *[t.float() for t in params], 1)
    assert y32.dtype == torch.float32
    assert rel_err(y32, y64) <= 1e-5


# ----------------------------------------------------------------------------------------------------------------
# Bad arguments
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(in_channels=4, out_channels=4, kernel_size=4), "odd integer kernel_size"),
        (dict(in_channels=4, out_channels=4, wt_type="db2"), "only the Haar wavelet wt_type='db1'"),
        (dict(in_channels=4, out_channels=8), "in_channels must equal out_channels, got 4 and 8"),
        (dict(in_channels=4, out_channels=4, stride=0), "integer stride >= 1"),
        (dict(in_channels=4, out_channels=4, wt_levels=-1), "wt_levels >= 0"),
    ],
    ids=["even_kernel", "db2", "in_ne_out", "stride0", "negative_levels"],
)
def test_bad_layer_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        WTConv2d(**kwargs)


def test_bad_input_rank() -> None:
    layer = WTConv2d(4, 4, kernel_size=3, wt_levels=1)
    with pytest.raises(ValueError, match=r"expects a 4-D input \(B, C, H, W\), got shape \(4, 8, 8\)"):
        layer(torch.randn(4, 8, 8))


def test_wrong_channel_count() -> None:
    layer = WTConv2d(4, 4, kernel_size=3, wt_levels=1)
    with pytest.raises(ValueError, match=r"input has 3 channels but the base weight has shape \(4, 1, 3, 3\)"):
        layer(torch.randn(1, 3, 8, 8))


def test_bad_functional_shapes_and_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(1, 2, 8, 8)
    w, b, bs = torch.randn(2, 1, 3, 3), torch.randn(2), torch.ones(2)
    ww, ws = torch.randn(2, 2, 4, 3, 3), torch.ones(2, 2, 4)
    with pytest.raises(ValueError, match=r"wavelet_scale has shape \(2, 2\), expected \(2, 2, 4\)"):
        wtconv2d(x, w, b, bs, ww, ws[..., 0])
    with pytest.raises(ValueError, match=r"base_scale has shape \(1, 2, 1, 1\), expected \(2,\)"):
        wtconv2d(x, w, b, bs.reshape(1, 2, 1, 1), ww, ws)
    with pytest.raises(ValueError, match="backend must be one of"):
        wtconv2d(x, w, b, bs, ww, ws, backend="cudnn")
    monkeypatch.setenv("WTCONVNEXT_BACKEND", "nope")
    with pytest.raises(ValueError, match="backend must be one of"):
        wtconv2d(x, w, b, bs, ww, ws)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device (CUDA) to mismatch devices")
def test_mismatched_device() -> None:
    layer = WTConv2d(4, 4, kernel_size=3, wt_levels=1)
    with pytest.raises(ValueError, match="input is on cuda"):
        layer(torch.randn(1, 4, 8, 8, device="cuda"))


def test_triton_backend_on_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    from wtconvnext.ops import wtconv2d

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(1, 2, 8, 8)
    params = (torch.randn(2, 1, 3, 3), None, torch.ones(2), torch.randn(1, 2, 4, 3, 3), torch.ones(1, 2, 4))
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        wtconv2d(x, *params, backend="triton")


def _misfits() -> list:
    """Argument sets of wtconv2d, good (first) and each with one thing wrong."""
    x = torch.randn(2, 4, 8, 8)
    good = dict(x=x, weight=torch.randn(4, 1, 3, 3), bias=torch.randn(4), base_scale=torch.ones(4),
                wavelet_weight=torch.randn(2, 4, 4, 3, 3), wavelet_scale=torch.ones(2, 4, 4), stride=1)
    bad = [dict(x=x[0]), dict(x=x.to(torch.int32)), dict(x=x[:, :3]), dict(weight=torch.randn(4, 1, 2, 2)),
           dict(weight=torch.randn(4, 2, 3, 3)), dict(weight=torch.randn(4, 1, 3, 5)),
           dict(wavelet_weight=torch.randn(2, 4, 4, 5, 5)), dict(wavelet_weight=torch.randn(2, 4, 3, 3, 3)),
           dict(wavelet_weight=torch.randn(4, 4, 3, 3)), dict(wavelet_scale=torch.ones(3, 4, 4)),
           dict(base_scale=torch.ones(1, 4)), dict(bias=torch.randn(3)), dict(stride=0), dict(stride=1.0),
           dict(bias=torch.randn(4, device="meta")), dict(wavelet_scale=torch.ones(2, 4, 4, device="meta"))]
    return [good, *({**good, **b} for b in bad), {**good, "bias": None}, {**good, "stride": 2}]


@pytest.mark.parametrize("i", range(len(_misfits())))
def test_fast_input_check_agrees_with_the_explained_one(i: int) -> None:
    """The per-call check (wtconv._inputs_fit) passes exactly the argument sets that the one-by-one checks pass, so
    its shortcut neither lets a misfit through nor sends a good call down the slow path."""
    from wtconvnext.ops import wtconv as W

    args = _misfits()[i]
    try:
        W._explain_misfit(**args)
        explained = True
    except ValueError:
        explained = False
    assert W._inputs_fit(**args) == explained
    if not explained:
        with pytest.raises(ValueError):
            W.check_wtconv_inputs(**args)
