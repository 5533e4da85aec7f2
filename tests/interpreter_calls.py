"""Cheaper device-function calls under Triton's interpreter (TRITON_INTERPRET=1, the CPU test runs).

The interpreter re-patches ``triton.language`` for every call of a ``@triton.jit`` device function
(``InterpretedFunction.__call__`` calls ``_patch_lang``, an ``inspect.getmembers`` walk over the language's
modules), although the running kernel's launch already patched them and keeps them patched until it returns. The
fused kernels call small device functions per row and per tap (``_tap_fmas``, ``_haar``, ...): in the 56 x 56
golden case, 185 000 calls, and the walks were 42 % of ``_level1_kernel``'s interpreted time (30.4 s -> 17.6 s with
this, the same output bit for bit).

``install()`` wraps the two entry points: a launch records which language modules it patched (those its kernel's
globals see), and a device call whose globals see only those skips the walk; one that sees another (``tl.core``
from ``triton.language.standard``) patches as before, once per launch. Patching is the interpreter's own code, so
what runs is unchanged; only repeated walks are skipped. Test infrastructure only: the package never patches Triton.

``programs_reversed()``: within it, every launch runs its programs in reverse grid order, so that a result that
depends on the order of a launch's programs (one reading what another wrote) changes (tests/test_ops_triton.py).
"""

from __future__ import annotations

import contextlib
import inspect
import textwrap
import threading
from typing import Any, Callable, Iterator, Optional

_STATE = threading.local()  # .patched: ids of the modules the running launch has patched, else None; .reverse
_REVERSED: list[Callable[..., Any]] = []  # the interpreter's launch with its grid loops reversed, if install() made it


def install() -> bool:
    """Wrap the interpreter's launch and device-call entry points (idempotent); False where this Triton's
    interpreter is not shaped as expected (then nothing is changed)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter as ti
    except ImportError:
        return False
    grid_cls, fn_cls = getattr(ti, "GridExecutor", None), getattr(ti, "InterpretedFunction", None)
    needed = (grid_cls, fn_cls, getattr(ti, "_patch_lang", None), getattr(ti, "InterpreterError", None))
    if any(x is None for x in needed) or not hasattr(fn_cls, "rewrite"):
        return False
    if getattr(fn_cls.__call__, "_wtconvnext_wrapped", False):
        return True
    try:  # the body device_call reproduces below (triton 3.8's): another version's is left alone
        body = inspect.getsource(fn_cls.__call__)
    except (OSError, TypeError):
        return False
    if not all(part in body for part in ("_patch_lang(self.fn)", "fn = self.rewrite()", "InterpreterError(repr(e))")):
        return False

    state = _STATE
    langs_of: dict[Callable[..., Any], frozenset[int]] = {}

    def langs(fn: Callable[..., Any]) -> frozenset[int]:
        """The language modules ``_patch_lang(fn)`` patches: those of fn's globals that are tl or tl.core."""
        got = langs_of.get(fn)
        if got is None:
            got = langs_of[fn] = frozenset(id(m) for m in fn.__globals__.values()
                                           if inspect.ismodule(m) and m in (tl, tl.core))
        return got

    launch = grid_cls.__call__
    rev = _reversed_launch(launch, ti)
    if rev is not None:
        _REVERSED.append(rev)

    def grid_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        prev = getattr(state, "patched", None)
        state.patched = set(langs(self.fn))
        try:
            return (rev if rev is not None and getattr(state, "reverse", False) else launch)(self, *args, **kwargs)
        finally:
            state.patched = prev

    def device_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        # The interpreter's own body, with its _patch_lang skipped where the launch already covers fn's modules.
        patched = getattr(state, "patched", None)
        mods = langs(self.fn)
        if patched is None or not mods <= patched:
            ti._patch_lang(self.fn)
            if patched is not None:
                patched |= mods
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise ti.InterpreterError(repr(e)) from e

    device_call._wtconvnext_wrapped = True  # type: ignore[attr-defined]
    grid_cls.__call__ = grid_call
    fn_cls.__call__ = device_call
    return True


def _reversed_launch(launch: Callable[..., Any], ti: Any) -> Optional[Callable[..., Any]]:
    """The interpreter's launch (``GridExecutor.__call__``, triton 3.8's shape) with its three grid loops run from the
    last index down, compiled in the interpreter module's namespace; None where the source is shaped otherwise."""
    try:
        src = textwrap.dedent(inspect.getsource(launch))
    except (OSError, TypeError):
        return None
    loops = [f"for {v} in range(grid[{i}]):" for i, v in enumerate("xyz")]
    if not src.startswith("def __call__") or not all(src.count(loop) == 1 for loop in loops):
        return None
    for i, (v, loop) in enumerate(zip("xyz", loops)):
        src = src.replace(loop, f"for {v} in reversed(range(grid[{i}])):")
    namespace = dict(vars(ti))
    exec(compile(src, f"<reversed {launch.__qualname__}>", "exec"), namespace)
    return namespace["__call__"]


def can_reverse() -> bool:
    """Whether install() could rewrite this Triton's interpreter launch for :func:`programs_reversed`."""
    return bool(_REVERSED)


@contextlib.contextmanager
def programs_reversed() -> Iterator[None]:
    """Within: every interpreted launch runs its programs in reverse grid order (see :func:`can_reverse`)."""
    if not _REVERSED:
        raise RuntimeError("this Triton's interpreter launch could not be rewritten to reverse its grid")
    prev = getattr(_STATE, "reverse", False)
    _STATE.reverse = True
    try:
        yield
    finally:
        _STATE.reverse = prev
