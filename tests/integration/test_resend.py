# Following a message across reconnects (issue 33, src/DESIGN.md §4b): real pika publishers with confirms go through
# the tap to the test broker; their connection is closed by the broker (`rabbitmqctl close_connection`) or the broker
# is killed -9 and restarted keeping its data while publishes wait unconfirmed (a memory alarm keeps the broker from
# reading them, so a known number is left unknown). The publisher reconnects and resends its unconfirmed set, or
# does not, or also resends some it had acked; `amqptap audit` over the verdict files must say which.

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
import pika.spec

from scenario_lib import ScenarioCase, broker_sh, params
from tapharness import (AMQPTAP_BIN, CLIENTS_DIR, SOURCE_DIR, chromium, free_port, http_get, main, page_findings,
                        read_records, wait_for)

N = 20  # publishes left unconfirmed when the connection dies


def ctl(*args, check=True):
    out = subprocess.run([os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "broker.sh"), "ctl", *args],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    if check and out.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {out.stderr[-500:]}")
    return out.stdout


def memory_alarm(on):
    """The broker blocks publishing connections (reads nothing more of them) while its memory alarm is on."""
    ctl("set_vm_memory_high_watermark", "0.0000001" if on else "0.4")


def audit(*files, json_out=True, stdin=None):
    args = [AMQPTAP_BIN, "audit", *(["--json"] if json_out else []), *files]
    p = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=120)
    return p.returncode, (json.loads(p.stdout) if json_out and p.stdout.strip() else p.stdout), p.stderr


class Publisher:
    """pika with confirms answered asynchronously (pika's own channel under the blocking adapter), keeping what is
    unconfirmed as an at-least-once publisher must: seq -> (message_id, body)."""

    def __init__(self, queue, name, message_ids=True):
        self.queue, self.name, self.message_ids = queue, name, message_ids
        self.conn = None
        self.pending, self.acked = {}, []

    def connect(self, port, attempts=1):
        self.conn = pika.BlockingConnection(params(port, connection_attempts=attempts, retry_delay=1,
                                                   client_properties={"connection_name": self.name}))
        self.ch = self.conn.channel()
        self.seq = 0
        self.pending = {}
        self.ch._impl.confirm_delivery(ack_nack_callback=self._on_confirm)
        self.conn.process_data_events(time_limit=0.2)

    def _on_confirm(self, frame):
        m = frame.method
        tags = [s for s in self.pending if s <= m.delivery_tag] if m.multiple else [m.delivery_tag]
        for s in tags:
            entry = self.pending.pop(s, None)
            if entry and isinstance(m, pika.spec.Basic.Ack):
                self.acked.append(entry)

    def publish(self, mid, body):
        self.seq += 1
        self.pending[self.seq] = (mid, body)
        props = pika.BasicProperties(message_id=mid if self.message_ids else None, delivery_mode=2)
        self.ch.basic_publish("", self.queue, body, props)

    def pump(self, secs=0.2):
        self.conn.process_data_events(time_limit=secs)

    def wait_confirms(self, timeout=30):
        end = time.monotonic() + timeout
        while self.pending and time.monotonic() < end:
            self.pump()
        return not self.pending

    def wait_closed(self, timeout=30):
        """Reads until the broker's close (or the connection's end) reaches pika; returns the unconfirmed set."""
        end = time.monotonic() + timeout
        try:
            while time.monotonic() < end:
                self.pump()
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.StreamLostError,
                pika.exceptions.ConnectionClosedByBroker, pika.exceptions.ChannelWrongStateError):
            return list(self.pending.values())
        raise AssertionError("the connection did not end")

    def close(self):
        try:
            if self.conn and self.conn.is_open:
                self.conn.close()
        except pika.exceptions.AMQPError:
            pass


