#!/usr/bin/env bash
# "Several hosts on one machine" for MPI tests: Linux network namespaces joined by a bridge.
# Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2.
#
#   netns.sh up   PREFIX N     create namespaces PREFIX0..PREFIX{N-1}; prints the state dir
#   netns.sh down PREFIX [N]   remove them (idempotent; kills processes left inside them)
#   netns.sh link PREFIX I down|up [peer|ns]
#                              cut / restore host I. "peer" (default) downs the bridge-side
#                              veth end: the host keeps its address and route, its packets are
#                              silently dropped (a pulled cable). "ns" downs eth0 inside the
#                              namespace: its route disappears, local sends fail at once.
#   netns.sh agent HOST CMD... the rsh agent for mpirun (--mca plm_rsh_agent): runs CMD (joined
#                              with spaces and given to sh -c, as ssh does) inside HOST's namespace
#   netns.sh exec PREFIX I CMD...  run CMD in host I's namespace (debugging)
#   netns.sh mpirun-args PREFIX    print the mpirun options for this cluster, one per line
#
# Layout (SUBNET defaults to 10.77.0, override with NETNS_SUBNET=a.b.c before "up"):
#   root namespace: bridge PREFIXbr with SUBNET.254/24 (mpirun runs here and its OOB listens here)
#   host i: namespace PREFIXi, lo up, eth0 = SUBNET.(i+1)/24, veth peer PREFIXv<i> on the bridge;
#           processes started by the agent also get their own UTS namespace with hostname PREFIXi.
# State dir /tmp/netns-PREFIX: hostfile ("SUBNET.(i+1) slots=2"), hosts ("ip name netns"),
#   rsh-agent (wrapper around "netns.sh agent" with the map baked in), mpirun.args.
#
# Usage:
#   D=$(tests/multihost/netns.sh up mh 2)
#   mapfile -t A < <(tests/multihost/netns.sh mpirun-args mh)
#   OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun "${A[@]}" -np 4 ./prog
#   tests/multihost/netns.sh link mh 1 down
#   tests/multihost/netns.sh down mh 2
#
# Agent environment: like ssh, the agent starts the remote orted with a clean environment
# (PATH, HOME, LANG, and OPAL_PREFIX/LD_LIBRARY_PATH only if NETNS_AGENT_KEEP lists them), so a
# variable reaches the ranks only if passed with "mpirun -x VAR". NETNS_AGENT_KEEPENV=1 keeps all.
# NETNS_SLOTS (default 2) sets slots per host; NETNS_TCP_RETRIES2=n sets net.ipv4.tcp_retries2
# inside every namespace (how long TCP retransmits before a dead peer's socket errors out).
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
die() { echo "netns.sh: $*" >&2; exit 1; }
log() { echo "netns.sh: $*" >&2; }

statedir() { echo "/tmp/netns-$1"; }

# reaches NS ADDR: whether namespace NS has a path to ADDR (a TCP connect to a closed port
# answers "refused" once the path works, and times out while it does not).
reaches() {
  local out
  out=$(ip netns exec "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1 || true)
  [[ $out == *refused* ]]
}

check_prefix() {
  [[ $1 =~ ^[A-Za-z][A-Za-z0-9]{0,8}$ ]] || die "prefix must be 1-9 alphanumerics starting with a letter (interface names are limited to 15 chars): '$1'"
}

cmd_down() {
  local p=$1 n=${2:-}
  check_prefix "$p"
  local d; d=$(statedir "$p")
  # Namespaces named PREFIX<digits>: from the state file if present, else by listing.
  local nss=()
  if [[ -n $n ]]; then
    for ((i = 0; i < n; i++)); do nss+=("$p$i"); done
  fi
  while read -r ns _; do
    [[ $ns =~ ^${p}[0-9]+$ ]] && nss+=("$ns")
  done < <(ip netns list 2>/dev/null)
  local ns pids
  for ns in $(printf '%s\n' "${nss[@]}" | sort -u); do
    if [[ -e /run/netns/$ns ]]; then
      # Processes left in the namespace keep it (and its veth) alive after "ip netns del".
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      if [[ -n $pids ]]; then
        kill -KILL $pids 2>/dev/null || true
        sleep 0.2
      fi
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
  local l
  for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${p}(br|v[0-9]+)$" || true); do
    ip link del "$l" 2>/dev/null || true
  done
  rm -rf "$d"
}

cmd_up() {
  local p=$1 n=$2
  check_prefix "$p"
  [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 250 ]] || die "nhosts must be 1..250"
  [[ $(id -u) -eq 0 ]] || die "must run as root"
  local sub=${NETNS_SUBNET:-10.77.0} slots=${NETNS_SLOTS:-2}
  cmd_down "$p" "$n"
  # Two clusters on one subnet would give the root namespace two routes to it (and mpirun's OOB
  # address $sub.254 twice): orteds then time out connecting back. Use NETNS_SUBNET to separate.
  if ip -o -4 addr show | grep -q " inet $sub\.254/"; then
    die "subnet $sub.0/24 already in use ($(ip -o -4 addr show | awk -v a="$sub.254" 'index($4, a"/") == 1 {print $2}')); set NETNS_SUBNET"
  fi
  local d; d=$(statedir "$p")
  mkdir -p "$d"
  local br=${p}br
  ip link add "$br" type bridge
  ip link set "$br" type bridge stp_state 0 forward_delay 0 2>/dev/null || true
  ip addr add "$sub.254/24" dev "$br"
  ip link set "$br" up
  : >"$d/hostfile"; : >"$d/hosts"
  local i ns ip
  for ((i = 0; i < n; i++)); do
    ns=$p$i ip=$sub.$((i + 1))
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "${p}v$i" type veth peer name "${p}p$i"
    ip link set "${p}p$i" netns "$ns"
    ip -n "$ns" link set "${p}p$i" name eth0
    ip -n "$ns" addr add "$ip/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip link set "${p}v$i" master "$br"
    ip link set "${p}v$i" up
    if [[ -n ${NETNS_TCP_RETRIES2:-} ]]; then
      ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2="$NETNS_TCP_RETRIES2"
    fi
    echo "$ip slots=$slots" >>"$d/hostfile"
    echo "$ip $ns $ns" >>"$d/hosts"
  done
  cat >"$d/rsh-agent" <<EOF
#!/bin/sh
NETNS_HOSTS='$d/hosts' exec '$SELF' agent "\$@"
EOF
  chmod +x "$d/rsh-agent"
  # Wait until every namespace reaches every other one and the root-side bridge address.
  local t=0 ok dst
  while :; do
    ok=1
    for ((i = 0; i < n; i++)); do
      for dst in "$sub.254" "$sub.$(((i + 1) % n + 1))"; do
        reaches "$p$i" "$dst" || ok=0
      done
    done
    ((ok)) && break
    ((++t < 20)) || die "namespaces cannot reach each other"
    sleep 0.25
  done
  cmd_mpirun_args "$p" >"$d/mpirun.args"
  log "up: $n hosts $sub.1..$sub.$n (namespaces ${p}0..${p}$((n - 1))), mpirun side $sub.254 on $br"
  echo "$d"
}

