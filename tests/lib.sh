# Shared helpers for the shell-driven tests. Each test prints "N passed, M failed".
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PASSED=0
FAILED=0
ok()   { echo "PASS: $*"; PASSED=$((PASSED + 1)); }
bad()  { echo "FAIL: $*"; FAILED=$((FAILED + 1)); }
finish() { echo "$PASSED passed, $FAILED failed"; [ "$FAILED" -eq 0 ]; }
MPIRUN=(mpirun --oversubscribe)
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
