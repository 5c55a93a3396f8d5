#!/usr/bin/env bash
# Cross-process figures of the udp and shm links (two softverbs processes on
# this host, one per core), each beside the raw floor of ../shared/anchors
# measured in the same run, as a ratio:
#   latency:   `softverbs pingpong -s 8` median half round trip (every
#              send signaled and acknowledged, as ibv_rc_pingpong), and
#              `softverbs perf send_lat -s 8` typical half round trip (a
#              CQE every 100th send, as perftest's ib_send_lat)
#              / udp_pingpong (poll) or shm_pingpong median one way, run
#              again just before each row: these shared machines change
#              speed within minutes, the kernel's UDP path most, so a
#              floor from the start of the run can be off by 25 %;
#   bandwidth: `softverbs perf write_bw|send_bw` average
#              / memcpy (shm; same size) or the 4 KiB GSO UDP stream (udp),
#              the mean of the floors measured just before and just
#              after the row (both printed).
# The receiving process runs on CPU 1 and the sender on CPU 0, as the
# anchors pin themselves.
#
# For shm, also the link's ring alone (benches/src/bin/ring_pingpong.rs:
# two threads, 24-byte datagrams, no engine) against the same floor.
#
# Last, send_lat over IPv6 loopback (::1), and the kernel floor by socket
# mode (benches/kernel/udp_modes.c) for context.
#
# usage: benches/run_cross.sh [anchors dir] [seconds per bandwidth run]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
anchors="${1:-$root/../shared/anchors}"
secs="${2:-3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"; jobs -p | xargs -r kill 2>/dev/null || true' EXIT

for p in memcpy_bw shm_pingpong udp_pingpong udp_stream; do
    gcc -O2 -march=native -o "$tmp/$p" "$anchors/$p.c"
done
gcc -O2 -I "$anchors" -o "$tmp/udp_modes" "$here/kernel/udp_modes.c"
(cd "$root" && cargo build --release -q && cargo build --release -q -p softverbs-benches --bin ring_pingpong)
# SOFTVERBS_BIN: another build of the CLI to measure (benches/pgo.sh's).
sv="${SOFTVERBS_BIN:-$root/target/release/softverbs}"
echo "== binary: $sv"
port=18700

echo "== floors"
# (Every ratio's floor is measured around its row, below; these are for
# context.)
"$tmp/memcpy_bw" 5 200 1 | grep memcpy_best
"$tmp/udp_stream" 4096 2 32 16777216 1 0 poll gso | tail -1
# Context for the UDP latency ratio: the kernel's part by socket mode (a
# RoCEv2 sender over IPv4 must use unconnected sockets; see udp_modes.c).
"$tmp/udp_modes" 100000

# A key=value field of a line.
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | head -1; }
# The latency floor of a link in ns, measured now (one floor per row).
floor_ns() {
    if [ "$1" = udp ]; then
        "$tmp/udp_pingpong" 8 100000 poll 1 0 | tail -1 | field p50_oneway_us | awk '{ print $1 * 1000 }'
    else
        "$tmp/shm_pingpong" 1000000 0 0 1 0 | tail -1 | field p50_oneway_ns
    fi
}
# The bandwidth floor of a link in MiB/s, measured now: memcpy of that
# size (best of 3 trials) for shm, the 4 KiB GSO stream for udp. Taken
# before and after each row, as the copy speed itself changes with the
# host's phase (memcpy of 1 MiB measured 26,100 or 35,200 MiB/s within
# minutes, alone on the machine).
floor_bw() {
    if [ "$1" = udp ]; then
        "$tmp/udp_stream" 4096 1 32 16777216 1 0 poll gso | tail -1 | field rx_MiBps
    else
        "$tmp/memcpy_bw" 3 200 1 | grep "memcpy_best size=$2 " | field MiBps
    fi
}

