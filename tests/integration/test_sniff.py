# amqptap sniff (issue 15, DESIGN §6b): pika publishing straight to the broker while `amqptap sniff -i lo --port
# <broker>` captures gives the records the proxy gives for the same scenarios (DESIGN §7 3, 6, 1: confirm +
# mandatory routed/returned, missing exchange 404, confirm without mandatory, mandatory without confirm), every
# field but timings, connection ids and client ports; a missing interface is one line and exit 2.

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pika  # noqa: E402
import pika.exceptions  # noqa: E402

from tapharness import AMQPTAP_BIN, BROKER_PORT, TapTestCase, main, read_records, require_broker, wait_for  # noqa

VOLATILE = {"ts", "conn", "client", "return_us", "confirm_us", "duration_us", "multiple", "run", "started"}


def scenario(port, tag):
    """Publishes the scenarios on one connection to `port`; returns when the broker answered all."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.confirm_delivery()
    q = f"sniff.{tag}.q"
    ch.queue_declare(q, auto_delete=True)
    x = f"sniff.{tag}.x"
    ch.exchange_declare(x, "direct", auto_delete=True)
    ch.queue_bind(q, x, routing_key="k")
    props = lambda mid: pika.BasicProperties(message_id=mid, delivery_mode=2)  # noqa: E731
    ch.basic_publish(x, "k", b"routed", props("routed"), mandatory=True)
    try:
        ch.basic_publish(x, "nomatch", b"returned", props("returned"), mandatory=True)
    except pika.exceptions.UnroutableError:
        pass
    ch.basic_publish(x, "nomatch", b"unproven", props("no-mandatory"))
    try:
        ch.basic_publish(f"sniff.{tag}.nope", "k", b"lost", props("missing-exchange"), mandatory=True)
    except pika.exceptions.ChannelClosedByBroker:
        pass
    ch2 = conn.channel()
    ch2.basic_publish("", f"sniff.{tag}.none", b"nc", props("no-confirm"), mandatory=True)
    ch2.queue_delete(q)
    conn.close()


def normalise(recs, tag):
    out = []
    for r in recs:
        if r["type"] not in ("publish", "warning", "connection", "channel"):
            continue
        r = {k: v for k, v in r.items() if k not in VOLATILE}
        out.append(json.loads(json.dumps(r).replace(tag, "TAG")))
    return out


class Sniff(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)

    def sniff(self, d, *extra):
        verdicts = os.path.join(d, "sniff.jsonl")
        err = open(os.path.join(d, "sniff.err"), "w+")
        p = subprocess.Popen([AMQPTAP_BIN, "sniff", "-i", "lo", "--port", str(BROKER_PORT), "--verdicts", verdicts,
                              "--return-window", "300", *extra], stdout=subprocess.DEVNULL, stderr=err)
        self.assertTrue(wait_for(lambda: "sniffing on lo" in open(err.name).read() or p.poll() is not None, 10))
        self.assertIsNone(p.poll(), open(err.name).read())
        return p, verdicts, err

    def test_same_records_as_the_proxy(self):
        tap = self.start_tap(["--return-window", "300"])
        scenario(tap.port, "p")
        time.sleep(0.5)
        with tempfile.TemporaryDirectory() as d:
            p, verdicts, err = self.sniff(d)
            try:
                scenario(BROKER_PORT, "s")
                time.sleep(0.5)
            finally:
                p.send_signal(signal.SIGINT)
                self.assertEqual(p.wait(timeout=20), 0, open(err.name).read())
            sniffed = read_records(verdicts)
        tap_recs = read_records(tap.verdicts)
        want = normalise(tap_recs, "sniff.p.")
        got = normalise(sniffed, "sniff.s.")
        self.assertEqual(got, want)
        routes = {r["message_id"]: (r["route"], r["confirm"]) for r in got if r["type"] == "publish"}
        self.assertEqual(routes, {"routed": ("routed", "ack"), "returned": ("returned", "ack"),
                                  "no-mandatory": ("unproven", "ack"), "missing-exchange": ("unknown", "unknown"),
                                  "no-confirm": ("returned", "none")})
        self.assertFalse([r for r in sniffed if r["type"] == "capture_gap"])

    def test_missing_interface_is_one_line_and_exit_2(self):
        r = subprocess.run([AMQPTAP_BIN, "sniff", "-i", "nosuch0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=20)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr.strip().splitlines(), ["amqptap: --interface nosuch0: no such interface"])
        self.assertEqual(r.stdout, "")


if __name__ == "__main__":
    main()
