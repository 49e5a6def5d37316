# The routing model against the real broker on seeded random topologies: exchanges of the four types, exchange-to-
# exchange bindings (chains and cycles), alternate exchanges by argument and by policy (priorities, a policy without
# one shadowing a lower one, a queue policy that must not apply), internal exchanges behind others, topic bindings
# with '#', '*', '#.#', empty words, leading and trailing dots and multi-byte words, headers bindings with each
# x-match and typed values. Each round declares a topology with pika, publishes random keys and headers (mandatory,
# confirms), consumes every queue and counts which cases reached it, exports the definitions and runs the cases
# through `amqptap route --test`: the model's queue set must equal the broker's for every case. TAP_ROUTE_SEED fixes
# the seed (printed on failure), TAP_ROUTE_ROUNDS and TAP_ROUTE_CASES the size (default 10 x 1,050 cases).

import os
import random
import tempfile
import time

import pika

from routelib import MGMT_PORT, clear_policy, export_definitions, route, set_policy, write_cases
from tapharness import BROKER_PORT, TapTestCase, main, require_broker

TYPES = ["direct", "fanout", "topic", "headers"]
WORDS = ["a", "b", "", "ü", "温度", "sensor"]
PREFIXES = ["dt.p.hi.", "dt.p.sh.", "dt.p.", "dt.n."]
POLICIES = [  # name, pattern, definition, priority, apply-to
    ("dt-pol-low", r"^dt\.p\.", {"alternate-exchange": "dt.ae.pol1"}, 1, "exchanges"),
    ("dt-pol-high", r"^dt\.p\.hi\.", {"alternate-exchange": "dt.ae.pol2"}, 5, "all"),
    ("dt-pol-shadow", r"^dt\.p\.sh\.", {"max-length": 100000}, 9, "exchanges"),
    ("dt-pol-queues", r"^dt\.n\.", {"alternate-exchange": "dt.ae.pol2"}, 99, "queues"),
]
HDR_KEYS = ["h1", "h2", "x-h"]


def topic_key(rng, wild):
    n = rng.choice([0, 1, 1, 2, 2, 3, 3, 4])
    words = []
    for _ in range(n):
        if wild and rng.random() < 0.35:
            words.append(rng.choice(["#", "*"]))
        else:
            words.append(rng.choice(WORDS))
    return ".".join(words)


def hdr_value(rng):
    return rng.choice([1, 2, 2 ** 40, "1", "v", True, False])