class ResendBase(ScenarioCase):
    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix="amqptap-resend-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.addCleanup(lambda: memory_alarm(False))

    def tap(self, name, window_ms=60000):
        mport = free_port()
        tap = self.start_tap(["--tap-id", name, "--resend-window", str(window_ms), "--metrics", f"127.0.0.1:{mport}"],
                             frames=False)
        tap.path = tap.verdicts
        tap.mport = mport
        return tap

    @staticmethod
    def metric(tap, name):
        """The value of an unlabelled series on the tap's /metrics."""
        status, _, body = http_get(tap.mport, "/metrics")
        for line in body.decode().splitlines():
            if line.startswith(f"amqptap_{name} "):
                return float(line.split()[1])
        raise AssertionError(f"no amqptap_{name} on /metrics")

    def broker_connection_of(self, tap):
        """The broker's pid of the tap's connection to it (its name: "the tap's local address -> broker")."""
        opens = lambda: [r for r in tap.records("connection") if r.get("event") == "open"]  # noqa: E731
        wait_for(opens, 10)
        local = opens()[-1]["upstream_local"] + " "
        wait_for(lambda: local in ctl("list_connections", "name", "pid"), 20)
        line = next(ln for ln in ctl("list_connections", "name", "pid").splitlines() if local in ln)
        return line.split("\t")[-1].strip()

    def strand(self, pub, tap, how="close"):
        """N publishes left unconfirmed, then the connection dies: by close_connection or a broker kill -9 and
        restart. Returns the unconfirmed set the publisher kept."""
        name = self.broker_connection_of(tap)
        memory_alarm(True)
        pub.pump(0.5)
        base = len(pub.acked) + len(pub.pending)
        for i in range(N):
            pub.publish(f"{pub.name}-{base + i}", f"body {pub.name} {base + i}".encode())
        pub.pump(0.5)
        if how == "close":
            ctl("close_connection", name, "test: forced close")
            lost = pub.wait_closed()
            memory_alarm(False)
        else:
            broker_sh("kill")
            lost = pub.wait_closed()
            broker_sh("start")
        self.assertEqual(len(lost), N, "the broker confirmed some while blocked: scenario not exercised")
        return lost

    def publish_some(self, pub, n, start=0):
        for i in range(start, start + n):
            pub.publish(f"{pub.name}-{i}", f"body {pub.name} {i}".encode())
        self.assertTrue(pub.wait_confirms(), "not all confirmed")

    def queue_depth(self, q):
        return self.admin().queue_declare(q, passive=True).method.message_count

    def run_case(self, how="close", resend=True, extra_acked=0, message_ids=True, second_tap=False, live=None):
        q = self.declare_queue("q", durable=True)
        name = f"resend-{uuid.uuid4().hex[:6]}"
        window = 60000 if resend else 3000  # a settled identity is kept that long too (duplicates)
        tap_a = self.tap("a", window_ms=window)
        tap_b = self.tap("b", window_ms=window) if second_tap else tap_a
        pub = Publisher(q, name, message_ids)
        pub.connect(tap_a.port)
        self.publish_some(pub, 10)
        lost = self.strand(pub, tap_a, how)
        pub.connect(tap_b.port, attempts=30)
        again = lost + (pub.acked[:extra_acked] if extra_acked else [])
        if resend:
            for mid, body in again:
                pub.seq += 1
                pub.pending[pub.seq] = (mid, body)
                props = pika.BasicProperties(message_id=mid if message_ids else None, delivery_mode=2)
                pub.ch.basic_publish("", q, body, props)
            self.assertTrue(pub.wait_confirms(), "the resends were not confirmed")
        pub.close()
        if not resend:
            time.sleep(3.5)  # the tap's --resend-window
        wait_for(lambda: self.metric(tap_b, "resends_total") >= (N if resend and not second_tap else 0), 5)
        self.metrics = {k: self.metric(tap_b, k) for k in ("resends_total", "duplicates_total", "resend_missing_total",
                                                          "resend_delay_seconds_count")}
        if not resend:
            self.metrics["resend_missing_total"] = self.metric(tap_a, "resend_missing_total")
        if live:
            live(tap_a, lost)
        for t in {id(tap_a): tap_a, id(tap_b): tap_b}.values():
            self.assertEqual(t.stop(), 0, t.stderr()[-2000:])
        return q, name, lost, tap_a, tap_b

    def check_records(self, recs, lost, resend, message_ids=True):
        pubs = [r for r in recs if r["type"] == "publish"]
        unknown = [r for r in pubs if r["confirm"] == "unknown"]
        self.assertEqual(len(unknown), N, [r.get("reason") for r in unknown])
        for r in pubs:
            self.assertRegex(r["identity"], "^id:" if message_ids else "^fp:")
            self.assertIn("published", r)
        first_conn = unknown[0]["conn"]
        resends = [r for r in pubs if r.get("repeat") == "resend"]
        if resend:
            self.assertEqual(len(resends), N)
            by_identity = {r["identity"]: r for r in unknown}
            for r in resends:
                prev = by_identity[r["identity"]]
                self.assertEqual(r["attempt"], 2)
                self.assertEqual(r["previous"]["seq"], prev["seq"], r)
                self.assertEqual(r["previous"]["confirm"], "unknown")
                self.assertGreater(r["previous"]["ago_us"], 0)
                self.assertNotEqual(r["conn"], first_conn, r)
            self.assertEqual([r for r in recs if r["type"] == "resend_missing"], [])
        else:
            self.assertEqual(resends, [])
            missing = [r for r in recs if r["type"] == "resend_missing"]
            self.assertEqual(sorted(m["identity"] for m in missing), sorted(r["identity"] for r in unknown))
            for m in missing:
                self.assertTrue(m["window_over"], m)
        return pubs



