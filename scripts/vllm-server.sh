#!/usr/bin/env bash
# Starts and stops a real vLLM 0.32 (CPU) on loopback, serving SmolLM2-135M-Instruct from
# .models/smollm2-135m-hf (both installed by scripts/setup-vllm.sh).
#
#   scripts/vllm-server.sh start   # 127.0.0.1:${OMEN_VLLM_PORT:-18011}, waits for GET /health (70-100 s)
#   scripts/vllm-server.sh stop    # stops it by the PID in its state folder, then its children
#   scripts/vllm-server.sh url     # prints the base URL
#
# Environment:
#   OMEN_VLLM_PORT      port (default 18011)
#   OMEN_VLLM_STATE     folder for the PID file, the log and vLLM's caches (default <repo>/.vllm)
#   OMEN_VLLM_VENV      the venv (default <repo>/.venv-vllm)
#   OMEN_VLLM_ARGS      extra arguments for the API server, e.g. "--kv-cache-metrics"
#   VLLM_PLUGINS        which general plugins load ("" loads none; unset loads every installed one)
#   OMEN_VLLM_URL ...   the omen plugin's settings, passed through (integrations/vllm/README.md)
# The log stays in the state folder after a stop, so a failed test can be read afterwards.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${OMEN_VLLM_VENV:-$ROOT/.venv-vllm}"
PY="$VENV/bin/python"
MODEL_DIR="$ROOT/.models/smollm2-135m-hf"
PORT="${OMEN_VLLM_PORT:-18011}"
STATE="${OMEN_VLLM_STATE:-$ROOT/.vllm}"
PID_FILE="$STATE/server.pid"
LOG_FILE="$STATE/server.log"
START_TIMEOUT_S="${OMEN_VLLM_START_TIMEOUT_S:-400}"

die() { printf 'vllm-server: %s\n' "$*" >&2; exit 1; }

healthy() {
    curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/health" 2>/dev/null
}

running_pid() {
    [[ -f "$PID_FILE" ]] || return 1
    local pid
    pid="$(cat "$PID_FILE")"
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && printf '%s\n' "$pid"
}

start() {
    local pid
    [[ -x "$PY" ]] || die "no vLLM venv at $VENV; run \`make setup\` (or scripts/setup-vllm.sh)"
    [[ -f "$MODEL_DIR/config.json" ]] || die "no model at $MODEL_DIR; run \`make setup\` (or scripts/setup-vllm.sh)"
    if pid="$(running_pid)"; then
        healthy || die "a vLLM (PID $pid) is running but not healthy on port $PORT; run \`$0 stop\` first"
        printf 'vllm-server: already running (PID %s) on http://127.0.0.1:%s\n' "$pid" "$PORT"
        return
    fi
    healthy && die "port $PORT already serves /health but not from $PID_FILE; stop that server or set OMEN_VLLM_PORT"
    mkdir -p "$STATE/cache" "$STATE/inductor"
    # Float32 and eager mode: bf16 on AVX2 falls back to slow kernels and graph capture
    # costs minutes at start-up for no decoding gain (../shared/notes/vllm-cpu.md).
    # setsid: the server and its engine processes form one group that stop can signal.
    # shellcheck disable=SC2086
    VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    VLLM_CACHE_ROOT="$STATE/cache" TORCHINDUCTOR_CACHE_DIR="$STATE/inductor" \
        setsid nohup "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
        --served-model-name smollm2 --host 127.0.0.1 --port "$PORT" --max-model-len 2048 \
        --dtype float32 --enforce-eager ${OMEN_VLLM_ARGS:-} >"$LOG_FILE" 2>&1 </dev/null &
    pid=$!
    printf '%s\n' "$pid" >"$PID_FILE"
    local waited=0
    while (( waited < START_TIMEOUT_S * 2 )); do
        if healthy; then
            printf 'vllm-server: ready (PID %s) on http://127.0.0.1:%s after %ss (log %s)\n' \
                "$pid" "$PORT" "$((waited / 2))" "$LOG_FILE"
            return
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f "$PID_FILE"
            tail -n 30 "$LOG_FILE" >&2 || true
            die "vLLM exited during start-up; see $LOG_FILE"
        fi
        sleep 0.5
        waited=$((waited + 1))
    done
    stop_pid "$pid"
    die "vLLM did not answer GET /health within ${START_TIMEOUT_S}s; see $LOG_FILE"
}

# SIGTERM to the server's process group, SIGKILL after 20 s.
stop_pid() {
    local pid="$1"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do
        kill -0 -- "-$pid" 2>/dev/null || { rm -f "$PID_FILE"; return; }
        sleep 0.5
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$PID_FILE"
}

stop() {
    local pid
    if pid="$(running_pid)"; then
        stop_pid "$pid"
        printf 'vllm-server: stopped (PID %s)\n' "$pid"
    else
        rm -f "$PID_FILE"
        printf 'vllm-server: not running\n'
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    url) printf 'http://127.0.0.1:%s\n' "$PORT" ;;
    *) die "usage: $0 start|stop|url" ;;
esac
