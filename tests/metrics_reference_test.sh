#!/usr/bin/env bash
# docs/metrics.md against what runs write (the page itself equals `shardgan-train
# --metrics-reference`: ctest config_reference). Checks:
#   - every key of every line of metrics.jsonl is a field the page lists, read from the
#     page's tables (a per-model score may carry _trunc, _ema or _ema_trunc), for a tiny
#     StyleGAN2 with lazy R1, path length and ADA (training records), and a DCGAN with
#     evaluations of G and its EMA, untruncated and truncated (evaluation records);
#   - negative controls: the page check reports a planted unlisted key, and with
#     SHARDGAN_TEST_CONTROL=metrics_unlisted_field (log_step adds a field the page does not
#     list) the run ends non-zero naming the field and docs/metrics.md, and writes no line.
# Usage: metrics_reference_test.sh SHARDGAN_TRAIN SOURCE_DIR CLASSIFIER
TRAIN=$1; SRC=$2; CLASSIFIER=$3
PY=${SHARDGAN_PYTHON:-python3}
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-metrics.XXXXXX)
COMMON=(--set data.source=synthetic --set data.synthetic_size=32 --set train.global_batch=8
        --set train.log_every=1 --set train.sample_every=0 --set train.checkpoint_every=0
        --set train.final_checkpoint=false --set train.plots=false)
SG2=("$SRC/configs/fmnist-stylegan2.yaml" --set model.channel_base=512 --set model.channel_max=16
     --set model.z_dim=16 --set model.w_dim=16 --set model.mbstd_group=2 --set train.r1_every=2
     --set train.pl_weight=2 --set train.pl_every=2 --set augment.mode=ada --set augment.interval=1
     --set eval.enabled=false --set train.steps=3)
DCGAN=("$SRC/configs/fmnist-dcgan.yaml" --set ema.start_step=0 --set eval.enabled=true
       --set eval.classifier="$CLASSIFIER" --set eval.truncation=1.0 --set train.eval_every=2
       --set train.eval_samples=64 --set train.steps=2)
listed() {  # listed METRICS.JSONL...: every key of every line is on the page
  "$PY" - "$SRC/docs/metrics.md" "$@" <<'PY'
import json, re, sys
page = open(sys.argv[1]).read()
names = set()
for row in page.splitlines():
    if row.startswith("| `"):
        names.update(re.findall(r"`([a-z0-9_]+)`", row.split(" | ")[0]))
bad, keys = [], set()
for path in sys.argv[2:]:
    for line in open(path):
        for k in json.loads(line):
            keys.add(k)
            if k not in names:
                bad.append(f"{path}: '{k}'")
if bad:
    sys.exit("not on docs/metrics.md: " + ", ".join(sorted(set(bad))))
print(f"{len(keys)} keys written, all of them among the page's {len(names)} names")
PY
}
timeout 300 "${MPIRUN[@]}" -np 1 "$TRAIN" "${SG2[@]}" "${COMMON[@]}" --set run.dir="$T/sg2" > "$T/sg2.log" 2>&1 \
  || bad "StyleGAN2 run failed: $(tail -3 "$T/sg2.log")"
timeout 300 "${MPIRUN[@]}" -np 1 "$TRAIN" "${DCGAN[@]}" "${COMMON[@]}" --set run.dir="$T/dcgan" > "$T/dcgan.log" 2>&1 \
  || bad "DCGAN run with evaluations failed: $(tail -3 "$T/dcgan.log")"
for k in r1 pl pl_mean r_t ada_p ada_rt; do
  grep -q "\"$k\"" "$T/sg2/metrics.jsonl" 2> /dev/null || bad "the StyleGAN2 run wrote no '$k'"
done
for k in fid_trunc fid_ema fid_ema_trunc kid_ema class_fractions_ema; do
  grep -q "\"$k\"" "$T/dcgan/metrics.jsonl" 2> /dev/null || bad "the DCGAN run wrote no '$k'"
done
out=$(listed "$T/sg2/metrics.jsonl" "$T/dcgan/metrics.jsonl" 2>&1) && ok "$out" || bad "$out"
# the page check's own control: a planted key is reported
echo '{"step": 1, "loss_d": 0.5, "planted_unlisted_key": 1}' > "$T/planted.jsonl"
out=$(listed "$T/planted.jsonl" 2>&1) && bad "a planted key passed the page check: $out" \
  || { [[ $out == *planted_unlisted_key* ]] && ok "control: the page check reports a planted key" \
       || bad "control: the page check failed without naming the key: $out"; }
# the writer's control: a field the table lacks ends the run and is not written
SHARDGAN_TEST_CONTROL=metrics_unlisted_field expect_fail "control: log_step writes an unlisted field" \
  "'unlisted_control_field'): add them to metrics_fields()" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "${SG2[@]}" "${COMMON[@]}" --set train.steps=1 --set run.dir="$T/control"
if grep -qs unlisted_control_field "$T/control/metrics.jsonl"; then
  bad "control: the unlisted field was written"
else
  ok "control: no line with the unlisted field in metrics.jsonl"
fi
grep -q "docs/metrics.md" "$T/out.txt" || bad "control: the error does not name docs/metrics.md"
rm -rf "$T"
finish
