"""The checkpoint converter (``wtconvnext.convert``): folding, layouts, variant inference, loading, failures.

The golden model (a small config no registered variant has) goes through the command line and comes back through
timm's pretrained path; full-size tiny / small / base checkpoints in the reference layout are built here from
``reference_state_dict_keys.json`` with random, far-from-default values (scales in +-[0.5, 2]) so that folding
visibly changes every WTConv weight. The CLI runs in-process through ``main(argv)``; one test runs the module as
a subprocess to prove the entry point.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import subprocess
import sys
from hashlib import sha256
from pathlib import Path
from typing import Any, Optional

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

import wtconvnext.checkpoint
import wtconvnext.convert as convert
from conftest import GOLDEN, GOLDEN_INDEX, rel_err
from wtconvnext import WTConv2d, checkpoint_filter_fn, unwrap_checkpoint
from wtconvnext.convert import (
    ConversionError,
    convert_checkpoint,
    create_model_from_converted,
    fold_scales,
    main,
    select_state_dict,
)

CASE = GOLDEN_INDEX["models"][0]
GOLDEN_CKPT = GOLDEN / CASE["checkpoint"]
GOLDEN_KWARGS: dict[str, Any] = CASE["kwargs"]  # depths, dims, num_classes
ARCH_KWARGS = {k: v for k, v in GOLDEN_KWARGS.items() if k != "num_classes"}
# The golden config is no registered variant: the entry point named here only supplies the defaults it overrides.
GOLDEN_MODEL_ARGS = ["--model", "wtconvnext_tiny", "--model-kwargs", json.dumps(ARCH_KWARGS)]
# What the converter reads off the golden tensors: the index's kwargs plus the levels and kernel size they show.
INFERRED_KWARGS = {**ARCH_KWARGS, "wt_levels": [5, 4, 3, 2], "kernel_sizes": 5}
GOLDEN_HINT = f"--model wtconvnext_tiny --model-kwargs '{json.dumps(INFERRED_KWARGS)}'"
REFERENCE_KEYS: dict[str, dict[str, list[int]]] = json.loads((GOLDEN / "reference_state_dict_keys.json").read_text())
TOL = 1e-5


# ----------------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def golden_ckpt() -> dict[str, Any]:
    return torch.load(GOLDEN_CKPT, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def golden_io() -> dict[str, Tensor]:
    return load_file(GOLDEN / CASE["io"])


def run_cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def listing(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


def assert_clean_failure(
    rc: int, err: str, directory: Path, before: set[str], *fragments: str, code: int = 2
) -> None:
    """One error line, no traceback, the expected exit code, and nothing new (output or temp file) on disk."""
    assert rc == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wtconvnext-convert: error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert listing(directory) == before, f"left behind: {listing(directory) - before}"


def load_golden_model(path: Path) -> torch.nn.Module:
    """The documented loading call for the golden config (pretrained path, so checkpoint_filter_fn runs)."""
    overlay = dict(file=str(path), num_classes=GOLDEN_KWARGS["num_classes"])
    return timm.create_model("wtconvnext_tiny", pretrained=True, pretrained_cfg_overlay=overlay, **GOLDEN_KWARGS)


def check_against_golden(model: torch.nn.Module, io: dict[str, Tensor], logit_shift: float = 0.0) -> None:
    model = model.float().eval()
    x = io["x"].float()
    with torch.no_grad():
        features = model.forward_features(x)
        logits = model.forward_head(features)
    assert rel_err(features, io["features"]) <= TOL
    assert rel_err(logits, io["logits"] + logit_shift) <= TOL


def random_reference_state_dict(shapes: dict[str, list[int]], seed: int) -> dict[str, Tensor]:
    """A reference-layout state dict with non-trivial values for every key: scales far from 1 with random signs,
    layer scales far from 1e-6, LayerNorm affines away from identity, weights at 1/sqrt(fan_in)."""
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, Tensor] = {}
    for key, shape in shapes.items():
        if key.endswith(("wt_filter", "iwt_filter")):
            value = torch.full(shape, 0.5)  # ignored by the loader (the transform is exact), but present
        elif ".base_scale." in key or ".wavelet_scale." in key:
            sign = torch.randint(0, 2, shape, generator=g) * 2 - 1
            value = torch.empty(shape).uniform_(0.5, 2.0, generator=g) * sign
        elif key.endswith("gamma"):
            value = torch.empty(shape).uniform_(0.1, 1.0, generator=g)
        elif len(shape) >= 2:
            fan_in = torch.Size(shape[1:]).numel()
            value = torch.randn(shape, generator=g) / fan_in**0.5
        else:  # biases and norm affines
            value = 0.1 * torch.randn(shape, generator=g) + (1.0 if key.endswith("weight") else 0.0)
        sd[key] = value
    return sd


_FUSED_RENAMES = [
    (re.compile(r"\.base_conv\.weight$"), ".base_weight"),
    (re.compile(r"\.base_conv\.bias$"), ".base_bias"),
    (re.compile(r"\.base_scale\.weight$"), ".base_scale"),
    (re.compile(r"\.wavelet_convs\.(\d+)\.weight$"), r".wt_weights.\1"),
    (re.compile(r"\.wavelet_scale\.(\d+)\.weight$"), r".wt_scales.\1"),
]


def to_fused_layout(reference_sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """The same weights under the fused backends' names (spec), without the filter tensors."""
    out = {}
    for key, value in reference_sd.items():
        if key.endswith(("wt_filter", "iwt_filter")):
            continue
        for pattern, repl in _FUSED_RENAMES:
            key = pattern.sub(repl, key)
        out[key] = value
    return out


