#!/usr/bin/env bash
# Set up a fresh machine for wtconvnext: a .venv at the repository root with PyTorch and the package (editable,
# with the dev extras: pytest, the train and export extras) and timm's own test files. Safe to re-run: an existing
# .venv is reused and pip skips what is already installed.
#
#   bash scripts/setup.sh            # then: .venv/bin/python -m pytest -q -n auto
#
# PYTHON (default python3) picks the interpreter that creates the venv.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
# No pip cache: where torch cannot come from the machine's local index it is a multi-GB download from PyPI, and a
# cached copy beside the installed one once filled a CI machine's disk (OSError 28 during the torch install).
export PIP_NO_CACHE_DIR=1
free_mb=$(df -Pm . | awk 'NR == 2 {print $4}')
if [ "${free_mb:-0}" -lt 12000 ] && [ ! -x .venv/bin/python ]; then
    echo "setup: warning: ${free_mb} MB free here; a venv with a CUDA build of torch downloaded from PyPI needs ~12 GB" >&2
fi
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv .venv
fi

# torch / torchvision first, pinned: these releases lie on the development machines' disk (pip is capped at them
# there), and letting the project's torch range resolve them instead could pull a different multi-GB build.
.venv/bin/python -m pip install --disable-pip-version-check -q "torch==2.14.1" "torchvision==0.29.1"
.venv/bin/python -m pip install --disable-pip-version-check -q -e ".[dev]"
# timm's own model tests (tests/test_timm_suite.py runs them on our models): its sdist holds them, its wheel does not.
# Fetched for exactly the installed timm version into .timm_tests/; a failure is reported, not fatal.
.venv/bin/python scripts/fetch_timm_tests.py || echo "setup: continuing without timm's test files (tests/test_timm_suite.py will skip)"
.venv/bin/python -c "import torch, timm, wtconvnext; print(f'setup: torch {torch.__version__}, timm {timm.__version__}, wtconvnext {wtconvnext.__version__}')"
