"""Small maps as one operator matrix per channel, on the tensor cores (issue 14: stages 3-4).

At a fixed map size a WTConv layer is linear in x and shift-varying only through the Haar grid, so each channel's
layer is one (H·W) x (H·W) matrix ``M_c``: ``y_c = M_c x_c (+ bias_c)`` over each image's pixels. At 14 x 14 and
7 x 7 that matrix is small (196² and 49² entries) and the layer becomes batched matrix products, which the tensor
cores run, where the direct kernels run about 58 fp32 FMAs per element on the CUDA cores.

- **Build** (one launch): ``M_c`` from the folded weights (:func:`~.triton_kernels.folded_weights`) in closed form.
  Output pixel p takes input pixel q through base tap q - p (plus K // 2 per axis) where that lies inside the
  kernel, and through level l's subband s where the level-l pixels P = p >> l and Q = q >> l are a tap apart, times
  4^-l and the Haar signs: +1 for LL, -1 for the row high-pass where p's and q's rows differ in bit l - 1, likewise
  the columns, the diagonal their product. Zero padding at every level adds nothing else (the tests check every
  entry against the reference's response to one-hot inputs, odd and non-square maps included). M is kept in the
  input dtype (its entries are short sums of folded weights).
- **Apply** (one launch): ``Y_c = X_c M_cᵀ`` over the channels-last maps in place, four channels per program as
  four 2-D tensor-core products (``tl.dot``; at 64-row tiles Hopper's wgmma), the bias added on the way out. The input
  gradient is the same launch with M transposed: ``dX_c = dY_c M_c``.
- **Backward**: dx is the apply with M transposed (M rebuilt rather than kept from the forward: C·(H·W)² elements,
  29 MB a layer at stage 3); the weight gradients are the direct kernels' (dy's and x's Haar coefficients, then
  their correlations and :func:`~.triton_kernels.param_grads`), which take far fewer multiply-adds than summing
  every term's entries of a dM = dYᵀ X (session 38's version of this path did that: 2.4x slower than the direct
  kernels' layer at 14 x 14 on an H100).

M's rows are padded to a multiple of 16 entries (zeros past H·W) so that the products' loads of M vectorise.
Arithmetic is fp32 (fp64 for fp64 inputs: the tests' exact path).
"""

from __future__ import annotations

import weakref
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import launch_plan as _plan
from . import triton_kernels as _tk  # (TUNING and _launch read through the module: tests swap them)
from .triton_kernels import _cdiv, _compute_dtype, _pow2

__all__ = ["matrix_applies", "matrix_forward", "matrix_input_grad", "cached_forward", "MATRIX_DTYPES"]

# The dtypes the matrix path takes: tensor-core inputs. (fp32 would run tl.dot in TF32; fp32 and fp64 stay on the
# direct kernels, which are exact. The tests add fp64, whose products the interpreter computes exactly.)
MATRIX_DTYPES = {torch.bfloat16, torch.float16}
_MAX_MATRIX_BYTES = 256 << 20  # M of one layer: past this the direct kernels run (no channel groups)
# Inference: each layer's (weak reference to its weight, key, M, folded bias), by id of the weight tensor
# (cached_forward; a WeakKeyDictionary would compare tensors with ==). An entry goes with its weight.
_KEPT: dict[int, tuple] = {}


@triton.jit
def _tap_of(py, px, qy, qx, K: tl.constexpr):
    """(whether q lies within a K x K tap of p, the tap's index ky * K + kx): cross-correlation, 'same' padding."""
    dy = qy - py + K // 2
    dx = qx - px + K // 2
    return (dy >= 0) & (dy < K) & (dx >= 0) & (dx < K), dy * K + dx


