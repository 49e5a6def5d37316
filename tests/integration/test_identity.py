# Record identity (issue 17, "Two taps"): records merged from several taps, or from two runs of one tap, can be
# told apart and joined. Every record carries "run" (one per process); the connection open record also carries
# "tap" (--tap-id), "started" and "schema". (run, conn) is the join key: every publish record of the merged files
# joins exactly one connection open record. Real pika publishers go through the taps to the throwaway broker;
# the join is checked in Python and with the shipped jq example (scripts/dist/examples/join-open.jq).

import json
import os
import shutil
import socket
import subprocess
import tempfile

import pika

from tapharness import TapTestCase, main, read_records, require_broker

PUBLISHES = 5
CONNECTIONS = 2  # per tap run: conn 1 and 2 in every run, so conn alone is ambiguous after merging
JOIN_JQ = os.path.join(os.environ.get("TAP_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                       "scripts", "dist", "examples", "join-open.jq")


def publish_through(port, queue):
    for _ in range(CONNECTIONS):
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, connection_attempts=3))
        ch = conn.channel()
        ch.queue_declare(queue, auto_delete=True)
        ch.confirm_delivery()
        for i in range(PUBLISHES):
            ch.basic_publish("", queue, f"m{i}".encode())
        conn.close()


def join_counts(records):
    """For every publish record, how many connection open records it joins on (run, conn)."""
    opens = {}
    for r in records:
        if r["type"] == "connection" and r["event"] == "open":
            key = (r["run"], r["conn"])
            opens[key] = opens.get(key, 0) + 1
    return [opens.get((p["run"], p["conn"]), 0) for p in records if p["type"] == "publish"]


def readme_jq_join():
    """The jq program the README's "Shipping records to a log pipeline" section shows, shipped as an example:
    scripts/dist/examples/join-open.jq (its comment lines left out)."""
    with open(JOIN_JQ, encoding="utf-8") as f:
        return "".join(line for line in f if not line.startswith("#"))


class IdentityTest(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)
        self.dir = tempfile.mkdtemp(prefix="amqptap-identity-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def run_tap(self, tap_id, verdicts, queue):
        tap = self.start_tap(["--tap-id", tap_id, "--verdicts", verdicts], frames=False)
        publish_through(tap.port, queue)
        self.assertEqual(tap.stop(), 0)

    def check_merged(self, records, taps):
        publishes = [r for r in records if r["type"] == "publish"]
        opens = [r for r in records if r["type"] == "connection" and r["event"] == "open"]
        self.assertEqual(len(publishes), len(taps) * CONNECTIONS * PUBLISHES)
        self.assertEqual(len(opens), len(taps) * CONNECTIONS)
        self.assertEqual(sorted({o["tap"] for o in opens}), sorted(set(taps)))
        for o in opens:
            self.assertEqual(o["schema"], 2)
            self.assertRegex(o["run"], r"^[0-9a-f]{12}$")
            self.assertRegex(o["started"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
        self.assertEqual(len({o["run"] for o in opens}), len(taps), "one run per tap process")
        # conn alone repeats across the runs: the join needs run
        self.assertLess(len({o["conn"] for o in opens}), len(opens))
        for r in records:
            self.assertIn("run", r, r)
        self.assertEqual(join_counts(records), [1] * len(publishes))
        # the shipped jq join over the merged file: every publish gets exactly one tap
        merged = os.path.join(self.dir, "merged.jsonl")
        with open(merged, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        out = subprocess.run(["jq", "-s", "-c", readme_jq_join(), merged], capture_output=True, check=True)
        joined = [json.loads(line) for line in out.stdout.decode().splitlines()]
        self.assertEqual(len(joined), len(publishes))
        for j, p in zip(joined, publishes):
            self.assertEqual((j["run"], j["conn"], j["seq"]), (p["run"], p["conn"], p["seq"]))
            self.assertIn(j["tap"], taps)
        return opens

    def test_two_taps_two_files(self):
        a, b = os.path.join(self.dir, "a.jsonl"), os.path.join(self.dir, "b.jsonl")
        self.run_tap("node-a", a, "identity.two_taps.a")
        self.run_tap("node-b", b, "identity.two_taps.b")
        records = read_records(a) + read_records(b)
        opens = self.check_merged(records, ["node-a", "node-b"])
        by_run = {o["run"]: o["tap"] for o in opens}
        for p in records:
            if p["type"] == "publish":
                self.assertEqual(by_run[p["run"]], "node-a" if p["routing_key"].endswith(".a") else "node-b")

    def test_one_tap_two_runs_one_file(self):
        both = os.path.join(self.dir, "both.jsonl")
        self.run_tap("node-a", both, "identity.restart")
        self.run_tap("node-a", both, "identity.restart")
        self.check_merged(read_records(both), ["node-a", "node-a"])

    def test_decode_error_carries_run(self):
        # a record written by the decoder, not the tracker: it must carry the process's run like every other one
        v = os.path.join(self.dir, "garbage.jsonl")
        tap = self.start_tap(["--tap-id", "node-a", "--verdicts", v], frames=False)
        with socket.create_connection(("127.0.0.1", tap.port)) as s:
            s.sendall(b"AMQP\x00\x00\x09\x01")
            s.sendall(b"\x01\x00\x00\xff\xff\xff\xff" + b"\x00" * 16)  # a method frame far over any frame_max
            s.settimeout(5)
            try:
                while s.recv(4096):
                    pass
            except OSError:
                pass
        self.assertEqual(tap.stop(), 0)
        records = read_records(v)
        errors = [r for r in records if r["type"] == "decode_error"]
        self.assertEqual(len(errors), 1, records)
        runs = {r.get("run") for r in records}
        self.assertEqual(len(runs), 1, records)
        self.assertRegex(errors[0]["run"], r"^[0-9a-f]{12}$")


if __name__ == "__main__":
    main()
