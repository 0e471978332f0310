#!/usr/bin/env bash
# Starts or stops a one-node Slurm cluster (Debian's slurmctld/slurmd 22.05 + munge) for tests.
# Everything (munge key and socket, slurm.conf, state, spool, logs, pid files) lives under DIR.
#
#   scripts/slurm-local.sh start DIR   # prints the `export SLURM_CONF=...` line to eval
#   scripts/slurm-local.sh stop DIR    # cancels remaining jobs, stops slurmd, slurmctld, munged
#   scripts/slurm-local.sh status DIR  # sinfo + squeue
#
# Needs root (SlurmUser=root) and: apt-get install -y slurmctld slurmd slurm-client munge
# No cgroups: proctrack/linuxproc, task/none. MPI: `srun --mpi=pmix` with Debian's Open MPI 4.1 (pmi2/none fail in
# MPI_Init: its Open MPI has no PMI-1/2 support), or mpirun inside the allocation.
# Environment knobs: SLURM_LOCAL_CPUS (default nproc; more than nproc allowed via config_overrides),
# SLURM_LOCAL_PORT (slurmctld port, default 6817; slurmd uses +1), SLURM_LOCAL_TIMEOUT (default 60 s).
set -euo pipefail

usage() { echo "usage: $0 start|stop|status DIR" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
cmd=$1
mkdir -p "$2"
dir=$(cd "$2" && pwd)
conf=$dir/slurm.conf
msock=$dir/munge/munge.socket
host=$(hostname)

pid_of() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null && cat "$1"; }

stop_pid() { # pidfile name
  local pid
  pid=$(pid_of "$1") || return 0
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  echo "$2 (pid $pid) did not stop after SIGTERM, sending SIGKILL" >&2
  kill -9 "$pid" 2>/dev/null || true
}

start() {
  local c
  for c in slurmctld slurmd sinfo munged; do
    command -v "$c" >/dev/null || { echo "no $c; install: apt-get install -y slurmctld slurmd slurm-client munge" >&2; exit 1; }
  done
  [[ $(id -u) -eq 0 ]] || { echo "$0 must run as root (SlurmUser=root)" >&2; exit 1; }

  # munge: own key, socket and daemon (root-owned), so nothing in /etc or /run is needed.
  # munged insists that the socket's directory is executable by all.
  mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log"
  chmod 755 "$dir"; chmod 711 "$dir/munge"
  if [[ ! -s $dir/munge/munge.key ]]; then
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1 count=1024 status=none
  fi
  chmod 400 "$dir/munge/munge.key"
  if ! pid_of "$dir/munge/munged.pid" >/dev/null; then
    munged --key-file="$dir/munge/munge.key" --socket="$msock" --pid-file="$dir/munge/munged.pid" \
      --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed" --force
  fi
  munge -S "$msock" -n | unmunge -S "$msock" >/dev/null || { echo "munge self-test failed" >&2; exit 1; }

  local cpus mem port
  cpus=${SLURM_LOCAL_CPUS:-$(nproc)}
  mem=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.95 }' /proc/meminfo)
  port=${SLURM_LOCAL_PORT:-6817}

  cat > "$conf" <<EOF
# Written by scripts/slurm-local.sh: one-node test cluster, no cgroups, no accounting.
ClusterName=local
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket=$msock,cred_expire=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
# main scheduling loop every 2 s (default 60 s), so a requeued job restarts soon after it is eligible
SchedulerParameters=sched_interval=2
ReturnToService=2
JobRequeue=1
MailProg=/bin/true
KillWait=5
MinJobAge=600
InactiveLimit=0
SlurmdTimeout=300
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  cat > "$dir/cgroup.conf" <<EOF
# Not used (proctrack/linuxproc, task/none); present so nothing looks for /etc/slurm/cgroup.conf.
CgroupPlugin=autodetect
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF

  export SLURM_CONF=$conf
  local p
  if ! pid_of "$dir/slurmctld.pid" >/dev/null; then
    for p in "$port" $((port + 1)); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
        echo "port $p is in use (another cluster?); pick another with SLURM_LOCAL_PORT" >&2; exit 1
      fi
    done
    slurmctld -f "$conf"
  fi
  pid_of "$dir/slurmd.pid" >/dev/null || slurmd -f "$conf"

  local timeout=${SLURM_LOCAL_TIMEOUT:-60} state=""
  for ((i = 0; i < timeout * 2; i++)); do
    state=$(sinfo -h -N -n "$host" -o %t 2>/dev/null | head -1) || true
    [[ $state == idle ]] && break
    # the daemons fork before they bind their ports: a fatal error shows as a dead pid
    if ((i >= 4)) && ! { pid_of "$dir/slurmctld.pid" && pid_of "$dir/slurmd.pid"; } >/dev/null; then
      state="daemon died"; break
    fi
    sleep 0.5
  done
  if [[ $state != idle ]]; then
    echo "node $host not idle after ${timeout}s (state '${state}'); logs: $dir/log" >&2
    tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
    exit 1
  fi
  echo "export SLURM_CONF=$conf"
}

stop() {
  export SLURM_CONF=$conf
  if pid_of "$dir/slurmctld.pid" >/dev/null; then
    local jobs
    jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      # shellcheck disable=SC2086
      scancel $jobs 2>/dev/null || true
      for _ in $(seq 30); do [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break; sleep 0.5; done
    fi
  fi
  stop_pid "$dir/slurmd.pid" slurmd
  stop_pid "$dir/slurmctld.pid" slurmctld
  stop_pid "$dir/munge/munged.pid" munged
}

status() {
  export SLURM_CONF=$conf
  sinfo -N -l
  squeue
}

case $cmd in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) usage ;;
esac
