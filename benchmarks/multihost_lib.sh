# Helpers for the two-"host" benchmarks (tests/multihost/netns.sh), sourced by
# hsdp_multihost.sh and quantized_multihost.sh.

# veth_bytes_per_step PID METRICS STEPS VETH: while PID (a training run started in the
# background by the caller) runs, reads VETH's rx + tx byte counters each time a line is
# appended to METRICS (metrics.jsonl gets one when a step ends, with train.log_every 1), then
# waits for PID. Sets CROSS to the mean bytes per step from the end of step 1 to the end of
# step STEPS, and RC to PID's exit status.
veth_bytes_per_step() {
  local pid=$1 metrics=$2 steps=$3 veth=$4 n seen=0
  local -A at=()
  counter() { echo $(( $(cat /sys/class/net/$veth/statistics/rx_bytes) + $(cat /sys/class/net/$veth/statistics/tx_bytes) )); }
  at[0]=$(counter)
  while kill -0 "$pid" 2> /dev/null; do
    n=$(wc -l 2> /dev/null < "$metrics" || echo 0)
    while [ "$seen" -lt "$n" ]; do seen=$((seen + 1)); at[$seen]=$(counter); done
    sleep 0.2
  done
  RC=0; wait "$pid" || RC=$?
  n=$(wc -l 2> /dev/null < "$metrics" || echo 0)
  while [ "$seen" -lt "$n" ]; do seen=$((seen + 1)); at[$seen]=$(counter); done
  CROSS=$(( (${at[$steps]:-0} - ${at[1]:-0}) / (steps - 1) ))
}
