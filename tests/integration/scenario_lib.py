# Helpers for the real-broker scenario tests (src/DESIGN.md §7): pika connections through the tap, unique broker object
# names, the broker control script, readers for `publish` records and the --frames trace, and the invariant check
# "every basic.publish the client sent produces exactly one publish record". Builds on tapharness.

import collections
import json
import os
import struct
import subprocess
import uuid

import pika
import pika.exceptions

from tapharness import BROKER_HOST, BROKER_PORT, SOURCE_DIR, TapTestCase, read_records, require_broker, wait_for

BROKER_SH = os.path.join(SOURCE_DIR, "scripts", "broker.sh")


def broker_sh(*args, timeout=180):
    """Runs scripts/broker.sh with the caller's TAP_BROKER_* environment; raises on failure."""
    subprocess.run([BROKER_SH, *args], check=True, timeout=timeout, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def params(port, host="127.0.0.1", **kw):
    """pika connection parameters for the scenarios: no heartbeats (they would add frames the records do not
    expect), no blocked-connection timeout; kw adds or overrides."""
    kw.setdefault("heartbeat", 0)
    kw.setdefault("blocked_connection_timeout", None)
    return pika.ConnectionParameters(host, port, **kw)


def props(mid, **kw):
    """pika message properties with message_id mid (how a test finds its publish's record) and kw."""
    return pika.BasicProperties(message_id=mid, **kw)


def text_props(mid, **kw):
    """props() of a persistent text/plain message unless kw says otherwise (a well-behaved publisher's; the
    captures' messages)."""
    return props(mid, **{"delivery_mode": 2, "content_type": "text/plain", **kw})


def pipelined(conn_params, routing_key, messages, mandatory):
    """One pika SelectConnection, one confirm channel: every (properties, body) of messages written at once to the
    default exchange (so many are in flight and the broker answers with multiple=true acks), then a clean close
    once the broker confirmed them all (or after 30 s). Returns the highest delivery tag confirmed."""
    state = {"confirmed": 0}

    def on_open(conn):
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch):
        ch.confirm_delivery(on_confirm, callback=lambda _f: publish(ch))

    def publish(ch):
        for p, body in messages:
            ch.basic_publish("", routing_key, body, p, mandatory=mandatory)

    def on_confirm(frame):
        state["confirmed"] = frame.method.delivery_tag
        if frame.method.delivery_tag >= len(messages):
            conn.close()

    conn = pika.SelectConnection(conn_params, on_open_callback=on_open,
                                 on_close_callback=lambda *_a: conn.ioloop.stop())
    conn.ioloop.call_later(30, conn.ioloop.stop)
    conn.ioloop.start()
    return state["confirmed"]


def direct_connection():
    """A pika connection straight to the broker (not through the tap) for declaring and inspecting objects."""
    return pika.BlockingConnection(params(BROKER_PORT, BROKER_HOST))


def publish_records(path):
    return [r for r in read_records(path) if r.get("type") == "publish"]


def frame_lines(path):
    return read_records(path)


def traced_publishes(frames):
    """(conn, channel) of every basic.publish method the tap decoded on c2s, in wire order."""
    return [(f["conn"], f["channel"]) for f in frames
            if f.get("dir") == "c2s" and f.get("frame") == "method" and f.get("method") == "basic.publish"]


def traced_confirms(frames):
    """{(conn, channel): [(method, delivery_tag, multiple), ...]} of broker acks/nacks in the trace."""
    out = collections.defaultdict(list)
    for f in frames:
        if f.get("dir") == "s2c" and f.get("method") in ("basic.ack", "basic.nack"):
            a = f.get("args", {})
            out[(f["conn"], f["channel"])].append((f["method"], a.get("delivery_tag"), bool(a.get("multiple"))))
    return out


def confirmed_tags(confirms, max_seq):
    """The seqs (1..max_seq) covered by a list of (method, tag, multiple): {seq: "ack"|"nack"}, first answer wins."""
    out = {}
    for method, tag, multiple in confirms:
        seqs = range(1, min(tag, max_seq) + 1) if multiple else ([tag] if 1 <= tag <= max_seq else [])
        for s in seqs:
            out.setdefault(s, "ack" if method == "basic.ack" else "nack")
    return out


