#!/usr/bin/env bash
# Emulated multi-host cluster on one Linux machine (run as root).
#
# H "hosts" are network namespaces, each with one rate-limited NIC (veth,
# tc tbf in both directions) attached to a bridge in the root namespace.
# MPI ranks are started inside the namespaces by mpirun through a launch
# agent, so ranks of one host talk over shared memory (vader) and ranks of
# different hosts over TCP through their host's shaped NIC: the situation
# of paper 002 section 5 (fast devices inside a host, one slow NIC each).
#
# Usage:
#   cluster.sh [-H hosts] [-d ranks_per_host] [-n nics] [-r rate] [-b burst] [-m mtu] [-p] [-q] -- COMMAND [ARGS...]
#   -n: NICs per emulated host (default 1, at most 8), each shaped to the rate on its own: NIC k
#       of every host sits in subnet k (a "rail", eth<k> in the namespace), all on one bridge, and
#       each host routes by source address (a socket bound to eth<k>'s address leaves through
#       eth<k>, whatever subnet it talks to). MPI (btl tcp) uses eth0 only; the UCX runner opens
#       a worker on every eth<k> and sends each hop between hosts on the rail the plan gave it
#       (XMESH_UCX_NICS, XMESH_NICS_PER_HOST exported)
#   -m: MTU of every emulated NIC (default 1500). The kernel's work for the emulated NICs is
#       per packet (veth, bridge, tbf, TCP: no NIC offload), so at 1500 it takes host CPU a real
#       NIC would not; 9000 (jumbo frames) cuts it about six-fold (docs/RESULTS.md 2026-11-29)
#   -p: give each emulated host CPUs of its own, as real hosts have: every
#       process of host h (its Open MPI daemon, ranks and their threads) is
#       bound to CPUs {h, h + H, ...} mod nproc, and mpirun binds nothing
#       itself. Without -p all hosts share all CPUs, so a host that computes
#       slows the others down (and one that idles lends them CPU).
#   -b: token-bucket burst of each shaped NIC (tc units, default 256kb): transfers
#       smaller than it pass at full speed after an idle gap, so low rates with
#       small messages want a small burst (at least one 64 KiB GSO segment)
#   cluster.sh check        exit 0 if a cluster can be built here, 77 (with a
#                           message on stderr) if not
# COMMAND runs in the root namespace with these variables set:
#   XMH_MPIRUN    an mpirun wrapper carrying every launch flag; use it as
#                 "$XMH_MPIRUN -np $XMH_NP prog args"
#   XMH_NP        hosts x ranks_per_host (ranks are placed host-major)
#   XMH_HOSTS     number of hosts;  XMH_PPH  ranks per host
#   XMH_RATE_MBIT the shaped rate per NIC direction, Mbit/s
#   XMH_SUBNET    the private /24 used
#   XMESH_NIC_GBPS, XMESH_NICS_PER_HOST: the cost model of xmesh set to match
#   XMESH_UCX_NICS the NICs of every host (eth0,eth1,...) for the UCX runner
#   XMH_NICS      NICs per host
# Every name created carries the prefix xmh<pid>- ; tear-down runs on EXIT,
# INT and TERM and removes exactly the objects recorded as created.
set -u

HOSTS=4
PPH=4
RATE=300mbit
LATENCY=200ms
BURST=256kb
MTU=1500
QUIET=0
PIN=0
NICS=1

die() { echo "cluster.sh: $*" >&2; exit 1; }
skip() { echo "cluster.sh: SKIP: $*" >&2; exit 77; }
log() { [ "$QUIET" = 1 ] || echo "cluster.sh: $*" >&2; }

# Prerequisites; prints why not and exits 77 when the machine cannot host
# the emulated cluster.
check_prereq() {
    [ "$(id -u)" = 0 ] || skip "needs root (network namespaces, veth, tc)"
    for t in ip tc unshare mpirun; do
        command -v "$t" >/dev/null 2>&1 || skip "'$t' not found"
    done
    local probe="xmh$$-probe"
    if ! ip netns add "$probe" 2>/dev/null; then
        skip "cannot create network namespaces here (ip netns add failed)"
    fi
    ip netns del "$probe" 2>/dev/null
    if ! ip link add "xmh$$-pb" type bridge 2>/dev/null; then
        skip "cannot create a bridge here"
    fi
    ip link del "xmh$$-pb" 2>/dev/null
}

