"""Prototype (issue 14): a small map's whole WTConv as one dense operator per channel, on tensor cores.

Usage::

    python benchmarks/proto_small_matrix.py --check            # any machine: exactness against the reference (CPU)
    python benchmarks/proto_small_matrix.py --sm90             # any machine: the fused products compile for sm_90
    python benchmarks/proto_small_matrix.py [--out FILE.json]  # a CUDA GPU: the layer beside today's kernels, cuDNN
    python benchmarks/proto_small_matrix.py --model --out FILE.json  # a CUDA GPU: wtconvnext_tiny with it

WTConv is linear in x and shift-varying only through the Haar grid, so for a fixed map size each channel's layer is
an (H·W) x (H·W) matrix: ``y_c = M_c x_c + bias_c``. At stages 3-4 (14², 7²) that matrix is small (196² and 49²
entries) and the whole layer becomes batched matrix products that tensor cores run, where today's kernels run about
58 fp32 FMAs per element on the CUDA cores (at 14² with 3 levels M has 3.4x more multiply-adds, at 7² with 2
levels 0.85x):

- ``M_c`` is linear in the channel's folded weights ``wf_c`` (the base taps and every level's subband taps, each
  times its scale): ``M = wf @ E``, with the constant term basis ``E`` (T, n, n), T = K²(1 + 4L), built once per
  (H, W, L, K) by running the reference (:func:`wtconv2d_reference`, the one definition of the math) on one-hot
  images with one-hot weights. Each ``E[t]`` entry is 0 or ±4^-l (one Haar product per term), exact in bf16.
- forward ``Y_c = X_c M_c^T`` (X_c: B x n); backward ``dX_c = dY_c M_c``, ``dM_c = dY_c^T X_c``,
  ``d wf = dM E^T``. Autograd of the torch expression below runs exactly these GEMMs (cuBLAS, fp32 accumulation,
  deterministic), and the chain rule of the scale folding.

This is the prototype that the design is decided on, not the product: stride 1 only, M rebuilt on every call.
Variants:

- ``wtconv_small_matrix``: plain autograd, which keeps M and the (C, B, n) copy of x for the backward;
- ``wtconv_small_matrix_lean``: saves only x and the parameters and works a group of channels at a time (a
  built-out op's memory). Its products run by torch.bmm on (C, B, n) copies of the channels-last maps, or
  (``fused=True``) by two Triton kernels that read and write the maps in place, each channel the batch index of a
  3-D ``tl.dot`` (tensor cores: mma.sync in sm_90 code from triton 3.6 and 3.8), or (``tile=SPLIT_TILE``) by two
  kernels that split four channels out of one load and run a 2-D ``tl.dot`` per channel, 64-row tiles (Hopper's
  wgmma in sm_90 code from triton 3.6 and 3.8). M and the term gradients come from
  dense GEMMs with E (9.6 GFLOP each at 14², 384 channels) or (``sparse=True``) from two Triton kernels over E's
  nonzeros (at most 13 terms reach an entry of M: about 4 % of the GEMM's multiply-adds, on the CUDA cores).

``--check`` runs the Triton kernels in the interpreter in float64 only: the interpreter multiplies bf16 operands of
``tl.dot`` wrongly (triton 3.8: errors ~1e10 on a 16 x 16 product that is right in fp32), so their bf16 figures
come from the GPU run. The GPU run times forward and forward + backward (``triton.testing.do_bench``, median) of
today's fused layer, each variant (and their parts: the builds, the layout copies, the products) and cuDNN's
depthwise 7x7 / 5x5, channels-last, bf16, with the bf16 error of each fused layer against float64 and the peak
memory of forward + backward; it prints a table and writes JSON. ``--model`` times wtconvnext_tiny with its stage
3-4 layers on the prototype (``patch_small_maps``) beside the model itself and ConvNeXt-T instead.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Optional

if "--check" in sys.argv[1:]:  # the fused products' kernels on CPU tensors: Triton's interpreter, before its import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch import Tensor  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wtconvnext.ops.reference import wtconv2d_reference  # noqa: E402

SHAPES = [(128, 384, 14, 14, 3), (128, 768, 7, 7, 2), (16, 768, 16, 16, 2)]  # B, C, H, W, levels (K = 5)


@functools.lru_cache(maxsize=16)
def term_basis(h: int, w: int, levels: int, k: int, dtype: torch.dtype, device: str) -> Tensor:
    """E (T, n, n), n = h·w, T = k²(1 + 4·levels): ``E[t, p, q]``, output pixel p's response to a unit input at q
    when only term t's weight is 1 (t < k²: base tap t; then level l, subband s, tap i at k² + (4l + s)k² + i).
    Built in float64 by the reference, a block of terms at a time, then cast (its entries are exact in bf16)."""
    n, kk = h * w, k * k
    terms = kk * (1 + 4 * levels)
    eye = torch.eye(n, dtype=torch.float64).reshape(n, 1, h, w)
    blocks = []
    for t0 in range(0, terms, kk):
        weight = torch.zeros(kk, 1, k, k, dtype=torch.float64)
        wav = torch.zeros(levels, kk, 4, k, k, dtype=torch.float64)
        if t0 == 0:
            weight.view(kk, kk).fill_diagonal_(1.0)
        else:
            lv, s = divmod(t0 // kk - 1, 4)
            wav[lv, :, s].view(kk, kk).fill_diagonal_(1.0)
        y = wtconv2d_reference(eye.expand(n, kk, h, w), weight, None, torch.ones(kk, dtype=torch.float64), wav,
                               torch.ones(levels, kk, 4, dtype=torch.float64))
        blocks.append(y.reshape(n, kk, n).permute(1, 2, 0))  # (terms, p, q)
    return torch.cat(blocks).to(dtype=dtype, device=device).contiguous()


def folded_terms(weight: Tensor, base_scale: Tensor, wavelet_weight: Tensor, wavelet_scale: Tensor) -> Tensor:
    """(C, T): each channel's base taps times base_scale, then every level's subband taps times their scale, in
    :func:`term_basis`'s order."""
    c = weight.shape[0]
    base = weight.reshape(c, -1) * base_scale.reshape(c, 1)
    lev = (wavelet_weight * wavelet_scale[..., None, None]).transpose(0, 1).reshape(c, -1)
    return torch.cat((base, lev), dim=1)


