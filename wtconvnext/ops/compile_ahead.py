"""Cold start: a pass's Triton kernels compiled side by side in threads, the training backward's while the forward runs.

On a machine whose Triton cache is empty, every kernel specialisation compiles the first time it is launched, one
after another on the launching thread. The weight-gradient kernel alone takes 45-50 s per channel count (sm_90 on a
CPU machine), almost all of it in Triton's TritonGPUCoalesce pass, and WTConvNeXt-T has four channel counts: its
first eager training step waited minutes on compiles done in series.

The first time a pass of a new launch-plan signature runs on a GPU (``launch_plan.planned``'s ``first``), it is dry-run
on meta tensors (:func:`~wtconvnext.ops.triton_kernels.collected_launches`: the same launcher code, nothing
launched, nothing allocated), and every kernel it needs that is not compiled yet goes to a pool of compile threads
(``JITFunction.warmup``: Triton's own compile and cache, so the launch that follows finds the kernel there). The
pass waits for its own kernels, then runs. A training forward also dry-runs its backward (a stand-in dy of the
input's shape) and leaves those compiles running: they overlap the rest of the forward, and the backward's first
launch of each waits for its compile only if it is still running. Triton's compiler releases the GIL in its MLIR
passes, so threads compile in parallel (``benchmarks/compile_ahead_cpu.py``: a WTConvNeXt-T AMP training step's 30
kernel specialisations, sm_90, took 229 s in series and 113 s in two threads on a 2-core machine; the longest
single compile 49 s).

``WTCONVNEXT_COMPILE_THREADS`` (read at import): the pool's size; ``auto`` for ``min(8, CPUs)``, the CPUs shared
among torchrun's processes on the host (``LOCAL_WORLD_SIZE``). Default 0, off (each kernel compiles at its first
launch, as Triton does): on the H200 (session 32, torch 2.11, triton 3.6) an eager WTConvNeXt-T first step did not
finish within 250 s with it on either, and its GPU test failed in a run cut before the failure's traceback; opt-in
until a GPU run shows it working. Compiles still running when the interpreter exits are waited for; queued ones are
dropped.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from . import launch_plan as _plan
from . import triton_kernels as _tk

__all__ = ["THREADS", "applies", "dry_run", "submit", "warm_pass"]


def _default_threads() -> int:
    """min(8, the CPUs this process may use / the processes torchrun starts on this host)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        ranks = max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)
    except ValueError:
        ranks = 1
    return max(1, min(8, cpus // ranks))


def _threads_from_env() -> int:
    value = os.environ.get("WTCONVNEXT_COMPILE_THREADS", "0")
    if value == "auto":
        return _default_threads()
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"WTCONVNEXT_COMPILE_THREADS must be 'auto' or a whole number of threads (0: off), got {value!r}") from None


THREADS = _threads_from_env()
_pool: Optional[ThreadPoolExecutor] = None
_lock = threading.Lock()


class _Pending:
    """A kernel compiling in the pool: :meth:`wait` returns once it is done, whether or not it compiled (a failed
    compile is left to the launch itself, which then compiles on its own thread and raises Triton's error there)."""

    __slots__ = ("future",)

    def __init__(self, future: Future) -> None:
        self.future = future

    def wait(self) -> None:
        try:
            self.future.result()
        except Exception:  # noqa: BLE001 - see the class docs
            pass


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="wtconvnext-compile")
            register = getattr(threading, "_register_atexit", None)
            if register is not None:  # before concurrent.futures' own exit hook: drop what has not started
                register(lambda: _pool.shutdown(wait=False, cancel_futures=True))
        return _pool


def applies(x: Tensor) -> bool:
    """Whether a first pass over ``x`` compiles ahead: a CUDA tensor, kept kernels (compiled Triton, not the
    interpreter), eager launches (not traced, not inside a pass being recorded), a pool of at least one thread."""
    return x.is_cuda and _ready()


def _ready() -> bool:
    return (THREADS > 0 and _tk._FAST_LAUNCH and not _tk._TRACED.on and _tk._COLLECT.launches is None
            and _plan.recording() is None)


def _compile(fn: Any, grid: tuple[int, ...], args: tuple, warps: int, consts: dict, device: int) -> None:
    # A tensor stands in as its dtype (Triton's MockTensor: 16-byte aligned, as submit() requires).
    with torch.cuda.device(device):
        fn.warmup(*args, grid=grid, **consts, **_tk.launch_options(fn, warps, consts, args[0]))


def submit(launches: Sequence[tuple]) -> list[_Pending]:
    """Compile in the pool each kernel of ``launches`` (as :func:`~wtconvnext.ops.triton_kernels.collected_launches`
    lists them) that is neither kept nor already compiling; returns what those launches wait for."""
    device = _tk._device_index()
    waits = []
    for fn, grid, args, warps, consts in launches:
        if any(isinstance(a, Tensor) and a.data_ptr() & 15 for a in args):
            continue  # a stand-in is aligned: this one's specialisation compiles at its launch
        key, _ = _tk.kept_key(fn, args, warps, consts, device)
        if key in _tk._COMPILED:
            continue
        pending = _tk._PENDING.get(key)
        if pending is None:
            stand_in = tuple(a.dtype if isinstance(a, Tensor) else a for a in args)
            pending = _tk._PENDING[key] = _Pending(
                _executor().submit(_compile, fn, grid, stand_in, warps, dict(consts), device))
        waits.append(pending)
    return waits


def dry_run(core: Callable[..., Any], inputs: Sequence[Optional[Tensor]], consts: Sequence[Any]) -> tuple[list, Any]:
    """(the launches of ``core(*inputs, *consts)``, its outputs), nothing launched (outputs uninitialised)."""
    with _tk.collected_launches() as found:
        outs = core(*inputs, *consts)
    return found, outs


def _meta(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.detach().to("meta")


def warm_pass(core: Callable[..., Any], inputs: Sequence[Optional[Tensor]], consts: Sequence[Any],
              then: Optional[Callable[[tuple, Sequence[Any], Any], tuple]] = None) -> None:
    """Compile the kernels of the pass ``core(*inputs, *consts)`` in the pool and wait for them. ``then``: given the
    dry run's inputs, consts and outputs, (core, inputs, consts) of a pass that will follow (the training
    backward), whose kernels are queued too but not waited for.

    The dry runs take meta copies of the inputs (sizes, strides and dtypes, no memory: a first step allocates
    nothing more on the GPU), so a real input off 16-byte alignment compiles at its launch. Best effort: whatever
    goes wrong here is left to the pass itself, which runs next and raises its own errors. Does nothing where
    :func:`applies` says no (the launch plans call this at every signature's first pass)."""
    if not inputs or inputs[0] is None or not applies(inputs[0]):
        return
    try:
        meta = tuple(_meta(t) for t in inputs)
        launches, outs = dry_run(core, meta, consts)
        waits = submit(launches)
    except Exception:  # noqa: BLE001 - see the docstring
        return
    if then is not None:
        try:
            submit(dry_run(*then(meta, consts, outs))[0])
        except Exception:  # noqa: BLE001
            pass
    for pending in waits:
        pending.wait()
