#!/usr/bin/env bash
# The golden check of a restructuring: runs every cell of cells.sh with one build and
# keeps the checkpoints, so that a later build's runs can be compared bit for bit.
#   tests/golden/run.sh TRAIN OUT_DIR                run the set into OUT_DIR with the
#                                                    shardgan-train binary TRAIN
#   tests/golden/run.sh --compare OUT_A OUT_B        every checkpoint (steps 2 and 4) of
#                                                    every cell equal bit for bit (h5diff)
# Kernels' digits differ between CPU models: compare only runs made on one machine.
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$SRC/tests/golden/cells.sh"
source "$SRC/tests/lib.sh"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
if [ "${1:-}" = "--compare" ]; then
  A=$2; B=$3
  while read -r name np ref args; do
    for s in 2 4; do
      d=checkpoints/step-$(printf %08d $s)
      same_checkpoint "$A/$name/$d" "$B/$name/$d" "($name step $s)"
    done
  done < <(golden_cells)
  finish; exit $?
fi
TRAIN=$(realpath "$1"); OUT=$2
mkdir -p "$OUT"
{ echo "binary $TRAIN"; echo "commit ${GOLDEN_COMMIT:-$(git -C "$SRC" rev-parse HEAD)$(git -C "$SRC" diff --quiet HEAD -- src include apps || echo ' (with uncommitted changes)')}"
  echo "cpu $(lscpu | sed -n 's/^Model name: *//p')"; date -u; } > "$OUT/machine.txt"
while read -r name np ref args; do
  rm -rf "${OUT:?}/$name"
  # shellcheck disable=SC2086
  if timeout 600 "${MPIRUN[@]}" -np "$np" --bind-to none "$TRAIN" $args "${GOLDEN_COMMON[@]}" \
       --set run.dir="$OUT/$name" < /dev/null > "$OUT/$name.log" 2>&1; then ok "$name (np $np)"
  else bad "$name: $(tail -3 "$OUT/$name.log")"; fi
done < <(golden_cells)
finish
