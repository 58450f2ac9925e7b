#!/usr/bin/env bash
# A SLURM cluster on the emulated hosts of tests/cluster/hosts.sh: slurmctld
# on the first host, a slurmd on every host (each its own node, found by its
# hostname), munged shared through the file system.  Debian, as root.
#
#   bash tests/cluster/hosts.sh start a b
#   bash tests/cluster/slurm.sh start                  # nodes a and b, partition "emulated"
#   bash tests/cluster/hosts.sh exec a env SLURM_CONF=$HVD_DCASGD_HOSTS_DIR/slurm/slurm.conf \
#       sbatch slurm/multi_node.sbatch examples/train_digits.py --epochs 5
#   bash tests/cluster/slurm.sh stop
#
# SLURM's commands reach slurmctld at the first host's address, so run them
# on a host (hosts.sh exec).  Every node declares $HVD_DCASGD_SLURM_CPUS CPUs
# (default 8); no cgroups, no accounting; configuration, state and logs in
# $HVD_DCASGD_HOSTS_DIR/slurm.  The daemons listen on SLURM's default ports
# inside the hosts' namespaces only, so this cluster runs beside the one of
# slurm/local_cluster.sh.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
DIR="${HVD_DCASGD_HOSTS_DIR:-/tmp/hvd_dcasgd_hosts}"
NET="${HVD_DCASGD_HOSTS_NET:-10.213.24}"
CPUS="${HVD_DCASGD_SLURM_CPUS:-8}"
SLURM="$DIR/slurm"
CONF="$SLURM/slurm.conf"
export SLURM_CONF="$CONF"

die() { echo "slurm.sh: $*" >&2; exit 1; }
on() { bash "$HERE/hosts.sh" exec "$@"; }

mapfile -t NAMES < <(bash "$HERE/hosts.sh" names)

write_config() {
    local nodes=() i
    for i in "${!NAMES[@]}"; do nodes+=("${NAMES[$i]}=$NET.$((i + 1))"); done
    bash "$HERE/../../slurm/local_cluster.sh" config "$SLURM" hvd_emulated emulated "${nodes[@]}"
}

stop() {
    [ -f "$CONF" ] || return 0
    if [ ${#NAMES[@]} -gt 0 ] && [ -f "$SLURM/slurmctld.pid" ]; then
        on "${NAMES[0]}" timeout 10 scancel --full --quiet --user=root 2>/dev/null || true
    fi
    local pidfile pid name
    for pidfile in "$SLURM"/slurmd-*.pid "$SLURM/slurmctld.pid"; do
        [ -f "$pidfile" ] || continue
        pid="$(cat "$pidfile")"
        name="$(basename "$pidfile" .pid)"; name="${name%%-*}"
        if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then
            kill "$pid"
            for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -9 "$pid" 2>/dev/null || true
        fi
        rm -f "$pidfile"
    done
}

start() {
    [ "$(id -u)" -eq 0 ] || die "a SLURM cluster on emulated hosts needs root."
    [ ${#NAMES[@]} -gt 0 ] || die "no emulated hosts: start them first (bash tests/cluster/hosts.sh start a b)."
    stop
    rm -rf "$SLURM"
    mkdir -p "$SLURM"
    HVD_DCASGD_SLURM_DIR="$SLURM" bash "$HERE/../../slurm/local_cluster.sh" munge
    write_config
    on "${NAMES[0]}" slurmctld -f "$CONF" || die "slurmctld did not start (see $SLURM/slurmctld.log)."
    local name state=""
    for name in "${NAMES[@]}"; do
        on "$name" slurmd -f "$CONF" -N "$name" || die "slurmd did not start on $name (see $SLURM/slurmd-$name.log)."
    done
    for _ in $(seq 150); do
        state="$(on "${NAMES[0]}" timeout 5 sinfo --noheader --format=%t 2>/dev/null | sort -u | tr '\n' ' ' || true)"
        case "$state" in idle\ |mix\ |"idle mix "|"alloc "|"alloc idle "|"alloc mix ") echo "export SLURM_CONF=$CONF"; return ;; esac
        sleep 0.2
    done
    die "nodes ${NAMES[*]} are not ready (states '${state:-none}'; see $SLURM/slurmctld.log and $SLURM/slurmd-*.log)."
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) die "usage: slurm.sh start|stop" ;;
esac
