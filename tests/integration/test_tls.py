# TLS on both legs against a real RabbitMQ with its TLS listener on (issue 6): with tlslib's certificates and
# broker node of its own (mTLS required), checks verdicts over TLS, verification failures, mTLS, the key
# log (tshark decrypts a raw capture of the client leg with it), and the decrypted --frames/--pcap.
# --handshake-timeout: clients that open TCP and never finish (or never start) their TLS handshake delay
# nobody and are closed after the timeout with a record; so is a broker that never answers the tap's handshake.

import json
import os
import re
import selectors
import shutil
import signal
import ssl
import stat
import subprocess
import socket
import tempfile
import threading
import time

import pika

from tapharness import (AMQP_091_HEADER, AMQPTAP_BIN, Peer, free_port, http_get, main, page_findings, proc_stat,
                        read_records, replay, require_broker, wait_for, without_identity)
from tlslib import PLAIN_PORT, STORM, TLS_PORT, PkiCase, TlsCase


def memory_tls_client(ca):
    """A Python TLS client trusting ca on memory BIOs, its ClientHello written: (the SSL object, its incoming and
    outgoing BIOs, the ClientHello bytes)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context(cafile=ca).wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:  # it waits for the server's answer
        pass
    return tls, incoming, outgoing, outgoing.read()


class BothLegs(TlsCase):
    def test_scenarios_same_over_tls_and_plain(self):
        tls = self.tls_tap()
        plain = self.start_tap(upstream_port=PLAIN_PORT)
        self.scenarios(self.pika_params(tls.port, tls=True))
        self.scenarios(self.pika_params(plain.port, tls=False))
        want = {"routed": ("routed", "ack", None, None, None),
                "returned": ("returned", "ack", 312, "return_before_ack", None),
                "fills": ("routed", "ack", None, None, None),
                "nacked": ("unproven", "nack", None, None, None),
                "missing": ("unknown", "unknown", None, None, 404)}
        self.assertTrue(wait_for(lambda: len(tls.records("publish")) == 5, 5), tls.records("publish"))
        self.assertTrue(wait_for(lambda: len(plain.records("publish")) == 5, 5))
        self.assertEqual(self.verdicts(tls), want)
        self.assertEqual(self.verdicts(plain), want)
        opened = tls.records("connection")[0]
        self.assertEqual(opened["user"], "guest")

    def test_busy_legs_keep_their_record_buffers_and_quiet_ones_give_them_back(self):
        """OpenSSL's record buffers: a TLS leg read or written 100 times or more in a second keeps them (no
        malloc/free around every record), one that was quiet for a second gives them back (an idle connection
        costs little). SIGUSR1 says how many legs keep them."""
        tap = self.tls_tap()
        c = pika.BlockingConnection(self.pika_params(tap.port))
        ch = c.channel()
        q = f"tls.busy.{time.monotonic_ns()}"
        ch.queue_declare(q, auto_delete=True)
        ch.confirm_delivery()
        sent, until = 0, time.monotonic() + 2.5  # at least one whole sweep period of traffic
        while time.monotonic() < until:
            ch.basic_publish("", q, b"x")  # waits for its confirm: a read and a write on each leg
            sent += 1
        self.assertGreater(sent, 500, "too few publishes to make both legs busy")
        tap.proc.send_signal(signal.SIGUSR1)
        line = "TLS legs keeping their record buffers"
        self.assertTrue(wait_for(lambda: tap.stderr().count(line) == 1, 5), tap.stderr())
        self.assertIn(f"2 {line}", tap.stderr())
        time.sleep(2.5)  # the connection stays open and quiet
        tap.proc.send_signal(signal.SIGUSR1)
        self.assertTrue(wait_for(lambda: tap.stderr().count(line) == 2, 5), tap.stderr())
        self.assertIn(f"0 {line}", tap.stderr())
        c.close()
        self.assertTrue(wait_for(lambda: len(tap.records("publish")) == sent, 10))

    def test_mixed_legs_give_the_same_verdicts(self):
        """TLS on one leg only: the plain leg is read by the session itself, the TLS leg through OpenSSL; the
        bytes and verdicts must not depend on which side is which."""
        want = {"routed": ("routed", "ack", None, None, None),
                "returned": ("returned", "ack", 312, "return_before_ack", None),
                "fills": ("routed", "ack", None, None, None),
                "nacked": ("unproven", "nack", None, None, None),
                "missing": ("unknown", "unknown", None, None, 404)}
        tls_in = self.start_tap(["--tls-cert", self.p("server.pem"), "--tls-key", self.p("server.key")],
                                upstream_port=PLAIN_PORT)
        tls_out = self.tls_tap(client_tls=False)
        self.scenarios(self.pika_params(tls_in.port, tls=True))
        self.scenarios(self.pika_params(tls_out.port, tls=False))
        for tap in (tls_in, tls_out):
            self.assertTrue(wait_for(lambda: len(tap.records("publish")) == 5, 5), tap.records("publish"))
            self.assertEqual(self.verdicts(tap), want)
            closes = lambda: [r for r in tap.records("connection") if r.get("event") == "close"]
            self.assertTrue(wait_for(closes, 5), tap.records("connection"))
            self.assertNotIn("tls_error", closes()[0]["by"])
            # its own end towards the broker, told when the TCP connect completed (a TLS leg before its handshake)
            opened = [r for r in tap.records("connection") if r.get("event") == "open"]
            self.assertRegex(opened[0]["upstream_local"], r"^127\.0\.0\.1:\d+$")

    def test_frames_and_pcap_hold_decrypted_frames(self):
        d = tempfile.mkdtemp(prefix="amqptap-tlspcap-")
        try:
            pcap = os.path.join(d, "tls.pcapng")
            tap = self.tls_tap(extra=["--pcap", pcap])
            self.scenarios(self.pika_params(tap.port))
            self.assertEqual(tap.stop(), 0)
            methods = [r.get("method") for r in tap.frame_records()]
            self.assertIn("basic.publish", methods)
            self.assertIn("basic.return", methods)
            replayed = os.path.join(d, "replay.jsonl")
            r = replay(pcap, TLS_PORT, verdicts=replayed, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr())
            # replay writes no process identity: its records are the same on every run
            self.assertEqual([x for x in read_records(replayed) if x["type"] == "publish"],
                             without_identity(self, tap.records("publish")))
        finally:
            shutil.rmtree(d, ignore_errors=True)


class Verification(TlsCase):
    def refused(self, tap, needle):
        with self.assertRaises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(self.pika_params(tap.port, tls=False))
        self.assertTrue(wait_for(lambda: tap.records("connection"), 5))
        rec = tap.records("connection")[-1]
        self.assertEqual((rec["event"], rec["by"]), ("close", "broker_tls_error"), rec)
        self.assertIn(needle, rec["text"])
        # stderr has its own writer thread: its line may come a moment after the record
        self.assertTrue(wait_for(lambda: needle in tap.stderr(), 5), tap.stderr())

    def test_unknown_ca_is_refused(self):
        """... and it is there to alert on: /metrics counts the connection closed by broker_tls_error, and the
        status page says so on top."""
        mport = free_port()
        tap = self.tls_tap(client_tls=False, upstream_args=[
            "--upstream-tls", "--upstream-ca", self.p("rogue.pem"), "--upstream-cert", self.p("client.pem"),
            "--upstream-key", self.p("client.key")], extra=["--metrics", f"127.0.0.1:{mport}"])
        self.refused(tap, "certificate verify failed")
        metrics = http_get(mport, "/metrics")[2].decode()
        self.assertIn('\namqptap_connections_closed_total{by="broker_tls_error"} 1\n', metrics)
        self.assertIn('\namqptap_connections_closed_total{by="client_tls_error"} 0\n', metrics)
        self.assertIn("\namqptap_upstream_up 0\n", metrics)  # no client gets through
        health = json.loads(http_get(mport, "/healthz")[2])
        self.assertEqual((health["upstream_reachable"], health["upstream_failure"]), (False, "broker_tls_error"))
        findings = page_findings(self, mport)
        self.assertEqual(len(findings), 2, findings)
        self.assertEqual(findings[0], "TLS towards the broker localhost:%d failed at the last connection attempt: no "
                                      "client gets through." % TLS_PORT, findings)
        self.assertTrue(findings[1].startswith("1 connection(s) ended by a TLS failure towards the broker"), findings)

    def test_wrong_host_name_is_refused(self):
        tap = self.tls_tap(client_tls=False, upstream_args=[
            "--upstream-tls", "--upstream-ca", self.p("ca.pem"), "--upstream-sni", "wrong.example",
            "--upstream-cert", self.p("client.pem"), "--upstream-key", self.p("client.key")])
        self.refused(tap, "hostname mismatch")

    def test_insecure_opt_out_connects_and_warns(self):
        tap = self.tls_tap(client_tls=False, upstream_args=[
            "--upstream-tls", "--upstream-insecure",
            "--upstream-cert", self.p("client.pem"), "--upstream-key", self.p("client.key")])
        self.assertIn("WARNING", tap.stderr())
        c = pika.BlockingConnection(self.pika_params(tap.port, tls=False))
        c.close()

    def test_mtls_without_client_certificate_fails_clearly(self):
        """The broker wants a client certificate and the tap has none. In TLS 1.3 the broker refuses it after the
        tap's side of the handshake is done, with an alert: still a TLS failure towards the broker (not a reset),
        said on stderr, and the broker counts as down: no client gets through. The client sends nothing: bytes the
        broker never read would make its kernel reset the connection and drop the alert unsent (then the record can
        only say broker_reset)."""
        mport = free_port()
        tap = self.tls_tap(client_tls=False, upstream_args=["--upstream-tls", "--upstream-ca", self.p("ca.pem")],
                           extra=["--metrics", f"127.0.0.1:{mport}"])
        with socket.create_connection(("127.0.0.1", tap.port)) as s:
            self.assertIsNotNone(closed_after(s, 10), "the tap kept the client after the broker refused")
        self.assertTrue(wait_for(lambda: tap.records("connection"), 5))
        rec = tap.records("connection")[-1]
        self.assertEqual((rec["event"], rec["by"]), ("close", "broker_tls_error"), rec)
        self.assertIn("certificate required", rec["text"])
        self.assertTrue(wait_for(lambda: "TLS with the broker failed: " in tap.stderr(), 5), tap.stderr())
        metrics = http_get(mport, "/metrics")[2].decode()
        self.assertIn('\namqptap_connections_closed_total{by="broker_tls_error"} 1\n', metrics)
        self.assertIn("\namqptap_upstream_up 0\n", metrics)

    def test_plaintext_client_on_tls_listener_is_closed_with_a_record(self):
        mport = free_port()
        tap = self.tls_tap(extra=["--metrics", f"127.0.0.1:{mport}"])
        with self.assertRaises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(self.pika_params(tap.port, tls=False))
        self.assertTrue(wait_for(lambda: tap.records("connection"), 5))
        rec = tap.records("connection")[-1]
        self.assertEqual(rec["by"], "client_tls_error", rec)
        self.assertTrue(rec["text"])
        self.assertIn('\namqptap_connections_closed_total{by="client_tls_error"} 1\n',
                      http_get(mport, "/metrics")[2].decode())
        c = pika.BlockingConnection(self.pika_params(tap.port))  # the tap still serves TLS clients
        c.close()

    def test_bad_certificate_files_exit_2_naming_the_file(self):
        for args, name in ((["--tls-cert", self.p("missing.pem"), "--tls-key", self.p("server.key")], "missing.pem"),
                           (["--tls-cert", self.p("server.pem"), "--tls-key", self.p("client.key")], "client.key"),
                           (["--tls-cert", self.p("server.key"), "--tls-key", self.p("server.key")], "server.key"),
                           (["--upstream-tls", "--upstream-ca", self.p("nothere.pem")], "nothere.pem")):
            r = subprocess.run([AMQPTAP_BIN, "--listen", f"127.0.0.1:{free_port()}", *args],
                               stderr=subprocess.PIPE, timeout=10)
            err = r.stderr.decode()
            self.assertEqual(r.returncode, 2, err)
            self.assertIn(name, err)
            self.assertEqual(len(err.strip().splitlines()), 1, err)

    def test_key_file_errors_say_what_is_wrong(self):
        """One line each, exit 2: a key that belongs to another certificate, a key with a passphrase (never asked
        for: a prompt would hang a service), a CA file that is not there, a key log path from SSLKEYLOGFILE."""
        encrypted = self.p("server-enc.key")
        subprocess.run(["openssl", "pkey", "-in", self.p("server.key"), "-aes256", "-passout", "pass:secret", "-out",
                        encrypted], check=True, capture_output=True)
        tls = ["--tls-cert", self.p("server.pem")]
        for args, env, want in (
                (tls + ["--tls-key", self.p("client.key")], {},
                 f"--tls-key {self.p('client.key')}: does not match --tls-cert {self.p('server.pem')}"),
                (tls + ["--tls-key", encrypted], {}, f"--tls-key {encrypted}: the key is encrypted"),
                (["--upstream-tls", "--upstream-ca", self.p("nothere.pem")], {},
                 f"--upstream-ca {self.p('nothere.pem')}: cannot read (No such file or directory)"),
                (tls + ["--tls-key", self.p("server.key")], {"SSLKEYLOGFILE": "/nonexistent/dir/k.log"},
                 "SSLKEYLOGFILE /nonexistent/dir/k.log: No such file or directory")):
            with self.subTest(want=want):
                r = subprocess.run([AMQPTAP_BIN, "--listen", f"127.0.0.1:{free_port()}", *args], stdin=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, timeout=10, env=dict(os.environ, **env))
                err = r.stderr.decode()
                self.assertEqual(r.returncode, 2, err)
                self.assertEqual(len(err.strip().splitlines()), 1, err)
                self.assertIn(want, err)
                self.assertNotIn("pass phrase", err)


def closed_after(sock, limit):
    """Seconds until the peer closes sock (EOF or reset), reading and dropping whatever it sends; None if it
    stays open past limit."""
    t0 = time.monotonic()
    sock.settimeout(limit)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except socket.timeout:
        return None
    return time.monotonic() - t0


class HandshakeTimeout(PkiCase):
    pika_params = TlsCase.pika_params

    def test_stalled_client_handshakes_delay_nobody_and_are_closed(self):
        require_broker(self)
        tap = self.start_tap(["--tls-cert", self.p("server.pem"), "--tls-key", self.p("server.key"),
                              "--handshake-timeout", "1000"])
        silent = [socket.create_connection(("127.0.0.1", tap.port)) for _ in range(40)]
        partial = []
        for _ in range(10):  # the first bytes of a ClientHello record, then nothing
            c = socket.create_connection(("127.0.0.1", tap.port))
            c.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
            partial.append(c)
        opened = time.monotonic()
        t0 = time.monotonic()
        c = pika.BlockingConnection(self.pika_params(tap.port))
        ch = c.channel()
        ch.confirm_delivery()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"past the stalled ones", pika.BasicProperties(message_id="past"), mandatory=True)
        took = time.monotonic() - t0
        print(f"a TLS client connected and had its publish confirmed in {took * 1000:.0f} ms beside 50 stalled "
              "handshakes")
        self.assertLess(took, 0.9, "a stalled handshake delayed another client")
        closed = []
        for sock in silent + partial:
            closed.append(closed_after(sock, max(0.1, opened + 5 - time.monotonic())))
            sock.close()
        self.assertNotIn(None, closed, "a stalled handshake was not closed")
        since_open = time.monotonic() - opened
        print(f"all 50 closed {since_open:.2f} s after they connected (timeout 1 s)")
        self.assertLess(since_open, 3.0)
        c.close()
        self.assertTrue(wait_for(lambda: len(tap.records("connection")) >= 52, 5))
        timed_out = [r for r in tap.records("connection")
                     if r.get("by") == "client_tls_error" and r.get("text") == "TLS handshake timed out after 1000 ms"]
        self.assertEqual(len(timed_out), 50, tap.records("connection")[:3])
        self.assertGreaterEqual(min(r["duration_us"] for r in timed_out), 950_000)
        self.assertEqual([r["route"] for r in tap.records("publish")], ["routed"])

    def test_timeout_counts_from_the_connect_not_from_the_client_hello(self):
        """A client that sends its ClientHello late in its --handshake-timeout and then nothing more is closed when
        the timeout runs out, counted from its connect (the time its first step spent with the handshaker thread
        aside): not a whole timeout after its ClientHello (it was: 1.8 s for a 1 s timeout)."""
        tap = self.start_tap(["--tls-cert", self.p("server.pem"), "--tls-key", self.p("server.key"),
                              "--handshake-timeout", "1000"])
        hello = memory_tls_client(self.p("ca.pem"))[3]
        c = socket.create_connection(("127.0.0.1", tap.port))
        time.sleep(0.8)
        c.sendall(hello)  # then never the rest of the handshake
        self.assertIsNotNone(closed_after(c, 5))
        c.close()
        self.assertTrue(wait_for(lambda: tap.records("connection"), 5))
        rec = tap.records("connection")[-1]
        self.assertEqual((rec["by"], rec["text"]), ("client_tls_error", "TLS handshake timed out after 1000 ms"))
        print(f"closed {rec['duration_us'] / 1000:.0f} ms after its connect")
        self.assertGreaterEqual(rec["duration_us"], 950_000)
        self.assertLess(rec["duration_us"], 1_500_000)

    def test_broker_connection_waits_for_the_client_handshake(self):
        """The upstream connection is opened once the client's handshake is done: stalled, failed and abandoned
        handshakes cost the broker no connection."""
        peer = Peer(lambda conn, _idx: conn.sendall(conn.recv(64)))
        self.addCleanup(peer.close)
        tap = self.start_tap(["--tls-cert", self.p("server.pem"), "--tls-key", self.p("server.key"),
                              "--handshake-timeout", "300"], upstream_port=peer.port)
        stalled = socket.create_connection(("127.0.0.1", tap.port))
        plaintext = socket.create_connection(("127.0.0.1", tap.port))
        plaintext.sendall(b"AMQP\x00\x00\x09\x01")
        abandoned = socket.create_connection(("127.0.0.1", tap.port))
        abandoned.sendall(b"\x16\x03\x01\x02\x00\x01")
        abandoned.close()
        for sock in (stalled, plaintext):
            self.assertIsNotNone(closed_after(sock, 5))
            sock.close()
        self.assertTrue(wait_for(lambda: len(tap.records("connection")) == 3, 5), tap.records("connection"))
        self.assertEqual(sorted(r["by"] for r in tap.records("connection")),
                         ["client_eof", "client_tls_error", "client_tls_error"])
        self.assertEqual(peer.accepted, 0, "a client that never finished its handshake opened a broker connection")
        ctx = ssl.create_default_context(cafile=self.p("ca.pem"))
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", tap.port)), server_hostname="localhost") as c:
            c.sendall(b"AMQP\x00\x00\x09\x01")
            self.assertEqual(c.recv(64), b"AMQP\x00\x00\x09\x01")
        self.assertEqual(peer.accepted, 1)

    def broker_handshake_timeout(self, answer):
        """A broker that takes the ClientHello, sends `answer` and then nothing: the client is closed once
        --handshake-timeout (500 ms) runs out, and its connection's close record is returned."""
        hold = threading.Event()
        self.addCleanup(hold.set)

        def stalling_broker(conn, _idx):
            conn.recv(65536)
            conn.sendall(answer)
            hold.wait(30)

        peer = Peer(stalling_broker)
        self.addCleanup(peer.close)
        tap = self.start_tap(["--upstream-tls", "--upstream-ca", self.p("ca.pem"), "--handshake-timeout", "500"],
                             upstream_port=peer.port, upstream_host="localhost")
        c = socket.create_connection(("127.0.0.1", tap.port))
        c.sendall(b"AMQP\x00\x00\x09\x01")
        took = closed_after(c, 5)
        c.close()
        self.assertIsNotNone(took, "the client waited on a broker that never finished the handshake")
        self.assertGreaterEqual(took, 0.45)
        self.assertTrue(wait_for(lambda: tap.records("connection"), 5))
        self.assertEqual(peer.accepted, 1)
        return tap.records("connection")[-1]

    def test_broker_that_never_answers_the_handshake(self):
        """Connected, and not a byte back (a hung node, a balancer with no backend behind it): the address is
        unreachable, as one that does not answer the connect, so a name's next address would be tried."""
        rec = self.broker_handshake_timeout(b"")
        self.assertEqual((rec["by"], rec["text"]), ("unreachable", "no answer to the TLS handshake within 500 ms"))

    def test_broker_that_stalls_in_the_handshake(self):
        """The broker answered (here the first 5 bytes of a TLS record, whose body never comes): a TLS failure."""
        rec = self.broker_handshake_timeout(b"\x16\x03\x03\x00\x50")
        self.assertEqual((rec["by"], rec["text"]), ("broker_tls_error", "TLS handshake timed out after 500 ms"))


