#!/usr/bin/env bash
# train.placement: split (ParaGAN's asymmetric placement) end to end through shardgan-train:
#   - Parity in float64: split equals shared, for the alternating and the simultaneous
#     update, every tensor of the checkpoint (G, D, Adam's moments, the EMA, SyncBatchNorm
#     and spectral-norm buffers) within 1e-9 of the largest value of its kind
#     (ckpt_close.py) after 4 steps of the tiny conditional BigGAN (d_steps 2, 2
#     micro-batches, R1, EMA, the shipped config's AC-GAN class loss; G on 1 or 2 ranks,
#     D on 1-3).
#   - The bytes between the groups per step equal the formula (images x batch x transfers
#     x dtype bytes); each group's idle time is logged.
#   - A split run resumed from its step-2 checkpoint equals the straight run bit for bit;
#     a split checkpoint resumes shared at another N, and a shared one split, within 1e-9.
#   - Also at G stage 0 / D stage 2, with disk offload of the optimizer state, gradients and
#     D's parameters (bit-identical to none), and for the
#     DCGAN, whose D has SyncBatchNorm over D's group.
#   - checkpoint.async (fork and copy snapshots) saves the synchronous run's checkpoints.
#   - shardgan-ckpt verify accepts a split checkpoint; --dry-run reports each group's need
#     (with the data on D's ranks, and for pix2pix on G's ranks too),
#     and the pre-flight refuses a split that does not fit, naming placement.generator_ranks.
#   - A step's world figures arrive one step late (after the next step's work), yet a
#     NaN under train.on_nonfinite=abort ends every rank naming its step, and SIGTERM to
#     one of D's ranks ends every rank after the same step with a checkpoint that resumes
#     to the uninterrupted run bit for bit.
#   - ZeRO++ hpZ inside a group (G on 4 of 6 ranks, secondary groups of 2) is bit-identical
#     to the same split without it; HSDP inside each group equals it within 1e-9.
#   - Negative controls in every run: without G's L1 term on G's side (pix2pix), or without
#     G's class term on D's side (BigGAN), split no longer equals shared.
#   - pix2pix (paired data): split equals shared within 1e-9 (G on 1 or 2 ranks, D on 1-2),
#     with the same logged L1 and adversarial losses, and resumes bit for bit.
#   - Bad settings end every rank naming the key.
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-split.XXXXXX)
COMMON=(--set data.source=synthetic --set data.synthetic_size=72 --set model.dtype=float64
        --set train.log_every=1 --set train.sample_every=0 --set train.checkpoint_every=0
        --set run.seed=7 --set train.plots=false --set train.skip_memory_check=true)
BIGGAN=("$SRC/configs/fmnist-biggan.yaml" --set train.global_batch=12 --set model.ch=8 --set model.d_ch=8
        --set model.z_dim=8 --set model.shared_dim=8 --set ema.start_step=0 --set train.d_steps=2
        --set train.micro_batches=2 --set train.r1_gamma=0.1 --set eval.enabled=false)
run() {  # run NAME NP STEPS ARGS...
  local name=$1 np=$2 steps=$3; shift 3
  timeout 600 "${MPIRUN[@]}" -np "$np" "$TRAIN" "${BIGGAN[@]}" "${COMMON[@]}" --set train.steps="$steps" \
    --set run.dir="$T/$name" "$@" > "$T/$name.log" 2>&1
}
ckpt() { echo "$T/$1/checkpoints/step-$(printf %08d "$2")"; }
close() {  # close A B LABEL: every tensor within 1e-9 of the largest of its kind (ckpt_close.py)
  local out
  out=$("${SHARDGAN_PYTHON:-python3}" "$(dirname "$0")/ckpt_close.py" "$1" "$2" 1e-9 2>&1) \
    && ok "$3: $out" || bad "$3: $out"
}
split() { echo --set train.placement=split --set placement.generator_ranks="$1"; }
PRE_STEPS=60  # the preemption run: long enough that the signal lands mid-run

