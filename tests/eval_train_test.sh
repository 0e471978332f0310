#!/usr/bin/env bash
# FID during training (eval.enabled) and on a checkpoint (shardgan-ckpt fid), with the
# classifier of the fid_classifier fixture. Checks:
#  - every evaluation line in metrics.jsonl has a finite fid and fid_ema, 10 class fractions
#    summing to 1, and eval_samples = train.eval_samples rounded up to the ranks;
#  - evaluation never changes training: the checkpoint of a run with evaluations equals, bit
#    for bit (`shardgan-ckpt diff --rtol 0`: parameters, buffers, optimizer state, EMA), the
#    one of the same run without (the evaluation runs G in train mode, which updates
#    BatchNorm's running statistics, and must restore every buffer it touches);
#  - on 1 rank, `shardgan-ckpt fid` (and `fid --ema`) of the final checkpoint equals the
#    trainer's final evaluation of G (and of its EMA): same latents, same chunks of 64, same
#    weights. Bound 1e-9 relative: both sum the same float64 moments in the same order, so
#    only the eigendecomposition's rounding could differ (observed: identical);
#  - eval.truncation (BigGAN's truncation trick, here on DCGAN's Gaussian latents): the
#    trainer's record adds fid_trunc and fid_ema_trunc, which equal `shardgan-ckpt fid
#    --truncation 1.0` (and --ema) of its checkpoint and differ from the untruncated FIDs;
#    its untruncated fid equals the run without truncation's (same training, same latents);
#  - on 2 ranks the evaluation runs (equal shares, one all-reduce) and gives a finite FID;
#  - a missing classifier is a config error naming eval.classifier on every rank.
# Shown to fail (2026-11-23, one throwaway build with both breaks): without the buffer
# restore in Evaluator::evaluate, the diff against the run without evaluations reported
# "max rel difference 4.053 over 74 tensors" (G's and D's BatchNorm running statistics);
# without the EmaSwap in Trainer::evaluate, "trainer fid_ema 957.99 vs shardgan-ckpt fid
# 955.69: rel 0.0024" (fid_ema was G's own FID).
TRAIN=$1; CKPT=$2; SRC=$3; CLASSIFIER=$4
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-eval.XXXXXX)
CFG="$SRC/configs/fmnist-dcgan.yaml"
EVAL=(--set eval.enabled=true --set eval.classifier="$CLASSIFIER" --set train.eval_every=2 --set train.eval_samples=130
      --set train.steps=3 --set train.checkpoint_every=0 --set train.plots=false)
check_metrics() {  # run-dir expected-samples
  $PY - "$1/metrics.jsonl" "$2" <<'PYEOF'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"fid"' in l]
assert [r["step"] for r in rows] == [2, 3], f"evaluation steps {[r['step'] for r in rows]}"
for r in rows:
    assert math.isfinite(r["fid"]) and math.isfinite(r["fid_ema"]) and r["fid"] > 0, r
    for k in ("class_fractions", "class_fractions_ema"):
        assert len(r[k]) == 10 and abs(sum(r[k]) - 1) < 1e-12, r[k]
    assert r["eval_samples"] == int(sys.argv[2]), r["eval_samples"]
print(f"evaluations at steps 2 and 3, FID {rows[-1]['fid']:.2f}, EMA {rows[-1]['fid_ema']:.2f}")
PYEOF
}
"${MPIRUN[@]}" -np 1 "$TRAIN" "$CFG" "${SMALL[@]}" "${EVAL[@]}" --set run.dir="$T/r1" > "$T/r1.log" 2>&1 \
  && ok "1 rank: training with evaluations exits 0" || bad "1 rank failed: $(tail -5 "$T/r1.log")"
out=$(check_metrics "$T/r1" 130 2>&1) && ok "1 rank: $out" || bad "1 rank metrics: $out"
"${MPIRUN[@]}" -np 1 "$TRAIN" "$CFG" "${SMALL[@]}" "${EVAL[@]}" --set eval.enabled=false --set run.dir="$T/r0" \
  > "$T/r0.log" 2>&1 || bad "1 rank without evaluations failed: $(tail -5 "$T/r0.log")"
"$CKPT" diff "$T/r1" "$T/r0" --rtol 0 > "$T/diff.txt" 2>&1 && grep -q "max rel difference 0 over" "$T/diff.txt" \
  && ok "evaluations leave training unchanged: $(grep "max rel difference" "$T/diff.txt")" \
  || bad "evaluations changed training: $(grep -v " 0 *0$" "$T/diff.txt" | tail -5)"
