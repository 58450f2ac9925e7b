#!/usr/bin/env bash
# Emulated hosts on this machine: each one its own network, UTS (hostname)
# and mount namespace, with an address on a private virtual switch, the
# others' names in its /etc/hosts, and an SSH server, so that mpirun's remote
# launch (ssh NAME orted ...) and SLURM's daemons run across them for real.
# Debian, as root.
#
#   bash tests/cluster/hosts.sh start a b c     # three hosts (default: a b)
#   bash tests/cluster/hosts.sh exec a hostname # a command on host a, in the current directory
#   bash tests/cluster/hosts.sh exec a ssh b hostname
#   bash tests/cluster/hosts.sh pids b          # the processes running on host b
#   bash tests/cluster/hosts.sh link b down     # pull host b's cable (up: plug it back)
#   bash tests/cluster/hosts.sh kill b          # every process on host b killed at once (sshd too)
#   bash tests/cluster/hosts.sh boot b          # host b back: its cable plugged in, its sshd started
#   bash tests/cluster/hosts.sh stop            # stop every daemon, remove every namespace
#
# Traffic stays inside: the hosts' addresses ($HVD_DCASGD_HOSTS_NET.1, .2, ...,
# default 10.213.24.0/24) exist only on interfaces inside the hosts'
# namespaces, joined by a bridge in a namespace of its own; nothing is
# added to this machine's own network namespace (no interface, address or
# route), and no namespace has a route anywhere else.  The hosts share this
# machine's file system (as a cluster shares its home directories), except
# for /etc/hosts and /etc/ssh/ssh_config, which each host's mount namespace
# replaces with the cluster's own; root's login there is passwordless with a
# key of the cluster's.  State, keys and logs live in $HVD_DCASGD_HOSTS_DIR
# (default /tmp/hvd_dcasgd_hosts); namespaces are named
# $HVD_DCASGD_HOSTS_PREFIX-NAME (default hvd24); start stops an earlier
# cluster of the same directory first, and stop may be run any number of times.
set -euo pipefail

DIR="${HVD_DCASGD_HOSTS_DIR:-/tmp/hvd_dcasgd_hosts}"
PREFIX="${HVD_DCASGD_HOSTS_PREFIX:-hvd24}"
NET="${HVD_DCASGD_HOSTS_NET:-10.213.24}"
SWITCH="$PREFIX-switch"

die() { echo "hosts.sh: $*" >&2; exit 1; }

names() { [ -f "$DIR/names" ] && cat "$DIR/names" || true; }

# Run "$@" inside host $1's namespaces, in the current directory (entering a
# mount namespace moves to its root, so go back).
enter() {
    local name="$1"; shift
    [ -e "$DIR/ns/$name.mnt" ] || die "no host $name (started: $(names | tr '\n' ' '))."
    nsenter --net="/run/netns/$PREFIX-$name" --uts="$DIR/ns/$name.uts" --mount="$DIR/ns/$name.mnt" \
        --wd="$PWD" -- "$@"
}

install_packages() {
    command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] && return
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq --no-install-recommends openssh-server openssh-client >"$DIR/apt.log" 2>&1; then
        apt-get update -qq >>"$DIR/apt.log" 2>&1 || true
        apt-get install -y -qq --no-install-recommends openssh-server openssh-client >>"$DIR/apt.log" 2>&1 \
            || die "apt-get could not install openssh-server (see $DIR/apt.log)."
    fi
}