def wtconv_small_matrix(x: Tensor, weight: Tensor, bias: Optional[Tensor], base_scale: Tensor, wavelet_weight: Tensor,
                        wavelet_scale: Tensor) -> Tensor:
    """WTConv (stride 1) of a small map as per-channel matrix products in x's dtype (fp32 accumulation); output
    channels-last. Differentiable: autograd's backward is the GEMMs of the module docstring."""
    bsz, c, h, w = x.shape
    n = h * w
    wf, basis, _ = _operator_terms(x, weight, base_scale, wavelet_weight, wavelet_scale)
    m = _matrices(wf, basis, n)
    xt = x.permute(1, 0, 2, 3).reshape(c, bsz, n)  # a copy for channels-last x: (C, B, n)
    y = torch.bmm(xt, m.transpose(1, 2)).reshape(c, bsz, h, w).permute(1, 0, 2, 3)
    if bias is not None:
        y = y + (bias * base_scale).to(x.dtype).reshape(1, c, 1, 1)
    return y.contiguous(memory_format=torch.channels_last)


@triton.jit
def _tile(ncols, BR: tl.constexpr, BCOL: tl.constexpr, BC: tl.constexpr):
    """This program's row and column indices of a (rows, ncols) grid tiled BR x BCOL (axis 0 of the launch), and
    its BC channels (axis 1)."""
    pid = tl.program_id(0)
    nt = tl.cdiv(ncols, BCOL)
    return ((pid // nt) * BR + tl.arange(0, BR), (pid % nt) * BCOL + tl.arange(0, BCOL),
            tl.program_id(1) * BC + tl.arange(0, BC))


@triton.jit
def _apply_cl_kernel(x_ptr, a_ptr, y_ptr, B, N, CS, CG, sa_c, sa_p, sa_q,
                     BB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr, ACC: tl.constexpr):
    """y[b, p, c] = sum_q x[b, q, c] a[c, p, q] over channels-last maps (pixel stride CS, CG channels from the
    pointers): a block of BC channels x BB images x BN output pixels per program, the channel as the batch dimension
    of a 3-D tensor-core product, x and y read and written in place (no layout copies)."""
    bb, pp, cc = _tile(N, BB, BN, BC)
    bm, pm, cm = bb < B, pp < N, cc < CG
    acc = tl.zeros((BC, BB, BN), dtype=ACC)
    xrow = bb.to(tl.int64)[:, None, None] * N
    for k0 in range(0, N, BK):
        qq = k0 + tl.arange(0, BK)
        qm = qq < N
        xt = tl.load(x_ptr + (xrow + qq[None, :, None]) * CS + cc[None, None, :],
                     mask=bm[:, None, None] & qm[None, :, None] & cm[None, None, :], other=0.0)  # (BB, BK, BC)
        at = tl.load(a_ptr + cc[:, None, None] * sa_c + qq[None, :, None] * sa_q + pp[None, None, :] * sa_p,
                     mask=cm[:, None, None] & qm[None, :, None] & pm[None, None, :], other=0.0)  # (BC, BK, BN)
        acc = tl.dot(tl.permute(xt, (2, 0, 1)), at, acc)
    out = tl.permute(acc, (1, 2, 0)).to(y_ptr.dtype.element_ty)  # (BB, BN, BC)
    tl.store(y_ptr + (xrow + pp[None, :, None]) * CS + cc[None, None, :], out,
             mask=bm[:, None, None] & pm[None, :, None] & cm[None, None, :])


@triton.jit
def _outer_cl_kernel(dy_ptr, x_ptr, dm_ptr, B, N, CS, CG,
                     BP: tl.constexpr, BQ: tl.constexpr, BB: tl.constexpr, BC: tl.constexpr, ACC: tl.constexpr):
    """dm[c, p, q] = sum_b dy[b, p, c] x[b, q, c] (channels-last maps as in _apply_cl_kernel), the images summed in
    a fixed order (deterministic): a block of BC channels x BP x BQ entries per program."""
    pp, qq, cc = _tile(N, BP, BQ, BC)
    pm, qm, cm = pp < N, qq < N, cc < CG
    acc = tl.zeros((BC, BP, BQ), dtype=ACC)
    for b0 in range(0, B, BB):
        bb = b0 + tl.arange(0, BB)
        bm = bb < B
        row = bb.to(tl.int64)[:, None, None] * N
        dyt = tl.load(dy_ptr + (row + pp[None, :, None]) * CS + cc[None, None, :],
                      mask=bm[:, None, None] & pm[None, :, None] & cm[None, None, :], other=0.0)  # (BB, BP, BC)
        xt = tl.load(x_ptr + (row + qq[None, :, None]) * CS + cc[None, None, :],
                     mask=bm[:, None, None] & qm[None, :, None] & cm[None, None, :], other=0.0)  # (BB, BQ, BC)
        acc = tl.dot(tl.permute(dyt, (2, 1, 0)), tl.permute(xt, (2, 0, 1)), acc)
    base = cc.to(tl.int64)[:, None, None] * N * N
    tl.store(dm_ptr + base + pp[None, :, None] * N + qq[None, None, :], acc.to(dm_ptr.dtype.element_ty),
             mask=cm[:, None, None] & pm[None, :, None] & qm[None, None, :])


@triton.jit
def _quarters(t):
    """The four channel slices (channels 0, 1, 2, 3) of a (R, S, 4) tile, each (R, S): two splits of the
    channel axis, no data movement."""
    r: tl.constexpr = t.shape[0]
    c: tl.constexpr = t.shape[1]
    even, odd = tl.split(tl.reshape(t, (r, c, 2, 2)))  # channel 2i + j: j = 0 / 1
    c0, c2 = tl.split(even)
    c1, c3 = tl.split(odd)
    return c0, c1, c2, c3


@triton.jit
def _join4(c0, c1, c2, c3):
    """_quarters' inverse: four (R, S) channel slices as one (R, S, 4) tile."""
    return tl.reshape(tl.join(tl.join(c0, c2), tl.join(c1, c3)), (c0.shape[0], c0.shape[1], 4))


@triton.jit
def _apply_cl_split_kernel(x_ptr, a_ptr, y_ptr, B, N, CS, CG, sa_c, sa_p, sa_q,
                           BB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ACC: tl.constexpr):
    """_apply_cl_kernel for 4 channels per program as four 2-D products (a (BB, BK) x (BK, BN) tensor-core dot
    per channel, which Hopper may run as wgmma), the channels split out of one coalesced (BB, BK, 4) load and
    joined back for one (BB, BN, 4) store."""
    bb, pp, cc = _tile(N, BB, BN, 4)
    bm, pm, cm = bb < B, pp < N, cc < CG
    # Four accumulators, each its own zeros (not one tensor four times: see PERF.md on loop-carried values).
    a0, a1 = tl.zeros((BB, BN), dtype=ACC), tl.zeros((BB, BN), dtype=ACC)
    a2, a3 = tl.zeros((BB, BN), dtype=ACC), tl.zeros((BB, BN), dtype=ACC)
    xrow = bb.to(tl.int64)[:, None, None] * N
    for k0 in range(0, N, BK):
        qq = k0 + tl.arange(0, BK)
        qm = qq < N
        xt = tl.load(x_ptr + (xrow + qq[None, :, None]) * CS + cc[None, None, :],
                     mask=bm[:, None, None] & qm[None, :, None] & cm[None, None, :], other=0.0)  # (BB, BK, 4)
        x0, x1, x2, x3 = _quarters(xt)
        at = tl.load(a_ptr + cc[:, None, None] * sa_c + qq[None, :, None] * sa_q + pp[None, None, :] * sa_p,
                     mask=cm[:, None, None] & qm[None, :, None] & pm[None, None, :], other=0.0)  # (4, BK, BN)
        m0, m1, m2, m3 = _quarters(tl.permute(at, (1, 2, 0)))
        a0 = tl.dot(x0, m0, a0)
        a1 = tl.dot(x1, m1, a1)
        a2 = tl.dot(x2, m2, a2)
        a3 = tl.dot(x3, m3, a3)
    out = _join4(a0, a1, a2, a3).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + (xrow + pp[None, :, None]) * CS + cc[None, None, :], out,
             mask=bm[:, None, None] & pm[None, :, None] & cm[None, None, :])