class Storm(PkiCase):
    def test_reconnect_storm_every_publish_confirmed_and_recorded(self):
        """300 TLS clients connect at once (tests/bench/bench_storm.c), each publishes one mandatory message on a
        confirm channel: every one is confirmed and has exactly one routed+acked record."""
        require_broker(self)
        n = 300
        tap = self.start_tap(["--tls-cert", self.p("server.pem"), "--tls-key", self.p("server.key")])
        r = subprocess.run([STORM, "-T", "-H", "localhost", "-p", str(tap.port), "-C", self.p("ca.pem"), "-c", str(n),
                            "-q", f"amqptap.storm.{time.monotonic_ns()}"], stdout=subprocess.PIPE, timeout=300)
        res = json.loads(r.stdout)
        print(f"storm of {n}: {res}")
        self.assertEqual((r.returncode, res["ok"], res["acked"]), (0, n, n), res)
        self.assertTrue(wait_for(lambda: len(tap.records("publish")) >= n, 10))
        pubs = tap.records("publish")
        self.assertEqual(len(pubs), n)
        self.assertEqual({(p["route"], p["confirm"]) for p in pubs}, {("routed", "ack")})
        self.assertEqual(len({p["conn"] for p in pubs}), n)

class Handshaker(PkiCase):
    """Clients' first handshake steps (the tap's signature) run on the tls-handshaker thread (src/io/tlswork.c)."""

    def test_handshakes_run_on_a_thread_that_yields_to_the_traffic(self):
        """Clients' first handshake steps run on the tls-handshaker thread at nice 5, the loop at the process's
        nice: where both want a CPU, sessions already carrying traffic go first."""
        tap = self.start_tap(["--tls-cert", self.p("server.pem"), "--tls-key", self.p("server.key")])
        nice = 16  # field 19 of proc(5)
        threads = {}
        for tid in os.listdir(f"/proc/{tap.pid}/task"):
            name, fields = proc_stat(f"/proc/{tap.pid}/task/{tid}/stat")
            threads.setdefault(name, []).append(int(fields[nice]))
        self.assertEqual(threads.get("tls-handshaker"), [5], threads)
        self.assertEqual(int(proc_stat(f"/proc/{tap.pid}/stat")[1][nice]), 0)

    def test_stopping_in_a_storm_takes_every_handshake_back(self):
        """SIGTERM (with --grace 0: sessions end at once) while 300 clients' handshakes wait for, run on or come
        back from the handshaker's thread: the tap takes each step back (waiting for a running one), frees
        everything and exits 0 (the ASan tree's leak check included); every publish that got through has one
        record."""
        require_broker(self)
        tap = self.start_tap(["--tls-cert", self.p("server.pem"), "--tls-key", self.p("server.key"), "--grace", "0"])
        storm = subprocess.Popen([STORM, "-T", "-H", "localhost", "-p", str(tap.port), "-C", self.p("ca.pem"),
                                  "-c", "300", "-q", f"amqptap.storm.{time.monotonic_ns()}"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: storm.poll() is None and storm.kill())
        fds = f"/proc/{tap.pid}/fd"
        self.assertTrue(wait_for(lambda: len(os.listdir(fds)) >= 100, 30), "the storm never reached the tap")
        self.assertEqual(tap.stop(), 0, tap.stderr())
        self.assertNotRegex(tap.stderr(), "Sanitizer|runtime error")
        storm.communicate(timeout=60)
        conns = tap.records("connection")
        closed = [c["conn"] for c in conns if c["event"] == "close"]
        opened = {c["conn"] for c in conns if c["event"] == "open"}
        total = int(re.search(r"(\d+) in total", tap.stderr()).group(1))
        self.assertEqual(sorted(closed), list(range(1, total + 1)), "a connection without exactly one close record")
        in_handshake = [c for c in conns if c["event"] == "close" and c["conn"] not in opened]
        print(f"stopped with {total} connections: {len(in_handshake)} still in their handshake")
        self.assertTrue(in_handshake, "no handshake was under way at the stop: the test missed its moment")
        self.assertEqual({c["by"] for c in in_handshake}, {"shutdown"})
        pubs = tap.records("publish")
        self.assertEqual(len({(p["conn"], p["channel"], p["seq"]) for p in pubs}), len(pubs))
        self.assertIn(f"publishes={len(pubs)} ", tap.stderr())

    def test_client_hello_in_two_pieces(self):
        """A ClientHello split across two TCP segments 300 ms apart: the handshaker reads the first piece into the
        leg's own buffer and hands the step back wanting more; the loop finishes the handshake, and the session
        carries AMQP through to the broker."""
        require_broker(self)
        tap = self.start_tap(["--tls-cert", self.p("server.pem"), "--tls-key", self.p("server.key")])
        tls, incoming, outgoing, hello = memory_tls_client(self.p("ca.pem"))
        self.assertGreater(len(hello), 200)
        sock = tap.connect()
        sock.settimeout(5)
        sock.sendall(hello[:100])
        time.sleep(0.3)
        sock.sendall(hello[100:])

        def pump(step):
            while True:
                try:
                    return step()
                except ssl.SSLWantReadError:
                    sock.sendall(outgoing.read())
                    data = sock.recv(65536)
                    self.assertTrue(data, "the tap closed the connection")
                    incoming.write(data)

        pump(tls.do_handshake)
        tls.write(AMQP_091_HEADER)
        sock.sendall(outgoing.read())
        start = pump(lambda: tls.read(65536))
        sock.close()
        self.assertEqual((start[:3], start[7:11]), (b"\x01\x00\x00", b"\x00\x0a\x00\x0a"),
                         "no connection.start from the broker")
        self.assertTrue(wait_for(lambda: tap.records("connection"), 5))


class Resumption(TlsCase):
    """The upstream leg offers the session the broker gave the previous connection (TLS 1.3 ticket or TLS 1.2
    session id): a resumed handshake has no certificate and no signatures on either side, as HAProxy and nginx do
    by default. RabbitMQ gives no TLS 1.3 tickets unless told to, so the broker side here is a TLS front (Python's
    ssl, which issues tickets) relaying to the real broker's plain port; it reports whether each handshake was
    resumed, which the tap cannot fake."""

    def front(self, max_version):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.maximum_version = max_version
        ctx.load_cert_chain(self.p("server.pem"), self.p("server.key"))
        reused = []

        def relay(conn, _idx):
            with ctx.wrap_socket(conn, server_side=True) as tls, \
                    socket.create_connection(("127.0.0.1", PLAIN_PORT)) as broker:
                reused.append(tls.session_reused)
                sel = selectors.DefaultSelector()
                sel.register(tls, selectors.EVENT_READ, broker)
                sel.register(broker, selectors.EVENT_READ, tls)
                while True:
                    for key, _ in sel.select(10):
                        data = key.fileobj.recv(65536)
                        if not data:
                            return
                        key.data.sendall(data)
                        while isinstance(key.fileobj, ssl.SSLSocket) and key.fileobj.pending():
                            key.data.sendall(key.fileobj.recv(65536))

        peer = Peer(relay)
        self.addCleanup(peer.close)
        return peer, reused

    def publish_through(self, tap, reused, n):
        for i in range(n):
            c = pika.BlockingConnection(self.pika_params(tap.port, tls=False))
            ch = c.channel()
            ch.confirm_delivery()
            ch.basic_publish("", f"tls.resume.nowhere.{i}", b"x", pika.BasicProperties(message_id=f"m{i}"))
            c.close()
            self.assertTrue(wait_for(lambda: len(tap.records("publish")) == i + 1, 5))
        self.assertEqual(len(reused), n)
        pubs = tap.records("publish")
        self.assertEqual([(p["message_id"], p["confirm"]) for p in pubs], [(f"m{i}", "ack") for i in range(n)])

    def test_upstream_connections_resume_the_brokers_session(self):
        for version in (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2):
            with self.subTest(version=version.name):
                peer, reused = self.front(version)
                tap = self.start_tap(["--upstream-tls", "--upstream-ca", self.p("ca.pem")], upstream_port=peer.port,
                                     upstream_host="localhost")
                self.publish_through(tap, reused, 3)
                self.assertEqual(reused, [False, True, True])

    def test_no_reuse_option_makes_every_handshake_full(self):
        peer, reused = self.front(ssl.TLSVersion.TLSv1_3)
        tap = self.start_tap(["--upstream-tls", "--upstream-ca", self.p("ca.pem"), "--upstream-no-reuse"],
                             upstream_port=peer.port, upstream_host="localhost")
        self.publish_through(tap, reused, 2)
        self.assertEqual(reused, [False, False])

    def test_clients_resume_their_session_with_the_tap(self):
        """The listener gives clients tickets (TLS 1.3) and session ids (TLS 1.2): a reconnecting client (a broker
        restart's storm) costs no signature, also when the tap wants client certificates (--tls-client-ca)."""
        for mtls in (False, True):
            tap = self.tls_tap(extra=["--tls-client-ca", self.p("ca.pem")] if mtls else [])
            for version in (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2):
                with self.subTest(mtls=mtls, version=version.name):
                    ctx = ssl.create_default_context(cafile=self.p("ca.pem"))
                    ctx.maximum_version = version
                    if mtls:
                        ctx.load_cert_chain(self.p("client.pem"), self.p("client.key"))
                    session = None
                    reused = []
                    for _ in range(2):
                        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", tap.port)),
                                             server_hostname="localhost", session=session) as c:
                            c.sendall(b"AMQP\x00\x00\x09\x01")
                            self.assertTrue(c.recv(7).startswith(b"\x01\x00\x00"))  # the broker's connection.start
                            reused.append(c.session_reused)
                            session = c.session
                    self.assertEqual(reused, [False, True])
            self.assertNotIn("TLS with the client failed", tap.stderr())
            tap.stop()


