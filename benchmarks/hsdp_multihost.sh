#!/usr/bin/env bash
# Full sharding against HSDP over two "hosts": 2 network namespaces x 2 ranks over
# Open MPI's TCP btl (tests/multihost/netns.sh), the class-conditional BigGAN at ZeRO-3 for G
# and D (configs/biggan-1b.yaml at width CH: bfloat16 compute, float32 masters and Adam).
# For each mode it trains STEPS steps and measures:
#  - bytes that crossed between the hosts, from the kernel's counters on host 0's veth (rx +
#    tx: every byte between the hosts passes it once; mpirun's control traffic also does, and
#    is measured in the idle seconds before the first step), per step after step 1;
#  - shardgan's own per-rank accounting from metrics.jsonl (comm_bytes_world,
#    comm_bytes_shard_group, comm_bytes_replicate) and step_time_s;
#  - peak RSS (VmHWM) per rank, from the run's summary line.
# One JSON line per mode goes to benchmarks/results/hsdp/hsdp_multihost.jsonl (appended).
# Usage: benchmarks/hsdp_multihost.sh [CH] [STEPS]   (CH = model.ch = model.d_ch; 32 -> 262.3M)
# Needs root (ip netns) and build/shardgan-train.
set -euo pipefail
cd "$(dirname "$0")/.."
CH=${1:-32}; STEPS=${2:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
NETNS=tests/multihost/netns.sh; P=hb$(( $$ % 10000 )); export NETNS_SUBNET=10.$(( 100 + $$ % 100 )).7
OUT=benchmarks/results/hsdp; mkdir -p "$OUT"
T=$(mktemp -d /tmp/shardgan-hsdp-bench.XXXXXX)
trap 'bash "$NETNS" down "$P" 2 2> /dev/null; rm -rf "$T"' EXIT
bash "$NETNS" up "$P" 2 > /dev/null
mapfile -t HOSTS < <(bash "$NETNS" mpirun-args "$P")
VETH=${P}v0
source benchmarks/multihost_lib.sh
for mode in full hsdp; do
  R=1; [ $mode = hsdp ] && R=auto
  RUN=$T/$mode
  mpirun "${HOSTS[@]}" -np 4 build/shardgan-train configs/biggan-1b.yaml \
    --set model.ch=$CH --set model.d_ch=$CH --set train.steps=$STEPS --set train.d_steps=1 \
    --set train.global_batch=4 --set ema.enabled=false --set train.log_every=1 --set train.sample_every=0 \
    --set train.checkpoint_every=0 --set train.plots=false --set data.source=synthetic \
    --set sharding.generator.replicate_degree=$R --set sharding.discriminator.replicate_degree=$R \
    --set run.dir="$RUN" > "$T/$mode.log" 2>&1 &
  veth_bytes_per_step $! "$RUN/metrics.jsonl" "$STEPS" "$VETH"
  [ "$RC" -eq 0 ] || { echo "$mode failed:"; tail -20 "$T/$mode.log"; exit 1; }
  cross=$CROSS
  rss=$(grep -o "peak RSS:    \[[^]]*\]" "$T/$mode.log" | sed 's/.*\[\(.*\)\]/\1/')
  params=$(grep -o "model biggan: G [0-9]* parameters, D [0-9]* parameters" "$T/$mode.log" | awk '{print $4 + $7}')
  layout=$(grep -m1 -o "generator: hybrid sharding, [^(]*([^)]*)" "$T/$mode.log" || echo "generator: full sharding")
  python3 - "$RUN/metrics.jsonl" "$mode" "$CH" "$params" "$cross" "$rss" "$layout" "$STEPS" >> "$OUT/hsdp_multihost.jsonl" <<'EOF'
import json, sys
path, mode, ch, params, cross, rss, layout, steps = sys.argv[1:]
rows = [json.loads(l) for l in open(path)][1:]  # after step 1 (warm-up)
mean = lambda k: sum(r.get(k, 0) for r in rows) / len(rows)
print(json.dumps({"bench": "hsdp_multihost", "mode": mode, "layout": layout, "ch": int(ch), "params": int(params),
                  "steps": int(steps), "cross_host_bytes_per_step_veth": int(cross),
                  "comm_bytes_world_per_rank": mean("comm_bytes_world"),
                  "comm_bytes_shard_group_per_rank": mean("comm_bytes_shard_group"),
                  "comm_bytes_replicate_per_rank": mean("comm_bytes_replicate"),
                  "step_time_s": mean("step_time_s"), "time_collective_s": mean("time_collective_s"),
                  "vmhwm_gib_per_rank": [float(x) for x in rss.split(",")],
                  "machine": "2-core AMD EPYC, 24 GiB, 4 ranks on 2 cores"}))
EOF
  tail -1 "$OUT/hsdp_multihost.jsonl"
done
