# Shared helpers for the shell-driven tests. Each test prints "N passed, M failed".
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PASSED=0
FAILED=0
ok()   { echo "PASS: $*"; PASSED=$((PASSED + 1)); }
bad()  { echo "FAIL: $*"; FAILED=$((FAILED + 1)); }
finish() { echo "$PASSED passed, $FAILED failed"; [ "$FAILED" -eq 0 ]; }
# py_has PY MODULE...: whether PY has these modules installed, without importing them
# (importing torch and torchvision takes seconds; a broken install then fails the test
# that uses it instead of skipping it).
py_has() {
  "$1" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))" "${@:2}" \
    2> /dev/null
}
MPIRUN=(mpirun --oversubscribe)
# Fashion-MNIST's folder: Debian's, or the CMake option SHARDGAN_FMNIST_DIR (docs/install.md).
FMNIST=${SHARDGAN_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
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
# Python with h5py and numpy for the checkpoint helpers: ctest's SHARDGAN_PYTHON, else the
# checkout's .venv.
LIB_PY=${SHARDGAN_PYTHON:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/python}
# rank_files DIR: the names of DIR's rank-*.h5 files, sorted, one a line; nothing when DIR
# is missing or holds none.
rank_files() { (shopt -s nullglob; cd "$1" 2> /dev/null || exit 0; for f in rank-*.h5; do echo "$f"; done); }
# nonfinite_in DIR...: every floating-point dataset under /generator, /discriminator and
# /rng of each DIR's rank files is finite; otherwise prints one line per dataset with a NaN
# or an infinity (file, path, counts) and returns 1. A file h5py cannot read returns 1 too.
nonfinite_in() {
  "$LIB_PY" - "$@" 2>&1 <<'PY'
import glob, sys
import h5py, numpy as np
bad = []
for d in sys.argv[1:]:
    for path in sorted(glob.glob(f"{d}/rank-*.h5")):
        with h5py.File(path, "r") as f:
            def visit(name, obj):
                if isinstance(obj, h5py.Dataset) and obj.dtype.kind == "f":
                    x = np.asarray(obj[()])
                    n, i = int(np.isnan(x).sum()), int(np.isinf(x).sum())
                    if n or i:
                        bad.append(f"{path}:/{obj.name.lstrip('/')}: {n} NaN, {i} infinite of {x.size}")
            for g in ("generator", "discriminator", "rng"):
                if g in f:
                    f[g].visititems(visit)
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
}
# same_checkpoint A B [LABEL]: checkpoint directories A and B hold the same non-empty set of
# rank files, no NaN or infinity in any floating-point dataset of /generator, /discriminator
# or /rng on either side, and every rank file of A equals B's bit for bit (h5diff, no
# tolerance) in those groups (parameters, optimizer state, EMA, RNG). h5diff counts a NaN
# equal to a NaN, so the NaN check is separate: two runs that diverge to NaN in the same
# places are a failure, not a match. One ok/bad for the file sets and the values, then one
# per rank and group, each naming LABEL. A group absent from both sides' file is skipped
# (split placement: a rank file holds only its group's model; HSDP: only replica group 0
# writes the models).
same_checkpoint() {
  local a=$1 b=$2 label=${3:+ $3} f r obj out ra rb
  ra=$(rank_files "$a"); rb=$(rank_files "$b")
  [ -n "$ra" ] || bad "no rank files in checkpoint A '$a'$label"
  [ -n "$rb" ] || bad "no rank files in checkpoint B '$b'$label"
  { [ -n "$ra" ] && [ -n "$rb" ]; } || return 0
  if [ "$ra" = "$rb" ]; then
    ok "same $(wc -l <<< "$ra") rank files$label"
  else
    bad "rank files differ$label: only in A: $(comm -23 <(echo "$ra") <(echo "$rb") | tr '\n' ' ')only in B: $(comm -13 <(echo "$ra") <(echo "$rb") | tr '\n' ' ')"
  fi
  if out=$(nonfinite_in "$a" "$b"); then ok "no NaN or infinity in either checkpoint$label"
  else bad "NaN or infinity$label: $(head -3 <<< "$out" | tr '\n' ' ')"; fi
  out=$(mktemp)
  for f in $(comm -12 <(echo "$ra") <(echo "$rb")); do
    r=${f%.h5}; r=${r#rank-}
    for obj in /generator /discriminator /rng; do
      if ! h5ls "$a/$f$obj" > /dev/null 2>&1 && ! h5ls "$b/$f$obj" > /dev/null 2>&1; then continue; fi
      h5diff "$a/$f" "$b/$f" $obj $obj > "$out" 2>&1 \
        && ok "rank $r $obj bitwise equal$label" || bad "rank $r $obj differs$label: $(head -3 "$out")"
    done
  done
  rm -f "$out"
}
# checkpoints_identical A B: same_checkpoint's verdict as an exit status (0: every check
# passed), printing only the failed checks; the caller's PASSED/FAILED are untouched.
checkpoints_identical() {
  local out
  out=$(FAILED=0; same_checkpoint "$@"; [ "$FAILED" -eq 0 ] && echo IDENTICAL)
  grep '^FAIL: ' <<< "$out" | sed 's/^FAIL: /  /'
  [ "$(tail -1 <<< "$out")" = IDENTICAL ]
}
# checkpoints_within A B RTOL LABEL: `$CKPT diff A B --rtol RTOL` (every tensor's max|a - b| /
# max|b|, parameters, optimizer state and EMA) passes, both directories hold rank files
# (the world sizes may differ), and neither holds a NaN or an infinity (nonfinite_in: the
# tool counts a NaN equal to a NaN); one ok/bad naming LABEL.
checkpoints_within() {
  local out
  [ -n "$(rank_files "$1")" ] || { bad "$4: no rank files in checkpoint A '$1'"; return; }
  [ -n "$(rank_files "$2")" ] || { bad "$4: no rank files in checkpoint B '$2'"; return; }
  out=$(nonfinite_in "$1" "$2") || { bad "$4: NaN or infinity: $(head -3 <<< "$out" | tr '\n' ' ')"; return; }
  out=$(mktemp)
  "$CKPT" diff "$1" "$2" --rtol "$3" > "$out" 2>&1 \
    && ok "$4 within $3: $(grep -m1 "max rel difference" "$out")" || bad "$4: $(tail -5 "$out")"
  rm -f "$out"
}
