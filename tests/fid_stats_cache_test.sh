#!/usr/bin/env bash
# The reference statistics cache (eval.reference_cache, `shardgan-fid stats`; docs/fid.md),
# with the classifier of the fid_classifier fixture. Checks:
#  - `shardgan-fid stats` writes a file h5py reads (mean, cov, features, the two hashes);
#  - a 2-rank run that reuses it gives the FID of a run that featurizes the reference itself
#    (within 1e-9 relative: the same features, moments merged over 1 or 2 ranks), and says so;
#  - a run whose cache file is missing writes it, and a second run reuses it bit for bit;
#  - a stale cache is refused with the file named, non-zero on every rank, no hang: other
#    reference images (eval.reference_samples changed) and another network (a second
#    classifier);
#  - a file that is not a statistics file is refused naming it.
TRAIN=$1; FID=$2; SRC=$3; CLASSIFIER=$4
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-stats.XXXXXX)
trap 'rm -rf "$T"' EXIT
CFG="$SRC/configs/fmnist-dcgan.yaml"
FM=$FMNIST
RUN=(--set eval.enabled=true --set eval.classifier="$CLASSIFIER" --set train.eval_samples=128
     --set eval.reference_samples=600 --set train.steps=2 --set train.checkpoint_every=0 --set train.plots=false
     --set eval.kid_subsets=10)
fid_of() { $PY -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if '\"fid\"' in l][-1]['fid'])" "$1/metrics.jsonl"; }

"$FID" stats "$FM" -o "$T/ref.h5" --classifier "$CLASSIFIER" --reference-samples 600 > "$T/stats.json" 2>&1 \
  && ok "shardgan-fid stats: $(cut -c1-200 "$T/stats.json")" || bad "shardgan-fid stats: $(tail -3 "$T/stats.json")"
out=$($PY - "$T/ref.h5" <<'PYEOF' 2>&1
import sys, h5py, numpy as np
text = lambda v: v.decode() if isinstance(v, bytes) else str(v)
with h5py.File(sys.argv[1], "r") as f:
    assert text(f.attrs["format"]) == "shardgan-fid-stats" and f.attrs["count"] == 600, dict(f.attrs)
    assert f["features"].shape == (600, 128) and f["cov"].shape == (128, 128), f["features"].shape
    mean = f["features"][()].astype(np.float64).mean(0)
    assert np.allclose(mean, f["mean"][()], rtol=0, atol=1e-9 * np.abs(mean).max()), "mean differs from the features'"
    print(f"h5py reads it: count 600, network {text(f.attrs['network_xxh3'])}, images {text(f.attrs['images_xxh3'])}")
PYEOF
) && ok "$out" || bad "$out"

"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" "${RUN[@]}" --set run.dir="$T/plain" > "$T/plain.log" 2>&1 \
  || bad "2 ranks without a cache failed: $(tail -3 "$T/plain.log")"
"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" "${RUN[@]}" --set eval.reference_cache="$T/ref.h5" \
  --set run.dir="$T/cached" > "$T/cached.log" 2>&1 || bad "2 ranks with the cache failed: $(tail -3 "$T/cached.log")"
grep -q "reference features from $T/ref.h5" "$T/cached.log" && ok "the run reads the cache" || bad "no 'reference features from' line"
a=$(fid_of "$T/plain"); b=$(fid_of "$T/cached")
$PY -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(abs(a-b) > 1e-9*abs(a))" "$a" "$b" \
  && ok "FID with the cache $b equals the FID without $a (1e-9)" || bad "FID with the cache $b, without $a"

"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" "${RUN[@]}" --set eval.reference_cache="$T/new.h5" \
  --set run.dir="$T/w1" > "$T/w1.log" 2>&1 && [ -f "$T/new.h5" ] && ok "a missing cache is written" \
  || bad "cache not written: $(tail -3 "$T/w1.log")"
"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" "${RUN[@]}" --set eval.reference_cache="$T/new.h5" \
  --set run.dir="$T/w2" > "$T/w2.log" 2>&1 || bad "reusing the written cache failed: $(tail -3 "$T/w2.log")"
[ "$(fid_of "$T/w1")" = "$(fid_of "$T/w2")" ] && ok "the written cache is reused bit for bit (FID $(fid_of "$T/w2"))" \
  || bad "FID $(fid_of "$T/w1") then $(fid_of "$T/w2")"

expect_fail "stale cache (other images)" "reference statistics $T/ref.h5: computed on images" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" "${RUN[@]}" --set eval.reference_cache="$T/ref.h5" \
  --set eval.reference_samples=500 --set run.dir="$T/s1"
"$FID" train-classifier -o "$T/other.h5" --epochs 1 --limit 600 --min-accuracy 0 --seed 2 > "$T/other.log" 2>&1 \
  || bad "second classifier: $(tail -2 "$T/other.log")"
expect_fail "stale cache (other network)" "computed with the feature network of weights xxh3" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" "${RUN[@]}" --set eval.reference_cache="$T/ref.h5" \
  --set eval.classifier="$T/other.h5" --set run.dir="$T/s2"
echo "not hdf5" > "$T/junk.h5"
expect_fail "not a statistics file" "reference statistics $T/junk.h5: not a readable HDF5 file" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${SMALL[@]}" "${RUN[@]}" --set eval.reference_cache="$T/junk.h5" \
  --set run.dir="$T/s3"
finish
