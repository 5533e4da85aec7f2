"""validate.py: exact metrics, what it reads from a checkpoint, and one line for every ordinary mistake.

Everything runs in-process through ``validate.main(argv)`` on tiny models and image folders (fast); one test runs the
script as a subprocess to prove that the real entry point prints no traceback either.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # validate.py is a top-level script

import validate  # noqa: E402
from conftest import GOLDEN, GOLDEN_INDEX  # noqa: E402
from wtconvnext.convert import convert_checkpoint  # noqa: E402

GOLDEN_CASE = GOLDEN_INDEX["models"][0]
GOLDEN_CKPT = GOLDEN / GOLDEN_CASE["checkpoint"]
GOLDEN_ARCH = {k: v for k, v in GOLDEN_CASE["kwargs"].items() if k != "num_classes"}
MODEL = "test_wtconvnext"
MODEL_KWARGS = {"wt_levels": [2, 1, 1, 1]}
COMMON = ["--device", "cpu", "--workers", "0", "--no-progress"]


# ----------------------------------------------------------------------------------------------------------------------
# evaluate(): exact top-1 / top-5 / loss


class _LookupModel(nn.Module):
    """Returns row ``x`` of a fixed logits table: the input of each sample is its index."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[x.long()]


def _known_logits(ranks: list[int], num_classes: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct random logits per sample, and each sample's label chosen at the given rank (1 = the argmax)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.stack([torch.randperm(num_classes, generator=g).double() * 0.7 + torch.rand(1, generator=g).item()
                          for _ in ranks])
    order = logits.argsort(dim=1, descending=True)
    labels = torch.tensor([int(order[i, r - 1]) for i, r in enumerate(ranks)])
    return logits.float(), labels


