"""Tensor-core kernels of the fused WTConv's depthwise convolutions and weight gradients (bf16 / fp16 inputs).

Kernel model T of issue 14 (the explicit-column FMA kernels of :mod:`.triton_kernels` are model A2). A depthwise
convolution has no channel reduction, so the matrix product's inner dimension comes from the taps: one channel's
row convolution is a product with a banded Toeplitz matrix, ``out[q] = sum_i x[i] * T_ky[i, q]`` with
``T_ky[i, q] = w[ky, i - q]``. The product's M dimension packs 16 *segments*, each an (image, strip of NQ output
columns) pair, so a map need not be 16 columns wide; its N dimension is a strip's 16 output slots (NQ <= 17 - K of
them used), its inner dimension the strip's 16 input columns with the halo. Each channel has its own T, so the
channel is the batch dimension of a 3-D ``tl.dot`` (``mma.sync`` on Hopper). A program owns 16 segments and a block
of channels and walks down the rows: each input row is loaded once and feeds K products, one into each of the K
output rows in flight (loop-carried fp32 accumulators). The weight gradient pairs each x row with the K dy rows it
meets: ``G_ky[i, q] += sum_m X[m, i] DY[m, q]`` (the product ``X^T DY`` over the segments), and
``dW[ky, kx] = sum_q G_ky[q + kx, q]`` is read off the diagonals once per program into fp32 partials, laid out as
the FMA kernels' (``param_grads`` sums them in a fixed order: deterministic).

Numerics: the operands are the input dtype's values (x, dy and the coefficients are stored in it), the products
exact and accumulated in fp32 by the tensor cores. The folded fp32 weights are split into two operands of the
input dtype, ``hi = round(w)`` and ``lo = round(w - hi)`` (SPLIT), so the weights keep ~16 bits more than one
rounding would; SPLIT=False uses ``hi`` alone (one product per tap row instead of two). With fp16 operands a folded
weight (``scale * W``) must stay within fp16's range (65504), which the fp32 FMA kernels do not need.

Under Triton's interpreter (CPU tests) the operands are fp32 tensors holding exactly those rounded values: its
bf16 products do not model the hardware's, and its bf16 conversion truncates (``_round`` rounds to nearest even).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from .triton_kernels import _haar_pair_at, _level_of, _round, level_sizes

__all__ = ["MMA_TUNING", "mma_applies", "mma_programs", "mma_level_programs", "operand_dtype"]

SEG = tl.constexpr(16)  # segments per program (M), and a strip's input / output slots (inner dimension, N)
MAX_K = 15  # a strip holds 17 - K output columns

# Launch shapes (fixed: partials, hence the bits, must not depend on timing). bc: channels per program (the batch
# of the 3-D product), warps: each warp takes bc / warps channels. For K = 5, without spills: convolution 8 x 4;
# weight gradient 8 x 8 (its rows unrolled by K need the registers: 2 channels per warp spill).
# syn1: the base convolution synthesises level 1 itself (fewer bytes, more instructions: the A/B decides).
MMA_TUNING: dict[str, int] = {"conv_bc": 8, "conv_warps": 4, "wgrad_bc": 8, "wgrad_warps": 8, "split": 1, "syn1": 1}

# WTCONVNEXT_MMA=1 (read at import) takes the tensor-core kernels for bf16 / fp16 inputs; off by default until
# the H200 A/B against the FMA kernels (``benchmarks/ab_kernels.py --mma``, ``bench_layer.py``) decides.
ENABLED = os.environ.get("WTCONVNEXT_MMA", "0") == "1"


def mma_applies(dtype: torch.dtype, k: int) -> bool:
    """Whether the convolutions of an input of ``dtype`` with K x K kernels take the tensor-core kernels."""
    return ENABLED and dtype in (torch.bfloat16, torch.float16) and k <= MAX_K


def _strips(w: int, k: int) -> int:
    return -(-w // (17 - k))


@functools.cache
def mma_programs(w: int, k: int, bsz: int) -> int:
    """Programs over one map of width ``w``: 16 (image, strip) segments each."""
    return -(-(bsz * _strips(w, k)) // 16)


@functools.cache
def mma_level_programs(h: int, w: int, levels: int, k: int, bsz: int) -> int:
    """Programs of a launch over every level of an (h, w) map (as ``_level_programs`` for the FMA kernels)."""
    return sum(mma_programs(wc, k, bsz) for _, wc in level_sizes(h, w, levels)[1:])


@triton.jit
def _program_map(pid, a_ptr, b_ptr, H, W, B, K: tl.constexpr, LEVELS: tl.constexpr, CC: tl.constexpr):
    """Program ``pid``'s map: (level or 0, its program number within the map, h, w, and the map's start in the
    buffers a and b). LEVELS > 0: a launch over every level's subbands, ceil(B * strips_i / 16) programs each."""
    if LEVELS > 0:
        lv, h, w, st, off = _level_of(pid, H, W, B, 1, 1, LEVELS, CC, K)
        return lv, pid - st, h, w, a_ptr + off, b_ptr + off
    else:
        return pid * 0, pid, H, W, a_ptr, b_ptr


