#!/usr/bin/env bash
# How the agent's cost grows: scripts/bench-agent.sh at 1x, 4x and 16x the series count
# (GPUs x layers) on a new store, and at 1, 7 and 30 days of stored history at 1x, then a
# table, a JSON summary and a plot (target/bench-grow/).
#
#   bash scripts/bench-grow.sh           # also part of `make bench`
#
# 1x is GROW_LAYERS (default 40) layers of one GPU; 4x and 16x add GPUs of the same shape,
# so 16x is 640 layers (the node of bench-agent.sh's default load). The history stores are
# written once by `omen fill-history` at 1x (about 10 s per simulated day on a 2-core
# machine) and kept as target/bench-grow/history-<d>d.db, written again when older than a
# day (a fill ends when it ran: an older one would leave a gap before the pushes) or with
# GROW_REFILL=1.
# Each point is one shortened bench-agent.sh run (GROW_BACKFILL 120 s of pushes first,
# GROW_SECONDS 60 s of 1 Hz pushes, wrk GROW_WRK_SECONDS 9 s per query and side, in 3 rounds) with health.interval
# 5s, so that the 50 s steady window holds about 10 ticks to time (the agent's default is 1m;
# a tick's work does not depend on how often it runs).
#
# Targets (scripts/bench-grow-report.py checks them): CPU per pushed sample within 1.5x from
# 1x to 16x; tick time and /scores/latest p99 (a query of every series) growing no faster
# than the series count; the one-series /scores query's p99 within 2x across series counts
# and history lengths; tick time within 2x and CPU per sample within 1.5x from 1 to 30 days.
# Exits non-zero only when the benchmark cannot run.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
NAME=bench-grow
die() { echo "$NAME: $*" >&2; exit 1; }
log() { echo "$NAME: $*" >&2; }

LAYERS=${GROW_LAYERS:-40}
OUT_DIR=${GROW_OUT:-$ROOT/target/bench-grow}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
case $TARGET_DIR in /*) ;; *) TARGET_DIR=$ROOT/$TARGET_DIR ;; esac
[[ $LAYERS =~ ^[0-9]+$ ]] && (( LAYERS >= 1 && LAYERS <= 1024 )) || die "GROW_LAYERS=$LAYERS must be a whole number in 1..1024"
mkdir -p "$OUT_DIR"

if [[ ${BENCH_NO_BUILD:-0} != 1 ]]; then
    log "building (release): omen + omen-push-load + omen-static-serve"
    CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -p omen-cli --bin omen >&2
    CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -p omen-bench --bin omen-push-load --bin omen-static-serve >&2
fi
OMEN=$TARGET_DIR/release/omen
[[ -x $OMEN ]] || die "missing $OMEN (build failed?)"

point() { # NAME GPUS [STORE]
    local name=$1 gpus=$2 store=${3:-}
    log "point $name: $gpus GPU(s) x $LAYERS layers${store:+, store $store}"
    BENCH_NO_BUILD=1 BENCH_GPUS=$gpus BENCH_LAYERS=$LAYERS BENCH_STORE=$store BENCH_HEALTH_INTERVAL=5s \
        BENCH_BACKFILL=${GROW_BACKFILL:-120} BENCH_SECONDS=${GROW_SECONDS:-60} BENCH_WARMUP=10 \
        BENCH_WRK_SECONDS=${GROW_WRK_SECONDS:-9} BENCH_WRK1_SECONDS=3 BENCH_OUT="$OUT_DIR/$name.json" \
        bash scripts/bench-agent.sh >"$OUT_DIR/$name.txt" 2>"$OUT_DIR/$name.log" \
        || { tail -30 "$OUT_DIR/$name.log" >&2; die "bench-agent.sh failed at point $name (log: $OUT_DIR/$name.log)"; }
}

for scale in 1 4 16; do
    point "series-${scale}x" "$scale"
done
for days in 1 7 30; do
    store=$OUT_DIR/history-${days}d.db
    if [[ ! -f $store || ${GROW_REFILL:-0} == 1 || -n $(find "$store" -mmin +1440) ]]; then
        rm -f "$store" "$store-wal" "$store-shm"
        log "filling $days day(s) of history at 1x into $store (omen fill-history; progress once a simulated day)"
        RUST_LOG=info "$OMEN" fill-history --days "$days" --gpus 1 --layers "$LAYERS" --store "$store" \
            -o "$OUT_DIR/history-${days}d.fill.json" >&2 || die "omen fill-history failed for $days days"
    fi
    point "history-${days}d" 1 "$store"
done

# The plot needs matplotlib (PyPI), kept in its own environment.
PY=python3
if [[ ${GROW_NO_PLOT:-0} != 1 ]]; then
    VENV=$ROOT/.venv-bench
    if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
        log "installing matplotlib into $VENV (scripts/requirements-bench.txt)"
        python3 -m venv "$VENV" && "$VENV/bin/pip" install -q -r scripts/requirements-bench.txt >&2 \
            || log "warning: could not install matplotlib; the table is written without the plot"
    fi
    "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null && PY=$VENV/bin/python
fi
"$PY" scripts/bench-grow-report.py "$OUT_DIR"
