"""Where a single layer's f+b host time goes on the GPU host: autograd's device-thread hand-off, chains of layers."""
import statistics, sys
sys.path.insert(0, '.')
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from benchmarks.common import wall_us, wtconv_inputs
from wtconvnext.ops import wtconv2d

@triton.jit
def _touch(p):
    tl.store(p, tl.load(p))

class PyClone(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()
    @staticmethod
    def backward(ctx, g):
        return g.clone()

class PyTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.empty_like(x)
        _touch[(1,)](y)
        return y
    @staticmethod
    def backward(ctx, g):
        d = torch.empty_like(g)
        for _ in range(5):
            _touch[(1,)](d)
        return d

def med(fn, n=200, r=5):
    for _ in range(3): fn()
    return statistics.median(wall_us(fn, n) for _ in range(r))

for c, h, l in ((768, 7, 2), (96, 56, 5)):
    cl = torch.channels_last
    x, dy, p = wtconv_inputs(1, c, h, h, l, torch.bfloat16)
    x = x.contiguous(memory_format=cl).requires_grad_()
    dy = dy.contiguous(memory_format=cl)
    ps = [t.detach().requires_grad_() for t in p]
    w7 = (torch.randn(c, 1, 7, 7, device="cuda") * 0.1).to(torch.bfloat16).requires_grad_()
    N = 8
    chain_ps = [[t.detach().clone().requires_grad_() for t in p] for _ in range(N)]
    chain_w7 = [w7.detach().clone().requires_grad_() for _ in range(N)]
    def ours(): torch.autograd.grad(wtconv2d(x, *ps), [x, *ps], dy)
    def dw7(): torch.autograd.grad(F.conv2d(x, w7, padding=3, groups=c), [x, w7], dy)
    def clone(): torch.autograd.grad(PyClone.apply(x), [x], dy)
    def trit(): torch.autograd.grad(PyTriton.apply(x), [x], dy)
    def fwd_only():
        return wtconv2d(x, *ps)
    y = wtconv2d(x, *ps)
    def bwd_only(): torch.autograd.grad(y, [x, *ps], dy, retain_graph=True)
    def ours_chain():
        t = x
        for q in chain_ps: t = wtconv2d(t, *q)
        torch.autograd.grad(t, [x], dy)
    def dw7_chain():
        t = x
        for q in chain_w7: t = F.conv2d(t, q, padding=3, groups=c)
        torch.autograd.grad(t, [x], dy)
    def clone_chain():
        t = x
        for _ in range(N): t = PyClone.apply(t)
        torch.autograd.grad(t, [x], dy)
    res = {}
    for rnd in range(2):
        for name, fn in (("ours", ours), ("dw7", dw7), ("pyclone", clone), ("pytriton", trit), ("ours_fwd", fwd_only),
                         ("ours_bwd", bwd_only)):
            res.setdefault(name, []).append(med(fn))
        for name, fn in (("ours_chain8", ours_chain), ("dw7_chain8", dw7_chain), ("pyclone_chain8", clone_chain)):
            res.setdefault(name, []).append(med(fn, 50) / N)
        with torch.autograd.set_multithreading_enabled(False):
            for name, fn in (("ours_callthread", ours), ("pyclone_callthread", clone), ("pytriton_callthread", trit)):
                res.setdefault(name, []).append(med(fn))
    print(f"C={c} {h}x{h} L={l} B=1 bf16 CL, us per f+b (chains: per layer), two rounds")
    for k, v in res.items():
        print(f"  {k:22} " + " ".join(f"{t:8.1f}" for t in v))
