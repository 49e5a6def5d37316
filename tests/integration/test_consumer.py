# The consumer side (src/DESIGN.md §4, `delivery` and `consumer` records) against the real broker: messages are
# published straight to the broker, real consumers (pika, amqp091-go, node amqplib) take them through the tap, and
# every delivery the client received has exactly one `delivery` record saying how the client settled it: acks
# single and multiple, nack and reject with and without requeue, auto-ack, basic.get, a channel closed with
# deliveries unacked (each unknown, and the next delivery of the message redelivered), a consumer the broker
# cancels because its queue was deleted; and one case under `sniff -i lo`. The consumer warnings: a consumer that
# never acks (consumer_stalled), a reject-requeue loop (requeue_loop), manual acks without basic.qos
# (unbounded_prefetch), global QoS (global_qos), and a broker of its own with a 3 s consumer_timeout closing the
# channel 406: unacked_near_timeout first, then the close record naming the delivery.

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid

import pika
import pika.exceptions

from scenario_lib import params
from tapharness import (BROKER_PORT, CLIENTS_DIR, SOURCE_DIR, TapTestCase, chromium, free_port, http_get, main,
                        read_records, replay, require_broker, wait_for, without_identity)

CONSUMER_SRC = os.path.join(SOURCE_DIR, "tests", "clients", "consumer")


def settle_pattern(i, n, pending):
    """How the clients of this test settle their i-th delivery of n (the Go and node clients do the same):
    (outcome, multiple), or None to leave it for the next multiple ack."""
    if i % 10 == 3:
        return ("reject", False)
    if i % 10 == 6:
        return ("nack", False)
    if i % 5 == 4 or i == n - 1:
        return ("ack", i % 5 == 4 or pending > 0)
    return None


def publish_direct(queue, ids, **declare):
    """Publishes one message per id straight to the broker (not through the tap) on a confirm channel."""
    with pika.BlockingConnection(params(BROKER_PORT)) as c:
        ch = c.channel()
        ch.queue_declare(queue, **declare)
        ch.confirm_delivery()
        for mid in ids:
            ch.basic_publish("", queue, b"body of " + mid.encode(), pika.BasicProperties(message_id=mid))


def build_go_consumer():
    out = os.path.join(CLIENTS_DIR, "consumer_go")
    src = os.path.join(CONSUMER_SRC, "consumer.go")
    if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(src):
        return out
    os.makedirs(CLIENTS_DIR, exist_ok=True)
    env = dict(os.environ, GO111MODULE="off", GOPATH="/usr/share/gocode")
    env.setdefault("GOCACHE", os.path.join(CLIENTS_DIR, ".gocache"))
    subprocess.run(["go", "build", "-o", out, src], check=True, env=env, cwd=CONSUMER_SRC)
    return out


def install_node_consumer():
    """consumer.js beside the client matrix's node client, whose amqplib (from its lock file) it uses."""
    from test_client_matrix import install_node_client
    dest = os.path.dirname(install_node_client())
    shutil.copyfile(os.path.join(CONSUMER_SRC, "consumer.js"), os.path.join(dest, "consumer.js"))
    return os.path.join(dest, "consumer.js")


