"""Host enqueue time per f+b (GPU kept busy by a sleep kernel, so nothing waits on it) against do_bench wall, at
B=1 and B=128 for stages 3-4 (and 1-2), ours and cuDNN dw7. Session 42 probe."""
import statistics, sys, time
import torch, triton
import torch.nn.functional as F
sys.path.insert(0, ".")
from benchmarks.common import wtconv_inputs
from wtconvnext.ops import wtconv2d

def host_us(fn, n=80):
    torch.cuda.synchronize()
    torch.cuda._sleep(int(1.5e9))  # ~0.8 s of GPU time: the launches queue behind it
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6

ALL = ((384, 14, 3), (768, 7, 2), (96, 56, 5), (192, 28, 4))
for (c, h, L) in (ALL[int(i)] for i in (sys.argv[1:] or range(4))):
    for b in (1, 128):
        x, dy, p = wtconv_inputs(b, c, h, h, L, torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        dy = dy.contiguous(memory_format=torch.channels_last)
        ps = [t.detach().requires_grad_() for t in p]
        w7 = (torch.randn(c, 1, 7, 7, device="cuda") * 0.1).to(torch.bfloat16).requires_grad_()
        wt = lambda: torch.autograd.grad(wtconv2d(x, *ps), [x, *ps], dy)
        dw = lambda: torch.autograd.grad(F.conv2d(x, w7, padding=3, groups=c), [x, w7], dy)
        xd, psd = x.detach(), [q.detach() for q in ps]
        wtf = lambda: wtconv2d(xd, *psd)
        for f in (wt, dw, wtf):
            for _ in range(5):
                f()
        r = {}
        for name, f in (("wt", wt), ("dw7", dw), ("wt_infer", wtf)):
            hs = statistics.median(host_us(f) for _ in range(3))
            wall = triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median") * 1e3
            r[name] = (hs, wall)
        print(f"C={c} {h}x{h} B={b}: " + "  ".join(f"{k}: host {a:.0f} us wall {w:.0f} us" for k, (a, w) in r.items()),
              flush=True)
