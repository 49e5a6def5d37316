#!/usr/bin/env python3
"""Writes a pcapng capture of N AMQP connections that each log in (a pika-like client, a RabbitMQ-like broker), open
channel 1, select confirms, publish one message and get its ack, and are then left open: at the capture's end all N
are open flows at once, as in a replay of a busy broker's capture. What `amqptap replay` keeps per open connection
is what this measures (tests/bench/README.md, test_captures.FlowMemory).

With --channels C: N connections (default 300) whose client logs in and, on each of C channels (at most 2,047),
opens it, selects confirms and publishes once, all in one stream the broker never answers (issue 37's channel flood:
what the tracking budget bounds, tests/bench/README.md).

Usage: flowcap.py OUT.pcapng [N (65536)] [PORT (5672)] [--channels C]. Python 3 stdlib only."""

import struct
import sys


def shortstr(s):
    s = s.encode()
    return bytes([len(s)]) + s


def longstr(b):
    if isinstance(b, str):
        b = b.encode()
    return struct.pack("!I", len(b)) + b


def table(fields):
    out = b""
    for k, v in fields:
        out += shortstr(k)
        if isinstance(v, bool):
            out += b"t" + bytes([v])
        elif isinstance(v, list):
            out += b"F" + table(v)
        else:
            out += b"S" + longstr(v)
    return struct.pack("!I", len(out)) + out


def frame(ftype, channel, payload):
    return struct.pack("!BHI", ftype, channel, len(payload)) + payload + b"\xce"


def method(channel, cls, mth, args=b""):
    return frame(1, channel, struct.pack("!HH", cls, mth) + args)


SERVER_PROPS = table([
    ("capabilities", [("publisher_confirms", True), ("exchange_exchange_bindings", True), ("basic.nack", True),
                      ("consumer_cancel_notify", True), ("connection.blocked", True),
                      ("consumer_priorities", True), ("authentication_failure_close", True),
                      ("per_consumer_qos", True), ("direct_reply_to", True)]),
    ("cluster_name", "rabbit@bench"), ("copyright", "Copyright (c) 2007-2024 Broadcom Inc and/or its subsidiaries"),
    ("information", "Licensed under the MPL 2.0. Website: https://rabbitmq.com"), ("platform", "Erlang/OTP 26.2.1"),
    ("product", "RabbitMQ"), ("version", "3.13.7")])
CLIENT_PROPS = table([
    ("product", "Pika Python Client Library"), ("platform", "Python 3.11.2"),
    ("capabilities", [("authentication_failure_close", True), ("basic.nack", True), ("connection.blocked", True),
                      ("consumer_cancel_notify", True), ("publisher_confirms", True)]),
    ("information", "See http://pika.rtfd.org"), ("version", "1.2.0")])

C2S = [
    b"AMQP\x00\x00\x09\x01",
    method(0, 10, 11, CLIENT_PROPS + shortstr("PLAIN") + longstr(b"\0guest\0guest") + shortstr("en_US")),
    method(0, 10, 31, struct.pack("!HIH", 2047, 131072, 60)) + method(0, 10, 40, shortstr("/") + b"\0\0"),
    method(1, 20, 10, b"\0") + method(1, 85, 10, b"\0"),
    method(1, 60, 40, struct.pack("!H", 0) + shortstr("bench.x") + shortstr("bench.key") + b"\0")
    + frame(2, 1, struct.pack("!HHQH", 60, 0, 64, 0)) + frame(3, 1, bytes(range(64))),
]
S2C = [
    method(0, 10, 10, b"\0\x09" + SERVER_PROPS + longstr("AMQPLAIN PLAIN") + longstr("en_US")),
    method(0, 10, 30, struct.pack("!HIH", 2047, 131072, 60)),
    method(0, 10, 41, b"\0"),
    method(1, 20, 11, longstr(b"")) + method(1, 85, 11),
    method(1, 60, 80, struct.pack("!QB", 1, 0)),
]


def epb(ts_us, frame_bytes):
    pad = (-len(frame_bytes)) % 4
    body = struct.pack("<IIIII", 0, ts_us >> 32, ts_us & 0xFFFFFFFF, len(frame_bytes), len(frame_bytes))
    body += frame_bytes + b"\0" * pad
    return struct.pack("<II", 6, 12 + len(body)) + body + struct.pack("<I", 12 + len(body))


