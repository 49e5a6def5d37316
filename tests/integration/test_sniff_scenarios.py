# amqptap sniff against the proxy on the src/DESIGN.md §7 scenarios: each scenario is driven twice with the
# same broker objects, once by clients connected to the proxy and once by the same clients connected DIRECTLY to
# the broker while `amqptap sniff -i lo --port BROKER` captures. The two record sets must be equal in every field
# but timings and process identity. What must differ between two runs is normalised, and only that:
#   - process identity (run, tap, started, schema): tapharness.without_identity;
#   - timings: ts, published, *_us latencies, duration;
#   - the client's address and the connection id (another TCP connection, another id; the sniffer numbers streams);
#   - `multiple` on a confirm: whether the broker batched an ack is its own timing, not the publish's verdict;
#   - `publish_and_wait` warnings: whether a publish came after every earlier one was answered is a race between
#     the client and the broker, and a proxy in the path shifts it (a pipelining rabbitmq-c publisher can look
#     like it waited for its first few confirms on one path and not on the other).
# Records are compared as multisets (the sniffer sees the wire a few microseconds after the proxy would have, so
# records of different connections may interleave differently), and each channel's publish records additionally
# in order. The scenarios are the entries of scenario_table that the sniff driver runs (pika: 1-4, 6, 7, 10a-10d;
# rabbitmq-c: confirm_roundtrip, 2,000 confirmed publishes with a window of 100, and stream_publisher, 500 mandatory
# unroutable, confirmed), each with the expectations the proxy driver checks, on the proxy's run.

import collections
import json

from tapharness import BROKER_PORT, main, wait_for, without_identity
from scenario_lib import ScenarioCase
from scenario_table import CaseRun, SniffedRun, for_each_scenario

TIMING = {"ts", "published", "duration_us", "return_us", "confirm_us", "close_us", "latency_us", "age_us", "multiple"}
CONN_IDENTITY = {"conn", "client"}
# members naming another record of the same process: a repeat's previous attempt, a duplicate id's first publish
NESTED = {"previous": {"run", "conn", "ago_us"}, "first": {"conn"}}


def normalise(testcase, recs):
    out = []
    for r in without_identity(testcase, recs):
        if r["type"] == "warning" and r.get("rule") == "publish_and_wait":
            continue
        r = {k: ({kk: vv for kk, vv in v.items() if kk not in NESTED[k]} if k in NESTED else v)
             for k, v in r.items()}
        # consumer tags are the broker's (amq.ctag-<random>): the two runs' differ
        out.append({k: v for k, v in r.items() if k not in TIMING and k not in CONN_IDENTITY
                    and not k.endswith("_us") and k != "consumer_tag"})
    return out


def per_channel(recs):
    order = collections.defaultdict(list)
    for r in recs:
        if r["type"] == "publish":
            order[(r.get("channel"), r.get("tx"), r.get("seq") is None)].append(r.get("message_id"))
    return dict(order)


@for_each_scenario("sniff")
class SniffScenarios(ScenarioCase):
    def watched(self, scenario, run):
        """Drives the scenario in run while its tap (a proxy or a sniffer) watches; stops it (exit 0). Returns the
        drive's facts."""
        tap = run.tap
        try:
            facts = scenario.drive(run)
            if isinstance(run, SniffedRun):  # the last packets are on lo already; the sniffer reads them within its
                wait_for(lambda: False, 0.3)  # 10 ms tick
        finally:
            rc = tap.stop(timeout=30)
        self.assertEqual(rc, 0, tap.stderr()[-2000:])
        return facts

    def check(self, scenario):
        """Runs the scenario through the proxy (its expectations checked there), empties the test's queues, runs it
        straight to the broker under the sniffer, and compares the two record sets."""
        args = list(scenario.tap_args) or ["--return-window", "300"]
        tap = self.start_tap(args)
        scenario.expect(self, tap, self.watched(scenario, CaseRun(self, tap.port, tap)))
        self.purge_queues()
        sniffer = self.start_sniff(args)
        self.watched(scenario, SniffedRun(self, BROKER_PORT, sniffer))
        proxied, sniffed = tap.records(), sniffer.records()
        self.assertEqual([r for r in sniffed if r["type"] in ("capture_gap", "capture_drops")], [])
        a, b = normalise(self, proxied), normalise(self, sniffed)
        self.assertTrue([r for r in a if r["type"] == "publish"], "the scenario published nothing")
        key = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
        only_proxy = collections.Counter(map(key, a)) - collections.Counter(map(key, b))
        only_sniff = collections.Counter(map(key, b)) - collections.Counter(map(key, a))
        self.maxDiff = None
        self.assertEqual((sorted(only_proxy), sorted(only_sniff)), ([], []), "records differ (proxy, sniff)")
        self.assertEqual(per_channel(b), per_channel(a))


if __name__ == "__main__":
    main()
