#!/usr/bin/env bash
# softverbs' 8-byte RC send latency beside the peers the issues name (UCX
# and libfabric), all measured in one run, round after round, so that the
# host's changes of speed hit every row alike. Two processes per
# measurement, the server on CPU 1 and the client on CPU 0, as the anchors.
#
#   shm: the raw flag ping-pong (../shared/anchors/shm_pingpong.c, median
#        one way); UCX `ucx_perftest -t tag_lat` over posix shared memory
#        (UCX_TLS=posix,self; median one way); libfabric `fi_pingpong -p shm
#        -e rdm` (average per transfer = one way); `softverbs perf send_lat
#        --link shm` (typical = median one way).
#   udp: the raw UDP busy-poll ping-pong (udp_pingpong.c, median one way;
#        connected sockets); the same over unconnected sockets, which a
#        RoCEv2 sender over IPv4 must use (benches/kernel/udp_modes.c, its
#        IPv4 unconnected line: the kernel's floor for softverbs' UDP link);
#        libfabric's udp provider (unreliable datagrams, `-e dgram`), the
#        reliable rxd layer on it (`-p "udp;ofi_rxd" -e rdm`) and its tcp
#        provider (`-e msg`); UCX tag_lat over TCP (UCX_TLS=tcp,self);
#        `softverbs perf send_lat --link udp`.
#
# Each row prints every round's figure in µs and their median; the summary
# gives softverbs' median as a ratio to each peer's median, and the same
# ratio taken round by round (median, range, and the rounds in which
# softverbs' figure was the smaller: for bandwidth rows, the rounds it
# lost). A peer whose tool is missing is skipped with a line saying how
# to get it (Debian: apt-get install ucx-utils libfabric-bin).
#
# Last, the shared-memory issue's goals (#11), per build: the 8-byte send
# one way at or below 0.3 µs, below libfabric's shm provider and within 2x
# UCX; with PEERS_BW=1, WRITE at 64 KiB and 1 MiB at least 0.8x memcpy.
# Each line says met or MISSED on the medians (the bandwidth and peer
# goals as the ratio of the rows' medians) and in how many rounds the
# goal held on that round's own figures.
#
# With PEERS_BW=1, also RDMA WRITE bandwidth over shm at 64 KiB and 1 MiB:
# single-thread memcpy of that size (memcpy_bw.c, best of 3), UCX
# `ucp_put_bw` over posix shared memory, and `softverbs perf write_bw
# --link shm`, in MiB/s (UCX prints MB/s of 2^20 bytes).
#
# The CLI measured is target/release/softverbs, or $SOFTVERBS_BIN; when
# benches/pgo.sh has left its build in target/pgo, that one is measured too
# if it was built from the sources as they are now (benches/source_state.sh).
#
# usage: benches/run_peers.sh [rounds (5)] [anchors dir]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
rounds="${1:-5}"
anchors="${2:-$root/../shared/anchors}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"; jobs -p | xargs -r kill 2>/dev/null || true' EXIT

for p in shm_pingpong udp_pingpong memcpy_bw; do
    gcc -O2 -march=native -o "$tmp/$p" "$anchors/$p.c"
done
gcc -O2 -march=native -I "$anchors" -o "$tmp/udp_modes" "$here/kernel/udp_modes.c"
(cd "$root" && cargo build --release -q)
builds=("${SOFTVERBS_BIN:-$root/target/release/softverbs}")
pgo="$root/target/pgo/use/release/softverbs"
if [ -x "$pgo" ] && [ -z "${SOFTVERBS_BIN:-}" ]; then
    # Only a PGO build of these very sources: one left from another commit
    # (or from before an edit) would be measured under the same name.
    if [ "$(cat "$root/target/pgo/use/SOURCE_STATE" 2>/dev/null)" = "$(bash "$here/source_state.sh")" ]; then
        builds+=("$pgo")
    else
        echo "== skipping the PGO build in target/pgo: built from other sources (run benches/pgo.sh again)"
    fi
fi
for i in "${!builds[@]}"; do echo "== softverbs build $i: ${builds[$i]}"; done

have() { command -v "$1" >/dev/null 2>&1; }
have ucx_perftest || echo "SKIP UCX rows: ucx_perftest not found (Debian: apt-get install ucx-utils)"
have fi_pingpong || echo "SKIP libfabric rows: fi_pingpong not found (Debian: apt-get install libfabric-bin)"

port=18900
next_port() { port=$((port + 1)); }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | head -1; }

