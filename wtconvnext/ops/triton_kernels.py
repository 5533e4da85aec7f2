"""Triton kernels of the fused WTConv (Haar) and their launchers. Every tensor they touch is channels-last.

Layout of the computation (L levels, level i = 1..L works at 2^-i resolution):

- ``LL_0 = x``; ``LL_i`` is the raw low-pass of ``LL_{i-1}`` (2x2 block sums / 2, zero-extended). Only this
  low-pass pyramid ever reaches memory (N/3 elements); every detail coefficient is recomputed on chip from the
  2x2 block of ``LL_{i-1}`` it comes from (the Haar butterfly).
- Level kernel for level i: filtered coefficients ``t_i = conv(butterfly(LL_{i-1}), scale_i * W_i)`` on a tile of
  coarse positions, plus the already synthesised coarser levels ``acc_{i+1}`` on the LL subband, then one
  synthesis step to ``acc_i`` at the resolution of ``LL_{i-1}``. At level 1 the same program also adds the base
  conv ``conv(x, base_scale * W) + base_scale * b`` and writes ``y`` (strided), so y is written once.
- Backward: the input gradient is the same WTConv applied to dy with every kernel rotated by 180 degrees (no
  bias); the weight gradients are correlations of the coefficient pyramids of x and dy, accumulated per program
  over a fixed range of positions into fp32 partials that are summed afterwards (deterministic, no atomics).

Why channels-last: a program owns a tile of positions x a block of channels. Channels are contiguous, so every load
and store is a wide vector, one mask per position serves all its channels, and a weight tap is one channel vector
reused by every position of the tile. (The first, plane-walking NCHW kernels spent 2-3 integer / mask / address
instructions per FMA; results/h200/layer_v0_untuned.txt.)

The scales are folded into the weights once per call (``scale * W``, in fp32), so they cost no pass of their own and
their gradients follow from the same correlations. Arithmetic is fp32 (fp64 for fp64 inputs); outputs are stored in
the output tensor's dtype. Per-position offsets are int64 (a single image may pass 2^31 elements); channel offsets
within a position are 32-bit.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["ll_pyramid", "folded_weights", "wtconv_forward", "correlations", "wtconv_weight_grads", "param_grads",
           "TUNING"]


@triton.jit
def _butterfly(p_top, p_bot, m_a, m_b, m_c, m_d, C: tl.constexpr, COMPUTE: tl.constexpr):
    """Twice the four Haar subbands of 2x2 blocks: ``p_top`` points at each block's top-left pixel, ``p_bot`` at
    the one below it; ``m_a..m_d`` mask the four pixels (zero outside the finer map).

    The Haar factor 1/2 is left to the callers, which fold it into a weight or a final scale instead of paying a
    multiply per tap. The right-hand pixels sit ``C`` elements further: a compile-time offset.
    """
    a = tl.load(p_top, mask=m_a, other=0.0).to(COMPUTE)
    b = tl.load(p_top + C, mask=m_b, other=0.0).to(COMPUTE)
    c = tl.load(p_bot, mask=m_c, other=0.0).to(COMPUTE)
    d = tl.load(p_bot + C, mask=m_d, other=0.0).to(COMPUTE)
    ab = a + b
    cd = c + d
    amb = a - b
    cmd = c - d
    return ab + cd, ab - cd, amb + cmd, amb - cmd


@triton.jit
def _ll_kernel(
    src_ptr,  # (B, Hs, Ws, C) dense channels-last: the finer low-pass (x, or a previous level)
    out_ptr,  # (B, Hc, Wc, C) dense channels-last, compute dtype
    Hs, Ws, TILES_N, TILES,
    C: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, COMPUTE: tl.constexpr,
):
    pid = tl.program_id(0)
    bidx = (pid // TILES).to(tl.int64)
    tile = pid % TILES
    s = tl.arange(0, BLOCK_M * BLOCK_N)[:, None]
    m = (tile // TILES_N) * BLOCK_M + s // BLOCK_N
    n = (tile % TILES_N) * BLOCK_N + s % BLOCK_N
    hc = (Hs + 1) // 2
    wc = (Ws + 1) // 2
    cc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    inside = (m < hc) & (n < wc)
    if C % BLOCK_C != 0:
        inside = inside & (cc < C)
    row = Ws * C  # int32: offsets built from it are widened where they can pass 2^31
    p_top = src_ptr + bidx * Hs * row + ((2 * m).to(tl.int64) * row + 2 * n * C) + cc
    bot = 2 * m + 1 < Hs
    right = 2 * n + 1 < Ws
    s0, _, _, _ = _butterfly(p_top, p_top + row, inside, inside & right, inside & bot, inside & bot & right,
                             C, COMPUTE)
    off = bidx * hc * wc * C + (m.to(tl.int64) * wc + n) * C + cc
    tl.store(out_ptr + off, s0 * 0.5, mask=inside)


@triton.jit
def _store_phase(out, cc, cmask, h, w, H, W, val, C: tl.constexpr, STRIDE: tl.constexpr):
    """Store one phase of the synthesised tile into the dense channels-last ``out`` (one image)."""
    mask = cmask & (h < H) & (w < W)
    wo = W
    if STRIDE > 1:
        # Stride is plain subsampling of the full-resolution output.
        mask = mask & (h % STRIDE == 0) & (w % STRIDE == 0)
        h = h // STRIDE
        w = w // STRIDE
        wo = (W + STRIDE - 1) // STRIDE
    tl.store(out + (h.to(tl.int64) * wo + w) * C + cc, val.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _level_fwd_kernel(
    src_ptr,  # (B, Hs, Ws, C): LL_{i-1} (x at level 1)
    acc_ptr,  # (B, Hc, Wc, C): synthesis of the coarser levels (read when HAS_ACC)
    out_ptr,  # (B, Hs, Ws, C) acc_i, or y (B, ceil(Hs/STRIDE), ceil(Ws/STRIDE), C) when IS_LAST
    lw_ptr,  # (4, K, K, C) this level's kernels times their scales and the Haar 1/2 (HAS_LEVEL)
    bw_ptr,  # (K, K, C) base kernel times base_scale (IS_LAST)
    bb_ptr,  # (C,) bias times base_scale (HAS_BIAS)
    Hs, Ws, TILES_N, TILES,
    C: tl.constexpr, K: tl.constexpr, STRIDE: tl.constexpr,
    HAS_LEVEL: tl.constexpr, HAS_ACC: tl.constexpr, IS_LAST: tl.constexpr, HAS_BIAS: tl.constexpr,
    FLIP: tl.constexpr,  # rotate every kernel by 180 degrees (the input-gradient pass)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, COMPUTE: tl.constexpr,
):
    """All tensors dense channels-last. The channel count is a compile-time constant, so a column shift of a tap is
    an immediate offset of the load, and the channel mask disappears when the channel blocks tile C exactly."""
    PAD: tl.constexpr = K // 2
    KK: tl.constexpr = K * K
    BLOCK_S: tl.constexpr = BLOCK_M * BLOCK_N
    pid = tl.program_id(0)
    bidx = (pid // TILES).to(tl.int64)
    tile = pid % TILES
    s = tl.arange(0, BLOCK_S)[:, None]
    m = (tile // TILES_N) * BLOCK_M + s // BLOCK_N  # coarse positions (S, 1)
    n = (tile % TILES_N) * BLOCK_N + s % BLOCK_N
    cc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]  # (1, C)
    if C % BLOCK_C == 0:
        cmask = tl.full((1, BLOCK_C), 1, tl.int1)
    else:
        cmask = cc < C
    row = Ws * C  # int32: offsets built from it are widened where they can pass 2^31
    # Every tap's pixels are fixed offsets from the tile's top-left pixels (2m, 2n).
    origin = src_ptr + bidx * Hs * row + ((2 * m).to(tl.int64) * row + 2 * n * C) + cc  # (S, C)

    # Synthesised value of the four fine pixels (2m + r, 2n + q) of each coarse position.
    y00 = tl.zeros((BLOCK_S, BLOCK_C), dtype=COMPUTE)
    y01 = tl.zeros((BLOCK_S, BLOCK_C), dtype=COMPUTE)
    y10 = tl.zeros((BLOCK_S, BLOCK_C), dtype=COMPUTE)
    y11 = tl.zeros((BLOCK_S, BLOCK_C), dtype=COMPUTE)
    if HAS_LEVEL:
        t0 = tl.zeros((BLOCK_S, BLOCK_C), dtype=COMPUTE)
        t1 = tl.zeros((BLOCK_S, BLOCK_C), dtype=COMPUTE)
        t2 = tl.zeros((BLOCK_S, BLOCK_C), dtype=COMPUTE)
        t3 = tl.zeros((BLOCK_S, BLOCK_C), dtype=COMPUTE)
        for ky in range(K):
            r0 = 2 * (m + ky - PAD)
            # r0 is even, so r0 + 1 >= 0 exactly when r0 >= 0.
            top = cmask & (r0 >= 0) & (r0 < Hs)
            bot = cmask & (r0 >= 0) & (r0 + 1 < Hs)
            p_top = origin + (2 * (ky - PAD)) * row
            p_bot = p_top + row
            if FLIP:
                w_row = lw_ptr + ((K - 1 - ky) * K) * C + cc
            else:
                w_row = lw_ptr + (ky * K) * C + cc
            for kx in tl.static_range(K):
                c0 = 2 * (n + kx - PAD)
                left = (c0 >= 0) & (c0 < Ws)
                right = (c0 >= 0) & (c0 + 1 < Ws)
                s0, s1, s2, s3 = _butterfly(p_top + 2 * (kx - PAD) * C, p_bot + 2 * (kx - PAD) * C,
                                            top & left, top & right, bot & left, bot & right, C, COMPUTE)
                if FLIP:
                    wp = w_row + (K - 1 - kx) * C
                else:
                    wp = w_row + kx * C
                t0 += tl.load(wp, mask=cmask, other=0.0).to(COMPUTE) * s0
                t1 += tl.load(wp + KK * C, mask=cmask, other=0.0).to(COMPUTE) * s1
                t2 += tl.load(wp + 2 * KK * C, mask=cmask, other=0.0).to(COMPUTE) * s2
                t3 += tl.load(wp + 3 * KK * C, mask=cmask, other=0.0).to(COMPUTE) * s3
        if HAS_ACC:
            hc = (Hs + 1) // 2
            wc = (Ws + 1) // 2
            aoff = bidx * hc * wc * C + (m.to(tl.int64) * wc + n) * C + cc
            t0 += tl.load(acc_ptr + aoff, mask=cmask & (m < hc) & (n < wc), other=0.0).to(COMPUTE)
        pp = t0 + t1
        qq = t0 - t1
        rr = t2 + t3
        ss = t2 - t3
        y00 = (pp + rr) * 0.5
        y01 = (pp - rr) * 0.5
        y10 = (qq + ss) * 0.5
        y11 = (qq - ss) * 0.5

    if IS_LAST:
        # Base branch at full resolution for the four phases of the tile, accumulated straight into y.
        for ky in range(K):
            h0 = 2 * m + (ky - PAD)
            mh0 = cmask & (h0 >= 0) & (h0 < Hs)
            mh1 = cmask & (h0 + 1 >= 0) & (h0 + 1 < Hs)
            p0 = origin + (ky - PAD) * row
            p1 = p0 + row
            if FLIP:
                w_row = bw_ptr + ((K - 1 - ky) * K) * C + cc
            else:
                w_row = bw_ptr + (ky * K) * C + cc
            # Columns 2n + q + kx - PAD for q in {0, 1}, kx in [0, K): K + 1 distinct columns, each loaded once.
            for j in tl.static_range(K + 1):
                wc_ = 2 * n + (j - PAD)
                mw = (wc_ >= 0) & (wc_ < Ws)
                v0 = tl.load(p0 + (j - PAD) * C, mask=mh0 & mw, other=0.0).to(COMPUTE)
                v1 = tl.load(p1 + (j - PAD) * C, mask=mh1 & mw, other=0.0).to(COMPUTE)
                if j < K:  # phase q = 0 uses kx = j
                    if FLIP:
                        wq0 = tl.load(w_row + (K - 1 - j) * C, mask=cmask, other=0.0).to(COMPUTE)
                    else:
                        wq0 = tl.load(w_row + j * C, mask=cmask, other=0.0).to(COMPUTE)
                    y00 += wq0 * v0
                    y10 += wq0 * v1
                if j >= 1:  # phase q = 1 uses kx = j - 1
                    if FLIP:
                        wq1 = tl.load(w_row + (K - j) * C, mask=cmask, other=0.0).to(COMPUTE)
                    else:
                        wq1 = tl.load(w_row + (j - 1) * C, mask=cmask, other=0.0).to(COMPUTE)
                    y01 += wq1 * v0
                    y11 += wq1 * v1
        if HAS_BIAS:
            bias = tl.load(bb_ptr + cc, mask=cmask, other=0.0).to(COMPUTE)
            y00 += bias
            y01 += bias
            y10 += bias
            y11 += bias
        ho = (Hs + STRIDE - 1) // STRIDE
        out = out_ptr + bidx * ho * ((Ws + STRIDE - 1) // STRIDE) * C
        _store_phase(out, cc, cmask, 2 * m, 2 * n, Hs, Ws, y00, C, STRIDE)
        _store_phase(out, cc, cmask, 2 * m, 2 * n + 1, Hs, Ws, y01, C, STRIDE)
        _store_phase(out, cc, cmask, 2 * m + 1, 2 * n, Hs, Ws, y10, C, STRIDE)
        _store_phase(out, cc, cmask, 2 * m + 1, 2 * n + 1, Hs, Ws, y11, C, STRIDE)
    else:
        out = out_ptr + bidx * Hs * row
        _store_phase(out, cc, cmask, 2 * m, 2 * n, Hs, Ws, y00, C, 1)
        _store_phase(out, cc, cmask, 2 * m, 2 * n + 1, Hs, Ws, y01, C, 1)
        _store_phase(out, cc, cmask, 2 * m + 1, 2 * n, Hs, Ws, y10, C, 1)
        _store_phase(out, cc, cmask, 2 * m + 1, 2 * n + 1, Hs, Ws, y11, C, 1)


@triton.jit
def _wgrad_kernel(
    xs_ptr,  # (B, Hs, Ws, C) dense channels-last: LL_{i-1} of x (x itself for the base)
    gs_ptr,  # (B, Hs, Ws, C) dense channels-last: LL_{i-1} of dy (dy itself for the base)
    part_ptr,  # (CHUNKS, NSUB, TP, C) fp32 (fp64 for fp64 inputs): this program's partial correlations
    Hs, Ws, ROWS, ROWS_PER,
    C: tl.constexpr, K: tl.constexpr, TP: tl.constexpr, BASE: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, COMPUTE: tl.constexpr,
):
    """Correlations ``sum_q u_s[q + (ky - P, kx - P)] * g_s[q]`` over this program's ROWS_PER rows of positions q.

    Level (BASE false): u, g are the four Haar subbands of LL_{i-1} of x and dy at coarse positions. Base: u = x,
    g = dy at full resolution (one "subband"). All K*K taps are one tensor axis (padded to TP), so dy's butterfly
    is computed once per position for every tap, and the accumulators stay elementwise until one reduction over
    the positions at the end. A program walks whole rows of positions (b, m): the row's tap pointers and row masks
    are set once per row, and a step along the row adds a constant to the pointers, with no index division.
    The base also sums dy in lane K*K (TP > K*K).
    """
    PAD: tl.constexpr = K // 2
    NSUB: tl.constexpr = 1 if BASE else 4
    F: tl.constexpr = 1 if BASE else 2  # pixels per position step along each axis
    chunk = tl.program_id(0)
    cb = tl.program_id(1)
    t = tl.arange(0, TP)[:, None, None]  # (TP, 1, 1) taps, row-major over (ky, kx)
    oy = t // K - PAD
    ox = t % K - PAD
    cc = cb * BLOCK_C + tl.arange(0, BLOCK_C)[None, None, :]  # (1, 1, C)
    if C % BLOCK_C == 0:
        cmask = tl.full((1, 1, BLOCK_C), 1, tl.int1)
    else:
        cmask = cc < C
    tmask = cmask & (t < K * K)
    if BASE:
        sum_lane = (t == K * K).to(COMPUTE)
    row = Ws * C  # int32: offsets built from it are widened where they can pass 2^31
    hm = (Hs + F - 1) // F
    wm = (Ws + F - 1) // F
    tap_off = (F * oy) * row + (F * ox) * C + cc  # (TP, 1, C), loop-invariant
    s = tl.arange(0, BLOCK_S)[None, :, None]  # (1, S, 1) positions along the row
    a0 = tl.zeros((TP, BLOCK_S, BLOCK_C), dtype=COMPUTE)
    if not BASE:
        a1 = tl.zeros((TP, BLOCK_S, BLOCK_C), dtype=COMPUTE)
        a2 = tl.zeros((TP, BLOCK_S, BLOCK_C), dtype=COMPUTE)
        a3 = tl.zeros((TP, BLOCK_S, BLOCK_C), dtype=COMPUTE)
    j0 = chunk * ROWS_PER
    j1 = tl.minimum(j0 + ROWS_PER, ROWS)
    for j in range(j0, j1):
        bidx = j // hm
        m = j - bidx * hm
        rowbase = bidx.to(tl.int64) * Hs * row + (F * m).to(tl.int64) * row  # the row's first pixel
        mm = m + oy  # (TP, 1, 1)
        xrow = xs_ptr + rowbase + tap_off  # (TP, 1, C)
        grow = gs_ptr + rowbase + cc  # (1, 1, C)
        if BASE:
            rmask = tmask & (mm >= 0) & (mm < Hs)
        else:
            r0 = 2 * mm
            top = tmask & (r0 >= 0) & (r0 < Hs)
            bot = tmask & (r0 >= 0) & (r0 + 1 < Hs)
            gbot = cmask & (2 * m + 1 < Hs)
        for n0 in range(0, wm, BLOCK_S):
            n = n0 + s  # (1, S, 1)
            nok = n < wm
            nn = n + ox  # (TP, S, 1)
            if BASE:
                g0 = tl.load(grow + n * C, mask=cmask & nok, other=0.0).to(COMPUTE)
                # Lane K*K (beyond the taps) reads 1 and so sums dy: the bias gradient, without a pass of its own.
                # Past the row's end (n >= wm) g is 0, so those lanes add nothing whatever u reads.
                u0 = tl.load(xrow + n * C, mask=rmask & (nn >= 0) & (nn < Ws), other=sum_lane).to(COMPUTE)
                a0 += u0 * g0
            else:
                gm = cmask & nok
                gright = 2 * n + 1 < Ws
                gp = grow + (2 * n) * C
                g0, g1, g2, g3 = _butterfly(gp, gp + row, gm, gm & gright, gbot & nok, gbot & nok & gright,
                                            C, COMPUTE)
                c0 = 2 * nn
                left = (c0 >= 0) & (c0 < Ws)
                right = (c0 >= 0) & (c0 + 1 < Ws)
                xp = xrow + (2 * n) * C
                u0, u1, u2, u3 = _butterfly(xp, xp + row, top & left, top & right, bot & left, bot & right,
                                            C, COMPUTE)
                a0 += u0 * g0
                a1 += u1 * g1
                a2 += u2 * g2
                a3 += u3 * g3
    # One reduction over the positions at the end; rows of the partial buffer are (chunk, subband, tap).
    t2 = tl.arange(0, TP)[:, None]
    c2 = cb * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    dst = part_ptr + (chunk.to(tl.int64) * NSUB * TP + t2) * C + c2  # (TP, C); the mask broadcasts over taps
    if BASE:
        tl.store(dst, tl.sum(a0, 1).to(part_ptr.dtype.element_ty), mask=c2 < C)
    else:
        # Both butterflies carry twice the subbands: the exact factor 1/4 once here, not two multiplies per tap.
        tl.store(dst, (tl.sum(a0, 1) * 0.25).to(part_ptr.dtype.element_ty), mask=c2 < C)
        tl.store(dst + TP * C, (tl.sum(a1, 1) * 0.25).to(part_ptr.dtype.element_ty), mask=c2 < C)
        tl.store(dst + 2 * TP * C, (tl.sum(a2, 1) * 0.25).to(part_ptr.dtype.element_ty), mask=c2 < C)
        tl.store(dst + 3 * TP * C, (tl.sum(a3, 1) * 0.25).to(part_ptr.dtype.element_ty), mask=c2 < C)


@triton.jit
def _round(v, ROUND: tl.constexpr):
    """``v`` rounded to the dtype ROUND (to nearest even, as torch's casts), still in a wider type.

    bf16 by bit arithmetic on the fp32 value: Triton's interpreter truncates in its bf16 conversion, which would
    make the CPU tests disagree with the GPU by an ulp. (Wider inputs go through fp32 first, as torch does.)"""
    if ROUND == tl.bfloat16:
        f = v.to(tl.float32)
        u = f.to(tl.uint32, bitcast=True)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        return tl.where(f != f, f, r)  # NaN stays NaN
    else:
        return v.to(ROUND)


@triton.jit
def _param(ptr, offs, mask, ROUND: tl.constexpr, COMPUTE: tl.constexpr):
    """A parameter as the layer sees it: rounded to the autocast dtype first when ROUND is set (as a cast would)."""
    v = tl.load(ptr + offs, mask=mask, other=0.0)
    if ROUND is not None:
        v = _round(v, ROUND)
    return v.to(COMPUTE)


@triton.jit
def _store_grad(ptr, offs, val, mask, ROUND: tl.constexpr):
    """A parameter's gradient, rounded through the autocast dtype when ROUND is set (as a cast's backward would)."""
    if ROUND is not None:
        val = _round(val, ROUND)
    elif ptr.dtype.element_ty == tl.bfloat16:
        val = _round(val, tl.bfloat16)  # the same rounding whether the cast is on the fly or not
    tl.store(ptr + offs, val.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _group_tile(C: tl.constexpr, KK: tl.constexpr, TP: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's group (axis 1: 0 the base, i level i), taps (TP, 1), channels (BLOCK_C,) and their masks."""
    t = tl.arange(0, TP)[:, None]
    c1 = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    return tl.program_id(1), t, c1, c1 < C, (t < KK) & (c1[None, :] < C)


