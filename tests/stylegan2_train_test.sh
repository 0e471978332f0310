#!/usr/bin/env bash
# StyleGAN2's recipe end to end through shardgan-train (configs/fmnist-stylegan2.yaml,
# narrowed, synthetic data, 2 ranks, ZeRO-3), with R1 as its own D update every 2nd step and
# path length as its own G update every 3rd step:
#   - A run resumed from its step-2 checkpoint equals the uninterrupted 4-step run bit for
#     bit: the resumed half runs R1 on step 2 and path length on step 3, whose running mean
#     comes from the checkpoint.
#   - The same across an adjustment of ADA's p (every 3rd step, from a fast heuristic: the
#     checkpoint holds p and the signs of steps 1-2, the resumed half adjusts at step 3).
#   - bfloat16 compute for both models trains with finite losses and path-length figures.
#   - The memory pre-flight against VmHWM: at the authors' cifar width (512 channels), with
#     R1 and path length on every step (each its model gathered whole for the double
#     backward), each rank's VmHWM over training is within +-10% of the prediction the run
#     logged less its fixed safety margin (memory.json: predicted.margin_bytes, 100 MiB, a
#     tenth of this run's VmHWM), and below the prediction itself
#     (peak_rss_bytes_per_rank_training: the final sample grid comes after, and is not part
#     of the prediction).
#   - Configs it cannot take end every rank naming the key: split placement, and path
#     length for a family without styles.
# Usage: stylegan2_train_test.sh SHARDGAN_TRAIN SOURCE_DIR
TRAIN=$1; SRC=$2
PY=${SHARDGAN_PYTHON:-python3}
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-stylegan2.XXXXXX)
COMMON=(--set data.source=synthetic --set data.synthetic_size=32 --set train.global_batch=8
        --set train.log_every=1 --set train.sample_every=0 --set train.checkpoint_every=0
        --set run.seed=3 --set train.plots=false --set eval.enabled=false
        --set model.channel_base=512 --set model.channel_max=16 --set model.z_dim=16 --set model.w_dim=16
        --set model.mbstd_group=2 --set train.r1_every=2 --set train.pl_weight=2 --set train.pl_every=3)
SG2=("$SRC/configs/fmnist-stylegan2.yaml")
run() {  # run NAME NP STEPS ARGS...
  local name=$1 np=$2 steps=$3; shift 3
  timeout 600 "${MPIRUN[@]}" -np "$np" "$TRAIN" "${SG2[@]}" "${COMMON[@]}" --set train.steps="$steps" \
    --set run.dir="$T/$name" "$@" > "$T/$name.log" 2>&1
}
ckpt() { echo "$T/$1/checkpoints/step-$(printf %08d "$2")"; }

ADA=(--set augment.mode=ada --set augment.p=0.3 --set augment.interval=3 --set augment.speed_kimg=0.05)
run straight 2 4 "${ADA[@]}" || bad "straight run: $(tail -3 "$T/straight.log")"
run resumed 2 2 "${ADA[@]}" --set train.checkpoint_every=2 || bad "first half: $(tail -3 "$T/resumed.log")"
run resumed 2 4 "${ADA[@]}" --resume "$T/resumed" || bad "resume: $(tail -3 "$T/resumed.log")"
same_checkpoint "$(ckpt straight 4)" "$(ckpt resumed 4)" "(resumed at step 2 against 4 straight steps)"
"$PY" - "$T/straight/metrics.jsonl" "$T/resumed/metrics.jsonl" <<'PY' \
  && ok "metrics: R1 on steps 1 and 3, path length on 1 and 4 (1-based), ADA's p moved at step 3, equal after the resume" \
  || bad "metrics of the regularization updates"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if '"loss_d"' in l]
b = [json.loads(l) for l in open(sys.argv[2]) if '"loss_d"' in l]
print([(r["step"], r.get("r1"), r.get("pl"), r.get("pl_mean")) for r in a])
ok = len(a) == 4 and [r["step"] for r in a] == [1, 2, 3, 4]
ok = ok and all((r["r1"] > 0) == (r["step"] % 2 == 1) for r in a)
ok = ok and [("pl" in r) for r in a] == [True, False, False, True] and all(r["pl"] > 0 for r in a if "pl" in r)
ok = ok and a[0]["pl_mean"] > 0 and a[3]["pl_mean"] != a[2]["pl_mean"]
# ADA: p moves by 8 * 3 / 50 = 0.48 at step 3 only (from 0.3: up, or down to 0).
print([(r["step"], r.get("ada_p"), r.get("ada_rt"), r.get("r_t")) for r in a])
ok = ok and [r["ada_p"] for r in a[:2]] == [0.3, 0.3] and (abs(a[2]["ada_p"] - 0.78) < 1e-12 or a[2]["ada_p"] == 0) and a[3]["ada_p"] == a[2]["ada_p"]
ok = ok and "ada_rt" in a[2] and "ada_rt" not in a[1] and all(-1 <= r["r_t"] <= 1 for r in a)
tail = {r["step"]: r for r in b}
ok = ok and all(tail[s][k] == r[k] for r in a if r["step"] > 2 for s in [r["step"]]
                for k in ("loss_d", "loss_g", "pl_mean", "ada_p", "ada_rt"))
