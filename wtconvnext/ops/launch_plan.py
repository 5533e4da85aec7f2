"""Launch plans: a pass's allocations and kernel launches recorded once per call signature, then replayed.

A WTConv pass is a fixed sequence of 2-12 launches whose grids, integer arguments and buffer sizes depend only on
the sizes, dtypes, strides and alignment of its inputs, the tuning tables and the device. Working them out again
on every call (shape arithmetic, launch-shape choices, the kept-kernel lookup of every launch) cost about as much
host time as the launches themselves; at small maps and batches the layer waited on the host, not on the GPU. So
:func:`planned` runs a pass the ordinary way the first time a signature is seen, records what it did, and from
then on replays the record: allocate each buffer just before its first use, launch each kernel with the recorded
constants and this call's tensors, drop each intermediate after its last use (the caching allocator reuses it at
once, as the ordinary path's ``del`` did).

A record holds no tensors, only slots: the pass's inputs, the buffers it allocated through :func:`empty` and the
views of them it made through :func:`view`. A
pass that hands a kernel any other tensor (a view, a copy made inside the pass: chunked passes, non-contiguous
parameters) cannot be replayed; its signature is remembered as such and it always runs the ordinary way.
``WTCONVNEXT_LAUNCH_PLANS=0`` (read at import; or ``ENABLED = False``) turns replay off.

Direct launches: a recorded launch of a compiled Triton kernel may carry its launcher, function handle, packed
metadata and grid. A replay then calls that launcher itself, as ``CompiledKernel[grid](*args)`` would, with the
current stream read once per pass rather than per launch, no launch-metadata dict and no hook calls (Triton's
per-launch hooks are empty unless a profiler such as proton installed one: then the replay takes the runners),
and every tensor as its device pointer (an int), which skips the launcher's per-pointer driver query
(``cuPointerGetAttribute``; the recording run, through Triton's own path, checked them).
On by default: on the H200 (session 27, ``benchmarks/host_overhead.py``, B=1 bf16) a layer call's forward + backward
took 25-30 % less host time than replays through the runners (429-478 vs 538-653 us).
``WTCONVNEXT_DIRECT_LAUNCH=0`` (read at import) or ``DIRECT = False`` (read when a plan is recorded; part of a plan's
key) keeps the runners.

Workspace: since a direct launch needs only a device pointer, a direct replay allocates the intermediates that only
direct launches touch as one workspace per pass (:meth:`_Plan.arena`) rather than one ``torch.empty`` each.
``WTCONVNEXT_PLAN_WORKSPACE=0`` (read at import) or ``WORKSPACE = False`` (read when a plan is recorded; part of a
plan's key) allocates them one by one.

Graphs (on by default where Triton runs on a CUDA GPU; ``WTCONVNEXT_PLAN_GRAPHS=0`` (read at import) or ``GRAPHS =
False`` (read when a plan is recorded; part of a plan's key) turns them off). A direct replay whose launches are all
direct makes its allocations and reads its pointers as before, then, instead of its launches, replays a CUDA graph
of them keyed by those pointers: a training loop's caching allocator hands a layer the same addresses every step, so
from the second step on a pass is one graph launch instead of 2-12 kernel launches. A key's graph is captured the
second time the key is seen (one-off keys cost no capture), at most ``_MAX_GRAPHS`` per plan (oldest dropped; a plan
that has dropped ``_MAX_GRAPHS`` captures no more, so pointer sets that never settle cost no capture per call).
While the current stream is itself being captured, nothing is captured or replayed: the launches join that capture.
Launches deferred to the end of the pass keep their order, so a buffer freed mid-pass and handed to a later
allocation of the pass is reused in stream order, as before. Why on (session 52, H100, ``host_overhead.py``, B=1 bf16
forward + backward): 246.5 / 237.0 us per call at 56 x 56 / 7 x 7 against 327.3 / 268.2 without, 213.4 / 205.0 us
per layer in a chain of eight against 269.1 / 214.5; eager WTConvNeXt-T AMP training and inference at 1.01x / 1.00x
of ConvNeXt-T with graphs and without (GPU-bound at B=128); the GPU tests with graphs on passed (87 of them, none
failed, the run cut at 84 %).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
from torch import Tensor

__all__ = ["ENABLED", "DIRECT", "WORKSPACE", "GRAPHS", "empty", "view", "planned", "recording", "clear",
           "use_direct", "use_graphs", "graph_stats"]

ENABLED = os.environ.get("WTCONVNEXT_LAUNCH_PLANS", "1") != "0"
DIRECT = os.environ.get("WTCONVNEXT_DIRECT_LAUNCH", "1") != "0"
WORKSPACE = os.environ.get("WTCONVNEXT_PLAN_WORKSPACE", "1") != "0"
GRAPHS = os.environ.get("WTCONVNEXT_PLAN_GRAPHS", "1") != "0"
# (current stream, whether the launch hooks are idle): set by the kernel module where Triton runs on a GPU.
_direct_env: Optional[tuple[Callable[[], int], Callable[[], bool]]] = None
# (capture(launches) -> a graph with .replay(), whether the current stream is being captured): likewise.
_graph_env: Optional[tuple[Callable[[Callable[[int], None]], Any], Callable[[], bool]]] = None
_MAX_GRAPHS = 8  # per plan: a plan is one layer shape; its keys, the pointer sets it meets
_MAX_PLANS = 1024  # signatures are exact sizes: bound the table for workloads of ever-new shapes

_ALLOC, _LAUNCH, _FREE, _VIEW = 0, 1, 2, 3
# What a workspace may add to a pass's peak: nothing that matters to a GPU's memory, but enough that small inputs'
# passes (B=1: kilobytes) keep their buffers in it.
_PEAK_SLACK = 1 << 20
_ALIGN = 512  # bytes: a workspace buffer starts where the caching allocator's blocks do (kernels assume 16)


class _Recorder:
    """Collects one pass: its allocations and launches, in order, with every tensor argument as a slot."""

    def __init__(self, inputs: Sequence[Optional[Tensor]]) -> None:
        self.slots = {id(t): i for i, t in enumerate(inputs) if t is not None}
        self.alive: list[Any] = list(inputs)  # every recorded tensor stays alive, so no id is reused meanwhile
        self.ops: list[tuple] = []
        self.n = len(inputs)
        # A tensor passed as two inputs would map to one slot: a later call passing two tensors there could not
        # be told apart by the key, so such a pass is not replayed.
        self.ok = len(self.slots) == sum(t is not None for t in inputs)

    def alloc(self, t: Tensor, shape: tuple[int, ...], dtype: torch.dtype, fmt: torch.memory_format) -> None:
        self.slots[id(t)] = self.n
        self.alive.append(t)
        self.ops.append((_ALLOC, self.n, shape, dtype, fmt))
        self.n += 1

    def view(self, t: Tensor, base: Tensor, shape: tuple[int, ...], stride: tuple[int, ...], offset: int) -> None:
        slot = self.slots.get(id(base))
        if slot is None:  # a view of a tensor the pass made without empty(): not replayable
            self.ok = False
            return
        self.slots[id(t)] = self.n
        self.alive.append(t)
        self.ops.append((_VIEW, self.n, slot, shape, stride, offset))
        self.n += 1

    def launch(self, call: Callable[..., Any], args: Sequence[Any], direct: Optional[tuple] = None) -> None:
        """A launch ``call(*args)``; ``direct``: (launcher, function, packed metadata, grid x, y, z) of a compiled
        Triton kernel, whose launcher a replay may call itself (module docs)."""
        template, tensors = list(args), []
        for pos, a in enumerate(args):
            if isinstance(a, Tensor):
                slot = self.slots.get(id(a))
                if slot is None:  # a tensor the pass made without empty(): not replayable
                    self.ok = False
                    return
                template[pos] = None
                tensors.append((pos, slot))
        self.ops.append((_LAUNCH, call, template, tuple(tensors), direct))

    def finish(self, outputs: Sequence[Optional[Tensor]]) -> Optional["_Plan"]:
        if not self.ok:
            return None
        outs = []
        for t in outputs:
            if t is None:
                outs.append(-1)
            elif id(t) in self.slots:
                outs.append(self.slots[id(t)])
            else:
                return None
        return _Plan(self.ops, self.n, tuple(outs))


class _Plan:
    """A recorded pass: allocations, launches and frees over numbered slots (inputs first)."""

    def __init__(self, ops: list[tuple], n: int, outs: tuple[int, ...]) -> None:
        keep = set(outs)
        last: dict[int, int] = {}
        for i, op in enumerate(ops):
            if op[0] == _LAUNCH:
                for _, slot in op[3]:
                    last[slot] = i
            elif op[0] == _VIEW:  # made from its base: the base is alive until then (the view keeps its memory)
                last[op[2]] = max(last.get(op[2], i), i)
        n_in = n - sum(op[0] in (_ALLOC, _VIEW) for op in ops)
        frees: dict[int, list[int]] = {}
        for slot, i in last.items():
            if slot >= n_in and slot not in keep:  # an intermediate buffer: dropped after its last launch
                frees.setdefault(i, []).append(slot)
        self.ops: list[tuple] = []
        for i, op in enumerate(ops):
            self.ops.append(op)
            for slot in frees.get(i, ()):
                self.ops.append((_FREE, slot))
        self.n, self.outs = n, outs
        self.graph_state: Optional[tuple[dict, list[int]]] = None  # graph mode: (its graphs, its counts)
        self._run = self._compiled(n_in, direct=False)
        if DIRECT and _direct_env is not None and any(op[0] == _LAUNCH and op[4] is not None for op in self.ops):
            self._run = self._compiled(n_in, direct=True, runners=self._run)

    def _compiled(self, n_in: int, direct: bool, runners: Optional[Callable] = None
                  ) -> Callable[..., tuple[Optional[Tensor], ...]]:
        """The plan as one generated Python function: every slot a local variable, every launcher and non-tensor
        argument bound by name or as a literal, so a replay interprets no op list (the loop over ops cost about as
        much host time as the allocations it made). ``direct``: the compiled kernels' launchers called directly
        (module docs), falling back to ``runners`` (the plan without) while a launch hook is installed."""
        env: dict[str, Any] = {"_empty": torch.empty}
        names = [f"s{i}" for i in range(self.n)]
        lines = ["def run(inputs, device):"]
        if direct:
            env["_stream"], env["_idle"] = _direct_env
            env["_runners"] = runners
            lines += ["    if not _idle():", "        return _runners(inputs, device)", "    st = _stream()"]
        if n_in:
            lines.append(f"    {', '.join(names[:n_in])}, = inputs")
        pointers: set[int] = set()  # slots whose device pointer is a local already
        offsets, arena_bytes, arena_end = self.arena() if direct and WORKSPACE else ({}, 0, -1)
        # Graph mode (module docs): every launch direct; launches deferred into one function of the stream.
        graphs = (direct and GRAPHS and _graph_env is not None
                  and all(op[4] is not None for op in self.ops if op[0] == _LAUNCH))
        deferred: list[str] = []
        arena_made = False
        for i, op in enumerate(self.ops):
            if op[0] == _ALLOC and op[1] in offsets:
                # A buffer that only direct launches touch: a pointer into the pass's one workspace allocation.
                if not arena_made:  # the first of them: the workspace itself
                    arena_made = True
                    env["_u8"] = torch.uint8
                    lines += [f"    arena = _empty(({arena_bytes},), dtype=_u8, device=device)",
                              "    pa = arena.data_ptr()"]
                lines.append(f"    p{op[1]} = pa + {offsets[op[1]]}")
                pointers.add(op[1])
                continue
            if op[0] == _FREE and op[1] in offsets:
                if i == arena_end:
                    lines.append("    arena = None")
                continue
            if op[0] == _LAUNCH:
                fast = direct and op[4] is not None
                args = list(op[2])
                for pos, slot in op[3]:
                    if fast:  # the pointer, read once per slot
                        if slot not in pointers:
                            lines.append(f"    p{slot} = {names[slot]}.data_ptr()")
                            pointers.add(slot)
                        args[pos] = f"p{slot}"
                    else:
                        args[pos] = names[slot]
                for pos, a in enumerate(op[2]):
                    if pos in dict(op[3]):
                        continue
                    if a is None or type(a) in (int, bool):  # exact types: their repr is the value
                        args[pos] = repr(a)
                    else:
                        env[f"a{i}_{pos}"] = a
                        args[pos] = f"a{i}_{pos}"
                if fast:
                    launcher, function, metadata, gx, gy, gz = op[4]
                    env[f"R{i}"], env[f"F{i}"], env[f"M{i}"] = launcher, function, metadata
                    # As CompiledKernel[grid](*args) calls it: no launch metadata, no hooks (they are idle).
                    call = f"R{i}({gx}, {gy}, {gz}, st, F{i}, M{i}, None, None, None, {', '.join(args)})"
                    if graphs:
                        deferred.append(call)
                    else:
                        lines.append(f"    {call}")
                else:
                    env[f"L{i}"] = op[1]
                    lines.append(f"    L{i}({', '.join(args)})")
            elif op[0] == _ALLOC:
                env[f"shape{i}"], env[f"dtype{i}"], env[f"fmt{i}"] = op[2], op[3], op[4]
                lines.append(f"    {names[op[1]]} = _empty(shape{i}, dtype=dtype{i}, device=device, "
                             f"memory_format=fmt{i})")
            elif op[0] == _VIEW:
                at = f", {names[op[2]]}.storage_offset() + {op[5]}" if op[5] else ""
                lines.append(f"    {names[op[1]]} = {names[op[2]]}.as_strided({op[3]!r}, {op[4]!r}{at})")
            else:
                lines.append(f"    {names[op[1]]} = None")
        if graphs:
            env["_graphs"], env["_seen"], env["_counts"], env["_graph_miss"] = {}, {}, [0, 0, 0], _graph_miss
            self.graph_state = (env["_graphs"], env["_counts"])  # (graph_stats)
            env["_capturing"] = _graph_env[1]  # type: ignore[index]
            # The key: every pointer the launches take (the workspace's buffers by its own pointer).
            key = (["pa"] if arena_made else []) + [f"p{s}" for s in sorted(pointers) if s not in offsets]
            lines += [f"    key = ({''.join(k + ', ' for k in key)})",
                      "    g = _graphs.get(key)",
                      "    if g is not None and not _capturing():  # inside another capture: the launches join it",
                      "        g.replay()",
                      "    else:",
                      "        def launches(st):",
                      *(f"            {c}" for c in deferred),
                      "        _graph_miss(_graphs, _seen, _counts, key, launches, st)"]
        lines.append(f"    return ({''.join(('None' if s < 0 else names[s]) + ', ' for s in self.outs)})")
        exec(compile("\n".join(lines), "<launch plan>", "exec"), env)  # noqa: S102 (our own generated source)
        return env["run"]

    def arena(self) -> tuple[dict[int, int], int, int]:
        """The workspace of a direct replay: (byte offset of each buffer in it, its size in bytes, the index in
        ``ops`` after which it is dropped).

        Its buffers are intermediates (neither outputs nor bases of views) that only direct launches touch: those
        need just a device pointer, so one allocation serves them all instead of one ``torch.empty`` each (each costs
        several microseconds of host time). A buffer takes the lowest offset free of the buffers alive with it (first
        fit in allocation order). The workspace lives from its first buffer's allocation to its last one's last use,
        so an output allocated meanwhile cannot reuse a buffer that died before it, as it could from the caching
        allocator: the largest buffers leave the workspace until the pass's peak is at most ``_PEAK_SLACK`` higher
        than with separate allocations (at 14 x 14, B=128, where the input gradient is allocated after x's
        coefficients die, the whole workspace raised the peak by one map)."""
        keep = set(self.outs)
        views = {op[2] for op in self.ops if op[0] == _VIEW}
        slow = {slot for op in self.ops if op[0] == _LAUNCH and op[4] is None for _, slot in op[3]}
        frees = {op[1]: i for i, op in enumerate(self.ops) if op[0] == _FREE}
        # Rounded as the caching allocator rounds.
        sizes = {op[1]: -(-max(op[3].itemsize * math.prod(op[2]), 1) // _ALIGN) * _ALIGN
                 for op in self.ops if op[0] == _ALLOC}
        cands = [s for s in sizes if s not in keep and s not in views and s not in slow and s in frees]
        separate = self._peak(sizes, {}, 0, -1, -1)
        while cands:
            offsets, total, first, end = self._pack(cands, sizes, frees)
            if self._peak(sizes, offsets, total, first, end) <= separate + _PEAK_SLACK:
                return offsets, total, end
            cands.remove(max(cands, key=lambda slot: (sizes[slot], slot)))
        return {}, 0, -1

    def _pack(self, slots: list[int], sizes: dict[int, int], frees: dict[int, int]
              ) -> tuple[dict[int, int], int, int, int]:
        """First fit of ``slots`` in allocation order: (offsets, size, index of the first allocation, index of the
        last free)."""
        offsets: dict[int, int] = {}
        live: list[tuple[int, int, int]] = []  # (offset, end, index of its free) of placed buffers
        total, first, end = 0, -1, -1
        for i, op in enumerate(self.ops):
            if op[0] != _ALLOC or op[1] not in slots:
                continue
            size = sizes[op[1]]
            live = sorted(b for b in live if b[2] > i)
            at = 0
            for off, stop, _ in live:
                if at + size <= off:
                    break
                at = max(at, stop)
            offsets[op[1]] = at
            live.append((at, at + size, frees[op[1]]))
            total, end = max(total, at + size), max(end, frees[op[1]])
            first = i if first < 0 else first
        return offsets, total, first, end

    def _peak(self, sizes: dict[int, int], offsets: dict[int, int], total: int, first: int, end: int) -> int:
        """The most bytes the pass's allocations hold at once (inputs aside), the buffers in ``offsets`` as one
        workspace of ``total`` bytes allocated at op ``first`` and freed after op ``end``."""
        live = peak = 0
        for i, op in enumerate(self.ops):
            if op[0] == _ALLOC:
                live += total if i == first else (0 if op[1] in offsets else sizes[op[1]])
            elif op[0] == _FREE and op[1] in sizes and op[1] not in offsets:
                live -= sizes[op[1]]
            peak = max(peak, live)
            if i == end:
                live -= total
        return peak

    def run(self, inputs: Sequence[Optional[Tensor]], device: torch.device) -> tuple[Optional[Tensor], ...]:
        return self._run(inputs, device)


class _State(threading.local):
    rec: Optional[_Recorder] = None  # a class default: every thread starts with no recording
    # While a triton_op body is traced (see traced_bases): {id(view): (view, base)} of its channels-last buffers.
    bases: Optional[dict] = None


_STATE = _State()
_PLANS: dict[tuple, Optional[_Plan]] = {}


def use_direct(stream: Callable[[], int], idle: Callable[[], bool]) -> None:
    """Let plans recorded from now on launch compiled kernels directly (module docs): ``stream()`` gives the current
    stream's handle, ``idle()`` whether Triton's launch hooks are all empty."""
    global _direct_env
    _direct_env = (stream, idle)


def use_graphs(capture: Callable[[Callable[[int], None]], Any], capturing: Callable[[], bool]) -> None:
    """Let plans recorded from now on with ``GRAPHS`` replay their launches as CUDA graphs (module docs):
    ``capture(launches)`` returns a graph of ``launches(stream)`` (captured, not run), ``capturing()`` whether the
    current stream is being captured (then a pass launches as usual, into that capture)."""
    global _graph_env
    _graph_env = (capture, capturing)


def _graph_miss(graphs: dict, seen: dict, counts: list[int], key: tuple, launches: Callable[[int], None],
                stream: int) -> None:
    """A graph-mode pass whose pointers have no graph: launch, or capture and replay the second time ``key`` is
    seen. ``counts``: [graphs this plan has dropped for newer ones, passes it launched without a graph, captures];
    from ``_MAX_GRAPHS`` drops on it captures no more (a workload cycling through more pointer sets than a plan
    keeps would otherwise capture on every other call: each capture costs more host time than the launches it
    saves), replaying the graphs it has."""
    capture, capturing = _graph_env  # type: ignore[misc]
    n = seen.get(key, 0) + 1
    if n < 2 or capturing() or counts[0] >= _MAX_GRAPHS:
        if len(seen) >= 4 * _MAX_GRAPHS:  # keys seen once: bounded
            seen.clear()
        seen[key] = n
        counts[1] += 1
        launches(stream)
        return
    seen.pop(key, None)
    try:
        g = capture(launches)
    except Exception:  # noqa: BLE001 - a capture the driver refuses: launch as usual, never capture this key
        seen[key] = -(1 << 30)
        counts[1] += 1
        launches(stream)
        return
    counts[2] += 1
    if len(graphs) >= _MAX_GRAPHS:
        graphs.pop(next(iter(graphs)))  # the oldest
        counts[0] += 1
    graphs[key] = g
    g.replay()


def recording() -> Optional[_Recorder]:
    """The recorder of the pass now being recorded on this thread, or None (read by the kernel launcher)."""
    return _STATE.rec


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
          memory_format: torch.memory_format = torch.contiguous_format) -> Tensor:
    """``torch.empty`` for a pass's buffers and outputs: a recorded allocation while a plan is being recorded."""
    if memory_format == torch.channels_last and len(shape) == 4:
        b, c, h, w = shape
        if _STATE.bases is not None:
            # Traced: a flat aten.empty, which the kernels write themselves (see base_of), and its NCHW view.
            # Inductor copies into a buffer before a kernel writes it where that buffer is not a plain allocation
            # with the kernel's layout: a permuted view written by a kernel is cloned (session 35); torch 2.11's
            # graph CSE merges equal empty_strided calls (three layers' outputs became one buffer copied three
            # times, session 36); and its layout optimisation relays 4-D tensors upstream of a convolution
            # channels-last, which for an NHWC (B, H, W, C) allocation is another layout, so the kernel got a
            # NaN-filled copy (stages 1-3's outputs in a training step, session 36). Flat buffers were never copied.
            base = torch.empty((b * h * w * c,), dtype=dtype, device=device)
            t = base.view(b, h, w, c).permute(0, 3, 1, 2)
            _STATE.bases[id(t)] = (t, base)
        else:
            # One strided allocation: a base, where empty(memory_format=...) is an empty and a permuted view.
            t = torch.empty_strided(shape, (h * w * c, 1, w * c, c), dtype=dtype, device=device)
    else:
        t = torch.empty(shape, dtype=dtype, device=device, memory_format=memory_format)
    rec = _STATE.rec
    if rec is not None:
        rec.alloc(t, tuple(shape), dtype, memory_format)
    return t