def _expected_loss(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean cross-entropy, written out in Python floats."""
    total = 0.0
    for row, label in zip(logits.double().tolist(), labels.tolist()):
        top = max(row)
        total += top + math.log(sum(math.exp(v - top) for v in row)) - row[label]
    return total / len(labels)


@pytest.mark.parametrize("batch_size", [1, 3, 10])
def test_evaluate_counts_top1_top5_and_loss_exactly(batch_size: int) -> None:
    # 7 classes; labels at ranks 1 (3 samples), 2-5 (5 samples: in the top 5, not the top 1) and 6-7 (2 samples).
    ranks = [1, 2, 6, 3, 1, 5, 4, 7, 2, 1]
    logits, labels = _known_logits(ranks, num_classes=7)
    model = _LookupModel(logits)
    index = torch.arange(len(ranks))
    loader = [(index[i:i + batch_size], labels[i:i + batch_size]) for i in range(0, len(ranks), batch_size)]
    metrics = validate.evaluate(model, loader, torch.device("cpu"))
    assert metrics["num_images"] == 10
    assert metrics["top1"] == pytest.approx(30.0, abs=1e-9)
    assert metrics["top5"] == pytest.approx(80.0, abs=1e-9)
    assert metrics["loss"] == pytest.approx(_expected_loss(logits, labels), rel=1e-6)


def test_evaluate_top5_with_fewer_than_five_classes() -> None:
    logits, labels = _known_logits([1, 2, 3, 4], num_classes=4, seed=1)
    metrics = validate.evaluate(_LookupModel(logits), [(torch.arange(4), labels)], torch.device("cpu"))
    assert (metrics["top1"], metrics["top5"]) == (25.0, 100.0)  # top-k over every class there is


# ----------------------------------------------------------------------------------------------------------------------
# Fixtures


def _write_folder(root: Path, classes: int, per_class: int, size: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    for c in range(classes):
        d = root / "val" / f"class{c}"
        d.mkdir(parents=True)
        base = rng.integers(0, 256, size=3)
        for i in range(per_class):
            pixels = np.clip(base + rng.integers(-60, 60, size=(size, size, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(d / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """6 classes x 2 images, 40 px (larger than the 32 px the test checkpoint records, so a crop matters)."""
    return _write_folder(tmp_path_factory.mktemp("val6"), classes=6, per_class=2, size=40, seed=0)


@pytest.fixture(scope="module")
def train_ckpt(tmp_path_factory) -> Path:
    """A checkpoint laid out as train.py writes it: a model trained at 32 px, evaluated with crop_pct 1.0."""
    torch.manual_seed(0)
    model = timm.create_model(MODEL, num_classes=6, **MODEL_KWARGS)
    with torch.no_grad():  # a head that depends on the input: random-init logits are near-constant otherwise
        model.head.fc.weight.normal_(0, 1.0)
    state = {
        "version": 2, "arch": MODEL, "epoch": 0, "next_epoch": 1, "next_update": 0, "num_updates": 1,
        "state_dict": model.state_dict(), "optimizer": {}, "scheduler": None,
        "args": {"model": MODEL, "model_kwargs": MODEL_KWARGS, "num_classes": 6, "img_size": 32, "crop_pct": 1.0,
                 "input_size": None, "interpolation": "", "mean": None, "std": None, "crop_mode": None},
        "data_config": {"input_size": [3, 32, 32], "interpolation": "bilinear", "mean": [0.5, 0.5, 0.5],
                        "std": [0.25, 0.25, 0.25], "crop_pct": 1.0, "crop_mode": "center"},
    }
    path = tmp_path_factory.mktemp("ckpt") / "last.pth.tar"
    torch.save(state, path)
    return path


def run_main(argv: list[str]) -> dict[str, Any]:
    return validate.main([*COMMON, *argv])


def run_failing(argv: list[str], capsys) -> str:
    """validate.main must exit with status 2 and print exactly one line on stderr; returns that line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        run_main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("validate.py: error: "), err
    return lines[0]


# ----------------------------------------------------------------------------------------------------------------------
# What validate.py reads from a checkpoint


def test_train_checkpoint_supplies_model_kwargs_and_data_config(train_ckpt, folder, tmp_path, capsys) -> None:
    res = run_main(["--checkpoint", str(train_ckpt), "--data-dir", str(folder)])
    out = capsys.readouterr().out
    assert res["model"] == MODEL and res["num_images"] == 12
    assert (res["input_size"], res["crop_pct"], res["interpolation"]) == ([3, 32, 32], 1.0, "bilinear")
    assert res["data_config_source"] == "the train.py checkpoint"
    assert "Input size (3, 32, 32), crop_pct 1.0 (center), bilinear" in out
    assert "mean (0.5, 0.5, 0.5), std (0.25, 0.25, 0.25)" in out

    # The same preprocessing spelled out on the command line gives the same numbers...
    explicit = run_main(["--checkpoint", str(train_ckpt), "--data-dir", str(folder), "--model", MODEL,
                         "--model-kwargs", json.dumps(MODEL_KWARGS), "--num-classes", "6", "--img-size", "32",
                         "--crop-pct", "1.0", "--interpolation", "bilinear", "--mean", "0.5", "0.5", "0.5",
                         "--std", "0.25", "0.25", "0.25"])
    assert (explicit["top1"], explicit["top5"], explicit["loss"]) == (res["top1"], res["top5"], res["loss"])
    # ... and a flag beats the record: the model's own size here (160 px, crop 0.875) gives other numbers.
    other = run_main(["--checkpoint", str(train_ckpt), "--data-dir", str(folder), "--img-size", "160",
                      "--crop-pct", "0.875"])
    assert (other["input_size"], other["crop_pct"], other["data_config_source"]) == ([3, 160, 160], 0.875,
                                                                                      "command line")
    assert other["loss"] != res["loss"]

    # A converted file carries the record over: no flags, the same evaluation.
    converted = tmp_path / "converted.safetensors"
    meta = convert_checkpoint(train_ckpt, converted)
    assert (meta["architecture"], json.loads(meta["model_kwargs"])) == (MODEL, MODEL_KWARGS)
    assert json.loads(meta["data_config"])["input_size"] == [3, 32, 32]
    conv = run_main(["--checkpoint", str(converted), "--data-dir", str(folder)])
    assert conv["data_config_source"] == "the converted-file metadata"
    assert (conv["input_size"], conv["crop_pct"], conv["interpolation"]) == ([3, 32, 32], 1.0, "bilinear")
    assert conv["top1"] == res["top1"] and conv["top5"] == res["top5"]
    assert conv["loss"] == pytest.approx(res["loss"], rel=1e-5)  # folding changes rounding only


def test_reference_checkpoint_without_model_flags(folder, caplog) -> None:
    """A reference checkpoint records no model: validate.py reads the configuration off its tensors."""
    size = ["--img-size", "64", "--data-dir", str(folder)]
    with caplog.at_level("INFO", logger="validate"):
        inferred = run_main(["--checkpoint", str(GOLDEN_CKPT), *size])
    assert "from the checkpoint's tensors: a custom configuration" in caplog.text
    flags = run_main(["--checkpoint", str(GOLDEN_CKPT), "--model", "wtconvnext_tiny", "--num-classes", "10",
                      "--model-kwargs", json.dumps(GOLDEN_ARCH), *size])
    assert inferred["model"] == flags["model"] == "wtconvnext_tiny"
    assert (inferred["top1"], inferred["top5"], inferred["loss"]) == (flags["top1"], flags["top5"], flags["loss"])
    assert inferred["data_config_source"] == "command line" and inferred["input_size"] == [3, 64, 64]


# ----------------------------------------------------------------------------------------------------------------------
# One line for every ordinary mistake


def _bad_checkpoint(kind: str, directory: Path, train_ckpt: Path) -> Path:
    path = directory / f"{kind}.pth"
    if kind == "missing":
        return directory / "nope.pth"
    if kind == "truncated":
        data = train_ckpt.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "random_bytes":
        path.write_bytes(bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8)))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "directory":
        path.mkdir()
    else:
        raise AssertionError(kind)
    return path


