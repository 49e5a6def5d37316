# Unreachable upstream: the client's connection is closed promptly (within 1 s), stderr says why, and the tap
# keeps serving: once something listens on that port, the next client gets through. The client is reset
# (SO_LINGER 0), not closed cleanly, so that client libraries take their "broker down" path as they do for the
# "connection refused" a direct connection gets: py-amqp raises ConnectionResetError (a ConnectionError, as
# ConnectionRefusedError is) instead of OSError("Server unexpectedly closed connection"); pika's error names the
# reset instead of "Transport indicated EOF".
# Out of file descriptors (RLIMIT_NOFILE lowered under the running tap): clients the tap cannot give an upstream
# socket are recorded with reason tap_fd_limit (not unreachable: the broker is fine), stderr says so once, and
# the tap neither spins on a listener it cannot accept from nor stops serving; the clients that waited get
# through once a connection ends.

import errno
import os
import re
import resource
import shutil
import socket
import ssl
import struct
import tempfile
import threading
import time

import amqp
import pika
import pika.exceptions

from tapharness import (AMQP_091_HEADER, BROKER_PORT, Peer, TapTestCase, echo_handler, fd_count, free_port, http_get,
                        main, proc_stat, recv_bytes, replay, require_broker, wait_for)
from tlslib import shared_pki