@contextlib.contextmanager
def traced_bases() -> Iterator[None]:
    """Inside, channels-last buffers from ``empty`` are views of flat allocations, which ``base_of`` gives the
    kernels in their place (a triton_op body traced by torch.compile)."""
    was = _STATE.bases
    _STATE.bases = {}
    try:
        yield
    finally:
        _STATE.bases = was


def base_of(t: Tensor) -> Tensor:
    """The allocation that ``empty`` made ``t`` a view of inside ``traced_bases`` (same first element, so the same
    pointer for a kernel), else ``t``."""
    bases = _STATE.bases
    hit = bases.get(id(t)) if bases else None
    return hit[1] if hit is not None and hit[0] is t else t


def view(base: Tensor, shape: tuple[int, ...], stride: tuple[int, ...], offset: int = 0) -> Tensor:
    """``base.as_strided(shape, stride)`` from ``offset`` elements past base's first for a pass's buffers and
    outputs: a recorded view of a recorded buffer while a plan is being recorded."""
    t = base.as_strided(shape, stride, base.storage_offset() + offset)
    rec = _STATE.rec
    if rec is not None:
        rec.view(t, base, tuple(shape), tuple(stride), offset)
    return t


def signature(*tensors: Optional[Tensor]) -> tuple:
    """What a pass's launches may depend on in its tensor inputs: sizes, strides, dtype, 16-byte alignment."""
    return tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.data_ptr() & 15) for t in tensors)


