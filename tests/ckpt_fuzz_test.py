#!/usr/bin/env python3
"""Checkpoint fuzzer (issue 10): seeded corruptions of a real checkpoint, in every region of
its HDF5 files, must never crash, hang or load wrong values.

Usage: ckpt_fuzz_test.py SHARDGAN_TRAIN SHARDGAN_CKPT SOURCE_DIR [--seed N] [--workers N] [--keep]
Runs with the project's environment's Python (.venv: h5py, numpy). ctest: ckpt_fuzz (tests/fuzz_tests.cmake).

What it does:
- Trains the tiny synthetic DCGAN of tests/ckpt_lib.sh for 2 steps on 2 ranks (ZeRO-3), so
  the checkpoint has rank-00000.h5, rank-00001.h5 and index.h5.
- Maps every byte of each file to the HDF5 structure that holds it, by walking the file
  format itself (superblock 0 and v1 object headers, which is what HDF5 1.10 writes by
  default): the superblock; object header prefixes and each kind of header message
  (dataspace, datatype, fill value, layout, attribute, symbol table, continuation,
  modification time, null = free space in a header); v1 B-tree nodes; symbol table nodes;
  local heaps (link names); global heaps (index.h5's virtual dataset mappings); raw data
  (the rank files' shards, the index's manifest.json); and bytes no structure claims
  (alignment, EOF slack). 16 regions in a rank file, 17 in the index.
- Makes PER_REGION = 4 corruptions in each (file, region) pair and TRUNCATIONS = 4 per file:
  49 pairs x 4 + 3 x 4 = 208 cases. A corruption is a one-bit flip, a byte XOR, or an
  overwrite of 2-16 bytes with random bytes, zeros or 0xFF at a uniformly drawn offset of
  the region (always changing at least one byte); a truncation cuts the file at 0, right
  after the superblock, one byte short, or inside a random structure. Plus 3 targeted
  cases: a virtual dataset's global-heap index set past the heap's objects (this crashed
  HDF5 1.10.8), and the layout class of index.h5's manifest.json and of a rank file's
  dataset turned from contiguous into virtual. 211 cases in all.
- `shardgan-ckpt verify` runs on every case. `shardgan-train --resume` runs on a seeded
  subset, because each start of shardgan-train costs 1.5-3 s here: one case of every
  (file, region) pair and one truncation per file (52 cases), the 3 targeted cases, and
  every case in which the HDF5 library crashed under verify. The resume uses the config that wrote the checkpoint,
  on one rank, with train.steps = 3 (checkpoint step + 1), checkpoint_every 0 and
  sample_every 0, and writes to a run directory of its own.

Each case of each tool is classified:
- refused: exit status 1 (verify) or non-zero without a signal (train), within the time
  limit, with an error message that names the corrupted file; for --resume also nothing
  trained or saved;
- accepted-identical: exit 0, and what can be loaded is bit-identical to what the untouched
  checkpoint gives. For verify: h5py's view of all three files (every dataset, the index's
  virtual datasets read through to the rank files, every attribute, walked with visititems)
  equals the untouched one; and for the first accepted case of each (file, region),
  `shardgan-ckpt consolidate` (shardgan's own reader: every tensor, the counters, scalars and
  config) equals the untouched consolidation. For --resume: the checkpoint the resumed run
  writes at step 3 (every dataset of its rank file, and the manifest's models, counters,
  scalars and config) equals the one a resume from the untouched checkpoint writes (two such
  reference resumes must agree). Flips land there in bytes no reader uses (free space in
  object headers, unused B-tree and symbol-table slots, reserved fields, EOF slack) and, for
  a one-rank --resume, in what that loader does not read (the index's virtual datasets and
  attributes, the rank files' attributes, rank 1's copy of the RNG state and its padding);
- anything else fails: a signal (crash), a hang, another exit status, an error without the
  file's name, h5py unable to read a file that verify accepted, or different values.
The test fails if any case fails, if a region has no case, or if there are < 200 cases.

Shown to fail:
- With SHARDGAN_FUZZ_SELFTEST=1 the script treats the first data-block corruption of a rank
  file as accepted by verify. It then reported (seed 1)
    FAIL verify #004 rank-00000.h5 data random @199341+2 (/discriminator/units/block2/param_shard):
      accepted, but h5py reads other values from rank-00000.h5: ['d:discriminator/units/block2/param_shard']
  and exited 1.
- Against the build before the fixes that came with it, the fuzzer failed for real: verify
  accepted corruptions of index.h5 (virtual-dataset mappings, dataspaces, attributes) that
  make h5py read other values, and of modification-time messages that make h5py's
  visititems fail; once verify opened the index's virtual datasets, a corrupted global-heap
  reference in a layout message (case #179 of seed 1) crashed HDF5 1.10.8 inside H5HG_read
  (SIGSEGV). verify now compares the index with the manifest, walks every object header,
  and checks each file in a child process (src/checkpoint/verify.cpp).
"""
import argparse
import concurrent.futures
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict

