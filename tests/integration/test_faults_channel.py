# --fault return and return-after-ack against two real client libraries (pika, Go's amqp091-go)
# through the tap to the real broker. Each test asserts that the library reports the fault as it would the real
# thing (pika's UnroutableError, on_return callbacks in frame order; Go's NotifyReturn), that the broker stayed consistent (its queue holds exactly the publishes the records say were
# routed), and that the records name the fault (a `fault` record per act, client_saw and fault on the publish).
# Reuses test_faults.py's FaultTest (its broker queue per test, the tap with rules, the Go client in
# tests/clients/faults). close-channel: pika's ChannelClosedByBroker with the code and text the rule gives, a channel
# number used again while the broker's side is still closing (its channel.open waits for the broker's close-ok), and
# Go's channel NotifyClose followed by a new channel on the same connection.

import os
import sys
import time

import pika
import pika.exceptions

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tapharness import main  # noqa: E402
from test_faults import FaultTest  # noqa: E402

class ChannelFaultTest(FaultTest):
    def settle_all(self, tap):
        """As FaultTest.settle, for connections whose channel numbers are used again (the (conn, channel, seq) of
        a reopened channel's publishes repeat the closed one's): the queue against the records, every publish
        once."""
        tap.stop()
        pubs = [r for r in tap.records("publish") if r["routing_key"] == self.queue]
        faults = tap.records("fault")
        routed = sum(1 for r in pubs if r["route"] == "routed")
        self.assertEqual(self.depth(), routed, f"the queue against the records: {pubs}")
        return pubs, faults

    def pika_events(self, tap, n, body=b"e%d", frame_max=None, bodies=None):
        """pika's asynchronous connection: n mandatory publishes on a confirm channel; the acks, nacks and Returns
        its callbacks heard of, in the order it dispatched them (the order of the frames)."""
        events = []
        state = {}

        def on_open(conn):
            conn.channel(on_open_callback=on_channel)

        def on_channel(ch):
            ch.add_on_return_callback(lambda _ch, method, _props, b: events.append(("return", method.reply_code, b)))
            ch.confirm_delivery(on_confirm, callback=lambda _frame: publish(ch))

        def on_confirm(frame):
            m = frame.method
            events.append((type(m).__name__.lower(), m.delivery_tag, m.multiple))
            if m.delivery_tag == n:
                state["conn"].ioloop.call_later(0.3, state["conn"].close)

        def publish(ch):
            for i in range(1, n + 1):
                ch.basic_publish("", self.queue, bodies[i] if bodies else body % i, mandatory=True)

        params = pika.ConnectionParameters("127.0.0.1", tap.port, **({"frame_max": frame_max} if frame_max else {}))
        conn = pika.SelectConnection(params, on_open_callback=on_open, on_close_callback=lambda c, e: c.ioloop.stop())
        state["conn"] = conn
        conn.ioloop.call_later(10, conn.ioloop.stop)
        conn.ioloop.start()
        return events

    def acked(self, events):
        """The tags the confirms covered, one entry per tag."""
        tags, last = [], 0
        for e in events:
            if e[0] == "ack":
                top = e[1]
                tags += list(range(last + 1, top + 1)) if e[2] else [top]
                last = max(last, top)
        return sorted(set(tags))


