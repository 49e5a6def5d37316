# The scenarios of src/DESIGN.md §7 against the real broker, one entry each: how it is driven, what records it must give,
# and which drivers run it. Every driver reads this table: test_scenarios (through the proxy), test_sniff_scenarios
# (through the proxy, then straight to the broker under `amqptap sniff`: the two record sets equal) and
# capture_scenarios (recorded through the proxy into captures/, replayed by test_captures). A new entry is run by
# every driver unless its `skip` says why not.

import json
import os
import signal
import struct
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

import pika
import pika.exceptions

from tapharness import CLIENTS_DIR, MIB, read_records, wait_for
from scenario_lib import RawClient, broker_sh, params, pipelined, props, text_props, traced_publishes

DRIVERS = ("proxy", "sniff", "capture")


@dataclass
class Scenario:
    """drive(run) publishes through run.port (see CaseRun for what a run offers) and returns what expect needs;
    expect(case, out, facts) checks the records: out.records(kind) and out.frame_records() of the process that
    watched (for a golden capture: its committed records, facts None). tap_args: the watching process's options
    (the sniff driver's default is --return-window 300). skip: {driver: why it does not run this entry}."""
    name: str
    design: str
    drive: Callable
    expect: Callable
    tap_args: tuple = ()
    skip: dict = field(default_factory=dict)

    def runs_in(self, driver):
        return driver not in self.skip


# ---- through the proxy and under the sniffer, named by the test case ----

def drive_mandatory_unroutable(run):
    x = run.exchange("x", "direct")
    conn = run.connect()
    ch = conn.channel()
    returns = []
    ch.add_on_return_callback(lambda _c, m, p, b: returns.append((m, p, b)))
    body = b"payload \x00\xff \xe2\x82\xac"
    p = props("m1", correlation_id="c1", delivery_mode=2, content_type="text/plain", headers={"h": "v"})
    ch.basic_publish(x, "nomatch", body, p, mandatory=True)
    while not returns:
        conn.process_data_events(0.1)
    m, rp, rb = returns[0]
    case = run.case
    case.assertEqual((m.reply_code, m.reply_text, m.exchange, m.routing_key), (312, "NO_ROUTE", x, "nomatch"))
    case.assertEqual((rp.message_id, rp.correlation_id, rp.delivery_mode, rp.content_type, rp.headers),
                     ("m1", "c1", 2, "text/plain", {"h": "v"}))
    case.assertEqual(rb, body)
    conn.close()
    return {"x": x, "body": body}


def expect_mandatory_unroutable(case, out, facts):
    recs = out.records("publish")
    case.assertOnePerPublish(recs, ["m1"])
    case.assertRecord(recs[0], route="returned", reply_code=312, reply_text="NO_ROUTE", confirm="none", seq=None,
                      exchange=facts["x"], routing_key="nomatch", mandatory=True, message_id="m1", correlation_id="c1",
                      delivery_mode=2, body_size=len(facts["body"]), order=None)


def drive_thousand_returns(run):
    conn = run.connect()
    ch = conn.channel()
    returns = []
    ch.add_on_return_callback(lambda _c, _m, p, _b: returns.append(p.message_id))
    q = run.name("absent")
    mids = [f"m{i}" for i in range(1000)]
    for i, mid in enumerate(mids):
        ch.basic_publish("", q, b"x" * (i % 50), props(mid), mandatory=True)
    while len(returns) < 1000:
        conn.process_data_events(0.2)
    run.case.assertEqual(returns, mids)
    conn.close()
    return {"mids": mids}


def expect_thousand_returns(case, out, facts):
    recs = out.records("publish")
    mids = facts["mids"]
    case.assertOnePerPublish(recs, mids)
    case.assertEqual([r["message_id"] for r in recs], mids, "records are not in publish order")
    for i, r in enumerate(recs):
        case.assertRecord(r, route="returned", reply_code=312, confirm="none", seq=None, body_size=i % 50)


def drive_exchange_types(run):
    d = run.exchange("direct", "direct")
    f = run.exchange("fanout", "fanout")
    t = run.exchange("topic", "topic")
    h = run.exchange("headers", "headers")
    q = run.queue("q")
    run.bind(q, d, "k")
    run.bind(q, t, "a.*")
    run.bind(q, h, arguments={"x-match": "all", "h": "1"})
    cases = [  # (exchange, routing key, headers, expected route)
        (d, "k", None, "routed"), (d, "other", None, "returned"), (f, "any", None, "returned"),
        (t, "a.b", None, "routed"), (t, "a.b.c", None, "returned"), (h, "", {"h": "1"}, "routed"),
        (h, "", {"h": "2"}, "returned"),
    ]
    conn = run.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    pika_returned = []
    for i, (x, rk, hdrs, _want) in enumerate(cases):
        try:
            ch.basic_publish(x, rk, b"body", props(f"m{i}", headers=hdrs), mandatory=True)
        except pika.exceptions.UnroutableError:
            pika_returned.append(i)
    case = run.case
    case.assertEqual(pika_returned, [i for i, c in enumerate(cases) if c[3] == "returned"])
    with case.assertRaises(pika.exceptions.ChannelClosedByBroker) as cm:
        ch.basic_publish(run.name("nope"), "k", b"body", props("missing"), mandatory=True)
    case.assertEqual(cm.exception.reply_code, 404)
    conn.close()
    return {"cases": cases}


def expect_exchange_types(case, out, facts):
    recs = out.records("publish")
    cases = facts["cases"]
    case.assertOnePerPublish(recs, [f"m{i}" for i in range(len(cases))] + ["missing"])
    by_mid = {r["message_id"]: r for r in recs}
    for i, (x, rk, _h, want) in enumerate(cases):
        r = by_mid[f"m{i}"]
        if want == "routed":
            case.assertRecord(r, seq=i + 1, exchange=x, routing_key=rk, route="routed", confirm="ack", order=None)
        else:
            case.assertRecord(r, seq=i + 1, exchange=x, routing_key=rk, route="returned", reply_code=312,
                              reply_text="NO_ROUTE", confirm="ack", order="return_before_ack")
    r = by_mid["missing"]
    case.assertRecord(r, seq=len(cases) + 1, route="unknown", confirm="unknown")
    case.assertEqual(r["reason"]["by"], "broker", r)
    case.assertEqual(r["reason"]["code"], 404, r)
    case.assertTrue(r["reason"]["text"].startswith("NOT_FOUND - no exchange"), r)


