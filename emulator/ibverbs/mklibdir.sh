#!/bin/sh
# Builds the verbs emulator library and makes a directory in which it is
# libibverbs.so.1 (and libibverbs.so), for LD_LIBRARY_PATH:
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
cargo build -p softverbs-ibverbs $flag
target=${CARGO_TARGET_DIR:-$here/target}
lib=$(cd "$target/$profile" && pwd)/libsoftverbs_ibverbs.so
mkdir -p "$dir"
ln -sf "$lib" "$dir/libibverbs.so.1"
ln -sf "$lib" "$dir/libibverbs.so"
echo "$dir/libibverbs.so.1 -> $lib"
