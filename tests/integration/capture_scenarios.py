# Records the DESIGN §7 scenarios as small real captures: each scenario is a pika session through an amqptap started
# with --pcap in front of the throwaway broker; the pcapng is then replayed (`amqptap replay`) to write the expected
# records beside it. Broker objects have fixed names ("cap.<scenario>.*") so a re-recording has the same shape.
# Usage: capture_scenarios.py [--out DIR] [NAME...]   (default: every scenario into captures/)

import argparse
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pika  # noqa: E402
import pika.exceptions  # noqa: E402

from tapharness import AMQPTAP_BIN, BROKER_PORT, SOURCE_DIR, start_tap  # noqa: E402

CAPTURES_DIR = os.path.join(SOURCE_DIR, "captures")


def params(port, **kw):
    kw.setdefault("heartbeat", 0)
    kw.setdefault("blocked_connection_timeout", None)
    return pika.ConnectionParameters("127.0.0.1", port, **kw)


def props(mid, **kw):
    return pika.BasicProperties(message_id=mid, delivery_mode=kw.pop("delivery_mode", 2),
                                content_type=kw.pop("content_type", "text/plain"), **kw)


class Admin:
    """Declares and deletes the scenario's broker objects over a direct connection (not in the capture)."""

    def __init__(self):
        self.conn = pika.BlockingConnection(params(BROKER_PORT))
        self.queues = []
        self.exchanges = []

    def ch(self):
        return self.conn.channel()

    def queue(self, name, arguments=None):
        c = self.ch()
        c.queue_delete(name)
        c.queue_declare(name, arguments=arguments)
        self.queues.append(name)
        return name

    def exchange(self, name, kind, arguments=None):
        c = self.ch()
        c.exchange_delete(name)
        c.exchange_declare(name, kind, arguments=arguments)
        self.exchanges.append(name)
        return name

    def bind(self, q, x, key="", arguments=None):
        self.ch().queue_bind(q, x, key, arguments=arguments)

    def close(self):
        c = self.ch()
        for q in self.queues:
            c.queue_delete(q)
        for x in self.exchanges:
            c.exchange_delete(x)
        self.conn.close()


def publish_all(ch, exchange, items, mandatory=True):
    """items: (routing_key, message_id[, properties kw]); pika's blocking publish raises on return/nack."""
    for item in items:
        key, mid = item[0], item[1]
        kw = item[2] if len(item) > 2 else {}
        try:
            ch.basic_publish(exchange, key, f"body of {mid}".encode(), props(mid, **kw), mandatory=mandatory)
        except (pika.exceptions.UnroutableError, pika.exceptions.NackError):
            pass


# ---- scenarios: fn(admin, tap_port) ----

def sc_returned_noconfirm(adm, port):
    """§7.1/7.2: mandatory publishes without confirm to an unroutable key: every one returned 312, in order."""
    x = adm.exchange("cap.returned_noconfirm.x", "direct")
    with pika.BlockingConnection(params(port)) as c:
        ch = c.channel()
        for i in range(1, 21):
            ch.basic_publish(x, "nomatch", f"unroutable {i}".encode(), props(f"nc-{i}"), mandatory=True)
        c.process_data_events(0.3)  # the returns arrive before the close


def sc_confirm_mandatory(adm, port):
    """§7.3/7.5: confirm + mandatory to direct, fanout, topic and headers exchanges, routed and returned."""
    q = adm.queue("cap.confirm_mandatory.q")
    xd = adm.exchange("cap.confirm_mandatory.direct", "direct")
    xf = adm.exchange("cap.confirm_mandatory.fanout", "fanout")
    xt = adm.exchange("cap.confirm_mandatory.topic", "topic")
    xh = adm.exchange("cap.confirm_mandatory.headers", "headers")
    xs = adm.exchange("cap.confirm_mandatory.sensor", "topic")
    adm.bind(q, xd, "match")
    adm.bind(q, xt, "a.*")
    adm.bind(q, xh, "", {"x-match": "all", "kind": "alarm"})
    qs = {}
    for b in ("sensor.#", "sensor.*.temp", "sensor.floor1.#"):
        qs[b] = adm.queue("cap.confirm_mandatory.q." + b)
        adm.bind(qs[b], xs, b)
    qstar = adm.queue("cap.confirm_mandatory.q.sensor.*")
    adm.bind(qstar, xs, "sensor.*")
    with pika.BlockingConnection(params(port)) as c:
        ch = c.channel()
        ch.confirm_delivery()
        publish_all(ch, xd, [("match", "direct-match"), ("nomatch", "direct-nomatch")])
        publish_all(ch, xf, [("any", "fanout-unbound")])
        publish_all(ch, xt, [("a.b", "topic-match"), ("a.b.c", "topic-nomatch")])
        publish_all(ch, xh, [("", "headers-match", {"headers": {"kind": "alarm"}}),
                             ("", "headers-nomatch", {"headers": {"kind": "info"}})])
        publish_all(ch, xs, [("sensor.floor1.temperature.critical", "sensor-deep"),
                             ("sensor.x.temp", "sensor-temp"), ("other.x", "sensor-nomatch")])


