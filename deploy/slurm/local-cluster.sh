#!/usr/bin/env bash
# A real single-machine Slurm (munge + slurmctld + N slurmd), for trying dt without a cluster and
# for dt's own tests. Needs root (the daemons run as root here) and Debian's slurm packages
# (scripts/setup.sh installs them).
#
#   deploy/slurm/local-cluster.sh start [--nodes N] [--dir DIR]   # idempotent; waits until idle
#   deploy/slurm/local-cluster.sh stop  [--dir DIR]
#   deploy/slurm/local-cluster.sh status [--dir DIR]
#
# Node names are n1..nN (several slurmd on one machine: SLURMD_NODENAME tells them apart).
set -euo pipefail

cmd="${1:-}"
shift || true
nodes=1
dir="${DT_SLURM_DIR:-/tmp/dt-slurm}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) nodes="$2"; shift 2 ;;
    --nodes=*) nodes="${1#*=}"; shift ;;
    --dir) dir="$2"; shift 2 ;;
    --dir=*) dir="${1#*=}"; shift ;;
    *) echo "local-cluster.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
conf=/etc/slurm/slurm.conf

die() { echo "local-cluster.sh: $*" >&2; exit 1; }

need_tools() {
  for t in slurmctld slurmd munged sinfo sbatch; do
    command -v "$t" >/dev/null 2>&1 || [[ -x /usr/sbin/$t ]] || die "$t is missing: run scripts/setup.sh (slurmctld slurmd slurm-client munge)"
  done
  [[ $(id -u) -eq 0 ]] || die "start the daemons as root"
}

pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$(cat "$1")/status" 2>/dev/null; }

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  [[ -f /etc/munge/munge.key ]] || mungekey --create >/dev/null 2>&1 || /usr/sbin/mungekey -c
  chown munge:munge /etc/munge/munge.key 2>/dev/null || true
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge 2>/dev/null || true
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.1; done
  die "munged did not come up"
}

write_conf() {
  local host cpus mem
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo)
  mkdir -p /etc/slurm "$dir/state" "$dir/log"
  local node_lines
  if [[ "$nodes" -eq 1 ]]; then
    mkdir -p "$dir/spool-n1"
    node_lines="NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=6818 CPUs=$cpus RealMemory=$((mem / 2)) State=UNKNOWN"
  else
    for i in $(seq 1 "$nodes"); do mkdir -p "$dir/spool-n$i"; done
    node_lines="NodeName=n[1-$nodes] NodeHostname=$host NodeAddr=127.0.0.1 Port=6818-$((6817 + nodes)) CPUs=$cpus RealMemory=$((mem / (nodes + 1))) State=UNKNOWN"
  fi
  cat > "$conf" <<CONF
# Written by dt's deploy/slurm/local-cluster.sh
ClusterName=dt-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits out its old step credentials (cred_expire + 1 s) before it starts again:
# 10 s instead of the default 120 on this one machine, so a preempted run resumes promptly.
AuthInfo=cred_expire=10
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# A requeued job starts once its old credentials expire, not at the next periodic pass (60 s /
# backfill 30 s by default).
SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=5
# A node whose slurmd stops answering is marked DOWN (its jobs end NODE_FAIL and --requeue jobs go
# back to the queue) after this long: 300 s by default, 10 s on this one machine.
SlurmdTimeout=10
MinJobAge=300
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
$node_lines
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
}

start() {
  need_tools
  if pid_alive "$dir/slurmctld.pid"; then
    local idle
    idle=$(sinfo -h -N -t idle,mix,alloc -o %N 2>/dev/null | sort -u | wc -l)
    if [[ "$idle" -ge "$nodes" ]]; then
      echo "local Slurm already running in $dir ($idle node(s))"
      return
    fi
    stop
  fi
  start_munge
  rm -rf "$dir/state"
  write_conf
  setsid /usr/sbin/slurmctld -D -i -f "$conf" >"$dir/log/slurmctld.out" 2>&1 < /dev/null &
  for i in $(seq 1 "$nodes"); do
    setsid /usr/sbin/slurmd -D -N "n$i" -f "$conf" >"$dir/log/slurmd-n$i.out" 2>&1 < /dev/null &
  done
  for _ in $(seq 300); do
    local idle
    idle=$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
    if [[ "$idle" -ge "$nodes" ]]; then
      sleep 2  # the first job after start-up is slow to schedule otherwise
      echo "local Slurm running: slurmctld + $nodes slurmd (n1..n$nodes) + munged; config $conf, state $dir"
      return
    fi
    sleep 0.1
  done
  echo "--- slurmctld log" >&2; tail -20 "$dir/log/slurmctld.log" >&2 || true
  die "the nodes did not become idle within 30 s"
}

stop() {
  local f
  # Jobs first, so no step outlives its daemons.
  if pid_alive "$dir/slurmctld.pid"; then
    local jobs
    jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
    if [[ -n "${jobs// }" ]]; then
      scancel $jobs 2>/dev/null || true
      for _ in $(seq 100); do
        [[ -z "$(squeue -h -o %i 2>/dev/null)" ]] && break
        sleep 0.1
      done
    fi
  fi
  for f in "$dir"/slurmd-*.pid "$dir/slurmctld.pid"; do
    [[ -f "$f" ]] || continue
    kill "$(cat "$f")" 2>/dev/null || true
  done
  for _ in $(seq 100); do
    local alive=0
    for f in "$dir"/slurmd-*.pid "$dir/slurmctld.pid"; do pid_alive "$f" && alive=1; done
    [[ $alive -eq 0 ]] && break
    sleep 0.1
  done
  for f in "$dir"/slurmd-*.pid "$dir/slurmctld.pid"; do
    pid_alive "$f" && kill -9 "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
  # Step daemons of this cluster (they hold its slurmd log open) that outlived their job.
  local p
  for p in $(pgrep slurmstepd 2>/dev/null); do
    if ls -l "/proc/$p/fd" 2>/dev/null | grep -q "$dir/"; then kill -9 "$p" 2>/dev/null || true; fi
  done
  pkill -9 -f "$dir/spool-" 2>/dev/null || true
  echo "local Slurm stopped"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  status) sinfo -N 2>/dev/null || { echo "not running"; exit 1; } ;;
  *) echo "usage: $0 start [--nodes N] | stop | status  [--dir DIR]" >&2; exit 2 ;;
esac
