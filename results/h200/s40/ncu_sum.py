"""Per-kernel summary of the ncu CSVs given (session 40: python ncu_sum.py call2_ncu_*.csv): FFMA count, warp
instructions per FFMA, FMA rate against the H100's fp32 peak, issue-slot use, occupancy, DRAM bytes."""
import csv, sys
PEAK_FMA = 132 * 128 * 1.98e9  # H100 SXM fp32 FMA/s at the max clock (ncu ran with clock-control none)
def num(v):
    try: return float(v.replace(",", ""))
    except: return float("nan")
out = []
for f in sys.argv[1:]:
    lines = [l for l in open(f) if l.startswith('"')]
    rows = list(csv.DictReader(lines))[1:]  # skip the units row
    print(f"== {f.split('/')[-1]}")
    tot_t = tot_f = tot_i = 0
    for r in rows:
        t = num(r["gpu__time_duration.sum"]) * 1e-9
        ffma = num(r["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"])
        hf = num(r["smsp__sass_thread_inst_executed_op_hfma_pred_on.sum"])
        ti = num(r["smsp__thread_inst_executed.sum"]); wi = num(r["smsp__inst_executed.sum"])
        issue = num(r["smsp__issue_active.avg.pct_of_peak_sustained_active"])
        occ = num(r["sm__warps_active.avg.pct_of_peak_sustained_active"])
        dram = num(r["dram__bytes.sum"])
        name = r["Kernel Name"][:40]
        tot_t += t; tot_f += ffma; tot_i += wi
        print(f"{name:40} {t*1e6:8.1f} us  FFMA {ffma/1e9:6.2f} G  HFMA {hf/1e9:5.2f} G  warp-inst {wi/1e6:7.1f} M  "
              f"inst/FFMA {wi*32/max(ffma,1):6.2f}  FMA rate {ffma/t/1e12:5.2f} T/s ({100*ffma/t/PEAK_FMA:4.1f}%)  "
              f"issue {issue:5.1f}%  occ {occ:5.1f}%  DRAM {dram/1e6:6.1f} MB  regs {r['launch__registers_per_thread']}")
    print(f"{'TOTAL':40} {tot_t*1e6:8.1f} us  FFMA {tot_f/1e9:6.2f} G  warp-inst {tot_i/1e6:7.1f} M  inst/FFMA {tot_i*32/tot_f:6.2f}  FMA rate {tot_f/tot_t/1e12:5.2f} T/s ({100*tot_f/tot_t/PEAK_FMA:4.1f}%)")