# pair SERVER... -- CLIENT...: the server on CPU 1 (its output dropped),
# then the client on CPU 0; prints the client's output and waits for the
# server. (Callers take a fresh $port with next_port first, outside the
# pipeline they put this in.)
pair() {
    local srv=()
    while [ "$1" != -- ]; do
        srv+=("$1")
        shift
    done
    shift
    timeout 60 taskset -c 1 "${srv[@]}" >/dev/null 2>&1 &
    sleep 0.5
    timeout 60 taskset -c 0 "$@" 2>/dev/null
    wait || true
}
# sv BIN ARGS...: `softverbs ARGS` as server and client.
sv() {
    local bin=$1
    shift
    pair "$bin" "$@" --server -p "$port" -- "$bin" "$@" -p "$port" 127.0.0.1
}
# ucx TLS ARGS...: `ucx_perftest ARGS` (the client's) over transports TLS.
ucx() {
    local tls=$1
    shift
    pair env UCX_TLS="$tls" ucx_perftest -p "$port" -- env UCX_TLS="$tls" ucx_perftest -p "$port" 127.0.0.1 "$@" -f
}

# Each measurement prints one figure, or nothing if it failed: latency in
# µs, bandwidth in MiB/s.
flag_us() { "$tmp/shm_pingpong" 1000000 0 0 1 0 | tail -1 | field p50_oneway_ns | awk '{ printf "%.3f", $1 / 1000 }'; }
udp_us() { "$tmp/udp_pingpong" 8 100000 poll 1 0 | tail -1 | field p50_oneway_us; }
# udp_unconnected_us: udp_modes' IPv4 unconnected median (it runs all four
# modes; the others are not used here).
udp_unconnected_us() { "$tmp/udp_modes" 100000 1 0 | grep 'family=4 socket=unconnected' | field p50_oneway_us; }
# ucx_us TLS ITERS: tag_lat's 50th percentile column of the final line.
ucx_us() {
    next_port
    ucx "$1" -t tag_lat -s 8 -n "$2" | awk -v n="$2" '$1 == n { print $2 }' | tail -1
}
# ucx_bw SIZE: put_bw's average bandwidth column (MB/s of 2^20 bytes).
ucx_bw() {
    next_port
    ucx posix,self -t ucp_put_bw -s "$1" -n 4000 | awk '$1 == 4000 { print $5 }' | tail -1
}
# fi_us PROVIDER EP ITERS: usec/xfer (total time over 2 x ITERS one-way transfers).
fi_us() {
    next_port
    pair fi_pingpong -p "$1" -e "$2" -S 8 -I "$3" -B "$port" -- fi_pingpong -p "$1" -e "$2" -S 8 -I "$3" -P "$port" 127.0.0.1 \
        | awk '$1 == 8 { print $7 }' | tail -1
}
# memcpy_mibps SIZE: best of 3 trials.
memcpy_mibps() { "$tmp/memcpy_bw" 3 200 1 | grep "memcpy_best size=$1 " | field MiBps; }
# sv_us BIN LINK ITERS: send_lat's typical (median) half round trip.
sv_us() {
    next_port
    sv "$1" perf send_lat --no-embedded --link "$2" -s 8 -n "$3" | awk 'NF >= 9 && $1 == 8 { print $5; exit }'
}
# sv_bw BIN SIZE: write_bw's average over shm, 3 s.
sv_bw() {
    next_port
    sv "$1" perf write_bw --no-embedded --link shm -s "$2" -D 3 -f 1 | awk 'NF == 5 && $1 ~ /^[0-9]+$/ { print $4; exit }'
}

# Rows: name and command. Figures collect in $tmp/<row>.
rows=(shm:flag shm:softverbs0)
[ ${#builds[@]} -gt 1 ] && rows+=(shm:softverbs1)
have ucx_perftest && rows+=(shm:ucx)
have fi_pingpong && rows+=(shm:libfabric)
rows+=(udp:raw udp:raw-unconnected udp:softverbs0)
[ ${#builds[@]} -gt 1 ] && rows+=(udp:softverbs1)
have fi_pingpong && rows+=(udp:libfabric-udp udp:libfabric-rxd udp:libfabric-tcp)
have ucx_perftest && rows+=(udp:ucx-tcp)
if [ "${PEERS_BW:-0}" = 1 ]; then
    for s in 65536 1048576; do
        rows+=("bw$s:memcpy" "bw$s:softverbs0")
        [ ${#builds[@]} -gt 1 ] && rows+=("bw$s:softverbs1")
        have ucx_perftest && rows+=("bw$s:ucx")
    done
fi

measure() {
    local size="${1%%:*}"
    size="${size#bw}"
    case $1 in
    shm:flag) flag_us ;;
    # As many round trips as the peers of the link: the host's speed
    # changes over seconds, and a run 10x shorter than its neighbours'
    # samples another mix of them.
    shm:softverbs*) sv_us "${builds[${1#shm:softverbs}]}" shm 200000 ;;
    shm:ucx) ucx_us posix,self 200000 ;;
    shm:libfabric) fi_us shm rdm 200000 ;;
    udp:raw) udp_us ;;
    udp:raw-unconnected) udp_unconnected_us ;;
    udp:softverbs*) sv_us "${builds[${1#udp:softverbs}]}" udp 100000 ;;
    udp:libfabric-udp) fi_us udp dgram 50000 ;;
    udp:libfabric-rxd) fi_us "udp;ofi_rxd" rdm 50000 ;;
    udp:libfabric-tcp) fi_us tcp msg 50000 ;;
    udp:ucx-tcp) ucx_us tcp,self 50000 ;;
    bw*:memcpy) memcpy_mibps "$size" ;;
    bw*:softverbs*) sv_bw "${builds[${1#*:softverbs}]}" "$size" ;;
    bw*:ucx) ucx_bw "$size" ;;
    esac
}

