# The --metrics endpoint against what could take it down or make it say too much (src/DESIGN.md §6c): exchanges whose
# names look like the tap's pseudo labels or differ only in bytes that are not UTF-8 (of a series that comes twice
# in a scrape Prometheus keeps one sample and drops the other: a real Prometheus must show each exchange's own
# count); idle and slow connections past the cap
# (a scrape still gets in at once); a scrape storm (each page is rendered at most once a second, the rest get that
# copy); the warning when the endpoint is not on loopback; /api/status leaving --header-values out; HEAD answered
# without a body on a keep-alive connection; a foreign Host refused.

import collections
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pika
import pika.exceptions

from tapharness import free_port, http_get, main, proc_stat, wait_for
from scenario_lib import ScenarioCase
from test_metrics import MAX_HTTP_CONNS, metric_samples, note, start_metrics_tap, start_prometheus

PROMTOOL = "/usr/bin/promtool"


def series_keys(text):
    """The series (name and labels, as written) of every sample line of a Prometheus text body."""
    return [line.rpartition(" ")[0] for line in text.splitlines() if line and not line.startswith("#")]


def prom_query(port, expr):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        res = json.load(r)
    assert res["status"] == "success", res
    return res["data"]["result"]


class ExchangeSeries(ScenarioCase):
    def test_exchange_names_never_share_a_series(self):
        """RabbitMQ takes "(other)" and "(AMQP default)" as exchange names, and a client may publish to a name that
        is not UTF-8: each exchange keeps a series of its own, apart from the pseudo ones, and a real Prometheus
        takes the scrape whole."""
        queue = self.declare_queue("q")
        for name in ("(other)", "(AMQP default)"):  # names of the tap's pseudo labels, taken for real
            self.admin().exchange_declare(name, "fanout")
            self.addCleanup(self._delete, "exchange", name)
            self.admin().queue_bind(queue, name)
        tap, mport = start_metrics_tap(self)
        conn = self.connect(tap)
        ch = conn.channel()
        ch.confirm_delivery()
        sent = {"": 1, "(AMQP default)": 2, "(other)": 3}
        for exchange, n in sent.items():
            for _ in range(n):
                ch.basic_publish(exchange, queue, b"m", mandatory=True)
        # two names that differ only in a byte that is not UTF-8 (no such exchange: the broker closes the channel)
        bad = [f"{self.prefix}.x".encode() + b"\xff", f"{self.prefix}.x".encode() + b"\xfe"]
        for name in bad:
            c = conn.channel()
            c.basic_publish(name, "k", b"m")
            self.assertTrue(wait_for(lambda: conn.process_data_events(0.05) or c.is_closed, 10))
        self.assertTrue(self.wait_records(tap, lambda recs: len(recs) == 6 + len(bad)))

        text = http_get(mport, "/metrics")[2].decode()
        keys = series_keys(text)
        twice = [k for k, n in collections.Counter(keys).items() if n > 1]
        self.assertEqual(twice, [], "a series twice in one scrape")
        m = metric_samples(text)

        def total(label):
            return sum(m.get(f'amqptap_exchange_publishes_total{{exchange="{label}",route="{route}"}}', -100)
                       for route in ("routed", "returned", "unproven", "unknown"))
        self.assertEqual(total("(AMQP default)"), 1)  # the default exchange ""
        self.assertEqual(total("\\\\(AMQP default)"), 2)  # label value \(AMQP default)
        self.assertEqual(total("\\\\(other)"), 3)
        self.assertEqual(total("(other)"), 0)  # the pseudo one: no exchange without a series here
        self.assertEqual(total(f"{self.prefix}.x\\\\xff"), 1)  # label value ...x\xff
        self.assertEqual(total(f"{self.prefix}.x\\\\xfe"), 1)
        checked = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
        self.assertEqual(checked.returncode, 0, checked.stdout.decode() + checked.stderr.decode())

        prom = start_prometheus(self, mport)

        def scraped():
            up = prom_query(prom, 'up{job="amqptap"}')
            return up and up[0]["value"][1] == "1" and prom_query(prom, "amqptap_exchange_publishes_total")
        self.assertTrue(wait_for(scraped, 30, 0.5), "Prometheus did not take a scrape")
        got = {r["metric"]["exchange"]: float(r["value"][1])
               for r in prom_query(prom, "sum by (exchange) (amqptap_exchange_publishes_total)")}
        self.assertEqual(got, {"(AMQP default)": 1, "\\(AMQP default)": 2, "\\(other)": 3, "(other)": 0,
                               f"{self.prefix}.x\\xff": 1, f"{self.prefix}.x\\xfe": 1})
        series = prom_query(prom, "count(amqptap_exchange_publishes_total)")
        self.assertEqual(float(series[0]["value"][1]), 6 * 4, "a series of each exchange and route")


