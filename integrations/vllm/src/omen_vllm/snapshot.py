"""Reads the scheduler's KV block pool into a plain snapshot (engine thread), and turns a
snapshot into omen's /v1/ingest/kvcache payload (push thread).

The engine-side part only copies numbers: which blocks each KV-cache group holds, the free
count, and per group the free blocks that still hold a cached prefix. Packing the bitmap,
base64 and JSON happen later on the push thread.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import time


@dataclasses.dataclass
class GroupSnapshot:
    """One KV-cache group at one scheduler step."""

    group: int
    attention: str
    used_positions: list[int]
    """Bitmap positions of the blocks the group's requests hold (the null block excluded)."""
    cached_blocks: int
    """Free blocks whose cached prefix belongs to this group."""


@dataclasses.dataclass
class Snapshot:
    """The pool at one scheduler step."""

    ts_ms: int
    num_blocks: int
    """Blocks in the pool, the null block excluded (what vLLM's own usage divides by)."""
    free_blocks: int
    groups: list[GroupSnapshot]
    requests_running: int
    requests_waiting: int


def attention_name(spec: object) -> str:
    """``FullAttentionSpec`` -> ``full_attention``: the label for a group's attention type."""
    name = type(spec).__name__
    name = name[: -len("Spec")] if name.endswith("Spec") else name
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def take(scheduler: object) -> Snapshot:
    """Snapshots ``scheduler``'s KV cache manager. Cost grows with the blocks in the pool
    (one pass for the cached-prefix count) and the blocks held by requests."""
    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    null_id = pool.null_block.block_id
    kv_groups = scheduler.kv_cache_config.kv_cache_groups
    type_managers = manager.coordinator.single_type_managers
    groups = []
    for g, type_manager in enumerate(type_managers):
        held = set()
        for blocks in type_manager.req_to_blocks.values():
            for block in blocks:
                held.add(block.block_id)
        held.discard(null_id)
        positions = [b if b < null_id else b - 1 for b in held]
        spec = kv_groups[g].kv_cache_spec if g < len(kv_groups) else None
        groups.append(GroupSnapshot(g, attention_name(spec) if spec is not None else "unknown", positions, 0))
    if groups:
        # Free blocks that keep a prefix hash; the hash's last 4 bytes name its group.
        for block in pool.blocks:
            if block.ref_cnt == 0 and not block.is_null:
                key = block.block_hash
                if key is not None:
                    g = int.from_bytes(key[-4:], "big") if len(groups) > 1 else 0
                    if g < len(groups):
                        groups[g].cached_blocks += 1
    counts = getattr(scheduler, "get_request_counts", None)
    running, waiting = counts() if counts else (len(scheduler.running), len(scheduler.waiting))
    return Snapshot(
        ts_ms=int(time.time() * 1000),
        num_blocks=pool.num_gpu_blocks - 1,
        free_blocks=pool.get_num_free_blocks(),
        groups=groups,
        requests_running=int(running),
        requests_waiting=int(waiting),
    )


def bitmap_b64(positions: list[int], num_blocks: int) -> str:
    """Base64 of the occupancy bitmap omen reads: bit i % 8 of byte i / 8 set = block i in use."""
    bits = bytearray((num_blocks + 7) // 8)
    for p in positions:
        if 0 <= p < num_blocks:
            bits[p >> 3] |= 1 << (p & 7)
    return base64.b64encode(bytes(bits)).decode("ascii")


def payload(snap: Snapshot, labels: dict[str, str], gpu: str | None) -> dict:
    """The /v1/ingest/kvcache body for ``snap``. With one group the pool's free count is sent
    too (omen checks it against the bitmap); groups that share a pool each get their own map."""
    body: dict = {
        "ts_ms": snap.ts_ms,
        "labels": labels,
        "groups": [
            {
                "group": g.group,
                "attention": g.attention,
                "num_blocks": snap.num_blocks,
                "bitmap_b64": bitmap_b64(g.used_positions, snap.num_blocks),
                "cached_blocks": g.cached_blocks,
                **({"free_blocks": snap.free_blocks} if len(snap.groups) == 1 else {}),
            }
            for g in snap.groups
        ],
        "requests_running": snap.requests_running,
        "requests_waiting": snap.requests_waiting,
    }
    if gpu is not None:
        body["gpu"] = gpu
    return body
