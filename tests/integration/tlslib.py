# What the TLS tests share (test_tls.py, test_alloc_failures.py): certificates written with the openssl command line,
# a broker node of their own with its TLS listener on (verify_peer, fail_if_no_peer_cert: mTLS required), taps
# with TLS on either leg, and tests/bench/bench_storm (1 TLS client per connection, at once).

import os
import shutil
import ssl
import subprocess
import tempfile
import time
import unittest

import pika

from tapharness import CLIENTS_DIR, SOURCE_DIR, TapTestCase

STORM = os.path.join(os.path.dirname(CLIENTS_DIR), "bench", "bench_storm")

TLS_PORT = int(os.environ.get("TAP_TLS_BROKER_PORT", "5751"))
PLAIN_PORT = int(os.environ.get("TAP_TLS_BROKER_PLAIN_PORT", "5750"))
BROKER_ENV = {
    "TAP_BROKER_PORT": str(PLAIN_PORT),
    "TAP_BROKER_DIST_PORT": str(PLAIN_PORT + 20000),  # below the ephemeral range
    "TAP_BROKER_DIR": os.path.join(SOURCE_DIR, ".run", "tls-broker"),
    "TAP_BROKER_NODE": f"amqptap-tls-{PLAIN_PORT}@localhost",
    "TAP_BROKER_TLS_PORT": str(TLS_PORT),
}


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_pki(d):
    """CA, a server certificate for localhost/127.0.0.1, a client certificate, and an unrelated CA."""
    for ca in ("ca", "rogue"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                "-days", "2", "-subj", f"/CN=amqptap test {ca}", cwd=d)
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, ext in (("server", ["-extfile", "server.ext"]), ("client", [])):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                f"/CN={'localhost' if name == 'server' else 'amqptap-client'}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
                f"{name}.pem", "-days", "2", *ext, cwd=d)


def broker_sh(*args):
    env = dict(os.environ, **BROKER_ENV)
    env.pop("TAP_BROKER_MGMT_PORT", None)  # the shared broker's management port is taken
    return subprocess.run(["bash", os.path.join(SOURCE_DIR, "scripts", "broker.sh"), *args], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)


_shared = {}  # what every class of a test file uses: "pki" (a directory), "broker" (True once started)


def _end_shared():
    if _shared.pop("broker", False):
        broker_sh("stop")
    pki = _shared.pop("pki", None)
    if pki:
        shutil.rmtree(pki, ignore_errors=True)


def shared_pki():
    """The certificates of this test file's run, written at the first use and removed when its tests are done."""
    if "pki" not in _shared:
        _shared["pki"] = tempfile.mkdtemp(prefix="amqptap-pki-")
        unittest.addModuleCleanup(_end_shared)
        make_pki(_shared["pki"])
    return _shared["pki"]


def shared_tls_broker():
    """The TLS broker of this test file's run (with shared_pki's certificates), started at the first use and stopped
    with the certificates (a start and stop per class cost 10 s each)."""
    if _shared.get("broker"):
        return
    pki = shared_pki()
    BROKER_ENV.update({"TAP_BROKER_TLS_CA": f"{pki}/ca.pem", "TAP_BROKER_TLS_CERT": f"{pki}/server.pem",
                       "TAP_BROKER_TLS_KEY": f"{pki}/server.key"})
    r = broker_sh("start")
    if r.returncode != 0:
        raise RuntimeError("TLS broker did not start: " + r.stdout.decode()[-2000:])
    _shared["broker"] = True


class PkiCase(TapTestCase):
    """Certificates for the class's tests (no broker of its own)."""
    pki = None

    @classmethod
    def setUpClass(cls):
        cls.pki = shared_pki()

    def p(self, name):
        return os.path.join(self.pki, name)


class TlsCase(PkiCase):
    """Certificates and a broker with a TLS listener that wants client certificates."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        shared_tls_broker()

    def tls_tap(self, client_tls=True, upstream_args=None, extra=(), **kw):
        args = []
        if client_tls:
            args += ["--tls-cert", self.p("server.pem"), "--tls-key", self.p("server.key")]
        if upstream_args is None:
            upstream_args = ["--upstream-tls", "--upstream-ca", self.p("ca.pem"), "--upstream-cert",
                             self.p("client.pem"), "--upstream-key", self.p("client.key")]
        return self.start_tap(args + upstream_args + list(extra), upstream_port=TLS_PORT,
                              upstream_host="localhost", **kw)

    def pika_params(self, port, tls=True):
        kw = {}
        if tls:
            ctx = ssl.create_default_context(cafile=self.p("ca.pem"))
            kw["ssl_options"] = pika.SSLOptions(ctx, "localhost")
        return pika.ConnectionParameters("localhost" if tls else "127.0.0.1", port, connection_attempts=1,
                                         socket_timeout=5, **kw)

    def scenarios(self, params):
        """Routed, returned, nacked and missing-exchange publishes on one confirm channel set; returns the
        message ids in publish order."""
        c = pika.BlockingConnection(params)
        ch = c.channel()
        q = f"tls.q.{time.monotonic_ns()}"
        ch.queue_declare(q, auto_delete=True)
        full = q + ".full"
        ch.queue_declare(full, auto_delete=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        ch.confirm_delivery()
        ch.basic_publish("", q, b"routed", pika.BasicProperties(message_id="routed"), mandatory=True)
        try:
            ch.basic_publish("", q + ".nowhere", b"ret", pika.BasicProperties(message_id="returned"), mandatory=True)
        except pika.exceptions.UnroutableError:
            pass
        ch.basic_publish("", full, b"1", pika.BasicProperties(message_id="fills"), mandatory=True)
        try:
            ch.basic_publish("", full, b"2", pika.BasicProperties(message_id="nacked"), mandatory=True)
        except pika.exceptions.NackError:
            pass
        try:
            ch.basic_publish("nope.tls", "k", b"x", pika.BasicProperties(message_id="missing"), mandatory=True)
        except pika.exceptions.ChannelClosedByBroker:
            pass
        c.close()

    @staticmethod
    def verdicts(tap):
        out = {}
        for r in tap.records("publish"):
            out[r["message_id"]] = (r["route"], r["confirm"], r.get("reply_code"), r["order"],
                                    (r.get("reason") or {}).get("code"))
        return out
