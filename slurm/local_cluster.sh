#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, to try the batch scripts without a
# real cluster (and to test them).  Debian/Ubuntu, as root.
#
#   bash slurm/local_cluster.sh start    # install slurm-wlm + munge if needed, start munged, slurmctld, slurmd
#   export SLURM_CONF=/tmp/hvd_dcasgd_slurm/slurm.conf
#   sbatch slurm/one_node.sbatch
#   bash slurm/local_cluster.sh stop     # cancel the jobs, stop the daemons this script started
#
# The configuration, state and logs live in $HVD_DCASGD_SLURM_DIR (default
# /tmp/hvd_dcasgd_slurm), never in /etc/slurm, so a machine's own SLURM set-up
# is left alone; commands find the cluster through SLURM_CONF.  The node
# declares $HVD_DCASGD_SLURM_CPUS CPUs (default 8) whatever the machine has, so
# a server and 4 workers fit on a 2-core machine.  No cgroups
# (proctrack/linuxproc, task/none), no accounting database, root runs the
# daemons.
set -euo pipefail

DIR="${HVD_DCASGD_SLURM_DIR:-/tmp/hvd_dcasgd_slurm}"
CPUS="${HVD_DCASGD_SLURM_CPUS:-8}"
CONF="$DIR/slurm.conf"
NODE="$(hostname -s)"
export SLURM_CONF="$CONF"

die() { echo "local_cluster.sh: $*" >&2; exit 1; }

# Run a daemon without the descriptors this script inherited beyond 0-2: a
# daemon that kept one open (munged does) would hold it -- a lock file of the
# caller's, say -- for as long as it runs.
daemon() {
    (
        for fd in /proc/$BASHPID/fd/*; do
            fd="${fd##*/}"
            if [ "$fd" -gt 2 ] 2>/dev/null; then eval "exec $fd>&-" 2>/dev/null || true; fi
        done
        exec "$@"
    )
}

install_packages() {
    local packages=(slurm-wlm munge)
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v sbatch >/dev/null && command -v munged >/dev/null; then
        return
    fi
    export DEBIAN_FRONTEND=noninteractive
    # A fresh machine may have stale or empty package lists: update, then retry once.
    if ! apt-get install -y -qq --no-install-recommends "${packages[@]}" >"$DIR/apt.log" 2>&1; then
        apt-get update -qq >>"$DIR/apt.log" 2>&1 || true
        apt-get install -y -qq --no-install-recommends "${packages[@]}" >>"$DIR/apt.log" 2>&1 \
            || die "apt-get could not install ${packages[*]} (see $DIR/apt.log)."
    fi
}

start_munge() {
    # Debian's package creates the key; create one if it is missing.
    if [ ! -s /etc/munge/munge.key ]; then
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        return  # a munged already answers (the machine's own, say): use it
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
    daemon runuser -u munge -- munged
    touch "$DIR/munged.ours"
    for _ in $(seq 50); do
        if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
        sleep 0.1
    done
    die "munged started but does not answer (see /var/log/munge/munged.log)."
}

# write_config DIR CLUSTER PARTITION NAME=ADDRESS...: DIR/slurm.conf for a
# cluster of these nodes, slurmctld on the first; with several nodes (on one
# machine), each its own spool and temporary directory, pid and log file
# ("%n": the node's name).  tests/cluster/slurm.sh's nodes use it too.
write_config() {
    local dir="$1" cluster="$2" partition="$3"; shift 3
    local per_node="" node name
    if [ $# -gt 1 ]; then per_node="-%n"; fi
    mkdir -p "$dir/state"
    {
        cat <<EOF
# Written by slurm/local_cluster.sh: $# node(s), $CPUS CPUs declared each, no cgroups.
ClusterName=$cluster
SlurmctldHost=${1%%=*}(${1#*=})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool$per_node
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd$per_node.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd$per_node.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
# The node has fewer real CPUs than declared: trust the declaration.
SlurmdParameters=config_overrides
ReturnToService=2
# Finished jobs stay visible to "scontrol show job" for 10 minutes.
MinJobAge=600
# A job told to stop (scancel, its time limit: SIGTERM) has this long to save
# its checkpoint before SIGKILL: set it above the longest checkpoint write.
KillWait=30
# The time limit is the time limit: SIGTERM when it comes, no grace minutes.
OverTimeLimit=0
EOF
        if [ -n "$per_node" ]; then
            echo "# Each node its own temporary directory (srun --mpi=pmix's files), as on separate machines."
            echo "TmpFS=$dir/tmp-%n"
        fi
        for node in "$@"; do
            name="${node%%=*}"
            if [ -n "$per_node" ]; then mkdir -p "$dir/spool-$name" "$dir/tmp-$name"; else mkdir -p "$dir/spool"; fi
            echo "NodeName=$name NodeAddr=${node#*=} CPUs=$CPUS State=UNKNOWN"
        done
        echo "PartitionName=$partition Nodes=ALL Default=YES MaxTime=INFINITE OverSubscribe=FORCE State=UP"
    } >"$dir/slurm.conf"
}

stop() {
    if [ -f "$CONF" ] && [ -f "$DIR/slurmctld.pid" ]; then
        timeout 10 scancel --full --quiet --user=root 2>/dev/null || true
    fi
    local name pid
    for name in slurmd slurmctld; do
        if [ -f "$DIR/$name.pid" ]; then
            pid="$(cat "$DIR/$name.pid")"
            # Only if that process is still the daemon (not a recycled pid).
            if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then
                kill "$pid"
                for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
                kill -9 "$pid" 2>/dev/null || true
            fi
            rm -f "$DIR/$name.pid"
        fi
    done
    if [ -f "$DIR/munged.ours" ]; then
        runuser -u munge -- munged --stop >/dev/null 2>&1 || true
        rm -f "$DIR/munged.ours"
    fi
}

start() {
    [ "$(id -u)" -eq 0 ] || die "starting a local SLURM cluster needs root (apt-get, munged, slurmd)."
    command -v apt-get >/dev/null || die "no apt-get: this script installs SLURM from Debian/Ubuntu packages."
    mkdir -p "$DIR"
    stop  # a cluster left over from an earlier start of this directory
    rm -rf "$DIR/state" "$DIR/spool"
    install_packages
    start_munge
    write_config "$DIR" hvd_dcasgd local "$NODE=127.0.0.1"
    daemon slurmctld -f "$CONF" || die "slurmctld did not start (see $DIR/slurmctld.log)."
    daemon slurmd -f "$CONF" || die "slurmd did not start (see $DIR/slurmd.log)."
    local state=""
    for _ in $(seq 150); do
        state="$(timeout 5 sinfo --noheader --nodes="$NODE" --format=%t 2>/dev/null || true)"
        case "$state" in idle*|mix*|alloc*) echo "export SLURM_CONF=$CONF"; return ;; esac
        sleep 0.2
    done
    die "node $NODE is not ready (state '${state:-none}'; see $DIR/slurmctld.log and $DIR/slurmd.log)."
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    # Only the packages and munged (for tests/cluster/slurm.sh, whose nodes share this machine's munged).
    munge)
        [ "$(id -u)" -eq 0 ] || die "starting munged needs root."
        mkdir -p "$DIR"; install_packages; start_munge ;;
    # Only the configuration: config DIR CLUSTER PARTITION NAME=ADDRESS... (for tests/cluster/slurm.sh).
    config)
        [ $# -ge 5 ] || die "usage: local_cluster.sh config DIR CLUSTER PARTITION NAME=ADDRESS..."
        shift; write_config "$@" ;;
    *) die "usage: local_cluster.sh start|stop|munge|config" ;;
esac
