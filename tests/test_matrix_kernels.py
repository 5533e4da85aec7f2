"""The operator-matrix path of small maps (wtconvnext/ops/matrix_kernels.py) against the reference.

Marked ``triton``: on a GPU the layer runs in bf16 at real stage shapes against the float64 reference; without
one, under Triton's interpreter, it runs in float64 (whose products the interpreter computes exactly), with
``MATRIX_DTYPES`` widened to take it, and must then equal the reference to rounding.
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

from wtconvnext.ops import launch_plan  # noqa: E402
from wtconvnext.ops import matrix_kernels as mk  # noqa: E402
from wtconvnext.ops import triton_kernels as tk  # noqa: E402
from wtconvnext.ops import wtconv2d  # noqa: E402
from wtconvnext.ops.reference import wtconv2d_reference  # noqa: E402

pytestmark = pytest.mark.triton

NAMES = ["y", "dx", "dweight", "dbias", "dbase_scale", "dwavelet_weight", "dwavelet_scale"]


def _params(c: int, k: int, levels: int, bias: bool, g: torch.Generator) -> list:
    def r(*shape, lo=-1.0, hi=1.0):
        return torch.rand(*shape, generator=g, dtype=torch.float64) * (hi - lo) + lo

    # Scales far from 1 and of both signs, so a wrongly folded scale shows.
    return [r(c, 1, k, k), r(c) if bias else None, r(c, lo=0.5, hi=2.0) * torch.where(r(c) > 0, 1.0, -1.0),
            r(levels, c, 4, k, k), r(levels, c, 4, lo=-2.0, hi=2.0)]


def _grads(fn, x: torch.Tensor, params: list, dy: torch.Tensor) -> list:
    xi = x.detach().clone().requires_grad_()
    ps = [None if p is None else p.detach().clone().requires_grad_() for p in params]
    y = fn(xi, *ps)
    used = [xi] + [p for p in ps if p is not None]
    return [y, *torch.autograd.grad(y, used, dy, allow_unused=True)]


@pytest.fixture
def matrix_on(monkeypatch):
    """The matrix path on for every batch and map up to 16 x 16, float64 included (the interpreter's exact path);
    counts its forward and backward passes."""
    monkeypatch.setattr(tk, "TUNING", {**tk.TUNING, "matrix_max": 16, "matrix_min_b": 1})
    monkeypatch.setattr(mk, "MATRIX_DTYPES", {*mk.MATRIX_DTYPES, torch.float64})
    calls: list[str] = []
    fwd, bwd = mk.matrix_forward, mk.matrix_input_grad
    monkeypatch.setattr(mk, "matrix_forward", lambda *a: calls.append("forward") or fwd(*a))
    monkeypatch.setattr(mk, "matrix_input_grad", lambda *a: calls.append("backward") or bwd(*a))
    launch_plan.clear()
    yield calls
    launch_plan.clear()


# (B, C, H, W, K, levels, bias): stage 3-4 shapes scaled down, odd and non-square maps, K = 3 / 5 / 7, no levels.
CASES = [(2, 3, 7, 7, 5, 2, True), (2, 5, 14, 14, 5, 3, True), (1, 4, 6, 9, 3, 3, False), (2, 3, 5, 11, 7, 2, True),
         (1, 2, 16, 12, 3, 4, True), (2, 6, 7, 5, 5, 0, False)]


@pytest.mark.skipif(DEVICE != "cpu", reason="float64 products are exact only in the interpreter; the GPU test "
                                            "below checks bf16")
@pytest.mark.parametrize("case", CASES, ids=lambda s: "B{}C{}H{}W{}K{}L{}b{}".format(*s))
def test_matrix_path_is_the_reference_in_float64(case, matrix_on):
    b, c, h, w, k, levels, bias = case
    g = torch.Generator().manual_seed(sum(case))
    params = _params(c, k, levels, bias, g)
    x = torch.randn(b, c, h, w, generator=g, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    dy = torch.randn(b, c, h, w, generator=g, dtype=torch.float64)
    ref = _grads(wtconv2d_reference, x, params, dy)
    got = _grads(lambda *a: wtconv2d(*a, backend="triton"), x, params, dy)
    assert matrix_on == ["forward", "backward"]
    for name, o, r in zip(NAMES, got, ref):
        if r is None:  # (no levels: the wavelet parameters take no gradient)
            continue
        err = ((o - r).abs().max() / r.abs().max()).item()
        assert err < 1e-12, f"{name}: max relative error {err:.2e}"


@pytest.mark.skipif(DEVICE != "cpu", reason="interpreter check of the closed forms")
@pytest.mark.parametrize("h, w, levels, k", [(14, 14, 3, 5), (7, 7, 2, 5), (9, 6, 2, 3), (5, 11, 3, 7)])
def test_build_is_the_references_operator(h, w, levels, k):
    """Every entry of M: the build's closed form from the folded weights against the reference's response to
    one-hot inputs (column q of M_c is the layer's output for a unit impulse at pixel q); the rows' padding past
    H·W is zero."""
    n, c = h * w, 3
    g = torch.Generator().manual_seed(n + k)
    weight, _, base_scale, ww, ws = _params(c, k, levels, False, g)
    base_w, _, level_w = tk.folded_weights(weight, None, base_scale, ww, ws)
    m = mk._build(base_w, level_w, h, w, torch.float64)
    eye = torch.eye(n, dtype=torch.float64).reshape(n, 1, h, w).expand(n, c, h, w)
    cols = wtconv2d_reference(eye, weight, None, base_scale, ww, ws)  # (q, c, p)
    ns = m.shape[-1]
    assert m.shape == (c, ns, ns) and ns % 16 == 0 and ns - 16 < n <= ns
    assert torch.allclose(m[:, :n, :n], cols.reshape(n, c, n).permute(1, 2, 0), rtol=0, atol=1e-13)
    assert not m[:, n:].any() and not m[:, :, n:].any()


@pytest.mark.skipif(DEVICE != "cuda", reason="a GPU test: bf16 tensor-core products at the stage shapes")
@pytest.mark.parametrize("shape", [(128, 384, 14, 14, 3), (128, 768, 7, 7, 2), (32, 96, 16, 16, 2)],
                         ids=["stage3", "stage4", "dense16"])
def test_matrix_path_bf16_on_the_gpu(shape, matrix_on):
    """bf16 through the matrix path against the float64 reference of the same bf16-rounded inputs: within what
    the direct kernels reach (relative norm error of a few 1e-3; the reference run in bf16 is ~3e-3)."""
    b, c, h, w, levels = shape
    g = torch.Generator().manual_seed(1)
    params = [None if p is None else p.to(torch.bfloat16) for p in _params(c, 5, levels, True, g)]
    x = torch.randn(b, c, h, w, generator=g).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    dy = torch.randn(b, c, h, w, generator=g).to(torch.bfloat16)
    ref = _grads(wtconv2d_reference, x.double(), [p.double() for p in params], dy.double())
    dev = [t.cuda() for t in (x, dy)]
    got = _grads(lambda *a: wtconv2d(*a, backend="triton"), dev[0], [p.cuda() for p in params], dev[1])
    assert matrix_on == ["forward", "backward"]
    for name, o, r in zip(NAMES, got, ref):
        err = ((o.double().cpu() - r).norm() / r.norm()).item()
        assert err < 2e-2, f"{name}: relative error {err:.2e}"
    # Deterministic: a second run gives the same bits.
    again = _grads(lambda *a: wtconv2d(*a, backend="triton"), dev[0], [p.cuda() for p in params], dev[1])
    for name, o, a in zip(NAMES, got, again):
        assert torch.equal(o, a), name


def test_inference_keeps_m_while_the_parameters_stay(matrix_on, monkeypatch):
    """Without autograd a layer's M is built once and kept: later calls launch only the product and give the bits
    of the training path's forward; an in-place parameter change (an optimizer step) builds it again; another map
    size builds its own (in its place)."""
    dtype = torch.float64 if DEVICE == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(5)
    params = [p.to(DEVICE, dtype) for p in _params(3, 3, 2, True, g)]
    x = torch.randn(2, 3, 7, 6, generator=g).to(DEVICE, dtype).contiguous(memory_format=torch.channels_last)
    builds = []
    build = mk._build
    monkeypatch.setattr(mk, "_build", lambda *a: builds.append(a[2:4]) or build(*a))
    mk._KEPT.clear()
    with torch.no_grad():
        first = wtconv2d(x, *params, backend="triton")
        again = wtconv2d(x, *params, backend="triton")
        assert len(builds) == 1 and torch.equal(first, again)
        params[3].mul_(0.5)  # in place, as an optimizer step: its version moves
        changed = wtconv2d(x, *params, backend="triton")
        assert len(builds) == 2 and not torch.equal(changed, first)
        other = wtconv2d(x[..., :5], *params, backend="triton")
        assert len(builds) == 3 and builds[-1] == (7, 5)
    # The training path (no cache) gives the same bits.
    trained = wtconv2d(x.requires_grad_(), *params, backend="triton")
    assert torch.equal(trained.detach(), changed)
    assert other.shape[-1] == 5
    mk._KEPT.clear()
