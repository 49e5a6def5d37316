# Per-publish verdicts against the real broker (DESIGN §7 scenarios 1-7 and 10, plus shutdown): pika publishes
# through the tap, and every test checks the invariant — one `publish` record per basic.publish, matched by the
# message_id each publish carries — and the route / confirm / reply_code / order the broker's answer implies.

import json
import signal
import struct
import time

import pika
import pika.exceptions

from tapharness import main
from scenario_lib import RawClient, ScenarioCase, frame_lines, publish_records, traced_publishes

MIB = 1024 * 1024


def props(mid, **kw):
    return pika.BasicProperties(message_id=mid, **kw)


class ReturnsWithoutConfirm(ScenarioCase):
    def test_1_mandatory_unroutable_is_returned(self):
        tap = self.start_tap()
        x = self.declare_exchange("x", "direct")
        conn = self.connect(tap)
        ch = conn.channel()
        returns = []
        ch.add_on_return_callback(lambda _c, m, p, b: returns.append((m, p, b)))
        body = b"payload \x00\xff \xe2\x82\xac"
        p = props("m1", correlation_id="c1", delivery_mode=2, content_type="text/plain", headers={"h": "v"})
        ch.basic_publish(x, "nomatch", body, p, mandatory=True)
        while not returns:
            conn.process_data_events(0.1)
        m, rp, rb = returns[0]
        self.assertEqual((m.reply_code, m.reply_text, m.exchange, m.routing_key), (312, "NO_ROUTE", x, "nomatch"))
        self.assertEqual((rp.message_id, rp.correlation_id, rp.delivery_mode, rp.content_type, rp.headers),
                         ("m1", "c1", 2, "text/plain", {"h": "v"}))
        self.assertEqual(rb, body)
        conn.close()
        recs = self.stop_tap(tap)
        self.assertOnePerPublish(recs, ["m1"])
        self.assertRecord(recs[0], route="returned", reply_code=312, reply_text="NO_ROUTE", confirm="none", seq=None,
                          exchange=x, routing_key="nomatch", mandatory=True, message_id="m1", correlation_id="c1",
                          delivery_mode=2, body_size=len(body), order=None)

    def test_2_thousand_returns_in_publish_order(self):
        tap = self.start_tap()
        conn = self.connect(tap)
        ch = conn.channel()
        returns = []
        ch.add_on_return_callback(lambda _c, _m, p, _b: returns.append(p.message_id))
        q = self.name("absent")
        mids = [f"m{i}" for i in range(1000)]
        for i, mid in enumerate(mids):
            ch.basic_publish("", q, b"x" * (i % 50), props(mid), mandatory=True)
        while len(returns) < 1000:
            conn.process_data_events(0.2)
        self.assertEqual(returns, mids)
        conn.close()
        recs = self.stop_tap(tap)
        self.assertOnePerPublish(recs, mids)
        self.assertEqual([r["message_id"] for r in recs], mids, "records are not in publish order")
        for i, r in enumerate(recs):
            self.assertRecord(r, route="returned", reply_code=312, confirm="none", seq=None, body_size=i % 50)


