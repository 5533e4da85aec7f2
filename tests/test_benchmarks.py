"""The kernel A/B script runs end to end and reports differences where they are (on the CPU under Triton's
interpreter, on one small shape); the SASS instruction counter reads real sm_90 machine code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import ab_kernels

pytestmark = pytest.mark.triton


# A baseline that differs from the current kernels in one known way: its forward launcher scales what it computes by
# 1 + 1e-3. The forward and the input-gradient pass (the same launcher, rotated kernels) must show that difference;
# the weight gradients, which do not use it, must not.
_PERTURBED_BASELINE = """
import functools
from wtconvnext.ops import triton_kernels as _current

globals().update({k: v for k, v in vars(_current).items() if not k.startswith("__")})


@functools.wraps(_current.wtconv_forward)
def wtconv_forward(*args, **kwargs):
    return _current.wtconv_forward(*args, **kwargs).mul_(1 + 1e-3)
"""


def test_ab_kernels_script_reports_what_differs(tmp_path: Path) -> None:
    """The A/B script end to end (a test of the script, not of the kernels: test_ops_triton.py pins those to the
    golden data and the reference). Against the current kernels themselves every part is bitwise equal (the weight
    gradients are deterministic); against a baseline whose forward is off by 1e-3, exactly the parts that use it
    report that difference."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    perturbed = tmp_path / "perturbed_kernels.py"
    perturbed.write_text(_PERTURBED_BASELINE)
    diffs = {}
    # (Against itself, the input gradient and the weight gradients: the parts whose launchers the others combine.)
    for name, baseline, parts in (("same", Path(ab_kernels.current.__file__), ["dx", "wgrad"]),
                                  ("perturbed", perturbed, ["fwd", "wgrad", "bwd"])):
        out = tmp_path / f"{name}.json"
        args = ["--baseline", str(baseline), "--parts", *parts, "--dtypes", "fp32", "--device", device, "--check",
                "--out", str(out)]
        assert ab_kernels.main(args) == 0
        rows = json.loads(out.read_text())["rows"]
        assert [r["part"] for r in rows] == parts
        diffs[name] = {r["part"]: r["max_rel_diff"] for r in rows}
    assert diffs["same"] == {"dx": 0.0, "wgrad": 0.0}
    assert diffs["perturbed"]["wgrad"] == 0.0
    for part in ("fwd", "bwd"):  # the whole backward's input gradient is the forward launcher's
        assert diffs["perturbed"][part] == pytest.approx(1e-3 / (1 + 1e-3), rel=1e-3), part


