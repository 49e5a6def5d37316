# Passwords never reach a file (issue 12 §5, src/DESIGN.md §2 and §5), against the real broker through the tap: the AMQP
# 0-8 and 0-9 protocol headers RabbitMQ accepts (decoded, so the session's publishes get their records), a start-ok
# cut before its end octet, AMQPLAIN with two PASSWORD keys, PLAIN from pika, and AMQP 1.0 with a SASL PLAIN
# frame. Each uses its own distinctive password, which must appear in no output: --verdicts, --frames, --pcap (which
# hides all of the SASL response but the user name, as --frames does: an authzid or an extra AMQPLAIN key too).

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pika  # noqa: E402

from scenario_lib import RawClient, broker_sh, direct_connection, params  # noqa: E402
from tapharness import BROKER_PORT, Peer, TapTestCase, echo_handler, main, require_broker, wait_for  # noqa: E402

USER = f"sec-{uuid.uuid4().hex[:6]}"
PASSWORD = f"Sq{uuid.uuid4().hex[:12]}Zx"  # the broker's password for USER


def distinctive(tag):
    """A password no output could hold by chance."""
    return f"{tag}-{uuid.uuid4().hex[:10]}-Pw"


def raw_login(port, header, mechanism, response):
    """Sends header and a start-ok on a raw socket; returns the client (its socket read up to connection.start)
    and the version octets connection.start carried."""
    rc = RawClient.__new__(RawClient)
    rc.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    rc.buf = b""
    rc.sock.sendall(header)
    start = rc.expect(0, 10, 10)
    rc.method(0, 10, 11, rc.table() + rc.short(mechanism) + rc.long(response) + rc.short("en_US"))
    return rc, start[:2]


def plain(user, password):
    return b"\x00" + user.encode() + b"\x00" + password.encode()


def finish_login(rc):
    tune = rc.expect(0, 10, 30)
    channel_max, frame_max = struct.unpack(">HI", tune[:6])
    rc.method(0, 10, 31, struct.pack(">HIH", channel_max, frame_max, 0))
    rc.method(0, 10, 40, rc.short("/") + rc.short("") + b"\x00")
    rc.expect(0, 10, 41)


