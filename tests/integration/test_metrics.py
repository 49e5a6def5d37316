# --metrics (DESIGN §6c, issue 16) against real parts: a real Prometheus (Debian `prometheus`) scrapes the tap every
# second while pika publishes a scenario with known outcomes through it, and its query API must return exactly the
# counts the records show; `promtool check metrics` passes on /metrics; the status page is rendered by a real headless
# Chromium and must show the counts and the problem publishes (a screenshot is left in the test's working directory);
# hostile HTTP clients on the metrics port do not change forwarding or verdicts of a confirm stream; /healthz,
# routes, methods and the option's forms.

import errno
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pika
import pika.exceptions

from tapharness import (AMQPTAP_BIN, BROKER_PORT, free_port, is_asan_build, main, read_records, rss_kb,
                        wait_for)
from scenario_lib import ScenarioCase, final_line, publish_records, stream_publisher

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
CHROMIUM = "/usr/bin/chromium"
# le bounds of amqptap_confirm_latency_seconds, in µs (src/core/metrics.c)
LE_US = [m * 10 ** e for e in range(2, 7) for m in (1, 1.5, 2, 3, 5, 7)] + [10 ** 7]
ARTIFACT_DIR = os.environ.get("TAP_ARTIFACT_DIR", os.getcwd())

ROUTED, RETURNED, MISSING_X, MAXLEN_PUBLISHES = 120, 7, 1, 3


def note(msg):
    sys.stderr.write(f"  [{msg}]\n")


def http_get(port, path, method="GET", timeout=10, body=None):
    """(status, headers, body bytes) of one request to the tap's metrics port."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, data=body)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def metric_samples(text):
    """{'name{labels}': value} of a Prometheus text body."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def start_metrics_tap(case, extra=(), **kw):
    """A tap with --metrics on a free loopback port; returns (tap, metrics_port)."""
    port = free_port()
    tap = case.start_tap(["--metrics", f"127.0.0.1:{port}", *extra], **kw)
    case.assertIn(f"metrics on http://127.0.0.1:{port}/", tap.stderr())
    return tap, port


