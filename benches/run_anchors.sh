#!/usr/bin/env bash
# Runs the raw C floors (../shared/anchors) and softverbs' perftest tools
# side by side, and prints every test at 8 B, 4 KiB, 64 KiB and 1 MiB as a
# ratio against the floor measured in the same run:
#   bandwidth tests: BW average / single-thread memcpy at the same size
#                    (4 KiB memcpy for 8 B messages);
#   latency tests:   t_typical / shm ping-pong median (one way for write and
#                    send, whose latency is half a round trip; the round trip
#                    for read and atomic, which report the full round trip).
#
# usage: benches/run_anchors.sh [anchors dir] [bw iterations] [lat iterations]
# Needs gcc and cargo. Run from anywhere; builds into a temporary directory.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
anchors="${1:-$root/../shared/anchors}"
bw_iters="${2:-2000}"
lat_iters="${3:-20000}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

for p in memcpy_bw shm_pingpong; do
    gcc -O2 -march=native -o "$tmp/$p" "$anchors/$p.c"
done
(cd "$root" && cargo build --release -q)
# SOFTVERBS_BIN: another build of the CLI to measure (benches/pgo.sh's).
sv="${SOFTVERBS_BIN:-$root/target/release/softverbs}"
echo "== binary: $sv"

echo "== anchors"
"$tmp/memcpy_bw" 5 200 1 | grep -v trial | tee "$tmp/memcpy.txt"
"$tmp/shm_pingpong" 1000000 0 0 1 0 | tee "$tmp/shm.txt"

# memcpy MiB/s at a size (best trial): the summary line names size= and MiBps=.
memcpy_at() {
    awk -v s="$1" '{ for (i = 1; i <= NF; i++) { if ($i ~ /^size=/) { split($i, a, "="); sz = a[2] }
                     if ($i ~ /^(best_)?MiBps=/) { split($i, b, "="); v = b[2] } }
                     if (sz == s && v != "") { print v; exit } }' "$tmp/memcpy.txt"
}
shm_p50_ns="$(sed -n 's/.*p50_oneway_ns=\([0-9.]*\).*/\1/p' "$tmp/shm.txt")"

printf '\n== softverbs (inproc link, loopback, one thread)\n'
printf '%-11s %8s %14s %12s %14s %10s\n' test bytes "BW[MiB/s]" "MsgRate[Mpps]" "lat[usec]" ratio
for t in write_bw read_bw send_bw atomic_bw write_lat read_lat send_lat atomic_lat; do
    case $t in atomic_*) sizes="8" ;; *) sizes="8 4096 65536 1048576" ;; esac
    for s in $sizes; do
        case $t in
        *_bw)
            n=$bw_iters
            [ "$s" -ge 1048576 ] && n=$((bw_iters / 4))
            line="$("$sv" perf "$t" -s "$s" -n "$n" | awk 'NF == 5 && $1 ~ /^[0-9]+$/ { print; exit }')"
            avg="$(echo "$line" | awk '{ print $4 }')"
            rate="$(echo "$line" | awk '{ print $5 }')"
            ref_size=$s
            [ "$s" -lt 4096 ] && ref_size=4096
            ref="$(memcpy_at "$ref_size")"
            ratio="$(awk -v a="$avg" -v r="$ref" 'BEGIN { if (r > 0) printf "%.4f x memcpy(%s)", a / r, "'"$ref_size"'"; else print "n/a" }')"
            printf '%-11s %8s %14s %12s %14s %s\n' "$t" "$s" "$avg" "$rate" "-" "$ratio"
            ;;
        *_lat)
            n=$lat_iters
            [ "$s" -ge 65536 ] && n=$((lat_iters / 10))
            line="$("$sv" perf "$t" -s "$s" -n "$n" | awk 'NF == 9 && $1 ~ /^[0-9]+$/ { print; exit }')"
            typ="$(echo "$line" | awk '{ print $5 }')"
            case $t in read_*|atomic_*) f=2 ;; *) f=1 ;; esac
            ratio="$(awk -v l="$typ" -v p="$shm_p50_ns" -v f="$f" 'BEGIN { if (p > 0) printf "%.1f x shm %s", l * 1000 / (p * f), (f == 2 ? "RTT" : "one-way"); else print "n/a" }')"
            printf '%-11s %8s %14s %12s %14s %s\n' "$t" "$s" "-" "-" "$typ" "$ratio"
            ;;
        esac
    done
done
