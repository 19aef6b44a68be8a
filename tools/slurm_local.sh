#!/usr/bin/env bash
# A real 2-node SLURM cluster (Debian slurm-wlm 22.05 + munge) on this one machine, for tests/CI.
# Usage: slurm_local.sh install (exit 3 if apt is unusable) | start DIR | stop DIR | status DIR
# All state (config, munge key/socket, spool, logs, pid files) lives under DIR and daemons are
# stopped only by the PIDs in DIR's pid files, so several clusters can coexist. Env overrides:
# SLURM_LOCAL_PORT (17000 slurmctld, +1/+2 nodes), SLURM_LOCAL_CPUS, SLURM_LOCAL_MEM_MB (per node).
set -euo pipefail
export PATH="/usr/sbin:/sbin:$PATH"   # daemons live in sbin, often missing from a test's PATH
cmd=${1:-}; DIR=${2:-}
die() { echo "slurm_local: $*" >&2; exit "${RC:-1}"; }
fail() { do_stop; die "start failed: $*; logs in $DIR/log"; }  # leave nothing half-started

do_install() {
  [ "$(command -v slurmctld slurmd munged sbatch scontrol | wc -l)" = 5 ] && return 0
  command -v apt-get >/dev/null || RC=3 die "apt-get not available; cannot install slurm-wlm"
  [ "$(id -u)" = 0 ] || RC=3 die "must be root to apt-get install slurm-wlm munge"
  export DEBIAN_FRONTEND=noninteractive
  local log; log=$(mktemp)
  # apt-get update only when the lists lack the package (fresh images) or are stale.
  apt-cache show slurm-wlm >/dev/null 2>&1 || apt-get update -qq >"$log" 2>&1 || true
  if ! apt-get install -y -qq slurm-wlm munge >>"$log" 2>&1; then
    apt-get update -qq >>"$log" 2>&1 && apt-get install -y -qq slurm-wlm munge >>"$log" 2>&1 ||
      RC=3 die "apt-get install slurm-wlm munge failed: $(grep -E '^E:' "$log" | head -1)"
  fi
  rm -f "$log"
}

# pid from a pid file, only if that process is alive and is the expected program (no reuse).
live_pid() {  # pidfile comm
  local pid comm; read -r pid 2>/dev/null <"$1" || return 1
  [[ $pid =~ ^[0-9]+$ ]] && read -r comm 2>/dev/null <"/proc/$pid/comm" && [ "$comm" = "$2" ] &&
    alive "$pid" && echo "$pid"
}
alive() { local s; read -r _ _ s _ 2>/dev/null <"/proc/$1/stat" && [ "$s" != Z ]; }  # zombie=gone
daemons() {  # "pidfile comm" lines, in stop order
  printf '%s slurmd\n' "$DIR/run/slurmd-node1.pid" "$DIR/run/slurmd-node2.pid"
  printf '%s %s\n' "$DIR/run/slurmctld.pid" slurmctld "$DIR/run/munged.pid" munged
}
# slurmstepd processes of this cluster: they keep the cluster's slurmd log open.
stepds() {
  local p comm
  for p in /proc/[0-9]*; do
    read -r comm 2>/dev/null <"$p/comm" && [ "$comm" = slurmstepd ] || continue
    ls -l "$p/fd" 2>/dev/null | grep -q -- "-> $DIR/log/" && echo "${p#/proc/}"
  done
}
tree() { local c; echo "$1"; for c in $(ps -o pid= --ppid "$1"); do tree "$c"; done; }

write_config() {
  local port=${SLURM_LOCAL_PORT:-17000} host cpus mem
  # the machine's CPUs: nproc counts OMP_NUM_THREADS instead where it is set (the tests' one thread a process)
  host=$(hostname); cpus=${SLURM_LOCAL_CPUS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}
  mem=${SLURM_LOCAL_MEM_MB:-$(awk '/MemTotal/ {print int($2/1024*0.9)}' /proc/meminfo)}
  mkdir -p "$DIR"/{state,log,run,spool/node1,spool/node2}
  install -d -m 755 "$DIR/munge"   # clients need x on the socket dir; key stays 0400
  [ -s "$DIR/munge/munge.key" ] ||
    { dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 2>/dev/null; chmod 400 "$DIR/munge/munge.key"; }
  # gres.conf: the gpu plugin needs character devices that exist (else no CUDA_VISIBLE_DEVICES);
  # /dev/tty0-1 stand in for 2 A100s, or null-like nodes under DIR where they are missing.
  local gpus=/dev/tty
  if ! [ -c /dev/tty0 ] || ! [ -c /dev/tty1 ]; then
    gpus=$DIR/dev/gpu; mkdir -p "$DIR/dev"
    for n in 0 1; do [ -c "$gpus$n" ] || mknod "$gpus$n" c 1 3; done
  fi
  printf 'AutoDetect=off\nNodeName=node[1-2] Name=gpu Type=a100 File=%s[0-1]\n' "$gpus" >"$DIR/gres.conf"
  cat >"$DIR/slurm.conf" <<EOF
ClusterName=local$port
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmUser=root
SlurmdUser=root
# Own munged socket. cred_expire also delays a requeued job's restart (default 120 s).
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.txt
MailProg=/bin/true
# Both nodes share the host: trust the configured CPUs/memory instead of draining the node.
SlurmdParameters=config_overrides
ReturnToService=2
# Preemption/requeue: batch jobs requeue; SIGTERM->SIGKILL grace; finished jobs purged soon.
JobRequeue=1
KillWait=5
MinJobAge=60
SchedulerType=sched/backfill
# Schedule every 2 s, not 30-60 s: a requeued job waits for a pass after its BeginTime.
SchedulerParameters=sched_interval=2,bf_interval=2
GresTypes=gpu
NodeName=node1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + 1)) CPUs=$cpus RealMemory=$mem Gres=gpu:a100:2 State=UNKNOWN
NodeName=node2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + 2)) CPUs=$cpus RealMemory=$mem Gres=gpu:a100:2 State=UNKNOWN
PartitionName=gpu Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
EOF
}