@triton.jit
def _segments(local, h, w, B, K: tl.constexpr, CC: tl.constexpr, BC: tl.constexpr, TRANS: tl.constexpr):
    """This program's tile geometry: channels (BC, 1, 1) and their mask; each segment's image (int64) and first
    output column, its validity, and the strip width NQ. Segments run along axis 1 (axis 2 with TRANS), slots
    along the other."""
    c = tl.program_id(1) * BC + tl.arange(0, BC)[:, None, None]
    if TRANS:
        m = tl.arange(0, SEG)[None, None, :]
    else:
        m = tl.arange(0, SEG)[None, :, None]
    s_per = (w + 16 - K) // (17 - K)
    nq = (w + s_per - 1) // s_per
    g = local * SEG + m
    return c, c < CC, (g // s_per).to(tl.int64), (g % s_per) * nq, g < B * s_per, nq


@triton.jit
def _split_weight(wt, RND: tl.constexpr, OPD: tl.constexpr):
    """fp32 weights as two operands of the input dtype RND (hi, lo: hi + lo carries ~16 more bits than hi)."""
    hi = _round(wt, RND).to(tl.float32)
    lo = _round(wt - hi, RND).to(tl.float32)
    return hi.to(OPD), lo.to(OPD)


@triton.jit
def _mma_conv_kernel(
    x_ptr,  # (B, H, W, CC) dense; LEVELS > 0: the flat coefficient buffer, level i (B, h_i, w_i, CC) after level i-1
    acc_ptr,  # HAS_ACC: (B, H, W, CC) added to the output; SYN1: level 1's filtered subbands (B, h_1, w_1, 4, CC)
    acc2_ptr,  # SYN1 and HAS_ACC2: acc_2 (B, h_1, w_1, CC), the coarser levels' synthesis, from element acc2_off
    y_ptr,  # (B, ceil(H / STRIDE), ceil(W / STRIDE), CC); LEVELS > 0: a buffer laid out as x_ptr's
    w_ptr,  # (K, K, CC) fp32 taps-major; LEVELS > 0: (L, K, K, CC)
    b_ptr,  # (CC,) fp32 (HAS_BIAS)
    acc2_off, H, W, B,
    CC: tl.constexpr, K: tl.constexpr, LEVELS: tl.constexpr, BC: tl.constexpr, STRIDE: tl.constexpr,
    HAS_ACC: tl.constexpr, HAS_BIAS: tl.constexpr, FLIP: tl.constexpr, SPLIT: tl.constexpr,
    RND: tl.constexpr, OPD: tl.constexpr,  # the input dtype; the operand dtype (RND, or fp32 in the interpreter)
    SYN1: tl.constexpr, HAS_ACC2: tl.constexpr,
):
    """Depthwise K x K convolution, 'same' zero padding, on tensor cores: of one map (LEVELS = 0) or of every
    level's subbands in one launch. FLIP rotates the kernel by 180 degrees. SYN1 (with HAS_ACC): the base
    convolution adds level 1's inverse Haar step itself, from its filtered subbands (and acc_2 on their low-pass),
    instead of reading a synthesised acc_1: one full-resolution map less written and read."""
    PAD: tl.constexpr = K // 2
    lv, local, h, w, xb, yb = _program_map(tl.program_id(0), x_ptr, y_ptr, H, W, B, K, LEVELS, CC)
    wb = w_ptr + tl.maximum(lv - 1, 0) * (K * K * CC)
    c, cm, b, n0, gok, nq = _segments(local, h, w, B, K, CC, BC, False)
    img = b * h * w * CC
    sl = tl.arange(0, SEG)[None, None, :]  # input slot (the inner dimension) / output slot (N)
    col = n0 + sl - PAD
    xm = cm & gok & (col >= 0) & (col < w)
    rs = tl.cast(w, tl.int64) * CC
    xo = img + col * CC + c
    ocol = n0 + sl
    om = cm & gok & (sl < nq) & (ocol < w)
    if STRIDE > 1:
        om = om & (ocol % STRIDE == 0)
    ho = (h + STRIDE - 1) // STRIDE
    wo = (w + STRIDE - 1) // STRIDE
    ors = tl.cast(wo, tl.int64) * CC
    yo = b * ho * wo * CC + (ocol // STRIDE) * CC + c
    ao = img + ocol * CC + c
    if SYN1:
        # Level 1's positions under this program's columns (row 0), and the columns' parity.
        w1 = (w + 1) // 2
        s1 = (b * ((h + 1) // 2) * w1 + ocol // 2) * CC
        t1p = acc_ptr + s1 * 4 + c
        a2p = acc2_ptr + tl.cast(acc2_off, tl.int64) + s1 + c
        rs1 = tl.cast(w1, tl.int64) * CC
        right = ocol % 2 == 1
    # Toeplitz operands, one (or a hi / lo pair) per tap row: T[c, i, q] = w[ky, i - q, c].
    ti = tl.arange(0, SEG)[None, :, None]
    kx = ti - sl
    tm = cm & (kx >= 0) & (kx < K) & (sl < nq)
    ts = ()
    for ky in tl.static_range(K):
        if FLIP:
            wo_ = ((K - 1 - ky) * K + (K - 1 - kx)) * CC + c
        else:
            wo_ = (ky * K + kx) * CC + c
        hi, lo = _split_weight(tl.load(wb + wo_, mask=tm, other=0.0).to(tl.float32), RND, OPD)
        ts = ts + (hi, lo)
    if HAS_BIAS:
        bias = tl.load(b_ptr + c, mask=cm, other=0.0).to(tl.float32)
    acc = ()
    for _ in tl.static_range(K):
        acc = acc + (tl.zeros((BC, SEG, SEG), dtype=tl.float32),)
    # The next row is loaded while this one is computed (raw dtype, loop-carried).
    nxt = tl.load(xb + xo, mask=xm & (h > 0), other=0.0)
    for r in range(0, h + PAD):
        cur = nxt.to(OPD)
        r1 = r + 1
        nxt = tl.load(xb + xo + r1 * rs, mask=xm & (r1 < h), other=0.0)
        new = ()
        for j in tl.static_range(K):  # slot j: output row r - PAD + j, reached through tap row K - 1 - j
            a = tl.dot(cur, ts[2 * (K - 1 - j)], acc[j])
            if SPLIT:
                a = tl.dot(cur, ts[2 * (K - 1 - j) + 1], a)
            new = new + (a,)
        o = r - PAD
        if (o >= 0) & (o % STRIDE == 0):
            out = new[0]
            if HAS_BIAS:
                out += bias
            if HAS_ACC:
                if SYN1:
                    r1_ = (o // 2) * rs1
                    out += _haar_synthesis_at(t1p + 4 * r1_, a2p + r1_, o, right, om, CC, HAS_ACC2)
                else:
                    out += tl.load(acc_ptr + ao + o * rs, mask=om, other=0.0).to(tl.float32)
            tl.store(yb + yo + (o // STRIDE) * ors, out.to(y_ptr.dtype.element_ty), mask=om)
        acc = ()
        for j in tl.static_range(1, K):
            acc = acc + (new[j],)
        acc = acc + (tl.zeros((BC, SEG, SEG), dtype=tl.float32),)


@triton.jit
def _haar_synthesis_at(tp, a2p, o, right, om, CC: tl.constexpr, HAS_ACC2: tl.constexpr):
    """acc_1 at full-resolution row ``o`` (fp32), each output slot from its own 2 x 2 block (``right``: odd
    columns): :func:`_haar_pair_at` of level 1's filtered subbands at ``tp`` (+ acc_2 at ``a2p``)."""
    left, rgt = _haar_pair_at(tp, a2p, o, om, CC, HAS_ACC2, tl.float32)
    return tl.where(right, rgt, left)


@triton.jit
def _wgrad_row(xp, gp, r, rs, h, xm, gmk, dq, gacc, dsum, K: tl.constexpr, DSUM: tl.constexpr, OPD: tl.constexpr):
    """One x row of the weight gradient: dy row r + PAD joins the rows in flight, and x row r meets each of them."""
    PAD: tl.constexpr = K // 2
    xt = tl.load(xp + r * rs, mask=xm, other=0.0).to(OPD)
    rg = r + PAD
    graw = tl.load(gp + rg * rs, mask=gmk & (rg < h), other=0.0)
    if DSUM:
        dsum += graw.to(tl.float32)
    new = ()
    for j in tl.static_range(1, K):
        new = new + (dq[j],)
    dq = new + (graw.to(OPD),)
    upd = ()
    for ky in tl.static_range(K):  # x row r pairs with dy row r - ky + PAD: slot K - 1 - ky
        upd = upd + (tl.dot(xt, dq[K - 1 - ky], gacc[ky]),)
    return dq, upd, dsum


@triton.jit
def _mma_wgrad_kernel(
    x_ptr,  # (B, H, W, CC) dense x; LEVELS > 0: the flat coefficient buffer of x
    g_ptr,  # the same for dy
    part_ptr,  # (programs, TP, CC) fp32: one row of partial sums per program (taps, then dy's sum in lane K*K)
    H, W, B,
    CC: tl.constexpr, K: tl.constexpr, TP: tl.constexpr, LEVELS: tl.constexpr, BC: tl.constexpr,
    DSUM: tl.constexpr, OPD: tl.constexpr,
):
    """d w[ky, kx] = sum over positions of dy(o, n) * x(o + ky - PAD, n + kx - PAD), per program, on tensor cores;
    of one map (LEVELS = 0) or of every level's subbands in one launch. DSUM: also the sum of dy (bias gradient)."""
    PAD: tl.constexpr = K // 2
    pid = tl.program_id(0)
    _, local, h, w, xb, gb = _program_map(pid, x_ptr, g_ptr, H, W, B, K, LEVELS, CC)
    rs = tl.cast(w, tl.int64) * CC
    # x is loaded transposed, (BC, 16 input slots, 16 segments): the product's A operand as it is loaded.
    c, cm, bt, n0t, gokt, _ = _segments(local, h, w, B, K, CC, BC, True)
    it = tl.arange(0, SEG)[None, :, None]
    colt = n0t + it - PAD
    xm = cm & gokt & (colt >= 0) & (colt < w)
    xo = bt * h * w * CC + colt * CC + c
    # dy as (BC, 16 segments, 16 output slots), the B operand.
    c, cm, b, n0, gok, nq = _segments(local, h, w, B, K, CC, BC, False)
    sl = tl.arange(0, SEG)[None, None, :]
    ocol = n0 + sl
    img = b * h * w * CC
    gmk = cm & gok & (sl < nq) & (ocol < w)
    go = img + ocol * CC + c
    gacc = ()
    for _ in tl.static_range(K):
        gacc = gacc + (tl.zeros((BC, SEG, SEG), dtype=tl.float32),)
    dsum = tl.zeros((BC, SEG, SEG), dtype=tl.float32)
    # dy rows r - PAD .. r + PAD in flight (slot j: row r - PAD + j); zeros above the map.
    dq = ()
    for _ in tl.static_range(PAD + 1):
        dq = dq + (tl.zeros((BC, SEG, SEG), dtype=OPD),)
    for j in tl.static_range(PAD):
        graw = tl.load(gb + go + j * rs, mask=gmk & (j < h), other=0.0)
        if DSUM:
            dsum += graw.to(tl.float32)
        dq = dq + (graw.to(OPD),)
    # Rows in blocks of K, unrolled: the dy rows in flight rotate by renaming, so each is converted to its operand
    # layout once per block rather than once per product; then the remaining rows one by one.
    main = h - h % K
    for r0 in range(0, main, K):
        for u in tl.static_range(K):
            dq, gacc, dsum = _wgrad_row(xb + xo, gb + go, r0 + u, rs, h, xm, gmk, dq, gacc, dsum, K, DSUM, OPD)
    for r in range(main, h):
        dq, gacc, dsum = _wgrad_row(xb + xo, gb + go, r, rs, h, xm, gmk, dq, gacc, dsum, K, DSUM, OPD)
    ti = tl.arange(0, SEG)[None, :, None]
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    dst = part_ptr + pid.to(tl.int64) * TP * CC + cc
    for ky in tl.static_range(K):
        for kx in tl.static_range(K):
            v = tl.sum(tl.sum(tl.where(ti - sl == kx, gacc[ky], 0.0), 2), 1)
            tl.store(dst + (ky * K + kx) * CC, v, mask=cc < CC)
    if DSUM:
        tl.store(dst + K * K * CC, tl.sum(tl.sum(dsum, 2), 1), mask=cc < CC)


_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def operand_dtype(dtype: torch.dtype):
    """(rounding dtype, operand dtype) of the kernels for inputs of ``dtype`` (bf16 / fp16)."""
    rnd = tl.float16 if dtype == torch.float16 else tl.bfloat16
    return rnd, tl.float32 if _INTERPRET else rnd