@triton.jit
def _outer_cl_split_kernel(dy_ptr, x_ptr, dm_ptr, B, N, CS, CG,
                           BP: tl.constexpr, BQ: tl.constexpr, BB: tl.constexpr, ACC: tl.constexpr):
    """_outer_cl_kernel for 4 channels per program as four 2-D products ((BP, BB) x (BB, BQ) per channel)."""
    pp, qq, cc = _tile(N, BP, BQ, 4)
    pm, qm, cm = pp < N, qq < N, cc < CG
    a0, a1 = tl.zeros((BP, BQ), dtype=ACC), tl.zeros((BP, BQ), dtype=ACC)
    a2, a3 = tl.zeros((BP, BQ), dtype=ACC), tl.zeros((BP, BQ), dtype=ACC)
    for b0 in range(0, B, BB):
        bb = b0 + tl.arange(0, BB)
        bm = bb < B
        row = bb.to(tl.int64)[:, None, None] * N
        dyt = tl.load(dy_ptr + (row + pp[None, :, None]) * CS + cc[None, None, :],
                      mask=bm[:, None, None] & pm[None, :, None] & cm[None, None, :], other=0.0)  # (BB, BP, 4)
        xt = tl.load(x_ptr + (row + qq[None, :, None]) * CS + cc[None, None, :],
                     mask=bm[:, None, None] & qm[None, :, None] & cm[None, None, :], other=0.0)  # (BB, BQ, 4)
        d0, d1, d2, d3 = _quarters(dyt)
        x0, x1, x2, x3 = _quarters(xt)
        a0 = tl.dot(tl.trans(d0), x0, a0)
        a1 = tl.dot(tl.trans(d1), x1, a1)
        a2 = tl.dot(tl.trans(d2), x2, a2)
        a3 = tl.dot(tl.trans(d3), x3, a3)
    out = tl.permute(_join4(a0, a1, a2, a3), (2, 0, 1))
    base = cc.to(tl.int64)[:, None, None] * N * N
    tl.store(dm_ptr + base + pp[None, :, None] * N + qq[None, None, :], out.to(dm_ptr.dtype.element_ty),
             mask=cm[:, None, None] & pm[None, :, None] & qm[None, None, :])


# The fused products' tiles (3-D dot: M, N, K >= 16); SPLIT: the four-channel 2-D-dot kernels (BC = 4).
_TILE = dict(BB=32, BN=32, BK=32, BC=4, BP=32, BQ=32, SPLIT=0)
# The split kernels at 64-row tiles: Triton (3.6 and 3.8) emits Hopper's wgmma for them (32 rows: mma.sync).
SPLIT_TILE = dict(SPLIT=1, BB=64, BN=64, BK=32, BP=64, BQ=64)
GROUP_BYTES = 32 << 20  # the lean variant's default channel group: its M within 32 MiB (stages 3-4: one group)


def _acc_of(t: Tensor):
    return tl.float64 if t.dtype == torch.float64 else tl.float32


def _apply_cl(x: Tensor, a: Tensor, y: Tensor, transpose: bool, tile: Optional[dict] = None) -> None:
    """y = the per-channel product of x (B, CG, H, W channels-last view, any channel offset) with a (CG, n, n)
    (or its transpose), written into the channels-last view y, by _apply_cl_kernel (``tile``: _TILE entries to
    change)."""
    bsz, cg, h, w = x.shape
    n, t = h * w, {**_TILE, **(tile or {})}
    sc, sp, sq = a.stride()
    if transpose:
        sp, sq = sq, sp
    bc = 4 if t["SPLIT"] else t["BC"]
    grid = (triton.cdiv(bsz, t["BB"]) * triton.cdiv(n, t["BN"]), triton.cdiv(cg, bc))
    if t["SPLIT"]:
        _apply_cl_split_kernel[grid](x, a, y, bsz, n, x.stride(3), cg, sc, sp, sq, BB=t["BB"], BN=t["BN"],
                                     BK=t["BK"], ACC=_acc_of(x))
        return
    _apply_cl_kernel[grid](x, a, y, bsz, n, x.stride(3), cg, sc, sp, sq, BB=t["BB"], BN=t["BN"], BK=t["BK"],
                           BC=bc, ACC=_acc_of(x))


def _outer_cl(dy: Tensor, x: Tensor, tile: Optional[dict] = None) -> Tensor:
    """(CG, n, n) = sum over images of dy's pixels times x's, per channel (_outer_cl_kernel), in x's dtype."""
    bsz, cg, h, w = x.shape
    n, t = h * w, {**_TILE, **(tile or {})}
    dm = torch.empty(cg, n, n, dtype=x.dtype, device=x.device)
    bc = 4 if t["SPLIT"] else t["BC"]
    grid = (triton.cdiv(n, t["BP"]) * triton.cdiv(n, t["BQ"]), triton.cdiv(cg, bc))
    if t["SPLIT"]:
        _outer_cl_split_kernel[grid](dy, x, dm, bsz, n, x.stride(3), cg, BP=t["BP"], BQ=t["BQ"], BB=t["BB"],
                                     ACC=_acc_of(x))
    else:
        _outer_cl_kernel[grid](dy, x, dm, bsz, n, x.stride(3), cg, BP=t["BP"], BQ=t["BQ"], BB=t["BB"], BC=bc,
                               ACC=_acc_of(x))
    return dm


