"""Fused Triton WTConv (work in progress in this commit: the kernels land next)."""
try:
    import triton  # noqa: F401
    TRITON_AVAILABLE = True
except ImportError:  # pragma: no cover
    TRITON_AVAILABLE = False
