# Helpers for the checkpoint shell tests: a tiny synthetic run.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PY=${SHARDGAN_PYTHON:?set by ctest: the .venv Python with h5py and numpy}
SMALL=(--set ema.start_step=0 --set data.source=synthetic --set data.synthetic_size=96 --set train.global_batch=12
       --set model.z_dim=16 --set model.g_width=8 --set model.d_width=8 --set train.log_every=1
       --set train.sample_every=0 --set run.seed=5)
# expect_fail NAME TEXT CMD...: CMD must exit non-zero within 90 s and print TEXT.
expect_fail() {
  local name=$1 want=$2; shift 2
  timeout 90 "$@" > "$T/out.txt" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then bad "$name: exited 0"; return; fi
  if [ $rc -eq 124 ]; then bad "$name: hung"; return; fi
  if grep -qF -- "$want" "$T/out.txt"; then ok "$name: exit $rc: $(grep -F -- "$want" "$T/out.txt" | head -1 | cut -c1-220)"
  else bad "$name: exit $rc but no '$want' in: $(tail -5 "$T/out.txt")"; fi
}