def drive_alternate_exchange(run):
    ae = run.exchange("ae", "fanout")
    aeq = run.queue("aeq")
    run.bind(aeq, ae)
    x = run.exchange("x", "direct", arguments={"alternate-exchange": ae})
    q = run.queue("q")
    run.bind(q, x, "r")
    ae_empty = run.exchange("ae-empty", "fanout")
    x2 = run.exchange("x2", "direct", arguments={"alternate-exchange": ae_empty})
    conn = run.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    keys = ["r", "nope1", "r", "nope2", "nope3"]
    for i, rk in enumerate(keys):
        ch.basic_publish(x, rk, b"b", props(f"m{i}"), mandatory=True)  # raises if returned
    with run.case.assertRaises(pika.exceptions.UnroutableError):
        ch.basic_publish(x2, "nope", b"b", props("m-ae-empty"), mandatory=True)
    conn.close()
    run.assert_message_count(aeq, 3)


def expect_alternate_exchange(case, out, _facts):
    recs = out.records("publish")
    case.assertOnePerPublish(recs, [f"m{i}" for i in range(5)] + ["m-ae-empty"])
    by_mid = {r["message_id"]: r for r in recs}
    for i in range(5):
        case.assertRecord(by_mid[f"m{i}"], seq=i + 1, route="routed", confirm="ack", order=None)
    case.assertRecord(by_mid["m-ae-empty"], seq=6, route="returned", reply_code=312, confirm="ack",
                      order="return_before_ack")


def drive_topic_words(run):
    bindings = ["sensor.#", "sensor.*.temp", "sensor.floor1.#", "sensor.*"]
    keys = ["sensor.floor1.temperature.critical", "sensor.floor1.temp", "sensor.floor2.temp", "sensor.floor1",
            "sensor.x", "sensor", "other.floor1.temp"]
    # which key each binding takes (RabbitMQ topic matching: * one word, # zero or more words)
    takes = {
        "sensor.#": {"sensor.floor1.temperature.critical", "sensor.floor1.temp", "sensor.floor2.temp",
                     "sensor.floor1", "sensor.x", "sensor"},
        "sensor.*.temp": {"sensor.floor1.temp", "sensor.floor2.temp"},
        "sensor.floor1.#": {"sensor.floor1.temperature.critical", "sensor.floor1.temp", "sensor.floor1"},
        "sensor.*": {"sensor.floor1", "sensor.x"},
    }
    exchanges, queues = {}, {}
    for i, b in enumerate(bindings):
        exchanges[b] = run.exchange(f"t{i}", "topic")
        queues[b] = run.queue(f"q{i}")
        run.bind(queues[b], exchanges[b], b)
    conn = run.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    expect = {}
    for b in bindings:
        for k in keys:
            mid = f"{b}|{k}"
            expect[mid] = (exchanges[b], k, "routed" if k in takes[b] else "returned")
            try:
                ch.basic_publish(exchanges[b], k, b"t", props(mid), mandatory=True)
            except pika.exceptions.UnroutableError:
                pass
    conn.close()
    for b in bindings:
        run.assert_message_count(queues[b], len(takes[b]), f"broker routing for {b} is not what the test expects")
    return {"expect": expect}


def expect_topic_words(case, out, facts):
    recs = out.records("publish")
    case.assertOnePerPublish(recs, list(facts["expect"]))
    by_mid = {r["message_id"]: r for r in recs}
    for mid, (x, k, route) in facts["expect"].items():
        case.assertRecord(by_mid[mid], exchange=x, routing_key=k, route=route, confirm="ack",
                          order="return_before_ack" if route == "returned" else None)
    case.assertEqual(by_mid["sensor.*|sensor.floor1.temperature.critical"]["route"], "returned")


def drive_confirm_without_mandatory(run):
    conn = run.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    q = run.name("absent")
    for i in range(3):
        ch.basic_publish("", q, b"b", props(f"m{i}"), mandatory=False)
    ch_no = ch.channel_number
    conn.close()
    return {"channel": ch_no}


def expect_confirm_without_mandatory(case, out, facts):
    recs = out.records("publish")
    case.assertOnePerPublish(recs, ["m0", "m1", "m2"])
    for i, r in enumerate(recs):
        case.assertRecord(r, seq=i + 1, route="unproven", confirm="ack", mandatory=False, order=None)
    warns = [w for w in out.records("warning") if w.get("rule") == "confirm_without_mandatory"]
    case.assertEqual(len(warns), 1, warns)
    case.assertEqual(warns[0]["channel"], facts["channel"])


def drive_nack_on_reject_publish(run):
    q = run.queue("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    conn = run.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", q, b"first", props("m0"), mandatory=True)
    for i in range(1, 4):
        with run.case.assertRaises(pika.exceptions.NackError):
            ch.basic_publish("", q, b"next", props(f"m{i}"), mandatory=True)
    conn.close()


def expect_nack_on_reject_publish(case, out, _facts):
    recs = out.records("publish")
    case.assertOnePerPublish(recs, [f"m{i}" for i in range(4)])
    by_mid = {r["message_id"]: r for r in recs}
    case.assertRecord(by_mid["m0"], seq=1, route="routed", confirm="ack")
    for i in range(1, 4):
        r = by_mid[f"m{i}"]
        case.assertRecord(r, seq=i + 1, confirm="nack", order=None)
        case.assertNotEqual(r["route"], "routed", f"a nacked publish is not proven routed: {r}")
        case.assertNotEqual(r["route"], "returned", r)


