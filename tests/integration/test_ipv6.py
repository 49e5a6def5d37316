# IPv6 on both legs: a tap listening on [::1] in front of an IPv6 stand-in peer relays bytes unchanged, and a
# real pika session over IPv6 to a tap in front of the broker gets its verdicts with the client's IPv6 address;
# its --pcap holds IPv6 packets that replay to the same records.

import hashlib
import os
import shutil
import socket
import tempfile
import threading

import pika

from tapharness import (BROKER_PORT, TapTestCase, free_port, main, read_records, replay, require_broker,
                        without_identity)


def v6_free_port():
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.bind(("::1", 0))
        return s.getsockname()[1]


class Ipv6(TapTestCase):
    def test_bytes_unchanged_over_ipv6_legs(self):
        srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        srv.bind(("::1", 0))
        srv.listen(1)
        peer_port = srv.getsockname()[1]

        def echo():
            c, _ = srv.accept()
            with c:
                while True:
                    d = c.recv(65536)
                    if not d:
                        break
                    c.sendall(d)

        t = threading.Thread(target=echo, daemon=True)
        t.start()
        port = v6_free_port()
        tap = self.start_tap(["--listen", f"[::1]:{port}", "--upstream", f"[::1]:{peer_port}"], upstream_port=1)
        data = os.urandom(3 * 1024 * 1024)
        c = socket.create_connection(("::1", port), timeout=10)
        sender = threading.Thread(target=lambda: (c.sendall(data), c.shutdown(socket.SHUT_WR)))
        sender.start()
        got = bytearray()
        while True:
            d = c.recv(1 << 20)
            if not d:
                break
            got += d
        sender.join()
        c.close()
        srv.close()
        self.assertEqual(hashlib.sha256(got).digest(), hashlib.sha256(data).digest())
        self.assertTrue(tap.alive())

    def test_pika_over_ipv6_verdicts_and_pcap(self):
        require_broker(self)
        d = tempfile.mkdtemp(prefix="amqptap-v6-")
        self.addCleanup(shutil.rmtree, d, True)
        pcap = os.path.join(d, "v6.pcapng")
        port = v6_free_port()
        tap = self.start_tap(["--listen", f"[::1]:{port}", "--pcap", pcap])
        conn = pika.BlockingConnection(pika.ConnectionParameters("::1", port))
        ch = conn.channel()
        ch.confirm_delivery()
        q = f"v6.{os.getpid()}"
        ch.queue_declare(q, auto_delete=True)
        for i in range(3):
            ch.basic_publish("", q, b"v6", pika.BasicProperties(message_id=f"v6-{i}"), mandatory=True)
        conn.close()
        self.assertEqual(tap.stop(), 0)
        recs = tap.records("publish")
        self.assertEqual([(r["message_id"], r["route"], r["confirm"]) for r in recs],
                         [(f"v6-{i}", "routed", "ack") for i in range(3)])
        self.assertTrue(recs[0]["client"].startswith("[::1]:"), recs[0])
        out = os.path.join(d, "replay.jsonl")
        r = replay(pcap, BROKER_PORT, verdicts=out, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr())
        # replay writes no process identity: its records are the same on every run
        self.assertEqual([x for x in read_records(out) if x["type"] == "publish"], without_identity(self, recs))


    def test_ipv4_through_dual_stack_sockets_is_named_as_ipv4(self):
        """A tap listening on [::] (dual-stack) reached over IPv4, and forwarding to [::ffff:127.0.0.1]: its records
        name the client, the broker and its own end towards the broker as the IPv4 addresses a sniffer and the
        broker see (they were IPv4-mapped IPv6 ones, [::ffff:127.0.0.1]:P, which match nothing there)."""
        require_broker(self)
        port = free_port()
        tap = self.start_tap(["--listen", f"[::]:{port}"], upstream_host="[::ffff:127.0.0.1]")
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        local = conn._impl._transport._sock.getsockname()[1]
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", f"dual.{os.getpid()}", b"x", pika.BasicProperties(message_id="d1"))
        conn.close()
        self.assertEqual(tap.stop(), 0)
        opened = [r for r in tap.records("connection") if r["event"] == "open"]
        self.assertEqual(len(opened), 1, opened)
        self.assertEqual(opened[0]["client"], f"127.0.0.1:{local}")
        self.assertEqual(opened[0]["upstream"], f"127.0.0.1:{BROKER_PORT}")
        self.assertRegex(opened[0]["upstream_local"], r"^127\.0\.0\.1:\d+$")
        self.assertEqual(tap.records("publish")[0]["client"], f"127.0.0.1:{local}")


if __name__ == "__main__":
    main()