@triton.jit
def _fold_kernel(
    w_ptr, b_ptr, bs_ptr, ww_ptr, ws_ptr,  # the layer's parameters, contiguous, in their own dtype
    bw_ptr,  # (K, K, C): weight * base_scale
    bb_ptr,  # (C,): bias * base_scale (HAS_BIAS)
    lw_ptr,  # (L, 4, K, K, C): wavelet_weight * wavelet_scale * 1/2
    C: tl.constexpr, K: tl.constexpr, TP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_C: tl.constexpr,
    COMPUTE: tl.constexpr, ROUND: tl.constexpr,  # None, or the dtype autocast would cast the parameters to
):
    """The kernels' weights, one program per channel block and group (0: base, i: level i), from the parameters'
    (C, ..., K, K) layouts to taps-major, channels-contiguous ones."""
    KK: tl.constexpr = K * K
    g, t, c1, cm1, tm = _group_tile(C, KK, TP, BLOCK_C)
    cc = c1[None, :]
    if g == 0:
        bs = _param(bs_ptr, c1, cm1, ROUND, COMPUTE)
        w = _param(w_ptr, cc * KK + t, tm, ROUND, COMPUTE)
        tl.store(bw_ptr + t * C + cc, (w * bs[None, :]).to(bw_ptr.dtype.element_ty), mask=tm)
        if HAS_BIAS:
            b = _param(b_ptr, c1, cm1, ROUND, COMPUTE)
            tl.store(bb_ptr + c1, (b * bs).to(bb_ptr.dtype.element_ty), mask=cm1)
    else:
        lc = (g - 1) * C + c1  # (level, channel) row of the wavelet parameters
        for s in tl.static_range(4):
            sc = _param(ws_ptr, lc * 4 + s, cm1, ROUND, COMPUTE) * 0.5
            w = _param(ww_ptr, (lc[None, :] * 4 + s) * KK + t, tm, ROUND, COMPUTE)
            tl.store(lw_ptr + (((g - 1) * 4 + s) * KK + t) * C + cc, (w * sc[None, :]).to(lw_ptr.dtype.element_ty),
                     mask=tm)


