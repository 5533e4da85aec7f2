"""The fused WTConv for autograd, ``torch.compile`` and autocast.

Three entry points share one forward and one backward implementation:

- under ``torch.compile``, static sizes on a GPU: the ``torch.library.triton_op`` pair ``wtconvnext::wtconv2d_traced``
  and ``wtconvnext::wtconv2d_traced_backward``, whose bodies the compiler traces (every launch through
  ``wrap_triton``): Inductor's generated code launches the kernels, with no Python per layer call;
- under ``torch.compile`` otherwise (dynamic sizes, the CPU interpreter, a torch without ``triton_op``): the opaque
  custom ops ``wtconvnext::wtconv2d`` and ``wtconvnext::wtconv2d_backward`` with fake (meta) kernels, so
  ``fullgraph=True`` traces a whole WTConvNeXt with no graph break and sizes stay symbolic;
- in eager mode: a plain ``torch.autograd.Function`` that calls the same implementation directly, because the
  custom-op dispatch costs host time that small layers cannot hide (on the H200, stage-4 layers were host-bound).

The forward saves only x, the parameters and the folded kernels; the backward recomputes x's Haar coefficients
instead of storing them.
"""

from __future__ import annotations

import functools
import os
from typing import Optional

import torch
from torch import Tensor

from .wtconv import _exporting

try:
    import triton  # noqa: F401

    TRITON_AVAILABLE = True
except ImportError:  # pragma: no cover - triton ships with the Linux torch wheels
    TRITON_AVAILABLE = False
TRITON_OP = TRITON_OP_AVAILABLE = False

__all__ = ["TRITON_AVAILABLE", "traced_op_applies", "wtconv2d_triton"]


def _output_format(x: Tensor) -> torch.memory_format:
    """channels_last for a channels_last input, else contiguous (shared by the real and fake kernels)."""
    channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    return torch.channels_last if channels_last else torch.contiguous_format


