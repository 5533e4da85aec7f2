"""Row-streaming Triton kernels of the fused WTConv (Haar): the kernel model of issue 14, two variants.

Every tensor is channels-last. A program owns one image (or a group of images), a strip of ``BW`` columns and a
block of ``BC`` channels, and walks down all rows of its map. Each input row is loaded once per horizontal tap
(``K`` shifted windows) and each loaded window feeds ``K`` FMAs, one per output row still open: the ``K`` output
rows in flight are loop-carried fp32 accumulators (a tuple that rotates by one row per step), and the ``K * K``
weight vectors sit in registers for the whole walk.

Two ways to get the Haar coefficients a level convolves (the A/B of issue 14):

- ``FROM_LL=False`` (model A, coefficients stored): one analysis pass per level writes all four subbands of every
  level, ``(B, h, w, 4, C)`` in the input dtype, each computed once; the level convolutions are plain depthwise
  convolutions over them, and the backward's dy coefficients serve the input gradient and the weight gradients.
- ``FROM_LL=True`` (model B, coefficients on chip): only the low-pass pyramid is stored and every shifted window
  of coefficients is the butterfly of four loaded fine windows (once per window, not once per tap as before).

Synthesis runs coarse to fine, one level per program walk, fused into the level's convolution (it is 5 loads and
12 adds per four outputs, far cheaper than a one-pass synthesis that gathers every level for every output). The
finest level writes ``acc_1`` at full resolution; the last kernel adds it to the base convolution and the bias.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _zeros_tuple(N: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, COMPUTE: tl.constexpr):
    # Each accumulator its own tl.zeros: a rotation of tensors that start as one value loses a carried value on the
    # GPU (PERF.md's compiler trap).
    acc = ()
    for _ in tl.static_range(N):
        acc = acc + (tl.zeros((BW, BC), dtype=COMPUTE),)
    return acc


@triton.jit
def _taps(acc, win, wts, S: tl.constexpr, kx: tl.constexpr, K: tl.constexpr, FLIP: tl.constexpr,
          NSUB: tl.constexpr):
    """acc[S*K + j] += w[ky, kx] * win for the K open output rows (slot j is output row r - PAD + j, which the
    input row r reaches through tap ky = K - 1 - j). ``wts`` holds the K*K weight vectors of subband S at
    S*K*K + ky*K + kx; FLIP reads them rotated by 180 degrees."""
    new = ()
    for i in tl.static_range(S * K):
        new = new + (acc[i],)
    for j in tl.static_range(K):
        if FLIP:  # tap (K - 1 - ky, K - 1 - kx) with ky = K - 1 - j
            wv = wts[S * K * K + j * K + (K - 1 - kx)]
        else:
            wv = wts[S * K * K + (K - 1 - j) * K + kx]
        new = new + (acc[S * K + j] + wv * win,)
    for i in tl.static_range((S + 1) * K, NSUB * K):
        new = new + (acc[i],)
    return new


@triton.jit
def _rotate(acc, NSUB: tl.constexpr, K: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, COMPUTE: tl.constexpr):
    """Drop each subband's finished row (slot 0) and open a new one at the end."""
    new = ()
    for s in tl.static_range(NSUB):
        for j in tl.static_range(1, K):
            new = new + (acc[s * K + j],)
        new = new + (tl.zeros((BW, BC), dtype=COMPUTE),)
    return new


@triton.jit
def _load_weights(w_ptr, cc, cmask, NSUB: tl.constexpr, K: tl.constexpr, C: tl.constexpr, COMPUTE: tl.constexpr):
    """(NSUB, K, K, C) taps-major weights -> tuple of NSUB*K*K (1, BC) vectors."""
    wts = ()
    for t in tl.static_range(NSUB * K * K):
        wts = wts + (tl.load(w_ptr + t * C + cc, mask=cmask, other=0.0).to(COMPUTE),)
    return wts


@triton.jit
def _butterfly_win(p, r, col, Hs, Ws, cmask, PIX: tl.constexpr, COMPUTE: tl.constexpr):
    """Twice the 4 Haar subbands at coarse row r (scalar) and columns col (BW, 1) from the fine map at ``p`` (one
    image, pixel stride PIX, row length Ws); zero outside the fine map."""
    fr = 2 * r
    fc = 2 * col
    rt = (fr >= 0) & (fr < Hs)
    rb = (fr >= 0) & (fr + 1 < Hs)
    cl = (fc >= 0) & (fc < Ws)
    cr = (fc >= 0) & (fc + 1 < Ws)
    top = p + fr * (Ws * PIX).to(tl.int64) + fc * PIX
    bot = top + Ws * PIX
    a = tl.load(top, mask=cmask & rt & cl, other=0.0).to(COMPUTE)
    b = tl.load(top + PIX, mask=cmask & rt & cr, other=0.0).to(COMPUTE)
    c = tl.load(bot, mask=cmask & rb & cl, other=0.0).to(COMPUTE)
    d = tl.load(bot + PIX, mask=cmask & rb & cr, other=0.0).to(COMPUTE)
    ab = a + b
    cd = c + d
    amb = a - b
    cmd = c - d
    return ab + cd, ab - cd, amb + cmd, amb - cmd


