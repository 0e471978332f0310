#!/usr/bin/env bash
# shardgan as a user without root: run as root (CI), everything below runs as `nobody`
# through runuser, with no OMPI_ALLOW_RUN_AS_ROOT and no skip variables; run by another user,
# as that user. Checks:
#  - a 2-rank training step (ZeRO-3 DCGAN, synthetic data) and a checkpoint;
#  - the KID/precision/IS test executable (its known-answer and refusal cases);
#  - the two root-only tests, the Slurm cluster and the network-namespace hosts, report
#    skipped (exit 77) with a reason naming root, instead of failing.
TRAIN=$1; SRC=$2; FEATURES_TEST=$3
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-unpriv.XXXXXX)
trap 'rm -rf "$T"' EXIT
PYBIN=${SHARDGAN_PYTHON:-$SRC/.venv/bin/python}
if [ "$(id -u)" -eq 0 ]; then
  command -v runuser > /dev/null || { echo "SKIP: no runuser to drop root"; exit 77; }
  chmod 755 "$T"; chown nobody "$T"
  AS=(runuser -u nobody --)
  who=nobody
else
  AS=()
  who=$(id -un)
fi
# A clean environment: no root allowances, no skip switches.
ENV=(env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$T" TMPDIR="$T" SHARDGAN_PYTHON="$PYBIN" OMP_NUM_THREADS=1)
"${AS[@]}" "${ENV[@]}" true 2> "$T/err" || { echo "SKIP: cannot run as $who: $(cat "$T/err")"; exit 77; }
# A checkout inside a private home (/root) cannot be reached by another user: nothing to test.
"${AS[@]}" "${ENV[@]}" test -x "$TRAIN" -a -r "$SRC/configs/fmnist-dcgan.yaml" \
  || { echo "SKIP: $who cannot reach $TRAIN or $SRC (a checkout inside a private home); clone elsewhere to run it"
       exit 77; }
"${AS[@]}" "${ENV[@]}" mpirun --oversubscribe -np 2 "$TRAIN" "$SRC/configs/fmnist-dcgan.yaml" \
  --set data.source=synthetic --set data.synthetic_size=64 --set train.global_batch=8 --set model.z_dim=16 \
  --set model.g_width=8 --set model.d_width=8 --set train.steps=1 --set train.checkpoint_every=1 \
  --set train.sample_every=0 --set train.plots=false --set run.dir="$T/run" > "$T/train.log" 2>&1 \
  && [ -d "$T/run/checkpoints/step-00000001" ] && ok "as $who: a 2-rank ZeRO-3 step and its checkpoint" \
  || bad "as $who: training failed: $(tail -5 "$T/train.log")"
# Without the Python comparison: .venv's interpreter may link into root's home (pyenv), which
# another user cannot enter; the known-answer and refusal cases need no Python.
"${AS[@]}" "${ENV[@]}" "$FEATURES_TEST" --gtest_filter=-FeatureMetrics.MatchesFloat64Python > "$T/features.log" 2>&1 \
  && ok "as $who: $(grep -E "tests? ran|PASSED" "$T/features.log" | tail -1)" \
  || bad "as $who: test_feature_metrics failed: $(tail -5 "$T/features.log")"
for t in slurm_test multihost_test; do
  "${AS[@]}" "${ENV[@]}" bash "$SRC/tests/$t.sh" "$TRAIN" /nonexistent "$SRC" > "$T/$t.log" 2>&1
  rc=$?
  reason=$(grep -m1 "^SKIP:" "$T/$t.log")
  [ $rc -eq 77 ] && [[ $reason == *root* ]] && ok "as $who: $t skipped: ${reason#SKIP: }" \
    || bad "as $who: $t exit $rc, not a skip naming root: $(tail -3 "$T/$t.log")"
done
finish
