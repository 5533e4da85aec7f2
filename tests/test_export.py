"""Deployment: TorchScript, torch.export and ONNX (legacy and dynamo exporters) with dynamic batch and image size.

Every capture runs the pure-PyTorch reference math (plain convolutions); the exported graphs are checked against the
eager model at another batch size and at sizes other than the export's, odd ones included, and the ONNX files in
onnxruntime. One export of ``wtconvnext_atto`` per exporter (module fixtures), built with one block per stage (every
stage's layer, with its own level count; tracing time grows with the block count, CI time): torch.export ~15 s, the
dynamo ONNX exporter on top of it ~60 s, the legacy one ~5 s on two CPU cores (with atto's 2-2-6-2 blocks).
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import pytest
import timm
import torch
from torch import nn
from torch.export import Dim

from wtconvnext import WTConv2d
from wtconvnext.ops import wtconv as wtconv_ops

# torch.jit.script / trace are deprecated in favour of torch.export: timm's users still script models.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:FutureWarning")

onnx = pytest.importorskip("onnx", reason="the export extra (pip install -e '.[export]') is not installed")
ort = pytest.importorskip("onnxruntime", reason="the export extra (pip install -e '.[export]') is not installed")

EXPORT_INPUT = (2, 3, 64, 64)
# (batch, 3, H, W) other than the export's: another batch, odd and non-square sizes, the canonical 224.
RUN_INPUTS = [(3, 3, 96, 80), (3, 3, 67, 45 + 64), (5, 3, 224, 224)]
DYNAMIC = ({0: Dim.AUTO, 2: Dim.AUTO, 3: Dim.AUTO},)
ONNX_TOL = 1e-4


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(0)
    m = timm.create_model("wtconvnext_atto", depths=(1, 1, 1, 1)).eval()
    with torch.no_grad():  # scales away from their init values, so every branch of the layer carries weight
        for layer in m.modules():
            if isinstance(layer, WTConv2d):
                layer.wavelet_scale.uniform_(0.5, 1.5)
                layer.base_scale.uniform_(0.5, 1.5)
    return m


@pytest.fixture(scope="module")
def exported(model: nn.Module) -> torch.export.ExportedProgram:
    torch.manual_seed(1)
    return torch.export.export(model, (torch.randn(EXPORT_INPUT),), dynamic_shapes=DYNAMIC)


def _inputs() -> list[torch.Tensor]:
    torch.manual_seed(2)
    return [torch.randn(shape) for shape in RUN_INPUTS]


def _onnx_session(path: Path) -> "ort.InferenceSession":
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _check_onnx_file(path: Path, model: nn.Module) -> None:
    graph = onnx.load(str(path)).graph
    # Plain ONNX operators only (no custom domain), and the WTConv branches are there as convolutions.
    ops = {(n.domain or "ai.onnx", n.op_type) for n in graph.node}
    assert {d for d, _ in ops} == {"ai.onnx"}, sorted(ops)
    assert {"Conv", "ConvTranspose"} <= {op for _, op in ops}
    session = _onnx_session(path)
    name = session.get_inputs()[0].name
    for x in _inputs():
        with torch.no_grad():
            expected = model(x)
        (actual,) = session.run(None, {name: x.numpy()})
        assert actual.shape == tuple(expected.shape)
        torch.testing.assert_close(torch.from_numpy(actual), expected, rtol=0, atol=ONNX_TOL)


# ----------------------------------------------------------------------------------------------------------------
# TorchScript
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, kwargs", [("wtconvnext_atto", {}), ("test_wtconvnext", dict(conv_mlp=True))])
def test_torchscript_matches_eager(name: str, kwargs: dict, model: nn.Module) -> None:
    m = model if name == "wtconvnext_atto" else timm.create_model(name, **kwargs).eval()
    scripted = torch.jit.script(m)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    for x in _inputs()[:2]:
        with torch.no_grad():
            expected = m(x)
            torch.testing.assert_close(scripted(x), expected, rtol=0, atol=1e-6)
            torch.testing.assert_close(loaded(x), expected, rtol=0, atol=1e-6)


def test_torchscript_layer_gradients_match_eager() -> None:
    layer = WTConv2d(5, 5, kernel_size=3, wt_levels=3).double()
    scripted = torch.jit.script(layer)
    x = torch.randn(2, 5, 13, 9, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(layer(x).square().sum(), x)
    (gs,) = torch.autograd.grad(scripted(x).square().sum(), x)
    torch.testing.assert_close(gs, gx, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# torch.export
# ----------------------------------------------------------------------------------------------------------------


def test_torch_export_runs_at_other_batch_and_sizes(model: nn.Module, exported: torch.export.ExportedProgram) -> None:
    program = exported.module()
    for x in _inputs():
        with torch.no_grad():
            torch.testing.assert_close(program(x), model(x), rtol=0, atol=1e-5)


def test_torch_export_constrains_sizes_no_more_than_timm_convnext(exported: torch.export.ExportedProgram) -> None:
    """The only size constraint of the exported WTConvNeXt is ConvNeXt's own (every stage at least 2 x 2 in)."""
    convnext = torch.export.export(
        timm.create_model("convnext_atto").eval(), (torch.randn(EXPORT_INPUT),), dynamic_shapes=DYNAMIC
    )

    def bounds(ep: torch.export.ExportedProgram) -> list[tuple[int, int]]:
        x = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == "x")
        return [(ep.range_constraints[s.node.expr].lower, ep.range_constraints[s.node.expr].upper)
                for s in x.meta["val"].shape if isinstance(s, torch.SymInt)]

    assert len(bounds(exported)) == 3  # batch, height, width all symbolic
    assert bounds(exported) == bounds(convnext)


