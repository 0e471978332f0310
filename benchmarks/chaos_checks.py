"""The chaos campaign's fault injection and checks (benchmarks/chaos.py)."""
import glob
import json
import os
import re
import signal
import subprocess
import time

import h5py
import numpy as np


# --- processes -------------------------------------------------------------------------

def _read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def rank_pids(tid):
    """{world rank: pid} of the shardgan-train ranks of trial `tid` (marked by SHARDGAN_CHAOS_TRIAL;
    a fork-snapshot checkpoint writer, a child of a rank, is left out)."""
    marker = f"SHARDGAN_CHAOS_TRIAL={tid}".encode()
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        if (_read(f"/proc/{d}/comm") or "").strip() != "shardgan-train":
            continue
        env = _read(f"/proc/{d}/environ", "rb")
        if not env or marker not in env.split(b"\0"):
            continue
        stat = _read(f"/proc/{d}/stat") or ""
        ppid = stat.rsplit(")", 1)[-1].split()[1] if ")" in stat else "0"
        if (_read(f"/proc/{ppid}/comm") or "").strip() == "shardgan-train":
            continue
        for kv in env.split(b"\0"):
            if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                out[int(kv.split(b"=", 1)[1])] = int(d)
    return out


def alive(pid):
    s = _read(f"/proc/{pid}/stat")
    return s is not None and s.rsplit(")", 1)[-1].split()[0] != "Z"


def fill(mnt):
    """Takes every free byte of the tmpfs at mnt (a full disk)."""
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    fd = os.open(os.path.join(mnt, "filler"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, max(free, 4096))
    except OSError:
        pass
    chunk = b"\0" * (1 << 20)
    try:
        while True:
            os.write(fd, chunk)
    except OSError:
        pass
    os.close(fd)


def unfill(mnt):
    try:
        os.unlink(os.path.join(mnt, "filler"))
    except OSError:
        pass


def mount_tmpfs(mnt, size):
    os.makedirs(mnt, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "chaos", mnt], check=True)


def umount(mnt):
    subprocess.run(["umount", "-l", mnt], check=False)


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)


MARKERS = {"fsync_eio": "injected fsync fault", "io_eio": "injected I/O fault", "io_enospc": "injected I/O fault",
           "io_short": "injected I/O fault", "hung_writer": "checkpoint writer delayed"}


def faulted_run(cmd, log_path, tid, np_, fault, fault_at, victim, netns, bound_s):
    """Runs cmd, applies the fault, and times every rank's exit from the fault."""
    log = open(log_path, "w")
    t_launch = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    pids, exits = {}, {}
    t_fault = None
    fired = False
    last_scan = 0.0
    hard_end = t_launch + 600
    rc = None
    while True:
        now = time.time()
        if len(pids) < np_ and now - last_scan > 0.05:
            pids.update(rank_pids(tid))
            last_scan = now
        rc = proc.poll()
        if t_fault is None:
            if fault in MARKERS:
                if MARKERS[fault] in (_read(log_path) or ""):
                    t_fault, fired = now, True
            elif now - t_launch >= fault_at and rc is None:
                targets = None
                if fault in ("kill9", "sigterm_one", "sigusr1_one"):
                    targets = [pids[victim]] if victim in pids else None
                elif fault in ("sigterm_all", "sigusr1_all"):
                    targets = list(pids.values()) if len(pids) == np_ else None
                if fault == "disk_full":
                    fill(os.path.join(os.path.dirname(log_path), "mnt"))
                    t_fault, fired = time.time(), True
                elif fault == "link_cut":
                    if len(pids) == np_:  # every rank started (a cut during the launch stalls mpirun, not shardgan)
                        netns.link_down()
                        t_fault, fired = time.time(), True
                elif targets:
                    sig = {"kill9": signal.SIGKILL, "sigterm_one": signal.SIGTERM, "sigterm_all": signal.SIGTERM,
                           "sigusr1_one": signal.SIGUSR1, "sigusr1_all": signal.SIGUSR1}[fault]
                    for p in targets:
                        try:
                            os.kill(p, sig)
                        except ProcessLookupError:
                            pass
                    t_fault, fired = time.time(), True
        for r, p in pids.items():
            if r not in exits and not alive(p):
                exits[r] = now
        ranks_done = len(pids) == np_ and len(exits) == np_
        if rc is not None and (ranks_done or now - t_launch > 5 and len(exits) == len(pids)):
            break
        if ranks_done and fault == "link_cut":
            # mpirun may keep waiting for the cut host's daemon (Open MPI's behaviour)
            time.sleep(3)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            netns.kill_all()
            rc = proc.wait()
            break
        if (t_fault is not None and now - t_fault > bound_s + 30) or now > hard_end:
            break
        time.sleep(0.02)
    hung = [r for r in range(np_) if r not in exits]
    if proc.poll() is None or hung:
        for p in pids.values():
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if netns is not None:
            netns.kill_all()
    rc = proc.wait()
    log.close()
    text = _read(log_path) or ""
    ref = t_fault if t_fault is not None else t_launch
    exit_s = {str(r): round(t - ref, 2) for r, t in sorted(exits.items())}
    exit_max = max((t - ref for t in exits.values()), default=None)
    if fired:
        exit_ok = not hung and exit_max is not None and exit_max <= bound_s
    else:
        exit_ok = not hung and rc == 0  # the fault never came: the run must simply complete
    named = sorted(set(int(m) for m in re.findall(r"error on rank (\d+): \S", text))
                   | set(int(m) for m in re.findall(r"process rank (\d+) with PID \d+ on node \S+ exited on signal", text)))
    causes = re.findall(r"error on rank \d+: .{0,200}", text)[:4] + \
        re.findall(r"process rank \d+ with PID \d+ on node \S+ exited on signal \d+[^\n]*", text)[:2]
    return {"rc": rc, "fired": fired, "fault_at_s": round(ref - t_launch, 2), "exit_s": exit_s,
            "exit_max_s": None if exit_max is None else round(exit_max, 2), "hung_ranks": hung,
            "exit_ok": exit_ok, "named_ranks": named, "named_ok": rc == 0 or bool(named),
            "causes": [c.strip() for c in causes], "preempted": "preemption" in text.lower()}


