"""Prototype (issue 14): a small map's whole WTConv as one dense operator per channel, on tensor cores.

Usage::

    python benchmarks/proto_small_matrix.py --check            # any machine: exactness against the reference (CPU)
    python benchmarks/proto_small_matrix.py [--out FILE.json]  # a CUDA GPU: side by side with today's kernels, cuDNN

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

This is the prototype that the design is decided on, not the product: stride 1 only, channels-last maps moved to
(C, B, n) and back by copies (a fused kernel would load them in place), M rebuilt on every call. Two variants:
``wtconv_small_matrix`` (plain autograd, which keeps M and x's copy for the backward) and
``wtconv_small_matrix_lean`` (saves only x and the parameters, a group of channels at a time: a built-out op's
memory). The GPU run times
forward and forward + backward (``triton.testing.do_bench``, median) of today's fused layer, this one (and its
parts: the build, the layout copies, the products) and cuDNN's depthwise 7x7 / 5x5, channels-last, bf16, and the
bf16 error of both fused layers against float64 at each shape, and the peak memory of forward + backward (this
prototype's autograd keeps M and the (C, B, n) copy of x for the backward: a built-out op would keep neither); it
prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

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
    basis, wf = _basis_and_terms(x, weight, base_scale, wavelet_weight, wavelet_scale)
    m = _matrices(wf, basis, n)
    xt = x.permute(1, 0, 2, 3).reshape(c, bsz, n)  # a copy for channels-last x: (C, B, n)
    y = torch.bmm(xt, m.transpose(1, 2)).reshape(c, bsz, h, w).permute(1, 0, 2, 3)
    if bias is not None:
        y = y + (bias * base_scale).to(x.dtype).reshape(1, c, 1, 1)
    return y.contiguous(memory_format=torch.channels_last)


class SmallMatrixLean(torch.autograd.Function):
    """The same layer as :func:`wtconv_small_matrix` with a built-out op's memory: it saves only x and the
    parameters (the backward rebuilds M and the (C, B, n) copy of x) and works through the channels in groups of
    ``group``, so that M, dM and the layout copies of a group are all the transient memory there is."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor], base_scale: Tensor, wavelet_weight: Tensor,
                wavelet_scale: Tensor, group: int = 128) -> Tensor:
        ctx.save_for_backward(x, weight, bias, base_scale, wavelet_weight, wavelet_scale)
        ctx.group = group
        bsz, c, h, w = x.shape
        basis, wf = _basis_and_terms(x, weight, base_scale, wavelet_weight, wavelet_scale)
        y = torch.empty_like(x, memory_format=torch.channels_last)
        for c0 in range(0, c, group):
            c1 = min(c, c0 + group)
            m = _matrices(wf[c0:c1], basis, h * w)
            xt = x[:, c0:c1].permute(1, 0, 2, 3).reshape(c1 - c0, bsz, h * w)
            y[:, c0:c1] = torch.bmm(xt, m.transpose(1, 2)).reshape(c1 - c0, bsz, h, w).permute(1, 0, 2, 3)
        if bias is not None:
            y += (bias * base_scale).to(x.dtype).reshape(1, c, 1, 1)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, weight, bias, base_scale, wavelet_weight, wavelet_scale = ctx.saved_tensors
        bsz, c, h, w = x.shape
        n, group = h * w, ctx.group
        basis, wf = _basis_and_terms(x, weight, base_scale, wavelet_weight, wavelet_scale)
        dx = torch.empty_like(x, memory_format=torch.channels_last)
        acc = torch.promote_types(x.dtype, torch.float32)  # the gradients' arithmetic: fp32 (fp64 for fp64)
        dwf = torch.empty(c, basis.shape[0], dtype=acc, device=x.device)
        for c0 in range(0, c, group):
            c1 = min(c, c0 + group)
            m = _matrices(wf[c0:c1], basis, n)
            dyt = dy[:, c0:c1].permute(1, 0, 2, 3).reshape(c1 - c0, bsz, n)
            dx[:, c0:c1] = torch.bmm(dyt, m).reshape(c1 - c0, bsz, h, w).permute(1, 0, 2, 3)
            del m
            xt = x[:, c0:c1].permute(1, 0, 2, 3).reshape(c1 - c0, bsz, n)
            dm = torch.bmm(dyt.transpose(1, 2), xt)  # (group, p, q), summed over the batch
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
                cast(d_ww, wavelet_weight), cast(d_ws, wavelet_scale), None)


def _basis_and_terms(x: Tensor, weight: Tensor, base_scale: Tensor, wavelet_weight: Tensor, wavelet_scale: Tensor
                     ) -> tuple[Tensor, Tensor]:
    """(term basis in x's dtype, (C, T) folded terms in x's dtype) of a layer over x's map size."""
    basis = term_basis(x.shape[2], x.shape[3], wavelet_weight.shape[0], weight.shape[-1], x.dtype, str(x.device))
    return basis, folded_terms(weight, base_scale, wavelet_weight, wavelet_scale).to(x.dtype)


