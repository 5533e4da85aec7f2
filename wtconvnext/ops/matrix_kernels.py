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
- **Outer product** (one launch): ``dM_c = dY_cᵀ X_c`` summed over the images in a fixed order, and each channel's
  dy sums per pixel (for the bias and base_scale gradients).
- **Term sums** (one launch): the gradient of every folded weight is a fixed-order sum of the dM entries its term
  reaches (the build's closed form read backwards: a program per base tap, or per level and tap with its four
  subbands), written as the partial rows that :func:`~.triton_kernels.param_grads` sums and takes through the
  scale folding, as for the direct kernels.

The backward rebuilds M rather than keeping it from the forward (C·(H·W)² elements: 29 MB a layer at stage 3).
Everything is deterministic (no atomics). Arithmetic is fp32 (fp64 for fp64 inputs: the tests' exact path); dM is
stored in bf16 for 16-bit inputs (fp16's range would not hold a batch's sums).
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
from .triton_kernels import _acc_dtype, _cdiv, _compute_dtype, _pow2, param_grads

__all__ = ["matrix_applies", "matrix_forward", "matrix_backward", "cached_forward", "MATRIX_DTYPES"]

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
    m_ptr,  # (C, N, N): M[c, p, q], in the input dtype
    N, W, C: tl.constexpr, K: tl.constexpr, LEVELS: tl.constexpr, BPQ: tl.constexpr, BC: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """M's entries (p, q) of BPQ consecutive positions for BC channels, in closed form (module docs)."""
    KK: tl.constexpr = K * K
    pq = tl.program_id(0) * BPQ + tl.arange(0, BPQ)
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    pm, cm = pq < N * N, cc < C
    p = pq // N
    q = pq - p * N
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
    tl.store(m_ptr + cc.to(tl.int64)[:, None] * N * N + pq[None, :], acc.to(m_ptr.dtype.element_ty),
             mask=cm[:, None] & pm[None, :])


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
    m_ptr,  # (C, N, N)
    b_ptr,  # (C,) the folded bias (HAS_BIAS)
    y_ptr,  # (B, N, C)
    B, N, C: tl.constexpr, TRANS: tl.constexpr, HAS_BIAS: tl.constexpr, BB: tl.constexpr, BN: tl.constexpr,
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
    mrow = cc.to(tl.int64)[:, None, None] * N * N
    for k0 in range(0, N, BK):
        qq = k0 + tl.arange(0, BK)
        qm = qq < N
        xt = tl.load(x_ptr + (xrow + qq[None, :, None]) * C + cc[None, None, :],
                     mask=bm[:, None, None] & qm[None, :, None] & cm[None, None, :], other=0.0)  # (BB, BK, 4)
        if TRANS:
            at = mrow + qq[None, :, None] * N + pp[None, None, :]
        else:
            at = mrow + pp[None, None, :] * N + qq[None, :, None]
        mt = tl.load(m_ptr + at, mask=cm[:, None, None] & qm[None, :, None] & pm[None, None, :],
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


@triton.jit
def _matrix_outer_kernel(
    dy_ptr, x_ptr,  # (B, N, C) channels-last maps
    dm_ptr,  # (C, N, N): dM[c, p, q] = sum_b dy[b, p, c] x[b, q, c]
    ds_ptr,  # (N, C) fp32: sum_b dy[b, p, c], written by the first column of programs
    B, N, C: tl.constexpr, BP: tl.constexpr, BQ: tl.constexpr, BB: tl.constexpr, COMPUTE: tl.constexpr,
):
    """A BP x BQ block of dM for four channels: the images in blocks of BB, in order (deterministic), a 2-D
    product per channel as in _matrix_apply_kernel."""
    nt = tl.cdiv(N, BQ)
    pp = (tl.program_id(0) // nt) * BP + tl.arange(0, BP)
    qq = (tl.program_id(0) % nt) * BQ + tl.arange(0, BQ)
    cc = tl.program_id(1) * 4 + tl.arange(0, 4)
    pm, qm, cm = pp < N, qq < N, cc < C
    first = tl.program_id(0) % nt == 0
    a0, a1 = tl.zeros((BP, BQ), dtype=COMPUTE), tl.zeros((BP, BQ), dtype=COMPUTE)
    a2, a3 = tl.zeros((BP, BQ), dtype=COMPUTE), tl.zeros((BP, BQ), dtype=COMPUTE)
    dsum = tl.zeros((BP, 4), dtype=COMPUTE)
    for b0 in range(0, B, BB):
        bb = b0 + tl.arange(0, BB)
        bm = bb < B
        row = bb.to(tl.int64)[:, None, None] * N
        dyt = tl.load(dy_ptr + (row + pp[None, :, None]) * C + cc[None, None, :],
                      mask=bm[:, None, None] & pm[None, :, None] & cm[None, None, :], other=0.0)  # (BB, BP, 4)
        xt = tl.load(x_ptr + (row + qq[None, :, None]) * C + cc[None, None, :],
                     mask=bm[:, None, None] & qm[None, :, None] & cm[None, None, :], other=0.0)  # (BB, BQ, 4)
        if first:
            dsum += tl.sum(dyt.to(COMPUTE), axis=0)
        d0, d1, d2, d3 = _quarters(dyt)
        x0, x1, x2, x3 = _quarters(xt)
        a0 = tl.dot(tl.trans(d0), x0, a0)
        a1 = tl.dot(tl.trans(d1), x1, a1)
        a2 = tl.dot(tl.trans(d2), x2, a2)
        a3 = tl.dot(tl.trans(d3), x3, a3)
    out = tl.permute(_join4(a0, a1, a2, a3), (2, 0, 1))  # (4, BP, BQ)
    at = cc.to(tl.int64)[:, None, None] * N * N + pp[None, :, None] * N + qq[None, None, :]
    tl.store(dm_ptr + at, out.to(dm_ptr.dtype.element_ty),
             mask=cm[:, None, None] & pm[None, :, None] & qm[None, None, :])
    if first:
        tl.store(ds_ptr + pp[:, None] * C + cc[None, :], dsum, mask=pm[:, None] & cm[None, :])


@triton.jit
def _matrix_terms_kernel(
    dm_ptr,  # (C, N, N) from _matrix_outer_kernel
    ds_ptr,  # (N, C) fp32 dy sums per pixel
    bpart_ptr,  # (1, TP, C): the base taps' sums, dy's sum in lane K*K (param_grads' partial rows, one row)
    lpart_ptr,  # (L, TP, 4C): level l's row, subband s's channels at s*C
    N, H, W, C: tl.constexpr, K: tl.constexpr, TP: tl.constexpr, BE: tl.constexpr, BC: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """The gradient of every folded weight as the fixed-order sum of the dM entries its term reaches (module docs):
    program (g, t) of axis 0 is base tap t (g = 0) or level g's tap t with its four subbands, for BC channels.
    Base tap o: q = p + o. Level l, tap o: the level-l pixels P and Q = P + o, then every pixel pair of their
    2^l x 2^l blocks (e = (P, i, j)), signed by the bits l - 1 of p and q, times 4^-l."""
    KK: tl.constexpr = K * K
    g = tl.program_id(0) // KK
    t = tl.program_id(0) % KK
    oy = t // K - K // 2
    ox = t % K - K // 2
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    cm = cc < C
    rows = cc.to(tl.int64)[:, None] * N * N
    if g == 0:
        acc = tl.zeros((BC, BE), dtype=COMPUTE)
        for p0 in range(0, N, BE):
            p = p0 + tl.arange(0, BE)
            qy = p // W + oy
            qx = p % W + ox
            ok = (p < N) & (qy >= 0) & (qy < H) & (qx >= 0) & (qx < W)
            acc += tl.load(dm_ptr + rows + (p * N + qy * W + qx)[None, :], mask=cm[:, None] & ok[None, :],
                           other=0.0).to(COMPUTE)
        tl.store(bpart_ptr + t * C + cc, tl.sum(acc, axis=1), mask=cm)
        if t == 0:  # dy's sum over the map, in lane K*K
            dsum = tl.zeros((BC, BE), dtype=COMPUTE)
            for p0 in range(0, N, BE):
                p = p0 + tl.arange(0, BE)
                dsum += tl.load(ds_ptr + p[None, :] * C + cc[:, None], mask=cm[:, None] & (p < N)[None, :],
                                other=0.0).to(COMPUTE)
            tl.store(bpart_ptr + KK * C + cc, tl.sum(dsum, axis=1), mask=cm)
    else:
        s = 1 << g  # the level's block side
        hl = (H + s - 1) >> g
        wl = (W + s - 1) >> g
        any_pair = (oy < hl) & (-oy < hl) & (ox < wl) & (-ox < wl)
        end = tl.where(any_pair, hl * wl * s * s * s * s, 0)
        a0 = tl.zeros((BC, BE), dtype=COMPUTE)
        a1 = tl.zeros((BC, BE), dtype=COMPUTE)
        a2 = tl.zeros((BC, BE), dtype=COMPUTE)
        a3 = tl.zeros((BC, BE), dtype=COMPUTE)
        for e0 in range(0, end, BE):
            e = e0 + tl.arange(0, BE)
            pl = e >> (4 * g)  # the level pixel P
            i = (e >> (2 * g)) & (s * s - 1)  # p within P's block
            j = e & (s * s - 1)  # q within Q's block
            ply, plx = pl // wl, pl % wl
            iy, ix, jy, jx = i >> g, i & (s - 1), j >> g, j & (s - 1)
            py, px = ply * s + iy, plx * s + ix
            qy, qx = (ply + oy) * s + jy, (plx + ox) * s + jx
            ok = ((e < end) & (py < H) & (px < W) & (ply + oy >= 0) & (ply + oy < hl) & (plx + ox >= 0)
                  & (plx + ox < wl) & (qy < H) & (qx < W))
            v = tl.load(dm_ptr + rows + ((py * W + px) * N + qy * W + qx)[None, :], mask=cm[:, None] & ok[None, :],
                        other=0.0).to(COMPUTE)
            sy = (1 - 2 * (((iy ^ jy) >> (g - 1)) & 1)).to(COMPUTE)[None, :]
            sx = (1 - 2 * (((ix ^ jx) >> (g - 1)) & 1)).to(COMPUTE)[None, :]
            a0 += v
            a1 += sy * v
            a2 += sx * v
            a3 += sy * sx * v
        scale = 1.0 / (s * s).to(COMPUTE)
        at = lpart_ptr + ((g - 1) * TP + t) * 4 * C + cc
        tl.store(at, tl.sum(a0, axis=1) * scale, mask=cm)
        tl.store(at + C, tl.sum(a1, axis=1) * scale, mask=cm)
        tl.store(at + 2 * C, tl.sum(a2, axis=1) * scale, mask=cm)
        tl.store(at + 3 * C, tl.sum(a3, axis=1) * scale, mask=cm)


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


def _build(base_w: Tensor, level_w: Tensor, h: int, w: int, dtype: torch.dtype) -> Tensor:
    ch, k, levels, n = base_w.shape[-1], base_w.shape[0], level_w.shape[0], h * w
    m = _plan.empty((ch, n, n), dtype, base_w.device)
    bc = min(8, _pow2(ch))
    _tk._launch(_matrix_build_kernel, (_cdiv(n * n, 256), _cdiv(ch, bc)), (base_w, level_w, m, n, w), 4,
                C=ch, K=k, LEVELS=levels, BPQ=256, BC=bc, COMPUTE=_compute_dtype(base_w.dtype))
    return m


def _apply(x: Tensor, m: Tensor, bias: Optional[Tensor], y: Tensor, trans: bool) -> None:
    bsz, ch, h, w = x.shape
    n, t = h * w, _tk.TUNING["matrix_tile"]
    grid = (_cdiv(bsz, t) * _cdiv(n, t), _cdiv(ch, 4))
    _tk._launch(_matrix_apply_kernel, grid, (x, m, m if bias is None else bias, y, bsz, n), 4,
                C=ch, TRANS=trans, HAS_BIAS=bias is not None, BB=t, BN=t, BK=32, COMPUTE=_compute_dtype(x.dtype))


def matrix_forward(x: Tensor, out: Tensor, base_w: Tensor, base_b: Optional[Tensor], level_w: Tensor) -> Tensor:
    """The stride-1 WTConv of the channels-last ``x`` into ``out`` (same shape) by the operator matrices: build,
    then apply with the folded bias (two launches). Weights from :func:`~.triton_kernels.folded_weights`."""
    _tk._check_cl(x, out)
    m = _build(base_w, level_w, x.shape[2], x.shape[3], x.dtype)
    _apply(x, m, base_b, out, trans=False)
    return out


def matrix_backward(
    dy: Tensor, x: Tensor, weight: Tensor, bias: Optional[Tensor], base_scale: Tensor, wavelet_weight: Tensor,
    wavelet_scale: Tensor, base_w: Tensor, level_w: Tensor, round_to: Optional[torch.dtype],
) -> tuple[Tensor, ...]:
    """(dx, d weight, d bias, d base_scale, d wavelet_weight, d wavelet_scale) of a stride-1 pass over the
    channels-last ``x`` by the operator matrices: M rebuilt, dx = dY M, dM = dYᵀ X, the term sums, then
    :func:`~.triton_kernels.param_grads` (five launches). M is dropped before dM is made."""
    _tk._check_cl(dy, x)
    bsz, ch, h, w = x.shape
    n, k, levels = h * w, weight.shape[-1], wavelet_weight.shape[0]
    compute = _compute_dtype(x.dtype)
    m = _build(base_w, level_w, h, w, x.dtype)
    dx = _plan.empty(tuple(x.shape), x.dtype, x.device, torch.channels_last)
    _apply(dy, m, None, dx, trans=True)
    del m
    t = _tk.TUNING["matrix_tile"]
    dm = _plan.empty((ch, n, n), torch.bfloat16 if x.element_size() == 2 else x.dtype, x.device)
    acc = _acc_dtype(x.dtype)
    ds = _plan.empty((n, ch), acc, x.device)
    _tk._launch(_matrix_outer_kernel, (_cdiv(n, t) * _cdiv(n, t), _cdiv(ch, 4)), (dy, x, dm, ds, bsz, n), 4,
                C=ch, BP=t, BQ=t, BB=32, COMPUTE=compute)
    tp = _pow2(k * k + 1)
    bpart = _plan.empty((1, tp, ch), acc, x.device)
    lpart = _plan.empty((max(levels, 1), tp, 4 * ch), acc, x.device)
    bc = min(8, _pow2(ch))
    _tk._launch(_matrix_terms_kernel, (k * k * (1 + levels), _cdiv(ch, bc)), (dm, ds, bpart, lpart, n, h, w), 4,
                C=ch, K=k, TP=tp, BE=128, BC=bc, COMPUTE=compute)
    del dm, ds
    # One partial row per level: param_grads' rows of an image of this map (strips as wide as the map).
    grads = param_grads((bpart, lpart), (1, ch, h, w), weight, bias, base_scale, wavelet_weight, wavelet_scale,
                        round_to, strip=_pow2(w))
    return (dx, *grads)


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
