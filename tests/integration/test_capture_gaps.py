# Captures with holes and captures from a pipe (issue 15, src/DESIGN.md §6b): every committed capture with data-bearing
# segments cut out (one at a time, and two in a row as in the tshark capture of the issue) replays to
# capture_gap records and `unknown` verdicts, never a routed/returned/ack/nack the full capture does not give,
# never a reset that did not happen, and without losing the record of a publish whose method frame was captured;
# `amqptap replay -` and `/dev/stdin` read pcap and pcapng from a pipe, as the packets arrive.

import collections
import glob
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tapharness import SOURCE_DIR, Tap, capture_port, main, read_records, replay, wait_for  # noqa: E402

CAPTURES = os.path.join(SOURCE_DIR, "captures")
IDENTITY = ("channel", "exchange", "routing_key", "message_id", "body_size")


def blocks(data):
    """The pcapng blocks of a little-endian file as (type, bytes)."""
    out, off = [], 0
    while off < len(data):
        btype, blen = struct.unpack_from("<II", data, off)
        out.append((btype, data[off:off + blen]))
        off += blen
    return out


def packets_info(cap, port):
    """Per packet (1-based, in file order): (direction 'c2s'/'s2c', tcp payload length, basic.publish methods,
    FIN)."""
    fields = subprocess.run(["tshark", "-r", cap, "-d", f"tcp.port=={port},amqp", "-T", "fields", "-e",
                             "tcp.dstport", "-e", "tcp.len", "-e", "amqp.method.class", "-e", "amqp.method.method",
                             "-e", "tcp.flags.fin"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True).stdout
    info = []
    for line in fields.splitlines():
        dport, tlen, classes, methods, fin = (line.split("\t") + ["", "", "", "", ""])[:5]
        pairs = zip(classes.split(","), methods.split(",")) if classes else []
        pubs = sum(1 for c, m in pairs if c == "60" and m == "40")
        info.append(("c2s" if dport == str(port) else "s2c", int(tlen or 0), pubs, fin in ("1", "True")))
    return info


def holes(info, drop):
    """The (direction, stream offset, bytes) of the holes dropping the packets numbered in `drop` leaves, for a
    capture whose segments are in order (loopback): a run of dropped payload of one direction is one hole."""
    out, pos, run = [], {"c2s": 0, "s2c": 0}, {}
    for n, (d, tlen, _, fin) in enumerate(info, 1):
        if n in drop:
            if tlen and d not in run:
                run[d] = [pos[d], 0]
            if tlen:
                run[d][1] += tlen
        elif d in run and (tlen or fin):  # data or a FIN after it shows the hole
            out.append((d, *run.pop(d)))
        pos[d] += tlen
    return sorted(out)  # a hole nothing came after is never seen as one


def cut(data, drop):
    """The capture without the packets numbered in `drop` (1-based over packet blocks)."""
    out, n = [], 0
    for btype, raw in blocks(data):
        if btype == 6:
            n += 1
            if n in drop:
                continue
        out.append(raw)
    return b"".join(out)


def frames_with_method(cap, port, class_id, method_id):
    """The numbers (1-based) of the packets of cap that carry the given AMQP method."""
    out = subprocess.run(["tshark", "-r", cap, "-d", f"tcp.port=={port},amqp", "-Y",
                          f"amqp.method.class == {class_id} && amqp.method.method == {method_id}", "-T", "fields",
                          "-e", "frame.number"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         check=True).stdout
    return [int(n) for n in out.split()]


def stamp(raw):
    """An enhanced packet block's timestamp (microseconds, as the committed captures have it)."""
    hi, lo = struct.unpack_from("<II", raw, 12)
    return (hi << 32) | lo


def restamped(raw, us):
    return raw[:12] + struct.pack("<II", us >> 32, us & 0xFFFFFFFF) + raw[20:]


def numbered_blocks(data):
    """The pcapng blocks of data as (n, is a packet block, bytes): n is the packet's number (1-based), or for any
    other block the number of the last packet before it."""
    n = 0
    for btype, raw in blocks(data):
        n += btype == 6
        yield n, btype == 6, raw


def golden_publishes(cap):
    return [r for r in read_records(cap[:-len(".pcapng")] + ".verdicts.jsonl") if r["type"] == "publish"]


def replay_bytes(data, port, path="-"):
    r = replay(path, port, input=data)
    return r.returncode, r.records(), r.stderr()


def identity(rec):
    return tuple(json.dumps(rec.get(k)) for k in IDENTITY)


def claims(rec):
    """What a record asserts the broker did: its route when routed/returned, its confirm when ack/nack."""
    out = {}
    if rec["route"] in ("routed", "returned"):
        out["route"] = rec["route"]
        out["reply_code"] = rec.get("reply_code")
    if rec["confirm"] in ("ack", "nack"):
        out["confirm"] = rec["confirm"]
    return out


def resets(records):
    return collections.Counter(r["by"] for r in records if r["type"] == "connection" and r.get("event") == "close"
                               and r.get("by", "").endswith("_reset"))


class ReplayHints(unittest.TestCase):
    def test_wrong_port_and_cut_packets_are_said(self):
        """A replay given the wrong port says on which port the capture's TCP is; one of a capture whose snap
        length cut the packets says so (their records are then gaps and unknowns, which alone would not say why)."""
        cap = os.path.join(CAPTURES, "alternate_exchange.pcapng")
        port = capture_port(cap)
        with open(cap, "rb") as f:
            data = f.read()
        n_packets = sum(1 for t, _ in blocks(data) if t == 6)
        rc, recs, err = replay_bytes(data, port + 1)
        self.assertEqual((rc, recs), (0, []), err)
        self.assertIn(f"amqptap: replay: no TCP on port {port + 1} of the capture's {n_packets} packets; its TCP is "
                      f"on port {port} ({n_packets} segments): give the broker's with --port", err)
        rc, recs, err = replay_bytes(data, port)
        self.assertNotIn("amqptap: replay:", err)
        short = bytearray()
        cut_n = 0
        for btype, raw in blocks(data):  # every packet block cut to 100 bytes, as tcpdump -s 100 would
            if btype == 6:
                caplen = struct.unpack_from("<I", raw, 20)[0]
                if caplen > 100:
                    body = raw[28:28 + 100]
                    blen = 28 + 100 + 4
                    raw = raw[:4] + struct.pack("<I", blen) + raw[8:20] + struct.pack("<I", 100) + raw[24:28] + \
                        body + struct.pack("<I", blen)
                    cut_n += 1
            short += raw
        self.assertGreater(cut_n, 0)
        rc, recs, err = replay_bytes(bytes(short), port)
        self.assertEqual(rc, 0, err)
        self.assertIn(f"amqptap: replay: {cut_n} packet(s) were cut short by the capture's snap length", err)

    def test_one_direction_is_said(self):
        """A capture of the client's packets alone names the connections that got not one byte from the broker;
        the whole capture, and one cut off in a broken block (which has its own error line), do not."""
        cap = os.path.join(CAPTURES, "alternate_exchange.pcapng")
        port = capture_port(cap)
        with open(cap, "rb") as f:
            data = f.read()
        hint = "connection(s) had client bytes and not one byte from the broker"
        rc, _, err = replay_bytes(data, port)
        self.assertEqual(rc, 0, err)
        self.assertNotIn(hint, err)
        info = packets_info(cap, port)
        s2c = {n for n, (d, _, _, _) in enumerate(info, 1) if d == "s2c"}
        self.assertTrue(s2c)
        rc, recs, err = replay_bytes(cut(data, s2c), port)
        self.assertEqual(rc, 0, err)
        self.assertIn(f"amqptap: replay: 1 {hint}: was only one direction captured?", err)
        pubs = [r for r in recs if r["type"] == "publish"]
        self.assertTrue(pubs)
        self.assertTrue(all(r["route"] == "unknown" for r in pubs), pubs)
        first = min(n for n in s2c if info[n - 1][1] > 0)
        before = cut(data, set(range(first, len(info) + 1)))  # the blocks before the broker's first byte
        rc, _, err = replay_bytes(before + data[len(before):len(before) + 3], port)  # cut inside its packet
        self.assertEqual(rc, 1, err)
        self.assertIn("truncated", err)
        self.assertNotIn(hint, err)


class CaptureGaps(unittest.TestCase):
    def check_cut(self, name, data, port, full, info, drop):
        rc, recs, err = replay_bytes(cut(data, drop), port)
        what = f"{name} without packets {sorted(drop)}"
        self.assertEqual(rc, 0, f"{what}: {err}")
        gaps = [r for r in recs if r["type"] == "capture_gap"]
        pubs = [r for r in recs if r["type"] == "publish"]
        full_pubs = [r for r in full if r["type"] == "publish"]
        if not gaps:
            self.assertEqual(recs, full, f"{what}: no capture_gap record, yet the records changed")
            return 0
        for g in gaps:
            self.assertIn(g["dir"], ("c2s", "s2c"))
            self.assertGreater(g["missing"], 0)
        # each hole is at its stream offset: the bytes of its direction before it, delivered or lost
        self.assertEqual(sorted((g["dir"], g["offset"], g["missing"]) for g in gaps), holes(info, drop), what)
        self.assertIn("capture gaps:", err)
        # a verdict the broker's answer decides is only written when the full capture gives the same one
        by_identity = collections.defaultdict(list)
        for r in full_pubs:
            by_identity[identity(r)].append(r)
        for r in pubs:
            said = claims(r)
            if r["route"] == "unproven" and not said:
                # nothing is claimed without mandatory and confirm; with mandatory, a window closed with no Return
                # is only believed when the full capture says so too
                if r["mandatory"] or r["seq"] is not None:
                    self.assertIn("unproven", [f["route"] for f in by_identity[identity(r)]], f"{what}: {r}")
                continue
            if not said:
                self.assertEqual(r["route"], "unknown", f"{what}: {r}")
                self.assertIn("reason", r, f"{what}: {r}")
                continue
            same = [f for f in by_identity[identity(r)]
                    if all(f.get(k) == v for k, v in said.items()) and (r["seq"] is None or f["seq"] == r["seq"])]
            self.assertTrue(same, f"{what}: a verdict the full capture does not give: {r}")
        # a publish may lose its record only when its method frame was (partly) in a cut packet
        lost_methods = sum(info[n - 1][2] for n in drop) + len(drop)
        self.assertGreaterEqual(len(pubs), len(full_pubs) - lost_methods,
                                f"{what}: {len(full_pubs) - len(pubs)} publish records missing")
        self.assertEqual(resets(recs) - resets(full), collections.Counter(), f"{what}: a reset was claimed")
        return len(gaps)

    def test_every_capture_with_segments_cut_out(self):
        checked = gapped = 0
        for cap in sorted(glob.glob(os.path.join(CAPTURES, "*.pcapng"))):
            name = os.path.basename(cap)
            port = capture_port(cap)
            with open(cap, "rb") as f:
                data = f.read()
            rc, full, _ = replay_bytes(data, port)
            self.assertEqual(rc, 0)
            info = packets_info(cap, port)
            data_pkts = [i + 1 for i, (_, tlen, _, _) in enumerate(info) if tlen > 0]
            runs = [{n} for n in data_pkts]
            runs += [{a, b} for a, b in zip(data_pkts, data_pkts[1:]) if info[a - 1][0] == info[b - 1][0]]
            for drop in runs[:120]:
                with self.subTest(capture=name, drop=sorted(drop)):
                    gapped += self.check_cut(name, data, port, full, info, drop) > 0
                    checked += 1
        print(f"{checked} cut captures replayed, {gapped} with capture_gap records")
        self.assertGreater(gapped, checked // 2)

    def test_issue_capture_lost_two_segments_mid_publish(self):
        """large_message: the 20 KiB publish loses two body segments (c2s), or the broker's Return and acks lose
        two segments (s2c): gap records, unknown verdicts with the gap as reason, both publishes recorded, and the
        client's clean close still written as the client's."""
        cap = os.path.join(CAPTURES, "large_message.pcapng")
        port = capture_port(cap)
        with open(cap, "rb") as f:
            data = f.read()
        info = packets_info(cap, port)
        body = [i + 1 for i, (d, tlen, _, _) in enumerate(info) if d == "c2s" and tlen == 4096]
        answers = [i + 1 for i, (d, tlen, _, _) in enumerate(info) if d == "s2c" and tlen == 4096]
        for drop, direction in (({body[1], body[2]}, "c2s"), ({answers[0], answers[1]}, "s2c")):
            rc, recs, err = replay_bytes(cut(data, drop), port)
            self.assertEqual(rc, 0, err)
            gaps = [r for r in recs if r["type"] == "capture_gap"]
            self.assertEqual([(g["conn"], g["dir"], g["missing"]) for g in gaps], [(1, direction, 8192)])
            pubs = {r["message_id"]: r for r in recs if r["type"] == "publish"}
            self.assertEqual(sorted(pubs), ["large-20k", "large-9k-returned"])
            for r in pubs.values():
                self.assertEqual(r["route"], "unknown", r)
                self.assertEqual(r["reason"], {"by": "capture_gap"}, r)
            self.assertEqual(pubs["large-20k"]["seq"], 1)
            # after a client-side gap the sequence numbers are not known
            self.assertEqual(pubs["large-9k-returned"]["seq"], None if direction == "c2s" else 2)
            close = [r for r in recs if r["type"] == "connection" and r["event"] == "close"]
            self.assertEqual([(c["by"], c["code"]) for c in close], [("client", 200)])
            self.assertIn("capture gaps: 1 (8192 bytes missing)", err)

    def test_lost_return_before_a_silence_is_a_gap_not_unproven(self):
        """The last Returns of returned_noconfirm (no confirms, mandatory) cut out, and 3 s of silence before the
        client's next packet: their publishes' 2 s window runs out before the broker sends anything more, but the
        client's next packet acknowledges the lost bytes, so they end `unknown` by capture_gap, not `unproven` (a
        guess the capture cannot back)."""
        cap = os.path.join(CAPTURES, "returned_noconfirm.pcapng")
        port = capture_port(cap)
        with open(cap, "rb") as f:
            data = f.read()
        dropped = frames_with_method(cap, port, 60, 50)[-1]  # the packet of the last Returns
        out = []
        for n, packet, raw in numbered_blocks(data):
            if packet and n == dropped:
                continue
            if packet and n > dropped:  # 3 s later
                raw = restamped(raw, stamp(raw) + 3_000_000)
            out.append(raw)
        rc, recs, err = replay_bytes(b"".join(out), port)
        golden = read_records(cap[:-len(".pcapng")] + ".verdicts.jsonl")
        full = {identity(r): r for r in golden if r["type"] == "publish"}
        pubs = [r for r in recs if r["type"] == "publish"]
        self.assertEqual(len(pubs), len(full), err)
        self.assertTrue([r for r in recs if r["type"] == "capture_gap" and r["dir"] == "s2c"], recs)
        routes = collections.Counter(r["route"] for r in pubs)
        print(f"packet {dropped} (Returns) cut, 3 s of silence after it: {dict(routes)}")
        self.assertNotIn("unproven", routes, "a publish whose Return the capture lost was written unproven")
        self.assertGreater(routes["unknown"], 0)
        for r in pubs:  # what is still claimed, the full capture claims too
            if claims(r):
                self.assertEqual(claims(r), claims(full[identity(r)]), r)

    def test_two_holes_in_one_direction_each_at_its_offset(self):
        """Two separate holes in the client's stream, and two in the broker's: each capture_gap says where its hole
        starts in the stream, counting the bytes of the earlier hole (and those skipped to find a frame again, or
        not decoded after a broker-side hole), as tshark's sequence numbers give it."""
        cap = os.path.join(CAPTURES, "large_message.pcapng")
        port = capture_port(cap)
        with open(cap, "rb") as f:
            data = f.read()
        info = packets_info(cap, port)
        for d in ("c2s", "s2c"):
            pkts = [i + 1 for i, (dd, tlen, _, _) in enumerate(info) if dd == d and tlen > 0]
            self.assertGreater(len(pkts), 4, d)
            drop = {pkts[1], pkts[3]}
            with self.subTest(direction=d, drop=sorted(drop)):
                rc, recs, err = replay_bytes(cut(data, drop), port)
                self.assertEqual(rc, 0, err)
                gaps = [(g["dir"], g["offset"], g["missing"]) for g in recs if g["type"] == "capture_gap"]
                self.assertEqual(len(gaps), 2, gaps)
                self.assertEqual(sorted(gaps), holes(info, drop))


def waits_with_handlers(pid):
    """Whether process pid has its SIGINT handler installed and sleeps (waits for input): a signal now is its to
    handle, not a default action that kills it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return False
    return int(status["SigCgt"], 16) >> (signal.SIGINT - 1) & 1 and status["State"].split()[0] == "S"


class Pipes(unittest.TestCase):
    def test_pcapng_and_pcap_from_a_pipe(self):
        cap = os.path.join(CAPTURES, "confirm_mandatory.pcapng")
        port = capture_port(cap)
        with open(cap, "rb") as f:
            ng = f.read()
        with tempfile.TemporaryDirectory() as d:
            classic = os.path.join(d, "x.pcap")
            subprocess.run(["editcap", "-F", "pcap", cap, classic], check=True)
            with open(classic, "rb") as f:
                pcap = f.read()
            rc, want, err = replay_bytes(None, port, cap)
            self.assertEqual(rc, 0, err)
            self.assertTrue(any(r["type"] == "publish" for r in want))
            for fmt, data in (("pcapng", ng), ("pcap", pcap)):
                for path in ("-", "/dev/stdin"):
                    with self.subTest(fmt=fmt, path=path):
                        rc, got, err = replay_bytes(data, port, path)
                        self.assertEqual(rc, 0, err)
                        self.assertEqual(got, want)

    def test_records_follow_the_packets(self):
        """`tcpdump -U -w - | amqptap replay -`: a record is written while the pipe is still open."""
        cap = os.path.join(CAPTURES, "confirm_mandatory.pcapng")
        port = capture_port(cap)
        with open(cap, "rb") as f:
            data = f.read()
        raw = [raw for _, raw in blocks(data)]
        head = b"".join(raw[:len(raw) // 2])
        p = Tap.replay("-", port, stdin=subprocess.PIPE)
        try:
            p.stdin.write(head)
            p.stdin.flush()
            ready, _, _ = select.select([p.stdout], [], [], 10)
            self.assertTrue(ready, "no record within 10 s of the first packets")
            first = json.loads(p.stdout.readline())
            self.assertEqual(first["type"], "connection")
            self.assertIsNone(p.proc.poll(), "replay ended before its input did")
            p.stdin.write(b"".join(raw[len(raw) // 2:]))
            p.stdin.close()
            rest = p.stdout.read()
            self.assertEqual(p.wait(timeout=30), 0)
        finally:
            p.cleanup()
        self.assertTrue(any(json.loads(line)["type"] == "publish" for line in rest.splitlines()))


    def test_a_live_pipe_that_goes_quiet_still_settles(self):
        """A live capture through a pipe (its packets' times are now) that goes quiet after the broker's last
        answers: the acked mandatory publishes held for a late Return are written once their hold is over, while
        the pipe stays open, not at the next packet (on a quiet link the next heartbeat, or never)."""
        cap = os.path.join(CAPTURES, "confirm_mandatory.pcapng")
        port = capture_port(cap)
        with open(cap, "rb") as f:
            data = f.read()
        quiet_from = frames_with_method(cap, port, 20, 40)[0]  # the client's channel.close: it and all after, unsent
        last_sent = [raw for _, packet, raw in numbered_blocks(data) if packet][quiet_from - 2]
        shift = int(time.time() * 1e6) - stamp(last_sent)  # as if it was captured just now
        out = [restamped(raw, stamp(raw) + shift) if packet else raw
               for n, packet, raw in numbered_blocks(data) if n < quiet_from]
        golden = golden_publishes(cap)
        p = Tap.replay("-", port, stdin=subprocess.PIPE)
        try:
            p.stdin.write(b"".join(out))
            p.stdin.flush()
            got, buf, end = [], b"", time.monotonic() + 5
            while len(got) < len(golden) and time.monotonic() < end:
                ready, _, _ = select.select([p.stdout], [], [], 0.2)
                if ready:  # raw reads: a buffered readline would hide lines from select
                    buf += os.read(p.stdout.fileno(), 65536)
                    *lines, buf = buf.split(b"\n")
                    got += [r for r in map(json.loads, lines) if r["type"] == "publish"]
            self.assertIsNone(p.proc.poll(), "replay ended before its input did")
            print(f"{len(got)} of {len(golden)} publish records written while the pipe was quiet")
            self.assertEqual(sorted((r["route"], r["confirm"]) for r in got),
                             sorted((r["route"], r["confirm"]) for r in golden))
        finally:
            p.cleanup()

    def test_a_live_pipe_that_hands_packets_over_late_keeps_their_times(self):
        """tcpdump -U without --immediate-mode hands packets over up to a second after it captured them: here every
        packet comes 0.4 s after its timestamp and the broker's first ack half a second after the packet before it
        (0.9 s late). The records have the capture's latencies, as a replay of the file gives them. (Before: the
        clock, which went on 200 ms behind the wall while the pipe was quiet, had passed the ack's time, which could
        not go back: its confirm latencies came out about 0.7 s.)"""
        cap = os.path.join(CAPTURES, "confirm_no_mandatory.pcapng")
        port = capture_port(cap)
        with open(cap, "rb") as f:
            data = f.read()
        first_ack = frames_with_method(cap, port, 60, 80)[0]
        packets = [raw for _, packet, raw in numbered_blocks(data) if packet]
        shift = int(time.time() * 1e6) - 400000 - stamp(packets[first_ack - 2])
        head, tail = [], []
        for n, packet, raw in numbered_blocks(data):
            (head if n < first_ack else tail).append(restamped(raw, stamp(raw) + shift) if packet else raw)
        golden = golden_publishes(cap)
        p = Tap.replay("-", port, stdin=subprocess.PIPE)
        try:
            p.stdin.write(b"".join(head))
            p.stdin.flush()
            time.sleep(0.5)  # the pipe is quiet: the live clock goes on
            p.stdin.write(b"".join(tail))
            p.stdin.close()
            out = p.stdout.read()
            p.wait(60)
        finally:
            p.cleanup()
        got = [r for r in map(json.loads, out.splitlines()) if r["type"] == "publish"]
        self.assertEqual([(r["seq"], r["route"], r["confirm"], r.get("confirm_us")) for r in got],
                         [(r["seq"], r["route"], r["confirm"], r.get("confirm_us")) for r in golden])

    def live_view(self, name, extra=(), stdout=subprocess.PIPE):
        """`amqptap replay -` of captures/NAME.pcapng written whole into a pipe that stays open: (process, the
        golden records without ts and run). The caller ends it with end_by_sigint, or the cleanup kills it."""
        cap = os.path.join(CAPTURES, f"{name}.pcapng")
        golden = [{k: v for k, v in r.items() if k not in ("ts", "run")}
                  for r in read_records(os.path.join(CAPTURES, f"{name}.verdicts.jsonl"))]
        p = Tap.replay("-", capture_port(cap), extra, stdin=subprocess.PIPE, stdout=stdout)
        self.addCleanup(p.cleanup)
        with open(cap, "rb") as f:
            p.stdin.write(f.read())
        p.stdin.flush()  # and the pipe stays open: replay waits for more
        return p, golden

    def end_by_sigint(self, p):
        """SIGINT, then (stdout, stderr) once it exited 0 and said so."""
        self.assertIsNone(p.proc.poll(), "replay ended before its input did")
        rc = p.stop(signal.SIGINT, timeout=30)
        err = p.stderr()
        self.assertEqual(rc, 0, err)
        self.assertIn("replay stopped by SIGINT", err)
        return p.output, err

    def test_sigint_ends_a_live_view_as_its_end_would(self):
        """Ctrl-C on `tcpdump -U -w - | amqptap replay -` signals both while the pipe is open: replay ends the
        capture where it has read to, as an end of file would, so it writes every record the golden verdicts have
        (the capture's connection closed before its end), and the connection's records, with exit 0."""
        p, golden = self.live_view("alternate_exchange")
        ready, _, _ = select.select([p.stdout], [], [], 10)
        self.assertTrue(ready, "no record within 10 s")
        time.sleep(0.5)
        out, err = self.end_by_sigint(p)
        self.assertIn("output verdicts records=", err)  # the summary
        got = [{k: v for k, v in json.loads(line).items() if k not in ("ts", "run")} for line in out.splitlines()]
        self.assertEqual(got, golden)

    def test_sighup_and_sigusr1_on_a_live_view(self):
        """SIGHUP and SIGUSR1 do for `replay -` what they do for the proxy: the verdict file, moved aside, is made
        anew (records after the signal go to the new one) and the summary is printed, the replay going on; then
        SIGINT ends it with every record written across the two files. (Before: either signal killed it, with the
        records not yet flushed lost and no summary.)"""
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        out = os.path.join(d, "v.jsonl")
        p, golden = self.live_view("alternate_exchange", ["-o", out], stdout=subprocess.DEVNULL)
        self.assertTrue(wait_for(lambda: os.path.exists(out) and os.path.getsize(out) > 0, 10, 0.1))
        time.sleep(0.3)
        os.rename(out, out + ".1")
        p.proc.send_signal(signal.SIGHUP)
        p.proc.send_signal(signal.SIGUSR1)
        self.assertTrue(wait_for(lambda: os.path.exists(out), 10, 0.1), "SIGHUP made no new verdict file")
        time.sleep(0.3)
        _, err = self.end_by_sigint(p)
        self.assertGreaterEqual(err.count("output verdicts records="), 2, "SIGUSR1's summary and the last one")
        got = [{k: v for k, v in r.items() if k not in ("ts", "run")}
               for r in read_records(out + ".1") + read_records(out)]
        self.assertEqual(got, golden)

    def test_stop_before_the_capture_began(self):
        """A replay of a FIFO nobody has opened yet, or of a pipe whose writer has written nothing yet (tcpdump that
        waits for its interface), ends at SIGINT as a capture without packets: exit 0, said so, no error. Before,
        the FIFO's waiting open failed with "Interrupted system call" (exit 1), and the pipe's header read went on
        waiting through the signal until the writer closed, then said "too short for a capture file"."""
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        fifo = os.path.join(d, "cap")
        os.mkfifo(fifo, 0o600)
        waiting_for_a_writer = Tap.replay(fifo)
        silent_writer = Tap.replay("-", stdin=subprocess.PIPE)
        for p in (waiting_for_a_writer, silent_writer):
            self.addCleanup(p.cleanup)
            self.assertTrue(wait_for(lambda p=p: waits_with_handlers(p.pid), 10, 0.05), "never waited for input")
        for p in (waiting_for_a_writer, silent_writer):
            out, err = self.end_by_sigint(p)
            self.assertEqual(out, b"")
            self.assertNotRegex(err, r"(?i)interrupted|too short|amqptap: replay [-/]")  # no error line
        silent_writer.stdin.close()

    def test_signals_while_a_fifo_waits_for_its_writer(self):
        """SIGUSR1 and SIGHUP while `replay FIFO` waits for a writer: the summary is printed and the replay goes on
        waiting; the capture written later is replayed whole (before, either signal ended it with exit 1)."""
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        fifo = os.path.join(d, "cap")
        os.mkfifo(fifo, 0o600)
        cap = os.path.join(CAPTURES, "alternate_exchange.pcapng")
        p = Tap.replay(fifo, capture_port(cap))
        self.addCleanup(p.cleanup)
        self.assertTrue(wait_for(lambda: waits_with_handlers(p.pid), 10, 0.05), "never waited for a writer")
        p.proc.send_signal(signal.SIGUSR1)
        time.sleep(0.3)
        p.proc.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        self.assertIsNone(p.proc.poll(), "a signal ended the wait for the writer")
        with open(fifo, "wb") as w, open(cap, "rb") as f:
            w.write(f.read())
        rc = p.wait(timeout=30)
        out, err = p.output, p.stderr()
        self.assertEqual(rc, 0, err)
        self.assertGreaterEqual(err.count("output verdicts records="), 2, "SIGUSR1's summary and the last one")
        golden = [{k: v for k, v in r.items() if k not in ("ts", "run")}
                  for r in read_records(os.path.join(CAPTURES, "alternate_exchange.verdicts.jsonl"))]
        got = [{k: v for k, v in json.loads(line).items() if k not in ("ts", "run")} for line in out.splitlines()]
        self.assertEqual(got, golden)


if __name__ == "__main__":
    main()