def read_metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata())


def assert_same_tensors(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


# ----------------------------------------------------------------------------------------------------------------
# fold_scales
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias,stride", [(True, 1), (False, 2)])
def test_fold_scales_preserves_layer_output(bias: bool, stride: int) -> None:
    layer = WTConv2d(6, 6, kernel_size=5, stride=stride, bias=bias, wt_levels=3, backend="reference").double()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
        layer.base_scale.uniform_(0.5, 2.0).mul_(torch.randint(0, 2, layer.base_scale.shape) * 2 - 1)
        layer.wavelet_scale.uniform_(0.5, 2.0).mul_(torch.randint(0, 2, layer.wavelet_scale.shape) * 2 - 1)
    folded_layer = WTConv2d(6, 6, kernel_size=5, stride=stride, bias=bias, wt_levels=3, backend="reference").double()
    folded_layer.load_state_dict(fold_scales(layer.state_dict()), strict=True)
    x = torch.randn(2, 6, 23, 17, dtype=torch.float64)
    with torch.no_grad():
        assert rel_err(folded_layer(x), layer(x)) <= 1e-12
    assert torch.equal(folded_layer.base_scale, torch.ones(6, dtype=torch.float64))
    assert torch.equal(folded_layer.wavelet_scale, torch.ones(3, 6, 4, dtype=torch.float64))
    assert not torch.allclose(folded_layer.weight, layer.weight)


def test_fold_scales_is_pure_idempotent_and_keeps_dtype() -> None:
    sd = {
        "a.conv_dw.weight": torch.randn(3, 1, 5, 5),
        "a.conv_dw.bias": torch.randn(3),
        "a.conv_dw.base_scale": torch.tensor([2.0, -0.5, 1.5]),
        "a.conv_dw.wavelet_weight": torch.randn(2, 3, 4, 5, 5),
        "a.conv_dw.wavelet_scale": torch.randn(2, 3, 4),
        "a.norm.weight": torch.randn(3),
    }
    sd16 = {k: v.half() for k, v in sd.items()}
    copies = {k: v.clone() for k, v in sd.items()}
    folded = fold_scales(sd)
    assert_same_tensors(sd, copies)  # input untouched
    assert folded["a.norm.weight"] is sd["a.norm.weight"]  # other keys pass through
    p = "a.conv_dw."
    torch.testing.assert_close(folded[p + "weight"], sd[p + "weight"] * sd[p + "base_scale"].view(3, 1, 1, 1))
    torch.testing.assert_close(folded[p + "bias"], sd[p + "bias"] * sd[p + "base_scale"])
    torch.testing.assert_close(
        folded[p + "wavelet_weight"], sd[p + "wavelet_weight"] * sd[p + "wavelet_scale"][..., None, None]
    )
    assert_same_tensors(fold_scales(folded), folded)
    assert all(v.dtype == torch.float16 for v in fold_scales(sd16).values())


def test_fold_scales_rejects_incomplete_layer() -> None:
    sd = {
        "l.weight": torch.randn(3, 1, 5, 5),
        "l.wavelet_weight": torch.randn(1, 3, 4, 5, 5),
        "l.base_scale": torch.ones(3),
    }
    with pytest.raises(ValueError, match="l.wavelet_scale"):
        fold_scales(sd)
    sd["l.wavelet_scale"] = torch.ones(1, 3, 5)
    with pytest.raises(ValueError, match="do not fit"):
        fold_scales(sd)


# ----------------------------------------------------------------------------------------------------------------
# Golden model through the command line and timm's pretrained path
# ----------------------------------------------------------------------------------------------------------------


def test_golden_wrappers_hold_the_same_weights(golden_ckpt: dict[str, Any]) -> None:
    # The golden logits were computed from "exactly those float32 weights"; both wrappers hold the same ones, so
    # the golden output is the target for either choice (test_wrapper_choice tells the wrappers apart).
    assert_same_tensors(golden_ckpt["state_dict"], golden_ckpt["state_dict_ema"])


@pytest.mark.parametrize("no_ema", [False, True], ids=["ema", "no-ema"])
def test_golden_through_cli(
    no_ema: bool, tmp_path: Path, capsys: pytest.CaptureFixture, golden_ckpt: dict, golden_io: dict
) -> None:
    out = tmp_path / "golden.safetensors"
    rc, stdout, err = run_cli([GOLDEN_CKPT, out, *GOLDEN_MODEL_ARGS, *(["--no-ema"] if no_ema else [])], capsys)
    assert rc == 0, err
    assert err == ""
    meta = read_metadata(out)
    wrapper = "state_dict" if no_ema else "state_dict_ema"
    assert meta == {
        "format": "wtconvnext",
        "architecture": "wtconvnext_tiny",
        "model_kwargs": json.dumps(ARCH_KWARGS, sort_keys=True),
        "model_source": "arguments",
        "num_classes": "10",
        "folded": "true",
        "source_file": GOLDEN_CKPT.name,
        "source_sha256": sha256(GOLDEN_CKPT.read_bytes()).hexdigest(),
        "source_layout": "reference",
        "source_wrapper": wrapper,
        "ema": "false" if no_ema else "true",
        "converter_version": convert.CONVERTER_VERSION,
    }
    assert f"'{wrapper}'" in stdout
    tensors = load_file(out)
    src = golden_ckpt[wrapper]
    p = "stages.0.blocks.0.conv_dw."
    assert torch.equal(tensors[p + "base_scale"], torch.ones(16))
    assert torch.equal(tensors[p + "wavelet_scale"], torch.ones(5, 16, 4))
    base_scale = src[p + "base_scale.weight"].view(16, 1, 1, 1)
    torch.testing.assert_close(tensors[p + "weight"], src[p + "base_conv.weight"] * base_scale)
    check_against_golden(load_golden_model(out), golden_io)
    check_against_golden(create_model_from_converted(out), golden_io)
    # Native layout with every key: timm's checkpoint_path loading (which skips the filter) takes it as well.
    check_against_golden(timm.create_model("wtconvnext_tiny", checkpoint_path=str(out), **GOLDEN_KWARGS), golden_io)


def test_raw_golden_checkpoint_loads_through_timm(golden_io: dict) -> None:
    check_against_golden(load_golden_model(GOLDEN_CKPT), golden_io)


def test_wrapper_choice(tmp_path: Path, capsys: pytest.CaptureFixture, golden_ckpt: dict, golden_io: dict) -> None:
    # Raw weights = EMA weights with the classifier bias shifted by 1: the logits say which wrapper was taken.
    raw = dict(golden_ckpt["state_dict_ema"])
    raw["head.fc.bias"] = raw["head.fc.bias"] + 1.0
    src = tmp_path / "train.pth"
    torch.save({"epoch": 3, "arch": "x", "state_dict": raw, "state_dict_ema": golden_ckpt["state_dict_ema"]}, src)
    for flag, shift in (([], 0.0), (["--no-ema"], 1.0)):
        out = tmp_path / f"out{len(flag)}.safetensors"
        rc, _, err = run_cli([src, out, *GOLDEN_MODEL_ARGS, *flag], capsys)
        assert rc == 0, err
        check_against_golden(create_model_from_converted(out), golden_io, logit_shift=shift)


def test_prefixes_and_nested_wrappers(tmp_path: Path, golden_ckpt: dict) -> None:
    ema = golden_ckpt["state_dict_ema"]
    plain = tmp_path / "plain.safetensors"
    convert_checkpoint(GOLDEN_CKPT, plain, "wtconvnext_tiny", ARCH_KWARGS)
    wrapped = tmp_path / "wrapped.pth"
    torch.save(
        {
            "model_ema": {"module." + k: v for k, v in ema.items()},  # ModelEmaV2 / DDP
            "model": {"state_dict": {"module._orig_mod." + k: v for k, v in ema.items()}},  # DDP + torch.compile
        },
        wrapped,
    )
    meta = convert_checkpoint(wrapped, tmp_path / "a.safetensors", "wtconvnext_tiny", ARCH_KWARGS)
    assert (meta["source_wrapper"], meta["ema"]) == ("model_ema", "true")
    assert_same_tensors(load_file(tmp_path / "a.safetensors"), load_file(plain))
    meta = convert_checkpoint(wrapped, tmp_path / "b.safetensors", "wtconvnext_tiny", ARCH_KWARGS, prefer_ema=False)
    assert (meta["source_wrapper"], meta["ema"]) == ("model/state_dict", "false")
    assert_same_tensors(load_file(tmp_path / "b.safetensors"), load_file(plain))


@pytest.mark.parametrize("prefer_ema", [True, False])
def test_select_state_dict_agrees_with_loader(prefer_ema: bool, golden_ckpt: dict) -> None:
    # The converter and the model's loader must pick the same weights out of a training checkpoint.
    ckpt = dict(golden_ckpt, state_dict={k: v + 1 for k, v in golden_ckpt["state_dict"].items()})
    mine, _ = select_state_dict(ckpt, prefer_ema=prefer_ema)
    assert_same_tensors(mine, unwrap_checkpoint(ckpt, prefer_ema=prefer_ema))


# ----------------------------------------------------------------------------------------------------------------
# No flags needed: recorded, registered or read off the tensors
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["reference", "fused"])
def test_unregistered_configuration_needs_no_flags(
    layout: str, tmp_path: Path, capsys: pytest.CaptureFixture, golden_ckpt: dict, golden_io: dict
) -> None:
    src = GOLDEN_CKPT
    if layout == "fused":
        src = tmp_path / "fused.pth"
        torch.save(to_fused_layout(golden_ckpt["state_dict_ema"]), src)
    out = tmp_path / "out.safetensors"
    rc, stdout, err = run_cli([src, out, "--verify", "--image-size", "32"], capsys)
    assert rc == 0, err
    assert "(inferred from the tensors)" in stdout
    meta = read_metadata(out)
    assert (meta["architecture"], meta["model_source"], meta["source_layout"]) == (
        "wtconvnext_tiny", "inferred from the tensors", layout)
    assert json.loads(meta["model_kwargs"]) == INFERRED_KWARGS and meta["num_classes"] == "10"
    assert "data_config" not in meta  # a reference checkpoint records no preprocessing
    check_against_golden(create_model_from_converted(out), golden_io)


