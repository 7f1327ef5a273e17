#!/usr/bin/env bash
# The agent's own cost: CPU and RSS of `omen run` under the push load of an 8-GPU node
# (8 GPUs x 80 layers of KV bitmaps + 4 canaries, once a second), then /scores p99
# under 200 concurrent clients (wrk) while that load keeps running.
#
# Every figure is also given as a ratio to a reference measured in the same run on the
# same machine, so that it carries from one machine to another (each query's wrk time is
# split into BENCH_WRK_ROUNDS, default 3, rounds alternating agent and reference; a ratio
# is the median of the rounds'):
#   - each query is repeated against omen-static-serve, which serves the agent's own answer
#     (same bytes, same encoding) through the same HTTP stack with no work behind it:
#     throughput ratio (target >= 0.5) and p99 ratio (target <= 2);
#   - agent CPU per pushed sample and per pushed KV block map (omen_samples_ingested_total
#     over the steady window), beside the cost of merely parsing the same payloads with the
#     agent's parser (omen-push-load --parse-only);
#   - RSS per live series (omen_series): what the series added over the idle agent.
#
#   bash scripts/bench-agent.sh            # 60 s of push load, 2 x 15 s of wrk
#
# Environment: BENCH_SECONDS (push phase, default 60), BENCH_BACKFILL (seconds of
# history pushed before the timing starts, default 300), BENCH_WARMUP (seconds skipped
# before CPU sampling, default 10), BENCH_WRK_SECONDS (per query and side, default 15),
# BENCH_WRK_ROUNDS (default 3), BENCH_WRK_CONNS
# (default 200), BENCH_WRK_THREADS (default 2), BENCH_WRK1_SECONDS (the
# one-connection service-time runs, default 5), BENCH_GPUS / BENCH_LAYERS /
# BENCH_BLOCKS / BENCH_CANARIES (push shape, default 8/80/4096/4), BENCH_OUT (JSON
# summary, default target/bench-agent.json), CARGO_TARGET_DIR (where the release
# build goes, default target), BENCH_NO_BUILD=1 (use the binaries already built),
# BENCH_PIN (1, the default: the servers on all CPUs but the last, pusher and wrk on the
# last; 0: no pinning), BENCH_HEALTH_INTERVAL (the agent's health.interval, e.g. 5s, so that a short steady window
# holds enough ticks to time; default: the agent's default, 1m), BENCH_STORE (a store file, e.g. from `omen fill-history`, copied and used as the agent's
# store so that it starts with that history; default: a new store), BENCH_LEAN=1 (the lean sidecar: built with --no-default-features, without model
# support, into target/lean unless CARGO_TARGET_DIR says otherwise). Neither build of
# `omen` links libtorch: the models run in the omen-worker process, started only when
# a model is configured, and the bench configures none ("without the model").
#
# Everything runs on loopback. Exits non-zero only when the benchmark cannot run;
# each target is reported as MET or NOT MET. Every process it starts is stopped on exit.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD

SECONDS_PUSH=${BENCH_SECONDS:-60}
WARMUP=${BENCH_WARMUP:-10}
WRK_SECONDS=${BENCH_WRK_SECONDS:-15}
WRK_ROUNDS=${BENCH_WRK_ROUNDS:-3}
WRK_CONNS=${BENCH_WRK_CONNS:-200}
WRK_THREADS=${BENCH_WRK_THREADS:-2}
WRK1_SECONDS=${BENCH_WRK1_SECONDS:-5}
BACKFILL=${BENCH_BACKFILL:-300}
GPUS=${BENCH_GPUS:-8}
LAYERS=${BENCH_LAYERS:-80}
BLOCKS=${BENCH_BLOCKS:-4096}
CANARIES=${BENCH_CANARIES:-4}
LEAN=${BENCH_LEAN:-0}
if [[ $LEAN == 1 ]]; then
    BUILD_ARGS=(--no-default-features)
    TARGET_DIR=${CARGO_TARGET_DIR:-target/lean}
    BUILD_KIND="lean (--no-default-features: no model support)"
else
    BUILD_ARGS=()
    TARGET_DIR=${CARGO_TARGET_DIR:-target}
    BUILD_KIND="default features (lstm, bertscore: run by omen-worker, not started without a model)"
