# amqptap sniff (issue 15, src/DESIGN.md §6b): pika publishing straight to the broker while `amqptap sniff -i lo --port
# <broker>` captures gives the records the proxy gives for the same scenarios (src/DESIGN.md §7 3, 6, 1: confirm +
# mandatory routed/returned, missing exchange 404, confirm without mandatory, mandatory without confirm), every
# field but timings, connection ids and client ports (the full §7 set with rabbitmq-c too: test_sniff_scenarios);
# forced kernel drops give capture_drops/capture_gap records and `unknown`, never a wrong verdict; a capture that
# starts mid-connection says the channel modes it did not see are unknown; a missing interface is one line and
# exit 2.

import collections
import datetime
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pika  # noqa: E402
import pika.exceptions  # noqa: E402

from tapharness import (AMQPTAP_BIN, BROKER_PORT, SOURCE_DIR, Tap, TapTestCase, capture_port,  # noqa: E402
                        is_asan_build, main, read_records, replay, require_broker, rss_kb, wait_for)
from scenario_lib import params, props, read_until_progress, stream_publisher  # noqa: E402

PROXY_ONLY = ("upstream_local",)  # the proxy's own end towards the broker: a sniffer has no such leg
VOLATILE = {"ts", "published", "conn", "client", "return_us", "confirm_us", "duration_us", "multiple", "run", "started",
            *PROXY_ONLY}