@functools.lru_cache(maxsize=16)
def term_tables(h: int, w: int, levels: int, k: int, device: str) -> tuple[Tensor, ...]:
    """E's nonzeros (:func:`term_basis`), both ways: per entry (p, q) of M, the terms that reach it
    (``idx``, ``coef``: (n², J), J the most any entry has, padded with coefficient 0), and per term t, the entries
    it reaches (``t_ptr`` (T + 1,) offsets into ``t_pq``, ``t_coef``; entries in increasing order)."""
    basis = term_basis(h, w, levels, k, torch.float64, "cpu")
    terms, n = basis.shape[0], h * w
    by_entry = basis.reshape(terms, n * n).t()  # (n², T)
    nz = by_entry != 0
    j = int(nz.sum(1).max())
    idx = torch.argsort(nz.to(torch.int8), dim=1, descending=True, stable=True)[:, :j]
    coef = by_entry.gather(1, idx)
    t_of, pq = basis.reshape(terms, n * n).nonzero(as_tuple=True)  # row-major: by term, then entry
    t_ptr = torch.zeros(terms + 1, dtype=torch.int64)
    t_ptr[1:] = torch.bincount(t_of, minlength=terms).cumsum(0)
    t_coef = basis.reshape(terms, n * n)[t_of, pq]
    return tuple(t.to(device) for t in (idx.to(torch.int32).contiguous(), coef.to(torch.float32).contiguous(),
                                        t_ptr, pq.to(torch.int32), t_coef.to(torch.float32)))


@triton.jit
def _build_m_kernel(wf_ptr, idx_ptr, coef_ptr, m_ptr, NN, T, CG, J: tl.constexpr, BPQ: tl.constexpr,
                    BC: tl.constexpr, ACC: tl.constexpr):
    """m[c, pq] = sum_j coef[pq, j] wf[c, idx[pq, j]] (sums in ACC, stored in m's dtype): M from the term weights,
    each entry from the at most J terms that reach it."""
    pq = tl.program_id(0) * BPQ + tl.arange(0, BPQ)
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    pm, cm = pq < NN, cc < CG
    acc = tl.zeros((BC, BPQ), dtype=ACC)
    for j in tl.static_range(J):
        t = tl.load(idx_ptr + pq * J + j, mask=pm, other=0)
        cf = tl.load(coef_ptr + pq * J + j, mask=pm, other=0.0).to(ACC)  # (0 or +-4^-l: exact in fp32)
        wv = tl.load(wf_ptr + cc[:, None] * T + t[None, :], mask=cm[:, None] & pm[None, :], other=0.0)
        acc += wv.to(ACC) * cf[None, :]
    tl.store(m_ptr + cc[:, None].to(tl.int64) * NN + pq[None, :], acc.to(m_ptr.dtype.element_ty),
             mask=cm[:, None] & pm[None, :])


@triton.jit
def _term_grads_kernel(dm_ptr, tptr_ptr, tpq_ptr, tcoef_ptr, dwf_ptr, NN, T, CG, BL: tl.constexpr,
                       BC: tl.constexpr, ACC: tl.constexpr):
    """dwf[c, t] = sum over the entries (p, q) that term t reaches of coef dm[c, p, q], in a fixed order
    (deterministic): one term and BC channels per program."""
    t = tl.program_id(0)
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    cm = cc < CG
    start = tl.load(tptr_ptr + t)
    end = tl.load(tptr_ptr + t + 1)
    acc = tl.zeros((BC, BL), dtype=ACC)
    for i0 in range(start, end, BL):
        ii = i0 + tl.arange(0, BL)
        im = ii < end
        pq = tl.load(tpq_ptr + ii, mask=im, other=0)
        cf = tl.load(tcoef_ptr + ii, mask=im, other=0.0).to(ACC)
        v = tl.load(dm_ptr + cc[:, None].to(tl.int64) * NN + pq[None, :], mask=cm[:, None] & im[None, :], other=0.0)
        acc += v.to(ACC) * cf[None, :]
    tl.store(dwf_ptr + cc * T + t, tl.sum(acc, axis=1), mask=cm)


def _build_m(wf: Tensor, tables: tuple, n: int) -> Tensor:
    """(CG, n, n) by _build_m_kernel from the (CG, T) term weights, in wf's dtype."""
    idx, coef = tables[0], tables[1]
    cg, terms = wf.shape
    m = torch.empty(cg, n, n, dtype=wf.dtype, device=wf.device)
    grid = (triton.cdiv(n * n, 256), triton.cdiv(cg, 8))
    _build_m_kernel[grid](wf.contiguous(), idx, coef, m, n * n, terms, cg, J=idx.shape[1], BPQ=256, BC=8,
                          ACC=_acc_of(wf))
    return m


def _term_grads(dm: Tensor, tables: tuple, out: Tensor) -> None:
    """out (CG, T) fp32 = dM's sums per term (_term_grads_kernel)."""
    t_ptr, t_pq, t_coef = tables[2], tables[3], tables[4]
    cg, n = dm.shape[0], dm.shape[1]
    terms = t_ptr.shape[0] - 1
    _term_grads_kernel[(terms, triton.cdiv(cg, 16))](dm, t_ptr, t_pq, t_coef, out, n * n, terms, cg, BL=128, BC=16,
                                                     ACC=_acc_of(out))