def test_mismatch_hint_is_complete(tmp_path: Path, capsys: pytest.CaptureFixture, golden_io: dict) -> None:
    """The configuration printed for a checkpoint that does not fit --model, followed as printed, converts it."""
    rc, _, err = run_cli([GOLDEN_CKPT, tmp_path / "a.safetensors", "--model", "wtconvnext_atto"], capsys)
    assert rc == 2
    m = re.search(r"--model (\S+) --model-kwargs '([^']+)'", err)
    assert m, err
    out = tmp_path / "b.safetensors"
    rc, _, err = run_cli([GOLDEN_CKPT, out, "--model", m.group(1), "--model-kwargs", m.group(2)], capsys)
    assert rc == 0, err
    check_against_golden(create_model_from_converted(out), golden_io)


def _small_model(seed: int) -> torch.nn.Module:
    """test_wtconvnext (GELU-tanh, LayerNorm eps 1e-5: nothing its tensors show) with 2 levels on the first stage."""
    torch.manual_seed(seed)
    model = timm.create_model("test_wtconvnext", num_classes=5, wt_levels=[2, 1, 1, 1])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("gamma", "_scale")):
                p.uniform_(0.5, 1.5)  # blocks that matter, scales far from 1
    return model.eval()


def test_train_checkpoint_records_model_and_data_config(tmp_path: Path) -> None:
    model = _small_model(0)
    # A run on the GPU records its backend; the converted file must not (it would not build on a CPU).
    args = {"model": "test_wtconvnext", "model_kwargs": {"wt_levels": [2, 1, 1, 1], "wtconv_backend": "triton"},
            "num_classes": 5, "img_size": 32, "input_size": None, "crop_pct": 1.0, "interpolation": "", "mean": None, "std": None,
            "crop_mode": None}
    data_config = {"input_size": [3, 32, 32], "interpolation": "bilinear", "mean": [0.5, 0.5, 0.5],
                   "std": [0.25, 0.25, 0.25], "crop_pct": 1.0, "crop_mode": "center"}
    src = tmp_path / "last.pth.tar"
    torch.save({"state_dict": model.state_dict(), "args": args, "data_config": data_config, "next_epoch": 3,
                "optimizer": {}}, src)
    out = tmp_path / "out.safetensors"
    meta = convert_checkpoint(src, out, verify=True, image_size=32)
    assert (meta["architecture"], meta["model_source"]) == ("test_wtconvnext", "train.py checkpoint")
    assert json.loads(meta["model_kwargs"]) == {"wt_levels": [2, 1, 1, 1]}
    assert json.loads(meta["data_config"]) == data_config

    converted = create_model_from_converted(out).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert rel_err(converted(x), model(x)) <= TOL
    # The record reaches timm's data config of the model built from the file.
    from timm.data import resolve_data_config

    resolved = resolve_data_config({}, model=converted)
    assert (resolved["input_size"], resolved["crop_pct"], resolved["interpolation"]) == ((3, 32, 32), 1.0, "bilinear")
    assert tuple(resolved["mean"]) == (0.5, 0.5, 0.5)

    # The same weights without the record look like a custom configuration on the reference defaults: the record
    # is what says which entry point (activation, norm epsilon) they belong to.
    torch.save(model.state_dict(), tmp_path / "flat.pth")
    meta = convert_checkpoint(tmp_path / "flat.pth", tmp_path / "flat.safetensors")
    assert (meta["architecture"], meta["model_source"]) == ("wtconvnext_tiny", "inferred from the tensors")


