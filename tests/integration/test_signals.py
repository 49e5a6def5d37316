# Operator signals against a live tap with real pika traffic: SIGUSR1 prints the summary (per connection and in
# total, with confirm latency) to stderr, SIGHUP reopens --verdicts and --frames (logrotate: records after the
# rename go to the new file, none are lost), SIGTERM prints the summary again and exits 0.

import os
import re
import signal
import time

import pika

from tapharness import TapTestCase, main, read_records, require_broker, wait_for


class Signals(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)

    def publish(self, tap, n, routing_key):
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tap.port))
        ch = c.channel()
        ch.confirm_delivery()
        q = f"sig.{os.getpid()}.{time.monotonic_ns()}"
        ch.queue_declare(q, auto_delete=True)
        for i in range(n):
            ch.basic_publish("", q if routing_key is None else routing_key, b"x",
                             pika.BasicProperties(message_id=f"{routing_key}-{i}"), mandatory=routing_key is None)
        return c

    def test_usr1_summary_hup_reopen_term_exit(self):
        tap = self.start_tap()
        conn = self.publish(tap, 5, None)  # stays open: the summary shows a live connection
        self.assertTrue(wait_for(lambda: len(tap.records("publish")) == 5, 5))
        tap.proc.send_signal(signal.SIGUSR1)
        self.assertTrue(wait_for(lambda: "publishes=5" in tap.stderr(), 5), tap.stderr())
        err = tap.stderr()
        self.assertRegex(err, r"connections? open")
        self.assertRegex(err, r"acked=5")
        self.assertRegex(err, r"confirm_us p50=\d+ p99=\d+ max=\d+")

        # logrotate: move the files away, SIGHUP, then more traffic lands in fresh files
        rotated_v, rotated_f = tap.verdicts + ".1", tap.frames + ".1"
        os.rename(tap.verdicts, rotated_v)
        os.rename(tap.frames, rotated_f)
        tap.proc.send_signal(signal.SIGHUP)
        self.assertTrue(wait_for(lambda: os.path.exists(tap.verdicts) and os.path.exists(tap.frames), 5))
        conn.close()
        conn2 = self.publish(tap, 3, "nowhere.at.all")
        conn2.close()
        self.assertTrue(wait_for(lambda: len(tap.records("publish")) == 3, 5), tap.records())
        old = [r for r in read_records(rotated_v) if r["type"] == "publish"]
        self.assertEqual(len(old), 5)
        self.assertEqual({r["message_id"] for r in tap.records("publish")}, {f"nowhere.at.all-{i}" for i in range(3)})
        self.assertTrue(tap.frame_records())

        self.assertEqual(tap.stop(), 0)
        final = tap.stderr().split("amqptap summary")[-1]
        self.assertIn("publishes=8", final)
        self.assertIn("routed=5 returned=0 unproven=3", re.sub(r"\s+", " ", final))

    def test_signals_during_the_stop_change_nothing(self):
        """A supervisor that repeats its SIGTERM, or a test stopping a tap whose last session has just ended, signals
        a tap that is already stopping. Up to its very exit that must not kill it: the summary is written and the
        exit status is 0. SIGTERM and SIGINT are sent as fast as Python can until the process is gone, so they also
        fall after the event loop has ended (where they once found the default action: exit -15). SIGHUP and SIGUSR1
        are given back the same way, and are left out: each one's work (reopening, a summary) slows the stop."""
        for _ in range(10):
            tap = self.start_tap()
            c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tap.port))
            c.close()
            self.assertTrue(wait_for(lambda: [r["event"] for r in tap.records("connection")] == ["open", "close"], 5))
            sent = 0
            while tap.proc.poll() is None:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    try:
                        os.kill(tap.proc.pid, sig)
                        sent += 1
                    except ProcessLookupError:
                        break
            self.assertGreater(sent, 2)
            self.assertEqual(tap.stop(), 0, tap.stderr()[-2000:])
            self.assertIn("amqptap summary", tap.stderr())


if __name__ == "__main__":
    main()
