# --verdicts and --frames into FIFOs whose reader goes away and comes back (a log shipper restarting): the tap
# keeps what it could not write in its backlog while there is no reader, opens the FIFO again once there is one,
# and goes on; every publish record is in what the readers got together, or counted lost (summary, records_lost
# records, exit code 1). Every line the readers got is whole. pika and rabbitmq-c publishers go through the tap to
# the throwaway broker.

import os
import shutil
import subprocess
import tempfile
import time

import pika

import test_outputs
from tapharness import TapTestCase, main, require_broker, wait_for

N_BEFORE, N_GAP, N_AFTER = 150, 150, 100


class Reader:
    """cat FIFO > FILE: a reader process that can be killed like a log shipper."""

    def __init__(self, fifo, path):
        self.path = path
        self._out = open(path, "wb")
        self.proc = subprocess.Popen(["cat", fifo], stdout=self._out, stdin=subprocess.DEVNULL)

    def data(self):
        with open(self.path, "rb") as f:
            return f.read()

    def publishes(self):
        return self.data().count(b'"type":"publish"')

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        self._out.close()

    def wait(self, timeout=15):
        self.proc.wait(timeout)
        self._out.close()


def pika_publish(port, first, count):
    """count confirmed publishes with message ids m<first>.. to an unroutable key (acked, route unproven)."""
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=10,
                                                          blocked_connection_timeout=10))
    ch = c.channel()
    ch.confirm_delivery()
    for i in range(first, first + count):
        ch.basic_publish("", f"fifo.{os.getpid()}.nowhere", b"x" * 32,
                         pika.BasicProperties(message_id=f"m{i}", delivery_mode=2))
    c.close()


class FifoReaders(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)
        self.dir = tempfile.mkdtemp(prefix="amqptap-fifo-back-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.readers = []
        self.taps = []

    def tearDown(self):
        for r in self.readers:
            if r.proc.poll() is None:
                r.kill()
        for t in self.taps:
            t.cleanup()
        super().tearDown()

    def fifo(self, name):
        path = os.path.join(self.dir, name)
        os.mkfifo(path, 0o600)
        return path

    def reader(self, fifo, name):
        r = Reader(fifo, os.path.join(self.dir, name))
        self.readers.append(r)
        return r

    def tap(self, args):
        t = test_outputs.RawTap(args)
        self.taps.append(t)
        return t

    def test_reader_restarts_nothing_lost(self):
        """Readers of --verdicts and --frames killed and started again a second later: the records written while
        nobody read wait in the backlog; the two readers together got every publish record and every publish frame,
        each line whole and once; nothing counted lost, exit code 0."""
        vf, ff = self.fifo("v.fifo"), self.fifo("f.fifo")
        v1, f1 = self.reader(vf, "v1.jsonl"), self.reader(ff, "f1.jsonl")
        tap = self.tap(["--verdicts", vf, "--frames", ff])
        pika_publish(tap.port, 0, N_BEFORE)
        self.assertTrue(wait_for(lambda: v1.publishes() == N_BEFORE, 10), v1.publishes())
        self.assertTrue(wait_for(lambda: f1.data().count(b'"basic.publish"') == N_BEFORE, 10))
        time.sleep(0.2)  # cat has written out all it read
        v1.kill()
        f1.kill()
        pika_publish(tap.port, N_BEFORE, N_GAP)  # nobody reads
        time.sleep(1.0)
        v2, f2 = self.reader(vf, "v2.jsonl"), self.reader(ff, "f2.jsonl")
        pika_publish(tap.port, N_BEFORE + N_GAP, N_AFTER)
        total = N_BEFORE + N_GAP + N_AFTER
        self.assertTrue(wait_for(lambda: v2.publishes() == N_GAP + N_AFTER, 10), v2.publishes())
        code, _ = tap.stop()
        v2.wait()
        f2.wait()
        err = tap.stderr()
        self.assertEqual(code, 0, err[-3000:])
        self.assertNotIn("Sanitizer", err)
        self.assertIn(f"--verdicts {vf}: the reader went away", err)
        self.assertIn(f"--verdicts {vf}: a reader opened it; writing again", err)
        for name in ("verdicts", "frames"):
            self.assertEqual(test_outputs.summary_losses(err, name)[1], 0, name)
        recs = test_outputs.parse_lines(v1.data() + v2.data())
        ids = sorted(int(r["message_id"][1:]) for r in recs if r["type"] == "publish")
        self.assertEqual(ids, list(range(total)))
        self.assertFalse([r for r in recs if r["type"] == "records_lost"])
        frames = test_outputs.parse_lines(f1.data() + f2.data())
        pubs = [f for f in frames if f.get("method") == "basic.publish"]
        self.assertEqual(len(pubs), total)
        self.assertEqual(len([f for f in frames if f.get("frame") == "header" and f["dir"] == "c2s"]), total)

    def test_reader_gap_past_the_backlog(self):
        """No reader for longer than the 8 MiB backlog takes: what did not fit is counted lost as backlog_full,
        the next reader gets a records_lost record where the gap is, every line is whole, the records the readers
        got plus those lost are every record, and the exit code is 1."""
        vf = self.fifo("v.fifo")
        v1 = self.reader(vf, "v1.jsonl")
        tap = self.tap(["--verdicts", vf])
        pika_publish(tap.port, 0, 10)
        self.assertTrue(wait_for(lambda: v1.publishes() == 10, 10))
        time.sleep(0.2)
        v1.kill()
        took, res = tap.publish(40000, 120)  # ~16 MB of records while nobody reads: forwarding is not held up
        self.assertEqual(res["acked"], 40000)
        v2 = self.reader(vf, "v2.jsonl")
        sizes = []  # the backlog drained: what v2 got stopped growing
        self.assertTrue(wait_for(lambda: sizes.append(len(v2.data())) or (len(sizes) > 10 and sizes[-1] == sizes[-10]),
                                 20, 0.05))
        pika_publish(tap.port, 10, 10)
        self.assertTrue(wait_for(lambda: b'"message_id":"m19"' in v2.data(), 10))
        code, _ = tap.stop()
        v2.wait()
        err = tap.stderr()
        self.assertEqual(code, 1, err[-3000:])
        records, lost, why = test_outputs.summary_losses(err, "verdicts")
        self.assertGreater(lost, 0)
        self.assertEqual(why, {"backlog_full": lost})
        recs = test_outputs.parse_lines(v1.data() + v2.data())
        notes = [r for r in recs if r["type"] == "records_lost"]
        self.assertEqual(sum(r["lost"] for r in notes), lost)
        self.assertEqual({r["reason"] for r in notes}, {"backlog_full"})
        self.assertEqual(len(recs) - len(notes) + lost, records)
        pubs = [r for r in recs if r["type"] == "publish"]
        self.assertGreater(len(pubs), 20)


if __name__ == "__main__":
    main()
