# The routing model's health on /metrics, `amqptap route --management`, and --management over HTTPS (issue 36),
# against the real broker's management plugin (TAP_BROKER_MGMT_PORT; TAP_BROKER_MGMT_TLS_PORT for its HTTPS listener,
# scripts/broker.sh, with the node's own test CA):
# - amqptap_topology_polls_total{result} counts every poll (ok against the API, failed against a port where nothing
#   listens, while the topology record says the first failure only), the model's age and size gauges are there once a
#   model is, --definitions counts its reads at start and on SIGHUP;
# - `amqptap route --management URL` gives the queues `--definitions` gives for a declared topology; a wrong password
#   or a port that does not answer exits 3 with one line, bad options exit 2;
# - --management https:// with --management-ca: the right CA polls and publishes are judged; a wrong CA fails the poll
#   (the record, the metric) and nothing is judged; a server whose certificate stops verifying mid-run (a TCP relay
#   switched from the broker to a server with a certificate of another CA) fails the poll and keeps the last good model.

import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time

import pika

from routelib import export_definitions, route, write_cases
from tapharness import BROKER_PORT, SOURCE_DIR, TapTestCase, free_port, http_get, main, require_broker, wait_for

MGMT = os.environ.get("TAP_BROKER_MGMT_PORT")
MGMT_TLS = os.environ.get("TAP_BROKER_MGMT_TLS_PORT")
MGMT_CA = os.environ.get("TAP_BROKER_MGMT_TLS_CA") or os.path.join(
    os.environ.get("TAP_BROKER_DIR") or os.path.join(SOURCE_DIR, ".run", "broker"), "mgmt-tls", "ca.pem")

# exchange -> (type, {queue: binding key}); tm.topic also binds tm.fan (an exchange-to-exchange binding), tm.ae is
# tm.withae's alternate exchange
TOPOLOGY = {
    "tm.direct": ("direct", {"tm.q1": "k1", "tm.q2": "k2"}),
    "tm.topic": ("topic", {"tm.q3": "a.*"}),
    "tm.fan": ("fanout", {"tm.q4": ""}),
    "tm.ae": ("fanout", {"tm.q2": ""}),
    "tm.withae": ("direct", {"tm.q1": "only"}),
}
QUEUES = ["tm.q1", "tm.q2", "tm.q3", "tm.q4"]
CASES = [
    {"exchange": "tm.direct", "key": "k1", "queues": ["tm.q1"]},
    {"exchange": "tm.direct", "key": "nowhere", "queues": "none"},
    {"exchange": "tm.topic", "key": "a.b", "queues": ["tm.q3", "tm.q4"]},
    {"exchange": "tm.topic", "key": "b.c", "queues": ["tm.q4"]},
    {"exchange": "tm.withae", "key": "other", "queues": ["tm.q2"], "alternate": True},
    {"exchange": "tm.missing", "key": "k", "outcome": "no_exchange"},
]


def metric(text, name, labels=""):
    """The value of one series in a /metrics text, or None when it is not there."""
    m = re.search(r"^" + re.escape(name + labels) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Relay:
    """A TCP relay on a free loopback port to a target port that can be switched (new connections go there)."""

    def __init__(self, target):
        self.target = target
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                c.close()
                continue
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.sock.close()


class RogueServer:
    """A TLS server for localhost whose certificate another CA signed: every handshake the tap verifies fails."""

    def __init__(self, d):
        with open(os.path.join(d, "server.ext"), "w") as f:
            f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "rogue-server.key", "-out", "rogue-server.csr",
                "-subj", "/CN=localhost", cwd=d)
        openssl("x509", "-req", "-in", "rogue-server.csr", "-CA", "rogue.pem", "-CAkey", "rogue.key",
                "-CAcreateserial", "-out", "rogue-server.pem", "-days", "2", "-extfile", "server.ext", cwd=d)
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(os.path.join(d, "rogue-server.pem"), os.path.join(d, "rogue-server.key"))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handshakes = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.handshakes += 1
            c.settimeout(5)
            try:
                with self.ctx.wrap_socket(c, server_side=True) as t:
                    t.recv(1)
            except (OSError, ssl.SSLError):
                pass
            finally:
                c.close()

    def close(self):
        self.sock.close()


