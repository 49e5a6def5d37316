# amqptap sniff (issue 15, DESIGN §6b): pika publishing straight to the broker while `amqptap sniff -i lo --port
# <broker>` captures gives the records the proxy gives for the same scenarios (DESIGN §7 3, 6, 1: confirm +
# mandatory routed/returned, missing exchange 404, confirm without mandatory, mandatory without confirm), every
# field but timings, connection ids and client ports (the full §7 set with rabbitmq-c too: test_sniff_scenarios);
# forced kernel drops give capture_drops/capture_gap records and `unknown`, never a wrong verdict; a capture that
# starts mid-connection says the channel modes it did not see are unknown; a missing interface is one line and
# exit 2.

import collections
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
from scenario_lib import read_until_progress, stream_publisher  # noqa: E402

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

    def test_forced_loss_gives_gaps_and_unknown_never_a_wrong_verdict(self):
        """Kernel drops made certain: a sniffer with a small --buffer-size (2 MiB) is stopped (SIGSTOP) while two
        rabbitmq-c publishers stream 20,000 of their 60,000 confirmed mandatory publishes (one to a queue: routed,
        one to nothing: returned), so its ring overflows and the kernel drops what follows; it is continued while
        they still publish, so later segments show the holes. A second sniffer with the default buffer sees the
        whole run and is the reference. The lossy one must report capture_drops and capture_gap records, write
        `unknown` (by capture_gap) where it cannot know, never a route or confirm the reference contradicts, and a
        record for every basic.publish its --frames trace shows it decoded."""
        q = f"sniff.loss.{os.getpid()}"
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", BROKER_PORT))
        conn.channel().queue_declare(q, auto_delete=False, arguments={"x-max-length": 1000})
        self.addCleanup(lambda: conn.channel().queue_delete(q) and conn.close())
        with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
            ref, ref_out, ref_err = self.sniff(d1)
            lossy, lossy_out, lossy_err = self.sniff(d2, "--buffer-size", "2048", "--frames",
                                                     os.path.join(d2, "frames.jsonl"))
            pubs = [stream_publisher(BROKER_PORT, 60000, 64, 1000, True, rk) for rk in (q, f"{q}.absent")]
            try:
                self.assertGreaterEqual(read_until_progress(pubs[0], 5000), 5000)
                lossy.send_signal(signal.SIGSTOP)
                self.assertGreaterEqual(read_until_progress(pubs[0], 25000), 25000)
                lossy.send_signal(signal.SIGCONT)
                for p in pubs:
                    out, err = p.communicate(timeout=120)
                    self.assertEqual(p.returncode, 0, err)
            finally:
                lossy.send_signal(signal.SIGCONT)
            time.sleep(0.5)
            for p, e in ((ref, ref_err), (lossy, lossy_err)):
                p.send_signal(signal.SIGINT)
                self.assertEqual(p.wait(timeout=60), 0, open(e.name).read())
            want = read_records(ref_out)
            got = read_records(lossy_out)
            frames = read_records(os.path.join(d2, "frames.jsonl"))
        self.assertEqual([r for r in want if r["type"] in ("capture_gap", "capture_drops")], [],
                         "the reference sniffer lost packets too: the machine is too busy for this test")
        ref_pubs = {(r["routing_key"], r["message_id"]): r for r in want if r["type"] == "publish"}
        self.assertEqual(len(ref_pubs), 120000)
        drops = [r for r in got if r["type"] == "capture_drops"]
        self.assertTrue(drops and sum(r["dropped"] for r in drops) > 1000, drops)
        gaps = [r for r in got if r["type"] == "capture_gap"]
        self.assertTrue(gaps)
        lossy_pubs = [r for r in got if r["type"] == "publish"]
        unknown = [r for r in lossy_pubs if r["route"] == "unknown" and r["reason"]["by"] == "capture_gap"]
        self.assertTrue(unknown, "no publish was written unknown because of the gap")
        claims = collections.Counter()
        for r in lossy_pubs:
            if r["route"] in ("routed", "returned"):
                claims[r["route"]] += 1
            if r.get("message_id") is None:  # its content header was lost: nothing may be claimed for it
                self.assertEqual((r["route"], r["confirm"], r["reason"]["by"]), ("unknown", "unknown", "capture_gap"), r)
                continue
            truth = ref_pubs.get((r.get("routing_key"), r.get("message_id")))
            self.assertIsNotNone(truth, r)
            if r["route"] in ("routed", "returned"):
                self.assertEqual((r["route"], r.get("reply_code")), (truth["route"], truth.get("reply_code")), r)
            if r["confirm"] in ("ack", "nack"):
                self.assertEqual(r["confirm"], truth["confirm"], r)
        self.assertTrue(claims, "nothing was claimed before the loss: the test proves nothing")
        decoded = [f for f in frames if f.get("dir") == "c2s" and f.get("method") == "basic.publish"]
        self.assertEqual(len(lossy_pubs), len(decoded), "a decoded basic.publish without its record (or extra)")
        mids = [(r.get("routing_key"), r.get("message_id")) for r in lossy_pubs if r.get("message_id") is not None]
        self.assertEqual(len(mids), len(set(mids)), "a publish written twice")
        print(f"lossy sniffer: {sum(r['dropped'] for r in drops)} packets dropped, {len(gaps)} gaps, "
              f"{len(lossy_pubs)} of 120000 publishes written, {len(unknown)} unknown by capture_gap, {claims}")

    def test_capture_started_mid_connection(self):
        """The sniffer starts after a pika publisher opened its connection and selected confirms on channel 1
        (README, "A capture that starts mid-connection"): channel 1's mode was not seen, so it gets a
        "mode_unknown" channel record and its publishes are written route and confirm `unknown`, seq null,
        {"by": "capture_start"}, never a guessed verdict; channel 2, opened and confirm-selected under the
        sniffer, is decoded in full (routed/ack, returned/ack, seq from 1)."""
        q = f"sniff.mid.{os.getpid()}"
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", BROKER_PORT, heartbeat=0))
        self.addCleanup(lambda: conn.is_open and conn.close())
        ch1 = conn.channel()
        ch1.confirm_delivery()
        ch1.queue_declare(q, auto_delete=True)
        props = lambda mid: pika.BasicProperties(message_id=mid)  # noqa: E731
        ch1.basic_publish("", q, b"before", props("before"), mandatory=True)
        with tempfile.TemporaryDirectory() as d:
            p, verdicts, err = self.sniff(d)
            try:
                ch1.basic_publish("", q, b"a", props("ch1-routed"), mandatory=True)
                try:
                    ch1.basic_publish("", q + ".absent", b"b", props("ch1-returned"), mandatory=True)
                except pika.exceptions.UnroutableError:
                    pass
                ch2 = conn.channel()
                ch2.confirm_delivery()
                ch2.basic_publish("", q, b"c", props("ch2-routed"), mandatory=True)
                try:
                    ch2.basic_publish("", q + ".absent", b"d", props("ch2-returned"), mandatory=True)
                except pika.exceptions.UnroutableError:
                    pass
                conn.close()
                time.sleep(0.5)
            finally:
                p.send_signal(signal.SIGINT)
                self.assertEqual(p.wait(timeout=20), 0, open(err.name).read())
            recs = read_records(verdicts)
        pubs = {r["message_id"]: r for r in recs if r["type"] == "publish"}
        self.assertEqual(sorted(pubs), ["ch1-returned", "ch1-routed", "ch2-returned", "ch2-routed"])
        for mid in ("ch1-routed", "ch1-returned"):
            r = pubs[mid]
            self.assertEqual((r["route"], r["confirm"], r["seq"], r["reason"]), ("unknown", "unknown", None,
                                                                                 {"by": "capture_start"}), r)
        self.assertEqual((pubs["ch2-routed"]["route"], pubs["ch2-routed"]["confirm"], pubs["ch2-routed"]["seq"]),
                         ("routed", "ack", 1))
        self.assertEqual((pubs["ch2-returned"]["route"], pubs["ch2-returned"]["confirm"],
                          pubs["ch2-returned"]["seq"]), ("returned", "ack", 2))
        chan = [(r["channel"], r["event"]) for r in recs if r["type"] == "channel"]
        self.assertIn((1, "mode_unknown"), chan)
        self.assertNotIn((2, "mode_unknown"), chan)
        self.assertFalse([r for r in recs if r["type"] in ("capture_gap", "capture_drops")])

    def test_missing_interface_is_one_line_and_exit_2(self):
        r = subprocess.run([AMQPTAP_BIN, "sniff", "-i", "nosuch0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=20)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr.strip().splitlines(), ["amqptap: --interface nosuch0: no such interface"])
        self.assertEqual(r.stdout, "")


if __name__ == "__main__":
    main()
