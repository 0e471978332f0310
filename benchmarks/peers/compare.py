"""Compares the first three steps' losses of benchmark records within the derived float32
tolerance (tolerance.py; docs/benchmarks-peers.md).

    compare.py RESULTS.jsonl [...] [--reference-system shardgan] [--steps 3]

For each model, the reference is the shardgan record with the smallest (world_size, stage);
every other record of that model is compared with it, step by step, on loss_d and loss_g:
|a - b| <= k * r_1 * max(1, |b|) at step k. Prints one line per record with the largest
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
    earlier line. A cell whose last run failed is dropped unless keep_failed."""
    out = {}
    for r in recs:
        key = (r["model"], r["system"], r["world_size"], r["stage"], tuple(r.get("overrides") or ()),
               r.get("not_loaded"))
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
    return worst <= 1.0, worst, detail


def main():
    p = argparse.ArgumentParser()
    p.add_argument("files", nargs="+")
    p.add_argument("--reference-system", default="shardgan")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args()
    recs = [json.loads(l) for f in a.files for l in open(f) if l.strip()]
    recs = latest(recs)
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
        for r in mine:
            if r is ref:
                continue
            ok, worst, detail = check(r, ref, r1, a.steps)
            ok_all &= ok
            tag = "PASS" if ok else "FAIL"
            extra = " ".join(r.get("overrides") or []) + (f" (not loaded: {r['not_loaded']})" if r.get("not_loaded") else "")
            print(f"  {tag} {r['system']:8s} N={r['world_size']} stage {r['stage']}: max |d|/tol = {worst:.3g} {extra}")
            if a.verbose or not ok:
                for d in (detail if isinstance(detail, list) else [detail]):
                    print("       " + d)
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