for r in $(seq 1 "$rounds"); do
    echo "== round $r of $rounds"
    for row in "${rows[@]}"; do
        v="$(measure "$row")"
        echo "${v:-nan}" >>"$tmp/${row/:/_}"
    done
done

# ratios A B: round by round, A's figure over B's (rounds where either
# failed left out).
ratios() { paste -d ' ' "$1" "$2" | awk '$1 != "nan" && $2 != "nan" && $2 > 0 { print $1 / $2 }'; }
median() { grep -v nan "$1" | sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

echo
printf '%-22s %8s   %s\n' row median "rounds (µs one way; bw rows MiB/s)"
for row in "${rows[@]}"; do
    f="$tmp/${row/:/_}"
    printf '%-22s %8s   %s\n' "$row" "$(median "$f")" "$(tr '\n' ' ' <"$f")"
done

echo
echo "== softverbs' median / each other row's median"
links="shm udp"
[ "${PEERS_BW:-0}" = 1 ] && links="$links bw65536 bw1048576"
for link in $links; do
    for i in "${!builds[@]}"; do
        mine="$(median "$tmp/${link}_softverbs$i")"
        for row in "${rows[@]}"; do
            case $row in "$link":softverbs*) continue ;; "$link":*) ;; *) continue ;; esac
            peer="$(median "$tmp/${row/:/_}")"
            # Then the same ratio round by round (both rows measured in the
            # same round): its median and range, and in how many rounds
            # softverbs' figure was the smaller one.
            ratios "$tmp/${link}_softverbs$i" "$tmp/${row/:/_}" >"$tmp/ratios"
            per="$(sort -g "$tmp/ratios" | awk -v m="$(median "$tmp/ratios")" '{ a[NR] = $1; if ($1 < 1) k++ }
                END { if (NR) printf "per round: median %.2f, %.2f-%.2f, smaller in %d of %d", m, a[1], a[NR], k, NR }')"
            awk -v s="$mine" -v p="$peer" -v n="$link:softverbs$i / ${row#*:}" -v per="$per" \
                'BEGIN { if (p > 0 && s > 0) printf "%-36s %6.2f x   %s\n", n, s / p, per; else printf "%-36s    n/a\n", n }'
        done
    done
done

# goal LABEL OP LIMIT ROW [PEER]: whether ROW's median (or its ratio to
# PEER's median) is OP LIMIT (OP one of <=, <, >=), and in how many rounds
# that round's figure (or ratio) was.
goal() {
    local label=$1 op=$2 limit=$3 a=$4 b=${5:-} m
    if [ -n "$b" ]; then
        ratios "$a" "$b" >"$tmp/goal"
        m="$(awk -v x="$(median "$a")" -v y="$(median "$b")" 'BEGIN { if (x + 0 > 0 && y + 0 > 0) printf "%.3f", x / y; else print "nan" }')"
    else
        grep -v nan "$a" >"$tmp/goal" || true
        m="$(median "$a")"
    fi
    awk -v m="$m" -v op="$op" -v lim="$limit" -v label="$label" '
        function ok(x) { return op == "<=" ? x + 0 <= lim + 0 : op == "<" ? x + 0 < lim + 0 : x + 0 >= lim + 0 }
        { n++; if (ok($1)) k++ }
        END {
            v = (m == "nan" || n == 0) ? "n/a" : ok(m) ? "met" : "MISSED"
            printf "%-46s %-6s median %s; held in %d of %d rounds\n", label, v, m, k, n
        }' "$tmp/goal"
}

echo
echo "== the shared-memory issue's goals (#11)"
for i in "${!builds[@]}"; do
    s="$tmp/shm_softverbs$i"
    goal "build $i: 8-byte send one way <= 0.3 µs" "<=" 0.3 "$s"
    have fi_pingpong && goal "build $i: / libfabric shm < 1" "<" 1 "$s" "$tmp/shm_libfabric"
    have ucx_perftest && goal "build $i: / UCX posix <= 2" "<=" 2 "$s" "$tmp/shm_ucx"
    if [ "${PEERS_BW:-0}" = 1 ]; then
        for size in 65536 1048576; do
            goal "build $i: write_bw $size / memcpy >= 0.8" ">=" 0.8 "$tmp/bw${size}_softverbs$i" "$tmp/bw${size}_memcpy"
        done
    fi
done