@triton.jit
def _matrix_build_kernel(
    bw_ptr,  # (K, K, C) folded base taps
    lw_ptr,  # (L, K, K, 4, C) folded level taps (the synthesis 1/2 included)
    m_ptr,  # (C, NS, NS): M[c, p, q], in the input dtype; zero where p or q >= N
    N, W, NS, C: tl.constexpr, K: tl.constexpr, LEVELS: tl.constexpr, BPQ: tl.constexpr, BC: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """M's entries (p, q) of BPQ consecutive positions of the padded NS x NS square for BC channels, in closed form
    (module docs)."""
    KK: tl.constexpr = K * K
    pq = tl.program_id(0) * BPQ + tl.arange(0, BPQ)
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    p = pq // NS
    q = pq - p * NS
    sm, cm = p < NS, cc < C
    pm = (p < N) & (q < N)
    py, px = p // W, p % W
    qy, qx = q // W, q % W
    ok, tap = _tap_of(py, px, qy, qx, K)
    acc = tl.load(bw_ptr + tap[None, :] * C + cc[:, None], mask=cm[:, None] & (pm & ok)[None, :],
                  other=0.0).to(COMPUTE)
    for lv in tl.static_range(1, LEVELS + 1):
        ok, tap = _tap_of(py >> lv, px >> lv, qy >> lv, qx >> lv, K)
        sy = (1 - 2 * (((py ^ qy) >> (lv - 1)) & 1)).to(COMPUTE)[None, :]
        sx = (1 - 2 * (((px ^ qx) >> (lv - 1)) & 1)).to(COMPUTE)[None, :]
        m2 = cm[:, None] & (pm & ok)[None, :]
        at = lw_ptr + (((lv - 1) * KK + tap[None, :]) * 4) * C + cc[:, None]
        s0 = tl.load(at, mask=m2, other=0.0).to(COMPUTE)
        s1 = tl.load(at + C, mask=m2, other=0.0).to(COMPUTE)
        s2 = tl.load(at + 2 * C, mask=m2, other=0.0).to(COMPUTE)
        s3 = tl.load(at + 3 * C, mask=m2, other=0.0).to(COMPUTE)
        # 4^-l per level, times 2 for the synthesis 1/2 that the folded level taps carry.
        acc += (s0 + sy * s1 + sx * (s2 + sy * s3)) * (2.0 / (1 << (2 * lv)))
    tl.store(m_ptr + cc.to(tl.int64)[:, None] * NS * NS + pq[None, :], acc.to(m_ptr.dtype.element_ty),
             mask=cm[:, None] & sm[None, :])


@triton.jit
def _quarters(t):
    """The four channel slices (channels 0, 1, 2, 3) of an (R, S, 4) tile, each (R, S): two splits of the channel
    axis, no data movement."""
    r: tl.constexpr = t.shape[0]
    s: tl.constexpr = t.shape[1]
    even, odd = tl.split(tl.reshape(t, (r, s, 2, 2)))  # channel 2i + j: j = 0 / 1
    c0, c2 = tl.split(even)
    c1, c3 = tl.split(odd)
    return c0, c1, c2, c3


@triton.jit
def _join4(c0, c1, c2, c3):
    """_quarters' inverse: four (R, S) channel slices as one (R, S, 4) tile."""
    return tl.reshape(tl.join(tl.join(c0, c2), tl.join(c1, c3)), (c0.shape[0], c0.shape[1], 4))


@triton.jit
def _matrix_apply_kernel(
    x_ptr,  # (B, N, C) channels-last maps
    m_ptr,  # (C, NS, NS), zero past N
    b_ptr,  # (C,) the folded bias (HAS_BIAS)
    y_ptr,  # (B, N, C)
    B, N, NS, C: tl.constexpr, TRANS: tl.constexpr, HAS_BIAS: tl.constexpr, BB: tl.constexpr, BN: tl.constexpr,
    BK: tl.constexpr, COMPUTE: tl.constexpr,
):
    """y[b, p, c] = sum_q x[b, q, c] M[c, p, q] (TRANS: M[c, q, p]) (+ bias[c]) for BB images, BN output pixels and
    four channels: the channels split out of one coalesced (BB, BK, 4) load, a 2-D product per channel, joined
    back for one (BB, BN, 4) store."""
    nt = tl.cdiv(N, BN)
    bb = (tl.program_id(0) // nt) * BB + tl.arange(0, BB)
    pp = (tl.program_id(0) % nt) * BN + tl.arange(0, BN)
    cc = tl.program_id(1) * 4 + tl.arange(0, 4)
    bm, pm, cm = bb < B, pp < N, cc < C
    # Four accumulators, each its own zeros (one tensor four times is dropped from the loop carry: PERF.md).
    a0, a1 = tl.zeros((BB, BN), dtype=COMPUTE), tl.zeros((BB, BN), dtype=COMPUTE)
    a2, a3 = tl.zeros((BB, BN), dtype=COMPUTE), tl.zeros((BB, BN), dtype=COMPUTE)
    xrow = bb.to(tl.int64)[:, None, None] * N
    mrow = cc.to(tl.int64)[:, None, None] * NS * NS
    for k0 in range(0, N, BK):
        qq = k0 + tl.arange(0, BK)
        qm = qq < N
        xt = tl.load(x_ptr + (xrow + qq[None, :, None]) * C + cc[None, None, :],
                     mask=bm[:, None, None] & qm[None, :, None] & cm[None, None, :], other=0.0)  # (BB, BK, 4)
        if TRANS:
            at = mrow + qq[None, :, None] * NS + pp[None, None, :]
        else:
            at = mrow + pp[None, None, :] * NS + qq[None, :, None]
        # Masked against the padded square (M is zero past N): NS, a multiple of 16, lets the loads vectorise.
        mt = tl.load(m_ptr + at, mask=cm[:, None, None] & (qq < NS)[None, :, None] & (pp < NS)[None, None, :],
                     other=0.0)  # (4, BK, BN)
        x0, x1, x2, x3 = _quarters(xt)
        m0, m1, m2, m3 = _quarters(tl.permute(mt, (1, 2, 0)))
        a0 = tl.dot(x0, m0, a0)
        a1 = tl.dot(x1, m1, a1)
        a2 = tl.dot(x2, m2, a2)
        a3 = tl.dot(x3, m3, a3)
    out = _join4(a0, a1, a2, a3)
    if HAS_BIAS:
        out += tl.load(b_ptr + cc, mask=cm, other=0.0).to(COMPUTE)[None, None, :]
    tl.store(y_ptr + (xrow + pp[None, :, None]) * C + cc[None, None, :], out.to(y_ptr.dtype.element_ty),
             mask=bm[:, None, None] & pm[None, :, None] & cm[None, None, :])


# ----------------------------------------------------------------------------------------------------------------
# Launchers


def matrix_applies(x: Tensor, levels: int, stride: int) -> bool:
    """Whether a pass over ``x`` (its sizes and dtype) runs as operator-matrix products: stride 1, a tensor-core dtype
    (:data:`MATRIX_DTYPES`), a map of at most ``TUNING["matrix_max"]`` rows and columns (0: never), at least
    ``TUNING["matrix_min_b"]`` images (M's build does not shrink with the batch) and M within 256 MiB."""
    bsz, ch, h, w = x.shape
    n = h * w
    return (stride == 1 and 0 < max(h, w) <= _tk.TUNING["matrix_max"] and bsz >= _tk.TUNING["matrix_min_b"]
            and x.dtype in MATRIX_DTYPES and ch * n * n * x.element_size() <= _MAX_MATRIX_BYTES)


def _row_stride(n: int) -> int:
    """M's row stride: n rounded up to a multiple of 16 elements, so that rows start 32-byte aligned and Triton
    (which specialises integer arguments on divisibility by 16) vectorises the loads along them."""
    return -(-n // 16) * 16


def _build(base_w: Tensor, level_w: Tensor, h: int, w: int, dtype: torch.dtype) -> Tensor:
    ch, k, levels, n = base_w.shape[-1], base_w.shape[0], level_w.shape[0], h * w
    ns = _row_stride(n)
    m = _plan.empty((ch, ns, ns), dtype, base_w.device)
    bc = min(8, _pow2(ch))
    _tk._launch(_matrix_build_kernel, (_cdiv(ns * ns, 256), _cdiv(ch, bc)), (base_w, level_w, m, n, w, ns), 4,
                C=ch, K=k, LEVELS=levels, BPQ=256, BC=bc, COMPUTE=_compute_dtype(base_w.dtype))
    return m


def _apply(x: Tensor, m: Tensor, bias: Optional[Tensor], y: Tensor, trans: bool) -> None:
    bsz, ch, h, w = x.shape
    n, t = h * w, _tk.TUNING["matrix_tile"]
    grid = (_cdiv(bsz, t) * _cdiv(n, t), _cdiv(ch, 4))
    _tk._launch(_matrix_apply_kernel, grid, (x, m, m if bias is None else bias, y, bsz, n, m.shape[-1]), 4,
                C=ch, TRANS=trans, HAS_BIAS=bias is not None, BB=t, BN=t, BK=32, COMPUTE=_compute_dtype(x.dtype))


def matrix_forward(x: Tensor, out: Tensor, base_w: Tensor, base_b: Optional[Tensor], level_w: Tensor) -> Tensor:
    """The stride-1 WTConv of the channels-last ``x`` into ``out`` (same shape) by the operator matrices: build,
    then apply with the folded bias (two launches). Weights from :func:`~.triton_kernels.folded_weights`."""
    _tk._check_cl(x, out)
    m = _build(base_w, level_w, x.shape[2], x.shape[3], x.dtype)
    _apply(x, m, base_b, out, trans=False)
    return out


def matrix_input_grad(dy: Tensor, base_w: Tensor, level_w: Tensor) -> Tensor:
    """dx of a stride-1 pass, dX_c = dY_c M_c, over the channels-last ``dy``: M rebuilt (two launches). The weight
    gradients come from the direct kernels' coefficient correlations (wtconv_triton's backward), which need far
    fewer multiply-adds than a dM = dYᵀ X route (C·B·(H·W)², then every term's sum over its entries)."""
    m = _build(base_w, level_w, dy.shape[2], dy.shape[3], dy.dtype)
    dx = _plan.empty(tuple(dy.shape), dy.dtype, dy.device, torch.channels_last)
    _apply(dy, m, None, dx, trans=True)
    return dx


def cached_forward(x: Tensor, weight: Tensor, bias: Optional[Tensor], base_scale: Tensor, wavelet_weight: Tensor,
                   wavelet_scale: Tensor, round_to: Optional[torch.dtype]) -> Tensor:
    """An inference forward (no autograd) of the channels-last ``x`` from the M its layer keeps: one launch.

    M and the folded bias are made on a layer's first call and kept (by a weak reference to ``weight``) for as long
    as the parameters' versions, the dtypes and the map size stay; an in-place change of any parameter (an
    optimizer step, ``load_state_dict``) makes the next call build them again. A kept M costs C·(H·W)² elements
    (29 MB a WTConvNeXt-T stage-3 layer in bf16; TUNING ``matrix_cache`` 0 keeps none)."""
    params = (weight, bias, base_scale, wavelet_weight, wavelet_scale)
    key = (tuple(None if p is None else (p.data_ptr(), p._version, p.dtype) for p in params), round_to, x.dtype,
           x.shape[2], x.shape[3], x.device)
    hit = _KEPT.get(id(weight))
    if hit is None or hit[0]() is not weight or hit[1] != key:
        base_w, base_b, level_w = _tk.folded_weights(weight, bias, base_scale, wavelet_weight, wavelet_scale,
                                                     round_to)
        if hit is None or hit[0]() is not weight:
            weakref.finalize(weight, _KEPT.pop, id(weight), None)
        hit = (weakref.ref(weight), key, _build(base_w, level_w, x.shape[2], x.shape[3], x.dtype), base_b)
        _KEPT[id(weight)] = hit
    out = torch.empty_like(x, memory_format=torch.channels_last)
    _apply(x, hit[2], hit[3], out, trans=False)
    return out
