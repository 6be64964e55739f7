#!/usr/bin/env bash
# A throwaway Slurm cluster on this one machine, for tests: munged, slurmctld
# and two slurmd nodes, each daemon in a network namespace of its own with an
# address of its own on a private bridge (10.77.0.0/24 exists only inside the
# namespaces; the host's own network is not touched).
#
#   scripts/slurm_test_cluster.sh up DIR     # prints the env to use it
#   scripts/slurm_test_cluster.sh down DIR   # kills the daemons, removes the namespaces
#   scripts/slurm_test_cluster.sh exec CMD   # runs CMD in the controller namespace
#
# Layout:  ns rlm-ctl: bridge rlmbr0 10.77.0.1 (slurmctld, the coordinator)
#          ns rlm-n1:  eth0 10.77.0.11 (slurmd node1)
#          ns rlm-n2:  eth0 10.77.0.12 (slurmd node2)
# Each daemon also gets a UTS namespace, so roles on node1 see hostname node1.
# Needs root, slurm-wlm and munge (scripts/setup.sh installs them).
set -euo pipefail

CTL=rlm-ctl
NODES=(rlm-n1 rlm-n2)
NODE_NAMES=(node1 node2)
NODE_ADDRS=(10.77.0.11 10.77.0.12)
CTL_ADDR=10.77.0.1

die() { echo "slurm_test_cluster: $*" >&2; exit 1; }

down() {
  local dir=$1
  for f in "$dir"/pids/*.pid; do
    [ -e "$f" ] || continue
    local pid
    pid=$(cat "$f" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null || true; fi
  done
  sleep 1
  for f in "$dir"/pids/*.pid; do
    [ -e "$f" ] || continue
    local pid
    pid=$(cat "$f" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    rm -f "$f"
  done
  # Anything left running in our namespaces (job steps) goes too.
  for ns in "$CTL" "${NODES[@]}"; do
    if ip netns list | grep -qw "$ns"; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
}

up() {
  local dir=$1
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, slurmd)"
  for b in munged slurmctld slurmd sbatch srun; do
    command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] || die "$b not found: run scripts/setup.sh (installs slurm-wlm and munge)"
  done
  down "$dir" || true
  mkdir -p "$dir"/{pids,log,state,spool,munge}
  for n in "${NODE_NAMES[@]}"; do mkdir -p "$dir/spool/$n"; done
  chmod 755 "$dir" "$dir/munge"

  # --- network ---------------------------------------------------------------
  ip netns add "$CTL"
  ip -n "$CTL" link set lo up
  ip -n "$CTL" link add rlmbr0 type bridge
  ip -n "$CTL" addr add "$CTL_ADDR/24" dev rlmbr0
  ip -n "$CTL" link set rlmbr0 up
  for i in "${!NODES[@]}"; do
    local ns=${NODES[$i]}
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$CTL" link add "veth$i" type veth peer name eth0 netns "$ns"
    ip -n "$CTL" link set "veth$i" master rlmbr0
    ip -n "$CTL" link set "veth$i" up
    ip -n "$ns" addr add "${NODE_ADDRS[$i]}/24" dev eth0
    ip -n "$ns" link set eth0 up
  done

  # --- munge -------------------------------------------------------------------
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge/munge.key"
  /usr/sbin/munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.sock" \
    --pid-file="$dir/pids/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munge.seed" \
    || die "munged did not start; see $dir/log/munged.log"

  # --- slurm.conf ----------------------------------------------------------------
  cat > "$dir/slurm.conf" <<CONF
ClusterName=rlmtest
SlurmctldHost=ctl($CTL_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/pids/slurmctld.pid
SlurmdPidFile=$dir/pids/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/linear
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=5
InactiveLimit=0
MinJobAge=30
NodeName=${NODE_NAMES[0]} NodeAddr=${NODE_ADDRS[0]} CPUs=2 State=UNKNOWN
NodeName=${NODE_NAMES[1]} NodeAddr=${NODE_ADDRS[1]} CPUs=2 State=UNKNOWN
PartitionName=test Nodes=${NODE_NAMES[0]},${NODE_NAMES[1]} Default=YES MaxTime=INFINITE State=UP
CONF
  # No cgroup enforcement (roles share the machine), but slurmd 22.05 loads
  # a cgroup plugin anyway: point it at the v1 hierarchy this host mounts.
  cat > "$dir/cgroup.conf" <<CONF
CgroupPlugin=${RLMESH_SLURM_CGROUP_PLUGIN:-cgroup/v1}
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
CONF
  export SLURM_CONF="$dir/slurm.conf"

  # --- daemons ---------------------------------------------------------------------
  ip netns exec "$CTL" unshare --uts sh -c "hostname ctl; exec /usr/sbin/slurmctld -i" \
    || die "slurmctld did not start; see $dir/log/slurmctld.log"
  for i in "${!NODES[@]}"; do
    ip netns exec "${NODES[$i]}" unshare --uts sh -c "hostname ${NODE_NAMES[$i]}; exec /usr/sbin/slurmd -N ${NODE_NAMES[$i]}" \
      || die "slurmd ${NODE_NAMES[$i]} did not start; see $dir/log/slurmd-${NODE_NAMES[$i]}.log"
  done
  # Both nodes idle within 60 s.
  local deadline=$((SECONDS + 60)) idle=0
  while [ $SECONDS -lt $deadline ]; do
    idle=$(ip netns exec "$CTL" sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle' || true)
    [ "$idle" = 2 ] && break
    sleep 1
  done
  if [ "$idle" != 2 ]; then
    ip netns exec "$CTL" sinfo -N 2>&1 | sed 's/^/  /' >&2 || true
    die "nodes not idle after 60 s; see $dir/log/"
  fi
  echo "SLURM_CONF=$dir/slurm.conf"
}

case "${1:-}" in
  up) [ $# = 2 ] || die "usage: $0 up DIR"; up "$2" ;;
  down) [ $# = 2 ] || die "usage: $0 down DIR"; down "$2" ;;
  exec) shift; exec ip netns exec "$CTL" "$@" ;;
  *) die "usage: $0 up|down DIR | exec CMD..." ;;
esac