for update in alternating simultaneous; do
  U=(--set train.update=$update)
  run "shared-$update" 2 4 "${U[@]}" || bad "shared $update: $(tail -3 "$T/shared-$update.log")"
  for spec in "2 1" "3 1" "4 2"; do
    set -- $spec; np=$1; k=$2; name="split-$update-np$np-k$k"
    if run "$name" "$np" 4 "${U[@]}" $(split "$k"); then
      close "$(ckpt "$name" 4)" "$(ckpt "shared-$update" 4)" "$update: split (G on $k of $np ranks) against shared on 2"
    else
      bad "$name: $(tail -3 "$T/$name.log")"
    fi
  done
done

# placement.defer_figures false (each step's world figures waited for at its end): the
# same updates, bit for bit.
run split-nodefer 3 4 --set train.update=simultaneous $(split 1) --set placement.defer_figures=false \
  || bad "split, defer_figures false: $(tail -3 "$T/split-nodefer.log")"
same_checkpoint "$(ckpt split-simultaneous-np3-k1 4)" "$(ckpt split-nodefer 4)" "(split, figures at each step's end)"

# Other stages, disk offload, and a D with SyncBatchNorm (DCGAN), simultaneous update.
SIM=(--set train.update=simultaneous)
run shared-s02 2 4 "${SIM[@]}" --set sharding.generator.stage=0 --set sharding.discriminator.stage=2 || bad "shared-s02"
run split-s02 4 4 "${SIM[@]}" --set sharding.generator.stage=0 --set sharding.discriminator.stage=2 $(split 1) \
  || bad "split-s02: $(tail -3 "$T/split-s02.log")"
close "$(ckpt split-s02 4)" "$(ckpt shared-s02 4)" "G stage 0, D stage 2: split (G on 1 of 4) against shared on 2"
off() { local x; for x in generator discriminator; do echo --set offload.$x.optimizer=disk --set offload.$x.gradient=disk; done
       echo --set offload.discriminator.param=disk; }  # G's EMA reads G's master shards: no G param offload
run split-offload 3 4 "${SIM[@]}" $(split 1) $(off) || bad "split with offload: $(tail -3 "$T/split-offload.log")"
same_checkpoint "$(ckpt split-simultaneous-np3-k1 4)" "$(ckpt split-offload 4)" "(split, disk offload of state and gradients, and of D's parameters)"
DC=("$SRC/configs/fmnist-dcgan.yaml" --set train.global_batch=12 --set model.g_width=16 --set model.d_width=16
    --set ema.enabled=false --set train.update=simultaneous --set data.source=synthetic --set data.synthetic_size=72
    --set model.dtype=float64 --set train.log_every=1 --set train.sample_every=0 --set train.checkpoint_every=0
    --set run.seed=7 --set train.plots=false --set train.skip_memory_check=true --set train.steps=3)
timeout 300 "${MPIRUN[@]}" -np 2 "$TRAIN" "${DC[@]}" --set run.dir="$T/dc-shared" > "$T/dc-shared.log" 2>&1 || bad "dcgan shared"
timeout 300 "${MPIRUN[@]}" -np 3 "$TRAIN" "${DC[@]}" $(split 1) --set run.dir="$T/dc-split" > "$T/dc-split.log" 2>&1 \
  || bad "dcgan split: $(tail -3 "$T/dc-split.log")"
close "$(ckpt dc-split 3)" "$(ckpt dc-shared 3)" "DCGAN (SyncBatchNorm in G and D): split (G on 1 of 3) against shared on 2"

# pix2pix (paired data) under split: G's ranks read their slices' A (G's input) and B (the
# L1 target), D's ranks score {G(A), A} with their own slices' A. 2 D steps of 2
# micro-batches (G's pass reuses the last D step's pairs); against shared within 1e-9, the
# L1 and adversarial losses of every row alike, and resumed at step 2 bit for bit.
P2P=("$SRC/configs/fmnist-pix2pix.yaml" --set data.source=synthetic --set data.synthetic_size=48
     --set train.global_batch=12 --set model.g_width=8 --set model.d_width=8 --set model.dtype=float64
     --set train.d_steps=2 --set train.micro_batches=2 --set train.log_every=1 --set train.sample_every=0
     --set train.checkpoint_every=0 --set run.seed=7 --set train.plots=false --set train.skip_memory_check=true)