class TopologyMetricsTest(TapTestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="test_topology_metrics-")
        cls.cred = os.path.join(cls.dir, "cred")
        with open(cls.cred, "w") as f:
            f.write("guest:guest\n")
        os.chmod(cls.cred, 0o600)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def setUp(self):
        super().setUp()
        require_broker(self)
        if not MGMT:
            self.skipTest("TAP_BROKER_MGMT_PORT is not set: the broker has no management plugin")
        self.conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", BROKER_PORT))
        ch = self.conn.channel()
        for q in QUEUES:
            ch.queue_declare(q)
        ch.exchange_declare("tm.ae", "fanout")
        for x, (kind, binds) in TOPOLOGY.items():
            args = {"alternate-exchange": "tm.ae"} if x == "tm.withae" else None
            ch.exchange_declare(x, kind, arguments=args)
            for q, key in binds.items():
                ch.queue_bind(q, x, key)
        ch.exchange_bind("tm.fan", "tm.topic", "#")
        self.ch = ch

    def tearDown(self):
        try:
            for q in QUEUES:
                self.ch.queue_delete(q)
            for x in TOPOLOGY:
                self.ch.exchange_delete(x)
            self.conn.close()
        finally:
            super().tearDown()

    def scrape(self, port):
        status, _, body = http_get(port, "/metrics")
        self.assertEqual(status, 200)
        return body.decode()

    def wait_metric(self, port, name, labels, at_least, timeout=10):
        got = wait_for(lambda: (metric(self.scrape(port), name, labels) or 0) >= at_least, timeout, interval=0.2)
        self.assertTrue(got, f"{name}{labels} below {at_least}: {self.scrape(port)[-3000:]}")
        return self.scrape(port)

    def mgmt_tap(self, url, *extra):
        mport = free_port()
        tap = self.start_tap(["--management", url, "--management-credentials", self.cred, "--topology-interval", "1",
                              "--metrics", f"127.0.0.1:{mport}", *extra])
        return tap, mport

    def publish(self, tap, *keys):
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tap.port))
        ch = c.channel()
        for x, k in keys:
            ch.basic_publish(x, k, b"x", pika.BasicProperties(message_id=f"{x}/{k}/{time.monotonic_ns()}"))
        c.close()

    def publishes(self, tap, n):
        self.assertTrue(wait_for(lambda: len(tap.records("publish")) >= n, 10), tap.records())
        return tap.records("publish")

    def drops(self, tap):
        return [r for r in tap.records("warning") if r["rule"] == "dropped_by_topology"]

    def test_poll_counters_age_and_sizes(self):
        defs_path = os.path.join(self.dir, "defs.json")
        export_definitions(defs_path)
        with open(defs_path) as f:
            defs = json.load(f)
        tap, mport = self.mgmt_tap(f"http://127.0.0.1:{MGMT}")
        text = self.wait_metric(mport, "amqptap_topology_polls_total", '{result="ok"}', 2)
        self.assertEqual(metric(text, "amqptap_topology_polls_total", '{result="failed"}'), 0)
        age = metric(text, "amqptap_topology_age_seconds")
        self.assertIsNotNone(age, text)
        self.assertLess(age, 2.5, "reloaded every second")
        self.assertEqual(metric(text, "amqptap_topology_queues"), len(defs["queues"]))
        self.assertEqual(metric(text, "amqptap_topology_bindings"), len(defs["bindings"]))
        amq = ["amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match", "amq.rabbitmq.trace"]
        exchanges = {(x["vhost"], x["name"]) for x in defs["exchanges"]} | {(v["name"], a) for v in defs["vhosts"]
                                                                           for a in amq}
        self.assertEqual(metric(text, "amqptap_topology_exchanges"), len(exchanges), "the predeclared ones included")
        lint = subprocess.run(["/usr/bin/promtool", "check", "metrics"], input=text.encode(), capture_output=True,
                              timeout=30)
        self.assertEqual((lint.returncode, lint.stdout + lint.stderr), (0, b""))
        # a port where nothing listens: every poll counts as failed, the record says the first one only
        bad, bport = self.mgmt_tap(f"http://127.0.0.1:{free_port()}")
        text = self.wait_metric(bport, "amqptap_topology_polls_total", '{result="failed"}', 3)
        self.assertEqual(metric(text, "amqptap_topology_polls_total", '{result="ok"}'), 0)
        self.assertIsNone(metric(text, "amqptap_topology_age_seconds"), "no model: no age")
        self.assertIsNone(metric(text, "amqptap_topology_queues"))
        self.assertEqual([r["event"] for r in bad.records("topology")], ["poll_failed"])
        # --definitions: a read at start; a SIGHUP with a broken file fails and keeps the model (its age goes on)
        dtap = self.start_tap(["--definitions", defs_path, "--metrics", f"127.0.0.1:{(dport := free_port())}"])
        text = self.scrape(dport)
        self.assertEqual(metric(text, "amqptap_topology_polls_total", '{result="ok"}'), 1)
        self.assertEqual(metric(text, "amqptap_topology_queues"), len(defs["queues"]))
        age0 = metric(text, "amqptap_topology_age_seconds")
        with open(defs_path, "w") as f:
            f.write('{"queues":[')
        dtap.proc.send_signal(signal.SIGHUP)
        self.assertTrue(wait_for(lambda: "the last good definitions stay" in dtap.stderr(), 5), dtap.stderr())
        time.sleep(1.1)  # past the page's one-second cache
        text = self.scrape(dport)
        self.assertEqual(metric(text, "amqptap_topology_polls_total", '{result="failed"}'), 1)
        self.assertEqual(metric(text, "amqptap_topology_polls_total", '{result="ok"}'), 1)
        self.assertGreater(metric(text, "amqptap_topology_age_seconds"), age0 + 1)

    def test_route_management_same_as_definitions(self):
        defs_path = os.path.join(self.dir, "defs-route.json")
        export_definitions(defs_path)
        cases = write_cases(CASES, self.dir)
        url = f"http://127.0.0.1:{MGMT}"
        by_file = route("--definitions", defs_path, "--test", cases)
        by_api = route("--management", url, "--management-credentials", self.cred, "--test", cases)
        self.assertEqual((by_file.returncode, by_file.stdout), (0, f"{len(CASES)} cases, 0 failed\n"), by_file.stderr)
        self.assertEqual((by_api.returncode, by_api.stdout, by_api.stderr), (by_file.returncode, by_file.stdout, ""))
        for x, k in (("tm.topic", "a.b"), ("tm.withae", "other")):
            q = ["--exchange", x, "--key", k, "--json"]
            by_file = route("--definitions", defs_path, *q)
            by_api = route("--management", url + "/", "--management-credentials", self.cred, *q)
            self.assertEqual((by_api.returncode, by_api.stdout), (0, by_file.stdout))
        # the API unreadable: exit 3, one line saying why; the password never shown
        wrong = os.path.join(self.dir, "wrong")
        with open(wrong, "w") as f:
            f.write("guest:not-the-password\n")
        for args, why in (([url, "--management-credentials", wrong], "HTTP 401"),
                          ([f"http://127.0.0.1:{free_port()}", "--management-credentials", self.cred], "no answer")):
            r = route("--management", *args, "--exchange", "tm.direct", "--key", "k1")
            self.assertEqual(r.returncode, 3, r.stderr)
            self.assertEqual(r.stdout, "")
            self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
            self.assertIn(why, r.stderr)
            self.assertNotIn("not-the-password", r.stderr)
        # bad options: exit 2, one line naming the option
        for args, named in ((["--management", "ftp://x", "--exchange", "e"], "--management"),
                            (["--management", url, "--definitions", defs_path, "--exchange", "e"], "--definitions"),
                            (["--definitions", defs_path, "--management-ca", MGMT_CA, "--exchange", "e"],
                             "--management-ca"),
                            (["--management", url, "--management-credentials", "/nonexistent", "--exchange", "e"],
                             "--management-credentials"),
                            (["--management", "https://localhost:1", "--management-ca", "/nonexistent",
                              "--exchange", "e"], "--management-ca")):
            r = route(*args)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
            self.assertIn(named, r.stderr)

    def test_https_poll_verified(self):
        if not MGMT_TLS:
            self.skipTest("TAP_BROKER_MGMT_TLS_PORT is not set: the broker has no HTTPS management listener")
        self.assertTrue(os.path.exists(MGMT_CA), f"{MGMT_CA}: the management listener's CA (scripts/broker.sh)")
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "rogue.key", "-out", "rogue.pem", "-days",
                "2", "-subj", "/CN=amqptap test rogue CA", cwd=self.dir)
        rogue_ca = os.path.join(self.dir, "rogue.pem")
        https = f"https://localhost:{MGMT_TLS}"
        # the right CA: polled, and publishes are judged by the broker's bindings
        good, gport = self.mgmt_tap(https, "--management-ca", MGMT_CA)
        self.assertTrue(wait_for(lambda: "definitions polled:" in good.stderr(), 10), good.stderr())
        self.publish(good, ("tm.direct", "k1"), ("tm.direct", "nowhere"))
        pubs = {p["routing_key"]: p for p in self.publishes(good, 2)}
        self.assertEqual(pubs["k1"]["topology"], {"queues": ["tm.q1"], "count": 1})
        self.assertEqual(pubs["nowhere"]["topology"]["count"], 0)
        self.assertTrue(wait_for(lambda: len(self.drops(good)) == 1, 5), good.records())
        text = self.scrape(gport)
        self.assertGreaterEqual(metric(text, "amqptap_topology_polls_total", '{result="ok"}'), 1)
        self.assertEqual(metric(text, "amqptap_topology_polls_total", '{result="failed"}'), 0)
        r = route("--management", https, "--management-ca", MGMT_CA, "--management-credentials", self.cred,
                  "--exchange", "tm.direct", "--key", "k1")
        self.assertEqual((r.returncode, r.stdout), (0, "tm.q1\n"), r.stderr)
        r = route("--management", https, "--management-ca", rogue_ca, "--management-credentials", self.cred,
                  "--exchange", "tm.direct", "--key", "k1")
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("certificate verify failed", r.stderr)
        # a wrong CA: the poll fails (record, metric), nothing is judged, nothing warned
        bad, bport = self.mgmt_tap(https, "--management-ca", rogue_ca)
        self.assertTrue(wait_for(lambda: bad.records("topology"), 10), bad.stderr())
        rec = bad.records("topology")[0]
        self.assertEqual(rec["event"], "poll_failed", rec)
        self.assertIn("certificate verify failed", rec["error"])
        self.wait_metric(bport, "amqptap_topology_polls_total", '{result="failed"}', 1)
        self.assertEqual(metric(self.scrape(bport), "amqptap_topology_polls_total", '{result="ok"}'), 0)
        self.publish(bad, ("tm.direct", "nowhere"))
        pub = self.publishes(bad, 1)[0]
        self.assertNotIn("topology", pub)
        self.assertEqual(pub["route"], "unproven")
        self.assertEqual(self.drops(bad), [])
        # verified, then a certificate that does not verify: the poll fails, the last good model stays
        rogue = RogueServer(self.dir)
        relay = Relay(int(MGMT_TLS))
        try:
            mid, mport = self.mgmt_tap(f"https://localhost:{relay.port}", "--management-ca", MGMT_CA)
            self.assertTrue(wait_for(lambda: "definitions polled:" in mid.stderr(), 10), mid.stderr())
            relay.target = rogue.port
            self.assertTrue(wait_for(lambda: any(r["event"] == "stale" for r in mid.records("topology")), 10),
                            mid.records("topology"))
            stale = [r for r in mid.records("topology") if r["event"] == "stale"][0]
            self.assertIn("certificate verify failed", stale["error"])
            self.assertGreaterEqual(rogue.handshakes, 1)
            text = self.wait_metric(mport, "amqptap_topology_polls_total", '{result="failed"}', 2)
            self.assertGreaterEqual(metric(text, "amqptap_topology_polls_total", '{result="ok"}'), 1)
            self.assertGreater(metric(text, "amqptap_topology_age_seconds"), 1, "the model's age goes on")
            self.publish(mid, ("tm.direct", "k1"), ("tm.direct", "nowhere"))
            pubs = {p["routing_key"]: p for p in self.publishes(mid, 2)}
            self.assertEqual(pubs["k1"]["topology"], {"queues": ["tm.q1"], "count": 1})
            self.assertEqual(pubs["nowhere"]["topology"]["count"], 0)
        finally:
            relay.close()
            rogue.close()


if __name__ == "__main__":
    main()
