# Shared helpers for the shell-driven tests. Each test prints "N passed, M failed".
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PASSED=0
FAILED=0
ok()   { echo "PASS: $*"; PASSED=$((PASSED + 1)); }
bad()  { echo "FAIL: $*"; FAILED=$((FAILED + 1)); }
finish() { echo "$PASSED passed, $FAILED failed"; [ "$FAILED" -eq 0 ]; }
MPIRUN=(mpirun --oversubscribe)
