"""Instruction counts of the fused kernels' inner loops, from their sm_90 machine code, on any machine (no GPU).

    python benchmarks/sass_stats.py [--kernels conv_base wgrad_levels ...] [--channels 96] [--kernel-size 5]
                                    [--tuning wgrad_maxnreg=0 ...] [--json out.json] [--fresh-cache]

Compiles each kernel for Hopper in the specialisation the launchers use for a bf16 (or ``--dtype fp32``) layer
with C channels (today's ``TUNING`` launch shapes, pointers 16-byte aligned as allocations are), disassembles the
cubin with the ``nvdisasm`` that ships with triton, and prints, for every loop (a backward branch), how many
instructions its body has and how many of them are FMAs, adds and loads, plus the registers per thread. The kernels
are instruction-issue bound, so instructions per FMA of a loop body is what a change to a kernel should lower;
timing stays with ``ab_kernels.py`` on a GPU. It also prints each kernel's compile time (``--fresh-cache``: from an
empty Triton cache), which a fresh machine pays at a model's first step: most of it is Triton's TritonGPUCoalesce
pass, whose cost grows with the square of a kernel's size (session 27).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import compile_sm90, tuning_entries, write_json  # noqa: E402

KERNELS = ["conv_base", "conv_base_syn1", "conv_base_onload", "conv_levels", "dx_base", "dx_base_onload", "small",
           "small_dx",
           "wgrad_base", "wgrad_levels", "wgrad_levels_unroll", "wgrad_levels_fp32", "wgrad_pair",
           "wgrad_level1", "level1", "level1_dx"]
_INSTR = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)[.\s]")
_BRANCH = re.compile(r"BRA\s+`?\((\.L_x_\d+)\)")


def _case(name: str, ch: int, dtype: str, k: int = 5):
    import triton.language as tl

    from wtconvnext.ops import triton_kernels as tk

    x = "*fp32" if dtype == "fp32" or name.endswith("fp32") else "*bf16"
    f32, i32, fp = "*fp32", "i32", tl.float32
    tun = tk.TUNING
    tp = tk._pow2(k * k + 1)  # the weight-gradient partials' lanes, as _walk_shape pads them
    levels = 4 if "levels" in name else 0
    cc = 4 * ch if levels else ch
    if name.startswith("small"):  # a small map's whole pass (WTConvNeXt-T stage 3: 14 x 14, 3 levels)
        from wtconvnext.ops import small_kernels as sk

        dx = name == "small_dx"
        sig = dict(x_ptr=x, coef_ptr=x, filt_ptr=x, y_ptr=x, bw_ptr=f32, bb_ptr=f32, lw_ptr=f32, H=i32,
                   W=i32, B=i32)
        const = dict(C=ch, K=k, LEVELS=3, HM=16, WM=16, BW=tun["small_bw"], BC=tk._block_c(ch, tun["small_bc"]),
                     CHUNK=tun["small_chunk"], STRIDE=1, HAS_BIAS=not dx, FLIP=dx, HAS_COEF=dx, COMPUTE=fp,
                     SYN1=int(tk._syn1(tun["small_bw"])), SYN_AHEAD=tun["syn1_ahead"],
                     NARROW=tk.small_narrow())
        return sk._small_kernel, sig, const, tun["small_warps"]
    if name.startswith("level1"):  # level 1's convolutions with its subbands made on load (TUNING l1_onload)
        sig = dict(x_ptr=x, y_ptr=x, w_ptr=f32, H=i32, W=i32)
        const = dict(C=ch, K=k, BW=tun["l1_bw"], BC=tk._block_c(ch, tun["l1_bc"]), FLIP=name == "level1_dx",
                     COMPUTE=fp)
        return tk._level1_kernel, sig, const, tun["l1_warps"]
    if name.startswith(("conv", "dx")):
        sig = dict(x_ptr=x, acc_ptr=x, acc2_ptr=x, y_ptr=x, w_ptr=f32, b_ptr=f32, acc2_off=i32, H=i32, W=i32, B=i32)
        # syn1: level 1 synthesised from its stored filtered subbands; onload: from level 1 on load's, polyphase
        # in the output itself (SYN1 2: the default base convolutions of 56 x 56 and 28 x 28, forward and dx).
        syn1 = 2 if name.endswith("onload") else int(name.endswith("syn1"))
        bc = tk.conv_block_c(cc, levels)
        const = dict(CC=cc, K=k, LEVELS=levels, BW=tun["conv_bw"], BC=bc, STRIDE=1,
                     HAS_ACC=not levels, HAS_BIAS=name.startswith("conv_base"), FLIP=name.startswith("dx"), COMPUTE=fp,
                     SYN1=syn1, HAS_ACC2=bool(syn1), SYN_AHEAD=tun["syn1_ahead"] if syn1 else 0,
                     PAIR=tk.conv_pairs(cc, bc, levels))
        return tk._conv_kernel, sig, const, tun["conv_warps"]
    if name == "wgrad_pair":  # the default backward's one weight-gradient launch: base and every level
        sig = dict(x_ptr=x, g_ptr=x, bpart_ptr=f32, cx_ptr=x, cg_ptr=x, lpart_ptr=f32, H=i32, W=i32, B=i32, IMGS=i32,
                   G0=i32, GT=i32, R0=i32)
        const = dict(C=ch, K=k, TP=tp, LEVELS=4, BW=tun["wgrad_bw"], BC0=tk._block_c(ch, tun["wgrad_bc"]),
                     BC=tk._block_c(4 * ch, tun["wgrad_bc"]), COMPUTE=fp, UNROLL=bool(tun["wgrad_unroll"]),
                     INNER=bool(tun["wgrad_inner"]), NARROW=tk._narrow(tun["wgrad_bw"]))
        return tk._wgrad_pair_kernel, sig, const, tun["wgrad_warps"]
    sig = dict(x_ptr=x, g_ptr=x, part_ptr=f32, H=i32, W=i32, B=i32, IMGS=i32, G0=i32, GT=i32)
    if name == "wgrad_level1":  # level 1's walk over its subbands staged through dx's buffer (level1_partials)
        const = dict(CC=4 * ch, K=k, TP=tp, LEVELS=1, BW=tun["wgrad_bw"], BC=tk._block_c(4 * ch, tun["wgrad_bc"]),
                     DSUM=False, COMPUTE=fp, UNROLL=bool(tun["wgrad_unroll"]), INNER=bool(tun["wgrad_inner"]))
        return tk._wgrad_kernel, sig, const, tun["wgrad_warps"]
    const = dict(CC=cc, K=k, TP=tp, LEVELS=levels, BW=tun["wgrad_bw"], BC=tk._block_c(cc, tun["wgrad_bc"]),
                 DSUM=not levels, COMPUTE=fp, UNROLL=name.endswith("unroll"), INNER=bool(tun["wgrad_inner"]),
                 NARROW=tk._narrow(tun["wgrad_bw"]) if levels else 0)
    return tk._wgrad_kernel, sig, const, tun["wgrad_warps"]


def _tool(name: str) -> str:
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    found = str(bundled) if bundled.is_file() else shutil.which(name)
    if not found:
        raise SystemExit(f"{name} not found (neither in triton's backends/nvidia/bin nor on PATH)")
    return found


def loops(sass: str) -> list[dict]:
    """One row per loop of a disassembly (a backward branch): its label, the labels of the loops nested in it (whose
    bodies its count includes once), its instruction count and opcode histogram."""
    lines = sass.splitlines()
    labels = {ln.strip()[:-1]: i for i, ln in enumerate(lines) if re.fullmatch(r"\s*\.L_x_\d+:", ln)}
    spans = []
    for i, ln in enumerate(lines):
        m = _BRANCH.search(ln)
        if m and labels.get(m.group(1), i) < i:
            spans.append((m.group(1), labels[m.group(1)], i))
    rows = []
    for label, start, end in spans:
        ops = collections.Counter(o.group(1) for o in map(_INSTR.match, lines[start:end + 1]) if o)
        if sum(ops.values()) <= 1:  # the branch-to-itself that ends the code
            continue
        inner = [lb for lb, s0, e0 in spans if start <= s0 and e0 <= end and (s0, e0) != (start, end)]
        rows.append(dict(label=label, contains=inner, instructions=sum(ops.values()), ops=dict(ops.most_common())))
    return rows


def analyse(name: str, ch: int, dtype: str, k: int = 5) -> dict:
    """Compile one kernel for sm_90 (kernel size ``k``), disassemble it and count its loops' instructions."""
    fn, sig, const, warps = _case(name, ch, dtype, k)
    start = time.perf_counter()
    compiled = compile_sm90(fn, sig, const, warps)
    seconds = time.perf_counter() - start  # a compile's cost only from an empty cache (--fresh-cache)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / f"{name}.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([_tool("nvdisasm"), "-c", str(cubin)], check=True, capture_output=True, text=True).stdout
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", res)
    rows = loops(sass)
    for lp in rows:  # a warp's FFMA is 32 lanes' multiply-adds
        lp["useful_fma_per_instr"] = 32.0 * lp["ops"].get("FFMA", 0) / lp["instructions"]
    return dict(kernel=name, channels=ch, dtype=dtype, kernel_size=k, registers=int(regs.group(1)) if regs else None,
                compile_s=seconds, constexprs={k: str(v) for k, v in const.items()}, loops=rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", nargs="+", default=KERNELS, choices=KERNELS)
    ap.add_argument("--channels", type=int, default=96)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--kernel-size", type=int, default=5, choices=[3, 5, 7],
                    help="K of the specialisations (the register caps apply at K = 5 only: triton_kernels._maxnreg)")
    ap.add_argument("--tuning", nargs="*", default=[], metavar="KEY=V",
                    help="TUNING entries for these compiles, e.g. wgrad_maxnreg=0 (launch shapes, caps)")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--fresh-cache", action="store_true",
                    help="compile into an empty Triton cache, so 'compile s' is each kernel's whole compile time")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET"):
        # The interpreter's decorators cannot compile: run again without it.
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        return subprocess.run([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])], env=env).returncode
    from wtconvnext.ops import triton_kernels as tk

    tk.TUNING.update(tuning_entries(ap, args.tuning))
    with tempfile.TemporaryDirectory() as cache:
        if args.fresh_cache:
            os.environ["TRITON_CACHE_DIR"] = cache  # read by Triton at each compile
        rows = [analyse(name, args.channels, args.dtype, args.kernel_size) for name in args.kernels]
    tuned = f", TUNING {' '.join(args.tuning)}" if args.tuning else ""
    print(f"sm_90 SASS, {args.dtype}, C={args.channels}, K={args.kernel_size}{tuned}: loop bodies "
          "(instructions per iteration of each loop)")
    print("(an outer loop's count includes the bodies of the loops nested in it, named after '>')")
    for r in rows:
        print(f"{r['kernel']:18} {r['registers'] or '?':>4} regs, compiled in {r['compile_s']:6.1f} s")
    print(f"{'kernel':18} {'regs':>4}  {'loop':20} {'instr':>6} {'FFMA':>5} {'LDG':>4} {'instr/FFMA':>10} "
          f"{'FMA/instr':>9}  top")
    for r in rows:
        for lp in r["loops"]:
            ops = lp["ops"]
            ffma = ops.get("FFMA", 0)
            per = f"{lp['instructions'] / ffma:.1f}" if ffma else "-"
            top = " ".join(f"{k}:{v}" for k, v in list(ops.items())[:6])
            name = lp["label"] + (">" + ",".join(lp["contains"]) if lp["contains"] else "")
            print(f"{r['kernel']:18} {r['registers'] or '?':>4}  {name:20} {lp['instructions']:>6} {ffma:>5} "
                  f"{ops.get('LDG', 0):>4} {per:>10} {lp['useful_fma_per_instr']:9.1f}  {top}")
    print("FMA/instr: useful multiply-adds per warp instruction of the loop body")
    if args.json:
        write_json(args.json, dict(rows=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
