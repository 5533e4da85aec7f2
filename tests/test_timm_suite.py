"""timm's own model test suite on the wtconvnext models.

timm ships ``tests/test_models.py`` in its source distribution, the generic file every timm model passes (forward,
backward, default cfgs and the model API contract, TorchScript, torch.fx, features_only, forward_intermediates,
pruning, head width, ...). ``scripts/fetch_timm_tests.py`` (run by ``scripts/setup.sh``) fetches the file of exactly
the installed timm version into ``.timm_tests/``; this test runs it, unmodified, in a subprocess with
``tests/timm_suite_plugin.py``, which registers our models and treats ``wtconvnext`` as timm's file treats
``convnext`` (see the plugin). The selection defaults to the small models, ``wtconvnext_atto`` and
``test_wtconvnext`` (about 20 s); ``WTCONVNEXT_TIMM_SUITE_K`` replaces the ``-k`` expression, e.g. ``wtconvnext`` for
every registered model (README, "timm's own tests"). The test skips only when the files could not be fetched, with the
reason.
"""

from __future__ import annotations

import collections
import importlib.metadata
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import fetch_timm_tests  # noqa: E402

DEFAULT_SELECTION = "wtconvnext_atto or test_wtconvnext"

# Test functions of timm's file that must run (not skip) on each selected model: every per-model test that applies
# to a CNN classifier with a feature pyramid.
PER_MODEL_TESTS = (
    "test_model_forward",
    "test_model_backward",
    "test_model_default_cfgs",
    "test_model_forward_torchscript",
    "test_model_forward_features",
    "test_model_forward_intermediates_features",
    "test_model_forward_intermediates",
    "test_prune_intermediate_layers_contract",
    "test_model_forward_fx",
    "test_model_backward_fx",
    "test_model_forward_fx_torchscript",
)
# Tests that name convnext_atto / test_convnext, which the plugin extends to our counterparts.
NAMED_TESTS = {
    "wtconvnext_atto": (
        "test_features_only_grad_checkpointing_backward",
        "test_model_features_output_stride",
        "test_prune_intermediate_layers_params_used",
        "test_head_hidden_size",
        "test_catavgmax_unsupported",
    ),
    "test_wtconvnext": ("test_reset_classifier_keeps_pool",),
}


def _suite_dir() -> Path:
    version = importlib.metadata.version("timm")
    try:
        return fetch_timm_tests.fetch(version)
    except Exception as exc:  # noqa: BLE001
        reason = f"timm {version}'s test files could not be fetched ({exc})"
        if fetch_timm_tests.FAILED.is_file():
            reason += f"; setup reported: {fetch_timm_tests.FAILED.read_text().strip()}"
        pytest.skip(reason)


def _run_timm_suite(selection: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[tuple[str, str]]]:
    suite = _suite_dir()
    junit = tmp_path / "timm_suite.xml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")])))
    cmd = [
        sys.executable, "-m", "pytest", "tests/test_models.py", "-p", "timm_suite_plugin", "-k", selection,
        "-q", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning", "-W", "ignore::FutureWarning",
        f"--junitxml={junit}", "-o", "junit_family=xunit2",
    ]
    result = subprocess.run(cmd, cwd=suite, env=env, capture_output=True, text=True, timeout=3000)
    cases = []
    if junit.is_file():
        for case in ET.parse(junit).getroot().iter("testcase"):
            outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
            cases.append((case.get("name"), outcome))
    return result, cases


def test_timm_model_suite(tmp_path: Path) -> None:
    selection = os.environ.get("WTCONVNEXT_TIMM_SUITE_K", DEFAULT_SELECTION)
    result, cases = _run_timm_suite(selection, tmp_path)
    counts = collections.Counter(outcome for _, outcome in cases)
    summary = result.stdout.strip().splitlines()[-1:] or result.stderr.strip().splitlines()[-1:]
    print(f"timm {importlib.metadata.version('timm')} tests/test_models.py -k {selection!r}: {dict(counts)} {summary}")
    bad = [f"{name}: {outcome}" for name, outcome in cases if outcome in ("failure", "error")]
    assert result.returncode == 0 and not bad, (
        f"timm's test suite failed ({dict(counts)}):\n" + "\n".join(bad) + "\n" + result.stdout[-6000:] + result.stderr[-2000:]
    )

    # Nothing that should run was skipped or left out of the selection.
    ran = {name for name, outcome in cases if outcome == "passed"}
    models = re.findall(r"(?:wtconvnext_\w+|test_wtconvnext)", selection) if selection != "wtconvnext" else []
    for model in models:
        for test in PER_MODEL_TESTS:
            assert any(n.startswith(test + "[") and re.search(rf"[-\[]{model}(\.|\]|-)", n) for n in ran), (test, model)
        for test in NAMED_TESTS.get(model, ()):
            assert any(n.startswith(test + "[") and model in n for n in ran), (test, model)
    assert counts["skipped"] == 0, [n for n, o in cases if o == "skipped"]
