# Streaming confirms and connections that die with publishes in flight (src/DESIGN.md §7 scenarios 8 and 9), driven by the
# rabbitmq-c client tests/clients/stream_publisher: every seq gets exactly one `publish` record, multiple=true acks
# cover ranges, and when the client, the broker process or the broker application goes away, every publish the tap
# saw on the wire (counted from the --frames trace) is written once, the unanswered ones as `unknown`.

import json
import signal
import statistics
import sys
import time

from tapharness import main, wait_for
from scenario_lib import (RawClient, ScenarioCase, broker_sh, confirmed_tags, final_line, frame_lines,
                          read_until_progress, stream_publisher, traced_confirms, traced_publishes)


def note(msg):
    sys.stderr.write(f"  [{msg}]\n")


class StreamingCase(ScenarioCase):
    def check_stream(self, tap, recs, allowed_unknown_by):
        """The invariant against the frame trace for one publisher connection on channel 1, and that each record is
        either an ack the trace carries or an `unknown` with a reason in allowed_unknown_by. Returns the records
        split into (acked, unknown)."""
        frames = frame_lines(tap.frames)
        pubs = traced_publishes(frames)
        self.assertEqual(len({c for c, _ in pubs}), 1, "expected one publisher connection")
        conn = pubs[0][0]
        self.assertEqual({ch for _, ch in pubs}, {1})
        n = len(pubs)
        self.assertGreater(n, 0)
        self.assertEqual(len(recs), n, "publish records differ from basic.publish frames in the trace")
        self.assertSeqsOnce(recs, n)
        for r in recs:
            if r["message_id"] is None:
                # the connection died between this basic.publish and its content header: the record
                # exists (the client sent the publish) but its properties and size never crossed the wire
                self.assertEqual((r["route"], r["confirm"], r["body_size"]), ("unknown", "unknown", None), r)
                self.assertEqual(r["seq"], n, "only the last publish can be cut before its header")
                continue
            self.assertEqual(r["message_id"], f"s-{r['seq']}", r)
        wire = confirmed_tags(traced_confirms(frames)[(conn, 1)], n)
        acked, unknown = [], []
        for r in recs:
            if r["confirm"] == "ack":
                self.assertEqual(wire.get(r["seq"]), "ack", f"record claims an ack the wire did not carry: {r}")
                self.assertRecord(r, route="routed")
                acked.append(r)
            else:
                self.assertRecord(r, route="unknown", confirm="unknown")
                self.assertIn(r["reason"]["by"], allowed_unknown_by, r)
                unknown.append(r)
        return acked, unknown


class StreamingConfirms(StreamingCase):
    def test_8_streaming_confirms(self):
        tap = self.start_tap()
        q = self.declare_queue("stream")
        n = 20000
        pub = stream_publisher(tap.port, n, 64, 1000, True, q)
        out, err = pub.communicate(timeout=120)
        self.assertEqual(pub.returncode, 0, err.decode())
        res = final_line(out)
        self.assertEqual((res["sent"], res["acked"], res["nacked"], res["returned"]), (n, n, 0, 0), res)
        self.assertGreater(res["multiple_acks"], 0, "the broker sent no multiple=true ack: scenario not exercised")
        recs = self.stop_tap(tap)
        acked, unknown = self.check_stream(tap, recs, ())
        self.assertEqual((len(acked), len(unknown)), (n, 0))
        multi = [r for r in recs if r["multiple"] is True]
        self.assertGreater(len(multi), 0, "no record shows \"multiple\": true")
        frames = frame_lines(tap.frames)
        wire_multi = sum(1 for m, _t, mult in traced_confirms(frames)[(recs[0]["conn"], 1)] if mult)
        self.assertGreaterEqual(len(multi), wire_multi, "each multiple ack on the wire covers at least one record")
        tap_p50 = statistics.median(r["confirm_us"] for r in recs)
        note(f"client p50 {res['p50_us']} us p99 {res['p99_us']} us; tap confirm_us median {tap_p50} us; "
             f"{res['multiple_acks']} multiple acks, {len(multi)} records with multiple=true")
        self.assertLessEqual(tap_p50, res["p50_us"], "the tap measured a longer confirm latency than the client")


