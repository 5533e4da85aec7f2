"""Shared test set-up: seeding, thread count, Triton's interpreter on CPU-only machines (with cheaper device-function
calls, interpreter_calls.py), the golden data.

The golden data lives in ``shared/golden``, which is not part of this repository. It is looked for, in order, in
``$WTCONVNEXT_SHARED/golden``, then in ``shared/golden`` beside any parent of this file (a fresh clone in CI has
``shared/`` as a sibling of the repository directory), then beside any parent of the local repository this one was
cloned from (``git clone . /tmp/ci-check`` of a checkout that has ``../shared``). Collection fails loudly when it is
missing, rather than silently running no golden test.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any, Optional

import pytest
import torch

if not torch.cuda.is_available():
    # Without a GPU the Triton kernel tests run under Triton's interpreter, which must be switched on before the
    # kernels are decorated, i.e. before wtconvnext is first imported (just below). The CPU reference path, which
    # every other test uses, does not touch Triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    # Device-function calls without the interpreter's per-call re-patching of triton.language (the same code runs;
    # the kernel tests' interpreted time drops by up to 40 %): interpreter_calls.py.
    from interpreter_calls import install as _install_interpreter_calls

    _install_interpreter_calls()

import wtconvnext  # noqa: E402,F401  (registers the models with timm)

# One intra-op thread: the tensors here are small, so a second thread buys little, and with OpenMP's spinning
# barriers every small op stalls whenever another process holds a core (measured: the layer tests ran 0.6 s with
# one thread, 2.5-50 s with two on a busy 2-core machine). WTCONVNEXT_TEST_THREADS overrides.
torch.set_num_threads(int(os.environ.get("WTCONVNEXT_TEST_THREADS", "1")))


def _local_origin() -> Optional[Path]:
    """The directory this checkout was cloned from, when that is a local path (else None)."""
    try:
        url = subprocess.run(["git", "config", "--get", "remote.origin.url"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if url.startswith("file://"):
        url = url[len("file://"):]
    path = Path(url)
    return path.resolve() if url and path.is_absolute() and path.is_dir() else None


def find_golden() -> Path:
    """Return the golden data directory (see the module docstring)."""
    env = os.environ.get("WTCONVNEXT_SHARED")
    candidates = [Path(env) / "golden"] if env else []
    candidates += [p / "shared" / "golden" for p in Path(__file__).resolve().parents]
    origin = _local_origin()
    if origin is not None:
        candidates += [p / "shared" / "golden" for p in (origin, *origin.parents)]
    for c in candidates:
        if (c / "index.json").is_file():
            return c
    raise FileNotFoundError(
        "golden data not found: set WTCONVNEXT_SHARED to the shared/ directory (looked in "
        + ", ".join(str(c) for c in candidates) + ")"
    )


GOLDEN: Path = find_golden()
GOLDEN_INDEX: dict[str, Any] = json.loads((GOLDEN / "index.json").read_text())


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Max abs error relative to the max abs of ``expected`` (robust to entries near zero), in float64."""
    actual, expected = actual.detach().double(), expected.detach().double()
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    scale = expected.abs().max().clamp_min(1e-30)
    return ((actual - expected).abs().max() / scale).item()


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    random.seed(0)
    torch.manual_seed(0)
    try:
        import numpy as np

        np.random.seed(0)
    except ImportError:  # numpy is optional here
        pass


@pytest.fixture(autouse=True)
def _fresh_launch_plans() -> None:
    """No launch plan recorded in one test replays in another: tests swap tuning tables, kernels and launchers, and
    count launches (a replay does not go through ``triton_kernels._launch``)."""
    from wtconvnext.ops import launch_plan

    launch_plan.clear()


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    return GOLDEN
