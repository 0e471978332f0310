"""The peer benchmark's results as a markdown table (stdout, and RESULTS.md beside the JSONL)
and a plot (docs/images/peers.png: step time and VmHWM against N; matplotlib when the venv
has it, else gnuplot, which scripts/setup.sh installs).

    report.py benchmarks/results/peers/peers.jsonl [--plot docs/images/peers.png]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402

ORDER = {"shardgan": 0, "fsdp2": 1, "ddp": 2}
SERIES = [("shardgan", 0), ("shardgan", 2), ("shardgan", 3), ("ddp", 0), ("fsdp2", 2), ("fsdp2", 3)]


def label(system, stage):
    if system == "fsdp2":
        return f"FSDP2 reshard_after_forward={'True' if stage == 3 else 'False'}"
    if system == "ddp":
        return "DDP"
    return f"shardgan stage {stage}"


def table(recs):
    lines = []
    models = list(dict.fromkeys(r["model"] for r in recs))
    for model in models:
        mine = [r for r in recs if r["model"] == model]
        ok = [r for r in mine if not r.get("failed")]
        refs = sorted((r for r in ok if r["system"] == "shardgan"), key=lambda r: (r["world_size"], r["stage"]))
        ref = refs[0] if refs else None
        p = ok[0]["params"] if ok else 0
        lines.append(f"\n**{model}**: {p / 1e6:.2f}M parameters (G {ok[0]['params_g'] / 1e6:.2f}M, "
                     f"D {ok[0]['params_d'] / 1e6:.2f}M), global batch {ok[0]['global_batch']}, "
                     f"d_steps {ok[0]['d_steps']}, {ok[0]['loss']} loss, float32."
                     if ok else f"\n**{model}**: no run finished.")
        if ref:
            lines.append(f"Losses compared with shardgan N={ref['world_size']} stage {ref['stage']}, "
                         f"r_1 = {ref['loss_rtol_step1']:.2e}.")
            if ref.get("reg_rtol_step1"):
                rt = ref["reg_rtol_step1"]
                lines.append(f"Also the regularization figures r1, pl, pl_mean (relative, r = {rt['r1']:.2e}, "
                             f"{rt['pl']:.2e}). FSDP2 runs path length under set_reshard_after_backward(False).")
        lines.append("shardgan's VmHWM is each rank's at the end of the run, after the final checkpoint and "
                     "sample grid the trainer always writes; in brackets, rank 0's after the last step "
                     "(metrics.jsonl). The peers read theirs after the last step.")
        lines.append("")
        last = min(10, max((r.get("steps") or len(r.get("step_times_s", []))) for r in ok)) if ok else 10
        lines.append(f"| N | system | stage | step s (median, steps 3-{last}) | min-max s | VmHWM GiB (max over ranks) "
                     "| vs FSDP2 same N (step, VmHWM) | losses steps 1-3: max abs(d)/tol | machine |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for r in sorted(mine, key=lambda r: (r["world_size"], ORDER[r["system"]], r["stage"])):
            if r.get("failed"):
                what = f"failed (exit {r.get('exit')})" if r.get("exit") is not None else "failed"
                if r.get("fsdp"):
                    what += f", {r['fsdp']}"
                err = (r.get("error") or "").replace("|", "/")
                lines.append(f"| {r['world_size']} | {r['system']} | {r['stage']} | {what} | | | | {err} | |")
                continue
            # the FSDP2 counterpart: same stage for 2 and 3, reshard_after_forward=True for 0
            peer = [q for q in ok if q["system"] == "fsdp2" and q["world_size"] == r["world_size"]
                    and q["stage"] == (r["stage"] if r["stage"] in (2, 3) else 3)]
            vs = ""
            if peer and r["system"] != "fsdp2":
                q = peer[0]
                vs = f"{r['step_s'] / q['step_s']:.2f}x, {r['vmhwm_gib'] / q['vmhwm_gib']:.2f}x (vs stage {q['stage']})"
            par = "reference"
            if ref and r is not ref:
                good, worst, _ = compare.check(r, ref, ref["loss_rtol_step1"])
                par = f"{worst:.2g} {'pass' if good else '**FAIL**'}"
            timed = r["step_times_s"][2:10]
            hwm = f"{r['vmhwm_gib']:.3f}"
            if r.get("vmhwm_gib_rank0_last_step"):
                hwm += f" ({r['vmhwm_gib_rank0_last_step']:.3f})"
            lines.append(f"| {r['world_size']} | {r['system']} | {r['stage']} | {r['step_s']:.4g} | "
                         f"{min(timed):.3g}-{max(timed):.3g} | {hwm} | {vs} | {par} | {r.get('note', '')} |")
    return "\n".join(lines) + "\n"


def plot(recs, path):
    models = list(dict.fromkeys(r["model"] for r in recs if not r.get("failed")))
    ok = [r for r in recs if not r.get("failed")]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
    if plt is not None:
        fig, axes = plt.subplots(len(models), 2, figsize=(11, 3.6 * len(models)), squeeze=False)
        for i, model in enumerate(models):
            for sys_, st in SERIES:
                pts = sorted((r["world_size"], r["step_s"], r["vmhwm_gib"]) for r in ok
                             if r["model"] == model and r["system"] == sys_ and r["stage"] == st)
                if not pts:
                    continue
                ls = "-" if sys_ == "shardgan" else "--"
                axes[i][0].plot([p[0] for p in pts], [p[1] for p in pts], ls, marker="o", label=label(sys_, st))
                axes[i][1].plot([p[0] for p in pts], [p[2] for p in pts], ls, marker="o", label=label(sys_, st))
            axes[i][0].set_title(f"{model}: step time (median, steps 3-10)")
            axes[i][0].set_ylabel("s")
            axes[i][1].set_title(f"{model}: VmHWM, largest rank")
            axes[i][1].set_ylabel("GiB")
            for ax in axes[i]:
                ax.set_xlabel("ranks N")
                ax.set_xticks([1, 2, 4])
                ax.grid(alpha=0.3)
            axes[i][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        return path
    if not shutil.which("gnuplot"):
        return None
    tmp = tempfile.mkdtemp(prefix="peers-plot-")
    script = [f"set terminal pngcairo noenhanced size 1100,{380 * len(models)} font ',9'", f"set output '{path}'",
              f"set multiplot layout {len(models)},2", "set grid", "set xtics (1,2,4)", "set xrange [0.8:4.2]",
              "set key top left font ',7'", "set xlabel 'ranks N'"]
    for model in models:
        for col, (title, unit) in enumerate((("step time (median, steps 3-10)", "s"), ("VmHWM, largest rank", "GiB"))):
            plots = []
            for sys_, st in SERIES:
                pts = sorted((r["world_size"], r["step_s"], r["vmhwm_gib"]) for r in ok
                             if r["model"] == model and r["system"] == sys_ and r["stage"] == st)
                if not pts:
                    continue
                f = os.path.join(tmp, f"{model}-{sys_}-{st}.dat")
                with open(f, "w") as fh:
                    fh.writelines(f"{p[0]} {p[1]} {p[2]}\n" for p in pts)
                dt = 1 if sys_ == "shardgan" else 2
                plots.append(f"'{f}' using 1:{2 + col} with linespoints lw 2 pt 7 dt {dt} title '{label(sys_, st)}'")
            script += [f"set title '{model}: {title}'", f"set ylabel '{unit}'", "plot " + ", ".join(plots)]
    script.append("unset multiplot")
    sf = os.path.join(tmp, "plot.gp")
    with open(sf, "w") as fh:
        fh.write("\n".join(script) + "\n")
    subprocess.run(["gnuplot", sf], check=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return path


def main():
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--plot", default="docs/images/peers.png", help="'' for none")
    a = p.parse_args()
    raw = [json.loads(l) for l in open(a.results) if l.strip()]
    recs = compare.latest(raw, keep_failed=True)
    md = table(recs)
    machine = a.results + ".machine.txt"
    if os.path.exists(machine):
        md += "\nMachine:\n\n```\n" + open(machine).read() + "```\n"
    out_md = os.path.splitext(a.results)[0] + ".md"
    with open(out_md, "w") as f:
        f.write(md)
    print(md)
    if a.plot:
        got = plot(recs, a.plot)
        print(f"plot: {got}" if got else "plot: neither matplotlib nor gnuplot; none drawn")


if __name__ == "__main__":
    main()