@triton.jit
def _analysis_kernel(
    src_ptr,  # (B, Hs, Ws, *) fine low-pass, pixel stride PIX (x: C; a coefficient tensor's LL: 4C)
    out_ptr,  # (B, hc, wc, 4, C) subbands, or (B, hc, wc, C) LL only (LL_ONLY)
    Hs, Ws, hc, wc, TILES_N, TILES,
    C: tl.constexpr, PIX: tl.constexpr, LL_ONLY: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BC: tl.constexpr, COMPUTE: tl.constexpr,
):
    pid = tl.program_id(0)
    b = (pid // TILES).to(tl.int64)
    tile = pid % TILES
    s = tl.arange(0, BM * BN)[:, None]
    m = (tile // TILES_N) * BM + s // BN
    n = (tile % TILES_N) * BN + s % BN
    cc = tl.program_id(1) * BC + tl.arange(0, BC)[None, :]
    cmask = cc < C
    inside = (m < hc) & (n < wc) & cmask
    s0, s1, s2, s3 = _bfly_rows(src_ptr + b * Hs * Ws * PIX + cc, m, n, Hs, Ws, inside, PIX, COMPUTE)
    if LL_ONLY:
        off = b * hc * wc * C + (m.to(tl.int64) * wc + n) * C + cc
        tl.store(out_ptr + off, (s0 * 0.5).to(out_ptr.dtype.element_ty), mask=inside)
    else:
        off = b * hc * wc * 4 * C + (m.to(tl.int64) * wc + n) * (4 * C) + cc
        ty = out_ptr.dtype.element_ty
        tl.store(out_ptr + off, (s0 * 0.5).to(ty), mask=inside)
        tl.store(out_ptr + off + C, (s1 * 0.5).to(ty), mask=inside)
        tl.store(out_ptr + off + 2 * C, (s2 * 0.5).to(ty), mask=inside)
        tl.store(out_ptr + off + 3 * C, (s3 * 0.5).to(ty), mask=inside)


@triton.jit
def _bfly_rows(p, m, n, Hs, Ws, inside, PIX: tl.constexpr, COMPUTE: tl.constexpr):
    """As _butterfly_win for a tile of coarse positions (m, n), both (S, 1)."""
    fr = 2 * m
    fc = 2 * n
    rb = fr + 1 < Hs
    cr = fc + 1 < Ws
    top = p + fr.to(tl.int64) * Ws * PIX + fc * PIX
    bot = top + Ws * PIX
    a = tl.load(top, mask=inside, other=0.0).to(COMPUTE)
    b = tl.load(top + PIX, mask=inside & cr, other=0.0).to(COMPUTE)
    c = tl.load(bot, mask=inside & rb, other=0.0).to(COMPUTE)
    d = tl.load(bot + PIX, mask=inside & rb & cr, other=0.0).to(COMPUTE)
    ab = a + b
    cd = c + d
    amb = a - b
    cmd = c - d
    return ab + cd, ab - cd, amb + cmd, amb - cmd


@triton.jit
def _level_rows_kernel(
    src_ptr,  # model A: (B, hc, wc, 4, C) coefficients of this level; model B: (B, Hs, Ws, C) LL_{i-1}
    accin_ptr,  # (B, hc, wc, C) synthesis of the coarser levels (HAS_ACC)
    dst_ptr,  # (B, Hs, Ws, C) synthesis of this level and the coarser ones
    lw_ptr,  # (4, K, K, C) this level's kernels times their scales and the synthesis 1/2
    Hs, Ws, hc, wc, STRIPS,
    C: tl.constexpr, K: tl.constexpr, FROM_LL: tl.constexpr, HAS_ACC: tl.constexpr, FLIP: tl.constexpr,
    BW: tl.constexpr, BC: tl.constexpr, COMPUTE: tl.constexpr,
):
    PAD: tl.constexpr = K // 2
    pid = tl.program_id(0)
    b = (pid // STRIPS).to(tl.int64)
    n = (pid % STRIPS) * BW + tl.arange(0, BW)[:, None]  # coarse columns (BW, 1)
    cc = tl.program_id(1) * BC + tl.arange(0, BC)[None, :]
    cmask = cc < C
    wts = _load_weights(lw_ptr, cc, cmask, 4, K, C, COMPUTE)
    if FROM_LL:
        src = src_ptr + b * Hs * Ws * C + cc
    else:
        src = src_ptr + b * hc * wc * (4 * C) + cc
    dst = dst_ptr + b * Hs * Ws * C + cc
    accin = accin_ptr + b * hc * wc * C + cc
    acc = _zeros_tuple(4 * K, BW, BC, COMPUTE)
    for r in range(-PAD, hc + PAD):
        rin = r < hc  # rows past the end are zero: only the open rows get finished
        for kx in tl.static_range(K):
            col = n + (kx - PAD)
            if FROM_LL:
                w0, w1, w2, w3 = _butterfly_win(src, r, col, Hs, Ws, cmask, C, COMPUTE)
            else:
                mk = cmask & rin & (r >= 0) & (col >= 0) & (col < wc)
                p = src + r * (wc * (4 * C)).to(tl.int64) + col * (4 * C)
                w0 = tl.load(p, mask=mk, other=0.0).to(COMPUTE)
                w1 = tl.load(p + C, mask=mk, other=0.0).to(COMPUTE)
                w2 = tl.load(p + 2 * C, mask=mk, other=0.0).to(COMPUTE)
                w3 = tl.load(p + 3 * C, mask=mk, other=0.0).to(COMPUTE)
            acc = _taps(acc, w0, wts, 0, kx, K, FLIP, 4)
            acc = _taps(acc, w1, wts, 1, kx, K, FLIP, 4)
            acc = _taps(acc, w2, wts, 2, kx, K, FLIP, 4)
            acc = _taps(acc, w3, wts, 3, kx, K, FLIP, 4)
        o = r - PAD
        if o >= 0:
            t0 = acc[0]
            t1 = acc[K]
            t2 = acc[2 * K]
            t3 = acc[3 * K]
            if FROM_LL:  # the butterfly gave twice the coefficients
                t0 = t0 * 0.5
                t1 = t1 * 0.5
                t2 = t2 * 0.5
                t3 = t3 * 0.5
            if HAS_ACC:
                # t already carries the synthesis 1/2 (folded into the weights); the coarser levels' sum needs it.
                t0 += 0.5 * tl.load(accin + o * (wc * C).to(tl.int64) + n * C, mask=cmask & (n < wc),
                                    other=0.0).to(COMPUTE)
            pp = t0 + t1
            qq = t0 - t1
            rr = t2 + t3
            ss = t2 - t3
            fr = 2 * o
            fc = 2 * n
            ty = dst_ptr.dtype.element_ty
            top = dst + fr * (Ws * C).to(tl.int64) + fc * C
            ml = cmask & (fc < Ws)
            mr = cmask & (fc + 1 < Ws)
            tl.store(top, (pp + rr).to(ty), mask=ml)
            tl.store(top + C, (pp - rr).to(ty), mask=mr)
            bot = fr + 1 < Hs
            tl.store(top + Ws * C, (qq + ss).to(ty), mask=ml & bot)
            tl.store(top + Ws * C + C, (qq - ss).to(ty), mask=mr & bot)
        acc = _rotate(acc, 4, K, BW, BC, COMPUTE)


@triton.jit
def _final_rows_kernel(
    x_ptr,  # (B, H, W, C)
    acc1_ptr,  # (B, H, W, C) synthesis of all levels (HAS_ACC)
    y_ptr,  # (B, ceil(H / STRIDE), ceil(W / STRIDE), C)
    bw_ptr,  # (K, K, C) base kernel times base_scale
    bb_ptr,  # (C,) bias times base_scale (HAS_BIAS)
    H, W, STRIPS,
    C: tl.constexpr, K: tl.constexpr, STRIDE: tl.constexpr, HAS_ACC: tl.constexpr, HAS_BIAS: tl.constexpr,
    FLIP: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, COMPUTE: tl.constexpr,
):
    PAD: tl.constexpr = K // 2
    pid = tl.program_id(0)
    b = (pid // STRIPS).to(tl.int64)
    n = (pid % STRIPS) * BW + tl.arange(0, BW)[:, None]
    cc = tl.program_id(1) * BC + tl.arange(0, BC)[None, :]
    cmask = cc < C
    wts = _load_weights(bw_ptr, cc, cmask, 1, K, C, COMPUTE)
    if HAS_BIAS:
        bias = tl.load(bb_ptr + cc, mask=cmask, other=0.0).to(COMPUTE)
    xb = x_ptr + b * H * W * C + cc
    ab = acc1_ptr + b * H * W * C + cc
    Ho = (H + STRIDE - 1) // STRIDE
    Wo = (W + STRIDE - 1) // STRIDE
    yb = y_ptr + b * Ho * Wo * C + cc
    acc = _zeros_tuple(K, BW, BC, COMPUTE)
    for r in range(-PAD, H + PAD):
        rin = (r >= 0) & (r < H)
        for kx in tl.static_range(K):
            col = n + (kx - PAD)
            win = tl.load(xb + r * (W * C).to(tl.int64) + col * C, mask=cmask & rin & (col >= 0) & (col < W),
                          other=0.0).to(COMPUTE)
            acc = _taps(acc, win, wts, 0, kx, K, FLIP, 1)
        o = r - PAD
        if (o >= 0) & (o % STRIDE == 0):
            out = acc[0]
            if HAS_BIAS:
                out += bias
            mo = cmask & (n < W)
            if HAS_ACC:
                out += tl.load(ab + o * (W * C).to(tl.int64) + n * C, mask=mo, other=0.0).to(COMPUTE)
            if STRIDE > 1:
                mo = mo & (n % STRIDE == 0)
            tl.store(yb + (o // STRIDE) * (Wo * C).to(tl.int64) + (n // STRIDE) * C, out.to(y_ptr.dtype.element_ty),
                     mask=mo)
        acc = _rotate(acc, 1, K, BW, BC, COMPUTE)


@triton.jit
def _push_dy(dq, gb, rg, n, h, w, Hs, Ws, mask, CC: tl.constexpr, K: tl.constexpr, NSUB: tl.constexpr,
             FROM_LL: tl.constexpr, COMPUTE: tl.constexpr):
    """Rotate dy row ``rg`` (all subbands) into the K-row window ``dq``."""
    if FROM_LL:
        g0, g1, g2, g3 = _butterfly_win(gb, rg, n, Hs, Ws, mask, CC, COMPUTE)
        gw = (g0, g1, g2, g3)
    else:
        gw = (tl.load(gb + (w * CC).to(tl.int64) * rg + n * CC, mask=mask & (rg < h) & (n < w), other=0.0).to(COMPUTE),)
    new = ()
    for s in tl.static_range(NSUB):
        for j in tl.static_range(1, K):
            new = new + (dq[s * K + j],)
        new = new + (gw[s],)
    return new


@triton.jit
def _wgrad_rows_kernel(
    xs_ptr,  # model A / base: (B, h, w, CC) x side (pixel stride CC); model B level: (B, Hs, Ws, C) LL_{i-1} of x
    gs_ptr,  # the same for dy
    part_ptr,  # (GROUPS * STRIPS, NSUB, K * K, CC) fp32 partial sums, one row per program
    h, w, Hs, Ws, STRIPS, IMGS, B,
    CC: tl.constexpr, K: tl.constexpr, NSUB: tl.constexpr, FROM_LL: tl.constexpr,
    BW: tl.constexpr, BC: tl.constexpr, COMPUTE: tl.constexpr,
):
    """d w[s, ky, kx] = sum over positions of dy_s(o, n) * x_s(o + ky - PAD, n + kx - PAD), per channel. A program
    walks the x rows of IMGS images for a strip of columns, keeping the K dy rows that an x row pairs with."""
    PAD: tl.constexpr = K // 2
    KK: tl.constexpr = K * K
    pid = tl.program_id(0)
    grp = pid // STRIPS
    n = (pid % STRIPS) * BW + tl.arange(0, BW)[:, None]
    cc = tl.program_id(1) * BC + tl.arange(0, BC)[None, :]
    cmask = cc < CC
    acc = _zeros_tuple(NSUB * KK, BW, BC, COMPUTE)
    for i in range(IMGS):
        b = grp * IMGS + i
        bok = b < B
        b64 = b.to(tl.int64)
        if FROM_LL:
            xb = xs_ptr + b64 * Hs * Ws * CC + cc
            gb = gs_ptr + b64 * Hs * Ws * CC + cc
        else:
            xb = xs_ptr + b64 * h * w * CC + cc
            gb = gs_ptr + b64 * h * w * CC + cc
        # dy rows r - PAD .. r + PAD, subband-major; rows outside the map are zero. Rows 0 .. PAD - 1 first.
        dq = _zeros_tuple(NSUB * K, BW, BC, COMPUTE)
        for j in tl.static_range(PAD):
            dq = _push_dy(dq, gb, j, n, h, w, Hs, Ws, cmask & bok, CC, K, NSUB, FROM_LL, COMPUTE)
        for r in range(0, h):
            dq = _push_dy(dq, gb, r + PAD, n, h, w, Hs, Ws, cmask & bok, CC, K, NSUB, FROM_LL, COMPUTE)
            for kx in tl.static_range(K):
                col = n + (kx - PAD)
                if FROM_LL:
                    x0, x1, x2, x3 = _butterfly_win(xb, r, col, Hs, Ws, cmask & bok & (col < w), CC, COMPUTE)
                    xw = (x0, x1, x2, x3)
                else:
                    xw = (tl.load(xb + r * (w * CC).to(tl.int64) + col * CC,
                                  mask=cmask & bok & (col >= 0) & (col < w), other=0.0).to(COMPUTE),)
                upd = ()
                for s in tl.static_range(NSUB):
                    for ky in tl.static_range(K):
                        for kx2 in tl.static_range(K):
                            if kx2 == kx:
                                # x row r pairs with dy row r - ky + PAD, slot K - 1 - ky.
                                upd = upd + (acc[s * KK + ky * K + kx2] + xw[s] * dq[s * K + K - 1 - ky],)
                            else:
                                upd = upd + (acc[s * KK + ky * K + kx2],)
                acc = upd
    c1 = tl.program_id(1) * BC + tl.arange(0, BC)
    dst = part_ptr + pid.to(tl.int64) * NSUB * KK * CC + c1
    cm = c1 < CC
    for t in tl.static_range(NSUB * KK):
        v = tl.sum(acc[t], 0)
        if FROM_LL:  # both butterflies gave twice the subbands
            v = v * 0.25
        tl.store(dst + t * CC, v, mask=cm)


# ----------------------------------------------------------------------------------------------------------------
# Launchers (prototype: plain ``kernel[grid]`` launches)


def _compute(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _bc(ch: int, cap: int = 32) -> int:
    b = 1
    while b < min(ch, cap):
        b *= 2
    return b


def _bw(w: int, cap: int = 8) -> int:
    b = 1
    while b < min(w, cap):
        b *= 2
    return b


def _dense(x: Tensor) -> Tensor:
    """(B, C, H, W) -> a tensor whose memory is dense (B, H, W, C)."""
    return x.contiguous(memory_format=torch.channels_last)


def coefficients(x: Tensor, levels: int, dtype: Optional[torch.dtype] = None) -> list[Tensor]:
    """Model A: the Haar subbands of every level, (B, h_i, w_i, 4, C) each, in ``dtype`` (default x's)."""
    x = _dense(x)
    bsz, ch, hs, ws = x.shape
    dtype = dtype or x.dtype
    out: list[Tensor] = []
    src, pix = x, ch
    for _ in range(levels):
        hc, wc = (hs + 1) // 2, (ws + 1) // 2
        co = torch.empty((bsz, hc, wc, 4, ch), device=x.device, dtype=dtype)
        bm, bn = 4, 4
        tn = _cdiv(wc, bn)
        tiles = _cdiv(hc, bm) * tn
        bc = _bc(ch, 64)
        _analysis_kernel[(bsz * tiles, _cdiv(ch, bc))](
            src, co, hs, ws, hc, wc, tn, tiles, C=ch, PIX=pix, LL_ONLY=False, BM=bm, BN=bn, BC=bc,
            COMPUTE=_compute(x.dtype), num_warps=4)
        out.append(co)
        src, pix, hs, ws = co, 4 * ch, hc, wc
    return out


def ll_pyramid(x: Tensor, levels: int) -> list[Tensor]:
    """Model B: [x, LL_1, ..., LL_{levels-1}] as dense (B, h, w, C) tensors (x's dtype)."""
    x = _dense(x)
    bsz, ch, hs, ws = x.shape
    pyr = [x.permute(0, 2, 3, 1)]
    for _ in range(1, levels):
        hc, wc = (hs + 1) // 2, (ws + 1) // 2
        ll = torch.empty((bsz, hc, wc, ch), device=x.device, dtype=x.dtype)
        bm, bn = 4, 4
        tn = _cdiv(wc, bn)
        tiles = _cdiv(hc, bm) * tn
        bc = _bc(ch, 64)
        _analysis_kernel[(bsz * tiles, _cdiv(ch, bc))](
            pyr[-1], ll, hs, ws, hc, wc, tn, tiles, C=ch, PIX=ch, LL_ONLY=True, BM=bm, BN=bn, BC=bc,
            COMPUTE=_compute(x.dtype), num_warps=4)
        pyr.append(ll)
        hs, ws = hc, wc
    return pyr


def forward(
    x: Tensor, base_w: Tensor, base_b: Optional[Tensor], level_w: Tensor, stride: int = 1, flip: bool = False,
    from_ll: bool = False, bw: int = 8, bc: int = 32, warps: int = 4, levels_src: Optional[list[Tensor]] = None,
) -> Tensor:
    """y (B, C, ceil(H/stride), ceil(W/stride)) channels-last. ``level_w``: (L, 4, K, K, C) with the synthesis 1/2
    folded in; ``base_w`` (K, K, C); ``levels_src``: precomputed coefficients (model A) or LL pyramid (model B)."""
    x = _dense(x)
    bsz, ch, h, w = x.shape
    levels, k = level_w.shape[0], base_w.shape[0]
    comp = _compute(x.dtype)
    if levels_src is None:
        levels_src = ll_pyramid(x, levels) if from_ll else coefficients(x, levels)
    sizes = [(h, w)]
    for _ in range(levels):
        sizes.append(((sizes[-1][0] + 1) // 2, (sizes[-1][1] + 1) // 2))
    acc: Optional[Tensor] = None
    bcx = _bc(ch, bc)
    for i in range(levels, 0, -1):
        hs, ws = sizes[i - 1]
        hc, wc = sizes[i]
        dst = torch.empty((bsz, hs, ws, ch), device=x.device, dtype=_acc_dtype(x.dtype))
        bwi = _bw(wc, bw)
        strips = _cdiv(wc, bwi)
        _level_rows_kernel[(bsz * strips, _cdiv(ch, bcx))](
            levels_src[i - 1], dst if acc is None else acc, dst, level_w[i - 1], hs, ws, hc, wc, strips,
            C=ch, K=k, FROM_LL=from_ll, HAS_ACC=acc is not None, FLIP=flip, BW=bwi, BC=bcx, COMPUTE=comp,
            num_warps=warps)
        acc = dst
    y = torch.empty((bsz, ch, _cdiv(h, stride), _cdiv(w, stride)), device=x.device, dtype=x.dtype,
                    memory_format=torch.channels_last)
    bwf = _bw(w, bw)
    strips = _cdiv(w, bwf)
    _final_rows_kernel[(bsz * strips, _cdiv(ch, bcx))](
        x, x if acc is None else acc, y, base_w, base_w if base_b is None else base_b, h, w, strips,
        C=ch, K=k, STRIDE=stride, HAS_ACC=acc is not None, HAS_BIAS=base_b is not None, FLIP=flip,
        BW=bwf, BC=bcx, COMPUTE=comp, num_warps=warps)
    return y


def _wgrad(xs: Tensor, gs: Tensor, cc: int, h: int, w: int, hs: int, ws: int, k: int, nsub: int, from_ll: bool,
           bw: int, bc: int, imgs: int, warps: int) -> Tensor:
    bsz = xs.shape[0]
    bwi = _bw(w, bw)
    strips = _cdiv(w, bwi)
    groups = _cdiv(bsz, imgs)
    bcx = _bc(cc, bc)
    part = torch.empty((groups * strips, nsub, k * k, cc), device=xs.device, dtype=torch.float32)
    _wgrad_rows_kernel[(groups * strips, _cdiv(cc, bcx))](
        xs, gs, part, h, w, hs, ws, strips, imgs, bsz, CC=cc, K=k, NSUB=nsub, FROM_LL=from_ll, BW=bwi, BC=bcx,
        COMPUTE=_compute(xs.dtype), num_warps=warps)
    return part.sum(0)


def weight_grads(
    x: Tensor, dy: Tensor, levels: int, k: int, from_ll: bool = False, bw: int = 8, bc: int = 32, imgs: int = 4,
    warps: int = 4, xsrc: Optional[list[Tensor]] = None, gsrc: Optional[list[Tensor]] = None,
) -> tuple[Tensor, list[Tensor]]:
    """(d base (K*K, C), [d level i (4, K*K, C)]) of the unscaled convolutions: correlations of x and dy
    (model A: of their stored coefficients; model B: of butterflies of their LL pyramids)."""
    x, dy = _dense(x), _dense(dy)
    bsz, ch, h, w = x.shape
    if xsrc is None:
        xsrc = ll_pyramid(x, levels) if from_ll else coefficients(x, levels)
    if gsrc is None:
        gsrc = ll_pyramid(dy, levels) if from_ll else coefficients(dy, levels)
    base = _wgrad(x, dy, ch, h, w, h, w, k, 1, False, bw, bc, imgs, warps)[0]
    out = []
    hs, ws = h, w
    for i in range(levels):
        hc, wc = (hs + 1) // 2, (ws + 1) // 2
        if from_ll:
            out.append(_wgrad(xsrc[i], gsrc[i], ch, hc, wc, hs, ws, k, 4, True, bw, bc, imgs, warps)[:, :, :])
        else:
            g = _wgrad(xsrc[i], gsrc[i], 4 * ch, hc, wc, hc, wc, k, 1, False, bw, bc, imgs, warps)[0]
            out.append(g.reshape(k * k, 4, ch).permute(1, 0, 2))
        hs, ws = hc, wc
    return base, out


# ----------------------------------------------------------------------------------------------------------------
# Model A2: explicit columns. A thread owns channels, not positions: the strip's BW output columns and the
# BW + K - 1 input columns they read are separate (BC,) tensors, so every loaded input value feeds all K * K taps
# it meets (K rows in flight x up to K columns) instead of the K of a shifted window.


@triton.jit
def _dw_cols_kernel(
    x_ptr,  # (B, H, W, CC) dense
    acc_ptr,  # (B, H, W, CC) added to the output (HAS_ACC)
    y_ptr,  # (B, ceil(H / STRIDE), ceil(W / STRIDE), CC)
    w_ptr,  # (K, K, CC)
    b_ptr,  # (CC,) (HAS_BIAS)
    H, W, STRIPS,
    CC: tl.constexpr, K: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, STRIDE: tl.constexpr,
    HAS_ACC: tl.constexpr, HAS_BIAS: tl.constexpr, FLIP: tl.constexpr, COMPUTE: tl.constexpr,
):
    PAD: tl.constexpr = K // 2
    NI: tl.constexpr = BW + K - 1
    pid = tl.program_id(0)
    b = (pid // STRIPS).to(tl.int64)
    n0 = (pid % STRIPS) * BW
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    cmask = cc < CC
    wts = _load_weights(w_ptr, cc, cmask, 1, K, CC, COMPUTE)
    if HAS_BIAS:
        bias = tl.load(b_ptr + cc, mask=cmask, other=0.0).to(COMPUTE)
    inm = ()
    for i in tl.static_range(NI):
        inm = inm + (cmask & (n0 + (i - PAD) >= 0) & (n0 + (i - PAD) < W),)
    outm = ()
    for q in tl.static_range(BW):
        if STRIDE > 1:
            outm = outm + (cmask & (n0 + q < W) & ((n0 + q) % STRIDE == 0),)
        else:
            outm = outm + (cmask & (n0 + q < W),)
    rs = (W * CC).to(tl.int64)
    xb = x_ptr + b * H * rs + n0 * CC + cc
    ab = acc_ptr + b * H * rs + n0 * CC + cc
    Ho = (H + STRIDE - 1) // STRIDE
    Wo = (W + STRIDE - 1) // STRIDE
    ors = (Wo * CC).to(tl.int64)
    yb = y_ptr + b * Ho * ors + cc
    acc = ()
    for _ in tl.static_range(K * BW):
        acc = acc + (tl.zeros((BC,), dtype=COMPUTE),)
    # Row r + 1 is loaded while row r is computed (loop-carried, raw dtype): the FMAs hide the load latency.
    nxt = ()
    for i in tl.static_range(NI):
        nxt = nxt + (tl.zeros((BC,), dtype=x_ptr.dtype.element_ty),)
    for r in range(-PAD, H + PAD):
        cur = nxt
        r1 = r + 1
        p = xb + r1 * rs
        nxt = ()
        for i in tl.static_range(NI):
            nxt = nxt + (tl.load(p + (i - PAD) * CC, mask=inm[i] & (r1 >= 0) & (r1 < H), other=0.0),)
        for i in tl.static_range(NI):
            v = cur[i].to(COMPUTE)
            new = ()
            for j in tl.static_range(K):  # slot j: output row r - PAD + j, tap row K - 1 - j
                for q in tl.static_range(BW):
                    if (i - q >= 0) and (i - q < K):
                        if FLIP:
                            wv = wts[j * K + (K - 1 - (i - q))]
                        else:
                            wv = wts[(K - 1 - j) * K + (i - q)]
                        new = new + (acc[j * BW + q] + wv * v,)
                    else:
                        new = new + (acc[j * BW + q],)
            acc = new
        o = r - PAD
        if (o >= 0) & (o % STRIDE == 0):
            yo = yb + (o // STRIDE) * ors
            for q in tl.static_range(BW):
                out = acc[q]
                if HAS_BIAS:
                    out += bias
                if HAS_ACC:
                    out += tl.load(ab + o * rs + q * CC, mask=outm[q], other=0.0).to(COMPUTE)
                tl.store(yo + ((n0 + q) // STRIDE) * CC, out.to(y_ptr.dtype.element_ty), mask=outm[q])
        new = ()
        for s in tl.static_range(BW, K * BW):
            new = new + (acc[s],)
        for _ in tl.static_range(BW):
            new = new + (tl.zeros((BC,), dtype=COMPUTE),)
        acc = new


@triton.jit
def _wgrad_cols_kernel(
    x_ptr,  # (B, H, W, CC) dense
    g_ptr,  # (B, H, W, CC) dense: dy
    part_ptr,  # (GROUPS * STRIPS, K * K, CC) fp32: one row of partial sums per program
    H, W, STRIPS, IMGS, B,
    CC: tl.constexpr, K: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, COMPUTE: tl.constexpr,
):
    """d w[ky, kx] = sum over positions of dy(o, n) * x(o + ky - PAD, n + kx - PAD): a program walks the x rows
    of IMGS images for BW columns, keeping the K dy rows that an x row pairs with (K * BW values)."""
    PAD: tl.constexpr = K // 2
    NI: tl.constexpr = BW + K - 1
    pid = tl.program_id(0)
    grp = pid // STRIPS
    n0 = (pid % STRIPS) * BW
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    cmask = cc < CC
    inm = ()
    for i in tl.static_range(NI):
        inm = inm + (cmask & (n0 + (i - PAD) >= 0) & (n0 + (i - PAD) < W),)
    gm = ()
    for q in tl.static_range(BW):
        gm = gm + (cmask & (n0 + q < W),)
    rs = (W * CC).to(tl.int64)
    acc = ()
    for _ in tl.static_range(K * K):
        acc = acc + (tl.zeros((BC,), dtype=COMPUTE),)
    for im in range(IMGS):
        bi = grp * IMGS + im
        bok = bi < B
        xb = x_ptr + bi.to(tl.int64) * H * rs + n0 * CC + cc
        gb = g_ptr + bi.to(tl.int64) * H * rs + n0 * CC + cc
        dq = ()  # dy rows r - PAD .. r + PAD (slot j * BW + q)
        for _ in tl.static_range((PAD + 1) * BW):
            dq = dq + (tl.zeros((BC,), dtype=COMPUTE),)
        for j in tl.static_range(PAD):
            for q in tl.static_range(BW):
                dq = dq + (tl.load(gb + j * rs + q * CC, mask=gm[q] & bok & (j < H), other=0.0).to(COMPUTE),)
        # Rows r + 1 of x and r + 1 + PAD of dy are loaded while row r is computed (raw dtype).
        gn = ()
        for q in tl.static_range(BW):
            gn = gn + (tl.load(gb + PAD * rs + q * CC, mask=gm[q] & bok & (PAD < H), other=0.0),)
        xn = ()
        for i in tl.static_range(NI):
            xn = xn + (tl.load(xb + (i - PAD) * CC, mask=inm[i] & bok, other=0.0),)
        for r in range(0, H):
            gc = gn
            xc = xn
            r1 = r + 1
            rg = r1 + PAD
            gn = ()
            for q in tl.static_range(BW):
                gn = gn + (tl.load(gb + rg * rs + q * CC, mask=gm[q] & bok & (rg < H), other=0.0),)
            xn = ()
            for i in tl.static_range(NI):
                xn = xn + (tl.load(xb + r1 * rs + (i - PAD) * CC, mask=inm[i] & bok & (r1 < H), other=0.0),)
            new = ()
            for s in tl.static_range(BW, K * BW):
                new = new + (dq[s],)
            for q in tl.static_range(BW):
                new = new + (gc[q].to(COMPUTE),)
            dq = new
            for i in tl.static_range(NI):
                v = xc[i].to(COMPUTE)
                upd = ()
                for ky in tl.static_range(K):
                    for kx in tl.static_range(K):
                        if (i - kx >= 0) and (i - kx < BW):
                            upd = upd + (acc[ky * K + kx] + v * dq[(K - 1 - ky) * BW + (i - kx)],)
                        else:
                            upd = upd + (acc[ky * K + kx],)
                acc = upd
    dst = part_ptr + pid.to(tl.int64) * K * K * CC + cc
    for t in tl.static_range(K * K):
        tl.store(dst + t * CC, acc[t], mask=cmask)


@triton.jit
def _synth_kernel(
    t_ptr,  # (B, hc, wc, 4, C) filtered subbands of this level (synthesis 1/2 folded in)
    accin_ptr,  # (B, hc, wc, C) synthesis of the coarser levels (HAS_ACC)
    dst_ptr,  # (B, Hs, Ws, C)
    Hs, Ws, hc, wc, TILES_N, TILES,
    C: tl.constexpr, HAS_ACC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BC: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    pid = tl.program_id(0)
    b = (pid // TILES).to(tl.int64)
    tile = pid % TILES
    s = tl.arange(0, BM * BN)[:, None]
    m = (tile // TILES_N) * BM + s // BN
    n = (tile % TILES_N) * BN + s % BN
    cc = tl.program_id(1) * BC + tl.arange(0, BC)[None, :]
    inside = (m < hc) & (n < wc) & (cc < C)
    pos = b * hc * wc + m.to(tl.int64) * wc + n
    tp = t_ptr + pos * (4 * C) + cc
    t0 = tl.load(tp, mask=inside, other=0.0).to(COMPUTE)
    t1 = tl.load(tp + C, mask=inside, other=0.0).to(COMPUTE)
    t2 = tl.load(tp + 2 * C, mask=inside, other=0.0).to(COMPUTE)
    t3 = tl.load(tp + 3 * C, mask=inside, other=0.0).to(COMPUTE)
    if HAS_ACC:
        t0 += 0.5 * tl.load(accin_ptr + pos * C + cc, mask=inside, other=0.0).to(COMPUTE)
    pp = t0 + t1
    qq = t0 - t1
    rr = t2 + t3
    ss = t2 - t3
    fr = 2 * m
    fc = 2 * n
    top = dst_ptr + b * Hs * Ws * C + (fr.to(tl.int64) * Ws + fc) * C + cc
    ty = dst_ptr.dtype.element_ty
    ml = inside
    mr = inside & (fc + 1 < Ws)
    mb = fr + 1 < Hs
    tl.store(top, (pp + rr).to(ty), mask=ml)
    tl.store(top + C, (pp - rr).to(ty), mask=mr)
    tl.store(top + Ws * C, (qq + ss).to(ty), mask=ml & mb)
    tl.store(top + Ws * C + C, (qq - ss).to(ty), mask=mr & mb)


def _cols_bc(cc: int, cap: int) -> int:
    return _bc(cc, cap)


def dw_cols(x: Tensor, w: Tensor, bias: Optional[Tensor] = None, acc: Optional[Tensor] = None, stride: int = 1,
            flip: bool = False, bw: int = 8, bc: int = 64, warps: int = 2, out_dtype: Optional[torch.dtype] = None,
            ) -> Tensor:
    """Depthwise K x K conv of the dense (B, H, W, CC) ``x`` with (K, K, CC) ``w``; returns dense
    (B, ceil(H/stride), ceil(W/stride), CC)."""
    bsz, h, wd, cc = x.shape
    k = w.shape[0]
    y = torch.empty((bsz, _cdiv(h, stride), _cdiv(wd, stride), cc), device=x.device, dtype=out_dtype or x.dtype)
    strips = _cdiv(wd, bw)
    bcx = _cols_bc(cc, bc)
    _dw_cols_kernel[(bsz * strips, _cdiv(cc, bcx))](
        x, x if acc is None else acc, y, w, w if bias is None else bias, h, wd, strips,
        CC=cc, K=k, BW=bw, BC=bcx, STRIDE=stride, HAS_ACC=acc is not None, HAS_BIAS=bias is not None, FLIP=flip,
        COMPUTE=_compute(x.dtype), num_warps=warps)
    return y


def wgrad_cols(x: Tensor, g: Tensor, k: int, bw: int = 8, bc: int = 64, imgs: int = 4, warps: int = 2) -> Tensor:
    """(K*K, CC) correlations of dense (B, H, W, CC) x and dy, partials summed in a fixed order."""
    bsz, h, wd, cc = x.shape
    strips = _cdiv(wd, bw)
    groups = _cdiv(bsz, imgs)
    bcx = _cols_bc(cc, bc)
    part = torch.empty((groups * strips, k * k, cc), device=x.device, dtype=torch.float32)
    _wgrad_cols_kernel[(groups * strips, _cdiv(cc, bcx))](
        x, g, part, h, wd, strips, imgs, bsz, CC=cc, K=k, BW=bw, BC=bcx, COMPUTE=_compute(x.dtype), num_warps=warps)
    return part.sum(0)


def synth(t: Tensor, accin: Optional[Tensor], hs: int, ws: int, out_dtype: torch.dtype) -> Tensor:
    bsz, hc, wc, _, ch = t.shape
    dst = torch.empty((bsz, hs, ws, ch), device=t.device, dtype=out_dtype)
    bm, bn = 4, 4
    tn = _cdiv(wc, bn)
    tiles = _cdiv(hc, bm) * tn
    bc = _bc(ch, 64)
    _synth_kernel[(bsz * tiles, _cdiv(ch, bc))](
        t, t if accin is None else accin, dst, hs, ws, hc, wc, tn, tiles, C=ch, HAS_ACC=accin is not None,
        BM=bm, BN=bn, BC=bc, COMPUTE=_compute(t.dtype), num_warps=4)
    return dst


def forward_cols(
    x: Tensor, base_w: Tensor, base_b: Optional[Tensor], level_w: Tensor, stride: int = 1, flip: bool = False,
    bw: int = 8, bc: int = 64, warps: int = 2, coefs: Optional[list[Tensor]] = None,
    mid_dtype: Optional[torch.dtype] = None,
) -> Tensor:
    """Model A2: analysis, per level a depthwise conv over the 4C subband channels and a synthesis step, then the
    base conv plus the synthesised levels. Returns y channels-last (B, C, ceil(H/stride), ceil(W/stride))."""
    xd = _dense(x)
    bsz, ch, h, w = xd.shape
    levels, k = level_w.shape[0], base_w.shape[0]
    mid = mid_dtype or x.dtype
    if coefs is None:
        coefs = coefficients(xd, levels)
    sizes = [(h, w)]
    for _ in range(levels):
        sizes.append(((sizes[-1][0] + 1) // 2, (sizes[-1][1] + 1) // 2))
    lw = level_w.permute(0, 2, 3, 1, 4).reshape(levels, k, k, 4 * ch)  # prototype: would be the fold's layout
    acc: Optional[Tensor] = None
    for i in range(levels, 0, -1):
        co = coefs[i - 1]
        hc, wc = sizes[i]
        t = dw_cols(co.view(bsz, hc, wc, 4 * ch), lw[i - 1], flip=flip, bw=bw, bc=bc, warps=warps, out_dtype=mid)
        acc = synth(t.view(bsz, hc, wc, 4, ch), acc, sizes[i - 1][0], sizes[i - 1][1], mid)
    y = dw_cols(xd.permute(0, 2, 3, 1), base_w, base_b, acc, stride, flip, bw, bc, warps)
    return y.permute(0, 3, 1, 2)


def weight_grads_cols(
    x: Tensor, dy: Tensor, levels: int, k: int, bw: int = 8, bc: int = 64, imgs: int = 4, warps: int = 2,
    xsrc: Optional[list[Tensor]] = None, gsrc: Optional[list[Tensor]] = None,
) -> tuple[Tensor, list[Tensor]]:
    """As :func:`weight_grads` (model A), with the explicit-column kernel."""
    x, dy = _dense(x), _dense(dy)
    bsz, ch, h, w = x.shape
    if xsrc is None:
        xsrc = coefficients(x, levels)
    if gsrc is None:
        gsrc = coefficients(dy, levels)
    base = wgrad_cols(x.permute(0, 2, 3, 1), dy.permute(0, 2, 3, 1), k, bw, bc, imgs, warps)
    out = []
    for i in range(levels):
        _, hc, wc, _, _ = xsrc[i].shape
        g = wgrad_cols(xsrc[i].view(bsz, hc, wc, 4 * ch), gsrc[i].view(bsz, hc, wc, 4 * ch), k, bw, bc, imgs, warps)
        out.append(g.reshape(k * k, 4, ch).permute(1, 0, 2))
    return base, out
