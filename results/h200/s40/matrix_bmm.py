"""Session 40, call 1: the operator-matrix path on cuBLAS (channel-major copies + torch.bmm; M by a dense GEMM with
the term basis) at stages 3-4, part by part and whole, beside today's kernels and cuDNN dw7 / dw5 (bf16, cl)."""
import functools, json, sys, time
import torch, torch.nn.functional as F
sys.path.insert(0, ".")
from benchmarks.bench_layer import _bench, _peak_mb
from benchmarks import proto_small_matrix as P
from wtconvnext.ops import wtconv2d
from wtconvnext.ops.reference import wtconv2d_reference

dev, dt, cl = "cuda", torch.bfloat16, torch.channels_last
torch.backends.cudnn.benchmark = True
rows = []

def emit(**r):
    rows.append(r); print(json.dumps(r), flush=True)

def layer_rows(b, c, h, w, L, k=5):
    g = torch.Generator().manual_seed(0)
    p64 = P._params(c, L, k, torch.float64, "cpu", g)
    x64 = torch.randn(b, c, h, w, generator=g, dtype=torch.float64)
    dy64 = torch.randn(b, c, h, w, generator=g, dtype=torch.float64)
    ps = [p.to(dev, dt) for p in p64]
    x = x64.to(dev, dt).contiguous(memory_format=cl); dy = dy64.to(dev, dt).contiguous(memory_format=cl)
    sub = slice(0, min(b, 8))
    exact = P._grads(wtconv2d_reference, x[sub].double(), [p.double() for p in ps], dy[sub].double())
    today = lambda *a: wtconv2d(*a, backend="triton")
    lean = functools.partial(P.wtconv_small_matrix_lean, fused=False)
    for name, fn in (("today", today), ("bmm_lean", lean), ("bmm_keepM", P.wtconv_small_matrix)):
        got = P._grads(fn, x[sub], ps, dy[sub])
        emit(shape=(b, c, h, w, L), impl=name, err={n: P._rel(o, r) for n, o, r in
             zip(("y", "dx", "dw", "db", "dbs", "dww", "dws"), got, exact)})
    g2 = torch.Generator(device=dev).manual_seed(1)
    def layer(fn, ws):
        xi = x.detach().requires_grad_(); pp = [t.detach().requires_grad_() for t in ws]
        def inf():
            with torch.no_grad():
                return fn(x, *ws)
        return (lambda: fn(xi, *pp)), (lambda: torch.autograd.grad(fn(xi, *pp), [xi, *pp], dy)), inf
    dws = {kk: [torch.randn(c, 1, kk, kk, device=dev, generator=g2).to(dt) * 0.1,
                torch.randn(c, device=dev, generator=g2).to(dt) * 0.1] for kk in (7, 5)}
    n = h * w
    basis = P.term_basis(h, w, L, k, dt, dev)
    wf = P.folded_terms(ps[0], ps[2], ps[3], ps[4]).to(dt)
    m = (wf @ basis.reshape(-1, n * n)).reshape(c, n, n)
    shift = (ps[1] * ps[2]).reshape(1, c, 1, 1)
    def cached_infer():  # inference from a kept M: copy in, one bmm, copy out (+ bias)
        xt = x.permute(1, 0, 2, 3).reshape(c, b, n)
        y = torch.empty_like(x)
        y.copy_(torch.bmm(xt, m.transpose(1, 2)).reshape(c, b, h, w).permute(1, 0, 2, 3))
        return y.add_(shift)
    impls = {"today": layer(today, ps), "bmm_lean": layer(lean, ps), "bmm_keepM": layer(P.wtconv_small_matrix, ps),
             "dw7_cl": layer(lambda xi, wt, bi: F.conv2d(xi, wt, bi, padding=3, groups=c), dws[7]),
             "dw5_cl": layer(lambda xi, wt, bi: F.conv2d(xi, wt, bi, padding=2, groups=c), dws[5])}
    for name, (fwd, fb, inf) in impls.items():
        emit(shape=(b, c, h, w, L), impl=name, fwd_ms=_bench(fwd), fwdbwd_ms=_bench(fb), infer_ms=_bench(inf),
             peak_mb=_peak_mb(fb))
    emit(shape=(b, c, h, w, L), impl="bmm_cachedM_infer", infer_ms=_bench(cached_infer), M_mb=m.numel() * 2 / 2**20)
    xt = x.permute(1, 0, 2, 3).reshape(c, b, n); dyt = dy.permute(1, 0, 2, 3).reshape(c, b, n)
    yt = torch.bmm(xt, m.transpose(1, 2)); y = torch.empty_like(x)
    dm = torch.bmm(dyt.transpose(1, 2), xt)
    parts = {"fold": lambda: P.folded_terms(ps[0], ps[2], ps[3], ps[4]).to(dt),
             "build_gemm": lambda: wf @ basis.reshape(-1, n * n),
             "to_cbn": lambda: x.permute(1, 0, 2, 3).reshape(c, b, n),
             "bmm_fwd": lambda: torch.bmm(xt, m.transpose(1, 2)),
             "to_cl": lambda: y.copy_(yt.reshape(c, b, h, w).permute(1, 0, 2, 3)),
             "bmm_dx": lambda: torch.bmm(dyt, m),
             "bmm_dM": lambda: torch.bmm(dyt.transpose(1, 2), xt),
             "dwf_gemm": lambda: dm.reshape(c, n * n) @ basis.reshape(-1, n * n).t(),
             "dsum": lambda: dy.float().sum(dim=(0, 2, 3))}
    for name, fn in parts.items():
        emit(shape=(b, c, h, w, L), impl="part_" + name, ms=_bench(fn))