def test_timm_training_checkpoint_with_namespace_args(tmp_path: Path) -> None:
    """timm's train.py pickles its arguments as an argparse.Namespace: loaded (weights-only, allow-listed), used."""
    model = _small_model(1)
    args = argparse.Namespace(model="test_wtconvnext", model_kwargs={"wt_levels": [2, 1, 1, 1]}, num_classes=5,
                              img_size=None, input_size=[3, 48, 48], crop_pct=0.9, interpolation="bilinear",
                              mean=None, std=None, crop_mode=None, lr=0.1)
    src = tmp_path / "model_best.pth.tar"
    torch.save({"epoch": 7, "arch": "wtconvnext", "state_dict": model.state_dict(), "args": args}, src)
    meta = convert_checkpoint(src, tmp_path / "out.safetensors")
    assert (meta["architecture"], meta["model_source"]) == ("test_wtconvnext", "training checkpoint arguments")
    data = json.loads(meta["data_config"])
    assert (data["input_size"], data["crop_pct"], data["interpolation"]) == ([3, 48, 48], 0.9, "bilinear")
    assert data["mean"] == pytest.approx([0.485, 0.456, 0.406])  # unset in the run: the model's default, as it used


def test_recorded_model_that_does_not_fit_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = _small_model(2)
    src = tmp_path / "ckpt.pth"
    torch.save({"state_dict": model.state_dict(), "args": {"model": "test_wtconvnext"}, "next_epoch": 1}, src)
    before = listing(tmp_path)
    rc, _, err = run_cli([src, tmp_path / "out.safetensors"], capsys)
    assert_clean_failure(rc, err, tmp_path, before, "the train.py checkpoint names model test_wtconvnext",
                         "wavelet_weight (2, 24, 4, 5, 5) vs model (5, 24, 4, 5, 5)",
                         "configuration is --model test_wtconvnext --model-kwargs '{\"depths\": [1, 2, 4, 2], "
                         "\"dims\": [24, 32, 48, 64], \"wt_levels\": [2, 1, 1, 1], \"kernel_sizes\": 5}'",
                         "pass --model to override")
    rc, _, err = run_cli([src, tmp_path / "out.safetensors", "--model", "test_wtconvnext", "--model-kwargs",
                          '{"wt_levels": [2, 1, 1, 1]}'], capsys)
    assert rc == 0, err