p2p() {  # p2p NAME NP STEPS ARGS...
  local name=$1 np=$2 steps=$3; shift 3
  timeout 300 "${MPIRUN[@]}" -np "$np" "$TRAIN" "${P2P[@]}" --set train.steps="$steps" --set run.dir="$T/$name" "$@" \
    > "$T/$name.log" 2>&1 || bad "$name: $(tail -3 "$T/$name.log")"
}
p2p p2p-shared 2 4
for spec in "3 1" "3 2" "4 2"; do
  set -- $spec
  p2p "p2p-split-np$1-k$2" "$1" 4 $(split "$2")
  close "$(ckpt "p2p-split-np$1-k$2" 4)" "$(ckpt p2p-shared 4)" "pix2pix: split (G on $2 of $1 ranks) against shared on 2"
done
"${SHARDGAN_PYTHON:-python3}" - "$T/p2p-shared/metrics.jsonl" "$T/p2p-split-np4-k2/metrics.jsonl" <<'PY' \
  && ok "pix2pix split: loss_l1, loss_g and loss_d of every step equal shared's within 1e-9" \
  || bad "pix2pix split: the logged losses differ from shared's"
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"loss_d"' in l] for p in sys.argv[1:])
assert len(a) == len(b) == 4, (len(a), len(b))
for x, y in zip(a, b):
    assert x["loss_l1"] > 0, x
    for k in ("loss_l1", "loss_g", "loss_d"):
        assert abs(x[k] - y[k]) <= 1e-9 * max(1.0, abs(x[k])), (x["step"], k, x[k], y[k])
PY
# Negative controls (test-only switches): G's side drops its L1 term (split_drop_l1), and,
# on the BigGAN with the alternating update, D's side leaves G's class term out of the
# gradient it returns (split_drop_class_fake). Each run must train and fail the parity.
control_fails() {  # control_fails LABEL A B: ckpt_close must report a difference
  local out
  if out=$("${SHARDGAN_PYTHON:-python3}" "$(dirname "$0")/ckpt_close.py" "$2" "$3" 1e-9 2>&1); then
    bad "$1: the parity still holds: $out"
  elif [ -d "$2" ]; then ok "$1: the parity fails: $out"
  else bad "$1: the control run wrote no checkpoint"; fi
}
export SHARDGAN_TEST_CONTROL=split_drop_l1
p2p p2p-control 3 4 $(split 1)
export SHARDGAN_TEST_CONTROL=split_drop_class_fake
run split-class-control 3 4 --set train.update=alternating $(split 1) || bad "class control run: $(tail -3 "$T/split-class-control.log")"
unset SHARDGAN_TEST_CONTROL
control_fails "control, pix2pix without G's L1 term" "$(ckpt p2p-control 4)" "$(ckpt p2p-shared 4)"
control_fails "control, BigGAN without G's class term on D's side" "$(ckpt split-class-control 4)" "$(ckpt shared-alternating 4)"
p2p p2p-half 3 2 $(split 2) --set train.checkpoint_every=2
p2p p2p-half 3 4 $(split 2) --resume "$T/p2p-half"
same_checkpoint "$(ckpt p2p-split-np3-k2 4)" "$(ckpt p2p-half 4)" "(pix2pix split, resumed at step 2)"

# ZeRO++ hpZ inside each group: G on 4 of 6 ranks with secondary groups of 2, D on 2 with
# one of 2; bit-identical to the same split without hpZ, G's gathers after the first in
# its secondary group.
HPZ=(--set train.update=simultaneous --set train.global_batch=16 $(split 4))
run split-nohpz 6 3 "${HPZ[@]}" || bad "split on 6: $(tail -3 "$T/split-nohpz.log")"
run split-hpz 6 3 "${HPZ[@]}" --set sharding.generator.hpz_partition_size=2 \
  --set sharding.discriminator.hpz_partition_size=2 || bad "split with hpZ: $(tail -3 "$T/split-hpz.log")"