def packet(src, sport, dst, dport, seq, ack, flags, payload, ident):
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 5 << 4, flags, 65535, 0, 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp) + len(payload), ident & 0xFFFF, 0x4000, 64, 6, 0, src,
                     dst)
    return b"\x02\0\0\0\0\x01\x02\0\0\0\0\x02\x08\x00" + ip + tcp + payload


SHB = struct.pack("<IIIHHq", 0x0A0D0D0A, 28, 0x1A2B3C4D, 1, 0, -1) + struct.pack("<I", 28)
IDB = struct.pack("<IIHHI", 1, 20, 1, 0, 0) + struct.pack("<I", 20)  # Ethernet, no snap length


def handshake(i, server, port, ts_us):
    """Connection i's client address and port, its sequence numbers after the TCP handshake, and the handshake's
    three packets."""
    client = bytes([10, (i >> 16) & 255, (i >> 8) & 255, i & 255])
    sport = 1024 + i % 60000
    cs, ss = 1000 + i, 5000000 + i  # initial sequence numbers
    out = [epb(ts_us, packet(client, sport, server, port, cs, 0, 0x02, b"", i)),
           epb(ts_us + 1, packet(server, port, client, sport, ss, cs + 1, 0x12, b"", i)),
           epb(ts_us + 2, packet(client, sport, server, port, cs + 1, ss + 1, 0x10, b"", i))]
    return client, sport, cs + 1, ss + 1, out


def flows(n, port=5672, ts_us=1764411302000000):
    """The capture's bytes, yielded in pieces: the header blocks, then each connection's packets in turn."""
    yield SHB + IDB
    server = bytes([127, 0, 0, 1])
    for i in range(n):
        client, sport, cs, ss, out = handshake(i, server, port, ts_us)
        t = ts_us + 3
        for k, c in enumerate(C2S):
            out.append(epb(t, packet(client, sport, server, port, cs, ss, 0x18, c, i)))
            cs += len(c)
            t += 1
            if k < len(S2C):
                s = S2C[k]
                out.append(epb(t, packet(server, port, client, sport, ss, cs, 0x18, s, i)))
                ss += len(s)
                t += 1
        ts_us += 20
        yield b"".join(out)


def channel_flood(n, channels, port=5672, ts_us=1764411302000000):
    """The capture's bytes: n connections, each a login then an open, a confirm.select and a publish on each of
    channels channels, sent in 60,000-byte segments; the broker only acknowledges the bytes (no AMQP answer)."""
    yield SHB + IDB
    server = bytes([127, 0, 0, 1])
    stream = [C2S[0], C2S[1], method(0, 10, 31, struct.pack("!HIH", 2047, 131072, 0)) +
              method(0, 10, 40, shortstr("/") + b"\0\0")]
    for ch in range(1, channels + 1):
        stream += [method(ch, 20, 10, b"\0"), method(ch, 85, 10, b"\0"),
                   method(ch, 60, 40, struct.pack("!H", 0) + shortstr("") + shortstr("q") + b"\x01"),
                   frame(2, ch, struct.pack("!HHQH", 60, 0, 10, 0)), frame(3, ch, b"p" * 10)]
    data = b"".join(stream)
    for i in range(n):
        client, sport, cs, ss, out = handshake(i, server, port, ts_us)
        t = ts_us + 3
        for off in range(0, len(data), 60000):
            seg = data[off:off + 60000]
            out.append(epb(t, packet(client, sport, server, port, cs, ss, 0x18, seg, i)))
            cs += len(seg)
            out.append(epb(t + 1, packet(server, port, client, sport, ss, cs, 0x10, b"", i)))
            t += 2
        ts_us = t + 10
        yield b"".join(out)


def main():
    args = sys.argv[1:]
    channels = None
    if "--channels" in args:
        k = args.index("--channels")
        channels = int(args[k + 1])
        del args[k:k + 2]
    path = args[0]
    n = int(args[1]) if len(args) > 1 else (300 if channels else 65536)
    port = int(args[2]) if len(args) > 2 else 5672
    with open(path, "wb") as f:
        for piece in (channel_flood(n, channels, port) if channels else flows(n, port)):
            f.write(piece)


if __name__ == "__main__":
    main()
