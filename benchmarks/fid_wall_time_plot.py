#!/usr/bin/env python3
"""FID against wall time from benchmarks/fid_wall_time.sh's JSON lines, as one PNG (gnuplot):
one colour per run, G solid and its EMA dashed, FID on a log scale, the StyleGAN2 target
(30) as a dotted line. The last line of each run wins.

    .venv/bin/python benchmarks/fid_wall_time_plot.py RESULTS.jsonl OUT.png [MACHINE]

MACHINE (default: the CPU model of the records) goes in the title.
"""
import json
import os
import subprocess
import sys
import tempfile

LABELS = {"dcgan": "DCGAN (demo)", "biggan": "conditional BigGAN", "stylegan2": "StyleGAN2 (fmnist preset)"}


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    runs = {}
    for line in open(sys.argv[1]):
        if '"fid_wall_time"' in line:
            r = json.loads(line)
            runs[r["run"]] = r
    if not runs:
        sys.exit(f"{sys.argv[1]}: no fid_wall_time rows")
    machine = sys.argv[3] if len(sys.argv) == 4 else next(iter(runs.values()))["cpu"]
    commits = ", ".join(sorted({r["commit"] for r in runs.values()}))
    tmp = tempfile.mkdtemp()
    plots = []
    for i, (name, r) in enumerate(runs.items()):
        path = os.path.join(tmp, f"{name}.dat")
        with open(path, "w") as f:
            for p in r["points"]:
                ema = p["fid_ema"] if p["fid_ema"] is not None else "NaN"
                f.write(f"{p['wall_s'] / 60:.3f} {p['fid']} {ema}\n")
        label = LABELS.get(name, name)
        plots.append(f"'{path}' using 1:2 with linespoints lw 2 pt 7 lc {i + 1} dt 1 title '{label}: G'")
        plots.append(f"'{path}' using 1:3 with linespoints lw 2 pt 5 lc {i + 1} dt 2 title '{label}: EMA'")
    plots.append("30 with lines lc rgb 'black' dt 3 title 'FID 30 (the StyleGAN2 target)'")
    script = f"""
set terminal pngcairo size 900,520 font ',10'
set output '{sys.argv[2]}'
set title 'Fashion-MNIST, 2 ranks, ZeRO-3 ({commits}, {machine})'
set xlabel 'wall time on 2 ranks (minutes, evaluations included)'
set ylabel 'FID (project classifier, 2,000 samples)'
set logscale y
set yrange [5:800]
set grid
set key bottom right
plot {", ".join(plots)}
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    print(f"wrote {sys.argv[2]}")


if __name__ == "__main__":
    main()
