"""The vLLM general plugin: wraps ``Scheduler.schedule`` so that, at most once per
interval, the step's KV block pool is snapshotted and handed to the push thread.

vLLM calls ``register`` in every process it starts; only a process that runs a scheduler
ever takes a snapshot. With OMEN_VLLM_URL unset the plugin changes nothing.
"""

from __future__ import annotations

import functools
import logging
import threading

from . import config, snapshot
from .pusher import Pusher, now_ns

log = logging.getLogger("vllm.omen_vllm")

_lock = threading.Lock()
_registered = False


def register() -> None:
    """Entry point of ``vllm.general_plugins``; safe to call more than once."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
    try:
        settings = config.from_env()
    except config.SettingsError as e:
        log.error("omen-vllm: %s; the plugin stays off", e)
        return
    if settings is None:
        log.info("omen-vllm: OMEN_VLLM_URL is unset; the plugin stays off")
        return
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
    except ImportError as e:
        log.error("omen-vllm: this vLLM has no v1 Scheduler (%s); the plugin stays off", e)
        return
    _wrap(Scheduler, settings)


def _labels(scheduler: object, settings: config.Settings) -> dict[str, str]:
    """``server``, ``model`` (vLLM's model_name) and ``engine`` (the data-parallel rank)."""
    vllm_config = getattr(scheduler, "vllm_config", None)
    model_config = getattr(vllm_config, "model_config", None)
    served = getattr(model_config, "served_model_name", None) or getattr(model_config, "model", "unknown")
    if isinstance(served, (list, tuple)):
        served = served[0] if served else "unknown"
    rank = getattr(getattr(vllm_config, "parallel_config", None), "data_parallel_rank", 0)
    return {"server": "vllm", "model": str(served)[:128], "engine": str(rank)}


def _wrap(scheduler_class: type, settings: config.Settings) -> None:
    original = scheduler_class.schedule
    interval_ns = int(settings.interval_s * 1e9)
    state = {"pusher": None, "next_ns": 0, "broken": False}

    @functools.wraps(original)
    def schedule(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        if state["broken"]:
            return output
        start = now_ns()
        pusher = state["pusher"]
        try:
            if start >= state["next_ns"]:
                state["next_ns"] = start + interval_ns
                if pusher is None:
                    pusher = state["pusher"] = Pusher(settings, _labels(self, settings))
                    log.info("omen-vllm: pushing the KV block pool to %s every %gs", settings.ingest_url, settings.interval_s)
                snap = snapshot.take(self)
                pusher.stats.snapshots += 1
                pusher.stats.snapshot_ns += now_ns() - start
                pusher.offer(snap)
        except Exception as e:  # noqa: BLE001 - nothing may escape into vLLM's step
            state["broken"] = True
            log.error("omen-vllm: reading the KV cache manager failed (%s: %s); the plugin stops for this process", type(e).__name__, e)
        if pusher is not None:
            pusher.stats.steps += 1
            pusher.stats.hook_ns += now_ns() - start
        return output

    scheduler_class.schedule = schedule
