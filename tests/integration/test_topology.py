# --definitions through the proxy (README "Routing"), with pika publishers through the tap and the real broker's
# definitions: publish records carry "topology"; a publish that is not mandatory and that the broker's bindings route
# nowhere is warned dropped_by_topology (once per exchange and key per --topology-interval, counted on /metrics by
# exchange); a Celery-style publisher (the default exchange, the queue's name as the key) gets the warning for the
# unroutable task only; a binding deleted on the broker makes a mandatory publish come back, which disagrees with the
# stale definitions (topology_mismatch); SIGHUP reloads the file, and a broken file keeps the last good model.

import json
import os
import signal
import subprocess
import time

import pika

from routelib import export_definitions
from tapharness import TapTestCase, free_port, http_get, main, require_broker, wait_for


class TopologyTest(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)
        admin = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", int(os.environ.get("TAP_BROKER_PORT",
                                                                                                    "5690"))))
        self.admin = admin.channel()
        self.admin_conn = admin
        self.admin.exchange_declare("tt.orders", "direct")
        self.admin.exchange_declare("tt.events", "topic")
        for q in ["tt.eu", "tt.celery", "tt.sensors"]:
            self.admin.queue_declare(q)
        self.admin.queue_bind("tt.eu", "tt.orders", "eu")
        self.admin.queue_bind("tt.sensors", "tt.events", "sensor.*.temp")

    def tearDown(self):
        try:
            for q in ["tt.eu", "tt.celery", "tt.sensors"]:
                self.admin.queue_delete(q)
            for x in ["tt.orders", "tt.events"]:
                self.admin.exchange_delete(x)
            self.admin_conn.close()
        finally:
            super().tearDown()

    def start(self, extra=()):
        self.defs = os.path.join(self.id_dir(), "definitions.json")
        export_definitions(self.defs)
        self.mport = free_port()
        tap = self.start_tap(["--definitions", self.defs, "--topology-interval", "2", "--metrics",
                              f"127.0.0.1:{self.mport}", *extra])
        self.assertIn("definitions loaded:", tap.stderr())
        return tap

    def id_dir(self):
        if not hasattr(self, "_dir"):
            import tempfile
            self._dir = tempfile.mkdtemp(prefix="test_topology-")
        return self._dir

    def publisher(self, tap, confirm=False):
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tap.port))
        ch = conn.channel()
        if confirm:
            ch.confirm_delivery()
        return conn, ch

    def wait_records(self, tap, n):
        self.assertTrue(wait_for(lambda: len(tap.records("publish")) >= n, 10),
                        f"{len(tap.records('publish'))} publish records, want {n}")
        return tap.records()

    def drops(self, records, key=None):
        return [r for r in records if r.get("type") == "warning" and r["rule"] == "dropped_by_topology"
                and (key is None or r["routing_key"] == key)]

    def test_dropped_by_topology_and_metrics(self):
        tap = self.start()
        conn, ch = self.publisher(tap)
        ch.basic_publish("tt.orders", "eu", b"x")
        for _ in range(5):
            ch.basic_publish("tt.orders", "us", b"x")  # a typo'd key: the broker drops these silently
        ch.basic_publish("tt.events", "sensor.floor1.temp.critical", b"x")  # 4 words against sensor.*.temp
        ch.basic_publish("tt.events", "sensor.floor1.temp", b"x")
        conn.close()
        recs = self.wait_records(tap, 8)
        pubs = tap.records("publish")
        by_key = {}
        for p in pubs:
            by_key.setdefault(p["routing_key"], []).append(p)
        self.assertEqual(by_key["eu"][0]["topology"], {"queues": ["tt.eu"], "count": 1})
        self.assertEqual(by_key["us"][0]["topology"], {"queues": [], "count": 0})
        self.assertEqual(by_key["sensor.floor1.temp"][0]["topology"], {"queues": ["tt.sensors"], "count": 1})
        self.assertEqual(by_key["us"][0]["route"], "unproven")  # the broker's evidence is still none
        self.assertEqual(len(self.drops(recs, "us")), 1, "once per exchange and key per interval")
        self.assertEqual(len(self.drops(recs, "sensor.floor1.temp.critical")), 1)
        self.assertEqual(len(self.drops(recs)), 2)
        w = self.drops(recs, "us")[0]
        self.assertEqual(w["exchange"], "tt.orders")
        _, _, body = http_get(self.mport, "/metrics")
        text = body.decode()
        self.assertIn('amqptap_warnings_total{rule="dropped_by_topology"} 2', text)
        self.assertIn('amqptap_exchange_dropped_by_topology_total{exchange="tt.orders"} 5', text)
        self.assertIn('amqptap_exchange_dropped_by_topology_total{exchange="tt.events"} 1', text)
        lint = subprocess.run(["/usr/bin/promtool", "check", "metrics"], input=body, capture_output=True, timeout=30)
        self.assertEqual((lint.returncode, lint.stdout + lint.stderr), (0, b""))
        # past the interval the same key warns again
        time.sleep(2.1)
        conn, ch = self.publisher(tap)
        ch.basic_publish("tt.orders", "us", b"x")
        conn.close()
        recs = self.wait_records(tap, 9)
        self.assertEqual(len(self.drops(recs, "us")), 2)

    def test_celery_recipe(self):
        # Celery publishes a task to the default exchange with its queue's name as the key, not mandatory
        tap = self.start()
        conn, ch = self.publisher(tap, confirm=True)
        props = pika.BasicProperties(delivery_mode=2, message_id="task-1", content_type="application/json",
                                     headers={"task": "tasks.add", "id": "task-1"})
        ch.basic_publish("", "tt.celery", b'[[2, 2], {}, {}]', props)
        props.message_id = "task-2"
        ch.basic_publish("", "tt.celery-typo", b'[[2, 2], {}, {}]', props)
        conn.close()
        recs = self.wait_records(tap, 2)
        pubs = {p["message_id"]: p for p in tap.records("publish")}
        self.assertEqual(pubs["task-1"]["route"], "unproven")
        self.assertEqual(pubs["task-2"]["route"], "unproven")  # without the model the two look alike
        self.assertEqual(pubs["task-1"]["topology"]["count"], 1)
        self.assertEqual(pubs["task-2"]["topology"]["count"], 0)
        drops = self.drops(recs)
        self.assertEqual([(d["exchange"], d["routing_key"]) for d in drops], [("", "tt.celery-typo")])
        self.admin.queue_purge("tt.celery")

    def test_mismatch_and_reload(self):
        tap = self.start()
        # the binding goes on the broker; the definitions still have it
        self.admin.queue_unbind("tt.eu", "tt.orders", "eu")
        conn, ch = self.publisher(tap, confirm=True)
        props = pika.BasicProperties(delivery_mode=2, message_id="m1")
        try:
            ch.basic_publish("tt.orders", "eu", b"x", props, mandatory=True)
        except pika.exceptions.UnroutableError:
            pass
        conn.close()
        recs = self.wait_records(tap, 1)
        pub = tap.records("publish")[0]
        self.assertEqual(pub["route"], "returned")
        self.assertEqual(pub["topology"]["count"], 1)
        mism = [r for r in recs if r.get("type") == "warning" and r["rule"] == "topology_mismatch"]
        self.assertEqual(len(mism), 1, recs)
        self.assertEqual((mism[0]["route"], mism[0]["model_routes"], mism[0]["routing_key"]), ("returned", True, "eu"))
        # SIGHUP with a broken file: the last good model stays
        good = open(self.defs, "rb").read()
        with open(self.defs, "w") as f:
            f.write('{"queues":[')
        tap.proc.send_signal(signal.SIGHUP)
        self.assertTrue(wait_for(lambda: "the last good definitions stay" in tap.stderr(), 5), tap.stderr())
        conn, ch = self.publisher(tap)
        ch.basic_publish("tt.orders", "eu", b"x", pika.BasicProperties(message_id="m2"))
        conn.close()
        self.wait_records(tap, 2)
        self.assertEqual({p["message_id"]: p for p in tap.records("publish")}["m2"]["topology"]["count"], 1)
        # SIGHUP with the broker's definitions now: the binding is gone, so the same publish is dropped
        self.assertNotEqual(good, b"")
        export_definitions(self.defs)
        tap.proc.send_signal(signal.SIGHUP)
        self.assertTrue(wait_for(lambda: "definitions reloaded:" in tap.stderr(), 5), tap.stderr())
        conn, ch = self.publisher(tap)
        ch.basic_publish("tt.orders", "eu", b"x", pika.BasicProperties(message_id="m3"))
        conn.close()
        recs = self.wait_records(tap, 3)
        self.assertEqual({p["message_id"]: p for p in tap.records("publish")}["m3"]["topology"]["count"], 0)
        self.assertEqual(len(self.drops(recs, "eu")), 1)

    def test_management_poll(self):
        # --management: the definitions polled from the broker's management API; a binding deleted mid-stream is
        # judged within one poll interval; a poll that fails is said (stderr, a topology record), the password never
        mgmt = os.environ.get("TAP_BROKER_MGMT_PORT")
        if not mgmt:
            self.skipTest("TAP_BROKER_MGMT_PORT is not set: the broker has no management plugin")
        cred = os.path.join(self.id_dir(), "cred")
        with open(cred, "w") as f:
            f.write("guest:guest\n")
        os.chmod(cred, 0o600)
        # a host name (resolved by evdns on the loop, /etc/hosts here), not an address
        tap = self.start_tap(["--management", f"http://localhost:{mgmt}", "--management-credentials", cred,
                              "--topology-interval", "1"])
        self.assertTrue(wait_for(lambda: "definitions polled:" in tap.stderr(), 10), tap.stderr())
        conn, ch = self.publisher(tap)
        ch.basic_publish("tt.orders", "eu", b"x", pika.BasicProperties(message_id="before"))
        self.wait_records(tap, 1)
        self.assertEqual(tap.records("publish")[0]["topology"]["count"], 1)
        self.admin.queue_unbind("tt.eu", "tt.orders", "eu")
        t0 = time.monotonic()
        n = 1
        while not self.drops(tap.records(), "eu") and time.monotonic() - t0 < 5:
            ch.basic_publish("tt.orders", "eu", b"x", pika.BasicProperties(message_id=f"after-{n}"))
            n += 1
            self.wait_records(tap, n)
            time.sleep(0.1)
        took = time.monotonic() - t0
        conn.close()
        self.assertTrue(self.drops(tap.records(), "eu"), "no dropped_by_topology after the binding went")
        self.assertLess(took, 2.5, "within one poll interval (1 s) and the poll's own time")
        # a wrong password: the poll fails, the tap goes on without a model, and says so
        with open(cred, "w") as f:
            f.write("guest:not-the-password\n")
        bad = self.start_tap(["--management", f"http://127.0.0.1:{mgmt}", "--management-credentials", cred,
                              "--topology-interval", "1"])
        self.assertTrue(wait_for(lambda: "HTTP 401" in bad.stderr(), 10), bad.stderr())
        self.assertTrue(wait_for(lambda: any(r.get("event") == "poll_failed" for r in bad.records("topology")), 5))
        # a name no resolver answers: the poll fails (asynchronously, evdns) naming it, the relay is not held up
        nx = self.start_tap(["--management", "http://no-such-host.invalid:1", "--management-credentials", cred])
        conn, ch = self.publisher(nx)
        ch.basic_publish("tt.orders", "eu", b"x", pika.BasicProperties(message_id="nx"))
        conn.close()
        self.wait_records(nx, 1)
        self.assertTrue(wait_for(lambda: any(r.get("event") == "poll_failed" and "no-such-host.invalid" in r["error"]
                                             for r in nx.records("topology")), 10), nx.stderr())
        for t in (tap, bad):
            self.assertNotIn("not-the-password", t.stderr())
            with open(t.verdicts) as f:
                self.assertNotIn("not-the-password", f.read())

    def test_bad_definitions_exit_2(self):
        path = os.path.join(self.id_dir(), "bad.json")
        with open(path, "w") as f:
            json.dump({"policies": [{"name": "p", "vhost": "/", "pattern": "a" * 5000, "definition": {}}]}, f)
        from tapharness import AMQPTAP_BIN
        r = subprocess.run([AMQPTAP_BIN, "--listen", f"127.0.0.1:{free_port()}", "--definitions", path],
                           capture_output=True, text=True, timeout=10)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("--definitions", lines[0])
        self.assertIn("pattern of 5000 bytes", lines[0])


if __name__ == "__main__":
    main()
