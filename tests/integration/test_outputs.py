# Outputs never stall forwarding (issue 12 §1, §2, §6): a --verdicts pipe nobody reads, --frames and --pcap into
# FIFOs nobody reads, /dev/full and a full tmpfs. Real rabbitmq-c publishers go through the tap to the throwaway
# broker; the tap must keep forwarding at normal speed, accept new clients, end within --grace plus the 2 s flush
# bound on SIGTERM, count what it lost (stderr, summary, exit code 1) and never leave a merged half line.
# Output files are created 0600; every line of them carries the run, records_lost records too. Log lines stderr did
# not take (a pipe nobody reads, or whose reader is gone) are counted in /metrics and make the exit code 1.

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time

import pika

from tapharness import (AMQPTAP_BIN, BROKER_PORT, CLIENTS_DIR, TapTestCase, free_port, http_get, main,
                        read_records, require_broker, wait_for)

PUBLISHER = os.path.join(CLIENTS_DIR, "stream_publisher")
GRACE_MS = 500
FLUSH_BOUND_S = 2.0  # TAP_OUT_FLUSH_MS
EXIT_SLACK_S = 2.5   # the stderr flush (0.5 s), cancelling writers, the tracker's shutdown, a slow box


class RawTap:
    """amqptap started with the given output arguments; stdout is a pipe the test reads or not (stdout_pipe)."""

    def __init__(self, args, stdout_pipe=False):
        self.dir = tempfile.mkdtemp(prefix="amqptap-out-")
        self.port = free_port()
        self.stderr_path = os.path.join(self.dir, "stderr.txt")
        self._err = open(self.stderr_path, "wb")
        cmd = [AMQPTAP_BIN, "--listen", f"127.0.0.1:{self.port}", "--upstream", f"127.0.0.1:{BROKER_PORT}",
               "--grace", str(GRACE_MS)] + list(args)
        env = dict(os.environ)
        env.setdefault("ASAN_OPTIONS", "abort_on_error=0:detect_leaks=1")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE if stdout_pipe else subprocess.DEVNULL,
                                     stderr=self._err, env=env, preexec_fn=lambda: os.umask(0o022))
        if not wait_for(lambda: self.proc.poll() is not None or "listening on" in self.stderr(), 10):
            self.proc.kill()
            raise RuntimeError(f"amqptap did not start: {self.stderr()!r}")
        if self.proc.poll() is not None:
            raise RuntimeError(f"amqptap exited {self.proc.returncode} at startup: {self.stderr()!r}")

    def stderr(self):
        with open(self.stderr_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def publish(self, count, timeout):
        """count confirm-mode publishes (64 B, window 500) through the tap; returns (seconds, result dict)."""
        t0 = time.monotonic()
        out = subprocess.run([PUBLISHER, "127.0.0.1", str(self.port), str(count), "64", "500", "1",
                              f"out.{os.getpid()}.nowhere", ""], capture_output=True, timeout=timeout)
        took = time.monotonic() - t0
        lines = [l for l in out.stdout.decode().splitlines() if l.startswith("{\"sent\"")]
        if out.returncode != 0 or not lines:
            raise AssertionError(f"publisher failed ({out.returncode}): {out.stderr.decode()[-500:]}")
        return took, json.loads(lines[-1])

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Signals the tap; returns (exit code, seconds it took to exit)."""
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -9, time.monotonic() - t0
        return self.proc.returncode, time.monotonic() - t0

    def cleanup(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self._err.close()
        shutil.rmtree(self.dir, ignore_errors=True)


LOSS_REASONS = ("backlog_full", "no_memory", "write_failed", "unflushed")


def summary_losses(err, name):
    """(records, lost, {reason: n}) from the last 'output NAME records=N lost=M write_errors=K [REASON=n ...]'
    line of the stderr text; the reasons must add up to lost."""
    found = re.findall(rf"^output {name} records=(\d+) lost=(\d+) write_errors=\d+((?: [a-z_]+=\d+)*)$", err, re.M)
    if not found:
        raise AssertionError(f"no summary line for output {name} in {err[-2000:]!r}")
    records, lost, tail = found[-1]
    reasons = {k: int(v) for k, v in (kv.split("=") for kv in tail.split())}
    if not set(reasons) <= set(LOSS_REASONS) or sum(reasons.values()) != int(lost) or 0 in reasons.values():
        raise AssertionError(f"output {name}: lost={lost} but the reasons say {reasons}")
    return int(records), int(lost), reasons


def summary_counts(err, name):
    """(records, lost) from the last summary line of the output."""
    return summary_losses(err, name)[:2]


def log_lines_lost(mport):
    """amqptap_log_lines_lost_total from /metrics on mport; None while it does not answer or lacks the series."""
    try:
        text = http_get(mport, "/metrics", timeout=2)[2].decode()
    except (OSError, ValueError):
        return None
    m = re.search(r"(?m)^amqptap_log_lines_lost_total (\d+)$", text)
    return int(m.group(1)) if m else -1


def parse_lines(data, allow_cut_last=False):
    """Every line of data as JSON; a line that does not parse fails (the last one may be cut when allowed)."""
    out = []
    lines = data.split(b"\n")
    tail = lines.pop()
    if tail and not allow_cut_last:
        raise AssertionError(f"output does not end with a newline: {tail[-200:]!r}")
    for n, line in enumerate(lines, 1):
        try:
            out.append(json.loads(line))
        except ValueError as e:
            raise AssertionError(f"line {n} is not JSON ({e}): {line[:200]!r}")
    return out


class Outputs(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)
        if not os.access(PUBLISHER, os.X_OK):
            self.fail(f"{PUBLISHER} not built (librabbitmq-dev missing?)")
        self.raw = []

    def tearDown(self):
        for t in self.raw:
            t.cleanup()
        super().tearDown()

    def raw_tap(self, args, stdout_pipe=False):
        t = RawTap(args, stdout_pipe)
        self.raw.append(t)
        return t

    def baseline_seconds(self, n):
        """How long n publishes take through a tap whose outputs are healthy files."""
        t = self.raw_tap(["--verdicts", os.path.join(tempfile.gettempdir(), f"amqptap-base-{os.getpid()}.jsonl")])
        took, res = t.publish(n, 120)
        self.assertEqual(res["acked"], n)
        t.stop()
        os.unlink(os.path.join(tempfile.gettempdir(), f"amqptap-base-{os.getpid()}.jsonl"))
        return took

    def assert_forwarding_unhindered(self, tap, n, base_s):
        took, res = tap.publish(n, 120)
        self.assertEqual((res["sent"], res["acked"]), (n, n), res)
        # normal speed: a tap stuck in write() would not finish at all; allow a loaded box 3x + 3 s
        self.assertLess(took, base_s * 3 + 3, f"{n} publishes took {took:.1f}s, {base_s:.1f}s with healthy outputs")
        # new clients still connect and get answers
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tap.port, socket_timeout=5,
                                                              blocked_connection_timeout=5))
        ch = c.channel()
        ch.confirm_delivery()
        ch.basic_publish("", "out.nowhere", b"x")
        c.close()

    def assert_exit_bounded(self, tap, want_code=1):
        code, took = tap.stop()
        self.assertNotEqual(code, -9, f"tap did not end on SIGTERM: {tap.stderr()[-2000:]}")
        self.assertLess(took, GRACE_MS / 1000 + FLUSH_BOUND_S + EXIT_SLACK_S, "SIGTERM took too long")
        self.assertEqual(code, want_code, tap.stderr()[-2000:])
        err = tap.stderr()
        self.assertNotIn("Sanitizer", err)
        return err

    def test_stdout_pipe_never_read(self):
        """The default --verdicts - into a pipe nobody reads: forwarding goes on, SIGTERM ends the tap in time,
        the loss is reported and counted, exit code 1."""
        n = 20000
        base = self.baseline_seconds(n)
        tap = self.raw_tap(["--verdicts", "-"], stdout_pipe=True)
        self.assert_forwarding_unhindered(tap, n, base)
        tap.proc.send_signal(signal.SIGUSR1)
        self.assertTrue(wait_for(lambda: "output verdicts records=" in tap.stderr(), 5), tap.stderr())
        records, lost = summary_counts(tap.stderr(), "verdicts")
        self.assertGreater(lost, 0)
        err = self.assert_exit_bounded(tap)
        self.assertIn("--verdicts -: written slower than records come", err)
        records, lost, why = summary_losses(err, "verdicts")
        self.assertGreaterEqual(records, n + 1)
        self.assertGreater(lost, 0)
        # dropped with the backlog full; what the stuck writer still held at the stop is unflushed
        self.assertGreater(why.get("backlog_full", 0), 0, why)
        self.assertLessEqual(set(why), {"backlog_full", "unflushed"})
        self.assertRegex(err, rf"--verdicts: {lost} of {records} records lost \(backlog_full=")

    def test_stdout_pipe_reader_resumes(self):
        """The reader stops, then reads again: a records_lost record marks the gap, every line parses, and the
        records written plus the records lost are every record the tap made."""
        n = 20000
        tap = self.raw_tap(["--verdicts", "-"], stdout_pipe=True)
        took, res = tap.publish(n, 120)
        self.assertEqual(res["acked"], n)
        got = bytearray()
        reader = threading.Thread(target=lambda: got.extend(tap.proc.stdout.read()), daemon=True)
        reader.start()
        tap.publish(100, 60)
        time.sleep(0.3)  # the 10 ms flush hands the last batch over
        err = self.assert_exit_bounded(tap)
        reader.join(10)
        recs = parse_lines(bytes(got))
        records, lost, why = summary_losses(err, "verdicts")
        self.assertEqual(why, {"backlog_full": lost})
        notes = [r for r in recs if r["type"] == "records_lost"]
        self.assertTrue(notes, "no records_lost record")
        self.assertEqual(sum(r["lost"] for r in notes), lost)
        self.assertEqual({r["output"] for r in notes}, {"verdicts"})
        self.assertEqual({r["reason"] for r in notes}, {"backlog_full"})
        for r in notes:
            self.assertLessEqual(r["first_lost_ts"], r["ts"])
        self.assertEqual(len(recs) - len(notes) + lost, records)
        pubs = [r for r in recs if r["type"] == "publish"]
        self.assertGreater(len(pubs), 100, "the publishes after the reader came back were not written")

    def test_dev_full(self):
        """--verdicts /dev/full: one error line naming the output, the summary counts every record lost, exit 1."""
        tap = self.raw_tap(["--verdicts", "/dev/full"])
        took, res = tap.publish(2000, 60)
        self.assertEqual(res["acked"], 2000)
        err = self.assert_exit_bounded(tap)
        fails = [l for l in err.splitlines() if "write failed" in l]
        self.assertEqual(len(fails), 1, err)
        self.assertIn("--verdicts /dev/full: write failed: No space left on device", fails[0])
        records, lost, why = summary_losses(err, "verdicts")
        self.assertGreaterEqual(records, 2000)
        self.assertEqual(lost, records)
        self.assertEqual(why, {"write_failed": lost})
        self.assertIn(f"--verdicts: {lost} of {records} records lost (write_failed={lost})", err)

    def test_fifo_frames_and_pcap_never_read(self):
        """--frames and --pcap into FIFOs whose reader never reads: forwarding goes on, --verdicts (a healthy
        file) still gets every record, and the losses are counted per output."""
        n = 20000
        base = self.baseline_seconds(n)
        d = tempfile.mkdtemp(prefix="amqptap-fifo-")
        self.addCleanup(shutil.rmtree, d, True)
        frames, pcap, verdicts = (os.path.join(d, x) for x in ("frames.fifo", "pcap.fifo", "v.jsonl"))
        os.mkfifo(frames)
        os.mkfifo(pcap)
        readers = [os.open(p, os.O_RDONLY | os.O_NONBLOCK) for p in (frames, pcap)]  # open, never read
        try:
            tap = self.raw_tap(["--verdicts", verdicts, "--frames", frames, "--pcap", pcap])
            self.assert_forwarding_unhindered(tap, n, base)
            err = self.assert_exit_bounded(tap)
        finally:
            for fd in readers:
                os.close(fd)
        self.assertGreater(summary_counts(err, "frames")[1], 0)
        self.assertGreater(summary_counts(err, "pcap")[1], 0)
        self.assertEqual(summary_counts(err, "verdicts")[1], 0)
        pubs = [r for r in read_records(verdicts) if r["type"] == "publish"]
        self.assertEqual(len(pubs), n + 1)

    def test_fifo_without_a_reader_at_start(self):
        """--verdicts into a FIFO that nobody has opened yet (a log shipper that is down when the tap starts): the
        tap listens and forwards at once; a reader that comes later gets every record."""
        d = tempfile.mkdtemp(prefix="amqptap-fifo0-")
        self.addCleanup(shutil.rmtree, d, True)
        fifo = os.path.join(d, "v.fifo")
        os.mkfifo(fifo)
        tap = self.raw_tap(["--verdicts", fifo])  # waits until it listens
        took, res = tap.publish(200, 60)
        self.assertEqual(res["acked"], 200)
        got = bytearray()
        with open(fifo, "rb") as f:
            reader = threading.Thread(target=lambda: got.extend(f.read()), daemon=True)
            reader.start()
            self.assert_exit_bounded(tap, want_code=0)
            reader.join(10)
        pubs = [r for r in parse_lines(bytes(got)) if r["type"] == "publish"]
        self.assertEqual(len(pubs), 200)

    def test_closed_stdout_is_not_taken_by_an_output(self):
        """Started with stdout closed (`amqptap --frames F 1>&-`), the first file the tap opens would become
        descriptor 1, and the verdicts (stdout by default) would go into the frame trace: it must hold frames only."""
        d = tempfile.mkdtemp(prefix="amqptap-fd1-")
        self.addCleanup(shutil.rmtree, d, True)
        frames = os.path.join(d, "f.jsonl")
        port = free_port()
        p = subprocess.Popen(["sh", "-c", f'exec "$0" --listen 127.0.0.1:{port} --upstream 127.0.0.1:{BROKER_PORT} '
                              f'--frames {frames} 1>&-', AMQPTAP_BIN], stderr=subprocess.PIPE)
        try:
            self.assertTrue(wait_for(lambda: os.path.exists(frames) and os.path.getsize(frames) == 0, 5))
            time.sleep(0.3)
            c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, connection_attempts=20,
                                                                  retry_delay=0.1))
            ch = c.channel()
            ch.confirm_delivery()
            ch.basic_publish("", "out.fd1.nowhere", b"x")
            c.close()
            time.sleep(0.3)
        finally:
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=20)
        recs = parse_lines(open(frames, "rb").read())
        self.assertTrue(recs)
        self.assertEqual([r for r in recs if "type" in r or "frame" not in r], [])  # no verdict record

    def test_full_tmpfs_then_space_again(self):
        """A 1 MiB tmpfs fills up, then space is freed and writing goes on: every line parses (the record a
        failed write cut is removed), a records_lost record says how many were lost, and the counts add up."""
        if os.geteuid() != 0:
            self.skipTest("mounting a tmpfs needs root")
        d = tempfile.mkdtemp(prefix="amqptap-tmpfs-")
        self.addCleanup(shutil.rmtree, d, True)
        mnt = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", d], capture_output=True)
        if mnt.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs here: {mnt.stderr.decode().strip()}")
        self.addCleanup(subprocess.run, ["umount", "-l", d])
        filler = os.path.join(d, "filler")
        with open(filler, "wb") as f:
            f.write(b"\0" * (1024 * 1024 - 200 * 1024))  # leaves ~200 KiB for the records
        verdicts = os.path.join(d, "v.jsonl")
        tap = self.raw_tap(["--verdicts", verdicts])
        tap.publish(4000, 60)  # ~1.4 MB of records: the disk fills
        self.assertTrue(wait_for(lambda: "write failed" in tap.stderr(), 10), tap.stderr())
        # The writer takes its backlog in bursts up to 50 ms apart: let it fail through the rest of the first
        # publishes before space is freed, or they fill the disk again after it, with no record left to follow
        # them and carry their records_lost (the summary still counts them).
        time.sleep(0.5)
        os.unlink(filler)
        time.sleep(0.2)
        tap.publish(200, 60)
        time.sleep(0.3)
        err = self.assert_exit_bounded(tap)
        with open(verdicts, "rb") as f:
            recs = parse_lines(f.read())
        records, lost, why = summary_losses(err, "verdicts")
        self.assertGreater(lost, 0)
        self.assertEqual(why, {"write_failed": lost})
        notes = [r for r in recs if r["type"] == "records_lost"]
        self.assertTrue(notes, "no records_lost record")
        self.assertEqual(notes[0]["reason"], "write_failed")
        self.assertEqual(notes[0]["error"], "No space left on device")
        self.assertEqual(sum(r["lost"] for r in notes), lost)
        self.assertEqual(len(recs) - len(notes) + lost, records)
        self.assertEqual(len([l for l in err.splitlines() if "write failed" in l]), 1, err)

    def test_every_line_carries_the_run(self):
        """Merged lines of many taps can be told apart: every line of --verdicts and of --frames carries this
        process's run, records_lost records too (with the tap's --tap-id: a loss belongs to no connection). The
        record files are deleted with their directory under the tap, then the directory comes back."""
        d = tempfile.mkdtemp(prefix="amqptap-run-")
        self.addCleanup(shutil.rmtree, d, True)
        sub = os.path.join(d, "sub")
        os.mkdir(sub)
        verdicts, frames = os.path.join(sub, "v.jsonl"), os.path.join(sub, "f.jsonl")
        tap = self.raw_tap(["--tap-id", "tap-lines", "--verdicts", verdicts, "--frames", frames])
        tap.publish(20, 30)
        self.assertTrue(wait_for(lambda: read_records(verdicts, live=True), 5))
        shutil.rmtree(sub)
        tap.publish(20, 30)  # lost: the files cannot be made again
        self.assertTrue(wait_for(lambda: tap.stderr().count("write failed") >= 2, 5), tap.stderr())
        os.mkdir(sub)
        tap.publish(20, 30)
        time.sleep(0.3)
        err = self.assert_exit_bounded(tap)
        self.assertGreater(summary_counts(err, "verdicts")[1], 0)
        runs = set()
        for path in (verdicts, frames):
            with open(path, "rb") as f:
                recs = parse_lines(f.read())
            self.assertTrue(recs, path)
            for r in recs:
                self.assertIn("run", r, f"{path}: {r}")
                runs.add(r["run"])
            notes = [r for r in recs if r.get("type") == "records_lost"]
            self.assertTrue(notes, f"no records_lost record in {path}")
            self.assertEqual({r["tap"] for r in notes}, {"tap-lines"})
        self.assertEqual(len(runs), 1, runs)

    def stderr_tap(self, stderr_fd):
        """amqptap -v with --metrics, stderr the given descriptor; returns (process, listen port, metrics port)."""
        port, mport = free_port(), free_port()
        d = tempfile.mkdtemp(prefix="amqptap-err-")
        self.addCleanup(shutil.rmtree, d, True)
        proc = subprocess.Popen([AMQPTAP_BIN, "-v", "--listen", f"127.0.0.1:{port}", "--upstream",
                                 f"127.0.0.1:{BROKER_PORT}", "--verdicts", os.path.join(d, "v.jsonl"), "--metrics",
                                 f"127.0.0.1:{mport}", "--grace", str(GRACE_MS)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr_fd)
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.wait()))
        self.assertTrue(wait_for(lambda: proc.poll() is not None or log_lines_lost(mport) is not None, 10))
        self.assertIsNone(proc.poll())
        return proc, port, mport

    def test_stderr_never_read_counts_lost_log_lines(self):
        """stderr a pipe nobody reads: forwarding goes on, the log lines that did not fit are counted in
        amqptap_log_lines_lost_total, and the exit code is 1; once stderr is read again the summary says so."""
        r, w = os.pipe()
        proc, port, mport = self.stderr_tap(w)
        os.close(w)
        for _ in range(4000):  # -v: two lines each, ~600 KB, past the pipe and the 256 KiB backlog
            socket.create_connection(("127.0.0.1", port), 5).close()
        self.assertTrue(wait_for(lambda: (log_lines_lost(mport) or 0) > 0, 10), log_lines_lost(mport))
        self.assertEqual(http_get(mport, "/healthz")[0], 200)  # the loop is not held up
        got = bytearray()
        reader = threading.Thread(target=lambda: got.extend(os.fdopen(r, "rb").read()), daemon=True)
        reader.start()  # stderr works again
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(15), 1)
        reader.join(10)
        err = got.decode("utf-8", "replace")
        self.assertRegex(err, r"line\(s\) of this log were lost")
        self.assertRegex(err, r"(?m)^output stderr lost=[1-9]\d* lines$")
        self.assertNotIn("Sanitizer", err)

    def test_stderr_reader_gone_counts_lost_log_lines(self):
        """stderr a pipe whose reader is gone: every log line fails (EPIPE) and is counted; exit code 1."""
        r, w = os.pipe()
        os.close(r)
        proc, port, mport = self.stderr_tap(w)
        os.close(w)
        socket.create_connection(("127.0.0.1", port), 5).close()
        self.assertTrue(wait_for(lambda: (log_lines_lost(mport) or 0) >= 3, 10), log_lines_lost(mport))
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(15), 1)

    def test_files_created_0600(self):
        d = tempfile.mkdtemp(prefix="amqptap-mode-")
        self.addCleanup(shutil.rmtree, d, True)
        paths = [os.path.join(d, x) for x in ("v.jsonl", "f.jsonl", "c.pcapng")]
        tap = self.raw_tap(["--verdicts", paths[0], "--frames", paths[1], "--pcap", paths[2]])
        tap.publish(10, 30)
        code, _ = tap.stop()
        self.assertEqual(code, 0, tap.stderr())
        for p in paths:
            self.assertEqual(stat.S_IMODE(os.stat(p).st_mode), 0o600, p)


    def test_mode_and_group_survive_a_rotation(self):
        """An operator's chmod 640 and chgrp (for a log shipper) carry over to the file the tap makes after logrotate
        renamed the old one and SIGHUP reopened it; they survived restarts, but the new file was 0600 (README:
        "survives restarts"). Not the TLS key log, a secret: that one is always made 0600."""
        d = tempfile.mkdtemp(prefix="amqptap-mode-")
        self.addCleanup(shutil.rmtree, d, True)
        paths = [os.path.join(d, x) for x in ("v.jsonl", "c.pcapng")]
        tap = self.raw_tap(["--verdicts", paths[0], "--pcap", paths[1]])
        tap.publish(5, 30)
        self.assertTrue(wait_for(lambda: all(os.path.getsize(p) > 0 for p in paths), 5))
        if os.geteuid() != 0:
            self.skipTest("needs root to give the files a group of their own")
        group = 4  # adm, as a shipper's group would be
        for p in paths:
            os.chmod(p, 0o640)
            os.chown(p, -1, group)
            os.rename(p, p + ".1")
        tap.proc.send_signal(signal.SIGHUP)
        self.assertTrue(wait_for(lambda: all(os.path.exists(p) for p in paths), 5), tap.stderr())
        tap.publish(5, 30)
        code, _ = tap.stop()
        self.assertEqual(code, 0, tap.stderr())
        for p in paths:
            st = os.stat(p)
            self.assertEqual((stat.S_IMODE(st.st_mode), st.st_gid), (0o640, group), p)

    def test_world_readable_capture_is_said(self):
        """An existing --pcap or --frames file keeps its mode; one every user may read gets a warning at start, as
        it holds what publishers send (a --verdicts file has no bodies: no warning)."""
        d = tempfile.mkdtemp(prefix="amqptap-mode-")
        self.addCleanup(shutil.rmtree, d, True)
        paths = [os.path.join(d, x) for x in ("v.jsonl", "f.jsonl", "c.pcapng")]
        for p in paths:
            open(p, "w").close()
            os.chmod(p, 0o644)
        tap = self.raw_tap(["--verdicts", paths[0], "--frames", paths[1], "--pcap", paths[2]])
        err = tap.stderr()
        code, _ = tap.stop()
        self.assertEqual(code, 0, tap.stderr())
        self.assertIn(f"WARNING: --pcap {paths[2]} is readable by every user (mode 0644)", err)
        self.assertIn(f"WARNING: --frames {paths[1]} is readable by every user", err)
        self.assertNotIn("--verdicts", err)

if __name__ == "__main__":
    main()
