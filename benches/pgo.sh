#!/usr/bin/env bash
# A profile-guided (PGO) release build of the softverbs CLI.
#
# The per-message path of the soft provider spans more code than an L1
# instruction cache holds (its hot functions are long and carry their
# error paths inline), and a plain release build lays it out blind: a
# cache simulation (callgrind, 32 KiB 8-way L1i) of the client of
# `perf send_lat --link shm -s 8` counted ~185 instruction-cache misses
# per round trip. With a profile, LLVM moves the cold blocks out of the
# hot functions, places hot code together and inlines by what is hot: the
# same run takes 2-3 misses and ~20 % fewer instructions, and the message
# path is faster (figures in benches/RESULTS.md).
#
# Steps: an instrumented build (target/pgo/gen), a training run of the
# CLI's own benchmarks between two processes over both links and in one
# process (a few seconds each), `llvm-profdata merge`, and the optimized
# build (target/pgo/use). It prints the optimized binary's path last.
# Nothing of the normal build (target/release) is touched. The RUSTFLAGS
# set here replace those of .cargo/config.toml (its higher inline
# threshold, which brings the release build close to this one and adds
# nothing to it: the profile guides the inlining).
#
# Needs the llvm-profdata of the toolchain's own LLVM (the rustup component
# llvm-tools, which this script adds if it is missing; a system
# llvm-profdata of another LLVM version cannot read rustc's profiles).
#
# usage: benches/pgo.sh [--quick]   (--quick: shorter training, for CI)
# Exit status 77: no llvm-profdata for this toolchain (nothing was built).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
quick=0
[ "${1:-}" = "--quick" ] && quick=1

host="$(rustc -vV | sed -n 's/^host: //p')"
profdata="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
    echo "pgo: adding the rustup component llvm-tools (for llvm-profdata)" >&2
    timeout 300 rustup component add llvm-tools >&2 || true
fi
if [ ! -x "$profdata" ]; then
    echo "pgo: no llvm-profdata for this toolchain ($profdata); install the rustup component llvm-tools" >&2
    exit 77 # "skipped", as automake's test drivers read it (.ci/run does)
fi

out="$root/target/pgo"
data="$out/data"
rm -rf "$data"
mkdir -p "$out"

echo "== instrumented build" >&2
RUSTFLAGS="-Cprofile-generate=$data" \
    cargo build --release -q --target-dir "$out/gen" -p softverbs-emulator
gen="$out/gen/release/softverbs"

# Training: the benchmarks users run, as they run them.
if [ $quick = 1 ]; then
    n_lat=20000 n_bw=2000
else
    n_lat=200000 n_bw=20000
fi
port=$((19000 + RANDOM % 500))
pair() { # TEST LINK SIZE ITERS: server on CPU 1, client on CPU 0
    port=$((port + 1))
    timeout 120 taskset -c 1 "$gen" perf "$1" --no-embedded --link "$2" -s "$3" -n "$4" --server -p "$port" \
        >/dev/null 2>&1 &
    sleep 0.5
    timeout 120 taskset -c 0 "$gen" perf "$1" --no-embedded --link "$2" -s "$3" -n "$4" -p "$port" 127.0.0.1 \
        >/dev/null 2>&1 || echo "pgo: training run perf $1 --link $2 -s $3 failed" >&2
    wait || true
}
echo "== training" >&2
for link in shm udp; do
    pair send_lat "$link" 8 "$n_lat"
    pair write_lat "$link" 8 $((n_lat / 4))
    pair read_lat "$link" 8 $((n_lat / 4))
    pair send_bw "$link" 8 $((n_lat / 2))
    pair send_bw "$link" 4096 "$n_bw"
    pair write_bw "$link" 65536 "$n_bw"
    pair write_bw "$link" 1048576 $((n_bw / 10))
done
# In one process (the embedded default of `cargo run --release -- perf`).
timeout 120 "$gen" perf send_lat -s 8 -n "$n_lat" >/dev/null
timeout 120 "$gen" perf write_bw -s 65536 -n "$n_bw" >/dev/null

"$profdata" merge -o "$out/merged.profdata" "$data"

echo "== optimized build" >&2
RUSTFLAGS="-Cprofile-use=$out/merged.profdata" \
    cargo build --release -q --target-dir "$out/use" -p softverbs-emulator
# It runs.
timeout 60 "$out/use/release/softverbs" perf send_lat -s 8 -n 1000 >/dev/null
# What it was built from, for benches/run_peers.sh, which measures this
# build beside target/release only while the sources are still these.
bash "$here/source_state.sh" >"$out/use/SOURCE_STATE"
echo "$out/use/release/softverbs"
