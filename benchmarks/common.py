"""What every benchmark script shares: the environment record, seeded layer inputs, the atomic JSON write, and
compiling a kernel for Hopper on a machine without a GPU."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Sequence

# A torch.profiler session leaves CUPTI's callbacks in place after it ends unless Kineto is told to tear CUPTI down
# (pytorch/pytorch#144455): every later kernel launch of the process then pays for them, and a model with more
# launches pays more. The benchmarks that profile (the fused-kernel check of bench_model, the profile scripts) time
# in the same process, so they tear it down. Torch itself sets 0 where CUDA graphs need it (CUDA < 12.6).
os.environ.setdefault("TEARDOWN_CUPTI", "1")

import torch  # noqa: E402
from torch import Tensor  # noqa: E402


def gpu_env(**extra: Any) -> dict[str, Any]:
    """GPU name and library versions, to store beside measured figures."""
    import triton

    return dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, python=platform.python_version(),
                date=time.strftime("%Y-%m-%d %H:%M:%S"), **extra)


def wtconv_inputs(
    b: int, c: int, h: int, w: int, levels: int, dtype: torch.dtype, device: str = "cuda", k: int = 5,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, list[Tensor]]:
    """Seeded NCHW ``x`` and ``dy`` and the WTConv parameters (weight, bias, base_scale, wavelet_weight,
    wavelet_scale) at trained-like scales, for one layer of B x C x H x W with ``levels`` Haar levels.

    Pass ``generator`` to keep drawing from it afterwards (e.g. for a comparison layer's weights).
    """
    g = generator if generator is not None else torch.Generator(device=device).manual_seed(0)

    def rnd(*shape: int, scale: float = 1.0) -> Tensor:
        return (torch.randn(*shape, device=device, generator=g) * scale).to(dtype)

    x = rnd(b, c, h, w)
    dy = rnd(b, c, h, w)
    params = [rnd(c, 1, k, k, scale=0.1), rnd(c, scale=0.1), 1 + rnd(c, scale=0.1), rnd(levels, c, 4, k, k, scale=0.1),
              0.1 + rnd(levels, c, 4, scale=0.01)]
    return x, dy, params


def tuning_entries(ap: Any, items: list[str] | str, flag: str = "--tuning") -> dict[str, int]:
    """``KEY=VALUE`` items (a list, or one variant ``KEY=V[,KEY=V]``) as ``triton_kernels.TUNING`` entries (known
    keys, integers >= 0), or ``ap.error`` naming ``flag`` and the bad item (``ap``: an argument parser, or anything
    with an ``error(message)`` that raises)."""
    from wtconvnext.ops import triton_kernels as tk

    out = {}
    for item in items.split(",") if isinstance(items, str) else items:
        key, sep, value = item.strip().partition("=")
        if not sep or key not in tk.TUNING or not value.isdigit():
            ap.error(f"{flag} {item!r}: expected KEY=INTEGER (>= 0) with KEY one of {sorted(tk.TUNING)}")
        out[key] = int(value)
    return out


class Refuse:
    """An ``ap`` for :func:`tuning_entries` outside an argument parser: its error exits with the message."""

    @staticmethod
    def error(message: str) -> None:
        raise SystemExit(message)


def with_entries(fn: Any, table: dict, entries: dict) -> Any:
    """``fn`` run with ``table`` (a tuning dict such as ``triton_kernels.TUNING``) updated by ``entries``, restored
    afterwards."""

    def run() -> Any:
        saved = dict(table)
        table.update(entries)
        try:
            return fn()
        finally:
            table.clear()
            table.update(saved)

    return run


def device_time_us(event: Any) -> float:
    """A torch.profiler averaged event's total device time, µs (``cuda_time_total`` before torch renamed it)."""
    return getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)