@triton.jit
def _param_grads_kernel(
    corr_ptr,  # (L + 1, 4, TP, C): what correlations() returns
    w_ptr, b_ptr, bs_ptr, ww_ptr, ws_ptr,  # the layer's parameters, contiguous
    dw_ptr, db_ptr, dbs_ptr, dww_ptr, dws_ptr,  # their gradients, same shapes and dtypes
    C: tl.constexpr, K: tl.constexpr, TP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_C: tl.constexpr,
    COMPUTE: tl.constexpr, ROUND: tl.constexpr,  # as in _fold_kernel
):
    """Chain rule through the folding, one program per channel block and group (0: base, i: level i):
    ``d W = scale * corr``, ``d scale = sum_taps W * corr`` (+ ``bias * sum dy`` for base_scale),
    ``d bias = base_scale * sum dy``."""
    KK: tl.constexpr = K * K
    g, t, c1, cm1, tm = _group_tile(C, KK, TP, BLOCK_C)
    cc = c1[None, :]
    if g == 0:
        corr = tl.load(corr_ptr + t * C + cc, mask=tm, other=0.0).to(COMPUTE)
        dsum = tl.load(corr_ptr + KK * C + c1, mask=cm1, other=0.0).to(COMPUTE)
        bs = _param(bs_ptr, c1, cm1, ROUND, COMPUTE)
        w = _param(w_ptr, cc * KK + t, tm, ROUND, COMPUTE)
        _store_grad(dw_ptr, cc * KK + t, corr * bs[None, :], tm, ROUND)
        dbs = tl.sum(w * corr, 0)
        if HAS_BIAS:
            dbs += _param(b_ptr, c1, cm1, ROUND, COMPUTE) * dsum
        _store_grad(dbs_ptr, c1, dbs, cm1, ROUND)
        _store_grad(db_ptr, c1, bs * dsum, cm1, ROUND)
    else:
        lc = (g - 1) * C + c1
        for s in tl.static_range(4):
            corr = tl.load(corr_ptr + ((g * 4 + s) * TP + t) * C + cc, mask=tm, other=0.0).to(COMPUTE)
            sc = _param(ws_ptr, lc * 4 + s, cm1, ROUND, COMPUTE)
            woff = (lc[None, :] * 4 + s) * KK + t
            w = _param(ww_ptr, woff, tm, ROUND, COMPUTE)
            _store_grad(dww_ptr, woff, corr * sc[None, :], tm, ROUND)
            _store_grad(dws_ptr, lc * 4 + s, tl.sum(w * corr, 0), cm1, ROUND)


