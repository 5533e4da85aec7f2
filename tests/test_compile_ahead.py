"""Compile-ahead (wtconvnext/ops/compile_ahead.py): a new pass signature's kernels compiled side by side in threads,
the training backward's while the forward runs.

Checked with stand-in kernels (no GPU needed): each logs its compiles, on which thread, and whether a launch found
its specialisation compiled (as Triton's cache would) or compiled it on the launching thread. On a GPU, the real
kernels at a shape no other test uses: each compiled once, in the pool, with the ordinary results.
"""

from __future__ import annotations

import contextlib
import os
import threading

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are first decorated

from wtconvnext.ops import compile_ahead, launch_plan  # noqa: E402
from wtconvnext.ops import small_kernels as sk  # noqa: E402
from wtconvnext.ops import triton_kernels as tk  # noqa: E402
from wtconvnext.ops import wtconv2d  # noqa: E402


class _Compiled:
    """A compiled kernel's stand-in: the attributes the kept-kernel path and launch plans use, launches no-ops."""

    function = packed_metadata = None

    @staticmethod
    def run(*args: object) -> None:
        return None

    def __getitem__(self, grid):
        return lambda *args: None


class _Kernel:
    """A ``@triton.jit`` kernel's stand-in: ``warmup`` compiles a specialisation (logged), a launch through
    ``kernel[grid]`` finds it compiled or compiles it there (logged either way)."""

    def __init__(self, fn, log: list, fail: bool) -> None:
        self.arg_names, self.__name__ = fn.arg_names, fn.__name__
        self.log, self.fail, self.compiled = log, fail, set()

    @staticmethod
    def _spec(args, warps, consts):
        return (tuple(a.dtype if isinstance(a, torch.Tensor) else a for a in args), warps, tuple(consts.items()))

    def warmup(self, *args, grid, num_warps, **consts):
        spec = self._spec(args, num_warps, consts)
        self.log.append(("warmup", self.__name__, threading.get_ident(), spec))
        if self.fail:
            raise RuntimeError("stand-in compile error")
        self.compiled.add(spec)

    def __getitem__(self, grid):
        def launch(*args, num_warps, **consts):
            spec = self._spec(args, num_warps, consts)
            self.log.append(("hit" if spec in self.compiled else "compile", self.__name__, threading.get_ident(), spec))
            self.compiled.add(spec)
            return _Compiled()

        return launch


@pytest.fixture
def kernels(monkeypatch):
    """Every kernel of the fused WTConv as a stand-in, the kept-kernel path on as on a GPU, empty caches; yields a
    function that returns the log and sets whether warmups fail."""
    log: list = []
    state = {"fail": False}
    made = []
    for mod in (tk, sk):
        for name, value in list(vars(mod).items()):
            if name.endswith("_kernel") and hasattr(value, "arg_names"):
                k = _Kernel(value, log, False)
                made.append(k)
                monkeypatch.setattr(mod, name, k)
    monkeypatch.setattr(tk, "_FAST_LAUNCH", True)
    monkeypatch.setattr(tk, "_device_index", lambda: 0)
    for name in ("_COMPILED", "_CONSTS", "_PENDING"):
        monkeypatch.setattr(tk, name, {})
    monkeypatch.setattr(launch_plan, "_PLANS", {})
    monkeypatch.setattr(launch_plan, "_direct_env", (lambda: 0, lambda: True))
    monkeypatch.setattr(compile_ahead, "applies", lambda x: compile_ahead._ready())  # CPU tensors here
    monkeypatch.setattr(compile_ahead, "THREADS", 2)  # opt-in
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())

    def get(fail: bool = False) -> list:
        for k in made:
            k.fail = fail
        return log

    yield get
    launch_plan.clear()


def _inputs(small_max, monkeypatch, c=8, h=11, w=9, levels=2):
    monkeypatch.setattr(tk, "TUNING", {**tk.TUNING, "small_max": small_max})
    x = torch.randn(2, c, h, w, dtype=torch.bfloat16, device=DEVICE).contiguous(memory_format=torch.channels_last)
    params = [torch.randn(c, 1, 5, 5), torch.randn(c), torch.ones(c), torch.randn(levels, c, 4, 5, 5),
              torch.ones(levels, c, 4)]
    return x.requires_grad_(), [p.to(DEVICE).requires_grad_() for p in params]