def drive_returns_without_message_ids(run):
    """A headers exchange on a confirm channel, 40 mandatory publishes pipelined without message ids, every
    other one matching the binding: same exchange, routing key and size, so a Return names no one publish."""
    x = run.exchange("h", "headers")
    q = run.queue("q")
    run.bind(q, x, "", arguments={"x-match": "all", "k": "v"})
    rc = RawClient(run.port)
    rc.open_confirm_channel(1)
    n = 40
    for i in range(n):
        entries = b"".join(rc.short(k) + b"S" + rc.long(v.encode())
                           for k, v in (("k", "v" if i % 2 == 0 else "w"), ("n", f"{i:02d}")))
        rc.method(1, 60, 40, struct.pack(">H", 0) + rc.short(x) + rc.short("") + b"\x01")
        rc.frame(2, 1, struct.pack(">HHQH", 60, 0, 4, 0x2000) + rc.long(entries))
        rc.frame(3, 1, b"body")
    acked = 0
    while acked < n:
        ftype, ch, payload = rc.read_frame()
        if ftype == 1 and payload[:4] == struct.pack(">HH", 60, 80):
            acked = max(acked, struct.unpack(">Q", payload[4:12])[0])
    rc.method(0, 10, 50, struct.pack(">H", 200) + rc.short("") + struct.pack(">HH", 0, 0))
    rc.expect(0, 10, 51)
    rc.close()
    routed = set()
    admin = run.admin()
    while True:
        m, mprops, _ = admin.basic_get(q, auto_ack=True)
        if m is None:
            break
        routed.add(mprops.headers["n"])
    run.case.assertEqual(routed, {f"{i:02d}" for i in range(0, n, 2)})
    return {"x": x, "n": n, "routed": routed}


def expect_returns_without_message_ids(case, out, facts):
    """No record may contradict what the broker did (read back from the queue); a publish the tap cannot place is
    unknown with reason ambiguous_return, and an ambiguous_return warning names the candidates."""
    recs = out.records("publish")
    routed = facts["routed"]
    case.assertSeqsOnce(recs, facts["n"])
    wrong = [(r["seq"], r["route"]) for r in recs
             if r["route"] in ("routed", "returned") and (r["route"] == "routed") != (f"{r['seq'] - 1:02d}" in routed)]
    case.assertEqual(wrong, [], "records contradicting the broker")
    unknown = [r for r in recs if r["route"] == "unknown"]
    case.assertTrue(all(r["reason"] == {"by": "ambiguous_return"} and r["confirm"] == "ack" for r in unknown),
                    json.dumps(unknown[:3]))
    ambiguous = [w for w in out.records("warning") if w.get("rule") == "ambiguous_return"]
    case.assertEqual(bool(unknown), bool(ambiguous))
    for w in ambiguous:
        case.assertGreaterEqual(w["candidates"], 2)
        case.assertEqual((w["exchange"], w["routing_key"], w["reply_code"]), (facts["x"], "", 312))


LARGE_SIZES = [MIB, 3 * MIB + 17, 131072 - 8, 131072]


def drive_large_message(run):
    q = run.queue("big")
    conn = run.connect(frame_max=131072)
    ch = conn.channel()
    ch.confirm_delivery()
    for i, n in enumerate(LARGE_SIZES):
        ch.basic_publish("", q, bytes([i]) * n, props(f"m{i}"), mandatory=True)
    conn.close()


