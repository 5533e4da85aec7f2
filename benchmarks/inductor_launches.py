"""What a compiled step launches: the kernels in the wrappers Inductor generated, read from its cache.

For each compiled graph (an output-code file with a ``call``), the launches in ``call`` by kernel, the extern calls
(cuBLAS, cuDNN) and, among Inductor's own kernels, the **fills**: kernels that store a constant and load nothing. A
fill of NaN is Inductor cloning an uninitialised buffer before a user kernel writes it (a functional kernel argument
it could not re-inplace: session 35 found one per WTConv output and input gradient, session 36 one per forward
output in training), a write of a whole map that does nothing.

    python benchmarks/inductor_launches.py [CACHE_DIR] [--match _conv_kernel] [--newer FILE] [--json OUT]

CACHE_DIR: ``$TORCHINDUCTOR_CACHE_DIR``, else ``/tmp/torchinductor_$USER``. ``--match``: only wrappers containing
this string (e.g. a WTConv kernel's name); ``--newer``: only wrappers written after FILE (a run's own graphs).
"""

from __future__ import annotations

import argparse
import collections
import getpass
import json
import os
import re
import sys
from pathlib import Path
from typing import Optional

_LAUNCH = re.compile(r"^\s+(\w+)\.run\(", re.M)
_EXTERN = re.compile(r"extern_kernels\.(\w+)\(")
_KERNEL_DEF = re.compile(r"^def (triton_\w+)\(", re.M)


def _call_body(src: str) -> Optional[str]:
    """The source of the wrapper's ``call`` (a method or a function) and of the graph partitions it runs
    (``partition_N``, where Inductor splits a graph for CUDA graphs), each up to the next top-level definition."""
    starts = list(re.finditer(r"^(\s*)def (call|partition_\d+)\(", src, re.M))
    if not starts:
        return None
    parts = []
    for m in starts:
        end = re.search(r"^(def|class|async_compile\.wait)", src[m.end():], re.M)
        parts.append(src[m.start(): m.end() + end.start() if end else len(src)])
    return "\n".join(parts)


def _fills(src: str) -> dict[str, str]:
    """Inductor kernels that store a constant and load nothing, by full name: the constant ('nan', '0.0', ...)."""
    found = {}
    defs = list(_KERNEL_DEF.finditer(src))
    for i, d in enumerate(defs):
        body = src[d.end(): defs[i + 1].start() if i + 1 < len(defs) else len(src)]
        body = body.split("'''", 1)[0]  # the kernel's source ends with its string literal
        if "tl.load" in body or "tl.store" not in body:
            continue
        stored = re.search(r"tl\.store\([^,]+, (\w+)", body)
        value = stored and re.search(rf"^\s+{stored.group(1)} = (.+)$", body, re.M)
        if not value:
            found[d.group(1)] = "?"
            continue
        const = re.search(r"tl\.full\(\[[^\]]*\], ([^,]+),", value.group(1))
        found[d.group(1)] = (const.group(1) if const else value.group(1)).strip().replace('float("nan")', "nan")
    return found


def count(path: Path, src: Optional[str] = None) -> Optional[dict]:
    """Launches of one output-code file (``src``: its text, if already read): totals, by kernel (numbered
    suffixes merged) and its fills; None if it has no ``call``."""
    src = path.read_text(errors="ignore") if src is None else src
    body = _call_body(src)
    if body is None:
        return None
    full = _LAUNCH.findall(body)
    kernels = collections.Counter(re.sub(r"_\d+$", "", n) for n in full)
    extern = collections.Counter("extern_kernels." + m for m in _EXTERN.findall(body))
    fills = _fills(src)
    fill_launches = collections.Counter(fills[n] for n in full if n in fills)
    return {
        "file": str(path),
        "launches": sum(kernels.values()),
        "user_launches": sum(v for k, v in kernels.items() if not k.startswith("triton_")),
        "extern_calls": sum(extern.values()),
        "fill_launches": dict(fill_launches),
        "by_kernel": dict((kernels + extern).most_common()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or f"/tmp/torchinductor_{getpass.getuser()}"
    ap.add_argument("cache", nargs="?", default=default)
    ap.add_argument("--match", default=None, help="only wrappers whose source contains this string")
    ap.add_argument("--newer", default=None, help="only wrappers modified after this file")
    ap.add_argument("--rows", type=int, default=25, help="kernels listed per wrapper")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    root = Path(args.cache)
    if not root.is_dir():
        print(f"inductor_launches.py: no cache directory at {root}", file=sys.stderr)
        return 2
    since = Path(args.newer).stat().st_mtime if args.newer else None
    rows = []
    for p in sorted(root.rglob("*.py"), key=lambda p: p.stat().st_mtime):
        if since is not None and p.stat().st_mtime <= since:
            continue
        src = p.read_text(errors="ignore")
        if args.match and args.match not in src:
            continue
        row = count(p, src)
        if row is not None and row["launches"]:
            rows.append(row)
    for r in rows:
        fills = ", ".join(f"{n} of {c}" for c, n in r["fill_launches"].items()) or "none"
        print(f"== {Path(r['file']).name}: {r['launches']} Triton launches ({r['user_launches']} user kernels), "
              f"{r['extern_calls']} extern calls; fills: {fills}")
        for k, v in list(r["by_kernel"].items())[: args.rows]:
            print(f"    {v:4d} {k}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