class ConsumerTest(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)
        self.queue = f"amqptap-it-consume-{uuid.uuid4().hex[:8]}"

    def tearDown(self):
        try:
            with pika.BlockingConnection(params(BROKER_PORT)) as c:
                c.channel().queue_delete(self.queue)
        finally:
            super().tearDown()

    def ids(self, n, prefix="m"):
        return [f"{self.queue}-{prefix}{i}" for i in range(n)]

    def finish(self, tap):
        self.assertTrue(tap.alive())
        self.assertEqual(tap.stop(), 0, tap.stderr())
        return tap.records()

    def deliveries(self, recs):
        return [r for r in recs if r["type"] == "delivery"]

    def by_tag(self, recs, channel=1):
        """{delivery_tag: record} of a channel, failing on a tag written twice."""
        out = {}
        for r in self.deliveries(recs):
            if r["channel"] != channel:
                continue
            self.assertNotIn(r["delivery_tag"], out, f"two records for tag {r['delivery_tag']}: {r}")
            out[r["delivery_tag"]] = r
        return out

    def check_pattern(self, got, recs, n):
        """got: the client's [(message_id, tag, outcome, multiple)]: one record per delivery, saying the same."""
        self.assertEqual(len(got), n, "the client took every message")
        records = self.by_tag(recs)
        self.assertEqual(len(self.deliveries(recs)), n, "one delivery record per delivery")
        for mid, tag, outcome, multiple in got:
            r = records[tag]
            self.assertEqual((r["message_id"], r["outcome"], r["multiple"]), (mid, outcome, multiple), r)
            self.assertEqual(r["queue"], self.queue, r)
            self.assertFalse(r["redelivered"], r)
            self.assertGreaterEqual(r["settle_us"], 0, r)
            if outcome in ("nack", "reject"):
                self.assertIs(r["requeue"], False, r)
        consumers = [r for r in recs if r["type"] == "consumer"]
        self.assertEqual([k["event"] for k in consumers], ["consume", "cancel"], consumers)
        self.assertEqual(consumers[0]["prefetch"], 10)
        self.assertEqual(consumers[1]["deliveries"], n)

    # ---- pika ----

    def pika_pattern(self, port, n):
        got = []
        with pika.BlockingConnection(params(port)) as c:
            ch = c.channel()
            ch.basic_qos(prefetch_count=10)
            pending = []
            for i, (method, props, _body) in enumerate(ch.consume(self.queue)):
                tag = method.delivery_tag
                how = settle_pattern(i, n, len(pending))
                if how is None:
                    pending.append((props.message_id, tag))
                else:
                    outcome, multiple = how
                    if outcome == "reject":
                        ch.basic_reject(tag, requeue=False)
                    elif outcome == "nack":
                        ch.basic_nack(tag, multiple=False, requeue=False)
                    else:
                        ch.basic_ack(tag, multiple=multiple)
                        if multiple:
                            got += [(m, t, "ack", True) for m, t in pending]
                            pending = []
                    got.append((props.message_id, tag, outcome, multiple))
                if i == n - 1:
                    break
            ch.cancel()
        return got

    def test_pika_acks_single_multiple_nack_reject(self):
        n = 50
        publish_direct(self.queue, self.ids(n))
        tap = self.start_tap()
        got = self.pika_pattern(tap.port, n)
        self.check_pattern(got, self.finish(tap), n)

    def test_pika_single_acks_and_requeue(self):
        n = 6
        publish_direct(self.queue, self.ids(n))
        tap = self.start_tap()
        seen = []
        with pika.BlockingConnection(params(tap.port)) as c:
            ch = c.channel()
            ch.basic_qos(prefetch_count=1)
            for method, props, _ in ch.consume(self.queue):
                seen.append((props.message_id, method.delivery_tag, method.redelivered))
                if props.message_id.endswith("m0") and not method.redelivered:
                    ch.basic_reject(method.delivery_tag, requeue=True)
                elif props.message_id.endswith("m1") and not method.redelivered:
                    ch.basic_nack(method.delivery_tag, requeue=True)
                else:
                    ch.basic_ack(method.delivery_tag)
                if len([s for s in seen if not (s[0].endswith(("m0", "m1")) and not s[2])]) == n:
                    break
            ch.cancel()
        recs = self.finish(tap)
        records = self.by_tag(recs)
        self.assertEqual(len(self.deliveries(recs)), len(seen), "one record per delivery")
        self.assertEqual(len(seen), n + 2)
        for mid, tag, redelivered in seen:
            r = records[tag]
            self.assertEqual((r["message_id"], r["redelivered"]), (mid, redelivered), r)
            if mid.endswith(("m0", "m1")) and not redelivered:
                self.assertEqual((r["outcome"], r["requeue"]), ("reject" if mid.endswith("m0") else "nack", True))
            else:
                self.assertEqual((r["outcome"], r["multiple"]), ("ack", False), r)

    def test_pika_auto_ack(self):
        n = 20
        publish_direct(self.queue, self.ids(n))
        tap = self.start_tap()
        got = []
        with pika.BlockingConnection(params(tap.port)) as c:
            ch = c.channel()
            for method, props, _ in ch.consume(self.queue, auto_ack=True):
                got.append((props.message_id, method.delivery_tag))
                if len(got) == n:
                    break
            ch.cancel()
        recs = self.finish(tap)
        records = self.by_tag(recs)
        self.assertEqual(len(self.deliveries(recs)), n)
        for mid, tag in got:
            self.assertEqual((records[tag]["message_id"], records[tag]["outcome"]), (mid, "auto_ack"))
            self.assertNotIn("settle_us", records[tag])
        consume = [r for r in recs if r["type"] == "consumer"][0]
        self.assertTrue(consume["no_ack"])

    def test_pika_basic_get(self):
        publish_direct(self.queue, self.ids(3))
        tap = self.start_tap()
        with pika.BlockingConnection(params(tap.port)) as c:
            ch = c.channel()
            m1, p1, _ = ch.basic_get(self.queue)
            m2, p2, _ = ch.basic_get(self.queue, auto_ack=True)
            m3, p3, _ = ch.basic_get(self.queue)
            ch.basic_ack(m3.delivery_tag, multiple=True)  # settles m1 too
            empty = ch.basic_get(self.queue)
            self.assertEqual(empty, (None, None, None))
        recs = self.finish(tap)
        records = self.by_tag(recs)
        self.assertEqual(len(self.deliveries(recs)), 3)
        for m, p, outcome, multiple in ((m1, p1, "ack", True), (m3, p3, "ack", True), (m2, p2, "auto_ack", None)):
            r = records[m.delivery_tag]
            self.assertEqual((r["message_id"], r["outcome"], r.get("multiple"), r["get"], r["queue"]),
                             (p.message_id, outcome, multiple, True, self.queue), r)
            self.assertIsNone(r["consumer_tag"])

    def test_pika_channel_closed_with_unacked(self):
        n = 5
        publish_direct(self.queue, self.ids(n))
        tap = self.start_tap()
        first, second = [], []
        with pika.BlockingConnection(params(tap.port)) as c:
            ch = c.channel()
            ch.basic_qos(prefetch_count=n)
            for method, props, _ in ch.consume(self.queue):
                first.append((props.message_id, method.delivery_tag, method.redelivered))
                if len(first) == n:
                    break
            ch.close()  # none acked: the broker requeues them
            ch2 = c.channel()
            for method, props, _ in ch2.consume(self.queue):
                second.append((props.message_id, method.delivery_tag, method.redelivered))
                ch2.basic_ack(method.delivery_tag)
                if len(second) == n:
                    break
            ch2.cancel()
        recs = self.finish(tap)
        dels = self.deliveries(recs)
        self.assertEqual(len(dels), 2 * n, "one record per delivery")
        # pika opens the channel number again: the records of the closed channel are written at its close
        closed = {r["delivery_tag"]: r for r in dels[:n]}
        reopened = {r["delivery_tag"]: r for r in dels[n:]}
        for mid, tag, redelivered in first:
            r = closed[tag]
            self.assertFalse(redelivered)
            self.assertEqual((r["message_id"], r["outcome"]), (mid, "unknown"), r)
            self.assertEqual(r["reason"]["by"], "channel_closed", r)
            self.assertEqual(r["reason"]["peer"], "client", r)
        self.assertEqual(sorted(m for m, _, _ in second), sorted(m for m, _, _ in first))
        for mid, tag, redelivered in second:
            r = reopened[tag]
            self.assertTrue(redelivered)
            self.assertEqual((r["message_id"], r["outcome"], r["redelivered"]), (mid, "ack", True), r)
        cancels = [r for r in recs if r["type"] == "consumer" and r["event"] == "cancel"]
        # pika cancels its consumers before it closes the channel
        self.assertEqual([k["by"] for k in cancels], ["client", "client"], cancels)

    def test_pika_broker_cancel_by_queue_deletion(self):
        publish_direct(self.queue, self.ids(2))
        tap = self.start_tap()
        cancelled = []
        with pika.BlockingConnection(params(tap.port)) as c:
            ch = c.channel()
            got = []
            ch.basic_consume(self.queue, lambda ch_, m, p, b: got.append(m.delivery_tag))
            ch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
            self.assertTrue(wait_for(lambda: (c.process_data_events(0.05), len(got) == 2)[1], 10))
            with pika.BlockingConnection(params(BROKER_PORT)) as other:
                other.channel().queue_delete(self.queue)
            self.assertTrue(wait_for(lambda: (c.process_data_events(0.05), bool(cancelled))[1], 10))
            ch.basic_ack(got[-1], multiple=True)  # after the cancel: the deliveries stay the channel's
            c.process_data_events(0.1)
        recs = self.finish(tap)
        cancel = [r for r in recs if r["type"] == "consumer" and r["event"] == "cancel"]
        self.assertEqual(len(cancel), 1, cancel)
        self.assertEqual((cancel[0]["by"], cancel[0]["queue"], cancel[0]["deliveries"]), ("broker", self.queue, 2))
        self.assertEqual([r["outcome"] for r in self.deliveries(recs)], ["ack", "ack"])

    def test_connection_killed_with_unacked(self):
        n = 4
        publish_direct(self.queue, self.ids(n))
        tap = self.start_tap()
        c = pika.BlockingConnection(params(tap.port))
        ch = c.channel()
        got = []
        for method, _props, _ in ch.consume(self.queue):
            got.append(method.delivery_tag)
            if len(got) == n:
                break
        c._impl._transport._sock.close()  # the client dies: no close methods
        self.assertTrue(wait_for(lambda: len(tap.records("delivery")) == n, 10), tap.records())
        recs = self.finish(tap)
        for r in self.deliveries(recs):
            self.assertEqual((r["outcome"], r["reason"]["by"]), ("unknown", "connection_closed"), r)
        self.assertEqual([r["type"] for r in recs if r["type"] in ("delivery", "consumer", "connection")][-1],
                         "connection", "the deliveries come before the connection's close record")

    # ---- warnings ----

    def warnings(self, recs, rule):
        return [r for r in recs if r["type"] == "warning" and r["rule"] == rule]

    def test_consumer_that_never_acks_is_stalled(self):
        publish_direct(self.queue, self.ids(10))
        tap = self.start_tap(["--stall-after", "1"])
        with pika.BlockingConnection(params(tap.port)) as c:
            ch = c.channel()
            ch.basic_qos(prefetch_count=5)
            got = []
            ch.basic_consume(self.queue, lambda ch_, m, p, b: got.append(m.delivery_tag))
            self.assertTrue(wait_for(lambda: (c.process_data_events(0.05), len(got) == 5)[1], 10))
            ok = wait_for(lambda: (c.process_data_events(0.05),
                                   bool(self.warnings(tap.records(), "consumer_stalled")))[1], 5)
            self.assertTrue(ok, tap.records())
            self.assertEqual(len(got), 5, "the broker keeps to the prefetch")
        recs = self.finish(tap)
        w = self.warnings(recs, "consumer_stalled")
        self.assertEqual(len(w), 1, w)
        self.assertEqual((w[0]["channel"], w[0]["unacked"], w[0]["delivery_tag"], w[0]["queue"]),
                         (1, 5, 1, self.queue), w[0])
        self.assertGreaterEqual(w[0]["stalled_us"], 1000000)
        self.assertEqual(self.warnings(recs, "unbounded_prefetch"), [])
        dels = self.deliveries(recs)
        self.assertEqual(len(dels), 5)
        self.assertEqual({r["outcome"] for r in dels}, {"unknown"})

    def test_reject_requeue_loop(self):
        publish_direct(self.queue, [f"{self.queue}-poison"])
        tap = self.start_tap()
        n = 0
        with pika.BlockingConnection(params(tap.port)) as c:
            ch = c.channel()
            ch.basic_qos(prefetch_count=1)
            for method, props, _ in ch.consume(self.queue):
                n += 1
                self.assertEqual(method.redelivered, n > 1)
                if n < 30:
                    ch.basic_reject(method.delivery_tag, requeue=True)
                else:
                    ch.basic_ack(method.delivery_tag)
                    break
            ch.cancel()
        recs = self.finish(tap)
        dels = self.deliveries(recs)
        self.assertEqual(len(dels), n, "one record per delivery")
        self.assertEqual([r["outcome"] for r in dels], ["reject"] * 29 + ["ack"])
        self.assertTrue(all(r["requeue"] for r in dels[:29]))
        self.assertEqual(sum(r["redelivered"] for r in dels), 29)
        w = self.warnings(recs, "requeue_loop")
        self.assertEqual(len(w), 1, w)
        self.assertEqual((w[0]["message_id"], w[0]["redeliveries"]), (f"{self.queue}-poison", 20), w[0])
        self.assertEqual(w[0]["delivery_tag"], 21)

    def test_unbounded_prefetch_and_global_qos(self):
        publish_direct(self.queue, self.ids(2))
        tap = self.start_tap()
        with pika.BlockingConnection(params(tap.port)) as c:
            ch = c.channel()
            for method, _p, _ in ch.consume(self.queue):  # manual acks, no basic.qos
                ch.basic_ack(method.delivery_tag)
                break
            ch.cancel()
            ch2 = c.channel()
            ch2.basic_qos(prefetch_count=7, global_qos=True)
        recs = self.finish(tap)
        w = self.warnings(recs, "unbounded_prefetch")
        self.assertEqual(len(w), 1, w)
        self.assertEqual(w[0]["queue"], self.queue)
        g = self.warnings(recs, "global_qos")
        self.assertEqual(len(g), 1, g)
        self.assertEqual((g[0]["channel"], g[0]["prefetch"]), (2, 7))

    # ---- publish -> delivery ----

    def test_fan_out_to_three_queues_links_every_delivery(self):
        x = f"{self.queue}-fan"
        queues = [f"{self.queue}-{i}" for i in range(3)]
        n = 5
        tap = self.start_tap()
        with pika.BlockingConnection(params(tap.port)) as c:
            ch = c.channel()
            ch.exchange_declare(x, "fanout", auto_delete=True)
            for q in queues:
                ch.queue_declare(q)
                ch.queue_bind(q, x)
            got = []
            tags = [ch.basic_consume(q, lambda ch_, m, p, b: (got.append(p.message_id), ch_.basic_ack(m.delivery_tag)))
                    for q in queues]
            pub = c.channel()
            pub.confirm_delivery()
            for i in range(n):
                pub.basic_publish(x, "", b"fan", pika.BasicProperties(message_id=f"{x}-{i}"))
            self.assertTrue(wait_for(lambda: (c.process_data_events(0.05), len(got) == 3 * n)[1], 10))
            # the first queue's first message once more: redelivered after a recover, linked again
            ch.basic_cancel(tags[0])
            ch2 = c.channel()
            redo = []
            ch2.basic_consume(queues[0], lambda ch_, m, p, b: redo.append((m.delivery_tag, m.redelivered)))
            pub.basic_publish(x, "", b"again", pika.BasicProperties(message_id=f"{x}-again"))
            self.assertTrue(wait_for(lambda: (c.process_data_events(0.05), len(redo) == 1 and len(got) == 3 * n + 2)[1],
                                     10))
            ch2.basic_recover(requeue=True)
            self.assertTrue(wait_for(lambda: (c.process_data_events(0.05), len(redo) == 2)[1], 10))
            ch2.basic_ack(redo[1][0])
            c.process_data_events(0.1)
            for q in queues:
                pub.queue_delete(q)
        recs = self.finish(tap)
        dels = self.deliveries(recs)
        self.assertEqual(len(dels), 3 * n + 3 + 1, "one record per delivery")
        fan = [r for r in dels if r["message_id"].startswith(f"{x}-") and not r["message_id"].endswith("again")]
        self.assertEqual(len(fan), 3 * n)
        for i in range(n):
            mine = [r for r in fan if r["message_id"] == f"{x}-{i}"]
            self.assertEqual(sorted(r["queue"] for r in mine), queues)
            for r in mine:
                self.assertGreater(r["queue_us"], 0, r)
                self.assertGreaterEqual(r["end_to_end_us"], r["queue_us"] + r["settle_us"] - 1, r)
        again = [r for r in dels if r["message_id"] == f"{x}-again" and r["channel"] == 3]
        self.assertEqual([r["redelivered"] for r in again], [False, True], again)
        self.assertEqual([r["outcome"] for r in again], ["unknown", "ack"], again)
        self.assertLess(again[0]["queue_us"], again[1]["queue_us"], "both linked to the one publish")

    # ---- metrics ----

    def test_metrics(self):
        n = 10
        publish_direct(self.queue, self.ids(n))
        mport = free_port()
        tap = self.start_tap(["--metrics", str(mport)])

        def scrape():
            status, _headers, body = http_get(mport, "/metrics")
            self.assertEqual(status, 200)
            out = {}
            for line in body.decode().splitlines():
                if line and not line.startswith("#"):
                    name, value = line.rsplit(" ", 1)
                    out[name] = float(value)
            return out
        with pika.BlockingConnection(params(tap.port)) as c:
            ch = c.channel()
            ch.basic_qos(prefetch_count=n)
            tags = []
            for method, _p, _ in ch.consume(self.queue):
                tags.append(method.delivery_tag)
                if len(tags) == n:
                    break
            time.sleep(1.1)  # a page is rendered at most once a second
            m = scrape()
            self.assertEqual(m["amqptap_deliveries_total"], n)
            self.assertEqual(m["amqptap_deliveries_unacked"], n)
            self.assertEqual(m["amqptap_consumers_open"], 1)
            ch.basic_ack(tags[3], multiple=True)
            ch.basic_reject(tags[4], requeue=True)
            c.process_data_events(0.2)
            time.sleep(1.1)
            m = scrape()
            self.assertEqual(m["amqptap_deliveries_unacked"], n - 5 + 1)  # the rejected one came back
            self.assertEqual(m['amqptap_delivery_outcomes_total{outcome="ack"}'], 4)
            self.assertEqual(m['amqptap_delivery_outcomes_total{outcome="reject"}'], 1)
            self.assertEqual(m[f'amqptap_queue_deliveries_total{{queue="{self.queue}",outcome="ack"}}'], 4)
            self.assertEqual(m[f'amqptap_queue_deliveries_total{{queue="{self.queue}",outcome="reject"}}'], 1)
            self.assertEqual(m['amqptap_queue_deliveries_total{queue="(other)",outcome="ack"}'], 0)
            self.assertEqual(m["amqptap_requeues_total"], 1)
            self.assertEqual(m["amqptap_redeliveries_total"], 1)
            self.assertEqual(m["amqptap_settle_latency_seconds_count"], 5)
            self.assertEqual(m['amqptap_warnings_total{rule="consumer_stalled"}'], 0)
            self.assertEqual(m["amqptap_queue_time_seconds_count"], 0)  # published around the tap: no link
            ch.basic_publish("", self.queue, b"linked", pika.BasicProperties(message_id="via-the-tap"))
            for _ in range(10):  # until the page rendered after the delivery
                c.process_data_events(0.3)
                time.sleep(0.5)
                m = scrape()
                if m["amqptap_queue_time_seconds_count"]:
                    break
            self.assertGreaterEqual(m["amqptap_queue_time_seconds_count"], 1)
            self.assertGreater(m["amqptap_queue_time_seconds_sum"], 0)
            _status, _headers, body = http_get(mport, "/metrics")
            if os.path.exists("/usr/bin/promtool"):  # the families added here lint as the rest (test_metrics)
                lint = subprocess.run(["/usr/bin/promtool", "check", "metrics"], input=body, capture_output=True,
                                      timeout=30)
                self.assertEqual(lint.returncode, 0, lint.stdout + lint.stderr)
            ch.cancel()
        recs = self.finish(tap)
        linked = [r for r in self.deliveries(recs) if r["message_id"] == "via-the-tap"]
        self.assertGreaterEqual(len(linked), 1)  # and pika's cancel may requeue it: a redelivery links too
        self.assertTrue(all(r["queue_us"] > 0 for r in linked), linked)

    def test_status_page_lists_consumers(self):
        # a consumer that never acks (prefetch 5) and one that acks everything, on two channels: /api/status and the
        # status page, rendered by Chromium, list both with their unacked deliveries, the stuck one first
        stuck_q, busy_q = self.queue, self.queue + "-busy"
        publish_direct(stuck_q, self.ids(8))
        publish_direct(busy_q, self.ids(4, "b"))
        self.addCleanup(lambda: pika.BlockingConnection(params(BROKER_PORT)).channel().queue_delete(busy_q))
        mport = free_port()
        tap = self.start_tap(["--metrics", str(mport)])
        with pika.BlockingConnection(params(tap.port)) as c:
            stuck, busy = c.channel(), c.channel()
            stuck.basic_qos(prefetch_count=5)
            busy.basic_qos(prefetch_count=3)
            got = []
            stuck.basic_consume(stuck_q, lambda ch_, m, p, b: got.append(m.delivery_tag), consumer_tag="stuck-one")
            busy.basic_consume(busy_q, lambda ch_, m, p, b: (got.append(m.delivery_tag), ch_.basic_ack(m.delivery_tag)),
                               consumer_tag="busy-one")
            self.assertTrue(wait_for(lambda: (c.process_data_events(0.05), len(got) == 9)[1], 10), got)
            c.process_data_events(0.3)
            time.sleep(1.1)  # a page is rendered at most once a second
            _status, _headers, body = http_get(mport, "/api/status")
            cons = json.loads(body)["consumers"]
            rows = {r["tag"]: r for r in cons["rows"]}
            self.assertEqual(cons["total"], 2, cons)
            self.assertEqual((rows["stuck-one"]["queue"], rows["stuck-one"]["prefetch"], rows["stuck-one"]["deliveries"],
                              rows["stuck-one"]["unacked"], rows["stuck-one"]["no_ack"]), (stuck_q, 5, 5, 5, False))
            self.assertGreater(rows["stuck-one"]["oldest_unacked_age_seconds"], 1.0)
            self.assertEqual((rows["busy-one"]["deliveries"], rows["busy-one"]["unacked"]), (4, 0))
            self.assertNotIn("oldest_unacked", rows["busy-one"])
            run = chromium(self, f"http://127.0.0.1:{mport}/", "--dump-dom")
            self.assertEqual(run.returncode, 0, run.stderr.decode()[-2000:])
            dom = run.stdout.decode("utf-8", "replace")
            table = re.search(r'<table id="consumers">(.*?)</table>', dom, re.S)
            self.assertIsNotNone(table, dom[:3000])
            cells = [[re.sub(r"<[^>]+>", "", td) for td in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
                     for tr in re.findall(r'<tr class="consumer[^"]*"[^>]*>(.*?)</tr>', table.group(1), re.S)]
            self.assertEqual([r[:7] for r in cells],
                             [["conn 1 · ch 1", "stuck-one", stuck_q, "manual", "5", "5", "5"],
                              ["conn 1 · ch 2", "busy-one", busy_q, "manual", "3", "4", "0"]], cells)
            self.assertRegex(cells[0][7], r"^0m [0-9]+s$")
        self.finish(tap)

    def test_fingerprint_links_without_message_ids(self):
        # publishes without message ids through the tap, each body in several frames (frame_max 4096), to a queue
        # a consumer on the same connection takes them from: each delivery is linked to its publish by their
        # fingerprint (queue_us); with --identity off nothing links them
        for identity, linked in (("auto", True), ("off", False)):
            with self.subTest(identity=identity):
                publish_direct(self.queue, [])
                tap = self.start_tap(["--identity", identity])
                with pika.BlockingConnection(params(tap.port, frame_max=4096)) as c:
                    cons, pub = c.channel(), c.channel()
                    cons.basic_qos(prefetch_count=10)
                    got = []
                    cons.basic_consume(self.queue, lambda ch_, m, p, b: (got.append(b), ch_.basic_ack(m.delivery_tag)))
                    pub.confirm_delivery()
                    bodies = [bytes([65 + i]) * (10000 + i) for i in range(5)]
                    for b in bodies:
                        pub.basic_publish("", self.queue, b, pika.BasicProperties(content_type="application/octet-stream"))
                    self.assertTrue(wait_for(lambda: (c.process_data_events(0.05), len(got) == 5)[1], 10))
                    c.process_data_events(0.2)
                self.assertEqual(sorted(got), sorted(bodies))
                dels = self.deliveries(self.finish(tap))
                self.assertEqual([(d["message_id"], d["outcome"]) for d in dels], [(None, "ack")] * 5)
                if linked:
                    self.assertTrue(all(d["queue_us"] > 0 for d in dels), dels)
                else:
                    self.assertEqual([d for d in dels if "queue_us" in d], [])

    # ---- other libraries ----

    def run_client(self, argv, n):
        publish_direct(self.queue, self.ids(n))
        tap = self.start_tap()
        proc = subprocess.run(argv(f"amqp://guest:guest@127.0.0.1:{tap.port}/") + [self.queue, str(n)],
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        got = [json.loads(line) for line in proc.stdout.splitlines()]
        got = [(g["message_id"], g["tag"], g["outcome"], g["multiple"]) for g in got]
        self.check_pattern(got, self.finish(tap), n)

    def test_go_amqp091(self):
        go = build_go_consumer()
        self.run_client(lambda url: [go, url], 50)

    def test_node_amqplib(self):
        js = install_node_consumer()
        self.run_client(lambda url: ["node", js, url], 50)

    # ---- replay ----

    def test_replay_of_the_pcap_gives_the_same_records(self):
        n = 30
        publish_direct(self.queue, self.ids(n))
        d = tempfile.mkdtemp(prefix="amqptap-consume-")
        self.addCleanup(shutil.rmtree, d)
        cap = os.path.join(d, "live.pcapng")
        tap = self.start_tap(["--pcap", cap], frames=False)
        self.pika_pattern(tap.port, n)
        live = [r for r in self.finish(tap) if r["type"] in ("delivery", "consumer", "warning")]
        out = os.path.join(d, "replay.jsonl")
        r = replay(cap, BROKER_PORT, verdicts=out)
        self.assertEqual(r.returncode, 0, r.stderr())
        rep = [x for x in read_records(out) if x["type"] in ("delivery", "consumer", "warning")]
        self.assertEqual(len([x for x in rep if x["type"] == "delivery"]), n)
        self.assertEqual(without_identity(self, live), rep, "live and replay records differ")

    # ---- sniff ----

    def test_sniff_pika_consumer(self):
        n = 30
        publish_direct(self.queue, self.ids(n))
        sniff = self.start_sniff()
        time.sleep(0.3)
        got = self.pika_pattern(BROKER_PORT, n)
        ok = wait_for(lambda: len([r for r in sniff.records("delivery") if r["queue"] == self.queue]) == n, 10)
        self.assertTrue(ok, sniff.records())
        recs = [r for r in self.finish(sniff) if r.get("conn") in
                {r["conn"] for r in sniff.records("delivery") if r["queue"] == self.queue}]
        self.check_pattern(got, recs, n)


class ConsumerTimeoutTest(TapTestCase):
    """A broker of its own with consumer_timeout 3 s (scripts/broker.sh, TAP_BROKER_CONSUMER_TIMEOUT_MS)."""

    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        cls.env = dict(os.environ, TAP_BROKER_PORT=str(cls.port), TAP_BROKER_DIST_PORT=str(free_port()),
                       TAP_BROKER_DIR=os.path.join(SOURCE_DIR, ".run", f"consumer-timeout-{cls.port}"),
                       TAP_BROKER_CONSUMER_TIMEOUT_MS="3000")
        cls.env.pop("TAP_BROKER_MGMT_PORT", None)  # the shared broker's management port is taken
        cls.broker = os.path.join(SOURCE_DIR, "scripts", "broker.sh")
        subprocess.run([cls.broker, "start"], check=True, env=cls.env, timeout=180, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL)

    @classmethod
    def tearDownClass(cls):
        subprocess.run([cls.broker, "stop"], env=cls.env, timeout=120, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(cls.env["TAP_BROKER_DIR"], ignore_errors=True)

    def test_consumer_timeout_closes_the_channel_406(self):
        queue = f"amqptap-it-timeout-{uuid.uuid4().hex[:8]}"
        with pika.BlockingConnection(params(self.port)) as c:
            ch = c.channel()
            ch.queue_declare(queue, auto_delete=False)
            ch.basic_publish("", queue, b"slow", pika.BasicProperties(message_id="held-too-long"))
        tap = self.start_tap(["--consumer-timeout", "3000"], upstream_port=self.port)
        closed = []
        with pika.BlockingConnection(params(tap.port)) as c:
            ch = c.channel()
            ch.basic_qos(prefetch_count=1)
            got = []
            ch.basic_consume(queue, lambda ch_, m, p, b: got.append(m.delivery_tag))

            def pump():
                try:
                    c.process_data_events(0.1)
                except pika.exceptions.ChannelClosedByBroker as e:
                    closed.append(e.reply_code)
                return bool(closed) or ch.is_closed
            self.assertTrue(wait_for(pump, 90), "no 406 close")
            self.assertEqual(got, [1])
            c.channel().queue_delete(queue)
        self.assertEqual(tap.stop(), 0, tap.stderr())
        recs = tap.records()
        w = [r for r in recs if r["type"] == "warning" and r["rule"] == "unacked_near_timeout"]
        self.assertEqual(len(w), 1, recs)
        self.assertEqual((w[0]["delivery_tag"], w[0]["message_id"]), (1, "held-too-long"))
        self.assertGreaterEqual(w[0]["unacked_us"], 2400000)
        close = [r for r in recs if r["type"] == "channel" and r["event"] == "close" and r["by"] == "broker"]
        self.assertEqual(len(close), 1, recs)
        self.assertEqual((close[0]["by"], close[0]["code"]), ("broker", 406), close[0])
        named = close[0]["timed_out_delivery"]
        self.assertEqual((named["delivery_tag"], named["message_id"], named["queue"]), (1, "held-too-long", queue))
        self.assertGreater(close[0]["ts"], w[0]["ts"], "the warning came first")
        dels = [r for r in recs if r["type"] == "delivery"]
        self.assertEqual(len(dels), 1)
        self.assertEqual((dels[0]["outcome"], dels[0]["reason"]["by"], dels[0]["reason"]["code"]),
                         ("unknown", "channel_closed", 406))


if __name__ == "__main__":
    main()
