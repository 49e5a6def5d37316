# Captures and replay (src/DESIGN.md §6): the committed captures/ replay to their expected records byte for byte; a live
# pika session's --pcap replays to the live records, timestamps and latencies included; tshark decodes every AMQP
# frame of a --pcap file exactly as the tap's --frames saw it; a dumpcap recording of pika talking straight to the
# broker replays with the right verdicts; corrupt and truncated captures fail cleanly with the records before the
# fault.

import collections
import glob
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pika  # noqa: E402
import pika.exceptions  # noqa: E402

from capture_scenarios import Admin  # noqa: E402
from scenario_lib import RawClient, params, text_props  # noqa: E402
from scenario_table import RecordFile, scenarios  # noqa: E402
from tapharness import (BROKER_PORT, SOURCE_DIR, TapTestCase, capture_port, is_asan_build, main,  # noqa: E402
                        read_records, replay, require_broker, wait_for, without_identity)

CAPTURES = os.path.join(SOURCE_DIR, "captures")
FRAME_TYPES = {"method": 1, "header": 2, "body": 3, "heartbeat": 8}


def capture_files():
    return sorted(glob.glob(os.path.join(CAPTURES, "*.pcapng")))


def pcapng_blocks(data):
    """(offset, length) of every pcapng block (little-endian files, as the tap writes them)."""
    out = []
    off = 0
    while off + 12 <= len(data):
        _, length = struct.unpack_from("<II", data, off)
        out.append((off, length))
        off += length
    return out


def tap_frames_by_stream(frames, verdicts):
    """{(client_port, "c2s"|"s2c"): [(type, channel, class, method)]} from a --frames trace; conn ids are mapped to
    client ports through the `connection` open records."""
    port_of = {r["conn"]: int(r["client"].rsplit(":", 1)[1]) for r in verdicts
               if r.get("type") == "connection" and r.get("event") == "open"}
    out = collections.defaultdict(list)
    for f in frames:
        key = (port_of.get(f["conn"], -f["conn"]), f["dir"])
        if f["frame"] == "protocol_header":
            continue  # tshark 4.0 labels that packet "AMQP (unknown version)" without a tree: not a frame
        if f["frame"] == "method":
            out[key].append((1, f["channel"], f["class_id"], f["method_id"]))
        else:
            out[key].append((FRAME_TYPES[f["frame"]], f["channel"]))
    return out


