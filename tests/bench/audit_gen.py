#!/usr/bin/env python3
# The merged verdict file of tests/bench/README.md ("amqptap audit on a large merged file"):
#   tests/bench/audit_gen.py 2600000 merged.jsonl && /usr/bin/time -v amqptap audit --json merged.jsonl
# A merged verdict file of two taps: N publish records (1 % unknown, each resent on the other tap 2 s later), as the
# tap writes them, plus the connection open records; ts in order.
import sys, datetime
N = int(sys.argv[1])
out = open(sys.argv[2], "w")
t0 = datetime.datetime(2026, 12, 3, 12, 0, 0, tzinfo=datetime.timezone.utc).timestamp()
def ts(us):
    return datetime.datetime.fromtimestamp(us / 1e6, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
for run, conn in (("aaaaaaaaaaaa", 1), ("bbbbbbbbbbbb", 1)):
    out.write('{"type":"connection","ts":"%s","run":"%s","conn":%d,"event":"open","tap":"t","started":"%s","schema":2,"client":"127.0.0.1:40000","upstream":"127.0.0.1:5672","upstream_local":"127.0.0.1:40001","user":"guest","vhost":"/","product":"pika","version":"1.2.0","platform":"Python","connection_name":"orders-%s","capabilities":{"publisher_confirms":true},"frame_max":131072,"heartbeat":60,"channel_max":2047}\n' % (ts(t0 * 1e6), run, conn, ts(t0 * 1e6), run[0]))
pending = []
us0 = int(t0 * 1e6) + 1000
lines = []
for i in range(N):
    us = us0 + i * 20  # 50,000 publishes a second
    unknown = i % 100 == 7
    run = "aaaaaaaaaaaa"
    out.write('{"type":"publish","ts":"%s","run":"%s","conn":1,"client":"127.0.0.1:40000","vhost":"/","user":"guest","channel":1,"seq":%d,"published":"%s","exchange":"orders","routing_key":"order.created","mandatory":true,"message_id":"m-%d","correlation_id":null,"delivery_mode":2,"content_type":"application/json","body_size":512,"identity":"id:%016x","route":"%s","confirm":"%s",%s"order":null%s}\n' % (
        ts(us + 900), run, i + 1, ts(us), i, (i * 0x9e3779b97f4a7c15) & 0xffffffffffffffff,
        "unknown" if unknown else "routed", "unknown" if unknown else "ack",
        "" if unknown else '"confirm_us":900,"multiple":false,', ',"reason":{"by":"broker_eof"}' if unknown else ""))
    if unknown:
        pending.append((us + 2000000, i))
    while pending and pending[0][0] <= us:
        rus, j = pending.pop(0)
        out.write('{"type":"publish","ts":"%s","run":"bbbbbbbbbbbb","conn":1,"client":"127.0.0.1:40002","vhost":"/","user":"guest","channel":1,"seq":%d,"published":"%s","exchange":"orders","routing_key":"order.created","mandatory":true,"message_id":"m-%d","correlation_id":null,"delivery_mode":2,"content_type":"application/json","body_size":512,"identity":"id:%016x","route":"routed","confirm":"ack","confirm_us":900,"multiple":false,"order":null}\n' % (
            ts(rus + 900), j + 1, ts(rus), j, (j * 0x9e3779b97f4a7c15) & 0xffffffffffffffff))
out.close()