@pytest.mark.parametrize("kind,fragment", [
    ("missing", "no such file"),
    ("truncated", "truncated or corrupt"),
    ("random_bytes", "not a valid checkpoint"),  # not "pickled objects": nothing was refused, nothing is there
    ("empty", "truncated or corrupt"),
    ("directory", "is a directory"),
])
def test_bad_checkpoint_is_one_line(kind, fragment, folder, train_ckpt, tmp_path, capsys) -> None:
    path = _bad_checkpoint(kind, tmp_path, train_ckpt)
    line = run_failing(["--checkpoint", str(path), "--data-dir", str(folder)], capsys)
    assert fragment in line and str(path) in line


def test_bad_arguments_are_one_line(folder, train_ckpt, tmp_path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    ckpt = ["--checkpoint", str(train_ckpt)]
    cases = [
        (["--model", MODEL, "--data-dir", str(tmp_path / "nowhere")], "data directory", "does not exist"),
        (["--model", MODEL, "--data-dir", str(empty)], "Found 0 images", str(empty)),
        (["--model", "wtconvnext_tinny", "--data-dir", str(folder)], "unknown model 'wtconvnext_tinny'",
         "did you mean wtconvnext_tiny"),
        (["--data-dir", str(folder)], "--model is required", ""),
        ([*ckpt, "--model", "wtconvnext_atto", "--num-classes", "6", "--data-dir", str(folder)],
         "checkpoint does not fit", "mis-shaped key(s): stem.0.weight"),
        ([*ckpt, "--num-classes", "3", "--data-dir", str(folder)], "checkpoint does not fit",
         "head.fc.weight (6, 64) vs model (3, 64)"),
        (["--model", MODEL, "--num-classes", "4", "--data-dir", str(folder)], "the dataset has 6 classes",
         "predicts 4"),
        (["--model", MODEL, "--model-kwargs", "depths=(1,1)", "--data-dir", str(folder)], "cannot build", "depths"),
        (["--model", MODEL, "--data-dir", str(folder), "--device", "cuda:0"] if not torch.cuda.is_available()
         else ["--model", MODEL, "--data-dir", str(folder), "--device", "nonsense"], "--device", ""),
        (["--model", MODEL, "--bogus-flag"], "unrecognized arguments: --bogus-flag", "see --help"),
    ]
    for argv, *fragments in cases:
        line = run_failing(argv, capsys)
        for fragment in fragments:
            assert fragment in line, (argv, line)


def test_script_entry_point_prints_no_traceback(tmp_path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(REPO / "validate.py"), "--model", MODEL, "--data-dir",
                           str(tmp_path / "nowhere"), *COMMON], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"validate.py: error: data directory '{tmp_path / 'nowhere'}' does not exist"