class ConfirmAndMandatory(ScenarioCase):
    def test_3_exchange_types(self):
        tap = self.start_tap()
        d = self.declare_exchange("direct", "direct")
        f = self.declare_exchange("fanout", "fanout")
        t = self.declare_exchange("topic", "topic")
        h = self.declare_exchange("headers", "headers")
        q = self.declare_queue("q")
        a = self.admin()
        a.queue_bind(q, d, "k")
        a.queue_bind(q, t, "a.*")
        a.queue_bind(q, h, arguments={"x-match": "all", "h": "1"})
        cases = [  # (exchange, routing key, headers, expected route)
            (d, "k", None, "routed"), (d, "other", None, "returned"), (f, "any", None, "returned"),
            (t, "a.b", None, "routed"), (t, "a.b.c", None, "returned"), (h, "", {"h": "1"}, "routed"),
            (h, "", {"h": "2"}, "returned"),
        ]
        conn = self.connect(tap)
        ch = conn.channel()
        ch.confirm_delivery()
        pika_returned = []
        for i, (x, rk, hdrs, _want) in enumerate(cases):
            try:
                ch.basic_publish(x, rk, b"body", props(f"m{i}", headers=hdrs), mandatory=True)
            except pika.exceptions.UnroutableError:
                pika_returned.append(i)
        self.assertEqual(pika_returned, [i for i, c in enumerate(cases) if c[3] == "returned"])
        with self.assertRaises(pika.exceptions.ChannelClosedByBroker) as cm:
            ch.basic_publish(self.name("nope"), "k", b"body", props("missing"), mandatory=True)
        self.assertEqual(cm.exception.reply_code, 404)
        conn.close()
        recs = self.stop_tap(tap)
        self.assertOnePerPublish(recs, [f"m{i}" for i in range(len(cases))] + ["missing"])
        by_mid = {r["message_id"]: r for r in recs}
        for i, (x, rk, _h, want) in enumerate(cases):
            r = by_mid[f"m{i}"]
            if want == "routed":
                self.assertRecord(r, seq=i + 1, exchange=x, routing_key=rk, route="routed", confirm="ack", order=None)
            else:
                self.assertRecord(r, seq=i + 1, exchange=x, routing_key=rk, route="returned", reply_code=312,
                                  reply_text="NO_ROUTE", confirm="ack", order="return_before_ack")
        r = by_mid["missing"]
        self.assertRecord(r, seq=len(cases) + 1, route="unknown", confirm="unknown")
        self.assertEqual(r["reason"]["by"], "broker", r)
        self.assertEqual(r["reason"]["code"], 404, r)
        self.assertTrue(r["reason"]["text"].startswith("NOT_FOUND - no exchange"), r)

    def test_4_alternate_exchange(self):
        tap = self.start_tap()
        ae = self.declare_exchange("ae", "fanout")
        aeq = self.declare_queue("aeq")
        self.admin().queue_bind(aeq, ae)
        x = self.declare_exchange("x", "direct", arguments={"alternate-exchange": ae})
        q = self.declare_queue("q")
        self.admin().queue_bind(q, x, "r")
        ae_empty = self.declare_exchange("ae-empty", "fanout")
        x2 = self.declare_exchange("x2", "direct", arguments={"alternate-exchange": ae_empty})
        conn = self.connect(tap)
        ch = conn.channel()
        ch.confirm_delivery()
        keys = ["r", "nope1", "r", "nope2", "nope3"]
        for i, rk in enumerate(keys):
            ch.basic_publish(x, rk, b"b", props(f"m{i}"), mandatory=True)  # raises if returned
        with self.assertRaises(pika.exceptions.UnroutableError):
            ch.basic_publish(x2, "nope", b"b", props("m-ae-empty"), mandatory=True)
        conn.close()
        self.assertEqual(self.admin().queue_declare(aeq, passive=True).method.message_count, 3)
        recs = self.stop_tap(tap)
        self.assertOnePerPublish(recs, [f"m{i}" for i in range(5)] + ["m-ae-empty"])
        by_mid = {r["message_id"]: r for r in recs}
        for i in range(5):
            self.assertRecord(by_mid[f"m{i}"], seq=i + 1, route="routed", confirm="ack", order=None)
        self.assertRecord(by_mid["m-ae-empty"], seq=6, route="returned", reply_code=312, confirm="ack",
                          order="return_before_ack")

    def test_5_topic_words(self):
        tap = self.start_tap()
        bindings = ["sensor.#", "sensor.*.temp", "sensor.floor1.#", "sensor.*"]
        keys = ["sensor.floor1.temperature.critical", "sensor.floor1.temp", "sensor.floor2.temp", "sensor.floor1",
                "sensor.x", "sensor", "other.floor1.temp"]
        # which key each binding takes (RabbitMQ topic matching: * one word, # zero or more words)
        takes = {
            "sensor.#": {"sensor.floor1.temperature.critical", "sensor.floor1.temp", "sensor.floor2.temp",
                         "sensor.floor1", "sensor.x", "sensor"},
            "sensor.*.temp": {"sensor.floor1.temp", "sensor.floor2.temp"},
            "sensor.floor1.#": {"sensor.floor1.temperature.critical", "sensor.floor1.temp", "sensor.floor1"},
            "sensor.*": {"sensor.floor1", "sensor.x"},
        }
        exchanges, queues = {}, {}
        for i, b in enumerate(bindings):
            exchanges[b] = self.declare_exchange(f"t{i}", "topic")
            queues[b] = self.declare_queue(f"q{i}")
            self.admin().queue_bind(queues[b], exchanges[b], b)
        conn = self.connect(tap)
        ch = conn.channel()
        ch.confirm_delivery()
        expect = {}
        for b in bindings:
            for k in keys:
                mid = f"{b}|{k}"
                expect[mid] = (exchanges[b], k, "routed" if k in takes[b] else "returned")
                try:
                    ch.basic_publish(exchanges[b], k, b"t", props(mid), mandatory=True)
                except pika.exceptions.UnroutableError:
                    pass
        conn.close()
        for b in bindings:
            self.assertEqual(self.admin().queue_declare(queues[b], passive=True).method.message_count, len(takes[b]),
                             f"broker routing for {b} is not what the test expects")
        recs = self.stop_tap(tap)
        self.assertOnePerPublish(recs, list(expect))
        by_mid = {r["message_id"]: r for r in recs}
        for mid, (x, k, route) in expect.items():
            self.assertRecord(by_mid[mid], exchange=x, routing_key=k, route=route, confirm="ack",
                              order="return_before_ack" if route == "returned" else None)
        self.assertEqual(by_mid["sensor.*|sensor.floor1.temperature.critical"]["route"], "returned")

    def test_6_confirm_without_mandatory(self):
        tap = self.start_tap()
        conn = self.connect(tap)
        ch = conn.channel()
        ch.confirm_delivery()
        q = self.name("absent")
        for i in range(3):
            ch.basic_publish("", q, b"b", props(f"m{i}"), mandatory=False)
        ch_no = ch.channel_number
        conn.close()
        recs = self.stop_tap(tap)
        self.assertOnePerPublish(recs, ["m0", "m1", "m2"])
        for i, r in enumerate(recs):
            self.assertRecord(r, seq=i + 1, route="unproven", confirm="ack", mandatory=False, order=None)
        warns = [w for w in tap.records("warning") if w.get("rule") == "confirm_without_mandatory"]
        self.assertEqual(len(warns), 1, warns)
        self.assertEqual(warns[0]["channel"], ch_no)

    def test_7_nack_on_reject_publish(self):
        tap = self.start_tap()
        q = self.declare_queue("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        conn = self.connect(tap)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", q, b"first", props("m0"), mandatory=True)
        for i in range(1, 4):
            with self.assertRaises(pika.exceptions.NackError):
                ch.basic_publish("", q, b"next", props(f"m{i}"), mandatory=True)
        conn.close()
        recs = self.stop_tap(tap)
        self.assertOnePerPublish(recs, [f"m{i}" for i in range(4)])
        by_mid = {r["message_id"]: r for r in recs}
        self.assertRecord(by_mid["m0"], seq=1, route="routed", confirm="ack")
        for i in range(1, 4):
            r = by_mid[f"m{i}"]
            self.assertRecord(r, seq=i + 1, confirm="nack", order=None)
            self.assertNotEqual(r["route"], "routed", f"a nacked publish is not proven routed: {r}")
            self.assertNotEqual(r["route"], "returned", r)


    def test_8_returns_without_message_ids_are_never_guessed(self):
        """A headers exchange on a confirm channel, 40 mandatory publishes pipelined without message ids, every
        other one matching the binding: same exchange, routing key and size, so a Return names no one publish.
        No record may contradict what the broker did (read back from the queue); a publish the tap cannot place
        is unknown with reason ambiguous_return, and an ambiguous_return warning names the candidates."""
        x = self.declare_exchange("h", "headers")
        q = self.declare_queue("q")
        self.admin().queue_bind(q, x, "", arguments={"x-match": "all", "k": "v"})
        tap = self.start_tap()
        rc = RawClient(tap.port)
        rc.open_confirm_channel(1)
        n = 40
        for i in range(n):
            entries = b"".join(rc.short(k) + b"S" + rc.long(v.encode())
                               for k, v in (("k", "v" if i % 2 == 0 else "w"), ("n", f"{i:02d}")))
            rc.method(1, 60, 40, struct.pack(">H", 0) + rc.short(x) + rc.short("") + b"\x01")
            rc.frame(2, 1, struct.pack(">HHQH", 60, 0, 4, 0x2000) + rc.long(entries))
            rc.frame(3, 1, b"body")
        acked = 0
        while acked < n:
            ftype, ch, payload = rc.read_frame()
            if ftype == 1 and payload[:4] == struct.pack(">HH", 60, 80):
                acked = max(acked, struct.unpack(">Q", payload[4:12])[0])
        rc.method(0, 10, 50, struct.pack(">H", 200) + rc.short("") + struct.pack(">HH", 0, 0))
        rc.expect(0, 10, 51)
        rc.close()
        routed = set()
        admin = self.admin()
        while True:
            m, props, _ = admin.basic_get(q, auto_ack=True)
            if m is None:
                break
            routed.add(props.headers["n"])
        self.assertEqual(routed, {f"{i:02d}" for i in range(0, n, 2)})
        recs = self.stop_tap(tap)
        self.assertSeqsOnce(recs, n)
        wrong = [(r["seq"], r["route"]) for r in recs
                 if r["route"] in ("routed", "returned") and (r["route"] == "routed") != (f"{r['seq'] - 1:02d}" in routed)]
        self.assertEqual(wrong, [], "records contradicting the broker")
        unknown = [r for r in recs if r["route"] == "unknown"]
        self.assertTrue(all(r["reason"] == {"by": "ambiguous_return"} and r["confirm"] == "ack" for r in unknown),
                        json.dumps(unknown[:3]))
        warnings = [json.loads(line) for line in open(tap.verdicts)]
        ambiguous = [w for w in warnings if w.get("type") == "warning" and w.get("rule") == "ambiguous_return"]
        self.assertEqual(bool(unknown), bool(ambiguous))
        for w in ambiguous:
            self.assertGreaterEqual(w["candidates"], 2)
            self.assertEqual((w["exchange"], w["routing_key"], w["reply_code"]), (x, "", 312))

