#!/usr/bin/env bash
# Connection setup rate: the soft connection manager against TCP
# connect/accept on loopback (both in `cm_rate`, benches/src/bin) and
# against rdma-core's `cmtime` (Debian rdmacm-utils) running unmodified on
# the librdmacm-compatible library (emulator/ibverbs), in the same run,
# rounds alternated (cm_rate first in odd rounds, cmtime first in even
# ones) so that the host's changes of speed hit both alike.
#
#   cm_rate   connections/s one at a time (seq) and P at once (parP), for
#             soft devices on UDP over loopback and for TCP; in-process.
#   cmtime    two processes (server on CPU 1, client on CPU 0), each with
#             its soft device (SOFTVERBS_ADDR 127.0.7.1 / .2, port 4791):
#             `cmtime -c 1` run SEQ_RUNS times (one at a time) and
#             `cmtime -c P` (P at once). Setup time = the sum of its
#             totals for create id, resolve addr, resolve route, create qp
#             and connect; the rate is connections / setup time. Once with
#             the library's default link (UDP + shared memory to local
#             peers) and once with SOFTVERBS_LINK=udp. `cmtime -c 1` is a
#             fresh process's first connection each time: it includes
#             what a first contact with the peer process costs (on the
#             default link, the shared-memory channel's rendezvous).
#
# Each row prints every round's figure and the median. The load average
# (`uptime`) is printed before and after.
#
# Needs cmtime (apt-get install rdmacm-utils). The libraries are built
# with emulator/ibverbs/mklibdir.sh, cm_rate with cargo (release).
#
# usage: benches/run_cm_rate.sh [rounds (3)] [conns (400)] [P (16)] [SEQ_RUNS (10)]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
rounds="${1:-3}"
conns="${2:-400}"
par="${3:-16}"
seq_runs="${4:-10}"
target="${CARGO_TARGET_DIR:-$root/target}"
tmp="$(mktemp -d)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

command -v cmtime >/dev/null || { echo "SKIP: cmtime missing (apt-get install rdmacm-utils)"; exit 0; }
(cd "$root" && emulator/ibverbs/mklibdir.sh "$tmp/lib" >/dev/null 2>&1)
(cd "$root" && cargo build --release -p softverbs-benches --bin cm_rate >/dev/null 2>&1)
bin="$target/release/cm_rate"

echo "load before: $(uptime)"
port=$((19000 + RANDOM % 4000))

# start_server LINK: a cmtime server on CPU 1 with the library's link LINK.
start_server() {
    port=$((port + 1))
    SOFTVERBS_LINK="$1" SOFTVERBS_ADDR=127.0.7.1 SOFTVERBS_PORT=4791 LD_LIBRARY_PATH="$tmp/lib" \
        taskset -c 1 cmtime -b 127.0.7.1 -p "$port" >"$tmp/srv.log" 2>&1 &
    server=$!
    pids+=("$server")
    sleep 1
}

stop_server() {
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
}

# cmtime_setup_ms LINK C: one client run of C connections; prints its
# setup milliseconds. A run in which a connection was refused (cmtime
# prints the event and goes on) fails the script: its connect time would
# be a reject's round trip.
cmtime_setup_ms() {
    SOFTVERBS_LINK="$1" SOFTVERBS_ADDR=127.0.7.2 SOFTVERBS_PORT=4791 LD_LIBRARY_PATH="$tmp/lib" \
        taskset -c 0 timeout 120 cmtime -s 127.0.7.1 -p "$port" -c "$2" >"$tmp/cli.log" 2>&1 ||
        { echo "cmtime failed:" >&2; cat "$tmp/cli.log" >&2; exit 1; }
    if grep -qiE 'REJECTED|UNREACHABLE|CONNECT_ERROR|error' "$tmp/cli.log"; then
        echo "cmtime: a connection did not complete:" >&2
        cat "$tmp/cli.log" >&2
        exit 1
    fi
    awk -F: '/^(create id|resolve addr|resolve route|create qp|connect) *:/ { split($2, f, " "); s += f[1] }
             END { printf "%.3f\n", s }' "$tmp/cli.log"
}

# cmtime_rates LINK: appends this round's seq and par rates to the files.
# Every client run gets a server of its own: each client process is a new
# device with the same address, so its first QP has the number the
# previous client's had, and a server that still holds that connection in
# time-wait rightly refuses it as stale (IBTA REJ reason 10).
cmtime_rates() {
    local link="$1" total=0 ms
    for _ in $(seq "$seq_runs"); do
        start_server "$link"
        ms=$(cmtime_setup_ms "$link" 1)
        stop_server
        total=$(echo "$total + $ms" | bc -l)
    done
    echo "$seq_runs * 1000 / $total" | bc -l >>"$tmp/cmtime_${link}_seq"
    start_server "$link"
    ms=$(cmtime_setup_ms "$link" "$par")
    echo "$par * 1000 / $ms" | bc -l >>"$tmp/cmtime_${link}_par"
    stop_server
}

cm_rate_round() {
    taskset -c 0,1 "$bin" --conns "$conns" --parallel "$par" --rounds 1 >"$tmp/rate.log"
    awk -v d="$tmp" '/^RESULT/ { split($7, r, "="); m = ($3 == "seq") ? "seq" : "par"; print r[2] >> (d "/" $2 "_" m) }' \
        "$tmp/rate.log"
}

for r in $(seq "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then
        cm_rate_round
        cmtime_rates auto
        cmtime_rates udp
    else
        cmtime_rates udp
        cmtime_rates auto
        cm_rate_round
    fi
done

median() { sort -g "$1" | awk '{ a[NR] = $1 } END { printf "%.0f", a[int((NR + 1) / 2)] }'; }
row() {
    printf "| %s | %s (%s) | %s (%s) |\n" "$1" \
        "$(median "$tmp/$2_seq")" "$(xargs printf '%.0f ' <"$tmp/$2_seq" | sed 's/ $//')" \
        "$(median "$tmp/$2_par")" "$(xargs printf '%.0f ' <"$tmp/$2_par" | sed 's/ $//')"
}
echo
echo "connections/s, median (each round); $rounds rounds; cm_rate $conns connections per mode, cmtime -c 1 x $seq_runs and -c $par"
echo "| setup | one at a time | $par at once |"
echo "|---|---|---|"
row "soft CM, in-process, UDP loopback (cm_rate)" soft_cm_udp
row "TCP connect/accept, loopback (cm_rate)" tcp
row "cmtime on librdmacm.so.1, 2 processes, UDP + shm" cmtime_auto
row "cmtime on librdmacm.so.1, 2 processes, UDP only" cmtime_udp
echo
echo "load after: $(uptime)"
