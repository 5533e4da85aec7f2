"""Small maps on the tensor cores: a whole WTConv pass as one dense per-channel operator (bf16 / fp16 inputs).

Kernel model D of issue 14. On a map of P = H x W positions, a WTConv is, per channel c, a linear map
``y_c = M_c x_c`` with a P' x P matrix (P' output positions). With levels of Haar halving, every output position
meets every input position within a few level blocks, so on the maps of WTConvNeXt's stages 3-4 (14 x 14 with 3
levels, 7 x 7 with 2) ``M_c`` is dense and the layer is a batched matrix product over the B images: the channel is
the batch of a 3-D ``tl.dot``, the images are its N dimension, the input positions its inner dimension. A program
owns a block of channels, a block of output positions and a block of images; it never stores ``M_c``: each step
of its inner loop builds the tile of ``M_c`` it needs from a small per-channel table and feeds it to the product.

The entries, with the reference's orthonormal Haar transform (1/2 per level and direction)::

    M[o, p] = Wb[p - o]                                                    (base, |p - o| <= K // 2 per axis)
            + sum_l 4^-l sum_s sgn_s(o) sgn_s(p) Wl_s[(p >> l) - (o >> l)]   (level l = 1..L)

with Wb = base_scale * weight, Wl_s = wavelet_scale * wavelet_weight of subband s, and sgn_s(p) the sign subband s
gives position p at level l (from bit l - 1 of its row and column). Only the products sgn_s(o) sgn_s(p) matter, so
each level's four subband kernels collapse into four combined kernels, one per (same row bit, same column bit)
pair: the table ``(L, 4, K, K, C)`` that :func:`~.triton_kernels.folded_weights` writes for this path. An entry of
the tile is then one table read per term (1 + L) and no arithmetic beyond index math. Zero-extended odd maps need
nothing special: only real positions are summed over. The input gradient is the same product with ``M^T``, which is
``M`` with every kernel rotated by 180 degrees (FLIP).

Numerics: the operands are the input dtype's values (x or dy, exact) and M's entries split into ``hi + lo`` of the
input dtype (fp32 sums of fp32 folded weights), products exact and accumulated in fp32 by the tensor cores, so the
result carries the error of an fp32 computation, rounded once to the output dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .mma_kernels import _split_weight, operand_dtype

__all__ = ["DENSE_TUNING", "dense_applies", "dense_pass"]

# Launch shapes (fixed: results must not depend on timing). bc: channels per program (the batch of the product),
# bm: output positions, bn: images, bk: input positions per step; warps; max_p: the largest map (H x W) taken.
DENSE_TUNING: dict[str, int] = {"bc": 8, "bm": 32, "bn": 64, "bk": 32, "warps": 4, "max_p": 256, "split": 1}


def dense_applies(x: Tensor, levels: int) -> bool:
    """Whether a pass over ``x`` (B, C, H, W) takes the dense-operator kernel: bf16 / fp16, levels, a map of at most
    ``DENSE_TUNING["max_p"]`` positions."""
    return (levels > 0 and x.dtype in (torch.bfloat16, torch.float16)
            and x.shape[-2] * x.shape[-1] <= DENSE_TUNING["max_p"])


@triton.jit
def _operator_tile(bw_ptr, tab_ptr, c, cm, oi, oj, pi, pj, pm, C: tl.constexpr, K: tl.constexpr,
                   LEVELS: tl.constexpr, FLIP: tl.constexpr):
    """The fp32 tile M[o, p] (BC, BM, BK) for channels ``c`` (BC, 1, 1), output rows / columns ``oi``, ``oj``
    (1, BM, 1), input rows / columns ``pi``, ``pj`` (1, 1, BK), ``pm`` the input positions that exist."""
    PAD: tl.constexpr = K // 2
    KK: tl.constexpr = K * K
    if FLIP:
        di = oi - pi + PAD
        dj = oj - pj + PAD
    else:
        di = pi - oi + PAD
        dj = pj - oj + PAD
    ok = pm & (di >= 0) & (di < K) & (dj >= 0) & (dj < K)
    m = tl.load(bw_ptr + (di * K + dj) * C + c, mask=ok & cm, other=0.0)
    for lv in tl.static_range(1, LEVELS + 1):
        if FLIP:
            di = (oi >> lv) - (pi >> lv) + PAD
            dj = (oj >> lv) - (pj >> lv) + PAD
        else:
            di = (pi >> lv) - (oi >> lv) + PAD
            dj = (pj >> lv) - (oj >> lv) + PAD
        rc = (((pi ^ oi) >> (lv - 1)) & 1) * 2 + (((pj ^ oj) >> (lv - 1)) & 1)
        ok = pm & (di >= 0) & (di < K) & (dj >= 0) & (dj < K)
        m += tl.load(tab_ptr + ((((lv - 1) * 4 + rc) * K + di) * K + dj) * C + c, mask=ok & cm, other=0.0)
    return m


@triton.jit
def _dense_kernel(
    x_ptr,  # (B, H, W, C) dense, channels fastest
    y_ptr,  # (B, HO, WO, C): the output, output position o at full-resolution row (o // WO) * STRIDE
    bw_ptr,  # (K, K, C) fp32: base_scale * weight
    bb_ptr,  # (C,) fp32: base_scale * bias (HAS_BIAS)
    tab_ptr,  # (L, 4, K, K, C) fp32: the combined level kernels (module docstring)
    H, W, HO, WO, B,
    C: tl.constexpr, K: tl.constexpr, LEVELS: tl.constexpr, STRIDE: tl.constexpr, FLIP: tl.constexpr,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, RND: tl.constexpr, OPD: tl.constexpr,
    BC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    """y[b, o, c] = sum_p M_c[o, p] x[b, p, c] (+ bias): a program per channel block, output-position block and
    image block; the channel is the batch of a 3-D product (BC, BM, BK) x (BC, BK, BN)."""
    c = tl.program_id(0) * BC + tl.arange(0, BC)[:, None, None]
    cm = c < C
    o = tl.program_id(1) * BM + tl.arange(0, BM)[None, :, None]
    om = o < HO * WO
    oi = (o // WO) * STRIDE
    oj = (o % WO) * STRIDE
    b = tl.program_id(2) * BN + tl.arange(0, BN)[None, None, :]
    bm = b < B
    hw = H * W
    xb = x_ptr + b.to(tl.int64) * hw * C + c  # (BC, 1, BN)
    acc = tl.zeros((BC, BM, BN), dtype=tl.float32)
    for p0 in tl.range(0, hw, BK, num_stages=1):  # no pipelining: it would stage the table gathers in shared memory
        p = p0 + tl.arange(0, BK)[None, None, :]
        pm = p < hw
        m = _operator_tile(bw_ptr, tab_ptr, c, cm, oi, oj, p // W, p % W, pm, C, K, LEVELS, FLIP)
        pk = p0 + tl.arange(0, BK)[None, :, None]  # the input positions along the product's inner axis
        xt = tl.load(xb + pk * C, mask=cm & (pk < hw) & bm, other=0.0).to(OPD)
        if SPLIT:
            hi, lo = _split_weight(m, RND, OPD)
            acc = tl.dot(hi, xt, acc)
            acc = tl.dot(lo, xt, acc)
        else:
            acc = tl.dot(m.to(RND).to(OPD), xt, acc)
    if HAS_BIAS:
        acc += tl.load(bb_ptr + c, mask=cm, other=0.0)
    yo = y_ptr + (b.to(tl.int64) * (HO * WO) + o) * C + c
    tl.store(yo, acc.to(y_ptr.dtype.element_ty), mask=cm & om & bm)


def dense_pass(x: Tensor, out: Tensor, base_w: Tensor, base_b: Tensor | None, table: Tensor, stride: int,
               flip: bool) -> None:
    """One WTConv pass of the channels-last ``x`` into the channels-last ``out`` through the dense operator; weights
    from ``folded_weights(..., dense=True)`` (``table``: the combined level kernels)."""
    from .triton_kernels import _cdiv, _launch

    bsz, ch, h, w = x.shape
    ho, wo = out.shape[-2:]
    k = base_w.shape[0]
    t = DENSE_TUNING
    rnd, opd = operand_dtype(x.dtype)
    bc = min(t["bc"], triton.next_power_of_2(ch))
    _launch(
        _dense_kernel, (_cdiv(ch, bc), _cdiv(ho * wo, t["bm"]), _cdiv(bsz, t["bn"])),
        (x, out, base_w, base_w if base_b is None else base_b, table, h, w, ho, wo, bsz), t["warps"],
        C=ch, K=k, LEVELS=table.shape[0], STRIDE=stride, FLIP=flip, HAS_BIAS=base_b is not None,
        SPLIT=bool(t["split"]), RND=rnd, OPD=opd, BC=bc, BM=t["bm"], BN=t["bn"], BK=t["bk"],
    )


def dense_table(level_w: Tensor) -> Tensor:
    """The combined level kernels (L, 4, K, K, C) from the folded level weights (L, K, K, 4, C) (which hold the
    synthesis 1/2): rc = 2 * (row bits differ) + (column bits differ); prototype in torch."""
    levels = level_w.shape[0]
    sgn = torch.tensor([[1, 1, 1, 1], [1, 1, -1, -1], [1, -1, 1, -1], [1, -1, -1, 1]], dtype=level_w.dtype,
                       device=level_w.device)  # [rc, s]: s1 flips with the row bit, s2 with the column, s3 both
    # folded = w * scale / 2; the entry needs w * scale * 4^-l = folded * 2^(1 - 2l)
    f = torch.tensor([2.0 ** (1 - 2 * lv) for lv in range(1, levels + 1)], dtype=level_w.dtype, device=level_w.device)
    return torch.einsum("lijsc,rs,l->lrijc", level_w, sgn, f).contiguous()
