#!/usr/bin/env bash
# Fails when the `omen` binary links libtorch. Only omen-worker may: the agent, the lab
# and the bench tools run on machines without libtorch. Cargo unifies features across a
# workspace build, so any crate in omen's tree that depends on omen-model gets the
# `torch` feature omen-worker turns on; keep such code in a torch-free crate (omen-nab).
set -euo pipefail
bin="${1:?usage: check-omen-links.sh PATH_TO_OMEN}"
if [[ ! -x "$bin" ]]; then
    echo "check-omen-links: $bin is not an executable; build it first (cargo build -p omen-cli)" >&2
    exit 2
fi
if linked=$(ldd "$bin" | grep -E 'libtorch|libc10'); then
    echo "check-omen-links: $bin links libtorch:" >&2
    echo "$linked" >&2
    echo "a crate in omen's dependency tree depends on omen-model (whose torch feature" >&2
    echo "omen-worker enables); move what it needs into a crate without torch" >&2
    exit 1
fi
echo "check-omen-links: $bin does not link libtorch"