def test_ab_kernels_tuning_mode(tmp_path: Path) -> None:
    """--tuning syn1=0: today's launch settings against the separate level-1 synthesis, the same results to fp32
    rounding; --parts runs only the passes named; an unknown key is a usage error naming the keys."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = tmp_path / "tuning.json"
    # syn1 changes the forward launcher only (which the input gradient shares): the weight gradients are not run.
    assert ab_kernels.main(["--tuning", "syn1=0", "--parts", "fwd", "dx", "--dtypes", "fp32", "--device", device,
                            "--check", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["part"] for r in rows] == ["fwd", "dx"]
    assert all(r["max_rel_diff"] <= 1e-5 for r in rows), rows
    assert ab_kernels.main(["--tuning", "wgrad_unroll=0", "--parts", "wgrad", "--dtypes", "fp32", "--device", device,
                            "--check", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["part"] for r in rows] == ["wgrad"] and rows[0]["max_rel_diff"] == 0.0, rows
    with pytest.raises(SystemExit):
        ab_kernels.main(["--tuning", "nonsense=1", "--device", "cpu", "--check"])


def test_ab_kernels_rejects_a_missing_baseline(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no such file"):
        ab_kernels.main(["--baseline", str(tmp_path / "nope.py"), "--device", "cpu", "--check"])
    with pytest.raises(SystemExit):
        ab_kernels.main(["--device", "cpu", "--check"])  # neither --baseline nor --tuning


def test_sass_stats_counts_the_loops_of_real_machine_code(tmp_path: Path) -> None:
    # A subprocess: the script compiles for sm_90, which the interpreter (set for the CPU tests) cannot.
    out = tmp_path / "sass.json"
    script = Path(ab_kernels.__file__).with_name("sass_stats.py")
    # K = 3 and a TUNING entry: the options that make a cap's K = 3 / 7 rows reproducible (results/sm90/), and the
    # cheaper compiles.
    proc = subprocess.run([sys.executable, str(script), "--kernels", "conv_base", "wgrad_levels", "--channels", "128",
                           "--kernel-size", "3", "--tuning", "wgrad_bw=8", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "K=3, TUNING wgrad_bw=8" in proc.stdout, proc.stdout[:400]
    rows = {r["kernel"]: r for r in json.loads(out.read_text())["rows"]}
    assert {r["kernel_size"] for r in rows.values()} == {3}
    assert rows["wgrad_levels"]["constexprs"]["BW"] == "8" and rows["wgrad_levels"]["constexprs"]["TP"] == "16"
    conv = [lp for lp in rows["conv_base"]["loops"] if not lp["contains"]]
    wgrad = [lp for lp in rows["wgrad_levels"]["loops"] if not lp["contains"]]
    assert conv and wgrad and rows["conv_base"]["registers"] and rows["conv_base"]["compile_s"] > 0
    # The row walk of a K x K conv over BW columns: K * K * BW FMAs a row, and far fewer loads (each loaded column
    # feeds every tap it meets). The weight gradient's row: the same FMAs, loads of x's and dy's columns.
    from wtconvnext.ops.triton_kernels import TUNING

    for loops, bw in ((conv, TUNING["conv_bw"]), (wgrad, 8)):
        row = max(loops, key=lambda lp: lp["ops"].get("FFMA", 0))
        assert row["ops"].get("FFMA", 0) >= 9 * bw, row["ops"]
        assert 0 < row["ops"].get("LDG", 0) * 4 <= row["ops"]["FFMA"], row["ops"]


def test_report_prints_the_table_and_writes_json(tmp_path: Path, capsys) -> None:
    from benchmarks.common import report

    out = tmp_path / "sub" / "r.json"
    report(out, {"gpu": "X"}, "a   b", ["1   2", "3   4"], [{"a": 1}], note="* note", best={"a": 1})
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["# {'gpu': 'X'}", "a   b", "-----", "1   2", "3   4", "* note"]
    assert json.loads(out.read_text()) == {"env": {"gpu": "X"}, "rows": [{"a": 1}], "best": {"a": 1}}
    assert not list(out.parent.glob("*.tmp"))  # written through a temporary sibling, which is gone


def test_bench_model_runs_every_task(tmp_path: Path) -> None:
    """The model benchmark end to end on the CPU (--check: one step of every task, test-sized models): each row has
    its ConvNeXt counterpart's ratio, and the multi-scale rows count their graphs, WTConvNeXt's no more than
    ConvNeXt's."""
    from benchmarks import bench_model

    out = tmp_path / "model.json"
    assert bench_model.main(["--check", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    tasks = {(r["model"], r["task"], r["compile"]) for r in rows}
    for model in ("test_convnext", "test_wtconvnext"):
        for task, compiled in (("train", False), ("infer", False), ("dense_infer", False), ("dense_train", False),
                               ("train", True), ("multiscale", True)):
            assert (model, task, compiled) in tasks
    assert any(not r["amp"] for r in rows if r["model"] == "test_wtconvnext")
    assert all(r["throughput_vs_convnext"] > 0 for r in rows)
    assert all(r["graphs"] >= 1 and len(r["ms_per_size"]) == 3 for r in rows if r["task"] == "multiscale")
    # Multi-scale training compiles no more graphs than ConvNeXt's (issue 15): 96 -> 128 -> 64, the last size reuses
    # the dynamic graph unless the model guards on the sizes. (On the CPU the models run the reference WTConv; the
    # op's own path: test_autocast_compile.py, test_compiled_layer_keeps_sizes_symbolic_across_the_small_map_threshold.)
    graphs = {r["model"]: r["graphs"] for r in rows if r["task"] == "multiscale"}
    assert graphs["test_wtconvnext"] <= graphs["test_convnext"], graphs


def test_tuning_entries_read_items_and_variants() -> None:
    """One parser serves every benchmark's TUNING arguments: ``--tuning KEY=V ...`` items and ``KEY=V[,KEY=V]``
    variants (bench_layer, warm_kernels, bench_compile); an unknown key, a negative or a missing value is refused,
    naming the flag."""
    from benchmarks.common import Refuse, tuning_entries

    assert tuning_entries(Refuse, ["wgrad_bw=8", "syn1=0"]) == {"wgrad_bw": 8, "syn1": 0}
    assert tuning_entries(Refuse, "wgrad_narrow=4, small_narrow=1", "--variants") == {"wgrad_narrow": 4,
                                                                                     "small_narrow": 1}
    for bad in ("nonsense=1", "wgrad_bw=-1", "wgrad_bw", "wgrad_bw=x", ""):
        with pytest.raises(SystemExit, match="--variants"):
            tuning_entries(Refuse, bad, "--variants")


def test_host_cpu_times_every_mode_on_a_tiny_shape(tmp_path: Path) -> None:
    """The host-cost script end to end on the CPU (a subprocess: it switches Triton's interpreter on before
    importing wtconvnext, which must not leak into this process): a row per mode with positive medians over the
    requested iterations, and the table printed."""
    out = tmp_path / "host.json"
    script = Path(ab_kernels.__file__).with_name("host_cpu.py")
    proc = subprocess.run([sys.executable, str(script), "--tiny", "--iters", "20", "--rounds", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["stub", "kept", "planned", "direct", "workspace", "graphs", "op"]
    # Per layer of a chain of 8 with one backward: the modes with autograd (not the ops' calls).
    assert all(r["chain"] == 8 and r["chain_us"] > 0 for r in rows[:6]) and rows[6]["chain_us"] is None
    for r in rows:
        assert (r["C"], r["H"], r["levels"], r["iters"]) == (8, 9, 2, 20)
        assert 0 < r["fwd_us"] < r["fwd_bwd_us"], r
    assert "fwd+bwd us" in proc.stdout and proc.stdout.count("8,   9, 2") == 7


def test_peak_cpu_counts_the_layers_allocations(tmp_path: Path) -> None:
    """The allocation-count script end to end on the CPU (a subprocess, as host_cpu): at 56 x 56 and 28 x 28
    (multi-launch) level 1 on load lowers the peak by more than half a map, and without it the input gradient in
    dy's coefficient buffer lowers it (the peak moves to another phase: by less than one full-size map); at 14 x 14
    (the one-launch pass) all layouts are the same."""
    out = tmp_path / "peak.json"
    script = Path(ab_kernels.__file__).with_name("peak_cpu.py")
    proc = subprocess.run([sys.executable, str(script), "--batch", "2", "--shapes", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["C"], r["H"]) for r in rows] == [(96, 56), (192, 28), (384, 14)]
    for r in rows[:2]:  # (all three without the workspace)
        assert 0 < r["separate_dx_mib"] - r["no_onload_mib"] <= r["x_mib"], r
        assert r["no_onload_mib"] > 2 * r["x_mib"]  # y and two coefficient buffers at least
        assert r["no_workspace_mib"] < r["no_onload_mib"] - r["x_mib"] / 2, r
    assert rows[2]["no_workspace_mib"] == rows[2]["no_onload_mib"] == rows[2]["separate_dx_mib"] > 0
    for r in rows:  # the workspace of direct replays adds at most launch_plan._PEAK_SLACK (1 MiB)
        assert r["no_workspace_mib"] - 1e-9 <= r["peak_mib"] <= r["no_workspace_mib"] + 1, r
    assert "peak MiB" in proc.stdout


def test_bench_train_reads_the_last_epochs_rate() -> None:
    from benchmarks.bench_train import last_epoch_rate

    log = ("Train 0 [5/10] loss 2.3 lr 1.0e-03 10.0 img/s\nTrain 0 [10/10] loss 2.2 lr 1.0e-03 20.0 img/s\n"
           "Train 1 [5/10] loss 2.1 lr 1.0e-03 30.5 img/s\nTrain 1 [10/10] loss 2.0 lr 1.0e-03 41.25 img/s\n"
           "Eval 1: top1 10.0\n")
    assert last_epoch_rate(log) == 41.25
    assert last_epoch_rate("no rates here") != last_epoch_rate("no rates here")  # nan


def test_bench_train_runs_train_py_on_a_generated_folder(tmp_path: Path) -> None:
    """bench_train.py --check: a generated ImageFolder, train.py for both test models, the pipeline's own rate."""
    from benchmarks import bench_train

    out = tmp_path / "train.json"
    assert bench_train.main(["--check", "--out", str(out), "--data-dir", str(tmp_path / "data")]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["model"] for r in rows] == ["test_convnext", "test_wtconvnext"]
    assert all(r["img_s"] > 0 and r["pipeline_img_s"] > 0 for r in rows), rows
    assert rows[0]["vs_convnext"] == 1.0
    assert len(list((tmp_path / "data" / "train").glob("class*/*.jpg"))) >= 40


def test_bench_layer_rebuilds_a_cut_runs_table_from_its_row_lines(tmp_path: Path) -> None:
    """--rows-from: the table of the per-row lines a run printed before its time limit cut it (no GPU needed);
    ratios are to the faster dw7 layout of the same shape, and a shape whose dw7 row never printed is left out."""
    from benchmarks import bench_layer

    log = tmp_path / "layer.log"
    log.write_text("\n".join([
        "bf16 128,96,56,56,5 wtconv_triton_cl: fwd 0.462 ms, fwd+bwd 1.347 ms, 287.4 MB",
        "bf16 128,96,56,56,5 dw7_nchw: fwd 1.325 ms, fwd+bwd 5.735 ms, 148.0 MB",
        "bf16 128,96,56,56,5 dw7_cl: fwd 0.385 ms, fwd+bwd 1.338 ms, 172.8 MB",
        "some other output line",
        "bf16 16,96,128,128,5 wtconv_triton_cl: fwd 0.400 ms, fwd+bwd 1.500 ms, 300.0 MB",
    ]))
    out = tmp_path / "layer.json"
    assert bench_layer.main(["--rows-from", str(log), "--env", '{"gpu": "H200"}', "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["env"] == {"gpu": "H200"}
    rows = {r["impl"]: r for r in data["rows"]}
    assert sorted(rows) == ["dw7_cl", "dw7_nchw", "wtconv_triton_cl"]  # the 128^2 shape had no dw7 row yet
    assert rows["wtconv_triton_cl"]["fwdbwd_vs_best_dw7"] == pytest.approx(1.347 / 1.338)
    assert rows["wtconv_triton_cl"]["peak_vs_best_dw7"] == pytest.approx(287.4 / 172.8)
    assert rows["dw7_nchw"]["best_dw7_layout"] == "dw7_cl"
    # What a run prints per row is what this reads back.
    row = dict(dtype="bf16", B=2, C=8, H=9, W=10, levels=2, impl="dw7_cl", fwd_ms=0.5, fwdbwd_ms=1.25, peak_mb=3.0)
    (tmp_path / "printed.log").write_text(bench_layer.row_line(row) + "\n")
    assert bench_layer.rows_from_log(str(tmp_path / "printed.log")) == [row]


def test_bench_layer_partial_write_keeps_every_row(tmp_path: Path) -> None:
    """The JSON written after every row (a run cut by its limit keeps it): every row so far, ratios only where the
    shape has a dw7 row, marked partial."""
    from benchmarks import bench_layer

    rows = [dict(dtype="bf16", B=8, C=96, H=56, W=56, levels=5, impl="dw7_cl", fwd_ms=0.4, fwdbwd_ms=1.3, peak_mb=10.0),
            dict(dtype="bf16", B=8, C=96, H=56, W=56, levels=5, impl="wtconv_triton_cl", fwd_ms=0.4, fwdbwd_ms=1.4,
                 peak_mb=11.0),
            dict(dtype="bf16", B=8, C=192, H=28, W=28, levels=4, impl="wtconv_triton_cl", fwd_ms=0.2, fwdbwd_ms=0.7,
                 peak_mb=5.0)]
    out = tmp_path / "layer.json"
    bench_layer.write_table(str(out), {"gpu": "H100"}, rows, quiet=True)
    data = json.loads(out.read_text())
    assert data["partial"] is True and len(data["rows"]) == 3
    assert data["rows"][1]["fwdbwd_vs_best_dw7"] == pytest.approx(1.4 / 1.3)
    assert "fwdbwd_vs_best_dw7" not in data["rows"][2]


def test_compile_ahead_cpu_lists_a_training_steps_specialisations(tmp_path: Path, monkeypatch) -> None:
    """The cold-start script's list (each stage's forward and backward dry-run, as compile_ahead.py does): the
    multi-launch stages' nine kernels and the small-map stages' six, once each; its table times each (the sm_90
    compile stubbed here: it takes minutes) in series and in the pool."""
    import torch

    from benchmarks import compile_ahead_cpu as cac

    kinds = [[key[0] for key in cac.distinct(cac.step_launches(s, torch.bfloat16))] for s in range(4)]
    for names in kinds[:2]:
        assert sorted(set(names)) == sorted(["_fold_kernel", "_analysis_kernel", "_conv_kernel",
                                             "_synthesis_kernel", "_wgrad_pair_kernel", "_param_grads_kernel",
                                             "_level1_kernel", "_wgrad_kernel"])
        assert names.count("_conv_kernel") == 4  # levels, base (+ bias, level 1's synthesis), and both flipped
        assert names.count("_level1_kernel") == 2  # level 1 on load (TUNING l1_onload), and flipped
    for names in kinds[2:]:
        assert sorted(names) == sorted(["_fold_kernel", "_small_kernel", "_small_kernel", "_analysis_kernel",
                                        "_wgrad_pair_kernel", "_param_grads_kernel"])
    compiled = []
    monkeypatch.setattr(cac, "compile_sm90", lambda fn, sig, const, warps: compiled.append(fn.__name__))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = tmp_path / "ca.json"
    assert cac.main(["--stages", "3", "--threads", "2", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert len(res["rows"]) == 6 and len(compiled) == 12  # each once in series, once in the pool
    assert res["best"]["series_s"] >= 0 and res["best"]["threads"] == 2


_WRAPPER = """
@triton.jit
def triton_poi_fused_0(out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    tmp0 = tl.full([1], float("nan"), tl.float32)
    tl.store(out_ptr0 + (xindex), tmp0, None)
''', device_str='cuda')

@triton.jit
def triton_poi_fused__to_copy_1(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:]
    tmp0 = tl.load(in_ptr0 + (xindex), None)
    tl.store(out_ptr0 + (xindex), tmp0, None)
''', device_str='cuda')

def partition_0(args):
    triton_poi_fused_0.run(buf1, 64, stream=stream0)
    _conv_kernel_2.run(buf0, buf1, 8, stream=stream0)
    triton_poi_fused_0.run(buf2, 64, stream=stream0)
    buf3 = extern_kernels.mm(buf1, buf2)
    triton_poi_fused__to_copy_1.run(buf3, buf4, 64, stream=stream0)
    return (buf4, )

async_compile.wait(globals())

class Runner:
    def call(self, args):
        _conv_kernel_2.run(buf0, buf1, 8, stream=stream0)
        return self.partitions[0](args)

def get_args():
    triton_poi_fused_0.run(buf9, 64, stream=stream0)
"""


def test_inductor_launches_counts_a_wrappers_launches_and_fills(tmp_path: Path, capsys) -> None:
    """Launches are counted in ``call`` and the graph partitions it runs, not in the benchmark harness below them;
    a kernel that stores NaN and loads nothing is a fill (Inductor cloning an uninitialised buffer), a copy is not."""
    from benchmarks import inductor_launches

    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "cabc.py").write_text(_WRAPPER)
    (tmp_path / "ab" / "cnone.py").write_text("x = 1\n")
    out = tmp_path / "launches.json"
    assert inductor_launches.main([str(tmp_path), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert len(rows) == 1, rows
    r = rows[0]
    assert r["launches"] == 5 and r["user_launches"] == 2 and r["extern_calls"] == 1, r
    assert r["fill_launches"] == {"nan": 2}, r
    assert r["by_kernel"]["triton_poi_fused"] == 2 and r["by_kernel"]["_conv_kernel"] == 2, r
    assert "fills: 2 of nan" in capsys.readouterr().out
    assert inductor_launches.main([str(tmp_path), "--match", "nothing-has-this"]) == 0
    assert inductor_launches.main([str(tmp_path / "missing")]) == 2
