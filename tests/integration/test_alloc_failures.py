# The tap where allocations fail: tests/preload/failalloc.c (LD_PRELOAD) makes one malloc, calloc or realloc in N
# return NULL once the tap has started. Real clients, real broker. Whatever fails, the tap must not crash or hang
# (on SIGTERM it exits 0, or 1 exactly when it counted records lost or connections it could not follow), every
# connection gets one close record and every publish one record (or is counted lost), no session is left waiting, a verdict it could not establish is
# `unknown` with a reason (never a route or confirm the broker did not give), a shortage of the tap's own is
# never blamed on the broker or the client (`tap_no_memory`), and no reason text is made up: an error without an
# errno has no text, never strerror(0)'s "Success". Plain TCP with rabbitmq-c publishers on the shared broker;
# TLS storms and TLS streams with TLS on both legs on tlslib's broker; a stop while allocations go on failing;
# `replay` of a capture, checked against the
# replay whose allocations all worked; `sniff -i lo` beside publishers that go straight to the broker. Skipped in
# sanitizer builds: their allocator comes first.

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import pika

from scenario_lib import stream_publisher
from tapharness import (AMQPTAP_BIN, BROKER_PORT, CLIENTS_DIR, FAILALLOC, Tap, free_port, is_asan_build, main,
                        read_records, replay, require_broker)
from tlslib import PLAIN_PORT, STORM, TlsCase, shared_pki

LOADGEN = os.path.join(os.path.dirname(CLIENTS_DIR), "bench", "bench_loadgen")
AFTER_MS = 1500  # the tap starts up whole before the first failure


def failing_env(one_in, stop_file):
    """The environment for a tap whose allocations fail, one in one_in, until stop_file exists."""
    return {"LD_PRELOAD": FAILALLOC, "FAILALLOC_ONE_IN": str(one_in), "FAILALLOC_AFTER_MS": str(AFTER_MS),
            "FAILALLOC_STOP_FILE": stop_file}


def summary(stderr):
    """From the tap's summary at exit: (publishes tracked, verdict records lost (by the output, or not rendered
    for want of memory), anything lost: records by any output, lines of the log, and connections the tap had no
    memory to follow or take (they have no records at all)). A summary the tap could not write in full is one line
    with what matters most, the outputs' losses on lines of their own."""
    short = re.search(r"^amqptap: summary: no memory or no room in the log to write it in full; (\d+) publishes, "
                      r"(\d+) records not rendered, (\d+) connections not followed", stderr, re.M)
    if short:
        pubs, unrendered, not_followed = (int(g) for g in short.groups())
        outputs = {k: int(n) for k, n in re.findall(r"^amqptap: --(\w+): (\d+) of \d+ records lost", stderr, re.M)}
    else:
        total = re.search(r"^total outstanding=\d+ publishes=(\d+)", stderr, re.M)
        tracking = re.search(r"^tracking memory .* short of memory \d+ times \(records lost (\d+), "
                             r"connections not followed (\d+)(?:, channels not followed \d+)?"
                             r"(?:, deliveries not followed \d+)?\)$", stderr, re.M)
        outputs = {k: int(n) for k, n in re.findall(r"^output (\w+) records=\d+ lost=(\d+)", stderr, re.M)}
        if not total or not tracking or "verdicts" not in outputs:
            raise AssertionError(f"no summary in the tap's stderr: {stderr[-2000:]}")
        pubs, unrendered, not_followed = int(total.group(1)), int(tracking.group(1)), int(tracking.group(2))
    # log lines lost count as records lost do (exit 1); the summary has those lost before it, the notes on stderr
    # all of them (the last note comes at the log's close)
    in_summary = re.search(r"^output stderr lost=(\d+) lines$", stderr, re.M)
    noted = sum(int(n) for n in re.findall(r"^amqptap: (\d+) line\(s\) of this log were lost", stderr, re.M))
    outputs["stderr"] = max(int(in_summary.group(1)) if in_summary else 0, noted)
    verdicts_lost = unrendered + outputs.get("verdicts", 0)
    lost_anywhere = verdicts_lost + not_followed + sum(n for k, n in outputs.items() if k != "verdicts")
    return pubs, verdicts_lost, lost_anywhere, not_followed


