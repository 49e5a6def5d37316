# Concurrency: 200 pika connections open through the tap at the same time, each completes a real AMQP session
# against the throwaway broker (declare, publish, get, close); afterwards the tap's open file descriptors are
# back to where they started.

import threading
import uuid

import pika

from tapharness import BROKER_PORT, TapTestCase, fd_count, main, require_broker, wait_for

CLIENTS = 200


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


if __name__ == "__main__":
    main()