def sc_missing_exchange(adm, port):
    """§7.3: publish to an exchange that does not exist: channel.close 404, route/confirm unknown."""
    with pika.BlockingConnection(params(port)) as c:
        ch = c.channel()
        ch.confirm_delivery()
        try:
            ch.basic_publish("cap.missing_exchange.nope", "k", b"to nowhere", props("missing-1"), mandatory=True)
        except pika.exceptions.ChannelClosedByBroker:
            pass
        ch2 = c.channel()
        ch2.confirm_delivery()
        ch2.basic_publish("", "amq.nothing", b"after", props("after-404"), mandatory=False)


def sc_alternate_exchange(adm, port):
    """§7.4: an exchange whose AE has a queue: 5 routed, none returned; an AE without binding: returned 312."""
    ae = adm.exchange("cap.alternate_exchange.ae", "fanout")
    aq = adm.queue("cap.alternate_exchange.ae.q")
    adm.bind(aq, ae)
    x = adm.exchange("cap.alternate_exchange.x", "direct", {"alternate-exchange": ae})
    q = adm.queue("cap.alternate_exchange.q")
    adm.bind(q, x, "known")
    ae2 = adm.exchange("cap.alternate_exchange.ae-unbound", "fanout")
    x2 = adm.exchange("cap.alternate_exchange.x2", "direct", {"alternate-exchange": ae2})
    with pika.BlockingConnection(params(port)) as c:
        ch = c.channel()
        ch.confirm_delivery()
        publish_all(ch, x, [("known", "ae-1"), ("other1", "ae-2"), ("known", "ae-3"), ("other2", "ae-4"),
                            ("other3", "ae-5")])
        publish_all(ch, x2, [("other", "ae-unbound-1")])


def sc_confirm_no_mandatory(adm, port):
    """§7.6: confirm without mandatory to an unroutable key: ack, route unproven, one warning."""
    x = adm.exchange("cap.confirm_no_mandatory.x", "direct")
    with pika.BlockingConnection(params(port)) as c:
        ch = c.channel()
        ch.confirm_delivery()
        publish_all(ch, x, [("nomatch", "cnm-1"), ("nomatch", "cnm-2")], mandatory=False)


def sc_nack_max_length(adm, port):
    """§7.7: x-max-length 2 with x-overflow reject-publish: two acks, then nacks."""
    q = adm.queue("cap.nack_max_length.q", {"x-max-length": 2, "x-overflow": "reject-publish"})
    with pika.BlockingConnection(params(port)) as c:
        ch = c.channel()
        ch.confirm_delivery()
        publish_all(ch, "", [(q, f"len-{i}") for i in range(1, 6)])


def _async_session(port, count, on_ready_extra=None, kill_after_publish=False, routing_key="", persistent=False,
                   frame_max=None):
    """A pika SelectConnection: confirm mode, `count` publishes written at once (so many are in flight and the
    broker answers with multiple=true acks), then a clean close once all are confirmed (or SIGKILL of this
    process right after the publishes are written)."""
    state = {"confirmed": 0}
    kw = {"frame_max": frame_max} if frame_max else {}

    def on_open(conn):
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch):
        state["ch"] = ch
        ch.confirm_delivery(on_confirm, callback=lambda _f: publish(ch))

    def publish(ch):
        for i in range(1, count + 1):
            ch.basic_publish("", routing_key, f"stream message {i:04d}".encode(),
                             props(f"s-{i}", delivery_mode=2 if persistent else 1))
        if kill_after_publish:
            conn.ioloop.call_later(0.02, _die)

    def on_confirm(frame):
        m = frame.method
        if isinstance(m, pika.spec.Basic.Ack) or isinstance(m, pika.spec.Basic.Nack):
            state["confirmed"] = m.delivery_tag
            if m.delivery_tag >= count:
                conn.close()

    conn = pika.SelectConnection(params(port, **kw), on_open_callback=on_open,
                                 on_close_callback=lambda *_a: conn.ioloop.stop())
    conn.ioloop.call_later(30, conn.ioloop.stop)
    conn.ioloop.start()
    return state["confirmed"]


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


def sc_streaming_confirms(adm, port):
    """§7.8: 300 publishes in flight on one confirm channel; acks with multiple=true cover ranges."""
    q = adm.queue("cap.streaming_confirms.q")
    _async_session(port, 300, routing_key=q)


