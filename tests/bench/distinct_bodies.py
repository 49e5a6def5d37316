#!/usr/bin/env python3
"""Writes a copy of a pcapng capture of AMQP 0-9-1 connections (Ethernet, IPv4, TCP) in which every body frame the
clients sent starts with its own number: the same flows, sizes and timing, but no two publishes alike. The CI
instruction guard measures identity tracking on the copy of tests/data/capture/core-budget.pcapng.gz (whose 4,500
publishes all share one body and so one fingerprint: every one a repeat) to give the cost of the common case
(tests/bench/README.md). Checksums are left as they were (the tap does not verify them).

Usage: distinct_bodies.py IN.pcapng OUT.pcapng BROKER_PORT. Python 3 stdlib only."""

import struct
import sys


def blocks(data):
    off = 0
    while off < len(data):
        btype, blen = struct.unpack_from("<II", data, off)
        yield off, btype, blen
        off += blen


def client_segments(data, port):
    """(offset of the TCP payload in the file, its length, flow, its sequence number) of every client segment."""
    for off, btype, _ in blocks(data):
        if btype != 6:  # enhanced packet block
            continue
        caplen = struct.unpack_from("<I", data, off + 20)[0]
        pkt = off + 28
        ip = pkt + 14
        ihl = (data[ip] & 15) * 4
        total = struct.unpack_from("!H", data, ip + 2)[0]
        tcp = ip + ihl
        sport, dport, seq = struct.unpack_from("!HHI", data, tcp)
        thl = (data[tcp + 12] >> 4) * 4
        payload = tcp + thl
        n = min(ip + total, pkt + caplen) - payload
        if dport == port and n > 0:
            yield payload, n, (bytes(data[ip + 12:ip + 16]), sport), seq


def main():
    src, dst, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    data = bytearray(open(src, "rb").read())
    flows = {}
    for payload, n, flow, seq in client_segments(data, port):
        flows.setdefault(flow, []).append((seq, payload, n))
    counter = 0
    for segs in flows.values():
        segs.sort()  # by sequence number (a retransmission would repeat bytes: none in the tap's own --pcap)
        stream = bytearray()
        where = []  # stream offset -> file offset, per byte
        for _, payload, n in segs:
            stream += data[payload:payload + n]
            where.extend(range(payload, payload + n))
        i = 0
        if stream.startswith(b"AMQP"):
            i = 8
        while i + 7 <= len(stream):
            ftype = stream[i]
            size = struct.unpack_from("!I", stream, i + 3)[0]
            if ftype == 3 and size >= 8:  # a body frame: its first 8 bytes become this publish's number
                counter += 1
                for k, byte in enumerate(struct.pack("!Q", counter)):
                    data[where[i + 7 + k]] = byte
            i += 7 + size + 1
    open(dst, "wb").write(data)
    print(f"{counter} bodies renumbered", file=sys.stderr)


if __name__ == "__main__":
    main()
