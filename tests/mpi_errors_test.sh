#!/usr/bin/env bash
# ctest mpi_errors: MPI errors that speak.
#  1. tests/test_mpi_errors on 2 ranks: a truncated receive is a CollectiveError naming the
#     call, the communicator, the peer and MPI_ERR_TRUNCATE (MPI_ERRORS_RETURN), not an
#     abort inside MPI.
#  2. Split placement with images of another shape on D's ranks than on G's (the test-only
#     switch split_shape_mismatch: D's ranks expect one more channel) on 3 ranks: every rank
#     exits non-zero within 60 s before any image is sent, and the error names both shapes.
#     Without the check D's ranks would receive a shorter message into a larger buffer,
#     which MPI completes without an error.
TEST_BIN=$1; TRAIN=$2; SRC=$3
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-mpierr.XXXXXX)
if timeout 60 "${MPIRUN[@]}" -np 2 "$TEST_BIN" > "$T/gtest.log" 2>&1 < /dev/null; then
  ok "truncated receive and named communicators: $(grep -c '\[       OK \]' "$T/gtest.log") cases passed"
else
  bad "test_mpi_errors: $(grep -m3 -E 'Failure|error|abort' "$T/gtest.log")"
fi
ARGS=("$SRC/configs/fmnist-biggan.yaml" --set model.ch=8 --set model.d_ch=8 --set model.z_dim=8 --set model.shared_dim=8
      --set eval.enabled=false --set data.source=synthetic --set data.synthetic_size=48 --set train.global_batch=12
      --set train.steps=2 --set train.plots=false --set train.skip_memory_check=true --set train.checkpoint_every=0
      --set train.final_checkpoint=false --set train.placement=split --set placement.generator_ranks=1
      --set run.dir="$T/run")
start=$(date +%s)
SHARDGAN_TEST_CONTROL=split_shape_mismatch timeout 60 "${MPIRUN[@]}" -np 3 -x SHARDGAN_TEST_CONTROL "$TRAIN" "${ARGS[@]}" \
  > "$T/split.log" 2>&1 < /dev/null
rc=$?
secs=$(( $(date +%s) - start ))
[ $rc -ne 0 ] && [ $rc -ne 124 ] && ok "split placement with mismatched image shapes: exit $rc after $secs s" \
  || bad "split placement with mismatched image shapes: exit $rc after $secs s (0: trained on; 124: hung)"
n=$(grep -c "would not fit: rank 0 (G's) has \[[0-9]* per micro-batch, [0-9]*, 32, 32\] [A-Za-z0-9]*, rank 1 (D's) \[[0-9]* per micro-batch, " "$T/split.log")
[ "$n" = 3 ] && ok "every rank (3) names both shapes" \
  || bad "$n of 3 ranks named both shapes: $(grep -m3 -i "error" "$T/split.log")"
grep -q '"loss_d"' "$T/run/metrics.jsonl" 2> /dev/null && bad "a step ran with mismatched shapes" || ok "no step ran"
rm -rf "$T"
finish
