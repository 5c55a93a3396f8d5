#!/usr/bin/env bash
# The C path against the Rust path (issue #38, item 7): Debian's perftest
# binaries running unmodified on the libibverbs-compatible library
# (emulator/ibverbs) beside `softverbs perf` on the same link, in the same
# run, rounds alternated (C first in odd rounds, Rust first in even ones)
# so that the host's changes of speed hit both alike. Two processes per
# measurement, the server on CPU 1 and the client on CPU 0 (each process's
# threads, the library's progress thread included, share its CPU).
#
#   ib_send_lat -s 8       t_typical (median one-way µs) of the 8-byte row,
#                          also without the library's progress thread
#                          (SOFTVERBS_ENGINE=inline) and against `perf
#                          send_lat` with perftest's effective settings;
#   ib_write_lat -s 2      t_typical (µs): the receiver spins on memory,
#                          only the library's progress thread serves it;
#   ib_write_bw -s 65536   BW average (MB/s), -D seconds; also against
#                          `perf write_bw --heap -Q 1` (buffers of the C
#                          program's kind).
#
# Each row prints every round's figure and the median; the ratios are C
# cost over Rust cost (latency C/Rust, bandwidth Rust/C: above 1 means the
# C path is slower), medians of the per-round ratios. Goal: within 1.2x.
# The load average (`uptime`) is printed before and after.
#
# Needs perftest (apt-get install perftest). The library is built with
# emulator/ibverbs/mklibdir.sh; the CLI is $CARGO_TARGET_DIR/release/softverbs
# (or $SOFTVERBS_BIN). Environment of the C side: SOFTVERBS_ENGINE etc. pass
# through (default: the library's progress thread). LAT_ITERS (20000),
# WLAT_ITERS (2000) and BW_SECS (2) set the lengths.
#
# usage: benches/run_ibverbs.sh [rounds (3)] [links ("shm udp")]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
rounds="${1:-3}"
links="${2:-shm udp}"
iters="${LAT_ITERS:-20000}"
wl_iters="${WLAT_ITERS:-2000}"
secs="${BW_SECS:-2}"
target="${CARGO_TARGET_DIR:-$root/target}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

for t in ib_send_lat ib_write_bw; do
    command -v "$t" >/dev/null || { echo "SKIP: $t missing (apt-get install perftest)"; exit 0; }
done
(cd "$root" && emulator/ibverbs/mklibdir.sh "$tmp/lib" >/dev/null)
bin="${SOFTVERBS_BIN:-$target/release/softverbs}"
if [ -z "${SOFTVERBS_BIN:-}" ]; then
    (cd "$root" && cargo build --release -p softverbs-emulator --bin softverbs >/dev/null 2>&1)
fi

port=$((18000 + RANDOM % 4000))
next_port() { port=$((port + 1)); }

# pair SERVER... -- CLIENT...: the server on CPU 1, the client on CPU 0;
# prints the client's output.
pair() {
    local srv=()
    while [ "$1" != -- ]; do
        srv+=("$1")
        shift
    done
    shift
    timeout 60 taskset -c 1 "${srv[@]}" >"$tmp/server.out" 2>&1 &
    sleep 0.5
    timeout 60 taskset -c 0 "$@" 2>"$tmp/client.err" || true
    wait || true
}

# c_tool LINK TOOL ARGS...: perftest on the library.
c_tool() {
    local link=$1 tool=$2
    shift 2
    next_port
    local envs=(env LD_LIBRARY_PATH="$tmp/lib" SOFTVERBS_ADDR=127.0.0.1 SOFTVERBS_LINK="$link")
    pair "${envs[@]}" "$tool" -d softverbs_0 -x 0 "$@" -p "$port" -- \
        "${envs[@]}" "$tool" -d softverbs_0 -x 0 "$@" -p "$port" 127.0.0.1
}
# rust_tool LINK TEST ARGS...: softverbs perf.
rust_tool() {
    local link=$1 test=$2
    shift 2
    next_port
    pair "$bin" perf "$test" --no-embedded --link "$link" "$@" --server -p "$port" -- \
        "$bin" perf "$test" --no-embedded --link "$link" "$@" -p "$port" 127.0.0.1
}
lat_col() { awk 'NF >= 9 && $1 == 8 { print $5; exit }'; }
bw_col() { awk 'NF == 5 && $1 == 65536 { print $4; exit }'; }