def _output_shape(x: Tensor, stride: int) -> tuple[int, int, int, int]:
    bsz, ch, h, w = x.shape
    return bsz, ch, -(-h // stride), -(-w // stride)


def _empty_output(x: Tensor, stride: int) -> Tensor:
    return torch.empty(_output_shape(x, stride), device=x.device, dtype=x.dtype, memory_format=_output_format(x))


def _channels_last(t: Tensor) -> Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def _images(t: Tensor, b0: int, b1: int) -> Tensor:
    """Images b0 .. b1 - 1 of t: t itself for the whole batch (the default single chunk adds no view per call)."""
    return t if b0 == 0 and b1 == t.shape[0] else t[b0:b1]


def _in_format_of(t: Tensor, x: Tensor) -> Tensor:
    """The channels-last kernel result ``t`` in x's memory format."""
    return t.contiguous(memory_format=_output_format(x))


if TRITON_AVAILABLE:
    from . import compile_ahead as _ahead
    from . import launch_plan as _plan
    from . import triton_kernels as _tk
    from .triton_kernels import (batch_chunks, coefficient_pair, folded_weights, input_grad_buffer, level1_partials,
                                 onload_applies, param_grads, weight_partials, wtconv_forward)

    def _planned(core, inputs: tuple, *consts, sig: Optional[tuple] = None, training: bool = False
                 ) -> tuple[tuple, Optional[tuple]]:
        """(``core(*inputs, *consts)``, the inputs' launch-plan signature or None), replayed from its launch plan
        after the first call of a signature (launch_plan.py); never while a triton_op body is traced. ``sig``: a
        stand-in for ``signature(*inputs)`` that determines it (the backward's, from the forward's). The first call
        of a signature compiles the pass's kernels side by side first (compile_ahead.py), and with ``training`` (a
        forward whose backward follows) the backward's too, unwaited."""
        key = None
        if _plan.ENABLED and not _tk._TRACED.on:
            # The current device (Triton's compiled kernels are per device; the interpreter's CPU tensors: none).
            dev = _tk._device_index() if inputs[0].is_cuda else None
            if sig is None:
                sig = _plan.signature(*inputs)
            key = (core, sig, consts, _tk.tuning_state(), dev)
        return _plan.planned(key, core, inputs, *consts,
                             first=_ahead_training if training else _ahead.warm_pass), sig

    def _forward_core(
        xc: Tensor, weight: Tensor, bias: Optional[Tensor], base_scale: Tensor, wavelet_weight: Tensor,
        wavelet_scale: Tensor, stride: int, round_to: Optional[torch.dtype],
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(y, folded base kernels, folded level kernels) of the channels-last ``xc``, y channels-last."""
        out = _plan.empty(_output_shape(xc, stride), xc.dtype, xc.device, torch.channels_last)
        base_w, base_b, level_w = folded_weights(weight, bias, base_scale, wavelet_weight, wavelet_scale, round_to)
        levels = wavelet_weight.shape[0]
        onload = onload_applies(xc, levels, stride)  # (for every chunk: it needs one, TUNING chunk_kb 0)
        # A large map's pass runs in chunks of images, so that its coefficient buffers stay small (batch_chunks).
        for b0, b1 in batch_chunks(xc, levels):
            wtconv_forward(_images(xc, b0, b1), _images(out, b0, b1), base_w, base_b, level_w, stride, onload=onload)
        return out, base_w, level_w

    def _forward_impl(
        x: Tensor, weight: Tensor, bias: Optional[Tensor], base_scale: Tensor, wavelet_weight: Tensor,
        wavelet_scale: Tensor, stride: int, round_to: Optional[torch.dtype] = None, training: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor, Optional[tuple]]:
        """y in x's memory format, the folded base and level kernels (for the backward) and the launch-plan
        signature of the pass (for the backward's key; None without plans). ``round_to``: the autocast dtype the
        parameters are rounded to on the fly (eager mode), or None; ``training``: a backward will follow (its
        kernels compile ahead with the forward's at a signature's first call)."""
        # The kernels work on channels-last data (wide channel vectors); NCHW input costs one copy each way.
        (out, base_w, level_w), sig = _planned(_forward_core, (_channels_last(x), weight, bias, base_scale,
                                                               wavelet_weight, wavelet_scale), stride, round_to,
                                               training=training)
        return _in_format_of(out, x), base_w, level_w, sig

    def _backward_after(inputs: tuple, consts: tuple, outs: tuple) -> tuple:
        """(core, inputs, consts) of the backward pass that follows a forward pass of ``inputs`` and ``consts``
        with outputs ``outs``, as _backward_impl will run it, on a stand-in dy (compile_ahead.py)."""
        xc = inputs[0]
        dy = torch.empty(xc.shape, dtype=xc.dtype, device=xc.device, memory_format=torch.channels_last)
        return _backward_core, (dy, *inputs, outs[1], outs[2]), (consts[1],)

    _ahead_training = functools.partial(_ahead.warm_pass, then=_backward_after)

    def _backward_core(
        dy: Tensor, xc: Tensor, weight: Tensor, bias: Optional[Tensor], base_scale: Tensor, wavelet_weight: Tensor,
        wavelet_scale: Tensor, base_w: Optional[Tensor], level_w: Optional[Tensor], round_to: Optional[torch.dtype],
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The backward of a stride-1 pass over channels-last ``xc`` and ``dy``: (dx channels-last, the parameters'
        gradients). ``base_w`` / ``level_w`` None: the folded kernels are made here (the backward op's)."""
        if base_w is None or level_w is None:
            base_w, _, level_w = folded_weights(weight, None, base_scale, wavelet_weight, wavelet_scale, round_to)
        levels, k = wavelet_weight.shape[0], weight.shape[-1]
        bsz = xc.shape[0]
        dx: Optional[Tensor] = None
        parts = grads = None
        # Chunk by chunk of images (one chunk unless TUNING chunk_kb bounds the workspace, batch_chunks), into one
        # set of partials: dy's coefficients serve both gradients, the weight gradients first, since the
        # input-gradient pass overwrites them; x's coefficients are recomputed here rather than kept from the
        # forward. The partials are summed once the last chunk's are in, and freed before the last input gradient.
        chunks = batch_chunks(xc, levels)
        # Level 1 made on load (one chunk): the coefficient buffers hold levels 2..L only; decided here for the input
        # gradient's pass too.
        onload = onload_applies(xc, levels, 1)
        for i, (b0, b1) in enumerate(chunks):
            xs, dys = _images(xc, b0, b1), _images(dy, b0, b1)
            coef_dy, coef_x = coefficient_pair(dys, xs, levels, onload)  # (None, None) without a level to store
            parts = weight_partials(xs, dys, coef_x, coef_dy, k, levels, parts, b0, bsz, onload)
            del coef_x
            sums = (tuple(xc.shape), weight, bias, base_scale, wavelet_weight, wavelet_scale, round_to)
            if i == len(chunks) - 1:
                grads = param_grads(parts, *sums, split=int(onload))
                parts = None
            if dx is None:
                # One chunk: dy's coefficient buffer where the pass allows (input_grad_buffer), else a new map.
                dx = (input_grad_buffer(dys, coef_dy, levels) if len(chunks) == 1 and not onload
                      else _plan.empty(tuple(xc.shape), xc.dtype, xc.device, torch.channels_last))
            if onload:
                # Level 1's partial rows, staged through dx's buffer once x's coefficients and the other rows are
                # freed: the layer's peak stays that of the input-gradient pass (below two image groups of images,
                # dy's level 1 takes a buffer of its own: level1_partials).
                lev1 = level1_partials(xs, dys, k, dx)
                param_grads((lev1, lev1), *sums, split=2, grads=grads)
                del lev1
            # The input gradient is the same WTConv applied to dy with every kernel rotated by 180 degrees, no bias.
            wtconv_forward(dys, _images(dx, b0, b1), base_w, None, level_w, 1, flip=True, coef=coef_dy,
                           onload=onload)
            del coef_dy
        return (dx, *grads)

    def _backward_impl(
        dy: Tensor, x: Tensor, weight: Tensor, bias: Optional[Tensor], base_scale: Tensor, wavelet_weight: Tensor,
        wavelet_scale: Tensor, stride: int, base_w: Optional[Tensor], level_w: Optional[Tensor],
        round_to: Optional[torch.dtype] = None, fwd_sig: Optional[tuple] = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(dx, d weight, d bias, d base_scale, d wavelet_weight, d wavelet_scale); d bias is for a zero bias when
        ``bias`` is None. ``base_w`` / ``level_w`` are the forward's folded kernels, or None (made in the pass,
        which its launch plan then replays too); ``fwd_sig``, the forward's
        plan signature when x and the parameters are the very tensors that forward saw (autograd's saved ones):
        with dy's, it determines the backward's inputs' signature, which is then not worked out again."""
        bsz, ch, h, w = x.shape
        if stride > 1:
            # The stride subsamples the full-resolution output: its adjoint scatters dy back onto zeros.
            dy_full = torch.zeros((bsz, h, w, ch), device=dy.device, dtype=dy.dtype).permute(0, 3, 1, 2)
            dy_full[:, :, ::stride, ::stride] = dy
            dy = dy_full
        dyc = _channels_last(dy)
        # x's channels-last copy (if x is not channels-last) and the folded kernels (the forward's outputs) have
        # sizes, strides and alignment that the forward's signature fixes.
        sig = None if fwd_sig is None else (fwd_sig, _plan.signature(dyc))
        (dx, *grads), _ = _planned(_backward_core, (dyc, _channels_last(x), weight, bias, base_scale, wavelet_weight,
                                                    wavelet_scale, base_w, level_w), round_to, sig=sig)
        return (_in_format_of(dx, x), *grads)

    def _refolded_backward(dy, x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride, round_to=None):
        """The backward ops' body: the folded kernels recomputed (an op's forward returns only y), inside the
        backward pass, so that its launch plan replays the fold too (unplanned, the fold was about half the
        op's host time on the CPU)."""
        return _backward_impl(dy, x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride, None, None,
                              round_to)

    @torch.library.custom_op("wtconvnext::wtconv2d", mutates_args=(), device_types=None)
    def _wtconv2d_op(
        x: Tensor,
        weight: Tensor,
        bias: Optional[Tensor],
        base_scale: Tensor,
        wavelet_weight: Tensor,
        wavelet_scale: Tensor,
        stride: int,
        round_to: Optional[torch.dtype] = None,
    ) -> Tensor:
        return _forward_impl(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride, round_to)[0]

    @_wtconv2d_op.register_fake
    def _(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride, round_to=None):
        return _empty_output(x, stride)

    @torch.library.custom_op("wtconvnext::wtconv2d_backward", mutates_args=(), device_types=None)
    def _wtconv2d_backward_op(
        dy: Tensor,
        x: Tensor,
        weight: Tensor,
        bias: Optional[Tensor],
        base_scale: Tensor,
        wavelet_weight: Tensor,
        wavelet_scale: Tensor,
        stride: int,
        round_to: Optional[torch.dtype] = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        return _refolded_backward(dy, x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride, round_to)

    @_wtconv2d_backward_op.register_fake
    def _(dy, x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride, round_to=None):
        return (
            _empty_output(x, 1),
            torch.empty_like(weight, memory_format=torch.contiguous_format),
            torch.empty_like(bias if bias is not None else base_scale, memory_format=torch.contiguous_format),
            torch.empty_like(base_scale, memory_format=torch.contiguous_format),
            torch.empty_like(wavelet_weight, memory_format=torch.contiguous_format),
            torch.empty_like(wavelet_scale, memory_format=torch.contiguous_format),
        )

    def _setup_context(ctx, inputs, output):
        x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride, round_to = inputs
        ctx.save_for_backward(x, weight, bias, base_scale, wavelet_weight, wavelet_scale)
        ctx.stride = stride
        ctx.round_to = round_to
        ctx.has_bias = bias is not None
        ctx.folded = ()  # the traced op's forward kernels, handed to its backward (see _traced_setup_context)

    def _autograd_of(backward_op):
        """The autograd formula of a forward op whose backward is ``backward_op``."""

        def backward(ctx, dy, *_):  # *_: no gradients flow to the traced op's folded-kernel outputs
            x, weight, bias, base_scale, wavelet_weight, wavelet_scale = ctx.saved_tensors
            dx, dw, db, dbs, dww, dws = backward_op(
                dy, x, weight, bias, base_scale, wavelet_weight, wavelet_scale, ctx.stride, ctx.round_to, *ctx.folded
            )
            return dx, dw, (db if ctx.has_bias else None), dbs, dww, dws, None, None

        return backward

    _wtconv2d_op.register_autograd(_autograd_of(_wtconv2d_backward_op), setup_context=_setup_context)

    # The same two ops as triton_ops (torch >= 2.6): torch.compile traces their bodies, so Inductor's generated code
    # launches the kernels itself (no Python per layer call). Their launch parameters are plain ints taken from the
    # sizes, so they serve static shapes; dynamic shapes go to the opaque custom ops above. The default for static
    # sizes on a GPU since session 35; WTCONVNEXT_TRITON_OP=0 (read at import) keeps every compile on the opaque ops.
    # Session 30 found this path's compiled results wrong on the H200 (one buffer in two written arguments of a
    # launch, mended in triton_kernels._analyse); session 35 measured it bitwise eager's on an H100
    # (benchmarks/compiled_parity.py: bf16 and fp32, with and without CUDA graphs).
    # Registered either way (tests and benchmarks call them).
    TRITON_OP_AVAILABLE = hasattr(torch.library, "triton_op") and hasattr(torch.library, "wrap_triton")
    TRITON_OP = TRITON_OP_AVAILABLE and os.environ.get("WTCONVNEXT_TRITON_OP", "1") != "0"
    if TRITON_OP_AVAILABLE:
        from . import ttir_memo
        from .triton_kernels import traced_launches

        ttir_memo.install()  # else every launch site re-generates its kernel's TTIR: minutes of compile per model

        # The traced forward also returns the folded kernels (non-differentiable), which its autograd saves for the
        # traced backward: no refold there (a launch and three allocations per layer call less).
        @torch.library.triton_op("wtconvnext::wtconv2d_traced", mutates_args=())
        def _wtconv2d_traced_op(
            x: Tensor,
            weight: Tensor,
            bias: Optional[Tensor],
            base_scale: Tensor,
            wavelet_weight: Tensor,
            wavelet_scale: Tensor,
            stride: int,
            round_to: Optional[torch.dtype] = None,
        ) -> tuple[Tensor, Tensor, Tensor]:
            if _symbolic(x):  # dynamic sizes (see traced_op_applies): the opaque op keeps them symbolic
                y = _wtconv2d_op(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride, round_to)
                # The opaque backward op, which the traced one hands symbolic sizes to, refolds: no kernels kept.
                return y, weight.new_empty((0,)), weight.new_empty((0,))
            with traced_launches():
                return _forward_impl(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride,
                                     round_to)[:3]

        @torch.library.triton_op("wtconvnext::wtconv2d_traced_backward", mutates_args=())
        def _wtconv2d_traced_backward_op(
            dy: Tensor,
            x: Tensor,
            weight: Tensor,
            bias: Optional[Tensor],
            base_scale: Tensor,
            wavelet_weight: Tensor,
            wavelet_scale: Tensor,
            stride: int,
            round_to: Optional[torch.dtype] = None,
            base_w: Optional[Tensor] = None,
            level_w: Optional[Tensor] = None,
        ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
            """The backward; ``base_w`` / ``level_w``: the forward's folded kernels, or None (folded here)."""
            if _symbolic(x):
                return _wtconv2d_backward_op(dy, x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride,
                                             round_to)
            with traced_launches():
                return _backward_impl(dy, x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride, base_w,
                                      level_w, round_to)

        def _traced_setup_context(ctx, inputs, output):
            _setup_context(ctx, inputs, output)
            ctx.folded = output[1:]
            ctx.mark_non_differentiable(*output[1:])
            ctx.set_materialize_grads(False)  # no zero gradients made for the folded kernels

        _wtconv2d_traced_op.register_autograd(_autograd_of(_wtconv2d_traced_backward_op),
                                              setup_context=_traced_setup_context)

    def _function_backward(ctx, dy):
        x, weight, bias, base_scale, wavelet_weight, wavelet_scale = ctx.saved_tensors
        dx, dw, db, dbs, dww, dws = _backward_impl(
            dy, x, weight, bias, base_scale, wavelet_weight, wavelet_scale, ctx.stride, *ctx.folded, ctx.round_to,
            ctx.sig,
        )
        return dx, dw, (db if bias is not None else None), dbs, dww, dws, None, None

    _once_backward = torch.autograd.function.once_differentiable(_function_backward)

    class _WTConvFunction(torch.autograd.Function):
        """Eager-mode autograd: the same implementation as the custom ops, without their dispatch."""

        @staticmethod
        def forward(ctx, x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride, round_to):
            y, base_w, level_w, sig = _forward_impl(
                x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride, round_to, training=True
            )
            ctx.save_for_backward(x, weight, bias, base_scale, wavelet_weight, wavelet_scale)
            # The folded kernels are this op's own tensors, which nothing else can modify in place: kept on ctx,
            # without saved-variable bookkeeping (host time per layer call).
            ctx.folded = (base_w, level_w)
            ctx.stride = stride
            ctx.round_to = round_to
            ctx.sig = sig
            return y

        @staticmethod
        def backward(ctx, dy):
            if torch.is_grad_enabled():
                # create_graph=True: the kernels' gradients are not differentiable themselves; once_differentiable
                # returns them with an error for a backward through them. Otherwise its no_grad wrapper is only
                # host time (a tenth of an empty Function's backward per layer, CPU).
                return _once_backward(ctx, dy)
            return _function_backward(ctx, dy)


def _symbolic(x: Tensor) -> bool:
    """Whether any size of ``x`` is symbolic (a ``SymInt``): true only where real or fake tensors are at hand. Dynamo,
    tracing Python, answers ``isinstance(s, int)`` for a ``SymInt`` as for an int (its ``python_type``), so the
    traced ops' bodies, which run on fake tensors, make this test and not :func:`traced_op_applies`."""
    return any(isinstance(s, torch.SymInt) for s in x.shape)


def traced_op_applies(x: Tensor) -> bool:
    """Whether a compiled WTConv of ``x`` takes the ``triton_op`` path (Inductor launches the kernels): a CUDA
    tensor of static sizes, on a torch with ``triton_op``, unless WTCONVNEXT_TRITON_OP=0, and not under
    ``torch.export`` (which keeps the one opaque op). Under Dynamo, symbolic sizes pass this test (see
    :func:`_symbolic`): the traced ops then hand them to the opaque ops themselves."""
    return (TRITON_AVAILABLE and TRITON_OP and x.is_cuda and not _symbolic(x) and not _exporting())


def wtconv2d_triton(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    base_scale: Tensor,
    wavelet_weight: Tensor,
    wavelet_scale: Tensor,
    stride: int = 1,
) -> Tensor:
    """Fused Triton WTConv (arguments as :func:`wtconvnext.ops.wtconv2d`, which checks them).

    Under autocast, x and every parameter are cast to the autocast dtype first, as a convolution does; the kernels
    accumulate in fp32 and store in that dtype. (The parameters are rounded inside the weight-folding and gradient
    kernels instead, eager and compiled, with the same result: ten cast kernels, and in eager mode their autograd
    nodes, less per layer.)
    """
    if not TRITON_AVAILABLE:
        raise RuntimeError("the 'triton' WTConv backend needs the triton package, which is not installed")
    device_type = "cuda" if x.is_cuda else x.device.type  # (no device object per call on a GPU)
    round_to = None
    if torch.is_autocast_enabled(device_type):
        round_to = torch.get_autocast_dtype(device_type)
        x = x.to(round_to)
    if torch.compiler.is_compiling():
        # Static sizes (plain ints while tracing) on a GPU: the traced ops, whose kernels Inductor launches. (The
        # interpreter's CPU kernels cannot be traced.) The parameters go in as they are, with the autocast dtype:
        # the kernels round them (and their gradients) as the casts would, where Inductor would launch a cast
        # kernel for each of the five parameters and each of their gradients (it does not fuse them into ours).
        if traced_op_applies(x):
            return _wtconv2d_traced_op(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride, round_to)[0]
        return _wtconv2d_op(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride, round_to)
    if not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or base_scale.requires_grad
                                         or wavelet_weight.requires_grad or wavelet_scale.requires_grad
                                         or (bias is not None and bias.requires_grad))):
        # Inference (no_grad, inference_mode, or nothing needs a gradient): the forward alone, without the autograd
        # Function's bookkeeping and saved tensors (host time per layer call is what small inputs pay).
        return _forward_impl(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride, round_to)[0]
    return _WTConvFunction.apply(x, weight, bias, base_scale, wavelet_weight, wavelet_scale, stride, round_to)