class RouteDifferentialTest(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)
        self.seed = int(os.environ.get("TAP_ROUTE_SEED", str(random.SystemRandom().randrange(1 << 32))))
        self.rounds = int(os.environ.get("TAP_ROUTE_ROUNDS", "10"))
        self.per_round = int(os.environ.get("TAP_ROUTE_CASES", "1050"))
        self.dir = tempfile.mkdtemp(prefix="test_route_differential-")
        self.conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", BROKER_PORT))
        self.ch = self.conn.channel()
        self.ch.confirm_delivery()
        for name, pattern, definition, prio, apply_to in POLICIES:
            set_policy(name, pattern, definition, prio, apply_to)
        for ae, q in [("dt.ae.pol1", "dt.q.pol1"), ("dt.ae.pol2", "dt.q.pol2")]:
            self.ch.exchange_declare(ae, "fanout")
            self.ch.queue_declare(q)
            self.ch.queue_bind(q, ae, "")

    def tearDown(self):
        try:
            for name, *_ in POLICIES:
                clear_policy(name)
            ch = self.conn.channel()
            for q in ["dt.q.pol1", "dt.q.pol2"]:
                ch.queue_delete(q)
            for x in ["dt.ae.pol1", "dt.ae.pol2"]:
                ch.exchange_delete(x)
            self.conn.close()
        finally:
            super().tearDown()

    def make_topology(self, rng, r):
        exchanges = []
        for i in range(rng.randint(4, 7)):
            # rabbitmqctl's export leaves internal exchanges out (the model then does not judge what meets them):
            # they are tested where the management API's export has them
            exchanges.append({"name": f"{rng.choice(PREFIXES)}r{r}.x{i}", "type": rng.choice(TYPES),
                              "internal": bool(MGMT_PORT) and rng.random() < 0.12})
        if all(x["internal"] for x in exchanges):
            exchanges[0]["internal"] = False
        for x in exchanges:
            if rng.random() < 0.3:
                missing = [f"dt.missing.r{r}"] if MGMT_PORT else []  # in rabbitmqctl's export: maybe internal
                x["ae"] = rng.choice([e["name"] for e in exchanges] + missing + ["dt.ae.pol1"])
        queues = [f"dt.q.r{r}.{j}" for j in range(rng.randint(6, 10))]
        bindings = []
        for _ in range(rng.randint(15, 30)):
            src = rng.choice(exchanges)
            to_ex = rng.random() < 0.2
            dest = rng.choice(exchanges)["name"] if to_ex else rng.choice(queues)
            args = None
            if src["type"] == "topic":
                key = topic_key(rng, True)
            elif src["type"] == "headers":
                key = ""
                args = {"x-match": rng.choice(["all", "any", "all-with-x", "any-with-x"])}
                for k in rng.sample(HDR_KEYS, rng.randint(1, 3)):
                    args[k] = hdr_value(rng)
            else:
                key = topic_key(rng, False)
            bindings.append((src["name"], to_ex, dest, key, args))
        return exchanges, queues, bindings

    def declare(self, exchanges, queues, bindings):
        for x in exchanges:
            args = {"alternate-exchange": x["ae"]} if "ae" in x else None
            self.ch.exchange_declare(x["name"], x["type"], internal=x["internal"], arguments=args)
        for q in queues:
            self.ch.queue_declare(q)
        for src, to_ex, dest, key, args in bindings:
            if to_ex:
                self.ch.exchange_bind(dest, src, key, arguments=args)
            else:
                self.ch.queue_bind(dest, src, key, arguments=args)

    def undeclare(self, exchanges, queues):
        for q in queues:
            self.ch.queue_delete(q)
        for x in exchanges:
            self.ch.exchange_delete(x["name"])

    def make_cases(self, rng, exchanges, queues, n):
        public = [x for x in exchanges if not x["internal"]]
        cases = []
        for _ in range(n):
            p = rng.random()
            if p < 0.05:
                c = {"exchange": "", "key": rng.choice(queues + ["dt.none", ""])}
            else:
                c = {"exchange": rng.choice(public)["name"], "key": topic_key(rng, False)}
                if rng.random() < 0.5:
                    c["headers"] = {k: hdr_value(rng) for k in rng.sample(HDR_KEYS, rng.randint(0, 3))}
            cases.append(c)
        return cases

    def publish_and_count(self, cases, queues):
        """Publishes every case (mandatory, confirmed), then consumes every queue: {case index: set of queues}."""
        for i, c in enumerate(cases):
            props = pika.BasicProperties(message_id=str(i), headers=c.get("headers"))
            try:
                self.ch.basic_publish(c["exchange"], c["key"], b"", props, mandatory=True)
            except pika.exceptions.UnroutableError:
                pass
        reached = {}
        consume = self.conn.channel()
        consume.basic_qos(prefetch_count=1000)
        seen = [0]

        def on_message(q):
            def cb(_ch, _method, props, _body):
                reached.setdefault(int(props.message_id), set()).add(q)
                seen[0] += 1
            return cb
        for q in queues:
            consume.basic_consume(q, on_message(q), auto_ack=True)
        last, quiet_since = -1, time.monotonic()
        while time.monotonic() - quiet_since < 0.3:
            self.conn.process_data_events(time_limit=0.05)
            if seen[0] != last:
                last, quiet_since = seen[0], time.monotonic()
        consume.close()
        for q in queues:
            left = self.ch.queue_declare(q, passive=True).method.message_count
            self.assertEqual(left, 0, f"seed {self.seed}: {q} still holds {left} messages")
        return reached

    def test_model_equals_broker(self):
        t0 = time.monotonic()
        total = 0
        stats = {"none": 0, "several": 0, "policy_ae": 0}
        for r in range(self.rounds):
            rng = random.Random(self.seed * 1000 + r)
            exchanges, queues, bindings = self.make_topology(rng, r)
            all_queues = queues + ["dt.q.pol1", "dt.q.pol2"]
            self.declare(exchanges, queues, bindings)
            try:
                cases = self.make_cases(rng, exchanges, queues, self.per_round)
                reached = self.publish_and_count(cases, all_queues)
                defs = os.path.join(self.dir, f"defs-{r}.json")
                export_definitions(defs)
            finally:
                self.undeclare(exchanges, queues)
            for i, c in enumerate(cases):
                got = sorted(reached.get(i, ()))
                c["queues"] = got if got else "none"
                stats["none"] += not got
                stats["several"] += len(got) > 1
                stats["policy_ae"] += any(q.startswith("dt.q.pol") for q in got)
            path = write_cases(cases, self.dir)
            res = route("--definitions", defs, "--test", path)
            total += len(cases)
            if res.returncode != 0:
                diff = "\n".join(res.stdout.splitlines()[:20])
                self.fail(f"seed {self.seed} ({'management API' if MGMT_PORT else 'rabbitmqctl'}) round {r}: the model differs from the broker (TAP_ROUTE_SEED={self.seed}"
                          f"; definitions {defs}, cases {path}):\n{diff}\n{res.stderr}")
        took = time.monotonic() - t0
        print(f"seed {self.seed}: {total} cases in {self.rounds} topologies, model equals broker, {took:.1f} s "
              f"({stats['none']} reached no queue, {stats['several']} several, {stats['policy_ae']} a policy's "
              "alternate)")
        # a run that never met the cases it is for would prove nothing
        self.assertGreater(stats["none"], total // 50)
        self.assertGreater(stats["several"], total // 50)
        self.assertGreater(stats["policy_ae"], total // 100)
        sized = "TAP_ROUTE_CASES" in os.environ or "TAP_ROUTE_ROUNDS" in os.environ
        self.assertGreaterEqual(total, 0 if sized else 10000)


if __name__ == "__main__":
    main()