class SmallMatrixLean(torch.autograd.Function):
    """The same layer as :func:`wtconv_small_matrix` with a built-out op's memory: it saves only x and the
    parameters (the backward rebuilds M and the (C, B, n) copy of x) and works through the channels in groups of
    ``group`` (None: as many as keep a group's M within GROUP_BYTES), so that M, dM and the layout copies of a group
    are all the transient memory there is."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor], base_scale: Tensor, wavelet_weight: Tensor,
                wavelet_scale: Tensor, group: Optional[int] = None, fused: bool = False, sparse: bool = False,
                tile: Optional[dict] = None) -> Tensor:
        ctx.save_for_backward(x, weight, bias, base_scale, wavelet_weight, wavelet_scale)
        x = x.contiguous(memory_format=torch.channels_last)
        bsz, c, h, w = x.shape
        group = group or max(1, GROUP_BYTES // ((h * w) ** 2 * x.element_size()))
        ctx.group, ctx.fused, ctx.sparse, ctx.tile = group, fused, sparse, tile
        wf, basis, tables = _operator_terms(x, weight, base_scale, wavelet_weight, wavelet_scale, sparse)
        y = torch.empty_like(x, memory_format=torch.channels_last)
        for c0 in range(0, c, group):
            c1 = min(c, c0 + group)
            m = _matrices(wf[c0:c1], basis, h * w, tables)
            if fused:
                _apply_cl(x[:, c0:c1], m, y[:, c0:c1], transpose=False, tile=tile)
                continue
            xt = x[:, c0:c1].permute(1, 0, 2, 3).reshape(c1 - c0, bsz, h * w)
            y[:, c0:c1] = torch.bmm(xt, m.transpose(1, 2)).reshape(c1 - c0, bsz, h, w).permute(1, 0, 2, 3)
        if bias is not None:
            y += (bias * base_scale).to(x.dtype).reshape(1, c, 1, 1)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, weight, bias, base_scale, wavelet_weight, wavelet_scale = ctx.saved_tensors
        x = x.contiguous(memory_format=torch.channels_last)
        dy = dy.contiguous(memory_format=torch.channels_last)
        bsz, c, h, w = x.shape
        n, group = h * w, ctx.group
        wf, basis, tables = _operator_terms(x, weight, base_scale, wavelet_weight, wavelet_scale, ctx.sparse)
        dx = torch.empty_like(x, memory_format=torch.channels_last)
        acc = torch.promote_types(x.dtype, torch.float32)  # the gradients' arithmetic: fp32 (fp64 for fp64)
        dwf = torch.empty(wf.shape, dtype=acc, device=x.device)
        for c0 in range(0, c, group):
            c1 = min(c, c0 + group)
            m = _matrices(wf[c0:c1], basis, n, tables)
            if ctx.fused:
                _apply_cl(dy[:, c0:c1], m, dx[:, c0:c1], transpose=True, tile=ctx.tile)
                del m
                dm = _outer_cl(dy[:, c0:c1], x[:, c0:c1], tile=ctx.tile)
            else:
                dyt = dy[:, c0:c1].permute(1, 0, 2, 3).reshape(c1 - c0, bsz, n)
                dx[:, c0:c1] = torch.bmm(dyt, m).reshape(c1 - c0, bsz, h, w).permute(1, 0, 2, 3)
                del m
                xt = x[:, c0:c1].permute(1, 0, 2, 3).reshape(c1 - c0, bsz, n)
                dm = torch.bmm(dyt.transpose(1, 2), xt)  # (group, p, q), summed over the batch
            if tables is not None:
                _term_grads(dm, tables, dwf[c0:c1])
            else:
                dwf[c0:c1] = dm.reshape(c1 - c0, n * n) @ basis.reshape(-1, n * n).t()
        # The fold's chain rule (folded_terms): base taps x base_scale, level taps x their scale.
        kk = weight.shape[-1] ** 2
        levels = wavelet_weight.shape[0]
        db_base = dwf[:, :kk]
        d_lev = dwf[:, kk:].reshape(c, levels, 4, kk).transpose(0, 1)  # (L, C, 4, k²)
        dsum = dy.to(acc).sum(dim=(0, 2, 3))
        d_weight = (db_base * base_scale.to(acc)[:, None]).reshape(weight.shape)
        d_base_scale = (db_base * weight.to(acc).reshape(c, kk)).sum(1)
        d_bias = None
        if bias is not None:
            d_bias = dsum * base_scale.to(acc)
            d_base_scale = d_base_scale + dsum * bias.to(acc)
        d_ww = (d_lev * wavelet_scale.to(acc)[..., None]).reshape(wavelet_weight.shape)
        d_ws = (d_lev * wavelet_weight.to(acc).reshape(levels, c, 4, kk)).sum(-1)
        cast = lambda g, p: None if g is None else g.to(p.dtype)  # noqa: E731
        return (dx, cast(d_weight, weight), cast(d_bias, bias), cast(d_base_scale, base_scale),
                cast(d_ww, wavelet_weight), cast(d_ws, wavelet_scale), None, None, None, None)


def _operator_terms(x: Tensor, weight: Tensor, base_scale: Tensor, wavelet_weight: Tensor, wavelet_scale: Tensor,
                    sparse: bool = False) -> tuple[Tensor, Optional[Tensor], Optional[tuple]]:
    """((C, T) folded terms in x's dtype, the term basis in x's dtype or None, term_tables or None) of a layer over
    x's map size: the basis for GEMM-built M, the tables (``sparse``) for the sparse kernels, never both."""
    h, w, levels, k = x.shape[2], x.shape[3], wavelet_weight.shape[0], weight.shape[-1]
    wf = folded_terms(weight, base_scale, wavelet_weight, wavelet_scale).to(x.dtype)
    if sparse:
        return wf, None, term_tables(h, w, levels, k, str(x.device))
    return wf, term_basis(h, w, levels, k, x.dtype, str(x.device)), None


def _matrices(wf: Tensor, basis: Optional[Tensor], n: int, tables: Optional[tuple] = None) -> Tensor:
    """(C, n, n): each channel's operator, ``wf @ E`` (a dense GEMM), or with ``tables`` (term_tables) by
    _build_m_kernel from E's nonzeros."""
    if tables is not None:
        return _build_m(wf, tables, n)
    return (wf @ basis.reshape(basis.shape[0], n * n)).reshape(wf.shape[0], n, n)


def wtconv_small_matrix_lean(x: Tensor, weight: Tensor, bias: Optional[Tensor], base_scale: Tensor,
                             wavelet_weight: Tensor, wavelet_scale: Tensor, group: Optional[int] = None,
                             fused: bool = False,
                             sparse: bool = False, tile: Optional[dict] = None) -> Tensor:
    """:class:`SmallMatrixLean` as a function (stride 1, output channels-last); ``fused``: the products by the
    Triton kernels above, on the channels-last maps in place, else by torch.bmm on (C, B, n) copies; ``sparse``:
    M and the term gradients from E's nonzeros (term_tables' kernels), else by dense GEMMs with E; ``tile``: the
    fused products' _TILE entries to change."""
    return SmallMatrixLean.apply(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, group, fused, sparse,
                                 tile)


