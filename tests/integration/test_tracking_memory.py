# The client cannot size the tap's memory, and whatever it sends every record parses (issue 12, items 3 and 4):
# (a) a confirm client that never reads its socket and (b) a fast mandatory client without confirms, both with large
# header keys, keep the tap's resident memory under --max-tracking-memory plus a fixed overhead, every publish still
# gets exactly one record (the oldest written unknown/evicted past the budget), and the tracker gives its memory back
# once they are written; (c) hostile header keys (64 x 250 bytes of 0x01, bytes that are no UTF-8) give records
# that json.loads reads, cut on a character boundary and marked headers_truncated.

import json
import os
import re
import shutil
import tempfile
import unittest
import signal
import socket
import struct
import threading
import time

from scenario_lib import RawClient, ScenarioCase
from tapharness import MIB, Peer, is_asan_build, main, read_records, replay, rss_kb, start_tap, wait_for

BUDGET = 4 * MIB
# The tap's own memory besides tracking: the loop, the relay buffers (1 MiB watermark each way), the record
# buffers and what malloc keeps. Peak VmRSS measured 10.8-11.9 MB with the 4 MiB budget (100 MB before the
# budget and the header caps).
OVERHEAD = 24 * MIB
KEY_LEN = 250
N_KEYS = 64


def vm_hwm_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM")


class Sampler(threading.Thread):
    """Peak VmRSS of a process, sampled every 10 ms."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_kb = rss_kb(pid)
        self.stop_ev = threading.Event()

    def run(self):
        while not self.stop_ev.is_set():
            try:
                self.peak_kb = max(self.peak_kb, rss_kb(self.pid))
            except (OSError, RuntimeError):
                return
            time.sleep(0.01)

    def stop(self):
        self.stop_ev.set()
        self.join(5)
        return self.peak_kb


class Client(RawClient):
    """RawClient that publishes with a headers table in one write, and reads or not as the test wants."""

    @staticmethod
    def header_table(keys):
        """A field table of boolean entries under the given keys (bytes, at most 255 each)."""
        entries = b"".join(struct.pack(">B", len(k)) + k + b"t\x01" for k in keys)
        return struct.pack(">I", len(entries)) + entries

    def publish_bytes(self, channel, exchange, routing_key, body, message_id, keys, mandatory=True):
        """basic.publish + content header (headers, message_id) + body, as one byte string."""
        def frame(ftype, payload):
            return struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce"
        method = struct.pack(">HH", 60, 40) + struct.pack(">H", 0) + self.short(exchange) + \
            self.short(routing_key) + (b"\x01" if mandatory else b"\x00")
        props = self.header_table(keys) + self.short(message_id)
        header = struct.pack(">HHQH", 60, 0, len(body), 0x2080) + props
        return frame(1, method) + frame(2, header) + frame(3, body)

    def open_channel(self, channel):
        self.method(channel, 20, 10, self.short(""))
        self.expect(channel, 20, 11)

    def drain(self, stop):
        """Reads and drops everything until stop is set or EOF; last_rx is when bytes last came."""
        self.sock.settimeout(0.2)
        while not stop.is_set():
            try:
                if not self.sock.recv(1 << 20):
                    return
                self.last_rx = time.monotonic()
            except socket.timeout:
                continue
            except OSError:
                return

    def close_connection(self):
        """connection.close, then waits (reading) for close-ok."""
        self.sock.settimeout(30)
        self.method(0, 10, 50, struct.pack(">H", 200) + self.short("bye") + struct.pack(">HH", 0, 0))
        self.expect(0, 10, 51)
        self.sock.close()


def large_keys(i):
    """64 distinct 250-byte ASCII keys, different for every publish (nothing the tracker can share)."""
    return [(b"%08d-%02d-" % (i, k)).ljust(KEY_LEN, b"k") for k in range(N_KEYS)]


def summary_memory(tap):
    """The tracker's `tracking memory N bytes` from a SIGUSR1 summary."""
    before = tap.stderr().count("tracking memory ")
    tap.proc.send_signal(signal.SIGUSR1)
    wait_for(lambda: tap.stderr().count("tracking memory ") > before, 10)
    line = [ln for ln in tap.stderr().splitlines() if ln.startswith("tracking memory ")][-1]
    return int(line.split()[2])


