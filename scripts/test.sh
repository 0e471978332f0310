#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh, then the test-only scripts/setup-dev.sh), builds,
# and runs the test suite with ctest: the default tier, or every entry with
# SHARDGAN_TEST_TIER=all. A test that skips is reported as skipped (not
# passed) in ctest's summary, and its reason is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup-dev.sh
bash scripts/build.sh
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
cd build
# The default tier leaves out the entries labelled `extended` (tests/extended_tier.cmake:
# other world sizes and variants of checks that a cheaper entry already makes), so that a
# cold run fits CI's time on a 2-core machine. SHARDGAN_TEST_TIER=all runs every entry.
tier_args=()
case "${SHARDGAN_TEST_TIER:-default}" in
  default) tier_args=(-LE extended) ;;
  all) ;;
  *) echo "scripts/test.sh: SHARDGAN_TEST_TIER must be default or all, not '${SHARDGAN_TEST_TIER}'" >&2; exit 2 ;;
esac
rc=0
ctest --output-on-failure --timeout 600 "${tier_args[@]}" "$@" || rc=$?
if [ ${#tier_args[@]} -gt 0 ]; then
  count() { ctest -N "$@" | awk '/Total Tests:/ {print $3}'; }
  echo "Left out: $(( $(count) - $(count -LE extended) )) entries of the extended tier" \
       "(SHARDGAN_TEST_TIER=all scripts/test.sh runs them)."
fi
# Why each skipped test skipped: gtest's "file:line: Skipped" and the line after it (the
# reason), and the shell tests' "SKIP: reason", under the ctest entry that printed them.
log=Testing/Temporary/LastTest.log
if [ -f "$log" ]; then
  awk '/^[0-9]+\/[0-9]+ Test: / { name = $3 }
       reason { print "  " name ": " $0; reason = 0 }
       /: Skipped$/ { reason = 1 }
       /^SKIP: / { print "  " name ": " substr($0, 7) }' "$log" | sort -u > skip-reasons.txt
  if [ -s skip-reasons.txt ]; then echo "Skip reasons:"; cat skip-reasons.txt; fi
fi
exit $rc
