#!/usr/bin/env bash
# Carry Triton's compiled kernels from one device call to the next. Every call starts on a fresh machine whose host
# compiles slowly (session 22: one stage shape's kernels took more than 100 s, and benchmarks hit their limits before
# printing a row), so a call that packs the cache lets the next one skip the compiles of unchanged kernels.
#   bash scripts/triton_cache.sh pack OUTDIR    # after a run: OUTDIR/triton_cache.tgz.partNN, 15 MiB each at most
# pack keeps what a cached kernel loads from: each kernel's metadata and group (.json), its binary (.cubin) and its
# TTIR (.ttir, which tests read back); Triton skips a group's missing files (LLVM IR, PTX, TTGIR, source: most of
# the bytes). Session 25's whole cache packed to 177 MB, over what a device call returns (8 files of 16 MiB).
#   bash scripts/triton_cache.sh unpack DIR     # before a run: DIR/triton_cache.tgz.part* into the cache
# The cache is $TRITON_CACHE_DIR, else ~/.triton/cache. Between calls, copy the parts into an ignored folder of the
# repository and name it in the device call's carry list.
# Inductor's cache ($TORCHINDUCTOR_CACHE_DIR, else /tmp/torchinductor_$USER: compiled graphs, their wrappers and
# Inductor's own kernels) travels beside it as inductor.tgz.partNN: without it a compiled WTConvNeXt-T's first step
# took more than 170 s on an H100 (session 34), with it the graphs load from the cache.
set -euo pipefail
cache="${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
icache="${TORCHINDUCTOR_CACHE_DIR:-/tmp/torchinductor_$(id -un)}"
case "${1:-}:${2:-}" in
  pack:?*)
    mkdir -p "$2"
    rm -f "$2"/triton_cache.tgz.part*
    if [ -d "$cache" ]; then
      (cd "$cache" && find . -type f \( -name '*.json' -o -name '*.cubin' -o -name '*.ttir' \) -print0 \
        | tar --null -T - -czf -) | split -b 15m -d - "$2/triton_cache.tgz.part"
      echo "triton_cache.sh: packed $(du -sh "$cache" | cut -f1) of $cache into $(ls "$2"/triton_cache.tgz.part* | wc -l) part(s)"
    else
      echo "triton_cache.sh: no cache at $cache, nothing packed"
    fi
    rm -f "$2"/inductor.tgz.part*
    if [ -d "$icache" ]; then
      tar -C "$icache" -czf - . | split -b 15m -d - "$2/inductor.tgz.part"
      echo "triton_cache.sh: packed Inductor's $icache into $(ls "$2"/inductor.tgz.part* | wc -l) part(s)"
    fi
    ;;
  unpack:?*)
    if ls "$2"/triton_cache.tgz.part* >/dev/null 2>&1; then
      mkdir -p "$cache"
      cat "$2"/triton_cache.tgz.part* | tar -C "$cache" -xzf -
      # A group lists its files by absolute path: point them into this cache (it may sit elsewhere than where
      # they were packed) and drop the files pack left out (triton >= 3.7 misses a group with a file gone).
      "${PYTHON:-python3}" - "$cache" <<'PY'
import json, pathlib, sys
for grp in pathlib.Path(sys.argv[1]).glob("*/__grp__*.json"):
    names = json.loads(grp.read_text())["child_paths"]
    kept = {n: str(grp.parent / n) for n in names if (grp.parent / n).exists()}
    grp.write_text(json.dumps({"child_paths": kept}))
PY
      echo "triton_cache.sh: unpacked $(ls "$cache" | wc -l) entries into $cache"
    else
      echo "triton_cache.sh: no cache parts in $2, starting cold"
    fi
    if ls "$2"/inductor.tgz.part* >/dev/null 2>&1; then
      mkdir -p "$icache"
      cat "$2"/inductor.tgz.part* | tar -C "$icache" -xzf -
      echo "triton_cache.sh: unpacked Inductor's cache into $icache"
    fi
    ;;
  *)
    echo "usage: bash scripts/triton_cache.sh pack OUTDIR | unpack DIR" >&2
    exit 2
    ;;
esac