class Return(ChannelFaultTest):
    def test_pika_unroutable_error(self):
        tap = self.tap("return:after=1,times=1")
        c, ch = self.pika_channel(tap)
        ch.basic_publish("", self.queue, b"r1", mandatory=True)
        with self.assertRaises(pika.exceptions.UnroutableError) as cm:
            ch.basic_publish("", self.queue, b"r2", mandatory=True)
        returned = cm.exception.messages[0]
        self.assertEqual((returned.method.reply_code, returned.method.reply_text, returned.body),
                         (312, "NO_ROUTE", b"r2"))
        ch.basic_publish("", self.queue, b"r3", mandatory=True)
        c.close()
        pubs, faults = self.settle(tap)
        self.assertEqual(self.depth(), 3, "the broker routed the one the client saw returned")
        self.assertEqual([(f["action"], f["seq"], f.get("skipped")) for f in faults], [("return", 2, None)])
        r2 = [r for r in pubs if r["seq"] == 2][0]
        self.assertEqual((r2["route"], r2["confirm"], r2["client_saw"], r2["fault"]), ("routed", "ack", "return", 1))

    def test_pika_return_body_in_frames(self):
        # frame_max 4096: the first body goes in 5 frames, and its Return carries it whole; the second is over
        # TAP_FAULT_RETURN_CONTENT_MAX (128 KiB): not kept, the client sees its ack alone and the record says why
        tap = self.tap("return")
        bodies = {1: b"x" * 20000 + b"-1", 2: b"y" * 140000 + b"-2"}
        events = self.pika_events(tap, 2, body=b"%d", frame_max=4096, bodies=bodies)
        returns = [e for e in events if e[0] == "return"]
        self.assertEqual([(code, b) for _, code, b in returns], [(312, bodies[1])])
        self.assertEqual(events[0][0], "return", "before the ack")
        self.assertEqual(self.acked(events), [1, 2])
        pubs, faults = self.settle(tap)
        self.assertEqual(self.depth(), 2)
        self.assertEqual([(f["action"], f["seq"], f.get("skipped")) for f in faults],
                         [("return", 1, None), ("return", 2, "too_large")])
        self.assertEqual(self.faulted(pubs, "return"), [1])

    def test_pika_return_then_ack(self):
        tap = self.tap("return:every=2")
        events = self.pika_events(tap, 4)
        returns = [(i, e) for i, e in enumerate(events) if e[0] == "return"]
        self.assertEqual([e[2] for _, e in returns], [b"e2", b"e4"])
        for i, e in returns:  # each Return before the confirm that covers its tag
            tag = int(e[2][1:].decode())
            first_cover = next(j for j, x in enumerate(events) if x[0] == "ack" and (x[1] == tag or (x[2] and x[1] > tag)))
            self.assertLess(i, first_cover, events)
        self.assertEqual(self.acked(events), [1, 2, 3, 4])
        pubs, faults = self.settle(tap)
        self.assertEqual(self.depth(), 4)
        self.assertEqual(self.faulted(pubs, "return"), [2, 4])

    def test_go_notify_return(self):
        tap = self.tap("return:every=2")
        res = self.go(tap, 6, 5000)
        self.assertEqual(sorted(res["returns"]), ["312 fault 2", "312 fault 4", "312 fault 6"])
        self.assertEqual(res["acks"], [1, 2, 3, 4, 5, 6], "the broker's acks still pass")
        pubs, faults = self.settle(tap)
        self.assertEqual(self.depth(), 6)
        self.assertEqual(self.faulted(pubs, "return"), [2, 4, 6])
        self.assertEqual(len([f for f in faults if f["action"] == "return"]), 3)


class ReturnAfterAck(ChannelFaultTest):
    RULE = "return-after-ack:after=1,times=2"

    def test_pika_ack_then_return(self):
        tap = self.tap(self.RULE)
        events = self.pika_events(tap, 4)
        returns = [(i, e) for i, e in enumerate(events) if e[0] == "return"]
        self.assertEqual([e[2] for _, e in returns], [b"e2", b"e3"])
        for i, e in returns:  # a genuine-looking Return after the ack that covered its tag
            tag = int(e[2][1:].decode())
            first_cover = next(j for j, x in enumerate(events) if x[0] == "ack" and (x[1] == tag or (x[2] and x[1] > tag)))
            self.assertGreater(i, first_cover, events)
        self.assertEqual(self.acked(events), [1, 2, 3, 4])
        pubs, faults = self.settle(tap)
        self.assertEqual(self.depth(), 4)
        self.assertEqual(self.faulted(pubs, "ack_then_return"), [2, 3])
        self.assertEqual([(f["action"], f["seq"]) for f in faults], [("return-after-ack", 2), ("return-after-ack", 3)])
        for r in pubs:
            self.assertEqual((r["route"], r["confirm"]), ("routed", "ack"))

    def test_go_notify_return(self):
        tap = self.tap(self.RULE)
        res = self.go(tap, 5, 5000)
        self.assertEqual(sorted(res["returns"]), ["312 fault 2", "312 fault 3"])
        self.assertEqual(res["acks"], [1, 2, 3, 4, 5])
        pubs, faults = self.settle(tap)
        self.assertEqual(self.depth(), 5)
        self.assertEqual(self.faulted(pubs, "ack_then_return"), [2, 3])


