"""Triton kernels of the fused WTConv (Haar) and their launchers. Every tensor they touch is channels-last.

Kernel model (issue 14; the A/B that chose it is in results/h200/summary.md): the layer is instruction-bound, so each
Haar coefficient is computed once and every loaded value feeds as many FMAs as it can.

- **Analysis** (one launch for up to five levels): a program owns a 2^n x 2^n patch of the input and a channel
  block and writes all four subbands of every level of that patch, ``(B, h_i, w_i, 4, C)`` per level in one flat
  buffer (the input dtype), each level read back from what the same program just wrote.
- **Level convolutions** (one launch for all levels): plain depthwise K x K convolutions over the ``4C`` subband
  channels of every level, written to a second buffer of the same layout.
- **Synthesis** (one launch for up to five levels, coarse to fine, patch-local like the analysis): ``acc_i`` = the
  inverse Haar step of (filtered level i + ``acc_{i+1}`` on its low-pass), stored over the level's coefficients,
  for levels 2 and up (TUNING syn1, the default) or 1 and up.
- **Base convolution** (one launch): ``conv(x, base_scale * W) + base_scale * b + acc_1``, strided, written once;
  with syn1 it computes acc_1 itself from level 1's filtered subbands and acc_2, so acc_1 is never stored.

The convolutions stream rows: a program owns one image, ``BW`` output columns and a block of channels, and walks
down every row. A thread owns channels, not positions: the ``BW + K - 1`` input columns of a row are separate
channel vectors, so each loaded value feeds every tap it meets (``K`` rows in flight x up to ``K`` columns); the ``K``
output rows in flight are loop-carried fp32 accumulators (a tuple that rotates by one row per step) and the next
row's inputs are loaded while the current one is computed. The backward runs the same passes on dy with every
kernel rotated by 180 degrees (the input gradient), and the weight gradients are correlations of the two
coefficient buffers (and of x and dy for the base) by the same row walk, into fp32 partials per program that the
chain-rule kernel sums in a fixed order (deterministic, no atomics).

The scales are folded into the weights once per call (``scale * W``, and the synthesis 1/2 into the level weights),
so they cost no pass of their own and their gradients follow from the same correlations. Arithmetic is fp32 (fp64
for fp64 inputs); stored values take the output tensor's dtype. Offsets that can pass 2^31 are int64.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import threading
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import launch_plan as _plan

__all__ = ["folded_weights", "coefficients", "wtconv_forward", "weight_partials", "level1_partials", "param_grads",
           "level_sizes", "batch_chunks", "TUNING"]

# Levels one analysis / synthesis launch covers: a program's patch is 2^5 x 2^5 pixels of the map it starts from.
PATCH_LEVELS = 5


# ----------------------------------------------------------------------------------------------------------------
# Kernels


@triton.jit
def _level_count(w, B, IMGS, BW: tl.constexpr):
    """Programs a launch over every level gives a level of width w: ceil(B / IMGS) * ceil(w / BW)."""
    return ((B + IMGS - 1) // IMGS) * ((w + BW - 1) // BW)


@triton.jit
def _level_at(H, W, B, J: tl.constexpr, CC: tl.constexpr):
    """(h, w, off): the map after J halvings of (H, W), which level J + 1's coefficients subsample, and where those
    start in a flat per-level buffer of CC channels (int64: levels 1..J come first)."""
    h = H
    w = W
    off = tl.cast(B * 0, tl.int64)
    for _ in tl.static_range(J):
        h = (h + 1) // 2
        w = (w + 1) // 2
        off += tl.cast(B * h * w, tl.int64) * CC
    return h, w, off


@triton.jit
def _level_of(pid, H, W, B, IMGS, BW: tl.constexpr, LEVELS: tl.constexpr, CC: tl.constexpr,
              SKIP1: tl.constexpr = False):
    """Which level program ``pid`` of a launch over every level works on (levels 1..L in order, each with
    _level_count programs): (level, h_i, w_i, its first program, its element offset in a flat per-level buffer of
    CC channels, int64). SKIP1: the launch and the buffer hold levels 2..L only (level 1 has neither programs nor
    a region)."""
    h = H
    w = W
    start = pid * 0
    off = (pid * 0).to(tl.int64)
    lv = pid * 0
    hs = pid * 0
    ws = pid * 0
    st = pid * 0
    of = off
    for i in tl.static_range(LEVELS):
        h = (h + 1) // 2
        w = (w + 1) // 2
        if not (SKIP1 and i == 0):
            n = _level_count(w, B, IMGS, BW)
            sel = (pid >= start) & (pid < start + n)
            lv = tl.where(sel, i + 1, lv)
            hs = tl.where(sel, h, hs)
            ws = tl.where(sel, w, ws)
            st = tl.where(sel, start, st)
            of = tl.where(sel, off, of)
            start += n
            off += tl.cast(B * h * w, tl.int64) * CC
    return lv, hs, ws, st, of


@triton.jit
def _conv_kernel(
    x_ptr,  # (B, H, W, CC) dense; LEVELS > 0: the flat coefficient buffer, level i (B, h_i, w_i, CC) after level i-1
    acc_ptr,  # (B, H, W, CC) added to the output (HAS_ACC); SYN1: level 1's filtered subbands (B, h_1, w_1, 4, CC)
    acc2_ptr,  # SYN1 and HAS_ACC2: acc_2 (B, h_1, w_1, CC), the coarser levels' synthesis, from element acc2_off
    y_ptr,  # (B, ceil(H / STRIDE), ceil(W / STRIDE), CC); LEVELS > 0: a buffer laid out as x_ptr's
    w_ptr,  # (K, K, CC) taps-major; LEVELS > 0: (L, K, K, CC)
    b_ptr,  # (CC,) (HAS_BIAS)
    acc2_off, H, W, B,
    CC: tl.constexpr, K: tl.constexpr, LEVELS: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr,
    STRIDE: tl.constexpr, HAS_ACC: tl.constexpr, HAS_BIAS: tl.constexpr, FLIP: tl.constexpr,
    COMPUTE: tl.constexpr, SYN1: tl.constexpr, HAS_ACC2: tl.constexpr, SYN_AHEAD: tl.constexpr,
    LV0: tl.constexpr = 0, PAIR: tl.constexpr = False,
):
    """Depthwise K x K convolution, 'same' zero padding: of one map (LEVELS = 0), or of every level's subbands in
    one launch (LEVELS = L: the program finds its level). FLIP rotates the kernel by 180 degrees. SYN1 (with
    HAS_ACC, BW even): the base convolution adds level 1's inverse Haar step itself, from the filtered subbands (and
    acc_2 on their low-pass), instead of reading a synthesised acc_1: one full-resolution map less written and
    read, a butterfly per 2 x 2 block more. LV0: levels 1.. of this launch are levels LV0 + 1.. of the weights (a
    launch over levels 2..L passes level 1's map as its (H, W)). PAIR (LEVELS = 0, the last channel block at most
    half full; TUNING conv_pair): that block's programs of an even image b take its channels in lanes 0 .. BC/2 - 1
    and image b + 1's in the other half, and those of an odd image do nothing: no lane idles for want of channels
    (C = 96 in blocks of 64: a fourth of the lanes did)."""
    PAD: tl.constexpr = K // 2
    NI: tl.constexpr = BW + K - 1
    pid = tl.program_id(0)
    if LEVELS > 0:
        lv, h, w, st, off = _level_of(pid, H, W, B, 1, BW, LEVELS, CC)
        local = pid - st
        strips = (w + BW - 1) // BW
        b = (local // strips).to(tl.int64)
        n0 = (local % strips) * BW
        xb0 = x_ptr + off
        yb0 = y_ptr + off
        wb = w_ptr + (lv - 1 + LV0) * (K * K * CC)
    else:
        h = H
        w = W
        strips = (w + BW - 1) // BW
        b = (pid // strips).to(tl.int64)
        n0 = (pid % strips) * BW
        xb0 = x_ptr
        yb0 = y_ptr
        wb = w_ptr
    lanes = tl.arange(0, BC)
    ho = (h + STRIDE - 1) // STRIDE
    wo = (w + STRIDE - 1) // STRIDE
    h1 = (h + 1) // 2
    w1 = (w + 1) // 2
    if PAIR:
        NB: tl.constexpr = (CC + BC - 1) // BC
        HALF: tl.constexpr = BC // 2
        last = tl.program_id(1) == NB - 1
        if last & (b % 2 == 1):  # image b's last channels are image b - 1's program's upper half
            return
        hi = tl.where(last, lanes // HALF, 0)  # 1: a lane of image b + 1 (an int32 offset, not a pointer, a lane)
        cc = tl.where(last, (NB - 1) * BC + lanes % HALF, tl.program_id(1) * BC + lanes)
        cmask = (cc < CC) & (b + hi < B)
        lo = cc + hi * (h * w * CC)  # the lane's element of image b's map, of its output, of its level-1 maps
        loy = cc + hi * (ho * wo * CC)
        lo1 = cc + hi * (h1 * w1 * CC)
        lo4 = cc + hi * (h1 * w1 * 4 * CC)
    else:
        cc = tl.program_id(1) * BC + lanes
        cmask = cc < CC
        lo = cc
        loy = cc
        lo1 = cc
        lo4 = cc
    wts = _conv_weights(wb, cc, cmask, CC, K, COMPUTE)
    if HAS_BIAS:
        bias = tl.load(b_ptr + cc, mask=cmask, other=0.0).to(COMPUTE)
    else:
        bias = tl.zeros(cc.shape, dtype=COMPUTE)
    rs = tl.cast(w * CC, tl.int64)
    xb = xb0 + b * h * rs + n0 * CC + lo
    ab = acc_ptr + b * h * rs + n0 * CC + lo
    ors = tl.cast(wo * CC, tl.int64)
    yb = yb0 + b * ho * ors + loy
    if SYN1:
        # Level 1's positions under this program's column pairs (row 0): BW is even, so pairs are 2 x 2 blocks.
        s1 = (b * h1 * w1 + n0 // 2) * CC
        # SYN1 == 2 (even maps): the filtered subbands polyphase in a full-resolution map (subband s of block
        # (r, j) at pixel (2r + s // 2, 2j + s % 2), _level1_kernel's), y itself: read a row ahead, then overwritten.
        t1p = ab if SYN1 == 2 else acc_ptr + s1 * 4 + lo4
        a2p = acc2_ptr + tl.cast(acc2_off, tl.int64) + s1 + lo1
        rs1 = tl.cast(w1 * CC, tl.int64)
    else:
        t1p = ab
        a2p = ab
        rs1 = rs
    _conv_strip(xb, ab, yb, rs, ors, h, w, n0, cmask, wts, bias, t1p, a2p, rs1,
                CC, K, BW, STRIDE, HAS_ACC, HAS_BIAS, FLIP, COMPUTE, SYN1, HAS_ACC2, SYN_AHEAD)


@triton.jit
def _level1_kernel(
    x_ptr,  # (B, H, W, C) channels-last, H and W even
    y_ptr,  # (B, H, W, C): level 1's filtered subbands, polyphase (see below)
    w_ptr,  # (L, K, K, 4, C): the folded level kernels (taps-major, then subband); level 1's are used
    H, W,
    C: tl.constexpr, K: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, FLIP: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """Level 1's K x K convolutions with its subbands made as the input rows load, no coefficient buffer: a
    program walks down BW of level 1's columns, loads the two full-resolution rows under each level-1 row, makes
    the four subbands of each 2 x 2 block (rounded to x's dtype, as the analysis stores them) and feeds all four
    subbands' rolling row accumulators (_conv_row's multiply-adds, _tap_fmas, in the same order). It writes
    subband s of block (r, j) at pixel (2r + s // 2, 2j + s % 2) of a map of x's shape ('polyphase'), which the
    base convolution (SYN1 == 2) reads a row ahead and overwrites in place: level 1, 3/4 of a coefficient buffer,
    needs no buffer of its own. FLIP rotates the kernels by 180 degrees (the input-gradient pass)."""
    PAD: tl.constexpr = K // 2
    NI: tl.constexpr = BW + K - 1
    h1 = H // 2
    w1 = W // 2
    strips = (w1 + BW - 1) // BW
    pid = tl.program_id(0)
    b = (pid // strips).to(tl.int64)
    j0 = (pid % strips) * BW
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    cmask = cc < C
    ty = x_ptr.dtype.element_ty
    wts = ()
    for t in tl.static_range(K * K):
        for s in tl.static_range(4):
            wts = wts + (tl.load(w_ptr + (t * 4 + s) * C + cc, mask=cmask, other=0.0).to(COMPUTE),)
    inm, outm = _column_masks(cmask, j0, w1, K, BW, 1)
    rs = tl.cast(W * C, tl.int64)
    xb = x_ptr + b * H * rs + cc
    yb = y_ptr + b * H * rs + cc
    acc = ()
    for _ in tl.static_range(4 * K * BW):  # subband-major, then row slot, then column
        acc = acc + (tl.zeros((BC,), dtype=COMPUTE),)
    for r in range(0, h1 + PAD):
        o = r - PAD
        if r < h1:
            top = xb + (2 * r) * rs
            for i in tl.static_range(NI):
                col = 2 * (j0 + (i - PAD))
                a = tl.load(top + col * C, mask=inm[i], other=0.0).to(COMPUTE)
                bb = tl.load(top + (col + 1) * C, mask=inm[i], other=0.0).to(COMPUTE)
                c = tl.load(top + rs + col * C, mask=inm[i], other=0.0).to(COMPUTE)
                d = tl.load(top + rs + (col + 1) * C, mask=inm[i], other=0.0).to(COMPUTE)
                v = _haar(a, bb, c, d, ty, COMPUTE)  # as _analysis_level stores them
                for s in tl.static_range(4):
                    acc = _tap_fmas(acc, v[s], wts, i, K, BW, FLIP, 4, s)
        if o >= 0:
            for s in tl.static_range(4):
                for q in tl.static_range(BW):
                    p = yb + (2 * o + s // 2) * rs + (2 * (j0 + q) + s % 2) * C
                    tl.store(p, acc[(s * K) * BW + q].to(y_ptr.dtype.element_ty), mask=outm[q])
        acc = _rotate_rows(acc, K, BW, 4)


@triton.jit
def _conv_weights(wb, cc, cmask, CC: tl.constexpr, K: tl.constexpr, COMPUTE: tl.constexpr):
    """The K*K taps' weight vectors (taps-major, CC channels apart) of the channels ``cc``, in COMPUTE."""
    wts = ()
    for t in tl.static_range(K * K):
        wts = wts + (tl.load(wb + t * CC + cc, mask=cmask, other=0.0).to(COMPUTE),)
    return wts


@triton.jit
def _column_masks(cmask, n0, w, K: tl.constexpr, BW: tl.constexpr, STRIDE: tl.constexpr):
    """The masks of a strip of BW output columns from n0 of a w-column map: its BW + K - 1 input columns (zero
    padding outside the map) and its output columns (in the map, and on the stride's grid)."""
    PAD: tl.constexpr = K // 2
    inm = ()
    for i in tl.static_range(BW + K - 1):
        inm = inm + (cmask & (n0 + (i - PAD) >= 0) & (n0 + (i - PAD) < w),)
    outm = ()
    for q in tl.static_range(BW):
        if STRIDE > 1:
            outm = outm + (cmask & (n0 + q < w) & ((n0 + q) % STRIDE == 0),)
        else:
            outm = outm + (cmask & (n0 + q < w),)
    return inm, outm


@triton.jit
def _conv_strip(xb, ab, yb, rs, ors, h, w, n0, cmask, wts, bias, t1p, a2p, rs1,
                CC: tl.constexpr, K: tl.constexpr, BW: tl.constexpr, STRIDE: tl.constexpr, HAS_ACC: tl.constexpr,
                HAS_BIAS: tl.constexpr, FLIP: tl.constexpr, COMPUTE: tl.constexpr, SYN1: tl.constexpr,
                HAS_ACC2: tl.constexpr, SYN_AHEAD: tl.constexpr):
    """One strip of BW output columns from column n0 of an (h, w) map, walked down every row: ``xb`` / ``ab`` point
    at row 0, column n0 of the input / the added map (row stride ``rs``), ``yb`` at the output's row 0, column 0
    (row stride ``ors``); the channel vectors take the shape of ``cmask``."""
    PAD: tl.constexpr = K // 2
    NI: tl.constexpr = BW + K - 1
    inm, outm = _column_masks(cmask, n0, w, K, BW, STRIDE)
    acc = ()
    for _ in tl.static_range(K * BW):
        acc = acc + (tl.zeros(cmask.shape, dtype=COMPUTE),)
    # The next row is loaded while this one is computed (loop-carried, raw dtype): the FMAs hide the latency.
    nxt = ()
    for i in tl.static_range(NI):
        nxt = nxt + (tl.load(xb + (i - PAD) * CC, mask=inm[i] & (h > 0), other=0.0),)
    if SYN1 and SYN_AHEAD:  # the first output row's level-1 values ride behind the row's (see _conv_row)
        nxt = nxt + _syn1_ahead(t1p, a2p, h * 0 - PAD, h, rs1, n0, w, cmask, CC, BW, HAS_ACC2, True, COMPUTE,
                                SYN_AHEAD, SYN1 == 2)
    # Input rows 0 .. h+PAD-1 in four loops: the rows in the middle, whose next row exists and which complete an
    # output row, without the row tests (in each load's mask and around the stores) that the edges need (one loop
    # testing every row ran at 0.94-0.95x in the input gradient on the H200, session 20); the padding rows below
    # the map only store and rotate. The padding rows above it are not walked at all: they would add w * 0 to
    # accumulators that are still zero. Both are 2 * PAD of h + 2 * PAD rows' multiply-adds, which the small
    # maps' levels felt most (at 14 x 14, levels 7 / 4 / 2 rows: 36 / 50 / 67 %; ncu, session 40).
    mid = tl.maximum(h - 1, PAD)
    for r in range(0, PAD):
        acc, nxt = _conv_row(acc, nxt, r, xb, rs, h, w, n0, inm, outm, cmask, wts, bias, ab, yb, ors,
                             t1p, a2p, rs1, CC, K, BW, STRIDE, HAS_ACC, HAS_BIAS, FLIP, COMPUTE, SYN1,
                             HAS_ACC2, True, False, SYN_AHEAD)
    for r in range(PAD, mid):
        acc, nxt = _conv_row(acc, nxt, r, xb, rs, h, w, n0, inm, outm, cmask, wts, bias, ab, yb, ors,
                             t1p, a2p, rs1, CC, K, BW, STRIDE, HAS_ACC, HAS_BIAS, FLIP, COMPUTE, SYN1,
                             HAS_ACC2, False, False, SYN_AHEAD)
    for r in range(mid, h):
        acc, nxt = _conv_row(acc, nxt, r, xb, rs, h, w, n0, inm, outm, cmask, wts, bias, ab, yb, ors,
                             t1p, a2p, rs1, CC, K, BW, STRIDE, HAS_ACC, HAS_BIAS, FLIP, COMPUTE, SYN1,
                             HAS_ACC2, True, False, SYN_AHEAD)
    for r in range(tl.maximum(h, mid), h + PAD):
        acc, nxt = _conv_row(acc, nxt, r, xb, rs, h, w, n0, inm, outm, cmask, wts, bias, ab, yb, ors,
                             t1p, a2p, rs1, CC, K, BW, STRIDE, HAS_ACC, HAS_BIAS, FLIP, COMPUTE, SYN1,
                             HAS_ACC2, True, True, SYN_AHEAD)


@triton.jit
def _conv_row(acc, nxt, r, xb, rs, h, w, n0, inm, outm, cmask, wts, bias, ab, yb, ors, t1p, a2p, rs1,
              CC: tl.constexpr, K: tl.constexpr, BW: tl.constexpr, STRIDE: tl.constexpr, HAS_ACC: tl.constexpr,
              HAS_BIAS: tl.constexpr, FLIP: tl.constexpr, COMPUTE: tl.constexpr, SYN1: tl.constexpr,
              HAS_ACC2: tl.constexpr, EDGE: tl.constexpr, PADROW: tl.constexpr, SYN_AHEAD: tl.constexpr):
    """Input row r of _conv_kernel: the next row's load, the row's multiply-adds into the K x BW rolling
    accumulators, and output row r - PAD's store. EDGE: the next row may not exist and the output row may not
    either (rows 0 .. PAD-1 and the last PAD + 1); else neither is tested. PADROW: row r is padding below the map
    (no load, no multiply-adds: the store and the rotation only). SYN_AHEAD (with SYN1): ``nxt`` also carries
    level 1's values under output row r - PAD (loaded a row ahead), and this row loads those of the next."""
    PAD: tl.constexpr = K // 2
    NI: tl.constexpr = BW + K - 1
    cur = nxt
    r1 = r + 1
    p = xb + r1 * rs
    o = r - PAD
    syn = ()
    if SYN1 and SYN_AHEAD:
        NS: tl.constexpr = BW if SYN_AHEAD == 2 else (BW // 2) * (5 if HAS_ACC2 else 4)
        for i in tl.static_range(NI, NI + NS):
            syn = syn + (cur[i],)
    if PADROW:
        if SYN1 and SYN_AHEAD:  # the row values stay as they are (unused); the level-1 term comes below
            nxt = ()
            for i in tl.static_range(NI):
                nxt = nxt + (cur[i],)
    else:
        nxt = ()
        for i in tl.static_range(NI):
            if EDGE:
                nxt = nxt + (tl.load(p + (i - PAD) * CC, mask=inm[i] & (r1 < h), other=0.0),)
            else:
                nxt = nxt + (tl.load(p + (i - PAD) * CC, mask=inm[i], other=0.0),)
    if SYN1 and SYN_AHEAD:
        nxt = nxt + _syn1_ahead(t1p, a2p, o + 1, h, rs1, n0, w, cmask, CC, BW, HAS_ACC2, EDGE, COMPUTE, SYN_AHEAD,
                                SYN1 == 2)
    if not PADROW:
        for i in tl.static_range(NI):
            acc = _tap_fmas(acc, cur[i].to(COMPUTE), wts, i, K, BW, FLIP)
    if EDGE:
        if (o >= 0) & (o % STRIDE == 0):
            _conv_store(acc, o, yb, ors, ab, rs, outm, bias, t1p, a2p, rs1, n0, w, cmask, syn,
                        CC, BW, STRIDE, HAS_ACC, HAS_BIAS, COMPUTE, SYN1, HAS_ACC2, SYN_AHEAD)
    elif STRIDE > 1:
        if o % STRIDE == 0:
            _conv_store(acc, o, yb, ors, ab, rs, outm, bias, t1p, a2p, rs1, n0, w, cmask, syn,
                        CC, BW, STRIDE, HAS_ACC, HAS_BIAS, COMPUTE, SYN1, HAS_ACC2, SYN_AHEAD)
    else:
        _conv_store(acc, o, yb, ors, ab, rs, outm, bias, t1p, a2p, rs1, n0, w, cmask, syn,
                    CC, BW, STRIDE, HAS_ACC, HAS_BIAS, COMPUTE, SYN1, HAS_ACC2, SYN_AHEAD)
    return _rotate_rows(acc, K, BW), nxt


@triton.jit
def _tap_fmas(acc, v, wts, i: tl.constexpr, K: tl.constexpr, BW: tl.constexpr, FLIP: tl.constexpr,
              NS: tl.constexpr = 1, S: tl.constexpr = 0):
    """``acc`` after input column i's value ``v`` met every tap it reaches: group S of the NS groups of K x BW
    rolling accumulators in ``acc`` (slot j: output row r - PAD + j, through tap row K - 1 - j), weighted by
    subband S of the NS a tap has in ``wts``; the other groups as they are. FLIP: the kernel rotated by 180
    degrees."""
    new = ()
    for t in tl.static_range(S * K * BW):
        new = new + (acc[t],)
    for j in tl.static_range(K):
        for q in tl.static_range(BW):
            if (i - q >= 0) and (i - q < K):
                if FLIP:
                    wv = wts[(j * K + (K - 1 - (i - q))) * NS + S]
                else:
                    wv = wts[((K - 1 - j) * K + (i - q)) * NS + S]
                new = new + (acc[(S * K + j) * BW + q] + wv * v,)
            else:
                new = new + (acc[(S * K + j) * BW + q],)
    for t in tl.static_range((S + 1) * K * BW, NS * K * BW):
        new = new + (acc[t],)
    return new


@triton.jit
def _rotate_rows(acc, K: tl.constexpr, BW: tl.constexpr, NS: tl.constexpr = 1):
    """Each of the NS groups of K x BW rolling accumulators in ``acc`` one row on: slot j takes slot j + 1's, the
    last starts at zero."""
    new = ()
    for g in tl.static_range(NS):
        for k in tl.static_range(BW, K * BW):
            new = new + (acc[g * K * BW + k],)
        for _ in tl.static_range(BW):
            new = new + (tl.zeros_like(acc[0]),)
    return new


@triton.jit
def _conv_store(acc, o, yb, ors, ab, rs, outm, bias, t1p, a2p, rs1, n0, w, cmask, syn_raw,
                CC: tl.constexpr, BW: tl.constexpr, STRIDE: tl.constexpr, HAS_ACC: tl.constexpr,
                HAS_BIAS: tl.constexpr, COMPUTE: tl.constexpr, SYN1: tl.constexpr, HAS_ACC2: tl.constexpr,
                SYN_AHEAD: tl.constexpr):
    """Output row o of _conv_kernel (the first BW accumulators), with the bias and acc_1 (read, or synthesised
    from level 1's subbands: SYN1) added. ``syn_raw``, carried from the row before (SYN_AHEAD, see _syn1_ahead):
    level 1's raw values as _syn1_loads gives them (1) or acc_1 itself (2); () with SYN_AHEAD 0, loaded here."""
    yo = yb + (o // STRIDE) * ors
    if SYN1:
        if not SYN_AHEAD:
            syn_raw = _syn1_loads(t1p, a2p, o, 0, rs1, n0, w, cmask, CC, BW, HAS_ACC2, False, SYN1 == 2)
        syn = syn_raw if SYN_AHEAD == 2 else _syn1_pairs(syn_raw, o, BW, HAS_ACC2, COMPUTE)
    for q in tl.static_range(BW):
        out = acc[q]
        if HAS_BIAS:
            out += bias
        if HAS_ACC:
            if SYN1:
                out += syn[q]
            else:
                out += tl.load(ab + o * rs + q * CC, mask=outm[q], other=0.0).to(COMPUTE)
        tl.store(yo + ((n0 + q) // STRIDE) * CC, out.to(yb.dtype.element_ty), mask=outm[q])


@triton.jit
def _syn1_loads(t1p, a2p, o, h, rs1, n0, w, cmask, CC: tl.constexpr, BW: tl.constexpr, HAS_ACC2: tl.constexpr,
                EDGE: tl.constexpr, POLY: tl.constexpr = False):
    """The raw values (input dtype) of level 1's filtered subbands (4, CC) (+ acc_2 on their low-pass) under
    full-resolution row ``o`` of the BW // 2 2 x 2 blocks from column n0; EDGE: row o may lie outside 0 .. h - 1
    (then they load as zeros)."""
    r1_ = (o // 2) * rs1
    vals = ()
    for pq in tl.static_range(BW // 2):
        m = cmask & (n0 + 2 * pq < w)
        if EDGE:
            m = m & (o >= 0) & (o < h)
        for s in tl.static_range(4):
            if POLY:  # polyphase (SYN1 == 2): rows of 2 * rs1 (an even map)
                tp = t1p + 4 * r1_ + (s // 2) * (2 * rs1) + (2 * pq + s % 2) * CC
            else:
                tp = t1p + 4 * (r1_ + pq * CC) + s * CC
            vals = vals + (tl.load(tp, mask=m, other=0.0),)
        if HAS_ACC2:
            vals = vals + (tl.load(a2p + r1_ + pq * CC, mask=m, other=0.0),)
    return vals


@triton.jit
def _syn1_pairs(vals, o, BW: tl.constexpr, HAS_ACC2: tl.constexpr, COMPUTE: tl.constexpr):
    """acc_1 at full-resolution row ``o`` in the BW columns of _syn1_loads' ``vals``, in COMPUTE."""
    NV: tl.constexpr = 5 if HAS_ACC2 else 4
    syn = ()
    for pq in tl.static_range(BW // 2):  # one block's subbands serve both its columns
        left, right = _haar_pair(vals, pq * NV, o, HAS_ACC2, COMPUTE)
        syn = syn + (left, right)
    return syn


@triton.jit
def _syn1_ahead(t1p, a2p, o, h, rs1, n0, w, cmask, CC: tl.constexpr, BW: tl.constexpr, HAS_ACC2: tl.constexpr,
                EDGE: tl.constexpr, COMPUTE: tl.constexpr, MODE: tl.constexpr, POLY: tl.constexpr = False):
    """What a row carries for output row ``o``'s level-1 term (TUNING syn1_ahead): MODE 1 the raw values as
    _syn1_loads gives them; MODE 2 acc_1 itself (BW values in COMPUTE: fewer to carry, no repacking of raw halves,
    but the butterfly waits on the loads within the row)."""
    vals = _syn1_loads(t1p, a2p, o, h, rs1, n0, w, cmask, CC, BW, HAS_ACC2, EDGE, POLY)
    if MODE == 2:
        vals = _syn1_pairs(vals, o, BW, HAS_ACC2, COMPUTE)
    return vals


@triton.jit
def _haar_pair(vals, i: tl.constexpr, o, HAS_ACC2: tl.constexpr, COMPUTE: tl.constexpr):
    """acc_1 at full-resolution row ``o`` in the two columns of one 2 x 2 block (left, right), in COMPUTE: the
    inverse Haar step of level 1's filtered subbands ``vals[i:i + 4]`` (+ acc_2, ``vals[i + 4]``, on the low-pass),
    as _synthesis_level computes it, picked by the row's parity."""
    t0 = vals[i].to(COMPUTE)
    t1 = vals[i + 1].to(COMPUTE)
    t2 = vals[i + 2].to(COMPUTE)
    t3 = vals[i + 3].to(COMPUTE)
    if HAS_ACC2:
        # t carries the synthesis 1/2 (folded into the weights); the coarser levels' sum needs it too.
        t0 += 0.5 * vals[i + 4].to(COMPUTE)
    if o % 2 == 0:  # top row of the 2 x 2 block
        ab = t0 + t1
        cd = t2 + t3
    else:
        ab = t0 - t1
        cd = t2 - t3
    return ab + cd, ab - cd


@triton.jit
def _wgrad_kernel(
    x_ptr,  # (B, H, W, CC) dense x; LEVELS > 0: the flat coefficient buffer of x
    g_ptr,  # the same for dy
    part_ptr,  # (rows, TP, CC) fp32: one row of partial sums per program (taps, then dy's sum in lane K*K)
    H, W, B, IMGS,
    G0, GT,  # the image groups of this launch start at group G0 of a batch of GT groups (the partial rows' layout)
    CC: tl.constexpr, K: tl.constexpr, TP: tl.constexpr, LEVELS: tl.constexpr, BW: tl.constexpr,
    BC: tl.constexpr, DSUM: tl.constexpr, COMPUTE: tl.constexpr, UNROLL: tl.constexpr,
    SKIP1: tl.constexpr = False, INNER: tl.constexpr = False, NARROW: tl.constexpr = 0,
):
    """d w[ky, kx] = sum over positions of dy(o, n) * x(o + ky - PAD, n + kx - PAD): a program walks the x rows
    of IMGS images for BW columns, keeping the K dy rows an x row pairs with; of one map (LEVELS = 0), or of every
    level's subbands in one launch. DSUM: also the sum of dy (the bias gradient). The B images of a launch may be a
    chunk of a larger batch: each program writes the row it has in the whole batch's launch (level-major, then
    group, then strip), so the partials and their fixed-order sum do not depend on the chunking. SKIP1: the
    coefficient buffers and the partial rows hold levels 2..L only (the launch runs their programs). NARROW: see
    _wgrad_program."""
    _wgrad_program(tl.program_id(0), tl.program_id(1), x_ptr, g_ptr, part_ptr, H, W, B, IMGS, G0, GT, CC, K, TP,
                   LEVELS, BW, BC, DSUM, COMPUTE, UNROLL, SKIP1, INNER, NARROW)


@triton.jit
def _wgrad_pair_kernel(
    x_ptr, g_ptr,  # (B, H, W, C) dense x and dy
    bpart_ptr,  # (R0 rows of the whole batch, TP, C) fp32: the base's partials, dy's sum in lane K*K
    cx_ptr, cg_ptr,  # the flat coefficient buffers of x and dy
    lpart_ptr,  # (rows, TP, 4C) fp32: every level's partials
    H, W, B, IMGS, G0, GT,  # as _wgrad_kernel's
    R0,  # programs of the base (axis 0); the levels' follow
    C: tl.constexpr, K: tl.constexpr, TP: tl.constexpr, LEVELS: tl.constexpr, BW: tl.constexpr,
    BC0: tl.constexpr, BC: tl.constexpr,  # channels per program of the base and of the levels
    COMPUTE: tl.constexpr, UNROLL: tl.constexpr, SKIP1: tl.constexpr = False, INNER: tl.constexpr = False,
    NARROW: tl.constexpr = 0,
):
    """_wgrad_kernel's two launches (the base map, every level's subbands) as one: a launch less per backward.
    Axis 1 runs over the levels' 4C / BC channel blocks; the base's programs past its C / BC0 blocks do nothing.
    SKIP1: as _wgrad_kernel's (level 1 runs in a launch of its own)."""
    pid = tl.program_id(0)
    cb = tl.program_id(1)
    NB0: tl.constexpr = (C + BC0 - 1) // BC0
    NB: tl.constexpr = (4 * C + BC - 1) // BC
    if pid < R0:
        if cb < NB0:
            _wgrad_program(pid, cb, x_ptr, g_ptr, bpart_ptr, H, W, B, IMGS, G0, GT, C, K, TP, 0, BW, BC0, True,
                           COMPUTE, UNROLL, False, INNER)
    else:
        if cb < NB:
            _wgrad_program(pid - R0, cb, cx_ptr, cg_ptr, lpart_ptr, H, W, B, IMGS, G0, GT, 4 * C, K, TP, LEVELS,
                           BW, BC, False, COMPUTE, UNROLL, SKIP1, INNER, NARROW)


# noinline: the paired kernel's two walks stay separate functions, and Triton's TritonGPUCoalesce pass, quadratic
# in a function's size, compiles it in 49 s instead of 89 (sm_90, results/cpu/compile_time.txt; same loop code).
@triton.jit(noinline=True)
def _wgrad_program(pid, cb, x_ptr, g_ptr, part_ptr, H, W, B, IMGS, G0, GT, CC: tl.constexpr, K: tl.constexpr,
                   TP: tl.constexpr, LEVELS: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, DSUM: tl.constexpr,
                   COMPUTE: tl.constexpr, UNROLL: tl.constexpr, SKIP1: tl.constexpr, INNER: tl.constexpr = False,
                   NARROW: tl.constexpr = 0):
    """Program ``pid`` (of its map or maps) and channel block ``cb`` of _wgrad_kernel. NARROW (2 .. BW - 1; levels
    only): a level at most NARROW columns wide (one strip) walks a strip of NARROW columns, one at most NARROW // 2
    wide a strip of NARROW // 2, rolled (TUNING wgrad_narrow): a wider strip's extra columns only add products with
    dy's zero padding, so the partial row is the same bit for bit."""
    if LEVELS > 0:
        lv, h, w, st, off = _level_of(pid, H, W, B, IMGS, BW, LEVELS, CC, SKIP1)
        local = pid - st
        first, _ = _level_rows(lv, H, W, GT * IMGS, IMGS, BW, LEVELS, SKIP1)  # (level 1's rows: their own buffer)
        xb0 = x_ptr + off
        gb0 = g_ptr + off
    else:
        h = H
        w = W
        local = pid
        first = pid * 0
        xb0 = x_ptr
        gb0 = g_ptr
    strips = (w + BW - 1) // BW
    row = first + G0 * strips + local
    cc = cb * BC + tl.arange(0, BC)
    dst = part_ptr + row.to(tl.int64) * TP * CC + cc
    # At most NARROW columns: one strip (n0 = 0, grp = local), its row where the full width's would be.
    if LEVELS > 0 and NARROW > 1 and NARROW < BW:
        if w <= NARROW // 2:
            _wgrad_strip(xb0, gb0, dst, h, w, 0, local, B, IMGS, cc, cc < CC, CC, K, NARROW // 2, DSUM, COMPUTE,
                         False)
        elif w <= NARROW:
            _wgrad_strip(xb0, gb0, dst, h, w, 0, local, B, IMGS, cc, cc < CC, CC, K, NARROW, DSUM, COMPUTE, False)
        else:
            _wgrad_strip(xb0, gb0, dst, h, w, (local % strips) * BW, local // strips, B, IMGS, cc, cc < CC, CC, K, BW,
                         DSUM, COMPUTE, UNROLL, INNER and (CC % BC == 0))
    else:
        _wgrad_strip(xb0, gb0, dst, h, w, (local % strips) * BW, local // strips, B, IMGS, cc, cc < CC, CC, K, BW,
                     DSUM, COMPUTE, UNROLL, INNER and (CC % BC == 0))


@triton.jit
def _wgrad_strip(xb0, gb0, dst, h, w, n0, grp, B, IMGS, cc, cmask, CC: tl.constexpr, K: tl.constexpr,
                 BW: tl.constexpr, DSUM: tl.constexpr, COMPUTE: tl.constexpr, UNROLL: tl.constexpr,
                 INNER: tl.constexpr = False):
    """One partial row of _wgrad_kernel: BW columns from n0 of images grp * IMGS .. of an (h, w) map whose image 0
    starts at ``xb0`` / ``gb0`` (x, dy; CC channels a pixel), into ``dst`` (the row's tap 0, at channels ``cc``).
    INNER (with UNROLL; every channel of ``cc`` real): the unrolled rows of a strip inside the map without masks
    (TUNING wgrad_inner)."""
    PAD: tl.constexpr = K // 2
    NI: tl.constexpr = BW + K - 1
    inm, gm = _column_masks(cmask, n0, w, K, BW, 1)
    rs = tl.cast(w * CC, tl.int64)
    acc = ()
    for _ in tl.static_range(K * K):
        acc = acc + (tl.zeros(cmask.shape, dtype=COMPUTE),)
    dsum = tl.zeros(cmask.shape, dtype=COMPUTE)
    for im in range(IMGS):
        bi = grp * IMGS + im
        bok = bi < B
        xb = xb0 + bi.to(tl.int64) * h * rs + n0 * CC + cc
        gb = gb0 + bi.to(tl.int64) * h * rs + n0 * CC + cc
        dq = ()  # dy rows r - PAD .. r + PAD, slot j * BW + q
        for _ in tl.static_range((PAD + 1) * BW):
            dq = dq + (tl.zeros(cmask.shape, dtype=COMPUTE),)
        for j in tl.static_range(PAD):
            for q in tl.static_range(BW):
                dq = dq + (tl.load(gb + j * rs + q * CC, mask=gm[q] & bok & (j < h), other=0.0).to(COMPUTE),)
        # Rows r + 1 of x and r + 1 + PAD of dy are loaded while row r is computed (raw dtype).
        gn = ()
        for q in tl.static_range(BW):
            gn = gn + (tl.load(gb + PAD * rs + q * CC, mask=gm[q] & bok & (PAD < h), other=0.0),)
        xn = ()
        for i in tl.static_range(NI):
            xn = xn + (tl.load(xb + (i - PAD) * CC, mask=inm[i] & bok & (h > 0), other=0.0),)
        # The rows whose next x and dy rows both exist (in unrolled blocks of K with UNROLL: the K dy rows in flight
        # rotate back to where they started, so the loop carries them without register moves), then the last
        # PAD + 1 rows with the row tests.
        mid = 0
        if UNROLL:
            mid = tl.maximum(h - 1 - PAD, 0) // K * K
            # INNER: a strip whose columns all lie in the map, of an image in the batch (most of them), loads
            # without masks: a masked load with other=0 first zeroes its register, and the masks outnumber the
            # predicate registers (sm_90: P2R / ISETP / LOP3 to rebuild them).
            if INNER and bok & (n0 >= PAD) & (n0 + BW + PAD <= w):
                acc, dq, gn, xn, dsum = _wgrad_blocks(acc, dq, gn, xn, dsum, mid, xb, gb, rs, h, inm, gm, bok,
                                                      CC, K, BW, DSUM, COMPUTE, False)
            else:
                acc, dq, gn, xn, dsum = _wgrad_blocks(acc, dq, gn, xn, dsum, mid, xb, gb, rs, h, inm, gm, bok,
                                                      CC, K, BW, DSUM, COMPUTE, True)
        for r in range(mid, h):
            acc, dq, gn, xn, dsum = _wgrad_xrow(acc, dq, gn, xn, dsum, r, xb, gb, rs, h, inm, gm, bok,
                                                CC, K, BW, DSUM, COMPUTE, True)
    for t in tl.static_range(K * K):
        tl.store(dst + t * CC, acc[t].to(dst.dtype.element_ty), mask=cmask)
    if DSUM:
        tl.store(dst + K * K * CC, dsum.to(dst.dtype.element_ty), mask=cmask)


@triton.jit
def _wgrad_blocks(acc, dq, gn, xn, dsum, mid, xb, gb, rs, h, inm, gm, bok, CC: tl.constexpr, K: tl.constexpr,
                  BW: tl.constexpr, DSUM: tl.constexpr, COMPUTE: tl.constexpr, MASKED: tl.constexpr):
    """_wgrad_strip's x rows 0 .. mid - 1 (mid a multiple of K) in unrolled blocks of K (MASKED: see _wgrad_xrow)."""
    for r0 in range(0, mid, K):
        for u in tl.static_range(K):
            acc, dq, gn, xn, dsum = _wgrad_xrow(acc, dq, gn, xn, dsum, r0 + u, xb, gb, rs, h, inm, gm, bok,
                                                CC, K, BW, DSUM, COMPUTE, False, MASKED)
    return acc, dq, gn, xn, dsum


@triton.jit
def _wgrad_xrow(acc, dq, gn, xn, dsum, r, xb, gb, rs, h, inm, gm, bok,
                CC: tl.constexpr, K: tl.constexpr, BW: tl.constexpr, DSUM: tl.constexpr, COMPUTE: tl.constexpr,
                EDGE: tl.constexpr, MASKED: tl.constexpr = True):
    """x row r of _wgrad_kernel: the next x and dy rows' loads, dy row r + PAD joining the K rows in flight, and
    x row r's products with each of them. EDGE: the next rows may not exist (the last PAD + 1 rows). MASKED =
    False (not EDGE): every column in the map, every channel and the image real: loads without masks."""
    PAD: tl.constexpr = K // 2
    NI: tl.constexpr = BW + K - 1
    gc = gn
    xc = xn
    r1 = r + 1
    rg = r1 + PAD
    gn = ()
    for q in tl.static_range(BW):
        if EDGE:
            gn = gn + (tl.load(gb + rg * rs + q * CC, mask=gm[q] & bok & (rg < h), other=0.0),)
        elif MASKED:
            gn = gn + (tl.load(gb + rg * rs + q * CC, mask=gm[q] & bok, other=0.0),)
        else:
            gn = gn + (tl.load(gb + rg * rs + q * CC),)
    xn = ()
    for i in tl.static_range(NI):
        if EDGE:
            xn = xn + (tl.load(xb + r1 * rs + (i - PAD) * CC, mask=inm[i] & bok & (r1 < h), other=0.0),)
        elif MASKED:
            xn = xn + (tl.load(xb + r1 * rs + (i - PAD) * CC, mask=inm[i] & bok, other=0.0),)
        else:
            xn = xn + (tl.load(xb + r1 * rs + (i - PAD) * CC),)
    new = ()
    for s in tl.static_range(BW, K * BW):
        new = new + (dq[s],)
    for q in tl.static_range(BW):
        new = new + (gc[q].to(COMPUTE),)
    dq = new
    if DSUM:
        for q in tl.static_range(BW):
            dsum += dq[PAD * BW + q]  # row r of dy
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
    return acc, dq, gn, xn, dsum


@triton.jit
def _haar(a, b, c, d, ty: tl.constexpr, COMPUTE: tl.constexpr):
    """The Haar subbands (LL, top-minus-bottom, left-minus-right, diagonal) of the 2 x 2 block ``[[a, b], [c, d]]``
    (in COMPUTE), rounded to ``ty`` as the analysis stores them, in COMPUTE."""
    ab = a + b
    cd = c + d
    amb = a - b
    cmd = c - d
    return (((ab + cd) * 0.5).to(ty).to(COMPUTE), ((ab - cd) * 0.5).to(ty).to(COMPUTE),
            ((amb + cmd) * 0.5).to(ty).to(COMPUTE), ((amb - cmd) * 0.5).to(ty).to(COMPUTE))


@triton.jit
def _low_pass(src, spix: tl.constexpr, hf, wf, fr, fc, ok, ty: tl.constexpr, COMPUTE: tl.constexpr):
    """Level 1's low-pass at positions (fr, fc) of the (hf, wf) map at ``src`` (pixel stride spix, zero outside),
    rounded to ``ty`` as the analysis stores it, in COMPUTE."""
    top = src + fr.to(tl.int64) * 2 * wf * spix + 2 * fc * spix
    bot = top + wf * spix
    mt = ok & (2 * fr < hf)
    mb = ok & (2 * fr + 1 < hf)
    a = tl.load(top, mask=mt & (2 * fc < wf), other=0.0).to(COMPUTE)
    bb = tl.load(top + spix, mask=mt & (2 * fc + 1 < wf), other=0.0).to(COMPUTE)
    c = tl.load(bot, mask=mb & (2 * fc < wf), other=0.0).to(COMPUTE)
    d = tl.load(bot + spix, mask=mb & (2 * fc + 1 < wf), other=0.0).to(COMPUTE)
    return _haar(a, bb, c, d, ty, COMPUTE)[0]


@triton.jit
def _analysis_level(src, spix: tl.constexpr, hs, ws, dst, hd, wd, b, m0, n0, cc, cmask,
                    C: tl.constexpr, S: tl.constexpr, SW: tl.constexpr, CH: tl.constexpr, COMPUTE: tl.constexpr,
                    SKIP: tl.constexpr = False, hf=0, wf=0):
    """The 4 subbands of the S x SW positions from (m0, n0) of a (hd, wd) level, from its (hs, ws) finer
    low-pass at ``src`` (pixel stride spix, zero outside), into ``dst`` (B, hd, wd, 4, C). SKIP: that low-pass is
    level 1's, not stored: each of its values is made from the (hf, wf) map at ``src`` (_low_pass)."""
    for c0 in tl.static_range(0, S * SW, CH):
        s = c0 + tl.arange(0, CH)[:, None]
        m = m0 + s // SW
        n = n0 + s % SW
        fr = 2 * m
        fc = 2 * n
        ok = cmask & (s < S * SW)
        mt = ok & (fr < hs)
        mb = ok & (fr + 1 < hs)
        if SKIP:
            ty = dst.dtype.element_ty
            img = src + (b * hf).to(tl.int64) * wf * spix
            a = _low_pass(img, spix, hf, wf, fr, fc, mt & (fc < ws), ty, COMPUTE)
            bb = _low_pass(img, spix, hf, wf, fr, fc + 1, mt & (fc + 1 < ws), ty, COMPUTE)
            c = _low_pass(img, spix, hf, wf, fr + 1, fc, mb & (fc < ws), ty, COMPUTE)
            d = _low_pass(img, spix, hf, wf, fr + 1, fc + 1, mb & (fc + 1 < ws), ty, COMPUTE)
        else:
            top = src + (b * hs + fr).to(tl.int64) * ws * spix + fc * spix
            bot = top + ws * spix
            a = tl.load(top, mask=mt & (fc < ws), other=0.0).to(COMPUTE)
            bb = tl.load(top + spix, mask=mt & (fc + 1 < ws), other=0.0).to(COMPUTE)
            c = tl.load(bot, mask=mb & (fc < ws), other=0.0).to(COMPUTE)
            d = tl.load(bot + spix, mask=mb & (fc + 1 < ws), other=0.0).to(COMPUTE)
        ty = dst.dtype.element_ty
        v = _haar(a, bb, c, d, ty, ty)
        o = dst + ((b * hd + m).to(tl.int64) * wd + n) * (4 * C)
        ms = ok & (m < hd) & (n < wd)
        tl.store(o, v[0], mask=ms)
        tl.store(o + C, v[1], mask=ms)
        tl.store(o + 2 * C, v[2], mask=ms)
        tl.store(o + 3 * C, v[3], mask=ms)


@triton.jit
def _patch_of(PATCHES, PATCHES_W, C: tl.constexpr, BC: tl.constexpr):
    """This program's image, patch row and column, channels (1, BC) and their mask."""
    pid = tl.program_id(0)
    patch = pid % PATCHES
    cc = tl.program_id(1) * BC + tl.arange(0, BC)[None, :]
    return pid // PATCHES, patch // PATCHES_W, patch % PATCHES_W, cc, cc < C


@triton.jit
def _analysis_kernel(
    src_ptr,  # (B, H0, W0, *) the map the first level analyses: x (pixel stride C), or a level's coefficients (4C)
    coef_ptr,  # flat coefficient buffer: (B, h_i, w_i, 4, C) per level
    src2_ptr, coef2_ptr,  # a second map of the same shape and dtype and its buffer, for programs (., ., 1)
    src_off, coef_off,  # element offsets of the source map and of the first level this launch writes
    H0, W0, B, PATCHES_W, PATCHES,
    C: tl.constexpr, SRC_PIX: tl.constexpr, NL: tl.constexpr, M: tl.constexpr, BC: tl.constexpr,
    CHUNK: tl.constexpr, COMPUTE: tl.constexpr, SKIP1: tl.constexpr = False,
):
    """NL levels of a 2^NL x M*2^NL patch of the source: each level from the low-pass this program just wrote.
    The grid's third axis picks the map (the backward analyses x and dy in one launch). SKIP1: the source is the
    (H0, W0) input and the first level written is level 2, its low-pass source (level 1's) made as it loads:
    level 1 itself is not stored (its convolutions build it on load, _level1_kernel)."""
    if tl.program_id(2) == 1:
        src_ptr = src2_ptr
        coef_ptr = coef2_ptr
    b, py, px, cc, cmask = _patch_of(PATCHES, PATCHES_W, C, BC)
    # Offsets, not sliced views, locate the levels: torch.compile's tracing of a launch then sees whole buffers.
    src_ptr += tl.cast(src_off, tl.int64)
    coef_ptr += tl.cast(coef_off, tl.int64)
    hs = H0
    ws = W0
    if SKIP1:
        hs = (H0 + 1) // 2
        ws = (W0 + 1) // 2
    hd = (hs + 1) // 2
    wd = (ws + 1) // 2
    _analysis_level(src_ptr + cc, SRC_PIX, hs, ws, coef_ptr + cc, hd, wd, b, py << (NL - 1),
                    (px * M) << (NL - 1), cc, cmask, C, 1 << (NL - 1), M << (NL - 1),
                    CHUNK if CHUNK < (M << (2 * NL - 2)) else (M << (2 * NL - 2)), COMPUTE, SKIP1, H0, W0)
    off = tl.cast(B * hd * wd, tl.int64) * (4 * C)
    for j in tl.static_range(1, NL):
        tl.debug_barrier()  # the finer level's low-pass, written by this program, is read back next
        prev = coef_ptr + (off - tl.cast(B * hd * wd, tl.int64) * (4 * C))
        hs = hd
        ws = wd
        hd = (hs + 1) // 2
        wd = (ws + 1) // 2
        _analysis_level(prev + cc, 4 * C, hs, ws, coef_ptr + off + cc, hd, wd, b, py << (NL - 1 - j),
                        (px * M) << (NL - 1 - j), cc, cmask, C, 1 << (NL - 1 - j), M << (NL - 1 - j),
                        CHUNK if CHUNK < (M << (2 * (NL - 1 - j))) else (M << (2 * (NL - 1 - j))), COMPUTE)
        off += tl.cast(B * hd * wd, tl.int64) * (4 * C)


@triton.jit
def _synthesis_level(t, hc, wc, accin, dst, hf, wf, b, m0, n0, cc, cmask, HAS_ACC: tl.constexpr,
                     C: tl.constexpr, S: tl.constexpr, SW: tl.constexpr, CH: tl.constexpr, COMPUTE: tl.constexpr):
    """acc = inverse Haar step of the filtered subbands ``t`` (B, hc, wc, 4, C) (+ accin (B, hc, wc, C) on the
    low-pass) for the S x SW positions from (m0, n0), into ``dst`` (B, hf, wf, C), cropped."""
    for c0 in tl.static_range(0, S * SW, CH):
        s = c0 + tl.arange(0, CH)[:, None]
        m = m0 + s // SW
        n = n0 + s % SW
        ok = cmask & (s < S * SW) & (m < hc) & (n < wc)
        pos = (b * hc + m).to(tl.int64) * wc + n
        tp = t + pos * (4 * C)
        t0 = tl.load(tp, mask=ok, other=0.0).to(COMPUTE)
        t1 = tl.load(tp + C, mask=ok, other=0.0).to(COMPUTE)
        t2 = tl.load(tp + 2 * C, mask=ok, other=0.0).to(COMPUTE)
        t3 = tl.load(tp + 3 * C, mask=ok, other=0.0).to(COMPUTE)
        if HAS_ACC:
            # t carries the synthesis 1/2 (folded into the weights); the coarser levels' sum needs it too.
            t0 += 0.5 * tl.load(accin + pos * C, mask=ok, other=0.0).to(COMPUTE)
        pp = t0 + t1
        qq = t0 - t1
        rr = t2 + t3
        ss = t2 - t3
        fr = 2 * m
        fc = 2 * n
        o = dst + ((b * hf + fr).to(tl.int64) * wf + fc) * C
        ty = dst.dtype.element_ty
        mr = ok & (fc + 1 < wf)
        mb = fr + 1 < hf
        tl.store(o, (pp + rr).to(ty), mask=ok)
        tl.store(o + C, (pp - rr).to(ty), mask=mr)
        tl.store(o + wf * C, (qq + ss).to(ty), mask=ok & mb)
        tl.store(o + wf * C + C, (qq - ss).to(ty), mask=mr & mb)


@triton.jit
def _synthesis_kernel(
    t_ptr,  # flat filtered-subband buffer (laid out as the coefficients)
    acc_ptr,  # flat buffer, same layout: level i's region gets acc_i = (B, h_{i-1}, w_{i-1}, C)
    first_off,  # element offset of this launch's finest level in both buffers
    H0, W0, B, PATCHES_W, PATCHES,
    C: tl.constexpr, NL: tl.constexpr, M: tl.constexpr, HAS_ACC: tl.constexpr, BC: tl.constexpr,
    CHUNK: tl.constexpr, COMPUTE: tl.constexpr,
):
    """NL levels of synthesis, coarse to fine, over a 2^NL x M*2^NL patch of the (H0, W0) map the finest of them
    synthesises to; HAS_ACC: the level above this launch's coarsest was synthesised by an earlier launch."""
    b, py, px, cc, cmask = _patch_of(PATCHES, PATCHES_W, C, BC)
    t_ptr += tl.cast(first_off, tl.int64)
    acc_ptr += tl.cast(first_off, tl.int64)
    for j in tl.static_range(NL - 1, -1, -1):
        # Level j of this launch: sizes and offset from the finest one.
        hf, wf, off = _level_at(H0, W0, B, j, 4 * C)
        hc = (hf + 1) // 2
        wc = (wf + 1) // 2
        up = off + tl.cast(B * hc * wc, tl.int64) * (4 * C)  # the next coarser level's region
        if j < NL - 1:
            tl.debug_barrier()  # acc of the coarser level, written by this program, is read next
        _synthesis_level(t_ptr + off + cc, hc, wc, acc_ptr + up + cc, acc_ptr + off + cc, hf, wf, b,
                         py << (NL - 1 - j), (px * M) << (NL - 1 - j), cc, cmask, True if HAS_ACC else j < NL - 1,
                         C, 1 << (NL - 1 - j), M << (NL - 1 - j),
                         CHUNK if CHUNK < (M << (2 * (NL - 1 - j))) else (M << (2 * (NL - 1 - j))), COMPUTE)
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
    lw_ptr,  # (L, K, K, 4, C): wavelet_weight * wavelet_scale * 1/2 (the synthesis 1/2)
    C: tl.constexpr, K: tl.constexpr, TP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_C: tl.constexpr,
    COMPUTE: tl.constexpr, ROUND: tl.constexpr,  # None, or the dtype autocast would cast the parameters to
):
    """The kernels' weights, one program per channel block and group (0: base, i: level i), from the parameters'
    (C, ..., K, K) layouts to taps-major, channels-contiguous ones (a level's 4C subband channels as the level
    convolution and the coefficient buffers order them)."""
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
            tl.store(lw_ptr + (((g - 1) * KK + t) * 4 + s) * C + cc, (w * sc[None, :]).to(lw_ptr.dtype.element_ty),
                     mask=tm)


@triton.jit
def _level_rows(g, H, W, B, IMGS, BW: tl.constexpr, LEVELS: tl.constexpr, SKIP1: tl.constexpr = False):
    """(first partial row, rows) of level g in a weight-gradient launch over every level (see _level_of); SKIP1:
    in a buffer of levels 2..L's rows only (g > 1)."""
    h = H
    w = W
    start = g * 0
    first = g * 0
    rows = g * 0
    for i in tl.static_range(LEVELS):
        h = (h + 1) // 2
        w = (w + 1) // 2
        n = _level_count(w, B, IMGS, BW)
        first = tl.where(g == i + 1, start, first)
        rows = tl.where(g == i + 1, n, rows)
        if not (SKIP1 and i == 0):
            start += n
    return first, rows


@triton.jit
def _param_grads_kernel(
    bpart_ptr,  # (R0, TP, C) base partials: taps, then dy's sum in lane K*K
    lpart_ptr,  # (R, TP, 4C) level partials, level i's rows after level i-1's
    w_ptr, b_ptr, bs_ptr, ww_ptr, ws_ptr,  # the layer's parameters, contiguous
    dw_ptr, db_ptr, dbs_ptr, dww_ptr, dws_ptr,  # their gradients, same shapes and dtypes
    R0, H, W, B, IMGS,
    C: tl.constexpr, K: tl.constexpr, TP: tl.constexpr, LEVELS: tl.constexpr, BW: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_C: tl.constexpr, COMPUTE: tl.constexpr, ROUND: tl.constexpr,  # as _fold_kernel
    RB: tl.constexpr,  # partial rows summed per step
    SPLIT: tl.constexpr = 0,  # 1: the base and levels 2..L (lpart: their rows only); 2: level 1 (lpart: its rows)
):
    """Partials summed in a fixed order, then the chain rule through the folding, one program per channel block
    and group (axis 1: 0 the base, 1 + 4 (i - 1) + s subband s of level i): ``d W = scale * corr``,
    ``d scale = sum_taps W * corr`` (+ ``bias * sum dy`` for base_scale), ``d bias = base_scale * sum dy``."""
    KK: tl.constexpr = K * K
    g, t, c1, cm1, tm = _group_tile(C, KK, TP, BLOCK_C)
    if SPLIT == 1:
        g += 4 * (g > 0)
    if SPLIT == 2:
        g += 1
    cc = c1[None, :]
    if g == 0:
        corr = _partial_sum(bpart_ptr, 0, R0, t, cc, (t <= KK) & (cc < C), C, TP, BLOCK_C, RB, COMPUTE)
        dsum = tl.sum(tl.where(t == KK, corr, 0.0), 0)
        corr = tl.where(t < KK, corr, 0.0)
        bs = _param(bs_ptr, c1, cm1, ROUND, COMPUTE)
        w = _param(w_ptr, cc * KK + t, tm, ROUND, COMPUTE)
        _store_grad(dw_ptr, cc * KK + t, corr * bs[None, :], tm, ROUND)
        dbs = tl.sum(w * corr, 0)
        if HAS_BIAS:
            dbs += _param(b_ptr, c1, cm1, ROUND, COMPUTE) * dsum
        _store_grad(dbs_ptr, c1, dbs, cm1, ROUND)
        _store_grad(db_ptr, c1, bs * dsum, cm1, ROUND)
    else:
        lv = (g - 1) // 4 + 1
        s = (g - 1) % 4
        first, rows = _level_rows(lv, H, W, B, IMGS, BW, LEVELS, SPLIT == 1)
        corr = _partial_sum(lpart_ptr + s * C, first, rows, t, cc, tm, 4 * C, TP, BLOCK_C, RB, COMPUTE)
        lc = (lv - 1) * C + c1  # (level, channel) row of the wavelet parameters
        sc = _param(ws_ptr, lc * 4 + s, cm1, ROUND, COMPUTE)
        woff = (lc[None, :] * 4 + s) * KK + t
        w = _param(ww_ptr, woff, tm, ROUND, COMPUTE)
        _store_grad(dww_ptr, woff, corr * sc[None, :], tm, ROUND)
        _store_grad(dws_ptr, lc * 4 + s, tl.sum(w * corr, 0), cm1, ROUND)


@triton.jit
def _partial_sum(ptr, first, rows, t, cc, m, RS: tl.constexpr, TP: tl.constexpr, BLOCK_C: tl.constexpr,
                 RB: tl.constexpr, COMPUTE: tl.constexpr):
    """The sum of partial rows ``first`` .. ``first + rows - 1``, each a (TP, BLOCK_C) tile at ``ptr + (row * TP +
    t) * RS + cc`` (mask ``m``): RB rows per step into an (RB, TP, BLOCK_C) accumulator (RB loads in flight where
    one row at a time waited on each), then over its rows; a fixed order, so the bits do not vary."""
    rr = tl.arange(0, RB)[:, None, None]
    t3 = t[None, :, :]
    c3 = cc[None, :, :]
    m3 = m[None, :, :]
    acc = tl.zeros([RB, TP, BLOCK_C], dtype=COMPUTE)
    end = first + rows
    for r0 in range(first, end, RB):
        r = r0 + rr
        acc += tl.load(ptr + (r * TP + t3).to(tl.int64) * RS + c3, mask=m3 & (r < end), other=0.0).to(COMPUTE)
    return tl.sum(acc, 0)


# ----------------------------------------------------------------------------------------------------------------
# Launchers


def _compute_dtype(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32,
              torch.float64: tl.float64}


def _tl_dtype(dtype: Optional[torch.dtype]):
    return None if dtype is None else _TL_DTYPES[dtype]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# Launch shapes: fixed, not autotuned (the weight-gradient partials, hence the bits, must not depend on timing).
# Override with ``TUNING.update(...)`` or ``WTCONVNEXT_TUNING=<file.json>``. From the H200 sweep of the
# explicit-column kernels (results/h200/s13/ncu_rows.txt, in git history at 7ff28de; depthwise 5x5 at the
# stage-1 shape, bf16): forward 4 columns x 32 channels, one warp (0.123 ms vs cuDNN's 0.141); weight gradient
# 7 columns x 64 channels, two warps, 4 images per program (0.174 ms vs 0.149).
TUNING: dict[str, int] = {
    # conv_bc 64 (two channels per thread, one warp): H200, bf16, B=128, CUDA time of the four convolution
    # launches per fwd + bwd by the profiler (session 26, one run): 0.696 / 0.310 ms against 0.791 / 0.455 with 32
    # at 56 / 28 (sm_90 SASS: 1.5-2.0 instructions per FMA in the inner loops against 1.8-2.8).
    "conv_bw": 4, "conv_bc": 64, "conv_warps": 1,
    "wgrad_bw": 7, "wgrad_bc": 64, "wgrad_warps": 2, "wgrad_imgs": 4,
    "patch_chunk": 64, "patch_bc": 32, "patch_warps": 4,
    # syn1 = 1: the FMA base convolution (multi-launch and small-map pass) synthesises level 1 itself (needs an
    # even strip width); wgrad_unroll = 1: the weight gradients' x rows in unrolled blocks of K (the K dy rows in
    # flight rotate by renaming). H200, bf16, B=128 (results/h200/summary.md, session 20): syn1 forward 1.30x /
    # 1.24x and input gradient 1.31x / 1.25x at 56 x 56 / 28 x 28; wgrad_unroll 1.06x / 1.20x.
    "syn1": 1, "wgrad_unroll": 1,
    # wgrad_pair = 1: the base's and the levels' weight-gradient walks in one launch (_wgrad_pair_kernel), a launch
    # less per backward, whose programs all carry the levels' register count; 0: two launches. H200, bf16, B=128,
    # CUDA time per fwd + bwd by the profiler (profile_layer.py --tuning, session 24, one run): 1.461 / 0.761 /
    # 0.478 / 0.316 ms against 1.516 / 0.762 / 0.485 / 0.319 at 56 / 28 / 14 / 7 (never slower, 3.6 % less at 56).
    "wgrad_pair": 1,
    # syn1_ahead = 1: the base convolution's level-1 values (filtered subbands, acc_2) for the next output row are
    # loaded a row ahead, beside the input row, instead of just before the store that needs them. conv_base_bc:
    # channels per program of the base convolution (0: conv_bc's rule, which takes blocks of 32 for C = 96, one
    # channel per thread; 64: two per thread, a third of the second block's lanes idle). ncu (session 40, H100,
    # 56 x 56 bf16) had the base convolution issuing on 36 % of cycles against the level convolutions' 60 %, at 2.4
    # against 1.6 instructions per FMA (sm_90 SASS: its row loop has 18 loads for 102 FMAs, 10 of them level 1's,
    # used as soon as loaded). H100, bf16, B=128, fwd + bwd wall time, one process (bench_layer.py --variants,
    # session 41): 56 x 56 1.330 ms, 1.337 with syn1_ahead, 1.380 with conv_base_bc 64, 1.309 with both (forward
    # 0.446 -> 0.418); 28 x 28 (C = 192 takes 64 either way) 0.632 -> 0.618 (forward 0.210 -> 0.199).
    # syn1_ahead = 2 carries acc_1 itself (BW values in the compute dtype) instead of the raw values: fewer carried
    # registers and no repacking of bf16 halves (sm_90 SASS, triton 3.8: see results/h200/summary.md, session 41),
    # but the butterfly waits on its loads within the row. Not measured yet.
    "syn1_ahead": 1, "conv_base_bc": 64,
    # conv_pair = 1: where the base convolution's last channel block is at most half full (C = 96 in blocks of 64:
    # 32 channels in 64 lanes), a program of it takes two images' channels, one in each half of its lanes, and the
    # programs of every other image return at once: a fourth fewer warp instructions for the base convolutions at
    # WTConvNeXt-T's 56 x 56 (C = 192, 384, 768 fill their blocks), the same sums bit for bit. sm_90 (triton 3.8,
    # bf16, the in-place base convolutions of level 1 on load): 2688 working programs instead of 3584 at B = 128,
    # rows of 412-415 (dx 403-404) instructions against 415-420 (412-413), 166 (162) registers against 150 (12
    # resident warps an SM instead of 13); under triton 3.6 (the device image's) 168 (203) against 158 (182).
    # H100, bf16, B=128, f+b wall, one process each (results/h200/variants*.txt, session 53, two calls): 56 x 56
    # 1.333 / 1.334 ms against 1.387 / 1.388 (cuDNN dw7 1.333 / 1.337: 1.00x from 1.04x), forward 0.394 against
    # 0.420; the four convolution launches 0.357 ms against 0.412 by the profiler; 28 / 14 / 7 unchanged. 0: off.
    "conv_pair": 1,
    # Maps of at most small_max rows and columns run a whole pass in one launch (small_kernels.py): a program per
    # image and small_bc channels, small_warps warps, strips of small_bw columns, small_chunk positions per
    # analysis / synthesis step. 0: never. H200, bf16, B=128 (results/h200/summary.md, session 18): forward /
    # input gradient 1.12x / 1.14x the multi-launch passes at 14 x 14, 1.65x / 1.40x at 7 x 7; 64 channels and two
    # warps beat 32 and one (1.06x / 1.64x), strips of 7 columns lost (0.84x at 14 x 14); at 28 x 28 (small_max 32)
    # it ran at 0.55x: a program per image leaves too few warps there.
    # Session 26 (same method as pgrad_bc below): 128 channels (two per thread) 0.299 / 0.156 ms per two passes
    # against 0.307 / 0.173 with 64 at 14 / 7; one warp at 64 channels 0.302 / 0.155.
    "small_max": 16, "small_bw": 4, "small_bc": 128, "small_warps": 2, "small_chunk": 16,
    # small_narrow = 1 (small_bw a multiple of 4): a map's last strip in the one-launch pass, where at most
    # small_bw / 2 columns are left, walks small_bw / 2 columns instead of small_bw (the rest padding), bit for bit
    # the same: the 14 x 14 base convolution's fourth strip (2 columns) and every 2-column level (the 7 x 7 map's
    # level 2, the 14 x 14 map's level 3). Of the pass's multiply-adds that removes 8 % at 14 x 14 and 11 % at 7 x 7
    # (not the 7-column maps' second strip of 3 columns). sm_90 registers: 214 against 232 / 226 (triton 3.8), 252 /
    # 245 against 232 / 227 (3.6), the same 4 programs an SM. H100 (session 53): the one-launch passes 0.213
    # against 0.218 ms at 14 x 14 but 0.114 against 0.108 at 7 x 7 by the profiler (with conv_pair and
    # wgrad_narrow), f+b wall 0.380 / 0.248 against 0.387 / 0.246: mixed, so off. 0: off.
    "small_narrow": 0,
    # A pass over a larger map runs in chunks of images whose two coefficient buffers (x's and dy's) take at most
    # chunk_kb KiB (batch_chunks): the layer's workspace is then bounded, not 8/3 x its input. 0: one chunk.
    "chunk_kb": 0,
    # The chain-rule kernel (param_grads): channels per program, each program summing all partial rows of its
    # group for them (the same sums bit for bit at any value). H200, bf16, B=128, CUDA time by the profiler
    # (profile_layer.py --tuning, session 25, one run), 8 against 32 channels: 0.014 / 0.010 / 0.009 / 0.012 ms
    # against 0.052 / 0.029 / 0.019 / 0.020 at 56 / 28 / 14 / 7 (32 left 3 x 21 programs at 56 x 56, latency-bound).
    "pgrad_bc": 8,
    # l1_onload = 1: level 1's convolutions make its subbands from the input as it loads (_level1_kernel), its
    # weight gradients walk them analysed into the input gradient's buffer (level1_partials), and the analysis
    # stores levels 2..L only; level 1's filtered subbands go
    # polyphase into the output's own buffer, which the base convolution overwrites in place (even maps, stride 1,
    # one chunk, syn1 with syn1_ahead, not in a traced triton_op body: else the pass is as before). The layer's
    # workspace drops from 8/3 of its input to about 2/3 (levels 2..L of x and dy). l1_bw / l1_bc / l1_warps:
    # _level1_kernel's columns, channels and warps per program (H100, session 42, proto_level1.py: 2 / 32 / 1 at
    # 0.92x the analysis + level convolution it replaces at 56 x 56, 0.98-0.99x at 28 x 28). Level 1's staged walk
    # with more programs (image groups of 2, 32-channel blocks, 4 warps) ran 1.4-7 % slower (H100, session 48; git
    # bab313d / b254b47 have the knobs); stored level 1 in batch chunks (chunk_kb 16384, 1.06x dw7's memory) 4.4x
    # slower, 101 launches (session 49). Per kernel at 56 x 56 (session 49): level 1 on load costs 0.14 ms over
    # stored level 1, in the backward (extra x / dy analysis for the staged walk, its two launches, the chain rule's).
    # Fewer instructions did not mean faster here (H100, session 50, one process, f+b at 56 x 56 against dw7's
    # 1.342 ms): session 49's _level1_kernel (row pointers, the Haar 1/2 in the weights: 454 sm_90 instructions a row
    # against 557, 185 registers against 168) took 0.384 ms per f+b by the profiler against this one's 0.307 (session
    # 49, same card type; every other kernel the same to the microsecond), the layer 1.540 ms; its rows in unrolled
    # blocks of K with mask-free inner strips (389 a row, 221 registers) 1.530, with strips of 4 columns (1.7
    # instructions per FFMA) 1.575; _conv_kernel's middle rows unrolled (8-14 % fewer, up to 184 registers) 1.582.
    # All reverted or removed (git 572471a has them).
    "l1_onload": 1, "l1_bw": 2, "l1_bc": 32, "l1_warps": 1,
    # wgrad_inner = 1 (with wgrad_unroll): the weight-gradient walks' unrolled rows of strips inside the map, of
    # images in the batch, load without masks (a second copy of that loop). sm_90 bf16, instructions per 5 rows: level
    # 1's walk 1101 against 1268, the pair's levels 1106 against 1372 and base 1173 against 1325; registers 228
    # against 168 (level 1's walk); 37 / 84 s to compile on this CPU against 14 / 29. Not timed yet.
    "wgrad_inner": 0,
    # wgrad_narrow = n (2 .. wgrad_bw - 1): the level walks' programs over a level at most n columns wide walk a
    # strip of n columns, at most n // 2 wide a strip of n // 2 (rolled), instead of wgrad_bw columns of which the
    # rest only meet dy's zero padding: the same partial rows bit for bit. A level of 4 columns in strips of 7 spends
    # 3/7 of its multiply-adds on padding, one of 2 columns 5/7: of the pair walk's (base and levels) at
    # WTConvNeXt-T's stage shapes 41 % at 7 x 7 (levels 4 x 4 and 2 x 2), 16 % at 14 x 14, 8 % at 28 x 28, 2 % at
    # 56 x 56. H100, bf16, B=128 (session 53, results/h200/variants*.txt): the pair walk 0.064 ms against 0.090 at
    # 7 x 7 and 0.099 against 0.106 at 14 x 14 by the profiler; f+b wall 0.375 against 0.387 ms at 14 x 14, and
    # with small_narrow 0.372 / 0.223 against 0.387 / 0.246 at 14 / 7 (dw7 0.397 / 0.255); alone at 7 x 7 one row
    # read 0.322 ms. Session 54 (results/h200/layer_variants.txt, one process): 7 x 7 0.216 ms against 0.243 with
    # wgrad_narrow=0, 14 x 14 0.373 against 0.383; a process's first WTConv row at 7 x 7 read 0.37 there, so session
    # 53's 0.322 fits a first-row effect (bench_layer.py now prints graph mode's counts per row). 0: off.
    "wgrad_narrow": 4,
    # conv_maxnreg / l1_maxnreg / wgrad_maxnreg: a register cap per thread (ptxas's maxrregcount, Triton's launch
    # option maxnreg) for _conv_kernel, _level1_kernel and the weight-gradient walks; 0: the compiler's choice. These
    # one- and two-warp programs are latency-bound at the occupancy their registers leave; a cap trades spills for
    # resident warps. sm_90 (benchmarks/sass_stats.py, results/sm90/s50_register_caps.txt): the pair walk 230 -> 168
    # registers (bf16; fp32 225) with no spill in its main loops (4 -> 6 programs an SM); the levels' convolution 168
    # -> 128 with none, the base convolution 150 -> 128 and level 1 on load 168 -> 144 with some. H100, bf16, B=128,
    # f+b wall, one process (results/h200/maxnreg.txt, session 51): wgrad_maxnreg 168 took 56 x 56 from 1.466 to
    # 1.422 ms and 1.467 to 1.423 in two calls (the pair kernel 0.232 -> 0.204 ms, level 1's walk 0.138 -> 0.123; at
    # 28 x 28 0.109 -> 0.098 and 0.074 -> 0.070, whose host-bound wall moved both ways); conv_maxnreg 128 made the
    # layer 5-10 % slower, l1_maxnreg 144 3-5 %. Ignored by the interpreter and on the traced (compiled) path, which
    # launches through Inductor (a cap changes no arithmetic, only where values wait), and at K other than 5
    # (_maxnreg).
    "conv_maxnreg": 0, "l1_maxnreg": 0, "wgrad_maxnreg": 168,
    # dx_maxnreg: a cap for the input gradient's base convolution alone (_conv_kernel with FLIP, no levels, 2-byte
    # maps), in place of conv_maxnreg. triton 3.6 (the device image) gives it 203 registers at sm_90, bf16, C = 96,
    # level 1 on load, paired blocks (9 resident warps an SM; 180 at C = 192), where 3.8 gives 162 and the forward
    # takes 168; capped at 168 it takes 164 (162) with no local loads, its main loops 411 / 436 -> 409 / 454
    # instructions (results/sm90/s54_dx_cap.txt). In fp32 the cap spills: not applied. H100, bf16, B=128, one process
    # (session 54, results/h200/layer_variants.txt): 56 x 56 f+b 1.304 ms against 1.334 (dw7 1.332), the other variants
    # of that run within 0.003 ms of the default; one row, not yet repeated, 28 x 28 not timed. Under triton 3.8 the
    # cap does not bind.
    "dx_maxnreg": 168,
}
# The kernels each register cap applies to.
_MAXNREG_KEYS = {"_conv_kernel": "conv_maxnreg", "_level1_kernel": "l1_maxnreg", "_wgrad_kernel": "wgrad_maxnreg",
                 "_wgrad_pair_kernel": "wgrad_maxnreg"}
_MAXNREG_K = 5  # the kernel size the caps apply to (_maxnreg)
# Every register-cap key: the families' and dx_maxnreg (a part of _conv_kernel's family, _maxnreg).
_CAP_KEYS = (*dict.fromkeys(_MAXNREG_KEYS.values()), "dx_maxnreg")
# 0 .. the value, not sizes
_MODE_KEYS = {"syn1": 1, "wgrad_unroll": 1, "wgrad_pair": 1, "syn1_ahead": 2, "l1_onload": 1, "wgrad_inner": 1,
              "small_narrow": 1, "conv_pair": 1}
# 0 turns the path off (conv_base_bc: the rule; the register caps: the compiler's choice)
_ZERO_KEYS = ("small_max", "chunk_kb", "conv_base_bc", "wgrad_narrow", *_CAP_KEYS)
_POW2_KEYS = ("conv_bc", "conv_base_bc", "wgrad_bc", "patch_chunk", "patch_bc", "small_bc", "small_chunk", "pgrad_bc",
              "l1_bc")

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
    bad = {k: v for k, v in values.items()
           if k not in TUNING or not isinstance(v, int) or v < (0 if k in (*_MODE_KEYS, *_ZERO_KEYS) else 1) or
           v > _MODE_KEYS.get(k, v)}
    if bad:
        raise RuntimeError(f"WTCONVNEXT_TUNING={path!r}: unknown keys or values out of range {bad}; expected "
                           f"positive integers for {sorted(TUNING)} (0 allowed for {_ZERO_KEYS}; modes 0 .. n: "
                           f"{_MODE_KEYS})")
    for key in _POW2_KEYS:
        if key in values and values[key] & (values[key] - 1):
            raise RuntimeError(f"WTCONVNEXT_TUNING={path!r}: {key} must be a power of two, got {values[key]}")
    for key in sorted(set(_CAP_KEYS) & set(values)):
        if values[key] and not (24 <= values[key] <= 255 and values[key] % 8 == 0):
            raise RuntimeError(f"WTCONVNEXT_TUNING={path!r}: {key} must be 0 or a multiple of 8 in 24 .. 255 "
                               f"(registers per thread), got {values[key]}")
    TUNING.update(values)


_tuning_from_env()


# Plain-Python grid arithmetic: triton.cdiv / next_power_of_2 became constexpr functions (triton 3.8) costing
# microseconds per host call, dozens of times per layer call.
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


# Launch path. ``kernel[grid](...)`` re-derives the kernel's specialization from every argument on every call
# (binder, cache key, option parsing, global-variable checks), and a layer launched 15-36 kernels per step (6-11
# today). After a kernel's first call through Triton, the compiled kernel is kept under a key at least as fine as
# what Triton specializes on (tensor dtype and 16-byte alignment; ints by value, where Triton looks at == 1,
# divisible by 16 and 32-bit range; constexprs; warps; device) and is launched through its own launcher
# (``CompiledKernel[grid]``, the call Triton's launch ends in). The kernel is keyed by id(): a JITFunction hashes
# through a locked property.
# H200: 12-15 % less host time per layer call (session 12; results/h200/s12/ in git history).
# WTCONVNEXT_FAST_LAUNCH=0 (read at import) keeps every launch on Triton's path.
_FAST_LAUNCH = os.environ.get("WTCONVNEXT_FAST_LAUNCH", "1") != "0" and os.environ.get("TRITON_INTERPRET") != "1"
_COMPILED: dict[tuple, object] = {}
_CONSTS: dict[int, tuple[tuple[str, ...], dict[str, object]]] = {}  # per kernel: constexpr names, defaults
_MAX_KEPT = 4096  # ints are keyed by value: bound the cache for workloads of ever-new shapes


def _device_index() -> int:
    """The device Triton's launch uses (its kernel cache is per device; so is a compiled kernel's handle)."""
    # Triton asks ``driver.active.get_current_device()`` on every launch (torch.cuda.current_device for the GPU
    # drivers); the getter is looked up once and then called directly (two property lookups and a frame less per
    # launch). It stays the current device's getter, so set_device between launches is still seen.
    global _device_index
    _device_index = triton.runtime.driver.active.get_current_device
    return _device_index()


def _current_stream() -> int:
    """The handle of the current device's current stream, as Triton's runner reads it before each launch."""
    drv = triton.runtime.driver.active
    return drv.get_current_stream(drv.get_current_device())


def _launch_hooks_idle() -> bool:
    """Whether Triton's launch enter / exit hooks are empty (a ``HookChain`` with no calls, or None), so that a
    launcher may be called without them."""
    rt = triton.knobs.runtime
    return all(h is None or not getattr(h, "calls", True) for h in (rt.launch_enter_hook, rt.launch_exit_hook))


if _FAST_LAUNCH and hasattr(triton, "knobs"):
    # Launch plans call the compiled kernels' launchers directly (launch_plan.py). Triton >= 3.4 (its knobs): the
    # runner's call convention checked against 3.6 and 3.8 (grid, stream, function, packed metadata, launch
    # metadata, enter / exit hooks, then the kernel's arguments).
    _plan.use_direct(_current_stream, _launch_hooks_idle)

_side_streams: dict = {}  # per device: where launch plans' graphs are captured


def _capture_graph(launches) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of ``launches(stream)``, captured (not run) on a side stream that waits for the current one;
    the current stream waits for the side stream after (launch_plan's graph mode)."""
    graph = torch.cuda.CUDAGraph()
    cur = torch.cuda.current_stream()
    side = _side_streams.get(cur.device)
    if side is None:
        side = _side_streams[cur.device] = torch.cuda.Stream(cur.device)
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="thread_local")  # other threads' CUDA calls go on meanwhile
        try:
            launches(side.cuda_stream)
        finally:
            graph.capture_end()
    cur.wait_stream(side)
    return graph


if _FAST_LAUNCH and hasattr(triton, "knobs") and torch.cuda.is_available():  # as use_direct above, on a GPU
    _plan.use_graphs(_capture_graph, torch.cuda.is_current_stream_capturing)


class _Traced(threading.local):
    on = False  # a class default: every thread starts untraced without a getattr default per launch


_TRACED = _Traced()  # .on while a torch.library.triton_op body runs (see traced_launches)


class _Collect(threading.local):
    launches: Optional[list] = None  # a class default: every thread starts launching


_COLLECT = _Collect()  # .launches: a list while a pass is dry-run (collected_launches)
# Kernels being compiled ahead by compile_ahead.py, by kept-kernel key: a launch that misses _COMPILED waits for its
# compile here rather than starting the same one (written by the launching thread only).
_PENDING: dict[tuple, Any] = {}


@contextlib.contextmanager
def collected_launches() -> Iterator[list]:
    """Inside, this thread's launches run nothing: each is appended to the yielded list as (kernel, grid, runtime
    arguments, warps, constexprs), so that a pass can be dry-run to learn which kernels it needs
    (compile_ahead.py). The buffers it allocates are left uninitialised."""
    was = _COLLECT.launches
    _COLLECT.launches = found = []
    try:
        yield found
    finally:
        _COLLECT.launches = was


@contextlib.contextmanager
def traced_launches() -> Iterator[None]:
    """Launch through ``torch.library.wrap_triton`` inside this block: the body of a ``triton_op``, which
    ``torch.compile`` traces into its graph so that Inductor launches the kernels itself."""
    was = _TRACED.on
    _TRACED.on = True
    try:
        with _plan.traced_bases():
            yield
    finally:
        _TRACED.on = was


def _maxnreg(fn: Any, consts: dict[str, object], first: Any = None) -> int:
    """The TUNING register cap of ``fn`` specialised with ``consts`` (0: none); ``first``: the launch's first
    argument (a tensor, or a dtype standing in for one), whose element size dx_maxnreg reads."""
    key = _MAXNREG_KEYS.get(fn.__name__)
    # Only the kernel size the caps were timed at: at K = 7 the pair walk needs 255 registers uncapped and 168 spills
    # 145-194 values a row in its main loops; at K = 3 it needs 138, and under a cap of 168 ptxas takes 168, leaving
    # fewer warps resident (results/sm90/s51_wgrad_cap.txt).
    if key is None or consts.get("K") != _MAXNREG_K:
        return 0
    # dx_maxnreg: 2-byte maps only (in fp32 a cap of 168 spills 17-25 values a row: results/sm90/s54_dx_cap.txt).
    if (key == "conv_maxnreg" and consts.get("FLIP") and not consts.get("LEVELS") and TUNING["dx_maxnreg"]
            and getattr(getattr(first, "dtype", first), "itemsize", 0) == 2):
        return TUNING["dx_maxnreg"]
    return TUNING[key]


def launch_options(fn: Any, warps: int, consts: dict[str, object], first: Any = None) -> dict[str, int]:
    """The Triton launch options of ``fn`` specialised with ``consts``: its warps, and its TUNING register cap where
    one applies (``first``: the launch's first argument, a tensor or its dtype)."""
    regs = _maxnreg(fn, consts, first)
    return {"num_warps": warps, "maxnreg": regs} if regs else {"num_warps": warps}


def _launch(fn, grid: tuple[int, ...], args: tuple, warps: int, **consts: object) -> None:
    """``fn[grid](*args, **consts, **launch_options(fn, warps, consts))``: runtime arguments positional (the kernel's
    leading parameters: tensors, ints or None), constexprs by name (those left out take the kernel's defaults)."""
    global _FAST_LAUNCH
    consts = launch_consts(fn, len(args), consts)
    if _TRACED.on:
        from torch.library import wrap_triton

        # The channels-last buffers' allocations rather than their views (launch_plan.empty says why). Warps only:
        # Inductor's launch of a user kernel takes no register cap.
        args = tuple(_plan.base_of(a) if isinstance(a, torch.Tensor) else a for a in args)
        wrap_triton(fn)[grid](*args, **consts, num_warps=warps)
        return
    if _COLLECT.launches is not None:
        _COLLECT.launches.append((fn, grid, args, warps, consts))
        return
    rec = _plan.recording()
    if not _FAST_LAUNCH:
        opts = launch_options(fn, warps, consts, args[0])
        fn[grid](*args, **consts, **opts)
        if rec is not None:
            rec.launch(functools.partial(fn[grid], **consts, **opts), args)
        return
    key, cvals = kept_key(fn, args, warps, consts, _device_index())
    kernel = _COMPILED.get(key)
    if kernel is None:
        if _PENDING:
            pending = _PENDING.pop(key, None)
            if pending is not None:  # compiled ahead (maybe still compiling): Triton's launch then finds it
                pending.wait()
        # (Triton's launch compiles or finds the kernel: not per kept launch)
        opts = launch_options(fn, warps, consts, args[0])
        kernel = fn[grid](*args, **consts, **opts)
        if not all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata", "__getitem__")):
            _FAST_LAUNCH = False  # a Triton whose launch returns something else: stay on its path
            if rec is not None:
                rec.launch(functools.partial(fn[grid], **consts, **opts), args)
            return
        if len(_COMPILED) < _MAX_KEPT:
            _COMPILED[key] = kernel
        if rec is not None:
            _record(rec, kernel, grid, (*args, *cvals))
        return
    runner = kernel[(grid[0], grid[1], grid[2] if len(grid) > 2 else 1)]
    runner(*args, *cvals)
    if rec is not None:
        _record(rec, kernel, grid, (*args, *cvals), runner)


def launch_consts(fn: Any, nargs: int, consts: dict[str, object]) -> dict[str, object]:
    """Every constexpr of a launch of ``fn`` with ``nargs`` runtime arguments, in parameter order (as its compiled
    launcher takes them, after the runtime ones), the kernel's defaults for those ``consts`` leaves out. Torch's
    traced launch needs them all: its analysis of which arguments a kernel writes counts every argument as written
    without them, and a tensor passed twice then fails the trace."""
    fid = id(fn)  # (a JITFunction hashes through a locked property)
    found = _CONSTS.get(fid)
    if found is None:
        found = _CONSTS[fid] = (tuple(fn.arg_names[nargs:]), param_defaults(fn))
    names, defaults = found
    if tuple(consts) == names:  # the launchers pass them all, in the kernel's order
        return consts
    try:
        if not set(consts) <= set(names):
            raise KeyError
        return {n: consts[n] if n in consts else defaults[n] for n in names}
    except KeyError:
        raise TypeError(
            f"{fn.__name__}: launch passes constexprs {sorted(consts)}, kernel has {sorted(names)}") from None


def param_defaults(fn: Any) -> dict[str, object]:
    """The default values of a ``@triton.jit`` kernel's parameters that have one (constexprs of paths that most
    launches leave off); {} for a stand-in without the Python function."""
    py = getattr(fn, "fn", None)
    if py is None:
        return {}
    return {n: p.default for n, p in inspect.signature(py).parameters.items() if p.default is not inspect.Parameter.empty}


def kept_key(fn: Any, args: tuple, warps: int, consts: dict[str, object], device: int) -> tuple[tuple, tuple]:
    """(the key a launch's compiled kernel is kept under in _COMPILED, the constexpr values in parameter order);
    ``consts`` as :func:`launch_consts` gives them."""
    cvals = tuple(consts.values())
    # A pointer's low four bits: zero for 16-byte aligned (what Triton specialises on), else kept (a finer key).
    # A register cap is another compile.
    key = (id(fn), device, warps, _maxnreg(fn, consts, args[0]), cvals,
           *[(a.dtype, a.data_ptr() & 15) if isinstance(a, Tensor) else a for a in args])
    return key, cvals


def _record(rec: "_plan._Recorder", kernel: Any, grid: tuple[int, ...], args: tuple, runner: Any = None) -> None:
    """A kept kernel's launch into the launch plan being recorded: the launcher bound to its grid (``runner``, made
    here unless given), and the parts a direct replay calls (launch_plan.py)."""
    g3 = (grid[0], grid[1], grid[2] if len(grid) > 2 else 1)
    rec.launch(runner if runner is not None else kernel[g3], args,
               (kernel.run, kernel.function, kernel.packed_metadata, *g3))


def tuning_state() -> tuple:
    """Everything in the tuning tables and launch-path switches that a pass's launches read: part of the key of
    its launch plan (launch_plan.py), so that changing a table never replays launches made under another."""
    return (tuple(TUNING.items()), _FAST_LAUNCH, _plan.DIRECT, _plan.WORKSPACE, _plan.GRAPHS)


@functools.cache  # called on every launch; a handful of (C, cap) pairs per model
def _block_c(ch: int, cap: int) -> int:
    """Channels per program: the power of two up to ``cap`` (at least 32) that pads C least, the larger on a tie
    (C = 96 takes 32: three full blocks rather than two with a fourth of the lanes idle)."""
    if ch <= cap:
        return _pow2(ch)
    sizes = [cap >> i for i in range(cap.bit_length()) if cap >> i >= min(32, cap)]
    return min(sizes, key=lambda b: (_cdiv(ch, b) * b, -b))



def conv_block_c(cc: int, levels: int) -> int:
    """Channels per program of a convolution launch over ``cc`` channels: TUNING conv_base_bc for the base map
    (``levels`` 0) where set, else conv_bc's rule (:func:`_block_c`)."""
    return (levels == 0 and TUNING["conv_base_bc"]) or _block_c(cc, TUNING["conv_bc"])


@functools.cache
def level_sizes(h: int, w: int, levels: int) -> tuple[tuple[int, int], ...]:
    """Map sizes of levels 0 (the input) .. L: each the ceiling of half the one before (odd maps zero-extend)."""
    sizes = [(h, w)]
    for _ in range(levels):
        sizes.append(((sizes[-1][0] + 1) // 2, (sizes[-1][1] + 1) // 2))
    return tuple(sizes)


@functools.cache
def _offsets(bsz: int, ch: int, h: int, w: int, levels: int) -> tuple[int, ...]:
    """Element offset of each level's region in a flat coefficient buffer (levels 1..L), and the total."""
    offs = [0]
    for hc, wc in level_sizes(h, w, levels)[1:]:
        offs.append(offs[-1] + bsz * hc * wc * 4 * ch)
    return tuple(offs)


@functools.cache
def _chunks(levels: int, first: int = 1) -> tuple[tuple[int, int], ...]:
    """(first level, levels) of each analysis / synthesis launch over levels ``first``..L, fine to coarse."""
    out = []
    while first <= levels:
        nl = min(PATCH_LEVELS, levels - first + 1)
        out.append((first, nl))
        first += nl
    return tuple(out)


@functools.cache
def _level_programs(h: int, w: int, levels: int, bw: int, groups: int) -> int:
    """Programs of a launch over every level (see the kernels' _level_of): groups x strips of bw columns each."""
    return sum(groups * _cdiv(wc, bw) for _, wc in level_sizes(h, w, levels)[1:])


@functools.cache
def _patches(hf: int, wf: int, nl: int, chunk: int) -> tuple[int, int, int]:
    """(M, patches along w, patches) over a first-level map of hf x wf: a patch is 2^(nl-1) x M*2^(nl-1)
    positions there, M widening small patches to at least ``chunk`` positions (not past the map)."""
    side = 1 << (nl - 1)
    m = 1
    while side * side * m < chunk and side * m < wf:
        m *= 2
    pw = _cdiv(wf, side * m)
    return m, pw, _cdiv(hf, side) * pw


def _check_cl(*tensors: Tensor) -> None:
    # The kernels derive every stride from the shape.
    for t in tensors:
        if not t.is_contiguous(memory_format=torch.channels_last):
            raise ValueError(
                f"fused WTConv kernels need dense channels-last tensors, got shape {tuple(t.shape)} and strides "
                f"{t.stride()}"
            )


def coefficients(x: Tensor, levels: int) -> Tensor:
    """The Haar subbands of every level of the channels-last ``x`` (B, C, H, W), each computed once: a flat buffer
    in x's dtype holding level i as (B, h_i, w_i, 4, C) after level i - 1 (subbands LL, top-minus-bottom,
    left-minus-right, diagonal; odd maps zero-extended). One launch per five levels."""
    return _analyse((x,), levels)[0]


def coefficient_pair(a: Tensor, b: Tensor, levels: int,
                     skip1: bool = False) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """:func:`coefficients` of two maps of one shape and dtype (the backward's x and dy), in the launches of one;
    ``skip1``: levels 2..L only (see :func:`onload_applies`). (None, None) where that leaves no level."""
    if levels < (2 if skip1 else 1):
        return None, None
    if a.shape != b.shape or a.dtype != b.dtype:
        return _analyse((a,), levels, skip1)[0], _analyse((b,), levels, skip1)[0]
    return _analyse((a, b), levels, skip1)


def _analyse(maps: tuple[Tensor, ...], levels: int, skip1: bool = False, bufs: Optional[tuple[Tensor, ...]] = None,
             images: Optional[tuple[int, int]] = None) -> tuple[Tensor, ...]:
    """The coefficient buffers of ``maps``; ``skip1``: of levels 2..L only (level 1's region left out, the others
    where they would be, shifted by its size), level 1 made on the fly from the maps (callers skip levels < 2).
    ``images`` ``(b0, n)``: of the maps' images b0 .. b0 + n - 1 only; ``bufs``: into these (one per map, flat,
    sized for those images) rather than new buffers."""
    _check_cl(*maps)
    bsz, ch, h, w = maps[0].shape
    b0, bsz = images if images is not None else (0, bsz)
    sizes = level_sizes(h, w, levels)
    offs = _offsets(bsz, ch, h, w, levels)
    base = offs[1] if skip1 else 0
    if bufs is None:
        bufs = tuple(_plan.empty((offs[-1] - base,), m.dtype, m.device) for m in maps)
    # The second map's buffer, which only programs (., ., 1) write; with one map a one-element stand-in, never the
    # first buffer again. Every written argument of a launch gets a buffer of its own: torch's analysis of a traced
    # launch counts both pointers as written (the kernel picks one at run time), and a functional kernel call writes
    # one copy of a shared buffer and hands on the other, never written (session 30: the compiled layer's results
    # were garbage). (On the default path the stand-in sits in the pass's workspace: no allocation of its own.)
    dst2 = bufs[-1] if len(maps) > 1 else _plan.empty((1,), maps[0].dtype, maps[0].device)
    bc = _block_c(ch, TUNING["patch_bc"])
    srcs, src_off, pix = maps, b0 * h * w * ch, ch
    for first, nl in _chunks(levels, 2 if skip1 else 1):
        m, pw, patches = _patches(*sizes[first], nl, TUNING["patch_chunk"])
        skip = skip1 and first == 2
        src_size = sizes[0] if skip else sizes[first - 1]
        _launch(
            _analysis_kernel, (bsz * patches, _cdiv(ch, bc), len(maps)),
            (srcs[0], bufs[0], srcs[-1], dst2, src_off, offs[first - 1] - base, src_size[0], src_size[1], bsz,
             pw, patches),
            TUNING["patch_warps"], C=ch, SRC_PIX=pix, NL=nl, M=m, BC=bc, CHUNK=TUNING["patch_chunk"],
            COMPUTE=_compute_dtype(maps[0].dtype), SKIP1=skip,
        )
        # The next launch starts from this one's coarsest level.
        srcs, src_off, pix = bufs, offs[first + nl - 2] - base, 4 * ch
    return bufs


def folded_weights(
    weight: Tensor, bias: Optional[Tensor], base_scale: Tensor, wavelet_weight: Tensor, wavelet_scale: Tensor,
    round_to: Optional[torch.dtype] = None,
) -> tuple[Tensor, Optional[Tensor], Tensor]:
    """The kernels' weights: scales (and, for the levels, the synthesis 1/2) folded in, taps-major and channels
    contiguous, in the compute dtype; one launch.

    Returns ``(base (K, K, C), bias * base_scale (C,) or None, levels (L, K, K, 4, C))``. The forward computes them
    once and the backward reuses them (the input-gradient pass reads them rotated, ``flip=True``). ``round_to``:
    the parameters are first rounded to this dtype (autocast's cast, without a cast pass per parameter).
    """
    ch, k, levels = weight.shape[0], weight.shape[-1], wavelet_weight.shape[0]
    acc = _acc_dtype(round_to or weight.dtype)
    dev = weight.device
    base = _plan.empty((k, k, ch), acc, dev)
    fb = None if bias is None else _plan.empty((ch,), acc, dev)
    lev = _plan.empty((levels, k, k, 4, ch), acc, dev)
    bc = _block_c(ch, 64)
    _launch(
        _fold_kernel, (_cdiv(ch, bc), levels + 1),
        (weight.contiguous(), base if bias is None else bias.contiguous(), base_scale.contiguous(),
         wavelet_weight.contiguous(), wavelet_scale.contiguous(), base, base if fb is None else fb, lev), 4,
        C=ch, K=k, TP=_pow2(k * k), HAS_BIAS=bias is not None, BLOCK_C=bc, COMPUTE=_compute_dtype(acc),
        ROUND=_tl_dtype(round_to),
    )
    return base, fb, lev


def wtconv_forward(
    x: Tensor, out: Tensor, base_w: Tensor, base_b: Optional[Tensor], level_w: Tensor, stride: int,
    flip: bool = False, coef: Optional[Tensor] = None, *, onload: bool,
) -> Tensor:
    """The WTConv of the channels-last ``x`` into the channels-last ``out`` (B, C, ceil(H/stride), ceil(W/stride)).

    Weights from :func:`folded_weights`; ``flip`` rotates every kernel by 180 degrees (the input-gradient pass).
    ``onload``: level 1 made on load, as :func:`onload_applies` decides for the pass (its caller decides once, for
    the backward's coefficient buffers too). ``coef``: x's :func:`coefficients` when already computed (levels 2..L
    only with ``onload``); it is overwritten (the synthesis reuses it).
    """
    _check_cl(x, out)
    bsz, ch, h, w = x.shape
    levels, k = level_w.shape[0], base_w.shape[0]
    syn1 = _pass_syn1()
    if small_applies(x, levels):
        _small_pass(x, out, base_w, base_b, level_w, stride, flip, coef)
        return out
    if onload:
        _onload_pass(x, out, base_w, base_b, level_w, flip, coef)
        return out
    acc: Optional[Tensor] = None
    acc2: Optional[Tensor] = None
    acc2_off = 0
    if levels:
        if coef is None:
            coef = coefficients(x, levels)
        filt = _plan.empty(coef.shape, coef.dtype, coef.device)
        _conv_launch(coef, coef, filt, level_w, level_w, h, w, bsz, 4 * ch, k, levels, 1, False, False, flip)
        _synthesis_launches(x, filt, coef, levels, 2 if syn1 else 1)
        if syn1:
            acc = filt  # level 1's filtered subbands; acc_2 over level 2's coefficients
            if levels > 1:
                acc2, acc2_off = coef, _offsets(bsz, ch, h, w, levels)[1]
        else:
            acc = coef  # level 1's region now holds acc_1, (B, H, W, C)
    _conv_launch(x, x if acc is None else acc, out, base_w, base_w if base_b is None else base_b, h, w, bsz, ch,
                 k, 0, stride, acc is not None, base_b is not None, flip, syn1=syn1 and acc is not None, acc2=acc2,
                 acc2_off=acc2_off)
    return out


def _synthesis_launches(x: Tensor, filt: Tensor, coef: Tensor, levels: int, first: int,
                        skip1: bool = False) -> None:
    """The synthesis of a pass over ``x``, coarse to fine: acc_i of levels ``first``..L into ``coef``'s regions from
    the filtered subbands ``filt`` (both laid out as :func:`coefficients`; ``skip1``: without level 1's region)."""
    bsz, ch, h, w = x.shape
    sizes = level_sizes(h, w, levels)
    offs = _offsets(bsz, ch, h, w, levels)
    base = offs[1] if skip1 else 0
    pbc = _block_c(ch, TUNING["patch_bc"])
    for lv, nl in reversed(_chunks(levels, first)):
        m, pw, patches = _patches(*sizes[lv], nl, TUNING["patch_chunk"])
        _launch(
            _synthesis_kernel, (bsz * patches, _cdiv(ch, pbc)),
            (filt, coef, offs[lv - 1] - base, sizes[lv - 1][0], sizes[lv - 1][1], bsz, pw, patches),
            TUNING["patch_warps"], C=ch, NL=nl, M=m, HAS_ACC=lv + nl <= levels, BC=pbc, CHUNK=TUNING["patch_chunk"],
            COMPUTE=_compute_dtype(x.dtype),
        )


def onload_applies(x: Tensor, levels: int, stride: int) -> bool:
    """Whether a multi-launch pass over ``x`` (and its backward) makes level 1 on load (TUNING l1_onload): then
    its coefficient buffers hold levels 2..L only (:func:`coefficient_pair` with ``skip1``)."""
    bsz, ch, h, w = x.shape
    # Levels 2..L's filtered subbands wait in the output's buffer: they must fit (a map that more levels than it
    # halves leave 1 x 1 may not).
    return (bool(TUNING["l1_onload"]) and levels > 0 and stride == 1 and h % 2 == 0 and w % 2 == 0
            and _pass_syn1() and bool(TUNING["syn1_ahead"]) and not TUNING["chunk_kb"] and not _TRACED.on
            and not small_applies(x, levels) and _offsets(bsz, ch, h, w, levels)[-1] <= 2 * bsz * ch * h * w)


def _onload_pass(x: Tensor, out: Tensor, base_w: Tensor, base_b: Optional[Tensor], level_w: Tensor, flip: bool,
                 coef: Optional[Tensor]) -> None:
    """:func:`wtconv_forward` with level 1 on load: levels 2..L as before (their filtered subbands in ``out``'s
    buffer, dead until level 1 writes it), acc_2 into level 2's region of ``coef``; level 1's filtered subbands
    polyphase into ``out`` (_level1_kernel); the base convolution reads them a row ahead and overwrites them."""
    bsz, ch, h, w = x.shape
    levels, k = level_w.shape[0], base_w.shape[0]
    acc2: Optional[Tensor] = None
    offs = _offsets(bsz, ch, h, w, levels)
    if coef is not None and coef.numel() != offs[-1] - offs[1]:
        raise ValueError(f"coef has {coef.numel()} elements; with level 1 made on load (onload_applies) it holds "
                         f"levels 2..{levels} only ({offs[-1] - offs[1]}): coefficient_pair(..., skip1=True)")
    if levels > 1:
        if coef is None:
            coef = _analyse((x,), levels, skip1=True)[0]
        sizes = level_sizes(h, w, levels)
        filt = _plan.view(out, coef.shape, (1,))  # levels 2..L: at most a third of out's elements
        _conv_launch(coef, coef, filt, level_w, level_w, *sizes[1], bsz, 4 * ch, k, levels - 1, 1, False, False,
                     flip, lv0=1)
        _synthesis_launches(x, filt, coef, levels, 2, skip1=True)  # acc_2 last
        acc2 = coef
    bw, bc = TUNING["l1_bw"], _block_c(ch, TUNING["l1_bc"])
    _launch(_level1_kernel, (bsz * _cdiv(w // 2, bw), _cdiv(ch, bc)), (x, out, level_w, h, w), TUNING["l1_warps"],
            C=ch, K=k, BW=bw, BC=bc, FLIP=flip, COMPUTE=_compute_dtype(x.dtype))
    _conv_launch(x, out, out, base_w, base_w if base_b is None else base_b, h, w, bsz, ch, k, 0, 1, True,
                 base_b is not None, flip, syn1=2, acc2=acc2)


def _pass_syn1() -> bool:
    """Whether a multi-launch pass's base convolution does level 1's synthesis itself (from the filtered subbands
    and acc_2): one full-resolution map less written and read, and the synthesis launches start at level 2."""
    return _syn1(TUNING["conv_bw"])


def input_grad_buffer(dy: Tensor, coef: Optional[Tensor], levels: int) -> Tensor:
    """The channels-last buffer the input-gradient pass over ``dy`` (one chunk of images: all of them) writes.

    Where that pass runs in several launches with level 1 synthesised by the base convolution, it is dy's
    coefficient buffer ``coef`` itself, from its first element: the level-1 region (B, h_1, w_1, 4, C), at least
    B * H * W * C elements, is dead once the level convolutions have read it, and the base convolution reads only
    the filtered subbands and acc_2 (level 2's region) while it writes dx. So no full-size map is allocated while
    the filtered subbands and the coefficients are both alive: at 56 x 56 that was the layer's peak (dx, dy's
    coefficients and their filtered copy at once). The returned gradient keeps the whole buffer (4/3 of dx)
    alive until it is freed."""
    bsz, ch, h, w = dy.shape
    if (coef is not None and levels > 0 and not _TRACED.on and coef.dtype == dy.dtype
            and not small_applies(dy, levels) and _pass_syn1() and coef.numel() >= dy.numel()):
        return _plan.view(coef, (bsz, ch, h, w), (h * w * ch, 1, w * ch, ch))
    return _plan.empty((bsz, ch, h, w), dy.dtype, dy.device, torch.channels_last)


def _syn1(bw: int) -> bool:
    """Whether an FMA base convolution with strips of ``bw`` columns synthesises level 1 itself: TUNING syn1, and
    strips of whole 2 x 2 blocks."""
    return bool(TUNING["syn1"]) and bw % 2 == 0


def small_applies(x: Tensor, levels: int) -> bool:
    """Whether a pass over ``x`` runs as one launch (``small_kernels``): levels, a map of at most
    ``TUNING["small_max"]`` rows and columns."""
    return levels > 0 and max(x.shape[-2:]) <= TUNING["small_max"]


def _small_pass(x: Tensor, out: Tensor, base_w: Tensor, base_b: Optional[Tensor], level_w: Tensor, stride: int,
                flip: bool, coef: Optional[Tensor]) -> None:
    """:func:`wtconv_forward` of a small map in one launch (``small_kernels``), into two level buffers of its own
    (one buffer in two written arguments breaks a traced launch, see :func:`_analyse`) unless x's coefficients are
    given."""
    bsz, ch, h, w = x.shape
    levels, k = level_w.shape[0], base_w.shape[0]
    n = _offsets(bsz, ch, h, w, levels)[-1]
    given = coef is not None  # the input gradient: dy's coefficients, computed for the weight gradients
    if not given:
        coef = _plan.empty((n,), x.dtype, x.device)
    filt = _plan.empty(coef.shape, coef.dtype, coef.device)
    bc = _block_c(ch, TUNING["small_bc"])
    _launch(
        _small._small_kernel, (bsz, _cdiv(ch, bc)),
        (x, coef, filt, out, base_w, base_w if base_b is None else base_b, level_w, h, w, bsz),
        TUNING["small_warps"], C=ch, K=k, LEVELS=levels, HM=_pow2(h), WM=_pow2(w), BW=TUNING["small_bw"], BC=bc,
        CHUNK=TUNING["small_chunk"], STRIDE=stride, HAS_BIAS=base_b is not None, FLIP=flip,
        HAS_COEF=given, COMPUTE=_compute_dtype(x.dtype),
        SYN1=int(_syn1(TUNING["small_bw"])), SYN_AHEAD=TUNING["syn1_ahead"],
        NARROW=small_narrow(),
    )


def _conv_launch(x: Tensor, acc: Tensor, y: Tensor, wts: Tensor, bias: Tensor, h: int, w: int, bsz: int, cc: int,
                 k: int, levels: int, stride: int, has_acc: bool, has_bias: bool, flip: bool, syn1: int = 0,
                 acc2: Optional[Tensor] = None, acc2_off: int = 0, lv0: int = 0) -> None:
    """One launch of the depthwise convolutions (``levels`` = 0: the base map; else every level's subbands, of
    weight levels ``lv0`` + 1.. over the (h, w) map that the first of them halves). ``syn1``: ``acc`` is level 1's
    filtered subbands (2: polyphase, _level1_kernel's) and ``acc2`` (from element ``acc2_off``, when given)
    acc_2, synthesised into the base convolution's output (with an even strip width)."""
    bw = TUNING["conv_bw"]
    bc = conv_block_c(cc, levels)
    programs = _level_programs(h, w, levels, bw, bsz) if levels else bsz * _cdiv(w, bw)
    # (An image's elements are an int32 lane offset: below 2^30 of them.)
    pair = conv_pairs(cc, bc, levels) and bsz > 1 and h * w * cc * 4 < 1 << 30
    _launch(
        _conv_kernel, (programs, _cdiv(cc, bc)),
        (x, acc, x if acc2 is None else acc2, y, wts, bias, acc2_off, h, w, bsz), TUNING["conv_warps"],
        CC=cc, K=k, LEVELS=levels, BW=bw, BC=bc, STRIDE=stride, HAS_ACC=has_acc, HAS_BIAS=has_bias, FLIP=flip,
        COMPUTE=_compute_dtype(x.dtype), SYN1=int(syn1), HAS_ACC2=acc2 is not None,
        SYN_AHEAD=TUNING["syn1_ahead"] if syn1 else 0, LV0=lv0, PAIR=pair,
    )


def _walk_shape(x: Tensor, k: int) -> tuple[int, int, int, int, int, int, Any]:
    """(bw, warps, imgs, tp, bc, lbc, compute) of the weight-gradient walks over ``x`` and its coefficients: strip
    width, warps, images a program, taps padded (dy's sum in lane K*K), channels a program of the base map and of
    the levels' 4C subband channels, the compute dtype."""
    ch = x.shape[1]
    return (TUNING["wgrad_bw"], TUNING["wgrad_warps"], TUNING["wgrad_imgs"], _pow2(k * k + 1),
            _block_c(ch, TUNING["wgrad_bc"]), _block_c(4 * ch, TUNING["wgrad_bc"]), _compute_dtype(x.dtype))


def conv_pairs(cc: int, bc: int, levels: int) -> bool:
    """Whether a convolution launch over ``cc`` channels in blocks of ``bc`` pairs images in its last block (TUNING
    conv_pair: the base map's, at most half full)."""
    return bool(TUNING["conv_pair"]) and not levels and 0 < cc % bc <= bc // 2


def small_narrow() -> bool:
    """The one-launch pass's NARROW (TUNING small_narrow, with strips of a multiple of 4 columns)."""
    return bool(TUNING["small_narrow"]) and TUNING["small_bw"] % 4 == 0


def _narrow(bw: int) -> int:
    """The level walks' NARROW (TUNING wgrad_narrow where it lies in 2 .. bw - 1, else 0: off)."""
    n = TUNING["wgrad_narrow"]
    return n if 2 <= n < bw else 0


def weight_partials(x: Tensor, dy: Tensor, coef_x: Optional[Tensor], coef_dy: Optional[Tensor], k: int,
                    levels: int, parts: Optional[tuple[Tensor, Tensor]] = None, first: int = 0,
                    batch: Optional[int] = None, onload: bool = False) -> tuple[Tensor, Tensor]:
    """Per-program partial correlations of the weight gradients (w.r.t. the folded weights), for
    :func:`param_grads`: the base's of x and dy (with dy's sum in lane K*K), and every level's of the two
    coefficient buffers, in one launch each (both in one with TUNING wgrad_pair).

    x and dy may be images ``first`` .. of a batch of ``batch`` (one of :func:`batch_chunks`' ranges): their rows
    are then written into ``parts`` (this function's result for an earlier chunk of the batch; allocated for the
    whole batch when None) where the whole batch's launch would write them, so the sums are bitwise the same.
    ``onload``: the coefficient buffers and the level partials hold levels 2..L only; level 1's rows are
    :func:`level1_partials`'."""
    _check_cl(x, dy)
    bsz, ch, h, w = x.shape
    bw, warps, imgs, tp, bc, lbc, compute = _walk_shape(x, k)
    batch = bsz if batch is None else batch
    if first % imgs or first + bsz > batch:
        raise ValueError(f"images {first}..{first + bsz - 1} of {batch} do not start a group of {imgs}")
    groups = _cdiv(batch, imgs)
    acc = _acc_dtype(x.dtype)
    unroll, inner = bool(TUNING["wgrad_unroll"]), bool(TUNING["wgrad_inner"])
    if parts is None:
        base = _plan.empty((groups * _cdiv(w, bw), tp, ch), acc, x.device)
        rows = _level_programs(h, w, levels, bw, groups) - (_level_programs(h, w, 1, bw, groups) if onload else 0)
        lev = _plan.empty((rows, tp, 4 * ch), acc, x.device) if rows else base
    else:
        base, lev = parts
    spans = (first // imgs, groups)
    r0 = _cdiv(bsz, imgs) * _cdiv(w, bw)
    # Level 1 made on load: its programs are level1_partials', after the pass has freed x's coefficients.
    skip = _level_programs(h, w, 1, bw, _cdiv(bsz, imgs)) if levels and onload else 0
    walk = levels > 1 if onload else levels > 0
    # Not in a traced (triton_op) body: Inductor re-emits a user kernel's helper functions with a plain
    # @triton.jit, dropping _wgrad_program's noinline, so the pair would compile as one function (89 s for sm_90
    # on the CPU machine, four of them per WTConvNeXt) where two launches compile in parallel workers; the launch
    # it saves is host time, which Inductor's launches and CUDA graphs do not spend here. Same partials, bit for bit.
    if walk and TUNING["wgrad_pair"] and not _TRACED.on:
        _launch(
            _wgrad_pair_kernel,
            (r0 + _level_programs(h, w, levels, bw, _cdiv(bsz, imgs)) - skip,
             max(_cdiv(ch, bc), _cdiv(4 * ch, lbc))),
            (x, dy, base, coef_x, coef_dy, lev, h, w, bsz, imgs, *spans, r0), warps,
            C=ch, K=k, TP=tp, LEVELS=levels, BW=bw, BC0=bc, BC=lbc, COMPUTE=compute, UNROLL=unroll, SKIP1=skip > 0,
            INNER=inner, NARROW=_narrow(bw),
        )
        return base, lev
    _launch(
        _wgrad_kernel, (r0, _cdiv(ch, bc)), (x, dy, base, h, w, bsz, imgs, *spans),
        warps, CC=ch, K=k, TP=tp, LEVELS=0, BW=bw, BC=bc, DSUM=True, COMPUTE=compute, UNROLL=unroll, INNER=inner,
    )
    if not walk:
        return base, lev
    _launch(
        _wgrad_kernel, (_level_programs(h, w, levels, bw, _cdiv(bsz, imgs)) - skip, _cdiv(4 * ch, lbc)),
        (coef_x, coef_dy, lev, h, w, bsz, imgs, *spans), warps,
        CC=4 * ch, K=k, TP=tp, LEVELS=levels, BW=bw, BC=lbc, DSUM=False, COMPUTE=compute, UNROLL=unroll,
        SKIP1=skip > 0, INNER=inner, NARROW=_narrow(bw),
    )
    return base, lev


def level1_partials(x: Tensor, dy: Tensor, k: int, scratch: Tensor) -> Tensor:
    """Level 1's weight-gradient partial rows, which :func:`weight_partials` with ``onload`` leaves out (for
    :func:`param_grads` with ``split`` 2): the same rows bit for bit as one walk over every level's coefficients.

    x's and dy's level-1 subbands are analysed half a batch at a time (whole image groups of TUNING wgrad_imgs)
    into ``scratch``, the channels-last input-gradient buffer, dead until its pass: as many elements as a map, so
    they take no memory of their own, and the walk reads stored values. A batch of fewer than two groups' worth of
    images analyses all of it at once, dy's subbands into a buffer of their own (a map of these few images)."""
    _check_cl(x, dy, scratch)
    bsz, ch, h, w = x.shape
    bw, warps, imgs, tp, _, lbc, compute = _walk_shape(x, k)
    groups = _cdiv(bsz, imgs)
    lev = _plan.empty((_level_programs(h, w, 1, bw, groups), tp, 4 * ch), _acc_dtype(x.dtype), x.device)
    n1 = h * w * ch  # elements of one image's level-1 subbands, as of the image itself (h and w even)
    per = bsz // 2 // imgs * imgs
    # The walk that made each subband value from four loads instead (no buffer at all) issued 2.7 instructions per
    # FFMA in its inner loop against this one's 1.5 (sm_90, results/sm90/s45_level1_walks.txt) and compiled for
    # minutes unrolled; it was removed in session 46 (git 3f2f2fc has it).
    side = None if per else _plan.empty((bsz * n1,), x.dtype, x.device)
    per = per or bsz
    assert scratch.dtype == x.dtype and scratch.numel() >= (2 if side is None else 1) * per * n1, \
        "scratch: dx's buffer, x's shape and dtype"
    for b0 in range(0, bsz, per):
        nb = min(per, bsz - b0)
        cx = _plan.view(scratch, (nb * n1,), (1,))
        cdy = side if side is not None else _plan.view(scratch, (nb * n1,), (1,), nb * n1)
        _analyse((x, dy), 1, bufs=(cx, cdy), images=(b0, nb))
        _launch(
            _wgrad_kernel, (_level_programs(h, w, 1, bw, _cdiv(nb, imgs)), _cdiv(4 * ch, lbc)),
            (cx, cdy, lev, h, w, nb, imgs, b0 // imgs, groups), warps,
            CC=4 * ch, K=k, TP=tp, LEVELS=1, BW=bw, BC=lbc, DSUM=False, COMPUTE=compute,
            UNROLL=bool(TUNING["wgrad_unroll"]), INNER=bool(TUNING["wgrad_inner"]),
        )
    return lev


def batch_chunks(x: Tensor, levels: int) -> tuple[tuple[int, int], ...]:
    """The image ranges ``[b0, b1)`` a pass over ``x`` (and its backward) runs in, one after another: so that a
    chunk's coefficient buffers (x's and dy's, 8/3 x the chunk's size together) stay within ``TUNING["chunk_kb"]``
    KiB, on the multi-launch path. Chunks start at multiples of ``wgrad_imgs`` (the weight-gradient partials'
    image groups), so results are bitwise those of one range; small maps take one."""
    bsz = x.shape[0]
    limit = TUNING["chunk_kb"] << 10
    if not limit or not levels or bsz <= 1 or small_applies(x, levels) or _TRACED.on:
        return ((0, bsz),)
    pair = 2 * _offsets(bsz, x.shape[1], x.shape[2], x.shape[3], levels)[-1] * x.element_size()
    imgs = TUNING["wgrad_imgs"]
    per = _cdiv(_cdiv(bsz, _cdiv(pair, limit)), imgs) * imgs
    return tuple((b0, min(b0 + per, bsz)) for b0 in range(0, bsz, per))


def param_grads(
    parts: tuple[Tensor, Tensor], x_shape: tuple[int, ...], weight: Tensor, bias: Optional[Tensor],
    base_scale: Tensor, wavelet_weight: Tensor, wavelet_scale: Tensor, round_to: Optional[torch.dtype] = None,
    split: int = 0, grads: Optional[tuple[Tensor, ...]] = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The parameters' gradients from :func:`weight_partials` (of an input of ``x_shape``), in one launch:
    ``(d weight, d bias, d base_scale, d wavelet_weight, d wavelet_scale)``, each contiguous in its parameter's
    shape and dtype (d bias in base_scale's dtype when there is no bias: the gradient a zero bias would get). With
    ``round_to`` (as given to :func:`folded_weights`), each is rounded through that dtype, as the backward of a
    cast to it would.

    ``split`` 1: the base's and levels 2..L's only (``parts`` from :func:`weight_partials` with ``onload``); 2:
    level 1's only, into ``grads`` (the split-1 call's result), from ``parts = (p, p)`` with ``p`` the rows of
    :func:`level1_partials`. Each partial row buffer can then be freed as soon as it is summed."""
    bpart, lpart = parts
    bsz, _, h, w = x_shape
    ch, k, levels = weight.shape[0], weight.shape[-1], wavelet_weight.shape[0]
    weight, base_scale = weight.contiguous(), base_scale.contiguous()
    wavelet_weight, wavelet_scale = wavelet_weight.contiguous(), wavelet_scale.contiguous()
    if grads is None:
        d_weight, d_base_scale, d_ww, d_ws = (_plan.empty(p.shape, p.dtype, p.device)
                                              for p in (weight, base_scale, wavelet_weight, wavelet_scale))
        like = bias if bias is not None else base_scale  # a missing bias's gradient: the one a zero bias would get
        d_bias = _plan.empty(like.shape, like.dtype, like.device)
    else:
        d_weight, d_bias, d_base_scale, d_ww, d_ws = grads
    # A program per channel block and group (the base, every level's subbands), each summing its partial rows a
    # block of rows at a time: the loop waits on memory once per block, not once per row.
    bc = _block_c(ch, TUNING["pgrad_bc"])
    tp = bpart.shape[1]
    _launch(
        _param_grads_kernel, (_cdiv(ch, bc), (1 + 4 * levels, 1 + 4 * (levels - 1), 4)[split]),
        (bpart, lpart, weight, bias if bias is not None else base_scale, base_scale, wavelet_weight, wavelet_scale,
         d_weight, d_bias, d_base_scale, d_ww, d_ws, bpart.shape[0], h, w, bsz, TUNING["wgrad_imgs"]), 8,
        C=ch, K=k, TP=tp, LEVELS=levels, BW=TUNING["wgrad_bw"], HAS_BIAS=bias is not None,
        BLOCK_C=bc, COMPUTE=_compute_dtype(bpart.dtype), ROUND=_tl_dtype(round_to),
        RB=max(2, 512 // tp), SPLIT=split,
    )
    return d_weight, d_bias, d_base_scale, d_ww, d_ws


from . import small_kernels as _small  # noqa: E402  (built from the device functions above)
