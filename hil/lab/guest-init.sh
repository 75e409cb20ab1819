#!/bin/bash
# pytest-san lab guest init: `san-hil lab up` copies it into the lab's state directory and virtme-ng runs it
# inside each guest (as root). The markers the controller waits for and the management NIC's address come as
# options (hil/lab/guest.py's guest_exec), so each is written in one place. --proxy-ko loads the proxy
# driver's kernel module (san_proxy.ko, built for the lab kernel) before the guest says it is ready.
#   guest-init.sh --ready MARKER --failed MARKER --mgmt-cidr CIDR [--proxy-ko SAN_PROXY_KO] \
#       boot NAME LAB_MAC LAB_CIDR MGMT_MAC HOST_KEY AUTHORIZED_KEYS [HUGEPAGES [rxe|siw [SIW_KO]]]
#   guest-init.sh find-nic MAC        # prints the interface that has MAC
#   guest-init.sh wait-file PATH SECONDS   # status 0 once PATH exists, 1 after SECONDS without it
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SYSFS_NET=${SAN_LAB_SYSFS_NET:-/sys/class/net}
USAGE="usage: $0 --ready MARKER --failed MARKER --mgmt-cidr CIDR [--proxy-ko KO] boot NAME LAB_MAC LAB_CIDR \
MGMT_MAC HOST_KEY AUTHORIZED_KEYS [HUGEPAGES [rxe|siw [SIW_KO]]] | find-nic MAC | wait-file PATH SECONDS"

READY_MARKER='' FAILED_MARKER='' MGMT_CIDR='' PROXY_KO=''
while [ $# -gt 0 ]; do
    case "$1" in
        --ready) READY_MARKER=${2:?"$USAGE"}; shift 2 ;;
        --failed) FAILED_MARKER=${2:?"$USAGE"}; shift 2 ;;
        --mgmt-cidr) MGMT_CIDR=${2:?"$USAGE"}; shift 2 ;;
        --proxy-ko) PROXY_KO=${2:?"$USAGE"}; shift 2 ;;
        *) break ;;
    esac
done