# Runs `softverbs ARGS` as a server on CPU 1 and as a client on CPU 0 (of
# $host, 127.0.0.1 unless set); prints the client's output. (`perf` servers
# say --server; a `pingpong` without a host is the server.)
host=127.0.0.1
pair() {
    port=$((port + 1))
    local as_server=()
    [ "$1" = perf ] && as_server=(--server)
    taskset -c 1 "$sv" "$@" "${as_server[@]}" -p "$port" >"$tmp/server.txt" 2>&1 &
    local srv=$!
    sleep 1
    taskset -c 0 "$sv" "$@" -p "$port" "$host" 2>&1
    wait "$srv" || true
}

echo
printf '%-5s %-22s %12s %s\n' link test value ratio
for link in udp shm; do
    floor="$(floor_ns "$link")"
    med="$(pair pingpong -s 8 -n 20000 --link "$link" | sed -n 's/.*median \([0-9.]*\).*/\1/p')"
    printf '%-5s %-22s %9s us %s\n' "$link" "pingpong 8 B" "$med" \
        "$(awk -v m="$med" -v f="$floor" 'BEGIN { printf "%.2f x raw (%.3f us)", m * 1000 / f, f / 1000 }')"
    floor="$(floor_ns "$link")"
    typ="$(pair perf send_lat --no-embedded --link "$link" -s 8 -n 50000 \
        | awk 'NF >= 9 && $1 == 8 { print $5; exit }')"
    printf '%-5s %-22s %9s us %s\n' "$link" "send_lat 8 B" "$typ" \
        "$(awk -v m="$typ" -v f="$floor" 'BEGIN { printf "%.2f x raw (%.3f us)", m * 1000 / f, f / 1000 }')"
    if [ "$link" = shm ]; then
        # The ring alone (two threads, no engine), against the same floor.
        floor="$(floor_ns shm)"
        ring="$(taskset -c 0,1 "$root/target/release/ring_pingpong" 1000000 | field p50_oneway_ns)"
        printf '%-5s %-22s %9s us %s\n' shm "ring alone 24 B" "$(awk -v r="$ring" 'BEGIN { printf "%.3f", r / 1000 }')" \
            "$(awk -v m="$ring" -v f="$floor" 'BEGIN { printf "%.2f x raw (%.3f us)", m / f, f / 1000 }')"
    fi
    for t in write_bw send_bw; do
        for s in 65536 1048576; do
            before="$(floor_bw "$link" "$s")"
            line="$(pair perf "$t" --no-embedded --link "$link" -s "$s" -D "$secs" -f 1 \
                | awk 'NF == 5 && $1 ~ /^[0-9]+$/ { print; exit }')"
            after="$(floor_bw "$link" "$s")"
            avg="$(echo "$line" | awk '{ print $4 }')"
            ref="$(awk -v a="$before" -v b="$after" 'BEGIN { print (a + b) / 2 }')"
            if [ "$link" = shm ]; then
                what="memcpy($s) ($before, $after)"
            else
                what="udp 4K GSO stream ($before, $after)"
            fi
            printf '%-5s %-22s %9s MiB/s %s\n' "$link" "$t $s" "$avg" \
                "$(awk -v a="$avg" -v r="$ref" -v w="$what" 'BEGIN { if (r > 0) printf "%.2f x %s", a / r, w }')"
        done
    done
done

# The UDP link over IPv6 (::1), against the same IPv4 floor, where this host
# has IPv6 loopback.
if ip -6 addr show dev lo 2>/dev/null | grep -q '::1'; then
    host=::1
    udp_ns="$(floor_ns udp)"
    typ="$(pair perf send_lat --no-embedded --link udp -s 8 -n 50000 \
        | awk 'NF >= 9 && $1 == 8 { print $5; exit }')"
    printf '%-5s %-22s %9s us %s\n' udp6 "send_lat 8 B" "$typ" \
        "$(awk -v m="$typ" -v f="$udp_ns" 'BEGIN { printf "%.2f x raw IPv4 (%.3f us)", m * 1000 / f, f / 1000 }')"
else
    echo "udp6  skipped: no IPv6 loopback on this host"
fi
