#!/usr/bin/env python3
"""r_t, p and FID over steps for benchmarks/ada_limited_data.sh's runs, as one PNG (gnuplot).

    .venv/bin/python benchmarks/ada_limited_data_plot.py RESULTS.jsonl OUT.png [COMMIT]

r_t is smoothed over 50 steps (a running mean of the logged steps). Runs of COMMIT only
(default: the last run's commit).
"""
import json
import os
import subprocess
import sys
import tempfile


def smooth(points, window):
    out = []
    for i in range(len(points)):
        part = [v for s, v in points if points[i][0] - window < s <= points[i][0]]
        out.append((points[i][0], sum(part) / len(part)))
    return out


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    rows = [json.loads(l) for l in open(sys.argv[1]) if '"ada_limited_data"' in l]
    if not rows:
        sys.exit(f"{sys.argv[1]}: no ada_limited_data rows")
    commit = sys.argv[3] if len(sys.argv) == 4 else rows[-1]["commit"]
    rows = [r for r in rows if r["commit"] == commit]
    tmp = tempfile.mkdtemp()
    series = []
    for r in rows:
        name = f"{r['mode']}-seed{r['seed']}"
        for what, pts in (("rt", smooth(r["r_t"], 50)), ("p", r["p"]), ("fid", [(s, f) for s, f, _ in r["fid"]])):
            path = os.path.join(tmp, f"{name}-{what}.dat")
            with open(path, "w") as f:
                f.writelines(f"{s} {v}\n" for s, v in pts)
            series.append((name, what, path))

    def plots(what):
        return ", ".join(f"'{p}' with lines lw 2 title '{n}'" for n, w, p in series if w == what)

    script = f"""
set terminal pngcairo size 1200,380 font ',10'
set output '{sys.argv[2]}'
set multiplot layout 1,3 title 'ADA on 2,000 Fashion-MNIST images ({commit})'
set xlabel 'step'
set title 'r_t = E[sign D(x_{{real}})] (50-step mean)'
set key bottom right
plot {plots('rt')}
set title 'augmentation probability p'
set key top left
plot {plots('p')}
set title 'FID (project classifier, 2,000 samples; log scale)'
set logscale y
set key top right
plot {plots('fid')}
unset multiplot
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    print(f"wrote {sys.argv[2]}")


if __name__ == "__main__":
    main()
