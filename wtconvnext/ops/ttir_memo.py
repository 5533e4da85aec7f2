"""Memoised kernel analysis for this package's kernels under ``torch.compile``: compile time only, not numerics.

To learn which arguments a ``wrap_triton`` launch reads and writes, torch.compile generates the kernel's TTIR and
walks it at every launch site, and again in each pass that needs it (functionalisation, AOTAutograd's metadata and
joint-graph traces, Inductor's lowering), with no cache (``torch._higher_order_ops.triton_kernel_wrap``:
``identify_accessed_tensors``, ``identify_mutated_tensors`` before torch 2.12, each generating the TTIR). A WTConvNeXt-T
train step has about 850 such calls; on the H200's host its first compiled step took more than five minutes,
against 41 s for ConvNeXt-T.

The result depends only on the kernel, its constexprs, Triton's specialisation of its other arguments (a tensor's dtype; an
int's being 1, a multiple of 16, or past 32 bits) and which arguments are tensors. Keyed on exactly those, one
analysis serves every launch site of a kernel configuration. Other kernels pass straight through.
"""

from __future__ import annotations

import copy
import functools
import threading
from typing import Any, Callable, Optional

import torch

__all__ = ["install", "launch_key", "MEMOISED"]

# The analysis function memoised, by its name in torch._higher_order_ops.triton_kernel_wrap across torch versions,
# each (kernel, kwargs, TMA descriptor metadata): a hit returns a fresh copy. (generate_ttir, which they call, is left
# alone: with the analysis memoised it is called only on a miss.)
MEMOISED = ("identify_accessed_tensors", "identify_mutated_tensors")

_MAX_KEPT = 1024  # configurations held: bound it for workloads of ever-new constexprs
_lock = threading.Lock()


def _jit_function(kernel: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The ``JITFunction`` under an autotuner, with the arguments generate_ttir traces it with (an autotuner's
    first config, as generate_ttir takes)."""
    while not hasattr(kernel, "params") and hasattr(kernel, "fn"):
        configs = getattr(kernel, "configs", None)
        if configs:
            kwargs = {**kwargs, **configs[0].kwargs}
        kernel = kernel.fn
    return kernel, kwargs


def _ours(fn: Any) -> bool:
    py = getattr(fn, "fn", None)
    return getattr(py, "__module__", "").startswith("wtconvnext.")


def _arg_key(value: Any, constexpr: bool) -> Any:
    """What of one argument the TTIR can depend on."""
    if constexpr or value is None or isinstance(value, (bool, str)):
        return ("c", repr(value))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym",)  # generate_ttir stands a plain 2 in for every symbol
    if isinstance(value, int):
        return ("i", value == 1, value % 16 == 0, -(2**31) <= value < 2**31)
    if isinstance(value, float):
        return ("f",)
    dtype = getattr(value, "dtype", None)  # a (fake) tensor or an Inductor TensorBox
    if dtype is not None:
        # Whether it is a Tensor too: older analyses report only the Tensor arguments, not the TensorBoxes.
        return ("t", str(dtype), isinstance(value, torch.Tensor))
    return ("?", type(value).__name__, repr(value))


def _keyed(kernel: Any, kwargs: dict[str, Any], tma: Any) -> Optional[tuple[Any, tuple]]:
    """(the JITFunction, the memo key) of a launch, or None when it must not be memoised."""
    # By the JITFunction: torch wraps each launch's kernel in an autotuner of its own (one config: the launch's
    # num_warps and such, which the TTIR does not depend on).
    kernel, kwargs = _jit_function(kernel, kwargs)
    if not _ours(kernel) or tma:
        return None
    names = getattr(kernel, "arg_names", None)
    params = getattr(kernel, "params", None)
    # Extra names are launch options (num_warps...), which the analysis drops: they do not change the TTIR.
    if names is None or params is None or not set(names) <= set(kwargs):
        return None
    return kernel, (id(kernel), tuple(kwargs)) + tuple(
        (n, _arg_key(kwargs[n], bool(getattr(p, "is_constexpr", False)))) for n, p in zip(names, params)
    )


def launch_key(kernel: Any, kwargs: dict[str, Any], tma: Any = None) -> Optional[tuple]:
    """The memo key of a launch of ``kernel`` (a ``triton.JITFunction`` or an autotuner of one) with ``kwargs``,
    or None when it is not one of this package's kernels (or the arguments are not the kernel's parameters) and must
    not be memoised."""
    keyed = _keyed(kernel, kwargs, tma)
    return None if keyed is None else keyed[1]


def _memoised(real: Callable) -> Callable:
    memo: dict[tuple, tuple[Any, Any]] = {}

    @functools.wraps(real)
    def memoised(kernel, kwargs, *args, **kw):
        keyed = _keyed(kernel, kwargs, args[0] if args else kw.get("tma_descriptor_metadata"))
        if keyed is None:
            return real(kernel, kwargs, *args, **kw)
        jit, key = keyed
        with _lock:
            hit = memo.get(key)
        if hit is not None and hit[0] is jit:
            memoised.hits += 1
            return copy.deepcopy(hit[1])
        out = real(kernel, kwargs, *args, **kw)
        with _lock:
            if len(memo) >= _MAX_KEPT:
                memo.clear()
            memo[key] = (jit, out)  # the kernel is held, so its id is not reused while the entry lives
        memoised.misses += 1
        return copy.deepcopy(out)

    memoised.hits = memoised.misses = 0
    memoised.wtconvnext_memo = True
    return memoised


def install() -> list[str]:
    """Memoise torch's analysis of this package's kernels (idempotent). Returns the names memoised: none where
    this torch has none of them (compiles then only take longer)."""
    try:
        import torch._higher_order_ops.triton_kernel_wrap as tkw
    except ImportError:  # pragma: no cover - torch without user-defined Triton kernel support
        return []
    done = []
    for name in MEMOISED:
        real = getattr(tkw, name, None)
        if real is None:
            continue
        if not getattr(real, "wtconvnext_memo", False):
            setattr(tkw, name, _memoised(real))
        done.append(name)
    return done
