# amqptap sniff against the proxy on the DESIGN §7 scenarios (issue 15): each scenario is driven twice with the
# same broker objects, once by clients connected to the proxy and once by the same clients connected DIRECTLY to
# the broker while `amqptap sniff -i lo --port BROKER` captures. The two record sets must be equal in every field
# but timings and process identity. What must differ between two runs is normalised, and only that:
#   - process identity (run, tap, started, schema): tapharness.without_identity;
#   - timings: ts, *_us latencies, duration;
#   - the client's address and the connection id (another TCP connection, another id; the sniffer numbers streams);
#   - `multiple` on a confirm: whether the broker batched an ack is its own timing, not the publish's verdict;
#   - `publish_and_wait` warnings: whether a publish came after every earlier one was answered is a race between
#     the client and the broker, and a proxy in the path shifts it (a pipelining rabbitmq-c publisher can look
#     like it waited for its first few confirms on one path and not on the other).
# Records are compared as multisets (the sniffer sees the wire a few microseconds after the proxy would have, so
# records of different connections may interleave differently), and each channel's publish records additionally
# in order. Publishers: pika (scenarios 1, 2, 3, 4, 6, 7, 10a, 10b, 10c, 10d) and rabbitmq-c (confirm_roundtrip:
# 2,000 confirmed publishes with a window of 100; stream_publisher: 500 mandatory unroutable, confirmed).

import collections
import json
import os
import subprocess

import pika
import pika.exceptions

from tapharness import BROKER_PORT, CLIENTS_DIR, main, read_records, wait_for, without_identity
from scenario_lib import ScenarioCase, params

MIB = 1024 * 1024
TIMING = {"ts", "duration_us", "return_us", "confirm_us", "close_us", "latency_us", "age_us", "multiple"}
CONN_IDENTITY = {"conn", "client"}


def props(mid, **kw):
    return pika.BasicProperties(message_id=mid, **kw)


def normalise(testcase, recs):
    out = []
    for r in without_identity(testcase, recs):
        if r["type"] == "warning" and r.get("rule") == "publish_and_wait":
            continue
        out.append({k: v for k, v in r.items() if k not in TIMING and k not in CONN_IDENTITY
                    and not k.endswith("_us")})
    return out


def per_channel(recs):
    order = collections.defaultdict(list)
    for r in recs:
        if r["type"] == "publish":
            order[(r.get("channel"), r.get("tx"), r.get("seq") is None)].append(r.get("message_id"))
    return dict(order)


