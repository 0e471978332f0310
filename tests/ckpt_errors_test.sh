#!/usr/bin/env bash
# Bad checkpoints: a corrupted shard, a truncated file, a missing rank file, a wrong schema
# version. For each, `shardgan-ckpt verify` exits 1 naming the problem, and shardgan-train
# --resume (at the same and at another world size) stops every rank with a message naming
# it, never hanging and never training from a wrong state.
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-ckpt-errors.XXXXXX)
CFG="$SRC/configs/fmnist-dcgan.yaml"
"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" --set train.steps=2 --set train.checkpoint_every=0 \
  --set run.dir="$T/good" > "$T/train.log" 2>&1 && ok "trained 2 steps" || bad "training: $(tail -5 "$T/train.log")"
C=checkpoints/step-00000002

case_dir() { rm -rf "$T/$1"; cp -r "$T/good" "$T/$1"; echo "$T/$1/$C"; }
check() {  # name, expected text
  local name=$1 want=$2 dir="$T/$1"
  expect_fail "$name: verify" "$want" "$CKPT" verify "$dir"
  expect_fail "$name: resume on 2 ranks" "$want" "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" --set train.steps=4 \
    --set run.dir="$dir" --resume "$dir"
  expect_fail "$name: resume on 3 ranks" "$want" "${MPIRUN[@]}" -np 3 "$TRAIN" "$CFG" "${SMALL[@]}" --set train.steps=4 \
    --set run.dir="$dir" --resume "$dir"
  [ ! -d "$dir/checkpoints/step-00000004" ] && ok "$name: nothing was trained or saved" || bad "$name: a run went on"
}

D=$(case_dir corrupt)
"$PY" - "$D/rank-00001.h5" <<'PYEOF' && ok "flipped bytes in the middle of rank 1's block1 parameter shard"
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    ds = f["generator/units/block1/param_shard"]
    off = ds.id.get_offset() + ds.id.get_storage_size() // 2
with open(sys.argv[1], "r+b") as f:
    f.seek(off); b = f.read(4); f.seek(off); f.write(bytes(x ^ 0x5A for x in b))
PYEOF
check corrupt "dataset 'generator/units/block1/param_shard' fails its checksum"

D=$(case_dir truncated)
truncate -s $(( $(stat -c %s "$D/rank-00000.h5") / 2 )) "$D/rank-00000.h5"
check truncated "(truncated or overwritten)"

D=$(case_dir missing)
rm "$D/rank-00001.h5"
check missing "file 'rank-00001.h5': is missing"

D=$(case_dir schema)
"$PY" -c "import h5py,sys; f=h5py.File(sys.argv[1],'r+'); f.attrs['schema_version']=3; f.close()" "$D/index.h5"
check schema "index.h5 has schema version 3, this build reads schema 2"

D=$(case_dir noindex)
rm "$D/index.h5"
expect_fail "no index: resume" "no complete checkpoint" "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" \
  --set train.steps=4 --set run.dir="$T/noindex" --resume "$T/noindex"
"$CKPT" verify "$T/good" > /dev/null 2>&1 && ok "the untouched checkpoint still verifies" || bad "good checkpoint fails verify"
rm -rf "$T"
finish