def expect_large_message(case, out, _facts):
    recs = out.records("publish")
    case.assertOnePerPublish(recs, [f"m{i}" for i in range(len(LARGE_SIZES))])
    by_mid = {r["message_id"]: r for r in recs}
    for i, n in enumerate(LARGE_SIZES):
        case.assertRecord(by_mid[f"m{i}"], seq=i + 1, body_size=n, route="routed", confirm="ack")
    case.assertEqual([r["body_size"] for r in recs], LARGE_SIZES)
    bodies = [f for f in out.frame_records() if f.get("dir") == "c2s" and f.get("frame") == "body"]
    case.assertGreaterEqual(len(bodies), MIB // 131072, "1 MiB did not go out as many body frames")
    case.assertEqual(sum(f["size"] for f in bodies), sum(LARGE_SIZES))


def drive_interleaved_confirm_channels(run):
    q = run.queue("q")
    conn = run.connect()
    # pika's BlockingChannel waits for each confirm; its underlying Channel keeps publishes in flight on both
    # channels at once, so their frames and confirms interleave on the wire.
    chans = [conn.channel()._impl, conn.channel()._impl]
    acks = {c.channel_number: [] for c in chans}
    for c in chans:
        c.confirm_delivery(lambda f, n=c.channel_number: acks[n].append(f.method))
    conn.process_data_events(0.5)
    n = 200
    mids = []
    for i in range(n):
        for c in chans:
            mid = f"c{c.channel_number}-{i}"
            mids.append(mid)
            c.basic_publish("", q, mid.encode() * (1 + i % 7), props(mid), mandatory=True)

    def all_acked():
        return all(v and max(m.delivery_tag for m in v) == n for v in acks.values())

    for _ in range(400):
        if all_acked():
            break
        conn.process_data_events(0.05)
    run.case.assertTrue(all_acked(), {k: len(v) for k, v in acks.items()})
    conn.close()
    return {"n": n, "mids": mids, "channels": [c.channel_number for c in chans]}


def expect_interleaved_confirm_channels(case, out, facts):
    recs = out.records("publish")
    n = facts["n"]
    case.assertOnePerPublish(recs, facts["mids"])
    pubs = traced_publishes(out.frame_records())
    case.assertGreater(sum(1 for a, b in zip(pubs, pubs[1:]) if a[1] != b[1]), n, "channels did not alternate")
    for channel in facts["channels"]:
        mine = [r for r in recs if r["channel"] == channel]
        case.assertSeqsOnce(mine, n)
        for r in mine:
            i = int(r["message_id"].split("-")[1])
            case.assertRecord(r, seq=i + 1, route="routed", confirm="ack", body_size=len(r["message_id"]) * (1 + i % 7))


def drive_transactional_channel(run):
    q = run.queue("q")
    conn = run.connect()
    ch = conn.channel()
    returns = []
    ch.add_on_return_callback(lambda _c, _m, p, _b: returns.append(p.message_id))
    ch.tx_select()
    ch.basic_publish("", q, b"a", props("m0"), mandatory=True)
    ch.basic_publish("", run.name("absent"), b"b", props("m1"), mandatory=True)
    ch.basic_publish("", q, b"c", props("m2"), mandatory=False)
    ch.tx_commit()
    while not returns:
        conn.process_data_events(0.1)
    case = run.case
    case.assertEqual(returns, ["m1"])
    # commit-ok settles the transaction: every verdict is written while the channel is still open
    case.assertTrue(run.wait_publishes(lambda r: len(r) == 3, 10), run.publishes())
    # a transaction rolled back, and one never committed (its channel closes): the broker discards both
    ch.basic_publish("", q, b"d", props("m3"), mandatory=True)
    ch.tx_rollback()
    time.sleep(0.5)  # no return window: the rolled-back publish waited for nothing but rollback-ok
    case.assertEqual(len(run.publishes()), 4)
    ch.basic_publish("", q, b"e", props("m4"), mandatory=True)
    ch.close()
    run.assert_message_count(q, 2)
    conn.close()


def expect_transactional_channel(case, out, _facts):
    recs = out.records("publish")
    case.assertOnePerPublish(recs, ["m0", "m1", "m2", "m3", "m4"])
    by_mid = {r["message_id"]: r for r in recs}
    for r in recs:
        case.assertRecord(r, confirm="none", tx=True, seq=None)
    case.assertRecord(by_mid["m0"], route="routed", order=None)
    case.assertRecord(by_mid["m1"], route="returned", reply_code=312, reply_text="NO_ROUTE", order=None)
    case.assertRecord(by_mid["m2"], route="unproven", order=None)
    case.assertRecord(by_mid["m3"], route="unknown", reason={"by": "tx_rollback"})
    case.assertRecord(by_mid["m4"], route="unknown")
    case.assertEqual(by_mid["m4"]["reason"]["by"], "client")  # pika closes with reply code 0


def drive_clean_close_inside_return_window(run):
    """A channel closed normally (close / close-ok) inside the return window: the broker handles a channel's
    methods in order, so a Return would have come before the close-ok; none came, so the mandatory publish was
    not returned. Without confirms that is `unproven` (src/DESIGN.md §4), not `unknown` with a close reason."""
    q = run.queue("q")
    conn = run.connect()
    ch = conn.channel()
    ch.basic_publish("", q, b"a", props("plain"), mandatory=True)
    ch.close()
    ch = conn.channel()
    ch.tx_select()
    ch.basic_publish("", q, b"a", props("tx"), mandatory=True)
    ch.tx_commit()
    ch.close()
    conn.close()


def expect_clean_close_inside_return_window(case, out, _facts):
    recs = out.records("publish")
    case.assertOnePerPublish(recs, ["plain", "tx"])
    by_mid = {r["message_id"]: r for r in recs}
    case.assertRecord(by_mid["plain"], route="unproven", confirm="none", reason="<absent>")
    case.assertRecord(by_mid["tx"], route="routed", confirm="none", tx=True, reason="<absent>")


def drive_shutdown_writes_pending(run):
    q = run.queue("q")
    conn = run.connect()
    ch = conn.channel()
    returns = []
    ch.add_on_return_callback(lambda _c, _m, p, _b: returns.append(p.message_id))
    for i in range(5):
        ch.basic_publish("", q, b"p", props(f"p{i}"), mandatory=True)
    ch.basic_publish("", run.name("absent"), b"r", props("r0"), mandatory=True)
    while not returns:
        conn.process_data_events(0.1)
    run.wait_publishes(lambda r: any(x.get("message_id") == "r0" for x in r), 10)
    run.case.assertEqual([r["message_id"] for r in run.publishes()], ["r0"],
                         "only the returned publish has its verdict before shutdown")
    run.case.assertEqual(run.tap.stop(signal.SIGTERM), 0)


def expect_shutdown_writes_pending(case, out, _facts):
    recs = out.records("publish")
    case.assertOnePerPublish(recs, [f"p{i}" for i in range(5)] + ["r0"])
    for r in recs:
        if r["message_id"] == "r0":
            case.assertRecord(r, route="returned", reply_code=312, confirm="none")
        else:
            case.assertRecord(r, route="unknown", confirm="none", reason={"by": "shutdown"}, seq=None)


def run_client(run, args):
    """Runs a tests/clients program (args after its name) to its end; asserts it exited 0."""
    path = os.path.join(CLIENTS_DIR, args[0])
    run.case.assertTrue(os.access(path, os.X_OK), f"{path} not built")
    r = subprocess.run([path, *args[1:]], capture_output=True, timeout=120)
    run.case.assertEqual(r.returncode, 0, r.stdout.decode() + r.stderr.decode())


def drive_rabbitmqc_confirm_roundtrip(run):
    q = run.name("rmqc")
    run.owns_queue(q)  # the client declares it
    run_client(run, ["confirm_roundtrip", "127.0.0.1", str(run.port), q, "2000", "100"])


def expect_rabbitmqc_confirm_roundtrip(case, out, _facts):
    pubs = out.records("publish")
    case.assertEqual(len(pubs), 2000)
    case.assertEqual({(r["route"], r["confirm"]) for r in pubs}, {("routed", "ack")})


def drive_rabbitmqc_stream_publisher_returns(run):
    run_client(run, ["stream_publisher", "127.0.0.1", str(run.port), "500", "64", "100", "1", run.name("absent"),
                     ""])


def expect_rabbitmqc_stream_publisher_returns(case, out, _facts):
    pubs = out.records("publish")
    case.assertEqual(len(pubs), 500)
    case.assertEqual({(r["route"], r["confirm"]) for r in pubs}, {("returned", "ack")})


# ---- the golden captures: fixed names (cap.<scenario>.*, so that a re-recording has the same shape) ----

def publish_all(ch, exchange, items, mandatory=True):
    """items: (routing_key, message_id[, properties kw]); pika's blocking publish raises on return/nack."""
    for item in items:
        key, mid = item[0], item[1]
        kw = item[2] if len(item) > 2 else {}
        try:
            ch.basic_publish(exchange, key, f"body of {mid}".encode(), text_props(mid, **kw), mandatory=mandatory)
        except (pika.exceptions.UnroutableError, pika.exceptions.NackError):
            pass


def drive_returned_noconfirm(run):
    """§7.1/7.2: mandatory publishes without confirm to an unroutable key: every one returned 312, in order."""
    x = run.exchange("x", "direct")
    with run.connect() as c:
        ch = c.channel()
        for i in range(1, 21):
            ch.basic_publish(x, "nomatch", f"unroutable {i}".encode(), text_props(f"nc-{i}"), mandatory=True)
        c.process_data_events(0.3)  # the returns arrive before the close


def by_mid(out):
    return {r["message_id"]: r for r in out.records("publish")}


def expect_returned_noconfirm(case, out, _facts):
    p = by_mid(out)
    case.assertEqual([r["route"] for r in p.values()], ["returned"] * 20)
    case.assertEqual(list(p), [f"nc-{i}" for i in range(1, 21)])


def drive_confirm_mandatory(run):
    """§7.3/7.5: confirm + mandatory to direct, fanout, topic and headers exchanges, routed and returned."""
    q = run.queue("q")
    xd = run.exchange("direct", "direct")
    xf = run.exchange("fanout", "fanout")
    xt = run.exchange("topic", "topic")
    xh = run.exchange("headers", "headers")
    xs = run.exchange("sensor", "topic")
    run.bind(q, xd, "match")
    run.bind(q, xt, "a.*")
    run.bind(q, xh, "", {"x-match": "all", "kind": "alarm"})
    qs = {}
    for b in ("sensor.#", "sensor.*.temp", "sensor.floor1.#"):
        qs[b] = run.queue("q." + b)
        run.bind(qs[b], xs, b)
    qstar = run.queue("q.sensor.*")
    run.bind(qstar, xs, "sensor.*")
    with run.connect() as c:
        ch = c.channel()
        ch.confirm_delivery()
        publish_all(ch, xd, [("match", "direct-match"), ("nomatch", "direct-nomatch")])
        publish_all(ch, xf, [("any", "fanout-unbound")])
        publish_all(ch, xt, [("a.b", "topic-match"), ("a.b.c", "topic-nomatch")])
        publish_all(ch, xh, [("", "headers-match", {"headers": {"kind": "alarm"}}),
                             ("", "headers-nomatch", {"headers": {"kind": "info"}})])
        publish_all(ch, xs, [("sensor.floor1.temperature.critical", "sensor-deep"),
                             ("sensor.x.temp", "sensor-temp"), ("other.x", "sensor-nomatch")])


def expect_confirm_mandatory(case, out, _facts):
    p = by_mid(out)
    for mid in ("direct-match", "topic-match", "headers-match", "sensor-deep", "sensor-temp"):
        case.assertEqual((p[mid]["route"], p[mid]["confirm"]), ("routed", "ack"), mid)
    for mid in ("direct-nomatch", "fanout-unbound", "topic-nomatch", "headers-nomatch", "sensor-nomatch"):
        case.assertEqual((p[mid]["route"], p[mid]["reply_code"], p[mid]["order"]),
                         ("returned", 312, "return_before_ack"), mid)


def drive_missing_exchange(run):
    """§7.3: publish to an exchange that does not exist: channel.close 404, route/confirm unknown."""
    with run.connect() as c:
        ch = c.channel()
        ch.confirm_delivery()
        try:
            ch.basic_publish(run.name("nope"), "k", b"to nowhere", text_props("missing-1"), mandatory=True)
        except pika.exceptions.ChannelClosedByBroker:
            pass
        ch2 = c.channel()
        ch2.confirm_delivery()
        ch2.basic_publish("", "amq.nothing", b"after", text_props("after-404"), mandatory=False)


def expect_missing_exchange(case, out, _facts):
    p = by_mid(out)
    case.assertEqual((p["missing-1"]["route"], p["missing-1"]["reason"]["code"]), ("unknown", 404))


def drive_cap_alternate_exchange(run):
    """§7.4: an exchange whose AE has a queue: 5 routed, none returned; an AE without binding: returned 312."""
    ae = run.exchange("ae", "fanout")
    aq = run.queue("ae.q")
    run.bind(aq, ae)
    x = run.exchange("x", "direct", arguments={"alternate-exchange": ae})
    q = run.queue("q")
    run.bind(q, x, "known")
    ae2 = run.exchange("ae-unbound", "fanout")
    x2 = run.exchange("x2", "direct", arguments={"alternate-exchange": ae2})
    with run.connect() as c:
        ch = c.channel()
        ch.confirm_delivery()
        publish_all(ch, x, [("known", "ae-1"), ("other1", "ae-2"), ("known", "ae-3"), ("other2", "ae-4"),
                            ("other3", "ae-5")])
        publish_all(ch, x2, [("other", "ae-unbound-1")])


def expect_cap_alternate_exchange(case, out, _facts):
    p = by_mid(out)
    case.assertEqual([p[f"ae-{i}"]["route"] for i in range(1, 6)], ["routed"] * 5)
    case.assertEqual(p["ae-unbound-1"]["route"], "returned")


def drive_confirm_no_mandatory(run):
    """§7.6: confirm without mandatory to an unroutable key: ack, route unproven, one warning."""
    x = run.exchange("x", "direct")
    with run.connect() as c:
        ch = c.channel()
        ch.confirm_delivery()
        publish_all(ch, x, [("nomatch", "cnm-1"), ("nomatch", "cnm-2")], mandatory=False)


def expect_nothing_more(case, out, _facts):
    """What the golden test checks of every capture (one record per basic.publish, at least one) is all."""


def drive_nack_max_length(run):
    """§7.7: x-max-length 2 with x-overflow reject-publish: two acks, then nacks."""
    q = run.queue("q", arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    with run.connect() as c:
        ch = c.channel()
        ch.confirm_delivery()
        publish_all(ch, "", [(q, f"len-{i}") for i in range(1, 6)])


def expect_nack_max_length(case, out, _facts):
    p = by_mid(out)
    case.assertEqual([p[f"len-{i}"]["confirm"] for i in range(1, 6)], ["ack", "ack", "nack", "nack", "nack"])


def drive_streaming_confirms(run):
    """§7.8: 300 publishes in flight on one confirm channel; acks with multiple=true cover ranges."""
    q = run.queue("q")
    messages = [(text_props(f"s-{i}", delivery_mode=1), f"stream message {i:04d}".encode()) for i in range(1, 301)]
    pipelined(params(run.port), q, messages, mandatory=False)


def expect_streaming_confirms(case, out, _facts):
    p = by_mid(out)
    case.assertEqual(sorted(r["seq"] for r in p.values()), list(range(1, 301)))
    case.assertTrue(any(r["multiple"] for r in p.values()))


def drive_cap_large_message(run):
    """§7.10: frame_max 4096; 20 KB and 9 KB bodies split over several body frames, confirm + mandatory."""
    q = run.queue("q")
    with run.connect(frame_max=4096) as c:
        ch = c.channel()
        ch.confirm_delivery()
        ch.basic_publish("", q, bytes(range(256)) * 80, text_props("large-20k"), mandatory=True)
        try:
            ch.basic_publish("", run.name("none"), b"x" * 9000, text_props("large-9k-returned"), mandatory=True)
        except pika.exceptions.UnroutableError:
            pass


def expect_cap_large_message(case, out, _facts):
    p = by_mid(out)
    case.assertEqual((p["large-20k"]["body_size"], p["large-20k"]["route"]), (20480, "routed"))


def drive_tx_channel(run):
    """§7.10: a transactional channel: publishes, tx.commit, more publishes, tx.rollback."""
    q = run.queue("q")
    with run.connect() as c:
        ch = c.channel()
        ch.tx_select()
        ch.basic_publish("", q, b"tx 1", text_props("tx-1"))
        ch.basic_publish("", q, b"tx 2", text_props("tx-2"))
        ch.tx_commit()
        ch.basic_publish("", q, b"tx 3", text_props("tx-3"))
        ch.tx_rollback()


def expect_tx_channel(case, out, _facts):
    p = by_mid(out)
    case.assertTrue(all(r.get("tx") and r["confirm"] == "none" for r in p.values()))


def drive_client_killed(run):
    """§7.9: a confirm-mode publisher SIGKILLed mid-stream. A memory alarm (vm_memory_high_watermark 0) makes the
    broker block the connection after the first publish, so the 49 written after it are never read, never acked,
    and end `unknown` when the client dies; the capture also shows connection.blocked."""
    q = run.queue("q")
    pid = os.fork()
    if pid == 0:
        try:
            c = pika.BlockingConnection(params(run.port))
            ch = c.channel()
            ch.confirm_delivery()
            ch.basic_publish("", q, b"killed 001", text_props("k-1"))
            broker_sh("ctl", "set_vm_memory_high_watermark", "0")
            ch._impl.basic_publish("", q, b"killed 002", text_props("k-2"))
            c.process_data_events(0.5)  # the broker blocks the connection and stops reading it
            for i in range(3, 51):  # the channel's own publish, which does not wait for the confirm
                ch._impl.basic_publish("", q, f"killed {i:03d}".encode(), text_props(f"k-{i}"))
            c.process_data_events(0.2)  # writes them out
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(3)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        broker_sh("ctl", "set_vm_memory_high_watermark", "0.4")
    if not os.WIFSIGNALED(status):
        raise RuntimeError(f"client_killed: the publisher was not killed (status {status})")
    time.sleep(0.5)


def expect_client_killed(case, out, _facts):
    p = by_mid(out)
    case.assertEqual(p["k-1"]["confirm"], "ack")
    case.assertEqual({p[f"k-{i}"]["confirm"] for i in range(2, 51)}, {"unknown"})


def pump(c, until, timeout=10):
    """Runs pika's I/O until until() holds (a drive that finds it never does raises)."""
    end = time.monotonic() + timeout
    while not until():
        if time.monotonic() > end:
            raise RuntimeError("the broker did not deliver in time")
        c.process_data_events(0.05)


def drive_consumer_acks(run):
    """The consumer side: 8 confirmed publishes through the tap, then one consumer (prefetch 10) settling them
    every way: ack, a multiple ack, nack with requeue (redelivered, then acked), reject without requeue; its cancel;
    basic.get on the empty queue (get-empty), and of a 9th message (get-ok, acked)."""
    q = run.queue("q")
    c = run.connect()
    ch = c.channel()
    ch.basic_qos(prefetch_count=10)  # the tap's first consumer method: from now on it links publishes to deliveries
    pub = c.channel()
    pub.confirm_delivery()
    for i in range(1, 9):
        pub.basic_publish("", q, f"consume {i}".encode(), text_props(f"cons-{i}"), mandatory=True)
    got = []
    ch.basic_consume(q, lambda _ch, m, _p, _b: got.append(m), consumer_tag="cap-consumer")
    pump(c, lambda: len(got) == 8)
    tag = {m.delivery_tag: m for m in got}
    ch.basic_ack(1)
    ch.basic_ack(3, multiple=True)  # 2 and 3
    ch.basic_nack(4, requeue=True)  # comes back redelivered
    ch.basic_reject(5, requeue=False)
    ch.basic_ack(8, multiple=True)  # 6, 7, 8
    pump(c, lambda: len(got) == 9)
    if not got[8].redelivered or len(tag) != 8:
        raise RuntimeError("the nacked message did not come back redelivered")
    ch.basic_ack(got[8].delivery_tag)
    ch.basic_cancel("cap-consumer")
    if ch.basic_get(q)[0] is not None:
        raise RuntimeError("the queue is not empty")
    pub.basic_publish("", q, b"consume 9", text_props("cons-9"), mandatory=True)
    method, _props, _body = ch.basic_get(q)
    ch.basic_ack(method.delivery_tag)
    c.close()


def expect_consumer_acks(case, out, _facts):
    dels = out.records("delivery")
    seen = [(d["message_id"], d["outcome"], d["multiple"], d.get("requeue"), d["redelivered"]) for d in dels]
    case.assertEqual(sorted(seen, key=str), sorted([
        ("cons-1", "ack", False, None, False), ("cons-2", "ack", True, None, False),
        ("cons-3", "ack", True, None, False), ("cons-4", "nack", False, True, False),
        ("cons-4", "ack", False, None, True), ("cons-5", "reject", False, False, False),
        ("cons-6", "ack", True, None, False), ("cons-7", "ack", True, None, False),
        ("cons-8", "ack", True, None, False), ("cons-9", "ack", False, None, False)], key=str), seen)
    case.assertTrue(all(d["queue_us"] > 0 for d in dels), "each linked to its publish through the tap")
    case.assertEqual([d["consumer_tag"] for d in dels if d["message_id"] == "cons-9"], [None], "basic.get")
    cons = out.records("consumer")
    case.assertEqual([(r["event"], r["consumer_tag"]) for r in cons],
                     [("consume", "cap-consumer"), ("cancel", "cap-consumer")])
    case.assertEqual(len(out.records("publish")), 9)


def drive_consumer_channel_closed(run):
    """A consumer (prefetch 5) takes 5 messages and closes its channel without settling any: each is unknown
    (channel_closed); a second channel's consumer gets them again redelivered and acks them at once (multiple);
    a third takes 2 messages of another queue with automatic acks."""
    q = run.queue("q")
    q2 = run.queue("auto")
    c = run.connect()
    first = c.channel()
    first.basic_qos(prefetch_count=5)  # the tap's first consumer method: from now on it links publishes to deliveries
    pub = c.channel()
    pub.confirm_delivery()
    for i in range(1, 6):
        pub.basic_publish("", q, f"closed {i}".encode(), text_props(f"cc-{i}"), mandatory=True)
    for i in range(1, 3):
        pub.basic_publish("", q2, f"auto {i}".encode(), text_props(f"auto-{i}"), mandatory=True)
    got = []
    first.basic_consume(q, lambda _ch, m, _p, _b: got.append(m), consumer_tag="cap-first")
    pump(c, lambda: len(got) == 5)
    first.close()
    second = c.channel()
    again = []
    second.basic_consume(q, lambda _ch, m, _p, _b: again.append(m), consumer_tag="cap-second")
    pump(c, lambda: len(again) == 5)
    second.basic_ack(again[-1].delivery_tag, multiple=True)
    third = c.channel()
    auto = []
    third.basic_consume(q2, lambda _ch, m, _p, _b: auto.append(m), auto_ack=True, consumer_tag="cap-auto")
    pump(c, lambda: len(auto) == 2)
    c.close()


def expect_consumer_channel_closed(case, out, _facts):
    dels = out.records("delivery")
    first = [d for d in dels if d["consumer_tag"] == "cap-first"]
    case.assertEqual([(d["message_id"], d["outcome"], d["reason"]["by"]) for d in first],
                     [(f"cc-{i}", "unknown", "channel_closed") for i in range(1, 6)])
    second = [d for d in dels if d["consumer_tag"] == "cap-second"]
    case.assertEqual([(d["message_id"], d["outcome"], d["redelivered"]) for d in second],
                     [(f"cc-{i}", "ack", True) for i in range(1, 6)])
    auto = [d for d in dels if d["consumer_tag"] == "cap-auto"]
    case.assertEqual([(d["message_id"], d["outcome"]) for d in auto], [("auto-1", "auto_ack"), ("auto-2", "auto_ack")])
    case.assertEqual(len(dels), 12)
    case.assertTrue(all(d["queue_us"] > 0 for d in dels))


# why a driver leaves an entry out
NO_CAPTURE = "no golden capture: captures/ holds one small recording of each §7 scenario (the entries below)"
TAP_ITSELF = "the event under test is the proxy's own stop (SIGTERM with verdicts pending), not traffic"
BATCHING = ("which Returns are ambiguous depends on how the broker batches its acks in each run, so two runs need "
            "not give the same records")
HELD_ORDER = ("28 confirm + mandatory publishes alternate routed ones, written when their hold for a late Return "
              "ends (on the proxy's clock; under the sniffer on the capture's), and returned ones, written at their "
              "ack: the order of the two on the channel, which the sniff driver compares, differs from run to run")
GOLDEN_ONLY = "a golden capture: replayed against its committed records by test_captures"

SCENARIOS = [
    Scenario("1_mandatory_unroutable_is_returned", "§7.1", drive_mandatory_unroutable, expect_mandatory_unroutable,
             skip={"capture": NO_CAPTURE}),
    Scenario("2_thousand_returns_in_publish_order", "§7.2", drive_thousand_returns, expect_thousand_returns,
             skip={"capture": NO_CAPTURE}),
    Scenario("3_exchange_types", "§7.3", drive_exchange_types, expect_exchange_types, skip={"capture": NO_CAPTURE}),
    Scenario("4_alternate_exchange", "§7.4", drive_alternate_exchange, expect_alternate_exchange,
             skip={"capture": NO_CAPTURE}),
    Scenario("5_topic_words", "§7.5", drive_topic_words, expect_topic_words,
             skip={"capture": NO_CAPTURE, "sniff": HELD_ORDER}),
    Scenario("6_confirm_without_mandatory", "§7.6", drive_confirm_without_mandatory, expect_confirm_without_mandatory,
             skip={"capture": NO_CAPTURE}),
    Scenario("7_nack_on_reject_publish", "§7.7", drive_nack_on_reject_publish, expect_nack_on_reject_publish,
             skip={"capture": NO_CAPTURE}),
    Scenario("8_returns_without_message_ids_are_never_guessed", "§7.3", drive_returns_without_message_ids,
             expect_returns_without_message_ids, skip={"capture": NO_CAPTURE, "sniff": BATCHING}),
    Scenario("10a_large_message_many_body_frames", "§7.10", drive_large_message, expect_large_message,
             skip={"capture": NO_CAPTURE}),
    Scenario("10b_interleaved_confirm_channels", "§7.10", drive_interleaved_confirm_channels,
             expect_interleaved_confirm_channels, skip={"capture": NO_CAPTURE}),
    Scenario("10c_transactional_channel", "§7.10", drive_transactional_channel, expect_transactional_channel,
             tap_args=("--return-window", "300"), skip={"capture": NO_CAPTURE}),
    Scenario("10d_clean_close_inside_return_window", "§7.10", drive_clean_close_inside_return_window,
             expect_clean_close_inside_return_window, tap_args=("--return-window", "60000"),
             skip={"capture": NO_CAPTURE}),
    Scenario("shutdown_writes_pending", "§7.9", drive_shutdown_writes_pending, expect_shutdown_writes_pending,
             tap_args=("--return-window", "60000"), skip={"capture": NO_CAPTURE, "sniff": TAP_ITSELF}),
    Scenario("rabbitmqc_confirm_roundtrip", "§7.8", drive_rabbitmqc_confirm_roundtrip,
             expect_rabbitmqc_confirm_roundtrip, skip={"capture": NO_CAPTURE}),
    Scenario("rabbitmqc_stream_publisher_returns", "§7.2", drive_rabbitmqc_stream_publisher_returns,
             expect_rabbitmqc_stream_publisher_returns, skip={"capture": NO_CAPTURE}),
    Scenario("returned_noconfirm", "§7.1, §7.2", drive_returned_noconfirm, expect_returned_noconfirm,
             skip={"proxy": GOLDEN_ONLY, "sniff": GOLDEN_ONLY}),
    Scenario("confirm_mandatory", "§7.3, §7.5", drive_confirm_mandatory, expect_confirm_mandatory,
             skip={"proxy": GOLDEN_ONLY, "sniff": GOLDEN_ONLY}),
    Scenario("missing_exchange", "§7.3", drive_missing_exchange, expect_missing_exchange,
             skip={"proxy": GOLDEN_ONLY, "sniff": GOLDEN_ONLY}),
    Scenario("alternate_exchange", "§7.4", drive_cap_alternate_exchange, expect_cap_alternate_exchange,
             skip={"proxy": GOLDEN_ONLY, "sniff": GOLDEN_ONLY}),
    Scenario("confirm_no_mandatory", "§7.6", drive_confirm_no_mandatory, expect_nothing_more,
             skip={"proxy": GOLDEN_ONLY, "sniff": GOLDEN_ONLY}),
    Scenario("nack_max_length", "§7.7", drive_nack_max_length, expect_nack_max_length,
             skip={"proxy": GOLDEN_ONLY, "sniff": GOLDEN_ONLY}),
    Scenario("streaming_confirms", "§7.8", drive_streaming_confirms, expect_streaming_confirms,
             skip={"proxy": GOLDEN_ONLY, "sniff": GOLDEN_ONLY}),
    Scenario("large_message", "§7.10", drive_cap_large_message, expect_cap_large_message,
             skip={"proxy": GOLDEN_ONLY, "sniff": GOLDEN_ONLY}),
    Scenario("tx_channel", "§7.10", drive_tx_channel, expect_tx_channel,
             skip={"proxy": GOLDEN_ONLY, "sniff": GOLDEN_ONLY}),
    Scenario("client_killed", "§7.9", drive_client_killed, expect_client_killed,
             skip={"proxy": GOLDEN_ONLY, "sniff": GOLDEN_ONLY}),
    Scenario("consumer_acks", "§3 consumers", drive_consumer_acks, expect_consumer_acks,
             skip={"proxy": GOLDEN_ONLY, "sniff": GOLDEN_ONLY}),
    Scenario("consumer_channel_closed", "§3 consumers", drive_consumer_channel_closed, expect_consumer_channel_closed,
             skip={"proxy": GOLDEN_ONLY, "sniff": GOLDEN_ONLY}),
]


def for_each_scenario(driver):
    """A class decorator: a test_<name> method, calling self.check(scenario), for every entry the driver runs."""
    def add(cls):
        for s in scenarios(driver):
            def test(self, s=s):
                self.check(s)
            test.__name__ = f"test_{s.name}"
            test.__doc__ = s.drive.__doc__
            setattr(cls, test.__name__, test)
        return cls
    return add


class RecordFile:
    """A committed records file seen as a watcher's output (for the expectations of a golden capture)."""

    def __init__(self, path):
        self.path = path

    def records(self, kind=None):
        return [r for r in read_records(self.path) if kind is None or r.get("type") == kind]

    def frame_records(self):
        return []


def scenarios(driver):
    """The entries a driver runs, in table order."""
    assert driver in DRIVERS, driver
    return [s for s in SCENARIOS if s.runs_in(driver)]


def by_name(name):
    return next(s for s in SCENARIOS if s.name == name)


class CaseRun:
    """A drive's view of one run in a test case: the port to publish to (the proxy's, or the broker's while a
    sniffer watches), the process that watches (tap), broker objects named by the case (declared once, purged
    between two runs of the same drive), and the publish records the watcher has written so far."""

    def __init__(self, case, port, tap):
        self.case, self.port, self.tap = case, port, tap

    def name(self, suffix):
        return self.case.name(suffix)

    def queue(self, suffix, **kw):
        return self.case.declare_queue(suffix, **kw)

    def exchange(self, suffix, kind, **kw):
        return self.case.declare_exchange(suffix, kind, **kw)

    def bind(self, q, x, key="", arguments=None):
        self.case.admin().queue_bind(q, x, key, arguments=arguments)

    def admin(self):
        return self.case.admin()

    def assert_message_count(self, q, n, msg=None):
        self.case.assertEqual(self.admin().queue_declare(q, passive=True).method.message_count, n, msg)

    def owns_queue(self, q):
        """A queue the client declares: deleted after the test, purged between runs as the declared ones."""
        self.case.own_queue(q)

    def connect(self, **kw):
        """A pika connection to the port, closed after the test if the drive did not close it."""
        c = pika.BlockingConnection(params(self.port, **kw))
        self.case.addCleanup(self.case._close_quietly, c)
        return c

    def publishes(self):
        return self.tap.records("publish")

    def wait_publishes(self, pred, timeout=20):
        return wait_for(lambda: pred(self.publishes()), timeout, 0.05)


class SniffedRun(CaseRun):
    """The second run of a drive, straight to the broker under a sniffer that captures every connection to it: the
    broker objects are the first run's (declared then, purged since), and the broker is not asked anything (the
    test's own connection to it would be in the capture); what it was asked in the first run holds."""

    def queue(self, suffix, **kw):
        return self.name(suffix)

    def exchange(self, suffix, kind, **kw):
        return self.name(suffix)

    def bind(self, q, x, key="", arguments=None):
        pass

    def admin(self):
        raise AssertionError("a drive the sniff driver runs may not use a connection of its own to the broker")

    def assert_message_count(self, q, n, msg=None):
        pass