same_checkpoint "$(ckpt split-nohpz 3)" "$(ckpt split-hpz 3)" "(split with hpZ in each group)"
"${SHARDGAN_PYTHON:-python3}" - "$T/split-hpz/metrics.jsonl" <<'PY' && ok "split with hpZ: G's rank 0 gathers in its secondary group" \
  || bad "split with hpZ: no bytes in the secondary group"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss_d"' in l]
assert len(rows) == 3 and all(r["comm_bytes_secondary"] > 0 for r in rows), [r.get("comm_bytes_secondary") for r in rows]
PY

# HSDP inside each group: G's 4 ranks as 2 replica groups of 2, D's 2 as 2 of 1, against
# the same split without it (another reduction order: within 1e-9).
run split-hsdp 6 3 "${HPZ[@]}" --set sharding.generator.replicate_degree=2 \
  --set sharding.discriminator.replicate_degree=2 || bad "split with HSDP: $(tail -3 "$T/split-hsdp.log")"
close "$(ckpt split-hsdp 3)" "$(ckpt split-nohpz 3)" "split with HSDP in each group (G 2 x 2 ranks, D 2 x 1) against split without"
grep -q "generator: hybrid sharding, 2 replica groups of 2 ranks" "$T/split-hsdp.log" \
  && grep -q '"comm_bytes_replicate":[1-9]' "$T/split-hsdp/metrics.jsonl" \
  && ok "split with HSDP: G's replica groups are logged and rank 0 reduces across them" \
  || bad "split with HSDP: $(grep -m2 "hybrid sharding" "$T/split-hsdp.log")"

# The simultaneous update with D run twice on the fakes (train.shared_d_forward false).
TWICE=(--set train.update=simultaneous --set train.shared_d_forward=false)
run shared-twice 2 4 "${TWICE[@]}" || bad "shared, D twice: $(tail -3 "$T/shared-twice.log")"
run split-twice 3 4 "${TWICE[@]}" $(split 1) || bad "split, D twice: $(tail -3 "$T/split-twice.log")"
close "$(ckpt split-twice 4)" "$(ckpt shared-twice 4)" "simultaneous, D run twice on the fakes: split (G on 1 of 3) against shared on 2"

# The bytes between the groups per step: B images for each D step that draws from G, and B
# images plus their gradients for G's pass (float64 here: 8 bytes per element).
"${SHARDGAN_PYTHON:-python3}" - "$T/split-alternating-np3-k1/metrics.jsonl" "$T/split-simultaneous-np3-k1/metrics.jsonl" <<'PY' \
  && ok "bytes between the groups = formula (alternating 4 transfers, simultaneous 3 of 12 images of 1x32x32 x 8 bytes); idle times logged" \
  || bad "bytes between the groups or idle times"
import json, sys
for path, transfers in zip(sys.argv[1:], (4, 3)):
    rows = [json.loads(l) for l in open(path) if '"loss_d"' in l]
    want = 12 * 1 * 32 * 32 * 8 * transfers
    assert rows and all(r["bytes_between_groups"] == want == r["bytes_between_groups_formula"] for r in rows), (path, want, rows[0])
    assert all(r["idle_g_s"] >= 0 and r["idle_d_s"] >= 0 and r["busy_g_s"] > 0 and r["busy_d_s"] > 0 for r in rows)
    assert [r["step"] for r in rows] == [1, 2, 3, 4], (path, [r["step"] for r in rows])  # one row per step, in order
PY

# A step's world figures (losses, NaN/Inf verdicts, the preemption vote) are waited for
# after the next step: the job still ends on every rank, naming the step it happened in.
DCF=("${DC[@]}" --set model.dtype=float32 --set train.update=alternating)
expect_fail "split: on_nonfinite=abort one step later" "step 1: a NaN or Inf in the generator" \
  "${MPIRUN[@]}" -np 3 "$TRAIN" "${DCF[@]}" $(split 1) --set optim.discriminator.lr=1e38 \
  --set train.on_nonfinite=abort --set train.steps=6 --set run.dir="$T/nan"
[ "$(grep -c "train.on_nonfinite is abort" "$T/out.txt")" -eq 3 ] && ok "split abort: all 3 ranks name the cause" \
  || bad "split abort: $(grep -c "train.on_nonfinite is abort" "$T/out.txt") of 3 ranks named it"