def planned(key: Optional[tuple], fn: Callable[..., Sequence[Optional[Tensor]]],
            inputs: Sequence[Optional[Tensor]], *consts: Any, first: Optional[Callable[..., None]] = None
            ) -> tuple[Optional[Tensor], ...]:
    """``fn(*inputs, *consts)`` (a tuple of tensors or None), replayed from its plan when ``key`` has one.

    ``key`` must determine every launch of the pass given the inputs' :func:`signature` (the caller includes it,
    with ``consts``, the tuning tables and the device); None: run ``fn`` without a plan. The first call of a key
    records the pass while running it the ordinary way, after calling ``first(fn, inputs, consts)`` (the caller's
    one-off work for a new signature: compile_ahead.py)."""
    if key is None or not ENABLED:
        return tuple(fn(*inputs, *consts))
    try:
        plan = _PLANS[key]
    except KeyError:
        pass
    else:
        if plan is None:  # seen before, not replayable
            return tuple(fn(*inputs, *consts))
        return plan.run(inputs, inputs[0].device)
    if _STATE.rec is not None:  # a pass inside a pass being recorded: part of the outer record
        return tuple(fn(*inputs, *consts))
    if first is not None and len(_PLANS) < _MAX_PLANS:  # (a full table: every call would be a first one)
        first(fn, inputs, consts)
    rec = _STATE.rec = _Recorder(inputs)
    try:
        out = tuple(fn(*inputs, *consts))
    finally:
        _STATE.rec = None
    if len(_PLANS) < _MAX_PLANS:
        _PLANS[key] = rec.finish(out)
    return out


def graph_stats() -> dict[str, int]:
    """Graph mode's state summed over every plan: ``plans`` (replayable ones), ``graph_plans`` (those in graph
    mode), ``graphs`` (held now), ``captures``, ``dropped`` (for newer ones), ``misses`` (passes launched without a
    graph: pointers seen for the first time, a capture in progress, or a plan that captures no more) and ``closed``
    (plans that have dropped ``_MAX_GRAPHS`` and capture no more). For benchmarks: a step that should replay graphs
    and shows misses growing has pointer sets that do not settle."""
    out = dict(plans=0, graph_plans=0, graphs=0, captures=0, dropped=0, misses=0, closed=0)
    for plan in list(_PLANS.values()):
        if plan is None:
            continue
        out["plans"] += 1
        if plan.graph_state is None:
            continue
        graphs, (dropped, misses, captures) = plan.graph_state
        out["graph_plans"] += 1
        out["graphs"] += len(graphs)
        out["captures"] += captures
        out["dropped"] += dropped
        out["misses"] += misses
        out["closed"] += dropped >= _MAX_GRAPHS
    return out


def clear() -> None:
    """Forget every plan (after swapping kernels or launchers, e.g. in tests and benchmarks)."""
    _PLANS.clear()