import h5py
import numpy as np

PER_REGION = 4
TRUNCATIONS = 4
VERIFY_TIMEOUT_S = 60
TRAIN_TIMEOUT_S = 120
STEP = 2  # the checkpoint's step; resumes run to STEP + 1
SMALL = ["ema.start_step=0", "data.source=synthetic", "data.synthetic_size=96", "train.global_batch=12",
         "model.z_dim=16", "model.g_width=8", "model.d_width=8", "train.log_every=1", "train.sample_every=0",
         "run.seed=5"]
FILES = ["rank-00000.h5", "rank-00001.h5", "index.h5"]

# ------------------------------------------------------------------ the HDF5 file map

UNDEF = 0xFFFFFFFFFFFFFFFF
MSG_NAMES = {0x0000: "null", 0x0001: "dataspace", 0x0002: "linkinfo", 0x0003: "datatype", 0x0004: "fill",
             0x0005: "fill", 0x0008: "layout", 0x000B: "filters", 0x000C: "attribute", 0x0010: "continuation",
             0x0011: "symtab", 0x0012: "mtime", 0x0015: "attrinfo"}


def h5_regions(path):
    """Every byte of an HDF5 file with superblock version 0 and v1 object headers, as
    [(start, end, region, what)] without overlaps or holes. Follows the root group's
    symbol table recursively: object headers (and continuation blocks) message by
    message, B-tree nodes, symbol table nodes, local heaps, contiguous data, and the
    global heap collections that hold virtual dataset mappings."""
    data = open(path, "rb").read()
    regions, seen = [], set()

    def u(fmt, off):
        return struct.unpack_from("<" + fmt, data, off)[0]

    if data[:8] != b"\x89HDF\r\n\x1a\n" or data[8] != 0:
        raise ValueError(f"{path}: not an HDF5 file with superblock version 0")
    leaf_k, internal_k = u("H", 16), u("H", 18)
    regions.append((0, 96, "superblock", "superblock"))

    def once(addr):
        if addr in seen:
            return False
        seen.add(addr)
        return True

    def local_heap(addr, what):
        if not once(addr):
            return None
        assert data[addr:addr + 4] == b"HEAP", (path, hex(addr))
        size, seg = u("Q", addr + 8), u("Q", addr + 24)
        regions.append((addr, addr + 32, "local-heap", what + " heap header"))
        regions.append((seg, seg + size, "local-heap", what + " heap data"))
        return seg

    def btree(addr, names, what):
        if not once(addr):
            return
        assert data[addr:addr + 4] == b"TREE", (path, hex(addr))
        level, used = data[addr + 5], u("H", addr + 6)
        regions.append((addr, addr + 24 + (2 * internal_k + 1) * 8 + 2 * internal_k * 8, "btree", what))
        for i in range(used):
            child = u("Q", addr + 32 + i * 16)
            if level > 0:
                btree(child, names, what)
            else:
                symbol_node(child, names, what)

    def symbol_node(addr, names, what):
        if not once(addr):
            return
        assert data[addr:addr + 4] == b"SNOD", (path, hex(addr))
        regions.append((addr, addr + 8 + 2 * leaf_k * 40, "symbol-node", what))
        for i in range(u("H", addr + 6)):
            e = addr + 8 + i * 40
            s = names + u("Q", e)
            name = data[s:data.index(b"\0", s)].decode()
            object_header(u("Q", e + 8), what.rstrip("/") + "/" + name)

    def object_header(addr, what):
        if not once(addr):
            return
        assert data[addr] == 1, (path, "v1 object header expected", hex(addr), what)
        nmsgs = u("H", addr + 2)
        regions.append((addr, addr + 16, "ohdr-prefix", what))
        blocks, count = [(addr + 16, u("I", addr + 8))], 0
        while blocks:
            start, size = blocks.pop(0)
            p = start
            while p + 8 <= start + size and count < nmsgs:
                mtype, msize = u("H", p), u("H", p + 2)
                regions.append((p, p + 8 + msize, "ohdr-" + MSG_NAMES.get(mtype, "other"), what))
                body = p + 8
                if mtype == 0x0010:
                    blocks.append((u("Q", body), u("Q", body + 8)))
                elif mtype == 0x0011:
                    names = local_heap(u("Q", body + 8), what)
                    if names is not None:
                        btree(u("Q", body), names, what)
                elif mtype == 0x0008 and data[body] == 3 and data[body + 1] == 1:
                    a, n = u("Q", body + 2), u("Q", body + 10)
                    if a != UNDEF and n:
                        regions.append((a, a + n, "data", what))
                elif mtype == 0x0008 and data[body + 1] == 3:  # virtual: mappings in a global heap
                    g = u("Q", body + 2)
                    if once(g):
                        assert data[g:g + 4] == b"GCOL", (path, hex(g))
                        regions.append((g, g + u("Q", g + 8), "global-heap", what))
                p += 8 + msize
                count += 1

    object_header(u("Q", 64), "/")
    regions.sort()
    out, pos = [], 0
    for a, b, r, w in regions:
        if a < pos:
            raise ValueError(f"{path}: overlapping structures at {a}")
        if a > pos:
            out.append((pos, a, "unclaimed", "gap"))
        out.append((a, b, r, w))
        pos = b
    if pos < len(data):
        out.append((pos, len(data), "unclaimed", "gap"))
    return out