sys.exit(0 if ok else 1)
PY

run bf16 2 4 --set sharding.generator.compute_dtype=bfloat16 --set sharding.discriminator.compute_dtype=bfloat16 \
  --set augment.mode=fixed --set augment.p=0.5 \
  || bad "bfloat16 run: $(tail -3 "$T/bf16.log")"
"$PY" - "$T/bf16/metrics.jsonl" <<'PY' && ok "bfloat16 (with ADA at p 0.5): finite losses, R1 and path length" || bad "bfloat16: non-finite or missing figures"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss_d"' in l]
keys = ("loss_d", "loss_g", "r1", "pl_mean", "r_t")
sys.exit(0 if len(rows) == 4 and all(math.isfinite(r[k]) for r in rows for k in keys) and rows[0]["pl"] > 0 else 1)
PY

# The pre-flight against VmHWM. Width 512 at every resolution (the authors' cifar widths,
# 1 channel): G about 18M and D about 21M parameters, float32, Adam; at stage 3 on 2 ranks
# the shards are small and the regularization updates gather a model whole.
run vmhwm 2 1 --set model.channel_base=16384 --set model.channel_max=512 --set model.z_dim=512 --set model.w_dim=512 \
  --set train.pl_every=1 --set train.r1_every=1 --set train.final_checkpoint=false \
  || bad "VmHWM run: $(tail -3 "$T/vmhwm.log")"
"$PY" - "$T/vmhwm/memory.json" > "$T/vmhwm.txt" 2>&1 <<'PY'
import json, os, sys
m = json.load(open(sys.argv[1]))
c = m["preflight"]["configured"]
predicted = c["predicted"]["vmhwm_bytes_per_rank"]
estimate = predicted - c["predicted"]["margin_bytes"]
hwm = m["peak_rss_bytes_per_rank_training"]
gib = 1 << 30
ratios = [h / estimate for h in hwm]
print(f"VmHWM over training {', '.join(f'{h / gib:.3f}' for h in hwm)} GiB against {estimate / gib:.3f} estimated "
      f"({', '.join(f'{r:.3f}' for r in ratios)}) and {predicted / gib:.3f} predicted with the margin; "
      f"estimate's peak phase {c['peak_phase']!r}")
sanitized = os.environ.get("SHARDGAN_SANITIZE") is not None
phases = [p["name"] for p in c["step_phases"]]
ok = "D reg (R1)" in phases and "G reg (path length)" in phases
ok = ok and (sanitized or all(0.9 <= r <= 1.1 and h <= predicted for r, h in zip(ratios, hwm)))
sys.exit(0 if ok else 1)
PY
if [ $? -eq 0 ]; then ok "pre-flight: $(cat "$T/vmhwm.txt")"; else bad "pre-flight: $(cat "$T/vmhwm.txt")"; fi

# Refusals, on every rank, naming the key.
refused() {  # refused NAME KEY ARGS...
  local name=$1 key=$2; shift 2
  if run "$name" 2 1 "$@"; then bad "$name: accepted"; return; fi
  if [ "$(grep -c "$key" "$T/$name.log")" -ge 1 ]; then ok "$name: refused naming $key"; else
    bad "$name: refused without naming $key: $(tail -3 "$T/$name.log")"; fi
}
refused split train.placement --set train.placement=split
if timeout 300 "${MPIRUN[@]}" -np 2 "$TRAIN" "$SRC/configs/fmnist-dcgan.yaml" --set data.source=synthetic \
     --set train.steps=1 --set run.dir="$T/dcgan-pl" --set train.pl_weight=2 > "$T/dcgan-pl.log" 2>&1; then
  bad "dcgan with train.pl_weight: accepted"
elif grep -q "train.pl_weight" "$T/dcgan-pl.log"; then ok "dcgan with train.pl_weight: refused naming the key"
else bad "dcgan with train.pl_weight: $(tail -3 "$T/dcgan-pl.log")"; fi
rm -rf "$T"
finish