write_files() {
    local names=("$@") i addresses=()
    mkdir -p "$DIR/ns" "$DIR/etc" "$DIR/ssh" "$DIR/run"
    chmod 0700 "$DIR/ssh"
    printf '%s\n' "${names[@]}" >"$DIR/names"
    {
        echo "127.0.0.1 localhost"
        for i in "${!names[@]}"; do echo "$NET.$((i + 1)) ${names[$i]}"; done
    } >"$DIR/etc/hosts"
    for i in "${!names[@]}"; do addresses+=("${names[$i]}" "$NET.$((i + 1))"); done
    [ -s "$DIR/ssh/host_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -C "hvd_dcasgd emulated host" -f "$DIR/ssh/host_ed25519"
    [ -s "$DIR/ssh/id_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -C "hvd_dcasgd emulated cluster" -f "$DIR/ssh/id_ed25519"
    cp "$DIR/ssh/id_ed25519.pub" "$DIR/ssh/authorized_keys"
    local IFS=,
    echo "${addresses[*]} $(cut -d' ' -f1-2 "$DIR/ssh/host_ed25519.pub")" >"$DIR/ssh/known_hosts"
    unset IFS
    # Every host's /etc/ssh/ssh_config: the cluster's key, its known hosts,
    # no prompt, and a dead peer noticed within 15 s.
    cat >"$DIR/ssh/ssh_config" <<EOF
# Written by tests/cluster/hosts.sh: /etc/ssh/ssh_config inside the emulated hosts.
Host *
    User root
    IdentityFile $DIR/ssh/id_ed25519
    UserKnownHostsFile $DIR/ssh/known_hosts
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    BatchMode yes
    ConnectTimeout 10
    ServerAliveInterval 5
    ServerAliveCountMax 3
    LogLevel ERROR
EOF
    for i in "${!names[@]}"; do
        cat >"$DIR/ssh/sshd_config.${names[$i]}" <<EOF
# Written by tests/cluster/hosts.sh: the SSH server of emulated host ${names[$i]}.
ListenAddress $NET.$((i + 1))
HostKey $DIR/ssh/host_ed25519
PidFile $DIR/run/sshd.${names[$i]}.pid
AuthorizedKeysFile $DIR/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# $DIR may sit in a world-writable /tmp.
StrictModes no
AcceptEnv LANG LC_*
MaxStartups 100:30:200
MaxSessions 100
LogLevel ERROR
EOF
    done
}

start_host() {
    local name="$1" address="$2" ns="$PREFIX-$1"
    ip netns add "$ns"
    ip -n "$ns" link set dev lo up
    # IPv4 only: no link-local IPv6 addresses to wander onto.
    ip netns exec "$ns" sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    # A peer that stops answering breaks a TCP connection with data in flight
    # after 5 retransmissions (about 10 s) instead of Linux's 15 (about 15
    # minutes): mpirun, told to abort while a host is gone, waits for that
    # host's daemon until its connection breaks (see docs/TESTING.md).
    ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_retries2=5
    # The cable: eth0 in the host, "$name" on the switch; neither end ever in this machine's namespace.
    ip link add eth0 netns "$ns" type veth peer name "$name" netns "$SWITCH"
    ip -n "$SWITCH" link set dev "$name" master br0 up
    ip -n "$ns" addr add "$address/24" dev eth0
    ip -n "$ns" link set dev eth0 up
    # Its hostname and its /etc/hosts and /etc/ssh/ssh_config, in namespaces kept by bind mounts.
    touch "$DIR/ns/$name.uts" "$DIR/ns/$name.mnt"
    unshare --uts="$DIR/ns/$name.uts" --mount="$DIR/ns/$name.mnt" --propagation private \
        sh -c 'hostname "$1" && mount --bind "$2/etc/hosts" /etc/hosts && mount --bind "$2/ssh/ssh_config" /etc/ssh/ssh_config' \
        set-up "$name" "$DIR"
    start_sshd "$name"
}

start_sshd() {
    local name="$1" pid
    pid="$(cat "$DIR/run/sshd.$name.pid" 2>/dev/null || true)"
    # Running already: that pid is an sshd inside this host.
    if [ -n "$pid" ] && ip netns pids "$PREFIX-$name" | grep -qx "$pid"; then return; fi
    mkdir -p /run/sshd
    enter "$name" /usr/sbin/sshd -f "$DIR/ssh/sshd_config.$name" -E "$DIR/run/sshd.$name.log"
}

# Host $1 back after "link down" or "kill": its cable plugged in, its SSH
# server running, reachable from the first host.
boot() {
    local name="$1" first
    grep -qx "$name" <(names) || die "no host $name."
    ip -n "$SWITCH" link set dev "$name" up
    start_sshd "$name"
    first="$(names | head -n 1)"
    for _ in $(seq 50); do
        if [ "$(enter "$first" timeout 20 ssh "$name" hostname 2>/dev/null)" = "$name" ]; then return; fi
        sleep 0.2
    done
    die "host $first cannot ssh to $name after booting it (see $DIR/run/sshd.$name.log)."
}

start() {
    [ "$(id -u)" -eq 0 ] || die "emulated hosts need root (network namespaces, sshd)."
    local names=("$@")
    [ ${#names[@]} -gt 0 ] || names=(a b)
    [ ${#names[@]} -le 250 ] || die "at most 250 hosts."
    local name
    for name in "${names[@]}"; do
        [[ "$name" =~ ^[a-z][a-z0-9-]{0,14}$ ]] || die "a host name is a lowercase letter, then letters, digits or '-' (at most 15), not '$name'."
    done
    mkdir -p "$DIR"
    stop
    install_packages
    write_files "${names[@]}"
    ip netns add "$SWITCH"
    ip netns exec "$SWITCH" sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    ip -n "$SWITCH" link add br0 type bridge
    ip -n "$SWITCH" link set br0 up
    local i
    for i in "${!names[@]}"; do start_host "${names[$i]}" "$NET.$((i + 1))"; done
    # Ready when every host reaches every other by name over SSH.
    local from to
    for from in "${names[@]}"; do
        for to in "${names[@]}"; do
            for _ in $(seq 50); do
                if [ "$(enter "$from" timeout 20 ssh "$to" hostname 2>/dev/null)" = "$to" ]; then continue 2; fi
                sleep 0.2
            done
            die "host $from cannot ssh to $to (see $DIR/run/sshd.$to.log)."
        done
    done
    echo "hosts.sh: ${names[*]} up on $NET.0/24; run a command on one with: bash $0 exec ${names[0]} COMMAND"
}

# Kill every process left in host $1's network namespace (its sshd, what
# ssh or SLURM started there): what "the machine is gone" means.
kill_host() {
    local ns="$PREFIX-$1" pids
    [ -e "/run/netns/$ns" ] || return 0
    for _ in $(seq 50); do
        pids="$(ip netns pids "$ns" 2>/dev/null || true)"
        [ -n "$pids" ] || return 0
        # shellcheck disable=SC2086
        kill -9 $pids 2>/dev/null || true
        sleep 0.1
    done
}

stop() {
    local name
    for name in $(names); do
        kill_host "$name"
        for kind in uts mnt; do
            if [ -e "$DIR/ns/$name.$kind" ]; then
                umount "$DIR/ns/$name.$kind" 2>/dev/null || true
                rm -f "$DIR/ns/$name.$kind"
            fi
        done
        ip netns del "$PREFIX-$name" 2>/dev/null || true
        rm -f "$DIR/run/sshd.$name.pid"
    done
    ip netns del "$SWITCH" 2>/dev/null || true
    rm -f "$DIR/names"
}

case "${1:-}" in
    start) shift; start "$@" ;;
    stop) stop ;;
    exec) shift; [ $# -ge 2 ] || die "usage: hosts.sh exec NAME COMMAND..."; enter "$@" ;;
    pids) [ $# -eq 2 ] || die "usage: hosts.sh pids NAME"; ip netns pids "$PREFIX-$2" ;;
    kill) [ $# -eq 2 ] || die "usage: hosts.sh kill NAME"; kill_host "$2" ;;
    link)
        [ $# -eq 3 ] && [[ "$3" =~ ^(up|down)$ ]] || die "usage: hosts.sh link NAME up|down"
        grep -qx "$2" <(names) || die "no host $2."
        ip -n "$SWITCH" link set dev "$2" "$3"
        ;;
    boot) [ $# -eq 2 ] || die "usage: hosts.sh boot NAME"; boot "$2" ;;
    names) names ;;
    *) die "usage: hosts.sh start [NAME...] | stop | exec NAME COMMAND... | pids NAME | kill NAME | boot NAME | link NAME up|down | names" ;;
esac
