#!/usr/bin/env bash
# ZeRO++'s quantized collectives over a slow link between two "hosts": 2 network namespaces x
# 2 ranks over Open MPI's TCP btl (tests/multihost/netns.sh), the bridge-side veth of each
# host limited by `tc` (token bucket) to RATE, the class-conditional BigGAN of
# configs/biggan-1b.yaml at width CH with ZeRO-3 for G and D (bfloat16 compute and reduction,
# float32 masters and Adam; node_shared_gather off, as across hosts). For each mode (plain,
# qwz = quantized_weights int8, qgz = quantized_gradients GBITS, both; hpz = hpz_partition_size
# auto, a secondary group per host; all = qwz + qgz + hpz; hsdp = one replica
# group per host, hsdp-qgz = the same with quantized gradients, which also quantizes the
# cross-host replica average) it trains STEPS steps
# and prints one JSON line: bytes that crossed between the hosts per step after step 1 (rx +
# tx on host 0's veth, from the kernel's counters), shardgan's own per-rank volume
# (comm_bytes_world), the mean step time after step 1, the losses, and peak RSS per rank.
# Usage: benchmarks/quantized_multihost.sh [CH] [STEPS]   env: RATES ("1gbit 10gbit"), MODES,
#        GBITS (int4). Needs root (ip netns, tc) and build/shardgan-train.
set -euo pipefail
cd "$(dirname "$0")/.."
CH=${1:-16}; STEPS=${2:-3}; RATES=${RATES:-1gbit 10gbit}; MODES=${MODES:-plain qwz qgz both}; GBITS=${GBITS:-int4}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
NETNS=tests/multihost/netns.sh; P=qz$(( $$ % 10000 )); export NETNS_SUBNET=10.$(( 100 + $$ % 100 )).9
OUT=benchmarks/results/quantized_multihost.jsonl; mkdir -p "$(dirname "$OUT")"
COMMIT=$(git rev-parse --short HEAD)
T=$(mktemp -d /tmp/shardgan-quant-bench.XXXXXX)
trap 'bash "$NETNS" down "$P" 2 2> /dev/null; rm -rf "$T"' EXIT
bash "$NETNS" up "$P" 2 > /dev/null
mapfile -t HOSTS < <(bash "$NETNS" mpirun-args "$P")
VETH=${P}v0
source benchmarks/multihost_lib.sh
for rate in $RATES; do
  for i in 0 1; do
    tc qdisc replace dev ${P}v$i root tbf rate "$rate" burst 4mbit latency 100ms
  done
  for mode in $MODES; do
    Q=()
    case $mode in
      qwz) Q=(--set sharding.generator.quantized_weights=int8 --set sharding.discriminator.quantized_weights=int8) ;;
      qgz) Q=(--set sharding.generator.quantized_gradients=$GBITS --set sharding.discriminator.quantized_gradients=$GBITS) ;;
      both) Q=(--set sharding.generator.quantized_weights=int8 --set sharding.discriminator.quantized_weights=int8
               --set sharding.generator.quantized_gradients=$GBITS --set sharding.discriminator.quantized_gradients=$GBITS) ;;
      hpz) Q=(--set sharding.generator.hpz_partition_size=auto --set sharding.discriminator.hpz_partition_size=auto) ;;
      all) Q=(--set sharding.generator.quantized_weights=int8 --set sharding.discriminator.quantized_weights=int8
              --set sharding.generator.quantized_gradients=$GBITS --set sharding.discriminator.quantized_gradients=$GBITS
              --set sharding.generator.hpz_partition_size=auto --set sharding.discriminator.hpz_partition_size=auto) ;;
      hsdp) Q=(--set sharding.generator.replicate_degree=auto --set sharding.discriminator.replicate_degree=auto) ;;
      hsdp-qgz) Q=(--set sharding.generator.replicate_degree=auto --set sharding.discriminator.replicate_degree=auto
                   --set sharding.generator.quantized_gradients=$GBITS --set sharding.discriminator.quantized_gradients=$GBITS) ;;
    esac
    RUN=$T/$rate-$mode
    mpirun "${HOSTS[@]}" -np 4 build/shardgan-train configs/biggan-1b.yaml \
      --set model.ch=$CH --set model.d_ch=$CH --set train.steps=$STEPS --set train.d_steps=1 \
      --set train.global_batch=4 --set ema.enabled=false --set train.log_every=1 --set train.sample_every=0 \
      --set train.checkpoint_every=0 --set train.plots=false --set data.source=synthetic \
      --set sharding.generator.node_shared_gather=false --set sharding.discriminator.node_shared_gather=false \
      "${Q[@]}" --set run.dir="$RUN" > "$RUN.log" 2>&1 &
    veth_bytes_per_step $! "$RUN/metrics.jsonl" "$STEPS" "$VETH"
    [ "$RC" -eq 0 ] || { echo "$rate $mode failed:"; tail -20 "$RUN.log"; exit 1; }
    cross=$CROSS
    rss=$(grep -o "peak RSS:    \[[^]]*\]" "$RUN.log" | sed 's/.*\[\(.*\)\]/\1/')
    params=$(grep -o "model biggan: G [0-9]* parameters, D [0-9]* parameters" "$RUN.log" | awk '{print $4 + $7}')
    python3 - "$RUN/metrics.jsonl" "$mode" "$rate" "$CH" "$params" "$cross" "$rss" "$STEPS" "$COMMIT" "$GBITS" >> "$OUT" <<'PY'
import json, sys
path, mode, rate, ch, params, cross, rss, steps, commit, gbits = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
after = rows[1:]  # after step 1 (warm-up)
mean = lambda k: sum(r.get(k, 0) for r in after) / len(after)
print(json.dumps({"bench": "quantized_multihost", "commit": commit, "mode": mode, "gradient_bits": gbits, "rate": rate,
                  "ch": int(ch), "params": int(params), "steps": int(steps),
                  "cross_host_bytes_per_step_veth": int(cross), "comm_bytes_world_per_rank": mean("comm_bytes_world"),
                  "comm_bytes_secondary_per_rank": mean("comm_bytes_secondary"),
                  "step_time_s": round(mean("step_time_s"), 3), "time_collective_s": round(mean("time_collective_s"), 3),
                  "losses": [(r["loss_d"], r["loss_g"]) for r in rows],
                  "vmhwm_gib_per_rank": [float(x) for x in rss.split(",")],
                  "machine": "2-core AMD EPYC, 24 GiB, 4 ranks on 2 cores, 2 network namespaces"}))
PY
    tail -1 "$OUT"
  done
done
