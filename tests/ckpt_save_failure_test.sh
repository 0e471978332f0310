#!/usr/bin/env bash
# A checkpoint save that fails on one rank only (issue 10). Rank 1 runs under a file-size
# limit (ulimit -f) of half its rank file, with SIGXFSZ ignored, so its HDF5 writes fail with
# EFBIG: a real write error on that rank's path, like a full disk, while rank 0 writes
# normally. Every rank must end with an error (rank 1 naming its cause, rank 0 naming rank
# 1) well before the collective timeout; the step-6 save must not be committed; the step-4
# checkpoint must still verify, and a run without the limit must resume from it.
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-save-fail.XXXXXX)
CFG="$SRC/configs/fmnist-dcgan.yaml"
RUN=("${SMALL[@]}" --set train.checkpoint_every=2 --set dist.timeout_s=300 --set run.dir="$T/run")
"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${RUN[@]}" --set train.steps=4 > "$T/a.log" 2>&1 \
  && ok "trained 4 steps, checkpoints at 2 and 4" || bad "first run: $(tail -5 "$T/a.log")"
size=$(stat -c %s "$T/run/checkpoints/step-00000004/rank-00001.h5")
limit_kb=$((size / 2048))  # half the rank file, in ulimit -f's 1024-byte blocks
t0=$SECONDS
timeout 120 "${MPIRUN[@]}" -np 1 "$TRAIN" "$CFG" "${RUN[@]}" --set train.steps=6 --resume "$T/run" : \
  -np 1 bash -c "trap '' XFSZ; ulimit -f $limit_kb; exec \"\$0\" \"\$@\"" "$TRAIN" "$CFG" "${RUN[@]}" \
  --set train.steps=6 --resume "$T/run" > "$T/b.log" 2>&1
rc=$?; took=$((SECONDS - t0))
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -lt 60 ] && ok "the save failed on rank 1 and the job ended (exit $rc) in $took s, under the 300 s collective timeout" \
  || bad "exit $rc after $took s: $(tail -5 "$T/b.log")"
grep -q "error on rank 1: rank 1: checkpoint save of step 6" "$T/b.log" \
  && ok "rank 1 names its cause: $(grep -o 'error on rank 1: .*' "$T/b.log" | head -1 | cut -c1-160)" \
  || bad "rank 1's message: $(grep -i error "$T/b.log" | head -3)"
grep -q "error on rank 0: checkpoint save of step 6 .* failed on rank 1" "$T/b.log" \
  && ok "rank 0 names the failed rank: $(grep -o 'error on rank 0: .*' "$T/b.log" | head -1 | cut -c1-160)" \
  || bad "rank 0's message: $(grep -i error "$T/b.log" | head -3)"
[ ! -e "$T/run/checkpoints/step-00000006" ] && [ "$(cat "$T/run/checkpoints/latest")" = "step-00000004" ] \
  && ok "step 6 was not committed; latest still names step-00000004" || bad "commit state: $(ls "$T/run/checkpoints")"
"$CKPT" verify "$T/run" > "$T/v.txt" 2>&1 && grep -q "step-00000004" "$T/v.txt" \
  && ok "the previous checkpoint verifies: $(cut -c1-100 "$T/v.txt")" || bad "verify: $(cat "$T/v.txt")"
"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${RUN[@]}" --set train.steps=6 --resume "$T/run" > "$T/c.log" 2>&1 \
  && grep -q "resumed from .*step-00000004 at step 4" "$T/c.log" && [ -f "$T/run/checkpoints/step-00000006/index.h5" ] \
  && ok "without the limit the run resumes from step 4 and saves step 6" || bad "resume: $(tail -5 "$T/c.log")"
rm -rf "$T"
finish
