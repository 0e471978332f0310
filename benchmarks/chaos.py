"""The chaos campaign: faults at random times in random valid configurations.

Run through benchmarks/chaos.sh (which picks the project's Python). For each trial a seeded
generator draws one cell of benchmarks/chaos_cells.py and one fault of those that apply to
it, at a random time inside the cell's uninterrupted run. The harness then checks:

  exit      every rank exits within 60 s of the fault (dist.timeout_s is 30 in every cell),
            and a failed job's output names a rank and a cause ("error on rank R: ...", or
            mpirun's "process rank R ... exited on signal N");
  verify    `shardgan-ckpt verify` passes on every committed checkpoint (step-N directories);
  resume    `--resume auto` (no fault) exits 0 and logs that it resumed from the newest
            committed checkpoint (or started fresh when there was none);
  same      in a cell listed as deterministic, the final checkpoint equals the uninterrupted
            run's bit for bit (every dataset of /generator, /discriminator and /rng of every
            rank file; no NaN or infinity). The uninterrupted run of each cell is run once
            per binary and cached under --work.

One JSON line per trial goes to --out (appended; trials already there are skipped, so the
campaign resumes). A failed trial prints the one command that replays it.
"""
import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chaos_cells as cc  # noqa: E402
import chaos_checks as ck  # noqa: E402

EXIT_BOUND_S = 60.0
# Passed on to every rank by name: the namespaced hosts of a multi-host cell start their ranks
# with a clean environment (as ssh does), and under scripts/sanitize.sh they need its settings
# (without ASAN_OPTIONS' detect_leaks=0, LeakSanitizer reports Open MPI's and LibTorch's
# process-lifetime allocations at exit).
SANITIZER_ENV = ("ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS", "SHARDGAN_SANITIZE")


def train_cmd(a, cell, run_dir, hosts, trial_id, extra=(), env=None, env_rank=None, resume=False):
    """mpirun command line; env_rank=(rank, {VAR: value}) gives one rank its own environment.
    Every app context carries its own -x options (Open MPI applies an -x to its context only)."""
    args = [os.path.join(a.src, cell["config"])]
    for kv in cc.COMMON + cell["args"] + [f"run.dir={run_dir}"] + list(extra):
        args += ["--set", kv]
    if resume:
        args += ["--resume", "auto"]
    cmd = ["mpirun"] + hosts if "multihost" in cell["tags"] else ["mpirun", "--oversubscribe", "--bind-to", "none"]

    def context(n, own):
        xs = []
        for k in SANITIZER_ENV:
            if k in os.environ:
                xs += ["-x", k]
        for k, v in list({"SHARDGAN_CHAOS_TRIAL": trial_id, **(env or {})}.items()) + list(own.items()):
            xs += ["-x", f"{k}={v}"]
        return ["-np", str(n)] + xs + [a.train] + args

    if env_rank is None:
        return cmd + context(cell["np"], {})
    r, renv = env_rank
    parts = ([context(r, {})] if r > 0 else []) + [context(1, renv)]
    if r < cell["np"] - 1:
        parts.append(context(cell["np"] - 1 - r, {}))
    for i, p in enumerate(parts):
        cmd += ([":"] if i else []) + p
    return cmd


def binary_key(path):
    st = os.stat(path)
    return f"{st.st_size}-{int(st.st_mtime)}"


