# --fault: each action against two real client libraries (pika, Go's amqp091-go) through the tap to the real
# broker. Each test asserts that the library reports the fault as it would the real thing (pika's NackError, a
# confirm that never comes, a late confirm, a lost connection; Go's NotifyPublish nack, missing confirms,
# NotifyClose), that the broker stayed consistent (the queue holds exactly the publishes the records say were
# routed), and that the records name the fault (a `fault` record per act, client_saw and fault on the publish).
#
# The Go client is tests/clients/faults/faults.go, built with Debian's golang-github-rabbitmq-amqp091-go-dev
# (GO111MODULE=off GOPATH=/usr/share/gocode) as tests/clients/matrix is.

import json
import os
import shutil
import subprocess
import time
import uuid

import pika
import pika.exceptions

from tapharness import BROKER_HOST, BROKER_PORT, CLIENTS_DIR, SOURCE_DIR, TapTestCase, main, require_broker

GO_SRC = os.path.join(SOURCE_DIR, "tests", "clients", "faults")


def build_go_client():
    out = os.path.join(CLIENTS_DIR, "faults_go")
    src = os.path.join(GO_SRC, "faults.go")
    if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(src):
        return out
    os.makedirs(CLIENTS_DIR, exist_ok=True)
    env = dict(os.environ, GO111MODULE="off", GOPATH="/usr/share/gocode")
    env.setdefault("GOCACHE", os.path.join(CLIENTS_DIR, ".gocache"))
    subprocess.run(["go", "build", "-o", out, src], check=True, env=env, cwd=GO_SRC)
    return out


class ConfirmTimeout(Exception):
    """A confirm did not come in time (raised from a pika timer inside the blocking publish)."""


def broker():
    return pika.BlockingConnection(pika.ConnectionParameters(BROKER_HOST, BROKER_PORT))


class FaultTest(TapTestCase):
    @classmethod
    def setUpClass(cls):
        cls.go_client = build_go_client() if shutil.which("go") else None

    def setUp(self):
        super().setUp()
        require_broker(self)
        self.queue = "fault-" + uuid.uuid4().hex[:10]
        with broker() as c:
            c.channel().queue_declare(self.queue)

    def tearDown(self):
        with broker() as c:
            c.channel().queue_delete(self.queue)
        super().tearDown()

    def tap(self, *rules):
        args = []
        for r in rules:
            args += ["--fault", r]
        return self.start_tap(args, frames=False)

    def pika_channel(self, tap):
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tap.port))
        ch = c.channel()
        ch.confirm_delivery()
        return c, ch

    def go(self, tap, n, wait_ms, env=None):
        if not self.go_client:
            self.skipTest("no go toolchain (golang-go)")
        out = subprocess.run([self.go_client, f"amqp://guest:guest@127.0.0.1:{tap.port}/", self.queue, str(n),
                              str(wait_ms)], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout)

    def depth(self):
        with broker() as c:
            return c.channel().queue_declare(self.queue, passive=True).method.message_count

    def settle(self, tap):
        """Stops the tap (every record written) and returns the publish and fault records; asserts the broker's
        queue holds exactly the publishes whose records say routed, and that every publish has one record."""
        tap.stop()
        pubs = [r for r in tap.records("publish") if r["routing_key"] == self.queue]
        faults = tap.records("fault")
        seqs = [(r["conn"], r["channel"], r["seq"]) for r in pubs]
        self.assertEqual(len(seqs), len(set(seqs)), "one record per publish")
        routed = sum(1 for r in pubs if r["route"] == "routed")
        self.assertEqual(self.depth(), routed, f"the queue against the records: {pubs}")
        return pubs, faults

    def faulted(self, pubs, action_saw):
        return sorted(r["seq"] for r in pubs if r.get("client_saw") == action_saw)


class Nack(FaultTest):
    RULE = "nack:every=3"

    def test_pika_nack_error(self):
        tap = self.tap(self.RULE)
        c, ch = self.pika_channel(tap)
        nacked = []
        for i in range(1, 10):
            try:
                ch.basic_publish("", self.queue, b"m%d" % i, mandatory=True)
            except pika.exceptions.NackError:
                nacked.append(i)
        c.close()
        self.assertEqual(nacked, [3, 6, 9])
        pubs, faults = self.settle(tap)
        self.assertEqual(len(pubs), 9)
        self.assertEqual(self.depth(), 9, "the broker took every one: the nacks were the tap's")
        self.assertEqual(self.faulted(pubs, "nack"), [3, 6, 9])
        for r in pubs:
            self.assertEqual((r["route"], r["confirm"]), ("routed", "ack"), "the broker's verdict is kept")
            if r["seq"] in (3, 6, 9):
                self.assertEqual(r["fault"], 1)
        self.assertEqual(sorted((f["action"], f["seq"], f["rule"]) for f in faults),
                         [("nack", 3, 1), ("nack", 6, 1), ("nack", 9, 1)])

    def test_go_notify_publish_nack(self):
        tap = self.tap(self.RULE)
        res = self.go(tap, 20, 5000)
        self.assertEqual(res["nacks"], [3, 6, 9, 12, 15, 18])
        self.assertEqual(len(res["acks"]), 14)
        self.assertEqual(res["missing"], [])
        pubs, faults = self.settle(tap)
        self.assertEqual(self.depth(), 20)
        self.assertEqual(self.faulted(pubs, "nack"), [3, 6, 9, 12, 15, 18])
        self.assertEqual(len([f for f in faults if f["action"] == "nack"]), 6)


