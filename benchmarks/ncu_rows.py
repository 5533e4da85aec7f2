"""Issue 14: one plain depthwise 5x5 (the base branch at stage 1) through each row-streaming kernel and cuDNN.

Times the forward and the weight gradient of a depthwise 5x5 on the WTConvNeXt-T stage-1 input (B=128, C=96, 56²,
bf16, channels-last) for a sweep of launch shapes of the explicit-column kernels (``triton_rows``) and cuDNN, then
runs the best of each inside cudaProfilerStart/Stop for Nsight Compute::

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats --section InstructionStats python benchmarks/ncu_rows.py --profile
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import gpu_env, report  # noqa: E402
from wtconvnext.ops import triton_rows as tr  # noqa: E402


def _bench(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/ncu_rows.json")
    ap.add_argument("--fwd", nargs="*", default=["7,32,1", "7,64,2", "7,128,4", "4,64,2", "8,64,2", "14,32,1",
                                                 "7,64,1", "4,32,1"])
    ap.add_argument("--wgrad", nargs="*", default=["7,64,2,2", "7,64,2,4", "7,64,2,8", "4,64,2,4", "7,32,1,4",
                                                   "8,32,1,4"])
    ap.add_argument("--profile", action="store_true", help="then run the fastest of each inside the profiler range")
    args = ap.parse_args(argv)
    torch.backends.cudnn.benchmark = True
    b, c, h, w = 128, 96, 56, 56
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(b, c, h, w, device="cuda", generator=g).to(torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    dy = torch.randn(b, c, h, w, device="cuda", generator=g).to(torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    wt = (torch.randn(c, 1, 5, 5, device="cuda", generator=g) * 0.1).to(torch.bfloat16)
    wk = wt.float()[:, 0].permute(1, 2, 0).contiguous()  # (K, K, C) fp32
    xd, dyd = x.permute(0, 2, 3, 1), dy.permute(0, 2, 3, 1)
    ref_y = F.conv2d(x, wt, None, padding=2, groups=c)
    conv_bwd = torch.ops.aten.convolution_backward
    ref_dw = conv_bwd(dy, x, wt, None, [1, 1], [2, 2], [1, 1], False, [0, 0], c, [False, True, False])[1]
    rows, lines = [], []
    fma = b * c * h * w * 25

    def add(impl, cfg, ms, err=""):
        rows.append(dict(impl=impl, cfg=cfg, ms=ms, tfma_s=fma / ms / 1e9, check=err))
        lines.append(f"{impl:10} {cfg:10} {ms:8.4f} {fma / ms / 1e9:8.2f}  {err}")
        print(lines[-1], flush=True)

    add("cudnn_fwd", "dw5", _bench(lambda: F.conv2d(x, wt, None, padding=2, groups=c)))
    add("cudnn_wgrad", "dw5", _bench(
        lambda: conv_bwd(dy, x, wt, None, [1, 1], [2, 2], [1, 1], False, [0, 0], c, [False, True, False])))
    best_f, best_w = None, None
    for cfg in args.fwd:
        bw, bc, warps = (int(v) for v in cfg.split(","))

        def f(bw=bw, bc=bc, warps=warps):
            return tr.dw_cols(xd, wk, bw=bw, bc=bc, warps=warps)

        y = f().permute(0, 3, 1, 2)
        err = float((y.float() - ref_y.float()).abs().max())
        ms = _bench(f)
        add("cols_fwd", cfg, ms, f"max err {err:.1e}")
        if best_f is None or ms < best_f[0]:
            best_f = (ms, f)
    for cfg in args.wgrad:
        bw, bc, warps, imgs = (int(v) for v in cfg.split(","))

        def f(bw=bw, bc=bc, warps=warps, imgs=imgs):
            return tr.wgrad_cols(xd, dyd, 5, bw=bw, bc=bc, imgs=imgs, warps=warps)

        gw = f().reshape(5, 5, c).permute(2, 0, 1)
        err = float((gw - ref_dw[:, 0].float()).abs().max() / ref_dw.float().abs().max())
        ms = _bench(f)
        add("cols_wgrad", cfg, ms, f"rel err {err:.1e}")
        if best_w is None or ms < best_w[0]:
            best_w = (ms, f)
    report(args.out, gpu_env(), f"{'impl':10} {'config':10} {'ms':>8} {'TFMA/s':>8}  check", lines, rows,
           note="depthwise 5x5, B=128 C=96 56x56 bf16 channels-last; cols: BW,BC,warps[,images]")
    if args.profile:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        F.conv2d(x, wt, None, padding=2, groups=c)
        conv_bwd(dy, x, wt, None, [1, 1], [2, 2], [1, 1], False, [0, 0], c, [False, True, False])
        best_f[1]()
        best_w[1]()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