class LargeInterleavedTx(ScenarioCase):
    def test_10a_large_message_many_body_frames(self):
        tap = self.start_tap()
        q = self.declare_queue("big")
        conn = self.connect(tap, frame_max=131072)
        ch = conn.channel()
        ch.confirm_delivery()
        sizes = [MIB, 3 * MIB + 17, 131072 - 8, 131072]
        for i, n in enumerate(sizes):
            ch.basic_publish("", q, bytes([i]) * n, props(f"m{i}"), mandatory=True)
        conn.close()
        recs = self.stop_tap(tap)
        self.assertOnePerPublish(recs, [f"m{i}" for i in range(len(sizes))])
        by_mid = {r["message_id"]: r for r in recs}
        for i, n in enumerate(sizes):
            self.assertRecord(by_mid[f"m{i}"], seq=i + 1, body_size=n, route="routed", confirm="ack")
        bodies = [f for f in frame_lines(tap.frames) if f.get("dir") == "c2s" and f.get("frame") == "body"]
        self.assertGreaterEqual(len(bodies), MIB // 131072, "1 MiB did not go out as many body frames")
        self.assertEqual(sum(f["size"] for f in bodies), sum(sizes))

    def test_10b_interleaved_confirm_channels(self):
        tap = self.start_tap()
        q = self.declare_queue("q")
        conn = self.connect(tap)
        # pika's BlockingChannel waits for each confirm; its underlying Channel keeps publishes in flight on both
        # channels at once, so their frames and confirms interleave on the wire.
        chans = [conn.channel()._impl, conn.channel()._impl]
        acks = {c.channel_number: [] for c in chans}
        for c in chans:
            c.confirm_delivery(lambda f, n=c.channel_number: acks[n].append(f.method))
        conn.process_data_events(0.5)
        n = 200
        mids = []
        for i in range(n):
            for c in chans:
                mid = f"c{c.channel_number}-{i}"
                mids.append(mid)
                c.basic_publish("", q, mid.encode() * (1 + i % 7), props(mid), mandatory=True)
        def all_acked():
            return all(v and max(m.delivery_tag for m in v) == n for v in acks.values())

        for _ in range(400):
            if all_acked():
                break
            conn.process_data_events(0.05)
        self.assertTrue(all_acked(), {k: len(v) for k, v in acks.items()})
        conn.close()
        recs = self.stop_tap(tap)
        self.assertOnePerPublish(recs, mids)
        pubs = traced_publishes(frame_lines(tap.frames))
        self.assertGreater(sum(1 for a, b in zip(pubs, pubs[1:]) if a[1] != b[1]), n, "channels did not alternate")
        for c in chans:
            mine = [r for r in recs if r["channel"] == c.channel_number]
            self.assertSeqsOnce(mine, n)
            for r in mine:
                i = int(r["message_id"].split("-")[1])
                self.assertRecord(r, seq=i + 1, route="routed", confirm="ack",
                                  body_size=len(r["message_id"]) * (1 + i % 7))

    def test_10c_transactional_channel(self):
        tap = self.start_tap(["--return-window", "300"])
        q = self.declare_queue("q")
        conn = self.connect(tap)
        ch = conn.channel()
        returns = []
        ch.add_on_return_callback(lambda _c, _m, p, _b: returns.append(p.message_id))
        ch.tx_select()
        ch.basic_publish("", q, b"a", props("m0"), mandatory=True)
        ch.basic_publish("", self.name("absent"), b"b", props("m1"), mandatory=True)
        ch.basic_publish("", q, b"c", props("m2"), mandatory=False)
        ch.tx_commit()
        while not returns:
            conn.process_data_events(0.1)
        self.assertEqual(returns, ["m1"])
        # commit-ok settles the transaction: every verdict is written while the channel is still open
        self.assertTrue(self.wait_records(tap, lambda r: len(r) == 3, 10), publish_records(tap.verdicts))
        # a transaction rolled back, and one never committed (its channel closes): the broker discards both
        ch.basic_publish("", q, b"d", props("m3"), mandatory=True)
        ch.tx_rollback()
        time.sleep(0.5)  # no return window: the rolled-back publish waited for nothing but rollback-ok
        self.assertEqual(len(publish_records(tap.verdicts)), 4)
        ch.basic_publish("", q, b"e", props("m4"), mandatory=True)
        ch.close()
        self.assertEqual(self.admin().queue_declare(q, passive=True).method.message_count, 2)
        conn.close()
        recs = self.stop_tap(tap)
        self.assertOnePerPublish(recs, ["m0", "m1", "m2", "m3", "m4"])
        by_mid = {r["message_id"]: r for r in recs}
        for r in recs:
            self.assertRecord(r, confirm="none", tx=True, seq=None)
        self.assertRecord(by_mid["m0"], route="routed", order=None)
        self.assertRecord(by_mid["m1"], route="returned", reply_code=312, reply_text="NO_ROUTE", order=None)
        self.assertRecord(by_mid["m2"], route="unproven", order=None)
        self.assertRecord(by_mid["m3"], route="unknown", reason={"by": "tx_rollback"})
        self.assertRecord(by_mid["m4"], route="unknown")
        self.assertEqual(by_mid["m4"]["reason"]["by"], "client")  # pika closes with reply code 0

    def test_10d_clean_close_inside_return_window(self):
        """A channel closed normally (close / close-ok) inside the return window: the broker handles a channel's
        methods in order, so a Return would have come before the close-ok; none came, so the mandatory publish was
        not returned. Without confirms that is `unproven` (DESIGN §4), not `unknown` with a close reason."""
        tap = self.start_tap(["--return-window", "60000"])
        q = self.declare_queue("q")
        conn = self.connect(tap)
        ch = conn.channel()
        ch.basic_publish("", q, b"a", props("plain"), mandatory=True)
        ch.close()
        ch = conn.channel()
        ch.tx_select()
        ch.basic_publish("", q, b"a", props("tx"), mandatory=True)
        ch.tx_commit()
        ch.close()
        conn.close()
        recs = self.stop_tap(tap)
        self.assertOnePerPublish(recs, ["plain", "tx"])
        by_mid = {r["message_id"]: r for r in recs}
        self.assertRecord(by_mid["plain"], route="unproven", confirm="none", reason="<absent>")
        self.assertRecord(by_mid["tx"], route="routed", confirm="none", tx=True, reason="<absent>")


class Shutdown(ScenarioCase):
    def test_shutdown_writes_pending(self):
        tap = self.start_tap(["--return-window", "60000"])
        q = self.declare_queue("q")
        conn = self.connect(tap)
        ch = conn.channel()
        returns = []
        ch.add_on_return_callback(lambda _c, _m, p, _b: returns.append(p.message_id))
        for i in range(5):
            ch.basic_publish("", q, b"p", props(f"p{i}"), mandatory=True)
        ch.basic_publish("", self.name("absent"), b"r", props("r0"), mandatory=True)
        while not returns:
            conn.process_data_events(0.1)
        self.wait_records(tap, lambda r: any(x.get("message_id") == "r0" for x in r), 10)
        self.assertEqual([r["message_id"] for r in publish_records(tap.verdicts)], ["r0"],
                         "only the returned publish has its verdict before shutdown")
        rc = tap.stop(signal.SIGTERM)
        self.assertEqual(rc, 0)
        recs = publish_records(tap.verdicts)
        self.assertOnePerPublish(recs, [f"p{i}" for i in range(5)] + ["r0"])
        for r in recs:
            if r["message_id"] == "r0":
                self.assertRecord(r, route="returned", reply_code=312, confirm="none")
            else:
                self.assertRecord(r, route="unknown", confirm="none", reason={"by": "shutdown"}, seq=None)


if __name__ == "__main__":
    main()
