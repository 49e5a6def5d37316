# --metrics (src/DESIGN.md §6c, issue 16) against real parts: a real Prometheus (Debian `prometheus`) scrapes the tap every
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
import unittest
import urllib.request

import pika
import pika.exceptions

from tapharness import (AMQP_091_HEADER, AMQPTAP_BIN, BROKER_PORT, FAILALLOC, SOURCE_DIR, chromium, free_port,
                        http_get, is_asan_build, main, page_findings, rss_kb, start_tap, wait_for)
from scenario_lib import ScenarioCase, final_line, publish_records, stream_publisher

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
# le bounds of amqptap_confirm_latency_seconds, in µs (src/core/metrics.c)
LE_US = [m * 10 ** e for e in range(2, 7) for m in (1, 1.5, 2, 3, 5, 7)] + [10 ** 7]
ARTIFACT_DIR = os.environ.get("TAP_ARTIFACT_DIR", os.getcwd())

ROUTED, RETURNED, MISSING_X, MAXLEN_PUBLISHES = 120, 7, 1, 3


def note(msg):
    sys.stderr.write(f"  [{msg}]\n")


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


def prom_ready(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def start_prometheus(case, target_port):
    """A real Prometheus scraping the tap at target_port every second, stopped at the case's cleanup; returns its
    web port once it is ready."""
    d = tempfile.mkdtemp(prefix="amqptap-prom-")
    case.addCleanup(shutil.rmtree, d, True)
    cfg = os.path.join(d, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: amqptap\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{target_port}']\n")
    port = free_port()
    log = open(os.path.join(d, "prometheus.log"), "wb")
    case.addCleanup(log.close)
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
    case.addCleanup(stop)
    ready = wait_for(lambda: prom_ready(port), 30, 0.2)
    case.assertTrue(ready, f"prometheus not ready: {open(os.path.join(d, 'prometheus.log')).read()[-2000:]}")
    return port


class PrometheusScrape(ScenarioCase):
    def query_all(self, port, expr):
        """Every sample of an instant query (an expression Prometheus cannot parse fails the test)."""
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                res = json.load(r)
        except urllib.error.HTTPError as e:
            self.fail(f"{expr}: {e.code} {e.read()[:500]!r}")
        self.assertEqual(res["status"], "success", res)
        return res["data"]["result"]

    def query(self, port, expr):
        """The single value of an instant query (None when the result is empty)."""
        data = self.query_all(port, expr)
        if not data:
            return None
        self.assertEqual(len(data), 1, f"{expr}: {data}")
        return float(data[0]["value"][1])

    def test_prometheus_scrapes_the_scenario(self):
        for tool in (PROMETHEUS, PROMTOOL):
            self.assertTrue(os.access(tool, os.X_OK), f"{tool} missing (apt-get install prometheus)")
        tap, mport = start_metrics_tap(self)
        prom = start_prometheus(self, mport)
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
        self.assertEqual(self.query(prom, 'amqptap_connections_closed_total{by="client"}'), 1)
        self.assertEqual(self.query(prom, "sum(amqptap_connections_closed_total)"), 1)
        self.assertEqual(self.query(prom, "amqptap_decode_errors_total"), 0)
        self.assertEqual(self.query(prom, 'amqptap_records_lost_total{reason="no_memory"}'), 0)
        self.assertEqual(self.query(prom, 'amqptap_build_info{version!=""}'), 1)
        # from an alert to the records: the build info names the tap and the run its records carry
        opened = [r for r in tap.records("connection") if r["event"] == "open"][0]
        self.assertEqual(self.query(prom, f'amqptap_build_info{{tap="{opened["tap"]}",run="{opened["run"]}"}}'), 1)
        self.assertEqual(self.query(prom, "amqptap_upstream_up"), 1)
        self.assertGreater(self.query(prom, 'amqptap_forwarded_bytes_total{dir="c2s"}'), 0)
        self.assertGreater(self.query(prom, "process_resident_memory_bytes"), 1 << 20)
        self.assertIsNotNone(self.query(prom, "process_cpu_seconds_total"))
        answered = [r["confirm_us"] for r in recs if r["confirm"] in ("ack", "nack")]
        self.assertEqual(self.query(prom, "amqptap_confirm_latency_seconds_count"), len(answered))
        self.assertEqual(self.query(prom, 'amqptap_confirm_latency_seconds_bucket{le="+Inf"}'), len(answered))

        # the median from the histogram lands in the bucket of the records' median (bounds moved by at most 1/16:
        # the tracker's own buckets are 1/8 wide and fold into a bound by their midpoint)
        self.assert_quantile_near(prom, "confirm_latency_seconds", answered)

        # the return latency histogram: one observation per returned publish, its median near the records'
        returned = [r["return_us"] for r in recs if r["route"] == "returned"]
        self.assertEqual(len(returned), RETURNED)
        self.assertEqual(self.query(prom, "amqptap_return_latency_seconds_count"), RETURNED)
        self.assertEqual(self.query(prom, 'amqptap_return_latency_seconds_bucket{le="+Inf"}'), RETURNED)
        self.assert_quantile_near(prom, "return_latency_seconds", returned)

        # publishes by exchange: the default exchange and the missing one have their series, nothing is "other",
        # and the series add up to every publish
        by_exchange = {}
        for r in recs:
            key = (r["exchange"] or "(AMQP default)", r["route"])
            by_exchange[key] = by_exchange.get(key, 0) + 1
        for (exchange, route), n in by_exchange.items():
            self.assertEqual(self.query(prom, f'amqptap_exchange_publishes_total{{exchange="{exchange}",'
                                              f'route="{route}"}}'), n, (exchange, route))
        self.assertEqual(self.query(prom, 'sum(amqptap_exchange_publishes_total{exchange="(other)"})'), 0)
        self.assertEqual(self.query(prom, "sum(amqptap_exchange_publishes_total)"), total)
        self.assertIsNone(self.query(prom, "amqptap_capture_gaps_total"), "no capture in proxy mode")
        self.check_readme_alerts(prom)

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
        self.assertLessEqual(labels, {"route", "confirm", "reply_code", "rule", "reason", "output", "dir", "le", "by",
                                      "version", "exchange", "queue", "tap", "run", "outcome"},
                             "a label per routing key or message would be unbounded (exchanges, queues: top N)")

    # What each example alert of the README gives after the scenario (keyed by a piece of its expression): True
    # fires, False stays quiet, None either (it depends on the machine's speed).
    README_ALERTS = {'route="returned"}[5m]) > 0': True, "histogram_quantile(0.99": None,
                     'confirm="unknown"}[5m]) > 0': True, 'route="unknown"}[5m]) > 0': True,
                     "amqptap_upstream_up == 0": False,
                     "topk(3": True, "changes(process_start_time_seconds": False, "amqptap_capture_drops_total": False,
                     "amqptap_connections_unfollowed_total": False, "amqptap_connections_closed_total": False}

    def check_readme_alerts(self, prom):
        """The shipped example alerts (scripts/dist/examples/amqptap.rules.yml) are expressions this Prometheus
        evaluates, and they fire on the scenario where they should (returns, publishes left unknown) and nowhere
        else."""
        exprs = readme_alerts()
        self.assertEqual(len(exprs), len(self.README_ALERTS), exprs)
        for expr in exprs:
            keys = [k for k in self.README_ALERTS if k in expr]
            self.assertEqual(len(keys), 1, f"README alert {expr!r} is not in README_ALERTS")
            want = self.README_ALERTS[keys[0]]
            fired = bool(self.query_all(prom, expr))
            if want is not None:
                self.assertEqual(fired, want, expr)

    def assert_quantile_near(self, prom, histogram, values):
        """histogram_quantile(0.5) of amqptap_<histogram> lands in the bucket of the median of values (µs); bounds
        move by at most 1/16: the tracker's own buckets are 1/8 wide and fold into a bound by their midpoint."""
        median = statistics.median(values)
        q = self.query(prom, f"histogram_quantile(0.5, amqptap_{histogram}_bucket)") * 1e6
        lo = max([0] + [b for b in LE_US if b < median / 1.07])
        hi = min([b for b in LE_US if b >= median * 1.07] + [LE_US[-1]])
        note(f"{histogram}: records' median {median:.0f} us, histogram_quantile(0.5) {q:.0f} us, bucket bounds "
             f"{lo}..{hi}")
        self.assertGreaterEqual(q, lo)
        self.assertLessEqual(q, hi)

    def test_sniff_serves_capture_metrics(self):
        """`amqptap sniff --metrics`: pika publishes straight to the broker while the sniffer captures lo; its
        /metrics (linted by promtool) counts the capture (packets, kernel drops, gaps) and the publishes, and a real
        Prometheus reads them."""
        mport = free_port()
        sniffer = self.start_sniff(["--return-window", "300", "--metrics", f"127.0.0.1:{mport}"])
        self.assertIn(f"metrics on http://127.0.0.1:{mport}/", sniffer.stderr())
        prom = start_prometheus(self, mport)
        self.assertTrue(wait_for(lambda: self.query(prom, 'up{job="amqptap"}') == 1, 20, 0.3),
                        "prometheus never scraped the sniffer")
        queue = self.declare_queue("sniffed")
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", BROKER_PORT))
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", queue, b"s", pika.BasicProperties(message_id=f"s-{i}"), mandatory=True)
        with self.assertRaises(pika.exceptions.UnroutableError):
            ch.basic_publish("", f"nowhere.{self.prefix}", b"x", mandatory=True)
        conn.close()
        self.assertTrue(wait_for(lambda: self.query(prom, "amqptap_publish_records_total") == 6, 20, 0.3),
                        "prometheus never saw the sniffed publishes")
        self.assertEqual(self.query(prom, 'amqptap_returns_total{reply_code="312"}'), 1)
        self.assertEqual(self.query(prom, "amqptap_return_latency_seconds_count"), 1)
        self.assertGreater(self.query(prom, "amqptap_capture_packets_total"), 10)
        self.assertEqual(self.query(prom, "amqptap_capture_drops_total"), 0)
        self.assertEqual(self.query(prom, "amqptap_capture_gaps_total"), 0)
        self.assertEqual(self.query(prom, "amqptap_capture_gap_bytes_total"), 0)
        status, _, body = http_get(mport, "/metrics")
        self.assertEqual(status, 200)
        lint = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=30)
        self.assertEqual((lint.returncode, lint.stdout + lint.stderr), (0, b""))
        st = json.loads(http_get(mport, "/api/status")[2])
        self.assertEqual(st["capture"]["gaps"], 0)
        self.assertGreater(st["capture"]["packets"], 10)
        # the connections it follows count as open while they are, as through the proxy (the test's own broker
        # connection, which declared the queue, is one of them)
        status = lambda: json.loads(http_get(mport, "/api/status")[2])["counters"]  # noqa: E731
        self.assertTrue(wait_for(lambda: status()["connections_total"] == status()["connections_open"] + 1, 10),
                        status())  # the publisher's is over
        base, total = status()["connections_open"], status()["connections_total"]
        held = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", BROKER_PORT))
        self.assertTrue(wait_for(lambda: status()["connections_open"] == base + 1, 10), status())
        self.assertEqual(status()["connections_total"], total + 1)
        held.close()
        self.assertTrue(wait_for(lambda: status()["connections_open"] == base, 10), status())
        self.assertEqual(sniffer.stop(timeout=20), 0, sniffer.stderr())


def readme_alerts():
    """The expressions of the example alerts the README points to: the `expr` of every rule in
    scripts/dist/examples/amqptap.rules.yml (one line each)."""
    with open(os.path.join(SOURCE_DIR, "scripts", "dist", "examples", "amqptap.rules.yml")) as f:
        exprs = re.findall(r"(?m)^\s+expr: (.+)$", f.read())
    assert exprs, "no example alerts in scripts/dist/examples/amqptap.rules.yml"
    return exprs


def readme_alert(piece):
    """The shipped example alert expression holding piece."""
    found = [ln for ln in readme_alerts() if piece in ln]
    assert len(found) == 1, (piece, found)
    return found[0]


class ReadmeAlertsOverTime(unittest.TestCase):
    """The shipped example alerts over made-up series (promtool test rules), for what one scrape of the scenario cannot
    show."""

    def promtool_test(self, series, expr, want):
        """expr over series ({series selector: values}, one a minute) at 6m gives the samples want ([(labels,
        value)]; [] for none)."""
        lines = ["evaluation_interval: 1m", "tests:", "- interval: 1m", "  input_series:"]
        for selector, values in series.items():
            lines += [f"  - series: '{selector}'", f"    values: '{values}'"]
        lines += ["  promql_expr_test:", f"  - expr: '{expr}'", "    eval_time: 6m",
                  "    exp_samples:" + ("" if want else " []")]
        for labels, value in want:
            lines += [f"    - labels: '{labels}'", f"      value: {value}"]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "alerts_test.yml")
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            r = subprocess.run([PROMTOOL, "test", "rules", path], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_exchange_alert_counts_a_series_that_appeared(self):
        """An exchange whose series appeared inside the window with its first returns counts them, as do one
        returning all along and one returning after its tap restarted (a counter reset); one quiet for the window
        does not. (`topk(3, increase(...[5m]))` gave 0 for the first kind: increase() does not count a series' first
        sample.)"""
        values = {"new": "_ _ _ 3 3 3 3", "quiet": "5 5 5 5 5 5 5", "busy": "5 6 7 8 9 10 11",
                  "restarted": "50 50 50 1 2 3 4"}
        series = {f'amqptap_exchange_publishes_total{{exchange="{name}",route="returned"}}': v
                  for name, v in values.items()}
        want = []
        for name, value in (("new", 3), ("busy", 5), ("restarted", 4)):
            kept = '__name__="amqptap_exchange_publishes_total",' if name == "new" else ""  # unless keeps it
            want.append((f'{{{kept}exchange="{name}",route="returned"}}', value))
        self.promtool_test(series, readme_alert("topk(3"), want)

    def test_unknown_route_alert_sees_refused_plain_publishes(self):
        """Publishes the broker refused on a channel without confirms (route unknown, confirm none): the route
        alert fires, the confirm alert (the one for confirm channels) does not."""
        series = {'amqptap_publish_routes_total{route="unknown"}': "0 0 0 2 4 4 4",
                  'amqptap_publish_confirms_total{confirm="unknown"}': "0 0 0 0 0 0 0",
                  'amqptap_publish_confirms_total{confirm="none"}': "0 0 0 2 4 4 4"}
        self.promtool_test(series, readme_alert('route="unknown"'), [("{route=\"unknown\"}", 4)])
        self.promtool_test(series, readme_alert('confirm="unknown"'), [])


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
        # publishes by exchange: the default one carries everything but the publish to the missing exchange
        xrows = dict(re.findall(r'<tr class="exchange[^"]*" data-exchange="([^"]*)">(.*?)</tr>', dom, re.S))
        self.assertEqual(set(xrows), {"(default)", f"missing.{self.prefix}"}, dom[:3000])
        nums = lambda row: [int(n.replace(",", "")) for n in re.findall(r'<td class="n">([\d,]+)</td>', row)]  # noqa
        self.assertEqual(nums(xrows["(default)"]), [routes["routed"], RETURNED, routes["unproven"], 0])
        self.assertEqual(nums(xrows[f"missing.{self.prefix}"]), [0, 0, 0, MISSING_X])
        self.assertRegex(dom, r"return latency \(publish forwarded → return\): p50 ")
        # times say their day and zone (they were a bare time of day, in UTC without a word)
        day = [r for r in publish_records(tap.verdicts)][0]["ts"][:10]
        self.assertRegex(dom, r"updated %s \d\d:\d\d:\d\d\.\d{6} UTC" % day)

        shot = os.path.join(ARTIFACT_DIR, "test_metrics-status-page.png")
        run = chromium(self, f"http://127.0.0.1:{mport}/", f"--screenshot={shot}", "--window-size=1400,1700",
                       "--hide-scrollbars")
        self.assertEqual(run.returncode, 0, run.stderr.decode()[-2000:])
        self.assertGreater(os.path.getsize(shot), 20000)
        note(f"screenshot: {shot}")
        conn.close()


    def own_tap(self, extra=(), env=None):
        """A tap with --metrics whose exit code the test checks itself (these ones exit 1); returns (tap, port)."""
        port = free_port()
        tap = start_tap(["--metrics", f"127.0.0.1:{port}", *extra], env=env)
        self.addCleanup(tap.cleanup)
        self.addCleanup(tap.stop)
        return tap, port

    def test_page_says_what_an_output_could_not_write(self):
        """--verdicts /dev/full: every verdict record is dropped. The page must not call the publishes fine: it
        names the output and how many records it dropped, and /api/status counts them per output."""
        tap, mport = self.own_tap(["--verdicts", "/dev/full"])
        q = self.declare_queue("devfull")
        conn = self.connect(tap)
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", q, b"x", pika.BasicProperties(message_id=f"full-{i}", delivery_mode=2),
                             mandatory=True)
        ch.basic_publish("", q, b"x", pika.BasicProperties(message_id="not-mandatory", delivery_mode=2))  # 2 warnings
        conn.close()
        status = lambda: json.loads(http_get(mport, "/api/status")[2])  # noqa: E731

        def all_dropped():
            """The connection's close record was written, and the writer thread has dropped every record so far."""
            st = status()
            v = st["outputs"]["verdicts"]
            return st["connections_closed_by"].get("client") == 1 and v["lost"] == v["records"] and v["records"] > 5
        self.assertTrue(wait_for(all_dropped, 10), status())
        out = status()["outputs"]
        self.assertGreater(out["verdicts"]["write_errors"], 0, out)
        self.assertEqual(out["frames"]["lost"], 0, out)
        self.assertGreater(out["frames"]["records"], 0, out)
        lost = out["verdicts"]["lost"]
        self.assertEqual(out["verdicts"]["lost_by"], {"write_failed": lost})
        self.assertEqual(out["frames"]["lost_by"], {})
        # what went wrong first, then what only may have: the dropped records before the two warnings the
        # not-mandatory publish earns (listed before them in the page's code)
        findings = page_findings(self, mport)
        self.assertEqual(findings[0], f"The --verdicts output dropped {lost} of {lost} record(s): {lost} on failed "
                                      f"writes ({out['verdicts']['write_errors']} failed write(s)). See the tap's log.")
        self.assertEqual(len(findings), 3, findings)
        self.assertTrue(findings[1].startswith("1 publish(es) unproven"), findings)
        self.assertTrue(findings[2].startswith("Warning confirm_without_mandatory"), findings)
        # /metrics: the same count under its reason
        metrics = http_get(mport, "/metrics")[2].decode()
        self.assertIn(f'amqptap_output_records_lost_total{{output="verdicts",reason="write_failed"}} {lost}\n', metrics)
        self.assertIn('amqptap_output_records_lost_total{output="verdicts",reason="backlog_full"} 0\n', metrics)
        self.assertEqual(tap.stop(), 1, tap.stderr()[-2000:])

    @unittest.skipIf(is_asan_build(), "sanitizer build: its allocator cannot be replaced with LD_PRELOAD")
    def test_page_says_connections_it_could_not_follow(self):
        """Every allocation failing once the tap is up (tests/preload/failalloc.so), three clients connect: the tap
        cannot follow them. With allocations working again, the page counts them and says that their publishes
        are in none of its counts, and the tap exits 1."""
        self.assertTrue(os.path.exists(FAILALLOC), f"{FAILALLOC} is not built")
        d = tempfile.mkdtemp(prefix="amqptap-unfollowed-")
        self.addCleanup(shutil.rmtree, d, True)
        stop_file = os.path.join(d, "stop")
        armed_after = 1.5
        tap, mport = self.own_tap(env={"LD_PRELOAD": FAILALLOC, "FAILALLOC_ONE_IN": "1",
                                       "FAILALLOC_AFTER_MS": str(int(armed_after * 1000)),
                                       "FAILALLOC_STOP_FILE": stop_file})
        started = time.monotonic()
        self.assertEqual(json.loads(http_get(mport, "/api/status")[2])["counters"]["connections_unfollowed"], 0)
        time.sleep(max(0.0, started + armed_after + 0.2 - time.monotonic()))
        clients = 3
        for _ in range(clients):
            with socket.create_connection(("127.0.0.1", tap.port), timeout=5) as s:
                s.sendall(AMQP_091_HEADER)
                s.settimeout(2)
                try:
                    s.recv(4096)  # the broker's connection.start when forwarded, or the tap closing it
                except OSError:
                    pass
        with open(stop_file, "w"):
            pass
        time.sleep(0.1)  # failalloc looks for the file every 10 ms
        counters = json.loads(http_get(mport, "/api/status")[2])["counters"]
        self.assertEqual(counters["connections_unfollowed"], clients, (counters, tap.stderr()[-2000:]))
        self.assertEqual(page_findings(self, mport), [f"{clients} connection(s) not followed for lack of memory: their traffic "
                                                 "went on, but they have no records and their publishes are in none of "
                                                 "these counts."])
        self.assertEqual(tap.stop(), 1, tap.stderr()[-2000:])
        self.assertNotIn("publish", {r["type"] for r in tap.records()})