class ScenarioCase(TapTestCase):
    """A TapTestCase that needs the broker and gives every test its own object-name prefix."""

    def setUp(self):
        super().setUp()
        require_broker(self)
        self.prefix = f"scn.{self._testMethodName}.{uuid.uuid4().hex[:8]}"
        self._admin = None
        self._queues = []

    def name(self, suffix):
        return f"{self.prefix}.{suffix}"

    def admin(self):
        """A channel straight to the broker; objects declared through it are the test's to clean up."""
        if self._admin is None or self._admin.is_closed:
            self._admin = direct_connection()
            self.addCleanup(self._close_admin)
        return self._admin.channel()

    def _close_admin(self):
        if self._admin is not None:
            self._close_quietly(self._admin)

    def declare_queue(self, suffix, **kw):
        q = self.name(suffix)
        self.admin().queue_declare(q, auto_delete=False, **kw)
        self.own_queue(q)
        return q

    def own_queue(self, q):
        """q is the test's: deleted after it, and one of the queues purge_queues() empties."""
        if q not in self._queues:
            self._queues.append(q)
            self.addCleanup(self._delete, "queue", q)

    def purge_queues(self):
        """Empties every queue the test owns that exists (so that a drive run again starts as the first did)."""
        for q in self._queues:
            try:
                self.admin().queue_purge(q)
            except pika.exceptions.ChannelClosedByBroker:  # not declared (yet): nothing in it
                pass

    def declare_exchange(self, suffix, kind, **kw):
        x = self.name(suffix)
        self.admin().exchange_declare(x, kind, **kw)
        self.addCleanup(self._delete, "exchange", x)
        return x

    def _delete(self, what, name):
        try:
            with direct_connection() as c:
                ch = c.channel()
                (ch.queue_delete if what == "queue" else ch.exchange_delete)(name)
        except Exception:  # the broker may have been restarted by the test; leftovers are harmless
            pass

    def connect(self, tap, **kw):
        c = pika.BlockingConnection(params(tap.port, **kw))
        self.addCleanup(self._close_quietly, c)
        return c

    @staticmethod
    def _close_quietly(c):
        try:
            if c.is_open:
                c.close()
        except pika.exceptions.AMQPError:  # the tap or the broker went away first, as some tests intend
            pass

    def stop_tap(self, tap):
        """SIGTERM, exit code 0 asserted; returns the publish records."""
        rc = tap.stop()
        self.assertEqual(rc, 0, f"amqptap exited {rc}: {tap.stderr()[-2000:]}")
        return publish_records(tap.verdicts)

    def wait_records(self, tap, pred, timeout=20):
        return wait_for(lambda: pred(publish_records(tap.verdicts)), timeout, 0.05)

    def assertRecord(self, rec, **want):
        got = {k: rec.get(k, "<absent>") for k in want}
        self.assertEqual(got, want, f"record: {json.dumps(rec)}")

    def assertOnePerPublish(self, recs, message_ids, total=None):
        """THE INVARIANT: each message_id published appears in exactly one publish record, and the number of
        publish records equals the number of publishes made (total, default len(message_ids))."""
        total = len(message_ids) if total is None else total
        counts = collections.Counter(r.get("message_id") for r in recs)
        dup = {m: n for m, n in counts.items() if m is not None and n > 1}
        missing = [m for m in message_ids if counts.get(m, 0) == 0]
        self.assertEqual(dup, {}, "message_ids with more than one publish record")
        self.assertEqual(missing, [], "publishes without a record")
        self.assertEqual(len(recs), total, "publish record count differs from publishes made")

    def assertSeqsOnce(self, recs, n):
        """Every seq 1..n exactly once in recs (one channel)."""
        seqs = collections.Counter(r.get("seq") for r in recs)
        self.assertEqual(sorted(seqs), list(range(1, n + 1)), "seqs are not exactly 1..n")
        self.assertEqual({s: c for s, c in seqs.items() if c != 1}, {}, "seqs with more than one record")


