#!/usr/bin/env bash
# Installs a CPU-only libtorch for tch 0.26 into .libtorch, built from PyPI wheels
# (torch==2.13.0 plus the two small NVIDIA runtime wheels libtorch_cpu.so links
# against even on CPU). No download-libtorch, no model hub: PyPI only.
#
#   scripts/setup-libtorch.sh     # ~540 MB download once, <1 s afterwards
#
# Environment: OMEN_LIBTORCH_DIR (default <repo>/.libtorch), PYTHON (default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
T="${OMEN_LIBTORCH_DIR:-$ROOT/.libtorch}"
VERSION="2.13.0"
PIP_CACHE="$ROOT/.tools/pip-cache"

log() { printf 'setup-libtorch: %s\n' "$*" >&2; }

complete() {
    [[ "$(cat "$T/build-version" 2>/dev/null)" == "$VERSION" ]] || return 1
    local f
    for f in libtorch_cpu.so libtorch.so libc10.so libgomp.so.1 libcudart.so.13 libcupti.so.13; do
        [[ -f "$T/lib/$f" ]] || return 1
    done
    [[ -f "$T/include/torch/csrc/api/include/torch/torch.h" ]]
}

if complete; then
    log "libtorch $VERSION already in $T"
    exit 0
fi

command -v unzip >/dev/null || { log "unzip is missing: run 'make setup-apt' (scripts/apt-packages.txt lists it)"; exit 1; }
DL="$(mktemp -d)"
trap 'rm -rf "$DL"' EXIT
log "downloading torch==$VERSION and the CUDA runtime stubs from PyPI"
"${PYTHON:-python3}" -m pip download --disable-pip-version-check --cache-dir "$PIP_CACHE" --no-deps -q -d "$DL" \
    "torch==$VERSION" nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85
rm -rf "$T.partial"
mkdir -p "$T.partial/lib"
unzip -q "$DL"/torch-"$VERSION"-*.whl 'torch/lib/libtorch_cpu.so' 'torch/lib/libtorch.so' 'torch/lib/libc10.so' \
    'torch/lib/libgomp.so.1' 'torch/include/*' -d "$DL/x"
mv "$DL"/x/torch/lib/* "$T.partial/lib/"
mv "$DL/x/torch/include" "$T.partial/include"
unzip -q -j -o "$DL"/nvidia_cuda_runtime-*.whl nvidia/cu13/lib/libcudart.so.13 -d "$T.partial/lib"
unzip -q -j -o "$DL"/nvidia_cuda_cupti-*.whl nvidia/cu13/lib/libcupti.so.13 -d "$T.partial/lib"
echo "$VERSION" > "$T.partial/build-version"
# Swap in atomically so an interrupted run never leaves a half folder that looks complete.
rm -rf "$T"
mv "$T.partial" "$T"
log "installed libtorch $VERSION in $T ($(du -sh "$T" | cut -f1))"
