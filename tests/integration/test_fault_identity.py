# Fault injection costs nothing when no rule is configured: one session (pika: a confirm channel, publishes that
# are routed and one that is returned) through the tap built from this tree and through the tap built from the
# reference branch (TAP_REF, default main; or the binary TAP_MAIN_BIN), each with --frames and --pcap. The
# AMQP bytes of every stream in the two pcapng files are identical, and so are the --frames and publish records
# but for what differs between any two runs (times, run id, client ports). A third run with a rule that selects
# nothing (the rewriter in the path, passing every frame) must give the same bytes too.
#
# Building the reference takes a few minutes at -j2 the first time (kept in the build tree, by commit).

import json
import os
import shutil
import struct
import subprocess
import tempfile

import pika

import tapharness
from tapharness import AMQPTAP_BIN, BROKER_HOST, BROKER_PORT, SOURCE_DIR, ProxyTap, TapTestCase, main, require_broker

QUEUE = "fault-identity"
# members that differ between any two runs of one session
VOLATILE = {"ts", "published", "run", "tap", "client", "upstream_local", "started_us"}


def reference_binary():
    """The amqptap of TAP_MAIN_BIN, or built from git's TAP_REF into the build tree; None when neither can be."""
    given = os.environ.get("TAP_MAIN_BIN")
    if given:
        return given
    ref = os.environ.get("TAP_REF", "main")
    try:
        commit = subprocess.run(["git", "-C", SOURCE_DIR, "rev-parse", ref], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    head = subprocess.run(["git", "-C", SOURCE_DIR, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", SOURCE_DIR, "status", "--porcelain", "--untracked-files=no", "src",
                            "include", "CMakeLists.txt"], capture_output=True, text=True).stdout.strip()
    if commit == head and not dirty:
        return AMQPTAP_BIN  # the reference is this tree (CI on main): the rule-that-selects-nothing run still counts
    root = os.path.join(os.path.dirname(AMQPTAP_BIN), "reference", commit[:12])
    binary = os.path.join(root, "build", "amqptap")
    if os.path.exists(binary):
        return binary
    src = os.path.join(root, "src")
    os.makedirs(src, exist_ok=True)
    archive = subprocess.run(["git", "-C", SOURCE_DIR, "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    subprocess.run(["cmake", "-S", src, "-B", os.path.join(root, "build"), "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", os.path.join(root, "build"), "-j2", "--target", "amqptap"], check=True,
                   capture_output=True)
    return binary


def session(port):
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(QUEUE)
    for i in range(20):
        ch.basic_publish("", QUEUE, b"body %d" % i, pika.BasicProperties(message_id=f"id-{i}"), mandatory=True)
    try:
        ch.basic_publish("", QUEUE + ".nowhere", b"lost", pika.BasicProperties(message_id="lost"), mandatory=True)
    except pika.exceptions.UnroutableError:
        pass
    conn.close()


def pcap_streams(path):
    """The TCP payload of every packet in a pcapng file, concatenated by (connection order, direction)."""
    with open(path, "rb") as f:
        data = f.read()
    links, streams, conns = [], {}, {}
    at = 0
    while at + 12 <= len(data):
        btype, blen = struct.unpack_from("<II", data, at)
        body = data[at + 8:at + blen - 4]
        if btype == 1:  # interface description
            links.append(struct.unpack_from("<H", body, 0)[0])
        elif btype == 6:  # enhanced packet
            iface, _hi, _lo, caplen, _orig = struct.unpack_from("<IIIII", body, 0)
            pkt = body[20:20 + caplen]
            if links[iface] == 1:
                pkt = pkt[14:]
            if pkt[0] >> 4 == 4:
                ihl = (pkt[0] & 15) * 4
                proto, tcp = pkt[9], pkt[ihl:]
            else:
                proto, tcp = pkt[6], pkt[40:]
            if proto == 6:
                sport, dport = struct.unpack_from(">HH", tcp, 0)
                payload = tcp[(tcp[12] >> 4) * 4:]
                key = (min(sport, dport), max(sport, dport))
                conn = conns.setdefault(key, len(conns))
                d = "s2c" if sport == BROKER_PORT or (sport < dport and dport != BROKER_PORT) else "c2s"
                streams[(conn, d)] = streams.get((conn, d), b"") + payload
        at += blen
    return streams


def normalized(path, kind):
    out = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type", "frame") != kind:  # frame lines have no type
                continue
            out.append({k: v for k, v in r.items() if k not in VOLATILE and not k.endswith("_us")})
    return out


class NoRuleIdentity(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)
        self.dir = tempfile.mkdtemp(prefix="amqptap-fault-identity-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def run_one(self, binary, name, extra=()):
        pcap = os.path.join(self.dir, name + ".pcapng")
        saved = tapharness.AMQPTAP_BIN
        tapharness.AMQPTAP_BIN = binary  # ProxyTap runs the module's binary
        try:
            tap = ProxyTap(extra_args=["--pcap", pcap, *extra])
        finally:
            tapharness.AMQPTAP_BIN = saved
        self._taps.append(tap)
        with pika.BlockingConnection(pika.ConnectionParameters(BROKER_HOST, BROKER_PORT)) as c:
            c.channel().queue_delete(QUEUE)
        session(tap.port)
        tap.stop()
        return pcap_streams(pcap), normalized(tap.frames, "frame"), normalized(tap.verdicts, "publish")

    def test_same_bytes_and_records_as_reference(self):
        try:
            ref = reference_binary()
        except (OSError, subprocess.CalledProcessError) as e:
            self.skipTest(f"the reference could not be built: {e}")
        if not ref:
            self.skipTest("no git reference (TAP_REF) and no TAP_MAIN_BIN")
        streams_ref, frames_ref, pubs_ref = self.run_one(ref, "reference")
        streams, frames, pubs = self.run_one(AMQPTAP_BIN, "this")
        idle_streams, idle_frames, idle_pubs = self.run_one(AMQPTAP_BIN, "idle-rule", ["--fault", "nack:channel=999"])
        self.assertGreater(len(frames), 60)
        self.assertEqual(len(pubs), 21)
        self.assertEqual(len(pubs_ref), 21)
        self.assertEqual(sorted(streams_ref), [(0, "c2s"), (0, "s2c")], "one connection's two streams")
        self.assertGreater(min(len(v) for v in streams_ref.values()), 1000)
        self.assertEqual(sorted(streams), sorted(streams_ref))
        for k in streams_ref:
            self.assertEqual(streams[k], streams_ref[k], f"stream {k}")
            self.assertEqual(idle_streams[k], streams_ref[k], f"stream {k} with a rule that selects nothing")
        self.assertEqual(frames, frames_ref)
        self.assertEqual(idle_frames, frames_ref)
        # a reference older than this tree may lack members added since: those it has must agree
        self.assertEqual([{k: v for k, v in p.items() if k in r} for p, r in zip(pubs, pubs_ref)], pubs_ref)
        self.assertEqual(idle_pubs, pubs)


if __name__ == "__main__":
    main()
