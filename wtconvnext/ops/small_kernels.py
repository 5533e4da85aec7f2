"""The whole WTConv pass of a small map in one launch (issue 14: stages 3-4, maps up to 16 x 16).

At 14 x 14 and 7 x 7 a pass of :func:`~wtconvnext.ops.triton_kernels.wtconv_forward` is five launches whose
programs each do little: launches and their host time, not multiply-adds, set the layer's time there. Here one
program owns one image and a block of channels and runs every phase of the pass itself, in order: the analysis of
every level, every level's depthwise convolutions (each subband, strip by strip), the synthesis coarse to fine, and
the base convolution that adds acc_1 (with TUNING syn1, the default: level 1's inverse Haar step itself) and the
bias. The phases exchange data through the same flat coefficient and filtered-subband buffers as the multi-launch
path (each program touches only its own image and channels, so no two programs share a byte) with a barrier
between phases; L1 / L2 serve the re-reads.

The input gradient is this pass on dy with rotated kernels, over the dy coefficients that the weight gradients
(multi-launch: their partial rows want several images per program) have read. A one-launch backward that also
wrote the weight-gradient partials, one image per row, ran at 0.67x / 0.93x these launches at 14 x 14 / 7 x 7 on
the H200 and doubled the layer's peak memory (session 19; git 0ff21c8 has it).

The phases are the multi-launch path's own device functions with the same operand order and storage dtypes, so
the results are bitwise those of that path (the tests check it). Each phase is a function of its own (noinline,
scalar arguments only): Triton's TritonGPUCoalesce pass is quadratic in a function's size, and the split takes the
forward pass's sm_90 compile from 11.4 s to 5.4 s with the same loop code (results/cpu/compile_time.txt).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_kernels import _analysis_level, _conv_strip, _conv_weights, _level_at, _synthesis_level

__all__ = ["_small_kernel"]


@triton.jit
def _whole_analysis(src, spix: tl.constexpr, hs, ws, dst, hd, wd, b, cc, cmask, C: tl.constexpr, LV: tl.constexpr,
                    HM: tl.constexpr, WM: tl.constexpr, CHUNK: tl.constexpr, COMPUTE: tl.constexpr):
    """_analysis_level over all of level LV of an image whose map fits HM x WM. (The tile sizes are constexprs of
    this scope: the compiler rejects a constexpr assigned twice in a static loop, the interpreter makes an
    unannotated one a tensor.)"""
    S: tl.constexpr = ((HM - 1) >> LV) + 1
    SW: tl.constexpr = ((WM - 1) >> LV) + 1
    _analysis_level(src, spix, hs, ws, dst, hd, wd, b, 0, 0, cc, cmask, C, S, SW,
                    CHUNK if CHUNK < S * SW else S * SW, COMPUTE)


@triton.jit
def _whole_synthesis(t, hc, wc, accin, dst, hf, wf, cc, cmask, HAS_ACC: tl.constexpr, C: tl.constexpr,
                     LV: tl.constexpr, HM: tl.constexpr, WM: tl.constexpr, CHUNK: tl.constexpr,
                     COMPUTE: tl.constexpr):
    """_synthesis_level over all of level LV of one image (its pointers at the image's blocks), as above."""
    S: tl.constexpr = ((HM - 1) >> LV) + 1
    SW: tl.constexpr = ((WM - 1) >> LV) + 1
    _synthesis_level(t, hc, wc, accin, dst, hf, wf, 0, 0, 0, cc, cmask, HAS_ACC, C, S, SW,
                     CHUNK if CHUNK < S * SW else S * SW, COMPUTE)


@triton.jit(noinline=True)
def _image_analysis(src_ptr, coef_ptr, H, W, B, b, cb, C: tl.constexpr, LEVELS: tl.constexpr,
                    HM: tl.constexpr, WM: tl.constexpr, BC: tl.constexpr, CHUNK: tl.constexpr, COMPUTE: tl.constexpr):
    """Every level's subbands of image b of ``src_ptr`` (B, H, W, C), fine to coarse, each level from the low-pass
    this program just wrote (a barrier between levels; the caller puts one after the last)."""
    c1 = cb * BC + tl.arange(0, BC)
    cc2 = c1[None, :]
    cm2 = (c1 < C)[None, :]
    zero = b * 0
    hs = H
    ws = W
    prev = zero
    off = zero
    for l in tl.static_range(LEVELS):
        hd = (hs + 1) // 2
        wd = (ws + 1) // 2
        if l == 0:
            _whole_analysis(src_ptr + cc2, C, hs, ws, coef_ptr + cc2, hd, wd, b, cc2, cm2, C, l + 1, HM, WM,
                            CHUNK, COMPUTE)
        else:
            tl.debug_barrier()
            _whole_analysis(coef_ptr + prev + cc2, 4 * C, hs, ws, coef_ptr + off + cc2, hd, wd, b, cc2, cm2,
                            C, l + 1, HM, WM, CHUNK, COMPUTE)
        prev = off
        off += tl.cast(B * hd * wd, tl.int64) * (4 * C)
        hs = hd
        ws = wd


@triton.jit(noinline=True)
def _image_level_convs(coef_ptr, filt_ptr, lw_ptr, H, W, B, b, cb, C: tl.constexpr, K: tl.constexpr,
                       LEVELS: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, FLIP: tl.constexpr,
                       COMPUTE: tl.constexpr, NARROW: tl.constexpr = False):
    """Every level's depthwise convolutions of image b, channel block cb: subband by subband, strip by strip (one
    code copy: a loop), from the coefficients in ``coef_ptr`` into the filtered subbands at ``filt_ptr``. NARROW
    (TUNING small_narrow): a last strip of at most BW / 2 columns walks BW / 2 (a second code copy)."""
    c1 = cb * BC + tl.arange(0, BC)
    cm1 = c1 < C
    zbias = tl.zeros((BC,), dtype=COMPUTE)
    hl = H + 0 * tl.program_id(0)  # loop-carried: a tensor even where Triton specialises H == 1
    wl = W + 0 * tl.program_id(0)
    off = b * 0  # an int64 zero: offsets into the level buffers can pass 2^31
    for lv in range(LEVELS):
        hl = (hl + 1) // 2
        wl = (wl + 1) // 2
        rs = tl.cast(wl * (4 * C), tl.int64)
        img = off + b * hl * rs
        for s in range(4):
            cc = s * C + c1
            wts = _conv_weights(lw_ptr + lv * (K * K * 4 * C), cc, cm1, 4 * C, K, COMPUTE)
            for n0 in range(0, wl, BW):
                xb = coef_ptr + img + n0 * (4 * C) + cc
                if NARROW and wl - n0 <= BW // 2:
                    _conv_strip(xb, xb, filt_ptr + img + cc, rs, rs, hl, wl, n0, cm1, wts, zbias, xb, xb, rs,
                                4 * C, K, BW // 2, 1, False, False, FLIP, COMPUTE, False, False, 0)
                else:
                    _conv_strip(xb, xb, filt_ptr + img + cc, rs, rs, hl, wl, n0, cm1, wts, zbias, xb, xb, rs,
                                4 * C, K, BW, 1, False, False, FLIP, COMPUTE, False, False, 0)
        off += tl.cast(B * hl * wl, tl.int64) * (4 * C)


@triton.jit(noinline=True)
def _image_synthesis(coef_ptr, filt_ptr, H, W, B, b, cb, C: tl.constexpr, LEVELS: tl.constexpr,
                     HM: tl.constexpr, WM: tl.constexpr, BC: tl.constexpr, CHUNK: tl.constexpr,
                     COMPUTE: tl.constexpr, SYN1: tl.constexpr):
    """The synthesis of image b, channel block cb, coarse to fine down to level 1 + SYN1: acc_i over this image's
    block of level i's coefficient region (laid out (h_{i-1}, w_{i-1}, C) from the block's start, so no write
    reaches another image's coefficients), a barrier between levels."""
    c1 = cb * BC + tl.arange(0, BC)
    cc2 = c1[None, :]
    cm2 = (c1 < C)[None, :]
    for j in tl.static_range(LEVELS - 1, SYN1 - 1, -1):
        hf, wf, off = _level_at(H, W, B, j, 4 * C)
        hc = (hf + 1) // 2
        wc = (wf + 1) // 2
        blk = off + b * hc * wc * (4 * C)  # this image's block of level j + 1
        up = off + tl.cast(B * hc * wc, tl.int64) * (4 * C) + b * ((hc + 1) // 2) * ((wc + 1) // 2) * (4 * C)
        if j < LEVELS - 1:
            tl.debug_barrier()
        _whole_synthesis(filt_ptr + blk + cc2, hc, wc, coef_ptr + up + cc2, coef_ptr + blk + cc2, hf, wf, cc2,
                         cm2, j < LEVELS - 1, C, j + 1, HM, WM, CHUNK, COMPUTE)


@triton.jit(noinline=True)
def _image_base_conv(x_ptr, coef_ptr, filt_ptr, y_ptr, bw_ptr, bb_ptr, H, W, B, b, cb, C: tl.constexpr,
                     K: tl.constexpr, LEVELS: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr,
                     STRIDE: tl.constexpr, HAS_BIAS: tl.constexpr, FLIP: tl.constexpr, COMPUTE: tl.constexpr,
                     SYN1: tl.constexpr, SYN_AHEAD: tl.constexpr, NARROW: tl.constexpr = False):
    """The base convolution of image b, channel block cb, + bias and acc_1 (this image's block of level 1's
    region), strided; SYN1 (BW even): it does level 1's inverse Haar step itself, as the multi-launch one does.
    NARROW (BW a multiple of 4): a last strip of at most BW / 2 columns walks BW / 2."""
    c1 = cb * BC + tl.arange(0, BC)
    cm1 = c1 < C
    wts = _conv_weights(bw_ptr, c1, cm1, C, K, COMPUTE)
    if HAS_BIAS:
        bias = tl.load(bb_ptr + c1, mask=cm1, other=0.0).to(COMPUTE)
    else:
        bias = tl.zeros((BC,), dtype=COMPUTE)
    rs = tl.cast(W * C, tl.int64)
    xb0 = x_ptr + b * H * rs + c1
    h1 = (H + 1) // 2
    w1 = (W + 1) // 2
    ab0 = coef_ptr + b * h1 * w1 * (4 * C) + c1
    ors = tl.cast((W + STRIDE - 1) // STRIDE * C, tl.int64)
    yb = y_ptr + b * ((H + STRIDE - 1) // STRIDE) * ors + c1
    # SYN1: level 1's filtered subbands (this image's block) and acc_2 (over this image's block of level 2).
    t1 = filt_ptr + b * h1 * w1 * (4 * C) + c1
    a2 = coef_ptr + tl.cast(B * h1 * w1, tl.int64) * (4 * C) + b * ((h1 + 1) // 2) * ((w1 + 1) // 2) * (4 * C) + c1
    rs1 = tl.cast(w1 * C, tl.int64)
    for n0 in range(0, W, BW):
        if NARROW and W - n0 <= BW // 2:
            _conv_strip(xb0 + n0 * C, ab0 + n0 * C, yb, rs, ors, H, W, n0, cm1, wts, bias, t1 + n0 // 2 * (4 * C),
                        a2 + n0 // 2 * C, rs1, C, K, BW // 2, STRIDE, LEVELS > 0, HAS_BIAS, FLIP, COMPUTE,
                        SYN1 and LEVELS > 0, SYN1 and LEVELS > 1, SYN_AHEAD)
        else:
            _conv_strip(xb0 + n0 * C, ab0 + n0 * C, yb, rs, ors, H, W, n0, cm1, wts, bias, t1 + n0 // 2 * (4 * C),
                        a2 + n0 // 2 * C, rs1, C, K, BW, STRIDE, LEVELS > 0, HAS_BIAS, FLIP, COMPUTE,
                        SYN1 and LEVELS > 0, SYN1 and LEVELS > 1, SYN_AHEAD)


@triton.jit
def _small_kernel(
    x_ptr,  # (B, H, W, C) channels-last
    coef_ptr,  # flat coefficient buffer, level i (B, h_i, w_i, 4, C) after level i - 1 (HAS_COEF: x's, given)
    filt_ptr,  # a buffer of the coefficients' layout for the filtered subbands
    y_ptr,  # (B, ceil(H / STRIDE), ceil(W / STRIDE), C)
    bw_ptr,  # (K, K, C) folded base kernel
    bb_ptr,  # (C,) folded bias (HAS_BIAS)
    lw_ptr,  # (L, K, K, 4, C) folded level kernels
    H, W, B,
    C: tl.constexpr, K: tl.constexpr, LEVELS: tl.constexpr, HM: tl.constexpr, WM: tl.constexpr,
    BW: tl.constexpr, BC: tl.constexpr, CHUNK: tl.constexpr, STRIDE: tl.constexpr, HAS_BIAS: tl.constexpr,
    FLIP: tl.constexpr, HAS_COEF: tl.constexpr, COMPUTE: tl.constexpr, SYN1: tl.constexpr,
    SYN_AHEAD: tl.constexpr, NARROW: tl.constexpr = False,
):
    """One WTConv pass (forward, or with FLIP and no bias the input gradient) of image ``program_id(0)``,
    channels ``program_id(1) * BC ...``; HM / WM: powers of two at least H / W (the analysis and synthesis tiles).
    NARROW (BW a multiple of 4; TUNING small_narrow): a map's last strip, where at most BW / 2 columns are left,
    walks BW / 2 columns instead of BW (half of them padding): the same sums in the same order."""
    b = tl.program_id(0).to(tl.int64)
    cb = tl.program_id(1)
    if LEVELS > 0:
        if not HAS_COEF:
            _image_analysis(x_ptr, coef_ptr, H, W, B, b, cb, C, LEVELS, HM, WM, BC, CHUNK, COMPUTE)
            tl.debug_barrier()
        _image_level_convs(coef_ptr, filt_ptr, lw_ptr, H, W, B, b, cb, C, K, LEVELS, BW, BC, FLIP, COMPUTE, NARROW)
        tl.debug_barrier()
        _image_synthesis(coef_ptr, filt_ptr, H, W, B, b, cb, C, LEVELS, HM, WM, BC, CHUNK, COMPUTE, SYN1)
        tl.debug_barrier()
    _image_base_conv(x_ptr, coef_ptr, filt_ptr, y_ptr, bw_ptr, bb_ptr, H, W, B, b, cb, C, K, LEVELS, BW, BC, STRIDE,
                     HAS_BIAS, FLIP, COMPUTE, SYN1, SYN_AHEAD, NARROW)
