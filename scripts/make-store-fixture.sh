#!/usr/bin/env bash
# Writes crates/omen-store/tests/data/store-schemaN.db.gz: a store as a released omen writes
# it, for the test that every later omen still opens it (and migrates it once the schema
# changes). Run with the released binary and its schema version:
#   OMEN_BIN=path/to/released/omen SCHEMA=2 bash scripts/make-store-fixture.sh
# store-schema1 holds the KV usage series only; from store-schema2 on, the store also holds
# a KV fragmentation series under the name that release pushed (kvf_ratio in schema 2).
set -euo pipefail
SCHEMA="${SCHEMA:-1}"
# The KV fragmentation signal's name in that release (none in schema 1's fixture).
case "$SCHEMA" in 1) KVF="" ;; 2) KVF=kvf_ratio ;; *) KVF=kv_fragmentation ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OMEN="${OMEN_BIN:-$ROOT/target/debug/omen}"
WORK="$(mktemp -d)"
trap 'kill "${PID:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
PORT=18031
cat >"$WORK/omen.yaml" <<YAML
store: {path: $WORK/omen.db}
http: {listen: 127.0.0.1:$PORT, metrics_listen: null}
YAML
"$OMEN" run --config "$WORK/omen.yaml" >"$WORK/log" 2>&1 &
PID=$!
for _ in $(seq 1 100); do curl -fsS -o /dev/null "http://127.0.0.1:$PORT/readyz" && break; sleep 0.1; done
# Two days of one KV layer at one sample every 5 minutes (2026-11-01..02), value = share of the day.
python3 - "$PORT" "$KVF" <<'PY'
import json, sys, urllib.request
port = sys.argv[1]
t0 = 1_793_491_200_000
for day in range(2):
    samples = [{"signal": "kvcache_usage_ratio", "labels": {"gpu": "0", "layer": "3"}, "value": (m % 1440) / 1440,
                "ts_ms": t0 + (day * 1440 + m) * 60_000} for m in range(0, 1440, 5)]
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/ingest/samples", json.dumps({"samples": samples}).encode(),
                                 {"content-type": "application/json"})
    urllib.request.urlopen(req).read()
kvf = sys.argv[2]
if kvf:
    samples = [{"signal": kvf, "labels": {"gpu": "0", "layer": "3"}, "value": 1.0 + m / 1440, "ts_ms": t0 + m * 60_000}
               for m in range(0, 1440, 5)]
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/ingest/samples", json.dumps({"samples": samples}).encode(),
                                 {"content-type": "application/json"})
    urllib.request.urlopen(req).read()
PY
kill -TERM "$PID"; wait "$PID" || true
python3 - "$WORK/omen.db" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1]); c.execute("PRAGMA wal_checkpoint(TRUNCATE)"); c.execute("PRAGMA journal_mode=DELETE"); c.execute("VACUUM"); c.close()
PY
OUT="$ROOT/crates/omen-store/tests/data/store-schema$SCHEMA.db.gz"
gzip -9 -n -c "$WORK/omen.db" >"$OUT"
ls -la "$OUT"
