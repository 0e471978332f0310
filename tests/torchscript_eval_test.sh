#!/usr/bin/env bash
# Evaluation on a TorchScript feature network during training (eval.features: torchscript)
# and on a checkpoint (shardgan-ckpt fid --feature-network), with pytorch-fid's Inception-v3
# at random weights (scripts/export_inception.py). Checks:
#  - a 2-rank DCGAN run writes evaluation records with finite fid, kid, kid_std, precision,
#    recall, is and is_std for G and its EMA, the network's description, kid_subset_size
#    and paper_comparable false (random weights, under 50,000 samples), no class fields;
#  - shardgan-ckpt fid --feature-network prints the same fields for the checkpoint;
#  - a missing network file is a config error naming eval.feature_network and the file, on
#    every rank, without a hang.
# Skips (77) when the Python cannot export the network (no torchvision or xxhash).
TRAIN=$1; CKPT=$2; SRC=$3; NET=$4
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-tseval.XXXXXX)
trap 'rm -rf "$T"' EXIT
if [ ! -f "$NET" ]; then
  $PY -c "import torchvision, xxhash" 2> /dev/null || { echo "SKIP: $PY cannot import torchvision and xxhash"; exit 77; }
  mkdir -p "$(dirname "$NET")"
  $PY "$SRC/scripts/export_inception.py" --random-weights --seed 1 -o "$NET.tmp" && mv "$NET.tmp" "$NET" \
    || { bad "export_inception.py failed"; finish; exit 1; }
fi
CFG="$SRC/configs/fmnist-dcgan.yaml"
RUN=(--set eval.enabled=true --set eval.features=torchscript --set eval.feature_network="$NET"
     --set train.eval_samples=16 --set eval.reference_samples=16 --set eval.kid_subsets=10 --set train.steps=2
     --set train.checkpoint_every=2 --set train.plots=false)
"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" "${RUN[@]}" --set run.dir="$T/r" > "$T/r.log" 2>&1 \
  && ok "2 ranks: training with Inception evaluations exits 0" || bad "2 ranks failed: $(tail -5 "$T/r.log")"
out=$($PY - "$T/r/metrics.jsonl" <<'PYEOF' 2>&1
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"fid"' in l]
assert rows, "no evaluation record"
r = rows[-1]
for s in ("", "_ema"):
    for k in ("fid", "kid", "kid_std", "precision", "recall", "is", "is_std"):
        assert math.isfinite(r[k + s]), (k + s, r.get(k + s))
    assert 0 <= r["precision" + s] <= 1 and 0 <= r["recall" + s] <= 1 and 1 <= r["is" + s] <= 1008, r
    assert "class_fractions" + s not in r and "class_acc" + s not in r, r
assert r["paper_comparable"] is False and r["kid_subset_size"] == 16, r
assert "pytorch-fid-inception-v3, random weights" in r["features"], r["features"]
print(f"record: FID {r['fid']:.4g}, KID {r['kid']:.3g} +- {r['kid_std']:.2g}, P {r['precision']:.3f}, "
      f"R {r['recall']:.3f}, IS {r['is']:.4f}; paper_comparable false")
PYEOF
) && ok "$out" || bad "$out"
"$CKPT" fid "$T/r" -n 16 --feature-network "$NET" --reference-samples 16 > "$T/fid.json" 2> "$T/fid.err" \
  || bad "shardgan-ckpt fid --feature-network: $(tail -3 "$T/fid.err")"
out=$($PY - "$T/fid.json" <<'PYEOF' 2>&1
import json, math, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
for k in ("fid", "kid", "precision", "recall", "is"):
    assert math.isfinite(j[k]), (k, j)
assert j["samples"] == 16 and j["paper_comparable"] is False and "classifier" not in j, j
print(f"shardgan-ckpt fid --feature-network: FID {j['fid']:.4g}, IS {j['is']:.4f}")
PYEOF
) && ok "$out" || bad "$out"
expect_fail "missing network file" "eval.feature_network: feature network $T/none.pt: no such file" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" "${RUN[@]}" --set eval.feature_network="$T/none.pt" \
  --set run.dir="$T/e"
finish
