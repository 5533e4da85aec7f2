"""The fused WTConv compiled under autocast gives what it gives in eager mode under autocast.

The two modes take different routes through ``wtconv2d_triton``: in eager mode an autograd Function, under
``torch.compile`` a custom op that receives the float32 parameters with the autocast dtype as an argument. In both
the kernels round the parameters to that dtype and their gradients through it (Inductor would launch a cast kernel
per parameter and per gradient otherwise: it does not fuse casts into user kernels). Both must give the same output
and the same gradients, bit for bit; a compiled path that dropped the dtype would compute with unrounded float32
weights and return float32 gradients that never went through the autocast dtype.

``torch.compile`` runs with the ``aot_eager`` backend: it traces the op's compiled branch and its autograd exactly as
Inductor does, without compiling C++ on a CPU-only machine (the custom op is opaque to Inductor either way). On the
CPU the kernels run under Triton's interpreter (switched on by conftest), on a small layer.
"""

from __future__ import annotations

import pytest
import torch

from wtconvnext import WTConv2d

pytestmark = pytest.mark.triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.bfloat16] + ([torch.float16] if DEVICE == "cuda" else [])


def _layer(c: int, k: int, levels: int) -> WTConv2d:
    """A layer with every parameter random and of both signs (scales far from 1), so no rounding hides."""
    layer = WTConv2d(c, c, kernel_size=k, wt_levels=levels, backend="triton").to(DEVICE)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.empty(p.shape).uniform_(-1.0, 1.0, generator=g))
        layer.base_scale.mul_(2.0)
        layer.wavelet_scale.mul_(2.0)
    return layer


def _forward_backward(fn, layer: WTConv2d, x: torch.Tensor, dy: torch.Tensor, dtype: torch.dtype):
    """Output, input gradient and parameter gradients of ``sum(fn(x) * dy)`` under autocast."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    with torch.autocast(DEVICE, dtype=dtype):
        y = fn(x)
    (y.float() * dy).sum().backward()
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in layer.named_parameters()}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_compiled_under_autocast_matches_eager(dtype: torch.dtype, channels_last: bool) -> None:
    torch._dynamo.reset()
    layer = _layer(c=4, k=3, levels=2)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 11, 10, generator=g).to(DEVICE)
    dy = torch.randn(2, 4, 11, 10, generator=g).to(DEVICE)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)

    eager = _forward_backward(layer, layer, x, dy, dtype)
    compiled = _forward_backward(torch.compile(layer, fullgraph=True, backend="aot_eager"), layer, x, dy, dtype)

    (y_e, dx_e, grads_e), (y_c, dx_c, grads_c) = eager, compiled
    assert y_e.dtype == y_c.dtype == dtype
    assert y_c.is_contiguous(memory_format=torch.channels_last) == channels_last
    assert torch.equal(y_c, y_e), f"output: max diff {(y_c.float() - y_e.float()).abs().max().item():.3g}"
    assert dx_c.dtype == dx_e.dtype == torch.float32
    assert torch.equal(dx_c, dx_e), f"dx: max diff {(dx_c - dx_e).abs().max().item():.3g}"
    for name, grad in grads_e.items():
        assert grad.dtype == grads_c[name].dtype == torch.float32, name
        assert torch.equal(grads_c[name], grad), \
            f"{name}: max diff {(grads_c[name] - grad).abs().max().item():.3g}"
    # Autocast really was in force: the same layer outside it computes in float32 and differs.
    with torch.no_grad():
        y_fp32 = layer(x)
    assert y_fp32.dtype == torch.float32 and not torch.equal(y_fp32.to(dtype), y_e)


def test_compiled_graph_hands_the_parameters_uncast_to_the_op() -> None:
    """Under autocast the compiled graph calls the op on the float32 parameters with the autocast dtype: no cast of a
    parameter in the graph (each would be a kernel launch of its own, and its gradient's cast another)."""
    torch._dynamo.reset()
    layer = _layer(c=4, k=3, levels=2)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.randn(2, 4, 9, 8).to(DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        torch.compile(layer, fullgraph=True, backend=record)(x)
    (gm,) = graphs
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and "wtconvnext" in str(n.target)]
    assert len(calls) == 1, [str(n.target) for n in gm.graph.nodes]
    op_args = calls[0].args
    assert op_args[-1] == torch.bfloat16  # round_to
    for arg in op_args[1:6]:  # weight, bias, base_scale, wavelet_weight, wavelet_scale
        assert arg is None or arg.op in ("placeholder", "get_attr"), arg.format_node()
    casts = [n for n in gm.graph.nodes if n.op == "call_method" and n.target in ("to", "type")]
    assert len(casts) == 1 and casts[0] is op_args[0], [n.format_node() for n in casts]  # x's own cast only


def test_compiled_layer_keeps_sizes_symbolic_across_the_small_map_threshold(monkeypatch) -> None:
    """Multi-scale compiled training (issue 15): once a second size has made the sizes dynamic, a third that crosses
    ``TUNING["small_max"]`` (another kernel path inside the op) reuses that graph, as a depthwise convolution's
    does: nothing in the op's Python path guards on the sizes, so a model recompiles no more than ConvNeXt. The
    op's whole launch logic runs, its kernels do not (what they compute is other tests' business: under the
    interpreter they were nearly all of this test's 100-180 s)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from wtconvnext.ops import launch_plan
    from wtconvnext.ops import triton_kernels as tk

    monkeypatch.setattr(tk, "_launch", lambda *args, **kwargs: None)
    monkeypatch.setattr(launch_plan, "ENABLED", False)  # no plan recorded around the stubbed launches

    sizes = (20, 24, 12)  # 20, 24: the multi-launch passes; 12 the one-launch small-map pass
    assert min(sizes) <= tk.TUNING["small_max"] < max(sizes)
    counts = {}
    for name, module in (("wtconv", _layer(c=2, k=3, levels=2)),
                         ("depthwise", torch.nn.Conv2d(2, 2, 3, padding=1, groups=2).to(DEVICE))):
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(module, backend=counter)
        for s in sizes:
            x = torch.randn(1, 2, s, s, device=DEVICE).requires_grad_()
            compiled(x).sum().backward()
        counts[name] = counter.frame_count
    assert counts["wtconv"] == counts["depthwise"] == 2, counts
