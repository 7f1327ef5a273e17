#!/usr/bin/env bash
# How the agent holds up over time (issue: "scales to 30 days of history"):
#
#   bash scripts/bench-scale.sh soak      # 10x the bench push load; RSS and CPU every 10 s
#   bash scripts/bench-scale.sh history   # an agent on a store holding weeks of history
#
# soak: `omen run` on a new store under omen-push-load at SOAK_RATE rounds a second
# (default 10: ten times bench-agent.sh's 8 GPUs x 80 layers + 4 canaries at 1 Hz) for
# SOAK_SECONDS (default 3600; `make bench` runs 300). RSS and CPU are sampled every 10 s
# into a CSV. Targets: RSS at the end within 10% of RSS at the end of the warm-up
# (SOAK_WARMUP, default a tenth of the run, at least 60 s), no failed push, no error in
# the agent's log.
#
# history: HISTORY_STORE (a store written by `omen fill-history`, default
# target/history-30d.db, filled first if missing: HISTORY_DAYS, default 30, of HISTORY_GPUS
# (8) x HISTORY_LAYERS (80), takes about 4 minutes a day on a 2-core machine) is copied, then measured: its size on disk, the
# agent's start-up time on it (to /readyz, 3 starts), and GET /scores for 14 days of one
# layer (step 1h, a random GPU and layer of the fill per request so that the answer cache
# does not answer) while omen-push-load pushes at 1 Hz, twice: 200 clients that each ask
# about once a second (wrk's delay(): a dashboard's or a script's pace; the p99 target
# applies here), then 200 connections asking back to back (the agent's capacity: how many
# such queries a second it answers on this machine, and the tail at saturation, reported
# without a target). Targets: store <= 2 GB, start-up <= 2 s, paced p99 < 10 ms; the fill
# report's tick times (<= 50 ms) are repeated beside them.
#
# Environment: BENCH_NO_BUILD=1 (use target/release as it is), CARGO_TARGET_DIR, SCALE_OUT
# (JSON summary, default target/bench-scale-<mode>.json). Everything runs on loopback;
# every process it starts is stopped on exit. Exits 1 when it cannot run or a target is not met.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
NAME=bench-scale
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