find_nic() {
    local want dir
    want=$(printf '%s' "$1" | tr 'A-F' 'a-f')
    for dir in "$SYSFS_NET"/*; do
        [ -r "$dir/address" ] || continue
        if [ "$(cat "$dir/address" 2>/dev/null)" = "$want" ]; then
            basename "$dir"
            return 0
        fi
    done
    return 1
}

wait_nic() {  # MAC SECONDS: virtio-net may still be probing when we start
    local tries=$(( $2 * 10 ))
    while [ "$tries" -gt 0 ]; do
        find_nic "$1" && return 0
        sleep 0.1
        tries=$(( tries - 1 ))
    done
    return 1
}

wait_file() {  # PATH SECONDS: until PATH exists
    local tries=$(( $2 * 10 ))
    while [ ! -e "$1" ]; do
        [ "$tries" -gt 0 ] || return 1
        sleep 0.1
        tries=$(( tries - 1 ))
    done
}

fail() {
    echo "$FAILED_MARKER $NAME: $*"
    ip -br link 2>&1 | sed 's/^/  /'
    exit 1  # the guest powers off; the controller shows this console and retries once
}

step() { echo "san-lab: $NAME: $*"; }

dmesg_tail() {  # on one line: the failed marker's reason is its line
    dmesg 2>&1 | tail -n "${1:-3}" | tr '\n' ';'
}

load_module() {  # KO: an out-of-tree module; modules.dep does not know it, so insmod loads nothing it needs
    local dep
    for dep in $(modinfo -F depends "$1" | tr ',' ' '); do
        modprobe "$dep" || fail "modprobe $dep (for $(basename "$1")) failed"
    done
    insmod "$1" || fail "insmod $1 failed: $(dmesg_tail 5)"
}

boot() {
    if [ -z "$READY_MARKER" ] || [ -z "$FAILED_MARKER" ] || [ -z "$MGMT_CIDR" ] || [ $# -lt 6 ]; then
        echo "$USAGE" >&2
        exit 2
    fi
    NAME=$1 LAB_MAC=$2 LAB_CIDR=$3 MGMT_MAC=$4 HOST_KEY=$5 AUTH_KEYS=$6 HUGEPAGES=${7:-0} PROVIDER=${8:-rxe}
    SIW_KO=${9:-}
    step "init started"
    modprobe virtio_net 2>/dev/null
    LAB=$(wait_nic "$LAB_MAC" 60) || fail "no NIC with MAC $LAB_MAC"
    MGMT=$(wait_nic "$MGMT_MAC" 60) || fail "no NIC with MAC $MGMT_MAC"
    ip link set lo up
    ip addr add "$MGMT_CIDR" dev "$MGMT" && ip link set "$MGMT" up || fail "cannot configure $MGMT"
    ip addr add "$LAB_CIDR" dev "$LAB" && ip link set "$LAB" up || fail "cannot configure $LAB"
    step "lab NIC $LAB ($LAB_MAC) $LAB_CIDR, management NIC $MGMT ($MGMT_MAC)"
    # One provider per guest: rxe and siw on one netdev conflict (RDMA CM picks by address).
    case "$PROVIDER" in
        rxe)
            DEV=rxe0
            modprobe rdma_rxe || fail "modprobe rdma_rxe failed" ;;
        siw)
            DEV=siw0
            load_module "$SIW_KO"  # after what it depends on: ib_core, libcrc32c
            # iWARP runs over TCP: a peer that vanished (its link down) is noticed only when TCP gives up
            # retransmitting, after about 15 min with the default tcp_retries2 of 15; 5 gives up after
            # about 13 s, as RoCE's retry count does within seconds.
            echo 5 >/proc/sys/net/ipv4/tcp_retries2 || fail "cannot set net.ipv4.tcp_retries2 to 5" ;;
        *) fail "unknown provider $PROVIDER" ;;
    esac
    rdma link add "$DEV" type "$PROVIDER" netdev "$LAB" || fail "rdma link add $DEV on $LAB failed"
    step "$(rdma link show "$DEV"/1 2>&1)"
    # 2 MiB hugetlb pages: the proxy's contiguous memory and common DMA buffers (P3-P5) come from them.
    if [ "$HUGEPAGES" -gt 0 ]; then
        echo "$HUGEPAGES" >/proc/sys/vm/nr_hugepages
        step "hugetlb pages: $(cat /proc/sys/vm/nr_hugepages) of $HUGEPAGES asked for"
    fi
    # The proxy driver's module: the agent uses /dev/san_proxy when it is there, its stand-in otherwise.
    if [ -n "$PROXY_KO" ]; then
        load_module "$PROXY_KO"
        wait_file /dev/san_proxy 10 || fail "san_proxy is loaded but /dev/san_proxy did not appear: $(dmesg_tail 5)"
        step "san_proxy loaded: $(grep '^san_proxy ' /proc/modules)"
    fi

    # sshd with the lab's host key, root login with the lab's client key only. / is read-only and
    # /run is a fresh tmpfs: everything sshd needs goes there, with the modes it insists on.
    # UsePAM: virtme-ng-init locks every account in its /etc/shadow ("!"), and sshd without PAM
    # refuses a locked account even a public key.
    local d=/run/san-lab
    mkdir -p "$d" /run/sshd && chmod 755 /run/sshd
    install -m 600 "$HOST_KEY" "$d/host_key" && install -m 644 "$AUTH_KEYS" "$d/authorized_keys" \
        || fail "cannot copy the lab's SSH keys"
    cat >"$d/sshd_config" <<EOF
Port 22
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile $d/authorized_keys
UsePAM yes
StrictModes no
UseDNS no
PrintMotd no
PidFile $d/sshd.pid
Subsystem sftp internal-sftp
EOF
    # The agent pins registered memory. pam_limits starts sessions from PID 1's limits (virtme-ng-init:
    # 8 MiB), so raise those too; root has CAP_IPC_LOCK anyway, this is for a non-root agent.
    ulimit -l unlimited
    prlimit --pid 1 --memlock=unlimited:unlimited 2>/dev/null
    # Every SSH command runs through root's shell, and bash reads ~/.bashrc for it: the host's, made for
    # interactive use on the host (pyenv init costs seconds under TCG and warns of read-only shims).
    # Hide it in this guest only; the controller names interpreters by absolute path anyway.
    [ -f /root/.bashrc ] && mount --bind /dev/null /root/.bashrc
    rm -f /run/nologin /var/run/nologin  # "System is booting up" on every login otherwise
    rm -f "$d/sshd.pid"
    /usr/sbin/sshd -f "$d/sshd_config" -h "$d/host_key" -E "$d/sshd.log" \
        || fail "sshd did not start: $(tail -n 5 "$d/sshd.log" 2>&1)"
    # sshd forks into the background before it binds port 22, and writes its pid file once it listens:
    # the ready marker must not come before that, or the first SSH attempt meets a closed port.
    wait_file "$d/sshd.pid" 60 || fail "sshd is not listening after 60 s: $(tail -n 5 "$d/sshd.log" 2>&1)"
    echo "$READY_MARKER $NAME netdev=$LAB mgmt=$MGMT${PROXY_KO:+ proxy=san_proxy}"
    while :; do sleep 3600; done  # the guest lives as long as this script
}

case "${1:-}" in
    boot) shift; boot "$@" ;;
    find-nic) find_nic "$2" ;;
    wait-file) wait_file "$2" "$3" ;;
    *) echo "$USAGE" >&2
       exit 2 ;;
esac
