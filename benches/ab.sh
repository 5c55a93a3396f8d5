#!/usr/bin/env bash
# Alternated A/B of two softverbs binaries on the 8-byte RC send latency
# between two processes (`perf send_lat -s 8`, server on CPU 1, client on
# CPU 0, as the anchors), for changes worth a few percent.
#
# Why this shape: on these shared machines the raw flag ping-pong
# (../shared/anchors/shm_pingpong.c) moves between ~35, ~70 and ~250 ns
# from one one-second run to the next (the host places the two vCPUs
# anew), and softverbs' one-way trip with it (0.25-0.41 µs over twelve
# back-to-back runs of one binary). Long runs average over such phases,
# and a handful of rounds cannot tell 5 % from noise. So: many short runs
# (`-n 20000`, about a second per pair), A and B back to back in an order
# that alternates, and per round the ratio B/A. Reported: the medians, the
# per-round ratio's median and geometric mean, and in how many rounds B
# was faster. Sixty to a hundred rounds show a 5-15 % change; a change
# with no effect comes out near 1.00 with B faster in about half.
#
# usage: benches/ab.sh A_BIN B_BIN [ROUNDS=60] [LINK=shm] [ITERS=20000]
set -euo pipefail

a=$1
b=$2
rounds=${3:-60}
link=${4:-shm}
iters=${5:-20000}
port=$((20000 + RANDOM % 4000))

# one BIN: a server/client pair; prints the client's typical latency (µs).
one() {
    port=$((port + 1))
    timeout 60 taskset -c 1 "$1" perf send_lat --no-embedded --link "$link" -s 8 -n "$iters" --server -p "$port" \
        >/dev/null 2>&1 &
    sleep 0.3
    # To the nanosecond where the build can (`--digits`; perftest's two
    # decimal places are steps of ~3 % here).
    local digits=()
    if "$1" perf send_lat --help 2>/dev/null | grep -q -- '--digits'; then
        digits=(--digits 3)
    fi
    timeout 60 taskset -c 0 "$1" perf send_lat --no-embedded --link "$link" -s 8 -n "$iters" -p "$port" "${digits[@]}" \
        127.0.0.1 2>/dev/null | awk 'NF >= 9 && $1 == 8 { print $5; exit }'
    wait || true
}

rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for r in $(seq "$rounds"); do
    if [ $((r % 2)) = 1 ]; then
        x=$(one "$a")
        y=$(one "$b")
    else
        y=$(one "$b")
        x=$(one "$a")
    fi
    if [ -n "$x" ] && [ -n "$y" ]; then
        echo "$x $y" >>"$rows"
    else
        echo "ab: round $r lost a run" >&2
    fi
done

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
n=$(wc -l <"$rows")
echo "rounds kept: $n of $rounds ($link, -s 8 -n $iters)"
echo "A $(basename "$a") median $(cut -d' ' -f1 "$rows" | median) µs"
echo "B $(basename "$b") median $(cut -d' ' -f2 "$rows" | median) µs"
echo "B/A per round: median $(awk '{ printf "%.3f\n", $2 / $1 }' "$rows" | median)," \
    "geometric mean $(awk '{ s += log($2 / $1) } END { if (NR) printf "%.3f", exp(s / NR) }' "$rows")," \
    "B faster in $(awk '$2 < $1' "$rows" | wc -l) of $n"