def patch_bmm(model, cache=False, keep=False, max_pixels=256):
    from wtconvnext.layers.wtconv2d import WTConv2d
    for mod in model.modules():
        if not isinstance(mod, WTConv2d) or mod.stride != 1:
            continue
        def forward(x, mod=mod, ordinary=mod.forward):
            if x.shape[-2] * x.shape[-1] > max_pixels:
                return ordinary(x)
            ps = [mod.weight, mod.bias, mod.base_scale, mod.wavelet_weight, mod.wavelet_scale]
            if torch.is_autocast_enabled("cuda"):
                x, ps = x.to(dt), [None if p is None else p.to(dt) for p in ps]
            with torch.autocast("cuda", enabled=False):
                if cache and not torch.is_grad_enabled():
                    own = [p for p in (mod.weight, mod.bias, mod.base_scale, mod.wavelet_weight, mod.wavelet_scale) if p is not None]
                    key = (tuple(p._version for p in own), x.dtype, x.shape[-2:])
                    hit = getattr(mod, "_mcache", None)
                    bsz, c, h, w = x.shape; n = h * w
                    if hit is None or hit[0] != key:
                        wf, basis, _ = P._operator_terms(x, ps[0], ps[2], ps[3], ps[4])
                        hit = mod._mcache = (key, P._matrices(wf, basis, n), (ps[1] * ps[2]).reshape(1, c, 1, 1))
                    xt = x.permute(1, 0, 2, 3).reshape(c, bsz, n)
                    y = torch.empty_like(x, memory_format=cl)
                    y.copy_(torch.bmm(xt, hit[1].transpose(1, 2)).reshape(c, bsz, h, w).permute(1, 0, 2, 3))
                    return y.add_(hit[2])
                if keep:
                    return P.wtconv_small_matrix(x, *ps)
                return P.wtconv_small_matrix_lean(x, *ps, fused=False)
        mod.forward = forward
    return model

def model_rows():
    from benchmarks import bench_model as bm
    base = {}
    for name, patch, label in (("convnext_tiny", None, "convnext_tiny"), ("wtconvnext_tiny", None, "wtconvnext_tiny"),
                               ("wtconvnext_tiny", patch_bmm, "wt+bmm_lean"),
                               ("wtconvnext_tiny", functools.partial(patch_bmm, keep=True), "wt+bmm_keepM"),
                               ("wtconvnext_tiny", functools.partial(patch_bmm, cache=True), "wt+bmm_cachedM")):
        for task in ("train", "infer"):
            if task == "train" and label == "wt+bmm_cachedM":
                continue
            t0 = time.time()
            if task == "train":
                r = bm._train_case(name, True, False, 128, 5, 20, patch=patch)
            else:
                r = bm._infer_case(name, True, False, 256, 5, 20, patch=patch)
            base.setdefault(task, r["img_s"])
            emit(model=label, task=task, **r, vs_convnext=r["img_s"] / base[task], wall_s=time.time() - t0)

if __name__ == "__main__":
    what = sys.argv[1]
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    if what == "layer":
        for s in [(128, 384, 14, 14, 3), (128, 768, 7, 7, 2), (256, 384, 14, 14, 3), (16, 768, 16, 16, 2)]:
            layer_rows(*s)
    else:
        model_rows()
    json.dump(rows, open(sys.argv[2], "w"), indent=1)