def failed_allocations(stderr):
    m = re.search(r"^failalloc: (\d+) of (\d+) allocations failed", stderr, re.M)
    if not m:
        raise AssertionError(f"failalloc did not report (was it preloaded?): {stderr[-2000:]}")
    return int(m.group(1))


@unittest.skipIf(is_asan_build(), "sanitizer build: its allocator cannot be replaced with LD_PRELOAD")
class AllocFailuresCase(TlsCase):
    """TlsCase: certificates and a TLS broker for the storms and streams; the plain test uses the shared broker."""

    def setUp(self):
        super().setUp()
        if not os.path.exists(FAILALLOC):
            self.fail(f"{FAILALLOC} is not built")

    def queue(self, tag, port=BROKER_PORT, max_length=None):
        """A queue on the broker at port for this test (at most max_length messages), deleted after it."""
        q = f"alloc.failures.{tag}.{time.monotonic_ns()}"
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        c.channel().queue_declare(q, arguments={"x-max-length": max_length} if max_length else None)
        self.addCleanup(lambda: c.channel().queue_delete(q) and c.close())
        return q

    def failing_tap(self, one_in, start, wait=True):
        """A tap from start(env) whose allocations fail, one in one_in, from AFTER_MS on (tap.armed_at, monotonic;
        waits for it unless wait is false)."""
        stop_file = os.path.join(tempfile.mkdtemp(prefix="failalloc-"), "stop")
        self.addCleanup(shutil.rmtree, os.path.dirname(stop_file), True)
        started = time.monotonic()
        tap = start(env=failing_env(one_in, stop_file))
        tap.failalloc_stop = stop_file
        tap.armed_at = started + AFTER_MS / 1000
        if wait:
            time.sleep(max(0.0, tap.armed_at + 0.2 - time.monotonic()))
        return tap

    def check_records(self, tap, verdicts_ok):
        """Stops the tap (allocations working again: its summary must not be lost) and checks what every test
        here asks of its records; returns (records, stderr)."""
        open(tap.failalloc_stop, "w").close()
        time.sleep(0.05)
        rc = tap.stop()
        self._taps.remove(tap)  # its exit code is checked here (1 when records were lost), not by tearDown
        self.addCleanup(tap.cleanup)
        err = tap.stderr()
        self.assertGreater(failed_allocations(err), 0, "no allocation failed: the test did not reach its premise")
        n_pubs, lost, lost_anywhere, not_followed = summary(err)
        self.assertEqual(rc, 1 if lost_anywhere else 0, f"{lost_anywhere} records lost, exit code {rc}: {err[-3000:]}")
        recs = read_records(tap.verdicts)
        made_up = [r for r in recs if "Success" in json.dumps(r)]
        self.assertEqual(made_up, [], "strerror(0) as a reason")
        no_room = [r for r in recs if r["type"] == "records_lost" and r["reason"] == "backlog_full"]
        self.assertEqual(no_room, [], "records dropped for want of memory reported as a full backlog")
        pubs = [r for r in recs if r["type"] == "publish"]
        self.assertLessEqual(len(pubs), n_pubs)
        self.assertGreaterEqual(len(pubs) + lost, n_pubs, f"publishes without a record, {lost} counted lost")
        # a publish is named by its confirm seq, or (its channel's mode lost to a failed allocation: seq null) by
        # the message id stream_publisher gives it; one with neither (details lost too) names nothing
        named = [(p["conn"], p["channel"], p["seq"] if p["seq"] is not None else p["message_id"]) for p in pubs
                 if p["seq"] is not None or p["message_id"] is not None]
        self.assertEqual(len(set(named)), len(named), "a publish twice")
        for p in pubs:
            if p["route"] == "unknown":
                self.assertTrue(p.get("reason") and p["reason"].get("by"), p)
            else:
                self.assertIn((p["route"], p["confirm"]), verdicts_ok, p)
        closes = [r for r in recs if r["type"] == "connection" and r.get("event") == "close"]
        ids = [r["conn"] for r in closes]
        self.assertEqual(len(ids), len(set(ids)), "a connection closed twice")
        if lost == 0:
            self.assertEqual(set(ids), {r["conn"] for r in recs if "conn" in r}, "a connection without its close")
        # no session was left waiting: none timed out (no client here stalls), none was still open at the stop
        self.assertEqual([r for r in closes if "timed out" in (r.get("text") or "") or r["by"] == "shutdown"], [],
                         "sessions the tap stopped watching")
        # a shortage of the tap's is the tap's: never blamed on the broker or the client
        blamed = [r for r in closes if "malloc failure" in (r.get("text") or "") and r["by"] != "tap_no_memory"]
        self.assertEqual(blamed, [])
        return recs, err

    def test_plain_publishers(self):
        """Twelve rabbitmq-c publishers, 3,000 confirmed mandatory publishes each to a queue, one allocation in 40
        failing: connections the tap cannot serve are closed, the rest are served in full."""
        require_broker(self)
        q = self.queue("plain", max_length=1000)
        tap = self.failing_tap(40, self.start_tap)
        pubs = [stream_publisher(tap.port, 3000, 64, 50, True, q) for _ in range(12)]
        done = 0
        for p in pubs:
            out, _ = p.communicate(timeout=120)
            final = [json.loads(ln) for ln in out.decode().splitlines() if ln.startswith('{"sent"')]
            if p.returncode == 0 and final and final[-1]["acked"] == 3000:
                done += 1
        recs, err = self.check_records(tap, {("routed", "ack")})
        # every publisher's connection has records, or is counted as one the tap could not follow
        _, lost, _, not_followed = summary(err)
        if lost == 0:
            self.assertEqual(len({r["conn"] for r in recs if "conn" in r}) + not_followed, 12, err[-2000:])
        print(f"{done} of 12 publishers finished; {failed_allocations(err)} allocations failed; "
              f"{sum(1 for r in recs if r['type'] == 'publish')} publish records")
        self.assertGreater(done, 0, "no publisher was served in full")

    def stop_under_failures(self, seed, after_ms, traffic):
        """A tap (--verdicts - into a pipe nobody reads) whose allocations fail one in 2 from after_ms on, stopped with
        SIGTERM just before (traffic: four publishers stream through it meanwhile, so its writer is stuck and must be
        cancelled at the stop) or after that (an idle tap): (exit code, seconds the stop took, stderr)."""
        port = free_port()
        env = dict(os.environ, LD_PRELOAD=FAILALLOC, FAILALLOC_ONE_IN="2", FAILALLOC_AFTER_MS=str(after_ms),
                   FAILALLOC_SEED=str(seed))
        err = tempfile.TemporaryFile()
        tap = subprocess.Popen([AMQPTAP_BIN, "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{BROKER_PORT}",
                                "--verdicts", "-"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=err)
        self.addCleanup(lambda: tap.poll() is None and tap.kill())
        time.sleep(0.5)
        pubs = [stream_publisher(port, 1000000, 64, 50, True, self.stop_queue) for _ in range(4 if traffic else 0)]
        self.addCleanup(lambda: [p.kill() for p in pubs if p.poll() is None])
        time.sleep(after_ms / 1000 - 0.4 if traffic else after_ms / 1000 + 0.3 - 0.5)
        tap.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        try:
            rc = tap.wait(timeout=15)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - t0
        for p in pubs:
            p.kill()
            p.communicate()
        tap.stdout.close()
        err.seek(0)
        return rc, took, err.read().decode(errors="replace")

    def test_stop_when_most_allocations_fail(self):
        """SIGTERM to a tap where one allocation in 2 fails: it exits within its deadlines, 0 or 1, with a summary,
        every time. An idle tap (five seeded runs): libevent's loopexit needs memory, and a stop whose allocation
        failed was lost (the tap ran on until killed: half the runs at one in 2). Its records into a pipe nobody
        reads while publishers stream (three runs): the stuck writer is cancelled, and glibc, loading the unwinder
        a cancel needs at the first one, aborted the process when that load found no memory."""
        require_broker(self)
        self.stop_queue = self.queue("most", max_length=1000)
        for traffic, seeds, after_ms in ((False, range(1, 6), 1500), (True, range(1, 4), 3000)):
            for seed in seeds:
                rc, took, err = self.stop_under_failures(seed, after_ms, traffic)
                run = f"{'streaming' if traffic else 'idle'} run, FAILALLOC_SEED={seed}: exit {rc} after {took:.1f} s: " \
                      f"{err[-1500:]}"
                self.assertIn(rc, (0, 1), run)
                self.assertLess(took, 8.0, run)
                self.assertRegex(err, r"(?m)^(output verdicts records=|amqptap: summary: )", run)

    def start_with_thread_refused(self, n, d, args):
        """Starts the tap (args, in front of the test broker, stderr in d) with its Nth thread refused
        (FAILALLOC_THREAD=N) and waits until it has exited or listens. Returns (the process, a reader of its
        stderr)."""
        err_path = os.path.join(d, "err")
        with open(err_path, "wb") as err:
            tap = subprocess.Popen([AMQPTAP_BIN, "--upstream", f"127.0.0.1:{BROKER_PORT}", *args],
                                   env=dict(os.environ, LD_PRELOAD=FAILALLOC, FAILALLOC_THREAD=str(n)),
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        self.addCleanup(lambda: tap.poll() is None and tap.kill())
        read_err = lambda: open(err_path, encoding="utf-8", errors="replace").read()  # noqa: E731
        deadline = time.monotonic() + 10
        while tap.poll() is None and "listening on" not in read_err() and time.monotonic() < deadline:
            time.sleep(0.05)
        return tap, read_err

    def test_each_helper_thread_refused_at_start(self):
        """The Nth thread the tap starts is refused (FAILALLOC_THREAD=N, each N in turn: the record writers, the
        metrics server, the stderr writer): it either does not start (exit 1, naming why in a line, no summary of
        nothing) or starts whole and forwards. It must never run on without a helper: without the stderr writer it
        used to go on writing its log directly, where a stderr that lags holds the event loop, and forwarding, up."""
        require_broker(self)
        q = self.queue("threads")
        refused, ran = [], []
        for n in range(1, 7):
            with tempfile.TemporaryDirectory() as d:
                port, mport = free_port(), free_port()
                verdicts = os.path.join(d, "v.jsonl")
                tap, read_err = self.start_with_thread_refused(n, d, [
                    "--listen", f"127.0.0.1:{port}", "--verdicts", verdicts, "--frames", os.path.join(d, "f.jsonl"),
                    "--metrics", f"127.0.0.1:{mport}"])
                if tap.poll() is not None:
                    err = read_err()
                    lines = [ln for ln in err.splitlines() if not ln.startswith("failalloc:")]
                    self.assertEqual(tap.returncode, 1, f"thread {n}: {err}")
                    self.assertRegex(lines[-1], r"^amqptap: .*(cannot start|no thread)", f"thread {n}: {err}")
                    self.assertNotIn("summary", err, f"thread {n}")
                    refused.append(n)
                    continue
                self.assertIn("listening on", read_err(), f"thread {n}")
                conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
                ch = conn.channel()
                ch.confirm_delivery()
                ch.basic_publish("", q, b"x", mandatory=True)
                conn.close()
                tap.send_signal(signal.SIGTERM)
                tap.wait(15)
                err = read_err()
                self.assertEqual(tap.returncode, 0, f"thread {n}: {err}")
                self.assertNotIn("directly", err, f"thread {n}")
                pubs = [r for r in read_records(verdicts) if r["type"] == "publish"]
                self.assertEqual([(r["route"], r["confirm"]) for r in pubs], [("routed", "ack")], f"thread {n}")
                ran.append(n)
        print(f"threads refused at start: {refused}; started whole: {ran}")
        self.assertEqual(refused, [1, 2, 3, 4])  # verdicts, frames, metrics, stderr
        self.assertTrue(ran)

    def test_tls_handshake_thread_refused_at_start(self):
        """A TLS listener's proxy starts a thread of its own, the handshaker: refused, the tap exits 1 with a line
        naming it (it said only "cannot start: Resource temporarily unavailable"). Each thread is refused in turn
        until one of them is the handshaker."""
        pki = shared_pki()
        lines = []
        for n in range(1, 6):
            with tempfile.TemporaryDirectory() as d:
                tap, read_err = self.start_with_thread_refused(n, d, [
                    "--listen", f"127.0.0.1:{free_port()}", "--tls-cert", os.path.join(pki, "server.pem"),
                    "--tls-key", os.path.join(pki, "server.key"), "--verdicts", os.path.join(d, "v.jsonl")])
                if tap.poll() is None:
                    tap.send_signal(signal.SIGTERM)
                    self.assertEqual(tap.wait(15), 0, f"thread {n}: {read_err()}")
                    continue
                self.assertEqual(tap.returncode, 1, f"thread {n}: {read_err()}")
                lines += [ln for ln in read_err().splitlines() if not ln.startswith("failalloc:")][-1:]
        self.assertIn("amqptap: cannot start its TLS handshake thread: Resource temporarily unavailable", lines)

    def test_stop_while_allocations_fail(self):
        """SIGTERM to a tap whose allocations go on failing (one in 30) while eight rabbitmq-c publishers stream
        through it, two seeded runs: it exits within the shutdown grace (1 s) and a margin, never killed, with
        0, or 1 exactly when its summary counts something lost; every publish it tracked has one record or is
        counted lost."""
        require_broker(self)
        q = self.queue("stop", max_length=1000)
        for seed in range(1, 3):
            env = {"LD_PRELOAD": FAILALLOC, "FAILALLOC_ONE_IN": "30", "FAILALLOC_AFTER_MS": str(AFTER_MS),
                   "FAILALLOC_SEED": str(seed)}
            tap = self.start_tap(env=env)
            time.sleep(AFTER_MS / 1000 + 0.2)
            pubs = [stream_publisher(tap.port, 1000000, 64, 50, True, q) for _ in range(8)]
            self.addCleanup(lambda pubs=pubs: [p.kill() for p in pubs if p.poll() is None])
            time.sleep(1.0)
            t0 = time.monotonic()
            rc = tap.stop(timeout=10)
            took = time.monotonic() - t0
            self._taps.remove(tap)  # its exit code is checked here, not by tearDown
            self.addCleanup(tap.cleanup)
            for p in pubs:
                p.kill()
                p.communicate()
            err = tap.stderr()
            run = f"run {seed} (FAILALLOC_SEED={seed}) exited {rc} after {took:.1f} s: {err[-2000:]}"
            self.assertGreater(failed_allocations(err), 0, run)
            self.assertIn(rc, (0, 1), run)
            self.assertLess(took, 5.0, run)
            n_pubs, lost, lost_anywhere, not_followed = summary(err)
            self.assertEqual(rc, 1 if lost_anywhere else 0, run)
            got = [r for r in read_records(tap.verdicts) if r["type"] == "publish"]
            self.assertGreaterEqual(len(got) + lost, n_pubs, run)
            self.assertGreater(n_pubs, 0, run)

    def test_replay(self):
        """`amqptap replay` of a capture of real traffic (twenty rabbitmq-c publishers through a tap with --pcap whose
        allocations all worked), 60 times with one allocation in 20 (odd runs) or 100 (even runs) failing from the
        start, each run seeded (FAILALLOC_SEED = the run's number: the same capture and seed fail the same
        allocations in the main thread). Each run exits 0 with every record the working replay wrote (a verdict the
        tracker had no room to establish may be `unknown` with a reason), or exits 1 and says on stderr what it lost,
        or that it could not start (then it wrote nothing). Never 0 with a record missing, never 2 (that is for bad
        options), never a crash."""
        require_broker(self)
        q = self.queue("replay", max_length=1000)
        work = tempfile.mkdtemp(prefix="alloc-replay-")
        self.addCleanup(shutil.rmtree, work, True)
        cap = os.path.join(work, "traffic.pcapng")
        tap = self.start_tap(["--pcap", cap], frames=False)
        pubs = [stream_publisher(tap.port, 300, 64, 50, True, q) for _ in range(20)]
        for p in pubs:
            p.communicate(timeout=120)
            self.assertEqual(p.returncode, 0)
        self.assertEqual(tap.stop(), 0)

        def replay_into(out, env=None):
            r = replay(cap, BROKER_PORT, verdicts=out, env=env)
            return r.returncode, r.stderr(), read_records(out)

        rc, err, ref = replay_into(os.path.join(work, "reference.jsonl"))
        self.assertEqual(rc, 0, err)
        ref_pubs = [r for r in ref if r["type"] == "publish"]
        self.assertEqual(len(ref_pubs), 20 * 300)
        # a publish is found by its confirm seq, or (on a channel whose mode the tap lost) by its message id:
        # stream_publisher numbers them; one whose id the tap lost has its seq
        by_seq = {(r["conn"], r["channel"], r["seq"]): r for r in ref_pubs}
        by_id = {(r["conn"], r["channel"], r["message_id"]): r for r in ref_pubs}
        conn_events = lambda recs: sorted((r["conn"], r["event"]) for r in recs  # noqa: E731
                                          if r["type"] == "connection")
        tally = {"whole": 0, "lost": 0, "not started": 0}
        for seed in range(1, 61):
            out = os.path.join(work, f"run{seed}.jsonl")
            env = {"LD_PRELOAD": FAILALLOC, "FAILALLOC_ONE_IN": "20" if seed % 2 else "100", "FAILALLOC_AFTER_MS": "0",
                   "FAILALLOC_SEED": str(seed)}
            rc, err, recs = replay_into(out, env)
            run = f"run {seed} (FAILALLOC_SEED={seed}) exited {rc}: {err[-1500:]}"
            self.assertIn(rc, (0, 1), run)
            started = re.search(r"^amqptap:? summary", err, re.M) is not None  # in full, or what matters most
            tally["whole" if rc == 0 else "lost" if started else "not started"] += failed_allocations(err) > 0
            self.assertNotIn("Success", json.dumps(recs), run)
            if not started:  # it could not start: said so, wrote nothing
                self.assertEqual(rc, 1, run)
                self.assertRegex(err, r"Cannot allocate memory|out of memory|cannot start its writer thread", run)
                self.assertEqual(recs, [], run)
                continue
            seen, anonymous = set(), 0
            for r in (r for r in recs if r["type"] == "publish"):
                if r["seq"] is None and r["message_id"] is None and r.get("details_lost"):
                    # its channel's mode and its details both lost to failed allocations: nothing names it, so it
                    # counts as one of the publishes, unknown, with the reason
                    self.assertEqual(r["route"], "unknown", (r, run))
                    self.assertTrue(r.get("reason") and r["reason"].get("by"), (r, run))
                    anonymous += 1
                    continue
                want = by_seq.get((r["conn"], r["channel"], r["seq"])) if r["seq"] is not None else \
                    by_id.get((r["conn"], r["channel"], r["message_id"]))
                self.assertIsNotNone(want, f"a publish the capture does not have: {r}; " + run)
                self.assertNotIn(id(want), seen, f"a publish twice: {r}; " + run)
                seen.add(id(want))
                # null only when the record says the tap lost it, or when the publish was cut before its
                # properties came (the replay stopped for want of memory: unknown, with the reason)
                for k in ("message_id", "exchange", "routing_key"):
                    self.assertTrue(r[k] == want[k] or (r[k] is None and (r.get("details_lost") or
                                                                          r["route"] == "unknown")), (k, r, run))
                if r["route"] == "unknown":
                    self.assertTrue(r.get("reason") and r["reason"].get("by"), r)
                else:
                    self.assertEqual((r["route"], r["confirm"]), (want["route"], want["confirm"]), (r, run))
            if rc == 0:  # nothing may be missing
                self.assertEqual(len(seen) + anonymous, len(ref_pubs), "exit 0 with publishes missing: " + run)
                self.assertEqual(conn_events(recs), conn_events(ref), "exit 0 with connections missing: " + run)
            else:
                self.assertRegex(err, r"records lost|have no records|out of memory|Cannot allocate memory", run)
        print(f"replays where allocations failed: {tally}")
        self.assertGreater(tally["whole"], 0, tally)
        self.assertGreater(tally["lost"], 0, tally)

    def test_sniff(self):
        """`amqptap sniff -i lo` while ten rabbitmq-c publishers (300 confirmed mandatory publishes each) go straight
        to the broker, one allocation in 20 failing once the sniffer is up, four seeded runs: every publish has a
        record unless its connection is counted as not followed (300 publishes each) or its record is counted lost,
        the exit code is 1 exactly when something was, and no verdict differs from the broker's unless it is
        `unknown` with a reason."""
        require_broker(self)
        q = self.queue("sniff")
        work = tempfile.mkdtemp(prefix="alloc-sniff-")
        self.addCleanup(shutil.rmtree, work, True)
        for seed in range(1, 5):
            stop_file = os.path.join(work, f"stop{seed}")
            env = {**failing_env(20, stop_file), "FAILALLOC_AFTER_MS": "700", "FAILALLOC_SEED": str(seed)}
            p = Tap.sniff(env=env)  # its exit code is 1 when it lost something: checked below
            self.addCleanup(p.cleanup)
            time.sleep(0.8)  # armed
            pubs = [stream_publisher(BROKER_PORT, 300, 64, 50, True, q) for _ in range(10)]
            for pub in pubs:
                pub.communicate(timeout=120)
                self.assertEqual(pub.returncode, 0)
            time.sleep(0.3)
            open(stop_file, "w").close()
            time.sleep(0.05)
            rc = p.stop(signal.SIGTERM, timeout=20)
            err = p.stderr()
            run = f"sniff run {seed} (FAILALLOC_SEED={seed}) exited {rc}: {err[-1500:]}"
            self.assertGreater(failed_allocations(err), 0, run)
            n_pubs, lost, lost_anywhere, not_followed = summary(err)
            self.assertEqual(rc, 1 if lost_anywhere else 0, run)
            recs = p.records()
            got = [r for r in recs if r["type"] == "publish"]
            if not [r for r in recs if r["type"] == "capture_gap"]:  # the kernel dropped nothing: all were seen
                self.assertEqual(n_pubs + 300 * not_followed, 3000, run)
                self.assertGreaterEqual(len(got) + lost + 300 * not_followed, 3000, run)
            for r in got:
                if r["route"] == "unknown":
                    self.assertTrue(r.get("reason") and r["reason"].get("by"), r)
                else:
                    self.assertEqual((r["route"], r["confirm"]), ("routed", "ack"), (r, run))
            self.assertNotIn("Success", json.dumps(recs), run)

    def storm(self, n, one_in):
        """n TLS clients at once (tests/bench/bench_storm.c) through a tap with TLS to the broker too, one
        allocation in one_in failing, each publishing one mandatory message to a queue declared beforehand (so
        that no setup connection has to get through); returns the storm's result, the records and the stderr."""
        q = self.queue("storm", port=PLAIN_PORT, max_length=1000)
        tap = self.failing_tap(one_in, self.tls_tap)
        r = subprocess.run([STORM, "-T", "-H", "localhost", "-p", str(tap.port), "-C", self.p("ca.pem"), "-c", str(n),
                            "-q", q, "-D", "-t", "30"], stdout=subprocess.PIPE, timeout=300)
        res = json.loads(r.stdout)
        self.assertEqual(res.get("ok", 0) + res.get("failed", 0), n, res)
        recs, err = self.check_records(tap, {("routed", "ack")})
        print(f"storm of {n}, one allocation in {one_in} failing: {res['ok']} confirmed, "
              f"{failed_allocations(err)} allocations failed")
        return res, recs, err

    def test_tls_streams_break(self):
        """Thirty rabbitmq-c TLS publishers (tests/bench/bench_loadgen.c) stream through a tap with TLS on both
        legs when allocations start failing (one in 50): sessions break in OpenSSL's reads and writes and in the
        tap's; each ends with what failed in OpenSSL's words or the tap's, or with no text, never "Success" (the
        errno of a failed read used to be read after forwarding what came before it had reset it)."""
        tap = self.failing_tap(50, self.tls_tap, wait=False)  # the handshakes are done before it fails
        r = subprocess.run([LOADGEN, "-T", "-H", "localhost", "-p", str(tap.port), "-C", self.p("ca.pem"), "-c", "30",
                            "-w", "20", "-s", "64", "-n", "4000"], stdout=subprocess.PIPE, timeout=300)
        self.assertGreater(time.monotonic(), tap.armed_at, "the load was over before anything failed")
        res = json.loads(r.stdout)
        recs, err = self.check_records(tap, {("unproven", "ack")})
        broken = [r for r in recs if r["type"] == "connection" and r.get("event") == "close" and r["by"] != "client"]
        print(f"30 TLS streams, one allocation in 50 failing: {len(broken)} broke, {res.get('sent')} sent, "
              f"{failed_allocations(err)} allocations failed")
        self.assertGreater(len(broken), 5, "the failures did not reach the streams")
        self.assertIn("tap_no_memory", {r["by"] for r in broken})

    def test_tls_storm_most_handshakes_fail(self):
        """300 clients, one allocation in 50 failing: OpenSSL fails nearly every handshake (a session takes
        about 4,400 allocations in the tap), at every step of it; each session is closed with what OpenSSL said,
        or with no text where nothing said anything."""
        res, recs, _ = self.storm(300, 50)
        ended = [r for r in recs if r["type"] == "connection" and r.get("by") in ("client_tls_error", "broker_tls_error",
                                                                                  "tap_no_memory")]
        self.assertGreater(len(ended), 100, "the failures did not reach the handshakes")

    def test_tls_storm_some_sessions_fail(self):
        """300 clients, one allocation in 20,000 failing: most sessions get through and their publishes are
        routed and acked; the rest end with a record."""
        res, recs, err = self.storm(300, 20000)
        self.assertGreater(res["ok"], 0, res)
        pubs = [r for r in recs if r["type"] == "publish"]
        self.assertGreater(sum(1 for r in pubs if r["route"] == "routed"), res["ok"] // 2)
        # every publish a client saw confirmed has its record (routed, or unknown where the tap lost track of it),
        # or the summary counts it lost: a record lost, or the one publish of a client whose connection the tap had
        # no memory to follow (such a connection has no records at all)
        _, lost, _, not_followed = summary(err)
        self.assertGreaterEqual(len(pubs) + lost + not_followed, res["ok"], err[-2000:])

if __name__ == "__main__":
    main()
