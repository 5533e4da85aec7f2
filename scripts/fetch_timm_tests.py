"""Fetch timm's own test files for the installed timm version into ``.timm_tests/timm-<version>/``.

timm's wheel has no tests; its source distribution on the package index does (``tests/test_models.py`` is the generic
model test file every timm model passes). ``tests/test_timm_suite.py`` runs that file against the wtconvnext models.
This script downloads the sdist of exactly the installed version with pip and extracts only ``tests/`` and
``pyproject.toml`` (timm's pytest markers), never the ``timm`` package itself, so the tests import the installed timm.

    .venv/bin/python scripts/fetch_timm_tests.py        # scripts/setup.sh runs it

Exit status 0 when the files are there (fetched now or before). On failure it prints why, writes the reason to
``.timm_tests/FETCH_FAILED`` (which the test reports as its skip reason) and exits 1.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEST_ROOT = ROOT / ".timm_tests"
FAILED = DEST_ROOT / "FETCH_FAILED"


def suite_dir(version: str) -> Path:
    """Where the test files of timm ``version`` live once fetched."""
    return DEST_ROOT / f"timm-{version}"


def fetch(version: str) -> Path:
    """Download and extract timm ``version``'s tests; return the directory holding ``tests/test_models.py``."""
    dest = suite_dir(version)
    if (dest / "tests" / "test_models.py").is_file():
        return dest
    DEST_ROOT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=DEST_ROOT) as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet", "--no-deps",
            "--no-binary", ":all:", "--dest", tmp, f"timm=={version}",
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        sdists = sorted(Path(tmp).glob("timm-*.tar.gz"))
        if result.returncode != 0 or not sdists:
            output = (result.stderr or result.stdout).strip().splitlines()
            raise RuntimeError(f"`{' '.join(cmd[2:])}` failed (exit {result.returncode}): {' | '.join(output[-3:])}")
        top = f"timm-{version}"
        wanted = (f"{top}/tests/", f"{top}/pyproject.toml")
        staging = Path(tmp) / "x"
        with tarfile.open(sdists[0]) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(wanted) and (m.isfile() or m.isdir())]
            if not any(m.name == f"{top}/tests/test_models.py" for m in members):
                raise RuntimeError(f"{sdists[0].name} has no {top}/tests/test_models.py")
            if sys.version_info >= (3, 12) or hasattr(tarfile, "data_filter"):
                tar.extractall(staging, members=members, filter="data")
            else:  # Python without extraction filters: the names were checked above, files and directories only
                tar.extractall(staging, members=members)
        if dest.exists():
            shutil.rmtree(dest)
        (staging / top).rename(dest)
    return dest


def main() -> int:
    version = importlib.metadata.version("timm")
    try:
        dest = fetch(version)
    except Exception as exc:  # noqa: BLE001  (any failure is reported, not raised: setup goes on without the suite)
        DEST_ROOT.mkdir(exist_ok=True)
        reason = f"could not fetch timm {version}'s test files: {exc}"
        FAILED.write_text(reason + "\n")
        print(f"fetch_timm_tests: {reason}", file=sys.stderr)
        return 1
    FAILED.unlink(missing_ok=True)
    print(f"fetch_timm_tests: timm {version}'s tests in {dest.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
