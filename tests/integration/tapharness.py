# Shared helpers for amqptap's integration tests: start the tap binary on a free port, stand-in TCP peers,
# the throwaway broker's address, JSON Lines readers, /proc sampling, and a unittest main that prints
# "N passed, M failed" and exits non-zero on failure. Python 3 stdlib only (pika is imported by the tests).

import hashlib
import html
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

SOURCE_DIR = os.environ.get("TAP_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
AMQPTAP_BIN = os.environ.get("AMQPTAP_BIN", os.path.join(SOURCE_DIR, "build", "amqptap"))
CLIENTS_DIR = os.environ.get("TAP_CLIENTS_DIR", os.path.join(os.path.dirname(AMQPTAP_BIN), "clients"))
# tests/preload/failalloc.c: an LD_PRELOAD library that makes allocations fail (see its header for the variables)
FAILALLOC = os.path.join(os.path.dirname(CLIENTS_DIR), "preload", "failalloc.so")
BROKER_HOST = "127.0.0.1"
BROKER_PORT = int(os.environ.get("TAP_BROKER_PORT", "5690"))
AMQP_091_HEADER = b"AMQP\x00\x00\x09\x01"
MIB = 1024 * 1024


def free_port():
    """A loopback TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def capture_port(cap):
    """The broker port of a committed capture (captures/NAME.pcapng: its NAME.port file)."""
    with open(cap[:-len(".pcapng")] + ".port") as f:
        return int(f.read().strip())


def is_asan_build(path=AMQPTAP_BIN):
    """True when the binary was built with AddressSanitizer (memory figures are inflated there)."""
    try:
        with open(path, "rb") as f:
            return b"__asan_init" in f.read()
    except OSError:
        return False


def read_records(path, live=False):
    """Every JSON Lines record in path (a missing file has none); a malformed line raises ValueError.

    live: the file is still being written. A reader can see a write half done (Linux lets a
    read in between the pages a write copies), so a last line without its newline is one in
    progress and is left for the next read. Otherwise every line must be whole."""
    if not path or not os.path.exists(path):
        return []
    out = []
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if live and not line.endswith(b"\n"):
                break
            if not line.strip():
                continue
            try:
                out.append(json.loads(line.decode("utf-8")))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e}): {line[:200]!r}") from e
    return out


# what only a live tap writes: the process identity, and the proxy's own end towards the broker (the tap's pcap
# has the client and the broker only)
IDENTITY_FIELDS = ("run", "tap", "started", "schema", "upstream_local")


def without_identity(testcase, records):
    """Live records without IDENTITY_FIELDS (which replay leaves out), checking each live one had the run."""
    out = []
    for r in records:
        testcase.assertIn("run", r, r)
        out.append({k: v for k, v in r.items() if k not in IDENTITY_FIELDS})
    return out


def rss_kb(pid):
    """Resident set size (VmRSS) of pid in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_for(pred, timeout, interval=0.02):
    """Polls pred until it is true or timeout seconds pass; returns its last value."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() >= end:
            return v
        time.sleep(interval)


def broker_reachable():
    try:
        with socket.create_connection((BROKER_HOST, BROKER_PORT), timeout=1):
            return True
    except OSError:
        return False


def require_broker(testcase):
    """Fails (or skips when TAP_BROKER_OPTIONAL=1) a test that needs the throwaway broker."""
    if broker_reachable():
        return
    msg = f"no broker on {BROKER_HOST}:{BROKER_PORT}; run scripts/broker.sh start (or scripts/test.sh)"
    if os.environ.get("TAP_BROKER_OPTIONAL") == "1":
        testcase.skipTest(msg)
    testcase.fail(msg)


def proc_stat(path):
    """A /proc/.../stat file as (comm, the fields after it: [0] is the state, field 3 of proc(5))."""
    with open(path) as f:
        stat = f.read()
    return stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()


class Tap:
    """A running amqptap in one of its modes: Tap.proxy(...) in front of a broker, Tap.sniff(...) on an interface,
    Tap.replay(...) of a capture. Its stderr, and the record files it was not told to put elsewhere, live in a
    private temp dir that cleanup() removes. stdin/stdout are the process's pipes when asked for (subprocess.PIPE),
    .output what finish() read from a piped stdout."""

    STOP_SIGNAL = signal.SIGTERM

    def _spawn(self, mode_args, ready=None, ready_timeout=10.0, env=None, prefix=(), stdin=subprocess.DEVNULL,
               stdout=subprocess.DEVNULL, cwd=None):
        """Starts AMQPTAP_BIN with mode_args in self.dir; waits until stderr shows ready (when given).
        prefix: a command that execs the tap (its arguments follow), so that the process is still the tap's."""
        self.stderr_path = os.path.join(self.dir, "stderr.txt")
        self.args = [AMQPTAP_BIN, *mode_args]
        self.output = None
        self.returncode = None
        self._stderr_text = None
        full_env = dict(os.environ)
        full_env.setdefault("ASAN_OPTIONS", "abort_on_error=0:detect_leaks=1")
        if env:
            full_env.update(env)
        self._err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen([*prefix, *self.args], stdin=stdin, stdout=stdout, stderr=self._err,
                                     env=full_env, cwd=cwd)
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        if ready is None:
            return
        if not wait_for(lambda: self.proc.poll() is not None or ready in self.stderr(), ready_timeout):
            self.kill()
            raise RuntimeError(f"amqptap did not report {ready!r} within {ready_timeout}s: {self.stderr()!r}")
        if self.proc.poll() is not None:
            raise RuntimeError(f"amqptap exited {self.proc.returncode} at startup: {self.stderr()!r}")

    def _file(self, path, name):
        """An output path: a path given, or (True) one named name in the temp dir, or None (no such output)."""
        return os.path.join(self.dir, name) if path is True else path or None

    @property
    def pid(self):
        return self.proc.pid

    def stderr(self):
        if self._stderr_text is not None:
            return self._stderr_text
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def alive(self):
        return self.proc.poll() is None

    def records(self, kind=None):
        """The verdict records so far (a line still being written is left out while the tap runs): its --verdicts
        file, or what finish() read from its stdout when the records went there."""
        if self.verdicts in (None, "-"):
            recs = [json.loads(line) for line in (self.output or b"").splitlines() if line.strip()]
        else:
            recs = read_records(self.verdicts, live=self.alive())
        return [r for r in recs if kind is None or r.get("type") == kind]

    def frame_records(self):
        """The --frames trace so far (a line still being written is left out while the tap runs)."""
        return read_records(self.frames, live=self.alive())

    def wait(self, timeout=15.0, input=None):
        """Waits for the exit (feeding input to a piped stdin, reading a piped stdout into .output); killed after
        timeout, when it returns -9. Returns the exit code."""
        if self.returncode is not None:
            return self.returncode
        if self.stdin is not None and self.stdin.closed:  # the caller ended the input: nothing left to feed
            self.proc.stdin = None
        try:
            if self.proc.stdin is not None or self.stdout is not None:
                out, _ = self.proc.communicate(input, timeout)
                self.output = out
            else:
                self.proc.wait(timeout)
            self.returncode = self.proc.returncode
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.returncode = -9
        self._err.close()
        return self.returncode

    def stop(self, sig=None, timeout=15.0):
        """Signals the tap (default: its mode's stop signal), waits, and returns its exit code (killed after
        timeout: returns -9)."""
        if self.returncode is None and self.proc.poll() is None:
            self.proc.send_signal(self.STOP_SIGNAL if sig is None else sig)
        return self.wait(timeout)

    def finish(self, input=None, timeout=120.0):
        """For a run to its end (a replay): waits for the exit as wait() does, keeps the stderr and removes the
        temp dir. Returns self (returncode, stderr(), records(), output)."""
        self.wait(timeout, input)
        self._stderr_text = self.stderr()
        self.cleanup()
        return self

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._err.close()

    def cleanup(self):
        """Removes the temp dir (after stop); kept when TAP_KEEP_OUTPUT=1 for debugging."""
        if self.proc.poll() is None:
            self.kill()
        for pipe in (self.stdin, self.stdout):
            if pipe is not None:
                pipe.close()
        if not os.path.isdir(self.dir):
            return
        if os.environ.get("TAP_KEEP_OUTPUT") == "1":
            print(f"kept tap output in {self.dir}", file=sys.stderr)
            return
        shutil.rmtree(self.dir, ignore_errors=True)


class ProxyTap(Tap):
    """amqptap in front of upstream_port (default: the throwaway broker) on a free loopback port; ready once it
    says it listens. Records in the temp dir: verdicts.jsonl, and frames.jsonl unless frames=False."""

    def __init__(self, upstream_port=None, extra_args=(), upstream_host="127.0.0.1", frames=True, **kw):
        upstream_port = BROKER_PORT if upstream_port is None else upstream_port
        self.dir = tempfile.mkdtemp(prefix="amqptap-it-")
        self.port = free_port()
        self.upstream = (upstream_host, upstream_port)
        self.verdicts = os.path.join(self.dir, "verdicts.jsonl")
        self.frames = os.path.join(self.dir, "frames.jsonl") if frames else None
        args = ["--listen", f"127.0.0.1:{self.port}", "--upstream", f"{upstream_host}:{upstream_port}",
                "--verdicts", self.verdicts]
        if self.frames:
            args += ["--frames", self.frames]
        kw.setdefault("ready", "listening on")
        self._spawn([*args, *extra_args], **kw)

    def connect(self, timeout=10.0):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s


class SniffTap(Tap):
    """`amqptap sniff -i IFACE --port P...` (default: lo and the throwaway broker's port); ready once it says it
    sniffs (ready=None: not waited for, for a sniffer that is to fail at its start); stopped with SIGINT.
    verdicts/frames: a path, True (a file in the temp dir) or None."""

    STOP_SIGNAL = signal.SIGINT

    def __init__(self, extra_args=(), ports=None, iface="lo", verdicts=True, frames=None, **kw):
        self.dir = tempfile.mkdtemp(prefix="amqptap-sniff-")
        self.verdicts = self._file(verdicts, "verdicts.jsonl")
        self.frames = self._file(frames, "frames.jsonl")
        args = ["sniff", "-i", iface]
        for port in (BROKER_PORT,) if ports is None else ports:
            args += ["--port", str(port)]
        if self.verdicts:
            args += ["--verdicts", self.verdicts]
        if self.frames:
            args += ["--frames", self.frames]
        kw.setdefault("ready", "sniffing on")
        self._spawn([*args, *extra_args], **kw)


class ReplayTap(Tap):
    """`amqptap replay CAPTURE [--port P]`: CAPTURE a file, a FIFO, "-" (its stdin: stdin=subprocess.PIPE to write
    it, whole with finish(input=...) or in parts through .stdin). verdicts: a path, "-" or None (the records go to
    its stdout, piped by default); frames: a path or None. capture None: extra_args are the whole command line after
    `replay` (for the tests of its grammar). Run to its end with finish(); a live view is stopped with SIGINT."""

    STOP_SIGNAL = signal.SIGINT

    def __init__(self, capture, port=None, extra_args=(), verdicts=None, frames=None, stdout=subprocess.PIPE, **kw):
        self.dir = tempfile.mkdtemp(prefix="amqptap-replay-")
        self.verdicts = verdicts
        self.frames = frames
        args = ["replay"]
        if capture is not None:
            args.append(capture)
            if port is not None:
                args += ["--port", str(port)]
            if verdicts is not None:
                args += ["--verdicts", verdicts]
            if frames is not None:
                args += ["--frames", frames]
        self._spawn([*args, *extra_args], stdout=stdout, **kw)


Tap.proxy, Tap.sniff, Tap.replay = ProxyTap, SniffTap, ReplayTap


def start_tap(extra_args=(), upstream_port=None, **kw):
    """Starts amqptap in front of upstream_port (default: the throwaway broker); returns a ProxyTap."""
    return ProxyTap(upstream_port, extra_args, **kw)


def replay(capture, port=None, extra_args=(), input=None, timeout=120.0, **kw):
    """`amqptap replay` run to its end (input: bytes for its stdin); returns the finished ReplayTap."""
    stdin = subprocess.PIPE if input is not None else subprocess.DEVNULL
    return ReplayTap(capture, port, extra_args, stdin=stdin, **kw).finish(input, timeout)


class TapTestCase(unittest.TestCase):
    """Stops the taps a test started (proxies and sniffers) and checks that each exited 0; prints their stderr on
    failure."""

    def setUp(self):
        self._taps = []

    def start_tap(self, extra_args=(), upstream_port=None, **kw):
        tap = start_tap(extra_args, upstream_port, **kw)
        self._taps.append(tap)
        return tap

    def start_sniff(self, extra_args=(), **kw):
        """A SniffTap (see there for the arguments) that must exit 0 when stopped (SIGINT)."""
        tap = SniffTap(extra_args, **kw)
        self._taps.append(tap)
        return tap

    def tearDown(self):
        for tap in self._taps:
            rc = tap.stop()
            err = tap.stderr()
            tap.cleanup()
            if rc != 0 or "Sanitizer" in err or "runtime error:" in err:
                sys.stderr.write(f"--- amqptap stderr (exit {rc}) ---\n{err[-4000:]}\n")
            self.assertEqual(rc, 0, f"amqptap exited {rc} on {tap.STOP_SIGNAL.name}")
            self.assertNotIn("Sanitizer", err)
            self.assertNotIn("runtime error:", err)


class Peer:
    """A TCP server standing in for the broker on a free loopback port. handler(sock, index) runs in its own
    thread for every accepted connection; the socket is closed when it returns."""

    def __init__(self, handler, port=None):
        self.handler = handler
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port or 0))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.errors = []
        self._running = 0  # handlers started and not returned: counted before the thread starts (join)
        self._done = threading.Condition()
        self._closed = False
        self._t = threading.Thread(target=self._accept_loop, daemon=True)
        self._t.start()

    def _accept_loop(self):
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            idx = self.accepted
            self.accepted += 1
            with self._done:
                self._running += 1
            threading.Thread(target=self._run, args=(conn, idx), daemon=True).start()

    def _run(self, conn, idx):
        try:
            self.handler(conn, idx)
        except Exception as e:  # reported by the test through .errors
            self.errors.append(repr(e))
        finally:
            conn.close()
            with self._done:
                self._running -= 1
                self._done.notify_all()

    def join(self, timeout=30.0):
        """Waits until every handler started so far has returned. A handler counts from before its thread starts:
        joining the threads listed missed one whose client was already served but that the accept loop had not
        listed yet, and its result was not there when the test looked."""
        with self._done:
            self._done.wait_for(lambda: self._running == 0, timeout)

    def close(self):
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def echo_handler(conn, _idx):
    while True:
        data = conn.recv(65536)
        if not data:
            return
        conn.sendall(data)


