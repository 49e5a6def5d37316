# --fault latency and bandwidth: byte-level faults (as toxiproxy's) against two real client libraries (pika, Go's
# amqp091-go) through the tap to the real broker. Each test measures what the library itself sees (a confirm's
# round trip, how long a large publish or a get takes), checks the broker (queue depth, the body byte for byte),
# that dir=up and dir=down each slow only their direction, that a rule selecting another connection leaves this
# one as fast as without it, and the records (one `fault` record when a rule begins acting on a connection) and
# /metrics. A client TLS leg (with the plain leg to the broker) carries the latency as a plain one does.
#
# The Go client is tests/clients/faults/faults.go (see test_faults.py).

import json
import os
import shutil
import ssl
import subprocess
import time
import uuid

import pika

from tapharness import BROKER_HOST, BROKER_PORT, TapTestCase, free_port, http_get, main, require_broker
from test_faults import build_go_client
from tlslib import shared_pki

KIB = 1024


def broker():
    return pika.BlockingConnection(pika.ConnectionParameters(BROKER_HOST, BROKER_PORT))


class ByteFaultTest(TapTestCase):
    @classmethod
    def setUpClass(cls):
        cls.go_client = build_go_client() if shutil.which("go") else None

    def setUp(self):
        super().setUp()
        require_broker(self)
        self.queue = "fault-bytes-" + uuid.uuid4().hex[:10]
        with broker() as c:
            c.channel().queue_declare(self.queue)

    def tearDown(self):
        with broker() as c:
            c.channel().queue_delete(self.queue)
        super().tearDown()

    def tap(self, *rules, extra=()):
        args = list(extra)
        for r in rules:
            args += ["--fault", r]
        return self.start_tap(args, frames=False)

    def connect(self, tap, name, **kw):
        params = kw.pop("params", None) or pika.ConnectionParameters("127.0.0.1", tap.port, **kw)
        params.client_properties = {"connection_name": name}
        c = pika.BlockingConnection(params)
        ch = c.channel()
        ch.confirm_delivery()
        return c, ch

    def confirm_rtt(self, ch, n=3):
        """The shortest of n confirm round trips (a publish on a confirm channel until its ack), seconds."""
        took = []
        for i in range(n):
            t0 = time.monotonic()
            ch.basic_publish("", self.queue, b"rtt %d" % i, mandatory=True)
            took.append(time.monotonic() - t0)
        return min(took)

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

    def bodies(self):
        """Every message in the queue, taken straight from the broker (not through the tap)."""
        out = []
        with broker() as c:
            ch = c.channel()
            while True:
                _m, _p, body = ch.basic_get(self.queue, auto_ack=True)
                if body is None:
                    return out
                out.append(body)

    def faults(self, tap):
        tap.stop()
        return [(f["action"], f.get("ms"), f.get("kib"), f["dir"]) for f in tap.records("fault")]


