#!/usr/bin/env bash
# Coverage-guided fuzzing of omen's input parsers with AFL++ (afl.rs / cargo-afl, stable Rust).
#
#   scripts/fuzz.sh smoke          # make test: replay the corpora, then FUZZ_SMOKE_SECONDS (10) per target
#   scripts/fuzz.sh run [TARGET..] # make fuzz: FUZZ_SECONDS (600) per target, new inputs kept in fuzz/corpus
#
# A target fails on any crash (a panic or an abort, including an allocation past AFL's
# memory limit of FUZZ_MEM_MB, 1024) or hang (AFL's timeout of FUZZ_TIMEOUT_MS, 1000 ms):
# the offending inputs stay in fuzz/out/<target>/default/{crashes,hangs} and the script
# exits 1 naming them. cargo-afl 0.18.2 is installed from crates.io when missing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FUZZ="$ROOT/fuzz"
MODE="${1:-smoke}"; shift || true
TARGETS=("$@")
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=(ingest prom_text slots sse config_yaml trace_jsonl nsys_sqlite scores_query)
SECONDS_PER_TARGET="${FUZZ_SECONDS:-600}"
[[ "$MODE" == smoke ]] && SECONDS_PER_TARGET="${FUZZ_SMOKE_SECONDS:-10}"
log() { printf 'fuzz: %s\n' "$*" >&2; }

if ! cargo afl --version >/dev/null 2>&1; then
    log "installing cargo-afl 0.18.2 from crates.io"
    cargo install cargo-afl --version 0.18.2 --locked >/dev/null
fi
# Builds AFL++ for this rustc once; "already built" is fine.
cargo afl config --build >/dev/null 2>&1 || true

cd "$FUZZ"
log "building the targets with AFL instrumentation"
cargo afl build --release --quiet
log "replaying the committed corpora"
./target/release/replay "$FUZZ/corpus"

# Keeps what a run found: the queue entries that added coverage (AFL names them +cov), up to
# 4 KB each and 50 per target, so that the committed corpus stays small.
keep_new_coverage() {
    local t="$1" kept=0 f
    for f in "$FUZZ/out/$t/default/queue/"*+cov*; do
        [[ -f "$f" && $(stat -c %s "$f") -le 4096 ]] || continue
        (( kept < 50 )) || break
        cp "$f" "$FUZZ/corpus/$t/$(basename "$f" | tr ':,' '__')"
        kept=$((kept + 1))
    done
    log "$t: kept $kept new inputs in fuzz/corpus/$t"
}

export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_QUIET=1
failed=()
for t in "${TARGETS[@]}"; do
    out="$FUZZ/out/$t"
    rm -rf "$out"
    mkdir -p "$FUZZ/out"
    log "$t: ${SECONDS_PER_TARGET}s"
    cargo afl fuzz -V "$SECONDS_PER_TARGET" -m "${FUZZ_MEM_MB:-1024}" -t "${FUZZ_TIMEOUT_MS:-1000}" \
        -i "$FUZZ/corpus/$t" -o "$out" "$FUZZ/target/release/$t" >"$out.log" 2>&1 || {
        log "$t: afl-fuzz failed to run; see $out.log"; tail -n 20 "$out.log" >&2; failed+=("$t"); continue; }
    stats="$out/default/fuzzer_stats"
    execs=$(awk -F': *' '$1 ~ /execs_done/ {print $2}' "$stats")
    paths=$(awk -F': *' '$1 ~ /corpus_count/ {print $2}' "$stats")
    crashes=$(find "$out/default/crashes" -type f ! -name README.txt | wc -l)
    hangs=$(find "$out/default/hangs" -type f | wc -l)
    log "$t: $execs executions, $paths inputs in the queue, $crashes crashes, $hangs hangs"
    if (( crashes + hangs > 0 )); then
        failed+=("$t")
        find "$out/default/crashes" "$out/default/hangs" -type f ! -name README.txt | head -n 5 >&2
    elif [[ "$MODE" == run ]]; then
        keep_new_coverage "$t"
    fi
done
if (( ${#failed[@]} > 0 )); then
    log "crashes or hangs in: ${failed[*]} (inputs under fuzz/out/<target>/default)"
    exit 1
fi
log "no crash or hang in ${#TARGETS[@]} target(s)"