def run_scenario(case, tap, keep_open=False):
    """Through the tap, with pika on one connection in confirm mode: ROUTED routable mandatory publishes to a queue,
    RETURNED unroutable mandatory ones (Basic.Return 312), MISSING_X to an exchange that does not exist (the broker
    closes the channel: route/confirm unknown), and MAXLEN_PUBLISHES to a queue of x-max-length 1 with
    reject-publish (the first acked, the rest nacked). Returns the connection when keep_open, else None."""
    queue = case.declare_queue("routed")
    full = case.declare_queue("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    conn = case.connect(tap)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(ROUTED):
        ch.basic_publish("", queue, b"r", pika.BasicProperties(message_id=f"ok-{i}"), mandatory=True)
    for i in range(RETURNED):
        with case.assertRaises(pika.exceptions.UnroutableError):
            ch.basic_publish("", f"nowhere.{case.prefix}.{i}", b"x", pika.BasicProperties(message_id=f"ret-{i}"),
                             mandatory=True)
    for i in range(MAXLEN_PUBLISHES):
        try:
            ch.basic_publish("", full, b"f", pika.BasicProperties(message_id=f"full-{i}"), mandatory=True)
        except pika.exceptions.NackError:
            pass
    for i in range(MISSING_X):
        with case.assertRaises(pika.exceptions.ChannelClosedByBroker):
            ch.basic_publish(f"missing.{case.prefix}", "k", b"m", pika.BasicProperties(message_id=f"lost-{i}"),
                             mandatory=True)
    if keep_open:
        conn.channel()  # the connection row stays on the page with an open channel
        return conn
    conn.close()
    return None


def expected_from_records(case, recs):
    """The counts the metrics must show, from the records (ground truth), after checking the scenario's known
    outcomes in them."""
    total = ROUTED + RETURNED + MISSING_X + MAXLEN_PUBLISHES
    case.assertEqual(len(recs), total, "one publish record per publish")
    routes = {k: sum(1 for r in recs if r["route"] == k) for k in ("routed", "returned", "unproven", "unknown")}
    confirms = {k: sum(1 for r in recs if r["confirm"] == k) for k in ("ack", "nack", "none", "unknown")}
    case.assertEqual(routes["returned"], RETURNED)
    case.assertEqual(routes["unknown"], MISSING_X)
    case.assertEqual(confirms["nack"], MAXLEN_PUBLISHES - 1)
    case.assertEqual(confirms["unknown"], MISSING_X)
    return total, routes, confirms


class PrometheusScrape(ScenarioCase):
    def start_prometheus(self, target_port):
        d = tempfile.mkdtemp(prefix="amqptap-prom-")
        self.addCleanup(shutil.rmtree, d, True)
        cfg = os.path.join(d, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: amqptap\n    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{target_port}']\n")
        port = free_port()
        log = open(os.path.join(d, "prometheus.log"), "wb")
        self.addCleanup(log.close)
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={d}/data",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log)

        def stop():
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.addCleanup(stop)
        ready = wait_for(lambda: self._prom_ready(port), 30, 0.2)
        self.assertTrue(ready, f"prometheus not ready: {open(os.path.join(d, 'prometheus.log')).read()[-2000:]}")
        return port

    @staticmethod
    def _prom_ready(port):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, port, expr):
        """The single value of an instant query (None when the result is empty)."""
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as r:
            res = json.load(r)
        self.assertEqual(res["status"], "success", res)
        data = res["data"]["result"]
        if not data:
            return None
        self.assertEqual(len(data), 1, f"{expr}: {data}")
        return float(data[0]["value"][1])

    def test_prometheus_scrapes_the_scenario(self):
        for tool in (PROMETHEUS, PROMTOOL):
            self.assertTrue(os.access(tool, os.X_OK), f"{tool} missing (apt-get install prometheus)")
        tap, mport = start_metrics_tap(self)
        prom = self.start_prometheus(mport)
        self.assertTrue(wait_for(lambda: self.query(prom, 'up{job="amqptap"}') == 1, 20, 0.3),
                        "prometheus never scraped the tap successfully")
        run_scenario(self, tap)
        self.assertTrue(self.wait_records(tap, lambda rs: len(rs) == ROUTED + RETURNED + MISSING_X + MAXLEN_PUBLISHES))
        recs = publish_records(tap.verdicts)
        total, routes, confirms = expected_from_records(self, recs)

        got = wait_for(lambda: self.query(prom, "amqptap_publish_records_total") == total, 20, 0.3)
        self.assertTrue(got, f"prometheus never saw {total} publish records")
        time.sleep(1.5)  # one more scrape: every series from the same final state
        self.assertEqual(self.query(prom, "amqptap_publishes_total"), total)
        for route, n in routes.items():
            self.assertEqual(self.query(prom, f'amqptap_publish_routes_total{{route="{route}"}}'), n, route)
        for confirm, n in confirms.items():
            self.assertEqual(self.query(prom, f'amqptap_publish_confirms_total{{confirm="{confirm}"}}'), n, confirm)
        self.assertEqual(self.query(prom, 'amqptap_returns_total{reply_code="312"}'), RETURNED)
        self.assertEqual(self.query(prom, 'sum(amqptap_returns_total)'), RETURNED)
        self.assertEqual(self.query(prom, "amqptap_publishes_outstanding"), 0)
        self.assertEqual(self.query(prom, "amqptap_connections_total"), 1)
        self.assertEqual(self.query(prom, "amqptap_connections_open"), 0)
        self.assertEqual(self.query(prom, "amqptap_decode_errors_total"), 0)
        self.assertEqual(self.query(prom, 'amqptap_records_lost_total{reason="no_memory"}'), 0)
        self.assertEqual(self.query(prom, 'amqptap_build_info{version!=""}'), 1)
        self.assertEqual(self.query(prom, "amqptap_upstream_up"), 1)
        self.assertGreater(self.query(prom, 'amqptap_forwarded_bytes_total{dir="c2s"}'), 0)
        self.assertGreater(self.query(prom, "process_resident_memory_bytes"), 1 << 20)
        self.assertIsNotNone(self.query(prom, "process_cpu_seconds_total"))
        answered = [r["confirm_us"] for r in recs if r["confirm"] in ("ack", "nack")]
        self.assertEqual(self.query(prom, "amqptap_confirm_latency_seconds_count"), len(answered))
        self.assertEqual(self.query(prom, 'amqptap_confirm_latency_seconds_bucket{le="+Inf"}'), len(answered))

        # the median from the histogram lands in the bucket of the records' median (bounds moved by at most 1/16:
        # the tracker's own buckets are 1/8 wide and fold into a bound by their midpoint)
        median = statistics.median(answered)
        q = self.query(prom, "histogram_quantile(0.5, amqptap_confirm_latency_seconds_bucket)") * 1e6
        lo = max([0] + [b for b in LE_US if b < median / 1.07])
        hi = min([b for b in LE_US if b >= median * 1.07] + [LE_US[-1]])
        note(f"records' median confirm_us {median:.0f}, histogram_quantile(0.5) {q:.0f} us, bucket bounds {lo}..{hi}")
        self.assertGreaterEqual(q, lo)
        self.assertLessEqual(q, hi)

        # promtool lints the exposition as served
        status, headers, body = http_get(mport, "/metrics")
        self.assertEqual(status, 200)
        self.assertTrue(headers["Content-Type"].startswith("text/plain; version=0.0.4"), headers)
        lint = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=30)
        self.assertEqual((lint.returncode, lint.stdout + lint.stderr), (0, b""))
        names = {k.split("{")[0] for k in metric_samples(body.decode())}
        for n in names:
            self.assertTrue(n.startswith("amqptap_") or n.startswith("process_"), n)
        labels = {m for k in metric_samples(body.decode()) for m in re.findall(r'[{,](\w+)="', k)}
        self.assertLessEqual(labels, {"route", "confirm", "reply_code", "rule", "reason", "output", "dir", "le",
                                      "version"}, "a label per routing key, exchange or message would be unbounded")


