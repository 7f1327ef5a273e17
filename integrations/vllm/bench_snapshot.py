"""Cost of one snapshot against the pool size, on vLLM's real BlockPool and KVCacheBlock
(half the pool held by 64 requests; the scheduler around them is a namespace with the
attributes snapshot.take reads). Run with vLLM's Python: .venv-vllm/bin/python integrations/vllm/bench_snapshot.py
"""
import os, sys, time, types
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))
from vllm.v1.core.block_pool import BlockPool
from omen_vllm import snapshot
for n in (1000, 10000, 100000):
    pool = BlockPool(n, True, 16)
    blocks = pool.get_new_blocks(n // 2)  # half the pool held by "requests"
    mgr = types.SimpleNamespace(req_to_blocks={f"r{i}": blocks[i::64] for i in range(64)})
    spec = types.SimpleNamespace()
    sched = types.SimpleNamespace(
        kv_cache_manager=types.SimpleNamespace(block_pool=pool, coordinator=types.SimpleNamespace(single_type_managers=(mgr,))),
        kv_cache_config=types.SimpleNamespace(kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=spec)]),
        running=[], waiting=[])
    snapshot.take(sched)
    t = time.perf_counter(); k = 20
    for _ in range(k): s = snapshot.take(sched)
    dt = (time.perf_counter() - t) / k
    assert len(s.groups[0].used_positions) == n // 2
    print(f"{n} blocks (half held): {dt*1e3:.2f} ms per snapshot, {dt/n*1e9:.0f} ns per block")
