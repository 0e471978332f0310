#!/bin/bash
# Replays every artifact libFuzzer left in a findings folder (crash-*, oom-*, timeout-*,
# leak-*, slow-unit-*) through the instrumented fuzz target and says where each one fails:
# the first stack frame that is not the sanitizer, libFuzzer, libc or an allocator decides
# whose it is (shardgan: src/ or tests/fuzz/; hdf5: Debian's libhdf5; stb: stb_image;
# yaml-cpp; torch). A memory error inside a library in a block shardgan allocated counts as
# shardgan's, and so does a "FINDING" of a harness (an undocumented exception, a broken
# invariant). The sanitizer logs of the run (FINDINGS/asan.PID, ubsan.PID: scripts/fuzz.sh
# sets log_path) are classified too. Writes FINDINGS/triage.txt and prints a summary.
#   tests/fuzz/triage.sh FUZZ_BINARY FINDINGS_DIR
# An artifact that no longer fails is "not-reproduced". Exit status 1 when any artifact fails in shardgan's own code, else 0.
set -u
BIN=$1 DIR=$2
OUT=$DIR/triage.txt
: > "$OUT"
CLASSIFY=$(mktemp /tmp/fuzz-triage.XXXXXX.py)
trap 'rm -f "$CLASSIFY"' EXIT
cat > "$CLASSIFY" <<'PY'
import re, sys, os
art, rep = sys.argv[1], open(sys.argv[2], errors='replace').read()
kind = os.path.basename(art).split('-')[0]
skip = re.compile(r'sanitizer|\bstrdup\b|\bstrlen\b|\bstrcmp\b|\bstrncpy\b|fuzzer::|libc\.so|__assert|\babort\b|raise|pthread_kill|__interceptor|\bmalloc\b|calloc|'
                  r'realloc|\bfree\b|operator new|operator delete|memcpy|memset|memmove|__asan|__ubsan|libclang_rt|'
                  r'PrintStackTrace|CrashCallback|StaticCrash|AlarmCallback|HandleMalloc|MallocHook|__libc_start|_start\b')
def owner(loc):
    if 'libhdf5' in loc: return 'hdf5'
    if 'stb' in loc: return 'stb'
    if 'yaml' in loc: return 'yaml-cpp'
    if 'libtorch' in loc or 'libc10' in loc: return 'torch'
    if '/work/main/src/' in loc or '/include/shardgan/' in loc or '/tests/fuzz/' in loc or 'fuzz-src/' in loc: return 'shardgan'
    return 'other'
def frames(text):
    out = []
    for m in re.finditer(r'^\s+#\d+ 0x[0-9a-f]+\s+(?:in (.*?) )?(\(?/\S+)', text, re.M):
        out.append((m.group(1) or '?', m.group(2)))
    return out
verdict, where = None, ''
if 'FINDING in' in rep:
    verdict, where = 'shardgan', re.search(r'FINDING in .*', rep).group(0)[:160]
if verdict is None:
    m = re.search(r'^(/\S+?):\d+:\d+: runtime error: .*', rep, re.M)
    if m:
        verdict, where = owner(m.group(1)), m.group(0)[:200]
if verdict is None:
    # The first stack of the report.
    first = rep[rep.find('ERROR:'):] if 'ERROR:' in rep else rep
    fr = [f for f in frames(first) if not skip.search(f[0] + ' ' + f[1])]
    if fr:
        named = next((f[0] for f in fr if f[0] != '?'), '?')
        verdict, where = owner(fr[0][1]), f'{fr[0][0][:90]} {fr[0][1][-60:]}' + (f' (under {named[:80]})' if fr[0][0] == '?' else '')
    else:
        verdict, where = 'unknown', (re.search(r'ERROR: .*', rep).group(0)[:160] if 'ERROR:' in rep else 'no report')
    # A library writing or reading out of bounds of a block shardgan allocated is shardgan's.
    if verdict != 'shardgan' and re.search(r'AddressSanitizer: (heap-buffer-overflow|stack-buffer-overflow|heap-use-after-free)', rep):
        alloc = rep[rep.find('allocated by thread'):] if 'allocated by thread' in rep else ''
        af = [f for f in frames(alloc) if not skip.search(f[0] + ' ' + f[1])]
        if af and owner(af[0][1]) == 'shardgan':
            verdict, where = 'shardgan', where + f' (in a block allocated by {af[0][0][:60]})'
if 'rc=0' in rep and verdict in (None, 'unknown'):
    verdict, where = 'not-reproduced', 'passes when replayed (an OOM/timeout of a loaded machine, or fixed since)'
err = re.search(r'ERROR: (AddressSanitizer|libFuzzer|UndefinedBehaviorSanitizer): ([\w-]+(?: [\w-]+)?)', rep)
reproduced = 'rc=0' not in rep
print(f"{os.path.basename(art)}\t{kind}\t{verdict}\t{err.group(2) if err else ('reproduced' if reproduced else 'NOT reproduced')}\t{where}")
PY
shopt -s nullglob
arts=("$DIR"/crash-* "$DIR"/oom-* "$DIR"/timeout-* "$DIR"/leak-* "$DIR"/slow-unit-*)
for a in "${arts[@]}"; do
  case $a in *.report) continue ;; esac
  ASAN_OPTIONS=detect_leaks=0:symbolize=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    OMP_NUM_THREADS=1 timeout 120 "$BIN" -runs=1 -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=1048576 "$a" \
    > "$a.report" 2>&1
  echo "rc=$?" >> "$a.report"
  python3 "$CLASSIFY" "$a" "$a.report" >> "$OUT"
done
# The sanitizers' own reports of the run (fork mode keeps only their first line in its log),
# classified as they are, without a replay.
for l in "$DIR"/asan.* "$DIR"/ubsan.*; do
  case $l in *.report) continue ;; esac
  grep -q -E 'ERROR:|runtime error:' "$l" || continue  # only allocation warnings
  python3 "$CLASSIFY" "$l" "$l" >> "$OUT"
done
n=$(wc -l < "$OUT")
echo "triage of $n artifacts and sanitizer logs in $DIR (details: $OUT):"
awk -F'\t' '{print "  " $3 ": " $4 " in " $5}' "$OUT" | sort | uniq -c | sort -rn | head -20
if awk -F'\t' '$3 == "shardgan"' "$OUT" | grep -q .; then
  echo "FINDINGS IN SHARDGAN'S OWN FRAMES:"; awk -F'\t' '$3 == "shardgan"' "$OUT"
  exit 1
fi
exit 0