class KeyLog(TlsCase):
    def test_a_key_log_through_a_symbolic_link_is_refused(self):
        """--keylog names a symbolic link (to a file of someone else's choosing): the tap refuses to start (exit 2, one
        line naming --keylog) rather than make that file 0600 and append TLS secrets to it; the file is unchanged."""
        d = tempfile.mkdtemp(prefix="amqptap-keylog-link-")
        self.addCleanup(shutil.rmtree, d, True)
        target = os.path.join(d, "someone-elses.txt")
        with open(target, "w") as f:
            f.write("theirs\n")
        os.chmod(target, 0o644)
        link = os.path.join(d, "keys.log")
        os.symlink(target, link)
        r = subprocess.run([AMQPTAP_BIN, "--listen", f"127.0.0.1:{free_port()}", "--upstream", f"localhost:{TLS_PORT}",
                            "--tls-cert", self.p("server.pem"), "--tls-key", self.p("server.key"), "--keylog", link],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual(r.returncode, 2, r.stderr)
        lines = r.stderr.splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn(f"--keylog {link}: a symbolic link: refused", lines[0])
        self.assertEqual(stat.S_IMODE(os.stat(target).st_mode), 0o644)
        with open(target) as f:
            self.assertEqual(f.read(), "theirs\n")

    def test_tshark_decrypts_the_client_leg_with_the_key_log(self):
        if not shutil.which("tshark"):
            self.fail("tshark is missing (scripts/test.sh installs it)")
        d = tempfile.mkdtemp(prefix="amqptap-keylog-")
        try:
            keylog = os.path.join(d, "keys.log")
            raw = os.path.join(d, "raw.pcapng")
            tap = self.tls_tap(extra=["--keylog", keylog])
            self.assertEqual(stat.S_IMODE(os.stat(keylog).st_mode), 0o600)
            cap = subprocess.Popen(["tshark", "-q", "-i", "lo", "-f", f"tcp port {tap.port}", "-w", raw],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                self.assertTrue(wait_for(lambda: os.path.exists(raw) and os.path.getsize(raw) > 0, 15),
                                "tshark did not start capturing")
                time.sleep(0.5)
                self.scenarios(self.pika_params(tap.port))
                time.sleep(0.5)
            finally:
                cap.send_signal(signal.SIGINT)
                cap.wait(15)
            out = subprocess.run(["tshark", "-r", raw, "-o", f"tls.keylog_file:{keylog}", "-d",
                                  f"tls.port=={tap.port},amqp", "-Y", "amqp", "-T", "fields", "-E", "occurrence=a",
                                  "-e", "amqp.method.class", "-e", "amqp.method.method"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
            methods = set()
            for line in out.stdout.decode().splitlines():
                classes, ids = (line.split("\t") + [""])[:2]
                methods.update(zip(classes.split(","), ids.split(",")))
            for want in (("10", "11"), ("60", "40"), ("60", "50"), ("60", "80"), ("60", "120")):
                self.assertIn(want, methods, (sorted(methods), out.stderr.decode()[-1000:]))
            with open(keylog) as f:
                lines = f.read().splitlines()
            self.assertTrue(any(l.startswith("CLIENT_TRAFFIC_SECRET_0") or l.startswith("CLIENT_RANDOM")
                                for l in lines), lines[:3])
        finally:
            shutil.rmtree(d, ignore_errors=True)


class KeyLogStuck(PkiCase):
    def test_a_key_log_nobody_reads_delays_no_handshake(self):
        """--keylog on a FIFO whose reader never reads: the pipe fills after a few dozen handshakes. Key lines are
        written by their own thread, so every later client is still served (before, the loop blocked in write()
        and every connection froze), and the lines that could not be written are counted on stderr."""
        require_broker(self)
        d = tempfile.mkdtemp(prefix="amqptap-keylog-fifo-")
        self.addCleanup(shutil.rmtree, d, True)
        fifo = os.path.join(d, "keys.fifo")
        os.mkfifo(fifo, 0o600)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # held open, never read
        self.addCleanup(os.close, reader)
        tap = self.start_tap(["--tls-cert", self.p("server.pem"), "--tls-key", self.p("server.key"),
                              "--keylog", fifo], frames=False)
        ctx = ssl.create_default_context(cafile=self.p("ca.pem"))
        n = 200  # about 1 KB of key lines per TLS 1.3 handshake: three times a 64 KiB pipe
        t0 = time.monotonic()
        for i in range(n):
            with socket.create_connection(("127.0.0.1", tap.port), timeout=5) as raw:
                with ctx.wrap_socket(raw, server_hostname="localhost") as c:
                    c.sendall(b"AMQP\x00\x00\x09\x01")
                    start = c.recv(7)
                    self.assertEqual(start[:3], b"\x01\x00\x00", f"client {i}: no connection.start")
        elapsed = time.monotonic() - t0
        print(f"{n} TLS clients through a stuck key log in {elapsed:.2f} s")
        self.assertEqual(tap.stop(), 0)
        self.assertRegex(tap.stderr(), r"--keylog: \d+ key lines lost")


if __name__ == "__main__":
    main()
