# Backpressure: when one side stops reading while the other writes 200 MB through the tap, the tap stops
# reading from the writer instead of buffering (VmRSS sampled, must stay under 64 MB), and once the reader
# resumes every byte arrives intact (SHA-256). Both directions.

import hashlib
import struct
import threading
import time

from tapharness import MIB, Peer, TapTestCase, is_asan_build, main, rss_kb

TOTAL = 200 * MIB
CHUNK = 256 * 1024
LIMIT_KB = 64 * 1024


def stream_chunks():
    """TOTAL bytes in CHUNK pieces, each stamped with its index so reordering or loss changes the hash."""
    base = bytes(range(256)) * (CHUNK // 256)
    for i in range(TOTAL // CHUNK):
        yield struct.pack(">Q", i) + base[8:]


class Writer(threading.Thread):
    def __init__(self, sock):
        super().__init__(daemon=True)
        self.sock = sock
        self.sent = 0
        self.hash = hashlib.sha256()
        self.error = None

    def run(self):
        try:
            for c in stream_chunks():
                self.sock.sendall(c)
                self.hash.update(c)
                self.sent += len(c)
        except OSError as e:
            self.error = e


def read_all(sock, n):
    h = hashlib.sha256()
    got = 0
    while got < n:
        data = sock.recv(min(MIB, n - got))
        if not data:
            break
        h.update(data)
        got += len(data)
    return h.hexdigest(), got


class Sampler(threading.Thread):
    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = rss_kb(pid)
        self.stop_ev = threading.Event()

    def run(self):
        while not self.stop_ev.is_set():
            try:
                self.peak = max(self.peak, rss_kb(self.pid))
            except (OSError, RuntimeError):
                return
            time.sleep(0.01)


class BackpressureTest(TapTestCase):
    def setUp(self):
        super().setUp()
        self.resume = threading.Event()
        self.peer_result = {}
        self.asan = is_asan_build()

    def wait_stalled(self, writer):
        """Waits until the writer has made no progress for 0.5 s (at most 15 s); returns bytes sent by then."""
        last, since = -1, time.monotonic()
        end = time.monotonic() + 15
        while time.monotonic() < end and writer.is_alive():
            if writer.sent != last:
                last, since = writer.sent, time.monotonic()
            elif time.monotonic() - since > 0.5:
                break
            time.sleep(0.02)
        return writer.sent

    def check(self, name, tap, baseline_kb, sampler, stalled_at, writer, result):
        sampler.stop_ev.set()
        sampler.join()
        limit = LIMIT_KB
        print(f"{name}: baseline RSS {baseline_kb} kB, peak RSS {sampler.peak} kB (limit {limit} kB), "
              f"writer stalled after {stalled_at / MIB:.1f} MiB of {TOTAL // MIB} MiB"
              + (" [ASan build]" if self.asan else ""))
        self.assertIsNone(writer.error)
        self.assertLess(stalled_at, TOTAL, "the writer never stalled: the tap buffered everything")
        self.assertEqual(result, (writer.hash.hexdigest(), TOTAL), "data lost or changed after resuming")
        self.assertLess(sampler.peak, limit, f"tap RSS peaked at {sampler.peak} kB")
        self.assertTrue(tap.alive())

    def test_broker_stops_reading(self):
        def handler(conn, _idx):
            conn.settimeout(120)
            self.resume.wait(60)
            self.peer_result["r"] = read_all(conn, TOTAL)

        peer = Peer(handler)
        self.addCleanup(peer.close)
        tap = self.start_tap(upstream_port=peer.port, env={"ASAN_OPTIONS": "quarantine_size_mb=16:detect_leaks=1"})
        baseline = rss_kb(tap.pid)
        sampler = Sampler(tap.pid)
        sampler.start()
        c = tap.connect(timeout=30)
        writer = Writer(c)
        writer.start()
        stalled_at = self.wait_stalled(writer)
        self.resume.set()
        writer.join(120)
        peer.join(120)
        c.close()
        self.check("client->broker", tap, baseline, sampler, stalled_at, writer, self.peer_result.get("r"))

    def test_client_stops_reading(self):
        writers = []

        def handler(conn, _idx):
            conn.settimeout(120)
            # Read the client's "go" first: closing a socket with unread input sends RST, which would
            # discard what is still in flight towards the client.
            self.assertEqual(conn.recv(2), b"go")
            w = Writer(conn)
            writers.append(w)
            w.run()

        peer = Peer(handler)
        self.addCleanup(peer.close)
        tap = self.start_tap(upstream_port=peer.port, env={"ASAN_OPTIONS": "quarantine_size_mb=16:detect_leaks=1"})
        baseline = rss_kb(tap.pid)
        sampler = Sampler(tap.pid)
        sampler.start()
        c = tap.connect(timeout=30)
        c.sendall(b"go")
        for _ in range(500):
            if writers:
                break
            time.sleep(0.01)
        self.assertTrue(writers, "the peer got no connection")
        stalled_at = self.wait_stalled(writers[0])
        try:
            result = read_all(c, TOTAL)
        except OSError as e:
            self.fail(f"reading from the tap failed ({e}); peer writer sent {writers[0].sent} bytes, "
                      f"error {writers[0].error!r}")
        peer.join(120)
        c.close()
        self.check("broker->client", tap, baseline, sampler, stalled_at, writers[0], result)


if __name__ == "__main__":
    main()