def write_json(path: str | Path, payload: Any) -> None:
    """Write ``payload`` as JSON to ``path`` through a temporary sibling, so a killed run never leaves half a file."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(out)


def layer_chain(layer: Callable[..., Tensor], x: Tensor, params: Sequence[Tensor], dy: Tensor, n: int
                ) -> Callable[[], None]:
    """A function that runs ``layer(y, *params_i)`` for n copies of ``params`` in a chain from x, then one backward
    to x and every copy: per layer, the host time a layer adds to a model's step (where a single layer's
    ``torch.autograd.grad`` also pays the engine's fixed cost of a backward call, which a step pays once)."""
    groups = [[t.detach().clone().requires_grad_() for t in params] for _ in range(n)]
    inputs = [x, *(t for group in groups for t in group)]

    def run() -> None:
        y = x
        for group in groups:
            y = layer(y, *group)
        torch.autograd.grad(y, inputs, dy)

    return run


def wall_us(fn, iters: int) -> float:
    """Mean wall-clock microseconds per call of ``fn`` over ``iters`` calls queued back to back (synchronised before
    and after the loop only, so a host-bound ``fn`` shows its host time)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e6


def report(out: str | Path, env: dict[str, Any], header: str, lines: list[str], rows: list[dict], note: str = "",
           **extra: Any) -> None:
    """Print the environment and a table (``header``, a rule, ``lines``, then ``note`` when given), and write
    ``env``, ``rows`` and ``extra`` to ``out`` as JSON (atomically)."""
    print(f"# {env}")
    print(header)
    print("-" * len(header))
    for line in lines:
        print(line)
    if note:
        print(note)
    write_json(out, dict(env=env, rows=rows, **extra))


def compile_sm90(fn: Any, signature: dict[str, str], constexprs: dict[str, Any], warps: int = 4) -> Any:
    """Compile the ``@triton.jit`` kernel ``fn`` for an sm_90 GPU (Hopper, the H200), on any machine.

    ``signature`` gives each runtime parameter's Triton type (``"*bf16"``, ``"i32"``, ...), ``constexprs`` the
    compile-time ones. Pointers are marked 16-byte aligned, as the launchers' allocations are, so the code is the
    specialisation a launch on the GPU gets. Returns Triton's compiled kernel (``.asm["cubin"]`` and the rest).
    The kernel must have been decorated without ``TRITON_INTERPRET``.
    """
    import triton
    from triton.backends.compiler import GPUTarget

    from wtconvnext.ops.triton_kernels import launch_options

    # (With the kernel's TUNING register cap, as its launches get it: the first parameter's dtype from its type.)
    first = {"*bf16": torch.bfloat16, "*fp16": torch.float16, "*fp32": torch.float32, "*fp64": torch.float64}.get(
        next(iter(signature.values()), ""))
    return triton.compile(_sm90_source(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                          options=launch_options(fn, warps, constexprs, first))


def _sm90_source(fn: Any, signature: dict[str, str], constexprs: dict[str, Any]) -> Any:
    from triton.compiler import ASTSource

    from wtconvnext.ops.triton_kernels import param_defaults

    # Constexprs left out take the kernel's defaults, as a launch's do.
    constexprs = {**{n: v for n, v in param_defaults(fn).items() if n not in signature}, **constexprs}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a, t in signature.items() if t.startswith("*")}
    return ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}}, constexprs=constexprs,
                     attrs=attrs)


def ttir_sm90(fn: Any, signature: dict[str, str], constexprs: dict[str, Any], warps: int = 4) -> str:
    """The TTIR that :func:`compile_sm90` would produce (Triton's first IR stage, after its own passes), without the
    later stages: those take minutes for the unrolled kernels (TritonGPUCoalesce), this a second. Runs the compiler's
    stages by hand; where this Triton's internals differ, falls back to the whole compile."""
    import inspect

    from triton.backends.compiler import GPUTarget

    try:
        from triton._C.libtriton import ir
        from triton.compiler.compiler import make_backend

        target = GPUTarget("cuda", 90, 32)
        src = _sm90_source(fn, signature, constexprs)
        backend = make_backend(target)
        options = backend.parse_options({"num_warps": warps})
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        args = [options, backend.get_codegen_implementation(options), backend.get_module_map(), context]
        if "target" in inspect.signature(src.make_ir).parameters:
            args.insert(0, target)
        module = src.make_ir(*args)
        stages: dict[str, Any] = {}
        backend.add_stages(stages, options, src.language)
        return str(stages["ttir"](module, {}))
    except (ImportError, AttributeError, TypeError, KeyError):
        return compile_sm90(fn, signature, constexprs, warps).asm["ttir"]
