"""The push thread: sends snapshots to omen with a bounded queue and timeouts.

Nothing here may block or raise into vLLM: ``offer`` never waits (a full queue drops the
snapshot and counts it), every error of a push is caught, counted and logged once per
spell of failures.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import urllib.error
import urllib.request

from . import snapshot as snap_mod
from .config import Settings

log = logging.getLogger("vllm.omen_vllm")


class Stats:
    """The plugin's own counters (written to OMEN_VLLM_STATS_FILE when set)."""

    def __init__(self) -> None:
        self.steps = 0
        self.hook_ns = 0
        self.snapshots = 0
        self.snapshot_ns = 0
        self.pushed = 0
        self.dropped_queue_full = 0
        self.failed = 0
        self.last_error: str | None = None

    def as_dict(self) -> dict:
        return {
            "steps": self.steps,
            "hook_us_per_step": self.hook_ns / self.steps / 1000 if self.steps else 0.0,
            "snapshots": self.snapshots,
            "snapshot_us": self.snapshot_ns / self.snapshots / 1000 if self.snapshots else 0.0,
            "pushed": self.pushed,
            "dropped_queue_full": self.dropped_queue_full,
            "failed": self.failed,
            "last_error": self.last_error,
        }


class Pusher:
    """Owns the queue and the daemon thread that empties it."""

    def __init__(self, settings: Settings, labels: dict[str, str]) -> None:
        self.settings = settings
        self.labels = labels
        self.stats = Stats()
        self._queue: queue.Queue = queue.Queue(maxsize=settings.queue)
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="omen-vllm-push", daemon=True)
        self._thread.start()

    def offer(self, snap: snap_mod.Snapshot) -> None:
        """Queues ``snap`` without waiting; drops it when the queue is full."""
        try:
            self._queue.put_nowait(snap)
        except queue.Full:
            self.stats.dropped_queue_full += 1

    def _run(self) -> None:
        while True:
            snap = self._queue.get()
            try:
                self._push(snap)
            except Exception as e:  # noqa: BLE001 - a push must never end the thread
                self._failed(f"{type(e).__name__}: {e}")
            self._write_stats()

    def _push(self, snap: snap_mod.Snapshot) -> None:
        body = json.dumps(snap_mod.payload(snap, self.labels, self.settings.gpu)).encode()
        request = urllib.request.Request(self.settings.ingest_url, data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        if self.settings.token:
            request.add_header("Authorization", f"Bearer {self.settings.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as e:
            reason = e.read(2048).decode("utf-8", "replace").strip()
            self._failed(f"omen answered HTTP {e.code} at {self.settings.ingest_url}: {reason}")
            return
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            self._failed(f"cannot reach omen at {self.settings.ingest_url} ({reason}); is the agent running?")
            return
        self.stats.pushed += 1
        if self._failing:
            self._failing = False
            log.warning("omen-vllm: pushes to %s work again", self.settings.ingest_url)

    def _failed(self, message: str) -> None:
        self.stats.failed += 1
        self.stats.last_error = message
        if not self._failing:
            self._failing = True
            log.warning("omen-vllm: %s; snapshots are dropped and counted until it answers", message)

    def _write_stats(self) -> None:
        path = self.settings.stats_file
        if not path:
            return
        try:
            tmp = f"{path}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.stats.as_dict(), f)
            os.replace(tmp, path)
        except OSError as e:
            log.debug("omen-vllm: cannot write %s: %s", path, e)


def now_ns() -> int:
    """Monotonic clock for the hook's own cost."""
    return time.perf_counter_ns()