@pytest.mark.parametrize("levels", [1, 5])
def test_exported_layer_holds_for_every_size(levels: int) -> None:
    """WTConv2d exported at 16 x 16 (5 levels: the last level is 1 x 1 there) is exact at any size >= 2."""
    torch.manual_seed(0)
    layer = WTConv2d(3, 3, kernel_size=3, wt_levels=levels).double().eval()
    with torch.no_grad():
        layer.wavelet_scale.uniform_(0.5, 1.5)
    ep = torch.export.export(layer, (torch.randn(2, 3, 16, 16, dtype=torch.float64),), dynamic_shapes=DYNAMIC)
    program = ep.module()
    for h, w in [(2, 2), (2, 3), (3, 17), (5, 8), (7, 7), (9, 33), (15, 2), (16, 16), (17, 31), (33, 40), (64, 65)]:
        x = torch.randn(3, 3, h, w, dtype=torch.float64)
        assert torch.equal(program(x), layer(x)), (h, w)


def test_captures_take_the_reference_path() -> None:
    """Under torch.export and the legacy ONNX exporter's tracer the 'auto' backend resolves to the reference."""
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append(wtconv_ops._exporting())
            return x + 1

    Probe()(torch.zeros(1))
    assert seen == [False]
    seen.clear()
    torch.export.export(Probe(), (torch.zeros(2),))
    assert seen and all(seen)
    seen.clear()
    torch.jit.trace(Probe(), (torch.zeros(2),), check_trace=False)
    assert seen == [True]


def test_compiled_code_is_not_taken_for_an_export(monkeypatch) -> None:
    """Inside a compiled function torch 2.11's dynamo folds ``torch.compiler.is_exporting()`` to True (pytorch
    issue 176347, fixed in 2.12): the backend choice must not rest on it, or every torch.compile'd WTConv on a GPU
    falls back to the reference. The stand-in below answers as 2.11's dynamo does."""
    real = torch.compiler.is_exporting
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: torch.compiler.is_compiling() or real())
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x + 1 if wtconv_ops._exporting() else x - 1, backend="eager", fullgraph=True)
    assert torch.equal(fn(torch.zeros(2)), -torch.ones(2))
    torch._dynamo.reset()
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append(wtconv_ops._exporting())
            return x + 1

    torch.export.export(Probe(), (torch.zeros(2),))
    assert seen and all(seen)


# ----------------------------------------------------------------------------------------------------------------
# ONNX
# ----------------------------------------------------------------------------------------------------------------


def test_onnx_legacy_exporter_dynamic_batch_and_size(model: nn.Module, tmp_path: Path) -> None:
    path = tmp_path / "wtconvnext_atto.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript-based exporter is deprecated
        warnings.simplefilter("error", torch.jit.TracerWarning)  # nothing of the model may be baked into the trace
        torch.onnx.export(
            model, (torch.randn(EXPORT_INPUT),), str(path), dynamo=False, input_names=["x"], output_names=["logits"],
            dynamic_axes={"x": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}},
        )
    _check_onnx_file(path, model)


def test_onnx_through_timm_onnx_export(model: nn.Module, tmp_path: Path) -> None:
    from timm.utils.onnx import onnx_export

    path = tmp_path / "timm_export.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        onnx_export(model, str(path), example_input=torch.randn(EXPORT_INPUT), dynamic_size=True, check_forward=True)
    _check_onnx_file(path, model)


def test_onnx_dynamo_exporter_dynamic_batch_and_size(
    model: nn.Module, exported: torch.export.ExportedProgram, tmp_path: Path
) -> None:
    # torch.onnx.export(model, (x,), dynamo=True, dynamic_shapes=...) exports the model this way first; handing it
    # the program saves a second torch.export here.
    path = tmp_path / "wtconvnext_atto_dynamo.onnx"
    program = torch.onnx.export(exported, dynamo=True)
    program.save(str(path))
    inputs = onnx.load(str(path)).graph.input
    assert [d.dim_param != "" for d in inputs[0].type.tensor_type.shape.dim] == [True, False, True, True]
    _check_onnx_file(path, model)