# ----------------------------------------------------------------------------------------------------------------
# Launchers


def _compute_dtype(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _tl_dtype(dtype: Optional[torch.dtype]):
    return None if dtype is None else {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16,
                                       torch.float32: tl.float32, torch.float64: tl.float64}[dtype]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# Launch shapes (benchmarks/tune_tiles.py sweeps them). Fixed shapes, not an autotuner: the weight-gradient
# reduction order, hence the bits, must not change from run to run. Override with ``TUNING.update(...)`` or with
# ``WTCONVNEXT_TUNING=<file.json>`` (what tune_tiles.py writes) for another GPU.
# H200 sweep (bf16, WTConvNeXt-T stage shapes; results/h200/tune_v2_bf16.json): 16 positions x 32 channels with
# 4 warps was the fastest forward on stages 1-3 (stage 4: 0.233 vs 0.193 ms with 64 channels). Weight gradients
# (all taps on one axis): 1 position x 64 channels was the fastest of 14 shapes on every stage, bf16 and fp32
# (results/h200/wgrad_taps_v3.txt); 1024 programs of at least 16 positions the fastest bf16 total of 8 splits, with
# 32 MB of partials at most instead of 144 MB for 2048 programs (results/h200/wgrad_chunks_v4.txt). Row-walking
# weight-gradient kernel (results/h200/s11/tune_rows.txt, bf16): 1 position per step still the fastest of 1, 2, 4.
# Its channel block, 32 vs 64, with 2 or 4 warps (results/h200/s12/tune_warps.txt; stages 3-4 there include host
# time): 4 warps beat 2 on 7 of 8 shapes; 32 channels halve the partials' memory, and in kernel time (profiles,
# results/h200/summary_v7.md) made fp32 stages 2-4 7-11 % faster and left bf16 within +-6 %.
TUNING: dict[str, int] = {
    "fwd_positions": 16, "fwd_block_c": 32, "fwd_warps": 4,
    "wgrad_positions": 1, "wgrad_block_c": 32, "wgrad_warps": 4, "wgrad_programs": 1024,
    "wgrad_min_chunk": 16,
}


def _tuning_from_env() -> None:
    path = os.environ.get("WTCONVNEXT_TUNING")
    if not path:
        return
    try:
        values = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise RuntimeError(f"WTCONVNEXT_TUNING={path!r}: cannot read a JSON object of launch shapes ({e})") from e
    if not isinstance(values, dict):
        raise RuntimeError(f"WTCONVNEXT_TUNING={path!r}: expected a JSON object of launch shapes")
    bad = {k: v for k, v in values.items() if k not in TUNING or not isinstance(v, int) or v < 1}
    if bad:
        raise RuntimeError(f"WTCONVNEXT_TUNING={path!r}: unknown keys or non-positive values {bad}; "
                           f"expected positive integers for {sorted(TUNING)}")
    for key in ("fwd_positions", "fwd_block_c", "wgrad_positions", "wgrad_block_c"):
        if key in values and values[key] & (values[key] - 1):
            raise RuntimeError(f"WTCONVNEXT_TUNING={path!r}: {key} must be a power of two, got {values[key]}")
    TUNING.update(values)


_tuning_from_env()


# Plain-Python grid arithmetic: triton.cdiv / next_power_of_2 became constexpr functions (triton 3.8) costing
# microseconds per host call, dozens of times per layer call.
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


# Launch path. ``kernel[grid](...)`` re-derives the kernel's specialization from every argument on every call
# (binder, cache key, option parsing, global-variable checks), and a layer launches 15-36 kernels per step. After a
# kernel's first call through Triton, the compiled kernel is kept under a key at least as fine as what Triton
# specializes on (tensor dtype and 16-byte alignment; ints by value, where Triton looks at == 1, divisible by 16 and
# 32-bit range; constexprs; warps; device) and is launched through its own launcher (``CompiledKernel[grid]``, the
# call Triton's launch ends in). The kernel is keyed by id(): a JITFunction hashes through a locked property.
# H200: 12-15 % less host time per layer call (results/h200/s12/host.txt; 7-15 % in host_call2.txt).
# WTCONVNEXT_FAST_LAUNCH=0 (read at import) keeps every launch on Triton's path.
_FAST_LAUNCH = os.environ.get("WTCONVNEXT_FAST_LAUNCH", "1") != "0" and os.environ.get("TRITON_INTERPRET") != "1"
_COMPILED: dict[tuple, object] = {}
_CONST_NAMES: dict[int, tuple[str, ...]] = {}
_MAX_KEPT = 4096  # ints are keyed by value: bound the cache for workloads of ever-new shapes


def _device_index() -> int:
    # The device Triton's launch uses (its kernel cache is per device; so is a compiled kernel's handle).
    return triton.runtime.driver.active.get_current_device()


def _launch(fn, grid: tuple[int, int], args: tuple, warps: int, **consts: object) -> None:
    """``fn[grid](*args, **consts, num_warps=warps)``: runtime arguments positional (the kernel's leading
    parameters: tensors, ints or None), constexprs by name."""
    global _FAST_LAUNCH
    if not _FAST_LAUNCH:
        fn[grid](*args, **consts, num_warps=warps)
        return
    fid = id(fn)
    names = _CONST_NAMES.get(fid)
    if names is None:
        # The compiled launcher takes every parameter in order: runtime ones, then the constexprs.
        names = _CONST_NAMES[fid] = tuple(fn.arg_names[len(args):])
    try:
        if len(consts) != len(names):
            raise KeyError
        cvals = tuple(consts[n] for n in names)
    except KeyError:
        raise TypeError(
            f"{fn.__name__}: launch passes constexprs {sorted(consts)}, kernel has {sorted(names)}") from None
    key = (fid, _device_index(), warps, cvals,
           *[(a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, Tensor) else a for a in args])
    kernel = _COMPILED.get(key)
    if kernel is None:
        kernel = fn[grid](*args, **consts, num_warps=warps)
        if not all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata", "__getitem__")):
            _FAST_LAUNCH = False  # a Triton whose launch returns something else: stay on its path
        elif len(_COMPILED) < _MAX_KEPT:
            _COMPILED[key] = kernel
        return
    kernel[(grid[0], grid[1], 1)](*args, *cvals)


def _empty_cl(shape: tuple[int, int, int, int], like: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.empty(shape, device=like.device, dtype=dtype, memory_format=torch.channels_last)


def _check_cl(*tensors: Tensor) -> None:
    # The kernels derive every stride from the shape (channel count a compile-time constant).
    for t in tensors:
        if not t.is_contiguous(memory_format=torch.channels_last):
            raise ValueError(
                f"fused WTConv kernels need dense channels-last tensors, got shape {tuple(t.shape)} and strides "
                f"{t.stride()}"
            )


def _pos_tiles(hc: int, wc: int, positions: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, tiles along n, tiles per image) for a coarse hc x wc map."""
    bn = min(_pow2(max(wc, 1)), positions, 8)
    bm = min(_pow2(max(hc, 1)), max(positions // bn, 1))
    tiles_n = _cdiv(wc, bn)
    return bm, bn, tiles_n, _cdiv(hc, bm) * tiles_n


@functools.cache  # called on every launch; a handful of (C, cap) pairs per model
def _block_c(ch: int, cap: int) -> int:
    """Channels per program: the power of two up to ``cap`` (at least 32) that pads C least, the larger on a tie.

    C = 96 takes 32 (three full blocks) rather than 64 (a fourth of the lanes idle): on the H200 the weight
    gradients of the stage-1 shape ran 1.15 vs 1.44 ms (results/h200/s11/tune_rows.txt)."""
    if ch <= cap:
        return _pow2(ch)
    sizes = [cap >> i for i in range(cap.bit_length()) if cap >> i >= min(32, cap)]
    return min(sizes, key=lambda b: (_cdiv(ch, b) * b, -b))


def ll_pyramid(x: Tensor, levels: int) -> list[Tensor]:
    """[LL_0 = x, LL_1, ..., LL_{levels-1}]: the low-pass inputs of every level (channels-last, compute dtype).

    One launch per level. (A single launch computing up to four levels from a tile in registers was tried: its
    reshapes cost 7x the time of these launches on the H200; results/h200/summary_v5.md.)
    """
    _check_cl(x)
    pyr = [x]
    bsz, ch = x.shape[:2]
    for _ in range(1, levels):
        src = pyr[-1]
        hs, ws = src.shape[-2:]
        hc, wc = (hs + 1) // 2, (ws + 1) // 2
        out = _empty_cl((bsz, ch, hc, wc), x, _acc_dtype(x.dtype))
        bm, bn, tiles_n, tiles = _pos_tiles(hc, wc, 16)
        bc = _block_c(ch, 64)
        _launch(
            _ll_kernel, (bsz * tiles, _cdiv(ch, bc)), (src, out, hs, ws, tiles_n, tiles), 4,
            C=ch, BLOCK_M=bm, BLOCK_N=bn, BLOCK_C=bc, COMPUTE=_compute_dtype(x.dtype),
        )
        pyr.append(out)
    return pyr


def folded_weights(
    weight: Tensor, bias: Optional[Tensor], base_scale: Tensor, wavelet_weight: Tensor, wavelet_scale: Tensor,
    round_to: Optional[torch.dtype] = None,
) -> tuple[Tensor, Optional[Tensor], Tensor]:
    """The kernels' weights: scales (and, for the levels, the Haar 1/2) folded in, taps-major and channels
    contiguous, in the compute dtype; one launch.

    Returns ``(base (K, K, C), bias * base_scale (C,) or None, levels (L, 4, K, K, C))``. The forward computes them
    once and the backward reuses them (the input-gradient pass reads them rotated, ``flip=True``). ``round_to``:
    the parameters are first rounded to this dtype (autocast's cast, without a cast pass per parameter).
    """
    ch, k, levels = weight.shape[0], weight.shape[-1], wavelet_weight.shape[0]
    acc = _acc_dtype(round_to or weight.dtype)
    dev = weight.device
    base = torch.empty((k, k, ch), device=dev, dtype=acc)
    fb = None if bias is None else torch.empty((ch,), device=dev, dtype=acc)
    lev = torch.empty((levels, 4, k, k, ch), device=dev, dtype=acc)
    bc = _block_c(ch, 64)
    # The Haar 1/2 of the analysis butterfly goes into the level kernels (exact: a power of two).
    _launch(
        _fold_kernel, (_cdiv(ch, bc), levels + 1),
        (weight.contiguous(), base if bias is None else bias.contiguous(), base_scale.contiguous(),
         wavelet_weight.contiguous(), wavelet_scale.contiguous(), base, base if fb is None else fb, lev), 4,
        C=ch, K=k, TP=_pow2(k * k), HAS_BIAS=bias is not None, BLOCK_C=bc, COMPUTE=_compute_dtype(acc),
        ROUND=_tl_dtype(round_to),
    )
    return base, fb, lev


def wtconv_forward(
    pyr: list[Tensor], out: Tensor, base_w: Tensor, base_b: Optional[Tensor], level_w: Tensor, stride: int,
    flip: bool = False,
) -> Tensor:
    """Run the level kernels coarse to fine on the low-pass pyramid ``pyr`` of the input, writing ``out``.

    ``out`` is channels-last (B, C, ceil(H/stride), ceil(W/stride)); the weights come from :func:`folded_weights`;
    ``flip`` rotates every kernel by 180 degrees (the input-gradient pass).
    """
    x = pyr[0]
    _check_cl(x, out)
    bsz, ch, h, w = x.shape
    levels = level_w.shape[0]
    k = base_w.shape[0]
    compute = _compute_dtype(x.dtype)
    bc = _block_c(ch, TUNING["fwd_block_c"])
    acc: Optional[Tensor] = None
    for i in range(max(levels, 1), 0, -1):  # level i reads pyr[i - 1]; L = 0 runs the base alone
        src = pyr[i - 1]
        hs, ws = src.shape[-2:]
        hc, wc = (hs + 1) // 2, (ws + 1) // 2
        last = i == 1
        dst = out if last else _empty_cl((bsz, ch, hs, ws), x, _acc_dtype(x.dtype))
        bm, bn, tiles_n, tiles = _pos_tiles(hc, wc, TUNING["fwd_positions"])
        aux = acc if acc is not None else dst
        _launch(
            _level_fwd_kernel, (bsz * tiles, _cdiv(ch, bc)),
            (src, aux, dst, level_w[i - 1] if levels else base_w, base_w, base_b if base_b is not None else base_w,
             hs, ws, tiles_n, tiles), TUNING["fwd_warps"],
            C=ch, K=k, STRIDE=stride if last else 1,
            HAS_LEVEL=levels > 0, HAS_ACC=acc is not None, IS_LAST=last, HAS_BIAS=base_b is not None, FLIP=flip,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_C=bc, COMPUTE=compute,
        )
        acc = dst
    return out


def _correlate(xs: Tensor, gs: Tensor, k: int, base: bool, out: Tensor) -> None:
    """Correlations of one level (NSUB = 4) or of the base (NSUB = 1, dy's sum in lane K*K), summed
    deterministically into ``out`` (NSUB, TP, C)."""
    bsz, ch, hs, ws = xs.shape
    hm, wm = (hs, ws) if base else ((hs + 1) // 2, (ws + 1) // 2)
    npos = bsz * hm * wm
    tp = out.shape[1]
    nsub = 1 if base else 4
    bc = _block_c(ch, TUNING["wgrad_block_c"])
    # Positions per step: as tuned for 5x5 taps (32 lanes), fewer for larger kernels so the tile stays as large.
    bs = max(1, min(TUNING["wgrad_positions"], TUNING["wgrad_positions"] * 32 // tp))
    cblocks = _cdiv(ch, bc)
    # Enough programs to fill the GPU, but each with at least wgrad_min_chunk positions: a program's partial
    # (NSUB x TP x channels, fp32) costs memory and traffic, which on small maps outweighs its input. The chunk
    # length depends on the shape only (bitwise reproducible).
    chunks = max(1, min(_cdiv(npos, max(bs, TUNING["wgrad_min_chunk"])), TUNING["wgrad_programs"] // cblocks))
    # Programs take whole rows of positions (no index division per step): as many rows each as spreads them evenly.
    rows = bsz * hm
    rows_per = _cdiv(rows, chunks)
    chunks = _cdiv(rows, rows_per)
    part = torch.empty((chunks, nsub, tp, ch), device=xs.device, dtype=out.dtype)
    _launch(
        _wgrad_kernel, (chunks, cblocks), (xs, gs, part, hs, ws, rows, rows_per), TUNING["wgrad_warps"],
        C=ch, K=k, TP=tp, BASE=base, BLOCK_S=bs, BLOCK_C=bc, COMPUTE=_compute_dtype(xs.dtype),
    )
    torch.sum(part, 0, out=out)  # fixed-order sum over the chunks (no atomics)


def correlations(xpyr: list[Tensor], gpyr: list[Tensor], k: int, levels: int) -> Tensor:
    """Every raw correlation of the weight gradients (w.r.t. the folded weights) in one (L + 1, 4, TP, C) buffer,
    fp32 (fp64 for fp64 inputs), TP = next power of two above K*K.

    Group 0 is the base: ``[0, 0, ky * K + kx]`` = ``sum x[p + (ky - P, kx - P)] * dy[p]`` over batch and map, and
    ``[0, 0, K * K]`` = the sum of dy. Group i = 1..L, subband s: the same for the Haar subbands of LL_{i-1} of x
    and of dy at level i's resolution. Unused rows are left unwritten.
    """
    _check_cl(*xpyr, *gpyr)
    ch = xpyr[0].shape[1]
    corr = torch.empty((levels + 1, 4, _pow2(k * k + 1), ch), device=xpyr[0].device, dtype=_acc_dtype(xpyr[0].dtype))
    _correlate(xpyr[0], gpyr[0], k, True, corr[0, :1])
    for i in range(levels):
        _correlate(xpyr[i], gpyr[i], k, False, corr[i + 1])
    return corr


def wtconv_weight_grads(xpyr: list[Tensor], gpyr: list[Tensor], k: int, levels: int) -> tuple[Tensor, Tensor, Tensor]:
    """The correlations of :func:`correlations` as views: ``level_corr`` (L, C, 4, K, K), ``base_corr`` (C, K, K)
    and the sum of dy (C,)."""
    corr = correlations(xpyr, gpyr, k, levels)
    kk = k * k
    ch = corr.shape[-1]
    level_corr = corr[1:, :, :kk].unflatten(2, (k, k)).permute(0, 4, 1, 2, 3)
    return level_corr, corr[0, 0, :kk].view(k, k, ch).permute(2, 0, 1), corr[0, 0, kk]


def param_grads(
    corr: Tensor, weight: Tensor, bias: Optional[Tensor], base_scale: Tensor, wavelet_weight: Tensor,
    wavelet_scale: Tensor, round_to: Optional[torch.dtype] = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The parameters' gradients from :func:`correlations`, in one launch: ``(d weight, d bias, d base_scale,
    d wavelet_weight, d wavelet_scale)``, each contiguous in its parameter's shape and dtype (d bias in
    base_scale's dtype when there is no bias: the gradient a zero bias would get). With ``round_to`` (as given to
    :func:`folded_weights`), each is rounded through that dtype, as the backward of a cast to it would."""
    ch, k, levels = weight.shape[0], weight.shape[-1], wavelet_weight.shape[0]
    weight, base_scale = weight.contiguous(), base_scale.contiguous()
    wavelet_weight, wavelet_scale = wavelet_weight.contiguous(), wavelet_scale.contiguous()
    d_weight = torch.empty_like(weight)
    d_bias = torch.empty_like(bias if bias is not None else base_scale, memory_format=torch.contiguous_format)
    d_base_scale = torch.empty_like(base_scale)
    d_ww = torch.empty_like(wavelet_weight)
    d_ws = torch.empty_like(wavelet_scale)
    bc = _block_c(ch, 64)
    _launch(
        _param_grads_kernel, (_cdiv(ch, bc), levels + 1),
        (corr, weight, bias if bias is not None else base_scale, base_scale, wavelet_weight, wavelet_scale,
         d_weight, d_bias, d_base_scale, d_ww, d_ws), 4,
        C=ch, K=k, TP=corr.shape[2], HAS_BIAS=bias is not None, BLOCK_C=bc, COMPUTE=_compute_dtype(corr.dtype),
        ROUND=_tl_dtype(round_to),
    )
    return d_weight, d_bias, d_base_scale, d_ww, d_ws
