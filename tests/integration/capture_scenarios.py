# Records the src/DESIGN.md §7 scenarios as small real captures: each entry of scenario_table that the capture driver runs
# is driven (pika) through an amqptap started with --pcap in front of the throwaway broker; the pcapng is then
# replayed (`amqptap replay`) to write the expected records beside it. Broker objects have fixed names
# ("cap.<scenario>.*") so a re-recording has the same shape.
# Usage: capture_scenarios.py [--out DIR] [NAME...]   (default: every scenario into captures/)

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pika  # noqa: E402

from tapharness import BROKER_PORT, SOURCE_DIR, replay, start_tap  # noqa: E402
from scenario_lib import params  # noqa: E402
from scenario_table import by_name, scenarios  # noqa: E402

CAPTURES_DIR = os.path.join(SOURCE_DIR, "captures")


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


class CaptureRun:
    """A drive's view of a recording (see scenario_table.CaseRun): broker objects named cap.<scenario>.<suffix>,
    declared anew over the Admin connection, and no test case (a drive that finds something wrong raises)."""

    def __init__(self, adm, name, tap):
        self.adm, self.prefix, self.tap, self.port, self.case = adm, f"cap.{name}", tap, tap.port, None

    def name(self, suffix):
        return f"{self.prefix}.{suffix}"

    def queue(self, suffix, arguments=None):
        return self.adm.queue(self.name(suffix), arguments)

    def exchange(self, suffix, kind, arguments=None):
        return self.adm.exchange(self.name(suffix), kind, arguments)

    def bind(self, q, x, key="", arguments=None):
        self.adm.bind(q, x, key, arguments)

    def connect(self, **kw):
        return pika.BlockingConnection(params(self.port, **kw))


def record_replay(cap, port, verdicts):
    """Replays cap into verdicts, which is replaced (the tap appends to an existing file)."""
    if os.path.exists(verdicts):
        os.unlink(verdicts)
    return replay(cap, port, verdicts=verdicts)


def record(name, out_dir):
    """Runs one scenario through a tap with --pcap; writes NAME.pcapng, NAME.port and NAME.verdicts.jsonl."""
    cap = os.path.join(out_dir, name + ".pcapng")
    tmp = cap + ".tmp"
    if os.path.exists(tmp):
        os.unlink(tmp)
    tap = start_tap(["--pcap", tmp], frames=False)
    adm = Admin()
    try:
        by_name(name).drive(CaptureRun(adm, name, tap))
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
    r = record_replay(cap, BROKER_PORT, os.path.join(out_dir, name + ".verdicts.jsonl"))
    if r.returncode != 0:
        raise RuntimeError(f"{name}: replay exited {r.returncode}: {r.stderr()}")
    return cap


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=CAPTURES_DIR)
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    known = [s.name for s in scenarios("capture")]
    names = a.names or known
    for n in names:
        if n not in known:
            ap.error(f"unknown scenario {n!r} (known: {', '.join(known)})")
    os.makedirs(a.out, exist_ok=True)
    for n in names:
        cap = record(n, a.out)
        print(f"{n}: {os.path.getsize(cap)} bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
