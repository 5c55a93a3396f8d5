#!/bin/sh
# Builds the verbs emulator library and its librdmacm and makes a
# directory in which they are libibverbs.so.1 and librdmacm.so.1 (and the
# .so names), for LD_LIBRARY_PATH:
#
#   emulator/ibverbs/mklibdir.sh /tmp/sv [--debug]
#   LD_LIBRARY_PATH=/tmp/sv ibv_devinfo
#
# The links point at the library in cargo's target directory
# ($CARGO_TARGET_DIR, else ./target), so a later build updates them.
set -eu
dir=${1:?usage: mklibdir.sh DIR [--debug]}
profile=release
flag=--release
if [ "${2:-}" = "--debug" ]; then profile=debug; flag=; fi
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
cargo build -p softverbs-ibverbs -p softverbs-rdmacm $flag
target=${CARGO_TARGET_DIR:-$here/target}
lib=$(cd "$target/$profile" && pwd)/libsoftverbs_ibverbs.so
mkdir -p "$dir"
ln -sf "$lib" "$dir/libibverbs.so.1"
ln -sf "$lib" "$dir/libibverbs.so"
echo "$dir/libibverbs.so.1 -> $lib"
cm=$(cd "$target/$profile" && pwd)/libsoftverbs_rdmacm.so
ln -sf "$cm" "$dir/librdmacm.so.1"
ln -sf "$cm" "$dir/librdmacm.so"
echo "$dir/librdmacm.so.1 -> $cm"