def recv_chunks(sock, n=None, chunk=MIB):
    """Yields what sock receives, until n bytes came (n None: until EOF) or EOF came first. The one receive loop of
    the integration tests: recv_bytes and recv_exact_hash are built on it."""
    got = 0
    while n is None or got < n:
        data = sock.recv(chunk if n is None else min(chunk, n - got))
        if not data:
            return
        got += len(data)
        yield data


def recv_bytes(sock, n=None, chunk=MIB):
    """n bytes (n None: everything until EOF) as one bytes object; fewer when EOF came first."""
    return b"".join(recv_chunks(sock, n, chunk))


def recv_exact_hash(sock, n, chunk=MIB):
    """Reads exactly n bytes; returns (sha256 hexdigest, bytes read) — fewer bytes when EOF came first."""
    h = hashlib.sha256()
    got = 0
    for data in recv_chunks(sock, n, chunk):
        h.update(data)
        got += len(data)
    return h.hexdigest(), got


def random_chunks(rng, total, min_chunk=1, max_chunk=MIB):
    """Chunk sizes summing to total, log-uniform between min_chunk and max_chunk (many small, some huge)."""
    sizes = []
    left = total
    lo, hi = min_chunk.bit_length(), max_chunk.bit_length()
    while left > 0:
        k = rng.randint(lo, hi)
        n = rng.randint(1 << (k - 1), (1 << k) - 1)
        n = max(min_chunk, min(n, max_chunk, left))
        sizes.append(n)
        left -= n
    return sizes