# SIGTERM to D's last rank only: every rank finishes the same step, saves it and exits 0;
# --resume auto then reaches the uninterrupted run bit for bit.
PRE=("${DC[@]}" $(split 1) --set train.steps=$PRE_STEPS)
timeout 300 "${MPIRUN[@]}" -np 3 "$TRAIN" "${PRE[@]}" --set run.dir="$T/pre-ref" > "$T/pre-ref.log" 2>&1 \
  || bad "split reference for preemption: $(tail -3 "$T/pre-ref.log")"
"${MPIRUN[@]}" -np 3 "$TRAIN" "${PRE[@]}" --set run.dir="$T/pre" > "$T/pre.log" 2>&1 &
MPI_PID=$!
victim=""
for _ in $(seq 1 3000); do
  for p in $(pgrep -P $MPI_PID); do
    [ "$(tr '\0' '\n' < /proc/$p/environ 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')" = 2 ] && victim=$p
  done
  [ -n "$victim" ] && [ -f "$T/pre/metrics.jsonl" ] && [ "$(wc -l < "$T/pre/metrics.jsonl")" -ge 3 ] && break
  sleep 0.01
done
kill -TERM "$victim"
wait $MPI_PID; rc=$?
got=$(sed -n 's/.*received SIGTERM (preemption): finished step \([0-9]*\) on every rank.*/\1/p' "$T/pre.log")
if [ $rc -eq 0 ] && [ -n "$got" ] && [ "$got" -lt "$PRE_STEPS" ]; then
  ok "split, SIGTERM to D's rank 2: every rank finished step $got, saved it and exited 0"
  "${MPIRUN[@]}" -np 3 "$TRAIN" "${PRE[@]}" --set run.dir="$T/pre" --resume auto > "$T/pre2.log" 2>&1 \
    || bad "split resume after SIGTERM: $(tail -3 "$T/pre2.log")"
  same_checkpoint "$(ckpt pre-ref "$PRE_STEPS")" "$(ckpt pre "$PRE_STEPS")" "(split, preempted at step $got and resumed)"
else
  bad "split SIGTERM: exit $rc, step '$got': $(tail -3 "$T/pre.log")"
fi

# Resume: same placement bit for bit; across placements and world sizes within 1e-9.
S=$(split 1)
run split-half 3 2 --set train.update=simultaneous $S --set train.checkpoint_every=2 || bad "split first half"
run split-half 3 4 --set train.update=simultaneous $S --resume "$T/split-half" > /dev/null 2>&1 \
  || bad "split resume: $(tail -3 "$T/split-half.log")"
same_checkpoint "$(ckpt split-simultaneous-np3-k1 4)" "$(ckpt split-half 4)" "(split, resumed at step 2)"
run to-shared 2 4 --set train.update=simultaneous --resume "$(ckpt split-half 2)" \
  || bad "shared from a split checkpoint: $(tail -3 "$T/to-shared.log")"
close "$(ckpt to-shared 4)" "$(ckpt shared-simultaneous 4)" "split (3 ranks) step 2 resumed shared on 2"
run shared-half 2 2 --set train.update=alternating --set train.checkpoint_every=2 || bad "shared first half"
run to-split 4 4 --set train.update=alternating $(split 2) --resume "$(ckpt shared-half 2)" \
  || bad "split from a shared checkpoint: $(tail -3 "$T/to-split.log")"
close "$(ckpt to-split 4)" "$(ckpt shared-alternating 4)" "shared (2 ranks) step 2 resumed split on 4"
# checkpoint.async on split placement (fork and copy snapshots): each group's ranks snapshot
# their model, and every checkpoint equals the synchronous run's bit for bit.
for snap in fork copy; do
  run "split-async-$snap" 3 4 --set train.update=simultaneous $S --set train.checkpoint_every=2 \
    --set checkpoint.async=true --set checkpoint.snapshot=$snap \
    && grep -q "saving step 2 in the background ($snap snapshot)" "$T/split-async-$snap.log" \
    || bad "split with async $snap saves: $(tail -3 "$T/split-async-$snap.log")"
  same_checkpoint "$(ckpt split-half 2)" "$(ckpt "split-async-$snap" 2)" "(split, async $snap save at step 2)"
  same_checkpoint "$(ckpt split-simultaneous-np3-k1 4)" "$(ckpt "split-async-$snap" 4)" "(split, async $snap saves, step 4)"
