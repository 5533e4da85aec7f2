"""Triton kernels of the fused WTConv (Haar) and their launchers.

Layout of the computation (L levels, level i = 1..L works at 2^-i resolution):

- ``LL_0 = x``; ``LL_i`` is the raw low-pass of ``LL_{i-1}`` (2x2 block sums / 2, zero-extended). Only this
  low-pass pyramid ever reaches memory (N/3 elements); every detail coefficient is recomputed on chip from the
  2x2 block of ``LL_{i-1}`` it comes from (the Haar butterfly).
- Level kernel for level i: filtered coefficients ``t_i = conv(butterfly(LL_{i-1}), scale_i * W_i)`` on a tile of
  coarse positions, plus the already synthesised coarser levels ``acc_{i+1}`` on the LL subband, then one
  synthesis step to ``acc_i`` at the resolution of ``LL_{i-1}``. At level 1 the same program also computes the base
  conv ``base_scale * (conv(x, W) + b)`` and writes ``y`` (strided, in x's memory layout), so y is written once.
- Backward: the input gradient is the same WTConv applied to dy with every kernel rotated by 180 degrees (no
  bias); the weight gradients are tile-wise correlations of the coefficient pyramids of x and dy, reduced into
  per-tile fp32 partial buffers and summed afterwards (deterministic, no atomics).

Every scale is folded into its weights inside the kernels (``w * s`` when the weight is loaded), so scales cost no
extra pass and their gradients follow from the same correlations. Arithmetic is fp32 (fp64 for fp64 inputs);
outputs are stored in the input dtype. Plane offsets are int64; in-plane offsets are int64 when a plane's span can
pass 2^31 elements (``INDEX_64``).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["ll_pyramid", "wtconv_forward", "wtconv_weight_grads"]


@triton.jit
def _ll_kernel(
    src_ptr,  # (P, Hs, Ws) any strides: the finer low-pass (x, or a previous level)
    out_ptr,  # (P, Hc, Wc) contiguous, compute dtype
    P, C, Hs, Ws, Hc, Wc,
    s_b, s_c, s_h, s_w,  # strides of src, plane index p = b * C + c
    BLOCK_P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    INDEX_64: tl.constexpr, COMPUTE: tl.constexpr,
):
    pid_p = tl.program_id(0).to(tl.int64)
    pid_m = tl.program_id(1)
    pid_n = tl.program_id(2)
    p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)[:, None, None]
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[None, :, None]
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[None, None, :]
    if INDEX_64:
        m = m.to(tl.int64)
        n = n.to(tl.int64)
    pmask = p < P
    plane = src_ptr + ((p // C) * s_b + (p % C) * s_c)
    s0, _, _, _ = _butterfly_at(plane, pmask, m, n, Hs, Ws, s_h, s_w, COMPUTE)
    out = s0
    omask = pmask & (m < Hc) & (n < Wc)
    tl.store(out_ptr + p * (Hc * Wc) + m * Wc + n, out, mask=omask)


@triton.jit
def _butterfly_at(plane, pmask, mm, nn, Hs, Ws, s_h, s_w, COMPUTE: tl.constexpr):
    """The four Haar subbands of the 2x2 blocks at coarse positions (mm, nn); zero outside the finer map.

    ``plane`` points at each plane's origin; in-plane offsets stay 32-bit unless mm / nn are int64.
    """
    r0 = 2 * mm
    c0 = 2 * nn
    mr0 = (r0 >= 0) & (r0 < Hs)
    mr1 = (r0 + 1 >= 0) & (r0 + 1 < Hs)
    mc0 = (c0 >= 0) & (c0 < Ws)
    mc1 = (c0 + 1 >= 0) & (c0 + 1 < Ws)
    ptr = plane + (r0 * s_h + c0 * s_w)
    a = tl.load(ptr, mask=pmask & mr0 & mc0, other=0.0).to(COMPUTE)
    b = tl.load(ptr + s_w, mask=pmask & mr0 & mc1, other=0.0).to(COMPUTE)
    c = tl.load(ptr + s_h, mask=pmask & mr1 & mc0, other=0.0).to(COMPUTE)
    d = tl.load(ptr + s_h + s_w, mask=pmask & mr1 & mc1, other=0.0).to(COMPUTE)
    ab = a + b
    cd = c + d
    amb = a - b
    cmd = c - d
    return (ab + cd) * 0.5, (ab - cd) * 0.5, (amb + cmd) * 0.5, (amb - cmd) * 0.5


@triton.jit
def _level_fwd_kernel(
    src_ptr,  # (P, Hs, Ws) any strides: LL_{i-1} (x at level 1)
    acc_ptr,  # (P, Hc, Wc) contiguous: synthesis of the coarser levels (read when HAS_ACC)
    out_ptr,  # (P, Hs, Ws) contiguous acc_i, or y (P, ceil(Hs/STRIDE), ceil(Ws/STRIDE)) with strides o_* (IS_LAST)
    ww_ptr,  # (C, 4, K, K) this level's kernels
    ws_ptr,  # (C, 4) this level's scales
    bw_ptr,  # (C, K, K) base kernel (IS_LAST)
    bb_ptr,  # (C,) base bias (HAS_BIAS)
    bs_ptr,  # (C,) base scale (IS_LAST)
    P, C, Hs, Ws, Hc, Wc,
    s_b, s_c, s_h, s_w,  # strides of src
    o_b, o_c, o_h, o_w,  # strides of out
    K: tl.constexpr, STRIDE: tl.constexpr,
    HAS_LEVEL: tl.constexpr, HAS_ACC: tl.constexpr, IS_LAST: tl.constexpr, HAS_BIAS: tl.constexpr,
    FLIP: tl.constexpr,  # rotate every kernel by 180 degrees (the input-gradient pass)
    BLOCK_P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    INDEX_64: tl.constexpr, COMPUTE: tl.constexpr,
):
    PAD: tl.constexpr = K // 2
    KK: tl.constexpr = K * K
    pid_p = tl.program_id(0).to(tl.int64)
    pid_m = tl.program_id(1)
    pid_n = tl.program_id(2)
    p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)[:, None, None]
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[None, :, None]
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[None, None, :]
    if INDEX_64:
        m = m.to(tl.int64)
        n = n.to(tl.int64)
    pmask = p < P
    ch = p % C
    plane = src_ptr + ((p // C) * s_b + ch * s_c)  # 64-bit once per plane, 32-bit offsets inside

    # Synthesised value of the four fine pixels (2m + r, 2n + q) of each coarse position.
    y00 = tl.zeros((BLOCK_P, BLOCK_M, BLOCK_N), dtype=COMPUTE)
    y01 = tl.zeros((BLOCK_P, BLOCK_M, BLOCK_N), dtype=COMPUTE)
    y10 = tl.zeros((BLOCK_P, BLOCK_M, BLOCK_N), dtype=COMPUTE)
    y11 = tl.zeros((BLOCK_P, BLOCK_M, BLOCK_N), dtype=COMPUTE)
    if HAS_LEVEL:
        t0 = tl.zeros((BLOCK_P, BLOCK_M, BLOCK_N), dtype=COMPUTE)
        t1 = tl.zeros((BLOCK_P, BLOCK_M, BLOCK_N), dtype=COMPUTE)
        t2 = tl.zeros((BLOCK_P, BLOCK_M, BLOCK_N), dtype=COMPUTE)
        t3 = tl.zeros((BLOCK_P, BLOCK_M, BLOCK_N), dtype=COMPUTE)
        wrow = ww_ptr + ch * (4 * KK)
        for ky in range(K):
            for kx in tl.static_range(K):
                if FLIP:
                    tap = (K - 1 - ky) * K + (K - 1 - kx)
                else:
                    tap = ky * K + kx
                s0, s1, s2, s3 = _butterfly_at(plane, pmask, m + (ky - PAD), n + (kx - PAD),
                                               Hs, Ws, s_h, s_w, COMPUTE)
                w0 = tl.load(wrow + tap, mask=pmask, other=0.0).to(COMPUTE)
                w1 = tl.load(wrow + KK + tap, mask=pmask, other=0.0).to(COMPUTE)
                w2 = tl.load(wrow + 2 * KK + tap, mask=pmask, other=0.0).to(COMPUTE)
                w3 = tl.load(wrow + 3 * KK + tap, mask=pmask, other=0.0).to(COMPUTE)
                t0 += w0 * s0
                t1 += w1 * s1
                t2 += w2 * s2
                t3 += w3 * s3
        # Fold the per-channel scales into the filtered coefficients (== folding them into the weights).
        t0 *= tl.load(ws_ptr + ch * 4, mask=pmask, other=0.0).to(COMPUTE)
        t1 *= tl.load(ws_ptr + ch * 4 + 1, mask=pmask, other=0.0).to(COMPUTE)
        t2 *= tl.load(ws_ptr + ch * 4 + 2, mask=pmask, other=0.0).to(COMPUTE)
        t3 *= tl.load(ws_ptr + ch * 4 + 3, mask=pmask, other=0.0).to(COMPUTE)
        if HAS_ACC:
            amask = pmask & (m < Hc) & (n < Wc)
            t0 += tl.load(acc_ptr + p * (Hc * Wc) + m * Wc + n, mask=amask, other=0.0).to(COMPUTE)
        pp = t0 + t1
        qq = t0 - t1
        rr = t2 + t3
        ss = t2 - t3
        y00 = (pp + rr) * 0.5
        y01 = (pp - rr) * 0.5
        y10 = (qq + ss) * 0.5
        y11 = (qq - ss) * 0.5

    if IS_LAST:
        # Base branch at full resolution: base_scale * (conv(x, W) + b), for the four phases of the tile.
        bscale = tl.load(bs_ptr + ch, mask=pmask, other=0.0).to(COMPUTE)
        b00 = tl.zeros((BLOCK_P, BLOCK_M, BLOCK_N), dtype=COMPUTE)
        b01 = tl.zeros((BLOCK_P, BLOCK_M, BLOCK_N), dtype=COMPUTE)
        b10 = tl.zeros((BLOCK_P, BLOCK_M, BLOCK_N), dtype=COMPUTE)
        b11 = tl.zeros((BLOCK_P, BLOCK_M, BLOCK_N), dtype=COMPUTE)
        brow = bw_ptr + ch * KK
        for ky in range(K):
            h0 = 2 * m + (ky - PAD)
            h1 = h0 + 1
            mh0 = pmask & (h0 >= 0) & (h0 < Hs)
            mh1 = pmask & (h1 >= 0) & (h1 < Hs)
            # Columns 2n + q + kx - PAD for q in {0, 1}, kx in [0, K): K + 1 distinct columns, each loaded once.
            for j in tl.static_range(K + 1):
                wc = 2 * n + (j - PAD)
                mw = (wc >= 0) & (wc < Ws)
                v0 = tl.load(plane + (h0 * s_h + wc * s_w), mask=mh0 & mw, other=0.0).to(COMPUTE)
                v1 = tl.load(plane + (h1 * s_h + wc * s_w), mask=mh1 & mw, other=0.0).to(COMPUTE)
                if j < K:  # phase q = 0 uses kx = j
                    if FLIP:
                        tap0 = (K - 1 - ky) * K + (K - 1 - j)
                    else:
                        tap0 = ky * K + j
                    wq0 = tl.load(brow + tap0, mask=pmask, other=0.0).to(COMPUTE)
                    b00 += wq0 * v0
                    b10 += wq0 * v1
                if j >= 1:  # phase q = 1 uses kx = j - 1
                    if FLIP:
                        tap1 = (K - 1 - ky) * K + (K - j)
                    else:
                        tap1 = ky * K + (j - 1)
                    wq1 = tl.load(brow + tap1, mask=pmask, other=0.0).to(COMPUTE)
                    b01 += wq1 * v0
                    b11 += wq1 * v1
        if HAS_BIAS:
            bias = tl.load(bb_ptr + ch, mask=pmask, other=0.0).to(COMPUTE)
            b00 += bias
            b01 += bias
            b10 += bias
            b11 += bias
        y00 += bscale * b00
        y01 += bscale * b01
        y10 += bscale * b10
        y11 += bscale * b11
        obase = (p // C) * o_b + ch * o_c
        _store_phase(out_ptr, obase, pmask, 2 * m, 2 * n, Hs, Ws, o_h, o_w, y00, STRIDE)
        _store_phase(out_ptr, obase, pmask, 2 * m, 2 * n + 1, Hs, Ws, o_h, o_w, y01, STRIDE)
        _store_phase(out_ptr, obase, pmask, 2 * m + 1, 2 * n, Hs, Ws, o_h, o_w, y10, STRIDE)
        _store_phase(out_ptr, obase, pmask, 2 * m + 1, 2 * n + 1, Hs, Ws, o_h, o_w, y11, STRIDE)
    else:
        obase = p * (Hs * Ws)
        _store_phase(out_ptr, obase, pmask, 2 * m, 2 * n, Hs, Ws, Ws, 1, y00, 1)
        _store_phase(out_ptr, obase, pmask, 2 * m, 2 * n + 1, Hs, Ws, Ws, 1, y01, 1)
        _store_phase(out_ptr, obase, pmask, 2 * m + 1, 2 * n, Hs, Ws, Ws, 1, y10, 1)
        _store_phase(out_ptr, obase, pmask, 2 * m + 1, 2 * n + 1, Hs, Ws, Ws, 1, y11, 1)


@triton.jit
def _store_phase(out_ptr, obase, pmask, h, w, H, W, o_h, o_w, val, STRIDE: tl.constexpr):
    mask = pmask & (h < H) & (w < W)
    if STRIDE > 1:
        # Stride is plain subsampling of the full-resolution output.
        mask = mask & (h % STRIDE == 0) & (w % STRIDE == 0)
        h = h // STRIDE
        w = w // STRIDE
    tl.store(out_ptr + obase + h * o_h + w * o_w, val.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _level_wgrad_kernel(
    xs_ptr,  # (B, C, Hs, Ws) any strides: LL_{i-1} of x
    gs_ptr,  # (B, C, Hs, Ws) any strides: LL_{i-1} of dy (dy itself at level 1)
    part_ptr,  # (R, C, NCOL) fp32 (fp64 for fp64 inputs) partial sums, R = B * tiles; columns: [4*K*K level | K*K base | 1 sum(dy)]
    C, Hs, Ws, NCOL, TILES_N, TILES,
    xs_b, xs_c, xs_h, xs_w,
    gs_b, gs_c, gs_h, gs_w,
    K: tl.constexpr, HAS_LEVEL: tl.constexpr, IS_LAST: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    INDEX_64: tl.constexpr, COMPUTE: tl.constexpr,
):
    PAD: tl.constexpr = K // 2
    KK: tl.constexpr = K * K
    pid_c = tl.program_id(0)
    bidx = tl.program_id(1).to(tl.int64)
    tile = tl.program_id(2)
    cc = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    ch = cc[:, None, None].to(tl.int64)
    m = (tile // TILES_N) * BLOCK_M + tl.arange(0, BLOCK_M)[None, :, None]
    n = (tile % TILES_N) * BLOCK_N + tl.arange(0, BLOCK_N)[None, None, :]
    if INDEX_64:
        m = m.to(tl.int64)
        n = n.to(tl.int64)
    cmask = ch < C
    xplane = xs_ptr + (bidx * xs_b + ch * xs_c)  # 64-bit once per plane, 32-bit offsets inside
    gplane = gs_ptr + (bidx * gs_b + ch * gs_c)
    row = part_ptr + ((bidx * TILES + tile) * C + cc) * NCOL  # (BLOCK_C,) pointers
    cvalid = cc < C
    if HAS_LEVEL:
        # dy's coefficients at this tile's coarse positions, correlated with x's at every shift.
        g0, g1, g2, g3 = _butterfly_at(gplane, cmask, m, n, Hs, Ws, gs_h, gs_w, COMPUTE)
        for ky in range(K):
            for kx in tl.static_range(K):
                c0, c1, c2, c3 = _butterfly_at(xplane, cmask, m + (ky - PAD), n + (kx - PAD),
                                               Hs, Ws, xs_h, xs_w, COMPUTE)
                tap = ky * K + kx
                tl.store(row + tap, tl.sum(tl.sum(c0 * g0, 2), 1).to(part_ptr.dtype.element_ty), mask=cvalid)
                tl.store(row + KK + tap, tl.sum(tl.sum(c1 * g1, 2), 1).to(part_ptr.dtype.element_ty), mask=cvalid)
                tl.store(row + 2 * KK + tap, tl.sum(tl.sum(c2 * g2, 2), 1).to(part_ptr.dtype.element_ty), mask=cvalid)
                tl.store(row + 3 * KK + tap, tl.sum(tl.sum(c3 * g3, 2), 1).to(part_ptr.dtype.element_ty), mask=cvalid)
    if IS_LAST:
        # Base conv: corr[ky, kx] = sum_{h, w} x[h + ky - PAD, w + kx - PAD] * dy[h, w], over this tile's pixels.
        h0 = 2 * m
        w0 = 2 * n
        mh0 = cmask & (h0 < Hs)
        mh1 = cmask & (h0 + 1 < Hs)
        mw0 = w0 < Ws
        mw1 = w0 + 1 < Ws
        gp = gplane + (h0 * gs_h + w0 * gs_w)
        d00 = tl.load(gp, mask=mh0 & mw0, other=0.0).to(COMPUTE)
        d01 = tl.load(gp + gs_w, mask=mh0 & mw1, other=0.0).to(COMPUTE)
        d10 = tl.load(gp + gs_h, mask=mh1 & mw0, other=0.0).to(COMPUTE)
        d11 = tl.load(gp + gs_h + gs_w, mask=mh1 & mw1, other=0.0).to(COMPUTE)
        tl.store(row + 5 * KK, tl.sum(tl.sum(d00 + d01 + d10 + d11, 2), 1).to(part_ptr.dtype.element_ty), mask=cvalid)
        for ky in range(K):
            hh0 = h0 + (ky - PAD)
            hh1 = hh0 + 1
            mr0 = cmask & (hh0 >= 0) & (hh0 < Hs)
            mr1 = cmask & (hh1 >= 0) & (hh1 < Hs)
            for kx in tl.static_range(K):
                ww0 = w0 + (kx - PAD)
                ww1 = ww0 + 1
                mc0 = (ww0 >= 0) & (ww0 < Ws)
                mc1 = (ww1 >= 0) & (ww1 < Ws)
                xp = xplane + (hh0 * xs_h + ww0 * xs_w)
                acc = d00 * tl.load(xp, mask=mr0 & mc0, other=0.0).to(COMPUTE)
                acc += d01 * tl.load(xp + xs_w, mask=mr0 & mc1, other=0.0).to(COMPUTE)
                acc += d10 * tl.load(xp + xs_h, mask=mr1 & mc0, other=0.0).to(COMPUTE)
                acc += d11 * tl.load(xp + xs_h + xs_w, mask=mr1 & mc1, other=0.0).to(COMPUTE)
                tl.store(row + 4 * KK + ky * K + kx, tl.sum(tl.sum(acc, 2), 1).to(part_ptr.dtype.element_ty), mask=cvalid)


# ----------------------------------------------------------------------------------------------------------------
# Launchers


def _compute_dtype(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# Launch shapes. Set from the sweep in benchmarks/tune_tiles.py on an H200; override for experiments with
# ``TUNING.update(...)``. Fixed tiles (no autotuner) keep the weight-gradient reduction order, hence the bits,
# identical from run to run.
# H200 sweep (bf16, WTConvNeXt-T stage shapes, results/tune.json): 512-element tiles with 4 warps for the level
# kernels (1024 for maps of <= 4x4 coarse positions), 512 with 2 warps for the weight-gradient kernels; larger tiles
# spill registers (2048 elements / 2 warps was 15x slower).
TUNING: dict[str, int] = {"fwd_elems": 512, "fwd_small_elems": 1024, "fwd_warps": 4, "wgrad_elems": 512,
                          "wgrad_warps": 2}


def _tiles(planes: int, hc: int, wc: int, max_elems: int) -> tuple[int, int, int]:
    """Block sizes (planes, coarse rows, coarse cols): whole small maps per program, several planes when small."""
    bn = min(triton.next_power_of_2(max(wc, 1)), 32, max_elems)
    bm = min(triton.next_power_of_2(max(hc, 1)), max(max_elems // bn, 1), 64)
    bp = min(triton.next_power_of_2(max(planes, 1)), max(max_elems // (bm * bn), 1))
    return bp, bm, bn


def _needs_int64(*tensors: Tensor) -> bool:
    """True when an in-plane offset of any tensor can pass 2^31 - 1."""
    for t in tensors:
        if t.dim() == 4:
            span = (t.shape[2] - 1) * abs(t.stride(2)) + (t.shape[3] - 1) * abs(t.stride(3))
            # Masked-off taps still compute offsets up to 2 * (K // 2) + 1 rows / columns outside the map; keep
            # those representable too (a 64-row / column margin covers every K <= 61).
            if span + 64 * (abs(t.stride(2)) + abs(t.stride(3))) >= 2**31 - 1:
                return True
    return False


def _num_warps(elems: int, override: int = 0) -> int:
    if override:
        return override
    return 4 if elems >= 512 else (2 if elems >= 128 else 1)


def ll_pyramid(x: Tensor, levels: int) -> list[Tensor]:
    """[LL_0 = x, LL_1, ..., LL_{levels-1}]: the low-pass inputs of every level (LL_i in the compute dtype)."""
    pyr = [x]
    bsz, ch = x.shape[:2]
    for _ in range(1, levels):
        src = pyr[-1]
        hs, ws = src.shape[-2:]
        hc, wc = (hs + 1) // 2, (ws + 1) // 2
        out = torch.empty((bsz, ch, hc, wc), device=x.device, dtype=_acc_dtype(x.dtype))
        bp, bm, bn = _tiles(bsz * ch, hc, wc, 1024)
        grid = (triton.cdiv(bsz * ch, bp), triton.cdiv(hc, bm), triton.cdiv(wc, bn))
        _ll_kernel[grid](
            src, out, bsz * ch, ch, hs, ws, hc, wc, *src.stride(),
            BLOCK_P=bp, BLOCK_M=bm, BLOCK_N=bn, INDEX_64=_needs_int64(src, out),
            COMPUTE=_compute_dtype(x.dtype), num_warps=_num_warps(bp * bm * bn),
        )
        pyr.append(out)
    return pyr


def wtconv_forward(
    pyr: list[Tensor],
    out: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    base_scale: Tensor,
    wavelet_weight: Tensor,
    wavelet_scale: Tensor,
    stride: int,
    flip: bool = False,
) -> Tensor:
    """Run the level kernels coarse to fine on the low-pass pyramid ``pyr`` of the input, writing ``out``.

    ``out`` is (B, C, ceil(H/stride), ceil(W/stride)) with any strides. ``flip`` rotates every kernel by 180
    degrees (the input-gradient pass; then ``bias`` is None).
    """
    x = pyr[0]
    bsz, ch, h, w = x.shape
    levels = wavelet_weight.shape[0]
    k = weight.shape[-1]
    planes = bsz * ch
    compute = _compute_dtype(x.dtype)
    acc: Optional[Tensor] = None
    for i in range(max(levels, 1), 0, -1):  # level i reads pyr[i - 1]; L = 0 runs the base alone
        src = pyr[i - 1]
        hs, ws = src.shape[-2:]
        hc, wc = (hs + 1) // 2, (ws + 1) // 2
        last = i == 1
        dst = out if last else torch.empty((bsz, ch, hs, ws), device=x.device, dtype=_acc_dtype(x.dtype))
        bp, bm, bn = _tiles(planes, hc, wc, TUNING["fwd_small_elems" if hc * wc <= 16 else "fwd_elems"])
        grid = (triton.cdiv(planes, bp), triton.cdiv(hc, bm), triton.cdiv(wc, bn))
        lvl = i - 1 if levels else 0
        _level_fwd_kernel[grid](
            src, acc if acc is not None else dst, dst,
            wavelet_weight[lvl] if levels else weight, wavelet_scale[lvl] if levels else base_scale,
            weight, bias if bias is not None else base_scale, base_scale,
            planes, ch, hs, ws, hc, wc, *src.stride(), *dst.stride(),
            K=k, STRIDE=stride if last else 1,
            HAS_LEVEL=levels > 0, HAS_ACC=acc is not None, IS_LAST=last, HAS_BIAS=bias is not None, FLIP=flip,
            BLOCK_P=bp, BLOCK_M=bm, BLOCK_N=bn, INDEX_64=_needs_int64(src, dst), COMPUTE=compute,
            num_warps=_num_warps(bp * bm * bn, TUNING["fwd_warps"]),
        )
        acc = dst
    return out


def wtconv_weight_grads(xpyr: list[Tensor], gpyr: list[Tensor], k: int, levels: int) -> tuple[Tensor, Tensor, Tensor]:
    """Raw correlations for the weight gradients.

    Returns:
        level_corr: (L, C, 4, K, K) fp32 (fp64 for fp64 inputs), ``sum c_i^s[m + ky - P, n + kx - P] * g_i^s[m, n]`` over batch and map.
        base_corr: (C, K, K) fp32, the same for x and dy at full resolution.
        dy_sum: (C,) fp32, ``sum dy`` per channel.
    """
    x = xpyr[0]
    bsz, ch = x.shape[:2]
    kk = k * k
    ncol = 5 * kk + 1
    compute = _compute_dtype(x.dtype)
    part_dtype = _acc_dtype(x.dtype)
    level_corr = []
    base_corr = dy_sum = None
    for i in range(1, max(levels, 1) + 1):
        xs, gs = xpyr[i - 1], gpyr[i - 1]
        hs, ws = xs.shape[-2:]
        hc, wc = (hs + 1) // 2, (ws + 1) // 2
        bc, bm, bn = _tiles(ch, hc, wc, TUNING["wgrad_elems"])
        tiles_n = triton.cdiv(wc, bn)
        tiles = triton.cdiv(hc, bm) * tiles_n
        part = torch.empty((bsz * tiles, ch, ncol), device=x.device, dtype=part_dtype)
        last = i == 1
        _level_wgrad_kernel[(triton.cdiv(ch, bc), bsz, tiles)](
            xs, gs, part, ch, hs, ws, ncol, tiles_n, tiles, *xs.stride(), *gs.stride(),
            K=k, HAS_LEVEL=levels > 0, IS_LAST=last, BLOCK_C=bc, BLOCK_M=bm, BLOCK_N=bn,
            INDEX_64=_needs_int64(xs, gs), COMPUTE=compute,
            num_warps=_num_warps(bc * bm * bn, TUNING["wgrad_warps"]),
        )
        # Deterministic reduction of the per-tile partials (fixed order, no atomics).
        total = part.sum(0)
        if levels > 0:
            level_corr.append(total[:, : 4 * kk].reshape(ch, 4, k, k))
        if last:
            base_corr = total[:, 4 * kk : 5 * kk].reshape(ch, k, k)
            dy_sum = total[:, 5 * kk]
    if levels > 0:
        lc = torch.stack(level_corr)
    else:
        lc = torch.zeros((0, ch, 4, k, k), device=x.device, dtype=part_dtype)
    return lc, base_corr, dy_sum
