# The publisher warnings of src/DESIGN.md §4 against the real broker: pika clients do each anti-pattern through the tap
# and its rule fires (once per channel, channel_churn once per connection); a well-behaved confirm publisher
# (persistent, message ids, pipelined, mandatory, one channel) gets none. And a publish made while the broker has
# the connection blocked (memory alarm) says "blocked":true in its record; the others say nothing.

import time
import uuid

import pika

from scenario_lib import broker_sh, params, pipelined, text_props
from tapharness import BROKER_PORT, TapTestCase, main, require_broker

NEW_RULES = ("transient_in_confirm_mode", "missing_message_id", "publish_and_wait", "channel_churn",
             "duplicate_message_id")


def client_params(port):
    return params(port, connection_attempts=1, socket_timeout=10)


class WarningsTest(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)
        self.queue = f"amqptap-it-warn-{uuid.uuid4().hex[:8]}"
        with pika.BlockingConnection(client_params(BROKER_PORT)) as c:
            c.channel().queue_declare(self.queue, durable=True)
        self.tap = self.start_tap(upstream_port=BROKER_PORT)

    def tearDown(self):
        try:
            with pika.BlockingConnection(client_params(BROKER_PORT)) as c:
                c.channel().queue_delete(self.queue)
        finally:
            super().tearDown()

    def finish(self):
        self.assertTrue(self.tap.alive())
        self.assertEqual(self.tap.stop(), 0)
        return self.tap.records()

    def warnings(self, recs, rule):
        return [r for r in recs if r["type"] == "warning" and r["rule"] == rule]

    def uid(self, i):
        return f"{self.queue}-{i}"

    def test_well_behaved_publisher_gets_no_warning(self):
        n = 500
        msgs = [(text_props(self.uid(i)), b"x" * 32) for i in range(n)]
        self.assertEqual(pipelined(client_params(self.tap.port), self.queue, msgs, mandatory=True), n)
        recs = self.finish()
        self.assertEqual(len([r for r in recs if r["type"] == "publish" and r["confirm"] == "ack"]), n)
        self.assertEqual([r for r in recs if r["type"] == "warning"], [])

    def test_transient_missing_id_and_duplicate_fire_once_per_channel(self):
        msgs = [(text_props(self.uid(i)), b"ok") for i in range(20)]
        msgs += [(text_props(self.uid(100 + i), delivery_mode=1), b"transient") for i in range(5)]
        msgs += [(text_props(None), b"no id") for _ in range(5)]
        msgs += [(text_props(self.uid(3)), b"again"), (text_props(self.uid(4)), b"again")]
        self.assertEqual(pipelined(client_params(self.tap.port), self.queue, msgs, mandatory=True), len(msgs))
        recs = self.finish()
        for rule, seq in (("transient_in_confirm_mode", 21), ("missing_message_id", 26),
                          ("duplicate_message_id", 31)):
            w = self.warnings(recs, rule)
            self.assertEqual(len(w), 1, rule)
            self.assertEqual((w[0]["channel"], w[0]["seq"]), (1, seq), rule)
        dup = self.warnings(recs, "duplicate_message_id")[0]  # it names the id and where it was published first
        self.assertEqual((dup["message_id"], dup["first"]),
                         (self.uid(3), {"conn": dup["conn"], "channel": 1, "seq": 4}))
        self.assertEqual(self.warnings(recs, "publish_and_wait"), [])
        self.assertEqual(self.warnings(recs, "channel_churn"), [])

    def test_publish_and_wait(self):
        with pika.BlockingConnection(client_params(self.tap.port)) as c:
            ch = c.channel()
            ch.confirm_delivery()
            for i in range(40):  # each basic_publish returns once the broker acked it
                ch.basic_publish("", self.queue, b"one at a time", text_props(self.uid(i)), mandatory=True)
        recs = self.finish()
        w = self.warnings(recs, "publish_and_wait")
        self.assertEqual(len(w), 1)
        # the 10th publish in a row sent after the ack of the one before (later if the machine stalled pika > 10 ms)
        self.assertGreaterEqual(w[0]["seq"], 11)
        for rule in NEW_RULES:
            if rule != "publish_and_wait":
                self.assertEqual(self.warnings(recs, rule), [], rule)

    def test_channel_churn(self):
        with pika.BlockingConnection(client_params(self.tap.port)) as c:
            for i in range(15):
                ch = c.channel()
                ch.basic_publish("", self.queue, b"a channel each", text_props(self.uid(i)))
                ch.close()
        recs = self.finish()
        w = self.warnings(recs, "channel_churn")
        self.assertEqual(len(w), 1)  # once per connection
        closes = [r for r in recs if r["type"] == "channel" and r["event"] == "close"]
        self.assertEqual(w[0]["channel"], closes[9]["channel"])  # at the tenth
        for rule in NEW_RULES:
            if rule != "channel_churn":
                self.assertEqual(self.warnings(recs, rule), [], rule)

    def test_publish_while_blocked_is_annotated(self):
        seen = {}

        def until(c, what, timeout):
            end = time.monotonic() + timeout
            while what not in seen and time.monotonic() < end:
                c.process_data_events(0.05)
            return what in seen

        try:
            with pika.BlockingConnection(client_params(self.tap.port)) as c:
                c.add_on_connection_blocked_callback(lambda *_a: seen.setdefault("blocked", True))
                c.add_on_connection_unblocked_callback(lambda *_a: seen.setdefault("unblocked", True))
                ch = c.channel()
                ch.basic_publish("", self.queue, b"before", text_props("b-1"))
                broker_sh("ctl", "set_vm_memory_high_watermark", "0")
                ch.basic_publish("", self.queue, b"trigger", text_props("b-2"))
                self.assertTrue(until(c, "blocked", 20), "the broker never blocked the connection")
                for i in range(3, 7):
                    ch.basic_publish("", self.queue, b"while blocked", text_props(f"b-{i}"))
                c.process_data_events(0.2)
                broker_sh("ctl", "set_vm_memory_high_watermark", "0.4")
                self.assertTrue(until(c, "unblocked", 30), "the broker never unblocked the connection")
                ch.basic_publish("", self.queue, b"after", text_props("b-7"))
        finally:
            broker_sh("ctl", "set_vm_memory_high_watermark", "0.4")
        recs = self.finish()
        pubs = {r["message_id"]: r for r in recs if r["type"] == "publish"}
        self.assertEqual(sorted(pubs), [f"b-{i}" for i in range(1, 8)])
        for i in range(3, 7):
            self.assertIs(pubs[f"b-{i}"].get("blocked"), True, pubs[f"b-{i}"])
        for i in (1, 7):
            self.assertNotIn("blocked", pubs[f"b-{i}"])


if __name__ == "__main__":
    main()