fi
case $TARGET_DIR in /*) ;; *) TARGET_DIR=$ROOT/$TARGET_DIR ;; esac
if [[ $LEAN == 1 ]]; then OUT=${BENCH_OUT:-$ROOT/target/bench-agent-lean.json}; else OUT=${BENCH_OUT:-$ROOT/target/bench-agent.json}; fi

# Targets (issue: "A benchmark of the agent's own cost").
CPU_TARGET_PCT=1.0      # % of one core at 1 Hz
RSS_TARGET_MB=40        # MB, without the model
P99_TARGET_MS=10        # /scores p99 under 200 clients

die() { echo "bench-agent: $*" >&2; exit 1; }
log() { echo "bench-agent: $*" >&2; }

[[ $SECONDS_PUSH =~ ^[0-9]+$ ]] || die "BENCH_SECONDS=$SECONDS_PUSH is not a whole number of seconds"
[[ $BACKFILL =~ ^[0-9]+$ ]] || die "BENCH_BACKFILL=$BACKFILL is not a whole number of seconds"
[[ $WARMUP =~ ^[0-9]+$ ]] || die "BENCH_WARMUP=$WARMUP is not a whole number of seconds"
(( SECONDS_PUSH > WARMUP + 4 )) || die "BENCH_SECONDS ($SECONDS_PUSH) must exceed BENCH_WARMUP ($WARMUP) by at least 5 s"
(( SECONDS_PUSH <= 3600 )) || die "BENCH_SECONDS is capped at 3600"
[[ $WRK_ROUNDS =~ ^[1-9][0-9]*$ ]] || die "BENCH_WRK_ROUNDS=$WRK_ROUNDS is not a whole number of rounds (at least 1)"
# Rounded up: each side gets at least BENCH_WRK_SECONDS per query.
ROUND_SECONDS=$(( (WRK_SECONDS + WRK_ROUNDS - 1) / WRK_ROUNDS ))
command -v wrk >/dev/null || die "wrk not found: apt-get install -y wrk (listed in scripts/apt-packages.txt)"
command -v curl >/dev/null || die "curl not found"
command -v python3 >/dev/null || die "python3 not found (used for the JSON summary)"
CLK_TCK=$(getconf CLK_TCK)

# ---------------------------------------------------------------- build
if [[ ${BENCH_NO_BUILD:-0} != 1 ]]; then
    log "building (release): omen + omen-push-load"
    CARGO_TARGET_DIR=$TARGET_DIR cargo build --release "${BUILD_ARGS[@]}" -p omen-cli --bin omen >&2
    CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -p omen-bench --bin omen-push-load --bin omen-static-serve >&2
fi
OMEN=$TARGET_DIR/release/omen
PUSH=$TARGET_DIR/release/omen-push-load
STATIC=$TARGET_DIR/release/omen-static-serve
[[ -x $OMEN && -x $PUSH && -x $STATIC ]] || die "missing $OMEN, $PUSH or $STATIC (build failed?)"

# ---------------------------------------------------------------- process bookkeeping
# TMP, PIDS (stopped on exit), free_port, cpu_ticks, status_kb, now_s.
NAME=bench-agent
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

# ---------------------------------------------------------------- CPU placement
# The server under test (agent or reference) gets every core but the last; the load
# (pusher, wrk) gets the last. Both servers then meet the same conditions, and the
# scheduler's shuffling of 200 clients' threads across all cores stops widening the tails
# (two runs' ratios differed by up to 26% unpinned). BENCH_PIN=0 turns it off.
# The CPUs this process may use (a container's cpuset need not start at 0), as
# "SERVER-LIST LOAD SERVER-COUNT ALL-COUNT".
read -r SERVER_CPUS CLIENT_CPU PINNED_SERVER_COUNT ALLOWED_CPU_COUNT < <(python3 -c '
import os
cpus = sorted(os.sched_getaffinity(0))
print(",".join(map(str, cpus[:-1])) or "-", cpus[-1], len(cpus) - 1, len(cpus))
')
PIN_SERVER=(); PIN_CLIENT=()
PLACEMENT="unpinned"
SERVER_CPU_COUNT=$ALLOWED_CPU_COUNT
if [[ ${BENCH_PIN:-1} == 1 && $SERVER_CPUS != - ]] && command -v taskset >/dev/null; then
    PIN_SERVER=(taskset -c "$SERVER_CPUS"); PIN_CLIENT=(taskset -c "$CLIENT_CPU")
    PLACEMENT="servers on CPUs $SERVER_CPUS, pusher and wrk on CPU $CLIENT_CPU"
    SERVER_CPU_COUNT=$PINNED_SERVER_COUNT
    log "pinning: $PLACEMENT"
fi

# ---------------------------------------------------------------- parse cost
# The agent's parser alone on 30 rounds of the same payloads (no HTTP, no pipeline).
"${PIN_SERVER[@]}" "$PUSH" --parse-only --gpus "$GPUS" --layers "$LAYERS" --blocks "$BLOCKS" --canaries "$CANARIES" \
    --seconds 30 >"$TMP/parse.json" 2>"$TMP/parse.log" || { cat "$TMP/parse.log" >&2; die "omen-push-load --parse-only failed"; }
log "parse cost: $(cat "$TMP/parse.json")"

# metric NAME: the sum of a metric's samples in the agent's /metrics (0 when absent).
metric() {
    curl -fsS "$URL/metrics" | awk -v n="$1" '$1 == n || index($1, n "{") == 1 {s += $NF} END {printf "%.9g\n", s + 0}'
}

# ---------------------------------------------------------------- agent
PORT=$(free_port)
URL=http://127.0.0.1:$PORT
cat >"$TMP/omen.yaml" <<EOF
store:
  path: $TMP/store/omen.db
http:
  listen: 127.0.0.1:$PORT
sources:
  nvml:
    enabled: false
EOF
if [[ -n ${BENCH_HEALTH_INTERVAL:-} ]]; then
    printf 'health:\n  interval: %s\n' "$BENCH_HEALTH_INTERVAL" >>"$TMP/omen.yaml"
fi
mkdir -p "$TMP/store"
if [[ -n ${BENCH_STORE:-} ]]; then
    [[ -f $BENCH_STORE ]] || die "BENCH_STORE=$BENCH_STORE is not a file: give a store written by omen run or omen fill-history"
    for suffix in "" -wal -shm; do
        [[ -f $BENCH_STORE$suffix ]] && cp "$BENCH_STORE$suffix" "$TMP/store/omen.db$suffix"
    done
    log "the agent starts on a copy of $BENCH_STORE ($(du -sh "$TMP/store" | cut -f1))"
fi
log "starting the agent on $URL (store in $TMP/store)"
RUST_LOG=${RUST_LOG:-warn} "${PIN_SERVER[@]}" "$OMEN" run --config "$TMP/omen.yaml" >"$TMP/omen.log" 2>&1 &
AGENT=$!
PIDS+=("$AGENT")

for _ in $(seq 300); do
    kill -0 "$AGENT" 2>/dev/null || { cat "$TMP/omen.log" >&2; die "the agent exited at start-up"; }
    curl -fsS -o /dev/null "$URL/readyz" 2>/dev/null && break
    sleep 0.1
done
curl -fsS -o /dev/null "$URL/readyz" || { cat "$TMP/omen.log" >&2; die "/readyz not 200 after 30 s"; }

# ---------------------------------------------------------------- samplers

# Idle cost (no pushes yet): 5 s.
I0=$(now_s); IC0=$(cpu_ticks "$AGENT")
sleep 5
I1=$(now_s); IC1=$(cpu_ticks "$AGENT")
CPU_IDLE_PCT=$(python3 -c "print(round(100.0 * ($IC1 - $IC0) / $CLK_TCK / ($I1 - $I0), 3))")
IDLE_RSS_KB=$(status_kb "$AGENT" VmRSS)
LOADAVG_START=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- backfill
# The store gets BENCH_BACKFILL seconds of history first (default 300 = the 5-minute window
# the /scores query reads), so queries meet what a long-running agent holds. Not timed.
if (( BACKFILL > 0 )); then
    log "backfill: ${BACKFILL} s of history"
    timeout $(( BACKFILL + 120 )) "${PIN_CLIENT[@]}" "$PUSH" --url "$URL" --gpus "$GPUS" --layers "$LAYERS" --blocks "$BLOCKS" \
        --canaries "$CANARIES" --seconds 0 --backfill "$BACKFILL" >"$TMP/backfill.log" 2>&1 \
        || { cat "$TMP/backfill.log" >&2; die "backfill failed"; }
    cat "$TMP/backfill.log" >&2
fi

# ---------------------------------------------------------------- push phase
# One pusher runs the push phase and the wrk phase, so /scores is measured under load.
PUSH_TOTAL=$(( SECONDS_PUSH + 6 * WRK_ROUNDS * (ROUND_SECONDS + 2) + 2 * (WRK1_SECONDS + 2) + 8 ))
log "push load: ${GPUS} GPUs x ${LAYERS} layers x ${BLOCKS} blocks, ${CANARIES} canaries, 1 Hz, ${PUSH_TOTAL} s in all"
"${PIN_CLIENT[@]}" "$PUSH" --url "$URL" --gpus "$GPUS" --layers "$LAYERS" --blocks "$BLOCKS" --canaries "$CANARIES" \
    --seconds "$PUSH_TOTAL" --rate 1 >"$TMP/push.log" 2>&1 &
PUSHER=$!
PIDS+=("$PUSHER")

sleep "$WARMUP"
kill -0 "$PUSHER" 2>/dev/null || { cat "$TMP/push.log" >&2; die "push_load exited early"; }
T0=$(now_s); C0=$(cpu_ticks "$AGENT"); N0=$(cpu_ns "$AGENT")
S0=$(metric omen_samples_ingested_total); K0=$(metric omen_tick_duration_seconds_count); KS0=$(metric omen_tick_duration_seconds_sum)
PEAK_RSS_KB=0
RSS_SUM=0; RSS_N=0
for _ in $(seq $(( SECONDS_PUSH - WARMUP ))); do
    sleep 1
    kill -0 "$AGENT" 2>/dev/null || { cat "$TMP/omen.log" >&2; die "the agent died under load"; }
    r=$(status_kb "$AGENT" VmRSS)
    (( r > PEAK_RSS_KB )) && PEAK_RSS_KB=$r
    RSS_SUM=$(( RSS_SUM + r )); RSS_N=$(( RSS_N + 1 ))
done
T1=$(now_s); C1=$(cpu_ticks "$AGENT"); N1=$(cpu_ns "$AGENT")
S1=$(metric omen_samples_ingested_total); K1=$(metric omen_tick_duration_seconds_count); KS1=$(metric omen_tick_duration_seconds_sum)
SERIES=$(metric omen_series)
END_RSS_KB=$(status_kb "$AGENT" VmRSS)
HWM_PUSH_KB=$(status_kb "$AGENT" VmHWM)
STEADY_S=$(python3 -c "print($T1 - $T0)")
CPU_PCT=$(python3 -c "print(round(100.0 * ($C1 - $C0) / $CLK_TCK / ($T1 - $T0), 3))")
RSS_MEAN_KB=$(( RSS_SUM / RSS_N ))
log "steady state ${STEADY_S%.*} s: CPU ${CPU_PCT}% of one core, RSS end $((END_RSS_KB / 1024)) MB, peak $((PEAK_RSS_KB / 1024)) MB, HWM $((HWM_PUSH_KB / 1024)) MB"

# ---------------------------------------------------------------- wrk phase (pusher still running)
wrk_pct() { # $1 = percentile label (50%, 99%) ; wrk --latency output on stdin -> ms
    awk -v q="$1" '$1 == q {
        v = $2; u = v; sub(/^[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
        if (u == "us") v /= 1000; else if (u == "s") v *= 1000; else if (u == "m") v *= 60000;
        print v; exit }'
}
wrk_field() { # $1 = awk pattern on wrk output -> field $2
    awk -v pat="$1" -v f="$2" '$0 ~ pat {print $f; exit}'
}
# run_wrk NAME PATH [CONNS THREADS SECONDS ACCEPT-ENCODING]: wrk against the agent, or
# against the reference server when REF_URL/REF_PID are set (the CPU column is then the reference's).
run_wrk() {
    local name=$1 path=$2 out=$TMP/wrk-$1.txt
    local conns=${3:-$WRK_CONNS} threads=${4:-$WRK_THREADS} secs=${5:-$WRK_SECONDS} encoding=${6:-identity}
    local base=${REF_URL:-$URL} pid=${REF_PID:-$AGENT}
    sleep 1 # the previous run's connections close
    curl -fsS -H "Accept-Encoding: $encoding" -o "$TMP/probe-$name.json" "$base$path" || die "GET $base$path is not 200 before wrk: $(cat "$TMP/probe-$name.json" 2>/dev/null)"
    log "wrk -t$threads -c$conns -d${secs}s --latency -H 'Accept-Encoding: $encoding' $base$path"
    local c0 c1 t0 t1
    t0=$(now_s); c0=$(cpu_ticks "$pid")
    timeout $(( secs + 30 )) "${PIN_CLIENT[@]}" wrk -t"$threads" -c"$conns" -d"${secs}s" --timeout 5s --latency -H "Accept-Encoding: $encoding" "$base$path" >"$out" 2>&1 \
        || { cat "$out" >&2; die "wrk failed on $base$path"; }
    t1=$(now_s); c1=$(cpu_ticks "$pid")
    cat "$out" >&2
    local p99 p50 p90 rps non2xx errs bytes
    p50=$(wrk_pct 50% <"$out")
    p90=$(wrk_pct 90% <"$out")
    p99=$(wrk_pct 99% <"$out")
    rps=$(wrk_field '^Requests/sec:' 2 <"$out")
    non2xx=$(wrk_field 'Non-2xx or 3xx responses:' 5 <"$out"); non2xx=${non2xx:-0}
    errs=$(awk '/Socket errors:/ {gsub(",", ""); print $4 + $6 + $8 + $10; exit}' "$out"); errs=${errs:-0}
    reqs=$(awk '/requests in/ {print $1; exit}' "$out")
    bytes=$(wc -c <"$TMP/probe-$name.json")
    [[ -n $p50 && -n $p90 && -n $p99 && -n $rps && -n $reqs ]] || die "could not read wrk's output for $path"
    cpu=$(python3 -c "print(round(100.0 * ($c1 - $c0) / $CLK_TCK / ($t1 - $t0), 1))")
    printf '{"path": "%s", "accept_encoding": "%s", "connections": %s, "requests": %s, "rps": %s, "p50_ms": %s, "p90_ms": %s, "p99_ms": %s, "non_2xx": %s, "socket_errors": %s, "response_bytes": %s, "server_cpu_pct": %s}' \
        "$path" "$encoding" "$conns" "$reqs" "$rps" "$p50" "$p90" "$p99" "$non2xx" "$errs" "$bytes" "$cpu" >"$TMP/wrk-$name.json"
}
# start_ref NAME BODY [GZIP_BODY]: omen-static-serve on the saved answer; sets REF_URL, REF_PID.
start_ref() {
    local port gz=()
    port=$(free_port)
    [[ -n ${3:-} ]] && gz=(--gzip-body "$3")
    "${PIN_SERVER[@]}" "$STATIC" --body "$2" "${gz[@]}" --listen "127.0.0.1:$port" >"$TMP/ref-$1.log" 2>&1 &
    REF_PID=$!
    PIDS+=("$REF_PID")
    REF_URL=http://127.0.0.1:$port
    for _ in $(seq 100); do
        curl -fsS -o /dev/null "$REF_URL/" 2>/dev/null && return 0
        kill -0 "$REF_PID" 2>/dev/null || break
        sleep 0.05
    done
    cat "$TMP/ref-$1.log" >&2
    die "the reference server for $1 did not answer"
}
stop_ref() {
    kill "$REF_PID" 2>/dev/null || true
    wait "$REF_PID" 2>/dev/null || true
    # Gone: the exit trap must not signal whatever process reuses the number.
    local kept=() pid
    for pid in "${PIDS[@]}"; do [[ $pid == "$REF_PID" ]] || kept+=("$pid"); done
    PIDS=("${kept[@]}")
    unset REF_URL REF_PID
}
LATEST_PATH=/scores/latest
SERIES_PATH='/scores?signal=kv_fragmentation&layer=3&gpu=0&since=now-5m&step=10s'
# Each agent run is followed at once by the same wrk run against the reference serving the
# bytes the agent answered just before it.
# BENCH_WRK_SECONDS per query and side is split into BENCH_WRK_ROUNDS alternating rounds, and
# a ratio is the median of the rounds' ratios: a noisy spell of the machine then spoils one
# round, not the figure.
for round in $(seq "$WRK_ROUNDS"); do
    run_wrk "latest_r$round" "$LATEST_PATH" "$WRK_CONNS" "$WRK_THREADS" "$ROUND_SECONDS"
    # As Grafana (Go's HTTP client), Python requests and browsers ask for it by default.
    run_wrk "latest_gzip_r$round" "$LATEST_PATH" "$WRK_CONNS" "$WRK_THREADS" "$ROUND_SECONDS" gzip
    start_ref latest "$TMP/probe-latest_r$round.json" "$TMP/probe-latest_gzip_r$round.json"
    run_wrk "ref_latest_r$round" "$LATEST_PATH" "$WRK_CONNS" "$WRK_THREADS" "$ROUND_SECONDS"
    run_wrk "ref_latest_gzip_r$round" "$LATEST_PATH" "$WRK_CONNS" "$WRK_THREADS" "$ROUND_SECONDS" gzip
    stop_ref
    run_wrk "series_r$round" "$SERIES_PATH" "$WRK_CONNS" "$WRK_THREADS" "$ROUND_SECONDS"
    start_ref series "$TMP/probe-series_r$round.json"
    run_wrk "ref_series_r$round" "$SERIES_PATH" "$WRK_CONNS" "$WRK_THREADS" "$ROUND_SECONDS"
    stop_ref
done
# One connection: the per-request service time, without queueing (informative, no target).
run_wrk latest1 "$LATEST_PATH" 1 1 "$WRK1_SECONDS"
run_wrk series1 "$SERIES_PATH" 1 1 "$WRK1_SECONDS"
HWM_END_KB=$(status_kb "$AGENT" VmHWM)
LOADAVG_END=$(cut -d' ' -f1-3 /proc/loadavg)
RSS_AFTER_WRK_KB=$(status_kb "$AGENT" VmRSS)

# ---------------------------------------------------------------- pusher result
kill -0 "$PUSHER" 2>/dev/null || log "warning: push_load ended before wrk did; the last wrk run was not fully under push load"
# The pusher stops by itself after --seconds (a few seconds from here); wait for its report.
log "waiting for push_load to finish its schedule"
PUSH_RC=0
wait "$PUSHER" || PUSH_RC=$?
# Count requests the agent saw fail: rejected ingest counter in /metrics.
REJECTED=$(curl -fsS "$URL/metrics" | awk '/^omen_ingest_rejected_total/ {s += $NF} END {print s + 0}')
SHED=$(curl -fsS "$URL/metrics" | awk '/^omen_shed_total/ {s += $NF} END {print s + 0}')
cat "$TMP/push.log" >&2 || true

# ---------------------------------------------------------------- summary
python3 - "$OUT" <<EOF
import json, sys, platform, os
def load(p):
    with open(p) as f:
        return json.load(f)
cpu = $CPU_PCT
rss_mb = $END_RSS_KB / 1024
peak_mb = $PEAK_RSS_KB / 1024
hwm_mb = $HWM_PUSH_KB / 1024
import statistics
rounds = $WRK_ROUNDS
def merged(name):
    """One query's rounds: the mean request rate, the summed counts, the median latencies."""
    runs = [load(f"$TMP/wrk-{name}_r{i}.json") for i in range(1, rounds + 1)]
    m = dict(runs[0])
    m["rps"] = statistics.mean(float(r["rps"]) for r in runs)
    for key in ("p50_ms", "p90_ms", "p99_ms"):
        m[key] = statistics.median(r[key] for r in runs)
    for key in ("requests", "non_2xx", "socket_errors"):
        m[key] = sum(int(r[key]) for r in runs)
    m["server_cpu_pct"] = round(statistics.mean(float(r["server_cpu_pct"]) for r in runs), 1)
    m["rounds"] = runs
    return m
latest, latest_gzip, series = merged("latest"), merged("latest_gzip"), merged("series")
latest1 = load("$TMP/wrk-latest1.json")
series1 = load("$TMP/wrk-series1.json")
ref = {k: merged(f"ref_{k}") for k in ("latest", "latest_gzip", "series")}
parse = load("$TMP/parse.json")
steady_s = $STEADY_S
cpu_us_ticks = ($C1 - $C0) / $CLK_TCK * 1e6
cpu_us = ($N1 - $N0) / 1e3
# schedstat misses threads that exited in the window; then the tick count is the better figure.
cpu_source = "schedstat (ns)"
if cpu_us_ticks - cpu_us > 2 * 1e6 / $CLK_TCK:
    cpu_us, cpu_source = cpu_us_ticks, "clock ticks (a thread exited in the window)"
samples = $S1 - $S0
kv_maps = samples * parse["kv_maps"] / parse["samples"]
ticks = $K1 - $K0
series_live = int($SERIES)
model = open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].split("\n")[0].strip() if "model name" in open("/proc/cpuinfo").read() else platform.machine()
def verdict(ok): return "MET" if ok else "NOT MET"
targets = {
    "cpu_pct_of_one_core": {"value": cpu, "target": "< $CPU_TARGET_PCT", "verdict": verdict(cpu < $CPU_TARGET_PCT)},
    "rss_mb": {"value": round(peak_mb, 1), "target": "< $RSS_TARGET_MB", "verdict": verdict(peak_mb < $RSS_TARGET_MB),
               "note": "peak VmRSS sampled each second over the steady state"},
    "scores_latest_p99_ms": {"value": latest["p99_ms"], "target": "< $P99_TARGET_MS",
                             "verdict": verdict(latest["p99_ms"] < $P99_TARGET_MS and latest["non_2xx"] == 0 and latest["socket_errors"] == 0)},
    "scores_latest_gzip_p99_ms": {"value": latest_gzip["p99_ms"], "target": "< $P99_TARGET_MS",
                                  "verdict": verdict(latest_gzip["p99_ms"] < $P99_TARGET_MS and latest_gzip["non_2xx"] == 0 and latest_gzip["socket_errors"] == 0)},
    "scores_series_p99_ms": {"value": series["p99_ms"], "target": "< $P99_TARGET_MS",
                             "verdict": verdict(series["p99_ms"] < $P99_TARGET_MS and series["non_2xx"] == 0 and series["socket_errors"] == 0)},
}
# Ratios to references measured in this run (these carry from machine to machine).
def clean(w): return w["non_2xx"] == 0 and w["socket_errors"] == 0
ratios = {}
# A reference that does not keep its CPUs busy is held back by the client (wrk), not by its
# own serving: then its req/s is a floor and the throughput ratio an upper bound.
server_cpu_capacity_pct = 100.0 * $SERVER_CPU_COUNT
client_bound = []
for key, agent, label in (("latest", latest, "/scores/latest"), ("latest_gzip", latest_gzip, "/scores/latest gzip"), ("series", series, "/scores?signal=...")):
    r = ref[key]
    pairs = list(zip(agent["rounds"], r["rounds"]))
    tput = statistics.median(float(a["rps"]) / float(b["rps"]) for a, b in pairs)
    p99 = statistics.median(a["p99_ms"] / b["p99_ms"] for a, b in pairs)
    saturated = r["server_cpu_pct"] / server_cpu_capacity_pct >= 0.85
    if not saturated:
        client_bound.append(f"{label} reference {r['server_cpu_pct']:.0f}% of {server_cpu_capacity_pct:.0f}%")
    ratios[f"{key}_throughput_vs_static"] = {"what": f"{label}: agent req/s / static same-size body req/s", "value": round(tput, 3),
        "target": ">= 0.5", "verdict": verdict(tput >= 0.5 and clean(agent) and clean(r)),
        "agent_cpu_pct": agent["server_cpu_pct"], "reference_cpu_pct": r["server_cpu_pct"], "server_cpu_capacity_pct": server_cpu_capacity_pct,
        "reference_saturated": saturated}
    ratios[f"{key}_p99_vs_static"] = {"what": f"{label}: agent p99 / static same-size body p99", "value": round(p99, 3),
        "target": "<= 2", "verdict": verdict(p99 <= 2.0 and clean(agent) and clean(r))}
if samples <= 0 or series_live <= 0:
    sys.exit(f"bench-agent: the agent accepted {samples} samples in the steady window and holds {series_live} series: "
             "the push load did not reach it (see the pusher's report above)")
per_sample = cpu_us / samples
per_map = cpu_us / kv_maps
ratios["cpu_us_per_sample"] = {"what": "agent CPU per pushed sample (us)", "value": round(per_sample, 3), "target": "", "verdict": ""}
ratios["cpu_us_per_kv_map"] = {"what": "agent CPU per pushed KV block map (us; the whole push's cost shared out)", "value": round(per_map, 3), "target": "", "verdict": ""}
ratios["cpu_vs_parse_per_sample"] = {"what": "agent CPU per sample / the agent's parser alone per sample", "value": round(per_sample / parse["parse_us_per_sample"], 3), "target": "", "verdict": ""}
rss_per_series = ($RSS_MEAN_KB - $IDLE_RSS_KB) * 1024 / series_live
ratios["rss_bytes_per_series"] = {"what": "RSS over the idle agent per live series (bytes)", "value": round(rss_per_series), "target": "", "verdict": ""}
summary = {
    "build": "$BUILD_KIND",
    "machine": {"cpu": model, "cores": os.cpu_count(), "kernel": platform.release(),
                "loadavg_start": "$LOADAVG_START", "loadavg_end": "$LOADAVG_END"},
    "store": "${BENCH_STORE:-new}",
    "cpu_placement": "$PLACEMENT",
    "load": {"gpus": $GPUS, "layers": $LAYERS, "blocks": $BLOCKS, "canaries": $CANARIES, "rate_hz": 1,
             "push_seconds": $SECONDS_PUSH, "warmup_seconds": $WARMUP, "backfill_seconds": $BACKFILL},
    "agent": {"cpu_pct_of_one_core": cpu, "cpu_idle_pct_of_one_core": $CPU_IDLE_PCT, "steady_seconds": round($STEADY_S, 1),
              "rss_idle_mb": round($IDLE_RSS_KB / 1024, 1), "rss_end_mb": round(rss_mb, 1),
              "rss_mean_mb": round($RSS_MEAN_KB / 1024, 1), "rss_peak_mb": round(peak_mb, 1),
              "vmhwm_push_mb": round(hwm_mb, 1), "vmhwm_end_mb": round($HWM_END_KB / 1024, 1),
              "rss_after_wrk_mb": round($RSS_AFTER_WRK_KB / 1024, 1),
              "ingest_rejected": $REJECTED, "ingest_shed": $SHED, "push_load_exit": $PUSH_RC},
    "wrk": {"threads": $WRK_THREADS, "connections": $WRK_CONNS, "seconds": $ROUND_SECONDS * rounds, "rounds": rounds,
            "scores_latest": latest, "scores_latest_gzip": latest_gzip, "scores_series": series,
            "one_connection": {"scores_latest": latest1, "scores_series": series1}},
    "targets": targets,
    "ratios": ratios,
    "per_sample": {"samples_in_steady_window": samples, "samples_per_second": round(samples / steady_s, 1),
                   "kv_maps_in_steady_window": round(kv_maps), "agent_cpu_us": round(cpu_us),
                   "live_series": series_live, "ticks": ticks,
                   "tick_mean_ms": round(($KS1 - $KS0) / ticks * 1000, 3) if ticks > 0 else None,
                   "agent_cpu_us_clock_ticks": round(cpu_us_ticks), "agent_cpu_source": cpu_source,
                   "parse": parse},
    "reference": ref,
}
os.makedirs(os.path.dirname(sys.argv[1]) or ".", exist_ok=True)
with open(sys.argv[1], "w") as f:
    json.dump(summary, f, indent=2)
    f.write("\n")
rows = [
    ("agent CPU, steady state (% of one core)", f"{cpu:.2f}", "< $CPU_TARGET_PCT", targets["cpu_pct_of_one_core"]["verdict"]),
    ("agent CPU, idle before pushes (% of one core)", f"{$CPU_IDLE_PCT:.2f}", "", ""),
    ("agent RSS peak (MB)", f"{peak_mb:.1f}", "< $RSS_TARGET_MB", targets["rss_mb"]["verdict"]),
    ("agent RSS end of push / VmHWM (MB)", f"{rss_mb:.1f} / {hwm_mb:.1f}", "", ""),
    ("agent RSS after wrk / VmHWM (MB, no target)", f"{$RSS_AFTER_WRK_KB / 1024:.1f} / {$HWM_END_KB / 1024:.1f}", "", ""),
    ("GET /scores/latest p99 (ms)", f"{latest['p99_ms']:.2f}", "< $P99_TARGET_MS", targets["scores_latest_p99_ms"]["verdict"]),
    ("  p50 / req/s / non-2xx", f"{latest['p50_ms']:.2f} / {float(latest['rps']):.0f} / {latest['non_2xx']}", "", ""),
    ("GET /scores/latest, Accept-Encoding: gzip, p99 (ms)", f"{latest_gzip['p99_ms']:.2f}", "< $P99_TARGET_MS", targets["scores_latest_gzip_p99_ms"]["verdict"]),
    ("  p50 / req/s / non-2xx", f"{latest_gzip['p50_ms']:.2f} / {float(latest_gzip['rps']):.0f} / {latest_gzip['non_2xx']}", "", ""),
    ("GET /scores?signal=kv_fragmentation... p99 (ms)", f"{series['p99_ms']:.2f}", "< $P99_TARGET_MS", targets["scores_series_p99_ms"]["verdict"]),
    ("  p50 / req/s / non-2xx", f"{series['p50_ms']:.2f} / {float(series['rps']):.0f} / {series['non_2xx']}", "", ""),
    ("1 connection: /scores/latest p50 / p99 (ms)", f"{latest1['p50_ms']:.2f} / {latest1['p99_ms']:.2f}", "", ""),
    ("1 connection: /scores?... p50 / p99 (ms)", f"{series1['p50_ms']:.2f} / {series1['p99_ms']:.2f}", "", ""),
    ("/scores/latest response size, identity / gzip (kB)", f"{latest['response_bytes'] / 1000:.1f} / {latest_gzip['response_bytes'] / 1000:.1f}", "", ""),
]
print()
print(f"build: {summary['build']}")
print(f"omen agent cost: {summary['load']['gpus']} GPUs x {summary['load']['layers']} layers x {summary['load']['blocks']} blocks + {summary['load']['canaries']} canaries at 1 Hz; {model}, {os.cpu_count()} cores")
w = max(len(r[0]) for r in rows)
print(f"{'measure':<{w}}  {'value':>14}  {'target':>7}  verdict")
for r in rows:
    print(f"{r[0]:<{w}}  {r[1]:>14}  {r[2]:>7}  {r[3]}")
print()
print("ratios to references measured in this run (same machine, same HTTP stack, same load):")
w2 = max(len(r["what"]) for r in ratios.values())
for r in ratios.values():
    print(f"{r['what']:<{w2}}  {r['value']:>10}  {r['target']:>6}  {r['verdict']}")
print(f"server CPU use during wrk (% of one core, {server_cpu_capacity_pct:.0f} available): agent {latest['server_cpu_pct']} / {latest_gzip['server_cpu_pct']} / {series['server_cpu_pct']}, "
      f"reference {ref['latest']['server_cpu_pct']} / {ref['latest_gzip']['server_cpu_pct']} / {ref['series']['server_cpu_pct']} (latest / gzip / series)")
if client_bound:
    print("warning: the client (wrk) bounds these references, so their req/s is a floor and the agent's throughput ratio an upper bound: " + "; ".join(client_bound))
print(f"static reference: /scores/latest {float(ref['latest']['rps']):.0f} req/s p99 {ref['latest']['p99_ms']:.2f} ms; gzip {float(ref['latest_gzip']['rps']):.0f} req/s p99 {ref['latest_gzip']['p99_ms']:.2f} ms; /scores?... {float(ref['series']['rps']):.0f} req/s p99 {ref['series']['p99_ms']:.2f} ms")
print(f"parser alone: {parse['parse_us_per_sample']:.3f} us/sample, {parse['parse_us_per_kv_map']:.3f} us/KV map (JSON scan {parse['json_scan_us_per_sample']:.3f} us/sample); "
      f"{samples:.0f} samples in {steady_s:.0f} s, {series_live} live series; {ticks:.0f} ticks in the window, mean {summary['per_sample']['tick_mean_ms']} ms")
print(f"load average (1/5/15 min) at start {summary['machine']['loadavg_start']}, at end {summary['machine']['loadavg_end']}: other work on the machine inflates the wrk latencies")
print(f"\nJSON: {sys.argv[1]}")
EOF

if (( PUSH_RC != 0 )); then
    log "warning: push_load exited $PUSH_RC: some pushes failed (see its report above); the figures were taken under that load"
fi
