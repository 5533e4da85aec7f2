"""The kernel A/B script runs end to end (on the CPU under Triton's interpreter, on one small shape); the SASS
instruction counter reads real sm_90 machine code."""

from __future__ import annotations

import json
import subprocess
import sys
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


def test_sass_stats_counts_the_loops_of_real_machine_code(tmp_path: Path) -> None:
    # A subprocess: the script compiles for sm_90, which the interpreter (set for the CPU tests) cannot.
    out = tmp_path / "sass.json"
    script = Path(ab_kernels.__file__).with_name("sass_stats.py")
    proc = subprocess.run([sys.executable, str(script), "--kernels", "wgrad_base", "wgrad_level1", "--channels", "128",
                           "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = {r["kernel"]: r for r in json.loads(out.read_text())["rows"]}
    base = [lp for lp in rows["wgrad_base"]["loops"] if not lp["contains"]]
    level = [lp for lp in rows["wgrad_level1"]["loops"] if not lp["contains"]]
    assert base and level and rows["wgrad_base"]["registers"]
    # The base correlates raw pixels (FMAs, no adds); a level recomputes both Haar butterflies (8 adds per 4 FMAs
    # for x's taps, plus dy's), and every loop loads.
    assert all(lp["ops"].get("FFMA", 0) > 0 and "FADD" not in lp["ops"] and lp["ops"].get("LDG", 0) > 0 for lp in base)
    assert all(lp["ops"].get("FADD", 0) >= 2 * lp["ops"].get("FFMA", 0) > 0 for lp in level)


def test_report_prints_the_table_and_writes_json(tmp_path: Path, capsys) -> None:
    from benchmarks.common import report

    out = tmp_path / "sub" / "r.json"
    report(out, {"gpu": "X"}, "a   b", ["1   2", "3   4"], [{"a": 1}], note="* note", best={"a": 1})
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["# {'gpu': 'X'}", "a   b", "-----", "1   2", "3   4", "* note"]
    assert json.loads(out.read_text()) == {"env": {"gpu": "X"}, "rows": [{"a": 1}], "best": {"a": 1}}
    assert not list(out.parent.glob("*.tmp"))  # written through a temporary sibling, which is gone
