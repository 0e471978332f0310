#!/usr/bin/env bash
# shardgan-ckpt on a real 2-rank run: ls, info, verify, diff, consolidate (checked with
# h5py against the index's virtual datasets), reshard to 3 and 1 ranks (exact, and training
# resumes from them), sample and export; h5dump reads a virtual dataset.
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-ckpt-tool.XXXXXX)
CFG="$SRC/configs/fmnist-dcgan.yaml"
"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" --set train.steps=4 --set train.checkpoint_every=2 \
  --set run.dir="$T/run" > "$T/train.log" 2>&1 && ok "trained 4 steps on 2 ranks" || bad "training: $(tail -5 "$T/train.log")"
C4=$T/run/checkpoints/step-00000004; C2=$T/run/checkpoints/step-00000002
[ -f "$C4/index.h5" ] && [ -f "$C4/rank-00001.h5" ] && ok "checkpoint has index.h5 and rank files" || bad "layout: $(ls -R "$T/run/checkpoints")"

"$CKPT" ls "$T/run" > "$T/ls.txt" 2>&1 && grep -q "generator/params/block0.0.weight" "$T/ls.txt" \
  && grep -q "generator/optim/exp_avg_sq/block1.1.weight" "$T/ls.txt" && grep -q "1: \[" "$T/ls.txt" \
  && ok "ls lists tensors, shapes and holders" || bad "ls: $(head -5 "$T/ls.txt")"
"$CKPT" info "$C4" > "$T/info.txt" 2>&1 && grep -q "^step *4" "$T/info.txt" && grep -q "^world size *2" "$T/info.txt" \
  && grep -q "stage 3" "$T/info.txt" && grep -q "train.steps: 4" "$T/info.txt" \
  && ok "info shows step, world size, stages and config" || bad "info: $(cat "$T/info.txt")"
"$CKPT" verify "$T/run" > "$T/v.txt" 2>&1 && grep -q "^OK" "$T/v.txt" && ok "verify: $(cut -c1-120 "$T/v.txt")" || bad "verify: $(cat "$T/v.txt")"

"$CKPT" diff "$C4" "$C4" --rtol 0 > "$T/d.txt" 2>&1 && ok "diff of a checkpoint with itself is 0" || bad "self diff: $(tail -3 "$T/d.txt")"
"$CKPT" diff "$C2" "$C4" --rtol 0 > "$T/d.txt" 2>&1 && bad "diff step 2 vs 4 saw no difference" \
  || { grep -q "generator/params/block0.0.weight" "$T/d.txt" && ok "diff step 2 vs 4: $(tail -2 "$T/d.txt" | head -1)"; }

"$CKPT" consolidate "$C4" -o "$T/full.h5" > "$T/c.txt" 2>&1 && ok "consolidate: $(cat "$T/c.txt")" || bad "consolidate: $(cat "$T/c.txt")"
"$PY" - "$C4/index.h5" "$T/full.h5" > "$T/py.txt" 2>&1 <<'PYEOF' && ok "h5py: $(cat "$T/py.txt")" || bad "h5py: $(tail -5 "$T/py.txt")"
import sys, h5py, numpy as np
idx, full = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
n = 0
def cmp(name, obj):
    global n
    if isinstance(obj, h5py.Dataset):
        assert idx[name].is_virtual, name
        assert np.array_equal(idx[name][...], obj[...]), name
        n += 1
full.visititems(cmp)
assert n > 40 and full.attrs["step"] == 4
print(f"{n} consolidated tensors equal the index's virtual datasets")
PYEOF
h5dump -d /generator/params/block1.0.weight "$C4/index.h5" > "$T/dump.txt" 2>&1 && grep -q "DATA" "$T/dump.txt" \
  && ok "h5dump reads a virtual dataset" || bad "h5dump: $(head -5 "$T/dump.txt")"
"$PY" "$SRC/tests/ckpt_h5py_check.py" "$C4" > "$T/py2.txt" 2>&1 && ok "$(cat "$T/py2.txt")" || bad "h5py check: $(tail -3 "$T/py2.txt")"

