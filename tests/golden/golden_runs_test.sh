#!/usr/bin/env bash
# ctest golden_runs: every cell of the golden set (tests/golden/cells.sh: DCGAN at stages 0
# and 3, the conditional BigGAN with the simultaneous update and the shared D forward,
# split placement with G on 1 of 3 ranks, HSDP on 4, hpZ + qwZ on 4, pix2pix at stage 3,
# disk offload, async checkpoints; float64, checkpoints at steps 2 and 4) equals its
# stage-0 one-rank counterpart within 1e-9 of the largest value of each tensor's kind
# (ckpt_close.py), at both steps. qwZ's int8 weights are lossy, so hpZ + qwZ is held to
# qwZ without hpZ, bit for bit (hpZ moves the same bytes another way).
# Negative control (SHARDGAN_TEST_CONTROL=golden_perturb, ctest golden_runs_control): two
# cells only, the reference run with another seed; every run must succeed and the
# comparison must fail.
TRAIN=$1; SRC=$3
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/cells.sh"
T=$(mktemp -d /tmp/shardgan-golden.XXXXXX)
CONTROL=0; case ",${SHARDGAN_TEST_CONTROL:-}," in *,golden_perturb,*) CONTROL=1;; esac
declare -A NP ARGS REF
order=()
while read -r name np ref args; do
  [ "$CONTROL" = 1 ] && [ "$name" != dcgan-ref ] && [ "$name" != dcgan-s3 ] && continue
  NP[$name]=$np; ARGS[$name]=$args; REF[$name]=$ref; order+=("$name"); done < <(golden_cells)
for name in "${order[@]}"; do
  extra=(); [ "$CONTROL" = 1 ] && [ "${REF[$name]}" = "-" ] && extra=(--set run.seed=8)
  # shellcheck disable=SC2086
  timeout 300 "${MPIRUN[@]}" -np "${NP[$name]}" --bind-to none "$TRAIN" ${ARGS[$name]} "${GOLDEN_COMMON[@]}" "${extra[@]}" \
    --set run.dir="$T/$name" < /dev/null > "$T/$name.log" 2>&1 || bad "$name: $(tail -3 "$T/$name.log")"
done
ck() { echo "$T/$1/checkpoints/step-$(printf %08d "$2")"; }
for name in "${order[@]}"; do
  ref=${REF[$name]}
  [ "$ref" = "-" ] && continue
  for s in 2 4; do
    if [[ $ref == bitwise:* ]]; then
      same_checkpoint "$(ck "$name" $s)" "$(ck "${ref#bitwise:}" $s)" "($name against ${ref#bitwise:}, step $s)"
    else
      out=$("${SHARDGAN_PYTHON:-python3}" "$(dirname "$0")/../ckpt_close.py" "$(ck "$name" $s)" "$(ck "$ref" $s)" 1e-9 2>&1) \
        && ok "$name against $ref, step $s: $out" || bad "$name against $ref, step $s: $out"
    fi
  done
done
rm -rf "$T"
if [ "$CONTROL" = 1 ]; then
  echo "control (references with another seed): $PASSED comparisons passed, $FAILED failed"
  [ "$PASSED" -eq 0 ] && [ "$FAILED" -eq 2 ] && { echo "PASS: the perturbed references fail both comparisons"; exit 0; }
  echo "FAIL: the control should fail exactly the 2 comparisons"; exit 1
fi
finish
