#!/usr/bin/env python3
"""Turns benchmarks/results/biggan/biggan_scale.jsonl (from biggan_scale.sh) into the
Markdown table of docs/results.md, the largest model trained per stage and world size,
and, with gnuplot, a plot of peak RSS per rank against parameters.

Usage: biggan_scale_report.py [JSONL] [PLOT.png]
Prints Markdown on stdout. Stdlib only; gnuplot is optional (no plot without it).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

GIB = 1024 ** 3


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/biggan/biggan_scale.jsonl"
    plot = sys.argv[2] if len(sys.argv) > 2 else "docs/images/biggan-scale.png"
    rows = [json.loads(line) for line in open(path) if line.strip()]
    # The last row of a cell wins (a cell re-run after a fix replaces the earlier one).
    cells = {}
    for r in rows:
        cells[(r["params"], r["world_size"], r["stage"])] = r
    rows = [cells[k] for k in sorted(cells)]
    print("| params | N | stage | result | VmHWM per rank (GiB) | summed | accounting/rank | "
          "pre-flight/rank | ZeRO formula/rank | step s | allocator |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rss = r.get("peak_rss_bytes_per_rank") or []
        acc = r.get("accounting_model_state_bytes_rank0")
        step = r.get("step_time_s")
        result = r["result"]
        if r.get("preflight_skipped") and not r.get("preflight_admits", True):
            # Trained with train.skip_memory_check (SWEEP_SET): the pre-flight refuses it.
            result += " (check skipped; the pre-flight refuses it)"
        cols = [f"{r['params'] / 1e6:.1f}M", str(r["world_size"]), str(r["stage"]), result,
                ", ".join(f"{b / GIB:.2f}" for b in rss), f"{sum(rss) / GIB:.2f}" if rss else "",
                f"{acc / GIB:.2f}" if acc is not None else "",
                f"{r['preflight_peak_bytes_per_rank'] / GIB:.2f}", f"{r['zero_formula_bytes_per_rank'] / GIB:.2f}",
                f"{step:.1f}" if step is not None else "",
                "fixed mmap threshold" if r.get("note") else "glibc default"]
        print("| " + " | ".join(cols) + " |")
    print()
    print("| N | stage | largest model trained | smallest model not trained (why) |")
    print("|---|---|---|---|")
    for n in sorted({r["world_size"] for r in rows}):
        for st in range(4):
            cell = [r for r in rows if r["world_size"] == n and r["stage"] == st]
            ok = [r["params"] for r in cell if r["result"] == "trained"]
            no = sorted((r["params"], r["result"]) for r in cell if r["result"] != "trained")
            if cell:
                print(f"| {n} | {st} | {max(ok) / 1e6:.1f}M | " if ok else f"| {n} | {st} | none | ", end="")
                print(f"{no[0][0] / 1e6:.1f}M ({no[0][1]}) |" if no else "none |")
    if not shutil.which("gnuplot"):
        print("\n(gnuplot not found: no plot)", file=sys.stderr)
        return
    # One panel per world size: measured peak RSS per stage (points) and the ZeRO formula
    # per stage (lines: 16, 4 + 12/N, 2 + 14/N, 16/N bytes per parameter).
    per_param = lambda n: [16, 4 + 12 / n, 2 + 14 / n, 16 / n]
    colors = ["#d62728", "#ff7f0e", "#2ca02c", "#1f77b4"]
    with tempfile.TemporaryDirectory() as tmp:
        panels = []
        for n in (1, 2, 4):
            plots = []
            for st in range(4):
                pts = sorted((r["params"], max(r["peak_rss_bytes_per_rank"]) / GIB) for r in rows
                             if r["world_size"] == n and r["stage"] == st and r["result"] == "trained")
                if pts:
                    f = os.path.join(tmp, f"n{n}s{st}.dat")
                    with open(f, "w") as out:
                        out.writelines(f"{p} {g}\n" for p, g in pts)
                    plots.append(f"'{f}' using 1:2 with points pt 7 ps 1.2 lc rgb '{colors[st]}' title 'stage {st} measured'")
                plots.append(f"{per_param(n)[st]}*x/2**30 with lines dt 2 lc rgb '{colors[st]}' title 'stage {st} ZeRO formula'")
            panels.append(f"set title 'N = {n}'\nplot [5e7:1.5e9] [0.1:40] " + ", ".join(plots))
        script = f"""
set terminal pngcairo size 1500,520 font ',10'
set output '{plot}'
set multiplot layout 1,3 title 'BigGAN, bfloat16 compute, float32 masters and Adam, 1 step: peak RSS (VmHWM) of the largest rank vs ZeRO formula (2 cores, 24 GiB)'
set logscale xy
set xlabel 'parameters (G + D)'
set ylabel 'GiB per rank'
set key left top font ',8'
set grid
{chr(10).join(panels)}
unset multiplot
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    print(f"\n(plot written to {plot})", file=sys.stderr)


if __name__ == "__main__":
    main()