def _matrices(wf: Tensor, basis: Tensor, n: int) -> Tensor:
    """(C, n, n): each channel's operator, ``wf @ E``."""
    return (wf @ basis.reshape(basis.shape[0], n * n)).reshape(wf.shape[0], n, n)


def wtconv_small_matrix_lean(x: Tensor, weight: Tensor, bias: Optional[Tensor], base_scale: Tensor,
                             wavelet_weight: Tensor, wavelet_scale: Tensor, group: int = 128) -> Tensor:
    """:class:`SmallMatrixLean` as a function (stride 1, output channels-last)."""
    return SmallMatrixLean.apply(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, group)


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
            for fn in (wtconv_small_matrix, lambda *a: wtconv_small_matrix_lean(*a, group=2)):
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
    for name, fn in (("wtconv_triton_cl", lambda *a: wtconv2d(*a, backend="triton")),
                     ("small_matrix", wtconv_small_matrix), ("small_matrix_lean", wtconv_small_matrix_lean)):
        got = _grads(fn, x[sub], params, dy[sub])
        errs[name] = dict(zip(("y", "dx", "dw", "db", "dbs", "dww", "dws"), (_rel(o, r) for o, r in zip(got, exact))))

    def layer(fn, ws):
        xi = x.detach().requires_grad_()
        ps = [t.detach().requires_grad_() for t in ws]
        return (lambda: fn(xi, *ps)), (lambda: torch.autograd.grad(fn(xi, *ps), [xi, *ps], dy))

    g2 = torch.Generator(device=dev).manual_seed(1)
    dws = {kk: [torch.randn(c, 1, kk, kk, device=dev, generator=g2).to(dt) * 0.1,
                torch.randn(c, device=dev, generator=g2).to(dt) * 0.1] for kk in (7, 5)}
    impls = {
        "wtconv_triton_cl": layer(lambda *a: wtconv2d(*a, backend="triton"), params),
        "small_matrix": layer(wtconv_small_matrix, params),
        "small_matrix_lean": layer(wtconv_small_matrix_lean, params),
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
    parts = {
        "part_build_M": lambda: wf @ basis.reshape(-1, n * n),
        "part_to_cbn": lambda: x.permute(1, 0, 2, 3).reshape(c, b, n),
        "part_fwd_bmm": lambda: torch.bmm(xt, m.transpose(1, 2)),
        "part_dx_bmm": lambda: torch.bmm(dyt, m),
        "part_dM_bmm": lambda: torch.bmm(dyt.transpose(1, 2), xt),
        "part_dwf_gemm": lambda: dm.reshape(c, n * n) @ basis.reshape(-1, n * n).t(),
    }
    for name, fn in parts.items():
        rows.append(dict(dtype="bf16", B=b, C=c, H=h, W=w, levels=levels, K=k, impl=name, fwd_ms=_bench(fn),
                         fwdbwd_ms=float("nan"), peak_mb=float("nan")))
    best = {r["impl"]: r for r in rows}
    for r in rows:
        r["fwdbwd_vs_dw7"] = r["fwdbwd_ms"] / best["dw7_cl"]["fwdbwd_ms"]
        r["fwd_vs_dw7"] = r["fwd_ms"] / best["dw7_cl"]["fwd_ms"]
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exactness against the reference in float64 (CPU)")
    ap.add_argument("--out", default="results/proto_small_matrix.json")
    args = ap.parse_args(argv)
    if args.check:
        print(f"small-matrix WTConv vs the reference, float64, output and six gradients: max relative {check():.1e}")
        return 0
    if not torch.cuda.is_available():
        print("proto_small_matrix.py needs a CUDA GPU (or --check)", file=sys.stderr)
        return 2
    from benchmarks.common import gpu_env, report

    rows = []
    for shape in SHAPES:
        for r in gpu_rows(*shape):
            rows.append(r)
            print(f"  {r}", flush=True)
    hdr = (f"{'shape (B,C,H,W,L)':20} {'impl':18} {'fwd ms':>8} {'f+b ms':>8} {'fwd/dw7':>8} {'f+b/dw7':>8} "
           f"{'peak MB':>8}  bf16 err y / dx / dww")
    lines = []
    for r in rows:
        e = r.get("rel_err_vs_fp64")
        err = f"  {e['y']:.1e} / {e['dx']:.1e} / {e['dww']:.1e}" if e else ""
        shape = f"{r['B']},{r['C']},{r['H']},{r['W']},{r['levels']}"
        lines.append(f"{shape:20} {r['impl']:18} {r['fwd_ms']:8.3f} "
                     f"{r['fwdbwd_ms']:8.3f} {r['fwd_vs_dw7']:8.2f} {r['fwdbwd_vs_dw7']:8.2f} {r['peak_mb']:8.1f}{err}")
    report(args.out, gpu_env(), hdr, lines, rows,
           note="bf16 channels-last; part_* rows: one piece of small_matrix alone (in the fwd ms column)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