# --- checkpoints ---------------------------------------------------------------------------

def committed(cdir):
    """Committed checkpoints (step-N directories, not step-N.tmp), oldest first."""
    out = [d for d in glob.glob(os.path.join(cdir, "step-*")) if re.fullmatch(r"step-\d+", os.path.basename(d))]
    return sorted(out, key=lambda d: int(os.path.basename(d)[5:]))


def verify_committed(ckpt, cdir):
    steps, bad = [], []
    for d in committed(cdir):
        steps.append(os.path.basename(d))
        r = subprocess.run([ckpt, "verify", d], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        if r.returncode != 0:
            bad.append(f"{os.path.basename(d)}: {r.stdout.strip()[-300:]}")
    return {"committed": steps, "verify_ok": not bad, "verify_failures": bad}


def resume_run(cmd, log_path, steps, run_dir):
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=600,
                                start_new_session=True).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    text = _read(log_path) or ""
    m = re.search(r"resumed from (\S+) at step (\d+)", text)
    fresh = "no committed checkpoint" in text
    want = steps[-1] if steps else None
    got = os.path.basename(m.group(1)) if m else ("fresh" if fresh else None)
    ok = rc == 0 and ((want is None and got == "fresh") or (want is not None and got == want))
    out = {"resume_rc": rc, "resumed_from": got, "resume_ok": ok}
    if not ok:
        out["resume_tail"] = text[-600:]
    return out


def same_checkpoint(a, b):
    """(equal, why): every rank file of a equals b's bit for bit in /generator, /discriminator, /rng."""
    fa = sorted(os.path.basename(p) for p in glob.glob(os.path.join(a, "rank-*.h5")))
    fb = sorted(os.path.basename(p) for p in glob.glob(os.path.join(b, "rank-*.h5")))
    if not fa or fa != fb:
        return False, f"rank files differ: {fa} vs {fb}"
    for name in fa:
        with h5py.File(os.path.join(a, name), "r") as x, h5py.File(os.path.join(b, name), "r") as y:
            for g in ("generator", "discriminator", "rng"):
                if (g in x) != (g in y):
                    return False, f"{name}: /{g} only on one side"
                if g not in x:
                    continue
                da, db = {}, {}
                x[g].visititems(lambda n, o: da.__setitem__(n, o) if isinstance(o, h5py.Dataset) else None)
                y[g].visititems(lambda n, o: db.__setitem__(n, o) if isinstance(o, h5py.Dataset) else None)
                if set(da) != set(db):
                    return False, f"{name}:/{g}: datasets differ: {sorted(set(da) ^ set(db))[:4]}"
                for n in da:
                    va, vb = np.asarray(da[n][()]), np.asarray(db[n][()])
                    if va.dtype.kind == "f" and not (np.isfinite(va).all() and np.isfinite(vb).all()):
                        return False, f"{name}:/{g}/{n}: NaN or infinity"
                    if va.shape != vb.shape or va.dtype != vb.dtype or va.tobytes() != vb.tobytes():
                        return False, f"{name}:/{g}/{n} differs"
    return True, ""