class IdleConnections(ScenarioCase):
    def test_idle_and_slow_connections_do_not_lock_out_scrapes(self):
        """The cap's worth of connections and more that send nothing, or a request line and no more: /healthz and
        /metrics still answer at once, also while the idle ones keep coming back, and never past the cap."""
        tap, mport = start_metrics_tap(self)
        base_fds = len(os.listdir(f"/proc/{tap.pid}/fd"))
        socks = []
        self.addCleanup(lambda: [s.close() for s in socks])
        for i in range(MAX_HTTP_CONNS + 8):
            s = socket.create_connection(("127.0.0.1", mport), timeout=5)
            if i % 2:
                s.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
            socks.append(s)
        time.sleep(0.5)
        for path in ("/healthz", "/metrics", "/api/status"):
            t0 = time.monotonic()
            status, _, _ = http_get(mport, path, timeout=2)
            self.assertEqual(status, 200, path)
            self.assertLess(time.monotonic() - t0, 2, path)

        # idle connections that keep coming back as fast as the tap closes them
        done = threading.Event()

        def reopen():
            while not done.is_set():
                try:
                    socks.append(socket.create_connection(("127.0.0.1", mport), timeout=1))
                except OSError:
                    pass
                if len(socks) > 4 * MAX_HTTP_CONNS:
                    socks.pop(0).close()
                done.wait(0.005)
        t = threading.Thread(target=reopen, daemon=True)
        t.start()
        try:
            for _ in range(10):
                t0 = time.monotonic()
                status, _, body = http_get(mport, "/metrics", timeout=2)
                self.assertEqual(status, 200)
                self.assertLess(time.monotonic() - t0, 2)
                self.assertLessEqual(len(os.listdir(f"/proc/{tap.pid}/fd")), base_fds + MAX_HTTP_CONNS + 1)
                time.sleep(0.1)
        finally:
            done.set()
            t.join(10)
        time.sleep(1.1)  # past the page's copy
        m = metric_samples(http_get(mport, "/metrics", timeout=2)[2].decode())
        self.assertGreater(m["amqptap_http_evicted_total"], 8)
        self.assertLessEqual(m["amqptap_http_connections_open"], MAX_HTTP_CONNS)


class RenderedCopies(ScenarioCase):
    def test_a_scrape_storm_renders_each_page_once_a_second(self):
        """Requests within a second of a page's last render get that copy, byte for byte; a later one is rendered
        again and shows the traffic since."""
        queue = self.declare_queue("q")
        tap, mport = start_metrics_tap(self)
        t_start = time.monotonic()
        for path in ("/metrics", "/api/status", "/healthz"):
            t0 = time.monotonic()
            bodies = [http_get(mport, path)[2] for _ in range(20)]  # a connection each: http_connections_total moves
            elapsed = time.monotonic() - t0
            self.assertLessEqual(len(set(bodies)), int(elapsed) + 1, f"{path}: {len(set(bodies))} renders in "
                                 f"{elapsed:.2f} s")
        before = metric_samples(http_get(mport, "/metrics")[2].decode())
        renders = before["amqptap_http_renders_total"]
        self.assertLessEqual(renders, 3 * (int(time.monotonic() - t_start) + 1), "60 requests")

        conn = self.connect(tap)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", queue, b"m", mandatory=True)
        self.assertTrue(self.wait_records(tap, lambda recs: len(recs) == 1))
        time.sleep(1.1)
        after = metric_samples(http_get(mport, "/metrics")[2].decode())
        self.assertEqual(after["amqptap_publish_records_total"], before["amqptap_publish_records_total"] + 1)
        self.assertGreater(after["amqptap_http_renders_total"], renders)