MODE=${1:-}
[[ $MODE == soak || $MODE == history ]] || die "usage: bash scripts/bench-scale.sh soak|history"
command -v wrk >/dev/null || die "wrk not found: apt-get install -y wrk (listed in scripts/apt-packages.txt)"
command -v curl >/dev/null || die "curl not found"
CLK_TCK=$(getconf CLK_TCK)
TARGET_DIR=${CARGO_TARGET_DIR:-target}
case $TARGET_DIR in /*) ;; *) TARGET_DIR=$ROOT/$TARGET_DIR ;; esac
OUT=${SCALE_OUT:-$ROOT/target/bench-scale-$MODE.json}

if [[ ${BENCH_NO_BUILD:-0} != 1 ]]; then
    log "building (release): omen + omen-push-load"
    CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -p omen-cli --bin omen >&2
    CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -p omen-bench --bin omen-push-load >&2
fi
OMEN=$TARGET_DIR/release/omen
PUSH=$TARGET_DIR/release/omen-push-load
[[ -x $OMEN && -x $PUSH ]] || die "missing $OMEN or $PUSH (build failed?)"

# ---------------------------------------------------------------- soak
soak() {
    local seconds=${SOAK_SECONDS:-3600} rate=${SOAK_RATE:-10}
    local warmup=${SOAK_WARMUP:-$(( seconds / 10 > 60 ? seconds / 10 : 60 ))}
    [[ $seconds =~ ^[0-9]+$ && $warmup =~ ^[0-9]+$ ]] || die "SOAK_SECONDS and SOAK_WARMUP are whole seconds"
    (( seconds >= warmup + 60 )) || die "SOAK_SECONDS ($seconds) must exceed SOAK_WARMUP ($warmup) by at least 60 s"
    start_agent "$OMEN" "$TMP/store/omen.db"
    log "soak: ${seconds} s at ${rate} rounds/s (8 GPUs x 80 layers + 4 canaries each), warm-up ${warmup} s, agent on $URL"
    "$PUSH" --url "$URL" --rate "$rate" --seconds "$seconds" >"$TMP/push.log" 2>&1 &
    local pusher=$!
    PIDS+=("$pusher")
    local csv=$TMP/soak.csv t0 c0 t c r
    echo "elapsed_s,rss_kb,cpu_pct" >"$csv"
    t0=$(now_s); c0=$(cpu_ticks "$AGENT")
    local prev_t=$t0 prev_c=$c0 next=10
    while kill -0 "$pusher" 2>/dev/null; do
        sleep 1
        t=$(now_s)
        if python3 -c "import sys; sys.exit(0 if $t - $t0 >= $next else 1)"; then
            kill -0 "$AGENT" 2>/dev/null || { cat "$AGENT_LOG" >&2; die "the agent died during the soak"; }
            c=$(cpu_ticks "$AGENT"); r=$(status_kb "$AGENT" VmRSS)
            python3 -c "print(f'{$t - $t0:.0f},$r,{100.0 * ($c - $prev_c) / $CLK_TCK / ($t - $prev_t):.2f}')" >>"$csv"
            prev_t=$t; prev_c=$c; next=$(( next + 10 ))
            if (( next % 300 == 10 )); then log "soak: $(tail -1 "$csv") (elapsed s, RSS kB, CPU %)"; fi
        fi
    done
    local push_rc=0
    wait "$pusher" || push_rc=$?
    cat "$TMP/push.log" >&2
    local errors
    errors=$(grep -c 'ERROR' "$AGENT_LOG" || true)
    cp "$csv" "${OUT%.json}.csv"
    python3 - "$OUT" "$csv" "$TMP/push.log" <<EOF
import csv, json, re, sys
rows = [(float(r["elapsed_s"]), int(r["rss_kb"]), float(r["cpu_pct"])) for r in csv.DictReader(open(sys.argv[2]))]
push = open(sys.argv[3]).read()
failed = sum(int(n) for n in re.findall(r"(\d+) failed", push))
warm = [r for r in rows if $warmup <= r[0] < $warmup + 60]
end = rows[-6:]
mean = lambda xs: sum(xs) / len(xs)
rss_warm = mean([r[1] for r in warm]) / 1024
rss_end = mean([r[1] for r in end]) / 1024
growth = 100.0 * (rss_end - rss_warm) / rss_warm
cpu = mean([r[2] for r in rows if r[0] >= $warmup])
ok = growth < 10.0 and failed == 0 and $errors == 0 and $push_rc == 0
summary = {"mode": "soak", "seconds": $seconds, "rate_rounds_per_s": $rate, "warmup_s": $warmup,
           "rss_mb_after_warmup": round(rss_warm, 1), "rss_mb_end": round(rss_end, 1), "rss_growth_pct": round(growth, 1),
           "rss_mb_max": round(max(r[1] for r in rows) / 1024, 1), "cpu_pct_of_one_core_mean": round(cpu, 2),
           "push_failed": failed, "push_load_exit": $push_rc, "agent_log_errors": $errors,
           "samples_csv": "${OUT%.json}.csv", "verdict": "MET" if ok else "NOT MET"}
json.dump(summary, open(sys.argv[1], "w"), indent=2)
print(f"\nsoak: {$seconds} s at {$rate} rounds/s: RSS {rss_warm:.1f} MB after the {$warmup} s warm-up, {rss_end:.1f} MB at the end ({growth:+.1f}%, target < 10%), "
      f"max {summary['rss_mb_max']} MB; CPU {cpu:.2f}% of one core; {failed} failed pushes, {$errors} errors in the agent log: {summary['verdict']}")
print(f"JSON: {sys.argv[1]}, samples: {summary['samples_csv']}")
sys.exit(0 if ok else 1)
EOF
}

# ---------------------------------------------------------------- history
history() {
    local store=${HISTORY_STORE:-$ROOT/target/history-30d.db}
    local report=${store%.db}.json
    if [[ ! -f $store ]]; then
        local days=${HISTORY_DAYS:-30}
        log "no $store: filling ${days} days of history first (omen fill-history; progress once a simulated day)"
        RUST_LOG=info "$OMEN" fill-history --days "$days" --gpus "${HISTORY_GPUS:-8}" --layers "${HISTORY_LAYERS:-80}" --store "$store" -o "$report" >&2
    fi
    # A fill stopped before its end leaves no report: the store is measured, tick times are not.
    [[ -f $report ]] || { log "no $report (fill stopped early?): tick times are not reported"; report=none; }
    log "copying $store (the agent writes to its copy)"
    mkdir -p "$TMP/store"
    cp "$store" "$TMP/store/omen.db"
    for suffix in -wal -shm; do [[ -f $store$suffix ]] && cp "$store$suffix" "$TMP/store/omen.db$suffix"; done
    local bytes
    bytes=$(python3 -c "import os; print(sum(os.path.getsize('$TMP/store/omen.db' + s) for s in ('', '-wal', '-shm') if os.path.exists('$TMP/store/omen.db' + s)))")

    local starts=()
    for i in 1 2 3; do
        local t0 t1
        t0=$(now_s)
        start_agent "$OMEN" "$TMP/store/omen.db"
        t1=$(now_s)
        starts+=("$(python3 -c "print(round($t1 - $t0, 3))")")
        log "start $i: /readyz after ${starts[-1]} s"
        (( i < 3 )) && stop_agent
    done

    log "push load at 1 Hz while wrk asks for 14 days of one layer"
    "$PUSH" --url "$URL" --seconds 60 >"$TMP/push.log" 2>&1 &
    local pusher=$!
    PIDS+=("$pusher")
    sleep 5
    # The GPUs and layers the fill wrote (a query outside them would answer nothing).
    local gpus=8 layers=80
    if [[ $report != none ]]; then
        read -r gpus layers < <(python3 -c "import json,sys; f=json.load(open(sys.argv[1])); print(f['gpus'], f['layers'])" "$report")
    fi
    cat >"$TMP/random-layer.lua" <<EOF
math.randomseed(os.time())
request = function()
  local path = string.format("/scores?signal=kv_fragmentation&gpu=%d&layer=%d&since=now-14d&step=1h", math.random(0, $((gpus - 1))), math.random(0, $((layers - 1))))
  return wrk.format("GET", path)
end
EOF
    # Paced: each connection waits 0.5-1.5 s (mean 1 s) before its next request.
    { cat "$TMP/random-layer.lua"; echo 'delay = function() return math.random(500, 1500) end'; } >"$TMP/paced.lua"
    local probe
    probe=$(curl -fsS "$URL/scores?signal=kv_fragmentation&gpu=0&layer=3&since=now-14d&step=1h") || die "the 14-day query is not 200"
    local points
    points=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(len(d['series'][0]['points']), d['resolution'])" "$probe")
    log "14-day query answers $points"
    log "200 clients, about one query a second each, 30 s"
    wrk -t2 -c200 -d30s --timeout 5s --latency -s "$TMP/paced.lua" "$URL" >"$TMP/wrk-paced.txt" 2>&1 || { cat "$TMP/wrk-paced.txt" >&2; die "wrk failed"; }
    cat "$TMP/wrk-paced.txt" >&2
    log "200 connections back to back, 15 s (capacity)"
    wrk -t2 -c200 -d15s --timeout 5s --latency -s "$TMP/random-layer.lua" "$URL" >"$TMP/wrk.txt" 2>&1 || { cat "$TMP/wrk.txt" >&2; die "wrk failed"; }
    cat "$TMP/wrk.txt" >&2
    kill "$pusher" 2>/dev/null || true
    python3 - "$OUT" "$report" "$TMP/wrk-paced.txt" "$TMP/wrk.txt" "${starts[*]}" "$bytes" "$points" <<'EOF'
import json, re, sys
out, report, paced_txt, wrk_txt, starts, size, points = sys.argv[1:8]
fill = json.load(open(report)) if report != "none" else None
def wrk_figures(path):
    text = open(path).read()
    def ms(label):
        m = re.search(rf"^\s+{label}\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
        v, u = float(m.group(1)), m.group(2)
        return v / 1000 if u == "us" else v * 1000 if u == "s" else v
    return {"p50_ms": ms("50%"), "p99_ms": ms("99%"),
            "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)),
            "non_2xx": int((re.search(r"Non-2xx or 3xx responses: (\d+)", text) or [0, 0])[1]),
            "connections": 200}
paced, closed = wrk_figures(paced_txt), wrk_figures(wrk_txt)
starts = [float(s) for s in starts.split()]
size_gb = int(size) / 1e9
targets = {"store_size_gb": (round(size_gb, 3), "<= 2", size_gb <= 2.0)}
if fill:
    tick = fill["tick_all"]
    targets["tick_p99_ms"] = (tick["p99_ms"], "<= 50", tick["p99_ms"] <= 50)
    targets["tick_max_ms"] = (tick["max_ms"], "(<= 50 at p99)", True)
targets["startup_s_max_of_3"] = (max(starts), "<= 2", max(starts) <= 2.0)
targets["scores_14d_p99_ms"] = (paced["p99_ms"], "< 10", paced["p99_ms"] < 10 and paced["non_2xx"] == 0)
query = "/scores?signal=kv_fragmentation&gpu=<random>&layer=<random>&since=now-14d&step=1h"
summary = {"mode": "history", "fill": fill, "startup_s": starts,
           "scores_14d": dict(paced, answer=points, query=query, pace="each client about 1 query/s"),
           "scores_14d_saturated": dict(closed, answer=points, query=query, pace="back to back"),
           "targets": {k: {"value": v, "target": t, "verdict": "MET" if ok else "NOT MET"} for k, (v, t, ok) in targets.items()}}
json.dump(summary, open(out, "w"), indent=2)
if fill:
    print(f"\nhistory: {fill['days']} days of {fill['gpus']} GPUs x {fill['layers']} layers every {fill['period_s']:.0f} s, {fill['series']} series, filled in {fill['fill_seconds']:.0f} s")
else:
    print("\nhistory: a store without its fill report (tick times not reported)")
for k, (v, t, ok) in targets.items():
    print(f"  {k:<22} {v:>10}  target {t:<16} {'MET' if ok else 'NOT MET'}")
if fill:
    print(f"  upkeep step (compaction between batches): p50 {fill['upkeep_step']['p50_ms']:.1f} ms, p99 {fill['upkeep_step']['p99_ms']:.1f} ms, max {fill['upkeep_step']['max_ms']:.1f} ms")
print(f"  14-day query, 200 clients at ~1/s: p50 {paced['p50_ms']:.2f} ms, p99 {paced['p99_ms']:.2f} ms, {paced['rps']:.0f} req/s, answer {points}")
print(f"  14-day query, 200 connections back to back: p50 {closed['p50_ms']:.2f} ms, p99 {closed['p99_ms']:.2f} ms, {closed['rps']:.0f} req/s")
print(f"JSON: {out}")
sys.exit(0 if all(ok for _, _, ok in targets.values()) else 1)
EOF
}

"$MODE"
