#!/usr/bin/env python3
"""Loopback webhook receiver for scripts/test-e2e.sh (Python standard library only).

    e2e-webhook.py --port PORT --out FILE.jsonl [--port-file FILE]

Listens on 127.0.0.1:PORT (0 = any free port; the bound port is written to
--port-file) and appends one JSON line per POST:

    {"path": "/wechat-warning", "received_at": 1793491200.123, "payload": {...}}

where payload is the Alertmanager webhook body as sent (or {"_raw": "..."} if
it is not JSON). Every POST is answered 200 so Alertmanager does not retry.
GET /healthz answers 200 (readiness probe for the test). Runs until killed.
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 8 * 1024 * 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--port-file")
    args = ap.parse_args()

    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, code: int, body: bytes = b"ok\n") -> None:
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server naming)
            self._reply(200 if self.path == "/healthz" else 404)

        def do_POST(self) -> None:  # noqa: N802
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                n = -1
            if n < 0 or n > MAX_BODY:
                self._reply(413, b"bad length\n")
                return
            raw = self.rfile.read(n)
            try:
                payload = json.loads(raw)
            except ValueError:
                payload = {"_raw": raw.decode("utf-8", "replace")}
            rec = {"path": self.path, "received_at": time.time(), "payload": payload}
            line = json.dumps(rec, sort_keys=True) + "\n"
            with lock:
                with open(args.out, "a", encoding="utf-8") as f:
                    f.write(line)
                    f.flush()
                    os.fsync(f.fileno())
            self._reply(200)

        def log_message(self, fmt: str, *a) -> None:
            sys.stderr.write("e2e-webhook: %s %s\n" % (self.address_string(), fmt % a))

    srv = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    srv.daemon_threads = True
    port = srv.server_address[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, args.port_file)
    sys.stderr.write(f"e2e-webhook: listening on 127.0.0.1:{port}, writing {args.out}\n")
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
