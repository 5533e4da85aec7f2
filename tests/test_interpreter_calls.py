"""The interpreter's device-function calls without re-patching (interpreter_calls.py) run the same code: a kernel
whose device functions see other language modules than the kernel itself (``tl.zeros`` from
``triton.language.standard``) computes what it should, and on the Triton that CI installs (3.8, with torch 2.14.1)
the wrapper is in place."""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")


@triton.jit
def _scaled(v, s):
    return v * s + tl.zeros(v.shape, dtype=v.dtype)


@triton.jit
def _kernel(x_ptr, y_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    v = tl.load(x_ptr + i)
    tl.store(y_ptr + i, _scaled(_scaled(v, 2.0), 0.5) + tl.sum(v, axis=0))


def test_device_calls_are_wrapped_and_compute_the_same() -> None:
    from triton.runtime import interpreter as ti

    import interpreter_calls

    installed = interpreter_calls.install()  # (idempotent: conftest installed it where it could)
    assert installed == getattr(ti.InterpretedFunction.__call__, "_wtconvnext_wrapped", False)
    if triton.__version__.startswith("3.8."):  # CI's: the speed-up must be on (another version's body is left alone)
        assert installed
    x = torch.arange(16, dtype=torch.float32)
    for _ in range(2):  # a second launch re-patches what the first one's end restored
        y = torch.empty_like(x)
        _kernel[(2,)](x, y, N=16)
        torch.testing.assert_close(y, x + x.sum(), rtol=0, atol=0)
