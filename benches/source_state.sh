#!/usr/bin/env bash
# Prints one line naming the sources a build of the CLI comes from: a hash
# of the committed files under the paths that go into the binary, and one
# of every uncommitted change there (tracked edits and new files). Equal
# lines mean the same sources, whatever else (docs, scripts) changed.
# benches/pgo.sh records it beside its build; benches/run_peers.sh
# compares, so that a PGO build left from other sources is not measured as
# if it were this tree's. Outside a git checkout every tree looks alike
# (the line is constant): nothing to compare against there.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
paths=(provider emulator conformance benches/src benches/tests benches/Cargo.toml Cargo.toml Cargo.lock .cargo)
committed=$({ git ls-tree -r HEAD -- "${paths[@]}" 2>/dev/null || echo "no git"; } | sha256sum | cut -c1-16)
uncommitted=$({
    git diff HEAD -- "${paths[@]}" 2>/dev/null || true
    { git ls-files --others --exclude-standard -- "${paths[@]}" 2>/dev/null || true; } | while read -r f; do
        echo "$f"
        cat "$f"
    done
} | sha256sum | cut -c1-16)
echo "$committed $uncommitted"
