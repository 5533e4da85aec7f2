"""The kernel A/B script runs end to end (on the CPU under Triton's interpreter, on one small shape)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks import ab_kernels

pytestmark = pytest.mark.triton


def test_ab_kernels_against_itself(tmp_path: Path) -> None:
    out = tmp_path / "ab.json"
    kernels = Path(ab_kernels.current.__file__)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = ["--baseline", str(kernels), "--dtypes", "fp32", "--device", device, "--check", "--out", str(out)]
    assert ab_kernels.main(args) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["part"] for r in rows} == {"fwd", "dx", "wgrad"}
    # The same kernels on the same inputs: bitwise equal results (the weight gradients are deterministic).
    assert all(r["max_rel_diff"] == 0.0 for r in rows)


def test_ab_kernels_rejects_a_missing_baseline(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no such file"):
        ab_kernels.main(["--baseline", str(tmp_path / "nope.py"), "--device", "cpu", "--check"])
