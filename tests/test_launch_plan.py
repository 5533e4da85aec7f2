"""Launch plans (wtconvnext/ops/launch_plan.py): a pass recorded once per signature and replayed.

The bookkeeping (slots, outputs, frees, what cannot be replayed) is checked with stand-in launchers; the replay of
the real kernels against the ordinary path, bitwise, under Triton's interpreter on CPU or on a GPU (marked
``triton``).
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are first decorated

from wtconvnext.ops import launch_plan  # noqa: E402
from wtconvnext.ops import wtconv2d  # noqa: E402


def _pass(calls: list):
    """A stand-in pass: two buffers, three launches (the first buffer's last use is the second launch)."""

    def launch(name):
        return lambda *args: calls.append((name, args))

    def core(x, w, k):
        rec = launch_plan.recording()
        a = launch_plan.empty((4,), torch.float32, x.device)
        b = launch_plan.empty((2, 3), torch.float32, x.device)
        for name, args in (("k0", (x, a, k)), ("k1", (a, w, None, 0.5, torch.float16)), ("k2", (b, x, 7, True))):
            launch(name)(*args)
            if rec is not None:
                rec.launch(launch(name), args)
        return b, None

    return core


def test_plan_replays_launches_with_this_calls_tensors():
    calls: list = []
    core = _pass(calls)
    x, w = torch.zeros(3), torch.ones(2)
    b0, none = launch_plan.planned(("k",), core, (x, w), 5)  # recorded while run the ordinary way
    assert none is None and b0.shape == (2, 3)
    plan = launch_plan._PLANS[("k",)]
    kinds = [op[0] for op in plan.ops]
    # allocations in order, the first buffer dropped right after its last launch, the output kept
    assert kinds == [launch_plan._ALLOC, launch_plan._ALLOC, launch_plan._LAUNCH, launch_plan._LAUNCH,
                     launch_plan._FREE, launch_plan._LAUNCH], kinds
    calls.clear()
    x2, w2 = torch.zeros(3), torch.ones(2)
    b1, none = launch_plan.planned(("k",), core, (x2, w2), 5)
    assert [c[0] for c in calls] == ["k0", "k1", "k2"]
    (_, a0), (_, a1), (_, a2) = calls
    assert a0[0] is x2 and a0[2] == 5 and a1[1] is w2 and a1[2] is None and a2[1] is x2 and a2[2] == 7
    assert a1[3] == 0.5 and a1[4] is torch.float16 and a2[3] is True  # constants of any type, as recorded
    assert a0[1] is a1[0] and a0[1] is not b1 and a2[0] is b1  # one buffer per slot, the output returned
    assert b1 is not b0 and none is None


def test_views_of_buffers_are_replayed_as_views():
    """A view of a recorded buffer (launch_plan.view) is a slot too: replayed as the same view of this call's
    buffer, and it keeps that buffer alive as an output after the buffer's own last launch."""
    calls: list = []

    def core(x):
        rec = launch_plan.recording()
        buf = launch_plan.empty((4, 6), torch.float32, x.device)
        v = launch_plan.view(buf, (3, 2), (1, 6))
        for args in ((x, buf), (v,)):
            calls.append(args)
            if rec is not None:
                rec.launch(lambda *a: calls.append(a), args)
        return (v,)

    x = torch.zeros(3)
    launch_plan.planned(("view",), core, (x,))
    plan = launch_plan._PLANS[("view",)]
    assert plan is not None and [op[0] for op in plan.ops] == [
        launch_plan._ALLOC, launch_plan._VIEW, launch_plan._LAUNCH, launch_plan._FREE, launch_plan._LAUNCH]
    calls.clear()
    (v,) = launch_plan.planned(("view",), core, (torch.zeros(3),))
    (_, buf), (v_launched,) = calls
    assert v is v_launched and v.shape == (3, 2) and v.stride() == (1, 6)
    assert v.data_ptr() == buf.data_ptr() and v.untyped_storage().nbytes() == 4 * 6 * 4
    # a view from an element past the first: the same offset into this call's buffer
    launch_plan.planned(("view_at",), lambda a: (launch_plan.view(launch_plan.empty((4, 6), torch.float32, a.device),
                                                                  (2, 3), (6, 1), 7),), (x,))
    # (replayed: this core never runs)
    (w,) = launch_plan.planned(("view_at",), lambda a: (launch_plan.view(a.new_empty((1,)), (1,), (1,)),), (x,))
    assert launch_plan._PLANS[("view_at",)] is not None and w.storage_offset() == 7 and w.stride() == (6, 1)
    # a view of a tensor the pass did not allocate: not replayable
    launch_plan.planned(("view2",), lambda a: (launch_plan.view(a.clone(), (1,), (1,)),), (x,))
    assert launch_plan._PLANS[("view2",)] is None


def test_pass_with_a_foreign_tensor_is_not_replayed():
    calls: list = []
    x = torch.zeros(3)

    def core(x):
        rec = launch_plan.recording()
        view = x[1:]  # a tensor the pass made without launch_plan.empty
        calls.append("k")
        if rec is not None:
            rec.launch(lambda *a: calls.append("k"), (view,))
        return (x,)

    launch_plan.planned(("v",), core, (x,))
    assert launch_plan._PLANS[("v",)] is None
    calls.clear()
    launch_plan.planned(("v",), core, (x,))
    assert calls == ["k"]  # ran the ordinary way (the pass itself launched once)


def test_one_tensor_as_two_inputs_is_not_replayed():
    x = torch.zeros(3)
    launch_plan.planned(("d",), lambda a, b: (a,), (x, x))
    assert launch_plan._PLANS[("d",)] is None


def test_no_key_or_disabled_runs_the_pass(monkeypatch):
    x = torch.zeros(3)
    launch_plan.planned(None, lambda a: (a,), (x,))
    monkeypatch.setattr(launch_plan, "ENABLED", False)
    launch_plan.planned(("e",), lambda a: (a,), (x,))
    assert not launch_plan._PLANS


class _FakeCompiled:
    """A compiled kernel's parts as a launch plan sees them: a launcher that records its call, a function handle
    and packed metadata."""

    def __init__(self, calls: list, name: str) -> None:
        self.function, self.packed_metadata = f"fn-{name}", (1, 1, 0)
        self.run = lambda *a: calls.append(("direct", name, a))


def test_direct_replay_calls_the_launchers_with_pointers(monkeypatch):
    """Plans with launcher parts replay through the launchers: the stream read once per pass, no launch metadata or
    hooks, tensors as their data pointers; with a launch hook installed, through the recorded runners."""
    calls: list = []
    hooks_idle = [True]
    streams = iter(range(100, 200))
    monkeypatch.setattr(launch_plan, "_direct_env", (lambda: next(streams), lambda: hooks_idle[0]))
    monkeypatch.setattr(launch_plan, "DIRECT", True)
    kernels = {name: _FakeCompiled(calls, name) for name in ("k0", "k1")}

    def core(x, w):
        rec = launch_plan.recording()
        a = launch_plan.empty((4,), torch.float32, x.device)
        for name, args, grid in (("k0", (x, a, 3), (2, 1, 1)), ("k1", (a, w, None, x), (5, 6, 7))):
            calls.append(("runner", name, args))
            if rec is not None:
                k = kernels[name]
                rec.launch(lambda *args, name=name: calls.append(("runner", name, args)), args,
                           (k.run, k.function, k.packed_metadata, *grid))
        return (a,)

    x, w = torch.zeros(3), torch.ones(2)
    launch_plan.planned(("direct",), core, (x, w))
    calls.clear()
    x2, w2 = torch.zeros(3), torch.ones(2)
    (a,) = launch_plan.planned(("direct",), core, (x2, w2))
    assert [c[:2] for c in calls] == [("direct", "k0"), ("direct", "k1")], calls
    (_, _, c0), (_, _, c1) = calls
    assert c0 == (2, 1, 1, 100, "fn-k0", (1, 1, 0), None, None, None, x2.data_ptr(), a.data_ptr(), 3)
    assert c1 == (5, 6, 7, 100, "fn-k1", (1, 1, 0), None, None, None, a.data_ptr(), w2.data_ptr(), None,
                  x2.data_ptr())
    calls.clear()
    hooks_idle[0] = False  # a profiler's hook: the runners, which call Triton's hooks
    (a,) = launch_plan.planned(("direct",), core, (x2, w2))
    assert [c[:2] for c in calls] == [("runner", "k0"), ("runner", "k1")] and calls[1][2][0] is a
    calls.clear()
    monkeypatch.setattr(launch_plan, "DIRECT", False)  # read when a plan is made
    hooks_idle[0] = True
    launch_plan.clear()
    launch_plan.planned(("direct",), core, (x, w))
    calls.clear()
    launch_plan.planned(("direct",), core, (x2, w2))
    assert [c[:2] for c in calls] == [("runner", "k0"), ("runner", "k1")]


def test_graph_mode_replays_a_captured_graph_per_pointer_set(monkeypatch):
    """GRAPHS (the default on a GPU): a direct replay launches as usual the first time its pointers are seen,
    captures a graph of its launches the second time and replays it (once) then and every later time; other pointers
    launch again, a stream being captured never captures, at most _MAX_GRAPHS graphs are kept per plan, and a plan
    that has dropped _MAX_GRAPHS of them captures no more."""
    calls: list = []
    capturing = [False]
    monkeypatch.setattr(launch_plan, "_direct_env", (lambda: 5, lambda: True))
    monkeypatch.setattr(launch_plan, "DIRECT", True)
    monkeypatch.setattr(launch_plan, "GRAPHS", True)
    monkeypatch.setattr(launch_plan, "_MAX_GRAPHS", 2)
    monkeypatch.setattr(launch_plan, "_PLANS", {})
    kernels = {name: _FakeCompiled(calls, name) for name in ("k0", "k1")}

    class Graph:
        def __init__(self, launches):
            calls.append(("capture",))
            self.launches = launches

        def replay(self):
            calls.append(("replay",))
            self.launches(-1)  # what the captured launches do, on the replaying stream

    monkeypatch.setattr(launch_plan, "_graph_env", (Graph, lambda: capturing[0]))

    def core(x, w):
        rec = launch_plan.recording()
        for name, args in (("k0", (x, w, 3)), ("k1", (w, x, None))):
            if rec is not None:
                k = kernels[name]
                rec.launch(lambda *a: None, args, (k.run, k.function, k.packed_metadata, 1, 2, 3))
        return (None,)

    x, w = torch.zeros(3), torch.ones(2)
    launch_plan.planned(("graphs",), core, (x, w))  # recorded the ordinary way (no launcher calls here)

    def replay(*inputs):
        calls.clear()
        launch_plan.planned(("graphs",), core, inputs)
        return [(c[0], c[1], c[2][3]) if c[0] == "direct" else c for c in calls]  # kind, kernel, stream

    direct = [("direct", "k0", 5), ("direct", "k1", 5)]
    replayed = [("replay",), ("direct", "k0", -1), ("direct", "k1", -1)]
    assert replay(x, w) == direct  # first sight of these pointers
    assert calls[0][2][9:] == (x.data_ptr(), w.data_ptr(), 3)
    assert replay(x, w) == [("capture",), *replayed]  # second: captured, then replayed
    assert replay(x, w) == replayed
    x2 = torch.zeros(3)
    assert replay(x2, w) == direct  # other pointers
    capturing[0] = True
    assert replay(x2, w) == direct  # inside another capture: launched into it, never captured
    capturing[0] = False
    assert replay(x2, w) == [("capture",), *replayed]
    x3 = torch.zeros(3)
    replay(x3, w)
    assert replay(x3, w)[0] == ("capture",)  # a third graph: the oldest (x's) is dropped
    assert replay(x, w) == direct
    assert replay(x2, w) == replayed
    capturing[0] = True
    assert replay(x2, w) == direct  # a graph for these pointers, but the stream is being captured
    capturing[0] = False
    assert replay(x, w)[0] == ("capture",)  # x's again (seen once since its drop); x2's dropped: two, _MAX_GRAPHS
    x4 = torch.zeros(3)
    for _ in range(3):  # pointers that keep changing: no more captures in this plan
        assert replay(x4, w) == direct
    assert replay(x2, w) == direct
    assert replay(x3, w) == replayed and replay(x, w) == replayed  # the graphs it has still replay
    # What graph_stats sums over the calls above: 10 passes launched without a graph (6 first sights or sights
    # inside a capture, then 4 after the plan closed), 4 captures, 2 dropped, so this plan captures no more.
    assert launch_plan.graph_stats() == dict(plans=1, graph_plans=1, graphs=2, captures=4, dropped=2, misses=10,
                                             closed=1)


def test_direct_replay_puts_intermediates_in_one_workspace(monkeypatch):
    """Intermediates that only direct launches touch become pointers into one allocation per pass, each at the
    lowest 512-byte-aligned offset free of the buffers alive with it; outputs, bases of views and buffers a runner
    launch takes stay tensors of their own."""
    calls: list = []
    monkeypatch.setattr(launch_plan, "_direct_env", (lambda: 7, lambda: True))
    monkeypatch.setattr(launch_plan, "DIRECT", True)
    kernels = {name: _FakeCompiled(calls, name) for name in ("k0", "k1", "k2", "k3")}
    f32 = torch.float32

    def core(x):
        rec = launch_plan.recording()
        made = {}

        def launch(name, *args, direct=True):
            if rec is not None:
                k = kernels[name]
                rec.launch(lambda *a: calls.append(("runner", name, a)), args,
                           (k.run, k.function, k.packed_metadata, 1, 1, 1) if direct else None)

        made["a"] = a = launch_plan.empty((100,), f32, x.device)   # 400 B: one 512-byte unit
        made["b"] = b = launch_plan.empty((300,), f32, x.device)   # 1200 B: three units
        launch("k0", x, a, b)
        made["c"] = c = launch_plan.empty((10,), f32, x.device)
        launch("k1", a, c)                                          # a's last use
        made["d"] = d = launch_plan.empty((2, 25), f32, x.device)  # a's place
        launch("k2", b, c, d)
        made["e"] = e = launch_plan.empty((4,), f32, x.device)     # a runner launch takes it: a tensor
        launch("k3", e, direct=False)
        out = launch_plan.empty((3,), f32, x.device)
        launch("k0", d, e, out)
        core.made = made
        return (out,)

    launch_plan.planned(("arena",), core, (torch.zeros(3),))
    plan = launch_plan._PLANS[("arena",)]
    offsets, size, _ = plan.arena()
    slot = {name: n for n, name in enumerate(("x", "a", "b", "c", "d", "e", "out"))}
    assert offsets == {slot["a"]: 0, slot["b"]: 512, slot["c"]: 2048, slot["d"]: 0} and size == 2560
    calls.clear()
    x2 = torch.zeros(3)
    (out,) = launch_plan.planned(("arena",), core, (x2,))
    assert out.shape == (3,) and [c[:2] for c in calls] == [("direct", "k0"), ("direct", "k1"), ("direct", "k2"),
                                                            ("runner", "k3"), ("direct", "k0")], calls
    pa = calls[0][2][10]  # a's pointer: the workspace's start
    assert calls[0][2][9:] == (x2.data_ptr(), pa, pa + 512)
    assert calls[1][2][9:] == (pa, pa + 2048)
    assert calls[2][2][9:] == (pa + 512, pa + 2048, pa)
    (e_tensor,) = calls[3][2]
    assert isinstance(e_tensor, torch.Tensor) and e_tensor.shape == (4,)
    assert calls[4][2][9:] == (pa, e_tensor.data_ptr(), out.data_ptr())  # d: a pointer at a's place


def test_workspace_keeps_the_peak_of_separate_allocations(monkeypatch):
    """A workspace lives until its last buffer's last use, so an output allocated after a large intermediate died
    could not reuse that memory: such an intermediate stays an allocation of its own."""
    calls: list = []
    monkeypatch.setattr(launch_plan, "_direct_env", (lambda: 7, lambda: True))
    monkeypatch.setattr(launch_plan, "DIRECT", True)
    k = _FakeCompiled(calls, "k")
    f32 = torch.float32

    def core(x):
        rec = launch_plan.recording()

        def launch(*args):
            if rec is not None:
                rec.launch(lambda *a: None, args, (k.run, k.function, k.packed_metadata, 1, 1, 1))

        big = launch_plan.empty((1 << 20,), f32, x.device)  # 4 MiB, dead before the output is made
        small = launch_plan.empty((4,), f32, x.device)
        launch(x, big, small)
        out = launch_plan.empty((1 << 20,), f32, x.device)
        launch(small, out)
        return (out,)

    launch_plan.planned(("peak",), core, (torch.zeros(3),))
    offsets, size, _ = launch_plan._PLANS[("peak",)].arena()
    assert offsets == {2: 0} and size == 512  # small alone; big keeps its own allocation
    calls.clear()
    (out,) = launch_plan.planned(("peak",), core, (torch.zeros(3),))
    big_ptr, small_ptr = calls[0][2][10:]
    assert big_ptr != small_ptr and calls[1][2][9:] == (small_ptr, out.data_ptr())


def _grads(x, params, dy, stride=1):
    xs = x.detach().clone().requires_grad_()
    ps = [p.detach().clone().requires_grad_() if p is not None else None for p in params]
    y = wtconv2d(xs, *ps, stride=stride, backend="triton")
    y.backward(dy)
    return [y, xs.grad] + [p.grad for p in ps if p is not None]


_ON_GPU = pytest.mark.skipif(DEVICE == "cpu", reason="direct launches need compiled kernels (a GPU)")


@pytest.mark.triton
@pytest.mark.parametrize("h, w, levels, stride, bias, small_max, dtype, direct", [
    (11, 9, 2, 1, True, 0, torch.float32, False),     # multi-launch passes
    (7, 6, 2, 1, False, 16, torch.bfloat16, False),   # one-launch passes of a small map, no bias
    (12, 9, 2, 2, True, 0, torch.float32, False),     # stride: dy scattered outside the plan
    (10, 8, 2, 1, True, 0, torch.bfloat16, False),    # level 1 on load, its weight gradients staged through dx
    pytest.param(11, 9, 2, 1, True, 0, torch.float32, True, marks=_ON_GPU),  # the launchers called directly
    pytest.param(7, 6, 2, 1, False, 16, torch.bfloat16, True, marks=_ON_GPU),
    pytest.param(10, 8, 2, 1, True, 0, torch.bfloat16, True, marks=_ON_GPU),
])
def test_replay_is_bitwise_the_ordinary_path(h, w, levels, stride, bias, small_max, dtype, direct, monkeypatch):
    from wtconvnext.ops import triton_kernels as tk

    # wgrad_imgs 1: two images are two image groups, so level1_partials stages one image at a time (views of dx's
    # buffer at an offset) on an even map.
    monkeypatch.setattr(tk, "TUNING", {**tk.TUNING, "small_max": small_max, "wgrad_imgs": 1})
    monkeypatch.setattr(launch_plan, "DIRECT", direct)
    g = torch.Generator().manual_seed(3)
    c, k = 6, 3

    def r(*shape):
        return (torch.rand(*shape, generator=g) - 0.5).to(DEVICE, dtype)

    params = [r(c, 1, k, k), r(c) if bias else None, 1 + r(c), r(levels, c, 4, k, k), r(levels, c, 4)]
    x = r(2, c, h, w).contiguous(memory_format=torch.channels_last)
    ho, wo = -(-h // stride), -(-w // stride)
    dy = r(2, c, ho, wo).contiguous(memory_format=torch.channels_last)
    monkeypatch.setattr(launch_plan, "ENABLED", False)
    ordinary = _grads(x, params, dy, stride)
    monkeypatch.setattr(launch_plan, "ENABLED", True)
    recorded = _grads(x, params, dy, stride)
    plans = dict(launch_plan._PLANS)
    assert len(plans) == 2 and all(p is not None for p in plans.values())  # the forward's and the backward's
    replayed = _grads(x, params, dy, stride)
    if direct:  # the plans did take the launchers directly
        assert launch_plan._direct_env is not None
        assert all(any(op[0] == launch_plan._LAUNCH and op[4] is not None for op in p.ops) for p in plans.values())
    x_nchw = x.contiguous()  # another input layout: the same plans (the kernels see channels-last copies)
    nchw = _grads(x_nchw, params, dy.contiguous(), stride)
    assert launch_plan._PLANS == plans
    for got in (recorded, replayed, nchw):
        for a, b in zip(got, ordinary):
            assert torch.equal(a, b)


@pytest.mark.triton
@_ON_GPU
@pytest.mark.parametrize("small_max", [0, 16], ids=["multi-launch", "small-map"])
def test_graph_mode_is_bitwise_the_ordinary_path(small_max, monkeypatch):
    """GRAPHS (the default on a GPU): passes whose pointers repeat are replayed as CUDA graphs of their launches,
    with the ordinary path's bits, forward and backward."""
    from wtconvnext.ops import triton_kernels as tk

    monkeypatch.setattr(tk, "TUNING", {**tk.TUNING, "small_max": small_max})
    monkeypatch.setattr(launch_plan, "GRAPHS", True)
    g = torch.Generator().manual_seed(5)
    c, k, levels, h, w = 6, 3, 2, 11, 9

    def r(*shape):
        return (torch.rand(*shape, generator=g) - 0.5).to(DEVICE, torch.bfloat16)

    params = [r(c, 1, k, k), r(c), 1 + r(c), r(levels, c, 4, k, k), r(levels, c, 4)]
    x = r(2, c, h, w).contiguous(memory_format=torch.channels_last)
    dy = r(2, c, h, w).contiguous(memory_format=torch.channels_last)
    monkeypatch.setattr(launch_plan, "ENABLED", False)
    ordinary = _grads(x, params, dy)
    monkeypatch.setattr(launch_plan, "ENABLED", True)
    launch_plan.clear()
    for _ in range(8):  # recorded, replayed (pointers seen), captured and replayed, then replays of the graph
        got = _grads(x, params, dy)  # each call's tensors freed before the next: the allocator repeats addresses
        for a, b in zip(got, ordinary):
            assert torch.equal(a, b)
        # (The loop's names too: a tensor of this call held into the next moves that call's addresses. Session 30
        # on the H200: with five calls and `a` held, the small-map case captured no backward graph; this form is
        # not yet GPU-run.)
        del got, a, b
    graphs = [p._run.__globals__.get("_graphs") for p in launch_plan._PLANS.values() if p is not None]
    assert len(graphs) == 2 and all(gr for gr in graphs), graphs  # the forward's and the backward's


@pytest.mark.triton
@pytest.mark.parametrize("plans", [False, True])
def test_input_gradient_is_written_into_dys_coefficient_buffer(plans, monkeypatch):
    """A multi-launch backward writes dx into dy's coefficient buffer (triton_kernels.input_grad_buffer: no extra
    full-size map at the layer's peak), recorded and replayed as a view, with the ordinary path's bits."""
    from wtconvnext.ops import triton_kernels as tk

    monkeypatch.setattr(tk, "TUNING", {**tk.TUNING, "small_max": 0})
    g = torch.Generator().manual_seed(5)
    c, k, levels, h, w = 4, 3, 2, 9, 7
    params = [(torch.rand(*s, generator=g) - 0.5).to(DEVICE) for s in
              [(c, 1, k, k), (c,), (c,), (levels, c, 4, k, k), (levels, c, 4)]]
    x = torch.rand(2, c, h, w, generator=g).to(DEVICE).contiguous(memory_format=torch.channels_last)
    dy = torch.rand(2, c, h, w, generator=g).to(DEVICE).contiguous(memory_format=torch.channels_last)
    monkeypatch.setattr(launch_plan, "ENABLED", plans)
    coef_bytes = tk._offsets(2, c, h, w, levels)[-1] * x.element_size()
    results = []
    for _ in range(2 if plans else 1):  # recorded, then replayed
        xs = x.clone().requires_grad_()
        ps = [p.clone().requires_grad_() for p in params]
        (dx,) = torch.autograd.grad(wtconv2d(xs, *ps, backend="triton"), [xs], dy)
        assert dx.untyped_storage().nbytes() == coef_bytes and dx.is_contiguous(memory_format=torch.channels_last)
        results.append(dx)
    from wtconvnext.ops import wtconv_triton

    # the reference: dx in a map of its own
    monkeypatch.setattr(wtconv_triton, "input_grad_buffer", lambda dys, coef, lv: torch.empty_like(dys))
    monkeypatch.setattr(launch_plan, "ENABLED", False)
    xs = x.clone().requires_grad_()
    ps = [p.clone().requires_grad_() for p in params]
    (ref,) = torch.autograd.grad(wtconv2d(xs, *ps, backend="triton"), [xs], dy)
    assert ref.untyped_storage().nbytes() == ref.numel() * ref.element_size()  # a map of its own
    for dx in results:
        assert torch.equal(dx, ref)


@pytest.mark.triton
def test_changed_tuning_records_a_new_plan(monkeypatch):
    """A plan is keyed by the tuning tables: a pass under other launch shapes is recorded anew, not replayed."""
    from wtconvnext.ops import triton_kernels as tk

    names: list[str] = []
    launch = tk._launch
    monkeypatch.setattr(tk, "_launch", lambda fn, *a, **kw: (names.append(fn.__name__), launch(fn, *a, **kw)))
    x = torch.randn(1, 4, 7, 7, device=DEVICE).contiguous(memory_format=torch.channels_last)
    params = [torch.randn(4, 1, 3, 3, device=DEVICE), None, torch.ones(4, device=DEVICE),
              torch.randn(2, 4, 4, 3, 3, device=DEVICE), torch.ones(2, 4, 4, device=DEVICE)]
    seen = []
    with torch.no_grad():
        for small_max in (16, 16, 0):
            monkeypatch.setattr(tk, "TUNING", {**tk.TUNING, "small_max": small_max})
            del names[:]
            wtconv2d(x, *params, backend="triton")
            seen.append(list(names))
    # recorded (one launch), replayed (past _launch), recorded anew under the other table (multi-launch)
    assert "_small_kernel" in seen[0] and seen[1] == [] and "_analysis_kernel" in seen[2], seen
    assert len(launch_plan._PLANS) == 2