cmd_mpirun_args() {
  local p=$1 d; d=$(statedir "$p")
  [[ -f $d/hostfile ]] || die "no cluster '$p' (run up first)"
  local net; net=$(awk '{split($1,a,"."); print a[1]"."a[2]"."a[3]".0/24"; exit}' "$d/hostfile")
  printf '%s\n' \
    --hostfile "$d/hostfile" \
    --mca plm_rsh_agent "$d/rsh-agent" \
    --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,self \
    --mca btl_tcp_if_include "$net" \
    --mca oob_tcp_if_include "$net"
}

cmd_link() {
  local p=$1 i=$2 st=$3 side=${4:-peer}
  check_prefix "$p"
  [[ $st == up || $st == down ]] || die "link state must be up or down"
  case $side in
    peer) ip link set "${p}v$i" "$st" ;;
    ns) ip -n "$p$i" link set eth0 "$st" ;;
    *) die "link side must be peer or ns" ;;
  esac
  log "host $i ($p$i) link $st ($side side) at $(date +%T.%N | cut -c1-12)"
  # Back up: wait until the host reaches the mpirun side again, so that a daemon started
  # right after can connect.
  if [[ $st == up ]]; then
    local sub t=0
    sub=$(awk '{split($1,a,"."); print a[1]"."a[2]"."a[3]; exit}' "$(statedir "$p")/hostfile")
    while ! reaches "$p$i" "$sub.254"; do
      ((++t < 40)) || die "host $i cannot reach $sub.254 after link up"
      sleep 0.25
    done
    log "host $i reaches $sub.254 again after $t retries"
  fi
}

cmd_agent() {
  # mpirun calls: AGENT [plm_rsh_args...] HOST WORD...  (the words make one sh command line)
  while [[ ${1:-} == -* ]]; do shift; done
  local host=${1:?agent: no host}; shift
  [[ $# -gt 0 ]] || die "agent: no command for $host"
  local maps=() ns="" name="" f
  if [[ -n ${NETNS_HOSTS:-} ]]; then maps=("$NETNS_HOSTS"); else maps=(/tmp/netns-*/hosts); fi
  for f in "${maps[@]}"; do
    [[ -f $f ]] || continue
    read -r ns name < <(awk -v h="$host" '$1 == h || $2 == h { print $3, $2; exit }' "$f") || true
    [[ -n $ns ]] && break
  done
  [[ -n $ns ]] || die "agent: unknown host '$host'"
  local envs=()
  if [[ ${NETNS_AGENT_KEEPENV:-0} == 1 ]]; then
    envs=(env)
  else
    envs=(env -i "PATH=$PATH" "HOME=${HOME:-/root}" "LANG=${LANG:-C.UTF-8}" "USER=${USER:-root}")
    local v
    for v in ${NETNS_AGENT_KEEP:-}; do [[ -n ${!v:-} ]] && envs+=("$v=${!v}"); done
  fi
  # Own UTS namespace so that gethostname()/MPI_Get_processor_name differ per host (also keeps
  # Open MPI's session dirs /tmp/ompi.<hostname>.<uid> apart).
  exec ip netns exec "$ns" unshare --uts -- "${envs[@]}" /bin/sh -c \
    'echo "$1" >/proc/sys/kernel/hostname; exec /bin/sh -c "$2"' sh "$name" "$*"
}

cmd_exec() {
  local p=$1 i=$2; shift 2
  exec ip netns exec "$p$i" "$@"
}

case ${1:-} in
  up) [[ $# -eq 3 ]] || die "usage: up PREFIX NHOSTS"; cmd_up "$2" "$3" ;;
  down) [[ $# -ge 2 ]] || die "usage: down PREFIX [NHOSTS]"; cmd_down "$2" "${3:-}" ;;
  link) [[ $# -ge 4 ]] || die "usage: link PREFIX I down|up [peer|ns]"; cmd_link "$2" "$3" "$4" "${5:-peer}" ;;
  agent) shift; cmd_agent "$@" ;;
  exec) [[ $# -ge 4 ]] || die "usage: exec PREFIX I CMD..."; shift; cmd_exec "$@" ;;
  mpirun-args) [[ $# -eq 2 ]] || die "usage: mpirun-args PREFIX"; cmd_mpirun_args "$2" ;;
  *) sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
