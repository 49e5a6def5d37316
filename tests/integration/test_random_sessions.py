# Seeded randomized sessions against the real broker: pika connections through the tap open confirm / plain / tx
# channels, publish to a routable queue, an unroutable key, a missing exchange and a full queue, commit, close and
# reopen channels, and sometimes drop the connection with publishes in flight. Checks THE INVARIANT (one `publish`
# record per basic.publish) and every verdict against what pika saw and what the --frames trace shows the broker
# answered. The oracle reads the trace by channel life (a reopened channel number starts a new one) and takes a
# publish as complete at its last body frame, where the tap tracks it.
# The suite runs the 8 fixed seeds; to hunt for invariant breaks, run new ones by hand (TAP_RANDOM_SEED=N or
# "random"; TAP_RANDOM_OPS sets each seed's operation count):
#   TAP_RANDOM_SEED=random TAP_BROKER_PORT=... AMQPTAP_BIN=build/amqptap PYTHONPATH=tests/integration \
#     /usr/bin/python3 tests/integration/test_random_sessions.py

import collections
import fcntl
import json
import os
import random
import socket
import struct
import termios
import time

import pika
import pika.exceptions

from tapharness import main
from scenario_lib import RawClient, ScenarioCase, frame_lines, publish_records

DEFAULT_SEEDS = [11, 23, 37, 41, 59, 67, 73, 89]
OPS = int(os.environ.get("TAP_RANDOM_OPS", "300"))  # operations per seed (capped at MAX_SECONDS)
MAX_SECONDS = 6.0
# When the client's channel.close crosses the broker's 404 close, the records must carry the broker's reason
# (a tap regression is tagged "[crossed close: broker's 404 lost]"); set to 1 to accept either reason there.
ALLOW_CROSSED = os.environ.get("TAP_RANDOM_ALLOW_CROSSED_CLOSE") == "1"
RETURN_WINDOW_MS = 2000  # the tap's default --return-window
TARGETS = ("routable", "unroutable", "missing", "full")


def seeds():
    env = os.environ.get("TAP_RANDOM_SEED")
    if not env:
        return DEFAULT_SEEDS
    if env == "random":
        return [int.from_bytes(os.urandom(4), "big")]
    return [int(s) for s in env.split(",")]


class Pub:
    """One basic.publish the client handed to the wire, and what the client saw of it."""

    def __init__(self, mid, sess, chan, target, mandatory, seq):
        self.mid, self.sess, self.chan, self.target, self.mandatory, self.seq = mid, sess, chan, target, mandatory, seq
        self.mode = chan.mode
        self.t_pub = time.monotonic()
        self.pika = None  # "ack" | "nack" (confirm callback), plus .returned
        self.returned = False
        self.end = None  # how the channel ended while this was outstanding: (kind, monotonic time)

    def describe(self):
        return (f"{self.mid} conn#{self.sess.n} ch{self.chan.number} mode={self.mode} target={self.target} "
                f"mandatory={self.mandatory} seq={self.seq} pika={self.pika} returned={self.returned} end={self.end}")


def mark_end(chans, kind):
    """Notes for every publish still open on `chans` that its connection ended now, and how."""
    now = time.monotonic()
    for c in chans:
        for p in c.pubs:
            if p.end is None:
                p.end = (kind, now)


class Chan:
    def __init__(self, sess, impl, mode):
        self.sess, self.impl, self.mode = sess, impl, mode
        self.number = impl.channel_number
        self.seq = 0
        self.pending = {}  # confirm seq -> Pub (confirm channels)
        self.pubs = []  # every Pub of this channel
        self.closed = None  # (by, code) once closed
        self.uncommitted = False
        self.committing = False  # tx.commit sent, commit-ok not yet seen: the broker takes no other command


class Session:
    """One client connection: pika (async channels under a BlockingConnection) or a RawClient burst."""

    def __init__(self, n, conn):
        self.n, self.conn = n, conn
        self.chans = []
        self.ended = None


