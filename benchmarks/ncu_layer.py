"""One fused WTConv forward + backward inside cudaProfilerStart/Stop, for Nsight Compute.

    ncu --clock-control none --profile-from-start off --kernel-name regex:"_wgrad_kernel|_conv_kernel" \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section InstructionStats \\
        python benchmarks/ncu_layer.py [--stage 0] [--dtype bf16]

The layer runs three times first (compiles the kernels outside the profiled range). ``--stage`` picks a WTConvNeXt-T
stage shape of ``bench_layer.SHAPES`` (B=128), channels_last input. ``--impl dw7`` / ``dw5`` profiles cuDNN's depthwise
convolution of the same shape instead (its kernels' names differ: drop ``--kernel-name``), so that the same metrics
compare the two side by side.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_layer import DTYPES, SHAPES  # noqa: E402
from benchmarks.common import wtconv_inputs  # noqa: E402
from wtconvnext.ops import wtconv2d  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", type=int, default=0, choices=range(len(SHAPES)))
    ap.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    ap.add_argument("--impl", default="wtconv", choices=["wtconv", "dw7", "dw5"])
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("ncu_layer.py needs a CUDA GPU", file=sys.stderr)
        return 2
    b, c, h, w, levels = SHAPES[args.stage]
    x, _, params = wtconv_inputs(b, c, h, w, levels, DTYPES[args.dtype])
    x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    for p in params:
        p.requires_grad_()

    k = {"dw7": 7, "dw5": 5}.get(args.impl, 0)
    if k:
        torch.backends.cudnn.benchmark = True
        dw = torch.randn(c, 1, k, k, device=x.device, dtype=x.dtype, requires_grad=True)
        db = torch.zeros(c, device=x.device, dtype=x.dtype, requires_grad=True)

    def step() -> None:
        if k:
            y = torch.nn.functional.conv2d(x, dw, db, padding=k // 2, groups=c)
        else:
            y = wtconv2d(x, *params, stride=1, backend="triton")
        y.backward(torch.ones_like(y))

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
