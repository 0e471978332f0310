#!/usr/bin/env bash
# Negative controls for the checkpoint comparisons the other tests rely on: tests/lib.sh's
# same_checkpoint (through checkpoints_identical, its verdict as an exit status) and
# checkpoints_within, and tests/ckpt_close.py, run on tiny fake checkpoint directories
# written with h5py (two rank files with /generator, /discriminator and /rng, and an
# index.h5 with a manifest and virtual datasets, as docs/checkpoints.md lays them out).
# Each comparison must FAIL on:
#   - checkpoint A missing (the old same_checkpoint looped over an empty glob and passed),
#     and A an empty directory;
#   - a rank file only in B (the old one iterated over A's files only);
#   - a NaN in the same place on both sides (h5diff counts NaN equal to NaN, and so does
#     shardgan-ckpt diff), a NaN on one side, and an infinity on both;
#   - one value that differs;
# and pass on an equal pair (ckpt_close.py also within a tolerance). checkpoints_within
# runs with CKPT=true, a tool that passes everything, so its own checks are what fail.
# Usage: lib_selftest.sh (python: $SHARDGAN_PYTHON, else the checkout's .venv).
source "$(dirname "$0")/lib.sh"
CLOSE=$(dirname "$0")/ckpt_close.py
T=$(mktemp -d /tmp/shardgan-libself.XXXXXX)
trap 'rm -rf "$T"' EXIT
"$LIB_PY" - "$T" <<'PY' || { echo "FAIL: could not write the fake checkpoints"; exit 1; }
import json, os, shutil, sys
import h5py, numpy as np
T = sys.argv[1]
N, S = 2, 3  # ranks, elements per shard


def make(name, change=None, extra_rank=False, drop_rank=None, unlisted=False):
    """A checkpoint directory T/name; change(model, rank, shard) may edit a shard in place."""
    d = f"{T}/{name}"
    os.makedirs(d)
    files = []
    for r in range(N + (1 if extra_rank else 0)):
        fn = f"rank-{r:05d}.h5"
        with h5py.File(f"{d}/{fn}", "w") as f:
            for m in ("generator", "discriminator"):
                x = np.arange(S, dtype=np.float32) + 10 * r + (100 if m == "discriminator" else 0)
                if change:
                    change(m, r, x)
                f[f"{m}/units/u/param_shard"] = x
                f[f"{m}/units/u/optim/exp_avg"] = x / 7
            f["rng/noise"] = np.arange(8, dtype=np.uint8)
        if r < N:
            files.append({"rank": r, "name": fn, "bytes": os.path.getsize(f"{d}/{fn}")})
    with h5py.File(f"{d}/index.h5", "w") as f:
        f["manifest.json"] = json.dumps({"format": "shardgan-checkpoint", "files": files})
        for m in ("generator", "discriminator"):
            for kind, src in (("params", "param_shard"), ("optim/exp_avg", "optim/exp_avg")):
                lay = h5py.VirtualLayout(shape=(N, S), dtype="f4")
                for r in range(N):
                    lay[r] = h5py.VirtualSource(f"rank-{r:05d}.h5", f"{m}/units/u/{src}", shape=(S,))
                f.create_virtual_dataset(f"{m}/{kind}/u.w", lay)
    if drop_rank is not None:
        os.remove(f"{d}/rank-{drop_rank:05d}.h5")
        if unlisted:  # and the manifest does not name it: only the virtual datasets do
            files = [e for e in files if e["rank"] != drop_rank]
            with h5py.File(f"{d}/index.h5", "a") as f:
                del f["manifest.json"]
                f["manifest.json"] = json.dumps({"format": "shardgan-checkpoint", "files": files})


def at(model, rank, value, pos=0):
    def change(m, r, x):
        if m == model and r == rank:
            x[pos] = value
    return change


make("a")
make("b")
os.makedirs(f"{T}/empty")
make("extra", extra_rank=True)       # rank-00002.h5 only in B
make("nan-a", at("generator", 1, np.nan))
make("nan-b", at("generator", 1, np.nan))
make("inf-a", at("discriminator", 0, np.inf))
make("inf-b", at("discriminator", 0, np.inf))
make("differ", at("discriminator", 1, 42.0))
make("near", at("generator", 1, np.float32(10.0) * (1 + 2 ** -20)))  # |a - b| / 21 ~ 5e-7
make("dropped", drop_rank=1)         # a rank file the manifest names is gone
make("unmapped", drop_rank=1, unlisted=True)  # gone, and only the index's mappings name it
PY

