# A publish that makes the broker close its channel (issue 14 §2), with real clients through the tap to the real
# broker: a burst on one plain channel (no confirms, not mandatory) — ok, missing exchange, ok-after — with pika and
# with py-amqp (Debian python3-amqp); and the same burst where the middle publish goes to the queue but carries a
# user_id that is not the login user, or a body over the broker's max_message_size (RabbitMQ's 406s, whose texts name
# no exchange), or the immediate flag (540, a connection.close). Each library reports the 404 channel close; the queue holds only the first
# message (the broker discarded the one after the culprit). The records must say the same: ok unproven with no
# reason, the missing-exchange publish unknown with the broker's 404 and "refused":"culprit", ok-after unknown with
# the same reason and "refused":"after_culprit", and the channel close record names the culprit.

import json
import os
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pika  # noqa: E402

from scenario_lib import broker_sh, params  # noqa: E402
from tapharness import TapTestCase, main, require_broker, wait_for  # noqa: E402

PY_AMQP_BURST = r"""
import json, sys, amqp
port, queue, missing, kind = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
c = amqp.Connection('127.0.0.1:' + port)
c.connect()
ch = c.channel()
out = {}
try:
    # py-amqp reads pending input before each publish: a close that is already in raises there, unsent
    for mid, x, rk in (('ok', '', queue), ('bad', missing, 'k'), ('after', '', queue)):
        out['raised_at'] = mid
        props, immediate = {}, False
        if kind == 'user_id' and mid == 'bad':
            x, rk, props = '', queue, {'user_id': 'not-the-login-user'}
        if kind == 'immediate' and mid == 'bad':
            x, rk, immediate = '', queue, True
        ch.basic_publish(amqp.Message(mid, message_id=mid, **props), exchange=x, routing_key=rk, immediate=immediate)
    out['raised_at'] = None
    c.drain_events(timeout=5)
except amqp.exceptions.AMQPError as e:
    out.update(code=e.reply_code, text=e.reply_text, method=list(e.method_sig or ()))
c.close()
print(json.dumps(out))
"""


