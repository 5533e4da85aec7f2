"""Diagnostic: where does the cold compile of wtconvnext_tiny (AMP train, B=128) spend its time?"""
import os, sys, tempfile, threading, time, traceback
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp())
sys.path.insert(0, os.getcwd())
log = open(sys.argv[1], "w", buffering=1)
T0 = time.perf_counter()
def say(*a):
    log.write(f"{time.perf_counter() - T0:8.2f} " + " ".join(str(x) for x in a) + "\n")
import torch, triton
import torch._inductor.config as icfg
say("compile_threads", icfg.compile_threads, "worker_start", getattr(icfg, "worker_start_method", None), "cpus", os.cpu_count(), len(os.sched_getaffinity(0)))
main_id = threading.get_ident()
def watch():
    while True:
        time.sleep(15)
        f = sys._current_frames().get(main_id)
        st = traceback.extract_stack(f)[-14:]
        say("STACK", " | ".join(f"{os.path.basename(s.filename)}:{s.lineno}:{s.name}" for s in st))
threading.Thread(target=watch, daemon=True).start()
import triton.compiler.compiler as tcc
_orig = tcc.compile
def comp(src, *a, **k):
    t = time.perf_counter(); r = _orig(src, *a, **k)
    name = getattr(getattr(src, "fn", None), "__name__", None) or getattr(src, "name", "?")
    say("triton.compile(parent)", name, f"{time.perf_counter() - t:.2f}s")
    return r
tcc.compile = comp; triton.compile = comp
import triton.compiler as tc; tc.compile = comp
from torch._inductor import async_compile as ac
_tr = ac.AsyncCompile.triton
def tr(self, kernel_name, source_code, *a, **k):
    t = time.perf_counter(); r = _tr(self, kernel_name, source_code, *a, **k)
    say("async.triton", kernel_name, len(source_code), f"{time.perf_counter() - t:.2f}s")
    return r
ac.AsyncCompile.triton = tr
from torch._inductor.graph import GraphLowering
for m in ("run", "codegen", "compile_to_module"):
    o = getattr(GraphLowering, m)
    def w(self, *a, _o=o, _m=m, **k):
        say("GraphLowering." + _m, "start"); t = time.perf_counter(); r = _o(self, *a, **k)
        say("GraphLowering." + _m, f"done {time.perf_counter() - t:.2f}s"); return r
    setattr(GraphLowering, m, w)
import torch._higher_order_ops.triton_kernel_wrap as tkw
for n in ("generate_ttir", "identify_mutated_tensors"):
    o = getattr(tkw, n, None)
    if o is None: continue
    def w(*a, _o=o, _n=n, **k):
        t = time.perf_counter(); r = _o(*a, **k); dt = time.perf_counter() - t
        if dt > 0.2: say(_n, getattr(a[0], "__name__", "?"), f"{dt:.2f}s")
        return r
    setattr(tkw, n, w)
import benchmarks.bench_model as bm
say("building")
step = bm._train_step("wtconvnext_tiny", True, True, 128)
x = bm._input(128, 224)
say("first step start")
step(x); torch.cuda.synchronize()
say("first step done")
step(x); torch.cuda.synchronize()
say("second step done")
from torch._dynamo.utils import compile_times
say(compile_times(repr="str", aggregate=True))
