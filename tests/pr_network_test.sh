#!/usr/bin/env bash
# Precision and recall on a second network (eval.pr_feature_network; docs/fid.md). The main
# network is the classifier of the fid_classifier fixture; the second is a stand-in with
# NVIDIA's vgg16.pt interface and 4 features (tests/stylegan2_detector_ref.py: no manifest,
# uint8 input), under which real and generated images share neighbourhoods.
# On 2 ranks, 2 steps of the tiny synthetic DCGAN, each evaluation on 128 samples:
#  - with eval.pr_feature_network, the record names the second network in pr_features; FID,
#    KID and the class fractions equal the run without it bit for bit (the same features);
#    precision and recall equal those of a run whose main network is the stand-in itself
#    (eval.features torchscript): they are computed on its features, not the classifier's;
#    at least one of them lies strictly between 0 and 1;
#  - `shardgan-ckpt fid --pr-network` on the checkpoint writes pr_features, finite figures;
#  - a file with neither a manifest nor a detector interface is refused on every rank,
#    naming eval.pr_feature_network and the file, with a non-zero exit.
# Control (pr_network_control, WILL_FAIL): SHARDGAN_TEST_CONTROL=pr_main_features keeps
# precision/recall on the main network's features, so the equality with the stand-in's fails.
TRAIN=$1; CKPT=$2; SRC=$3; CLASSIFIER=$4
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-prnet.XXXXXX)
trap 'rm -rf "$T"' EXIT
if ! py_has "$PY" torch numpy; then
  echo "SKIP: $PY has no torch or numpy (scripts/setup-dev.sh installs them)"; exit 77
fi
mkdir -p "$T/img"
printf "n 2\nchannels 1\nheight 32\nwidth 32\n" > "$T/img/meta.txt"
$PY -c "import numpy as np; np.zeros(2 * 32 * 32, '<f4').tofile('$T/img/images.f32')"
$PY "$SRC/tests/stylegan2_detector_ref.py" "$T" "$T/img" > "$T/standin.log" 2>&1 \
  || { bad "stand-ins: $(tail -3 "$T/standin.log")"; finish; exit; }
CFG="$SRC/configs/fmnist-dcgan.yaml"
RUN=(--set eval.enabled=true --set eval.classifier="$CLASSIFIER" --set train.eval_samples=128
     --set eval.reference_samples=300 --set train.steps=2 --set train.checkpoint_every=2 --set train.plots=false
     --set eval.kid_subsets=10 --set ema.enabled=false)
last_eval() { $PY -c "import json,sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1]) if '\"fid\"' in l][-1]))" \
  "$1/metrics.jsonl"; }
train() {  # name, overrides...
  local name=$1; shift
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" "${RUN[@]}" --set run.dir="$T/$name" "$@" > "$T/$name.log" 2>&1 \
    || bad "$name: $(tail -3 "$T/$name.log")"
}
train plain
train pr --set eval.pr_feature_network="$T/vgg16_coarse.pt"
train standin --set eval.features=torchscript --set eval.feature_network="$T/vgg16_coarse.pt"
out=$($PY - "$(last_eval "$T/plain")" "$(last_eval "$T/pr")" "$(last_eval "$T/standin")" "$T/vgg16_coarse.pt" <<'PYEOF' 2>&1
import json, math, sys
plain, pr, standin = (json.loads(a) for a in sys.argv[1:4])
errors = []
if sys.argv[4] not in pr.get("pr_features", "") or "VGG16" not in pr.get("pr_features", ""):
    errors.append(f"pr_features does not name the stand-in: {pr.get('pr_features')!r}")
if "pr_features" in plain:
    errors.append("a run without eval.pr_feature_network wrote pr_features")
for k in ("fid", "kid", "kid_std", "class_fractions", "features"):
    if plain.get(k) != pr.get(k):
        errors.append(f"{k} changed with the second network: {plain.get(k)} -> {pr.get(k)}")
for k in ("precision", "recall"):
    if not (0 <= pr[k] <= 1 and math.isfinite(pr[k])):
        errors.append(f"{k} {pr[k]} out of [0, 1]")
    if pr[k] != standin[k]:
        errors.append(f"MISMATCH {k} {pr[k]} on the second network, {standin[k]} with the stand-in as main network")
if not any(0 < pr[k] < 1 for k in ("precision", "recall")):
    errors.append(f"precision {pr['precision']} and recall {pr['recall']} are both 0 or 1: the equality shows little")
if (pr["precision"], pr["recall"]) == (plain["precision"], plain["recall"]):
    errors.append("precision and recall equal the classifier's: the second network changed nothing")
print("; ".join(errors) if errors else
      f"fid {pr['fid']:.4g} and kid {pr['kid']:.4g} unchanged; precision/recall {pr['precision']}/{pr['recall']} on the "
      f"stand-in (classifier's {plain['precision']}/{plain['recall']}), equal to the stand-in as main network")
sys.exit(1 if errors else 0)
PYEOF
) && ok "$out" || bad "$out"
"$CKPT" fid "$T/pr" -n 64 --reference-samples 200 --pr-network "$T/vgg16_coarse.pt" > "$T/ckpt.json" 2> "$T/ckpt.err" \
  && $PY -c "
import json, math, sys
j = json.loads(open(sys.argv[1]).read().splitlines()[-1])
assert 'VGG16' in j['pr_features'] and math.isfinite(j['precision']) and math.isfinite(j['fid']), j
print(j['precision'], j['recall'])" "$T/ckpt.json" > "$T/ckpt.check" 2>&1 \
  && ok "shardgan-ckpt fid --pr-network: precision/recall $(cat "$T/ckpt.check")" \
  || bad "shardgan-ckpt fid --pr-network: $(tail -3 "$T/ckpt.err" "$T/ckpt.json" "$T/ckpt.check" 2>/dev/null)"
expect_fail "no manifest, no detector interface" "eval.pr_feature_network: feature network $T/plain.pt" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" "${RUN[@]}" --set run.dir="$T/refused" \
  --set eval.pr_feature_network="$T/plain.pt"
finish
