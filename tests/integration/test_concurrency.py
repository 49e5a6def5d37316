# Concurrency: 200 pika connections open through the tap at the same time, each completes a real AMQP session
# against the throwaway broker (declare, publish, get, close); afterwards the tap's open file descriptors are
# back to where they started. And 1,000 rabbitmq-c confirm publishers open at once through one tap (the scale the
# performance issue asks for), every one of their publishes with exactly one right verdict.

import collections
import json
import os
import resource
import subprocess
import threading
import uuid

import pika

from tapharness import BROKER_PORT, CLIENTS_DIR, TapTestCase, fd_count, main, require_broker, wait_for

CLIENTS = 200
PUBLISHERS = 1000
PUBLISHES_EACH = 20
MANYCONN = os.path.join(os.path.dirname(CLIENTS_DIR), "bench", "bench_manyconn")


class ConcurrencyTest(TapTestCase):
    def test_200_concurrent_sessions(self):
        require_broker(self)
        tap = self.start_tap(upstream_port=BROKER_PORT)
        baseline = fd_count(tap.pid)
        all_open = threading.Barrier(CLIENTS + 1, timeout=60)
        release = threading.Event()
        ok = []
        errors = []
        lock = threading.Lock()

        def session(i):
            conn = None
            try:
                conn = pika.BlockingConnection(pika.ConnectionParameters(
                    host="127.0.0.1", port=tap.port, connection_attempts=1, socket_timeout=30,
                    blocked_connection_timeout=60))
                ch = conn.channel()
                q = ch.queue_declare("", exclusive=True).method.queue
                all_open.wait()
                release.wait(60)
                body = f"client {i} {uuid.uuid4().hex}".encode()
                ch.basic_publish("", q, body)
                got = None
                for _ in range(200):
                    method, _props, got = ch.basic_get(q, auto_ack=True)
                    if method:
                        break
                    conn.sleep(0.01)
                if got != body:
                    raise AssertionError(f"client {i}: got {got!r}")
                ch.close()
                conn.close()
                with lock:
                    ok.append(i)
            except Exception as e:  # collected and asserted below
                with lock:
                    errors.append(f"client {i}: {e!r}")
                try:
                    all_open.abort()
                except threading.BrokenBarrierError:
                    pass
                if conn is not None and conn.is_open:
                    conn.close()

        threads = [threading.Thread(target=session, args=(i,), daemon=True) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        peak = None
        try:
            all_open.wait()
            peak = fd_count(tap.pid)
        except threading.BrokenBarrierError:
            pass
        release.set()
        for t in threads:
            t.join(90)
        self.assertEqual(errors[:5], [])
        self.assertEqual(len(ok), CLIENTS)
        print(f"tap fds: baseline {baseline}, with {CLIENTS} sessions open {peak}")
        self.assertGreaterEqual(peak, baseline + 2 * CLIENTS, "the sessions were not all open at once")
        self.assertTrue(wait_for(lambda: fd_count(tap.pid) <= baseline, 10.0),
                        f"fd count {fd_count(tap.pid)} did not return to baseline {baseline}")
        self.assertEqual(fd_count(tap.pid), baseline)
        self.assertTrue(tap.alive())



def _enough_fds(need):
    """In the child: lifts the soft descriptor limit to `need` (the hard limit permitting)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else min(need, hard), hard))


class ManyPublishersTest(TapTestCase):
    def test_1000_confirm_publishers_at_once(self):
        require_broker(self)
        self.assertTrue(os.access(MANYCONN, os.X_OK), f"{MANYCONN} was not built (is librabbitmq-dev installed?)")
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard != resource.RLIM_INFINITY and hard < PUBLISHERS + 64:
            self.skipTest(f"descriptor hard limit {hard} is below the {PUBLISHERS + 64} the client needs")
        tap = self.start_tap(upstream_port=BROKER_PORT, frames=False)
        baseline = fd_count(tap.pid)
        peak = [0]
        done = threading.Event()

        def watch_fds():
            while not done.is_set():
                peak[0] = max(peak[0], fd_count(tap.pid))
                done.wait(0.05)

        watcher = threading.Thread(target=watch_fds, daemon=True)
        watcher.start()
        # -P: every connection stays open 300 ms once all are up (and after the last confirm), so the peak is seen
        run = subprocess.run([MANYCONN, "-p", str(tap.port), "-c", str(PUBLISHERS), "-w", "10",
                              "-n", str(PUBLISHES_EACH), "-s", "64", "-P", "300"],
                             capture_output=True, text=True, timeout=300,
                             preexec_fn=lambda: _enough_fds(PUBLISHERS + 256))
        done.set()
        watcher.join()
        self.assertEqual(run.returncode, 0, run.stderr[-2000:])
        client = json.loads(run.stdout)
        total = PUBLISHERS * PUBLISHES_EACH
        self.assertEqual((client["opened"], client["failed_conns"]), (PUBLISHERS, 0), client)
        self.assertEqual((client["sent"], client["acked"], client["nacked"], client["returned"]), (total, total, 0, 0))
        self.assertTrue(wait_for(lambda: fd_count(tap.pid) <= baseline, 10.0),
                        f"fd count {fd_count(tap.pid)} did not return to baseline {baseline}")
        print(f"tap fds: baseline {baseline}, peak {peak[0]} with {PUBLISHERS} publishers")
        self.assertGreaterEqual(peak[0], baseline + 2 * PUBLISHERS, "the connections were not all open at once")
        self.assertEqual(tap.stop(), 0, tap.stderr())

        pubs = tap.records("publish")
        per_conn = collections.Counter(r["conn"] for r in pubs)
        keys = {(r["conn"], r["channel"], r["seq"]) for r in pubs}
        verdicts = collections.Counter((r["route"], r["confirm"]) for r in pubs)
        self.assertEqual(len(pubs), total)
        self.assertEqual(len(keys), total, "a publish has more than one record")
        self.assertEqual(verdicts, {("routed", "ack"): total})
        self.assertEqual(sorted(per_conn.values()), [PUBLISHES_EACH] * PUBLISHERS)
        closes = [r for r in tap.records("connection") if r.get("event") == "close"]
        self.assertEqual(len(closes), PUBLISHERS)
        self.assertEqual({(r.get("by"), r.get("code")) for r in closes}, {("client", 200)})
        self.assertEqual(sum(r["publishes"] for r in closes), total)


if __name__ == "__main__":
    main()