class TrackingMemoryTest(ScenarioCase):
    def assertUnderBudget(self, hwm_kb):
        if is_asan_build():
            return  # resident memory of an ASan build is mostly the sanitizer's
        self.assertLess(hwm_kb, (BUDGET + OVERHEAD) // 1024, "VmHWM over the budget plus the fixed overhead")

    def check_one_record_each(self, tap, n):
        pubs = tap.records("publish")
        ids = [r.get("message_id") for r in pubs]
        self.assertEqual(len(pubs), n, "want exactly one publish record per basic.publish")
        self.assertEqual(sorted(ids), sorted(f"m{i}" for i in range(n)))
        return pubs

    def test_never_reading_confirm_client(self):
        """(a) confirm + mandatory, unroutable (each Return carries the 16 KB of keys back), the client never reads:
        the tap stops reading the broker and its publishes stay outstanding; past the budget the oldest go."""
        # the identities of the publishes are kept --resend-window to tell duplicates (src/DESIGN.md §4b): a short one
        # so that their memory too is given back before it is looked at
        tap = self.start_tap(["--max-tracking-memory", str(BUDGET), "--resend-window", "200"], frames=False)
        cl = Client(tap.port)
        cl.open_channel(1)
        cl.method(1, 85, 10, b"\x00")
        cl.expect(1, 85, 11)
        sampler = Sampler(tap.pid)
        sampler.start()
        cl.sock.settimeout(2)
        sent = 0
        n = 6000
        for i in range(n):
            data = cl.publish_bytes(1, "", self.name("nowhere"), b"x" * 16, f"m{i}".encode(), large_keys(i))
            try:
                cl.sock.sendall(data)
            except socket.timeout:
                break  # the broker stopped reading (its own memory alarm): what was sent is what counts
            sent += 1
        time.sleep(1)
        stalled = [r for r in tap.records("publish")]
        peak_stalled = sampler.peak_kb
        # the client reads at last: the rest of the acks and Returns arrive, every publish gets its record
        stop = threading.Event()
        cl.last_rx = time.monotonic()
        reader = threading.Thread(target=cl.drain, args=(stop,), daemon=True)
        reader.start()
        wait_for(lambda: len(tap.records("publish")) >= sent, 120, 0.2)
        # and reads on until nothing more comes: RabbitMQ closes with SO_LINGER 0 right after connection.close-ok,
        # which throws away what its socket has not sent yet, close-ok included, if Returns still queue before it
        wait_for(lambda: time.monotonic() - cl.last_rx > 1.0, 60, 0.2)
        stop.set()
        reader.join(5)
        cl.close_connection()
        peak_kb = sampler.stop()
        hwm_kb = vm_hwm_kb(tap.pid)
        time.sleep(0.5)  # the identities' --resend-window
        memory_after = summary_memory(tap)
        print(f"\n  never-reading confirm client: {sent} publishes sent, {len(stalled)} records while stalled, "
              f"peak VmRSS {peak_stalled} kB stalled / {peak_kb} kB overall, VmHWM {hwm_kb} kB, "
              f"tracking memory after {memory_after} B")
        self.assertGreater(sent, 3000, "the client should get thousands of publishes through")
        pubs = self.check_one_record_each(tap, sent)
        evicted = [r for r in pubs if r.get("reason") == {"by": "evicted", "text": "max-tracking-memory"}]
        self.assertGreater(len(evicted), 0, "the budget should have been reached")
        for r in evicted:
            # its Return may have arrived before it was evicted: then the route is known, only the ack is not
            self.assertIn(r["route"], ("unknown", "returned"), r)
            self.assertEqual(r["confirm"], "unknown", r)
        self.assertUnderBudget(hwm_kb)
        self.assertLess(memory_after, 64 * 1024, "the tracker gives its memory back")

    def test_fast_mandatory_client_without_confirms(self):
        """(b) 6,000 mandatory publishes without confirms, as fast as the socket takes them: each waits 2 s for a
        Return that never comes (the queue takes them), so all are outstanding at once."""
        q = self.declare_queue("q", arguments={"x-max-length": 10})
        # the identities of the publishes are kept --resend-window to tell duplicates (src/DESIGN.md §4b): a short one
        # so that their memory too is given back before it is looked at
        tap = self.start_tap(["--max-tracking-memory", str(BUDGET), "--resend-window", "200"], frames=False)
        cl = Client(tap.port)
        cl.open_channel(1)
        sampler = Sampler(tap.pid)
        sampler.start()
        n = 6000
        t0 = time.monotonic()
        for i in range(n):
            cl.sock.sendall(cl.publish_bytes(1, "", q, b"x" * 16, f"m{i}".encode(), large_keys(i)))
        took = time.monotonic() - t0
        wait_for(lambda: len(tap.records("publish")) >= n, 60, 0.2)
        peak_kb = sampler.stop()
        hwm_kb = vm_hwm_kb(tap.pid)
        time.sleep(0.5)  # the identities' --resend-window
        memory_after = summary_memory(tap)
        cl.close_connection()
        print(f"\n  fast mandatory client: {n} publishes in {took:.2f} s, peak VmRSS {peak_kb} kB, VmHWM {hwm_kb} kB, "
              f"tracking memory after {memory_after} B")
        pubs = self.check_one_record_each(tap, n)
        routes = {(r["route"], r["confirm"]) for r in pubs}
        self.assertLessEqual(routes, {("unproven", "none"), ("unknown", "none")})
        self.assertUnderBudget(hwm_kb)
        self.assertLess(memory_after, 64 * 1024, "the tracker gives its memory back")

    def test_hostile_header_keys_parse(self):
        """(c) 64 keys of 250 x 0x01 (1,500 bytes each once escaped), keys of bytes that are no UTF-8, and keys
        of two-byte characters: every line of --verdicts and --frames is JSON, header keys cut on a character
        boundary and marked."""
        q = self.declare_queue("q", arguments={"x-max-length": 10})
        tap = self.start_tap(["--max-tracking-memory", str(BUDGET)], frames=True)
        cl = Client(tap.port)
        cl.open_channel(1)
        cl.method(1, 85, 10, b"\x00")
        cl.expect(1, 85, 11)
        sets = [
            [b"\x01" * KEY_LEN] * N_KEYS,
            [bytes([0x80 + (k + j) % 0x7f for j in range(KEY_LEN)]) for k in range(N_KEYS)],
            [b"\xff\xfe" * (KEY_LEN // 2)] * N_KEYS,
            [("é" * 124).encode() + b"\xc3" for _ in range(N_KEYS)],
        ]
        for i, keys in enumerate(sets):
            cl.sock.sendall(cl.publish_bytes(1, "", q, b"x", f"m{i}".encode(), keys))
        wait_for(lambda: len(tap.records("publish")) >= len(sets), 20, 0.1)
        cl.close_connection()
        rc = tap.stop()
        self.assertEqual(rc, 0)
        for path in (tap.verdicts, tap.frames):
            with open(path, "rb") as f:
                for n, line in enumerate(f, 1):
                    try:
                        json.loads(line.decode("utf-8"))
                    except (UnicodeDecodeError, ValueError) as e:
                        self.fail(f"{path}:{n} is not JSON ({e}): {line[:120]!r}... ({len(line)} bytes)")
        pubs = self.check_one_record_each(tap, len(sets))
        for r in pubs:
            self.assertIs(r.get("headers_truncated"), True)
            self.assertGreaterEqual(len(r["headers"]), 1)
            self.assertLessEqual(len(json.dumps(r["headers"], ensure_ascii=False).encode()), 1024 + 2 + 64)
            self.assertEqual((r["route"], r["confirm"]), ("routed", "ack"))
        first = next(r for r in pubs if r["message_id"] == "m0")
        self.assertEqual(first["headers"], ["\x01" * 170])  # 1,022 bytes escaped: what fits of the first key


    def test_memory_of_contents_in_progress_is_given_back(self):
        """Two connections of 2,000 channels each start a publish whose content header carries eight 1 KiB values
        of --header-values keys (the decoder keeps them until the body comes: about 8 KiB a channel) and send the
        bodies a second later, the connections staying open: once the contents are done the heap is trimmed and
        the resident memory falls back (before: it stayed at its peak, about 40 MB, until a connection closed)."""
        if is_asan_build():
            self.skipTest("the resident memory of an ASan build is the sanitizer allocator's")
        def frame(ftype, ch, payload):
            return struct.pack(">BHI", ftype, ch, len(payload)) + payload + b"\xce"
        keys = [f"k{i}" for i in range(8)]
        tap = self.start_tap(["--header-values", ",".join(keys)])
        base_kb = rss_kb(tap.pid)
        table = b"".join(Client.short(k) + b"S" + Client.long(b"v" * 1000) for k in keys)
        header = struct.pack(">HHQH", 60, 0, 1, 0x2000) + struct.pack(">I", len(table)) + table
        clients, n = [Client(tap.port), Client(tap.port)], 2000
        for cl in clients:
            for ch in range(1, n + 1):
                cl.method(ch, 20, 10, Client.short(""))
            opened = set()
            while len(opened) < n:  # the broker's channels answer in their own order
                ftype, ch, payload = cl.read_frame()
                if ftype == 1 and payload[:4] == struct.pack(">HH", 20, 11):
                    opened.add(ch)
            cl.sock.sendall(b"".join(
                frame(1, ch, struct.pack(">HHH", 60, 40, 0) + Client.short("") + Client.short(f"nowhere.{ch}") +
                      b"\x00") + frame(2, ch, header) for ch in range(1, n + 1)))
        self.assertTrue(wait_for(lambda: rss_kb(tap.pid) > base_kb + 20 * 1024, 20, 0.1),
                        f"the contents in progress did not show: {rss_kb(tap.pid)} KiB")
        time.sleep(0.5)  # the last content headers read
        peak_kb = rss_kb(tap.pid)
        for cl in clients:
            cl.sock.sendall(b"".join(frame(3, ch, b"b") for ch in range(1, n + 1)))
        self.assertTrue(wait_for(lambda: len(tap.records("publish")) == 2 * n, 30, 0.1))
        fell = wait_for(lambda: rss_kb(tap.pid) < peak_kb - 10 * 1024, 5, 0.1)
        print(f"\n  contents in progress: VmRSS {base_kb} kB at the start, {peak_kb} kB with {2 * n} in progress, "
              f"{rss_kb(tap.pid)} kB once done (connections open)")
        self.assertTrue(fell, "the heap kept the memory of the finished contents")
        for cl in clients:
            cl.close_connection()
        self.assertEqual(tap.stop(), 0)


def raw_frame(ftype, channel, payload):
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce"


# A login sent at once (the broker here is a sink that answers nothing), then on each of 2,047 channels an open, a
# confirm.select and one publish: channel state by the thousand on every connection (issue 37, item 1).
LOGIN = (b"AMQP\x00\x00\x09\x01" +
         raw_frame(1, 0, struct.pack(">HHI", 10, 11, 0) + b"\x05PLAIN" + struct.pack(">I", 12) +
                   b"\x00guest\x00guest" + b"\x05en_US") +
         raw_frame(1, 0, struct.pack(">HHHIH", 10, 31, 2047, 131072, 0)) +
         raw_frame(1, 0, struct.pack(">HH", 10, 40) + b"\x01/\x00\x00"))
N_CHANNELS = 2047


def deliveries_flood():
    """What the broker sends back here: connection.open-ok, then on each channel one basic.deliver (consumer tag
    "ct", delivery tag 1) with a 10-byte body."""
    out = [raw_frame(1, 0, struct.pack(">HH", 10, 41) + b"\x00")]
    for ch in range(1, N_CHANNELS + 1):
        out += [raw_frame(1, ch, struct.pack(">HH", 60, 60) + b"\x02ct" + struct.pack(">QB", 1, 0) + b"\x00\x01q"),
                raw_frame(2, ch, struct.pack(">HHQH", 60, 0, 10, 0)), raw_frame(3, ch, b"d" * 10)]
    return b"".join(out)


def channel_flood():
    out = [LOGIN]
    for ch in range(1, N_CHANNELS + 1):
        out += [raw_frame(1, ch, struct.pack(">HH", 20, 10) + b"\x00"),
                raw_frame(1, ch, struct.pack(">HHB", 85, 10, 0)),
                raw_frame(1, ch, struct.pack(">HHH", 60, 40, 0) + b"\x00\x01q\x01"),
                raw_frame(2, ch, struct.pack(">HHQH", 60, 0, 10, 0)), raw_frame(3, ch, b"p" * 10)]
    return b"".join(out)


class ChannelFloodTest(unittest.TestCase):
    """Connections with 2,047 channels each, every channel with a publish on it, in front of a broker that answers
    nothing: the channels past --max-tracking-memory are not followed (their open records say "followed":false and
    their publishes are written at once, unknown), so the tap's memory stays at the budget plus a fixed overhead —
    in the proxy and replaying the proxy's own capture of it. Before, every channel stayed (about 2 KB each, the
    budget not consulted): 60 such connections took the tap to ~230 MB whatever the budget. The peer then sends a
    delivery on every channel: each gets exactly one delivery record too, the ones past the budget at once, unknown,
    no_memory (counted: "deliveries not followed")."""

    N_CONNS = 60
    BUDGET = "8M"
    PEAK_LIMIT_KB = (8 + 48) * 1024  # the budget, the 64 MiB-bounded contents (a few MB here), buffers, the binary

    def check(self, tap, records):
        pubs = [r for r in records if r.get("type") == "publish"]
        self.assertEqual(len(pubs), self.N_CONNS * N_CHANNELS, "one record per publish")
        unfollowed = [r for r in records if r.get("type") == "channel" and r.get("event") == "open"
                      and r.get("followed") is False]
        self.assertGreater(len(unfollowed), self.N_CONNS * N_CHANNELS // 2, "the budget did not bind")
        m = re.search(r"channels not followed (\d+)", tap.stderr())
        self.assertIsNotNone(m, tap.stderr())
        self.assertEqual(int(m.group(1)), len(unfollowed))
        peak = int(re.search(r"process peak_rss_kib=(\d+)", tap.stderr()).group(1))
        tracking_peak = int(re.search(r"tracking memory \d+ bytes \(peak (\d+)", tap.stderr()).group(1))
        print(f"{len(pubs)} publishes, {len(unfollowed)} channels not followed, peak RSS {peak} KiB, "
              f"tracking peak {tracking_peak} B")
        self.assertLess(tracking_peak, 9 * MIB, "tracking went past its budget")
        dlvs = [r for r in records if r.get("type") == "delivery"]
        self.assertEqual(len(dlvs), self.N_CONNS * N_CHANNELS, "one record per delivery")
        self.assertEqual(len({(r["conn"], r["channel"]) for r in dlvs}), len(dlvs))
        at_once = [r for r in dlvs if (r.get("reason") or {}).get("by") == "no_memory"]
        m = re.search(r"deliveries not followed (\d+)", tap.stderr())
        self.assertIsNotNone(m, tap.stderr())
        self.assertEqual(int(m.group(1)), len(at_once))
        self.assertGreater(len(at_once), 0, "the budget did not bind on deliveries")
        self.assertTrue(all(r["outcome"] == "unknown" for r in dlvs))
        unread = [r for r in at_once if r["reason"].get("text") == "channel not followed"]
        self.assertTrue(unread and all(r["body_size"] is None and r["details_lost"] for r in unread))
        print(f"{len(dlvs)} deliveries, {len(at_once)} written at once ({len(unread)} on unfollowed channels)")
        if not is_asan_build():
            self.assertLess(peak, self.PEAK_LIMIT_KB)

    def test_proxy_then_replay(self):
        data = channel_flood()
        back = deliveries_flood()

        def sink(conn, _idx):
            try:
                got = 0
                while got < len(data):
                    n = len(conn.recv(MIB))
                    if not n:
                        return
                    got += n
                conn.sendall(back)
                while conn.recv(MIB):
                    pass
            except OSError:
                pass

        peer = Peer(sink)
        self.addCleanup(peer.close)
        work = tempfile.mkdtemp(prefix="amqptap-chanflood-")
        self.addCleanup(shutil.rmtree, work, True)
        capture = os.path.join(work, "cap.pcapng")
        tap = start_tap(["--max-tracking-memory", self.BUDGET, "--pcap", capture], upstream_port=peer.port,
                        frames=False)
        self.addCleanup(tap.cleanup)
        socks = []
        for _ in range(self.N_CONNS):
            s = tap.connect()
            s.sendall(data)
            socks.append(s)
        self.assertTrue(wait_for(lambda: tap.records("publish") and
                                 len(tap.records("publish")) == self.N_CONNS * N_CHANNELS, 60, interval=0.5),
                        "not every publish was recorded")
        for s in socks:  # every delivery forwarded to the client: the tap has decoded it
            s.settimeout(60)
            got = 0
            while got < len(back):
                n = len(s.recv(MIB))
                self.assertNotEqual(n, 0, "the tap closed a connection")
                got += n
        for s in socks:
            s.close()
        self.assertEqual(tap.stop(), 0, tap.stderr())
        self.check(tap, tap.records())

        out = os.path.join(work, "replayed.jsonl")
        rep = replay(capture, peer.port, ["--max-tracking-memory", self.BUDGET], verdicts=out)
        self.assertEqual(rep.returncode, 0, rep.stderr())
        self.check(rep, list(read_records(out)))


if __name__ == "__main__":
    main()