class HealthAndRoutes(ScenarioCase):
    def test_routes_methods_and_health(self):
        tap, mport = start_metrics_tap(self)
        status, headers, body = http_get(mport, "/healthz")
        health = json.loads(body)
        self.assertEqual((status, health["status"], health["listening"]), (200, "ok", True), health)
        self.assertIsNone(health["upstream_reachable"], "no connection attempt yet")
        self.assertGreaterEqual(health["uptime_seconds"], 0)
        conn = self.connect(tap)
        self.assertTrue(wait_for(lambda: json.loads(http_get(mport, "/healthz")[2])["upstream_reachable"] is True, 10))
        self.assertEqual(json.loads(http_get(mport, "/healthz")[2])["connections_open"], 1)
        conn.close()

        self.assertEqual(http_get(mport, "/nope")[0], 404)
        self.assertEqual(http_get(mport, "/metrics/x")[0], 404)
        for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
            status, headers, _ = http_get(mport, "/metrics", method=method, body=b"x" if method != "OPTIONS" else None)
            self.assertEqual(status, 405, method)
            self.assertEqual(headers.get("Allow"), "GET, HEAD")
        status, _, body = http_get(mport, "/metrics", method="HEAD")
        self.assertEqual((status, body), (200, b""))

        status, headers, page = http_get(mport, "/")
        self.assertEqual(status, 200)
        self.assertTrue(headers["Content-Type"].startswith("text/html"))
        self.assertIn("default-src 'none'", headers["Content-Security-Policy"])
        html = page.decode()
        self.assertNotRegex(html, r"<(link|img|iframe)\b|<script[^>]+src=|url\(", "the page must be self-contained")
        self.assertEqual(re.findall(r"https?://[^\s\"']+", html), ["http://www.w3.org/2000/svg"])
        status, _, body = http_get(mport, "/api/status")
        st = json.loads(body)
        self.assertEqual(status, 200)
        for key in ("counters", "routes", "confirms", "confirm_latency", "connections", "problems", "returns_by_code",
                    "warnings_by_rule"):
            self.assertIn(key, st)
        self.assertEqual(len(st["confirm_latency"]["buckets"]), len(LE_US) + 1)

    def test_process_start_time_under_the_units_proc_subset(self):
        """The service runs with ProcSubset=pid, which hides /proc/stat: process_start_time_seconds must still be
        when the tap started (it was 0, read from /proc/stat's boot time). The tap runs here in a mount namespace of
        its own whose /proc is mounted subset=pid (unshare and sh exec it: its pid is the process's)."""
        if os.geteuid() != 0 or not shutil.which("unshare"):
            self.skipTest("needs root and unshare for a /proc of its own")
        mport = free_port()
        script = ("mount -t proc -o subset=pid proc /proc && test ! -e /proc/stat && exec \"$@\"")
        started = time.time()
        p = subprocess.Popen(["unshare", "--mount", "sh", "-c", script, "sh", AMQPTAP_BIN,
                              "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{BROKER_PORT}", "--verdicts",
                              os.devnull, "--metrics", f"127.0.0.1:{mport}"], stderr=subprocess.PIPE)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
        m = {}

        def scraped():
            nonlocal m
            try:
                m = metric_samples(http_get(mport, "/metrics", timeout=2)[2].decode())
                return True
            except OSError:
                return False
        self.assertTrue(wait_for(scraped, 10, 0.1), p.stderr.read1().decode() if p.poll() is not None else "")
        self.assertLess(abs(m["process_start_time_seconds"] - started), 5, m["process_start_time_seconds"])
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(15), 0)

    def test_unreachable_upstream_is_reported(self):
        tap, mport = start_metrics_tap(self, upstream_port=free_port())
        # the tap resets a client whose broker is unreachable (as a refused connect would), possibly before
        # connect() has even returned
        with self.assertRaises(ConnectionResetError):
            with socket.create_connection(("127.0.0.1", tap.port), timeout=5) as s:
                s.settimeout(5)
                s.recv(10)
        self.assertTrue(wait_for(lambda: json.loads(http_get(mport, "/healthz")[2])["upstream_reachable"] is False, 10))
        m = metric_samples(http_get(mport, "/metrics")[2].decode())
        self.assertEqual((m["amqptap_upstream_up"], m["amqptap_upstream_unreachable_total"]), (0, 1))
        self.assertEqual(json.loads(http_get(mport, "/healthz")[2])["upstream_failure"], "unreachable")
        self.assertEqual(http_get(mport, "/healthz")[0], 200, "the listener is up: healthy even if the broker is not")

    def test_healthz_is_503_while_shutting_down(self):
        tap, mport = start_metrics_tap(self, extra=["--grace", "20000"])
        conn = self.connect(tap)
        tap.proc.send_signal(signal.SIGTERM)
        self.assertTrue(wait_for(lambda: http_get(mport, "/healthz")[0] == 503, 10), "no 503 during the grace period")
        status, _, body = http_get(mport, "/healthz")
        self.assertEqual((status, json.loads(body)["status"]), (503, "stopping"))
        self.assertEqual(metric_samples(http_get(mport, "/metrics")[2].decode())["amqptap_listening"], 0)
        conn.close()
        self.assertEqual(tap.stop(), 0)

    def test_shutdown_with_the_connection_cap_reached(self):
        """Past the cap a new connection takes the place of the oldest one, so the count stays at the cap; shutting
        down then frees every connection cleanly. evhttp_free frees the listener before it closes the connections,
        whose close callbacks resume accepting: valgrind (when installed and the build is not ASan's, whose checks
        do not reach into libevent) sees any use after free."""
        valgrind = shutil.which("valgrind") if not is_asan_build() else None
        mport, lport = free_port(), free_port()
        args = [AMQPTAP_BIN, "--listen", f"127.0.0.1:{lport}", "--upstream", f"127.0.0.1:{BROKER_PORT}",
                "--verdicts", os.devnull, "--metrics", f"127.0.0.1:{mport}"]
        if valgrind:
            args = [valgrind, "-q", "--error-exitcode=9"] + args
        err = tempfile.TemporaryFile()
        tap = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        self.addCleanup(lambda: tap.poll() is None and (tap.kill(), tap.wait()))

        def listening():
            try:
                return http_get(mport, "/healthz", timeout=2)[0] == 200
            except OSError:
                return False
        self.assertTrue(wait_for(listening, 30, 0.2))
        idle = [socket.create_connection(("127.0.0.1", mport), timeout=5) for _ in range(MAX_HTTP_CONNS + 8)]
        self.addCleanup(lambda: [s.close() for s in idle])
        self.assertTrue(wait_for(lambda: len(os.listdir(f"/proc/{tap.pid}/fd")) >= MAX_HTTP_CONNS, 10))
        time.sleep(0.5)
        fds = len(os.listdir(f"/proc/{tap.pid}/fd"))
        late = socket.create_connection(("127.0.0.1", mport), timeout=5)  # takes the oldest one's place
        self.addCleanup(late.close)
        time.sleep(0.5)
        self.assertEqual(len(os.listdir(f"/proc/{tap.pid}/fd")), fds, "accepted past the cap")
        tap.send_signal(signal.SIGTERM)
        rc = tap.wait(60)
        err.seek(0)
        report = err.read().decode("utf-8", "replace")
        self.assertEqual(rc, 0, report[-3000:])
        self.assertNotIn("Sanitizer", report)
        note("checked under valgrind" if valgrind else "valgrind not used")

    def test_option_forms(self):
        port = free_port()
        tap = self.start_tap(["--metrics", str(port)])
        self.assertIn(f"metrics on http://127.0.0.1:{port}/", tap.stderr(), "PORT alone listens on loopback")
        self.assertEqual(http_get(port, "/healthz")[0], 200)
        tap2 = self.start_tap(["--metrics", ":0"])
        m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/", tap2.stderr())
        self.assertIsNotNone(m, tap2.stderr())
        self.assertEqual(http_get(int(m.group(1)), "/healthz")[0], 200)
        for bad in ("nope:x", "1.2.3.4:99999", ""):
            r = subprocess.run([AMQPTAP_BIN, "--metrics", bad, "--listen", f"127.0.0.1:{free_port()}"],
                               capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
            self.assertEqual(r.returncode, 2, (bad, r.stderr))
            self.assertIn(b"--metrics", r.stderr)
        r = subprocess.run([AMQPTAP_BIN, "--metrics", f"127.0.0.1:{port}", "--listen", f"127.0.0.1:{free_port()}"],
                           capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
        self.assertEqual(r.returncode, 1, "the metrics port is taken by the first tap")
        self.assertIn(f"--metrics 127.0.0.1:{port}:".encode(), r.stderr)
        out = subprocess.run([AMQPTAP_BIN, "--help"], capture_output=True, timeout=10).stdout
        self.assertIn(b"--metrics ADDR:PORT", out)


# ---- hostile HTTP clients on the metrics port ----

MAX_HTTP_CONNS = 32  # TAP_ADMIN_MAX_CONNS


class Attack:
    """Threads that misbehave on the metrics port until stop(): slow headers, waves of thousands of idle
    connections, a huge body, a huge header, pipelined requests whose replies are never read."""

    def __init__(self, port):
        self.port = port
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.stats = {"slow_closed_by_tap": 0, "flood_opened": 0, "huge_body_sent": 0, "huge_body_answer": None,
                      "huge_header_answer": None, "pipelined_sent": 0, "pipelined_answer": None}
        self.threads = [threading.Thread(target=f, daemon=True) for f in
                        (self.slowloris, self.flood, self.huge_body, self.huge_header, self.pipeliner)]

    def start(self):
        for t in self.threads:
            t.start()

    def stop(self):
        self.done.set()
        for t in self.threads:
            t.join(60)

    def add(self, key, n=1):
        with self.lock:
            self.stats[key] += n

    def connect(self):
        """A blocking socket to the metrics port, or None while the port accepts nobody (cap reached, flood)."""
        s = socket.socket()
        s.settimeout(3)
        try:
            s.connect(("127.0.0.1", self.port))
            return s
        except OSError:
            s.close()
            return None

    def slowloris(self):
        socks = []
        while not self.done.is_set():
            while len(socks) < MAX_HTTP_CONNS + 8:
                try:
                    s = socket.socket()
                    s.setblocking(False)
                    s.connect_ex(("127.0.0.1", self.port))
                    socks.append([s, False])
                except OSError:
                    break
            for entry in list(socks):
                s, started = entry
                try:
                    s.send(b"X-Slow: 1\r\n" if started else b"GET /metrics HTTP/1.1\r\n")
                    entry[1] = True
                    if s.recv(1) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    pass
                except OSError as e:
                    if getattr(e, "errno", None) in (errno.EAGAIN, errno.EINPROGRESS):
                        continue
                    if started:
                        self.add("slow_closed_by_tap")
                    s.close()
                    socks.remove(entry)
            self.done.wait(1.0)
        for s, _ in socks:
            s.close()

    def flood(self):
        """Waves of 2,000 connections that send nothing, held 3 s, then 2 s of rest."""
        while not self.done.is_set():
            wave = []
            for _ in range(2000):
                try:
                    s = socket.socket()
                    s.setblocking(False)
                    s.connect_ex(("127.0.0.1", self.port))
                    wave.append(s)
                except OSError:
                    break
            self.add("flood_opened", len(wave))
            self.done.wait(3.0)
            for s in wave:
                s.close()
            self.done.wait(2.0)

    def once(self, key, attempt):
        """Runs attempt(sock) on fresh connections until stop(); what it returns is kept in stats[key]."""
        while not self.done.is_set():
            s = self.connect()
            if s is None:
                self.done.wait(0.2)
                continue
            try:
                got = attempt(s)
                if got:
                    self.stats[key] = got
            except OSError:
                pass
            finally:
                s.close()
            self.done.wait(0.2)

    def huge_body(self):
        def attempt(s):
            s.sendall(b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 104857600\r\n\r\n")
            chunk = b"b" * (1 << 20)
            sent = 0
            try:
                for _ in range(100):
                    s.sendall(chunk)
                    sent += len(chunk)
            except OSError:
                pass
            with self.lock:
                self.stats["huge_body_sent"] = max(self.stats["huge_body_sent"], sent)
            s.settimeout(1)
            return s.recv(100)
        self.once("huge_body_answer", attempt)

    def huge_header(self):
        def attempt(s):
            try:
                s.sendall(b"GET / HTTP/1.1\r\nX-Big: " + b"h" * (1 << 20) + b"\r\n\r\n")
            except OSError:
                pass
            s.settimeout(1)
            return s.recv(100)
        self.once("huge_header_answer", attempt)

    def pipeliner(self):
        def attempt(s):
            s.settimeout(0.5)
            req = b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 100
            while not self.done.is_set():
                s.sendall(req)
                self.add("pipelined_sent", 100)
        self.once("pipelined_answer", attempt)


class HostileClients(ScenarioCase):
    def stream(self, tap, queue, n):
        t0 = time.monotonic()
        pub = stream_publisher(tap.port, n, 64, 1000, True, queue)
        out, err = pub.communicate(timeout=600)
        secs = time.monotonic() - t0
        self.assertEqual(pub.returncode, 0, err.decode())
        res = final_line(out)
        self.assertEqual((res["sent"], res["acked"], res["nacked"], res["returned"]), (n, n, 0, 0), res)
        return secs

    def test_hostile_clients_change_no_forwarding_or_verdict(self):
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
        queue = self.declare_queue("stream", arguments={"x-max-length": 10000})
        tap, mport = start_metrics_tap(self, frames=False)
        n = 150000
        base_secs = self.stream(tap, queue, n)
        base_rss, base_fds = rss_kb(tap.pid), len(os.listdir(f"/proc/{tap.pid}/fd"))

        attack = Attack(mport)
        peak = {"rss": 0, "fds": 0}
        sampling = threading.Event()

        def sample():
            while not sampling.is_set():
                try:
                    peak["rss"] = max(peak["rss"], rss_kb(tap.pid))
                    peak["fds"] = max(peak["fds"], len(os.listdir(f"/proc/{tap.pid}/fd")))
                except (OSError, RuntimeError):
                    pass
                sampling.wait(0.1)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        attack.start()
        t_attack = time.monotonic()
        time.sleep(1)
        attack_secs = self.stream(tap, queue, n)
        time.sleep(max(0.0, TAP_ADMIN_REQUEST_SECONDS + 3 - (time.monotonic() - t_attack)))  # past a request deadline
        # the huge body and the huge header get their answer only on a connection the tap accepted and did not
        # give to a newer one before the answer: a few more turns of the attack if neither got in yet
        wait_for(lambda: attack.stats["huge_body_answer"] and attack.stats["huge_header_answer"], 30, 0.5)
        attack.stop()
        sampling.set()
        sampler.join(5)
        note(f"stream of {n}: {base_secs:.2f} s alone, {attack_secs:.2f} s under attack; tap RSS {base_rss} KiB "
             f"before, peak {peak['rss']} KiB; descriptors {base_fds} before, peak {peak['fds']}; {attack.stats}")

        # forwarding and verdicts: both streams complete, one routed+acked record per publish
        self.assertTrue(tap.alive())
        m = None

        def scraped():
            nonlocal m
            try:
                m = metric_samples(http_get(mport, "/metrics", timeout=2)[2].decode())
                return m["amqptap_http_connections_open"] <= 1
            except OSError:
                return False
        self.assertTrue(wait_for(scraped, 30, 0.5), f"the metrics endpoint did not recover: {m}")
        recs = self.stop_tap(tap)
        self.assertEqual(len(recs), 2 * n)
        bad = [r for r in recs if (r["route"], r["confirm"]) != ("routed", "ack")]
        self.assertEqual(bad[:3], [])
        for conn in {r["conn"] for r in recs}:
            self.assertSeqsOnce([r for r in recs if r["conn"] == conn], n)

        # within reason: the machine is shared, so allow for noise but not for a stall
        self.assertLess(attack_secs, 2.5 * base_secs + 3, "forwarding slowed down under the HTTP attack")
        slack_kb = 40 * 1024 * (3 if is_asan_build() else 1)
        self.assertLess(peak["rss"], base_rss + slack_kb, "tap memory grew under the HTTP attack")
        self.assertLessEqual(peak["fds"], base_fds + MAX_HTTP_CONNS + 4, "more HTTP connections than the cap")
        # the attack did happen and met each bound
        self.assertGreater(attack.stats["flood_opened"], 2000)
        # a slow client ends at its request deadline or, sooner, when a newer connection takes its place at the cap
        self.assertGreater(m["amqptap_http_timeouts_total"] + m["amqptap_http_evicted_total"], 0,
                           "no slow client was closed")
        self.assertGreater(m["amqptap_http_evicted_total"], 0, "the connection cap was never reached")
        self.assertLess(attack.stats["huge_body_sent"], 100 << 20, "a 100 MB body was read to the end")  # most in one
        self.assertGreater(attack.stats["pipelined_sent"], 100)
        self.assertRegex(attack.stats["huge_body_answer"] or b"", rb"^HTTP/1\.1 413 ")
        self.assertRegex(attack.stats["huge_header_answer"] or b"", rb"^HTTP/1\.1 400 ")


TAP_ADMIN_REQUEST_SECONDS = 10


if __name__ == "__main__":
    main()