if [ "${1:-}" = check ]; then
    check_prereq
    exit 0
fi

while getopts "H:d:n:r:l:b:m:pqh" opt; do
    case "$opt" in
    H) HOSTS=$OPTARG ;;
    d) PPH=$OPTARG ;;
    n) NICS=$OPTARG ;;
    r) RATE=$OPTARG ;;
    l) LATENCY=$OPTARG ;;
    b) BURST=$OPTARG ;;
    m) MTU=$OPTARG ;;
    q) QUIET=1 ;;
    p) PIN=1 ;;
    h) sed -n '2,43p' "$0"; exit 0 ;;
    *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ "${1:-}" = -- ] && shift
[ $# -ge 1 ] || die "no command given (cluster.sh -h for help)"
case "$HOSTS" in '' | *[!0-9]*) die "-H '$HOSTS' is not a number" ;; esac
case "$PPH" in '' | *[!0-9]*) die "-d '$PPH' is not a number" ;; esac
[ "$HOSTS" -ge 1 ] && [ "$HOSTS" -le 200 ] || die "-H $HOSTS out of range [1, 200]"
[ "$PPH" -ge 1 ] || die "-d $PPH must be >= 1"
case "$NICS" in '' | *[!0-9]*) die "-n '$NICS' is not a number" ;; esac
[ "$NICS" -ge 1 ] && [ "$NICS" -le 8 ] || die "-n $NICS out of range [1, 8]"
case "$RATE" in
*mbit) RATE_MBIT=${RATE%mbit} ;;
*gbit) RATE_MBIT=$((${RATE%gbit} * 1000)) ;;
*) die "-r '$RATE': give NNNmbit or NNgbit" ;;
esac
case "$RATE_MBIT" in '' | *[!0-9]*) die "-r '$RATE' is not a rate" ;; esac

check_prereq

P="xmh$$-"
SCRATCH=$(mktemp -d "/tmp/${P}XXXXXX") || die "mktemp failed"
CREATED_NS=()
CREATED_LINKS=()
CHILD=

