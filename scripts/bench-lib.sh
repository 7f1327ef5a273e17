# Shared by the agent benchmarks (sourced, not run): process bookkeeping, ports, and the
# /proc samplers. The caller sets NAME (the prefix of its log lines) before sourcing.

die() { echo "$NAME: $*" >&2; exit 1; }
log() { echo "$NAME: $*" >&2; }

# Every process the benchmark starts goes in PIDS; all are stopped on exit (TERM, then
# KILL after 5 s), and the scratch folder TMP is removed.
TMP=$(mktemp -d "${TMPDIR:-/tmp}/omen-$NAME.XXXXXX")
PIDS=()
bench_cleanup() {
    local rc=$?
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$TMP"
    exit "$rc"
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

cpu_ticks() { # utime + stime of $1, clock ticks (fields after the parenthesised comm)
    local stat
    stat=$(<"/proc/$1/stat") || return 1
    stat=${stat##*) }
    # shellcheck disable=SC2086
    set -- $stat
    echo $(( ${12} + ${13} ))
}

cpu_ns() { # CPU time of $1's live threads, ns (/proc/PID/task/*/schedstat: exact, where
    # /proc/PID/stat counts clock ticks of 10 ms; a thread that exited takes its time with it,
    # so callers compare with cpu_ticks)
    local total=0 f t
    for f in /proc/"$1"/task/*/schedstat; do
        read -r t _ <"$f" 2>/dev/null || continue
        total=$(( total + t ))
    done
    echo "$total"
}

status_kb() { # VmRSS / VmHWM ($2) of $1 in kB
    awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"
}

now_s() { date +%s.%N; }

# start_agent OMEN STORE_PATH: starts `omen run` on a free loopback port with its store at
# STORE_PATH and NVML off; sets AGENT (pid), URL and AGENT_LOG, adds it to PIDS, and
# returns once /readyz answers 200 (dies after 60 s or if the agent exits).
start_agent() {
    local omen=$1 store=$2 port
    port=$(free_port)
    URL=http://127.0.0.1:$port
    AGENT_LOG=$TMP/omen-$port.log
    cat >"$TMP/omen-$port.yaml" <<EOF
store:
  path: $store
http:
  listen: 127.0.0.1:$port
sources:
  nvml:
    enabled: false
EOF
    RUST_LOG=${RUST_LOG:-warn} "$omen" run --config "$TMP/omen-$port.yaml" >"$AGENT_LOG" 2>&1 &
    AGENT=$!
    PIDS+=("$AGENT")
    for _ in $(seq 1200); do
        kill -0 "$AGENT" 2>/dev/null || { cat "$AGENT_LOG" >&2; die "the agent exited at start-up"; }
        curl -fsS -o /dev/null "$URL/readyz" 2>/dev/null && return 0
        sleep 0.05
    done
    cat "$AGENT_LOG" >&2
    die "/readyz not 200 after 60 s"
}

# stop_agent: SIGTERM to AGENT and wait for it (it exits within 5 s by contract).
stop_agent() {
    kill -TERM "$AGENT" 2>/dev/null || true
    wait "$AGENT" 2>/dev/null || true
}