def send_chunks(sock, data, sizes):
    """Sends data in chunks of the given sizes; returns its sha256 hexdigest."""
    h = hashlib.sha256()
    off = 0
    for n in sizes:
        piece = data[off:off + n]
        sock.sendall(piece)
        h.update(piece)
        off += n
    assert off == len(data)
    return h.hexdigest()


def check_confirmed_publishes(testcase, records, count, channel=1):
    """Asserts the tap's invariant for a clean confirm-mode run: exactly one publish record per publish,
    seq 1..count on the channel, every one routed and acked. Returns the publish records."""
    pubs = [r for r in records if r.get("type") == "publish"]
    testcase.assertEqual(len(pubs), count, "want exactly one publish record per basic.publish")
    testcase.assertEqual(sorted(r.get("seq") for r in pubs), list(range(1, count + 1)))
    testcase.assertEqual({r.get("channel") for r in pubs}, {channel})
    bad = [r for r in pubs if r.get("route") != "routed" or r.get("confirm") != "ack"]
    testcase.assertEqual(bad[:3], [], f"{len(bad)} publishes not routed+acked")
    return pubs


class _TimedResult(unittest.TextTestResult):
    """Keeps each test's wall time, for the slowest ones on the last line (where the CI's 20 minutes go)."""

    def startTest(self, test):
        self._started = time.monotonic()
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        self.times = getattr(self, "times", [])
        self.times.append((time.monotonic() - self._started, test.id().rsplit(".", 1)[-1]))