class SecretsCase(TapTestCase):
    @classmethod
    def setUpClass(cls):
        broker_sh("ctl", "add_user", USER, PASSWORD)
        broker_sh("ctl", "set_permissions", "-p", "/", USER, ".*", ".*", ".*")

    @classmethod
    def tearDownClass(cls):
        broker_sh("ctl", "delete_user", USER)

    def setUp(self):
        super().setUp()
        require_broker(self)
        self.queue = f"sec-q-{uuid.uuid4().hex[:8]}"
        with direct_connection() as conn:
            conn.channel().queue_declare(self.queue, auto_delete=False)
        self.addCleanup(self.delete_queue)

    def delete_queue(self):
        with direct_connection() as conn:
            conn.channel().queue_delete(self.queue)

    def start_tap_with_pcap(self):
        d = tempfile.mkdtemp(prefix="amqptap-sec-")
        self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, "tap.pcapng")
        tap = self.start_tap(["--pcap", path])
        tap.pcap = path
        return tap

    def assert_in_no_output(self, tap, *secrets):
        """After the tap stopped: no form of any secret in the verdicts, the frame trace or the pcap."""
        for name, path in (("verdicts", tap.verdicts), ("frames", tap.frames), ("pcap", tap.pcap)):
            with open(path, "rb") as f:
                data = f.read()
            self.assertGreater(len(data), 0, f"{name} is empty")
            for s in secrets:
                b = s.encode()
                for form in (b, b[3:-3], b.hex().encode(), json.dumps(s)[1:-1].encode()):
                    self.assertFalse(form in data, f"{s!r} appears in {name} ({path}) as {form!r}")

    def assert_response_in_pcap(self, tap, mechanism, masked):
        """The pcap holds the start-ok's response as masked: every byte '*' but the user and what finds it (the
        frame trace hides all but the user too), the same length; tshark still decodes the start-ok there."""
        with open(tap.pcap, "rb") as f:
            data = f.read()
        hidden = RawClient.short(mechanism) + RawClient.long(masked)
        self.assertTrue(hidden in data, f"the {mechanism} response is not {masked!r} in the pcap")
        r = subprocess.run(["tshark", "-r", tap.pcap, "-d", f"tcp.port=={BROKER_PORT},amqp", "-Y",
                            "amqp.method.class == 10 and amqp.method.method == 11", "-T", "fields", "-e",
                            "amqp.method.arguments.mechanism"], capture_output=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertIn(mechanism, r.stdout.decode().split(), r.stdout.decode())

    def amqplain_publish(self, tap, fields, message_id):
        """Logs in through the tap with AMQPLAIN, these (key, string value) fields as its response, and publishes
        one confirmed message; returns the response."""
        resp = b"".join(RawClient.short(k) + b"S" + RawClient.long(v.encode()) for k, v in fields)
        rc, _ = raw_login(tap.port, b"AMQP\x00\x00\x09\x01", "AMQPLAIN", resp)
        finish_login(rc)
        rc.open_confirm_channel(1)
        rc.publish_parts(1, "", self.queue, b"hello", message_id, mandatory=True)
        rc.expect(1, 60, 80)
        rc.close()
        return resp

    def test_a_peer_that_echoes_puts_no_password_in_the_pcap(self):
        """The tap in front of something that is no broker and sends back what it is sent: the client's start-ok
        comes back on the broker-to-client side, whole or cut across segments, and the pcap shows its password on
        neither side (the broker's stream is redacted as the client's until the client has logged in)."""
        peer = Peer(echo_handler)
        self.addCleanup(peer.close)
        secret = distinctive("echoed")
        for split in (None, 40):
            with self.subTest(split=split):
                d = tempfile.mkdtemp(prefix="amqptap-echo-")
                self.addCleanup(shutil.rmtree, d, True)
                pcap = os.path.join(d, "tap.pcapng")
                tap = self.start_tap(["--pcap", pcap], upstream_port=peer.port)
                rc = RawClient.__new__(RawClient)
                rc.buf = b""
                rc.sock = socket.create_connection(("127.0.0.1", tap.port), timeout=10)
                args = struct.pack(">HH", 10, 11) + rc.table() + rc.short("PLAIN") + rc.long(plain(USER, secret)) + \
                    rc.short("en_US")
                start_ok = struct.pack(">BHI", 1, 0, len(args)) + args + b"\xce"
                wire = b"AMQP\x00\x00\x09\x01" + start_ok
                echoed = b""
                for part in ((wire,) if split is None else (wire[:split], wire[split:])):
                    rc.sock.sendall(part)
                    while len(echoed) < wire.index(part) + len(part):
                        echoed += rc.sock.recv(65536)
                self.assertEqual(echoed, wire)  # it did come back whole
                rc.sock.close()
                self.assertTrue(wait_for(lambda: any(r["event"] == "close" for r in tap.records("connection")),
                                         10), tap.records())
                self.assertEqual(tap.stop(), 0, tap.stderr())
                with open(pcap, "rb") as f:
                    data = f.read()
                for form in (secret.encode(), secret.encode()[3:-3]):
                    self.assertNotIn(form, data)

    def test_pcap_hides_all_of_the_response_but_the_user(self):
        """--pcap hides every byte of a start-ok response but the user name (and what finds it), as --frames
        hides all but the user: a PLAIN authzid and an AMQPLAIN key besides LOGIN are the client's secrets too."""
        authzid, token = distinctive("authz"), distinctive("token")
        tap = self.start_tap_with_pcap()
        resp = self.amqplain_publish(tap, (("LOGIN", USER), ("PASSWORD", PASSWORD), ("X-TOKEN", token)), "x-1")
        # PLAIN with an authzid: whatever the broker makes of it, the tap has seen the start-ok
        presp = authzid.encode() + plain(USER, PASSWORD)
        rc, _ = raw_login(tap.port, b"AMQP\x00\x00\x09\x01", "PLAIN", presp)
        try:
            finish_login(rc)
        except (ConnectionError, OSError, AssertionError, struct.error):
            pass
        rc.close()
        wait_for(lambda: tap.records("publish"), 10)
        time.sleep(0.5)
        self.assertEqual(tap.stop(), 0)
        self.assertEqual([p["user"] for p in tap.records("publish")], [USER])
        login = resp[:resp.index(b"\x08PASSWORD")]
        self.assert_response_in_pcap(tap, "AMQPLAIN", login + b"*" * (len(resp) - len(login)))
        masked = b"*" * len(authzid) + b"\x00" + USER.encode() + b"\x00" + b"*" * len(PASSWORD)
        self.assert_response_in_pcap(tap, "PLAIN", masked)
        self.assert_in_no_output(tap, PASSWORD, authzid, token)

    # RabbitMQ maps "AMQP" 1 1 8 0 and 1 1 9 1 to AMQP 0-8 and 1 1 0 9 to 0-9-1 (rabbit_reader handshake/2)
    def test_amqp_0_8_and_0_9_headers_are_decoded(self):
        headers = [(b"AMQP\x01\x01\x08\x00", b"\x08\x00", "0-8 (AMQP 1 1 8 0)"),
                   (b"AMQP\x01\x01\x09\x01", b"\x08\x00", "0-8 (AMQP 1 1 9 1)"),
                   (b"AMQP\x01\x01\x00\x09", b"\x00\x09", "0-9-1 (AMQP 1 1 0 9)")]
        tap = self.start_tap_with_pcap()
        for header, version, _ in headers:
            rc, got = raw_login(tap.port, header, "PLAIN", plain(USER, PASSWORD))
            self.assertEqual(got, version, f"connection.start for {header!r}")
            finish_login(rc)
            rc.method(1, 20, 10, rc.short(""))
            rc.expect(1, 20, 11)
            rc.publish_parts(1, "", self.queue, b"routable", "m-1", mandatory=True)
            rc.publish_parts(1, "", "no-such-queue-" + self.queue, b"lost", "m-2", mandatory=True)
            rc.expect(1, 60, 50)  # basic.return of m-2
            rc.method(1, 20, 40, struct.pack(">H", 200) + rc.short("bye") + struct.pack(">HH", 0, 0))
            rc.expect(1, 20, 41)
            close = (10, 60) if version == b"\x08\x00" else (10, 50)  # 0-8 numbers connection.close 10/60
            rc.method(0, *close, struct.pack(">H", 200) + rc.short("done") + struct.pack(">HH", 0, 0))
            rc.expect(0, close[0], close[1] + 1)
            rc.close()
        wait_for(lambda: len([r for r in tap.records("connection") if r.get("event") == "close"]) >= 3, 10)
        self.assertEqual(tap.stop(), 0)
        self.assertEqual(tap.records("decode_error"), [])
        self.assertEqual(tap.records("blocked"), [])
        pubs = tap.records("publish")
        self.assertEqual(len(pubs), 6, json.dumps(pubs))
        for conn in (1, 2, 3):
            mine = sorted((p for p in pubs if p["conn"] == conn), key=lambda p: p["message_id"])
            self.assertEqual([(p["message_id"], p["route"]) for p in mine], [("m-1", "unproven"), ("m-2", "returned")],
                             json.dumps(mine))
            self.assertTrue(all(p["user"] == USER for p in mine))
        closes = [r for r in tap.records("connection") if r.get("event") == "close"]
        self.assertEqual(sorted((r["conn"], r["by"], r["code"]) for r in closes),
                         [(1, "client", 200), (2, "client", 200), (3, "client", 200)])
        trace = tap.frame_records()
        self.assertEqual([r["protocol"] for r in trace if r["frame"] == "protocol_header"], [h[2] for h in headers])
        closing = [r for r in trace if r.get("method") == "connection.close"]
        self.assertEqual([(r["conn"], r["dir"], r["method_id"]) for r in closing],
                         [(1, "c2s", 60), (2, "c2s", 60), (3, "c2s", 50)])
        self.assert_in_no_output(tap, PASSWORD)

    # the connection ends with all of its start-ok but the end octet (and, again, in the middle of the password)
    def test_start_ok_cut_before_its_end(self):
        tap = self.start_tap_with_pcap()
        secrets = [distinctive("cut-end"), distinctive("cut-mid")]
        for i, secret in enumerate(secrets):
            rc = RawClient.__new__(RawClient)
            rc.sock = socket.create_connection(("127.0.0.1", tap.port), timeout=10)
            rc.buf = b""
            rc.sock.sendall(b"AMQP\x00\x00\x09\x01")
            rc.expect(0, 10, 10)
            args = rc.table() + rc.short("PLAIN") + rc.long(plain(USER, secret)) + rc.short("en_US")
            frame = struct.pack(">BHI", 1, 0, 4 + len(args)) + struct.pack(">HH", 10, 11) + args + b"\xce"
            cut = len(frame) - 1 if i == 0 else frame.index(secret.encode()) + len(secret) - 3
            rc.sock.sendall(frame[:cut])
            time.sleep(0.3)
            rc.close()
        wait_for(lambda: len([r for r in tap.records("connection") if r.get("event") == "close"]) >= 2, 10)
        self.assertEqual(tap.stop(), 0)
        self.assert_in_no_output(tap, *secrets)

    # RabbitMQ reads the first PASSWORD; the tap hides every one, and LOGIN stays the user
    def test_amqplain_with_two_password_keys(self):
        decoy = distinctive("second")
        tap = self.start_tap_with_pcap()
        resp = self.amqplain_publish(tap, (("LOGIN", USER), ("PASSWORD", PASSWORD), ("PASSWORD", decoy)), "a-1")
        wait_for(lambda: tap.records("publish"), 10)
        self.assertEqual(tap.stop(), 0)
        pubs = tap.records("publish")
        self.assertEqual([(p["message_id"], p["route"], p["confirm"], p["user"]) for p in pubs],
                         [("a-1", "routed", "ack", USER)], json.dumps(pubs))
        startoks = [r for r in tap.frame_records() if r.get("method") == "connection.start-ok"]
        self.assertEqual(startoks[0].get("user"), USER)
        self.assertEqual(startoks[0]["args"]["response"], f"<redacted {len(resp)} bytes>")
        login = resp[:resp.index(b"\x08PASSWORD")]
        self.assert_response_in_pcap(tap, "AMQPLAIN", login + b"*" * (len(resp) - len(login)))
        self.assert_in_no_output(tap, PASSWORD, decoy)

    def test_plain_from_pika(self):
        tap = self.start_tap_with_pcap()
        conn = pika.BlockingConnection(params(tap.port, credentials=pika.PlainCredentials(USER, PASSWORD)))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", self.queue, b"hi", pika.BasicProperties(message_id="p-1"), mandatory=True)
        conn.close()
        wait_for(lambda: tap.records("publish"), 10)
        self.assertEqual(tap.stop(), 0)
        pubs = tap.records("publish")
        self.assertEqual([(p["message_id"], p["route"], p["confirm"], p["user"]) for p in pubs],
                         [("p-1", "routed", "ack", USER)])
        self.assert_in_no_output(tap, PASSWORD)

    # AMQP 1.0 with SASL PLAIN sent at once: the tap does not decode it, so none of it reaches a file
    def test_amqp_1_0_sasl_plain(self):
        secret = distinctive("amqp10")
        tap = self.start_tap_with_pcap()
        init = b"\x00\x53\x41\xc0" + bytes([len(secret) + 12, 2]) + b"\xa3\x05PLAIN\xa0" + \
            bytes([len(secret) + 2]) + b"\x00u\x00" + secret.encode()[:len(secret) - 1]
        s = tap.connect()
        s.sendall(b"AMQP\x03\x01\x00\x00" + struct.pack(">IBBH", 8 + len(init), 2, 1, 0) + init)
        try:
            while s.recv(4096):
                pass
        except OSError:
            pass
        s.close()
        wait_for(lambda: tap.records("decode_error"), 10)
        self.assertEqual(tap.stop(), 0)
        errs = tap.records("decode_error")
        self.assertEqual(len(errs), 1, json.dumps(errs))
        self.assertEqual(errs[0]["hex"], "03010000")
        self.assert_in_no_output(tap, secret[:-1])


    def test_decode_errors_show_what_a_frame_is_never_what_it_carries(self):
        """A decode_error record shows the frame's header and a method's class and method ids, no more: an
        update-secret too large for the frame_max (after the login, where the old rule showed 32 bytes: 17 of the
        secret) and a body frame longer than its content header announced (the message body)."""
        secret = distinctive("token") * 9000  # > frame_max (131072)
        body = distinctive("BODY") * 3
        tap = self.start_tap_with_pcap()
        rc = RawClient(tap.port)
        payload = struct.pack(">HH", 10, 70) + rc.long(secret.encode()) + rc.short("refresh")
        rc.frame(1, 0, payload)
        try:
            rc.expect(0, 10, 50)  # the broker's connection.close (frame_error)
        except (ConnectionError, OSError):
            pass
        rc.sock.close()
        rc = RawClient(tap.port)
        rc.method(1, 20, 10, rc.short(""))
        rc.expect(1, 20, 11)
        rc.method(1, 60, 40, struct.pack(">H", 0) + rc.short("") + rc.short(self.queue) + b"\x00")
        rc.frame(2, 1, struct.pack(">HHQH", 60, 0, 5, 0))  # body_size 5, no properties
        rc.frame(3, 1, body.encode())
        try:
            rc.expect(0, 10, 50)
        except (ConnectionError, OSError):
            pass
        rc.sock.close()
        self.assertTrue(wait_for(lambda: len(tap.records("decode_error")) == 2, 10), tap.records("decode_error"))
        self.assertEqual(tap.stop(), 0)
        errs = tap.records("decode_error")
        self.assertEqual(errs[0]["hex"], struct.pack(">BHIHH", 1, 0, len(payload), 10, 70).hex(), errs[0])
        self.assertEqual(errs[1]["hex"], struct.pack(">BHI", 3, 1, len(body)).hex(), errs[1])
        self.assert_in_no_output(tap, secret[:40])
        for path in (tap.verdicts, tap.frames):  # the pcap holds the body: it is the stream
            with open(path, "rb") as f:
                data = f.read()
            for form in (body[:12].encode(), body[:12].encode().hex().encode()):
                self.assertNotIn(form, data, path)


if __name__ == "__main__":
    main()