# ------------------------------------------------------------------ running the tools


def run(cmd, timeout, env):
    """(returncode or 'hang', output). A negative returncode is a signal."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out.decode(errors="replace")
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return "hang", out.decode(errors="replace")


def h5_contents(path, datasets_only_under=None):
    """Every dataset's bytes (with dtype and shape) and every attribute of a file."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                a = obj[()]
                out["d:" + name] = (str(obj.dtype), obj.shape, a.tobytes() if isinstance(a, np.ndarray) else a)
            for k, v in obj.attrs.items():
                out["a:" + name + "@" + k] = v.tobytes() if isinstance(v, np.ndarray) else v
        for k, v in f.attrs.items():
            out["a:/@" + k] = v.tobytes() if isinstance(v, np.ndarray) else v
        f.visititems(visit)
    return out


def diff_keys(a, b):
    keys = sorted(set(a) | set(b))
    return [k for k in keys if k not in a or k not in b or a[k] != b[k]]


def resumed_state(ckpt_dir):
    """What a resumed run saved: every dataset of its rank file, and the manifest's
    models, counters, scalars and config."""
    state = {k: v for k, v in h5_contents(f"{ckpt_dir}/rank-00000.h5").items() if k.startswith("d:")}
    with h5py.File(f"{ckpt_dir}/index.h5", "r") as f:
        m = json.loads(f["manifest.json"][()].decode())
    # The config differs only in run.dir (each resume writes to a directory of its own).
    m["config"] = "\n".join(l for l in m["config"].splitlines() if not l.startswith("run.dir:"))
    for k in ("step", "epoch", "batch_in_epoch", "scalars", "config", "models", "world_size"):
        state["manifest:" + k] = json.dumps(m[k], sort_keys=True)
    return state


