"""Settings from the environment, read once when vLLM loads the plugin."""

from __future__ import annotations

import dataclasses
import os
from urllib.parse import urlsplit

DEFAULT_INTERVAL_S = 1.0
DEFAULT_TIMEOUT_S = 2.0
DEFAULT_QUEUE = 8


class SettingsError(ValueError):
    """An environment variable has a value the plugin cannot use; the message names it and the fix."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the plugin needs: where omen listens and how often to push."""

    url: str
    """Base URL of the omen agent's API (OMEN_VLLM_URL), e.g. http://127.0.0.1:9464."""
    token: str | None
    """Bearer token for pushes (OMEN_VLLM_TOKEN, or the first line of OMEN_VLLM_TOKEN_FILE)."""
    interval_s: float
    """Seconds between snapshots (OMEN_VLLM_INTERVAL_S, default 1)."""
    timeout_s: float
    """Timeout of one push (OMEN_VLLM_TIMEOUT_S, default 2)."""
    queue: int
    """Snapshots held while omen is slow (OMEN_VLLM_QUEUE, default 8); more are dropped and counted."""
    gpu: str | None
    """Value of the ``gpu`` label (OMEN_VLLM_GPU); unset leaves the label out."""
    stats_file: str | None
    """Where to write the plugin's own counters as JSON after each push (OMEN_VLLM_STATS_FILE)."""

    @property
    def ingest_url(self) -> str:
        """The agent's KV-cache ingest endpoint."""
        return self.url.rstrip("/") + "/v1/ingest/kvcache"


def _number(env: dict[str, str], key: str, default: float, low: float, high: float) -> float:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{key}={raw!r} is not a number; write seconds, e.g. {key}={default:g}") from None
    if not low <= value <= high:
        raise SettingsError(f"{key}={raw!r} is outside {low:g}..{high:g}")
    return value


def from_env(env: dict[str, str] | None = None) -> Settings | None:
    """The settings, or None when OMEN_VLLM_URL is unset (the plugin then stays idle)."""
    env = dict(os.environ if env is None else env)
    url = env.get("OMEN_VLLM_URL", "").strip()
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SettingsError(
            f"OMEN_VLLM_URL={url!r} is not an http(s) URL; write the agent's API address, e.g. http://127.0.0.1:9464"
        )
    token = env.get("OMEN_VLLM_TOKEN") or None
    token_file = env.get("OMEN_VLLM_TOKEN_FILE")
    if token is None and token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.readline().strip() or None
        except OSError as e:
            raise SettingsError(f"OMEN_VLLM_TOKEN_FILE={token_file!r} cannot be read ({e.strerror})") from None
        if token is None:
            raise SettingsError(f"OMEN_VLLM_TOKEN_FILE={token_file!r} is empty; put the agent's ingest token in it")
    return Settings(
        url=url,
        token=token,
        interval_s=_number(env, "OMEN_VLLM_INTERVAL_S", DEFAULT_INTERVAL_S, 0.05, 3600.0),
        timeout_s=_number(env, "OMEN_VLLM_TIMEOUT_S", DEFAULT_TIMEOUT_S, 0.05, 60.0),
        queue=int(_number(env, "OMEN_VLLM_QUEUE", DEFAULT_QUEUE, 1, 1024)),
        gpu=env.get("OMEN_VLLM_GPU") or None,
        stats_file=env.get("OMEN_VLLM_STATS_FILE") or None,
    )
