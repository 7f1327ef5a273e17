#!/usr/bin/env bash
# A real history for the coupled latency model (`omen explain`, docs/explain.md): the local
# llama.cpp `llama-server` (SmolLM2-135M from `make setup`) on loopback, `omen run` with a
# canary and the server's /metrics, and `omen bench` load in phases of changing arrival
# rate; then `omen explain` on the agent's store. Bounded: every phase ends on its own.
#
#   bash scripts/explain-llama.sh            # 6 phases of 5 min; results in target/explain-llama/
#
# Environment: EXPLAIN_RATES (sessions/s per phase, 0 = idle; default "0 0.5 2 4 1 0"),
# EXPLAIN_PHASE_SECONDS (default 300), EXPLAIN_OUT (default target/explain-llama),
# OMEN_BIN (default target/release/omen, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RATES=${EXPLAIN_RATES:-"0 0.5 2 4 1 0"}
PHASE=${EXPLAIN_PHASE_SECONDS:-300}
OUT=${EXPLAIN_OUT:-$ROOT/target/explain-llama}
OMEN=${OMEN_BIN:-$ROOT/target/release/omen}
log() { echo "explain-llama: $*" >&2; }
die() { log "$*"; exit 1; }
[[ $PHASE =~ ^[0-9]+$ ]] && (( PHASE >= 60 && PHASE <= 3600 )) || die "EXPLAIN_PHASE_SECONDS=$PHASE must be 60..3600"
[[ -x $OMEN ]] || cargo build --release -p omen-cli --bin omen >&2
rm -rf "$OUT" && mkdir -p "$OUT"

mapfile -t paths < <(bash scripts/llm-server.sh path)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
LLM_PORT=$(free_port)
OMEN_PORT=$(free_port)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

"${paths[0]}" -m "${paths[1]}" --host 127.0.0.1 --port "$LLM_PORT" -c 4096 -np 2 -t 2 \
    --alias smollm2-135m --metrics >"$OUT/llama-server.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$LLM_PORT/health" >/dev/null && break; sleep 0.5; done
curl -sf "http://127.0.0.1:$LLM_PORT/health" >/dev/null || die "llama-server did not become healthy (see $OUT/llama-server.log)"

cat >"$OUT/omen.yaml" <<YAML
store:
  path: $OUT/omen.db
http:
  listen: 127.0.0.1:$OMEN_PORT
sources:
  nvml:
    enabled: false
  server_metrics:
    url: http://127.0.0.1:$LLM_PORT/metrics
    interval: 10s
  canary:
    interval: 10s
    target:
      base_url: http://127.0.0.1:$LLM_PORT/v1
      model: smollm2-135m
      max_tokens: 32
    prompts:
      - id: capital
        prompt: What is the capital of France? Answer in one sentence.
        reference: The capital of France is Paris.
      - id: water
        prompt: Why is the sky blue? Answer in two sentences.
        reference: Sunlight is scattered by the molecules of the air, and blue light is scattered the most.
YAML
"$OMEN" run --config "$OUT/omen.yaml" >"$OUT/omen.log" 2>&1 &
OMEN_PID=$!
PIDS+=($OMEN_PID)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$OMEN_PORT/readyz" >/dev/null && break; sleep 0.2; done
curl -sf "http://127.0.0.1:$OMEN_PORT/readyz" >/dev/null || die "omen did not become ready (see $OUT/omen.log)"

n=0
for rate in $RATES; do
    n=$((n + 1))
    if [[ $rate == 0 ]]; then
        log "phase $n: idle for ${PHASE}s (canaries only)"
        sleep "$PHASE"
        continue
    fi
    log "phase $n: $rate sessions/s for ${PHASE}s"
    sed -e "s/^  rate: .*/  rate: $rate/" -e "s/^max_requests: .*/max_requests: 1000000/" \
        -e "s/^duration: .*/duration: ${PHASE}s/" -e "s/^concurrency: .*/concurrency: 8/" \
        deploy/workflows/chat.yaml >"$OUT/phase$n.yaml"
    "$OMEN" bench --workflow "$OUT/phase$n.yaml" --endpoint "http://127.0.0.1:$LLM_PORT/v1" \
        --out "$OUT/phase$n-bench.json" --no-progress >"$OUT/phase$n-bench.log" 2>&1 \
        || log "phase $n: omen bench exited non-zero (see $OUT/phase$n-bench.log)"
done
kill -TERM "$OMEN_PID"
wait "$OMEN_PID" || true
total=$(( $(wc -w <<<"$RATES") * PHASE ))
"$OMEN" explain --store "$OUT/omen.db" --since "now-${total}s" --until now \
    --json "$OUT/explain.json" --svg "$OUT/explain.svg" | tee "$OUT/explain.txt"