def patch_small_maps(model: torch.nn.Module, max_pixels: int = 256, group: Optional[int] = None, sparse: bool = False,
                     tile: Optional[dict] = None, cache: bool = False) -> torch.nn.Module:
    """Run every stride-1 WTConv layer of ``model`` whose map has at most ``max_pixels`` pixels through
    ``wtconv_small_matrix_lean(fused=True)`` (in place; under autocast its input and parameters in the autocast
    dtype, as a convolution's; ``sparse``: M and the term gradients by the sparse kernels; ``tile``: the products'
    _TILE entries to change), the others unchanged: the prototype's A/B inside a model. ``cache``: without autograd
    (inference), each layer keeps its M for as long as its parameters (their versions), dtype and map size stay, so
    a forward is one product."""
    from wtconvnext.layers.wtconv2d import WTConv2d

    for mod in model.modules():
        if not isinstance(mod, WTConv2d) or mod.stride != 1:
            continue

        def forward(x: Tensor, mod=mod, ordinary=mod.forward) -> Tensor:
            if x.shape[-2] * x.shape[-1] > max_pixels:
                return ordinary(x)
            ps = [mod.weight, mod.bias, mod.base_scale, mod.wavelet_weight, mod.wavelet_scale]
            dev = x.device.type
            if torch.is_autocast_enabled(dev):
                dt = torch.get_autocast_dtype(dev)
                x, ps = x.to(dt), [None if p is None else p.to(dt) for p in ps]
            with torch.autocast(dev, enabled=False):
                if cache and not torch.is_grad_enabled():
                    return _cached_forward(mod, x, ps, sparse, tile)
                return wtconv_small_matrix_lean(x, *ps, group=group, fused=True, sparse=sparse, tile=tile)

        mod.forward = forward
    return model


def _cached_forward(mod: torch.nn.Module, x: Tensor, ps: list, sparse: bool, tile: Optional[dict]) -> Tensor:
    """A forward without autograd from the M that ``mod`` keeps (built again when a parameter changed: the
    versions of the module's own parameters key it, with the dtype and map size)."""
    weight, bias, base_scale, wavelet_weight, wavelet_scale = ps
    own = [p for p in (mod.weight, mod.bias, mod.base_scale, mod.wavelet_weight, mod.wavelet_scale) if p is not None]
    key = (tuple(p._version for p in own), x.dtype, x.device, x.shape[-2:])
    hit = getattr(mod, "_small_matrix_cache", None)
    if hit is None or hit[0] != key:
        wf, basis, tables = _operator_terms(x, weight, base_scale, wavelet_weight, wavelet_scale, sparse)
        shift = None if bias is None else (bias * base_scale).to(x.dtype).reshape(1, -1, 1, 1)
        hit = mod._small_matrix_cache = (key, _matrices(wf, basis, x.shape[-2] * x.shape[-1], tables), shift)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.empty_like(x, memory_format=torch.channels_last)
    _apply_cl(x, hit[1], y, transpose=False, tile=tile)
    return y if hit[2] is None else y.add_(hit[2])


def model_rows(batch: int = 128, infer_batch: int = 256) -> list[dict]:
    """AMP training and inference of convnext_tiny, wtconvnext_tiny and wtconvnext_tiny with its stage 3-4 layers
    on the fused small-matrix products (M by GEMM, by the sparse kernels; split products; inference with M kept),
    side by side (bench_model.py's cases)."""
    from benchmarks import bench_model as bm

    torch.backends.cudnn.benchmark = True
    rows = []
    for name, patch, label in (("convnext_tiny", None, "convnext_tiny"), ("wtconvnext_tiny", None, "wtconvnext_tiny"),
                               ("wtconvnext_tiny", patch_small_maps, "wtconvnext_tiny+small_matrix"),
                               ("wtconvnext_tiny", functools.partial(patch_small_maps, sparse=True),
                                "wtconvnext_tiny+small_matrix_sparse"),
                               ("wtconvnext_tiny", functools.partial(patch_small_maps, sparse=True, tile=SPLIT_TILE),
                                "wtconvnext_tiny+small_matrix_split"),
                               ("wtconvnext_tiny", functools.partial(patch_small_maps, sparse=True, tile=SPLIT_TILE,
                                                                     cache=True),
                                "wtconvnext_tiny+small_matrix_split_cached")):
        r = dict(model=label, task="train", **bm._train_case(name, True, False, batch, 5, 20, patch=patch))
        rows.append(r)
        print(f"  {r}", flush=True)
        r = dict(model=label, task="infer", **bm._infer_case(name, True, False, infer_batch, 5, 20, patch=patch))
        rows.append(r)
        print(f"  {r}", flush=True)
    base = {r["task"]: r for r in rows if r["model"] == "convnext_tiny"}
    for r in rows:
        r["img_s_vs_convnext"] = r["img_s"] / base[r["task"]]["img_s"]
    return rows


def _params(c: int, levels: int, k: int, dtype: torch.dtype, device: str, g: torch.Generator) -> list[Tensor]:
    def rnd(*shape: int, scale: float = 1.0) -> Tensor:
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype=dtype, device=device)

    return [rnd(c, 1, k, k, scale=0.1), rnd(c, scale=0.1), 1 + rnd(c, scale=0.1), rnd(levels, c, 4, k, k, scale=0.1),
            0.1 + rnd(levels, c, 4, scale=0.01)]


def _grads(fn, x: Tensor, params: list[Tensor], dy: Tensor) -> list[Tensor]:
    xi = x.detach().requires_grad_()
    ps = [p.detach().requires_grad_() for p in params]
    y = fn(xi, *ps)
    return [y.detach(), *torch.autograd.grad(y, [xi, *ps], dy)]