@pytest.mark.parametrize("config", [
    dict(depths=(1, 2, 1, 1), dims=(8, 16, 24, 32), kernel_sizes=(3, 5, 7, 3), wt_levels=(0, 1, 2, 3), patch_size=2,
         mlp_ratio=3.0, conv_bias=False, in_chans=1, num_classes=7),
    dict(depths=(2, 1, 1), dims=(8, 16, 24), wt_levels=2, head_norm_first=True, norm_layer="rmsnorm", num_classes=5),
    dict(depths=(1, 1, 1, 1), dims=(8, 16, 24, 32), kernel_sizes=7, head_hidden_size=12, num_classes=0),
], ids=["per-stage", "three-stages", "hidden-head"])
def test_configuration_read_off_the_tensors_rebuilds_them(config: dict) -> None:
    """Every key and shape of a WTConvNeXt no registered variant has (built on the meta device) comes back."""
    with torch.device("meta"):
        model = timm.create_model("wtconvnext_tiny", **config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    name, kwargs, how = convert.infer_architecture(model.state_dict())
    assert (name, how) == (convert.CUSTOM_BASE, "inferred from the tensors")
    full = convert._build_kwargs(model.state_dict(), kwargs)
    assert full.get("in_chans", 3) == config.get("in_chans", 3) and full["num_classes"] == config["num_classes"]
    with torch.device("meta"):
        rebuilt = timm.create_model(name, **full)
    assert {k: tuple(v.shape) for k, v in rebuilt.state_dict().items()} == shapes


# ----------------------------------------------------------------------------------------------------------------
# Non-finite weights
# ----------------------------------------------------------------------------------------------------------------


def test_allow_nonfinite_converts_and_verifies(tmp_path: Path, capsys: pytest.CaptureFixture, golden_ckpt) -> None:
    src, _, _ = _write_bad_input("nonfinite", tmp_path, golden_ckpt)
    out = tmp_path / "out.safetensors"
    rc, stdout, err = run_cli([src, out, *GOLDEN_MODEL_ARGS, "--allow-nonfinite", "--verify"], capsys)
    assert rc == 0, err
    assert "warning: source tensor 'stem.0.bias' has non-finite values" in stdout
    tensors = load_file(out)
    assert torch.isnan(tensors["stages.1.blocks.0.mlp.fc1.weight"][3, 5])
    assert tensors["stem.0.bias"][0] == float("-inf")


# ----------------------------------------------------------------------------------------------------------------
# Loading converted files
# ----------------------------------------------------------------------------------------------------------------


def test_create_model_from_converted_refuses_other_files(tmp_path: Path) -> None:
    with pytest.raises(wtconvnext.checkpoint.CheckpointError, match="not written by wtconvnext-convert"):
        create_model_from_converted(GOLDEN_CKPT)  # a torch checkpoint, not a raw SafetensorError
    plain = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(plain))
    with pytest.raises(wtconvnext.checkpoint.CheckpointError, match="metadata format=None"):
        create_model_from_converted(plain)
    out = tmp_path / "ok.safetensors"
    convert_checkpoint(GOLDEN_CKPT, out)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(out.read_bytes()[:-500])
    with pytest.raises(wtconvnext.checkpoint.CheckpointError, match="truncated or corrupt safetensors"):
        create_model_from_converted(cut)
    with pytest.raises(wtconvnext.checkpoint.CheckpointError, match="no such file"):
        create_model_from_converted(tmp_path / "missing.safetensors")


# ----------------------------------------------------------------------------------------------------------------
# Layouts
# ----------------------------------------------------------------------------------------------------------------


def test_fused_and_native_layouts_convert_to_the_same_tensors(tmp_path: Path, golden_ckpt: dict) -> None:
    reference = tmp_path / "reference.safetensors"
    convert_checkpoint(GOLDEN_CKPT, reference, "wtconvnext_tiny", ARCH_KWARGS)
    expected = load_file(reference)
    fused_sd = to_fused_layout(golden_ckpt["state_dict_ema"])
    assert any(k.endswith(".wt_weights.0") for k in fused_sd)
    for src in (tmp_path / "fused.pth", tmp_path / "fused_src.safetensors"):
        if src.suffix == ".pth":
            torch.save(fused_sd, src)
        else:
            save_file(fused_sd, str(src))
        meta = convert_checkpoint(src, tmp_path / f"from_{src.stem}.safetensors", "wtconvnext_tiny", ARCH_KWARGS)
        assert meta["source_layout"] == "fused"
        assert_same_tensors(load_file(tmp_path / f"from_{src.stem}.safetensors"), expected)
    # A converted file converts to itself; its metadata supplies the architecture without --model.
    meta = convert_checkpoint(reference, tmp_path / "again.safetensors")
    assert (meta["source_layout"], meta["architecture"]) == ("native", "wtconvnext_tiny")
    assert json.loads(meta["model_kwargs"]) == ARCH_KWARGS
    assert_same_tensors(load_file(tmp_path / "again.safetensors"), expected)