done
"$CKPT" verify "$(ckpt split-half 4)" > "$T/verify.log" 2>&1 && ok "shardgan-ckpt verify: $(tail -1 "$T/verify.log" | cut -c1-80)" \
  || bad "verify of a split checkpoint: $(tail -2 "$T/verify.log")"

# --dry-run: each group's need.
timeout 120 "${MPIRUN[@]}" -np 3 "$TRAIN" "${BIGGAN[@]}" "${COMMON[@]}" $(split 1) --set run.dir="$T/dry" --dry-run \
  > "$T/dry.log" 2>&1 && grep -q '"generator_rank_peak_bytes"' "$T/dry.log" && grep -q '"discriminator_rank_peak_bytes"' "$T/dry.log" \
  && ok "--dry-run reports a G rank's and a D rank's need" || bad "dry run: $(tail -3 "$T/dry.log")"

# The data a rank holds under split: D's ranks the images and labels; for pix2pix G's ranks
# too (their input images A and targets B). Twice the synthetic images add the same bytes
# to a G and a D rank for pix2pix, and nothing to a G rank for the BigGAN.
for n in 48 96; do
  timeout 120 "${MPIRUN[@]}" -np 3 "$TRAIN" "${P2P[@]}" $(split 1) --set data.synthetic_size=$n --set run.dir="$T/dry" \
    --dry-run > "$T/dry-p2p-$n.log" 2>&1 || bad "pix2pix dry run: $(tail -3 "$T/dry-p2p-$n.log")"
  timeout 120 "${MPIRUN[@]}" -np 3 "$TRAIN" "${BIGGAN[@]}" "${COMMON[@]}" $(split 1) --set data.synthetic_size=$n \
    --set run.dir="$T/dry" --dry-run > "$T/dry-bg-$n.log" 2>&1 || bad "BigGAN dry run: $(tail -3 "$T/dry-bg-$n.log")"
done
"${SHARDGAN_PYTHON:-python3}" - "$T"/dry-p2p-48.log "$T"/dry-p2p-96.log "$T"/dry-bg-48.log "$T"/dry-bg-96.log <<'PY' \
  > "$T/data.txt" 2>&1 && ok "--dry-run under split: $(cat "$T/data.txt")" || bad "split data bytes: $(cat "$T/data.txt")"
import json, sys
def split(path):
    text = open(path).read()
    return json.loads(text[text.index('{'):text.rindex('}') + 1])["split"]
p48, p96, b48, b96 = (split(p) for p in sys.argv[1:])
g, d = (p96[k] - p48[k] for k in ("generator_rank_peak_bytes", "discriminator_rank_peak_bytes"))
assert g == d == 48 * 2 * 32 * 32 * 8, (g, d)  # 48 more pairs of 1x32x32 float64 images
bg, bd = (b96[k] - b48[k] for k in ("generator_rank_peak_bytes", "discriminator_rank_peak_bytes"))
assert bg == 0 and bd > 0, (bg, bd)
print(f"48 more pix2pix pairs add {g} bytes to a G and to a D rank; 48 more BigGAN images add {bd} to a D rank, 0 to a G rank")
PY

# With checkpoint.async, a split rank's need counts the snapshot of the model it holds: in
# the rank for copy snapshots, on the node for fork.
for snap in copy fork; do
  timeout 120 "${MPIRUN[@]}" -np 3 "$TRAIN" "${BIGGAN[@]}" "${COMMON[@]}" $(split 1) --set run.dir="$T/dry" --dry-run \
    --set checkpoint.async=true --set checkpoint.snapshot=$snap > "$T/dry-$snap.log" 2>&1 || bad "dry run, async $snap"
