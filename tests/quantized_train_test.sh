#!/usr/bin/env bash
# ZeRO++ quantized collectives in training (2 ranks, ZeRO-3 DCGAN, float32 compute and
# reduction): int8 weights (qwZ), int4 or int8 gradients (qgZ), and both, for 4 steps against
# the unquantized run from the same initial weights and data:
#  - every loss is finite and within 5% of the plain run's at every step, and the final
#    parameters are not bit-identical to the plain run's (the quantization is applied);
#  - shardgan's own per-rank volume (comm_bytes_world in metrics.jsonl) follows the payload
#    formula: a float32 all-gather carries 1 + 4/256 bytes per element instead of 4 (ratio
#    r8 = 0.2539), a reduce-scatter 0.5 + 4/256 (int4, r4 = 0.1289) or 1 + 4/256 (int8). The
#    qwZ run gives the gathers' share of the volume, f_g = (1 - ratio) / (1 - r8), and the
#    int4 qgZ run the reduce-scatters' share f_r; the int8 qgZ run and the run with both
#    must then land within 0.02 of 1 - f_r (1 - r8) and 1 - f_g (1 - r8) - f_r (1 - r4);
#  - a quantized collective the stage does not have is refused, naming the key.
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-quant.XXXXXX)
BASE=("$SRC/configs/fmnist-dcgan.yaml" --set model.z_dim=16 --set model.g_width=16 --set model.d_width=16
      --set data.source=synthetic --set data.synthetic_size=96 --set train.global_batch=16 --set train.threads=1
      --set train.log_every=1 --set train.sample_every=0 --set train.checkpoint_every=0 --set train.plots=false
      --set run.seed=31 --set train.steps=4 --set ema.enabled=false)
