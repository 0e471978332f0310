#!/usr/bin/env bash
# Issue 22: ranks agree on the checkpoint they resume. Each rank is started in its own
# working directory (mpirun -wdir, one app context per rank) with the same relative
# --resume path, so each lists a different folder: the stale network-filesystem view in
# which ranks see different steps. (run.dir, where the new checkpoints go, is absolute.) Rank 0's choice must win on every rank (the same step is
# loaded, or nothing is), and a rank that cannot see rank 0's choice must end the job
# cleanly, naming itself. Before the fix every rank listed its own folder and picked its
# own newest step, or one started fresh while another loaded.
TRAIN=$1; SRC=$3
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-resume-agree.XXXXXX)
CFG="$SRC/configs/fmnist-dcgan.yaml"
COMMON=(--set data.source=synthetic --set data.synthetic_size=64 --set train.global_batch=16
        --set model.z_dim=16 --set model.g_width=8 --set model.d_width=8 --set train.log_every=1
        --set train.sample_every=0 --set run.seed=5 --set dist.timeout_s=30)
two_dirs() {  # rank 0 in $1, rank 1 in $2, then the arguments of both
  local d0=$1 d1=$2; shift 2
  timeout 120 "${MPIRUN[@]}" -np 1 -wdir "$d0" "$TRAIN" "$CFG" "${COMMON[@]}" "$@" : \
                             -np 1 -wdir "$d1" "$TRAIN" "$CFG" "${COMMON[@]}" "$@"
}
# A run with checkpoints at steps 2, 4 and 6.
mkdir -p "$T/src"
(cd "$T/src" && "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${COMMON[@]}" --set run.dir=run --set train.steps=6 --set train.checkpoint_every=2 \
   --set train.keep_checkpoints=5 > "$T/src.log" 2>&1) && ok "6 steps with checkpoints at 2, 4, 6" || bad "source run: $(tail -5 "$T/src.log")"
ls "$T/src/run/checkpoints"
S2=step-00000002; S4=step-00000004; S6=step-00000006
view() {  # view <dir> <steps...>: a run folder that shows only these checkpoints
  local d=$1; shift; mkdir -p "$d/run/checkpoints"
  for s in "$@"; do cp -r "$T/src/run/checkpoints/$s" "$d/run/checkpoints/"; done
}
view "$T/a" $S2 $S4          # rank 0: newest is step 4
view "$T/b" $S2 $S4 $S6      # rank 1: also sees step 6
view "$T/c" $S2              # rank 1: does not see step 4
mkdir -p "$T/e"              # rank 0: sees nothing at all

# 1. Rank 1 sees a newer step than rank 0: both load rank 0's step 4 and train to 8.
two_dirs "$T/a" "$T/b" --set run.dir="$T/out1" --set train.steps=8 --resume run > "$T/1.log" 2>&1
rc=$?
[ $rc -eq 0 ] && ok "different listings, rank 0's choice visible everywhere: exit 0" || bad "case 1 exit $rc: $(tail -5 "$T/1.log")"
grep -q "resumed from run/checkpoints/$S4 at step 4" "$T/1.log" && ok "resumed at rank 0's step 4" || bad "case 1: no resume at step 4"
[ -d "$T/out1/checkpoints/step-00000008" ] && ok "finished at step 8" || bad "case 1: no step-8 checkpoint"

# 2. Rank 1 cannot see rank 0's step 4: every rank fails, naming rank 1, without a hang.
two_dirs "$T/a" "$T/c" --set run.dir="$T/out2" --set train.steps=8 --resume run > "$T/2.log" 2>&1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then bad "case 2: exit $rc (0 = trained on different steps, 124 = hung)"
else ok "rank 1 blind to the choice: exit $rc"; fi
grep -q "which rank(s) 1 cannot see" "$T/2.log" && ok "the message names rank 1" || bad "case 2: message missing: $(tail -5 "$T/2.log")"
[ "$(grep -c 'shardgan-train: error on rank' "$T/2.log")" -eq 2 ] && ok "both ranks report the error" || bad "case 2: not every rank reported"

# 3. --resume auto reads run.dir itself, so here run.dir is relative: rank 0 (in e) sees no
# checkpoint, rank 1 (in b) sees step 6. Both must start fresh; before the fix rank 1 loaded
# step 6 and skipped the steps rank 0 trained. The final save writes rank 1's file into
# its own folder: a link there points it at rank 0's, so that the save can commit.
mkdir -p "$T/e/run/checkpoints"
ln -s "$T/e/run/checkpoints/step-00000002.tmp" "$T/b/run/checkpoints/step-00000002.tmp"
two_dirs "$T/e" "$T/b" --set run.dir=run --set train.steps=2 --resume auto > "$T/3.log" 2>&1
rc=$?
[ $rc -eq 0 ] && ok "auto with rank 0 empty: exit 0" || bad "case 3 exit $rc: $(tail -5 "$T/3.log")"
grep -q "starting fresh" "$T/3.log" && ok "every rank starts fresh" || bad "case 3: no fresh start"
rm -rf "$T"
finish
