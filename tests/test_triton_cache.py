"""scripts/triton_cache.sh: a packed cache keeps what a cached kernel loads from, and unpacks anywhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "triton_cache.sh"
HASH = "A" * 52  # Triton names a kernel's folder by a 52-character base32 hash


def _run(*args: str, cache: Path, inductor: Path | None = None) -> None:
    env = {"PATH": "/usr/bin:/bin", "TRITON_CACHE_DIR": str(cache), "PYTHON": sys.executable,
           "TORCHINDUCTOR_CACHE_DIR": str(inductor or cache.parent / "no_inductor_cache")}
    proc = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_pack_keeps_binaries_and_unpack_repoints_the_groups(tmp_path: Path) -> None:
    src = tmp_path / "packed_from" / HASH
    src.mkdir(parents=True)
    files = {"k.json": "{}", "k.cubin": "\x7fELF", "k.ttir": "module", "k.llir": "ll", "k.ptx": "ptx", "k.source": "s"}
    for name, text in files.items():
        (src / name).write_text(text)
    (src / "__grp__k.json").write_text(json.dumps({"child_paths": {n: str(src / n) for n in files}}))
    parts = tmp_path / "parts"
    _run("pack", str(parts), cache=src.parent)
    assert sorted(p.name for p in parts.iterdir()) == ["triton_cache.tgz.part00"]
    dst = tmp_path / "elsewhere"
    _run("unpack", str(parts), cache=dst)
    got = dst / HASH
    assert sorted(p.name for p in got.iterdir()) == ["__grp__k.json", "k.cubin", "k.json", "k.ttir"]
    group = json.loads((got / "__grp__k.json").read_text())["child_paths"]
    # every listed file exists where Triton looks (triton >= 3.7 misses a group with a file gone)
    assert group == {n: str(got / n) for n in ("k.json", "k.cubin", "k.ttir")}


def test_inductor_cache_travels_beside(tmp_path: Path) -> None:
    """Inductor's cache (compiled graphs) is packed into parts of its own and unpacked into the Inductor cache dir."""
    ind = tmp_path / "inductor"
    (ind / "fx" / "ab").mkdir(parents=True)
    (ind / "fx" / "ab" / "graph.py").write_text("def call(args): pass")
    parts = tmp_path / "parts"
    _run("pack", str(parts), cache=tmp_path / "no_triton_cache", inductor=ind)
    assert sorted(p.name for p in parts.iterdir()) == ["inductor.tgz.part00"]
    dst = tmp_path / "inductor_elsewhere"
    _run("unpack", str(parts), cache=tmp_path / "triton_elsewhere", inductor=dst)
    assert (dst / "fx" / "ab" / "graph.py").read_text() == "def call(args): pass"