class CloseChannel(ChannelFaultTest):
    def closed_channel_checks(self, tap, closed_seq, code, text):
        """The records after a close-channel of publish closed_seq on channel 1 (the first round): the fault record,
        the publish it acted on marked channel_closed, and the queue against the records."""
        pubs, faults = self.settle_all(tap)
        self.assertEqual([(f["action"], f["channel"], f["seq"], f["code"], f["text"]) for f in faults],
                         [("close-channel", 1, closed_seq, code, text)])
        first = [r for r in pubs if r["channel"] == 1 and r["seq"] == closed_seq][0]
        self.assertEqual((first["client_saw"], first["fault"]), ("channel_closed", 1))
        return pubs

    def test_pika_channel_closed_by_broker_and_reopened(self):
        # BlockingConnection: the second publish raises as a broker's close would; the next channel() takes
        # channel number 1 again, and its publishes are confirmed and routed
        tap = self.tap("close-channel:after=1,times=1,code=404,text=gone for testing")
        c, ch = self.pika_channel(tap)
        ch.basic_publish("", self.queue, b"c1", mandatory=True)
        with self.assertRaises(pika.exceptions.ChannelClosedByBroker) as cm:
            ch.basic_publish("", self.queue, b"c2", mandatory=True)
        self.assertEqual((cm.exception.reply_code, cm.exception.reply_text), (404, "gone for testing"))
        ch2 = c.channel()
        self.assertEqual(ch2.channel_number, 1, "pika takes the freed number again")
        ch2.confirm_delivery()
        for i in (3, 4):
            ch2.basic_publish("", self.queue, b"c%d" % i, mandatory=True)
        c.close()
        pubs = self.closed_channel_checks(tap, 2, 404, "gone for testing")
        self.assertEqual(len(pubs), 4, "every publish has its record")
        self.assertEqual(self.depth(), 4, "the broker had publish 2 and confirmed it before its side was closed")
        self.assertEqual(sorted(r["confirm"] for r in pubs), ["ack"] * 4)

    def test_pika_reuses_the_number_while_the_broker_closes(self):
        # SelectConnection: 200 publishes at once, the 4th closed. The close to the broker waits for its confirm of
        # publish 4; what the client sent after it on the channel is dropped (the client was shown the channel
        # closed); its channel.open of number 1 waits for the broker's close-ok, then 200 more are confirmed.
        # (pika cannot reopen a number from inside the channel's own close callback, tap or not: deferred a turn.)
        tap = self.tap("close-channel:after=3,times=1")
        events, state = [], {"round": 0}

        def on_open(conn):
            state["conn"] = conn
            conn.channel(channel_number=1, on_open_callback=on_channel)

        def on_channel(ch):
            events.append(("open", ch.channel_number))
            ch.add_on_close_callback(on_close)
            ch.confirm_delivery(lambda f: events.append(("ack", f.method.delivery_tag, f.method.multiple)),
                                callback=lambda _f: publish(ch))

        def publish(ch):
            for i in range(1, 201):
                ch.basic_publish("", self.queue, b"r%d-%d" % (state["round"], i), mandatory=True)

        def on_close(_ch, reason):
            events.append(("closed", reason.reply_code, reason.reply_text))
            state["round"] += 1
            if state["round"] == 1:
                state["conn"].ioloop.call_later(0, lambda: state["conn"].channel(channel_number=1,
                                                                                 on_open_callback=on_channel))

        def second_round():
            opened = [i for i, e in enumerate(events) if e == ("open", 1)]
            return events[opened[1]:] if len(opened) > 1 else []

        def check():  # every 100 ms: closed once the reopened channel has all its confirms
            if self.acked(second_round()) == list(range(1, 201)):
                state["conn"].close()
            else:
                state["conn"].ioloop.call_later(0.1, check)

        conn = pika.SelectConnection(pika.ConnectionParameters("127.0.0.1", tap.port), on_open_callback=on_open,
                                     on_close_callback=lambda c, e: c.ioloop.stop())
        conn.ioloop.call_later(0.1, check)
        conn.ioloop.call_later(15, conn.ioloop.stop)
        conn.ioloop.start()
        self.assertEqual([e for e in events if e[0] != "ack"][:3],
                         [("open", 1), ("closed", 406, "PRECONDITION_FAILED - amqptap fault injection"), ("open", 1)])
        self.assertEqual(self.acked(second_round()), list(range(1, 201)), "the reopened channel's publishes confirmed")
        pubs = self.closed_channel_checks(tap, 4, 406, "PRECONDITION_FAILED - amqptap fault injection")
        self.assertEqual(len(pubs), 400, "every publish has its record")
        routed = [r for r in pubs if r["route"] == "routed"]
        self.assertEqual(len(routed), 204, "the first round's 4 the broker had, and the second round")
        never = [r for r in pubs if r["route"] == "unknown"]
        self.assertEqual(len(never), 196)
        self.assertEqual({(r.get("client_saw"), r["reason"]["by"]) for r in never}, {("channel_closed", "fault")}, [(r["seq"], r.get("client_saw")) for r in never])
        self.assertEqual(sorted(r["seq"] for r in never), list(range(5, 201)), "seq as the client counted")

    def test_go_notify_close_then_a_new_channel(self):
        tap = self.tap("close-channel:after=2,times=1")
        res = self.go(tap, 10, 3000, env={"FAULTS_REOPEN": "5"})
        self.assertEqual(res["chan_closed"], "406 PRECONDITION_FAILED - amqptap fault injection")
        self.assertEqual(res["reopen_acks"], 5, "the connection goes on: a new channel's publishes are confirmed")
        self.assertTrue(set(res["acks"]) <= {1, 2}, "no confirm for the closed publish or any after it")
        pubs = self.closed_channel_checks(tap, 3, 406, "PRECONDITION_FAILED - amqptap fault injection")
        # the library stops taking publishes once it heard of the close: those it took reached the wire
        self.assertGreaterEqual(res["published"], 3)
        self.assertEqual(len(pubs), res["published"] + 5, "every publish has its record")


if __name__ == "__main__":
    main()