for m in 3 1; do
  "$CKPT" reshard "$C4" -o "$T/r$m" --world-size $m > "$T/r.txt" 2>&1 && "$CKPT" verify "$T/r$m" > /dev/null 2>&1 \
    && ok "reshard to $m ranks verifies" || bad "reshard $m: $(cat "$T/r.txt")"
  "$CKPT" diff "$C4" "$T/r$m" --rtol 0 > "$T/d.txt" 2>&1 && ok "resharded to $m: every tensor bit-identical" || bad "reshard $m differs: $(tail -3 "$T/d.txt")"
  "${MPIRUN[@]}" -np $m "$TRAIN" "$CFG" "${SMALL[@]}" --set train.steps=5 --set train.checkpoint_every=0 \
    --set run.dir="$T/cont$m" --resume "$T/r$m" > "$T/cont.log" 2>&1 && grep -q "resumed from $T/r$m at step 4" "$T/cont.log" \
    && [ -f "$T/cont$m/checkpoints/step-00000005/index.h5" ] && ok "training resumes on $m ranks and reaches step 5" \
    || bad "resume on $m ranks: $(tail -5 "$T/cont.log")"
done
"$CKPT" reshard "$C4" -o "$T/r2s0" --world-size 2 --stage 0 > /dev/null 2>&1 && "$CKPT" diff "$C4" "$T/r2s0" --rtol 0 > /dev/null 2>&1 \
  && "$CKPT" info "$T/r2s0" | grep -q "stage 0" && ok "reshard --stage 0 is exact" || bad "reshard --stage 0"

"$CKPT" sample "$C4" -o "$T/grid.png" > "$T/s.txt" 2>&1 && [ "$(head -c 8 "$T/grid.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] \
  && ok "sample wrote a PNG: $(cat "$T/s.txt")" || bad "sample: $(cat "$T/s.txt")"
"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" --set train.steps=4 --set run.dir="$T/run" --resume "$T/run" > /dev/null 2>&1
# The trainer draws its grid on 2 stage-3 ranks, the tool on one process from the gathered
# parameters: the same weights and inputs, so only float summation order may differ. A
# pixel is round((x + 1) * 127.5) of a tanh output x; a relative change near 1e-6 moves
# one only when x lies within ~1e-4 of a rounding boundary, so at most 1 gray level on
# at most 1% of the values. Wrong weights (another step's, or the EMA's) change most pixels.
TRAINER_PNG=$T/run/samples/samples-step-00000004.png
if [ -f "$TRAINER_PNG" ]; then
  "$PY" "$SRC/tests/png_diff.py" "$T/grid.png" "$TRAINER_PNG" 1 0.01 > "$T/pd.txt" 2>&1 \
    && ok "sample equals the trainer's own grid at step 4: $(cat "$T/pd.txt")" \
    || bad "sample differs from the trainer's grid at step 4: $(cat "$T/pd.txt")"
else
  bad "the resumed run wrote no grid at step 4"
fi
# The shipped config keeps a sharded EMA of G (ema.enabled), which checkpoints carry.
"$CKPT" sample "$C4" -o "$T/ema.png" --ema > "$T/s.txt" 2>&1 && [ -s "$T/ema.png" ] && ! cmp -s "$T/ema.png" "$T/grid.png" \
  && ok "sample --ema draws from the EMA (a different grid)" || bad "sample --ema: $(cat "$T/s.txt")"
"$CKPT" export "$C4" -o "$T/g_ema.pt" --ema > "$T/e.txt" 2>&1 && [ -s "$T/g_ema.pt" ] && ok "export --ema" || bad "export --ema: $(cat "$T/e.txt")"
"$CKPT" export "$C4" -o "$T/g.pt" > "$T/e.txt" 2>&1 && [ -s "$T/g.pt" ] && ok "export: $(cut -c1-100 "$T/e.txt")" || bad "export: $(cat "$T/e.txt")"
"$CKPT" info "$T/nothing" > "$T/n.txt" 2>&1; [ $? -eq 1 ] && grep -q "no checkpoint there" "$T/n.txt" && ok "a missing checkpoint is exit 1 with a message" || bad "missing: $(cat "$T/n.txt")"
"$CKPT" verify "$T/nothing" > "$T/n.txt" 2>&1; [ $? -eq 1 ] && grep -q "^.*checkpoint '$T/nothing': no checkpoint there" "$T/n.txt" &&
  ! grep -q -- "--resume" "$T/n.txt" && ok "verify of a missing path names the path, not --resume" || bad "verify missing: $(cat "$T/n.txt")"
"$CKPT" frobnicate > /dev/null 2>&1; [ $? -eq 2 ] && ok "bad usage is exit 2" || bad "bad usage exit code"
rm -rf "$T"
finish
