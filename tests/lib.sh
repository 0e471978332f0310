# Shared helpers for the shell-driven tests. Each test prints "N passed, M failed".
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PASSED=0
FAILED=0
ok()   { echo "PASS: $*"; PASSED=$((PASSED + 1)); }
bad()  { echo "FAIL: $*"; FAILED=$((FAILED + 1)); }
finish() { echo "$PASSED passed, $FAILED failed"; [ "$FAILED" -eq 0 ]; }
MPIRUN=(mpirun --oversubscribe)
# expect_fail NAME TEXT CMD...: CMD must exit non-zero within 90 s and print TEXT
# (its output goes to $T/out.txt).
expect_fail() {
  local name=$1 want=$2; shift 2
  timeout 90 "$@" > "$T/out.txt" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then bad "$name: exited 0"; return; fi
  if [ $rc -eq 124 ]; then bad "$name: hung"; return; fi
  if grep -qF -- "$want" "$T/out.txt"; then ok "$name: exit $rc: $(grep -F -- "$want" "$T/out.txt" | head -1 | cut -c1-220)"
  else bad "$name: exit $rc but no '$want' in: $(tail -5 "$T/out.txt")"; fi
}
# same_checkpoint A B [LABEL]: every rank file of checkpoint directory A equals B's bit for
# bit (h5diff, no tolerance) in /generator, /discriminator (parameters, optimizer state,
# EMA) and /rng; one ok/bad per rank and group, each naming LABEL.
same_checkpoint() {
  local a=$1 b=$2 label=${3:-} f r obj out
  out=$(mktemp)
  for f in "$a"/rank-*.h5; do
    r=$(basename "$f" .h5); r=${r#rank-}
    for obj in /generator /discriminator /rng; do
      # Split placement: a rank file holds only its group's model.
      if ! h5ls "$f$obj" > /dev/null 2>&1 && ! h5ls "$b/rank-$r.h5$obj" > /dev/null 2>&1; then continue; fi
      h5diff "$f" "$b/rank-$r.h5" $obj $obj > "$out" 2>&1 \
        && ok "rank $r $obj bitwise equal${label:+ $label}" || bad "rank $r $obj differs${label:+ $label}: $(head -3 "$out")"
    done
  done
  rm -f "$out"
}
# checkpoints_within A B RTOL LABEL: `$CKPT diff A B --rtol RTOL` (every tensor's max|a - b| /
# max|b|, parameters, optimizer state and EMA) passes; one ok/bad naming LABEL.
checkpoints_within() {
  local out
  out=$(mktemp)
  "$CKPT" diff "$1" "$2" --rtol "$3" > "$out" 2>&1 \
    && ok "$4 within $3: $(grep -m1 "max rel difference" "$out")" || bad "$4: $(tail -5 "$out")"
  rm -f "$out"
}