class ResendTest(ResendBase):
    def test_close_connection_resent(self):
        """pika resends its unconfirmed set after rabbitmqctl close_connection: each unknown is followed by a
        resend on the new connection, and audit exits 0."""
        q, name, lost, tap, _ = self.run_case()
        recs = read_records(tap.path)
        self.check_records(recs, lost, True)
        opens = [r for r in recs if r["type"] == "connection" and r["event"] == "open"]
        self.assertTrue(all(o["connection_name"] == name for o in opens), opens)
        self.assertTrue(opens[0]["capabilities"]["publisher_confirms"], opens[0])
        self.assertEqual(self.metrics, {"resends_total": N, "duplicates_total": 0, "resend_missing_total": 0,
                                        "resend_delay_seconds_count": N})
        rc, s, err = audit(tap.path)
        self.assertEqual(rc, 0, (s, err))
        self.assertEqual((s["unknown"], s["resent"], s["missing"], s["duplicates"]), (N, N, 0, 0), s)
        self.assertEqual(s["by_application"][0]["name"], name)
        rc, text, _ = audit(tap.path, json_out=False)
        self.assertEqual(rc, 0)
        self.assertIn(name, text)
        self.assertEqual(self.queue_depth(q), 10 + N)

    def test_close_connection_not_resent(self):
        """The same publisher with resending switched off: resend_missing for every unconfirmed one, audit exits 1
        and names them (stdin too)."""
        q, name, lost, tap, _ = self.run_case(resend=False, live=self.check_page)
        recs = read_records(tap.path)
        self.check_records(recs, lost, False)
        self.assertEqual(self.metrics["resend_missing_total"], N)
        rc, s, err = audit(tap.path)
        self.assertEqual(rc, 1, (s, err))
        self.assertEqual((s["unknown"], s["resent"], s["missing"]), (N, 0, N))
        self.assertEqual(sorted(s["missing_ids"]), sorted(mid for mid, _ in lost))
        with open(tap.path) as f:
            rc, s2, _ = audit("-", stdin=f.read())
        self.assertEqual((rc, s2["missing"]), (1, N))

    def check_page(self, tap, lost):
        """While the tap runs: /api/status lists the latest resend_missing records, and the status page, rendered by
        Chromium, shows them with a finding on top."""
        _, _, body = http_get(tap.mport, "/api/status")
        status = json.loads(body)
        ids = sorted(mid for mid, _ in lost)
        self.assertEqual(status["resend_missing"]["seen"], N)
        self.assertEqual(sorted(r["message_id"] for r in status["resend_missing"]["rows"]), ids)
        run = chromium(self, f"http://127.0.0.1:{tap.mport}/", "--dump-dom")
        self.assertEqual(run.returncode, 0, run.stderr.decode()[-2000:])
        dom = run.stdout.decode("utf-8", "replace")
        table = re.search(r'<table id="missing">(.*?)</table>', dom, re.S)
        self.assertIsNotNone(table, dom[:3000])
        rows = [[re.sub(r"<[^>]+>", "", td) for td in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
                for tr in re.findall(r'<tr class="missing"[^>]*>(.*?)</tr>', table.group(1), re.S)]
        self.assertEqual(sorted(r[2] for r in rows), ids, rows)
        self.assertTrue(all(r[1].startswith("conn ") and "attempt 1" in r[3] for r in rows), rows)
        self.assertIn(f"{N} unknown publish(es) not published again within --resend-window: lost, unless the "
                      "publisher resent them through another tap (see Missing resends).", page_findings(self, tap.mport))

    def test_resending_acked_ones_are_duplicates(self):
        """A publisher that also resends 5 messages it had acked: each is a duplicate, and the count is the queue
        depth minus the distinct ids."""
        q, name, lost, tap, _ = self.run_case(extra_acked=5)
        recs = read_records(tap.path)
        pubs = [r for r in recs if r["type"] == "publish"]
        dups = [r for r in pubs if r.get("repeat") == "duplicate"]
        self.assertEqual(len(dups), 5)
        self.assertEqual(self.metrics["duplicates_total"], 5)
        for r in dups:
            self.assertEqual(r["previous"]["confirm"], "ack", r)
        distinct = len({r["message_id"] for r in pubs})
        self.assertEqual(self.queue_depth(q) - distinct, 5)
        rc, s, _ = audit(tap.path)
        self.assertEqual((rc, s["duplicates"], s["resent"], s["missing"]), (0, 5, N, 0), s)

    def test_fingerprint_links_resends_without_message_ids(self):
        """No message_id at all: the fingerprint (exchange, routing key, properties, body) links the resends."""
        q, name, lost, tap, _ = self.run_case(message_ids=False)
        recs = read_records(tap.path)
        self.check_records(recs, lost, True, message_ids=False)
        rc, s, _ = audit(tap.path)
        self.assertEqual((rc, s["resent"], s["missing"]), (0, N, 0), s)

    def test_two_taps(self):
        """The client reconnects to a second tap (another process): each tap alone sees unknowns never resent or
        resends of nothing, audit of both files (either order) links them and exits 0."""
        q, name, lost, tap_a, tap_b = self.run_case(second_tap=True)
        a, b = read_records(tap_a.path), read_records(tap_b.path)
        self.assertEqual(len([r for r in a if r["type"] == "publish" and r["confirm"] == "unknown"]), N)
        self.assertEqual([r for r in b if r.get("repeat")], [])  # tap b never saw the first attempts
        self.assertEqual(audit(tap_a.path)[0], 1)
        for order in ((tap_a.path, tap_b.path), (tap_b.path, tap_a.path)):
            rc, s, err = audit(*order)
            self.assertEqual((rc, s["resent"], s["missing"], s["unknown"]), (0, N, 0, N), (order, s, err))
            self.assertIsNotNone(s["resend_delay_us"]["p50"])

    def test_broker_killed_and_restarted(self):
        """kill -9 of the broker with N unconfirmed, restart keeping its data: resent on the new connection."""
        q, name, lost, tap, _ = self.run_case(how="kill")
        recs = read_records(tap.path)
        self.check_records(recs, lost, True)
        rc, s, _ = audit(tap.path)
        self.assertEqual((rc, s["resent"], s["missing"]), (0, N, 0), s)


def build_go_publisher():
    out = os.path.join(CLIENTS_DIR, "resend_go")
    src = os.path.join(SOURCE_DIR, "tests", "clients", "resend", "resend.go")
    if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(src):
        return out
    os.makedirs(CLIENTS_DIR, exist_ok=True)
    env = dict(os.environ, GO111MODULE="off", GOPATH="/usr/share/gocode")
    env.setdefault("GOCACHE", os.path.join(CLIENTS_DIR, ".gocache"))
    subprocess.run(["go", "build", "-o", out, src], check=True, env=env, cwd=os.path.dirname(src))
    return out


class GoResendTest(ResendBase):
    """The same with Go's amqp091-go (tests/clients/resend/resend.go), closed by rabbitmqctl close_connection."""

    def go_case(self, resend):
        binary = build_go_publisher()
        q = self.declare_queue("q", durable=True)
        name = f"go-{uuid.uuid4().hex[:6]}"
        tap = self.tap("a", window_ms=60000 if resend else 3000)
        url = f"amqp://guest:guest@127.0.0.1:{tap.port}/"
        proc = subprocess.Popen([binary, url, url, q, name, str(N), "resend" if resend else "none"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(proc.kill)
        self.assertEqual(proc.stdout.readline().strip(), "ready", proc.stderr.read() if proc.poll() else "")
        conn = self.broker_connection_of(tap)
        memory_alarm(True)
        time.sleep(0.5)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        self.assertEqual(proc.stdout.readline().strip(), "published")
        time.sleep(0.5)
        ctl("close_connection", conn, "test: forced close")
        self.assertEqual(proc.stdout.readline().strip(), f"closed {N}")
        memory_alarm(False)
        proc.stdin.write("reconnect\n")
        proc.stdin.flush()
        self.assertEqual(proc.stdout.readline().strip(), "done", proc.stderr.read())
        self.assertEqual(proc.wait(30), 0)
        if not resend:
            time.sleep(3.5)
        self.assertEqual(tap.stop(), 0, tap.stderr()[-2000:])
        return tap

    def test_go_resent(self):
        tap = self.go_case(True)
        recs = read_records(tap.path)
        self.check_records(recs, None, True)
        rc, s, _ = audit(tap.path)
        self.assertEqual((rc, s["unknown"], s["resent"], s["missing"]), (0, N, N, 0), s)

    def test_go_not_resent(self):
        tap = self.go_case(False)
        recs = read_records(tap.path)
        self.check_records(recs, None, False)
        rc, s, _ = audit(tap.path)
        self.assertEqual((rc, s["missing"], len(s["missing_ids"])), (1, N, N), s)


JAVA_CP = ["/usr/share/java/amqp-client.jar", "/usr/share/java/slf4j-api.jar"]


def build_java_publisher():
    src = os.path.join(SOURCE_DIR, "tests", "clients", "resend", "Resend.java")
    out = os.path.join(CLIENTS_DIR, "java-resend")
    cls = os.path.join(out, "Resend.class")
    if not os.path.exists(cls) or os.path.getmtime(cls) < os.path.getmtime(src):
        os.makedirs(out, exist_ok=True)
        subprocess.run(["javac", "-cp", ":".join(JAVA_CP), "-d", out, src], check=True)
    return ["java", "-cp", ":".join([*JAVA_CP, out]), "Resend"]


class JavaResendTest(ResendBase):
    """The Java client with automatic recovery: the library reconnects and recovers the channel after
    close_connection, the application resends what was unconfirmed."""

    def test_java_recovery_resent(self):
        if not os.path.exists(JAVA_CP[0]):
            self.skipTest("librabbitmq-client-java is not installed")
        cmd = build_java_publisher()
        q = self.declare_queue("q", durable=True)
        name = f"java-{uuid.uuid4().hex[:6]}"
        tap = self.tap("a")
        proc = subprocess.Popen([*cmd, "127.0.0.1", str(tap.port), q, name, str(N)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(proc.kill)
        self.assertEqual(proc.stdout.readline().strip(), "ready", proc.stderr.read() if proc.poll() else "")
        conn = self.broker_connection_of(tap)
        memory_alarm(True)
        time.sleep(0.5)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        self.assertEqual(proc.stdout.readline().strip(), "published")
        time.sleep(0.5)
        ctl("close_connection", conn, "test: forced close")
        self.assertEqual(proc.stdout.readline().strip(), f"closed {N}")
        memory_alarm(False)
        self.assertEqual(proc.stdout.readline().strip(), "done", proc.stderr.read() if proc.poll() else "")
        self.assertEqual(proc.wait(30), 0)
        self.assertEqual(tap.stop(), 0, tap.stderr()[-2000:])
        recs = read_records(tap.path)
        self.check_records(recs, None, True)
        rc, s, _ = audit(tap.path)
        self.assertEqual((rc, s["unknown"], s["resent"], s["missing"]), (0, N, N, 0), s)
        self.assertEqual(s["by_application"][0]["name"], name)


class KombuResendTest(ResendBase):
    """kombu's publish(retry=True) with publisher confirms (py-amqp): the one publish waiting for its confirm when
    the broker closes the connection is published again on the connection kombu makes anew."""

    def test_kombu_retry(self):
        import threading

        import kombu
        q = self.declare_queue("q", durable=True)
        tap = self.tap("a")
        conn = kombu.Connection(f"amqp://guest:guest@127.0.0.1:{tap.port}//",
                                transport_options={"confirm_publish": True})
        producer = kombu.Producer(conn)
        producer.publish(b"first", routing_key=q, message_id="kombu-0", delivery_mode=2)
        name = self.broker_connection_of(tap)
        memory_alarm(True)
        done = []
        policy = {"max_retries": 30, "interval_start": 0.5, "interval_step": 0.5, "interval_max": 1}
        th = threading.Thread(target=lambda: done.append(producer.publish(
            b"second", routing_key=q, message_id="kombu-1", delivery_mode=2, retry=True, retry_policy=policy)))
        th.start()
        time.sleep(1.0)
        ctl("close_connection", name, "test: forced close")
        time.sleep(1.0)
        memory_alarm(False)
        th.join(60)
        self.assertFalse(th.is_alive(), "kombu's publish never returned")
        conn.release()
        self.assertEqual(tap.stop(), 0, tap.stderr()[-2000:])
        pubs = [r for r in read_records(tap.path) if r["type"] == "publish" and r["message_id"] == "kombu-1"]
        self.assertEqual([(r["confirm"], r.get("repeat")) for r in pubs], [("unknown", None), ("ack", "resend")], pubs)
        rc, s, _ = audit(tap.path)
        self.assertEqual((rc, s["unknown"], s["resent"], s["missing"]), (0, 1, 1, 0), s)


class AuditCliTest(ScenarioCase):
    def test_bad_input(self):
        rc, _, err = audit("--window", "x", "f")
        self.assertEqual(rc, 2)
        self.assertIn("--window", err)
        self.assertEqual(len(err.strip().splitlines()), 1)
        rc, _, err = audit("/nonexistent/verdicts.jsonl")
        self.assertEqual(rc, 2)
        self.assertIn("/nonexistent/verdicts.jsonl", err)
        rc, _, err = audit("--frobnicate")
        self.assertEqual(rc, 2)
        rc, _, err = audit()
        self.assertEqual(rc, 2)


if __name__ == "__main__":
    main()
