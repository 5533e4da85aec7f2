"""The memo of torch's kernel analysis (``wtconvnext/ops/ttir_memo.py``): its key tells apart exactly what the TTIR
depends on, and a compiled WTConv traces to the same functional graph with it as without it, analysing each kernel
configuration once.

It runs in a subprocess: the kernels must be real ``JITFunction``s, decorated without TRITON_INTERPRET (which conftest
sets for the CPU tests). Without a GPU, the CUDA tensors are fake and Triton targets an sm_90 GPU.
"""

from __future__ import annotations

import json
import operator
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def _key_checks() -> dict:
    import torch
    import triton
    import triton.language as tl

    from wtconvnext.ops import triton_kernels as tk
    from wtconvnext.ops.ttir_memo import launch_key

    fn = tk._conv_kernel
    consts = {p.name for p in fn.params if p.is_constexpr}
    base = {n: (torch.empty(2, dtype=torch.bfloat16) if n.endswith("_ptr") else (3 if n in consts else 7))
            for n in fn.arg_names}

    def key(**changes):
        return launch_key(fn, {**base, **changes})

    @triton.jit
    def foreign(x_ptr, N: tl.constexpr):  # not this package's: never memoised
        tl.store(x_ptr, N)

    tuned = triton.autotune(configs=[triton.Config({}, num_warps=4)], key=[])(fn)
    return {
        "int_value_ignored": key(H=9) == key(H=7),
        "int_one_kept": key(H=1) != key(H=7),
        "int_mult16_kept": key(H=32) != key(H=7),
        "int_width_kept": key(H=2**40) != key(H=7),
        "constexpr_kept": key(BW=4) != key(BW=3),
        "dtype_kept": key(x_ptr=torch.empty(2)) != key(),
        "none_kept": key(b_ptr=None) != key(),
        "launch_options_ignored": launch_key(fn, {**base, "num_warps": 8}) is not None,
        "missing_arg_not_memoised": launch_key(fn, {k: v for k, v in base.items() if k != "H"}) is None,
        "autotuner_same_key": launch_key(tuned, base) == key(),
        "foreign_not_memoised": launch_key(foreign, {"x_ptr": base["x_ptr"], "N": 1}) is None,
    }


