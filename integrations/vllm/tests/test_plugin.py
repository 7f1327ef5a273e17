"""Unit tests of the plugin's parts that do not need vLLM (settings, bitmap, payload, the
push thread against a real local HTTP server). Reading a real vLLM scheduler is tested by
crates/omen-cli/tests/vllm_server.rs. Run: python3 -m unittest discover integrations/vllm/tests
"""

import base64
import http.server
import json
import os
import socket
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from omen_vllm import config, snapshot  # noqa: E402
from omen_vllm.pusher import Pusher  # noqa: E402


class SettingsTest(unittest.TestCase):
    def test_unset_url_leaves_the_plugin_off(self):
        self.assertIsNone(config.from_env({}))

    def test_defaults_and_endpoint(self):
        s = config.from_env({"OMEN_VLLM_URL": "http://127.0.0.1:9464/"})
        self.assertEqual(s.ingest_url, "http://127.0.0.1:9464/v1/ingest/kvcache")
        self.assertEqual((s.interval_s, s.timeout_s, s.queue, s.token), (1.0, 2.0, 8, None))

    def test_errors_name_the_variable_and_the_fix(self):
        for env, want in [
            ({"OMEN_VLLM_URL": "127.0.0.1:9464"}, "OMEN_VLLM_URL"),
            ({"OMEN_VLLM_URL": "http://x", "OMEN_VLLM_INTERVAL_S": "fast"}, "OMEN_VLLM_INTERVAL_S='fast' is not a number"),
            ({"OMEN_VLLM_URL": "http://x", "OMEN_VLLM_INTERVAL_S": "0"}, "outside"),
            ({"OMEN_VLLM_URL": "http://x", "OMEN_VLLM_TOKEN_FILE": "/nonexistent/token"}, "OMEN_VLLM_TOKEN_FILE"),
        ]:
            with self.assertRaises(config.SettingsError) as e:
                config.from_env(env)
            self.assertIn(want, str(e.exception))

    def test_token_from_a_file(self):
        with tempfile.NamedTemporaryFile("w", delete=False) as f:
            f.write("s3cret\n")
        try:
            s = config.from_env({"OMEN_VLLM_URL": "http://x", "OMEN_VLLM_TOKEN_FILE": f.name})
            self.assertEqual(s.token, "s3cret")
        finally:
            os.unlink(f.name)


class PayloadTest(unittest.TestCase):
    def test_bitmap_bit_order_is_omens(self):
        # positions 0, 1 and 8 of 16: bytes 0b00000011, 0b00000001
        self.assertEqual(base64.b64decode(snapshot.bitmap_b64([0, 1, 8], 16)), bytes([3, 1]))
        self.assertEqual(len(base64.b64decode(snapshot.bitmap_b64([], 181))), 23)
        # positions outside the pool are not written
        self.assertEqual(base64.b64decode(snapshot.bitmap_b64([99], 8)), bytes([0]))

    def test_attention_names(self):
        class FullAttentionSpec:
            pass

        class SlidingWindowSpec:
            pass

        self.assertEqual(snapshot.attention_name(FullAttentionSpec()), "full_attention")
        self.assertEqual(snapshot.attention_name(SlidingWindowSpec()), "sliding_window")

    def test_one_group_sends_the_free_count_and_shared_pools_do_not(self):
        one = snapshot.Snapshot(1, 16, 13, [snapshot.GroupSnapshot(0, "full_attention", [0, 1, 8], 4)], 2, 1)
        body = snapshot.payload(one, {"server": "vllm"}, "0")
        self.assertEqual(body["groups"][0]["free_blocks"], 13)
        self.assertEqual(body["gpu"], "0")
        self.assertEqual((body["requests_running"], body["requests_waiting"]), (2, 1))
        two = snapshot.Snapshot(
            1, 16, 10, [snapshot.GroupSnapshot(0, "full_attention", [0], 0), snapshot.GroupSnapshot(1, "sliding_window", [1], 0)], 0, 0
        )
        body = snapshot.payload(two, {}, None)
        self.assertTrue(all("free_blocks" not in g for g in body["groups"]))
        self.assertNotIn("gpu", body)


class _Receiver(http.server.BaseHTTPRequestHandler):
    bodies: list = []
    status = 200

    def do_POST(self):
        n = int(self.headers.get("content-length", 0))
        _Receiver.bodies.append((self.headers.get("authorization"), json.loads(self.rfile.read(n))))
        self.send_response(_Receiver.status)
        self.end_headers()
        self.wfile.write(b'{"field": "groups[0].free_blocks", "reason": "test"}')

    def log_message(self, *args):
        pass


def _settings(url, **kw):
    env = {"OMEN_VLLM_URL": url, **kw}
    return config.from_env(env)


def _snap():
    return snapshot.Snapshot(int(time.time() * 1000), 8, 7, [snapshot.GroupSnapshot(0, "full_attention", [3], 0)], 1, 0)


def _wait(predicate, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class PusherTest(unittest.TestCase):
    def setUp(self):
        _Receiver.bodies = []
        _Receiver.status = 200
        self.server = http.server.HTTPServer(("127.0.0.1", 0), _Receiver)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def tearDown(self):
        self.server.shutdown()
        self.server.server_close()

    def test_pushes_carry_the_token_and_the_payload(self):
        p = Pusher(_settings(self.url, OMEN_VLLM_TOKEN="t0k"), {"server": "vllm"})
        p.offer(_snap())
        self.assertTrue(_wait(lambda: p.stats.pushed == 1))
        auth, body = _Receiver.bodies[0]
        self.assertEqual(auth, "Bearer t0k")
        self.assertEqual(body["groups"][0]["num_blocks"], 8)
        self.assertEqual(body["labels"], {"server": "vllm"})

    def test_a_rejection_is_counted_with_omens_reason(self):
        _Receiver.status = 422
        p = Pusher(_settings(self.url), {})
        p.offer(_snap())
        self.assertTrue(_wait(lambda: p.stats.failed == 1))
        self.assertIn("HTTP 422", p.stats.last_error)
        self.assertIn("groups[0].free_blocks", p.stats.last_error)

    def test_omen_down_is_counted_and_nothing_raises(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        stats_file = os.path.join(tempfile.mkdtemp(), "stats.json")
        p = Pusher(_settings(f"http://127.0.0.1:{port}", OMEN_VLLM_TIMEOUT_S="0.5", OMEN_VLLM_STATS_FILE=stats_file), {})
        for _ in range(3):
            p.offer(_snap())
        self.assertTrue(_wait(lambda: p.stats.failed == 3))
        self.assertIn("cannot reach omen", p.stats.last_error)
        self.assertTrue(_wait(lambda: os.path.exists(stats_file)))
        def written_failures():
            with open(stats_file, encoding="utf-8") as f:
                return json.load(f)["failed"]

        self.assertTrue(_wait(lambda: written_failures() == 3))

    def test_a_full_queue_drops_instead_of_waiting(self):
        p = Pusher(_settings(self.url, OMEN_VLLM_QUEUE="1"), {})
        start = time.perf_counter()
        for _ in range(200):
            p.offer(_snap())
        self.assertLess(time.perf_counter() - start, 1.0, "offer never blocks")
        self.assertTrue(_wait(lambda: p.stats.pushed + p.stats.dropped_queue_full == 200))
        self.assertGreater(p.stats.dropped_queue_full, 0)


if __name__ == "__main__":
    unittest.main()