teardown() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$CHILD" ] && kill -0 "$CHILD" 2>/dev/null; then
        kill -TERM "$CHILD" 2>/dev/null
        sleep 1
        kill -KILL "$CHILD" 2>/dev/null
    fi
    # Processes left inside our namespaces were started by this script.
    for ns in "${CREATED_NS[@]}"; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    done
    for l in "${CREATED_LINKS[@]}"; do
        ip link del "$l" 2>/dev/null
    done
    for ns in "${CREATED_NS[@]}"; do
        ip netns del "$ns" 2>/dev/null
    done
    rm -rf "$SCRATCH"
    log "torn down (${#CREATED_NS[@]} namespaces, ${#CREATED_LINKS[@]} links)"
    exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A private /24 that no interface or route of this machine covers (besides
# the default route), so traffic can only reach our namespaces.
# With -n K, K such subnets: NIC k of every host is in SUBNETS[k].
SUBNETS=()
for x in $(seq 213 250) $(seq 100 212); do
    cand="10.$x.0"
    if ip -o route show to match "$cand.1" | grep -qv '^default'; then continue; fi
    if ip -o addr show | grep -q " $cand\."; then continue; fi
    SUBNETS+=("$cand")
    [ ${#SUBNETS[@]} -ge "$NICS" ] && break
done
[ ${#SUBNETS[@]} -ge "$NICS" ] || die "no $NICS free 10.x.0.0/24 subnets found"
SUBNET=${SUBNETS[0]}

BR="${P}br"
ip link add "$BR" type bridge || die "cannot create bridge $BR"
CREATED_LINKS+=("$BR")
sysctl -qw "net.ipv6.conf.$BR.disable_ipv6=1" 2>/dev/null
for ((k = 0; k < NICS; k++)); do
    ip addr add "${SUBNETS[$k]}.254/24" dev "$BR" || die "cannot address $BR"
done
ip link set "$BR" up || die "cannot bring $BR up"

MAP="$SCRATCH/hosts.map"
: >"$MAP"
HOSTLIST=
for ((h = 0; h < HOSTS; h++)); do
    ns="${P}h$h"
    ip netns add "$ns" || die "ip netns add $ns failed"
    CREATED_NS+=("$ns")
    ip link add "${P}v$h" type veth peer name "${P}n$h" || die "veth for host $h failed"
    CREATED_LINKS+=("${P}v$h")
    sysctl -qw "net.ipv6.conf.${P}v$h.disable_ipv6=1" 2>/dev/null
    ip link set "${P}n$h" netns "$ns" || die "moving veth into $ns failed"
    ip -n "$ns" link set "${P}n$h" name eth0 || die "renaming eth0 in $ns failed"
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 2>/dev/null
    ip -n "$ns" addr add "$SUBNET.$((h + 1))/24" dev eth0 || die "address in $ns failed"
    ip -n "$ns" link set lo up || die "lo up in $ns failed"
    ip -n "$ns" link set eth0 up || die "eth0 up in $ns failed"
    if [ "$MTU" != 1500 ]; then
        ip link set "${P}v$h" mtu "$MTU" && ip -n "$ns" link set eth0 mtu "$MTU" ||
            die "-m $MTU: the veth of host $h refused that MTU"
    fi
    ip link set "${P}v$h" master "$BR" || die "attaching ${P}v$h to $BR failed"
    ip link set "${P}v$h" up || die "${P}v$h up failed"
    # Host send: egress of eth0 inside the namespace. Host receive: egress
    # of the bridge-side end. burst must exceed one GSO segment (64 KiB).
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "${RATE_MBIT}mbit" burst "$BURST" \
        latency "$LATENCY" || die "tc (send) in $ns failed"
    tc qdisc add dev "${P}v$h" root tbf rate "${RATE_MBIT}mbit" burst "$BURST" latency "$LATENCY" ||
        die "tc (receive) on ${P}v$h failed"
    # NICs 1 .. K-1 (-n): the same, named eth<k>, in rail subnet k. ARP answers
    # only for the address of the NIC asked (one bridge carries every rail), and
    # traffic from NIC k's address leaves through NIC k (source routing).
    if [ "$NICS" -gt 1 ]; then
        ip netns exec "$ns" sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 ||
            die "arp sysctls in $ns failed"
        letters=(x a b c d e f g)
        uppers=(X A B C D E F G)
        for ((k = 1; k < NICS; k++)); do
            bside="${P}${letters[$k]}$h"
            nside="${P}${uppers[$k]}$h"
            ip link add "$bside" type veth peer name "$nside" || die "veth $k for host $h failed"
            CREATED_LINKS+=("$bside")
            sysctl -qw "net.ipv6.conf.$bside.disable_ipv6=1" 2>/dev/null
            ip link set "$nside" netns "$ns" || die "moving NIC $k into $ns failed"
            ip -n "$ns" link set "$nside" name "eth$k" || die "renaming eth$k in $ns failed"
            ip -n "$ns" addr add "${SUBNETS[$k]}.$((h + 1))/24" dev "eth$k" || die "address eth$k in $ns failed"
            ip -n "$ns" link set "eth$k" up || die "eth$k up in $ns failed"
            if [ "$MTU" != 1500 ]; then
                ip link set "$bside" mtu "$MTU" && ip -n "$ns" link set "eth$k" mtu "$MTU" ||
                    die "-m $MTU: NIC $k of host $h refused that MTU"
            fi
            ip link set "$bside" master "$BR" || die "attaching $bside to $BR failed"
            ip link set "$bside" up || die "$bside up failed"
            ip netns exec "$ns" tc qdisc add dev "eth$k" root tbf rate "${RATE_MBIT}mbit" burst "$BURST" \
                latency "$LATENCY" || die "tc (send) on eth$k in $ns failed"
            tc qdisc add dev "$bside" root tbf rate "${RATE_MBIT}mbit" burst "$BURST" latency "$LATENCY" ||
                die "tc (receive) on $bside failed"
        done
        for ((k = 0; k < NICS; k++)); do
            ip -n "$ns" rule add from "${SUBNETS[$k]}.$((h + 1))" table $((100 + k)) ||
                die "source rule of eth$k in $ns failed"
            for ((j = 0; j < NICS; j++)); do
                ip -n "$ns" route add "${SUBNETS[$j]}.0/24" dev "eth$k" src "${SUBNETS[$k]}.$((h + 1))" \
                    table $((100 + k)) || die "route of eth$k to rail $j in $ns failed"
            done
        done
    fi
    mkdir -p "$SCRATCH/$ns"
    cpus=all
    if [ "$PIN" = 1 ]; then
        ncpu=$(nproc)
        cpus=
        for ((c = h % ncpu; c < ncpu; c += HOSTS)); do cpus="${cpus:+$cpus,}$c"; done
    fi
    echo "$SUBNET.$((h + 1)) $ns $cpus" >>"$MAP"
    HOSTLIST="${HOSTLIST:+$HOSTLIST,}$SUBNET.$((h + 1)):$PPH"
done

# Launch agent: mpirun calls it like ssh ("agent [opts] HOST CMD..."). It
# maps the host address to our namespace and runs the command there with
# its own hostname and Open MPI session directory (vader keys its shared
# memory segments on both).
AGENT="$SCRATCH/agent"
cat >"$AGENT" <<AGENT_EOF
#!/bin/sh
while [ \$# -gt 0 ]; do
    case "\$1" in -*) shift ;; *) break ;; esac
done
host=\$1; shift
ns=\$(awk -v h="\$host" '\$1 == h { print \$2 }' "$MAP")
cpus=\$(awk -v h="\$host" '\$1 == h { print \$3 }' "$MAP")
pin=
[ "\$cpus" = all ] || pin="taskset -c \$cpus"
if [ -z "\$ns" ]; then
    echo "xmh agent: host '\$host' is not part of this emulated cluster" >&2
    exit 1
fi
exec ip netns exec "\$ns" unshare --uts \$pin sh -c "hostname \$ns && \
export OMPI_MCA_orte_tmpdir_base=$SCRATCH/\$ns && \$*"
AGENT_EOF
chmod +x "$AGENT"

BIND=
[ "$PIN" = 1 ] && BIND="--bind-to none"
MPIRUN="$SCRATCH/mpirun"
cat >"$MPIRUN" <<MPI_EOF
#!/bin/sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun --oversubscribe --mca plm_rsh_agent "$AGENT" --host "$HOSTLIST" \\
    --mca btl self,vader,tcp --mca btl_tcp_if_include "$SUBNET.0/24" \\
    --mca oob_tcp_if_include "$SUBNET.0/24" --mca mpi_yield_when_idle 1 $BIND "\$@"
MPI_EOF
chmod +x "$MPIRUN"

export XMH_MPIRUN="$MPIRUN" XMH_NP=$((HOSTS * PPH)) XMH_HOSTS="$HOSTS" XMH_PPH="$PPH"
export XMH_RATE_MBIT="$RATE_MBIT" XMH_SUBNET="$SUBNET.0/24"
export XMESH_NIC_GBPS
XMESH_NIC_GBPS=$(awk -v r="$RATE_MBIT" 'BEGIN { printf "%g", r / 1000 }')
export XMESH_NICS_PER_HOST=$NICS XMH_NICS=$NICS
XMESH_UCX_NICS=eth0
for ((k = 1; k < NICS; k++)); do XMESH_UCX_NICS="$XMESH_UCX_NICS,eth$k"; done
export XMESH_UCX_NICS
log "$HOSTS hosts x $PPH ranks, $NICS NIC(s) of ${RATE_MBIT} Mbit/s each way, subnet $SUBNET.0/24, prefix $P$([ "$PIN" = 1 ] && echo ", CPUs pinned per host")"

"$@" &
CHILD=$!
wait "$CHILD"
rc=$?
CHILD=
exit "$rc"