@pytest.mark.parametrize("small_max", [0, 16], ids=["multi-launch", "small-map"])
def test_training_step_compiles_every_kernel_ahead_in_threads(small_max, kernels, monkeypatch):
    log = kernels()
    x, params = _inputs(small_max, monkeypatch)
    main = threading.get_ident()
    y = wtconv2d(x, *params, backend="triton")
    # The forward launched only kernels already compiled (it waited for them) and compiled nothing itself.
    launched = [e for e in log if e[0] != "warmup"]
    assert launched and all(e[0] == "hit" and e[2] == main for e in launched)
    fwd = len(launched)
    # The backward's kernels (its pass dry-run on a stand-in dy) are compiling or compiled, not yet collected.
    assert tk._PENDING
    torch.autograd.grad(y, [x, *params], torch.randn_like(y))
    launched = [e for e in log if e[0] != "warmup"]
    assert len(launched) > fwd and all(e[0] == "hit" for e in launched), launched  # the backward's too
    assert not tk._PENDING  # every compile ahead was collected by its launch
    warmed = [e for e in log if e[0] == "warmup"]
    assert all(e[2] != main for e in warmed)  # in the pool's threads
    names = [e[1] for e in warmed]
    assert {"_fold_kernel", "_param_grads_kernel"} <= set(names)
    assert ("_small_kernel" in names) == bool(small_max)
    # One compile per specialisation launched (a kernel may have several), none twice.
    specs = [(e[1], e[3]) for e in warmed]
    assert len(set(specs)) == len(specs) and set(specs) == {(e[1], e[3]) for e in launched}
    n = len(log)
    y = wtconv2d(x, *params, backend="triton")
    torch.autograd.grad(y, [x, *params], torch.randn_like(y))
    assert len(log) == n  # a known signature: launch plans replay, nothing compiles or dry-runs


def test_inference_compiles_only_its_own_pass(kernels, monkeypatch):
    log = kernels()
    x, params = _inputs(0, monkeypatch)
    with torch.no_grad():
        wtconv2d(x, *params, backend="triton")
    names = {e[1] for e in log if e[0] == "warmup"}
    assert names and "_param_grads_kernel" not in names and "_wgrad_pair_kernel" not in names


def test_no_threads_compiles_at_each_launch(kernels, monkeypatch):
    log = kernels()
    monkeypatch.setattr(compile_ahead, "THREADS", 0)
    x, params = _inputs(16, monkeypatch)
    y = wtconv2d(x, *params, backend="triton")
    torch.autograd.grad(y, [x, *params], torch.randn_like(y))
    assert log and all(e[0] == "compile" for e in log)


def test_a_failed_compile_ahead_leaves_the_launch_to_compile(kernels, monkeypatch):
    log = kernels(fail=True)
    x, params = _inputs(0, monkeypatch)
    y = wtconv2d(x, *params, backend="triton")
    torch.autograd.grad(y, [x, *params], torch.randn_like(y))
    assert any(e[0] == "warmup" for e in log)
    assert all(e[0] == "compile" for e in log if e[0] != "warmup")  # each launch compiled (and would raise) itself
    assert not tk._PENDING


@pytest.mark.triton
@pytest.mark.skipif(DEVICE != "cuda", reason="Triton compiles (and warmup runs) only with a GPU")
def test_gpu_kernels_compile_once_in_the_pool_with_the_ordinary_bits(monkeypatch):
    """On a GPU, at a shape no other test uses: every kernel of a training step compiles once, in the pool (Triton's
    cache grows by exactly the specialisations warmed up, so no launch compiled its own), and the results are
    bitwise those of the step with compile-ahead off."""
    import threading as th

    from wtconvnext.ops import wtconv2d as op

    monkeypatch.setattr(compile_ahead, "THREADS", 4)  # opt-in
    warmed: list[tuple] = []
    compile_fn = compile_ahead._compile

    def logged(fn, grid, args, warps, consts, device):
        warmed.append((fn, th.current_thread().name))
        compile_fn(fn, grid, args, warps, consts, device)

    monkeypatch.setattr(compile_ahead, "_compile", logged)
    g = torch.Generator().manual_seed(7)
    c, k, levels, h, w = 56, 7, 3, 13, 11  # 7 x 7 kernels and 56 channels: nowhere else in the suite

    def step():
        x = torch.randn(3, c, h, w, generator=g).cuda().to(torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        ps = [t.cuda().requires_grad_() for t in (torch.randn(c, 1, k, k, generator=g), torch.randn(c, generator=g),
                                                  torch.ones(c), torch.randn(levels, c, 4, k, k, generator=g),
                                                  torch.ones(levels, c, 4))]
        y = op(x, *ps, backend="triton")
        dy = torch.randn(y.shape, generator=g).cuda().to(y.dtype)
        return [y, *torch.autograd.grad(y, [x, *ps], dy)]

    kernels = {id(f): f for mod in (tk, sk) for n, f in vars(mod).items()
               if n.endswith("_kernel") and hasattr(f, "device_caches")}
    dev = torch.cuda.current_device()
    before = {i: len(f.device_caches[dev][0]) for i, f in kernels.items()}
    g.manual_seed(7)
    got = step()
    torch.cuda.synchronize()
    assert warmed and all(name.startswith("wtconvnext-compile") for _, name in warmed)
    assert not tk._PENDING
    grown = {i: len(f.device_caches[dev][0]) - before[i] for i, f in kernels.items()}
    per_kernel: dict[int, int] = {}
    for fn, _ in warmed:
        per_kernel[id(fn)] = per_kernel.get(id(fn), 0) + 1
    assert {i: n for i, n in grown.items() if n} == per_kernel  # no specialisation compiled twice or off the pool
    monkeypatch.setattr(compile_ahead, "THREADS", 0)
    launch_plan.clear()
    g.manual_seed(7)
    for a, b in zip(got, step()):
        assert torch.equal(a, b)


def test_dry_runs_take_meta_tensors_and_never_fail_the_pass(kernels, monkeypatch):
    """The dry runs allocate nothing on the device (meta copies of the inputs), and a dry run that raises leaves the
    pass to run (and compile) as it would without compile-ahead."""
    log = kernels()
    seen = []
    dry = compile_ahead.dry_run

    def logged(core, inputs, consts):
        seen.extend(t.device.type for t in inputs if t is not None)
        return dry(core, inputs, consts)

    monkeypatch.setattr(compile_ahead, "dry_run", logged)
    x, params = _inputs(0, monkeypatch)
    y = wtconv2d(x, *params, backend="triton")
    torch.autograd.grad(y, [x, *params], torch.randn_like(y))
    assert seen and set(seen) == {"meta"}

    def broken(core, inputs, consts):
        raise RuntimeError("a dry run that fails")

    monkeypatch.setattr(compile_ahead, "dry_run", broken)
    launch_plan.clear()
    del log[:]
    x, params = _inputs(0, monkeypatch, h=12)  # a new signature
    y = wtconv2d(x, *params, backend="triton")
    torch.autograd.grad(y, [x, *params], torch.randn_like(y))
    assert log and not [e for e in log if e[0] == "warmup"]


def test_default_pool_shares_the_cpus_among_torchruns_processes(monkeypatch):
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert compile_ahead._default_threads() == max(1, min(8, cpus))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cpus + 1))  # more processes than CPUs: still one thread each
    assert compile_ahead._default_threads() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "x")  # not a number: as if alone
    assert compile_ahead._default_threads() == max(1, min(8, cpus))