def chromium(case, url, *args, timeout=120):
    """Runs headless Chromium on url with a fresh profile; returns the CompletedProcess."""
    case.assertTrue(os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} missing (apt-get install chromium)")
    profile = tempfile.mkdtemp(prefix="amqptap-chromium-")
    case.addCleanup(shutil.rmtree, profile, True)
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--virtual-time-budget=3000", *args, url]
    return subprocess.run(cmd, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


class StatusPage(ScenarioCase):
    def test_page_shows_counts_connections_and_problem_publishes(self):
        tap, mport = start_metrics_tap(self)
        conn = run_scenario(self, tap, keep_open=True)
        total = ROUTED + RETURNED + MISSING_X + MAXLEN_PUBLISHES
        self.assertTrue(self.wait_records(tap, lambda rs: len(rs) == total))
        _, routes, confirms = expected_from_records(self, publish_records(tap.verdicts))

        run = chromium(self, f"http://127.0.0.1:{mport}/", "--dump-dom")
        dom = run.stdout.decode("utf-8", "replace")
        self.assertEqual(run.returncode, 0, run.stderr.decode()[-2000:])

        def shown(key):
            m = re.search(r'id="c-%s"[^>]*>([^<]*)<' % re.escape(key), dom)
            self.assertIsNotNone(m, f"no tile c-{key} in the rendered page: {dom[:3000]}")
            return m.group(1).replace(",", "")

        self.assertEqual(shown("publishes"), str(total))
        for route, n in routes.items():
            self.assertEqual(shown(route), str(n), route)
        self.assertEqual(shown("acked"), str(confirms["ack"]))
        self.assertEqual(shown("nacked"), str(confirms["nack"]))
        self.assertEqual(shown("outstanding"), "0")
        self.assertEqual(shown("connections_open"), "1")

        kinds = re.findall(r'<tr class="problem (\w+)"', dom)
        self.assertEqual(sorted(kinds), sorted(["returned"] * RETURNED + ["nacked"] * (MAXLEN_PUBLISHES - 1) +
                                               ["unknown"] * MISSING_X))
        for i in range(RETURNED):
            self.assertIn(f"nowhere.{self.prefix}.{i}", dom)
            self.assertIn(f"ret-{i}", dom)
        self.assertIn("312 NO_ROUTE", dom)
        self.assertIn(f"missing.{self.prefix}", dom)
        self.assertRegex(dom, r"broker 404 NOT_FOUND")
        self.assertRegex(dom, r"returned by the broker")  # the diagnosis on top
        row = re.search(r'<tr data-conn="\d+">(.*?)</tr>', dom, re.S)
        self.assertIsNotNone(row, "no connection row")
        self.assertIn("Pika", row.group(1))
        self.assertIn(f"<td class=\"n\">{total}</td>", row.group(1))
        self.assertIn("<svg", dom)  # the latency chart

        shot = os.path.join(ARTIFACT_DIR, "test_metrics-status-page.png")
        run = chromium(self, f"http://127.0.0.1:{mport}/", f"--screenshot={shot}", "--window-size=1400,1700",
                       "--hide-scrollbars")
        self.assertEqual(run.returncode, 0, run.stderr.decode()[-2000:])
        self.assertGreater(os.path.getsize(shot), 20000)
        note(f"screenshot: {shot}")
        conn.close()


if __name__ == "__main__":
    main()
