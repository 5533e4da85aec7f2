#!/usr/bin/env bash
# Carry Triton's compiled kernels from one device call to the next. Every call starts on a fresh machine whose host
# compiles slowly (session 22: one stage shape's kernels took more than 100 s, and benchmarks hit their limits before
# printing a row), so a call that packs the cache lets the next one skip the compiles of unchanged kernels.
#   bash scripts/triton_cache.sh pack OUTDIR    # after a run: OUTDIR/triton_cache.tgz.partNN, 15 MiB each at most
#   bash scripts/triton_cache.sh unpack DIR     # before a run: DIR/triton_cache.tgz.part* into the cache
# The cache is $TRITON_CACHE_DIR, else ~/.triton/cache. Between calls, copy the parts into an ignored folder of the
# repository and name it in the device call's carry list.
set -euo pipefail
cache="${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
case "${1:-}:${2:-}" in
  pack:?*)
    mkdir -p "$2"
    rm -f "$2"/triton_cache.tgz.part*
    if [ -d "$cache" ]; then
      tar -C "$cache" -czf - . | split -b 15m -d - "$2/triton_cache.tgz.part"
      echo "triton_cache.sh: packed $(du -sh "$cache" | cut -f1) of $cache into $(ls "$2"/triton_cache.tgz.part* | wc -l) part(s)"
    else
      echo "triton_cache.sh: no cache at $cache, nothing packed"
    fi
    ;;
  unpack:?*)
    if ls "$2"/triton_cache.tgz.part* >/dev/null 2>&1; then
      mkdir -p "$cache"
      cat "$2"/triton_cache.tgz.part* | tar -C "$cache" -xzf -
      echo "triton_cache.sh: unpacked $(ls "$cache" | wc -l) entries into $cache"
    else
      echo "triton_cache.sh: no cache parts in $2, starting cold"
    fi
    ;;
  *)
    echo "usage: bash scripts/triton_cache.sh pack OUTDIR | unpack DIR" >&2
    exit 2
    ;;
esac
