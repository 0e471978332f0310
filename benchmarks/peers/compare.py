"""Compares the first three steps' losses of benchmark records within the derived float32
tolerance (tolerance.py; docs/benchmarks-peers.md).

    compare.py RESULTS.jsonl [...] [--reference-system shardgan] [--steps 3]

For each model, the reference is the shardgan record with the smallest (world_size, stage);
every other record of that model is compared with it, step by step, on loss_d and loss_g:
|a - b| <= k * r_1 * max(1, |b|) at step k; and where the records carry them (StyleGAN2's
`reg_losses`), on the regularization figures r1, pl and pl_mean: |a - b| <= k * r * |b| with
the reference's `reg_rtol_step1` (tolerance.py). Prints one line per record with the largest
|a - b| / tolerance, and exits 1 if any record exceeds it (or has fewer steps).
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tolerance  # noqa: E402


def latest(recs, keep_failed=False):
    """The last record of each cell (model, system, N, stage, overrides, tensor not loaded):
    a cell re-run later (APPEND=1, e.g. because a compiler ran beside it) replaces the
    earlier line. A cell whose last run failed is dropped unless keep_failed. FSDP2's settings
    (`fsdp`: StyleGAN2's working cell and its attempt at the default settings) are part of
    the cell."""
    out = {}
    for r in recs:
        key = (r["model"], r["system"], r["world_size"], r["stage"], tuple(r.get("overrides") or ()),
               r.get("not_loaded"), r.get("fsdp"))
        out.pop(key, None)
        out[key] = r
    return [r for r in out.values() if keep_failed or not r.get("failed")]


def check(rec, ref, r1, steps=3):
    """(ok, worst ratio, per-step detail) of rec's losses against ref's."""
    worst, detail = 0.0, []
    if len(rec["losses"]) < steps or len(ref["losses"]) < steps:
        return False, float("inf"), "fewer than %d steps" % steps
    for k in range(1, steps + 1):
        for i, name in enumerate(("loss_d", "loss_g")):
            a, b = rec["losses"][k - 1][i], ref["losses"][k - 1][i]
            tol = k * r1 * max(1.0, abs(b))
            ratio = abs(a - b) / tol
            if not math.isfinite(ratio):
                ratio = float("inf")  # a NaN or Inf loss never matches
            worst = max(worst, ratio)
            detail.append(f"s{k} {name} {a:.7g} vs {b:.7g} (|d| {abs(a - b):.2e}, tol {tol:.2e})")
    reg_tol = ref.get("reg_rtol_step1")
    if reg_tol and (rec.get("reg_losses") is not None or ref.get("reg_losses") is not None):
        ra, rb = rec.get("reg_losses") or [], ref.get("reg_losses") or []
        if len(ra) < steps or len(rb) < steps:
            return False, float("inf"), detail + ["fewer than %d steps of regularization figures" % steps]
        for k in range(1, steps + 1):
            for i, name in enumerate(("r1", "pl", "pl_mean")):
                a, b = ra[k - 1][i], rb[k - 1][i]
                if a is None and b is None:
                    continue
                if a is None or b is None:
                    worst = float("inf")
                    detail.append(f"s{k} {name} {a} vs {b} (on one side only)")
                    continue
                tol = k * reg_tol[name] * abs(b)  # relative: sums of squares (tolerance.py)
                ratio = abs(a - b) / tol if tol > 0 else (0.0 if a == b else float("inf"))
                if not math.isfinite(ratio):
                    ratio = float("inf")
                worst = max(worst, ratio)
                detail.append(f"s{k} {name} {a:.7g} vs {b:.7g} (|d| {abs(a - b):.2e}, tol {tol:.2e})")
    return worst <= 1.0, worst, detail


def main():
    p = argparse.ArgumentParser()
    p.add_argument("files", nargs="+")
    p.add_argument("--reference-system", default="shardgan")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args()
    recs = [json.loads(l) for f in a.files for l in open(f) if l.strip()]
    every = latest(recs, keep_failed=True)
    recs = [r for r in every if not r.get("failed")]
    ok_all = True
    for model in dict.fromkeys(r["model"] for r in recs):
        mine = [r for r in recs if r["model"] == model]
        refs = sorted((r for r in mine if r["system"] == a.reference_system),
                      key=lambda r: (r["world_size"], r["stage"]))
        if not refs:
            print(f"{model}: no {a.reference_system} record to compare with")
            ok_all = False
            continue
        ref = refs[0]
        r1 = ref.get("loss_rtol_step1")
        print(f"{model}: reference {ref['system']} N={ref['world_size']} stage {ref['stage']}; "
              f"r_1 = {r1:.3e} (S = {ref.get('reduction_sqrt_sum', 0):.0f}); tolerance at step k: k * r_1 * max(1, |loss|)")
        if ref.get("reg_rtol_step1"):
            rt = ref["reg_rtol_step1"]
            print(f"  regularization figures: r = {rt['r1']:.3e} (r1), {rt['pl']:.3e} (pl, pl_mean); "
                  "tolerance at step k: k * r * |value|")
        for r in mine:
            if r is ref:
                continue
            ok, worst, detail = check(r, ref, r1, a.steps)
            ok_all &= ok
            tag = "PASS" if ok else "FAIL"
            extra = " ".join(r.get("overrides") or []) + (f" (not loaded: {r['not_loaded']})" if r.get("not_loaded") else "")
            extra += f" [{r['fsdp']}]" if r.get("fsdp") and "reshard_after_backward" in r["fsdp"] else ""
            print(f"  {tag} {r['system']:8s} N={r['world_size']} stage {r['stage']}: max |d|/tol = {worst:.3g} {extra}")
            if a.verbose or not ok:
                for d in (detail if isinstance(detail, list) else [detail]):
                    print("       " + d)
        for r in every:  # runs that ended without a result (e.g. FSDP2's default settings on StyleGAN2)
            if r["model"] == model and r.get("failed"):
                print(f"  RUN FAILED {r['system']:8s} N={r['world_size']} stage {r['stage']}"
                      f"{' [' + r['fsdp'] + ']' if r.get('fsdp') else ''}: {r.get('error') or 'exit %s' % r.get('exit')}")
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