def sc_large_message(adm, port):
    """§7.10: frame_max 4096; 20 KB and 9 KB bodies split over several body frames, confirm + mandatory."""
    q = adm.queue("cap.large_message.q")
    with pika.BlockingConnection(params(port, frame_max=4096)) as c:
        ch = c.channel()
        ch.confirm_delivery()
        ch.basic_publish("", q, bytes(range(256)) * 80, props("large-20k"), mandatory=True)
        try:
            ch.basic_publish("", "cap.large_message.none", b"x" * 9000, props("large-9k-returned"), mandatory=True)
        except pika.exceptions.UnroutableError:
            pass


def sc_tx_channel(adm, port):
    """§7.10: a transactional channel: publishes, tx.commit, more publishes, tx.rollback."""
    q = adm.queue("cap.tx_channel.q")
    with pika.BlockingConnection(params(port)) as c:
        ch = c.channel()
        ch.tx_select()
        ch.basic_publish("", q, b"tx 1", props("tx-1"))
        ch.basic_publish("", q, b"tx 2", props("tx-2"))
        ch.tx_commit()
        ch.basic_publish("", q, b"tx 3", props("tx-3"))
        ch.tx_rollback()


def sc_client_killed(adm, port):
    """§7.9: a confirm-mode publisher SIGKILLed mid-stream. A memory alarm (vm_memory_high_watermark 0) makes the
    broker block the connection after the first publish, so the 49 written after it are never read, never acked,
    and end `unknown` when the client dies; the capture also shows connection.blocked."""
    from scenario_lib import broker_sh
    q = adm.queue("cap.client_killed.q")
    pid = os.fork()
    if pid == 0:
        try:
            c = pika.BlockingConnection(params(port))
            ch = c.channel()
            ch.confirm_delivery()
            ch.basic_publish("", q, b"killed 001", props("k-1"))
            broker_sh("ctl", "set_vm_memory_high_watermark", "0")
            ch._impl.basic_publish("", q, b"killed 002", props("k-2"))
            c.process_data_events(0.5)  # the broker blocks the connection and stops reading it
            for i in range(3, 51):  # the channel's own publish, which does not wait for the confirm
                ch._impl.basic_publish("", q, f"killed {i:03d}".encode(), props(f"k-{i}"))
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


SCENARIOS = {
    "returned_noconfirm": sc_returned_noconfirm,
    "confirm_mandatory": sc_confirm_mandatory,
    "missing_exchange": sc_missing_exchange,
    "alternate_exchange": sc_alternate_exchange,
    "confirm_no_mandatory": sc_confirm_no_mandatory,
    "nack_max_length": sc_nack_max_length,
    "streaming_confirms": sc_streaming_confirms,
    "large_message": sc_large_message,
    "tx_channel": sc_tx_channel,
    "client_killed": sc_client_killed,
}


def replay(cap, port, verdicts, frames=None, binary=AMQPTAP_BIN):
    """Runs `amqptap replay`; the output files are replaced (the tap appends to existing files)."""
    for path in (verdicts, frames):
        if path and os.path.exists(path):
            os.unlink(path)
    args = [binary, "replay", cap, "--port", str(port), "--verdicts", verdicts]
    if frames:
        args += ["--frames", frames]
    return subprocess.run(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=120)


def record(name, out_dir):
    """Runs one scenario through a tap with --pcap; writes NAME.pcapng, NAME.port and NAME.verdicts.jsonl."""
    cap = os.path.join(out_dir, name + ".pcapng")
    tmp = cap + ".tmp"
    if os.path.exists(tmp):
        os.unlink(tmp)
    tap = start_tap(["--pcap", tmp], frames=False)
    adm = Admin()
    try:
        SCENARIOS[name](adm, tap.port)
        time.sleep(0.2)
    finally:
        rc = tap.stop()
        err = tap.stderr()
        tap.cleanup()
        adm.close()
    if rc != 0:
        raise RuntimeError(f"{name}: amqptap exited {rc}: {err[-2000:]}")
    os.replace(tmp, cap)
    with open(os.path.join(out_dir, name + ".port"), "w") as f:
        f.write(f"{BROKER_PORT}\n")
    r = replay(cap, BROKER_PORT, os.path.join(out_dir, name + ".verdicts.jsonl"))
    if r.returncode != 0:
        raise RuntimeError(f"{name}: replay exited {r.returncode}: {r.stderr.decode()}")
    return cap


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=CAPTURES_DIR)
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    names = a.names or list(SCENARIOS)
    for n in names:
        if n not in SCENARIOS:
            ap.error(f"unknown scenario {n!r} (known: {', '.join(SCENARIOS)})")
    os.makedirs(a.out, exist_ok=True)
    for n in names:
        cap = record(n, a.out)
        print(f"{n}: {os.path.getsize(cap)} bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