class UnreachableTest(TapTestCase):
    def tmpdir(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        return d

    def hosts_namespace(self):
        """The prefix that runs the tap with an /etc/hosts of its own (a mount namespace), in which dualhost has
        an AAAA record (::1) first and an A record (127.0.0.1)."""
        if os.geteuid() != 0 or not shutil.which("unshare"):
            self.skipTest("needs root and unshare for an /etc/hosts of its own")
        hosts = os.path.join(self.tmpdir(), "hosts")
        with open(hosts, "w") as f:
            f.write("::1 dualhost\n127.0.0.1 dualhost\n")
        return ["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', hosts]

    def dualhost_tap(self, port, extra):
        """A tap in front of dualhost:port (hosts_namespace); nothing may listen on [::1]:port."""
        prefix = self.hosts_namespace()
        try:  # the case needs the port unused on [::1] (the broker listens on IPv4 only) and IPv6 on loopback
            socket.create_connection(("::1", port), timeout=2).close()
            self.skipTest(f"something listens on [::1]:{port}")
        except ConnectionRefusedError:
            pass
        except OSError:
            self.skipTest("no IPv6 on loopback")
        return self.start_tap(extra, upstream_port=port, upstream_host="dualhost", prefix=prefix)

    def test_a_name_with_no_address_reachable(self):
        """Both addresses refused: the session tries each once, then the client is turned away (reset) as for
        any unreachable broker, with one close record naming the last address tried."""
        port, mport = free_port(), free_port()
        tap = self.dualhost_tap(port, ["--metrics", f"127.0.0.1:{mport}"])
        t0 = time.monotonic()
        with self.assertRaises((ConnectionError, amqp.exceptions.AMQPError, OSError)):
            c = amqp.Connection(f"127.0.0.1:{tap.port}", connect_timeout=5)
            c.connect()
        self.assertLess(time.monotonic() - t0, 2)
        self.assertTrue(wait_for(lambda: len(tap.records("connection")) == 1, 5))
        rec = tap.records("connection")[0]
        self.assertEqual((rec["event"], rec["by"], rec["upstream"]), ("close", "unreachable", f"127.0.0.1:{port}"))
        err = tap.stderr()
        self.assertIn(f"conn 1: upstream dualhost:{port} unreachable at [::1]:{port}: ", err)
        self.assertIn(f"conn 1: trying 127.0.0.1:{port}", err)
        self.assertIn(f"conn 1: upstream dualhost:{port} unreachable at 127.0.0.1:{port}: ", err)
        self.assertEqual(err.count("trying"), 1, err)
        self.assertEqual(upstream_counters(mport), (2, 1))

    def test_a_name_whose_first_address_is_unreachable(self):
        """--upstream NAME with an AAAA and an A record, the broker listening on IPv4 only (as this test's does):
        the first client's session finds [::1] refused and goes on to 127.0.0.1 itself, as a client library
        connecting directly tries each address (before: that client was turned away), and the tap sends the next
        clients to 127.0.0.1 at once. The records and the --pcap name the address each session went to. The name
        is given in an /etc/hosts of the tap's own (a mount namespace)."""
        require_broker(self)
        pcap, mport = os.path.join(self.tmpdir(), "dual.pcapng"), free_port()
        tap = self.dualhost_tap(BROKER_PORT, ["--pcap", pcap, "--metrics", f"127.0.0.1:{mport}"])
        for i in (1, 2):
            c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tap.port, connection_attempts=1))
            ch = c.channel()
            ch.confirm_delivery()
            ch.basic_publish("", "dualhost.nowhere", b"x", pika.BasicProperties(message_id=f"m{i}"))
            c.close()
        self.assertTrue(wait_for(lambda: len(tap.records("publish")) == 2, 5))
        self.assertEqual([r["confirm"] for r in tap.records("publish")], ["ack", "ack"])
        # the second close record follows the client's close (c.close() returns before the tap has seen the FIN)
        self.assertTrue(wait_for(lambda: sum(r["event"] == "close" for r in tap.records("connection")) == 2, 5))
        conns = tap.records("connection")
        went = {r["conn"]: r["upstream"] for r in conns if r["event"] == "open"}
        ended = {r["conn"]: r["by"] for r in conns if r["event"] == "close"}
        self.assertEqual([(went[c], ended[c]) for c in sorted(ended)],
                         [(f"127.0.0.1:{BROKER_PORT}", "client")] * 2)
        err = tap.stderr()
        self.assertIn(f"conn 1: upstream dualhost:{BROKER_PORT} unreachable at [::1]:{BROKER_PORT}: ", err)
        self.assertIn(f"[::1]:{BROKER_PORT} is unreachable; new connections go to 127.0.0.1:{BROKER_PORT}", err)
        self.assertIn(f"conn 1: trying 127.0.0.1:{BROKER_PORT}", err)
        self.assertNotIn("conn 2: upstream", err)
        # the failover shows in the metrics: an address failed, no client was turned away
        self.assertEqual(upstream_counters(mport), (1, 0))
        self.assertEqual(tap.stop(), 0)
        # the capture names the address each session went to: a replay of it gives the same connections
        out = replay(pcap, BROKER_PORT, verdicts="-", timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr())
        replayed = out.records()
        self.assertEqual([r["upstream"] for r in replayed if r["type"] == "connection" and r["event"] == "open"],
                         [f"127.0.0.1:{BROKER_PORT}"] * 2)
        self.assertEqual(sorted(r["message_id"] for r in replayed if r["type"] == "publish"), ["m1", "m2"])

    def closed_within(self, tap, limit, send=b""):
        """Seconds from connecting (and sending `send`) until the tap closes the connection (EOF or reset, which
        may even beat connect() itself), or None if it stays open past limit."""
        t0 = time.monotonic()
        try:
            sock = tap.connect()
        except ConnectionResetError:
            return time.monotonic() - t0
        try:
            sock.sendall(send)
            sock.settimeout(limit)
            while sock.recv(4096):
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass
        except socket.timeout:
            return None
        finally:
            sock.close()
        return time.monotonic() - t0

    def test_closed_promptly_then_recovers(self):
        port = free_port()
        tap = self.start_tap(upstream_port=port)
        took = self.closed_within(tap, 1.0, AMQP_091_HEADER)
        self.assertIsNotNone(took, "client connection still open 1 s after the upstream refused")
        print(f"client closed {took * 1000:.1f} ms after connect to an unreachable upstream")
        self.assertTrue(wait_for(lambda: str(port) in tap.stderr(), 2.0),
                        f"stderr does not mention the upstream {port}: {tap.stderr()!r}")
        self.assertTrue(tap.alive())

        # A silent client (sends nothing) is closed as well.
        self.assertIsNotNone(self.closed_within(tap, 1.0), "silent client not closed")

        peer = Peer(echo_handler, port=port)
        self.addCleanup(peer.close)
        c = tap.connect()
        c.settimeout(5)
        msg = AMQP_091_HEADER + b"after the upstream came back"
        c.sendall(msg)
        got = recv_bytes(c, len(msg))
        c.close()
        self.assertEqual(got, msg)
        self.assertEqual(peer.accepted, 1)
        self.assertTrue(tap.alive())

    def test_client_is_reset_as_if_refused(self):
        port = free_port()
        tap = self.start_tap(upstream_port=port)

        with self.assertRaises(ConnectionResetError):  # a clean close would read as b""
            c = tap.connect()  # sends nothing; the reset may come before connect() returns, or on recv
            c.settimeout(5)
            try:
                c.recv(4096)
            finally:
                c.close()

        with self.assertRaises(ConnectionRefusedError):  # what py-amqp says straight to a port nobody serves
            amqp.Connection(f"127.0.0.1:{port}", connect_timeout=5).connect()
        try:
            amqp.Connection(f"127.0.0.1:{tap.port}", connect_timeout=5).connect()
            self.fail("py-amqp connected through a tap whose broker is down")
        except OSError as e:
            print(f"py-amqp through the tap: {e!r}")
            self.assertIsInstance(e, ConnectionError, "py-amqp did not see a connection error")
            self.assertEqual(e.errno, errno.ECONNRESET)

        params = pika.ConnectionParameters(host="127.0.0.1", port=tap.port, connection_attempts=1, socket_timeout=5)
        with self.assertRaises(pika.exceptions.AMQPConnectionError) as ctx:
            pika.BlockingConnection(params)
        print(f"pika through the tap: {ctx.exception!r}")
        # reset on read: StreamLostError(ConnectionResetError); reset during its connect: ConnectionResetError or
        # (pika asks getpeername() of a socket already reset) "not connected"; a clean close: "Transport indicated EOF"
        self.assertNotIn("Transport indicated EOF", repr(ctx.exception))
        self.assertTrue(any(k in repr(ctx.exception) for k in ("ConnectionResetError", "not connected")),
                        repr(ctx.exception))

        self.assertTrue(wait_for(lambda: len(tap.records("connection")) >= 3, 5.0))
        self.assertEqual({r.get("by") for r in tap.records("connection")}, {"unreachable"})

    def test_connect_that_hangs_times_out(self):
        # connecting to a listener whose accept queue is full hangs, as to a host that is down or firewalled
        tap = self.start_tap(["--handshake-timeout", "500"], upstream_port=self.hanging_listener())
        took = self.closed_within(tap, 5.0, AMQP_091_HEADER)
        self.assertIsNotNone(took, "the client waited on a connect that never completed")
        self.assertGreaterEqual(took, 0.45)
        self.assertTrue(wait_for(lambda: tap.records("connection"), 5))
        rec = tap.records("connection")[-1]
        self.assertEqual((rec["by"], rec["text"]), ("unreachable", "connect timed out after 500 ms"))
        self.assertTrue(wait_for(lambda: "connect timed out" in tap.stderr(), 5), tap.stderr())  # its own writer

    def hanging_listener(self):
        """A listener whose accept queue is full: it drops further SYNs, so a connect to it hangs."""
        full = socket.socket()
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        self.addCleanup(full.close)
        queued = socket.create_connection(full.getsockname())
        self.addCleanup(queued.close)
        return full.getsockname()[1]

    def test_client_that_resets_during_a_hanging_connect_is_let_go(self):
        """A client is read only once its broker is connected, but one that goes away meanwhile is still seen:
        with no --handshake-timeout, a client that sent its header and reset while the connect hung had its
        session (and its socket) held until the kernel gave the connect up, about two minutes. Its end is now
        handled as before the client waited: the session ends within the drain timeout (10 s) as client_reset,
        and the tap does not spin meanwhile on the bytes that wait (a first try with epoll did)."""
        tap = self.start_tap(["--handshake-timeout", "0"], upstream_port=self.hanging_listener())
        cpu0 = cpu_seconds(tap.proc.pid)
        sock = tap.connect()
        sock.sendall(AMQP_091_HEADER)
        time.sleep(0.3)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        self.assertTrue(wait_for(lambda: tap.records("connection"), 14), "the session outlived its client")
        rec = tap.records("connection")[-1]
        self.assertEqual((rec["event"], rec["by"]), ("close", "client_reset"), rec)
        self.assertLess(cpu_seconds(tap.proc.pid) - cpu0, 1.0, "the tap spun while the client waited")

    def test_broker_tls_failure_closes_the_client_without_a_reset(self):
        """A broker whose answer to the TLS handshake is not TLS (a plain AMQP port: its protocol header): the
        client is closed with a FIN, as before it waited for its broker, not reset by the kernel for the header the
        tap had not read."""
        def plain_amqp_port(conn, _idx):
            conn.recv(65536)
            conn.sendall(AMQP_091_HEADER)
            conn.settimeout(10)
            while conn.recv(65536):  # until the tap closes: closing with its bytes unread would reset it
                pass

        peer = Peer(plain_amqp_port)
        self.addCleanup(peer.close)
        tap = self.start_tap(["--upstream-tls", "--upstream-insecure", "--handshake-timeout", "5000"],
                             upstream_port=peer.port)
        sock = tap.connect()
        sock.sendall(AMQP_091_HEADER)
        sock.settimeout(5)
        self.assertEqual(sock.recv(100), b"")  # EOF; a reset raises ConnectionResetError
        sock.close()
        self.assertTrue(wait_for(lambda: tap.records("connection"), 5))
        rec = tap.records("connection")[-1]
        self.assertEqual(rec["by"], "broker_tls_error", rec)
        self.assertEqual(peer.accepted, 1)

    def test_a_tls_address_that_never_answers_is_passed_over(self):
        """--upstream-tls to a name whose first address takes the TCP connection and never answers the TLS
        handshake (a hung node): after --handshake-timeout the session goes on to the next address, as for one
        that does not answer the connect (before, the client was closed as broker_tls_error)."""
        port, mport = free_port(), free_port()
        silent = socket.socket(socket.AF_INET6)
        try:
            silent.bind(("::1", port))
        except OSError:
            self.skipTest("no IPv6 on loopback")
        silent.listen(8)  # never accepted: the kernel takes the connection, nobody answers
        self.addCleanup(silent.close)
        pki = shared_pki()
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(os.path.join(pki, "server.pem"), os.path.join(pki, "server.key"))

        def tls_echo(conn, _idx):
            with server.wrap_socket(conn, server_side=True) as t:
                while data := t.recv(65536):
                    t.sendall(data)

        peer = Peer(tls_echo, port=port)
        self.addCleanup(peer.close)
        tap = self.start_tap(["--upstream-tls", "--upstream-ca", os.path.join(pki, "ca.pem"), "--upstream-sni",
                              "localhost", "--handshake-timeout", "500", "--metrics", f"127.0.0.1:{mport}"],
                             upstream_port=port, upstream_host="dualhost", prefix=self.hosts_namespace())
        sock = tap.connect()
        sock.sendall(AMQP_091_HEADER)
        sock.settimeout(5)
        self.assertEqual(recv_bytes(sock, len(AMQP_091_HEADER)), AMQP_091_HEADER)  # the echo, through 127.0.0.1
        sock.close()
        self.assertTrue(wait_for(lambda: "conn 1: trying" in tap.stderr(), 5), tap.stderr())  # its own writer
        err = tap.stderr()
        self.assertIn(f"conn 1: upstream dualhost:{port} unreachable at [::1]:{port}: no answer to the TLS "
                      "handshake within 500 ms", err)
        self.assertIn(f"conn 1: trying 127.0.0.1:{port}", err)
        self.assertEqual(upstream_counters(mport), (1, 0))
        self.assertEqual(peer.accepted, 1)


