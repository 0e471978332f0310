#!/usr/bin/env bash
# Loss parity of the PyTorch copies, with negative controls ("correctness first").
#   benchmarks/peers/parity.sh [model]        # model: dcgan (default) | biggan60m | biggan500m | pix2pix | stylegan2
# Runs shardgan (N = 1 stage 0, N = 2 stage 3) and the peers (DDP N = 1, FSDP2 N = 2 at
# reshard_after_forward True and False) for 3 steps from the same step-0 checkpoint, then
# deliberately wrong peers that must fail the comparison: D's learning rate 10% high, G's
# learning rate doubled, and G's first weight left at the copy's own N(0, 0.02) init instead
# of the checkpoint's; and a probe that may or may not be detected: G's learning rate 10% high.
# stylegan2: the runs also compare the regularization figures (r1, pl, pl_mean), FSDP2 runs path
# length under set_reshard_after_backward(False), and run.sh adds an attempt at FSDP2's default
# settings (N = 2), whose crash must be recorded as a failed line.
# Writes benchmarks/results/peers/parity-<model>.jsonl and .txt (compare.py's verdicts, one
# line per run); exits 1 unless every correct run passes and every negative control fails.
set -uo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-dcgan}
PY=${SHARDGAN_PYTHON:-$PWD/.venv/bin/python}
RES=benchmarks/results/peers
OUT=$RES/parity-$MODEL.jsonl
mkdir -p "$RES"
export STEPS=3 PLOT=
# the correct runs: run.sh's cells (3 steps), at N = 1 and 2
OUT=$OUT MODELS=$MODEL NS=1 SG_STAGES=0 SYSTEMS="shardgan ddp" benchmarks/peers/run.sh > /dev/null
OUT=$OUT APPEND=1 MODELS=$MODEL NS=2 SG_STAGES=3 SYSTEMS="shardgan fsdp2" benchmarks/peers/run.sh > /dev/null
WORK=${WORK:-runs/peers}
CK=$WORK/$MODEL/step0/checkpoints/step-00000000
DATA=$WORK/fmnist.h5; [[ $MODEL == pix2pix* ]] && DATA=$WORK/fmnist-edges.h5
lr() { "$PY" -c "import sys; sys.path.insert(0, 'benchmarks/peers'); import ckpt; print(float(ckpt.read_config('$CK')['optim.$1.lr']) * $2)"; }
wrong() {  # system, N, extra arguments
  local sys=$1 n=$2; shift 2
  OMP_NUM_THREADS=$(( $(nproc) / n > 0 ? $(nproc) / n : 1 )) PYTHONWARNINGS=ignore::FutureWarning \
  "$PY" -m torch.distributed.run --standalone --nproc_per_node "$n" benchmarks/peers/train_peer.py \
    --ckpt "$CK" --data "$DATA" --system "$sys" --steps 3 --model "$MODEL" --out "$OUT" "$@" \
    > "$WORK/$MODEL/parity-wrong.log" 2>&1 || echo "[parity] a wrong run failed to run (see $WORK/$MODEL/parity-wrong.log)"
}
wrong ddp 1 --set optim.discriminator.lr="$(lr discriminator 1.1)" --note "negative control: D lr x1.1"
wrong ddp 1 --set optim.generator.lr="$(lr generator 1.1)" --note "probe: G lr x1.1"
wrong ddp 1 --set optim.generator.lr="$(lr generator 2)" --note "negative control: G lr x2"
wrong fsdp2 2 --skip-load first --note "negative control: G's first weight not loaded"
"$PY" benchmarks/peers/compare.py -v "$OUT" > "${OUT%.jsonl}.txt"
cat "${OUT%.jsonl}.txt"
# every correct run passes, every negative control fails
"$PY" - "$OUT" <<'PY'
import json, sys
sys.path.insert(0, "benchmarks/peers")
import compare
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
bad = 0
for r in recs:
    if not r.get("failed"):
        continue
    note = r.get("note") or ""
    if "default settings" in (r.get("fsdp") or ""):
        print("FSDP2 default settings (recorded, expected to fail):", r.get("error"))
    else:  # a correct run or a control that did not run
        bad += 1
        print("UNEXPECTED: did not run:", r["system"], r["world_size"], r["stage"], note, r.get("error") or r.get("log"))
recs = [r for r in recs if not r.get("failed")]
ref = sorted((r for r in recs if r["system"] == "shardgan"), key=lambda r: (r["world_size"], r["stage"]))[0]
for r in recs:
    if r is ref:
        continue
    ok = compare.check(r, ref, ref["loss_rtol_step1"])[0]
    control = "negative control" in (r.get("note") or "")
    if "probe" in (r.get("note") or ""):
        print("probe:", r.get("note"), "passes (not detected)" if ok else "fails (detected)")
        continue
    if ok == control:
        bad += 1
        print("UNEXPECTED:", r["system"], r["world_size"], r["stage"], r.get("note"), "passes" if ok else "fails")
for want in ("negative control: D lr x1.1", "negative control: G lr x2", "negative control: G's first weight not loaded"):
    if not any(r.get("note") == want for r in recs):
        bad += 1
        print("UNEXPECTED: no result for", want)
print("parity: every correct run within tolerance, every negative control outside it" if not bad else f"parity: {bad} unexpected")
sys.exit(1 if bad else 0)
PY