class Fuzz:
    def __init__(self, args):
        self.train, self.ckpt, self.src = args.train, args.ckpt, args.src
        self.seed = args.seed
        self.env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                        OMPI_MCA_rmaps_base_oversubscribe="1")
        self.cfg = f"{self.src}/configs/fmnist-dcgan.yaml"
        self.T = tempfile.mkdtemp(prefix="shardgan-ckpt-fuzz.")
        self.failures = []
        self.lines = []

    def sets(self, extra):
        out = []
        for kv in SMALL + extra:
            out += ["--set", kv]
        return out

    def resume_cmd(self, ckpt_dir, run_dir):
        return [self.train, self.cfg] + self.sets([f"train.steps={STEP + 1}", "train.checkpoint_every=0",
                                                   "train.threads=1", f"run.dir={run_dir}"]) + ["--resume", ckpt_dir]

    def setup(self):
        good_run = f"{self.T}/good-run"
        rc, out = run(["mpirun", "-np", "2", "--oversubscribe", self.train, self.cfg]
                      + self.sets([f"train.steps={STEP}", "train.checkpoint_every=0", f"run.dir={good_run}"]),
                      300, self.env)
        if rc != 0:
            sys.exit(f"FAIL: training the checkpoint to fuzz: exit {rc}\n{out[-3000:]}")
        self.good = f"{good_run}/checkpoints/step-{STEP:08d}"
        assert sorted(os.listdir(self.good)) == sorted(FILES), os.listdir(self.good)
        rc, out = run([self.ckpt, "verify", self.good], VERIFY_TIMEOUT_S, self.env)
        if rc != 0:
            sys.exit(f"FAIL: the untouched checkpoint does not verify: {out}")
        self.good_views = {f: h5_contents(f"{self.good}/{f}") for f in FILES}
        self.maps = {f: h5_regions(f"{self.good}/{f}") for f in FILES}
        self.sizes = {f: os.path.getsize(f"{self.good}/{f}") for f in FILES}

    def references(self):
        """What the tools load from the untouched checkpoint (run beside the verify cases):
        its consolidation, and two resumes from it, the reference and a check that a
        resume is deterministic (else "identical" could not be judged)."""
        rc, out = run([self.ckpt, "consolidate", self.good, "-o", f"{self.T}/good.h5"], VERIFY_TIMEOUT_S, self.env)
        if rc != 0:
            raise RuntimeError(f"consolidate of the untouched checkpoint: {out}")
        self.good_values = h5_contents(f"{self.T}/good.h5")
        states = []
        for i in range(2):
            rd = f"{self.T}/good-resume-{i}"
            rc, out = run(self.resume_cmd(self.good, rd), TRAIN_TIMEOUT_S, self.env)
            if rc != 0:
                raise RuntimeError(f"resume from the untouched checkpoint: exit {rc}\n{out[-3000:]}")
            states.append(resumed_state(f"{rd}/checkpoints/step-{STEP + 1:08d}"))
        if diff_keys(*states):
            raise RuntimeError(f"two resumes from the same checkpoint differ in {diff_keys(*states)[:5]}")
        self.good_resumed = states[0]

    def make_cases(self):
        rng = random.Random(self.seed)
        cases = []
        for f in FILES:
            by_region = defaultdict(list)
            for a, b, r, w in self.maps[f]:
                by_region[r].append((a, b, w))
            for region in sorted(by_region):
                pieces = by_region[region]
                weights = [b - a for a, b, _ in pieces]
                for _ in range(PER_REGION):
                    a, b, what = rng.choices(pieces, weights)[0]
                    off = rng.randrange(a, b)
                    kind = rng.choice(["bit", "xor", "random", "zeros", "ones"])
                    n = 1 if kind in ("bit", "xor") else rng.randint(2, 16)
                    cases.append({"file": f, "region": region, "what": what, "kind": kind, "offset": off,
                                  "n": n, "salt": rng.getrandbits(32)})
            size = self.sizes[f]
            data_pieces = [(a, b, w) for a, b, r, w in self.maps[f] if r != "unclaimed"]
            cuts = [0, 96, size - 1]
            while len(cuts) < TRUNCATIONS:
                a, b, _ = rng.choice(data_pieces)
                cuts.append(rng.randrange(a, b))
            for c in cuts:
                region = next(r for a, b, r, w in self.maps[f] if a <= c < b) if c < size else "end"
                cases.append({"file": f, "region": "truncate", "what": f"at {c} ({region})", "kind": "truncate",
                              "offset": c, "n": 0, "salt": 0})
        # Targeted cases, run every time (and always resumed): bytes that are known to hurt.
        data = {f: open(f"{self.good}/{f}", "rb").read() for f in FILES}
        layouts = {f: [(a, w) for a, b, r, w in self.maps[f] if r == "ohdr-layout"] for f in FILES}
        vds = [(a, w) for a, w in layouts["index.h5"] if data["index.h5"][a + 9] == 3]
        a, w = rng.choice(vds)  # a virtual dataset's global-heap index past the heap's objects:
        cases.append({"file": "index.h5", "region": "targeted", "what": w + " heap index 0xffffffff",
                      "kind": "set", "offset": a + 18, "n": 4, "data": b"\xff" * 4, "salt": 0})
        a, w = next((a, w) for a, w in layouts["index.h5"] if w == "/manifest.json")
        cases.append({"file": "index.h5", "region": "targeted", "what": w + " layout class 1 -> 3 (virtual)",
                      "kind": "set", "offset": a + 9, "n": 1, "data": b"\x03", "salt": 0})
        a, w = rng.choice(layouts["rank-00000.h5"])
        cases.append({"file": "rank-00000.h5", "region": "targeted", "what": w + " layout class 1 -> 3 (virtual)",
                      "kind": "set", "offset": a + 9, "n": 1, "data": b"\x03", "salt": 0})
        for i, c in enumerate(cases):
            c["id"] = i
        # The --resume subset: one case of every (file, region) pair, seeded.
        groups = defaultdict(list)
        for c in cases:
            groups[(c["file"], c["region"])].append(c)
        resume = []
        for (_, region), g in sorted(groups.items()):
            resume += g if region == "targeted" else [rng.choice(g)]
        return cases, resume

    def corrupt(self, case):
        d = f"{self.T}/case-{case['id']:03d}"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(self.good, d)
        path = f"{d}/{case['file']}"
        if case["kind"] == "truncate":
            os.truncate(path, case["offset"])
            return d
        with open(path, "r+b") as fh:
            raw = bytearray(fh.read())
            off, n = case["offset"], min(case["n"], len(raw) - case["offset"])
            old = bytes(raw[off:off + n])
            r = random.Random(case["salt"])
            if case["kind"] == "set":
                raw[off:off + n] = case["data"]
            elif case["kind"] == "bit":
                raw[off] ^= 1 << r.randrange(8)
            elif case["kind"] == "xor":
                raw[off] ^= r.randrange(1, 256)
            elif case["kind"] == "random":
                raw[off:off + n] = bytes(r.randrange(256) for _ in range(n))
            else:
                raw[off:off + n] = (b"\0" if case["kind"] == "zeros" else b"\xff") * n
            if bytes(raw[off:off + n]) == old:  # the overwrite matched: flip a bit instead
                raw[off] ^= 0x80
                case["kind"] += "+bit"
            fh.seek(0)
            fh.write(raw)
        return d

    def label(self, case):
        return (f"#{case['id']:03d} {case['file']} {case['region']} {case['kind']}"
                f" @{case['offset']}" + (f"+{case['n']}" if case["n"] > 1 else "") + f" ({case['what']})")

    def judge_exit(self, rc, out, case, tool):
        """None if refused properly, else the reason it is not."""
        if rc == "hang":
            return "hung (killed after the time limit)"
        if rc < 0:
            return f"killed by signal {-rc} ({signal.Signals(-rc).name})"
        if tool == "verify" and rc != 1:
            return f"exit status {rc}, expected 1"
        if "error" not in out and "CORRUPT" not in out:
            return "no error message"
        if case["file"] not in out:
            return f"the message does not name {case['file']}"
        return None

    def do_verify(self, case):
        d = self.corrupt(case)
        rc, out = run([self.ckpt, "verify", d], VERIFY_TIMEOUT_S, self.env)
        if os.environ.get("SHARDGAN_FUZZ_SELFTEST") == "1" and case.get("selftest"):
            rc, out = 0, "OK (self-test: refusal ignored)"
        if rc == 0:
            # What h5py sees must not have changed: every dataset of every file (the
            # index's virtual datasets read through to the rank files, manifest.json, the
            # shards) and every attribute.
            for f in FILES:
                try:
                    seen = h5_contents(f"{d}/{f}")
                except Exception as e:  # noqa: BLE001
                    return "fail", f"accepted, but h5py cannot read {f}: {e!r}"[:400]
                bad = diff_keys(seen, self.good_views[f])
                if bad:
                    return "fail", f"accepted, but h5py reads other values from {f}: {bad[:4]}"
            return "identical", "accepted; h5py's view of every file is bit-identical"
        why = self.judge_exit(rc, out, case, "verify")
        if why:
            return "fail", why + ": " + out.strip()[-400:]
        first = next((l for l in out.splitlines() if "CORRUPT" in l or "error" in l), "")
        return "refused", first[:200]

    def do_consolidate(self, case):
        """What shardgan's own reader loads from an accepted case must be bit-identical."""
        d = f"{self.T}/case-{case['id']:03d}"
        out_h5 = f"{d}.consolidated.h5"
        rc, out = run([self.ckpt, "consolidate", d, "-o", out_h5], VERIFY_TIMEOUT_S, self.env)
        if rc != 0:
            return "fail", f"verify accepted it, but consolidate refused: {rc}: {out.strip()[-300:]}"
        bad = diff_keys(h5_contents(out_h5), self.good_values)
        if bad:
            return "fail", f"verify accepted it, but shardgan's reader loads other values: {bad[:4]}"
        return "identical", "consolidated values bit-identical"

    def do_resume(self, case):
        d = self.corrupt(case)
        run_dir = f"{d}.run"
        rc, out = run(self.resume_cmd(d, run_dir), TRAIN_TIMEOUT_S, self.env)
        saved = f"{run_dir}/checkpoints/step-{STEP + 1:08d}"
        if rc == 0:
            try:
                bad = diff_keys(resumed_state(saved), self.good_resumed)
            except Exception as e:  # noqa: BLE001
                return "fail", f"exit 0 but its checkpoint is unreadable: {e}"
            if bad:
                return "fail", f"resumed and trained from different values: {bad[:4]}"
            return "identical", "resumed; the state it saved at the next step is bit-identical"
        why = self.judge_exit(rc, out, case, "resume")
        if why:
            return "fail", why + ": " + out.strip()[-400:]
        if os.path.exists(saved):
            return "fail", "refused, but a checkpoint was saved anyway"
        first = next((l for l in out.splitlines() if "error" in l), "")
        return "refused", first[:200]

    def submit(self, ex, cases, fn):
        return {ex.submit(fn, c): c for c in cases}

    def collect(self, futs, tool):
        results = {}
        for fut, c in futs.items():
            try:
                results[c["id"]] = fut.result()
            except Exception as e:  # noqa: BLE001  (a bug in this script is a failure too)
                results[c["id"]] = ("fail", f"harness error: {e!r}")
        for c in sorted(futs.values(), key=lambda c: c["id"]):
            verdict, msg = results[c["id"]]
            tag = "FAIL" if verdict == "fail" else "PASS"
            print(f"{tag} {tool:6s} {self.label(c)}: {verdict}: {msg}", flush=True)
            if verdict == "fail":
                self.failures.append(f"{tool} {self.label(c)}: {msg}")
        return results

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train")
    ap.add_argument("ckpt")
    ap.add_argument("src")
    ap.add_argument("--seed", type=int, default=1)
    # Most of each case is a tool's start (LibTorch's static initialization, ~0.7 s of CPU);
    # twice as many workers as cores keeps the cores busy on a loaded machine.
    ap.add_argument("--workers", type=int, default=2 * (os.cpu_count() or 2))
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    args.train, args.ckpt, args.src = (os.path.abspath(x) for x in (args.train, args.ckpt, args.src))
    t0 = time.time()
    fz = Fuzz(args)
    try:
        fz.setup()
        cases, resume_cases = fz.make_cases()
        if os.environ.get("SHARDGAN_FUZZ_SELFTEST") == "1":
            next(c for c in cases if c["region"] == "data" and c["file"].startswith("rank"))["selftest"] = True
        t1 = time.time()
        print(f"checkpoint {fz.good}: {len(cases)} corruptions, {len(resume_cases)} of them also resumed "
              f"(seed {args.seed}, setup {t1 - t0:.0f} s)", flush=True)
        with concurrent.futures.ThreadPoolExecutor(args.workers) as ex:
            refs = ex.submit(fz.references)
            vres = fz.collect(fz.submit(ex, cases, fz.do_verify), "verify")
            try:
                refs.result()
            except RuntimeError as e:
                sys.exit(f"FAIL: {e}")
            t2 = time.time()
            # shardgan's reader on accepted cases: the first one of each (file, region), to
            # keep the run short (h5py's view of every accepted case is compared above, and
            # the --resume subset loads through the trainer).
            firsts = {}
            for c in cases:
                if vres[c["id"]][0] == "identical":
                    firsts.setdefault((c["file"], c["region"]), c)
            # Also resume every case in which the HDF5 library crashed under verify (verify
            # survives that by checking each file in a child process; the loader does not).
            chosen = {c["id"] for c in resume_cases}
            resume_cases += [c for c in cases if "library crashed" in vres[c["id"]][1] and c["id"] not in chosen]
            rfuts = fz.submit(ex, resume_cases, fz.do_resume)
            cres = fz.collect(fz.submit(ex, list(firsts.values()), fz.do_consolidate), "consol")
            rres = fz.collect(rfuts, "resume")
        for i, r in cres.items():
            if r[0] == "fail":
                vres[i] = r
        t3 = time.time()
        # Summary per (file, region): cases, and verify's and resume's verdicts.
        print("\nfile           region               cases  verify: refused identical fail"
              "   resume: refused identical fail")
        table = defaultdict(lambda: [0, Counter(), Counter()])
        for c in cases:
            row = table[(c["file"], c["region"])]
            row[0] += 1
            row[1][vres[c["id"]][0]] += 1
            if c["id"] in rres:
                row[2][rres[c["id"]][0]] += 1
        for (f, r), (n, v, rs) in sorted(table.items()):
            print(f"{f:14s} {r:20s} {n:5d}  {v['refused']:14d} {v['identical']:9d} {v['fail']:4d}"
                  f"  {rs['refused']:15d} {rs['identical']:9d} {rs['fail']:4d}")
        tv, tr = Counter(v[0] for v in vres.values()), Counter(v[0] for v in rres.values())
        print(f"verify: {len(vres)} cases, {tv['refused']} refused, {tv['identical']} accepted with identical "
              f"values ({len(cres)} of them also consolidated), {tv['fail']} failed ({t2 - t1:.0f} s)")
        print(f"resume: {len(rres)} cases, {tr['refused']} refused, {tr['identical']} accepted with identical "
              f"values, {tr['fail']} failed (with the consolidations: {t3 - t2:.0f} s)")
        regions = {(f, r) for f in FILES for r in {x[2] for x in fz.maps[f]} | {"truncate"}}
        missing = regions - {(c["file"], c["region"]) for c in cases}
        if missing:
            fz.failures.append(f"regions without a case: {sorted(missing)}")
        if len(cases) < 200:
            fz.failures.append(f"only {len(cases)} cases")
        print(f"total {time.time() - t0:.0f} s")
    finally:
        if args.keep:
            print("kept", fz.T)
        else:
            shutil.rmtree(fz.T, ignore_errors=True)
    for f in fz.failures:
        print("FAIL:", f)
    print(f"{'FAILED' if fz.failures else 'PASSED'}: {len(fz.failures)} failure(s)")
    sys.exit(1 if fz.failures else 0)


if __name__ == "__main__":
    main()
