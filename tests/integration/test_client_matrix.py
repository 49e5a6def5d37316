# The client matrix: three client libraries nobody here wrote (py-amqp, the library under Celery and kombu; Go's
# amqp091-go; node's amqplib) each publish through the tap to the real broker on confirm channels: routable,
# unroutable mandatory, unroutable without mandatory, a publish that fills a reject-publish queue and one it
# nacks, and a publish to a missing exchange. Each client prints what the library itself reported; every
# publish must have exactly one record, and its verdict must say what the library saw.
#
# The clients live in tests/clients/matrix/. Go builds with Debian's golang-github-rabbitmq-amqp091-go-dev
# (GO111MODULE=off GOPATH=/usr/share/gocode); amqplib comes from the npm registry (npm ci into the build tree).

import json
import os
import shutil
import subprocess
import uuid

import pika

from tapharness import BROKER_HOST, BROKER_PORT, CLIENTS_DIR, SOURCE_DIR, TapTestCase, main, require_broker

MATRIX_SRC = os.path.join(SOURCE_DIR, "tests", "clients", "matrix")

# What each library reports for each case (checked too: a library that changes its story changes the test).
LIBRARY_SAYS = {
    "routable": "ack",
    "unroutable-mandatory": "returned+ack",
    "unroutable-plain": "ack",
    "fills-queue": "ack",
    "overflow": "nack",
    "missing-exchange": "closed:404",
}
MANDATORY = {"routable", "unroutable-mandatory", "fills-queue", "overflow", "missing-exchange"}


def expected_record(case, outcome):
    """The (route, confirm, order) a publish record must carry for what the library reported."""
    if outcome == "returned+ack":
        return ("returned", "ack", "return_before_ack")
    if outcome == "ack":
        return ("routed" if case in MANDATORY else "unproven", "ack", None)
    if outcome == "nack":
        return ("unproven", "nack", None)
    if outcome.startswith("closed:"):
        return ("unknown", "unknown", None)
    raise AssertionError(f"unexpected library outcome {outcome!r}")


def build_go_client():
    out = os.path.join(CLIENTS_DIR, "matrix_go")
    src = os.path.join(MATRIX_SRC, "matrix.go")
    if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(src):
        return out
    os.makedirs(CLIENTS_DIR, exist_ok=True)
    env = dict(os.environ, GO111MODULE="off", GOPATH="/usr/share/gocode")
    env.setdefault("GOCACHE", os.path.join(CLIENTS_DIR, ".gocache"))
    subprocess.run(["go", "build", "-o", out, src], check=True, env=env, cwd=MATRIX_SRC)
    return out


def install_node_client():
    """Copies the node client beside the other clients and installs amqplib there from the lock file."""
    dest = os.path.join(CLIENTS_DIR, "matrix-node")
    os.makedirs(dest, exist_ok=True)
    for name in ("matrix.js", "package.json", "package-lock.json"):
        shutil.copyfile(os.path.join(MATRIX_SRC, name), os.path.join(dest, name))
    if not os.path.isdir(os.path.join(dest, "node_modules", "amqplib")):
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], check=True, cwd=dest,
                       stdout=subprocess.DEVNULL)
    return os.path.join(dest, "matrix.js")


class ClientMatrixTest(TapTestCase):
    @classmethod
    def setUpClass(cls):
        cls.go_client = build_go_client()
        cls.node_client = install_node_client()

    def setUp(self):
        super().setUp()
        require_broker(self)
        tag = uuid.uuid4().hex[:8]
        self.exchange = f"amqptap-matrix-{tag}"
        self.missing = f"amqptap-matrix-missing-{tag}"
        self.queues = [f"{self.exchange}.ok", f"{self.exchange}.full"]
        conn = pika.BlockingConnection(pika.ConnectionParameters(BROKER_HOST, BROKER_PORT))
        ch = conn.channel()
        ch.exchange_declare(self.exchange, "direct", auto_delete=False)
        ch.queue_declare(self.queues[0])
        ch.queue_bind(self.queues[0], self.exchange, "ok")
        ch.queue_declare(self.queues[1], arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        ch.queue_bind(self.queues[1], self.exchange, "full")
        conn.close()

    def tearDown(self):
        conn = pika.BlockingConnection(pika.ConnectionParameters(BROKER_HOST, BROKER_PORT))
        ch = conn.channel()
        for q in self.queues:
            ch.queue_delete(q)
        ch.exchange_delete(self.exchange)
        conn.close()
        super().tearDown()

    def run_client(self, name, argv):
        """Runs one client through a fresh tap; returns {message_id: outcome} and the tap's records."""
        tap = self.start_tap()
        prefix = f"{name}-"
        proc = subprocess.run(argv(tap.port) + [self.exchange, self.missing, prefix], capture_output=True,
                              text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, f"{name} client failed: {proc.stderr}")
        outcomes = {}
        for line in proc.stdout.splitlines():
            r = json.loads(line)
            outcomes[r["message_id"][len(prefix):]] = r["outcome"]
        self.assertEqual(tap.stop(), 0, tap.stderr())
        return outcomes, tap.records()

    def check(self, name, argv):
        outcomes, records = self.run_client(name, argv)
        self.assertEqual(outcomes, LIBRARY_SAYS, f"{name}: the library reported something else")
        publishes = [r for r in records if r["type"] == "publish"]
        self.assertEqual(len(publishes), len(LIBRARY_SAYS), f"{name}: one record per publish: {publishes}")
        by_case = {r["message_id"][len(name) + 1:]: r for r in publishes}
        self.assertEqual(set(by_case), set(LIBRARY_SAYS), f"{name}: records for other message ids")
        for case, outcome in outcomes.items():
            r = by_case[case]
            got = (r["route"], r["confirm"], r["order"])
            self.assertEqual(got, expected_record(case, outcome), f"{name} {case}: library said {outcome}: {r}")
            self.assertEqual(r["mandatory"], case in MANDATORY, f"{name} {case}")
            self.assertIsNotNone(r["seq"], f"{name} {case}: confirm channel")
            if outcome.startswith("closed:"):
                self.assertEqual(r["reason"]["by"], "broker", r)
                self.assertEqual(r["reason"]["code"], int(outcome.split(":")[1]), r)
        return records

    def test_py_amqp(self):
        self.check("pyamqp", lambda port: ["/usr/bin/python3", os.path.join(MATRIX_SRC, "matrix_pyamqp.py"),
                                           f"127.0.0.1:{port}"])

    def test_go_amqp091(self):
        self.check("go", lambda port: [self.go_client, f"amqp://guest:guest@127.0.0.1:{port}/"])

    def test_node_amqplib(self):
        self.check("node", lambda port: ["node", self.node_client, f"amqp://guest:guest@127.0.0.1:{port}/"])


if __name__ == "__main__":
    main()