for which in "" --ema; do
  key=fid; [ -n "$which" ] && key=fid_ema
  "$CKPT" fid "$T/r1" $which -n 130 --classifier "$CLASSIFIER" > "$T/fid.json" 2> "$T/fid.err" \
    || bad "shardgan-ckpt fid $which: $(cat "$T/fid.err")"
  out=$($PY - "$T/r1/metrics.jsonl" "$T/fid.json" "$key" <<'PYEOF' 2>&1
import json, sys
key = sys.argv[3]
train = [json.loads(l) for l in open(sys.argv[1]) if '"fid"' in l][-1]
tool = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
rel = abs(train[key] - tool["fid"]) / train[key]
assert tool["step"] == 3 and tool["samples"] == 130, tool
assert rel <= 1e-9, f"trainer {key} {train[key]!r} vs shardgan-ckpt fid {tool['fid']!r}: rel {rel:.3g}"
frac = "class_fractions" + ("_ema" if key == "fid_ema" else "")
assert train[frac] == tool["class_fractions"], (train[frac], tool["class_fractions"])
print(f"shardgan-ckpt fid equals the trainer's final {key} (rel {rel:.2g})")
PYEOF
) && ok "$out" || bad "$out"
done
"${MPIRUN[@]}" -np 1 "$TRAIN" "$CFG" "${SMALL[@]}" "${EVAL[@]}" --set eval.truncation=1.0 --set run.dir="$T/rt" \
  > "$T/rt.log" 2>&1 || bad "1 rank with eval.truncation failed: $(tail -5 "$T/rt.log")"
"$CKPT" fid "$T/rt" -n 130 --classifier "$CLASSIFIER" --truncation 1.0 > "$T/t_g.json" 2>&1 || bad "fid --truncation: $(cat "$T/t_g.json")"
"$CKPT" fid "$T/rt" --ema -n 130 --classifier "$CLASSIFIER" --truncation 1.0 > "$T/t_e.json" 2>&1 || bad "fid --ema --truncation"
out=$($PY - "$T/rt/metrics.jsonl" "$T/r1/metrics.jsonl" "$T/t_g.json" "$T/t_e.json" <<'PYEOF' 2>&1
import json, sys
last = lambda f: [json.loads(l) for l in open(f) if '"fid"' in l][-1]
trunc, plain = last(sys.argv[1]), last(sys.argv[2])
tool_g, tool_e = (json.loads(open(f).read().strip().splitlines()[-1]) for f in sys.argv[3:5])
assert trunc["truncation"] == 1.0 and "truncation" not in plain and "fid_trunc" not in plain, plain
assert trunc["fid"] == plain["fid"] and trunc["fid_ema"] == plain["fid_ema"], (trunc["fid"], plain["fid"])
for key, tool in (("fid_trunc", tool_g), ("fid_ema_trunc", tool_e)):
    assert tool["truncation"] == 1.0, tool
    assert abs(tool["fid"] - trunc[key]) <= 1e-9 * trunc[key], (key, trunc[key], tool["fid"])
    assert abs(trunc[key] - plain[key[:-6]]) > 1e-3 * plain[key[:-6]], ("truncation changed nothing", key)
print(f"truncated at 1.0: FID {trunc['fid_trunc']:.2f} / EMA {trunc['fid_ema_trunc']:.2f} (untruncated "
      f"{plain['fid']:.2f} / {plain['fid_ema']:.2f}), equal to shardgan-ckpt fid --truncation 1.0")
PYEOF
) && ok "$out" || bad "$out"
"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" "${EVAL[@]}" --set run.dir="$T/r2" > "$T/r2.log" 2>&1 \
  && ok "2 ranks: training with evaluations exits 0" || bad "2 ranks failed: $(tail -5 "$T/r2.log")"
out=$(check_metrics "$T/r2" 130 2>&1) && ok "2 ranks: $out" || bad "2 ranks metrics: $out"
expect_fail "missing classifier" "eval.classifier" "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" "${EVAL[@]}" \
  --set eval.classifier="$T/none.h5" --set run.dir="$T/r3"
[ "$(grep -c "error on rank" "$T/out.txt")" -eq 2 ] && ok "missing classifier: both ranks report it" \
  || bad "missing classifier: $(grep -c "error on rank" "$T/out.txt") ranks reported it"
rm -rf "$T"
finish