def baseline(a, cell, hosts):
    """The cell's uninterrupted run (cached): (run_dir, wall seconds)."""
    key = hashlib.sha1(json.dumps([cell["config"], cell["args"], cc.COMMON, binary_key(a.train)]).encode()).hexdigest()[:12]
    d = os.path.join(a.work, "baselines", f"{cell['name']}-{key}")
    meta = os.path.join(d, "wall.json")
    if os.path.exists(meta):
        return d, json.load(open(meta))["wall_s"]
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    t0 = time.time()
    cmd = train_cmd(a, cell, os.path.join(d, "run"), hosts, "baseline")
    with open(os.path.join(d, "log.txt"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=600).returncode
    wall = time.time() - t0
    if rc != 0:
        raise RuntimeError(f"uninterrupted run of {cell['name']} failed (exit {rc}): {d}/log.txt")
    json.dump({"wall_s": wall, "cmd": cmd}, open(meta, "w"))
    return d, wall


def draw(seed, index, cells, is_root, stratify):
    """Trial `index` of campaign `seed`: (cell, fault, fraction of the run, rank, k)."""
    rng = random.Random(f"chaos:{seed}:{index}")
    if stratify:
        kinds = sorted({f for c in cells for f in cc.faults_for(c, is_root)}, key=list(cc.FAULTS).index)
        fault = kinds[index % len(kinds)]
        cell = rng.choice([c for c in cells if fault in cc.faults_for(c, is_root)])
    else:
        cell = rng.choice(cells)
        fault = rng.choice(cc.faults_for(cell, is_root))
    return cell, fault, rng.uniform(0.05, 0.95), rng.randrange(cell["np"]), rng.randrange(1 << 30)


def run_trial(a, seed, index, cell, fault, frac, victim, k, hosts, netns):
    tid = f"{seed}-{index}"
    base_dir, base_wall = baseline(a, cell, hosts)
    tdir = os.path.join(a.work, "trials", tid)
    shutil.rmtree(tdir, ignore_errors=True)
    os.makedirs(tdir)
    run_dir = os.path.join(tdir, "run")
    mnt = None
    extra, env_rank, env = [], None, {}
    fault_at = frac * base_wall
    if fault == "disk_full":
        mnt = os.path.join(tdir, "mnt")
        size = max(64 << 20, 2 * ck.dir_bytes(os.path.join(base_dir, "run")) + (16 << 20))
        ck.mount_tmpfs(mnt, size)
        run_dir = os.path.join(mnt, "run")
    if fault == "fsync_eio":
        # A save fsyncs each rank file; rank 0 also the index, the folder, the root twice and
        # 'latest' (src/checkpoint/save.cpp): 1 or 6 calls per save, STEPS / 2 saves.
        env_rank = (victim, {"SHARDGAN_TEST_FSYNC_FAULTS": str(k % (cc.STEPS // 2 * (6 if victim == 0 else 1)))})
    elif fault.startswith("io_"):
        kind = fault[3:]
        # The offload cells' clean runs complete about 580-1,460 I/Os per rank (counted with a
        # short transfer, which adds one completion, planned at every other completion).
        env_rank = (victim, {"SHARDGAN_TEST_IO_FAULTS": f"c{k % 500}={kind}"})
    elif fault == "hung_writer":
        env_rank = (victim, {"SHARDGAN_TEST_CKPT_WRITE_DELAY_MS": "3600000"})
    cmd = train_cmd(a, cell, run_dir, hosts, tid, extra, env, env_rank)
    log_path = os.path.join(tdir, "fault.log")
    rec = {"trial": tid, "seed": seed, "index": index, "cell": cell["name"], "np": cell["np"], "fault": fault,
           "victim": victim, "planned_at_s": round(fault_at, 2), "deterministic": cell["deterministic"],
           "env": env_rank[1] if env_rank else {}}
    try:
        res = ck.faulted_run(cmd, log_path, tid, cell["np"], fault, fault_at, victim, netns, EXIT_BOUND_S)
        rec.update(res)
        if fault == "disk_full":
            ck.unfill(mnt)
        if fault == "link_cut":
            netns.link_up()
        rec.update(ck.verify_committed(a.ckpt, os.path.join(run_dir, "checkpoints")))
        rcmd = train_cmd(a, cell, run_dir, hosts, tid + "-resume", resume=True)
        rec.update(ck.resume_run(rcmd, os.path.join(tdir, "resume.log"), rec["committed"], run_dir))
        final = os.path.join(run_dir, "checkpoints", f"step-{cc.STEPS:08d}")
        if cell["deterministic"] and rec["resume_ok"]:
            same, why = ck.same_checkpoint(final, os.path.join(base_dir, "run", "checkpoints", f"step-{cc.STEPS:08d}"))
            rec["same"] = same
            if not same:
                rec["same_why"] = why
        else:
            rec["same"] = None
    finally:
        if fault == "link_cut" and netns is not None:
            netns.link_up()
        if mnt:
            ck.umount(mnt)
    rec["pass"] = bool(rec["exit_ok"] and rec["named_ok"] and rec["verify_ok"] and rec["resume_ok"] and rec["same"] is not False)
    if rec["pass"] and not a.keep:
        shutil.rmtree(tdir, ignore_errors=True)
    return rec


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument("--train", default=None)
    p.add_argument("--ckpt", default=None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--trials", type=int, default=300, help="trial indices 0..N-1 of this seed")
    p.add_argument("--trial", type=int, action="append", help="run only these indices (replay)")
    p.add_argument("--max-minutes", type=float, default=90)
    p.add_argument("--out", default=None)
    p.add_argument("--work", default="/tmp/shardgan-chaos")
    p.add_argument("--stratify", action="store_true", help="trial i draws fault kind i mod kinds (chaos_smoke)")
    p.add_argument("--cells", default=None, help="comma-separated cell names to draw from")
    p.add_argument("--fault", default=None, help="draw only this fault kind (a negative control's fixed trial)")
    p.add_argument("--at", type=float, default=None, help="the fault at this fraction of the uninterrupted run")
    p.add_argument("--victim", type=int, default=None, help="the rank the fault hits")
    p.add_argument("--k", type=int, default=None, help="the planned fault's index (fsync call, I/O completion)")
    p.add_argument("--keep", action="store_true", help="keep passing trials' directories")
    p.add_argument("--fresh", action="store_true", help="start --out afresh (ctest)")
    p.add_argument("--expect-divergence", action="store_true",
                   help="negative control: exit 0 only if every trial passed every check but 'same'")
    a = p.parse_args()
    a.train = os.path.abspath(a.train or os.path.join(a.src, "build", "shardgan-train"))
    a.ckpt = os.path.abspath(a.ckpt or os.path.join(a.src, "build", "shardgan-ckpt"))
    a.out = a.out or os.path.join(a.src, "benchmarks", "results", "chaos.jsonl")
    os.makedirs(a.work, exist_ok=True)
    t_start = time.time()
    is_root = os.geteuid() == 0 and shutil.which("ip") is not None
    cells = [c for c in cc.CELLS if is_root or "multihost" not in c["tags"]]
    if a.cells:
        want = a.cells.split(",")
        cells = [c for c in cells if c["name"] in want]
    done = set()
    if a.fresh and os.path.exists(a.out):
        os.unlink(a.out)
    if os.path.exists(a.out):
        for line in open(a.out):
            if line.strip():
                done.add(json.loads(line)["trial"])
    todo = a.trial if a.trial else [i for i in range(a.trials) if f"{a.seed}-{i}" not in done]
    if not todo:
        print(f"chaos: all {a.trials} trials of seed {a.seed} are in {a.out}")
        return 0
    netns = ck.NetNs(a.src, a.work) if any("multihost" in c["tags"] for c in cells) else None
    hosts = netns.up() if netns else []
    try:
        refused = ck.dry_run_cells(a, cells, hosts, train_cmd)
        for name, why in refused.items():
            print(f"chaos: DEFECT OF THE CELL LIST: {name} is refused by the config: {why}")
        cells = [c for c in cells if c["name"] not in refused]
        cpu = ck.cpu_model()
        commit = ck.binary_commit(a.train)
        failed = 0
        diverged_only = 0
        n = 0
        for index in todo:
            if time.time() - t_start > a.max_minutes * 60:
                print(f"chaos: stopping after {a.max_minutes} minutes; run again to continue")
                break
            cell, fault, frac, victim, k = draw(a.seed, index, cells, is_root, a.stratify)
            if a.fault:
                cell = random.Random(f"chaos:{a.seed}:{index}:cell").choice(
                    [c for c in cells if a.fault in cc.faults_for(c, is_root)])
                fault = a.fault
                victim %= cell["np"]
            if a.at is not None:
                frac = a.at
            if a.victim is not None:
                victim = a.victim
            if a.k is not None:
                k = a.k
            t0 = time.time()
            rec = run_trial(a, a.seed, index, cell, fault, frac, victim, k, hosts, netns)
            rec.update({"wall_s": round(time.time() - t0, 1), "cpu": cpu, "commit": commit,
                        "refused_cells": sorted(refused)})
            replay = (f"benchmarks/chaos.sh --seed {a.seed} --trial {index}" + (" --stratify" if a.stratify else "")
                      + (f" --cells {a.cells}" if a.cells else "") + (f" --fault {a.fault}" if a.fault else "")
                      + (f" --at {a.at}" if a.at is not None else "") + (f" --victim {a.victim}" if a.victim is not None else "")
                      + (f" --k {a.k}" if a.k is not None else "") + " --keep --out /tmp/chaos-replay.jsonl")
            rec["replay"] = replay
            n += 1
            with open(a.out, "a") as f:
                f.write(json.dumps(rec, sort_keys=True) + "\n")
            status = "PASS" if rec["pass"] else "FAIL"
            print(f"{status}: trial {rec['trial']} {cell['name']} np{cell['np']} {fault} rank {victim} at "
                  f"{rec['planned_at_s']} s: rc {rec.get('rc')}, exits {rec.get('exit_max_s')} s after the fault, "
                  f"{len(rec.get('committed', []))} committed, resume {rec.get('resumed_from')}, same {rec['same']} "
                  f"({rec['wall_s']} s)", flush=True)
            if not rec["pass"]:
                failed += 1
                if rec["same"] is False and rec["exit_ok"] and rec["named_ok"] and rec["verify_ok"] and rec["resume_ok"]:
                    diverged_only += 1
                print(f"  why: {ck.why(rec)}\n  replay: {replay}", flush=True)
        print(f"chaos: {n} trials, {failed} failed, {round(time.time() - t_start)} s; refused cells: {sorted(refused) or 'none'}")
        if a.expect_divergence:
            ok = n > 0 and diverged_only == n
            print(f"chaos: negative control: {diverged_only} of {n} trials diverged from the uninterrupted run "
                  f"with every other check passing: {'as expected' if ok else 'NOT as expected'}")
            return 0 if ok else 1
        return 1 if failed or refused else 0
    finally:
        if netns:
            netns.down()


if __name__ == "__main__":
    sys.exit(main())