def check(shapes=((2, 3, 14, 14, 3), (2, 4, 7, 7, 2), (1, 2, 9, 6, 2), (2, 3, 5, 11, 3), (1, 2, 16, 16, 4))) -> float:
    """Both prototypes' output and all six gradients against the reference's in float64 (maximum relative
    difference over every shape, K = 3, 5, 7); raises past 1e-10."""
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for (b, c, h, w, levels) in shapes:
        for k in (3, 5, 7):
            params = _params(c, levels, k, torch.float64, "cpu", g)
            x = torch.randn(b, c, h, w, generator=g, dtype=torch.float64)
            dy = torch.randn(b, c, h, w, generator=g, dtype=torch.float64)
            ref = _grads(wtconv2d_reference, x, params, dy)
            xcl = x.contiguous(memory_format=torch.channels_last)
            fns = [wtconv_small_matrix, lambda *a: wtconv_small_matrix_lean(*a, group=2)]
            if os.environ.get("TRITON_INTERPRET") == "1":  # (the kernels take CPU tensors only in the interpreter)
                fns.append(lambda *a: wtconv_small_matrix_lean(*a, group=2, fused=True))
                fns.append(lambda *a: wtconv_small_matrix_lean(*a, group=2, fused=True, sparse=True))
                fns.append(lambda *a: wtconv_small_matrix_lean(*a, group=2, fused=True, tile=SPLIT_TILE))
            for fn in fns:
                got = _grads(fn, xcl, params, dy)
                for name, r, o in zip(("y", "dx", "dw", "db", "dbs", "dww", "dws"), ref, got):
                    err = ((o - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
                    worst = max(worst, err)
                    if err > 1e-10:
                        raise AssertionError(f"{name} of {(b, c, h, w, levels)} K={k}: relative error {err:.2e}")
    return worst


def _rel(a: Tensor, ref: Tensor) -> float:
    return ((a.double() - ref).norm() / ref.norm()).item()


def gpu_rows(b: int, c: int, h: int, w: int, levels: int, k: int = 5, dev: str = "cuda") -> list[dict]:
    """Time every implementation at one shape (bf16, channels-last) and measure the fused layers' bf16 error."""
    from benchmarks.bench_layer import _bench, _peak_mb  # (do_bench's median; peak above the start, MiB)
    from wtconvnext.ops import wtconv2d

    dt, cl = torch.bfloat16, torch.channels_last
    g = torch.Generator().manual_seed(0)
    p64 = _params(c, levels, k, torch.float64, "cpu", g)
    x64 = torch.randn(b, c, h, w, generator=g, dtype=torch.float64)
    dy64 = torch.randn(b, c, h, w, generator=g, dtype=torch.float64)
    params = [p.to(dev, dt) for p in p64]
    x = x64.to(dev, dt).contiguous(memory_format=cl)
    dy = dy64.to(dev, dt).contiguous(memory_format=cl)
    rows: list[dict] = []

    # bf16 error against float64 on the GPU (the bf16-rounded inputs and parameters, exact math), first 8 images.
    sub = slice(0, min(b, 8))
    exact = _grads(wtconv2d_reference, x[sub].double(), [p.double() for p in params], dy[sub].double())
    errs = {}
    fused = functools.partial(wtconv_small_matrix_lean, fused=True)
    for name, fn in (("wtconv_triton_cl", lambda *a: wtconv2d(*a, backend="triton")),
                     ("small_matrix", wtconv_small_matrix), ("small_matrix_lean", wtconv_small_matrix_lean),
                     ("small_matrix_fused", fused),
                     ("small_matrix_fused_sparse", functools.partial(fused, sparse=True)),
                     ("small_matrix_split", functools.partial(fused, tile=SPLIT_TILE))):
        got = _grads(fn, x[sub], params, dy[sub])
        errs[name] = dict(zip(("y", "dx", "dw", "db", "dbs", "dww", "dws"), (_rel(o, r) for o, r in zip(got, exact))))

    def layer(fn, ws):
        xi = x.detach().requires_grad_()
        ps = [t.detach().requires_grad_() for t in ws]
        return (lambda: fn(xi, *ps)), (lambda: torch.autograd.grad(fn(xi, *ps), [xi, *ps], dy))

    def tiled(**tile):  # the fused variant with other tiles
        return functools.partial(fused, tile=tile)

    g2 = torch.Generator(device=dev).manual_seed(1)
    dws = {kk: [torch.randn(c, 1, kk, kk, device=dev, generator=g2).to(dt) * 0.1,
                torch.randn(c, device=dev, generator=g2).to(dt) * 0.1] for kk in (7, 5)}
    impls = {
        "wtconv_triton_cl": layer(lambda *a: wtconv2d(*a, backend="triton"), params),
        "small_matrix": layer(wtconv_small_matrix, params),
        "small_matrix_lean": layer(wtconv_small_matrix_lean, params),
        "small_matrix_fused": layer(fused, params),
        "small_matrix_fused_bc8": layer(tiled(BC=8), params),
        "small_matrix_fused_64": layer(tiled(BB=64, BN=64, BP=64, BQ=64), params),
        "small_matrix_split": layer(tiled(**SPLIT_TILE), params),
        "small_matrix_split_32": layer(tiled(SPLIT=1, BB=32, BN=32, BK=32, BP=32, BQ=32), params),
        "small_matrix_fused_sparse": layer(functools.partial(wtconv_small_matrix_lean, fused=True, sparse=True),
                                           params),
        "small_matrix_split_sparse": layer(functools.partial(fused, sparse=True, tile=SPLIT_TILE), params),
        "small_matrix_split_g64": layer(functools.partial(fused, tile=SPLIT_TILE, group=64), params),
        "dw7_cl": layer(lambda xi, wt, bi: F.conv2d(xi, wt, bi, padding=3, groups=c), dws[7]),
        "dw5_cl": layer(lambda xi, wt, bi: F.conv2d(xi, wt, bi, padding=2, groups=c), dws[5]),
    }
    for name, (fwd, fwdbwd) in impls.items():
        row = dict(dtype="bf16", B=b, C=c, H=h, W=w, levels=levels, K=k, impl=name, fwd_ms=_bench(fwd),
                   fwdbwd_ms=_bench(fwdbwd), peak_mb=_peak_mb(fwdbwd))
        if name in errs:
            row["rel_err_vs_fp64"] = errs[name]
        rows.append(row)

    # The prototype's parts, each alone: the build of M, the layout copies, the forward product and the backward's.
    n = h * w
    basis = term_basis(h, w, levels, k, dt, dev)
    wf = folded_terms(*params[:1], params[2], *params[3:]).to(dt)
    m = (wf @ basis.reshape(-1, n * n)).reshape(c, n, n)
    xt = x.permute(1, 0, 2, 3).reshape(c, b, n)
    dyt = dy.permute(1, 0, 2, 3).reshape(c, b, n)
    dm = torch.bmm(dyt.transpose(1, 2), xt)
    tables = term_tables(h, w, levels, k, dev)
    dwf = torch.empty(c, basis.shape[0], dtype=torch.float32, device=dev)
    parts = {
        "part_build_M": lambda: wf @ basis.reshape(-1, n * n),
        "part_to_cbn": lambda: x.permute(1, 0, 2, 3).reshape(c, b, n),
        "part_fwd_bmm": lambda: torch.bmm(xt, m.transpose(1, 2)),
        "part_dx_bmm": lambda: torch.bmm(dyt, m),
        "part_dM_bmm": lambda: torch.bmm(dyt.transpose(1, 2), xt),
        "part_dwf_gemm": lambda: dm.reshape(c, n * n) @ basis.reshape(-1, n * n).t(),
        "part_fused_apply": lambda: _apply_cl(x, m, torch.empty_like(x), transpose=False),
        "part_fused_outer": lambda: _outer_cl(dy, x),
        "part_split_apply": lambda: _apply_cl(x, m, torch.empty_like(x), transpose=False, tile=SPLIT_TILE),
        "part_split_outer": lambda: _outer_cl(dy, x, tile=SPLIT_TILE),
        "part_sparse_build": lambda: _build_m(wf, tables, n),
        "part_sparse_term_grads": lambda: _term_grads(dm, tables, dwf),
    }
    for name, fn in parts.items():
        rows.append(dict(dtype="bf16", B=b, C=c, H=h, W=w, levels=levels, K=k, impl=name, fwd_ms=_bench(fn),
                         fwdbwd_ms=float("nan"), peak_mb=float("nan")))
    best = {r["impl"]: r for r in rows}
    for r in rows:
        r["fwdbwd_vs_dw7"] = r["fwdbwd_ms"] / best["dw7_cl"]["fwdbwd_ms"]
        r["fwd_vs_dw7"] = r["fwd_ms"] / best["dw7_cl"]["fwd_ms"]
    return rows


def sm90_products() -> dict[str, int]:
    """Compile the prototype's kernels for sm_90 in bf16 at the default tiles (no GPU needed; the kernels must be
    decorated without the interpreter): the tensor-core instructions in the products' PTX (mma.sync; the split
    kernels at SPLIT_TILE: Hopper's wgmma), the fp32 FMAs in the sparse build's and term gradients'."""
    from benchmarks.common import compile_sm90

    ptr = {"B": "i32", "N": "i32", "CS": "i32", "CG": "i32"}
    t = _TILE
    apply = compile_sm90(_apply_cl_kernel, {"x_ptr": "*bf16", "a_ptr": "*bf16", "y_ptr": "*bf16", **ptr,
                                            "sa_c": "i32", "sa_p": "i32", "sa_q": "i32"},
                         dict(BB=t["BB"], BN=t["BN"], BK=t["BK"], BC=t["BC"], ACC=tl.float32))
    outer = compile_sm90(_outer_cl_kernel, {"dy_ptr": "*bf16", "x_ptr": "*bf16", "dm_ptr": "*bf16", **ptr},
                         dict(BP=t["BP"], BQ=t["BQ"], BB=t["BB"], BC=t["BC"], ACC=tl.float32))
    build = compile_sm90(_build_m_kernel, {"wf_ptr": "*bf16", "idx_ptr": "*i32", "coef_ptr": "*fp32", "m_ptr": "*bf16",
                                           "NN": "i32", "T": "i32", "CG": "i32"},
                         dict(J=13, BPQ=256, BC=8, ACC=tl.float32))
    grads = compile_sm90(_term_grads_kernel, {"dm_ptr": "*bf16", "tptr_ptr": "*i64", "tpq_ptr": "*i32",
                                              "tcoef_ptr": "*fp32", "dwf_ptr": "*fp32", "NN": "i32", "T": "i32",
                                              "CG": "i32"}, dict(BL=128, BC=16, ACC=tl.float32))
    st = SPLIT_TILE
    split_apply = compile_sm90(_apply_cl_split_kernel, {"x_ptr": "*bf16", "a_ptr": "*bf16", "y_ptr": "*bf16", **ptr,
                                                        "sa_c": "i32", "sa_p": "i32", "sa_q": "i32"},
                               dict(BB=st["BB"], BN=st["BN"], BK=st["BK"], ACC=tl.float32))
    split_outer = compile_sm90(_outer_cl_split_kernel, {"dy_ptr": "*bf16", "x_ptr": "*bf16", "dm_ptr": "*bf16", **ptr},
                               dict(BP=st["BP"], BQ=st["BQ"], BB=st["BB"], ACC=tl.float32))
    mma = {name: k.asm["ptx"].count("mma.sync") for name, k in (("apply", apply), ("outer", outer))}
    mma.update({name: k.asm["ptx"].count("wgmma.mma_async")
                for name, k in (("split_apply_wgmma", split_apply), ("split_outer_wgmma", split_outer))})
    return {**mma, **{name: k.asm["ptx"].count("fma.rn.f32") for name, k in (("build_fma", build),
                                                                            ("term_grads_fma", grads))}}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exactness against the reference in float64 (CPU)")
    ap.add_argument("--sm90", action="store_true", help="compile the fused products for sm_90 (no GPU needed)")
    ap.add_argument("--model", action="store_true",
                    help="instead of the layer table: AMP training / inference of wtconvnext_tiny with its stage 3-4 "
                         "layers on the prototype, beside the model and ConvNeXt-T")
    ap.add_argument("--out", default="results/proto_small_matrix.json")
    args = ap.parse_args(argv)
    if args.sm90:
        print(f"sm_90 bf16, mma / fma instructions in the PTX of the prototype's kernels: {sm90_products()}")
        return 0
    if args.check:
        print(f"small-matrix WTConv vs the reference, float64, output and six gradients: max relative {check():.1e}")
        return 0
    if not torch.cuda.is_available():
        print("proto_small_matrix.py needs a CUDA GPU (or --check)", file=sys.stderr)
        return 2
    from benchmarks.common import gpu_env, report

    if args.model:
        mrows = model_rows()
        mlines = [f"{r['task']:6} {r['model']:36} {r['ms']:8.2f} {r['img_s']:8.0f} {r.get('peak_gb', 0):8.2f} "
                  f"{r['img_s_vs_convnext']:8.2f}" for r in mrows]
        report(args.out, gpu_env(),
               f"{'task':6} {'model (bf16 AMP, eager)':36} {'ms':>8} {'img/s':>8} {'peak GB':>8} {'vs CNX':>8}",
               mlines, mrows, note="B=128 training (AdamW), B=256 inference, 224², channels-last")
        return 0
    rows = []
    for shape in SHAPES:
        for r in gpu_rows(*shape):
            rows.append(r)
            print(f"  {r}", flush=True)
    hdr = (f"{'shape (B,C,H,W,L)':20} {'impl':26} {'fwd ms':>8} {'f+b ms':>8} {'fwd/dw7':>8} {'f+b/dw7':>8} "
           f"{'peak MB':>8}  bf16 err y / dx / dww")
    lines = []
    for r in rows:
        e = r.get("rel_err_vs_fp64")
        err = f"  {e['y']:.1e} / {e['dx']:.1e} / {e['dww']:.1e}" if e else ""
        shape = f"{r['B']},{r['C']},{r['H']},{r['W']},{r['levels']}"
        lines.append(f"{shape:20} {r['impl']:26} {r['fwd_ms']:8.3f} "
                     f"{r['fwdbwd_ms']:8.3f} {r['fwd_vs_dw7']:8.2f} {r['fwdbwd_vs_dw7']:8.2f} {r['peak_mb']:8.1f}{err}")
    report(args.out, gpu_env(), hdr, lines, rows,
           note="bf16 channels-last; part_* rows: one piece of small_matrix alone (in the fwd ms column)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