c_lat() { c_tool "$1" ib_send_lat -s 8 -n "$iters" | lat_col; }
# The same without the library's progress thread (SOFTVERBS_ENGINE=inline):
# what that thread costs a busy-polling ping-pong (it must not take the core
# from the spinning application thread).
c0_lat() { SOFTVERBS_ENGINE=inline c_lat "$1"; }
r_lat() { rust_tool "$1" send_lat -s 8 -n "$iters" | lat_col; }
# What perftest 4.5-0.17 really runs on a soft device differs from `perf
# send_lat`'s defaults: it turns inline data off on a device it does not
# recognize (it prints "Device not recognized to implement inline
# feature"), and with a send queue of 1 every send it posts is signaled
# (each asks for an ACK: one more datagram per message, on the critical
# path, since the next send waits for that completion). `perf send_lat
# -I 0 -Q 1` does the same; this row is the like-for-like Rust figure.
r0_lat() { rust_tool "$1" send_lat -s 8 -n "$iters" -I 0 -Q 1 | lat_col; }
# ib_write_lat: the receiver polls the last byte of its buffer and never
# calls a verb, so only the library's progress thread places each WRITE.
wl_col() { awk 'NF >= 9 && $1 == 2 { print $5; exit }'; }
c_wlat() { c_tool "$1" ib_write_lat -s 2 -n "$wl_iters" | wl_col; }
r_wlat() { rust_tool "$1" write_lat -s 2 -n "$wl_iters" | wl_col; }
c_bw() { c_tool "$1" ib_write_bw -s 65536 -D "$secs" | bw_col; }
r_bw() { rust_tool "$1" write_bw -s 65536 -D "$secs" | bw_col; }
# perftest registers buffers it allocated itself (ibv_reg_mr of the heap),
# which the shared-memory link cannot map in the peer: a 64 KiB message
# goes through the rings packet by packet, where `perf`'s own buffers
# (shareable memory) travel as one train copied once; and it signals every
# WRITE (CQ moderation 1 on a device it does not know). `--heap -Q 1` gives `perf`
# the C program's kind of memory: the like-for-like Rust figure.
r0_bw() { rust_tool "$1" write_bw -s 65536 -D "$secs" --heap -Q 1 | bw_col; }

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# sides KIND: the rows of a kind (C first).
sides() {
    case "$1" in
        lat) echo "c c0 r r0" ;;
        bw) echo "c r r0" ;;
        *) echo "c r" ;;
    esac
}
name() {
    case "$1.$2" in
        lat.c) echo "ib_send_lat -s 8 (µs)" ;;
        lat.c0) echo "ib_send_lat, no lib thread" ;;
        lat.r) echo "perf send_lat -s 8 (µs)" ;;
        lat.r0) echo "perf send_lat -s 8 -I 0 -Q 1" ;;
        wlat.c) echo "ib_write_lat -s 2 (µs)" ;;
        wlat.r) echo "perf write_lat -s 2 (µs)" ;;
        bw.c) echo "ib_write_bw -s 65536 (MB/s)" ;;
        bw.r) echo "perf write_bw -s 65536 (MB/s)" ;;
        bw.r0) echo "perf write_bw --heap -Q 1" ;;
    esac
}

echo "load before: $(uptime)"
for r in $(seq 1 "$rounds"); do
    for link in $links; do
        for kind in lat wlat bw; do
            order="$(sides "$kind")"
            # Alternate: C first in odd rounds, Rust first in even ones.
            if [ $((r % 2)) = 0 ]; then order="$(echo "$order" | tr ' ' '\n' | tac | tr '\n' ' ')"; fi
            for side in $order; do
                v="$("${side}_${kind}" "$link" || true)"
                echo "${v:-}" >>"$tmp/$link.$kind.$side"
            done
        done
    done
    echo "round $r done" >&2
done
echo "load after: $(uptime)"

printf '%-5s %-30s %s\n' link row "rounds ... | median"
for link in $links; do
    for kind in lat wlat bw; do
        for side in $(sides "$kind"); do
            f="$tmp/$link.$kind.$side"
            printf '%-5s %-30s %s| %s\n' "$link" "$(name "$kind" "$side")" "$(tr '\n' ' ' <"$f")" "$(grep -v '^$' "$f" | median)"
        done
        # Ratios, C cost over Rust cost (latency C/Rust, bandwidth Rust/C:
        # above 1 means the C path is slower), medians of the per-round
        # ratios.
        case "$kind" in
            lat) pairs="c:r c:r0 c:c0" ;;
            bw) pairs="c:r c:r0" ;;
            *) pairs="c:r" ;;
        esac
        for pair in $pairs; do
            a="${pair%%:*}" b="${pair##*:}"
            paste "$tmp/$link.$kind.$a" "$tmp/$link.$kind.$b" | awk -v k="$kind" '
                $1 != "" && $2 != "" { printf "%.3f\n", (k == "bw") ? $2 / $1 : $1 / $2 }' >"$tmp/ratio"
            if [ -s "$tmp/ratio" ]; then
                m="$(median <"$tmp/ratio")"
                goal=""
                if [ "$kind" != wlat ] && [ "$a" = c ] && [ "$b" != c0 ]; then
                    goal=" | goal <= 1.2: $(awk -v m="$m" 'BEGIN { print (m <= 1.2) ? "met" : "MISSED" }')"
                fi
                printf '%-5s ratio %s %s/%s per round: %s| median %s%s\n' \
                    "$link" "$kind" "$a" "$b" "$(tr '\n' ' ' <"$tmp/ratio")" "$m" "$goal"
            else
                printf '%-5s ratio %s %s/%s: no complete round\n' "$link" "$kind" "$a" "$b"
            fi
        done
    done
done