q() {  # q WEIGHTS GRADIENTS: the --set pairs for both models
  local m
  for m in generator discriminator; do
    echo "--set sharding.$m.quantized_weights=$1 --set sharding.$m.quantized_gradients=$2"
  done
}
run() {  # run NAME ARGS...
  local name=$1; shift
  timeout 300 "${MPIRUN[@]}" -np 2 --bind-to none "$TRAIN" "${BASE[@]}" "$@" --set run.dir="$T/$name" > "$T/$name.log" 2>&1
}
bytes() { "$PY" -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(sum(x['comm_bytes_world'] for x in r[1:]))" "$T/$1/metrics.jsonl"; }
run plain || bad "plain run: $(tail -3 "$T/plain.log")"
declare -A RATIO
for mode in "int8 none" "none int4" "none int8" "int8 int4"; do
  set -- $mode
  name=w$1-g$2
  # shellcheck disable=SC2046
  run $name $(q $1 $2) || { bad "$name: $(tail -3 "$T/$name.log")"; continue; }
  "$PY" - "$T/$name/metrics.jsonl" "$T/plain/metrics.jsonl" > "$T/l.txt" <<'PY'
import json, math, sys
q = [json.loads(l) for l in open(sys.argv[1])]
p = [json.loads(l) for l in open(sys.argv[2])]
worst = max(abs(a[k] - b[k]) / abs(b[k]) for a, b in zip(q, p) for k in ("loss_d", "loss_g"))
finite = all(math.isfinite(a[k]) for a in q for k in ("loss_d", "loss_g"))
print(f"{len(q)} steps, finite losses, largest relative loss difference {worst:.4f}")
sys.exit(0 if finite and len(q) == 4 and worst <= 0.05 else 1)
PY
  [ $? -eq 0 ] && ok "$name: $(cat "$T/l.txt")" || bad "$name: $(cat "$T/l.txt")"
  "$CKPT" diff "$T/$name/checkpoints/step-00000004" "$T/plain/checkpoints/step-00000004" --rtol 0 > /dev/null 2>&1 \
    && bad "$name: bit-identical to the plain run (not quantized?)" || ok "$name: differs from the plain run (quantized)"
  RATIO[$name]=$("$PY" -c "import json,sys; f=lambda p: sum(json.loads(l)['comm_bytes_world'] for l in open(p)); print(f(sys.argv[1]) / f(sys.argv[2]))" \
    "$T/$name/metrics.jsonl" "$T/plain/metrics.jsonl")
done
"$PY" - "${RATIO[wint8-gnone]}" "${RATIO[wnone-gint4]}" "${RATIO[wnone-gint8]}" "${RATIO[wint8-gint4]}" > "$T/r.txt" <<'PY'
import sys
w, g4, g8, both = map(float, sys.argv[1:])
r8, r4 = (1 + 4 / 256) / 4, (0.5 + 4 / 256) / 4
fg, fr = (1 - w) / (1 - r8), (1 - g4) / (1 - r4)
p8, pb = 1 - fr * (1 - r8), 1 - fg * (1 - r8) - fr * (1 - r4)
print(f"bytes vs plain: qwZ {w:.3f}, qgZ int4 {g4:.3f}, qgZ int8 {g8:.3f} (predicted {p8:.3f}), both {both:.3f} "
      f"(predicted {pb:.3f}); gathers {fg:.3f} and reduce-scatters {fr:.3f} of the plain volume")
sys.exit(0 if 0 < fg and 0 < fr and fg + fr <= 1.001 and abs(g8 - p8) <= 0.02 and abs(both - pb) <= 0.02 else 1)
PY
[ $? -eq 0 ] && ok "$(cat "$T/r.txt")" || bad "$(cat "$T/r.txt")"
# HSDP on 4 ranks (2 replica groups of 2): qgZ also quantizes the cross-replica average
# (int4 reduce-scatter, float32 sum, int8 gather), so its volume (comm_bytes_replicate) falls
# to (0.5 + 4/256 + 1 + 4/256) / 4 = 0.383 of the float32 all-reduce's.
HSDP=(--set sharding.generator.replicate_degree=2 --set sharding.discriminator.replicate_degree=2)
timeout 300 "${MPIRUN[@]}" -np 4 --bind-to none "$TRAIN" "${BASE[@]}" "${HSDP[@]}" --set run.dir="$T/hsdp" > "$T/hsdp.log" 2>&1 \
  || bad "hsdp: $(tail -3 "$T/hsdp.log")"
# shellcheck disable=SC2046
timeout 300 "${MPIRUN[@]}" -np 4 --bind-to none "$TRAIN" "${BASE[@]}" "${HSDP[@]}" $(q none int4) --set run.dir="$T/hsdp-q" \
  > "$T/hsdp-q.log" 2>&1 || bad "hsdp qgZ: $(tail -3 "$T/hsdp-q.log")"
"$PY" - "$T/hsdp-q/metrics.jsonl" "$T/hsdp/metrics.jsonl" > "$T/h.txt" <<'PY'
import json, math, sys
q = [json.loads(l) for l in open(sys.argv[1])]
p = [json.loads(l) for l in open(sys.argv[2])]
worst = max(abs(a[k] - b[k]) / abs(b[k]) for a, b in zip(q, p) for k in ("loss_d", "loss_g"))
ratio = sum(a["comm_bytes_replicate"] for a in q) / sum(b["comm_bytes_replicate"] for b in p)
print(f"HSDP with qgZ int4: cross-replica bytes {ratio:.3f} of plain HSDP's (formula 0.383), "
      f"largest relative loss difference {worst:.4f}")
sys.exit(0 if len(q) == 4 and abs(ratio - 0.383) <= 0.02 and worst <= 0.05 else 1)
PY
[ $? -eq 0 ] && ok "$(cat "$T/h.txt")" || bad "$(cat "$T/h.txt")"
expect_fail "qwZ at stage 2" "sharding.generator.quantized_weights" "${MPIRUN[@]}" -np 1 "$TRAIN" "${BASE[@]}" \
  --set sharding.generator.stage=2 --set sharding.generator.quantized_weights=int8 --set run.dir="$T/e1"
expect_fail "qgZ at stage 1" "sharding.discriminator.quantized_gradients" "${MPIRUN[@]}" -np 1 "$TRAIN" "${BASE[@]}" \
  --set sharding.discriminator.stage=1 --set sharding.discriminator.quantized_gradients=int4 --set run.dir="$T/e2"
expect_fail "unknown bits" "sharding.generator.quantized_gradients" "${MPIRUN[@]}" -np 1 "$TRAIN" "${BASE[@]}" \
  --set sharding.generator.quantized_gradients=int2 --set run.dir="$T/e3"
rm -rf "$T"
finish