class Withhold(FaultTest):
    RULE = "withhold-confirms:after=2,times=1"

    def test_pika_confirm_never_comes(self):
        # pika's asynchronous connection: its confirm callback hears of every tag but the withheld one (the
        # blocking connection would wait for it for ever: the "unknown outcome" a publisher must time out of)
        tap = self.tap(self.RULE)
        seen = {}
        state = {}

        def on_open(conn):
            conn.channel(on_open_callback=on_channel)

        def on_channel(ch):
            state["ch"] = ch
            ch.confirm_delivery(on_confirm, callback=lambda _frame: publish(ch))

        def on_confirm(frame):
            m = frame.method
            seen[m.delivery_tag] = type(m).__name__
            if m.multiple:
                for t in range(1, m.delivery_tag):
                    seen.setdefault(t, "multiple")

        def publish(ch):
            for i in range(1, 6):
                ch.basic_publish("", self.queue, b"w%d" % i, mandatory=True)
            state["conn"].ioloop.call_later(1.5, state["conn"].close)

        conn = pika.SelectConnection(pika.ConnectionParameters("127.0.0.1", tap.port), on_open_callback=on_open,
                                     on_close_callback=lambda c, e: c.ioloop.stop())
        state["conn"] = conn
        conn.ioloop.call_later(20, conn.ioloop.stop)
        conn.ioloop.start()
        self.assertEqual(sorted(seen), [1, 2, 4, 5], f"pika heard of: {seen}")
        self.assertLessEqual(set(seen.values()), {"Ack", "multiple"})
        pubs, faults = self.settle(tap)
        self.assertEqual(self.depth(), 5, "the broker routed the one whose confirm was withheld")
        self.assertEqual(self.faulted(pubs, "none"), [3])
        self.assertEqual([(f["action"], f["seq"]) for f in faults], [("withhold-confirms", 3)])
        r3 = [r for r in pubs if r["seq"] == 3][0]
        self.assertEqual(r3["confirm"], "ack", "the broker did confirm it")

    def test_go_missing_confirm(self):
        tap = self.tap(self.RULE)
        res = self.go(tap, 10, 1500)
        # amqp091-go hands confirms to NotifyPublish in publish order: the withheld 3 holds back the 4 to 10 the
        # tap did pass on (one at a time: a multiple ack would have confirmed 3 in the library too)
        self.assertEqual(res["acks"], [1, 2])
        self.assertEqual(res["missing"], [3, 4, 5, 6, 7, 8, 9, 10])
        pubs, faults = self.settle(tap)
        self.assertEqual(self.depth(), 10)
        self.assertEqual(self.faulted(pubs, "none"), [3])
        self.assertEqual(len(pubs), 10)


class Delay(FaultTest):
    RULE = "delay-confirms:ms=400,every=2,times=2"

    def test_pika_late_confirm(self):
        tap = self.tap(self.RULE)
        c, ch = self.pika_channel(tap)
        took = []
        for i in range(1, 5):
            t0 = time.monotonic()
            ch.basic_publish("", self.queue, b"d%d" % i, mandatory=True)
            took.append(time.monotonic() - t0)
        c.close()
        self.assertGreaterEqual(took[1], 0.39)
        self.assertGreaterEqual(took[3], 0.39)
        self.assertLess(took[0], 0.3)
        self.assertLess(took[2], 0.3)
        pubs, faults = self.settle(tap)
        self.assertEqual(self.depth(), 4)
        self.assertEqual(sorted(r["seq"] for r in pubs if r.get("fault") == 1), [2, 4])
        self.assertEqual([(f["action"], f["ms"]) for f in faults], [("delay-confirms", 400)] * 2)
        for r in pubs:
            self.assertLess(r["confirm_us"], 300000, "the records keep when the broker confirmed")

    def test_go_late_confirm_in_order(self):
        tap = self.tap(self.RULE)
        res = self.go(tap, 6, 5000)
        self.assertEqual(res["missing"], [])
        self.assertEqual(res["acks"], [1, 2, 3, 4, 5, 6], "in order")
        self.assertGreaterEqual(res["confirm_ms"]["2"], 399)
        pubs, faults = self.settle(tap)
        self.assertEqual(self.depth(), 6)
        self.assertEqual(len(faults), 2)


