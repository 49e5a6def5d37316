# Transparency: whatever bytes go in one side of the tap come out of the other, unchanged and in order, in
# both directions at once — random garbage, AMQP headers followed by garbage, 1-byte to 1 MiB writes — and
# the tap stays up. A Python TCP server stands in for the broker.

import hashlib
import queue
import random
import socket
import struct
import threading
import time

from tapharness import (AMQP_091_HEADER, MIB, Peer, TapTestCase, fd_count, main, random_chunks, read_records,
                        recv_exact_hash, send_chunks, wait_for)

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



class CloseTest(TapTestCase):
    def test_half_close_keeps_other_direction(self):
        """The client's FIN reaches the broker side; the broker's reply still reaches the client after it."""
        got = {}

        def handler(conn, _idx):
            conn.settimeout(10)
            data = b""
            while True:
                d = conn.recv(65536)
                if not d:
                    break
                data += d
            got["peer"] = data
            conn.sendall(b"reply after your EOF" * 1000)

        peer = Peer(handler)
        self.addCleanup(peer.close)
        tap = self.start_tap(upstream_port=peer.port)
        c = tap.connect()
        c.settimeout(10)
        c.sendall(AMQP_091_HEADER + b"request")
        c.shutdown(socket.SHUT_WR)
        reply = b""
        while True:
            d = c.recv(65536)
            if not d:
                break
            reply += d
        c.close()
        peer.join(10)
        self.assertEqual(got.get("peer"), AMQP_091_HEADER + b"request")
        self.assertEqual(reply, b"reply after your EOF" * 1000)

    def test_resets_and_abrupt_closes_leave_no_fds(self):
        def handler(conn, idx):
            conn.settimeout(10)
            conn.recv(65536)
            if idx % 2:  # the broker side resets as well
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

        peer = Peer(handler)
        self.addCleanup(peer.close)
        tap = self.start_tap(upstream_port=peer.port)
        baseline = fd_count(tap.pid)
        for i in range(40):
            c = tap.connect()
            c.sendall(AMQP_091_HEADER + bytes(range(256)) * (i + 1))
            if i % 3 == 0:
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            elif i % 3 == 1:
                time.sleep(0.01)
            c.close()
        peer.join(10)
        self.assertTrue(wait_for(lambda: fd_count(tap.pid) <= baseline, 10.0),
                        f"fd count {fd_count(tap.pid)} did not return to baseline {baseline}")
        self.assertTrue(tap.alive())

    def test_broker_closes_while_client_still_sending(self):
        """The broker side reads once and closes while the client is still sending (9 KB, 512 KB or 5 MB), so
        the tap's writes to it fail while it reads the EOF; the client closes 10 ms later. Every session must
        end: the tap's fd count returns to baseline."""
        def handler(conn, _idx):
            conn.settimeout(10)
            conn.recv(65536)

        peer = Peer(handler)
        self.addCleanup(peer.close)
        tap = self.start_tap(upstream_port=peer.port)
        baseline = fd_count(tap.pid)
        sizes = [35, 2000, 20000]  # times 256 bytes
        for i in range(90):
            c = tap.connect()
            try:
                c.sendall(AMQP_091_HEADER + bytes(range(256)) * sizes[i % 3])
            except OSError:  # the tap passed the broker's close on while we were still sending
                pass
            time.sleep(0.01)
            c.close()
        peer.join(10)
        self.assertTrue(wait_for(lambda: fd_count(tap.pid) <= baseline, 12.0),
                        f"{(fd_count(tap.pid) - baseline) // 2} of 90 sessions still hold their sockets 12 s after "
                        "both peers closed")
        self.assertTrue(tap.alive())

if __name__ == "__main__":
    main()