def tshark_frames_by_stream(cap, port):
    """The same shape from tshark's own AMQP dissector (PDML: one <proto name="amqp"> per decoded frame)."""
    r = subprocess.run(["tshark", "-r", cap, "-d", f"tcp.port=={port},amqp", "-T", "pdml"], stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    if r.returncode != 0:
        raise AssertionError(f"tshark failed: {r.stderr.decode()[-2000:]}")
    out = collections.defaultdict(list)
    for packet in ET.fromstring(r.stdout).iter("packet"):
        protos = {p.get("name"): p for p in packet.findall("proto")}
        tcp = protos.get("tcp")
        if tcp is None:
            continue
        fields = {f.get("name"): f.get("show") for f in tcp.iter("field")}
        sport, dport = int(fields["tcp.srcport"]), int(fields["tcp.dstport"])
        key = (sport, "c2s") if dport == port else (dport, "s2c")
        for p in packet.findall("proto"):
            if p.get("name") != "amqp":
                continue
            af = {}
            for f in p.iter("field"):
                af.setdefault(f.get("name"), f.get("show"))
            if af.get("amqp.type") == "1":
                out[key].append((1, int(af["amqp.channel"]), int(af["amqp.method.class"]),
                                 int(af["amqp.method.method"])))
            elif "amqp.type" in af:
                out[key].append((int(af["amqp.type"]), int(af["amqp.channel"])))
            else:
                out[key].append(("undecoded", p.get("showname")))
    return out


def publish_mix(c, ch, tag, routed, full, unroutable, bodies):
    """On ch (confirm mode) of connection c: a confirm + mandatory publish routed to queue `routed` (left out when
    None) and one returned from `unroutable`, one that fits `full` (max length 1, reject-publish) and one nacked;
    then on a new plain channel a mandatory publish returned. Message ids are TAG-routed etc; bodies, one each."""
    if routed:
        ch.basic_publish("", routed, bodies[0], text_props(f"{tag}-routed"), mandatory=True)
    try:
        ch.basic_publish("", unroutable, bodies[1], text_props(f"{tag}-returned"), mandatory=True)
    except pika.exceptions.UnroutableError:
        pass
    ch.basic_publish("", full, bodies[2], text_props(f"{tag}-fits"))
    try:
        ch.basic_publish("", full, bodies[3], text_props(f"{tag}-nack"))
    except pika.exceptions.NackError:
        pass
    nc = c.channel()
    nc.basic_publish("", unroutable, bodies[4], text_props(f"{tag}-nc-returned"), mandatory=True)
    c.process_data_events(0.2)


class GoldenCaptures(unittest.TestCase):
    """Every committed capture replays to exactly its committed records."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="amqptap-golden-")
        self.addCleanup(shutil.rmtree, self.dir)

    def test_captures_exist_and_are_small(self):
        caps = capture_files()
        self.assertGreaterEqual(len(caps), 10, "captures/ is missing recordings")
        total = 0
        for cap in caps:
            size = os.path.getsize(cap)
            self.assertLess(size, 1 << 20, cap)
            total += size
            self.assertTrue(os.path.exists(cap[:-7] + ".verdicts.jsonl"), cap)
            capture_port(cap)
        self.assertLess(total, 3 << 20)

    def test_replay_equals_golden(self):
        for cap in capture_files():
            name = os.path.basename(cap)[:-7]
            with self.subTest(capture=name):
                out = os.path.join(self.dir, name + ".jsonl")
                frames = os.path.join(self.dir, name + ".frames.jsonl")
                r = replay(cap, capture_port(cap), verdicts=out, frames=frames)
                self.assertEqual(r.returncode, 0, r.stderr())
                with open(out, "rb") as a, open(cap[:-7] + ".verdicts.jsonl", "rb") as b:
                    got, want = a.read(), b.read()
                if got != want:
                    ga, wa = got.decode().splitlines(), want.decode().splitlines()
                    first = next((i for i, (x, y) in enumerate(zip(ga, wa)) if x != y), min(len(ga), len(wa)))
                    self.fail(f"{name}: line {first + 1} differs:\n got {ga[first:first + 1]}\nwant "
                              f"{wa[first:first + 1]} ({len(ga)} vs {len(wa)} lines)")
                # the invariant holds in every capture: one publish record per basic.publish on the wire
                pubs = sum(1 for f in read_records(frames) if f.get("method") == "basic.publish")
                recs = sum(1 for r in read_records(out) if r["type"] == "publish")
                self.assertEqual(recs, pubs)
                self.assertGreater(recs, 0)
                # and one delivery record per basic.deliver or basic.get-ok
                dlvs = sum(1 for f in read_records(frames) if f.get("method") in ("basic.deliver", "basic.get-ok"))
                self.assertEqual(sum(1 for r in read_records(out) if r["type"] == "delivery"), dlvs)

    def test_scenario_shapes(self):
        """The recorded verdicts show what each capture is for (a re-recording must keep them): the expectations
        of its entry in scenario_table."""
        for s in scenarios("capture"):
            with self.subTest(capture=s.name):
                s.expect(self, RecordFile(os.path.join(CAPTURES, s.name + ".verdicts.jsonl")), None)


class LiveEqualsReplay(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)
        self.adm = Admin()
        self.addCleanup(self.adm.close)

    def session(self, port, timers=True):
        """A mixed pika session over two connections: confirm + mandatory returned, confirm without mandatory,
        a nack, a non-confirm return, a tx channel, a large message and a 404. timers: also the publishes whose
        records are written by the tracker's timers (confirm + mandatory routed: the ack is held for a late Return)."""
        q = self.adm.queue("cap.live.q")
        qn = self.adm.queue("cap.live.full", {"x-max-length": 1, "x-overflow": "reject-publish"})
        with pika.BlockingConnection(params(port)) as c:
            ch = c.channel()
            ch.confirm_delivery()
            bodies = (b"one", b"two", b"fits", b"full", b"three")
            publish_mix(c, ch, "live", q if timers else None, qn, "cap.live.none", bodies)
            tx = c.channel()
            tx.tx_select()
            tx.basic_publish("", q, b"tx", text_props("live-tx"))
            tx.tx_commit()
        with pika.BlockingConnection(params(port, frame_max=4096)) as c:
            ch = c.channel()
            ch.confirm_delivery()
            ch.basic_publish("", q, b"L" * 10000, text_props("live-large"), mandatory=timers)
            try:
                ch.basic_publish("cap.live.nope", "k", b"x", text_props("live-404"))
            except pika.exceptions.ChannelClosedByBroker:
                pass
        return 8 if timers else 7

    def run_live(self, timers=True):
        d = tempfile.mkdtemp(prefix="amqptap-live-")
        if os.environ.get("TAP_KEEP_OUTPUT") == "1":
            print(f"kept live capture in {d}", file=sys.stderr)
        else:
            self.addCleanup(shutil.rmtree, d)
        cap = os.path.join(d, "live.pcapng")
        tap = self.start_tap(["--pcap", cap, "--frames", os.path.join(d, "live.frames.jsonl")], frames=False)
        n = self.session(tap.port, timers)
        time.sleep(0.1)
        self.assertEqual(tap.stop(), 0, tap.stderr())
        live = tap.records()
        self.assertEqual(len([x for x in live if x["type"] == "publish"]), n)
        return d, cap, live, read_records(os.path.join(d, "live.frames.jsonl"))

    def check_live_equals_replay(self, timers):
        d, cap, live, live_frames = self.run_live(timers)
        out = os.path.join(d, "replay.jsonl")
        frames = os.path.join(d, "replay.frames.jsonl")
        r = replay(cap, BROKER_PORT, verdicts=out, frames=frames)
        self.assertEqual(r.returncode, 0, r.stderr())
        rep = read_records(out)
        live = without_identity(self, live)  # replay leaves it out to stay deterministic (README)
        key = lambda x: (x["type"], x.get("conn"), x.get("channel"), x.get("message_id"), x.get("event"),  # noqa
                         x.get("rule"))
        self.assertEqual(sorted(map(key, live)), sorted(map(key, rep)), "record sets differ")
        rep_by = {key(x): x for x in rep}
        diffs = []
        for lv in live:
            rv = rep_by[key(lv)]
            for field in sorted(set(lv) | set(rv)):
                if lv.get(field, "<absent>") != rv.get(field, "<absent>"):
                    diffs.append(f"{key(lv)} {field}: live {lv.get(field, '<absent>')!r} replay "
                                 f"{rv.get(field, '<absent>')!r}")
        self.assertEqual(diffs, [], "fields differ live vs replay")
        self.assertEqual(live, rep, "same records, different order")
        # the frame trace is the same too, timestamps included (and each live line has the run, as every record)
        self.assertEqual(without_identity(self, live_frames), read_records(frames))

    def test_live_equals_replay(self):
        """Every record whose time is a wire event: field by field, timestamps and latencies included."""
        self.check_live_equals_replay(timers=False)

    def test_live_equals_replay_timer_records(self):
        """Records written by the tracker's timers (an acked mandatory publish held --late-return ms for a
        Return, a non-confirm mandatory publish at the end of --return-window) are stamped with their deadline and
        settled before newer bytes are decoded, live as in replay: equal too, in the same order."""
        self.check_live_equals_replay(timers=True)

    def test_ends_survive_the_capture(self):
        """The tap's --pcap writes each connection's end as it happened, so a replay gives the same close records: a
        client's reset is a reset (it was a FIN, and the replay said client_eof), beside a client's clean end."""
        d = tempfile.mkdtemp(prefix="amqptap-ends-")
        self.addCleanup(shutil.rmtree, d, True)
        cap = os.path.join(d, "ends.pcapng")
        tap = self.start_tap(["--pcap", cap], frames=False)
        socket.create_connection(("127.0.0.1", tap.port)).close()  # no byte
        rc = RawClient(tap.port)
        rc.method(1, 20, 10, rc.short(""))
        rc.expect(1, 20, 11)
        rc.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        rc.sock.close()  # a reset
        self.assertTrue(wait_for(lambda: len([r for r in tap.records("connection") if r["event"] == "close"]) == 2,
                                 10), tap.records("connection"))
        self.assertEqual(tap.stop(), 0, tap.stderr())
        live = sorted(r["by"] for r in tap.records("connection") if r["event"] == "close")
        self.assertEqual(live, ["client_eof", "client_reset"])
        out = os.path.join(d, "replay.jsonl")
        r = replay(cap, BROKER_PORT, verdicts=out)
        self.assertEqual(r.returncode, 0, r.stderr())
        self.assertEqual(sorted(x["by"] for x in read_records(out) if x["type"] == "connection" and
                                x["event"] == "close"), live)
        resets = subprocess.run(["tshark", "-r", cap, "-Y", "tcp.flags.reset == 1"],
                                capture_output=True, text=True, check=True).stdout.splitlines()
        self.assertEqual(len(resets), 1, resets)

    def test_tshark_decodes_every_frame_live(self):
        _, cap, live, live_frames = self.run_live()
        want = tap_frames_by_stream(live_frames, live)
        got = tshark_frames_by_stream(cap, BROKER_PORT)
        self.assertEqual(len(want), 4)  # two connections, both directions
        for k in sorted(want):
            self.assertEqual(len(got.get(k, [])), len(want[k]), f"{k}: frame count")
            self.assertEqual(got.get(k), want[k], f"{k}: frame sequence")
        self.assertEqual(sorted(got), sorted(want))


class TsharkCommitted(unittest.TestCase):
    def test_tshark_decodes_every_frame_of_every_capture(self):
        d = tempfile.mkdtemp(prefix="amqptap-tshark-")
        self.addCleanup(shutil.rmtree, d)
        for cap in capture_files():
            name = os.path.basename(cap)[:-7]
            with self.subTest(capture=name):
                port = capture_port(cap)
                out, frames = os.path.join(d, name + ".jsonl"), os.path.join(d, name + ".frames.jsonl")
                r = replay(cap, port, verdicts=out, frames=frames)
                self.assertEqual(r.returncode, 0, r.stderr())
                want = tap_frames_by_stream(read_records(frames), read_records(out))
                got = tshark_frames_by_stream(cap, port)
                self.assertEqual(sorted(got), sorted(want))
                for k in want:
                    self.assertEqual(got[k], want[k], f"{name} {k}")


class ForeignCapture(unittest.TestCase):
    """dumpcap on lo, pika straight to the broker (no tap): replay gives every publish its verdict."""

    def setUp(self):
        require_broker(self)
        self.adm = Admin()
        self.addCleanup(self.adm.close)
        if not shutil.which("dumpcap"):
            self.skipTest("dumpcap not installed")

    def test_dumpcap_capture_replays(self):
        d = tempfile.mkdtemp(prefix="amqptap-dumpcap-")
        self.addCleanup(shutil.rmtree, d)
        cap = os.path.join(d, "lo.pcapng")
        err = open(os.path.join(d, "dumpcap.err"), "w+b")
        self.addCleanup(err.close)
        dc = subprocess.Popen(["dumpcap", "-q", "-i", "lo", "-f", f"tcp port {BROKER_PORT}", "-w", cap],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        try:
            def running():
                err.seek(0)
                return b"Capturing on" in err.read() or (os.path.exists(cap) and os.path.getsize(cap) > 0)
            self.assertTrue(wait_for(lambda: running() or dc.poll() is not None, 15), "dumpcap did not start")
            self.assertIsNone(dc.poll(), "dumpcap exited")
            time.sleep(0.5)
            q = self.adm.queue("cap.dumpcap.q")
            full = self.adm.queue("cap.dumpcap.full", {"x-max-length": 1, "x-overflow": "reject-publish"})
            with pika.BlockingConnection(params(BROKER_PORT)) as c:
                ch = c.channel()
                ch.confirm_delivery()
                publish_mix(c, ch, "dc", q, full, "cap.dumpcap.none", (b"a", b"b", b"c", b"d", b"e"))
            time.sleep(0.5)
        finally:
            dc.send_signal(signal.SIGINT)
            dc.wait(15)
        out = os.path.join(d, "v.jsonl")
        r = replay(cap, BROKER_PORT, verdicts=out)
        self.assertEqual(r.returncode, 0, r.stderr())
        got = {x["message_id"]: (x["route"], x["confirm"]) for x in read_records(out)
               if x["type"] == "publish" and (x.get("message_id") or "").startswith("dc-")}
        self.assertEqual(got, {"dc-routed": ("routed", "ack"), "dc-returned": ("returned", "ack"),
                               "dc-fits": ("unproven", "ack"), "dc-nack": ("unproven", "nack"),
                               "dc-nc-returned": ("returned", "none")})


def syn_epb(i, port, ts_hi, ts_lo):
    """An Enhanced Packet Block holding one Ethernet/IPv4 TCP SYN from 10.x.y.z (an address no host here owns) to
    port, as a flood sends it: no answer ever comes."""
    ip_src = bytes([10, (i >> 16) & 255, (i >> 8) & 255, i & 255])
    tcp = struct.pack("!HHIIBBHHH", 1024 + i % 60000, port, i, 0, 5 << 4, 0x02, 65535, 0, 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), i & 0xFFFF, 0, 64, 6, 0, ip_src,
                     bytes([127, 0, 0, 1]))
    frame = b"\x02\0\0\0\0\x01\x02\0\0\0\0\x02\x08\x00" + ip + tcp
    pad = (-len(frame)) % 4
    body = struct.pack("<IIIII", 0, ts_hi, ts_lo, len(frame), len(frame)) + frame + b"\0" * pad
    return struct.pack("<II", 6, 12 + len(body)) + body + struct.pack("<I", 12 + len(body))


class SynFlood(unittest.TestCase):
    def test_a_syn_flood_beside_a_live_connection_keeps_its_verdicts(self):
        """70,000 SYNs that are never answered, more than the 65,536 streams the capture follows, arrive in the
        middle of a recorded session: the session's stream goes on as if they had not come (its records are the
        committed ones, byte for byte), none of them is a connection, and they cost the replay little memory."""
        cap = os.path.join(CAPTURES, "returned_noconfirm.pcapng")
        port = capture_port(cap)
        data = open(cap, "rb").read()
        epbs = [(off, n) for off, n in pcapng_blocks(data) if struct.unpack_from("<I", data, off)[0] == 6]
        at_off, at_len = epbs[len(epbs) // 2]  # the flood right after this packet, at its time
        ts_hi, ts_lo = struct.unpack_from("<II", data, at_off + 12)
        flood = b"".join(syn_epb(i, port, ts_hi, ts_lo) for i in range(70000))
        d = tempfile.mkdtemp(prefix="amqptap-synflood-")
        self.addCleanup(shutil.rmtree, d)
        flooded = os.path.join(d, "flooded.pcapng")
        with open(flooded, "wb") as f:
            f.write(data[:at_off + at_len] + flood + data[at_off + at_len:])
        out = os.path.join(d, "v.jsonl")
        r = replay(flooded, port, verdicts=out, extra_args=["-v"])
        self.assertEqual(r.returncode, 0, r.stderr())
        with open(out, "rb") as a, open(cap[:-7] + ".verdicts.jsonl", "rb") as b:
            self.assertEqual(a.read().decode().splitlines(), b.read().decode().splitlines())
        self.assertIn("1 in total", r.stderr())
        rss = int(re.search(r"peak_rss_kib=(\d+)", r.stderr()).group(1))
        if not is_asan_build():  # the sanitizers' shadow memory and redzones are not the tap's
            self.assertLess(rss, 48 * 1024, "65,536 quiet streams cost more than ~600 B each")


class FlowMemory(unittest.TestCase):
    def test_65536_open_connections_that_published_fit_the_default_budget(self):
        """65,536 connections (the most the capture follows), each with one publish on a confirm channel and its
        ack, all open at the capture's end (tests/bench/flowcap.py): every one is followed within the default
        --max-tracking-memory (before: its peak was 364 MiB and 35,012 channels were not followed), and the
        replay's peak RSS stays near the documented ~3.7 KiB per open connection (244 MiB measured; 676 before)."""
        sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "bench"))
        import flowcap
        n = 65536
        d = tempfile.mkdtemp(prefix="amqptap-flows-")
        self.addCleanup(shutil.rmtree, d)
        cap = os.path.join(d, "flows.pcapng")
        with open(cap, "wb") as f:
            for piece in flowcap.flows(n, 5672):
                f.write(piece)
        r = replay(cap, 5672, verdicts=os.devnull, extra_args=["-v"], timeout=300)
        err = r.stderr()
        self.assertEqual(r.returncode, 0, err)
        self.assertIn(f"{n} in total", err)
        self.assertIn(f"publishes={n} routed=0 returned=0 unproven={n} unknown=0 acked={n}", err)
        self.assertIn("records lost 0, connections not followed 0, channels not followed 0", err)
        peak = int(re.search(r"tracking memory \d+ bytes \(peak (\d+)", err).group(1))
        self.assertLess(peak, 256 << 20, "the tracking state of 65,536 connections outgrew the default budget")
        rss = int(re.search(r"peak_rss_kib=(\d+)", err).group(1))
        if not is_asan_build():  # the sanitizers' shadow memory and redzones are not the tap's
            self.assertLess(rss, 400 * 1024, "65,536 open connections cost more than ~6 KiB each")


