"""Prototype (issue 14, layer memory): level 1's convolutions with its subbands built as the input rows load.

Usage::

    python benchmarks/proto_level1.py                 # a GPU: time it against today's launches, check the bits
    TRITON_INTERPRET=1 python benchmarks/proto_level1.py --check --device cpu   # the bits only, small shape

Why. At 56 x 56 the layer's forward + backward peaks at 1.66x cuDNN's dw7 (issue 14 asks <= 1.1x): x's and dy's
coefficient buffers (4/3 of a map each) and their filtered copies. Level 1 is 3/4 of those buffers. This kernel
takes it out of them: a program walks down a strip of level 1's columns, loads the two full-resolution rows under
each level-1 row, makes the four Haar subbands of each 2 x 2 block itself (rounded to x's dtype, as the analysis
stores them) and runs all four subbands' K x K convolutions with rolling row accumulators, as ``_conv_row`` does.
It writes the filtered subbands in the *polyphase* layout: subband s of block (r, j) at full-resolution pixel
(2r + s // 2, 2j + s % 2) of a map of x's shape. In that layout the base convolution, whose strips own whole 2 x 2
blocks, could read level 1's term from its own output buffer and overwrite it in place; with levels >= 2 still in
buffers (1/3 of a map), the layer's peak would be y + dx + 1/3 map at 56 x 56 (the note's arithmetic: 0.99x dw7).

``forward_l1_inplace`` takes it one step on: a one-level forward with no coefficient buffer, level 1 on load into
y's buffer and the base convolution (``_conv_kernel``, SYN1 == 2) overwriting it in place, bitwise today's
three-launch forward.

What it measures: this kernel against what it replaces, level 1's part of today's passes: the analysis writing
level 1's coefficients plus the level convolution reading them (``coefficients(x, 1)`` and ``_conv_launch`` on
that one level). The results are checked bit for bit against those launches, rearranged (same multiply-add order).
Odd map sizes are not handled here (the prototype needs H, W even).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wtconvnext.ops import triton_kernels as tk  # noqa: E402

__all__ = ["level1_onload", "level1_today", "check"]


@triton.jit
def _level1_onload_kernel(
    x_ptr,  # (B, H, W, C) channels-last, H and W even
    y_ptr,  # (B, H, W, C): the filtered subbands, polyphase
    w_ptr,  # (K, K, 4, C): level 1's folded kernels (taps-major, then subband)
    H, W,
    C: tl.constexpr, K: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, COMPUTE: tl.constexpr,
):
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
    inm = ()
    for i in tl.static_range(NI):
        inm = inm + (cmask & (j0 + (i - PAD) >= 0) & (j0 + (i - PAD) < w1),)
    outm = ()
    for q in tl.static_range(BW):
        outm = outm + (cmask & (j0 + q < w1),)
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
                ab = a + bb
                cd = c + d
                amb = a - bb
                cmd = c - d
                # As _analysis_level computes and stores them (rounded to x's dtype).
                v = (((ab + cd) * 0.5).to(ty).to(COMPUTE), ((ab - cd) * 0.5).to(ty).to(COMPUTE),
                     ((amb + cmd) * 0.5).to(ty).to(COMPUTE), ((amb - cmd) * 0.5).to(ty).to(COMPUTE))
                new = ()
                for s in tl.static_range(4):
                    for j in tl.static_range(K):  # slot j: output row r - PAD + j, through tap row K - 1 - j
                        for q in tl.static_range(BW):
                            if (i - q >= 0) and (i - q < K):
                                wv = wts[((K - 1 - j) * K + (i - q)) * 4 + s]
                                new = new + (acc[(s * K + j) * BW + q] + wv * v[s],)
                            else:
                                new = new + (acc[(s * K + j) * BW + q],)
                acc = new
        if o >= 0:
            for s in tl.static_range(4):
                for q in tl.static_range(BW):
                    p = yb + (2 * o + s // 2) * rs + (2 * (j0 + q) + s % 2) * C
                    tl.store(p, acc[(s * K) * BW + q].to(y_ptr.dtype.element_ty), mask=outm[q])
        new = ()
        for s in tl.static_range(4):
            for k in tl.static_range(BW, K * BW):
                new = new + (acc[s * K * BW + k],)
            for _ in tl.static_range(BW):
                new = new + (tl.zeros_like(acc[0]),)
        acc = new


def level1_onload(x: torch.Tensor, level_w: torch.Tensor, bw: int = 2, bc: int = 32, warps: int = 1
                  ) -> torch.Tensor:
    """Level 1's filtered subbands of the channels-last ``x`` (B, C, H, W; H, W even), polyphase, channels-last;
    ``level_w``: the folded level kernels (L, K, K, 4, C) of ``triton_kernels.folded_weights`` (level 1's used)."""
    bsz, ch, h, w = x.shape
    if h % 2 or w % 2:
        raise ValueError(f"the prototype needs an even map, got {h} x {w}")
    k = level_w.shape[1]
    out = torch.empty_like(x, memory_format=torch.channels_last)
    grid = (bsz * triton.cdiv(w // 2, bw), triton.cdiv(ch, bc))
    _level1_onload_kernel[grid](x, out, level_w[0], h, w, C=ch, K=k, BW=bw, BC=bc,
                                COMPUTE=tk._compute_dtype(x.dtype), num_warps=warps)
    return out


def level1_today(x: torch.Tensor, level_w: torch.Tensor) -> torch.Tensor:
    """What the prototype replaces: level 1's analysis (one launch writing its coefficients) and its level
    convolution (one launch), as today's passes run them; (B, h_1, w_1, 4, C) filtered subbands."""
    bsz, ch, h, w = x.shape
    coef = tk.coefficients(x, 1)
    filt = torch.empty_like(coef)
    tk._conv_launch(coef, coef, filt, level_w[:1], level_w[:1], h, w, bsz, 4 * ch, level_w.shape[1], 1, 1,
                    False, False, False)
    return filt.view(bsz, h // 2, w // 2, 4, ch)


def forward_l1_inplace(x: torch.Tensor, base_w: torch.Tensor, base_b: torch.Tensor | None, level_w: torch.Tensor,
                       bw: int = 2, bc: int = 32, warps: int = 1) -> torch.Tensor:
    """A one-level WTConv forward in two launches and no coefficient buffer: level 1 on load, polyphase into y's
    own buffer, then the base convolution (``_conv_kernel`` with SYN1 == 2) adding the bias and level 1's inverse
    Haar step, reading each row's level-1 values a row ahead (TUNING syn1_ahead >= 1) and overwriting them."""
    if not tk.TUNING["syn1_ahead"] or tk.TUNING["conv_bw"] % 2:
        raise ValueError("in place needs TUNING syn1_ahead >= 1 and an even conv_bw")
    bsz, ch, h, w = x.shape
    y = level1_onload(x, level_w, bw, bc, warps)
    tk._conv_launch(x, y, y, base_w, base_w if base_b is None else base_b, h, w, bsz, ch, base_w.shape[0], 0, 1,
                    True, base_b is not None, False, syn1=2)
    return y


def forward_l1_today(x: torch.Tensor, base_w: torch.Tensor, base_b: torch.Tensor | None, level_w: torch.Tensor
                     ) -> torch.Tensor:
    """Today's multi-launch forward of one level (analysis, level convolution, base convolution with syn1)."""
    out = torch.empty_like(x, memory_format=torch.channels_last)
    return tk.wtconv_forward(x, out, base_w, base_b, level_w[:1], 1)


def _inputs(b: int, c: int, h: int, w: int, k: int, dtype: torch.dtype, device: str):
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(b, c, h, w, device=device, generator=g).to(dtype).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(c, 1, k, k, device=device, generator=g) * 0.2
    ww = torch.randn(1, c, 4, k, k, device=device, generator=g) * 0.2
    ws = torch.rand(1, c, 4, device=device, generator=g) + 0.5
    _, _, level_w = tk.folded_weights(weight, None, torch.ones(c, device=device), ww, ws)
    return x, level_w


def _layer(b: int, c: int, h: int, w: int, k: int, dtype: torch.dtype, device: str):
    """x and a one-level layer's folded kernels (base, bias, levels)."""
    x, level_w = _inputs(b, c, h, w, k, dtype, device)
    g = torch.Generator(device=device).manual_seed(1)
    weight = torch.randn(c, 1, k, k, device=device, generator=g) * 0.2
    bias = torch.randn(c, device=device, generator=g)
    base_w, base_b, _ = tk.folded_weights(weight, bias, torch.rand(c, device=device, generator=g) + 0.5,
                                          torch.zeros(1, c, 4, k, k, device=device), torch.ones(1, c, 4, device=device))
    return x, base_w, base_b, level_w


def check_forward(b: int = 2, c: int = 8, h: int = 20, w: int = 18, k: int = 5, dtype: torch.dtype = torch.bfloat16,
                  device: str = "cpu", bw: int = 2, bc: int = 8) -> None:
    """Raise AssertionError unless the in-place one-level forward is bitwise today's (a map past small_max)."""
    x, base_w, base_b, level_w = _layer(b, c, h, w, k, dtype, device)
    want = forward_l1_today(x, base_w, base_b, level_w)
    got = forward_l1_inplace(x, base_w, base_b, level_w, bw, bc)
    if not torch.equal(got, want):
        diff = (got.float() - want.float()).abs().max().item()
        raise AssertionError(f"in-place forward differs from today's (max abs diff {diff})")


def check(b: int = 2, c: int = 8, h: int = 12, w: int = 10, k: int = 5, dtype: torch.dtype = torch.bfloat16,
          device: str = "cpu", bw: int = 2, bc: int = 8) -> None:
    """Raise AssertionError unless the prototype's output is bitwise today's level-1 result, rearranged."""
    x, level_w = _inputs(b, c, h, w, k, dtype, device)
    want = level1_today(x, level_w)  # (B, h1, w1, 4, C)
    got = level1_onload(x, level_w, bw=bw, bc=bc).permute(0, 2, 3, 1)  # (B, H, W, C)
    poly = got.reshape(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h // 2, w // 2, 4, c)
    if not torch.equal(poly, want):
        diff = (poly.float() - want.float()).abs().max().item()
        raise AssertionError(f"prototype differs from today's level 1 (max abs diff {diff})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="only the bitwise check, on a small shape")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--configs", nargs="*", default=["2,32,1", "4,32,1", "2,64,2", "4,64,2"],
                    help="BW,BC,WARPS of the prototype")
    args = ap.parse_args(argv)
    if args.check:
        for bw, bc in ((2, 8), (4, 4)):
            check(device=args.device, bw=bw, bc=bc)
        check_forward(device=args.device)
        print("proto_level1: bitwise today's level 1 (2 configs) and one-level forward")
        return 0
    from benchmarks.bench_layer import _bench

    for b, c, h, k in ((128, 96, 56, 5), (128, 192, 28, 5)):
        x, level_w = _inputs(b, c, h, h, k, torch.bfloat16, args.device)
        row = {"today (analysis + level conv)": _bench(lambda: level1_today(x, level_w))}
        for cfg in args.configs:
            bw, bc, warps = (int(v) for v in cfg.split(","))
            try:
                check(b=4, c=c, h=h, w=h, k=k, device=args.device, bw=bw, bc=bc)
                row[f"on load BW={bw} BC={bc} warps={warps}"] = _bench(
                    lambda: level1_onload(x, level_w, bw, bc, warps))
            except Exception as e:  # noqa: BLE001 - a config that fails to compile or check is reported, not fatal
                row[f"on load BW={bw} BC={bc} warps={warps}"] = f"{type(e).__name__}: {str(e)[:120]}"
        xl, base_w, base_b, lw1 = _layer(b, c, h, h, k, torch.bfloat16, args.device)
        row["one-level forward today (3 launches)"] = _bench(lambda: forward_l1_today(xl, base_w, base_b, lw1))
        for cfg in args.configs[:2]:
            bw, bc, warps = (int(v) for v in cfg.split(","))
            try:
                check_forward(b=4, c=c, h=h, w=h, k=k, device=args.device, bw=bw, bc=bc)
                row[f"one-level forward in place BW={bw} BC={bc}"] = _bench(
                    lambda: forward_l1_inplace(xl, base_w, base_b, lw1, bw, bc, warps))
            except Exception as e:  # noqa: BLE001
                row[f"one-level forward in place BW={bw} BC={bc}"] = f"{type(e).__name__}: {str(e)[:120]}"
        print(f"=== bf16 B={b} C={c} {h}x{h} K={k}: level 1 (ms)")
        for name, v in row.items():
            print(f"  {name:44s} {v if isinstance(v, str) else f'{v:.4f}'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
