#!/usr/bin/env bash
# Measures what omen's vLLM plugin costs vLLM: the same `omen bench` load against a real
# vLLM (scripts/vllm-server.sh) with the plugin off (VLLM_PLUGINS="") and on (pushing to a
# real omen agent every second), alternating off/on PAIRS times, one fresh server per run.
# Prints one line per run and the medians per arm as a markdown table.
#
#   bash scripts/vllm-plugin-overhead.sh            # 3 pairs, ~8 min on 2 cores
#
# Environment: PAIRS (3), REQUESTS per run (48), OMEN_BIN (target/debug/omen; `cargo build -p omen-cli`).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OMEN="${OMEN_BIN:-$ROOT/target/debug/omen}"
PAIRS="${PAIRS:-3}"
REQUESTS="${REQUESTS:-48}"
WORK="$(mktemp -d)"
VLLM_PORT=18021
AGENT_PORT=18022
export OMEN_VLLM_PORT="$VLLM_PORT"
[[ -x "$OMEN" ]] || { echo "no omen binary at $OMEN; run \`cargo build -p omen-cli\`" >&2; exit 1; }

cleanup() {
    bash "$ROOT/scripts/vllm-server.sh" stop >/dev/null 2>&1 || true
    [[ -n "${AGENT_PID:-}" ]] && kill "$AGENT_PID" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/omen.yaml" <<YAML
store:
  path: $WORK/omen.db
http:
  listen: 127.0.0.1:$AGENT_PORT
  metrics_listen: null
YAML
"$OMEN" run --config "$WORK/omen.yaml" >"$WORK/agent.log" 2>&1 &
AGENT_PID=$!
for _ in $(seq 1 100); do curl -fsS -o /dev/null "http://127.0.0.1:$AGENT_PORT/readyz" && break; sleep 0.1; done

cat >"$WORK/wf.yaml" <<YAML
name: plugin-overhead
api: chat
max_tokens: 32
ignore_eos: true
concurrency: 4
seed: 11
arrival: { rate: 50, rate_shape: 4, change_every: 2s }
max_requests: $REQUESTS
duration: 600s
start: ask
states:
  ask:
    prompts: ["Name three rivers in Europe.", "Why is the sea salty? Answer briefly.", "Write a haiku about rain.", "Explain what a compiler does in two sentences."]
    timeout: 120s
    transitions: [{ to: ask, probability: 0.999 }, { to: end, probability: 0.001 }]
YAML

run() { # arm n
    local arm="$1" n="$2"
    if [[ "$arm" == on ]]; then
        OMEN_VLLM_URL="http://127.0.0.1:$AGENT_PORT" OMEN_VLLM_STATS_FILE="$WORK/stats-$n.json" \
            bash "$ROOT/scripts/vllm-server.sh" start >/dev/null
    else
        VLLM_PLUGINS="" bash "$ROOT/scripts/vllm-server.sh" start >/dev/null
    fi
    # One warm-up request so that no run pays a first-request cost.
    curl -fsS -o /dev/null "http://127.0.0.1:$VLLM_PORT/v1/chat/completions" -H 'content-type: application/json' \
        -d '{"model":"smollm2","messages":[{"role":"user","content":"Hi"}],"max_tokens":8}'
    "$OMEN" bench --workflow "$WORK/wf.yaml" --endpoint "http://127.0.0.1:$VLLM_PORT/v1" --out "$WORK/$arm-$n.json" 2>/dev/null
    bash "$ROOT/scripts/vllm-server.sh" stop >/dev/null
    python3 - "$WORK/$arm-$n.json" "$arm" "$n" "$WORK/stats-$n.json" <<'PY'
import json, sys, os
r = json.load(open(sys.argv[1]))
s = json.load(open(sys.argv[4])) if os.path.exists(sys.argv[4]) else {}
extra = f" plugin: {s.get('pushed', 0)} pushes, {s.get('hook_us_per_step', 0):.1f} us/step, snapshot {s.get('snapshot_us', 0):.0f} us, {s.get('failed', 0)} failed" if s else ""
print(f"run {sys.argv[3]} {sys.argv[2]:>3}: {r['completed']} ok {r['failed']} failed, "
      f"{r['output_throughput']:.1f} tok/s, median TTFT {r['median_ttft_ms']:.1f} ms, p99 TTFT {r['p99_ttft_ms']:.1f} ms{extra}")
PY
}

for n in $(seq 1 "$PAIRS"); do
    run off "$n"
    run on "$n"
done

python3 - "$WORK" <<'PY'
import glob, json, statistics, sys
work = sys.argv[1]
def arm(name):
    rs = [json.load(open(p)) for p in sorted(glob.glob(f"{work}/{name}-*.json"))]
    return {k: statistics.median(r[k] for r in rs) for k in ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms")}
off, on = arm("off"), arm("on")
print("\n| median of runs | plugin off | plugin on | change |\n|---|---:|---:|---:|")
for k, label in [("output_throughput", "output tokens/s"), ("median_ttft_ms", "median TTFT, ms"), ("p99_ttft_ms", "p99 TTFT, ms"), ("mean_tpot_ms", "mean TPOT, ms")]:
    print(f"| {label} | {off[k]:.1f} | {on[k]:.1f} | {100 * (on[k] - off[k]) / off[k]:+.1f}% |")
PY