def upstream_counters(mport):
    """(amqptap_upstream_address_failures_total, amqptap_upstream_unreachable_total) from the tap's /metrics."""
    text = http_get(mport, "/metrics")[2].decode()
    value = lambda name: int(re.search(rf"^{name} (\d+)$", text, re.M).group(1))  # noqa: E731
    return value("amqptap_upstream_address_failures_total"), value("amqptap_upstream_unreachable_total")


def cpu_seconds(pid):
    """User plus system CPU time the process has used."""
    fields = proc_stat(f"/proc/{pid}/stat")[1]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pika_connect(port):
    params = pika.ConnectionParameters(host="127.0.0.1", port=port, connection_attempts=1, socket_timeout=10,
                                       blocked_connection_timeout=30)
    return pika.BlockingConnection(params)


def confirm_publish(conn, body):
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, body, mandatory=True)  # raises if nacked or returned
    return ch


class FdLimitTest(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)
        self.tap = self.start_tap(upstream_port=BROKER_PORT)

    def limit_fds(self, spare):
        """Lowers the tap's soft RLIMIT_NOFILE to what it has open plus `spare`."""
        _, hard = resource.prlimit(self.tap.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(self.tap.pid, resource.RLIMIT_NOFILE, (fd_count(self.tap.pid) + spare, hard))

    def shortage_lines(self):
        return [ln for ln in self.tap.stderr().splitlines() if "out of file descriptors" in ln]

    def test_clients_without_an_upstream_socket_are_named_tap_fd_limit(self):
        tap = self.tap
        first = pika_connect(tap.port)  # before the limit: two descriptors (client and upstream)
        self.limit_fds(1)  # room for one accepted client, none for its upstream
        for _ in range(3):
            with self.assertRaises(pika.exceptions.AMQPConnectionError):
                pika_connect(tap.port)
        confirm_publish(first, b"the tap still serves the connection it has")
        first.close()
        closes_now = lambda: [r for r in tap.records("connection") if r.get("event") == "close"]
        self.assertTrue(wait_for(lambda: len(closes_now()) >= 4, 5.0))  # the three refused and `first`
        closes = closes_now()
        refused = [r for r in closes if r.get("by") == "tap_fd_limit"]
        self.assertEqual(len(refused), 3, f"want three clients closed with reason tap_fd_limit: {closes}")
        self.assertEqual([r for r in closes if r.get("by") == "unreachable"], [], "the broker was reachable")
        self.assertEqual(len(self.shortage_lines()), 1, f"say it once, not per client: {tap.stderr()!r}")
        self.assertNotIn("unreachable:", tap.stderr())
        later = pika_connect(tap.port)  # two descriptors are free again
        confirm_publish(later, b"after the shortage")
        later.close()

    def test_accept_pauses_instead_of_spinning_and_waiting_clients_get_through(self):
        tap = self.tap
        first = pika_connect(tap.port)
        self.limit_fds(0)  # accept() itself fails
        result = {}

        def waiting_client():
            try:
                conn = pika_connect(tap.port)
                confirm_publish(conn, b"waited in the accept queue")
                conn.close()
                result["ok"] = True
            except Exception as e:  # reported through result
                result["error"] = repr(e)

        t = threading.Thread(target=waiting_client, daemon=True)
        cpu0 = cpu_seconds(tap.pid)
        t.start()
        time.sleep(1.5)
        spent = cpu_seconds(tap.pid) - cpu0
        lines = len(tap.stderr().splitlines())
        print(f"at the limit for 1.5 s: {spent:.2f} s of tap CPU, {lines} stderr lines")
        self.assertTrue(t.is_alive(), f"the waiting client did not wait: {result}")
        self.assertLess(spent, 0.3, "the tap spins on a listener it cannot accept from")
        self.assertEqual(len(self.shortage_lines()), 1, tap.stderr()[-2000:])
        self.assertLess(lines, 10, tap.stderr()[-2000:])
        first.close()  # frees two descriptors: the waiting client is accepted
        t.join(20)
        self.assertEqual(result, {"ok": True})
        closes = [r for r in tap.records("connection") if r.get("event") == "close"]
        self.assertEqual([r.get("by") for r in closes if r.get("by") in ("tap_fd_limit", "unreachable")], [])


if __name__ == "__main__":
    main()
