# Transparency: whatever bytes go in one side of the tap come out of the other, unchanged and in order, in
# both directions at once — random garbage, AMQP headers followed by garbage, 1-byte to 1 MiB writes — and
# the tap stays up. A Python TCP server stands in for the broker.

import hashlib
import queue
import random
import threading

from tapharness import (AMQP_091_HEADER, MIB, Peer, TapTestCase, main, random_chunks, read_records, recv_exact_hash,
                        send_chunks)

HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"
BAD_END_FRAME = b"\x01\x00\x00\x00\x00\x00\x04\x00\x0a\x00\x0b\x00"  # method frame, 0x00 where 0xCE belongs


class Plan:
    def __init__(self, rng, c2s_len, s2c_len, c2s_prefix=b"", s2c_prefix=b"", max_chunk=MIB, min_chunk=1):
        self.c2s = c2s_prefix + rng.randbytes(c2s_len - len(c2s_prefix))
        self.s2c = s2c_prefix + rng.randbytes(s2c_len - len(s2c_prefix))
        self.c2s_sizes = random_chunks(rng, len(self.c2s), min_chunk, max_chunk)
        self.s2c_sizes = random_chunks(rng, len(self.s2c), min_chunk, max_chunk)


class TransparencyTest(TapTestCase):
    def setUp(self):
        super().setUp()
        self.plans = queue.Queue()
        self.peer_results = []  # (sha256 received c2s, bytes, sha256 sent s2c)
        self.lock = threading.Lock()
        self.peer = Peer(self._peer_handler)
        self.addCleanup(self.peer.close)
        self.tap = self.start_tap(upstream_port=self.peer.port)

    def _peer_handler(self, conn, _idx):
        plan = self.plans.get(timeout=10)
        conn.settimeout(60)
        sent = {}
        t = threading.Thread(target=lambda: sent.setdefault("h", send_chunks(conn, plan.s2c, plan.s2c_sizes)))
        t.start()
        got_hash, got = recv_exact_hash(conn, len(plan.c2s))
        t.join(60)
        with self.lock:
            self.peer_results.append((got_hash, got, sent.get("h")))

    def _client(self, plan, out):
        conn = self.tap.connect(timeout=60)
        try:
            sent = {}
            t = threading.Thread(target=lambda: sent.setdefault("h", send_chunks(conn, plan.c2s, plan.c2s_sizes)))
            t.start()
            got_hash, got = recv_exact_hash(conn, len(plan.s2c))
            t.join(60)
            out.append((got_hash, got, sent.get("h")))
        finally:
            conn.close()

    def run_round(self, plans):
        """Runs every plan on its own connection at once; compares SHA-256 of each direction as multisets."""
        self.peer_results.clear()
        for p in plans:
            self.plans.put(p)
        client_results = []
        threads = [threading.Thread(target=self._client, args=(p, client_results)) for p in plans]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.peer.join(60)
        self.assertEqual(self.peer.errors, [])
        self.assertEqual(len(client_results), len(plans), "a client did not finish")
        self.assertEqual(len(self.peer_results), len(plans), "the peer did not get every connection")
        want_c2s = sorted(hashlib.sha256(p.c2s).hexdigest() for p in plans)
        want_s2c = sorted(hashlib.sha256(p.s2c).hexdigest() for p in plans)
        self.assertEqual(sorted(r[2] for r in client_results), want_c2s, "client did not send everything")
        self.assertEqual(sorted(r[2] for r in self.peer_results), want_s2c, "peer did not send everything")
        self.assertEqual(sorted(r[1] for r in self.peer_results), sorted(len(p.c2s) for p in plans),
                         "client->broker byte count differs")
        self.assertEqual(sorted(r[1] for r in client_results), sorted(len(p.s2c) for p in plans),
                         "broker->client byte count differs")
        self.assertEqual(sorted(r[0] for r in self.peer_results), want_c2s, "client->broker bytes changed")
        self.assertEqual(sorted(r[0] for r in client_results), want_s2c, "broker->client bytes changed")
        self.assertTrue(self.tap.alive(), "tap died")

    def test_random_garbage_both_directions(self):
        rng = random.Random(1)
        for _ in range(3):
            self.run_round([Plan(rng, 6 * MIB + rng.randint(0, 4096), 6 * MIB + rng.randint(0, 4096))])

    def test_amqp_header_then_garbage(self):
        rng = random.Random(2)
        self.run_round([Plan(rng, 4 * MIB, 4 * MIB, c2s_prefix=AMQP_091_HEADER)])
        self.run_round([Plan(rng, 2 * MIB, 2 * MIB, c2s_prefix=AMQP_091_HEADER + HEARTBEAT_FRAME + BAD_END_FRAME,
                             s2c_prefix=HEARTBEAT_FRAME)])
        self.run_round([Plan(rng, 2 * MIB, 2 * MIB, c2s_prefix=b"AMQP\x00\x01\x00\x00")])  # AMQP 1.0 header

    def test_tiny_writes(self):
        rng = random.Random(3)
        self.run_round([Plan(rng, 96 * 1024, 96 * 1024, c2s_prefix=AMQP_091_HEADER, max_chunk=16)])

    def test_parallel_connections(self):
        rng = random.Random(4)
        self.run_round([Plan(rng, 3 * MIB, 3 * MIB, c2s_prefix=AMQP_091_HEADER if i % 2 else b"") for i in range(8)])

    def test_outputs_stay_json_lines(self):
        rng = random.Random(5)
        self.run_round([Plan(rng, MIB, MIB, c2s_prefix=AMQP_091_HEADER + BAD_END_FRAME)])
        self.assertEqual(self.tap.stop(), 0)
        read_records(self.tap.verdicts)  # raises on a malformed line
        read_records(self.tap.frames)


if __name__ == "__main__":
    main()