do_start() {
  export SLURM_CONF="$DIR/slurm.conf"
  live_pid "$DIR/run/munged.pid" munged >/dev/null || {
    write_config
    munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
      --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/seed"; }
  [ -f "$SLURM_CONF" ] || write_config
  # A port taken by another cluster would make our clients talk to its slurmctld: refuse.
  local ports n; ports=($(grep -oE '^SlurmctldPort=[0-9]+| Port=[0-9]+' "$SLURM_CONF" | cut -d= -f2))
  free() { ! (: </dev/tcp/127.0.0.1/"$1") 2>/dev/null || fail "port $1 in use (set SLURM_LOCAL_PORT)"; }
  live_pid "$DIR/run/slurmctld.pid" slurmctld >/dev/null || { free "${ports[0]}"; slurmctld -f "$SLURM_CONF"; }
  for n in 1 2; do
    live_pid "$DIR/run/slurmd-node$n.pid" slurmd >/dev/null ||
      { free "${ports[n]}"; slurmd -f "$SLURM_CONF" -N "node$n"; }
  done
  # Wait until both nodes are idle; resume a node left drained by an earlier failed registration.
  local t0=$SECONDS states
  while :; do
    [ $SECONDS -lt $((t0 + 3)) ] || live_pid "$DIR/run/slurmctld.pid" slurmctld >/dev/null ||
      fail "slurmctld exited"
    states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)
    [ "$(grep -cE ' (idle|mix|alloc)$' <<<"$states")" = 2 ] && break
    grep -E ' (drain|drng|drained|inval|down)\*?$' <<<"$states" | while read -r n _; do
      scontrol update nodename="$n" state=resume 2>/dev/null || true; done || true
    [ $SECONDS -lt $((t0 + ${SLURM_LOCAL_TIMEOUT:-60})) ] || fail "nodes not idle in time: $(tr '\n' ' ' <<<"$states")"
    sleep 0.3
  done
  echo "export SLURM_CONF=$SLURM_CONF"
}

do_stop() {
  export SLURM_CONF="$DIR/slurm.conf"
  # Cancel this cluster's jobs first so slurmstepd ends them cleanly, then kill leftovers.
  if live_pid "$DIR/run/slurmctld.pid" slurmctld >/dev/null; then
    timeout 5 scancel --quiet $(squeue -h -o %A 2>/dev/null) 2>/dev/null || true
    local t=0; while [ -n "$(stepds)" ] && [ $t -lt 30 ]; do sleep 0.5; t=$((t + 1)); done
  fi
  local p; for p in $(stepds); do kill -KILL $(tree "$p") 2>/dev/null || true; done  # + job tasks
  # slurmd x2 and slurmctld together (each takes 1-2 s to exit), then munged, which they use.
  term_wait $(daemons | head -3 | while read -r f c; do live_pid "$f" "$c" || true; done)
  term_wait $(live_pid "$DIR/run/munged.pid" munged || true)
}
term_wait() {  # TERM the PIDs, wait up to 10 s, then KILL what is left
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  local p left _
  for _ in $(seq 100); do
    left=; for p; do alive "$p" && left="$left $p"; done
    [ -n "$left" ] || return 0; sleep 0.1
  done; kill -KILL $left 2>/dev/null || true
}

do_status() {
  local f c pid rc=0
  while read -r f c; do
    if pid=$(live_pid "$f" "$c"); then echo "$c ($(basename "$f" .pid)): running, pid $pid"
    else echo "$c ($(basename "$f" .pid)): stopped"; rc=1; fi
  done < <(daemons)
  [ $rc = 0 ] && SLURM_CONF="$DIR/slurm.conf" sinfo -N -o '%N %t %G' 2>/dev/null || true
  return $rc
}

case $cmd in
  install) do_install ;;
  start | stop | status)
    [ -n "$DIR" ] || die "usage: $0 $cmd DIR"
    [ "$cmd" != start ] || mkdir -p "$DIR"
    DIR=$(cd "$DIR" 2>/dev/null && pwd -P) || die "no such directory: $2"   # absolute: it goes into slurm.conf
    "do_$cmd" ;;
  *) die "usage: $0 install | start DIR | stop DIR | status DIR" ;;
esac
