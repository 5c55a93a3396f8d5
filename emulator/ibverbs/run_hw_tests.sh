#!/usr/bin/env bash
# Runs the hardware backend (provider/src/hw, feature `hardware`, over
# rdma-sys) for real on the devices of softverbs' own libibverbs.so.1:
#
#   1. builds the library (debug profile, the one the workspace's tests
#      already built) and copies it into DIR as libibverbs.so.1;
#   2. with LD_LIBRARY_PATH=DIR:
#      - the hardware backend's own unit tests (hw::, subsystem::hw*);
#      - `softverbs conformance --backend hw`, every case, on the library's
#        device (the CLI; exit 4 if a case fails);
#      - the conformance suite's hardware test, which compares the run with
#        conformance/expected/hw-softverbs.txt (every hw/soft difference is
#        fixed or a documented known divergence);
#      - the hotplug and namespace properties on the library's device
#        (conformance/tests/hw_library.rs: the library unplugs the device,
#        the backend's monitor, removal and synthesized flushes run);
#      - `softverbs perf send_lat --backends soft,hw`: the side-by-side
#        table, the hw column on the library's device;
#      - when mklibdir.sh also made a librdmacm.so.1: the connection
#        manager's hardware backend (softverbs::cm over librdmacm,
#        provider/tests/cm_hw.rs, cm_hw_addr.rs (ADDR_CHANGE through
#        librdmacm), cm_hw_removal.rs, which unplugs the device
#        under the ids, and cm_hw_prop.rs, the property test of random
#        id populations under a removal at a random point, each case in
#        a child process) on the library's device, its address
#        fixed (SOFTVERBS_ADDR, SOFTVERBS_PORT=4791) so that its GID is the
#        plain IPv4-mapped one the test connects to; a second process's
#        device at 127.0.39.2 is the peer of the cross-device test.
#
#   emulator/ibverbs/run_hw_tests.sh [DIR]     (default: $TMPDIR/softverbs-hwlib)
#
# SOFTVERBS_HW_FEATURES: the provider's features for the builds (default
# `hardware`; it must include it).
#
# Every step runs; the script exits non-zero if any failed. A few minutes
# on 2 cores once the workspace is built.
set -uo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
dir=${1:-${TMPDIR:-/tmp}/softverbs-hwlib}
target=${CARGO_TARGET_DIR:-$here/target}

failed=()
run() {
    local name=$1
    shift
    printf '\n---- %s\n+ %s\n' "$name" "$*"
    local t0=$SECONDS
    if "$@"; then
        echo "---- $name: ok ($((SECONDS - t0)) s)"
    else
        echo "---- $name: FAILED ($((SECONDS - t0)) s)"
        failed+=("$name")
    fi
}

# The library, copied (not linked): a later build of the workspace with
# other features must not swap the file under the tests.
mkdir -p "$dir/links"
if ! emulator/ibverbs/mklibdir.sh "$dir/links" --debug; then
    echo "run_hw_tests: building the library failed"
    exit 1
fi
install -m 755 "$(readlink -f "$dir/links/libibverbs.so.1")" "$dir/libibverbs.so.1"
ln -sf libibverbs.so.1 "$dir/libibverbs.so"
rm -f "$dir/librdmacm.so.1" "$dir/librdmacm.so"
if [ -e "$dir/links/librdmacm.so.1" ]; then
    install -m 755 "$(readlink -f "$dir/links/librdmacm.so.1")" "$dir/librdmacm.so.1"
    ln -sf librdmacm.so.1 "$dir/librdmacm.so"
fi
rm -rf "$dir/links"

# The tests' own devices: one library device per process, on loopback,
# driven by the library's progress thread.
export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset SOFTVERBS_UNPLUG_AFTER_MS

# The provider's features: `hardware` and whatever else the caller's
# builds use (CI passes its feature build's set, so nothing is rebuilt).
feats=${SOFTVERBS_HW_FEATURES:-hardware}
sv_feats=$(echo "$feats" | sed 's/[^,][^,]*/softverbs\/&/g')

# Build everything first (without the library on the path: build scripts
# and proc macros must not load it).
LD_LIBRARY_PATH= cargo build -p softverbs --features "$feats" --lib --tests --quiet || exit 1
LD_LIBRARY_PATH= cargo build -p softverbs-conformance --features "hardware,$sv_feats" --tests --quiet || exit 1
LD_LIBRARY_PATH= cargo build -p softverbs-emulator --features "$sv_feats" --quiet || exit 1

run "the library lists its device" \
    "$target/debug/softverbs" --backend hw devices
run "hw backend unit tests" \
    cargo test -p softverbs --features "$feats" --lib --quiet -- hw
run "softverbs conformance --backend hw" \
    "$target/debug/softverbs" conformance --backend hw --case-timeout 60
run "conformance expectation (hw-softverbs.txt)" \
    cargo test -p softverbs-conformance --features "hardware,$sv_feats" --test suite --quiet -- hardware_device --nocapture
run "hotplug and namespace properties on the library's device" \
    cargo test -p softverbs-conformance --features "hardware,$sv_feats" --test hw_library -- --nocapture --test-threads=1
run "the ULP layer on the library's device (ulp_hw)" \
    cargo test -p softverbs --features "$feats" --test ulp_hw -- --nocapture --test-threads=1

# Item: soft vs hw in one command; here the hw column is the library's
# device through the hardware backend. A short run: it checks that both
# columns and the ratio come out, not the figures.
perf_side_by_side() {
    local out
    out=$("$target/debug/softverbs" perf send_lat -s 8 -n 500 --backends soft,hw) || return 1
    echo "$out" | sed -n '/side by side/,$p'
    echo "$out" | grep -Eq '^ 8 +[0-9.]+ +[0-9.]+ +[0-9.]+x$'
}
run "softverbs perf send_lat --backends soft,hw" perf_side_by_side

# The CM's hardware backend needs the library's librdmacm: rdma-core's
# would look for the kernel's rdma_cm, which the library's device is not
# under.
if [ -e "$dir/librdmacm.so.1" ]; then
    run "cm over librdmacm on the library's device (cm_hw)" \
        env SOFTVERBS_ADDR=127.0.39.1 SOFTVERBS_PORT=4791 SOFTVERBS_CM_HW_ADDRS=127.0.39.1 \
        SOFTVERBS_CM_HW_PEER_ADDR=127.0.39.2 \
        cargo test -p softverbs --features "$feats" --test cm_hw --test cm_hw_removal --test cm_hw_addr --test cm_hw_prop -- --nocapture --test-threads=1
else
    echo "---- cm over librdmacm (cm_hw): SKIP: mklibdir.sh made no librdmacm.so.1"
fi

if [ ${#failed[@]} -ne 0 ]; then
    printf 'run_hw_tests: FAILED: %s\n' "${failed[@]}"
    exit 1
fi
echo "run_hw_tests: all passed"
