#!/usr/bin/env bash
# The C path against the Rust path (issue #38, item 7): Debian's perftest
# binaries (`ib_send_lat -s 8`, `ib_write_bw -s 65536`) running unmodified on
# the libibverbs-compatible library (emulator/ibverbs), beside `softverbs
# perf send_lat -s 8` / `perf write_bw -s 65536` on the same link, in the
# same run, rounds alternated (C first in odd rounds, Rust first in even
# ones) so that the host's changes of speed hit both alike. Two processes
# per measurement, the server on CPU 1 and the client on CPU 0.
#
#   latency:   t_typical (median one-way µs) of the 8-byte row;
#   bandwidth: BW average (MB/s) of the 65536-byte row, -D seconds.
#
# Each row prints every round's figure and the median; the summary gives
# C/Rust as the ratio of the medians and round by round (for latency a
# ratio above 1 means the C path is slower; for bandwidth the ratio is
# Rust/C, so that above 1 means the same). Goal: within 1.2x.
#
# Needs perftest (apt-get install perftest). The library is built with
# emulator/ibverbs/mklibdir.sh; the CLI is $CARGO_TARGET_DIR/release/softverbs
# (or $SOFTVERBS_BIN). Environment of the C side: SOFTVERBS_ENGINE etc. pass
# through (default: the library's progress thread).
#
# usage: benches/run_ibverbs.sh [rounds (3)] [links ("shm udp")]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
rounds="${1:-3}"
links="${2:-shm udp}"
iters="${LAT_ITERS:-20000}"
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
r_lat() { rust_tool "$1" send_lat -s 8 -n "$iters" | lat_col; }
# What perftest 4.5-0.17 really runs on a soft device differs from `perf
# send_lat`'s defaults: it turns inline data off on a device it does not
# recognize (it prints "Device not recognized to implement inline
# feature"), and every send it posts is signaled (each asks for an ACK:
# one more datagram per message). `perf send_lat -I 0 -Q 1` does the
# same; this row is the like-for-like Rust figure.
r0_lat() { rust_tool "$1" send_lat -s 8 -n "$iters" -I 0 -Q 1 | lat_col; }
c_bw() { c_tool "$1" ib_write_bw -s 65536 -D "$secs" | bw_col; }
r_bw() { rust_tool "$1" write_bw -s 65536 -D "$secs" | bw_col; }

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for r in $(seq 1 "$rounds"); do
    for link in $links; do
        for kind in lat bw; do
            if [ $((r % 2)) = 1 ]; then order="c r r0"; else order="r0 r c"; fi

            for side in $order; do
                [ "$side" = r0 ] && [ "$kind" = bw ] && continue
                v="$("${side}_${kind}" "$link" || true)"
                echo "${v:-}" >>"$tmp/$link.$kind.$side"
            done
        done
    done
    echo "round $r done" >&2
done

printf '%-5s %-26s %s\n' link row "rounds ... median"
for link in $links; do
    for kind in lat bw; do
        sides="c r r0"
        [ "$kind" = bw ] && sides="c r"
        for side in $sides; do
            case "$kind.$side" in
                lat.c) name="ib_send_lat -s 8 (µs)" ;;
                lat.r) name="perf send_lat -s 8 (µs)" ;;
                lat.r0) name="perf send_lat -s 8 -I 0 -Q 1" ;;
                bw.c) name="ib_write_bw -s 65536 (MB/s)" ;;
                bw.r) name="perf write_bw -s 65536 (MB/s)" ;;
            esac
            f="$tmp/$link.$kind.$side"
            printf '%-5s %-28s %s | %s\n' "$link" "$name" "$(tr '\n' ' ' <"$f")" "$(grep -v '^$' "$f" | median)"
        done
        # Ratio: C slower than Rust > 1 (latency C/Rust, bandwidth Rust/C).
        vss="r r0"
        [ "$kind" = bw ] && vss="r"
        for vs in $vss; do
        paste "$tmp/$link.$kind.c" "$tmp/$link.$kind.$vs" | awk -v k="$kind" '
            $1 != "" && $2 != "" { printf "%.3f\n", (k == "lat") ? $1 / $2 : $2 / $1 }' >"$tmp/ratio"
        if [ -s "$tmp/ratio" ]; then
            m="$(median <"$tmp/ratio")"
            ok="$(awk -v m="$m" 'BEGIN { print (m <= 1.2) ? "met" : "MISSED" }')"
            printf '%-5s ratio %s vs %s (C/Rust cost) per round: %s| median %s | goal <= 1.2: %s\n' \
                "$link" "$kind" "$vs" "$(tr '\n' ' ' <"$tmp/ratio")" "$m" "$ok"
        else
            printf '%-5s ratio %s: no complete round\n' "$link" "$kind"
        fi
        done
    done
done