def stream_publisher(port, count, size, window, mandatory, routing_key, exchange=""):
    """Starts tests/clients/stream_publisher against the tap on port; stdout is a pipe of JSON lines."""
    from tapharness import CLIENTS_DIR
    path = os.path.join(CLIENTS_DIR, "stream_publisher")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} is not built (rabbitmq-c missing?)")
    args = [path, "127.0.0.1", str(port), str(count), str(size), str(window), "1" if mandatory else "0", routing_key,
            exchange]
    # unbuffered: progress lines are read one at a time with select() while the publisher runs
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)


def read_until_progress(proc, at_least, timeout=60):
    """Reads the publisher's progress lines until it reports at_least confirms; returns the last count seen
    (less than at_least when the stream ended or timed out first)."""
    import select
    import time
    end = time.monotonic() + timeout
    last = 0
    while last < at_least and time.monotonic() < end:
        r, _, _ = select.select([proc.stdout], [], [], 0.5)
        if not r:
            continue
        line = proc.stdout.readline()
        if not line:
            break
        last = json.loads(line).get("progress", last)
    return last


def final_line(out):
    """The publisher's summary: the last JSON line of its stdout that is not a progress line."""
    for line in reversed(out.decode().splitlines()):
        d = json.loads(line)
        if "progress" not in d:
            return d
    return None


class RawClient:
    """A minimal AMQP 0-9-1 client on a plain socket (PLAIN guest/guest, no heartbeats) for what real clients never
    do on purpose, such as ending a connection in the middle of a message. Frames: src/PROTOCOL.md §2; content: §4."""

    def __init__(self, port, host="127.0.0.1", timeout=10):
        import socket
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.expect(0, 10, 10)  # connection.start
        self.method(0, 10, 11, self.table() + self.short("PLAIN") + self.long(b"\x00guest\x00guest") +
                    self.short("en_US"))
        tune = self.expect(0, 10, 30)
        channel_max, frame_max = struct.unpack(">HI", tune[:6])
        self.method(0, 10, 31, struct.pack(">HIH", channel_max, frame_max, 0))
        self.method(0, 10, 40, self.short("/") + self.short("") + b"\x00")
        self.expect(0, 10, 41)

    @staticmethod
    def short(s):
        b = s.encode() if isinstance(s, str) else s
        return struct.pack(">B", len(b)) + b

    @staticmethod
    def long(b):
        return struct.pack(">I", len(b)) + b

    @staticmethod
    def table():
        return struct.pack(">I", 0)

    def frame(self, ftype, channel, payload):
        self.sock.sendall(struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce")

    def method(self, channel, class_id, method_id, args=b""):
        self.frame(1, channel, struct.pack(">HH", class_id, method_id) + args)

    def read_frame(self):
        while True:
            if len(self.buf) >= 7:
                ftype, channel, size = struct.unpack(">BHI", self.buf[:7])
                if len(self.buf) >= 8 + size:
                    payload, self.buf = self.buf[7:7 + size], self.buf[8 + size:]
                    return ftype, channel, payload
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("EOF from the tap")
            self.buf += data

    def expect(self, channel, class_id, method_id):
        """Reads frames until the given method arrives on channel; returns its arguments."""
        while True:
            ftype, ch, payload = self.read_frame()
            if ftype == 1 and ch == channel and struct.unpack(">HH", payload[:4]) == (class_id, method_id):
                return payload[4:]

    def open_confirm_channel(self, channel):
        self.method(channel, 20, 10, self.short(""))
        self.expect(channel, 20, 11)
        self.method(channel, 85, 10, b"\x00")
        self.expect(channel, 85, 11)

    def publish_parts(self, channel, exchange, routing_key, body, message_id, mandatory=True, body_sent=None):
        """basic.publish, its content header (message_id set) and the first body_sent bytes of body (all of it by
        default) as one body frame."""
        self.method(channel, 60, 40, struct.pack(">H", 0) + self.short(exchange) + self.short(routing_key) +
                    (b"\x01" if mandatory else b"\x00"))
        self.frame(2, channel, struct.pack(">HHQH", 60, 0, len(body), 0x0080) + self.short(message_id))
        part = body if body_sent is None else body[:body_sent]
        if part:
            self.frame(3, channel, part)

    def close(self):
        self.sock.close()