def main():
    """unittest main for one test file: verbose run, a final "N passed, M failed" line, exit 1 on failure."""
    module = sys.modules["__main__"]
    names = sys.argv[1:]
    loader = unittest.defaultTestLoader
    suite = loader.loadTestsFromNames(names, module) if names else loader.loadTestsFromModule(module)
    runner = unittest.TextTestRunner(verbosity=2, stream=sys.stdout, resultclass=_TimedResult)
    result = runner.run(suite)
    # a test and its tearDown may both fail: count the test once
    failed = len({t.id() for t, _ in result.failures + result.errors} | {t.id() for t in result.unexpectedSuccesses})
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    slowest = sorted(getattr(result, "times", []), reverse=True)[:int(os.environ.get("TAP_SLOWEST", "3"))]
    if slowest:
        line += "; slowest: " + ", ".join(f"{name} {took:.1f} s" for took, name in slowest)
    print(line)
    sys.stdout.flush()
    sys.exit(1 if failed or result.testsRun == 0 else 0)


CHROMIUM = "/usr/bin/chromium"


def http_get(port, path, method="GET", timeout=10, body=None):
    """(status, headers, body bytes) of one request to the tap's metrics port."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, data=body)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def chromium(case, url, *args, timeout=120):
    """Runs headless Chromium on url with a fresh profile; returns the CompletedProcess."""
    case.assertTrue(os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} missing (apt-get install chromium)")
    profile = tempfile.mkdtemp(prefix="amqptap-chromium-")
    case.addCleanup(shutil.rmtree, profile, True)
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--virtual-time-budget=3000", *args, url]
    return subprocess.run(cmd, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def page_findings(case, port):
    """The findings on top of the status page at the metrics port, rendered by Chromium, one string each."""
    run = chromium(case, f"http://127.0.0.1:{port}/", "--dump-dom")
    case.assertEqual(run.returncode, 0, run.stderr.decode()[-2000:])
    dom = run.stdout.decode("utf-8", "replace")
    found = re.search(r'<ul id="findings">(.*?)</ul>', dom, re.S)
    case.assertIsNotNone(found, f"no findings in the rendered page: {dom[:3000]}")
    items = re.findall(r"<li[^>]*>(.*?)</li>", found.group(1), re.S)
    return [html.unescape(re.sub(r"<[^>]+>", "", li)) for li in items]


__all__ = ["AMQPTAP_BIN", "AMQP_091_HEADER", "BROKER_HOST", "BROKER_PORT", "CHROMIUM", "CLIENTS_DIR", "FAILALLOC",
           "MIB", "Peer", "ProxyTap", "ReplayTap", "SOURCE_DIR", "SniffTap", "Tap", "TapTestCase", "broker_reachable",
           "capture_port", "check_confirmed_publishes", "chromium", "echo_handler", "fd_count", "free_port",
           "http_get", "is_asan_build", "main", "page_findings", "proc_stat", "random_chunks", "read_records",
           "recv_bytes", "recv_chunks", "recv_exact_hash", "replay", "require_broker", "rss_kb", "send_chunks",
           "start_tap", "wait_for"]
