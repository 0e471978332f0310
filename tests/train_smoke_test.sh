#!/usr/bin/env bash
# The main job on real Fashion-MNIST, shortened: 2 ranks, ZeRO-3, 10 steps. Checks the run
# directory holds samples, metrics and a committed checkpoint, and that losses are finite;
# then train.time_limit_s ends a long run early on both ranks.
TRAIN=$1; SRC=$3
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-smoke.XXXXXX)
"${MPIRUN[@]}" -np 2 "$TRAIN" "$SRC/configs/fmnist-dcgan.yaml" --set train.steps=10 --set train.log_every=5 \
  --set run.dir="$T/run" > "$T/log" 2>&1 && ok "training exits 0" || bad "training failed: $(tail -5 "$T/log")"
[ -s "$T/run/samples/samples-step-00000010.png" ] && ok "sample grid written" || bad "no sample grid"
[ "$(wc -l < "$T/run/metrics.jsonl")" -eq 2 ] && ok "two metrics lines" || bad "metrics.jsonl: $(cat "$T/run/metrics.jsonl")"
# Every loss of every line must be a finite number (nlohmann-json writes NaN and Inf as null).
"$SHARDGAN_PYTHON" - "$T/run/metrics.jsonl" > "$T/f.txt" 2>&1 <<'PYEOF' && ok "$(cat "$T/f.txt")" || bad "losses: $(cat "$T/f.txt")"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = [k for k in rows[0] if k.startswith("loss")]
assert {"loss_d", "loss_g"} <= set(keys), f"no loss_d/loss_g in {rows[0]}"
bad = [(r["step"], k, r[k]) for r in rows for k in keys if not isinstance(r[k], (int, float)) or not math.isfinite(r[k])]
assert not bad, f"non-finite: {bad}"
print(f"every loss finite: {keys} over {len(rows)} lines")
PYEOF
[ "$(cat "$T/run/checkpoints/latest")" = "step-00000010" ] && ok "latest names step 10" || bad "latest pointer wrong"
[ -f "$T/run/checkpoints/step-00000010/rank-00001.h5" ] && ok "rank files present" || bad "rank files missing"
h5dump -a /step "$T/run/checkpoints/step-00000010/rank-00000.h5" | grep -q "(0): 10" && ok "h5dump reads the step" || bad "h5dump cannot read step"
tail -3 "$T/log" | grep -q "checkpoints:" && ok "last lines say where outputs are" || bad "no closing summary"
# The end-of-run summary (issue 11): steps and wall time, plots, and peak RSS of each rank.
grep -q "done: step 10; this run trained 10 steps in" "$T/log" && ok "summary: steps and wall time" || bad "summary: no steps line"
grep -Eq "peak RSS: +\[[0-9.]+, [0-9.]+\] GiB per rank" "$T/log" && ok "summary: peak RSS of both ranks" \
  || bad "summary: no per-rank peak RSS"
for p in losses d_outputs step_time; do
  [ -s "$T/run/plots/$p.png" ] && ok "plots/$p.png written" || bad "no plots/$p.png: $(cat "$T/run/plots/gnuplot.log" 2>/dev/null)"
done
# Into a file there is no progress line (mpirun gives every rank a pseudo-terminal, so this
# checks that shardgan asks about mpirun's stdout); on a terminal (script's pty) there is.
# Shown to fail: SHARDGAN_PROGRESS=1 (always draw) fails the first check, SHARDGAN_PROGRESS=0
# (never draw) the second.
! grep -q "ETA" "$T/log" && ok "no progress line when mpirun writes to a file" || bad "progress line in a file"
if command -v script > /dev/null; then
  script -qec "${MPIRUN[*]} -np 2 $TRAIN $SRC/configs/fmnist-dcgan.yaml --set train.steps=3 --set run.dir=$T/tty \
    --set data.source=synthetic --set train.plots=false" "$T/tty.txt" > /dev/null 2>&1
  grep -q "step 3/3 (100%) | loss_D" "$T/tty.txt" && ok "progress line on a terminal" || bad "no progress line on a pty: $(tail -3 "$T/tty.txt")"
fi
# train.time_limit_s: both ranks stop after the same step once rank 0's clock passes the
# limit, then save, sample and summarize as at train.steps; also when that step already
# saved a periodic checkpoint (checkpoint_every 1: one save of it, no second).
# Shown to fail (2026-11-28): with the vote's time_up ignored, the run trained on to the
# timeout (124).
for every in 0 1; do
  timeout 120 "${MPIRUN[@]}" -np 2 "$TRAIN" "$SRC/configs/fmnist-dcgan.yaml" --set train.steps=1000000 \
    --set train.time_limit_s=3 --set train.checkpoint_every=$every --set data.source=synthetic --set train.plots=false \
    --set run.dir="$T/tl$every" > "$T/tl$every.log" 2>&1; rc=$?
  step=$(sed -n 's/.*train.time_limit_s: 3 s reached after step \([0-9]*\) of 1000000.*/\1/p' "$T/tl$every.log")
  if [ $rc -eq 0 ] && [ -n "$step" ] && [ "$step" -gt 0 ] \
     && [ "$(cat "$T/tl$every/checkpoints/latest")" = "$(printf 'step-%08d' "$step")" ] \
     && [ -s "$T/tl$every/samples/samples-step-$(printf '%08d' "$step").png" ] \
     && grep -q "done: step $step; this run trained $step steps in" "$T/tl$every.log"; then
    ok "train.time_limit_s 3 (checkpoint_every $every): both ranks stopped after step $step, saved and sampled it"
  else
    bad "train.time_limit_s (checkpoint_every $every): rc $rc, step '$step': $(tail -4 "$T/tl$every.log")"
  fi
done
# train.final_checkpoint false: no save at the end (the periodic one at step 2 stays), and
# the summary says so. Shown to fail (2026-11-28): with the key ignored, step 3 was saved.
"${MPIRUN[@]}" -np 2 "$TRAIN" "$SRC/configs/fmnist-dcgan.yaml" --set train.steps=3 --set train.checkpoint_every=2 \
  --set train.final_checkpoint=false --set data.source=synthetic --set train.plots=false --set run.dir="$T/nofinal" \
  > "$T/nofinal.log" 2>&1; rc=$?
[ $rc -eq 0 ] && [ "$(ls "$T/nofinal/checkpoints" | grep -c '^step-')" -eq 1 ] \
  && [ "$(cat "$T/nofinal/checkpoints/latest")" = "step-00000002" ] && grep -q "done: step 3;" "$T/nofinal.log" \
  && ok "train.final_checkpoint false: only the periodic step-2 checkpoint saved" \
  || bad "train.final_checkpoint false: rc $rc, $(ls "$T/nofinal/checkpoints" 2>&1)"
rm -rf "$T"
finish