class RandomSessions(ScenarioCase):
    def setUp(self):
        super().setUp()
        self.log = []

    def step(self, text):
        self.log.append(f"{time.monotonic() - self.t0:7.3f} {text}")

    # ---- the client side ----

    def new_session(self, tap):
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tap.port, heartbeat=0,
                                                              blocked_connection_timeout=None))
        self.n_sessions += 1
        s = Session(self.n_sessions - 1, c)
        self.sessions.append(s)
        self.step(f"conn#{s.n} open")
        return s

    def open_chan(self, s, mode):
        impl = s.conn.channel()._impl
        ch = Chan(s, impl, mode)

        def on_close(_impl, reason):
            by = "broker" if isinstance(reason, pika.exceptions.ChannelClosedByBroker) else "client"
            ch.closed = (by, getattr(reason, "reply_code", None))
            for p in ch.pubs:
                if p.end is None and (p.mode != "confirm" or p.pika is None):
                    p.end = (f"chan_{by}_{ch.closed[1]}", time.monotonic())

        def on_return(_impl, method, props, _body):
            for p in ch.pubs:
                if p.mid == props.message_id:
                    p.returned = True
                    self.assertEqual(method.reply_code, 312, p.describe())

        def on_confirm(frame):
            m = frame.method
            kind = "ack" if isinstance(m, pika.spec.Basic.Ack) else "nack"
            tags = [t for t in ch.pending if t <= m.delivery_tag] if m.multiple else [m.delivery_tag]
            for t in tags:
                p = ch.pending.pop(t, None)
                if p is not None:
                    p.pika = kind

        impl.add_on_close_callback(on_close)
        impl.add_on_return_callback(on_return)
        done = []
        if mode == "confirm":
            impl.confirm_delivery(on_confirm, callback=lambda _f: done.append(1))
        elif mode == "tx":
            impl.tx_select(callback=lambda _f: done.append(1))
        else:
            done.append(1)
        s.chans.append(ch)
        if not self.wait(s, lambda: done or ch.closed is not None, f"{mode}.select"):
            return ch
        self.step(f"conn#{s.n} ch{ch.number} open {mode}")
        return ch

    def publish(self, ch, target, mandatory):
        exchange, key = "", self.queue
        if target == "unroutable":
            key = self.name("absent")
        elif target == "missing":
            exchange, key = self.name("nope"), "k"
        elif target == "full":
            key = self.full
        self.counter += 1
        mid = f"s{self.seed}-{self.counter}"
        try:
            ch.impl.basic_publish(exchange, key, mid.encode() * self.rng.randint(0, 5),
                                  pika.BasicProperties(message_id=mid), mandatory=mandatory)
        except (pika.exceptions.ChannelWrongStateError, pika.exceptions.ConnectionWrongStateError):
            self.counter -= 1
            return None
        seq = None
        if ch.mode == "confirm":
            ch.seq += 1
            seq = ch.seq
        p = Pub(mid, ch.sess, ch, target, mandatory, seq)
        if seq is not None:
            ch.pending[seq] = p
        if ch.mode == "tx":
            ch.uncommitted = True
        ch.pubs.append(p)
        self.pubs[mid] = p
        self.step(f"conn#{ch.sess.n} ch{ch.number} publish {mid} {target} mandatory={mandatory}")
        return p

    def wait(self, s, pred, what, limit=3.0):
        """Pumps s until pred(); a broker that never answers (RabbitMQ drops a client channel.close that crosses its
        own close on a busy channel) gets the connection dropped, publishes in flight and all."""
        end = time.monotonic() + limit
        while not pred():
            if time.monotonic() > end:
                self.step(f"conn#{s.n} no answer to {what} within {limit}s: dropping the connection")
                self.end_session(s, abrupt=True)
                return False
            self.pump(s, 0.02)
        return True

    def pump(self, s, t=0):
        try:
            s.conn.process_data_events(t)
        except pika.exceptions.AMQPError as e:
            self.fail(f"connection #{s.n} failed while pumping: {e!r}")

    def flush(self, s):
        tr = s.conn._impl._transport
        for _ in range(200):
            if tr is None or tr.get_write_buffer_size() == 0:
                return
            self.pump(s, 0.01)
        self.fail(f"conn#{s.n}: pika did not flush its output")

    def sent_out(self, s):
        """Waits until the tap's kernel has acknowledged every byte pika handed to its socket. TCP may hold some back
        (BBR paces even on loopback), and a socket closed with unread input resets and drops what it still
        holds: those publishes would never reach the tap, though pika made them."""
        sock = s.conn._impl._transport._sock
        end = time.monotonic() + 5
        while time.monotonic() < end:
            if struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0] == 0:
                return
            time.sleep(0.001)
        self.fail(f"conn#{s.n}: the kernel did not send pika's output")

    def end_session(self, s, abrupt):
        live = [c for c in s.chans if c.closed is None]
        if any(c.committing or c.impl.is_closing for c in live):
            abrupt = True  # pika's close would wait on an answer RabbitMQ may never give (see wait())
        if abrupt:
            self.flush(s)
            self.sent_out(s)  # every publish made is on the wire; its answer may not be
            # FIN without connection.close; pika then sees its stream end
            s.conn._impl._transport._sock.shutdown(socket.SHUT_RDWR)
            try:
                for _ in range(100):
                    s.conn.process_data_events(0.01)
            except pika.exceptions.AMQPError:
                pass
            mark_end(live, "abort")
            self.step(f"conn#{s.n} ABORT")
        else:
            # the async close: BlockingConnection.close() trips over channels opened through _impl
            s.conn._impl.close()
            end = time.monotonic() + 3
            try:
                while not s.conn._impl.is_closed and time.monotonic() < end:
                    s.conn.process_data_events(0.02)
            except pika.exceptions.AMQPError:
                pass
            self.assertTrue(s.conn._impl.is_closed, f"conn#{s.n}: no connection.close-ok")
            mark_end(live, "conn_close")
            self.step(f"conn#{s.n} close")
        s.ended = "abort" if abrupt else "close"
        self.sessions.remove(s)

    def raw_burst(self, tap):
        """A RawClient confirm channel that publishes a few messages (the last one maybe cut inside its body) and
        drops the socket without reading a reply."""
        rc = RawClient(tap.port)
        rc.open_confirm_channel(1)
        sess = Session(-1, None)
        ch = Chan.__new__(Chan)
        ch.sess, ch.mode, ch.number, ch.pending, ch.pubs, ch.closed, ch.seq = sess, "confirm", 1, {}, [], None, 0
        n = self.rng.randint(1, 4)
        cut = self.rng.random() < 0.5
        for i in range(n):
            self.counter += 1
            mid = f"s{self.seed}-{self.counter}"
            target = self.rng.choice(["routable", "unroutable"])
            key = self.queue if target == "routable" else self.name("absent")
            body = b"r" * 100
            partial = cut and i == n - 1
            rc.publish_parts(1, "", key, body, mid, mandatory=True, body_sent=40 if partial else None)
            ch.seq += 1
            p = Pub(mid, sess, ch, target, True, ch.seq)
            p.raw_partial = partial
            ch.pubs.append(p)
            self.pubs[mid] = p
        rst = self.rng.random() < 0.5
        if rst:  # the kernel drops what the tap has not read yet: those publishes never reach it
            rc.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        rc.close()
        now = time.monotonic()
        for p in ch.pubs:
            p.end = ("abort", now)
            p.raw_rst = rst
        self.step(f"raw burst {n} publishes cut={cut} {'RST' if rst else 'FIN'}: {ch.pubs[0].mid}..{ch.pubs[-1].mid}")

    def run_session(self, tap):
        rng = self.rng
        end = time.monotonic() + MAX_SECONDS
        self.new_session(tap)
        for _ in range(OPS):
            if time.monotonic() > end:
                break
            if not self.sessions:
                self.new_session(tap)
            s = rng.choice(self.sessions)
            live = [c for c in s.chans if c.closed is None and c.impl.is_open and not c.committing]
            r = rng.random()
            if r < 0.02 and len(self.sessions) < 2:
                self.new_session(tap)
            elif r < 0.10 and len(live) < 4:
                self.open_chan(s, rng.choice(["confirm", "confirm", "plain", "tx"]))
            elif r < 0.70 and live:
                ch = rng.choice(live)
                target = rng.choices(TARGETS, weights=[6, 3, 1, 2])[0]
                for _ in range(rng.choice([1, 1, 1, 3, 8])):
                    self.publish(ch, target, rng.random() < 0.6)
            elif r < 0.78 and live:
                txs = [c for c in live if c.mode == "tx"]
                if txs:
                    ch = rng.choice(txs)
                    ch.committing = True

                    def commit_ok(_f, ch=ch):
                        ch.committing = ch.uncommitted = False

                    ch.impl.tx_commit(callback=commit_ok)
                    self.step(f"conn#{s.n} ch{ch.number} tx.commit")
                    if rng.random() < 0.7:  # else commit-ok comes during later operations (or never: abort)
                        self.wait(s, lambda: not ch.committing or ch.closed is not None, "tx.commit")
            elif r < 0.84 and live:
                ch = rng.choice(live)
                self.step(f"conn#{s.n} ch{ch.number} close")
                ch.impl.close()
                if rng.random() < 0.5:
                    self.wait(s, lambda: ch.closed is not None, "channel.close")
            elif r < 0.88:
                self.end_session(s, abrupt=rng.random() < 0.6)
            elif r < 0.90:
                self.raw_burst(tap)
            elif r < 0.95:
                self.pump(s, rng.choice([0, 0.01, 0.05]))
            else:
                self.pump(s, 0)
            # reopened channels after a broker close: keep a channel around
            if s in self.sessions and not [c for c in s.chans if c.impl.is_open] and rng.random() < 0.5:
                self.open_chan(s, rng.choice(["confirm", "plain", "tx"]))
        for s in list(self.sessions):
            self.end_session(s, abrupt=rng.random() < 0.5)

    # ---- what the broker answered, from the --frames trace ----

    def trace_outcomes(self, frames):
        """{message_id: info} for every publish the tap decoded: conn, channel, confirm seq, the broker's ack/nack
        covering it, and whether a Basic.Return carrying its message_id came back."""
        info = {}
        epoch = {}  # (conn, ch) -> {"seq": n or None, "pending": {seq: mid}}
        last_pub = {}
        ret_pending = set()
        n_publish = 0
        headerless = 0
        tx_open, tx_ending = {}, {}  # (conn, ch) -> mids since the last tx.commit; [mids of each commit unanswered]
        for f in frames:
            key = (f.get("conn"), f.get("channel"))
            d, kind, method = f.get("dir"), f.get("frame"), f.get("method")
            if kind == "method" and method == "tx.commit" and d == "c2s":
                tx_ending.setdefault(key, []).append(tx_open.pop(key, []))
            elif kind == "method" and method == "tx.commit-ok" and d == "s2c" and tx_ending.get(key):
                for mid in tx_ending[key].pop(0):
                    if mid in info:
                        info[mid]["committed"] = True
            elif kind == "method" and method == "channel.open" and d == "c2s":
                tx_open.pop(key, None)
                tx_ending.pop(key, None)
            if kind == "method" and method == "channel.open" and d == "c2s":
                epoch[key] = {"seq": None, "pending": {}, "life": epoch.get(key, {}).get("life", 0) + 1}
            elif kind == "method" and method == "confirm.select" and d == "c2s":
                epoch.setdefault(key, {"seq": None, "pending": {}})["seq"] = 0
            elif kind == "method" and method == "basic.publish" and d == "c2s":
                n_publish += 1
                if last_pub.get(key):
                    headerless += 1
                last_pub[key] = True
            elif kind == "header" and d == "c2s" and last_pub.pop(key, False):
                mid = (f.get("props") or {}).get("message_id")
                e = epoch.setdefault(key, {"seq": None, "pending": {}})
                seq = None
                if e["seq"] is not None:
                    e["seq"] += 1
                    seq = e["seq"]
                    e["pending"][seq] = mid
                info[mid] = {"conn": key[0], "channel": key[1], "life": e.get("life", 0), "seq": seq,
                             "confirm": None, "returned": False, "committed": False, "ts": f.get("ts")}
                tx_open.setdefault(key, []).append(mid)
            elif kind == "method" and method in ("basic.ack", "basic.nack") and d == "s2c":
                a = f.get("args", {})
                e = epoch.get(key)
                if e:
                    tag = a.get("delivery_tag")
                    tags = [t for t in e["pending"] if t <= tag] if a.get("multiple") else [tag]
                    for t in tags:
                        mid = e["pending"].pop(t, None)
                        if mid in info:
                            info[mid]["confirm"] = "ack" if method == "basic.ack" else "nack"
            elif kind == "method" and method == "basic.return" and d == "s2c":
                ret_pending.add(key)
            elif kind == "header" and d == "s2c" and key in ret_pending:
                ret_pending.discard(key)
                mid = (f.get("props") or {}).get("message_id")
                if mid in info:
                    info[mid]["returned"] = True
        headerless += sum(1 for v in last_pub.values() if v)
        return info, n_publish, headerless

    # ---- the checks ----

    def expected(self, p, tr, life, chan_close):
        """A list of acceptable {field: value} dicts for p's record (reason checked separately); life: the channel
        life it was published on, chan_close: broker_closes()."""
        base = {"seq": p.seq, "mandatory": p.mandatory}
        if p.mode == "tx":
            base["tx"] = True
        if p.mode == "confirm":
            if tr["confirm"] is not None:
                if tr["returned"]:
                    return [dict(base, route="returned", reply_code=312, confirm=tr["confirm"])]
                if tr["confirm"] == "nack":
                    return [dict(base, route="unproven", confirm="nack")]
                return [dict(base, route="routed" if p.mandatory else "unproven", confirm="ack")]
            if tr["returned"]:
                return [dict(base, route="returned", reply_code=312, confirm="unknown")]
            return [dict(base, route="unknown", confirm="unknown")]
        if tr["returned"]:
            return [dict(base, route="returned", reply_code=312, confirm="none")]
        if p.mode == "tx":
            # the broker sends a transaction's Returns before its commit-ok: a committed mandatory publish without
            # one was routed; one never committed was discarded with its channel (unknown, the close's reason)
            if tr["committed"]:
                return [dict(base, route="routed" if p.mandatory else "unproven", confirm="none")]
            return [dict(base, route="unknown", confirm="none")]
        if not p.mandatory:
            # held 50 ms; a publish the tap saw after the broker's channel.close waits and ends unknown, and so do
            # the one a 404 refused and those sent after it on its channel (issue 14 §2: "refused"). The trace
            # says whether the broker's 404 followed it: pika may call a close its own when the broker's crossed it
            refused = (p.end is not None and p.end[0] == "chan_broker_404") or \
                chan_close.get(life + ("close_after", p.mid)) == ("broker", 404) or \
                chan_close.get(life + ("crossed",)) == 404
            return [dict(base, route="unproven", confirm="none"), dict(base, route="unknown", confirm="none",
                                                                      _late=not refused)]
        settled = p.end is not None and p.end[0] in ("chan_client_200", "conn_close")
        if settled or p.end is None:
            return [dict(base, route="unproven", confirm="none")]
        out = [dict(base, route="unproven", confirm="none")]
        if p.end[1] - p.t_pub < RETURN_WINDOW_MS / 1000 + 1.0:
            out.append(dict(base, route="unknown", confirm="none"))
        return out

    def check_record(self, p, tr, rec, chan_close):
        life = (tr["conn"], tr["channel"], tr["life"])  # this channel number's life the publish was on
        alts = self.expected(p, tr, life, chan_close)
        got = {k: rec.get(k, "<absent>") for k in ("seq", "mandatory", "route", "confirm", "reply_code", "tx")}
        ok = False
        for want in alts:
            late = want.pop("_late", False)
            if any(got.get(k) != v for k, v in want.items()):
                continue
            if ALLOW_CROSSED and want["route"] == "unknown" and \
                    chan_close.get(life + ("crossed",)):
                ok = True
                break
            if p.mode != "tx" and got["tx"] not in ("<absent>", False):
                continue
            if want["route"] == "unknown":
                reason = rec.get("reason")
                if not isinstance(reason, dict):
                    continue
                closed = chan_close.get(life + ("late", p.mid)) or chan_close.get(life + ("close_after", p.mid))
                if late and life + ("late", p.mid) not in chan_close:
                    continue
                if chan_close.get(life + ("crossed",)):
                    closed = ("broker", 404)  # crossed closes: the broker's reason wins
                # the broker's close names the reason (a client's close may be overtaken by the connection's end)
                if closed and closed[0] == "broker" and (reason.get("by") != "broker" or
                                                         reason.get("code") != closed[1]):
                    continue
            ok = True
            break
        if not ok:
            tag = ""
            if rec.get("route") == "unknown" and (rec.get("reason") or {}).get("by") == "client" and \
                    chan_close.get(life + ("crossed",)):
                tag = "[crossed close: broker's 404 lost] "
            return (f"{tag}{p.describe()}\n    trace: {tr}\n    expected one of: {alts}\n    record: {json.dumps(rec)}")
        if p.pika is not None and tr["confirm"] != p.pika:
            return f"{p.describe()}: pika saw {p.pika}, the trace shows {tr['confirm']}"
        if p.returned and not tr["returned"]:
            return f"{p.describe()}: pika saw a Return the trace lacks"
        return None

    def broker_closes(self, frames):
        """What the channel closes mean for the publishes, keyed by channel life (conn, ch, n: the n-th
        channel.open of that number; a reopened channel starts a new life): (life, "close_after", mid) -> (by, code)
        for publishes the tap saw before a channel.close (by: "broker" | "client"); (life, "late", mid) ->
        ("broker", code) for publishes it completed after the broker's close, before close-ok; (life, "crossed") ->
        the broker's reply code when its close crossed the client's."""
        out = {}
        lives = collections.Counter()
        open_mids = collections.defaultdict(list)
        last_pub = {}
        client_closed = set()
        closing = {}  # life -> the broker's reply code, from its channel.close to the close-ok
        content = {}  # (conn, ch) -> [message_id, body bytes still to come]
        for f in frames:
            key = (f.get("conn"), f.get("channel"))
            kind, d, method = f.get("frame"), f.get("dir"), f.get("method")
            if kind == "method" and method == "channel.open" and d == "c2s":
                lives[key] += 1
            life = key + (lives[key],)
            if kind == "method" and method == "basic.publish" and d == "c2s":
                last_pub[key] = True
            elif kind == "header" and d == "c2s":
                mid = (f.get("props") or {}).get("message_id")
                if last_pub.pop(key, False):
                    open_mids[life].append(mid)
                content[key] = [mid, f.get("body_size", 0)]
            elif kind == "body" and d == "c2s" and key in content:
                content[key][1] -= f.get("size", 0)
            elif kind == "method" and method == "channel.close":
                by = "broker" if d == "s2c" else "client"
                code = f.get("args", {}).get("reply_code")
                if by == "broker" and life in client_closed:
                    out[life + ("crossed",)] = code
                for mid in open_mids.pop(life, []):
                    out[life + ("close_after", mid)] = (by, code)
                if by == "client":
                    client_closed.add(life)
                else:
                    closing[life] = code
            elif kind == "method" and method == "channel.close-ok":
                open_mids.pop(life, None)
                client_closed.discard(life)
                closing.pop(life, None)
            # a publish is complete at its last body frame (at its header when the body is empty); that is where
            # the tap tracks it, so a header before the broker's close with its body after it is late as well
            if kind in ("header", "body") and d == "c2s" and key in content and content[key][1] <= 0:
                mid = content.pop(key)[0]
                if life in closing:
                    out[life + ("late", mid)] = ("broker", closing[life])
        return out

    def run_seed(self, seed):
        self.seed, self.rng = seed, random.Random(seed)
        self.t0 = time.monotonic()
        self.sessions, self.pubs, self.counter, self.n_sessions = [], {}, 0, 0
        self.queue = self.declare_queue(f"q{seed}")
        self.full = self.declare_queue(f"full{seed}", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        self.admin().basic_publish("", self.full, b"filler")
        tap = self.start_tap(["--return-window", str(RETURN_WINDOW_MS)])
        try:
            self.run_session(tap)
        finally:
            for s in list(self.sessions):
                try:
                    s.conn.close()
                except Exception:
                    pass
        rc = tap.stop()
        self.assertEqual(rc, 0, f"seed {seed}: amqptap exited {rc}: {tap.stderr()[-2000:]}")
        recs = publish_records(tap.verdicts)
        frames = frame_lines(tap.frames)
        trace, n_traced, n_headerless = self.trace_outcomes(frames)
        closes = self.broker_closes(frames)
        problems = []
        counts = collections.Counter(r.get("message_id") for r in recs)
        if counts.get(None, 0) != n_headerless:
            problems.append(f"{counts.get(None, 0)} records without message_id for {n_headerless} basic.publish "
                            "frames whose content header never came")
        for mid, n in counts.items():
            if mid is None:
                continue
            if n != 1 or mid not in self.pubs:
                problems.append(f"message_id {mid!r}: {n} records, {'sent' if mid in self.pubs else 'never sent'}")
        if len(recs) != n_traced:
            problems.append(f"{len(recs)} publish records for {n_traced} basic.publish frames in the trace")
        by_mid = {r.get("message_id"): r for r in recs}
        for mid, p in self.pubs.items():
            if mid not in trace:
                if not getattr(p, "raw_rst", False):
                    problems.append(f"{p.describe()}: not in the frame trace (the client did not send it?)")
                continue
            if mid not in by_mid:
                problems.append(f"{p.describe()}: NO publish record")
                continue
            err = self.check_record(p, trace[mid], by_mid[mid], closes)
            if err:
                problems.append(err)
        kinds = collections.Counter((p.mode, p.target, p.mandatory, by_mid.get(p.mid, {}).get("route"),
                                     by_mid.get(p.mid, {}).get("confirm")) for p in self.pubs.values())
        summary = f"seed {seed}: {len(self.pubs)} publishes, {len(recs)} records, {len(self.log)} steps"
        print(summary, flush=True)
        if os.environ.get("TAP_RANDOM_VERBOSE") == "1":
            for k, n in sorted(kinds.items(), key=str):
                print(f"  {n:4d} {k}")
        if problems:
            logpath = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"amqptap-random-{seed}.log")
            with open(logpath, "w") as f:
                f.write("\n".join(self.log) + "\n")
            print(f"FAILED seed {seed} (replay: TAP_RANDOM_SEED={seed}); full operation log: {logpath}; last steps:")
            print("\n".join(self.log[-60:]))
            print("problems:\n  " + "\n  ".join(problems))
        self.assertEqual(problems[:20], [], f"seed {seed}: {len(problems)} problems (replay: TAP_RANDOM_SEED={seed})")


def _make(seed):
    def test(self):
        self.run_seed(seed)
    test.__name__ = f"test_seed_{seed}"
    return test


for _seed in seeds():
    setattr(RandomSessions, f"test_seed_{_seed}", _make(_seed))


if __name__ == "__main__":
    main()