# ----------------------------------------------------------------------------------------------------------------
# Full-size reference checkpoints
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed,variant", list(enumerate(["wtconvnext_tiny", "wtconvnext_small", "wtconvnext_base"])))
def test_full_size_reference_checkpoint(seed: int, variant: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ref_sd = random_reference_state_dict(REFERENCE_KEYS[variant], seed=seed)
    src = tmp_path / f"WTConvNeXt_{variant.split('_')[1]}_5_300e_ema.pth"
    torch.save(ref_sd, src)  # released checkpoints are flat state dicts
    out = tmp_path / "converted.safetensors"
    lines: list[str] = []
    # --verify compares the unfolded source (checkpoint_filter_fn + reference backend) with the converted file
    # loaded through timm's pretrained path, and raises above the tolerance.
    meta = convert_checkpoint(src, out, verify=True, tolerance=TOL, image_size=32, log=lines.append)
    assert meta["architecture"] == variant  # inferred from the shapes alone
    assert (meta["source_layout"], meta["source_wrapper"], meta["ema"]) == ("reference", "none", "unknown")
    assert meta["model_kwargs"] == "{}" and meta["num_classes"] == "1000"
    assert any(line.startswith("verify: logits max abs err") for line in lines), lines
    if variant != "wtconvnext_tiny":
        return  # the independent check below is the same at every size; once is enough for the time budget

    # Independently of --verify: unfolded source vs converted file, on the reference backend.
    source_model = timm.create_model(variant, wtconv_backend="reference")
    source_model.load_state_dict(checkpoint_filter_fn(ref_sd, source_model), strict=True)
    converted_model = create_model_from_converted(out, wtconv_backend="reference")
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected, actual = source_model.eval()(x), converted_model.eval()(x)
    assert rel_err(actual, expected) <= TOL
    assert expected.abs().max() > 1e-3  # the gammas are large: the blocks, and hence folding, matter
    w = "stages.3.blocks.2.conv_dw.weight"
    assert not torch.allclose(converted_model.state_dict()[w], source_model.state_dict()[w])

    # The same checkpoint named as another variant: the message lists what does not fit.
    before = listing(tmp_path)
    rc, _, err = run_cli([src, tmp_path / "small.safetensors", "--model", "wtconvnext_small"], capsys)
    assert_clean_failure(
        rc, err, tmp_path, before, "does not fit wtconvnext_small", "missing key(s): stages.2.blocks.9."
    )


# ----------------------------------------------------------------------------------------------------------------
# A folded model trained further
# ----------------------------------------------------------------------------------------------------------------


def test_folded_model_trains_with_scales_as_parameters(tmp_path: Path, golden_io: dict) -> None:
    out = tmp_path / "folded.safetensors"
    convert_checkpoint(GOLDEN_CKPT, out, "wtconvnext_tiny", ARCH_KWARGS)
    model = create_model_from_converted(out).train()
    scales = {n: p for n, p in model.named_parameters() if n.endswith((".base_scale", ".wavelet_scale"))}
    assert len(scales) == 2 * sum(GOLDEN_KWARGS["depths"])
    assert all(p.requires_grad and torch.equal(p, torch.ones_like(p)) for p in scales.values())
    assert set(scales) <= model.no_weight_decay()  # still trained without weight decay, as the reference does

    x, target = golden_io["x"].float(), torch.arange(2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss0 = F.cross_entropy(model(x), target)
    loss0.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in scales.values())
    opt.step()
    opt.zero_grad()
    assert all(not torch.equal(p, torch.ones_like(p)) for p in scales.values())
    with torch.no_grad():
        loss1 = F.cross_entropy(model(x), target)
    assert torch.isfinite(loss1) and loss1 < loss0


# ----------------------------------------------------------------------------------------------------------------
# Verification and atomic output
# ----------------------------------------------------------------------------------------------------------------


def test_verify_prints_errors_and_passes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "v.safetensors"
    rc, stdout, err = run_cli([GOLDEN_CKPT, out, *GOLDEN_MODEL_ARGS, "--verify", "--image-size", "48"], capsys)
    assert rc == 0, err
    m = re.search(r"verify: logits max abs err (\S+), max rel err (\S+) \(tolerance 1e-05\)", stdout)
    assert m, stdout
    assert 0 <= float(m.group(2)) <= TOL and float(m.group(1)) < 1e-4
    assert out.is_file()


def test_verify_failure_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    real_fold = convert.fold_scales

    def fold_forgetting_wavelet_scales(sd: dict[str, Tensor]) -> dict[str, Tensor]:
        out = real_fold(sd)
        return {k: sd[k] if k.endswith(".wavelet_weight") else v for k, v in out.items()}

    monkeypatch.setattr(convert, "fold_scales", fold_forgetting_wavelet_scales)
    before = listing(tmp_path)
    rc, stdout, err = run_cli([GOLDEN_CKPT, tmp_path / "bad.safetensors", *GOLDEN_MODEL_ARGS, "--verify"], capsys)
    assert_clean_failure(rc, err, tmp_path, before, "verification failed", "nothing written", code=1)
    assert "verify: logits max abs err" in stdout


def test_force_overwrites_and_interrupt_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch
) -> None:
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"keep me")
    rc, _, err = run_cli([GOLDEN_CKPT, out, *GOLDEN_MODEL_ARGS], capsys)
    assert_clean_failure(rc, err, tmp_path, {"out.safetensors"}, "exists", "--force")
    assert out.read_bytes() == b"keep me"
    rc, _, err = run_cli([GOLDEN_CKPT, out, *GOLDEN_MODEL_ARGS, "--force"], capsys)
    assert rc == 0, err
    assert read_metadata(out)["format"] == "wtconvnext"
    assert listing(tmp_path) == {"out.safetensors"}
    assert (out.stat().st_mode & 0o777) == 0o666 & ~_umask()

    def interrupted(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "_publish", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(GOLDEN_CKPT, tmp_path / "new.safetensors", "wtconvnext_tiny", ARCH_KWARGS)
    assert listing(tmp_path) == {"out.safetensors"}


def test_output_appearing_meanwhile_is_not_replaced(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    out = tmp_path / "race.safetensors"
    real_fold = convert.fold_scales

    def fold_while_another_writer_creates_output(sd: dict[str, Tensor]) -> dict[str, Tensor]:
        out.write_bytes(b"other writer")
        return real_fold(sd)

    monkeypatch.setattr(convert, "fold_scales", fold_while_another_writer_creates_output)
    rc, _, err = run_cli([GOLDEN_CKPT, out, *GOLDEN_MODEL_ARGS], capsys)
    assert_clean_failure(rc, err, tmp_path, {"race.safetensors"}, "exists")
    assert out.read_bytes() == b"other writer"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ----------------------------------------------------------------------------------------------------------------
# Bad inputs: one message, exit code 2, nothing left behind
# ----------------------------------------------------------------------------------------------------------------


def _touch_marker(path: str) -> None:
    Path(path).touch()


class _Payload:
    """Unpickling this would create the marker file: a stand-in for code execution from a checkpoint."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (_touch_marker, (str(self.marker),))


def _write_bad_input(kind: str, directory: Path, golden_ckpt: dict) -> tuple[Path, list[str], tuple[str, ...]]:
    """(input file, extra CLI args, expected message fragments) for one kind of bad input."""
    ema = golden_ckpt["state_dict_ema"]
    src = directory / f"{kind}.pth"
    args: list[str] = GOLDEN_MODEL_ARGS
    if kind == "truncated":
        data = GOLDEN_CKPT.read_bytes()
        src.write_bytes(data[: len(data) // 2])
        return src, args, ("truncated or corrupt",)
    if kind == "truncated_safetensors":
        src = directory / "t.safetensors"
        save_file(dict(ema), str(src))
        data = src.read_bytes()
        src.write_bytes(data[: len(data) - 1000])
        return src, args, ("truncated or corrupt safetensors",)
    if kind == "random_bytes":
        noise = torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(1))
        src.write_bytes(bytes(noise.tolist()))
        return src, args, ("not a valid checkpoint",)
    if kind == "empty":
        src.write_bytes(b"")
        return src, args, ("truncated or corrupt",)
    if kind == "not_a_state_dict":
        torch.save([torch.zeros(3)], src)
        return src, args, ("not a state dict",)
    if kind == "missing_keys":
        torch.save({k: v for k, v in ema.items() if k != "stages.2.blocks.1.mlp.fc2.weight"}, src)
        return src, args, ("1 missing key(s): stages.2.blocks.1.mlp.fc2.weight",)
    if kind == "unexpected_keys":
        torch.save({**ema, "stages.4.blocks.0.gamma": torch.ones(3)}, src)
        return src, args, ("1 unexpected key(s): stages.4.blocks.0.gamma",)
    if kind == "misshaped_keys":
        torch.save({**ema, "stages.0.blocks.0.mlp.fc1.weight": torch.ones(63, 16)}, src)
        return src, args, ("mis-shaped key(s): stages.0.blocks.0.mlp.fc1.weight (63, 16) vs model (64, 16)",)
    if kind == "model_mismatch":
        shape_note = "stem.0.weight (16, 3, 4, 4) vs model (96, 3, 4, 4)"
        return GOLDEN_CKPT, ["--model", "wtconvnext_tiny"], ("does not fit wtconvnext_tiny", shape_note, GOLDEN_HINT)
    if kind == "unreadable_config":
        # Neither a registered variant nor a configuration the tensors describe: a stage without its first block.
        torch.save({k: v for k, v in ema.items() if not k.startswith("stages.2.blocks.0.")}, src)
        return src, [], ("no registered WTConvNeXt variant fits", "does not fit either")
    if kind == "nonfinite":
        bad = dict(ema)
        bad["stages.1.blocks.0.mlp.fc1.weight"] = bad["stages.1.blocks.0.mlp.fc1.weight"].clone()
        bad["stages.1.blocks.0.mlp.fc1.weight"][3, 5] = float("nan")
        bad["stem.0.bias"] = bad["stem.0.bias"].clone()
        bad["stem.0.bias"][0] = float("-inf")
        torch.save({"state_dict_ema": bad}, src)
        return src, args, ("source tensor 'stem.0.bias' has non-finite values (1 Inf) (and 1 more tensor(s))",
                           "--allow-nonfinite")
    if kind == "nonfinite_verify":
        src, _, fragments = _write_bad_input("nonfinite", directory, golden_ckpt)
        return src, [*args, "--verify"], fragments
    if kind == "fold_overflow":
        # float16 weights whose scale x weight passes float16's 65504 once folded.
        half = {k: v.half() for k, v in ema.items()}
        scale, weight = (f"stages.0.blocks.0.conv_dw.{n}.1.weight" for n in ("wavelet_scale", "wavelet_convs"))
        half[scale], half[weight] = half[scale].clone(), half[weight].clone()
        half[scale].view(-1)[2] = 60000.0  # channel 0, subband 2 of level 1
        half[weight][2] = 2.0
        torch.save(half, src)
        return src, args, ("folded tensor (its scale times its weight overflows torch.float16) "
                           "'stages.0.blocks.0.conv_dw.wavelet_weight' has non-finite values",)
    if kind == "unknown_model":
        return GOLDEN_CKPT, ["--model", "resnet50"], ("unknown model 'resnet50'", "wtconvnext_base")
    if kind == "bad_kwargs_json":
        return GOLDEN_CKPT, ["--model", "wtconvnext_tiny", "--model-kwargs", "{depths: 1"], ("not valid JSON",)
    if kind == "kwargs_without_model":
        return GOLDEN_CKPT, ["--model-kwargs", json.dumps(ARCH_KWARGS)], ("--model-kwargs needs --model",)
    if kind == "no_ema_only_ema":
        torch.save({"state_dict_ema": ema}, src)
        return src, [*args, "--no-ema"], ("holds only EMA weights",)
    if kind == "missing_file":
        return directory / "nope.pth", args, ("no such file",)
    if kind == "directory":
        sub = directory / "a_dir"
        sub.mkdir()
        return sub, args, ("is a directory",)
    raise AssertionError(kind)


BAD_INPUTS = [
    "truncated", "truncated_safetensors", "random_bytes", "empty", "not_a_state_dict", "missing_keys",
    "unexpected_keys", "misshaped_keys", "model_mismatch", "unreadable_config", "unknown_model", "bad_kwargs_json",
    "kwargs_without_model", "no_ema_only_ema", "missing_file", "directory", "nonfinite", "nonfinite_verify",
    "fold_overflow",
]


@pytest.mark.parametrize("kind", BAD_INPUTS)
def test_bad_input(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture, golden_ckpt: dict) -> None:
    src, args, fragments = _write_bad_input(kind, tmp_path, golden_ckpt)
    before = listing(tmp_path)
    rc, stdout, err = run_cli([src, tmp_path / "out.safetensors", *args], capsys)
    assert_clean_failure(rc, err, tmp_path, before, *fragments)


def test_pickled_object_is_refused_not_executed(
    tmp_path: Path, capsys: pytest.CaptureFixture, golden_ckpt: dict
) -> None:
    marker = tmp_path / "executed"
    src = tmp_path / "evil.pth"
    torch.save({"state_dict": dict(golden_ckpt["state_dict_ema"]), "args": _Payload(marker)}, src)
    before = listing(tmp_path)
    rc, _, err = run_cli([src, tmp_path / "out.safetensors", *GOLDEN_MODEL_ARGS], capsys)
    assert_clean_failure(rc, err, tmp_path, before, "refusing to load", "_touch_marker", "weights_only=True")
    assert not marker.exists()


def test_unreadable_input(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    src = tmp_path / "locked.pth"
    src.write_bytes(GOLDEN_CKPT.read_bytes())
    src.chmod(0)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # root reads mode-000 files; make the first read fail as it does for everyone else.
        def denied(path: Path) -> bool:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

        monkeypatch.setattr(wtconvnext.checkpoint, "_is_safetensors", denied)
    before = listing(tmp_path)
    try:
        rc, _, err = run_cli([src, tmp_path / "out.safetensors", *GOLDEN_MODEL_ARGS], capsys)
    finally:
        src.chmod(0o600)
    assert_clean_failure(rc, err, tmp_path, before, "cannot read checkpoint", "Permission denied")


@pytest.mark.parametrize(
    "output,fragment",
    [("out.pth", "must end in .safetensors"), ("no_such_dir/out.safetensors", "does not exist")],
)
def test_bad_output(output: str, fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    before = listing(tmp_path)
    rc, _, err = run_cli([GOLDEN_CKPT, tmp_path / output, *GOLDEN_MODEL_ARGS], capsys)
    assert_clean_failure(rc, err, tmp_path, before, fragment)


# ----------------------------------------------------------------------------------------------------------------
# The real entry point
# ----------------------------------------------------------------------------------------------------------------


def _module_run(args: list[Any], cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run(
        [sys.executable, "-m", "wtconvnext.convert", *map(str, args)],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=300,
    )


def test_module_entry_point(tmp_path: Path) -> None:
    out = tmp_path / "cli.safetensors"
    ok = _module_run([GOLDEN_CKPT, out, *GOLDEN_MODEL_ARGS, "--verify"])
    assert ok.returncode == 0, ok.stderr
    assert "verify: logits max abs err" in ok.stdout and out.is_file()
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"\x80\x02not a pickle at all")
    bad = _module_run([junk, tmp_path / "junk.safetensors"])
    assert bad.returncode == 2
    assert bad.stderr.startswith("wtconvnext-convert: error: ") and len(bad.stderr.strip().splitlines()) == 1
    assert listing(tmp_path) == {"cli.safetensors", "junk.pth"}