# verdict NAME WANT CMD...: CMD's exit status must be 0 for WANT=pass, non-zero for fail.
verdict() {
  local name=$1 want=$2 rc word=passes; shift 2
  [ "$want" = fail ] && word=fails
  "$@" > "$T/out.txt" 2>&1; rc=$?
  if { [ "$want" = pass ] && [ $rc -eq 0 ]; } || { [ "$want" = fail ] && [ $rc -ne 0 ]; }; then
    ok "$name: $word ($(head -2 "$T/out.txt" | tr '\n' ' ' | cut -c1-200))"
  else
    bad "$name: should $want, exit $rc: $(tail -4 "$T/out.txt" | tr '\n' ' ')"
  fi
}
within() (CKPT=true; FAILED=0; checkpoints_within "$1" "$2" 0 x; [ "$FAILED" -eq 0 ])  # a subshell: own counters
close() { "$LIB_PY" "$CLOSE" "$@"; }

verdict "same_checkpoint, equal pair" pass checkpoints_identical "$T/a" "$T/b"
verdict "same_checkpoint, A missing" fail checkpoints_identical "$T/missing" "$T/b"
verdict "same_checkpoint, A empty" fail checkpoints_identical "$T/empty" "$T/b"
verdict "same_checkpoint, B missing" fail checkpoints_identical "$T/a" "$T/missing"
verdict "same_checkpoint, a rank file only in B" fail checkpoints_identical "$T/a" "$T/extra"
verdict "same_checkpoint, a rank file only in A" fail checkpoints_identical "$T/extra" "$T/a"
verdict "h5diff alone, NaN in the same place (why the NaN check exists)" pass \
  h5diff "$T/nan-a/rank-00001.h5" "$T/nan-b/rank-00001.h5" /generator /generator
verdict "same_checkpoint, NaN in the same place on both sides" fail checkpoints_identical "$T/nan-a" "$T/nan-b"
verdict "same_checkpoint, NaN in A only" fail checkpoints_identical "$T/nan-a" "$T/a"
verdict "same_checkpoint, infinity in the same place on both sides" fail checkpoints_identical "$T/inf-a" "$T/inf-b"
verdict "same_checkpoint, one value differs" fail checkpoints_identical "$T/a" "$T/differ"
verdict "checkpoints_within (tool passes all), equal pair" pass within "$T/a" "$T/b"
verdict "checkpoints_within, A missing" fail within "$T/missing" "$T/b"
verdict "checkpoints_within, NaN in the same place on both sides" fail within "$T/nan-a" "$T/nan-b"
verdict "ckpt_close.py, equal pair at rtol 0" pass close "$T/a" "$T/b" 0
verdict "ckpt_close.py, within 1e-6" pass close "$T/near" "$T/a" 1e-6
verdict "ckpt_close.py, not within 1e-8" fail close "$T/near" "$T/a" 1e-8
verdict "ckpt_close.py, A missing" fail close "$T/missing" "$T/b" 1
verdict "ckpt_close.py, A empty" fail close "$T/empty" "$T/b" 1
verdict "ckpt_close.py, a rank file only in B (not in its manifest)" fail close "$T/a" "$T/extra" 1
verdict "ckpt_close.py, a rank file the manifest names gone" fail close "$T/dropped" "$T/a" 1
verdict "ckpt_close.py, a rank file only the mappings name gone" fail close "$T/unmapped" "$T/a" 1
verdict "ckpt_close.py, NaN in the same place on both sides" fail close "$T/nan-a" "$T/nan-b" 1
verdict "ckpt_close.py, NaN in B only" fail close "$T/a" "$T/nan-b" 1
verdict "ckpt_close.py, infinity on both sides" fail close "$T/inf-a" "$T/inf-b" 1
verdict "ckpt_close.py, one value differs" fail close "$T/a" "$T/differ" 1e-3
finish
