#!/usr/bin/python3
"""Records tests/data/capture/loopback-amqp.pcapng: a small pika exchange with a real RabbitMQ on
127.0.0.1:PORT (scripts/broker.sh), captured on lo with dumpcap, and writes loopback-amqp.streams from
tshark's own reassembly (follow,tcp,raw) so the reader is checked against an independent implementation.
Usage: TAP_BROKER_PORT=5699 scripts/broker.sh start; record.py [PORT]"""
import os, subprocess, sys, time
import pika

here = os.path.dirname(os.path.abspath(__file__))
port = int(sys.argv[1]) if len(sys.argv) > 1 else 5699
pcap = os.path.join(here, "loopback-amqp.pcapng")

cap = subprocess.Popen(["dumpcap", "-q", "-i", "lo", "-f", f"tcp port {port}", "-w", pcap],
                       stderr=subprocess.DEVNULL)
time.sleep(2)
params = pika.ConnectionParameters("127.0.0.1", port, heartbeat=0)

# Connection 1: confirm mode, one routed and one returned (mandatory, unroutable) publish, clean close.
c = pika.BlockingConnection(params)
ch = c.channel()
ch.confirm_delivery()
ch.queue_declare("capture-q", auto_delete=True)
ch.basic_publish("", "capture-q", b"routed body", pika.BasicProperties(message_id="m-1", delivery_mode=2),
                 mandatory=True)
try:
    ch.basic_publish("", "no-such-queue", b"returned body", pika.BasicProperties(message_id="m-2"),
                     mandatory=True)
except pika.exceptions.UnroutableError:
    pass
c.close()

# Connection 2: no confirms, a 100 kB message (several TCP segments and body frames), clean close.
c = pika.BlockingConnection(params)
ch = c.channel()
ch.basic_publish("", "nowhere", b"x" * 100000)
c.close()

time.sleep(1)
cap.terminate()
cap.wait()

# Expected streams: "<c2s len> <s2c len> <fnv1a64 c2s> <fnv1a64 s2c> <how>" (how: 0 client FIN, 1 broker FIN).
def fnv(b):
    h = 1469598103934665603
    for x in b:
        h = ((h ^ x) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h

lines = []
for stream in range(2):
    out = subprocess.run(["tshark", "-r", pcap, "-q", "-z", f"follow,tcp,raw,{stream}"], capture_output=True,
                         text=True, check=True).stdout
    node0, data = None, {True: b"", False: b""}
    for line in out.splitlines():
        if line.startswith("Node 0:"):
            node0 = line.split()[-1]
        s = line.strip()
        if not s or line.startswith(("=", "Follow", "Filter", "Node")):
            continue
        c2s = not line.startswith("\t")
        data[c2s] += bytes.fromhex(s)
    fin = subprocess.run(["tshark", "-r", pcap, "-Y", f"tcp.stream=={stream} && tcp.flags.fin==1", "-T", "fields",
                          "-e", "tcp.srcport"], capture_output=True, text=True, check=True).stdout.split()
    how = 1 if fin and int(fin[0]) == port else 0
    lines.append(f"{len(data[True])} {len(data[False])} {fnv(data[True]):x} {fnv(data[False]):x} {how}")
with open(os.path.join(here, "loopback-amqp.streams"), "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