def _trace_checks() -> dict:
    import torch
    import torch._higher_order_ops.triton_kernel_wrap as tkw
    from torch._functorch.aot_autograd import aot_export_module
    from torch._subclasses.fake_tensor import FakeTensorMode

    from wtconvnext.layers import WTConv2d
    from wtconvnext.ops import ttir_memo, wtconv_triton

    assert wtconv_triton.TRITON_OP_AVAILABLE, "torch.library.triton_op is unavailable"
    names = ttir_memo.install()
    layer = WTConv2d(64, 64, kernel_size=5, wt_levels=3)

    class Fwd(torch.nn.Module):
        def forward(self, *a):
            return torch.ops.wtconvnext.wtconv2d_traced(*a, 1)

    class Bwd(torch.nn.Module):
        def forward(self, dy, *a):
            return torch.ops.wtconvnext.wtconv2d_traced_backward(dy, *a, 1)

    def trace() -> str:
        with FakeTensorMode():
            x = torch.empty(2, 64, 20, 20, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
            params = tuple(torch.empty(p.shape, device="cuda") for p in layer.parameters())
            codes = [aot_export_module(Fwd(), (x,) + params, trace_joint=False)[0].code,
                     aot_export_module(Bwd(), (x, x) + params, trace_joint=False)[0].code]
        # Side-table indices grow with every trace; the graphs must agree on everything else.
        return re.sub(r"(kernel_idx|constant_args_idx) = \d+", r"\1 = N", "\n".join(codes))

    real = {n: getattr(tkw, n).__wrapped__ for n in names}
    memoised = {n: getattr(tkw, n) for n in names}
    for n, f in real.items():
        setattr(tkw, n, f)
    try:
        plain = trace()
    finally:
        for n, f in memoised.items():
            setattr(tkw, n, f)
    analysis = memoised[names[0]]
    cold = trace()
    misses, hits = analysis.misses, analysis.hits
    warm = trace()
    return {
        "memoised": names,
        "kernels": plain.count("higher_order.triton_kernel_wrapper_functional("),
        "cold_equals_plain": cold == plain,
        "warm_equals_plain": warm == plain,
        "cold_misses": misses,
        "cold_hits": hits,
        "warm_misses": analysis.misses - misses,
        "warm_hits": analysis.hits - hits,
    }


def _graph_checks() -> dict:
    """What the traced ops put into a compiled graph under autocast (fp32 parameters, bf16 input): the forward with
    the autocast dtype, the backward with the forward's folded kernels."""
    import torch
    from torch._functorch.aot_autograd import aot_export_module
    from torch._subclasses.fake_tensor import FakeTensorMode

    from wtconvnext.layers import WTConv2d

    layer = WTConv2d(64, 64, kernel_size=5, wt_levels=3)

    class Fwd(torch.nn.Module):
        def forward(self, *a):
            return torch.ops.wtconvnext.wtconv2d_traced(*a, 1, torch.bfloat16)

    class Bwd(torch.nn.Module):
        def forward(self, dy, x, *a):
            *params, base_w, level_w = a
            return torch.ops.wtconvnext.wtconv2d_traced_backward(dy, x, *params, 1, torch.bfloat16, base_w, level_w)

    with FakeTensorMode():
        x = torch.empty(2, 64, 20, 20, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        params = tuple(torch.empty(p.shape, device="cuda") for p in layer.parameters())
        fwd = aot_export_module(Fwd(), (x,) + params, trace_joint=False)[0]
        y, base_w, level_w = Fwd()(x, *params)
        bwd = aot_export_module(Bwd(), (x, x) + params + (base_w, level_w), trace_joint=False)[0]

    def targets(gm) -> list:
        return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]

    def kernels(gm) -> list:
        return [n.kwargs["kernel_idx"] for n in gm.graph.nodes if "triton_kernel_wrapper" in str(n.target)]

    def channels_last_empties(gm) -> int:
        return sum(n.kwargs.get("memory_format") == torch.channels_last for n in gm.graph.nodes
                   if n.op == "call_function")

    def written_origins(gm) -> list:
        """The op that made each tensor a kernel writes, followed back through earlier kernels' outputs."""
        found = []
        for n in gm.graph.nodes:
            if "triton_kernel_wrapper_functional" not in str(n.target):
                continue
            for name in n.kwargs["tensors_to_clone"]:
                src = n.kwargs["kwargs"][name]
                while src.target is operator.getitem and "triton_kernel_wrapper" in str(src.args[0].target):
                    src = src.args[0].kwargs["kwargs"][src.args[1]]
                val = src.meta["val"]
                found.append((str(src.target) if src.op == "call_function" else src.op,
                              val.dim() == 4 and val.numel() >= x.numel()))
        return found

    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    written = written_origins(fwd) + written_origins(bwd)
    names = {g: [kernel_side_table.get_kernel(i).fn.__name__ for i in kernels(gm)] for g, gm in (("fwd", fwd),
                                                                                              ("bwd", bwd))}
    return {
        "casts": sum("convert_element_type" in t or "_to_copy" in t for g in (fwd, bwd) for t in targets(g)),
        "channels_last_empties": channels_last_empties(fwd) + channels_last_empties(bwd),
        "written_origins": sorted({o for o, _ in written}),
        # written 4-D maps of at least the layer's size (the gradient of the 4-D weight is small)
        "written_4d_maps": sum(m for _, m in written),
        "fwd_kernels": names["fwd"],
        "bwd_kernels": names["bwd"],
    }


@pytest.fixture(scope="module")
def checks() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_key_tells_apart_what_the_ttir_depends_on(checks):
    assert checks["keys"] == {k: True for k in checks["keys"]}


def test_compiled_graph_is_the_same_with_the_memo_and_analysed_once(checks):
    t = checks["trace"]
    assert t["memoised"][0] in ("identify_accessed_tensors", "identify_mutated_tensors"), t
    assert t["kernels"] >= 10, t  # forward and backward launches, each one functional node
    assert t["cold_equals_plain"] and t["warm_equals_plain"], t
    assert 0 < t["cold_misses"] < t["kernels"], t  # launch sites of one configuration share one analysis
    assert t["cold_hits"] > 0, t
    assert t["warm_misses"] == 0 and t["warm_hits"] >= t["kernels"], t


def test_traced_graph_casts_nothing_and_kernels_write_plain_allocations(checks):
    """Under autocast the parameters enter the kernels uncast (the kernels round them and their gradients: Inductor
    would launch a cast kernel for each). Every buffer a kernel writes is a flat or small ``aten.empty`` (or an
    earlier kernel's output), never a view, never ``empty_strided``, never a 4-D map: Inductor copies into a written
    buffer that is a permuted view (session 35), equal empty_strided calls that torch 2.11's CSE merges, or a 4-D map
    its layout optimisation relays channels-last (session 36, on the H100), a full-size copy per layer output or
    input gradient. The backward takes the forward's folded kernels instead of folding again."""
    g = checks["graph"]
    assert g["casts"] == 0 and g["channels_last_empties"] == 0, g
    assert g["written_origins"] == ["aten.empty.memory_format"], g
    assert g["written_4d_maps"] == 0, g
    assert g["fwd_kernels"][0] == "_fold_kernel" and "_fold_kernel" not in g["bwd_kernels"], g
    assert "_param_grads_kernel" in g["bwd_kernels"], g


if __name__ == "__main__":
    import torch

    if not torch.cuda.is_available():
        import triton.runtime as rt
        from triton.backends.compiler import GPUTarget

        class _Sm90:  # what torch's TTIR generation asks of the active driver
            def get_current_target(self):
                return GPUTarget("cuda", 90, 32)

            def get_current_device(self):
                return 0

        rt.driver.set_active(_Sm90())
    print(json.dumps({"keys": _key_checks(), "trace": _trace_checks(), "graph": _graph_checks()}))