class ConnectionDies(StreamingCase):
    def test_9a_client_killed(self):
        tap = self.start_tap()
        q = self.declare_queue("stream")
        pub = stream_publisher(tap.port, 10_000_000, 64, 1000, True, q)
        got = read_until_progress(pub, 5000)
        pub.send_signal(signal.SIGKILL)
        pub.communicate(timeout=30)
        self.assertGreaterEqual(got, 5000, "publisher did not reach 5000 confirms")
        self.assertTrue(wait_for(lambda: tap.records("connection")[-1:] and
                                 tap.records("connection")[-1].get("event") == "close", 20),
                        "the tap wrote no connection close after the client died")
        recs = self.stop_tap(tap)
        acked, unknown = self.check_stream(tap, recs, ("client_eof", "client_reset"))
        self.assertGreaterEqual(len(acked), got)
        note(f"client killed: {len(recs)} publishes seen, {len(acked)} acked, {len(unknown)} unknown, reasons "
             f"{sorted({json.dumps(r['reason']) for r in unknown})}")

    def test_9b_broker_killed(self):
        tap = self.start_tap()
        q = self.declare_queue("stream")
        pub = stream_publisher(tap.port, 10_000_000, 64, 2000, True, q)
        try:
            got = read_until_progress(pub, 5000)
            broker_sh("kill")
            out, err = pub.communicate(timeout=60)
        finally:
            if pub.poll() is None:
                pub.kill()
                pub.communicate()
            broker_sh("start")
        self.assertGreaterEqual(got, 5000)
        self.assertNotEqual(pub.returncode, 0, "the publisher did not notice the broker died")
        self.assertIn("error", final_line(out), out[-400:])
        recs = self.stop_tap(tap)
        acked, unknown = self.check_stream(tap, recs, ("broker_eof", "broker_reset"))
        note(f"broker killed: {len(recs)} publishes seen, {len(acked)} acked, {len(unknown)} unknown, reasons "
             f"{sorted({json.dumps(r['reason']) for r in unknown})}")
        self.assertGreater(len(unknown), 0, "nothing was in flight when the broker died: scenario not exercised")

    def test_9c_broker_app_restarted(self):
        tap = self.start_tap()
        q = self.declare_queue("stream")
        pub = stream_publisher(tap.port, 10_000_000, 1024, 5000, True, q)
        try:
            got = read_until_progress(pub, 5000)
            t0 = time.monotonic()
            broker_sh("ctl", "stop_app")
            out, err = pub.communicate(timeout=60)
            stop_s = time.monotonic() - t0
        finally:
            if pub.poll() is None:
                pub.kill()
                pub.communicate()
            broker_sh("ctl", "start_app")
            broker_sh("ctl", "await_startup")
        self.assertGreaterEqual(got, 5000)
        # the client may see the connection.close or only the socket closing, depending on where it was blocked
        self.assertIn("error", final_line(out), out[-400:])
        recs = self.stop_tap(tap)
        closes = [c for c in tap.records("connection") if c.get("event") == "close"]
        self.assertEqual(len(closes), 1)
        # The broker sends connection.close 320 and then closes; when the tap is slow (ASan) the broker may reset
        # the socket first. The record must say 320 exactly when the close reached the wire (the trace has it).
        broker_close = any(f.get("dir") == "s2c" and f.get("method") == "connection.close"
                           for f in frame_lines(tap.frames))
        if broker_close:
            self.assertRecord(closes[0], by="broker", code=320)
            acked, unknown = self.check_stream(tap, recs, ("broker",))
            for r in unknown:
                self.assertEqual(r["reason"]["code"], 320, r)
                self.assertTrue(r["reason"]["text"].startswith("CONNECTION_FORCED"), r)
        else:
            self.assertIn(closes[0]["by"], ("broker_reset", "broker_eof"), closes[0])
            acked, unknown = self.check_stream(tap, recs, ("broker_reset", "broker_eof"))
        note(f"broker app stopped ({stop_s:.1f} s): {len(recs)} publishes seen, {len(acked)} acked, "
             f"{len(unknown)} unknown")

    def test_9d_connection_ends_inside_a_message(self):
        """The client goes away after a basic.publish and part of its content: the tap saw the basic.publish, so
        it owes one record for it (the invariant counts basic.publish methods), route/confirm unknown."""
        tap = self.start_tap()
        q = self.declare_queue("q")
        for cut, body_sent in (("no-body", 0), ("half-body", 5)):
            c = RawClient(tap.port)
            c.open_confirm_channel(1)
            c.publish_parts(1, "", q, b"0123456789", f"{cut}-whole")
            c.expect(1, 60, 80)  # its basic.ack
            c.publish_parts(1, "", q, b"0123456789", f"{cut}-cut", body_sent=body_sent)
            c.close()
        self.assertTrue(wait_for(lambda: len([r for r in tap.records("connection") if r.get("event") == "close"])
                                 == 2, 10), "the tap did not end both connections")
        recs = self.stop_tap(tap)
        pubs = traced_publishes(frame_lines(tap.frames))
        self.assertEqual(len(pubs), 4)
        self.assertOnePerPublish(recs, ["no-body-whole", "no-body-cut", "half-body-whole", "half-body-cut"])
        by_mid = {r["message_id"]: r for r in recs}
        for cut in ("no-body", "half-body"):
            self.assertRecord(by_mid[f"{cut}-whole"], seq=1, route="routed", confirm="ack")
            r = by_mid[f"{cut}-cut"]
            self.assertRecord(r, seq=2, route="unknown", confirm="unknown", body_size=10)
            self.assertIn(r["reason"]["by"], ("client_eof", "client_reset"), r)

    def test_9d_plain_channel_ends_inside_a_message(self):
        """The same on channels without confirms, mandatory or not: a finished publish there is held for a late
        Return and then written unproven, but one whose content never finished never reached a queue (RabbitMQ drops
        a partial message): unknown, with how the connection ended, never unproven."""
        tap = self.start_tap()
        q = self.declare_queue("q")
        for mandatory in (False, True):
            c = RawClient(tap.port)
            c.method(1, 20, 10, c.short(""))
            c.expect(1, 20, 11)
            c.publish_parts(1, "", q, b"0123456789", f"m{int(mandatory)}-cut", mandatory=mandatory, body_sent=5)
            c.close()
        self.assertTrue(wait_for(lambda: len([r for r in tap.records("connection") if r.get("event") == "close"])
                                 == 2, 10), "the tap did not end both connections")
        recs = self.stop_tap(tap)
        self.assertOnePerPublish(recs, ["m0-cut", "m1-cut"])
        for r in recs:
            self.assertRecord(r, route="unknown", confirm="none", body_size=10)
            self.assertIn(r["reason"]["by"], ("client_eof", "client_reset"), r)


if __name__ == "__main__":
    main()
