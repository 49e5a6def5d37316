# Unreachable upstream: the client's connection is closed promptly (within 1 s), stderr says why, and the tap
# keeps serving: once something listens on that port, the next client gets through.

import socket
import time

from tapharness import AMQP_091_HEADER, Peer, TapTestCase, echo_handler, free_port, main, recv_bytes, wait_for


class UnreachableTest(TapTestCase):
    def closed_within(self, sock, limit):
        """Seconds until the tap closes sock (EOF or reset), or None if it stays open past limit."""
        t0 = time.monotonic()
        sock.settimeout(limit)
        try:
            while True:
                if not sock.recv(4096):
                    break
        except ConnectionResetError:
            pass
        except socket.timeout:
            return None
        return time.monotonic() - t0

    def test_closed_promptly_then_recovers(self):
        port = free_port()
        tap = self.start_tap(upstream_port=port)
        c = tap.connect()
        c.sendall(AMQP_091_HEADER)
        took = self.closed_within(c, 1.0)
        c.close()
        self.assertIsNotNone(took, "client connection still open 1 s after the upstream refused")
        print(f"client closed {took * 1000:.1f} ms after connect to an unreachable upstream")
        self.assertTrue(wait_for(lambda: str(port) in tap.stderr(), 2.0),
                        f"stderr does not mention the upstream {port}: {tap.stderr()!r}")
        self.assertTrue(tap.alive())

        # A silent client (sends nothing) is closed as well.
        c = tap.connect()
        self.assertIsNotNone(self.closed_within(c, 1.0), "silent client not closed")
        c.close()

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


if __name__ == "__main__":
    main()