class Kill(FaultTest):
    def test_pika_connection_lost(self):
        tap = self.tap("kill:after=3")
        c, ch = self.pika_channel(tap)
        for i in range(1, 4):
            ch.basic_publish("", self.queue, b"k%d" % i, mandatory=True)
        with self.assertRaises(pika.exceptions.AMQPConnectionError):
            ch.basic_publish("", self.queue, b"k4", mandatory=True)
        pubs, faults = self.settle(tap)
        self.assertEqual(self.depth(), 4, "the 4th reached the broker before the connection ended")
        self.assertEqual([(f["action"], f["seq"], f["outstanding"]) for f in faults], [("kill", 4, 1)])
        r4 = [r for r in pubs if r["seq"] == 4][0]
        self.assertEqual((r4["route"], r4["confirm"], r4.get("client_saw")), ("routed", "ack", "none"))
        closes = tap.records("connection")
        self.assertIn("tap_fault", json.dumps(closes))

    def test_pika_close_mode(self):
        tap = self.tap("kill:mode=close,after=1")
        c, ch = self.pika_channel(tap)
        ch.basic_publish("", self.queue, b"k1", mandatory=True)
        with self.assertRaises(pika.exceptions.ConnectionClosedByBroker) as cm:
            ch.basic_publish("", self.queue, b"k2", mandatory=True)
        self.assertEqual(cm.exception.reply_code, 320)
        pubs, faults = self.settle(tap)
        self.assertEqual(self.depth(), 2)
        self.assertEqual([f["action"] for f in faults], ["kill"])

    def test_go_notify_close(self):
        tap = self.tap("kill:after=5")
        res = self.go(tap, 50, 3000)
        self.assertNotEqual(res["closed"], "", res)
        self.assertIn(6, res["missing"], "the kill's publish got no confirm")
        pubs, faults = self.settle(tap)
        self.assertEqual([(f["action"], f["seq"]) for f in faults], [("kill", 6)])
        self.assertGreaterEqual(self.depth(), 6)


class Block(FaultTest):
    RULE = "block:seconds=2,after=2,times=1"

    def test_pika_blocked_callbacks(self):
        tap = self.tap(self.RULE)
        c, ch = self.pika_channel(tap)
        events = []
        c.add_on_connection_blocked_callback(lambda _c, frame: events.append(("blocked", time.monotonic())))
        c.add_on_connection_unblocked_callback(lambda _c, frame: events.append(("unblocked", time.monotonic())))
        took = []
        for i in range(1, 6):
            t0 = time.monotonic()
            ch.basic_publish("", self.queue, b"b%d" % i, mandatory=True)
            took.append(time.monotonic() - t0)
        c.process_data_events(time_limit=0.2)
        c.close()
        self.assertEqual([e for e, _ in events], ["blocked", "unblocked"])
        # (BlockingConnection runs both callbacks when it next dispatches: their times say nothing)
        self.assertGreaterEqual(took[3], 1.5, "the 4th publish was not read until the block was over")
        self.assertLess(took[2], 1.0)
        pubs, faults = self.settle(tap)
        self.assertEqual(self.depth(), 5)
        self.assertEqual([(f["action"], f["seq"], f["ms"]) for f in faults], [("block", 3, 2000)])

    def test_go_notify_blocked(self):
        tap = self.tap(self.RULE)
        res = self.go(tap, 6, 8000)
        self.assertEqual(res["blocked"], ["true amqptap fault injection", "false"])
        self.assertEqual(res["acks"], [1, 2, 3, 4, 5, 6])
        self.assertGreaterEqual(res["confirm_ms"]["4"], 1900)
        self.assertLess(res["confirm_ms"]["3"], 1000)
        pubs, faults = self.settle(tap)
        self.assertEqual(self.depth(), 6)
        self.assertEqual([f["action"] for f in faults], ["block"])


class StallHeartbeats(FaultTest):
    RULE = "stall-heartbeats:client=127.0.0.1"

    def test_pika_heartbeat_timeout(self):
        tap = self.tap(self.RULE)
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tap.port, heartbeat=2))
        t0 = time.monotonic()
        with self.assertRaises(pika.exceptions.AMQPConnectionError) as cm:
            while time.monotonic() - t0 < 45:
                c.process_data_events(time_limit=0.5)
        self.assertIn("heartbeat", repr(cm.exception).lower())
        self.assertLess(time.monotonic() - t0, 40)
        pubs, faults = self.settle(tap)
        self.assertEqual([(f["action"], f["channel"], f["seq"]) for f in faults], [("stall-heartbeats", 0, None)])

    def test_go_missed_heartbeats(self):
        tap = self.tap(self.RULE)
        t0 = time.monotonic()
        res = self.go(tap, 0, 20000, env={"FAULTS_HEARTBEAT": "2"})
        self.assertNotEqual(res["closed"], "", "amqp091-go noticed the broker went silent")
        self.assertLess(time.monotonic() - t0, 19)
        pubs, faults = self.settle(tap)
        self.assertEqual([f["action"] for f in faults], ["stall-heartbeats"])

    def test_other_clients_unharmed(self):
        tap = self.tap("stall-heartbeats:client=10.1.2.3")
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tap.port, heartbeat=1))
        t0 = time.monotonic()
        while time.monotonic() - t0 < 4:
            c.process_data_events(time_limit=0.5)
        self.assertTrue(c.is_open)
        c.close()
        pubs, faults = self.settle(tap)
        self.assertEqual(faults, [])


if __name__ == "__main__":
    main()