def test_a_bad_thread_count_is_named(monkeypatch):
    monkeypatch.setenv("WTCONVNEXT_COMPILE_THREADS", "eight")
    with pytest.raises(ValueError, match="WTCONVNEXT_COMPILE_THREADS must be 'auto' or a whole number"):
        compile_ahead._threads_from_env()
    monkeypatch.setenv("WTCONVNEXT_COMPILE_THREADS", "3")
    assert compile_ahead._threads_from_env() == 3
    monkeypatch.setenv("WTCONVNEXT_COMPILE_THREADS", "auto")
    assert compile_ahead._threads_from_env() == compile_ahead._default_threads()
    monkeypatch.delenv("WTCONVNEXT_COMPILE_THREADS")
    assert compile_ahead._threads_from_env() == 0  # opt-in


def _described(launches):
    """Launches as comparable rows: kernel, grid, warps, constexprs, and each argument (a tensor by dtype, shape
    and strides)."""
    return [(fn.__name__, tuple(grid), warps, tuple(consts.items()),
             tuple((a.dtype, tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else a for a in args))
            for fn, grid, args, warps, consts in launches]


@pytest.mark.triton
@pytest.mark.parametrize("small_max, stride", [(0, 1), (16, 1), (0, 2)], ids=["multi-launch", "small-map", "stride"])
def test_meta_dry_runs_list_the_launches_of_the_real_passes(small_max, stride, monkeypatch):
    """What compile-ahead compiles is what the passes launch: the forward's dry run and the backward's (on the
    stand-in dy), on meta copies, list the same kernels, grids, arguments and constexprs, in order, as a real
    forward + backward launches (the kernels run: under the interpreter on a CPU)."""
    from wtconvnext.ops import wtconv_triton as wt

    monkeypatch.setattr(tk, "TUNING", {**tk.TUNING, "small_max": small_max})
    monkeypatch.setattr(launch_plan, "ENABLED", False)  # every launch through _launch
    real = []
    launch = tk._launch

    def recorded(fn, grid, args, warps, **consts):
        if tk._COLLECT.launches is None:
            real.append((fn, grid, args, warps, consts))
        launch(fn, grid, args, warps, **consts)

    monkeypatch.setattr(tk, "_launch", recorded)
    g = torch.Generator().manual_seed(2)
    c, levels = 4, 2
    x = torch.randn(2, c, 9, 7, generator=g).to(DEVICE).contiguous(memory_format=torch.channels_last)
    params = [t.to(DEVICE) for t in (torch.randn(c, 1, 3, 3, generator=g), torch.randn(c, generator=g), torch.ones(c),
                                     torch.randn(levels, c, 4, 3, 3, generator=g), torch.ones(levels, c, 4))]
    xs = x.clone().requires_grad_()
    ps = [p.clone().requires_grad_() for p in params]
    y = wtconv2d(xs, *ps, stride=stride, backend="triton")
    torch.autograd.grad(y, [xs, *ps], torch.randn_like(y))
    meta = tuple(compile_ahead._meta(t) for t in (x, *params))
    fwd, outs = compile_ahead.dry_run(wt._forward_core, meta, (stride, None))
    bwd, _ = compile_ahead.dry_run(*wt._backward_after(meta, (stride, None), outs))
    assert _described(fwd + bwd) == _described(real)