class CorruptCaptures(unittest.TestCase):
    """Truncated or corrupted files: exit 1, one error line naming the offset, the records of every block before
    the fault (the same as replaying just those blocks), never a crash."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="amqptap-corrupt-")
        self.addCleanup(shutil.rmtree, self.dir)
        self.n = 0

    def run_replay(self, data, port):
        self.n += 1
        path = os.path.join(self.dir, f"c{self.n}.pcapng")
        with open(path, "wb") as f:
            f.write(data)
        out = os.path.join(self.dir, f"c{self.n}.jsonl")
        r = replay(path, port, verdicts=out, env={"ASAN_OPTIONS": "abort_on_error=0:detect_leaks=1"}, timeout=60)
        return r.returncode, r.stderr(), read_records(out)

    def check_fault(self, data, port, bad_block_off, label):
        rc, err, recs = self.run_replay(data, port)
        self.assertNotIn("Sanitizer", err, label)
        self.assertEqual(rc, 1, f"{label}: {err}")
        lines = [ln for ln in err.splitlines() if ln.startswith("amqptap: replay")]
        self.assertEqual(len(lines), 1, f"{label}: {err}")
        self.assertIn(f"offset {bad_block_off}", lines[0], label)
        rc0, err0, want = self.run_replay(data[:bad_block_off], port)
        self.assertEqual(rc0, 0, err0)
        self.assertEqual(recs, want, f"{label}: records differ from a replay of the blocks before the fault")
        return recs

    def test_truncated_at_many_offsets(self):
        cap = os.path.join(CAPTURES, "streaming_confirms.pcapng")
        port = capture_port(cap)
        data = open(cap, "rb").read()
        blocks = pcapng_blocks(data)
        checked = 0
        saw_partial = False
        for off, length in blocks[2:]:
            for cut in (off + 1, off + 8, off + length // 2, off + length - 1):
                recs = self.check_fault(data[:cut], port, off, f"cut at {cut}")
                saw_partial |= any(r.get("reason") == {"by": "capture_end"} for r in recs if r["type"] == "publish")
                checked += 1
        self.assertGreater(checked, 100)
        self.assertTrue(saw_partial, "no cut left publishes open at the end of the capture")

    def test_bad_block_length(self):
        for name in ("confirm_mandatory", "large_message", "client_killed"):
            cap = os.path.join(CAPTURES, name + ".pcapng")
            port = capture_port(cap)
            data = open(cap, "rb").read()
            blocks = pcapng_blocks(data)
            for idx in (3, len(blocks) // 2, len(blocks) - 1):
                off, length = blocks[idx]
                for bad in (0, 5, 0xFFFFFFF0, length + 4, 0x7FFFFFFF):
                    b = bytearray(data)
                    struct.pack_into("<I", b, off + 4, bad)
                    self.check_fault(bytes(b), port, off, f"{name} block {idx} length {bad:#x}")
                b = bytearray(data)  # the trailing copy of the length disagrees
                struct.pack_into("<I", b, off + length - 4, length + 4)
                self.check_fault(bytes(b), port, off, f"{name} block {idx} trailing length")

    def test_not_a_capture(self):
        rc, err, recs = self.run_replay(b"GET / HTTP/1.1\r\n\r\n" * 10, 5672)
        self.assertEqual(rc, 1, err)
        self.assertIn("offset 0", err)
        self.assertEqual(recs, [])


if __name__ == "__main__":
    main()
