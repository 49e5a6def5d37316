# Clients that break the protocol, through the tap to the real broker (RawClient: frames written by hand). A client
# that opens a channel again without waiting for the broker's close-ok to its channel.close: RabbitMQ still sends
# what it owed the old channel, then ends the connection (504 "second 'channel.open' seen") or, had it finished the
# close first, opens the new one. The old channel's acks must never be taken for the new channel's publishes: the
# new publish is never `routed`/`ack` unless the broker opened its channel and acked it, and every publish has one
# record.

import os
import struct
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pika  # noqa: E402

from scenario_lib import RawClient, params, publish_records  # noqa: E402
from tapharness import BROKER_PORT, TapTestCase, main, require_broker  # noqa: E402


class EarlyReopen(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)
        self.queue = f"misuse-{uuid.uuid4().hex[:8]}"
        admin = pika.BlockingConnection(params(BROKER_PORT))
        self.addCleanup(admin.close)
        admin.channel().queue_declare(self.queue, auto_delete=False)
        self.addCleanup(lambda: pika.BlockingConnection(params(BROKER_PORT)).channel().queue_delete(self.queue))

    def round(self, tap, old):
        """One connection: `old` publishes on confirm channel 1, then channel.close and at once channel.open,
        confirm.select and one publish on the same number. Returns (how the broker ended it, the old publishes' seqs
        it acked before it answered the new open)."""
        c = RawClient(tap.port)
        c.open_confirm_channel(1)
        for i in range(old):
            c.publish_parts(1, "", self.queue, b"old", f"old-{i}")
        c.method(1, 20, 40, struct.pack(">H", 200) + c.short("bye") + struct.pack(">HH", 0, 0))
        c.method(1, 20, 10, c.short(""))
        c.method(1, 85, 10, b"\x00")
        c.publish_parts(1, "", self.queue, b"new", "new")
        close, reopened, acked = None, False, set()
        while close is None:
            ftype, ch, payload = c.read_frame()
            if ftype != 1:
                continue
            cm = struct.unpack(">HH", payload[:4])
            if cm == (10, 50):  # connection.close: the broker would not take the new open
                close = struct.unpack(">H", payload[4:6])[0]
                c.method(0, 10, 51)
            elif cm == (20, 11):  # channel.open-ok: it had finished the close and took it
                reopened = True
            elif cm == (60, 80) and not reopened:  # basic.ack of old publishes
                tag, multiple = struct.unpack(">QB", payload[4:13])
                acked |= set(range(1, tag + 1)) if multiple & 1 else {tag}
            elif cm == (60, 80):  # the new publish's ack: end cleanly
                c.method(0, 10, 50, struct.pack(">H", 200) + c.short("bye") + struct.pack(">HH", 0, 0))
                c.expect(0, 10, 51)
                close = 200
        c.close()
        return close, acked

    def test_reopen_before_close_ok(self):
        tap = self.start_tap(frames=False)
        old, rounds = 200, []
        # until the broker acked some old publishes after the tap saw the new open (it does in most rounds)
        while len(rounds) < 20 and not any(close == 504 and acked for close, acked in rounds):
            rounds.append(self.round(tap, old))
        self.assertEqual(tap.stop(), 0, tap.stderr())
        recs = publish_records(tap.verdicts)
        self.assertEqual(len(recs), (old + 1) * len(rounds), "one record per publish")
        print(f"{len(rounds)} rounds: " + ", ".join(f"{close} with {len(acked)} acked" for close, acked in rounds))
        self.assertTrue(any(close == 504 and acked for close, acked in rounds), "no round exercised the case")
        for conn, (close, acked) in enumerate(rounds, 1):
            by_id = {r["message_id"]: r for r in recs if r["conn"] == conn}
            self.assertEqual(sorted(by_id), sorted([f"old-{i}" for i in range(old)] + ["new"]))
            new = by_id["new"]
            if close == 504:  # the broker never opened the new channel: nothing it sent was for the new publish
                self.assertEqual(new["route"], "unknown", new)
                self.assertNotIn(new["confirm"], ("ack", "nack"), new)
                self.assertEqual((new["reason"]["by"], new["reason"]["code"]), ("broker", 504), new)
            # the acks the broker sent before it answered the new open are the old publishes'
            for i in range(old):
                r = by_id[f"old-{i}"]
                self.assertEqual(r["confirm"], "ack" if i + 1 in acked else "unknown", r)


if __name__ == "__main__":
    main()