done
"${SHARDGAN_PYTHON:-python3}" - "$T/dry.log" "$T/dry-copy.log" "$T/dry-fork.log" <<'PY' > "$T/snap.txt" 2>&1 \
  && ok "--dry-run under split counts each group's snapshot: $(cat "$T/snap.txt")" || bad "split snapshot need: $(cat "$T/snap.txt")"
import json, sys
def report(path):
    text = open(path).read()
    return json.loads(text[text.index('{'):text.rindex('}') + 1])
plain, copy, fork = (report(p) for p in sys.argv[1:])
gs, ds = copy["split"]["generator_rank_snapshot_bytes"], copy["split"]["discriminator_rank_snapshot_bytes"]
assert gs > 0 and ds > 0 and gs != ds, (gs, ds)
for who, snap in (("generator", gs), ("discriminator", ds)):
    key = who + "_rank_peak_bytes"
    assert copy["split"][key] == plain["split"][key] + snap, (key, copy["split"][key], plain["split"][key], snap)
    assert fork["split"][key] == plain["split"][key], key
    assert fork["split"][who + "_rank_snapshot_bytes"] == snap
node = lambda r: r["configured"]["node_peak_bytes"]
assert node(copy) == node(fork) > node(plain), (node(copy), node(fork), node(plain))
print(f"G rank {gs} bytes, D rank {ds} bytes")
PY

# The pre-flight refuses a split that does not fit, naming the key (a 3e9-parameter BigGAN
# at stage 0: far past any machine this runs on).
timeout 300 "${MPIRUN[@]}" -np 2 "$TRAIN" "$SRC/configs/biggan-1b.yaml" --set train.placement=split \
  --set placement.generator_ranks=1 --set sharding.generator.stage=0 --set sharding.discriminator.stage=0 \
  --set model.g_blocks_per_res=60 --set model.d_blocks_per_res=60 --set train.memory_probe=false \
  --set run.dir="$T/big" > "$T/big.log" 2>&1 && bad "an oversized split was admitted" \
  || { [ "$(grep -c "memory pre-flight: train.placement split with placement.generator_ranks = 1" "$T/big.log")" -ge 2 ] \
       && ok "an oversized split is refused on both ranks, naming placement.generator_ranks" \
       || bad "oversized split: $(grep -m2 -i error "$T/big.log")"; }

refused() {  # refused LABEL PATTERN NP ARGS...: the run fails and every rank names PATTERN
  local label=$1 pattern=$2 np=$3; shift 3
  if timeout 120 "${MPIRUN[@]}" -np "$np" "$TRAIN" "${BIGGAN[@]}" "${COMMON[@]}" --set train.steps=1 --set run.dir="$T/err" \
       "$@" > "$T/err.log" 2>&1; then
    bad "$label accepted"
  elif [ "$(grep -c -- "$pattern" "$T/err.log")" -ge "$np" ]; then
    ok "$label: all $np ranks name it"
  else
    bad "$label: $(grep -m2 -i error "$T/err.log")"
  fi
}
refused "generator_ranks = world size" "placement.generator_ranks = 2 leaves no rank for D" 2 $(split 2)
refused "split on one rank" "train.placement split on 1 ranks: needs at least 2" 1 $(split 1)
refused "micro-batch not divisible" "must divide among G's 1 ranks and D's 4" 5 $(split 1)
refused "split with HSDP auto" "'sharding.discriminator.replicate_degree'.*not taken with train.placement split" 2 \
  $(split 1) --set sharding.discriminator.replicate_degree=auto
refused "split with a replica count that does not divide D's ranks" "replicate_degree' is 2, which does not divide D's ranks" \
  4 $(split 1) --set sharding.discriminator.replicate_degree=2
refused "bad placement" "'train.placement'.*must be shared or split" 2 --set train.placement=apart
refused "split with hpZ auto" "'sharding.generator.hpz_partition_size'.*not taken with train.placement split" 2 $(split 1) \
  --set sharding.generator.hpz_partition_size=auto
refused "split with an hpZ size that does not divide G's ranks" "does not divide G's ranks (placement.generator_ranks) 2" \
  4 $(split 2) --set sharding.generator.hpz_partition_size=3
rm -rf "$T"
finish
