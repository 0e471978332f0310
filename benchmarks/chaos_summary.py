"""Summary of a chaos campaign's JSONL (benchmarks/chaos.py) as Markdown, for docs/results.md.
   python benchmarks/chaos_summary.py [benchmarks/results/chaos.jsonl]"""
import collections
import json
import sys


def main(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    if not rows:
        print("no trials")
        return 1
    fired = [r for r in rows if r.get("fired")]
    hangs = [r for r in rows if r.get("hung_ranks") or not r.get("exit_ok")]
    damaged = [r for r in rows if not r.get("verify_ok")]
    lost = [r for r in rows if not r.get("resume_ok")]
    differ = [r for r in rows if r.get("same") is False]
    unnamed = [r for r in rows if not r.get("named_ok")]
    exits = [r["exit_max_s"] for r in fired if r.get("exit_max_s") is not None]
    print(f"| trials | {len(rows)} ({len(fired)} with the fault delivered; the others completed as planned faults never came) |")
    print(f"| seeds | {', '.join(str(s) for s in sorted({r['seed'] for r in rows}))} |")
    print(f"| cells drawn | {len({r['cell'] for r in rows})} |")
    print(f"| commits | {', '.join(sorted({r.get('commit', '?') for r in rows}))} |")
    print(f"| CPU | {', '.join(sorted({r.get('cpu', '?') for r in rows}))} |")
    print(f"| hangs (a rank alive 60 s after the fault) | {len(hangs)} |")
    print(f"| failed jobs with no message naming a rank and a cause | {len(unnamed)} |")
    print(f"| damaged checkpoints (verify fails on a committed step) | {len(damaged)} |")
    print(f"| lost checkpoints (--resume auto not from the newest committed, or failing) | {len(lost)} |")
    print(f"| resumes that differ from the uninterrupted run (deterministic cells) | {len(differ)} |")
    if exits:
        exits.sort()
        print(f"| slowest exit after a delivered fault | {exits[-1]:.1f} s (median {exits[len(exits) // 2]:.1f} s) |")
    print()
    print("| fault | trials | delivered | job exit 0 | checkpoints committed before resume (mean) | slowest exit (s) | failed checks |")
    print("|---|---|---|---|---|---|---|")
    by = collections.defaultdict(list)
    for r in rows:
        by[r["fault"]].append(r)
    for f, rs in sorted(by.items()):
        d = [r for r in rs if r.get("fired")]
        ex = [r["exit_max_s"] for r in d if r.get("exit_max_s") is not None]
        print(f"| {f} | {len(rs)} | {len(d)} | {sum(1 for r in rs if r.get('rc') == 0)} | "
              f"{sum(len(r.get('committed', [])) for r in rs) / len(rs):.1f} | {max(ex) if ex else '-'} | "
              f"{sum(1 for r in rs if not r.get('pass'))} |")
    print()
    cells = collections.Counter(r["cell"] for r in rows)
    print("Trials per cell: " + ", ".join(f"{c} {n}" for c, n in sorted(cells.items())))
    bad = [r for r in rows if not r.get("pass")]
    for r in bad:
        print(f"\nFAILED {r['trial']} {r['cell']} {r['fault']}: replay `{r.get('replay')}`")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/chaos.jsonl"))
