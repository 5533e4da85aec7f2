"""The row-streaming kernel models of issue 14 (``wtconvnext.ops.triton_rows``), not yet wired into the op.

Each model's forward, input gradient (the flipped pass on dy) and unscaled weight correlations against the
float64 reference on an odd, non-square map, so the A/B candidates stay correct until one replaces today's kernels.
"""

from __future__ import annotations

import pytest
import torch

from wtconvnext.ops.reference import wtconv2d_reference

pytestmark = pytest.mark.triton


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("model", ["A", "B", "A2"])
@pytest.mark.parametrize("k,stride", [(5, 1), (3, 2)])
def test_row_models_match_reference(model: str, k: int, stride: int) -> None:
    from wtconvnext.ops import triton_rows as tr
    from wtconvnext.ops.triton_kernels import folded_weights

    dev = _device()
    g = torch.Generator().manual_seed(3)
    b, c, h, w, levels = 2, 5, 11, 10, 2
    x = torch.randn(b, c, h, w, generator=g)
    weight = torch.randn(c, 1, k, k, generator=g) * 0.2
    bias, base_scale = torch.randn(c, generator=g), torch.randn(c, generator=g)
    ww = torch.randn(levels, c, 4, k, k, generator=g) * 0.2
    ws = torch.randn(levels, c, 4, generator=g)
    d = [t.double() for t in (x, weight, bias, base_scale, ww, ws)]
    y_ref = wtconv2d_reference(*d, stride)
    to = [t.to(dev) for t in (x, weight, bias, base_scale, ww, ws)]
    bw, bb, lw = folded_weights(*to[1:])
    if model == "A2":
        y = tr.forward_cols(to[0], bw, bb, lw, stride, bw=4, mid_dtype=torch.float32)
    else:
        y = tr.forward(to[0], bw, bb, lw, stride, from_ll=model == "B")
    torch.testing.assert_close(y.double().cpu(), y_ref, atol=1e-5, rtol=1e-5)
    if stride != 1:
        return
    # Gradients with unit scales: the weight gradients are then the correlations the kernels compute.
    dy = torch.randn(y_ref.shape, generator=g, dtype=torch.float64)
    xr, wr, wwr = (t.clone().requires_grad_() for t in (d[0], d[1], d[4]))
    ones_b, ones_l = torch.ones(c, dtype=torch.float64), torch.ones(levels, c, 4, dtype=torch.float64)
    gx, gw, gww = torch.autograd.grad(wtconv2d_reference(xr, wr, None, ones_b, wwr, ones_l, 1), [xr, wr, wwr], dy)
    bw1, _, lw1 = folded_weights(to[1], None, torch.ones(c, device=dev), to[4], torch.ones(levels, c, 4, device=dev))
    dyf = dy.float().to(dev)
    if model == "A2":
        dx = tr.forward_cols(dyf, bw1, None, lw1, 1, flip=True, bw=4, mid_dtype=torch.float32)
        base, lev = tr.weight_grads_cols(to[0], dyf, levels, k, bw=4, imgs=1)
    else:
        dx = tr.forward(dyf, bw1, None, lw1, 1, flip=True, from_ll=model == "B")
        base, lev = tr.weight_grads(to[0], dyf, levels, k, from_ll=model == "B", imgs=1)
    torch.testing.assert_close(dx.double().cpu(), gx, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(base.double().cpu().reshape(k, k, c).permute(2, 0, 1), gw[:, 0], atol=2e-5, rtol=1e-5)
    for i in range(levels):
        got = lev[i].double().cpu().reshape(4, k, k, c).permute(3, 0, 1, 2)
        torch.testing.assert_close(got, gww[i], atol=2e-5, rtol=1e-5)
