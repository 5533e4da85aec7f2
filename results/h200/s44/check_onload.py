"""Bitwise check on the GPU: l1_onload 1 (level-1 wgrad staged, and l1_stage 0: walked on load) vs l1_onload 0 at
the stage-1/2 shapes (B=128, bf16 channels_last), output and all gradients."""
import sys, torch
sys.path.insert(0, ".")
from benchmarks.common import wtconv_inputs
from wtconvnext.ops import triton_kernels as tk, wtconv2d
for c, h, L in ((96, 56, 5), (192, 28, 4)):
    res = {}
    for m, st in ((0, 1), (1, 1), (1, 0)):
        tk.TUNING["l1_onload"], tk.TUNING["l1_stage"] = m, st
        x, dy, p = wtconv_inputs(128, c, h, h, L, torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        dy = dy.contiguous(memory_format=torch.channels_last)
        ps = [t.detach().requires_grad_() for t in p]
        y = wtconv2d(x, *ps)
        res[m, st] = [y.detach()] + list(torch.autograd.grad(y, [x, *ps], dy))
    for key in ((1, 1), (1, 0)):
        same = [torch.equal(a, b) for a, b in zip(res[0, 1], res[key])]
        print(f"C={c} {h}x{h} B=128 l1_onload,l1_stage={key} vs l1_onload=0: bitwise equal (y, dx, dw, db, dbs, dww, dws): {same}", flush=True)
tk.TUNING["l1_onload"], tk.TUNING["l1_stage"] = 1, 1