def scenario(port, tag):
    """Publishes the scenarios on one connection to `port`; returns when the broker answered all."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.confirm_delivery()
    q = f"sniff.{tag}.q"
    ch.queue_declare(q, auto_delete=True)
    x = f"sniff.{tag}.x"
    ch.exchange_declare(x, "direct", auto_delete=True)
    ch.queue_bind(q, x, routing_key="k")
    ch.basic_publish(x, "k", b"routed", props("routed", delivery_mode=2), mandatory=True)
    try:
        ch.basic_publish(x, "nomatch", b"returned", props("returned", delivery_mode=2), mandatory=True)
    except pika.exceptions.UnroutableError:
        pass
    ch.basic_publish(x, "nomatch", b"unproven", props("no-mandatory", delivery_mode=2))
    try:
        ch.basic_publish(f"sniff.{tag}.nope", "k", b"lost", props("missing-exchange", delivery_mode=2),
                         mandatory=True)
    except pika.exceptions.ChannelClosedByBroker:
        pass
    ch2 = conn.channel()
    ch2.basic_publish("", f"sniff.{tag}.none", b"nc", props("no-confirm", delivery_mode=2), mandatory=True)
    ch2.queue_delete(q)
    conn.close()


def normalise(recs, tag):
    out = []
    for r in recs:
        if r["type"] not in ("publish", "warning", "connection", "channel"):
            continue
        r = {k: v for k, v in r.items() if k not in VOLATILE}
        out.append(json.loads(json.dumps(r).replace(tag, "TAG")))
    return out


def syn_frame(i, port):
    """An Ethernet frame (lo's zero addresses) holding a TCP SYN from 10.x.y.z to 10.255.255.254:port, an address
    no host owns: on lo the kernel drops it (not local, no forwarding) and nothing answers."""
    src = bytes([10, (i >> 16) & 255, (i >> 8) & 255, i & 255])
    tcp = struct.pack("!HHIIBBHHH", 1024 + i % 60000, port, i, 0, 5 << 4, 0x02, 65535, 0, 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), i & 0xFFFF, 0, 64, 6, 0, src,
                     bytes([10, 255, 255, 254]))
    return b"\0" * 12 + b"\x08\x00" + ip + tcp


class Sniff(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)

    def sniff(self, *extra, **kw):
        """`amqptap sniff -i lo --port BROKER --return-window 300`, stopped by the test (SIGINT, exit 0)."""
        return self.start_sniff(["--return-window", "300", *extra], **kw)

    def test_same_records_as_the_proxy(self):
        tap = self.start_tap(["--return-window", "300"])
        scenario(tap.port, "p")
        time.sleep(0.5)
        s = self.sniff()
        try:
            scenario(BROKER_PORT, "s")
            time.sleep(0.5)
        finally:
            self.assertEqual(s.stop(timeout=20), 0, s.stderr())
        sniffed = s.records()
        tap_recs = read_records(tap.verdicts)
        want = normalise(tap_recs, "sniff.p.")
        got = normalise(sniffed, "sniff.s.")
        self.assertEqual(got, want)
        routes = {r["message_id"]: (r["route"], r["confirm"]) for r in got if r["type"] == "publish"}
        self.assertEqual(routes, {"routed": ("routed", "ack"), "returned": ("returned", "ack"),
                                  "no-mandatory": ("unproven", "ack"), "missing-exchange": ("unknown", "unknown"),
                                  "no-confirm": ("returned", "none")})
        self.assertFalse([r for r in sniffed if r["type"] == "capture_gap"])

    def test_held_verdicts_are_written_on_a_quiet_connection(self):
        """Verdicts that wait for a window (a plain channel's late-Return window, a mandatory publish's
        --return-window without confirms, an acked mandatory publish's hold for a late Return) are written once the
        window is over while the connection stays open and silent, as the proxy writes them: the capture's clock
        moves on without packets. Heartbeats are off, so nothing else would come."""
        s = self.sniff()
        try:
            conn = pika.BlockingConnection(params(BROKER_PORT))
            plain = conn.channel()
            q = plain.queue_declare("", exclusive=True).method.queue
            plain.basic_publish("", q, b"p", props("plain"))
            plain.basic_publish("", q, b"m", props("mandatory-no-confirm"), mandatory=True)
            confirmed = conn.channel()
            confirmed.confirm_delivery()
            confirmed.basic_publish("", q, b"c", props("acked"), mandatory=True)
            t0 = time.monotonic()

            def routes():
                return {r["message_id"]: (r["route"], r["confirm"]) for r in s.records("publish")}
            self.assertTrue(wait_for(lambda: len(routes()) == 3, 5), routes())
            took = time.monotonic() - t0
            self.assertEqual(routes(), {"plain": ("unproven", "none"), "mandatory-no-confirm": ("unproven", "none"),
                                        "acked": ("routed", "ack")})
            self.assertLess(took, 2.0)  # --return-window 300 ms, plus the capture's lag
            self.assertFalse([r for r in s.records("connection") if r["event"] == "close"])  # still open
            conn.close()
        finally:
            self.assertEqual(s.stop(timeout=20), 0, s.stderr())

    def test_loopback_capture_takes_each_packet_once(self):
        """On lo the kernel hands a packet socket every packet twice, as sent and as received; the sniffer asks it
        (PACKET_IGNORE_OUTGOING) not to queue the sent copy, which libpcap would only throw away after the kernel
        cloned, filtered and copied it in the broker's and the publisher's time. SIGUSR1's line says how many
        packets the kernel queued and how many were captured: without the option the first is about twice the
        second."""
        s = self.sniff()
        try:
            scenario(BROKER_PORT, "once")
            time.sleep(0.3)
            s.proc.send_signal(signal.SIGUSR1)
            self.assertTrue(wait_for(lambda: "packets captured" in s.stderr(), 10))
        finally:
            self.assertEqual(s.stop(timeout=20), 0, s.stderr())
        line = [ln for ln in s.stderr().splitlines() if "packets captured" in ln][0]
        words = line.replace("(", " ").split()
        captured, queued = int(words[words.index("packets") - 1]), int(words[words.index("queued") - 1])
        self.assertGreater(captured, 20, line)
        self.assertLessEqual(queued, captured + 5, line)  # the ring may hold a packet or two not dispatched yet

    def test_forced_loss_gives_gaps_and_unknown_never_a_wrong_verdict(self):
        """Kernel drops made certain: a sniffer with a small --buffer-size (2 MiB) is stopped (SIGSTOP) while two
        rabbitmq-c publishers stream 20,000 of their 60,000 confirmed mandatory publishes (one to a queue: routed,
        one to nothing: returned), so its ring overflows and the kernel drops what follows; it is continued while
        they still publish, so later segments show the holes. A second sniffer with a 128 MiB buffer sees the
        whole run and is the reference. The lossy one must report capture_drops and capture_gap records, write
        `unknown` (by capture_gap) where it cannot know, never a route or confirm the reference contradicts, and a
        record for every basic.publish its --frames trace shows it decoded."""
        if is_asan_build():  # a fresh-clone CI run: the ASan sniffer fell so far behind that it claimed nothing
            self.skipTest("the sanitizer build cannot keep its 2 MiB ring from overflowing before the stop; the "
                          "normal tree runs this test, fuzz_replay and fuzz_capture the same paths under ASan")
        q = f"sniff.loss.{os.getpid()}"
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", BROKER_PORT))
        conn.channel().queue_declare(q, auto_delete=False, arguments={"x-max-length": 1000})
        self.addCleanup(lambda: conn.channel().queue_delete(q) and conn.close())
        # the reference's ring holds the whole run (about 30 MB) even if it is slow to read: it must not drop
        ref = self.sniff("--buffer-size", "131072")
        lossy = self.sniff("--buffer-size", "2048", frames=True)
        pubs = [stream_publisher(BROKER_PORT, 60000, 64, 1000, True, rk) for rk in (q, f"{q}.absent")]
        try:
            self.assertGreaterEqual(read_until_progress(pubs[0], 5000), 5000)
            lossy.proc.send_signal(signal.SIGSTOP)
            self.assertGreaterEqual(read_until_progress(pubs[0], 25000), 25000)
            lossy.proc.send_signal(signal.SIGCONT)
            for p in pubs:
                out, err = p.communicate(timeout=120)
                self.assertEqual(p.returncode, 0, err)
        finally:
            lossy.proc.send_signal(signal.SIGCONT)
        time.sleep(0.5)
        for s in (ref, lossy):
            self.assertEqual(s.stop(timeout=60), 0, s.stderr())
        want = ref.records()
        got = lossy.records()
        frames = lossy.frame_records()
        self.assertEqual([r for r in want if r["type"] in ("capture_gap", "capture_drops")], [],
                         "the reference sniffer lost packets too: the machine is too busy for this test")
        ref_pubs = {(r["routing_key"], r["message_id"]): r for r in want if r["type"] == "publish"}
        self.assertEqual(len(ref_pubs), 120000)
        drops = [r for r in got if r["type"] == "capture_drops"]
        self.assertTrue(drops and sum(r["dropped"] for r in drops) > 1000, drops)
        # a lasting loss is said once a second, not at every 10 ms tick (the last one, at the stop, may be sooner)
        stamps = [datetime.datetime.fromisoformat(r["ts"].replace("Z", "+00:00")) for r in drops[:-1]]
        self.assertTrue(all((b - a).total_seconds() >= 0.99 for a, b in zip(stamps, stamps[1:])), drops)
        gaps = [r for r in got if r["type"] == "capture_gap"]
        self.assertTrue(gaps)
        lossy_pubs = [r for r in got if r["type"] == "publish"]
        unknown = [r for r in lossy_pubs if r["route"] == "unknown" and r["reason"]["by"] == "capture_gap"]
        self.assertTrue(unknown, "no publish was written unknown because of the gap")
        # a connection whose end the kernel dropped too ends with the capture; a publish still waiting for its
        # content header then (the segments after it lost, nothing later of that stream captured to show the hole)
        # ends with it, and says so
        cut_at_end = {r["conn"] for r in got if r["type"] == "connection" and r.get("by") == "capture_end"}
        claims = collections.Counter()
        for r in lossy_pubs:
            if r["route"] in ("routed", "returned"):
                claims[r["route"]] += 1
            if r.get("message_id") is None:  # its content header was lost: nothing may be claimed for it
                by = r["reason"]["by"]
                self.assertEqual((r["route"], r["confirm"]), ("unknown", "unknown"), r)
                self.assertIn(by, ("capture_gap", "capture_end") if r["conn"] in cut_at_end else ("capture_gap",), r)
                continue
            truth = ref_pubs.get((r.get("routing_key"), r.get("message_id")))
            self.assertIsNotNone(truth, r)
            if r["route"] in ("routed", "returned"):
                self.assertEqual((r["route"], r.get("reply_code")), (truth["route"], truth.get("reply_code")), r)
            if r["confirm"] in ("ack", "nack"):
                self.assertEqual(r["confirm"], truth["confirm"], r)
        self.assertTrue(claims, "nothing was claimed before the loss: the test proves nothing")
        decoded = [f for f in frames if f.get("dir") == "c2s" and f.get("method") == "basic.publish"]
        self.assertEqual(len(lossy_pubs), len(decoded), "a decoded basic.publish without its record (or extra)")
        mids = [(r.get("routing_key"), r.get("message_id")) for r in lossy_pubs if r.get("message_id") is not None]
        self.assertEqual(len(mids), len(set(mids)), "a publish written twice")
        print(f"lossy sniffer: {sum(r['dropped'] for r in drops)} packets dropped, {len(gaps)} gaps, "
              f"{len(lossy_pubs)} of 120000 publishes written, {len(unknown)} unknown by capture_gap, {claims}")

    def test_capture_started_mid_connection(self):
        """The sniffer starts after a pika publisher opened its connection and selected confirms on channel 1
        (README, "A capture that starts mid-connection"): channel 1's mode was not seen, so it gets a
        "mode_unknown" channel record and its publishes are written route and confirm `unknown`, seq null,
        {"by": "capture_start"}, never a guessed verdict; channel 2, opened and confirm-selected under the
        sniffer, is decoded in full (routed/ack, returned/ack, seq from 1)."""
        q = f"sniff.mid.{os.getpid()}"
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", BROKER_PORT, heartbeat=0))
        self.addCleanup(lambda: conn.is_open and conn.close())
        ch1 = conn.channel()
        ch1.confirm_delivery()
        ch1.queue_declare(q, auto_delete=True)
        ch1.basic_publish("", q, b"before", props("before"), mandatory=True)
        s = self.sniff()
        try:
            ch1.basic_publish("", q, b"a", props("ch1-routed"), mandatory=True)
            try:
                ch1.basic_publish("", q + ".absent", b"b", props("ch1-returned"), mandatory=True)
            except pika.exceptions.UnroutableError:
                pass
            ch2 = conn.channel()
            ch2.confirm_delivery()
            ch2.basic_publish("", q, b"c", props("ch2-routed"), mandatory=True)
            try:
                ch2.basic_publish("", q + ".absent", b"d", props("ch2-returned"), mandatory=True)
            except pika.exceptions.UnroutableError:
                pass
            conn.close()
            time.sleep(0.5)
        finally:
            self.assertEqual(s.stop(timeout=20), 0, s.stderr())
        recs = s.records()
        pubs = {r["message_id"]: r for r in recs if r["type"] == "publish"}
        self.assertEqual(sorted(pubs), ["ch1-returned", "ch1-routed", "ch2-returned", "ch2-routed"])
        for mid in ("ch1-routed", "ch1-returned"):
            r = pubs[mid]
            self.assertEqual((r["route"], r["confirm"], r["seq"], r["reason"]), ("unknown", "unknown", None,
                                                                                 {"by": "capture_start"}), r)
        self.assertEqual((pubs["ch2-routed"]["route"], pubs["ch2-routed"]["confirm"], pubs["ch2-routed"]["seq"]),
                         ("routed", "ack", 1))
        self.assertEqual((pubs["ch2-returned"]["route"], pubs["ch2-returned"]["confirm"],
                          pubs["ch2-returned"]["seq"]), ("returned", "ack", 2))
        chan = [(r["channel"], r["event"]) for r in recs if r["type"] == "channel"]
        self.assertIn((1, "mode_unknown"), chan)
        self.assertNotIn((2, "mode_unknown"), chan)
        self.assertFalse([r for r in recs if r["type"] == "connection" and r["event"] == "open"], "handshake unseen")
        unmatched = [r for r in recs if r["type"] == "warning" and r.get("rule") == "unmatched_return"]
        self.assertEqual([(r["channel"], r.get("reply_code")) for r in unmatched], [(1, 312)], unmatched)
        self.assertFalse([r for r in recs if r["type"] in ("capture_gap", "capture_drops")])

    def test_syn_flood_beside_an_idle_connection_keeps_its_verdicts(self):
        """70,000 SYNs that are never answered (more than the 65,536 streams the capture follows) arrive on lo while
        a pika connection sits idle between publishes: its later publishes keep their verdicts (routed and returned,
        not unknown/capture_start as when the flood pushed it out), none of the SYNs is a connection, and the flood
        costs the sniffer little memory. The SYNs go from 10.x.y.z to 10.255.255.254 (an address no host owns,
        through an AF_PACKET socket on lo: the kernel drops them, no answer or reset is sent) on the broker's port."""
        s = self.sniff("-v")
        conn = pika.BlockingConnection(params(BROKER_PORT))
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            q = ch.queue_declare("", exclusive=True).method.queue
            ch.basic_publish("", q, b"a", props("before"), mandatory=True)

            def routes():
                return {r["message_id"]: (r["route"], r["confirm"]) for r in s.records("publish")}
            self.assertTrue(wait_for(lambda: "before" in routes(), 5), routes())
            rss_before = rss_kb(s.proc.pid)
            sent = 0
            with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as raw:
                raw.bind(("lo", 0))
                for i in range(70000):
                    raw.send(syn_frame(i, BROKER_PORT))
                    sent += 1
                    if i % 2000 == 1999:
                        time.sleep(0.01)  # the sniffer's ring takes bursts, not all 70,000 at once
            s.proc.send_signal(signal.SIGUSR1)
            self.assertTrue(wait_for(lambda: "packets captured" in s.stderr(), 10))
            line = [ln for ln in s.stderr().splitlines() if "packets captured" in ln][-1]
            captured = int(line.split(" packets captured")[0].split()[-1])
            self.assertGreater(captured, 70000, line)  # the flood was seen, every SYN of it
            self.assertIn("0 dropped by the kernel", line)
            rss_flood = rss_kb(s.proc.pid)
            ch.basic_publish("", q, b"b", props("after-routed"), mandatory=True)
            try:
                ch.basic_publish("", "sniff.flood.none", b"c", props("after-returned"), mandatory=True)
            except pika.exceptions.UnroutableError:
                pass
            ch.basic_publish("", q, b"d", props("after-routed-2"), mandatory=True)
            self.assertTrue(wait_for(lambda: len(routes()) == 4, 5), routes())
            self.assertEqual(routes(), {"before": ("routed", "ack"), "after-routed": ("routed", "ack"),
                                        "after-returned": ("returned", "ack"), "after-routed-2": ("routed", "ack")})
            conns = [r for r in s.records("connection") if r["event"] == "open"]
            self.assertEqual(len(conns), 1, conns)  # no SYN of the flood made a connection
            self.assertFalse([r for r in s.records("connection") if r["event"] == "close"])  # nor ended this one
        finally:
            conn.close()
            self.assertEqual(s.stop(timeout=20), 0, s.stderr())
        if not is_asan_build():  # the sanitizers' shadow memory and redzones are not the tap's
            self.assertLess(rss_flood - rss_before, 48 * 1024, f"{sent} SYNs cost more than ~700 B each")

    def test_missing_interface_is_one_line_and_exit_2(self):
        """A misspelt interface exits 2 with and without privileges (without them libpcap said "permission denied"
        first, exit 1); a real one without CAP_NET_RAW exits 1 and names the capability."""
        unprivileged = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
        probe = subprocess.run(unprivileged + [AMQPTAP_BIN, "--version"], capture_output=True, timeout=20)
        for prefix in ([], unprivileged):
            if prefix and probe.returncode != 0:
                self.skipTest(f"the build cannot be run as nobody here: {probe.stderr.decode().strip()}")
            r = Tap.sniff(iface="nosuch0", ports=(), verdicts=None, prefix=prefix, ready=None,
                          stdout=subprocess.PIPE).finish(timeout=20)
            self.assertEqual(r.returncode, 2, (prefix, r.stderr()))
            self.assertEqual(r.stderr().strip().splitlines(), ["amqptap: --interface nosuch0: no such interface"])
            self.assertEqual(r.output, b"")
        r = Tap.sniff(iface="lo", ports=(), verdicts=None, prefix=unprivileged, ready=None,
                      stdout=subprocess.PIPE).finish(timeout=20)
        self.assertEqual(r.returncode, 1, r.stderr())
        self.assertIn("CAP_NET_RAW", r.stderr())


def v6_free_port():
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.bind(("::1", 0))
        return s.getsockname()[1]


def comparable(recs, drop=("conn",)):
    """Records without process identity, timings and what `drop` names, as sorted JSON texts."""
    out = []
    for r in recs:
        r = {k: v for k, v in r.items() if k not in IDENTITY + PROXY_ONLY + drop and k not in ("ts", "published")
             and not k.endswith("_us") and k != "multiple"}
        out.append(json.dumps(r, sort_keys=True))
    return sorted(out)


IDENTITY = ("run", "tap", "started", "schema")
# A sniffer on both legs of a proxy sees every message twice: on the second leg it is a repeat of the first
TWO_LEGS = ("conn", "upstream", "attempt", "repeat", "previous")


def publish_some(host, port, tag):
    """Confirmed mandatory publishes on one connection: routed, returned, and one without mandatory."""
    conn = pika.BlockingConnection(pika.ConnectionParameters(host, port, heartbeat=0))
    ch = conn.channel()
    ch.confirm_delivery()
    q = f"sniff.{tag}.{os.getpid()}"
    ch.queue_declare(q, auto_delete=True)
    for i in range(5):
        ch.basic_publish("", q, b"x" * i, props(f"{tag}-{i}"), mandatory=True)
    try:
        ch.basic_publish("", q + ".absent", b"r", props(f"{tag}-ret"), mandatory=True)
    except pika.exceptions.UnroutableError:
        pass
    conn.close()


class SniffLinks(TapTestCase):
    """Several --port, IPv6 on lo, the `any` interface (Linux cooked link type), VLAN-tagged Ethernet frames."""

    def setUp(self):
        super().setUp()
        require_broker(self)

    def veth_pair(self, prefix, *link_args):
        """A veth pair NAMEa/NAMEb, up (with link_args), removed after the test; returns NAME. Skips the test
        where one cannot be made (no CAP_NET_ADMIN)."""
        name = f"{prefix}{os.getpid() % 100000}"
        r = subprocess.run(["ip", "link", "add", f"{name}a", "type", "veth", "peer", "name", f"{name}b"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest(f"cannot make a veth pair: {r.stderr.strip()}")
        self.addCleanup(subprocess.run, ["ip", "link", "del", f"{name}a"], capture_output=True)
        for end in "ab":
            subprocess.run(["ip", "link", "set", f"{name}{end}", *link_args, "up"], check=True)
        return name

    def stop_sniff(self, s):
        self.assertEqual(s.stop(timeout=20), 0, s.stderr())
        return s.stderr()

    def test_two_ports_one_of_them_ipv6(self):
        """A tap on [::1]:P in front of the broker; pika connects to it over IPv6. `sniff -i lo --port P --port
        BROKER` sees both legs: the IPv6 one gives exactly the tap's own records (same connection: the client
        address too), the IPv4 one (tap to broker) the same verdicts. With only --port P, only the IPv6 leg."""
        p6 = v6_free_port()
        tap = self.start_tap(["--listen", f"[::1]:{p6}", "--return-window", "300"])
        both = self.start_sniff(["--return-window", "300"], ports=[p6, BROKER_PORT])
        one = self.start_sniff(["--return-window", "300"], ports=[p6])
        publish_some("::1", p6, "v6")
        time.sleep(0.5)
        log = self.stop_sniff(both)
        self.stop_sniff(one)
        both_recs, one_recs = both.records(), one.records()
        self.assertIn(f"tcp port {p6} or tcp port {BROKER_PORT}", log)
        self.assertEqual(tap.stop(), 0)
        tap_recs = read_records(tap.verdicts)
        legs = {}
        for r in both_recs:
            if "client" in r:
                legs.setdefault(r["conn"], r["client"])
        v6 = [c for c, a in legs.items() if a.startswith("[::1]:")]
        v4 = [c for c, a in legs.items() if a.startswith("127.0.0.1:")]
        self.assertEqual((len(v6), len(v4)), (1, 1), legs)
        leg6 = [r for r in both_recs if r.get("conn") == v6[0]]
        leg4 = [r for r in both_recs if r.get("conn") == v4[0]]
        # "upstream" is the far end of the captured leg: the tap's [::1]:P for the sniffer, the broker for the tap
        self.assertEqual(comparable(leg6, TWO_LEGS), comparable(tap_recs, TWO_LEGS))
        self.assertEqual(comparable(one_recs, ("conn", "upstream")), comparable(tap_recs, ("conn", "upstream")))
        self.assertEqual({r["upstream"] for r in leg6 if "upstream" in r}, {f"[::1]:{p6}"})
        verdicts = lambda recs: sorted((r["message_id"], r["route"], r["confirm"], r["seq"])  # noqa: E731
                                       for r in recs if r["type"] == "publish")
        self.assertEqual(verdicts(leg4), verdicts(tap_recs))
        self.assertEqual(len(verdicts(leg4)), 6)
        # the tap's open and close records name its own end towards the broker: the client a sniffer there sees
        for event in ("open", "close"):
            recs = [r for r in tap_recs if r["type"] == "connection" and r["event"] == event]
            self.assertEqual([r["upstream_local"] for r in recs], [legs[v4[0]]], event)

    def test_any_interface_gives_what_lo_gives(self):
        """`-i any` (Linux cooked link type) and `-i lo` (Ethernet) capture the same session at once: the same
        records."""
        anyp = self.start_sniff(iface="any")
        lo = self.start_sniff(iface="lo")
        publish_some("127.0.0.1", BROKER_PORT, "any")
        time.sleep(0.5)
        log = self.stop_sniff(anyp)
        self.stop_sniff(lo)
        any_recs, lo_recs = anyp.records(), lo.records()
        self.assertRegex(log, r"link type LINUX_SLL2?\b")
        self.assertEqual(len([r for r in lo_recs if r["type"] == "publish"]), 6)
        self.assertEqual(comparable(any_recs, drop=()), comparable(lo_recs, drop=()))

    def test_vlan_tagged_frames_live(self):
        """802.1Q-tagged frames of a committed capture sent on one end of a veth pair while `sniff` captures the
        other: the records are those `replay` gives for the untagged capture (the kernel takes the tag off into
        packet metadata; libpcap puts it back; the filter's `vlan` clause matches it). Skipped where veth pairs
        cannot be made (no CAP_NET_ADMIN)."""
        name = self.veth_pair("snv", "mtu", "9000")
        cap = os.path.join(SOURCE_DIR, "captures", "confirm_mandatory.pcapng")
        port = capture_port(cap)
        frames = [vlan_tag(f, 7) for f in ethernet_frames(cap)]
        sniffer = self.start_sniff(["--return-window", "300"], ports=[port], iface=f"{name}b")
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
            s.bind((f"{name}a", 0))
            for f in frames:
                s.send(f)
        time.sleep(0.5)
        self.stop_sniff(sniffer)
        live = sniffer.records()
        rep = replay(cap, port, ["--return-window", "300"])
        self.assertEqual(rep.returncode, 0, rep.stderr())
        want = rep.records()
        self.assertTrue([r for r in want if r["type"] == "publish"])
        self.assertEqual(comparable(live), comparable(want))

    def test_interface_that_goes_away_ends_the_sniffer(self):
        """The interface is deleted while `sniff` captures on it: one line naming it and libpcap's reason, and the
        sniffer ends with exit 1 rather than capture nothing without a word. Skipped where veth pairs cannot be
        made (no CAP_NET_ADMIN)."""
        name = self.veth_pair("sng")
        s = Tap.sniff(iface=f"{name}b")  # it exits 1: not one of the case's sniffers, which must exit 0
        self.addCleanup(s.cleanup)
        subprocess.run(["ip", "link", "del", f"{name}a"], check=True)  # takes its peer with it
        self.assertEqual(s.wait(timeout=10), 1, s.stderr())
        log = s.stderr()
        self.assertRegex(log, rf"amqptap: --interface {name}b: the capture failed: .+")


def ethernet_frames(path):
    """The packets of a little-endian pcapng file whose interface is Ethernet."""
    data, off, out = open(path, "rb").read(), 0, []
    while off < len(data):
        btype, blen = struct.unpack_from("<II", data, off)
        if btype == 1:
            assert struct.unpack_from("<H", data, off + 8)[0] == 1, "not Ethernet"
        if btype == 6:
            caplen = struct.unpack_from("<I", data, off + 20)[0]
            out.append(data[off + 28:off + 28 + caplen])
        off += blen
    return out


def vlan_tag(frame, vid):
    return frame[:12] + struct.pack(">HH", 0x8100, vid) + frame[12:]


if __name__ == "__main__":
    main()
