# Backpressure: when one side stops reading while the other writes 200 MB through the tap, the tap stops
# reading from the writer instead of buffering (VmRSS sampled, must stay under 64 MB), and once the reader
# resumes every byte arrives intact (SHA-256). Both directions. And when the stalled broker then resets, the
# publishes the client had already delivered to the tap's socket, unread behind the backpressure, are still
# observed: each gets its record. The same backpressure holds with TLS on both legs (64 MB each way).

import collections
import fcntl
import hashlib
import os
import re
import signal
import socket
import ssl
import struct
import termios
import threading
import time

from scenario_lib import RawClient, frame_lines, publish_records, traced_publishes
from tapharness import (MIB, Peer, TapTestCase, is_asan_build, main, recv_exact_hash, require_broker, rss_kb,
                        wait_for)
from tlslib import PkiCase

TOTAL = 200 * MIB
CHUNK = 256 * 1024
LIMIT_KB = 64 * 1024


def stream_chunks(total=TOTAL):
    """total bytes in CHUNK pieces, each stamped with its index so reordering or loss changes the hash."""
    base = bytes(range(256)) * (CHUNK // 256)
    for i in range(total // CHUNK):
        yield struct.pack(">Q", i) + base[8:]


class Writer(threading.Thread):
    def __init__(self, sock, total=TOTAL):
        super().__init__(daemon=True)
        self.sock = sock
        self.total = total
        self.sent = 0
        self.hash = hashlib.sha256()
        self.error = None

    def run(self):
        try:
            for c in stream_chunks(self.total):
                self.sock.sendall(c)
                self.hash.update(c)
                self.sent += len(c)
        except OSError as e:
            self.error = e


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

    def write_until_stalled_then_resume(self, name, tap, peer, c, total):
        """The client writes total bytes into a broker that stops reading, until the tap stalls it; then the broker
        reads again. Checks memory stayed bounded and every byte arrived (check)."""
        baseline = rss_kb(tap.pid)
        sampler = Sampler(tap.pid)
        sampler.start()
        writer = Writer(c, total)
        writer.start()
        stalled_at = self.wait_stalled(writer)
        self.resume.set()
        writer.join(120)
        peer.join(120)
        c.close()
        self.check(name, tap, baseline, sampler, stalled_at, writer, self.peer_result.get("r"))

    def check(self, name, tap, baseline_kb, sampler, stalled_at, writer, result):
        sampler.stop_ev.set()
        sampler.join()
        limit = LIMIT_KB
        print(f"{name}: baseline RSS {baseline_kb} kB, peak RSS {sampler.peak} kB (limit {limit} kB), "
              f"writer stalled after {stalled_at / MIB:.1f} MiB of {writer.total // MIB} MiB"
              + (" [ASan build]" if self.asan else ""))
        self.assertIsNone(writer.error)
        self.assertLess(stalled_at, writer.total, "the writer never stalled: the tap buffered everything")
        self.assertEqual(result, (writer.hash.hexdigest(), writer.total), "data lost or changed after resuming")
        self.assertLess(sampler.peak, limit, f"tap RSS peaked at {sampler.peak} kB")
        self.assertTrue(tap.alive())

    def test_broker_stops_reading(self):
        def handler(conn, _idx):
            conn.settimeout(120)
            self.resume.wait(60)
            self.peer_result["r"] = recv_exact_hash(conn, TOTAL)

        peer = Peer(handler)
        self.addCleanup(peer.close)
        tap = self.start_tap(upstream_port=peer.port, env={"ASAN_OPTIONS": "quarantine_size_mb=16:detect_leaks=1"})
        self.write_until_stalled_then_resume("client->broker", tap, peer, tap.connect(timeout=30), TOTAL)

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
            result = recv_exact_hash(c, TOTAL)
        except OSError as e:
            self.fail(f"reading from the tap failed ({e}); peer writer sent {writers[0].sent} bytes, "
                      f"error {writers[0].error!r}")
        peer.join(120)
        c.close()
        self.check("broker->client", tap, baseline, sampler, stalled_at, writers[0], result)



TLS_TOTAL = 64 * MIB


class BrokerPauseTest(TapTestCase):
    def test_broker_pausing_longer_than_the_setup_timeout(self):
        """A broker that reads for a while, then reads nothing for longer than --handshake-timeout (a resource
        alarm), then reads again: the session is live all along, so the timeout does not end it (it used to: the
        upstream's connect timeout came back as a write timeout, and the client was reset as "unreachable")."""
        total = 64 * MIB
        result = {}

        def handler(conn, _idx):
            conn.settimeout(120)
            h = hashlib.sha256()
            got = 0
            end = time.monotonic() + 0.5
            while time.monotonic() < end:  # reads slowly, so the tap queues bytes for it
                data = conn.recv(64 * 1024)
                h.update(data)
                got += len(data)
                time.sleep(0.01)
            time.sleep(2.5)  # the pause: longer than the 1 s setup timeout
            while got < total:
                data = conn.recv(MIB)
                if not data:
                    break
                h.update(data)
                got += len(data)
            result["r"] = (h.hexdigest(), got)

        peer = Peer(handler)
        self.addCleanup(peer.close)
        tap = self.start_tap(["--handshake-timeout", "1000"], upstream_port=peer.port)
        c = tap.connect(timeout=30)
        writer = Writer(c, total)
        writer.start()
        writer.join(120)
        peer.join(120)
        c.close()
        self.assertIsNone(writer.error, "the client's connection failed")
        self.assertEqual(result.get("r"), (writer.hash.hexdigest(), total), "data lost after the pause")
        self.assertNotIn("unreachable", tap.stderr())


class TlsBackpressureTest(PkiCase, BackpressureTest):
    """TLS on both legs: client (Python ssl) -> tap -> a TLS peer standing in for the broker."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        cls.server_ctx.load_cert_chain(os.path.join(cls.pki, "server.pem"), os.path.join(cls.pki, "server.key"))
        cls.client_ctx = ssl.create_default_context(cafile=os.path.join(cls.pki, "ca.pem"))

    def tls_tap(self, peer):
        p = self.p
        return self.start_tap(["--tls-cert", p("server.pem"), "--tls-key", p("server.key"), "--upstream-tls",
                               "--upstream-ca", p("ca.pem")], upstream_port=peer.port, upstream_host="localhost",
                              env={"ASAN_OPTIONS": "quarantine_size_mb=16:detect_leaks=1"})

    def connect(self, tap):
        return self.client_ctx.wrap_socket(tap.connect(timeout=60), server_hostname="localhost")

    def test_broker_stops_reading(self):
        def handler(conn, _idx):
            conn.settimeout(120)
            with self.server_ctx.wrap_socket(conn, server_side=True) as tls:
                self.resume.wait(60)
                self.peer_result["r"] = recv_exact_hash(tls, TLS_TOTAL)

        peer = Peer(handler)
        self.addCleanup(peer.close)
        tap = self.tls_tap(peer)
        self.write_until_stalled_then_resume("TLS client->broker", tap, peer, self.connect(tap), TLS_TOTAL)

    def test_client_stops_reading(self):
        writers = []

        def handler(conn, _idx):
            conn.settimeout(120)
            with self.server_ctx.wrap_socket(conn, server_side=True) as tls:
                self.assertEqual(tls.recv(2), b"go")
                w = Writer(tls, TLS_TOTAL)
                writers.append(w)
                w.run()
                tls.recv(1)  # until the client is done: closing first would cut what is in flight

        peer = Peer(handler)
        self.addCleanup(peer.close)
        tap = self.tls_tap(peer)
        baseline = rss_kb(tap.pid)
        sampler = Sampler(tap.pid)
        sampler.start()
        c = self.connect(tap)
        c.sendall(b"go")
        self.assertTrue(wait_for(lambda: writers, 10), "the peer got no connection")
        stalled_at = self.wait_stalled(writers[0])
        result = recv_exact_hash(c, TLS_TOTAL)
        c.close()
        peer.join(120)
        self.check("TLS broker->client", tap, baseline, sampler, stalled_at, writers[0], result)


def raw_frame(ftype, channel, payload):
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce"


# One publish as frames: basic.publish (exchange "", routing key "q", not mandatory), content header, a 4 KiB body
# (a few thousand publishes fill the sockets: the records of tiny ones, all written at the end, would come faster
# than a loaded disk takes them).
PUBLISH = (raw_frame(1, 1, struct.pack(">HHH", 60, 40, 0) + b"\x00\x01q\x00") +
           raw_frame(2, 1, struct.pack(">HHQH", 60, 0, 4096, 0)) + raw_frame(3, 1, b"p" * 4096))
# The protocol header and a login sent at once, without waiting for the broker (which here never answers): the
# decoder takes no content frame for one before the login is over (one could be a password of the client's framing).
AMQP_HEADER = (b"AMQP\x00\x00\x09\x01" +
               raw_frame(1, 0, struct.pack(">HHI", 10, 11, 0) + b"\x05PLAIN" + struct.pack(">I", 12) +
                         b"\x00guest\x00guest" + b"\x05en_US") +
               raw_frame(1, 0, struct.pack(">HHHIH", 10, 31, 2047, 131072, 0)) +
               raw_frame(1, 0, struct.pack(">HH", 10, 40) + b"\x01/\x00\x00"))


class HeldPublishesTest(TapTestCase):
    """A plain client publishes into a broker (a Peer) that stopped reading until the tap pushes back; then the
    session ends with publishes delivered to the tap's socket but unread: each must still be observed and get
    its record, whether the broker resets or the tap is stopped."""

    def tap_for(self, peer, extra=()):
        return self.start_tap(list(extra), upstream_port=peer.port)

    def connect(self, tap):
        return tap.connect()

    # a TLS client's last record may be cut by what it had not sent: not decryptable, its publishes not seen
    cut = 0
    # a TLS client's send() that gave up (want write) may have written part of its 64 KiB before it did
    unfinished = 0

    def send_until_held(self, c):
        """Publishes until backpressure holds the client for 1 s; returns (bytes sent, bytes in the tap's
        socket: read by the tap or not)."""
        c.setblocking(False)
        data = AMQP_HEADER + PUBLISH * (64 * MIB // len(PUBLISH))
        sent, idle_since = 0, time.monotonic()
        while time.monotonic() - idle_since < 1.0 and sent < len(data):
            try:
                sent += c.send(data[sent:sent + 65536])
                idle_since = time.monotonic()
            except (BlockingIOError, ssl.SSLWantWriteError):
                time.sleep(0.01)
        self.assertLess(sent, len(data), "the tap never pushed back")
        unsent = struct.unpack("i", fcntl.ioctl(c.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        return sent, sent - unsent  # for TLS, unsent counts ciphertext: a lower bound on what was delivered

    def held_then(self, end, extra=()):
        """Runs the scenario; `end(tap)` ends the session. Checks that every whole publish the tap's kernel
        took has its record."""
        go = threading.Event()

        def broker(conn, _idx):  # takes the protocol header, stops reading, and resets when told
            conn.recv(len(AMQP_HEADER))
            go.wait(60)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

        peer = Peer(broker)
        self.addCleanup(peer.close)
        self.addCleanup(go.set)
        tap = self.tap_for(peer, extra)
        c = self.connect(tap)
        sent, delivered = self.send_until_held(c)
        end(tap, go)
        c.setblocking(True)
        c.settimeout(30)
        try:
            while c.recv(65536):
                pass
        except OSError:
            pass  # the tap closes the client once the broker is gone
        c.close()
        self.assertEqual(tap.stop(), 0, tap.stderr())

        whole = lambda n: max(0, n - len(AMQP_HEADER) - self.cut) // len(PUBLISH)
        traced = len(traced_publishes(frame_lines(tap.frames)))
        print(f"{whole(delivered)} publishes delivered to the tap's socket, {whole(sent)} sent, {traced} traced")
        # at least every whole publish the tap's kernel took; at most what the client sent (the tap's reads free
        # window, so some of what was still queued at the client may arrive before the tap closes)
        self.assertGreaterEqual(traced, whole(delivered))
        self.assertLessEqual(traced, whole(sent + self.cut + self.unfinished) + 1)
        self.assertEqual(len(publish_records(tap.verdicts)), traced, "one record per traced basic.publish")
        return tap

    def test_publishes_unread_when_the_broker_resets_are_observed(self):
        self.held_then(lambda tap, go: go.set())

    def test_publishes_unread_when_the_tap_stops_are_observed(self):
        def stop(tap, go):
            tap.proc.send_signal(signal.SIGTERM)  # its grace ends with the broker still not reading
            self.assertTrue(wait_for(lambda: not tap.alive(), 20), "the tap did not stop")

        tap = self.held_then(stop, ["--grace", "300"])
        ends = [r for r in tap.records("connection") if r.get("event") == "close"]
        self.assertEqual([r.get("by") for r in ends], ["shutdown"], ends)


class HeldPublishesMemoryTest(TapTestCase):
    """The same ending (the tap stopped) for 16 sessions at once, each with megabytes of publishes held in the
    tap's socket while its broker reads nothing: what the tap reads at the end is observed, not queued for a broker
    that will never take it, so the tap's peak memory does not grow with what clients sent (it grew by all of it:
    over 100 MB here)."""

    def test_what_is_read_at_the_end_is_not_queued(self):
        go = threading.Event()
        self.addCleanup(go.set)

        def broker(conn, _idx):
            conn.recv(len(AMQP_HEADER))
            go.wait(60)

        peer = Peer(broker)
        self.addCleanup(peer.close)
        tap = self.start_tap(["--grace", "300"], upstream_port=peer.port, frames=False)
        baseline = rss_kb(tap.pid)
        delivered = [0] * 16

        def fill(i, c):
            delivered[i] = HeldPublishesTest.send_until_held(self, c)[1]

        clients = [tap.connect() for _ in delivered]
        fillers = [threading.Thread(target=fill, args=(i, c)) for i, c in enumerate(clients)]
        for f in fillers:
            f.start()
        for f in fillers:
            f.join(60)
        tap.proc.send_signal(signal.SIGTERM)
        self.assertTrue(wait_for(lambda: not tap.alive(), 20), "the tap did not stop")
        for c in clients:
            c.close()
        self.assertEqual(tap.stop(), 0, tap.stderr())
        peak = int(re.search(r"process peak_rss_kib=(\d+)", tap.stderr()).group(1))
        held = sum(delivered) // 1024
        print(f"{held} KiB held in the tap's sockets at the end; peak RSS {peak} KiB, {baseline} KiB at the start")
        # Queued, the growth was all of what was held; observed, it is the forwarding buffers (1 MiB per direction
        # per session) and the verdict backlog (8 MiB): 20-25 MiB here, whatever the kernels held (75-270 MiB).
        # ASan's allocator (redzones, size classes, shadow) makes the same buffers 2-3 times as large (40-50 MiB
        # on a loaded machine), so there only the share of what was held is checked, against more held.
        if is_asan_build():
            self.assertGreater(held, 64 * 1024, "too little was held to tell")
            self.assertLess(peak - baseline, held * 3 // 4, "what the tap read at the end was queued")
        else:
            self.assertGreater(held, 32 * 1024, "too little was held to tell")
            self.assertLess(peak - baseline, held // 2, "what the tap read at the end was queued")
            self.assertLess(peak - baseline, 64 * 1024, "more than the forwarding buffers and the backlog")
        whole = sum(max(0, d - len(AMQP_HEADER)) // len(PUBLISH) for d in delivered)
        self.assertGreaterEqual(len(publish_records(tap.verdicts)), whole)


class TlsHeldPublishesTest(PkiCase, HeldPublishesTest):
    """The same with the client on TLS (the tap decrypts what was held)."""

    cut = 16 * 1024 + 64
    unfinished = 65536

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.client_ctx = ssl.create_default_context(cafile=os.path.join(cls.pki, "ca.pem"))

    def tap_for(self, peer, extra=()):
        p = self.p
        return self.start_tap(["--tls-cert", p("server.pem"), "--tls-key", p("server.key")] + list(extra),
                              upstream_port=peer.port)

    def connect(self, tap):
        return self.client_ctx.wrap_socket(tap.connect(timeout=60), server_hostname="localhost")


class SlowReaderReturnsTest(TapTestCase):
    """A client publishes mandatory messages nobody can route, through the tap to the real broker, and reads
    nothing for longer than the return window: the broker's Returns pile up behind the tap's backpressure, unread.
    The window must not run out while the tap holds them: every publish is `returned`, none `unproven`, and no
    Return is left unmatched."""

    def test_returns_held_by_backpressure_are_not_timed_out(self):
        require_broker(self)
        count, body = 400, b"r" * 65536
        # a window a loaded broker meets (it took over 300 ms in a busy CI run), well short of the time unread
        tap = self.start_tap(["--return-window", "1000"], frames=False)
        c = RawClient(tap.port, timeout=60)
        c.method(1, 20, 10, c.short(""))
        c.expect(1, 20, 11)
        failed = []

        def publish():
            try:
                for i in range(count):
                    c.publish_parts(1, "amq.direct", "nobody-binds-this", body, f"m{i}")
            except OSError as e:
                failed.append(e)

        writer = threading.Thread(target=publish, daemon=True)
        writer.start()
        time.sleep(3.0)  # reads nothing for 3 s: the tap stops reading the broker while returns wait
        returned = 0
        while returned < count:
            ftype, ch, payload = c.read_frame()
            if ftype == 1 and struct.unpack(">HH", payload[:4]) == (60, 50):
                returned += 1
        writer.join(30)
        self.assertEqual(failed, [])
        c.method(0, 10, 50, struct.pack(">H", 200) + c.short("bye") + struct.pack(">HH", 0, 0))
        c.expect(0, 10, 51)
        c.close()
        self.assertEqual(tap.stop(), 0, tap.stderr())
        recs = publish_records(tap.verdicts)
        self.assertEqual(len(recs), count)
        routes = collections.Counter(r["route"] for r in recs)
        self.assertEqual(routes, {"returned": count}, "a Return held by backpressure was timed out")
        self.assertEqual([r for r in tap.records() if r.get("type") == "warning"], [])


if __name__ == "__main__":
    main()