# --- the cell list, the machine ----------------------------------------------------------------

def cc_common(a):
    import chaos_cells
    return chaos_cells.COMMON


def dry_run_cells(a, cells, hosts, train_cmd):
    """{cell name: why} for every cell the config refuses (its --dry-run fails); cached per binary."""
    cache = os.path.join(a.work, "dry_run.json")
    key = f"{os.stat(a.train).st_size}-{int(os.stat(a.train).st_mtime)}"
    known = json.load(open(cache)) if os.path.exists(cache) else {}
    if known.get("key") != key:
        known = {"key": key, "cells": {}}
    refused = {}
    for c in cells:
        sig = json.dumps([c["config"], c["args"], cc_common(a)])
        if sig not in known["cells"]:
            cmd = train_cmd(a, c, os.path.join(a.work, "dry", c["name"]), hosts, "dry") + ["--dry-run"]
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               text=True, timeout=300)
            errors = [l for l in r.stdout.splitlines() if "error" in l.lower()]
            known["cells"][sig] = "" if r.returncode == 0 else ("\n".join(errors[:3]) or r.stdout.strip()[-400:])
        if known["cells"][sig]:
            refused[c["name"]] = known["cells"][sig]
    json.dump(known, open(cache, "w"))
    return refused


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def binary_commit(train):
    r = subprocess.run([train, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    m = re.search(r"\(([0-9a-f]{7,}[^)]*)\)", r.stdout)
    return m.group(1) if m else r.stdout.splitlines()[0] if r.stdout else "unknown"


def why(rec):
    out = []
    if not rec.get("exit_ok"):
        out.append(f"exit: rc {rec.get('rc')}, hung ranks {rec.get('hung_ranks')}, exits {rec.get('exit_s')}")
    if not rec.get("named_ok"):
        out.append("no message names a rank and a cause")
    if not rec.get("verify_ok"):
        out.append(f"verify: {rec.get('verify_failures')}")
    if not rec.get("resume_ok"):
        out.append(f"resume: rc {rec.get('resume_rc')}, from {rec.get('resumed_from')} (committed "
                   f"{rec.get('committed', [])[-1:]}): {rec.get('resume_tail', '')[-300:]}")
    if rec.get("same") is False:
        out.append(f"differs from the uninterrupted run: {rec.get('same_why')}")
    return "; ".join(out)


class NetNs:
    """Two namespaced hosts (tests/multihost/netns.sh) for the multihost cell."""

    def __init__(self, src, work):
        self.script = os.path.join(src, "tests", "multihost", "netns.sh")
        self.prefix = f"ch{os.getpid() % 10000}"
        self.env = dict(os.environ, NETNS_SUBNET=f"10.{150 + os.getpid() % 50}.{os.getpid() // 50 % 250}")

    def _run(self, *args, capture=False):
        return subprocess.run(["bash", self.script, *args], env=self.env, check=True, text=True,
                              stdout=subprocess.PIPE if capture else subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up(self):
        self._run("up", self.prefix, "2")
        return [l for l in self._run("mpirun-args", self.prefix, capture=True).stdout.splitlines() if l]

    def link_down(self):
        self._run("link", self.prefix, "1", "down")

    def link_up(self):
        self._run("link", self.prefix, "1", "up")

    def kill_all(self):
        for i in (0, 1):
            r = subprocess.run(["ip", "netns", "pids", f"{self.prefix}{i}"], stdout=subprocess.PIPE, text=True)
            for p in r.stdout.split():
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass

    def down(self):
        subprocess.run(["bash", self.script, "down", self.prefix, "2"], env=self.env, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
