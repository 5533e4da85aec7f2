"""Diagnostic: compiled WTConv layer (traced op) under CUDA graphs vs eager; graph-mode small-map keys."""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
import wtconvnext  # noqa
import wtconvnext.ops.wtconv_triton  # noqa
if os.environ.get("NOMEMO"):
    import torch._higher_order_ops.triton_kernel_wrap as tkw
    for n in ("identify_accessed_tensors", "identify_mutated_tensors"):
        f = getattr(tkw, n, None)
        if f is not None and hasattr(f, "__wrapped__"):
            setattr(tkw, n, f.__wrapped__); print("memo off", n)
if os.environ.get("NOFXCACHE"):
    torch._inductor.config.fx_graph_cache = False
from wtconvnext.layers import WTConv2d
variant = sys.argv[1]

def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))

def layer_and_input(dtype, b=4, c=96, h=29, w=31, levels=4):
    torch.manual_seed(0)
    layer = WTConv2d(c, c, kernel_size=5, wt_levels=levels).cuda()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.2)
    x = torch.randn(b, c, h, w, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
    return layer.to(dtype), x

def grads_of(fn, layer, x):
    x = x.detach().requires_grad_()
    y = fn(x)
    g = torch.autograd.grad(y.square().sum(), [x, *layer.parameters()])
    return [y.detach().clone(), *[t.clone() for t in g]]

if variant == "graphkeys":
    from wtconvnext.ops import launch_plan, triton_kernels as tk
    tk.TUNING["small_max"] = 16
    launch_plan.GRAPHS = True
    g = torch.Generator().manual_seed(5)
    c, k, levels, h, w = 6, 3, 2, 11, 9
    r = lambda *s: (torch.rand(*s, generator=g) - 0.5).to("cuda", torch.bfloat16)
    params = [r(c, 1, k, k), r(c), 1 + r(c), r(levels, c, 4, k, k), r(levels, c, 4)]
    x = r(2, c, h, w).contiguous(memory_format=torch.channels_last)
    dy = r(2, c, h, w).contiguous(memory_format=torch.channels_last)
    from wtconvnext.ops import wtconv2d
    for it in range(6):
        xx = x.clone().requires_grad_(); ps = [p.clone().requires_grad_() for p in params]
        y = wtconv2d(xx, *ps, backend="triton"); (y * dy).sum().backward()
        del y, xx, ps
        for i, p in enumerate(launch_plan._PLANS.values()):
            if p is None: continue
            gl = p._run.__globals__
            print(it, "plan", i, "graphs", len(gl.get("_graphs", {}) or {}), "seen", {tuple(hex(v)[-6:] for v in k_): n for k_, n in (gl.get("_seen") or {}).items()}, flush=True)
    sys.exit(0)

dtype = torch.float32 if "fp32" in variant else torch.bfloat16
print(variant, "traced op applies", wtconvnext.ops.wtconv_triton.traced_op_applies(torch.empty(1, device="cuda")), {k: v for k, v in os.environ.items() if k in ("NOMEMO", "NOFXCACHE", "BACKEND", "WTCONVNEXT_TRITON_OP", "WTCONVNEXT_LAUNCH_PLANS")})
layer, x = layer_and_input(dtype)
eager = grads_of(layer, layer, x)
eager2 = grads_of(layer, layer, x)
print(variant, "eager repeat", [round(rel(a, b), 6) for a, b in zip(eager2, eager)], flush=True)
if "notrees" in variant:
    torch._inductor.config.triton.cudagraph_trees = False
mode = "reduce-overhead" if "ro" in variant else None
torch._dynamo.reset()
compiled = torch.compile(layer, fullgraph=True, dynamic=False, mode=mode, backend=os.environ.get("BACKEND", "inductor"))
if "fwdonly" in variant:
    with torch.no_grad():
        ye = layer(x)
        for it in range(4):
            y = compiled(x).clone()
            print(variant, "iter", it, "y rel", round(rel(y, ye), 6), flush=True)
    sys.exit(0)
for it in range(4):
    out = grads_of(compiled, layer, x)
    print(variant, "iter", it, [round(rel(a, b), 6) for a, b in zip(out, eager)], flush=True)
