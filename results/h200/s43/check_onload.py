"""Bitwise check on the GPU: l1_onload 1 vs 0 at the stage-1/2 shapes (B=4, bf16 channels_last), output and all
gradients; and the peak memory of one f+b at B=128 both ways (torch.cuda.max_memory_allocated above x, dy)."""
import sys, torch
sys.path.insert(0, ".")
from benchmarks.common import wtconv_inputs
from wtconvnext.ops import triton_kernels as tk, wtconv2d
for c, h, L in ((96, 56, 5), (192, 28, 4)):
    res = {}
    for m in (0, 1):
        tk.TUNING["l1_onload"] = m
        x, dy, p = wtconv_inputs(4, c, h, h, L, torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        dy = dy.contiguous(memory_format=torch.channels_last)
        ps = [t.detach().requires_grad_() for t in p]
        y = wtconv2d(x, *ps)
        res[m] = [y.detach()] + list(torch.autograd.grad(y, [x, *ps], dy))
    same = [torch.equal(a, b) for a, b in zip(res[0], res[1])]
    print(f"C={c} {h}x{h} B=4: bitwise equal (y, dx, dw, db, dbs, dww, dws): {same}", flush=True)
tk.TUNING["l1_onload"] = 1