def thread_cpu_ticks(pid):
    """CPU ticks (user + system) of each thread of pid, by thread name; the loop is the thread named like the
    process, the one whose id is pid."""
    ticks = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        name, fields = proc_stat(f"/proc/{pid}/task/{tid}/stat")
        ticks["loop" if int(tid) == pid else name] += int(fields[11]) + int(fields[12])
    return ticks


# A client that asks for one page as fast as it can for some seconds: 20 requests at a time on a keep-alive
# connection, the next 20 as soon as the first replies come (evhttp answers pipelined requests one by one and waits
# for the client's ACK between them: a client that waited for all 20 would ask a few hundred times a second). Prints
# {path: replies}.
FLOOD = r"""
import json, socket, sys, time
port, path, secs = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
batch = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode() * 20
n, end, tail = 0, time.monotonic() + secs, b""
with socket.create_connection(("127.0.0.1", port)) as s:
    s.settimeout(5)
    while time.monotonic() < end:
        s.sendall(batch)
        data = s.recv(1 << 20)
        if not data:
            sys.exit("the endpoint closed a keep-alive connection")
        data = tail + data
        n += data.count(b"HTTP/1.1 200 OK\r\n")
        tail = data[-16:]
print(json.dumps({path: n}))
"""


class RequestFlood(ScenarioCase):
    def test_a_request_flood_is_paced_on_the_http_thread(self):
        """Clients that ask for /metrics, /healthz and /api/status as fast as they can, pipelined on keep-alive
        connections, get TAP_ADMIN_RATE answers a second (after a burst of TAP_ADMIN_BURST) from the http thread; the
        forwarding loop renders each page at most once a second and answers none of the requests, so neither thread
        spends more than a sliver of CPU on them; a scrape from another client still gets in, and a publisher
        meanwhile gets every verdict."""
        queue = self.declare_queue("q")
        tap, mport = start_metrics_tap(self)
        before = thread_cpu_ticks(tap.pid)
        self.assertIn("http", before, "the endpoint has a thread of its own")
        secs = 4
        floods = [subprocess.Popen([sys.executable, "-c", FLOOD, str(mport), path, str(secs)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE) for path in ("/metrics", "/healthz", "/api/status")]
        t0 = time.monotonic()
        conn = self.connect(tap)
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(200):
            ch.basic_publish("", queue, b"m", pika.BasicProperties(message_id=f"m{i}"), mandatory=True)
        time.sleep(max(0.0, 1 - (time.monotonic() - t0)))
        t_scrape = time.monotonic()
        scrape = http_get(mport, "/metrics", timeout=10)
        scrape_secs = time.monotonic() - t_scrape
        answered = {}
        for f in floods:
            out, err = f.communicate(timeout=60)
            self.assertEqual(f.returncode, 0, err.decode())
            answered.update(json.loads(out))
        elapsed = time.monotonic() - t0
        after = thread_cpu_ticks(tap.pid)
        conn.close()
        loop, http = after["loop"] - before["loop"], after["http"] - before["http"]
        m = metric_samples(http_get(mport, "/metrics")[2].decode())
        total = sum(answered.values())
        note(f"{total} requests answered in {elapsed:.1f} s ({answered}); a scrape beside them took {scrape_secs:.2f} s;"
             f" CPU ticks: loop {loop}, http {http}; {m['amqptap_http_renders_total']} renders, "
             f"{m['amqptap_http_paced_total']} paced")

        self.assertEqual(scrape[0], 200)
        self.assertLess(scrape_secs, 3, "a scrape waited behind the flood")
        self.assertGreater(total, TAP_ADMIN_RATE * (secs - 1), "the flood was not answered at the endpoint's rate")
        self.assertLessEqual(total, TAP_ADMIN_RATE * elapsed + TAP_ADMIN_BURST, "more answers than the rate allows")
        self.assertGreater(m["amqptap_http_paced_total"], total / 2)
        tck = os.sysconf("SC_CLK_TCK")
        self.assertLess(loop + http, 0.15 * elapsed * tck, "the flood took more than a sliver of the tap's CPU")
        self.assertLessEqual(m["amqptap_http_renders_total"], 3 * (int(elapsed) + 2), "one render a second a page")
        recs = self.stop_tap(tap)
        self.assertEqual(sorted(r["message_id"] for r in recs), sorted(f"m{i}" for i in range(200)))
        self.assertEqual({(r["route"], r["confirm"]) for r in recs}, {("routed", "ack")})


    def test_a_scrape_gets_its_turn_beside_31_flooding_connections(self):
        """31 keep-alive connections pipelining requests as fast as they can, the connection cap (32) all but full:
        a scrape on a connection of its own waits behind one request of each of them at most, not behind their
        pipelines: 31 turns at TAP_ADMIN_RATE a second are 0.31 s (served in arrival order; when the http thread
        slept per request and served a connection's pipeline on, the scrape took three times that and more)."""
        tap, mport = start_metrics_tap(self, frames=False)
        floods = [subprocess.Popen([sys.executable, "-c", FLOOD, str(mport), "/api/status", "6"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(31)]
        try:
            self.assertTrue(wait_for(lambda: metric_samples(http_get(mport, "/metrics")[2].decode())
                                     ["amqptap_http_paced_total"] > 200, 10), "the floods did not start")
            took = []
            for _ in range(3):
                t = time.monotonic()
                code = http_get(mport, "/metrics", timeout=10)[0]
                took.append(time.monotonic() - t)
                self.assertEqual(code, 200)
            note(f"scrapes beside 31 floods took {', '.join(f'{x:.2f}' for x in took)} s")
            self.assertLess(max(took), 0.6, took)
        finally:
            for f in floods:
                f.kill()
                f.communicate()


TAP_ADMIN_RATE, TAP_ADMIN_BURST = 100, 50


class Exposure(ScenarioCase):
    def test_warns_once_when_not_on_loopback(self):
        port = free_port()
        tap = self.start_tap(["--metrics", f"0.0.0.0:{port}"], frames=False)
        lines = [line for line in tap.stderr().splitlines() if "WARNING" in line]
        self.assertEqual(len(lines), 1, tap.stderr())
        self.assertRegex(lines[0], r"^amqptap: WARNING: --metrics 0\.0\.0\.0:%d .*no password" % port)
        self.assertIn("/api/status", lines[0])
        self.assertEqual(http_get(port, "/healthz")[0], 200)
        for addr in (f"127.0.0.1:{free_port()}", f"127.0.0.2:{free_port()}", str(free_port())):
            quiet = self.start_tap(["--metrics", addr], frames=False)
            self.assertNotIn("WARNING", quiet.stderr(), addr)
        if socket.has_ipv6:
            try:
                with socket.socket(socket.AF_INET6) as s:
                    s.bind(("::1", 0))
            except OSError:
                return
            quiet = self.start_tap(["--metrics", f"[::1]:{free_port()}"], frames=False)
            self.assertIn("metrics on http://[::1]:", quiet.stderr())
            self.assertNotIn("WARNING", quiet.stderr())

    def test_head_has_no_body_and_keeps_the_connection_in_step(self):
        """HEAD gets GET's headers and Content-Length and no body, on every page and on a 404, so the next response
        on the same keep-alive connection is read as itself (libevent alone sends a HEAD reply's body)."""
        tap, mport = start_metrics_tap(self)
        conn = http.client.HTTPConnection("127.0.0.1", mport, timeout=5)
        self.addCleanup(conn.close)
        conn.request("GET", "/")
        page = conn.getresponse().read()
        self.assertIn(b"<html", page.lower())
        for path, status, length in (("/", 200, len(page)), ("/metrics", 200, None), ("/api/status", 200, None),
                                     ("/healthz", 200, None), ("/nothing", 404, 0)):
            conn.request("HEAD", path)
            r = conn.getresponse()
            self.assertEqual(r.status, status, path)
            self.assertEqual(r.read(), b"", path)
            n = int(r.getheader("Content-Length"))
            if length is not None:
                self.assertEqual(n, length, path)
            else:
                self.assertGreater(n, 10, path)
            conn.request("GET", "/healthz")  # the same connection: it must still be in step
            r = conn.getresponse()
            self.assertEqual(r.status, 200, path)
            self.assertEqual(json.loads(r.read())["status"], "ok", path)
        self.assertEqual(conn.sock is not None, True)  # one connection throughout

    def test_a_foreign_host_is_refused(self):
        """A request whose Host is a name the endpoint does not go by gets 403 on every page (a page from another
        site that points a DNS name of its own at the tap cannot read it: DNS rebinding); its addresses, localhost,
        the machine's name and the --metrics-host names are answered."""
        tap, mport = start_metrics_tap(self, extra=["--metrics-host", "metrics.example.com,amqptap.ns.svc"])

        def status(path, host):
            conn = http.client.HTTPConnection("127.0.0.1", mport, timeout=5)
            try:
                conn.request("GET", path, headers={"Host": host})
                r = conn.getresponse()
                return r.status, r.read()
            finally:
                conn.close()

        for path in ("/", "/metrics", "/api/status", "/healthz", "/nothing"):
            code, body = status(path, f"rebind.attacker.example:{mport}")
            self.assertEqual(code, 403, path)
            self.assertIn(b"--metrics-host", body)
            self.assertNotIn(b"amqptap_", body)
        for host in (f"127.0.0.1:{mport}", f"localhost:{mport}", socket.gethostname(), "metrics.example.com",
                     f"AMQPTAP.ns.svc:{mport}"):
            self.assertEqual(status("/api/status", host)[0], 200, host)
        code, body = status("/metrics", "metrics.example.com")
        self.assertEqual(code, 200)
        self.assertIn(b"amqptap_", body)

    def test_status_leaves_header_values_out(self):
        """--header-values writes the values to the verdict file the operator chose; /api/status, which asks for no
        password, shows the header keys only."""
        tap, mport = start_metrics_tap(self, extra=["--header-values", "token"])
        conn = self.connect(tap)
        ch = conn.channel()
        ch.confirm_delivery()
        with self.assertRaises(pika.exceptions.UnroutableError):
            ch.basic_publish("", f"nowhere.{self.prefix}", b"x",
                             pika.BasicProperties(headers={"token": "s3cret-value", "n": 1}), mandatory=True)
        self.assertTrue(self.wait_records(tap, lambda recs: len(recs) == 1))
        self.assertEqual(tap.records("publish")[0]["header_values"], {"token": "s3cret-value"})
        body = http_get(mport, "/api/status")[2]
        rows = json.loads(body)["problems"]["rows"]
        self.assertEqual(len(rows), 1, rows)
        self.assertEqual((rows[0]["route"], sorted(rows[0]["headers"])), ("returned", ["n", "token"]), rows[0])
        self.assertNotIn("header_values", rows[0])
        self.assertNotIn(b"s3cret-value", body)


if __name__ == "__main__":
    main()