class Latency(ByteFaultTest):
    def test_pika_directions_and_bystander(self):
        tap = self.tap("latency:ms=300,dir=up,name=fb-up", "latency:ms=300,dir=down,name=fb-down")
        # the bystander, selected by neither rule: as fast as the broker
        c, ch = self.connect(tap, "fb-none")
        self.assertLess(self.confirm_rtt(ch), 0.1, "a rule for another connection slowed this one")
        c.close()
        for name in ("fb-up", "fb-down"):
            c, ch = self.connect(tap, name)
            rtt = self.confirm_rtt(ch)
            self.assertGreaterEqual(rtt, 0.3, name)
            self.assertLess(rtt, 0.55, f"{name}: one direction's 300 ms only")
            # which direction: a publish without confirms is at the broker at once (down) or 300 ms later (up)
            plain = c.channel()
            before = self.depth()
            plain.basic_publish("", self.queue, b"which way")
            time.sleep(0.15)
            arrived = self.depth() - before
            self.assertEqual(arrived, 0 if name == "fb-up" else 1, f"{name}: the publish at the broker after 150 ms")
            time.sleep(0.3)
            self.assertEqual(self.depth() - before, 1, name)
            c.close()
        self.assertEqual(self.depth(), 3 + 2 * 4)
        self.assertEqual(sorted(self.faults(tap)), [("latency", 300, None, "down"), ("latency", 300, None, "up")])

    def test_go_confirm_round_trip(self):
        # amqp091-go names its connection faults_go: the first tap's rule selects another one, the second's it
        tap = self.tap("latency:ms=300,name=someone-else")
        res = self.go(tap, 3, 5000)
        self.assertEqual(res["acks"], [1, 2, 3])
        self.assertLess(min(res["confirm_ms"].values()), 100, res)
        self.assertEqual(self.faults(tap), [])
        tap = self.tap("latency:ms=300,name=faults_go")
        t0 = time.monotonic()
        res = self.go(tap, 3, 5000)
        self.assertEqual(res["acks"], [1, 2, 3])
        self.assertEqual(res["missing"], [])
        # both directions: 300 ms out, 300 ms back
        self.assertGreaterEqual(min(res["confirm_ms"].values()), 599, res)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(self.faults(tap), [("latency", 300, None, "both")])
        self.assertEqual(self.depth(), 6)
        self.assertEqual(sorted(self.bodies()), sorted([b"fault 1", b"fault 2", b"fault 3"] * 2))

    def test_pika_over_tls(self):
        # the client's leg is TLS (the tap's own certificate), the broker's plain: both legs carry the delay
        pki = shared_pki()
        tap = self.tap("latency:ms=300,dir=down", extra=["--tls-cert", os.path.join(pki, "server.pem"), "--tls-key",
                                                         os.path.join(pki, "server.key")])
        ctx = ssl.create_default_context(cafile=os.path.join(pki, "ca.pem"))
        params = pika.ConnectionParameters("localhost", tap.port, ssl_options=pika.SSLOptions(ctx, "localhost"),
                                           connection_attempts=1, socket_timeout=5)
        c, ch = self.connect(tap, "fb-tls", params=params)
        rtt = self.confirm_rtt(ch, 2)
        c.close()
        self.assertGreaterEqual(rtt, 0.3)
        self.assertLess(rtt, 0.55)
        self.assertEqual(self.depth(), 2)
        self.assertEqual(self.faults(tap), [("latency", 300, None, "down")])


class Bandwidth(ByteFaultTest):
    BODY = bytes((i * 7 + 3) % 256 for i in range(256 * KIB))

    def test_pika_up_then_down(self):
        mport = free_port()
        tap = self.tap("bandwidth:kib=64,dir=up,name=fb-up", "bandwidth:kib=64,dir=down,name=fb-down",
                       extra=["--metrics", f"127.0.0.1:{mport}"])
        # up: the publish takes 256 KiB / 64 KiB/s (4 s; a 10 ms bucket goes at once), and arrives whole
        c, ch = self.connect(tap, "fb-up")
        t0 = time.monotonic()
        ch.basic_publish("", self.queue, self.BODY, mandatory=True)
        took = time.monotonic() - t0
        c.close()
        self.assertGreaterEqual(took, 3.0)
        self.assertLess(took, 8.0)
        self.assertEqual(self.depth(), 1)
        # down: the same publish goes at the broker's speed, the get of it back through the tap at 64 KiB/s
        c, ch = self.connect(tap, "fb-down")
        t0 = time.monotonic()
        ch.basic_publish("", self.queue, self.BODY, mandatory=True)
        self.assertLess(time.monotonic() - t0, 1.0, "dir=down does not pace the publish")
        self.assertEqual(self.depth(), 2)
        t0 = time.monotonic()
        _m, _p, got = ch.basic_get(self.queue, auto_ack=True)
        took = time.monotonic() - t0
        c.close()
        self.assertEqual(got, self.BODY)
        self.assertGreaterEqual(took, 3.0)
        self.assertLess(took, 8.0)
        self.assertEqual(self.bodies(), [self.BODY], "the other one, intact at the broker")
        metrics = http_get(mport, "/metrics")[2].decode()
        self.assertIn('amqptap_faults_total{action="bandwidth"} 2', metrics)
        self.assertEqual(sorted(self.faults(tap)), [("bandwidth", None, 64, "down"), ("bandwidth", None, 64, "up")])

    def test_go_large_publish(self):
        tap = self.tap("bandwidth:kib=64,client=127.0.0.1")
        t0 = time.monotonic()
        res = self.go(tap, 1, 15000, env={"FAULTS_BODY_BYTES": str(256 * KIB)})
        self.assertEqual((res["acks"], res["missing"]), ([1], []))
        self.assertGreaterEqual(res["confirm_ms"]["1"], 3000)
        self.assertLess(time.monotonic() - t0, 12)
        self.assertEqual(self.faults(tap), [("bandwidth", None, 64, "both")])
        self.assertEqual(self.bodies(), [bytes((1 + k) % 251 for k in range(256 * KIB))])


if __name__ == "__main__":
    main()