class RefusedPublishCase(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)
        self.queue = "refused." + uuid.uuid4().hex[:8]
        self.missing = "refused.missing." + uuid.uuid4().hex[:8]
        self.admin = pika.BlockingConnection(params(int(os.environ.get("TAP_BROKER_PORT", "5672"))))
        self.admin.channel().queue_declare(self.queue)

    def tearDown(self):
        ch = self.admin.channel()
        ch.queue_delete(self.queue)
        self.admin.close()
        super().tearDown()

    def queued(self):
        return self.admin.channel().queue_declare(self.queue, passive=True).method.message_count

    def check(self, tap, reported, sent_after=True, code=404):
        self.assertEqual(reported["code"], code, reported)
        want = ["after", "bad", "ok"] if sent_after else ["bad", "ok"]
        wait_for(lambda: len(tap.records("publish")) >= len(want), 10)
        pubs = {r["message_id"]: r for r in tap.records("publish")}
        self.assertEqual(sorted(pubs), want, pubs)
        ok, bad = pubs["ok"], pubs["bad"]
        self.assertEqual(self.queued(), 1, "the broker took ok and discarded after")
        self.assertEqual((ok["route"], ok["confirm"]), ("unproven", "none"), json.dumps(ok))
        self.assertNotIn("reason", ok)
        self.assertNotIn("refused", ok)
        reason = {"by": "broker", "code": code, "text": reported["text"]}
        for rec, refused in ((bad, "culprit"), (pubs.get("after"), "after_culprit")):
            if rec is None:
                continue
            self.assertEqual((rec["route"], rec["confirm"]), ("unknown", "none"), json.dumps(rec))
            self.assertEqual(rec["reason"], reason, json.dumps(rec))
            self.assertEqual(rec["refused"], refused, json.dumps(rec))
        closes = [r for r in tap.records("channel") if r.get("event") == "close" and r.get("code") == code]
        self.assertEqual(len(closes), 1, tap.records("channel"))
        culprit = closes[0]["culprit"]
        x, rk = (self.missing, "k") if code == 404 else ("", self.queue)
        self.assertEqual(culprit, {"conn": bad["conn"], "channel": bad["channel"], "seq": None, "message_id": "bad",
                                   "exchange": x, "routing_key": rk})

    def closed_by_broker(self, conn, ch):
        """Lets pika read the broker's channel close (and answer close-ok), checks that is what closed ch, and
        closes conn."""
        for _ in range(50):
            if ch.is_closed:
                break
            conn.process_data_events(time_limit=0.1)
        self.assertIsInstance(ch._closing_reason, pika.exceptions.ChannelClosedByBroker)
        conn.close()

    def pika_burst(self, kind):
        tap = self.start_tap()
        conn = pika.BlockingConnection(params(tap.port))
        ch = conn.channel()
        reported = {}

        def on_close(_channel, reason):
            reported.update(code=reason.reply_code, text=reason.reply_text)

        ch._impl.add_on_close_callback(on_close)  # what the library reports, as its channel close reason
        bad = {"exchange": (self.missing, "k", pika.BasicProperties(message_id="bad"), b"bad"),
               "user_id": ("", self.queue, pika.BasicProperties(message_id="bad", user_id="not-the-login-user"),
                           b"bad"),
               "size": ("", self.queue, pika.BasicProperties(message_id="bad"), b"b" * 2000)}[kind]
        try:  # pika writes each publish, then may raise a close that came in meanwhile
            ch.basic_publish("", self.queue, b"ok", pika.BasicProperties(message_id="ok"))
            ch.basic_publish(bad[0], bad[1], bad[3], bad[2])
            ch.basic_publish("", self.queue, b"after", pika.BasicProperties(message_id="after"))
        except pika.exceptions.ChannelClosedByBroker:
            pass
        self.closed_by_broker(conn, ch)
        self.check(tap, reported, code=404 if kind == "exchange" else 406)

    def py_amqp_burst(self, kind):
        tap = self.start_tap()
        out = subprocess.run(["/usr/bin/python3", "-c", PY_AMQP_BURST, str(tap.port), self.queue, self.missing,
                              kind], timeout=30, capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        reported = json.loads(out.stdout)
        self.assertEqual(reported.get("method"), [60, 40], reported)  # py-amqp names basic.publish as the cause
        self.assertIn(reported.get("raised_at"), (None, "after"), reported)
        return tap, reported

    def test_pika_close_ok_after_the_return_window(self):
        """A mandatory publish to a missing exchange on a plain channel, and pika's BlockingConnection idle past
        --return-window before it reads the broker's close and answers close-ok: the broker's close decides the
        verdict whenever the client answers it (unknown, the broker's reason), not the window running out."""
        tap = self.start_tap(["--return-window", "300"])
        conn = pika.BlockingConnection(params(tap.port))
        ch = conn.channel()
        ch.basic_publish(self.missing, "k", b"bad", pika.BasicProperties(message_id="bad"), mandatory=True)
        time.sleep(1.0)  # idle: the broker's channel.close waits unread; the window (300 ms) runs out meanwhile
        self.assertEqual(tap.records("publish"), [], "written before the client answered the close")
        self.closed_by_broker(conn, ch)
        self.assertTrue(wait_for(lambda: tap.records("publish"), 10))
        (rec,) = tap.records("publish")
        self.assertEqual((rec["route"], rec["confirm"], rec["refused"]), ("unknown", "none", "culprit"),
                         json.dumps(rec))
        self.assertEqual(rec["reason"]["by"], "broker", json.dumps(rec))
        self.assertEqual(rec["reason"]["code"], 404, json.dumps(rec))

    def test_pika_burst(self):
        self.pika_burst("exchange")

    def test_py_amqp_burst(self):
        tap, reported = self.py_amqp_burst("exchange")
        self.check(tap, reported, sent_after=reported.get("raised_at") is None)

    def test_pika_burst_user_id(self):
        self.pika_burst("user_id")

    def test_pika_burst_message_size(self):
        # a channel takes the broker's max_message_size when it opens: 1 KiB for this test's channel only
        broker_sh("ctl", "eval", "application:set_env(rabbit, max_message_size, 1024).")
        self.addCleanup(broker_sh, "ctl", "eval", "application:set_env(rabbit, max_message_size, 134217728).")
        self.pika_burst("size")

    def test_py_amqp_burst_user_id(self):
        tap, reported = self.py_amqp_burst("user_id")
        self.check(tap, reported, sent_after=reported.get("raised_at") is None, code=406)

    def test_py_amqp_burst_immediate(self):
        # RabbitMQ implements no immediate flag: it closes the whole connection (540), naming basic.publish
        tap, reported = self.py_amqp_burst("immediate")
        self.check(tap, reported, sent_after=reported.get("raised_at") is None, code=540)


if __name__ == "__main__":
    main()
