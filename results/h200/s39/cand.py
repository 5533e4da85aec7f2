"""Candidate apply kernels for the A/B (session 39): channels as the batch index of a 3-D tl.dot."""
import torch
import triton
import triton.language as tl

from wtconvnext.ops import triton_kernels as tk
from wtconvnext.ops.matrix_kernels import _join4, _quarters, _tap_of


@triton.jit
def _apply3d_kernel(x_ptr, m_ptr, b_ptr, y_ptr, B, N, NS, C: tl.constexpr, TRANS: tl.constexpr,
                    HAS_BIAS: tl.constexpr, CB: tl.constexpr, BB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    COMPUTE: tl.constexpr):
    nt = tl.cdiv(N, BN)
    bb = (tl.program_id(0) // nt) * BB + tl.arange(0, BB)
    pp = (tl.program_id(0) % nt) * BN + tl.arange(0, BN)
    cc = tl.program_id(1) * CB + tl.arange(0, CB)
    bm, pm, cm = bb < B, pp < N, cc < C
    acc = tl.zeros((CB, BB, BN), dtype=COMPUTE)
    xrow = bb.to(tl.int64)[:, None, None] * N
    mrow = cc.to(tl.int64)[:, None, None] * NS * NS
    for k0 in range(0, N, BK):
        qq = k0 + tl.arange(0, BK)
        qm = qq < N
        xt = tl.load(x_ptr + (xrow + qq[None, :, None]) * C + cc[None, None, :],
                     mask=bm[:, None, None] & qm[None, :, None] & cm[None, None, :], other=0.0)  # (BB, BK, CB)
        if TRANS:
            at = mrow + qq[None, :, None] * NS + pp[None, None, :]
        else:
            at = mrow + pp[None, None, :] * NS + qq[None, :, None]
        mt = tl.load(m_ptr + at, mask=cm[:, None, None] & (qq < NS)[None, :, None] & (pp < NS)[None, None, :],
                     other=0.0)  # (CB, BK, BN)
        acc = tl.dot(tl.permute(xt, (2, 0, 1)), mt, acc)
    out = tl.permute(acc, (1, 2, 0))  # (BB, BN, CB)
    if HAS_BIAS:
        out += tl.load(b_ptr + cc, mask=cm, other=0.0).to(COMPUTE)[None, None, :]
    tl.store(y_ptr + (xrow + pp[None, :, None]) * C + cc[None, None, :], out.to(y_ptr.dtype.element_ty),
             mask=bm[:, None, None] & pm[None, :, None] & cm[None, None, :])


def _factory(trans, cb, bbt, bn, bk, wp):
    def make(x, dy, p, bw, bias, lw, m):
        b, c, h, w = x.shape
        n = h * w
        y = torch.empty_like(x)

        def run():
            grid = (tk._cdiv(b, bbt) * tk._cdiv(n, bn), tk._cdiv(c, cb))
            tk._launch(_apply3d_kernel, grid, (x, m, bias if not trans else m, y, b, n, m.shape[-1]), wp, C=c,
                       TRANS=trans, HAS_BIAS=not trans and bias is not None, CB=cb, BB=bbt, BN=bn, BK=bk,
                       COMPUTE=tk._compute_dtype(x.dtype))
            return y
        return run
    return make


CANDIDATES = {}
STAGES = 1  # the fused kernels' gathers, pipelined, took ~0.5-0.9 MB of shared memory
for trans in (False, True):
    for cb, bbt, bn, bk, wp in [(8, 32, 64, 32, 4), (16, 32, 32, 32, 4), (8, 64, 64, 32, 8), (16, 16, 64, 32, 4)]:
        CANDIDATES[f"apply3d{' T' if trans else ''} CB={cb} BB={bbt} BN={bn} BK={bk} w={wp}"] = _factory(
            trans, cb, bbt, bn, bk, wp)


@triton.jit
def _m_tile(bw_ptr, lw_ptr, o, i, cc, valid, W, C: tl.constexpr, K: tl.constexpr, LEVELS: tl.constexpr,
            COMPUTE: tl.constexpr):
    """M[c, o, i] for broadcastable output-pixel o, input-pixel i and channel cc index tensors (closed form)."""
    KK: tl.constexpr = K * K
    py, px = o // W, o % W
    qy, qx = i // W, i % W
    ok, tap = _tap_of(py, px, qy, qx, K)
    acc = tl.load(bw_ptr + tap * C + cc, mask=valid & ok, other=0.0).to(COMPUTE)
    for lv in tl.static_range(1, LEVELS + 1):
        ok, tap = _tap_of(py >> lv, px >> lv, qy >> lv, qx >> lv, K)
        sy = (1 - 2 * (((py ^ qy) >> (lv - 1)) & 1)).to(COMPUTE)
        sx = (1 - 2 * (((px ^ qx) >> (lv - 1)) & 1)).to(COMPUTE)
        m2 = valid & ok
        at = lw_ptr + (((lv - 1) * KK + tap) * 4) * C + cc
        s0 = tl.load(at, mask=m2, other=0.0).to(COMPUTE)
        s1 = tl.load(at + C, mask=m2, other=0.0).to(COMPUTE)
        s2 = tl.load(at + 2 * C, mask=m2, other=0.0).to(COMPUTE)
        s3 = tl.load(at + 3 * C, mask=m2, other=0.0).to(COMPUTE)
        acc += (s0 + sy * s1 + sx * (s2 + sy * s3)) * (2.0 / (1 << (2 * lv)))
    return acc


@triton.jit
def _apply_fused_kernel(x_ptr, bw_ptr, lw_ptr, b_ptr, y_ptr, B, N, W, C: tl.constexpr, K: tl.constexpr,
                        LEVELS: tl.constexpr, TRANS: tl.constexpr, HAS_BIAS: tl.constexpr, CB: tl.constexpr,
                        BB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, COMPUTE: tl.constexpr):
    """The apply with M's tiles made in registers from the folded weights (no build launch, no M in memory)."""
    nt = tl.cdiv(N, BN)
    bb = (tl.program_id(0) // nt) * BB + tl.arange(0, BB)
    pp = (tl.program_id(0) % nt) * BN + tl.arange(0, BN)
    cc = tl.program_id(1) * CB + tl.arange(0, CB)
    bm, pm, cm = bb < B, pp < N, cc < C
    acc = tl.zeros((CB, BB, BN), dtype=COMPUTE)
    xrow = bb.to(tl.int64)[:, None, None] * N
    for k0 in range(0, N, BK):
        qq = k0 + tl.arange(0, BK)
        qm = qq < N
        xt = tl.load(x_ptr + (xrow + qq[None, :, None]) * C + cc[None, None, :],
                     mask=bm[:, None, None] & qm[None, :, None] & cm[None, None, :], other=0.0)  # (BB, BK, CB)
        valid = cm[:, None, None] & qm[None, :, None] & pm[None, None, :]
        if TRANS:
            mt = _m_tile(bw_ptr, lw_ptr, qq[None, :, None], pp[None, None, :], cc[:, None, None], valid, W, C, K,
                         LEVELS, COMPUTE)
        else:
            mt = _m_tile(bw_ptr, lw_ptr, pp[None, None, :], qq[None, :, None], cc[:, None, None], valid, W, C, K,
                         LEVELS, COMPUTE)
        acc = tl.dot(tl.permute(xt, (2, 0, 1)), mt.to(x_ptr.dtype.element_ty), acc)
    out = tl.permute(acc, (1, 2, 0))  # (BB, BN, CB)
    if HAS_BIAS:
        out += tl.load(b_ptr + cc, mask=cm, other=0.0).to(COMPUTE)[None, None, :]
    tl.store(y_ptr + (xrow + pp[None, :, None]) * C + cc[None, None, :], out.to(y_ptr.dtype.element_ty),
             mask=bm[:, None, None] & pm[None, :, None] & cm[None, None, :])


def _fused_factory(trans, cb, bbt, bn, bk, wp):
    def make(x, dy, p, bw, bias, lw, m):
        b, c, h, w = x.shape
        n = h * w
        y = torch.empty_like(x)

        def run():
            grid = (tk._cdiv(b, bbt) * tk._cdiv(n, bn), tk._cdiv(c, cb))
            _apply_fused_kernel[grid](x, bw, lw, bias if not trans else bw, y, b, n, w, num_warps=wp, num_stages=STAGES, C=c,
                       K=bw.shape[0], LEVELS=lw.shape[0], TRANS=trans, HAS_BIAS=not trans and bias is not None,
                       CB=cb, BB=bbt, BN=bn, BK=bk, COMPUTE=tk._compute_dtype(x.dtype))
            return y
        return run
    return make


for trans in (False, True):
    for cb, bbt, bn, bk, wp in [(8, 128, 32, 32, 4), (4, 128, 64, 32, 4), (8, 64, 64, 32, 4), (16, 128, 16, 32, 4)]:
        CANDIDATES[f"fused{' T' if trans else ''} CB={cb} BB={bbt} BN={bn} BK={bk} w={wp}"] = _fused_factory(
            trans, cb, bbt, bn, bk, wp)


@triton.jit
def _apply_fused2_kernel(x_ptr, bw_ptr, lw_ptr, b_ptr, y_ptr, B, N, W, C: tl.constexpr, K: tl.constexpr,
                         LEVELS: tl.constexpr, TRANS: tl.constexpr, HAS_BIAS: tl.constexpr, BB: tl.constexpr,
                         BN: tl.constexpr, BK: tl.constexpr, COMPUTE: tl.constexpr):
    """The product's four-channel split apply with M's (4, BK, BN) tile made in registers."""
    nt = tl.cdiv(N, BN)
    bb = (tl.program_id(0) // nt) * BB + tl.arange(0, BB)
    pp = (tl.program_id(0) % nt) * BN + tl.arange(0, BN)
    cc = tl.program_id(1) * 4 + tl.arange(0, 4)
    bm, pm, cm = bb < B, pp < N, cc < C
    a0, a1 = tl.zeros((BB, BN), dtype=COMPUTE), tl.zeros((BB, BN), dtype=COMPUTE)
    a2, a3 = tl.zeros((BB, BN), dtype=COMPUTE), tl.zeros((BB, BN), dtype=COMPUTE)
    xrow = bb.to(tl.int64)[:, None, None] * N
    for k0 in range(0, N, BK):
        qq = k0 + tl.arange(0, BK)
        qm = qq < N
        xt = tl.load(x_ptr + (xrow + qq[None, :, None]) * C + cc[None, None, :],
                     mask=bm[:, None, None] & qm[None, :, None] & cm[None, None, :], other=0.0)  # (BB, BK, 4)
        valid = cm[:, None, None] & qm[None, :, None] & pm[None, None, :]
        if TRANS:
            mt = _m_tile(bw_ptr, lw_ptr, qq[None, :, None], pp[None, None, :], cc[:, None, None], valid, W, C, K,
                         LEVELS, COMPUTE)
        else:
            mt = _m_tile(bw_ptr, lw_ptr, pp[None, None, :], qq[None, :, None], cc[:, None, None], valid, W, C, K,
                         LEVELS, COMPUTE)
        x0, x1, x2, x3 = _quarters(xt)
        m0, m1, m2, m3 = _quarters(tl.permute(mt.to(x_ptr.dtype.element_ty), (1, 2, 0)))
        a0 = tl.dot(x0, m0, a0)
        a1 = tl.dot(x1, m1, a1)
        a2 = tl.dot(x2, m2, a2)
        a3 = tl.dot(x3, m3, a3)
    out = _join4(a0, a1, a2, a3)
    if HAS_BIAS:
        out += tl.load(b_ptr + cc, mask=cm, other=0.0).to(COMPUTE)[None, None, :]
    tl.store(y_ptr + (xrow + pp[None, :, None]) * C + cc[None, None, :], out.to(y_ptr.dtype.element_ty),
             mask=bm[:, None, None] & pm[None, :, None] & cm[None, None, :])


def _fused2_factory(trans, bbt, bn, bk, wp):
    def make(x, dy, p, bw, bias, lw, m):
        b, c, h, w = x.shape
        n = h * w
        y = torch.empty_like(x)

        def run():
            grid = (tk._cdiv(b, bbt) * tk._cdiv(n, bn), tk._cdiv(c, 4))
            _apply_fused2_kernel[grid](x, bw, lw, bias if not trans else bw, y, b, n, w, num_warps=wp, num_stages=STAGES, C=c,
                       K=bw.shape[0], LEVELS=lw.shape[0], TRANS=trans, HAS_BIAS=not trans and bias is not None,
                       BB=bbt, BN=bn, BK=bk, COMPUTE=tk._compute_dtype(x.dtype))
            return y
        return run
    return make


for trans in (False, True):
    for bbt, bn, bk, wp in [(64, 64, 32, 4), (128, 64, 32, 4), (128, 64, 16, 4), (128, 32, 32, 4)]:
        CANDIDATES[f"fused2{' T' if trans else ''} BB={bbt} BN={bn} BK={bk} w={wp}"] = _fused2_factory(
            trans, bbt, bn, bk, wp)


@triton.jit
def _m_2d(bw_ptr, lw_ptr, c, okb, tapb, oks, taps, sys_, sxs, cm, C: tl.constexpr, K: tl.constexpr,
          LEVELS: tl.constexpr, COMPUTE: tl.constexpr):
    """One channel's (BK, BN) M tile from the tap indices and signs made once for the step."""
    KK: tl.constexpr = K * K
    acc = tl.load(bw_ptr + tapb * C + c, mask=okb & cm, other=0.0).to(COMPUTE)
    for lv in tl.static_range(1, LEVELS + 1):
        ok = ((oks >> (lv - 1)) & 1) != 0
        tap = (taps >> (8 * (lv - 1))) & 255
        sy = (1 - 2 * ((sys_ >> (lv - 1)) & 1)).to(COMPUTE)
        sx = (1 - 2 * ((sxs >> (lv - 1)) & 1)).to(COMPUTE)
        at = lw_ptr + (((lv - 1) * KK + tap) * 4) * C + c
        m2 = ok & cm
        s0 = tl.load(at, mask=m2, other=0.0).to(COMPUTE)
        s1 = tl.load(at + C, mask=m2, other=0.0).to(COMPUTE)
        s2 = tl.load(at + 2 * C, mask=m2, other=0.0).to(COMPUTE)
        s3 = tl.load(at + 3 * C, mask=m2, other=0.0).to(COMPUTE)
        acc += (s0 + sy * s1 + sx * (s2 + sy * s3)) * (2.0 / (1 << (2 * lv)))
    return acc


@triton.jit
def _apply_fused3_kernel(x_ptr, bw_ptr, lw_ptr, b_ptr, y_ptr, B, N, W, C: tl.constexpr, K: tl.constexpr,
                         LEVELS: tl.constexpr, TRANS: tl.constexpr, HAS_BIAS: tl.constexpr, BB: tl.constexpr,
                         BN: tl.constexpr, BK: tl.constexpr, COMPUTE: tl.constexpr):
    """Fused apply, M tiles made per channel as 2-D (BK, BN) tiles from tap indices made once per step (levels <=
    4: taps packed 8 bits a level)."""
    nt = tl.cdiv(N, BN)
    bb = (tl.program_id(0) // nt) * BB + tl.arange(0, BB)
    pp = (tl.program_id(0) % nt) * BN + tl.arange(0, BN)
    c0 = tl.program_id(1) * 4
    cc = c0 + tl.arange(0, 4)
    bm, pm, cm = bb < B, pp < N, cc < C
    a0, a1 = tl.zeros((BB, BN), dtype=COMPUTE), tl.zeros((BB, BN), dtype=COMPUTE)
    a2, a3 = tl.zeros((BB, BN), dtype=COMPUTE), tl.zeros((BB, BN), dtype=COMPUTE)
    xrow = bb.to(tl.int64)[:, None, None] * N
    for k0 in range(0, N, BK):
        qq = k0 + tl.arange(0, BK)
        qm = qq < N
        xt = tl.load(x_ptr + (xrow + qq[None, :, None]) * C + cc[None, None, :],
                     mask=bm[:, None, None] & qm[None, :, None] & cm[None, None, :], other=0.0)  # (BB, BK, 4)
        if TRANS:
            o = qq[:, None]
            i = pp[None, :]
        else:
            o = pp[None, :]
            i = qq[:, None]
        valid = qm[:, None] & pm[None, :]
        py, px = o // W, o % W
        qy, qx = i // W, i % W
        okb, tapb = _tap_of(py, px, qy, qx, K)
        okb = okb & valid
        oks = tl.zeros((BK, BN), dtype=tl.int32)
        taps = tl.zeros((BK, BN), dtype=tl.int32)
        for lv in tl.static_range(1, LEVELS + 1):
            ok, tap = _tap_of(py >> lv, px >> lv, qy >> lv, qx >> lv, K)
            oks |= (ok & valid).to(tl.int32) << (lv - 1)
            taps |= tl.where(ok, tap, 0) << (8 * (lv - 1))
        sys_ = py ^ qy
        sxs = px ^ qx
        x0, x1, x2, x3 = _quarters(xt)
        dt = x_ptr.dtype.element_ty
        a0 = tl.dot(x0, _m_2d(bw_ptr, lw_ptr, c0, okb, tapb, oks, taps, sys_, sxs, c0 < C, C, K, LEVELS,
                              COMPUTE).to(dt), a0)
        a1 = tl.dot(x1, _m_2d(bw_ptr, lw_ptr, c0 + 1, okb, tapb, oks, taps, sys_, sxs, c0 + 1 < C, C, K, LEVELS,
                              COMPUTE).to(dt), a1)
        a2 = tl.dot(x2, _m_2d(bw_ptr, lw_ptr, c0 + 2, okb, tapb, oks, taps, sys_, sxs, c0 + 2 < C, C, K, LEVELS,
                              COMPUTE).to(dt), a2)
        a3 = tl.dot(x3, _m_2d(bw_ptr, lw_ptr, c0 + 3, okb, tapb, oks, taps, sys_, sxs, c0 + 3 < C, C, K, LEVELS,
                              COMPUTE).to(dt), a3)
    out = _join4(a0, a1, a2, a3)
    if HAS_BIAS:
        out += tl.load(b_ptr + cc, mask=cm, other=0.0).to(COMPUTE)[None, None, :]
    tl.store(y_ptr + (xrow + pp[None, :, None]) * C + cc[None, None, :], out.to(y_ptr.dtype.element_ty),
             mask=bm[:, None, None] & pm[None, :, None] & cm[None, None, :])


def _fused3_factory(trans, bbt, bn, bk, wp):
    def make(x, dy, p, bw, bias, lw, m):
        b, c, h, w = x.shape
        n = h * w
        y = torch.empty_like(x)

        def run():
            grid = (tk._cdiv(b, bbt) * tk._cdiv(n, bn), tk._cdiv(c, 4))
            _apply_fused3_kernel[grid](x, bw, lw, bias if not trans else bw, y, b, n, w, num_warps=wp, num_stages=STAGES, C=c,
                       K=bw.shape[0], LEVELS=lw.shape[0], TRANS=trans, HAS_BIAS=not trans and bias is not None,
                       BB=bbt, BN=bn, BK=bk, COMPUTE=tk._compute_dtype(x.dtype))
            return y
        return run
    return make


for trans in (False, True):
    for bbt, bn, bk, wp in [(64, 64, 32, 4), (128, 64, 32, 4), (128, 64, 32, 8), (128, 32, 32, 4)]:
        CANDIDATES[f"fused3{' T' if trans else ''} BB={bbt} BN={bn} BK={bk} w={wp}"] = _fused3_factory(
            trans, bbt, bn, bk, wp)