class SniffScenarios(ScenarioCase):
    def connect_to(self, port, **kw):
        c = pika.BlockingConnection(params(port, **kw))
        self.addCleanup(self._close_quietly, c)
        return c

    def through_proxy(self, drive):
        tap = self.start_tap(["--return-window", "300"])
        drive(tap.port)
        rc = tap.stop()
        self.assertEqual(rc, 0, tap.stderr()[-2000:])
        return read_records(tap.verdicts)

    def sniffed(self, drive, *extra):
        s = self.start_sniff(["--return-window", "300", *extra])
        try:
            drive(BROKER_PORT)
            # the last packets are on lo already; the sniffer reads them within its 10 ms tick
            wait_for(lambda: False, 0.3)
        finally:
            rc = s.stop(timeout=30)
        self.assertEqual(rc, 0, s.stderr())
        return s.records()

    def assertSame(self, drive, between=None):
        """Runs drive(port) through the proxy, then (after between()) directly under the sniffer; compares."""
        proxied = self.through_proxy(drive)
        if between:
            between()
        sniffed = self.sniffed(drive)
        self.assertEqual([r for r in sniffed if r["type"] in ("capture_gap", "capture_drops")], [])
        a, b = normalise(self, proxied), normalise(self, sniffed)
        self.assertTrue([r for r in a if r["type"] == "publish"], "the scenario published nothing")
        key = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
        only_proxy = collections.Counter(map(key, a)) - collections.Counter(map(key, b))
        only_sniff = collections.Counter(map(key, b)) - collections.Counter(map(key, a))
        self.assertEqual((sorted(only_proxy), sorted(only_sniff)), ([], []), "records differ (proxy, sniff)")
        self.assertEqual(per_channel(b), per_channel(a))
        return b

    # ---- pika ----

    def test_1_2_returns_without_confirm(self):
        x = self.declare_exchange("x", "direct")
        absent = self.name("absent")

        def drive(port):
            conn = self.connect_to(port)
            ch = conn.channel()
            returns = []
            ch.add_on_return_callback(lambda _c, _m, p, _b: returns.append(p.message_id))
            ch.basic_publish(x, "nomatch", b"payload", props("m1", correlation_id="c1", delivery_mode=2,
                                                             headers={"h": "v"}), mandatory=True)
            for i in range(300):
                ch.basic_publish("", absent, b"x" * (i % 50), props(f"r{i}"), mandatory=True)
            while len(returns) < 301:
                conn.process_data_events(0.1)
            conn.close()

        recs = self.assertSame(drive)
        self.assertEqual(collections.Counter(r["route"] for r in recs if r["type"] == "publish"), {"returned": 301})

    def test_3_exchange_types_and_missing_exchange(self):
        d = self.declare_exchange("direct", "direct")
        f = self.declare_exchange("fanout", "fanout")
        t = self.declare_exchange("topic", "topic")
        h = self.declare_exchange("headers", "headers")
        q = self.declare_queue("q")
        a = self.admin()
        a.queue_bind(q, d, "k")
        a.queue_bind(q, t, "a.*")
        a.queue_bind(q, h, arguments={"x-match": "all", "h": "1"})
        cases = [(d, "k", None), (d, "other", None), (f, "any", None), (t, "a.b", None), (t, "a.b.c", None),
                 (h, "", {"h": "1"}), (h, "", {"h": "2"})]
        nope = self.name("nope")

        def drive(port):
            conn = self.connect_to(port)
            ch = conn.channel()
            ch.confirm_delivery()
            for i, (x, rk, hdrs) in enumerate(cases):
                try:
                    ch.basic_publish(x, rk, b"body", props(f"m{i}", headers=hdrs), mandatory=True)
                except pika.exceptions.UnroutableError:
                    pass
            with self.assertRaises(pika.exceptions.ChannelClosedByBroker):
                ch.basic_publish(nope, "k", b"body", props("missing"), mandatory=True)
            conn.close()

        recs = self.assertSame(drive, lambda: self.admin().queue_purge(q))
        routes = {r["message_id"]: (r["route"], r["confirm"]) for r in recs if r["type"] == "publish"}
        self.assertEqual(routes["m0"], ("routed", "ack"))
        self.assertEqual(routes["m1"], ("returned", "ack"))
        self.assertEqual(routes["missing"], ("unknown", "unknown"))

    def test_4_alternate_exchange(self):
        ae = self.declare_exchange("ae", "fanout")
        aeq = self.declare_queue("aeq")
        self.admin().queue_bind(aeq, ae)
        x = self.declare_exchange("x", "direct", arguments={"alternate-exchange": ae})
        q = self.declare_queue("q")
        self.admin().queue_bind(q, x, "r")
        ae_empty = self.declare_exchange("ae-empty", "fanout")
        x2 = self.declare_exchange("x2", "direct", arguments={"alternate-exchange": ae_empty})

        def drive(port):
            conn = self.connect_to(port)
            ch = conn.channel()
            ch.confirm_delivery()
            for i, rk in enumerate(["r", "nope1", "r", "nope2"]):
                ch.basic_publish(x, rk, b"b", props(f"m{i}"), mandatory=True)
            with self.assertRaises(pika.exceptions.UnroutableError):
                ch.basic_publish(x2, "nope", b"b", props("m-ae-empty"), mandatory=True)
            conn.close()

        self.assertSame(drive)

    def test_6_confirm_without_mandatory_and_7_nack(self):
        absent = self.name("absent")
        full = self.declare_queue("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})

        def drive(port):
            conn = self.connect_to(port)
            ch = conn.channel()
            ch.confirm_delivery()
            for i in range(3):
                ch.basic_publish("", absent, b"b", props(f"u{i}"), mandatory=False)
            ch.basic_publish("", full, b"first", props("n0"), mandatory=True)
            for i in range(1, 4):
                with self.assertRaises(pika.exceptions.NackError):
                    ch.basic_publish("", full, b"next", props(f"n{i}"), mandatory=True)
            conn.close()

        recs = self.assertSame(drive, lambda: self.admin().queue_purge(full))
        self.assertEqual(len([w for w in recs if w["type"] == "warning"
                              and w.get("rule") == "confirm_without_mandatory"]), 1)
        self.assertEqual(sum(1 for r in recs if r["type"] == "publish" and r["confirm"] == "nack"), 3)

    def test_10a_large_messages(self):
        q = self.declare_queue("big")

        def drive(port):
            conn = self.connect_to(port, frame_max=131072)
            ch = conn.channel()
            ch.confirm_delivery()
            for i, n in enumerate([MIB, 3 * MIB + 17, 131072 - 8, 131072]):
                ch.basic_publish("", q, bytes([i]) * n, props(f"m{i}"), mandatory=True)
            conn.close()

        recs = self.assertSame(drive, lambda: self.admin().queue_purge(q))
        self.assertEqual([r["body_size"] for r in recs if r["type"] == "publish"],
                         [MIB, 3 * MIB + 17, 131072 - 8, 131072])

    def test_10b_interleaved_confirm_channels(self):
        q = self.declare_queue("q")
        n = 200

        def drive(port):
            conn = self.connect_to(port)
            chans = [conn.channel()._impl, conn.channel()._impl]
            acks = {c.channel_number: [] for c in chans}
            for c in chans:
                c.confirm_delivery(lambda f, k=c.channel_number: acks[k].append(f.method))
            conn.process_data_events(0.5)
            for i in range(n):
                for c in chans:
                    mid = f"c{c.channel_number}-{i}"
                    c.basic_publish("", q, mid.encode() * (1 + i % 7), props(mid), mandatory=True)
            for _ in range(400):
                if all(v and max(m.delivery_tag for m in v) == n for v in acks.values()):
                    break
                conn.process_data_events(0.05)
            conn.close()

        recs = self.assertSame(drive, lambda: self.admin().queue_purge(q))
        self.assertEqual(sum(1 for r in recs if r["type"] == "publish" and r["confirm"] == "ack"), 2 * n)

    def test_10c_10d_transactions_and_clean_close(self):
        q = self.declare_queue("q")
        absent = self.name("absent")

        def drive(port):
            conn = self.connect_to(port)
            ch = conn.channel()
            returns = []
            ch.add_on_return_callback(lambda _c, _m, p, _b: returns.append(p.message_id))
            ch.tx_select()
            ch.basic_publish("", q, b"a", props("m0"), mandatory=True)
            ch.basic_publish("", absent, b"b", props("m1"), mandatory=True)
            ch.basic_publish("", q, b"c", props("m2"), mandatory=False)
            ch.tx_commit()
            while not returns:
                conn.process_data_events(0.1)
            ch.close()
            ch = conn.channel()
            ch.basic_publish("", q, b"a", props("plain"), mandatory=True)
            ch.close()
            conn.close()

        recs = self.assertSame(drive, lambda: self.admin().queue_purge(q))
        self.assertEqual({r["message_id"]: r["route"] for r in recs if r["type"] == "publish"},
                         {"m0": "routed", "m1": "returned", "m2": "unproven", "plain": "unproven"})

    # ---- rabbitmq-c ----

    def run_client(self, args):
        r = subprocess.run(args, capture_output=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout.decode() + r.stderr.decode())

    def test_rabbitmqc_confirm_roundtrip(self):
        client = os.path.join(CLIENTS_DIR, "confirm_roundtrip")
        self.assertTrue(os.access(client, os.X_OK), f"{client} not built")
        q = self.name("rmqc")
        self.addCleanup(self._delete, "queue", q)
        recs = self.assertSame(lambda port: self.run_client([client, "127.0.0.1", str(port), q, "2000", "100"]))
        pubs = [r for r in recs if r["type"] == "publish"]
        self.assertEqual(len(pubs), 2000)
        self.assertEqual({(r["route"], r["confirm"]) for r in pubs}, {("routed", "ack")})

    def test_rabbitmqc_stream_publisher_returns(self):
        client = os.path.join(CLIENTS_DIR, "stream_publisher")
        self.assertTrue(os.access(client, os.X_OK), f"{client} not built")
        absent = self.name("absent")
        recs = self.assertSame(lambda port: self.run_client([client, "127.0.0.1", str(port), "500", "64", "100", "1",
                                                             absent, ""]))
        pubs = [r for r in recs if r["type"] == "publish"]
        self.assertEqual(len(pubs), 500)
        self.assertEqual({(r["route"], r["confirm"]) for r in pubs}, {("returned", "ack")})


if __name__ == "__main__":
    main()
