"""train.py, validate.py, the configs and wtconvnext.data, on the CPU.

The scripts run as subprocesses, as a user runs them: that is the only way to test an abrupt exit mid-epoch and a
torchrun launch. Models are tiny (``test_wtconvnext`` at 32px) so that the whole file runs in a few minutes on 2
cores. The embedded digits are written once per session under a temporary ``$WTCONVNEXT_DATA``.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # train.py / validate.py are top-level scripts, not package modules

import train  # noqa: E402
import validate  # noqa: E402
from wtconvnext.data import (  # noqa: E402
    ResumableSampler,
    SeededDataset,
    ShardSampler,
    patch_timm_posterize,
    posterize_compat,
    prepare_digits,
)

# Small but real: every WTConv branch runs (2 levels on the 8x8 first stage); tests switch on the randomness they need.
TINY = ["--model", "test_wtconvnext", "--model-kwargs", '{"wt_levels": [2, 1, 1, 1]}', "--img-size", "32",
        "--crop-pct", "1.0", "--warmup-epochs", "1", "--lr", "2e-3", "--workers", "0", "--device", "cpu",
        "--log-interval", "0", "--no-progress"]


# ----------------------------------------------------------------------------------------------------------------------
# Fixtures and helpers

def _write_image_folder(root: Path, classes: int, per_class: dict[str, int], size: int, seed: int) -> Path:
    """A random ImageFolder: root/<split>/<class>/*.png. Each class gets its own mean colour so a model can learn."""
    rng = np.random.default_rng(seed)
    bases = rng.integers(0, 256, size=(classes, 3))
    for split, n in per_class.items():
        for c, base in enumerate(bases):
            d = root / split / f"class{c}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                noise = rng.integers(-60, 60, size=(size, size, 3))
                pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(d / f"{i}.png")
    return root


@pytest.fixture(scope="session")
def data_env(tmp_path_factory) -> dict[str, str]:
    """Environment for the subprocesses: a private dataset cache and the thread count."""
    env = dict(os.environ)
    env["WTCONVNEXT_DATA"] = str(tmp_path_factory.mktemp("wtdata"))
    # One intra-op thread per process unless WTCONVNEXT_TEST_THREADS says otherwise, as conftest does in-process:
    # with OpenMP's spinning barriers, two threads stall whenever another process holds one of CI's 2 cores.
    env["OMP_NUM_THREADS"] = os.environ.get("WTCONVNEXT_TEST_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> Path:
    """4 classes, 24 train / 6 val images each, 32px."""
    return _write_image_folder(tmp_path_factory.mktemp("tiny"), 4, {"train": 24, "val": 6}, 32, seed=0)


@pytest.fixture(scope="session")
def golden_folder(tmp_path_factory) -> Path:
    """10 classes at 96px: the golden reference model's classes and input size."""
    return _write_image_folder(tmp_path_factory.mktemp("golden96"), 10, {"val": 2}, 96, seed=1)


def run(args: list[str], env: dict[str, str], expect: int = 0, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run a command from the repository root; on an unexpected status, fail with its output."""
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == expect, (
        f"{' '.join(args)}\nexit {proc.returncode} (expected {expect})\n--- stdout\n{proc.stdout[-4000:]}"
        f"\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


def train_cmd(*args: str) -> list[str]:
    return [sys.executable, str(REPO / "train.py"), *args]


def validate_cmd(*args: str) -> list[str]:
    return [sys.executable, str(REPO / "validate.py"), "--device", "cpu", *args]


def read_summary(out: Path) -> list[dict[str, float]]:
    with open(out / "summary.csv", newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_state_equal(a: dict[str, Any], b: dict[str, Any], atol: float = 0.0, what: str = "") -> None:
    assert a.keys() == b.keys(), what
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.allclose(a[k].float(), b[k].float(), rtol=0, atol=atol), \
                f"{what}{k}: max diff {(a[k].float() - b[k].float()).abs().max().item():.3g}"
        elif isinstance(a[k], dict):
            assert_state_equal(a[k], b[k], atol, f"{what}{k}.")
        elif isinstance(a[k], list):
            assert len(a[k]) == len(b[k])
            for i, (x, y) in enumerate(zip(a[k], b[k])):
                assert_state_equal({i: x}, {i: y}, atol, f"{what}{k}.")
        else:
            assert a[k] == b[k], f"{what}{k}: {a[k]} != {b[k]}"


# ----------------------------------------------------------------------------------------------------------------------
# wtconvnext.data

def test_sampler_order_is_a_function_of_seed_and_epoch():
    a, b = ResumableSampler(50, seed=3), ResumableSampler(50, seed=3)
    a.set_epoch(2)
    b.set_epoch(2)
    first = list(a)
    assert first == list(b)
    assert sorted(i for i, _ in first) == list(range(50))
    b.set_epoch(3)
    assert [i for i, _ in b] != [i for i, _ in first]
    assert [i for i, _ in ResumableSampler(50, seed=4)] != [i for i, _ in ResumableSampler(50, seed=3)]
    a.set_epoch(2, start=17)
    assert list(a) == first[17:] and len(a) == 33


def test_sampler_shards_cover_the_global_order():
    """R ranks see the 1-rank order interleaved, with the same per-sample seeds (so DDP = one big batch)."""
    single = ResumableSampler(21, seed=1)
    single.set_epoch(5)
    glob = list(single)
    shards = []
    for rank in range(2):
        s = ResumableSampler(21, seed=1, num_replicas=2, rank=rank)
        s.set_epoch(5)
        shards.append(list(s))
    assert len(shards[0]) == len(shards[1]) == 11  # padded to equal length for DDP lockstep
    interleaved = [p for pair in zip(*shards) for p in pair]
    assert interleaved[:21] == glob


def test_shard_sampler_has_no_duplicates():
    parts = [list(ShardSampler(10, 3, r)) for r in range(3)]
    assert sorted(sum(parts, [])) == list(range(10))


def test_seeded_dataset_reproducible_and_leaves_main_rng_alone():
    class Noisy(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.rand(3), random.random(), np.random.rand()

    ds = SeededDataset(Noisy())
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    expected = (torch.rand(1), random.random(), np.random.rand())
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    x1, x2 = ds[(1, 1234)], ds[(1, 1234)]
    assert torch.equal(x1[0], x2[0]) and x1[1:] == x2[1:]
    assert not torch.equal(ds[(1, 99)][0], x1[0])
    after = (torch.rand(1), random.random(), np.random.rand())
    assert torch.equal(after[0], expected[0]) and after[1:] == expected[1:]


def test_posterize_compat_zero_bits():
    img = Image.new("RGB", (4, 4), (200, 100, 50))
    assert posterize_compat(img, 0).getpixel((0, 0)) == (0, 0, 0)
    assert posterize_compat(img, 1).getpixel((0, 0)) == (128, 0, 0)
    assert posterize_compat(img, 8) is img
    patch_timm_posterize()
    from timm.data import auto_augment

    assert auto_augment.NAME_TO_OP["PosterizeIncreasing"] is posterize_compat


def test_prepare_digits(tmp_path):
    root = prepare_digits(tmp_path / "digits")
    counts = {s: sum(1 for _ in (root / s).rglob("*.png")) for s in ("train", "val")}
    assert counts == {"train": 1437, "val": 360}
    assert sorted(p.name for p in (root / "val").iterdir()) == [str(c) for c in range(10)]
    per_class = [sum(1 for _ in (root / "val" / str(c)).iterdir()) for c in range(10)]
    assert min(per_class) >= 35  # stratified: every class held out in proportion
    img = Image.open(next((root / "train" / "3").iterdir()))
    assert img.size == (32, 32) and img.mode == "RGB"
    mtime = (root / "train").stat().st_mtime
    assert prepare_digits(root) == root and (root / "train").stat().st_mtime == mtime  # cached, not rewritten


def test_prepare_digits_concurrent_writers(tmp_path, data_env):
    """Every torchrun rank calls prepare_digits at once; all must succeed and leave one complete tree."""
    code = "import sys; from wtconvnext.data import prepare_digits; prepare_digits(sys.argv[1])"
    root = tmp_path / "digits"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(root)], env=data_env, cwd=REPO) for _ in range(3)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    assert sum(1 for _ in root.rglob("*.png")) == 1797
    assert [p.name for p in tmp_path.iterdir()] == ["digits"]  # no temporary trees left behind


# ----------------------------------------------------------------------------------------------------------------------
# Arguments and configs

def test_config_values_are_defaults_and_cli_wins(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"model": "test_wtconvnext", "epochs": 7, "lr": 1e-3, "mixup": 0.3}))
    args, used = train.parse_args(["-c", str(cfg), "--data-dir", "x", "--epochs", "2", "--mixup", "0"])
    assert used == str(cfg)
    assert (args.epochs, args.mixup) == (2, 0.0)  # command line beats YAML
    assert (args.model, args.lr) == ("test_wtconvnext", 1e-3)  # YAML beats the parser's defaults
    assert args.weight_decay == 0.05  # untouched default


def test_config_unknown_key_is_an_error(tmp_path):
    cfg = tmp_path / "typo.yaml"
    cfg.write_text("epocs: 3\n")
    with pytest.raises(train.ScriptError, match=r"unknown keys \['epocs'\]"):
        train.parse_args(["-c", str(cfg)])


def test_no_arguments_means_digits_config():
    args, used = train.parse_args([])
    assert Path(used) == REPO / "configs" / "digits.yaml"
    assert args.dataset == "digits" and args.num_classes == 10 and args.model.startswith("wtconvnext")
    args, used = train.parse_args(["--data-dir", "/imagenet"])
    assert used == "" and args.dataset == ""  # a dataset given: plain timm-style defaults, no digits config


@pytest.mark.parametrize("name,drop_path", [("tiny", 0.1), ("small", 0.4), ("base", 0.4)])
def test_in1k_configs_reproduce_the_reference_recipe(name, drop_path):
    cfg_path = REPO / "configs" / f"wtconvnext_{name}_in1k.yaml"
    args, _ = train.parse_args(["-c", str(cfg_path), "--data-dir", "/imagenet"])
    assert args.model == f"wtconvnext_{name}"
    assert args.epochs + (args.warmup_epochs if args.warmup_prefix else 0) == 300
    assert args.warmup_epochs == 20
    assert args.batch_size * 8 * args.grad_accum_steps == 4096  # the documented 8-GPU arithmetic
    assert (args.opt, args.lr, args.weight_decay, args.layer_decay) == ("adamw", 4e-3, 0.05, 1.0)
    assert (args.aa, args.reprob, args.mixup, args.cutmix, args.smoothing) == (
        "rand-m9-mstd0.5-inc1", 0.25, 0.8, 1.0, 0.1)
    assert args.model_ema and args.model_ema_decay == 0.9999
    assert args.sched_on_updates and args.drop_path == drop_path
    assert "4096" in cfg_path.read_text()


# ----------------------------------------------------------------------------------------------------------------------
# Checkpoint files

def test_checkpoint_manager_keeps_last_n_and_best(tmp_path):
    saver = train.CheckpointManager(tmp_path, hist=2)
    for epoch, best in [(0, True), (1, False), (2, True), (3, False)]:
        saver.save({"epoch": epoch, "w": torch.full((2,), float(epoch))}, epoch_end=True, is_best=best)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-2.pth.tar", "checkpoint-3.pth.tar", "last.pth.tar", "model_best.pth.tar"]
    assert load(tmp_path / "model_best.pth.tar")["epoch"] == 2
    saver.save({"epoch": 4, "w": torch.zeros(2)}, epoch_end=False, is_best=False)  # mid-epoch: last only
    assert load(tmp_path / "last.pth.tar")["epoch"] == 4
    assert load(tmp_path / "checkpoint-3.pth.tar")["epoch"] == 3
    assert not list(tmp_path.glob("*.tmp"))


# ----------------------------------------------------------------------------------------------------------------------
# End to end

def test_train_then_validate_tiny_folder(tiny_folder, data_env, tmp_path):
    out = tmp_path / "run"
    proc = run(train_cmd(*TINY, "--data-dir", str(tiny_folder), "-b", "16", "--epochs", "2", "--drop-path", "0.1",
                         "--model-ema", "--model-ema-decay", "0.9", "--log-interval", "2", "--output", str(tmp_path),
                         "--experiment", "run"), data_env)
    assert "Train 1 [4/6] loss" in proc.stderr and "Global batch 16 = 16" in proc.stderr
    names = {p.name for p in out.iterdir()}
    assert {"last.pth.tar", "model_best.pth.tar", "checkpoint-0.pth.tar", "checkpoint-1.pth.tar", "summary.csv",
            "summary.png", "args.yaml"} <= names
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = read_summary(out)
    assert [r["epoch"] for r in rows] == [0, 1]
    assert all(math.isfinite(r[k]) for r in rows for k in ("train_loss", "eval_loss", "eval_ema_loss"))
    ckpt = load(out / "last.pth.tar")
    assert ckpt["arch"] == "test_wtconvnext" and ckpt["next_epoch"] == 2 and ckpt["next_update"] == 0
    assert {"state_dict", "state_dict_ema", "optimizer", "scheduler", "args"} <= ckpt.keys()

    # validate.py reads the model, its kwargs and preprocessing from the checkpoint and reproduces the last
    # epoch's evaluation of the raw (non-EMA) weights exactly; results go to JSON or CSV.
    results = tmp_path / "results.json"
    run(validate_cmd("--checkpoint", str(out / "last.pth.tar"), "--no-use-ema", "--data-dir", str(tiny_folder),
                     "--workers", "0", "--results-file", str(results)), data_env)
    res = json.loads(results.read_text())
    assert res["weights"] == "model" and res["num_images"] == 24
    assert res["top1"] == pytest.approx(rows[-1]["eval_top1"], abs=1e-3)
    assert res["loss"] == pytest.approx(rows[-1]["eval_loss"], rel=1e-4)
    csv_path = tmp_path / "results.csv"
    run(validate_cmd("--checkpoint", str(out / "last.pth.tar"), "--data-dir", str(tiny_folder), "--workers", "0",
                     "--results-file", str(csv_path)), data_env)
    with open(csv_path, newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert row["weights"] == "ema"
    assert float(row["top1"]) == pytest.approx(rows[-1]["eval_ema_top1"], abs=1e-3)

    # The run's data config is in every checkpoint; wtconvnext-convert carries it (and the model) into the
    # converted file, and validate.py evaluates that file at the run's 32 px / crop 1.0 with no flags (the
    # model's own defaults, 160 px / crop 0.875, would give other numbers).
    assert ckpt["data_config"]["input_size"] == [3, 32, 32] and ckpt["data_config"]["crop_pct"] == 1.0
    from wtconvnext.convert import convert_checkpoint

    converted = tmp_path / "run.safetensors"
    convert_checkpoint(out / "last.pth.tar", converted, prefer_ema=False)
    proc = run(validate_cmd("--checkpoint", str(converted), "--data-dir", str(tiny_folder), "--workers", "0",
                            "--results-file", str(results)), data_env)
    assert "Input size (3, 32, 32), crop_pct 1.0" in proc.stdout
    res = json.loads(results.read_text())
    assert (res["model"], res["input_size"], res["crop_pct"]) == ("test_wtconvnext", [3, 32, 32], 1.0)
    assert res["top1"] == pytest.approx(rows[-1]["eval_top1"], abs=1e-3)
    assert res["loss"] == pytest.approx(rows[-1]["eval_loss"], rel=1e-4)

    # A converted-style .safetensors file (flat, native keys) needs the model spelled out on the command line.
    from safetensors.torch import save_file

    flat = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in ckpt["state_dict"].items()}, str(flat))
    run(validate_cmd("--checkpoint", str(flat), *TINY[:4], "--num-classes", "4", "--img-size", "32",
                     "--crop-pct", "1.0", "--data-dir", str(tiny_folder), "--workers", "0",
                     "--results-file", str(results)), data_env)
    res = json.loads(results.read_text())
    assert res["weights"] == "model"
    assert res["top1"] == pytest.approx(rows[-1]["eval_top1"], abs=1e-3)


def test_resume_after_kill_mid_epoch_matches_uninterrupted(tiny_folder, data_env, tmp_path):
    """Everything random is on (drop path, RandAugment, random erasing, mixup / cutmix, EMA, grad accumulation);
    the interrupted run even loads with a worker process. Final weights, EMA, optimizer and logs must agree
    bitwise."""
    recipe = [*TINY, "--data-dir", str(tiny_folder), "-b", "8", "--grad-accum-steps", "2", "--epochs", "2",
              "--drop-path", "0.2", "--aa", "rand-m9-mstd0.5-inc1", "--reprob", "0.25", "--mixup", "0.8",
              "--cutmix", "1.0", "--model-ema", "--model-ema-decay", "0.9", "--output", str(tmp_path),
              "--checkpoint-hist", "1"]
    run(train_cmd(*recipe, "--experiment", "straight"), data_env)
    # 96 images / 8 per batch = 12 batches = 6 updates per epoch; killed at update 9 (epoch 1, update 3), after
    # the mid-epoch checkpoint at epoch 1, update 2.
    run(train_cmd(*recipe, "--experiment", "killed", "--checkpoint-interval", "2", "--stop-after-updates", "9",
                  "--workers", "1"), data_env, expect=train.EXIT_SIMULATED_KILL)
    killed = tmp_path / "killed"
    stopped = load(killed / "last.pth.tar")
    assert (stopped["next_epoch"], stopped["next_update"], stopped["num_updates"]) == (1, 2, 8)
    run(train_cmd(*recipe, "--resume", str(killed / "last.pth.tar")), data_env)

    a, b = load(tmp_path / "straight" / "last.pth.tar"), load(killed / "last.pth.tar")
    assert b["num_updates"] == a["num_updates"] == 12
    for key in ("state_dict", "state_dict_ema", "optimizer"):
        assert_state_equal(a[key], b[key], atol=0.0, what=f"{key}.")
    assert read_summary(tmp_path / "straight") == read_summary(killed)


def test_resume_restores_a_stateful_scheduler(tiny_folder, data_env, tmp_path):
    """The plateau schedule's state is the metric's history. Here top-5 over 4 classes is always 100, so after the
    first epoch (which sets the best) every epoch is a plateau and, with no patience, halves the lr. A run killed in
    epoch 1 and resumed must halve it at the end of epoch 1 as the uninterrupted run does; a resumed run that
    forgot the scheduler would see 100 as a new best there and keep the lr, and its epoch 2 would differ. Resuming
    the finished run then says so and changes nothing."""
    recipe = [*TINY, "--data-dir", str(tiny_folder), "-b", "16", "--epochs", "3", "--warmup-epochs", "0",
              "--sched", "plateau", "--patience-epochs", "0", "--decay-rate", "0.5", "--eval-metric", "top5",
              "--output", str(tmp_path), "--checkpoint-hist", "1"]
    run(train_cmd(*recipe, "--experiment", "straight"), data_env)
    # 96 images / 16 = 6 updates per epoch; killed at update 9 (epoch 1), after the checkpoint at update 8.
    run(train_cmd(*recipe, "--experiment", "killed", "--checkpoint-interval", "2", "--stop-after-updates", "9"),
        data_env, expect=train.EXIT_SIMULATED_KILL)
    killed = tmp_path / "killed"
    assert load(killed / "last.pth.tar")["next_epoch"] == 1
    run(train_cmd(*recipe, "--resume", str(killed / "last.pth.tar")), data_env)

    straight = read_summary(tmp_path / "straight")
    assert [r["lr"] for r in straight] == pytest.approx([2e-3, 1e-3, 5e-4])  # the schedule really is stateful
    assert read_summary(killed) == straight
    a, b = load(tmp_path / "straight" / "last.pth.tar"), load(killed / "last.pth.tar")
    for key in ("state_dict", "optimizer", "scheduler"):
        assert_state_equal(a[key], b[key], atol=0.0, what=f"{key}.")
    assert a["scheduler"]["plateau"]["best"] == 100.0

    before = {p.name: p.stat().st_mtime_ns for p in killed.iterdir()}
    proc = run(train_cmd(*recipe, "--resume", str(killed / "last.pth.tar")), data_env)
    assert "Nothing to do" in proc.stderr and "3 of 3 epochs done" in proc.stderr and "final:" not in proc.stderr
    assert {p.name: p.stat().st_mtime_ns for p in killed.iterdir()} == before


# ----------------------------------------------------------------------------------------------------------------------
# One line for every ordinary mistake


def _train_failing(argv: list[str], capsys) -> str:
    """train.main must exit with status 2 and print exactly one line on stderr; returns that line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        train.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    lines = [line for line in err.strip().splitlines() if "FutureWarning" not in line]
    assert len(lines) == 1 and lines[0].startswith("train.py: error: "), err
    return lines[0]


def test_train_bad_input_is_one_line(tiny_folder, tmp_path, capsys, golden_model_args):
    empty = tmp_path / "empty"
    empty.mkdir()
    base = [*TINY, "-b", "16", "--epochs", "1", "--output", str(tmp_path)]
    data = ["--data-dir", str(tiny_folder)]
    truncated = tmp_path / "truncated.pth.tar"
    truncated.write_bytes(golden_model_args[0].read_bytes()[:5000])
    noise = tmp_path / "noise.pth.tar"
    noise.write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)))
    cases = [
        ([*base, "--data-dir", str(tmp_path / "nowhere")], "data directory", "does not exist"),
        ([*base, "--data-dir", str(empty)], "Found 0 images", str(empty)),
        ([*base, *data, "--model", "wtconvnext_tinyy"], "unknown model 'wtconvnext_tinyy'", "wtconvnext_tiny"),
        (["-c", str(tmp_path / "missing.yaml"), *data], "config file", "does not exist"),
        (["-c", str(REPO / "configs" / "wtconvnext_tiny_in1k.yaml")], "no data: pass --data-dir", ""),
        ([*base, *data, "--resume", str(tmp_path / "nope.pth.tar")], "no such file", "nope.pth.tar"),
        ([*base, *data, "--resume", str(tmp_path)], "no such file", "last.pth.tar"),
        ([*base, *data, "--resume", str(truncated)], "truncated or corrupt", str(truncated)),
        ([*base, *data, "--resume", str(noise)], "not a valid checkpoint", str(noise)),
        ([*base, *data, "--resume", str(golden_model_args[0])], "not a train.py checkpoint", "--initial-checkpoint"),
        ([*base, *data, "--initial-checkpoint", str(golden_model_args[0])], "checkpoint does not fit",
         "mis-shaped key(s)"),
        ([*base, *data, "--epochs", "x"], "invalid int value: 'x'", "see --help"),
    ]
    for argv, *fragments in cases:
        line = _train_failing(argv, capsys)
        for fragment in fragments:
            assert fragment in line, (argv, line)


def test_train_resume_with_other_model_flags_is_one_line(tiny_folder, tmp_path, capsys):
    """Resuming with flags that build another model (here 3 levels where the run had 2) names the keys that differ."""
    import timm

    model = timm.create_model("test_wtconvnext", num_classes=4, wt_levels=[2, 1, 1, 1])
    run_dir = tmp_path / "one"
    run_dir.mkdir()
    torch.save({"state_dict": model.state_dict(), "optimizer": {}, "next_epoch": 1, "next_update": 0,
                "num_updates": 2, "global_batch": 48}, run_dir / "last.pth.tar")
    other = [a if a != '{"wt_levels": [2, 1, 1, 1]}' else '{"wt_levels": [3, 1, 1, 1]}' for a in TINY]
    line = _train_failing([*other, "--data-dir", str(tiny_folder), "-b", "48", "--epochs", "2", "--resume",
                           str(run_dir)], capsys)
    assert "checkpoint does not fit test_wtconvnext" in line
    assert "mis-shaped key(s): stages.0.blocks.0.conv_dw.wavelet_weight (2, 24, 4, 5, 5) vs model (3, 24, 4, 5, 5)" \
        in line


def test_train_script_entry_point_prints_no_traceback(data_env, tmp_path):
    proc = run(train_cmd("--data-dir", str(tmp_path / "nowhere"), "--model", "test_wtconvnext", "--device", "cpu"),
               data_env, expect=2)
    assert proc.stderr.strip().splitlines()[-1] == (
        f"train.py: error: data directory '{tmp_path / 'nowhere'}' does not exist")
    assert "Traceback" not in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_processes_matches_one(tiny_folder, data_env, tmp_path):
    """torchrun with 2 CPU processes (gloo) and 8 images each per step equals 1 process with 16: same samples,
    same augmentations, gradients averaged. Drop path and mixup are per-process randomness, so they are off."""
    common = [*TINY, "--data-dir", str(tiny_folder), "--epochs", "2", "--drop-path", "0", "--aa",
              "rand-m9-mstd0.5-inc1", "--reprob", "0.25", "--smoothing", "0.1", "--output", str(tmp_path)]
    run(train_cmd(*common, "-b", "16", "--experiment", "one"), data_env)
    run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
         f"--master-port={_free_port()}", str(REPO / "train.py"), *common, "-b", "8", "--experiment", "two"],
        data_env)
    one, two = read_summary(tmp_path / "one"), read_summary(tmp_path / "two")
    assert len(one) == len(two) == 2
    for r1, r2 in zip(one, two):
        for key in ("train_loss", "eval_loss"):
            assert r2[key] == pytest.approx(r1[key], rel=1e-4), key
        # Weights agree to ~1e-6, so at most a near-tie among the 24 images may flip.
        assert r2["eval_top1"] == pytest.approx(r1["eval_top1"], abs=100 / 24 + 1e-6)
    assert_state_equal(load(tmp_path / "one" / "last.pth.tar")["state_dict"],
                       load(tmp_path / "two" / "last.pth.tar")["state_dict"], atol=1e-4)
    args = yaml.safe_load((tmp_path / "two" / "args.yaml").read_text())
    assert args["world_size"] == 2 and args["distributed"]


def test_digits_default_learns(data_env, tmp_path):
    """The README's main job, shortened to 2 epochs: it must clearly learn, and validate.py (no --data-dir: the
    digits val split) must agree with the run's own evaluation."""
    run(train_cmd("--epochs", "2", "--warmup-epochs", "1", "--no-progress", "--device", "cpu",
                  "--output", str(tmp_path), "--experiment", "digits"), data_env)
    rows = read_summary(tmp_path / "digits")
    assert len(rows) == 2
    assert rows[-1]["eval_top1"] > 60.0, rows
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    results = tmp_path / "digits.json"
    run(validate_cmd("--checkpoint", str(tmp_path / "digits" / "last.pth.tar"), "--workers", "0",
                     "--results-file", str(results)), data_env)
    res = json.loads(results.read_text())
    assert res["num_images"] == 360
    assert res["top1"] == pytest.approx(rows[-1]["eval_top1"], abs=1e-3)


@pytest.fixture(scope="module")
def golden_model_args(golden_dir) -> tuple[Path, list[str]]:
    (entry,) = [m for m in json.loads((golden_dir / "index.json").read_text())["models"] if m["name"] == "small_odd"]
    kwargs = {k: v for k, v in entry["kwargs"].items() if k != "num_classes"}
    args = ["--model", "wtconvnext_tiny", "--num-classes", str(entry["kwargs"]["num_classes"]), "--img-size",
            str(entry["input_shape"][-1]), "--model-kwargs", json.dumps(kwargs), "--workers", "0"]
    return golden_dir / entry["checkpoint"], args


def test_load_model_weights_reproduces_golden_logits(golden_dir, golden_model_args):
    """validate.py's loading path (reference .pth -> unwrap -> checkpoint_filter_fn) gives the reference's logits."""
    import timm
    from safetensors.torch import load_file

    ckpt, _ = golden_model_args
    model = timm.create_model("wtconvnext_tiny", num_classes=10, depths=(1, 1, 2, 1), dims=(16, 32, 64, 128))
    assert validate.load_model_weights(model, ckpt) == "ema"
    io = load_file(str(golden_dir / "model_small_odd_io.safetensors"))
    with torch.no_grad():
        logits = model.double().eval()(io["x"].double())
    torch.testing.assert_close(logits, io["logits"].double(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("data", ["generated", "digits"])
def test_validate_golden_reference_checkpoint(data, golden_model_args, golden_folder, data_env, tmp_path):
    ckpt, args = golden_model_args
    data_args = ["--data-dir", str(golden_folder)] if data == "generated" else []  # none: digits val split
    results = tmp_path / "r.json"
    proc = run(validate_cmd("--checkpoint", str(ckpt), *args, *data_args, "--results-file", str(results)), data_env)
    res = json.loads(results.read_text())
    assert res["num_images"] == (20 if data == "generated" else 360)
    assert math.isfinite(res["loss"]) and 0.0 <= res["top1"] <= res["top5"] <= 100.0
    assert res["weights"] == "ema" and res["img_size"] == 96
    assert "top-1" in proc.stdout and "images/s" in proc.stdout
