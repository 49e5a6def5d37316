# --fault-api: rules added and removed at run time on the --metrics endpoint (POST/GET /api/faults, DELETE
# /api/faults/ID), against real clients through the tap to the real broker. A pika publisher with confirms keeps
# its one connection while a rule is POSTed (its next selected publishes are nacked at the client, and their
# records say client_saw nack with the rule's id) and DELETEd (later publishes are acked); refused requests (a bad
# rule with the parser's reason, an unknown id, a body that is not JSON); the token (401 without it or with another,
# 201 with it; a token file others may read is refused at start); --fault-api on a --metrics address off loopback
# without a token exits 2; Go's amqp091-go sees a POSTed rule's nacks; the status page lists the rules (Chromium).

import json
import os
import re
import stat
import subprocess
import tempfile
import urllib.error
import urllib.request
import uuid

import pika
import pika.exceptions

from tapharness import (AMQPTAP_BIN, BROKER_HOST, BROKER_PORT, TapTestCase, chromium, free_port, main,
                        require_broker, wait_for)
from test_faults import build_go_client

TOKEN = "s3cr3t-t0ken-" + "x" * 20


def broker():
    return pika.BlockingConnection(pika.ConnectionParameters(BROKER_HOST, BROKER_PORT))


class FaultApiTest(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)
        self.queue = "faultapi-" + uuid.uuid4().hex[:10]
        with broker() as c:
            c.channel().queue_declare(self.queue)

    def tearDown(self):
        with broker() as c:
            c.channel().queue_delete(self.queue)
        super().tearDown()

    def tap(self, *extra):
        self.mport = free_port()
        return self.start_tap(["--metrics", f"127.0.0.1:{self.mport}", "--fault-api", *extra], frames=False)

    def api(self, method, path, body=None, token=None, ctype="application/json"):
        """(status, headers, the JSON body or None: none, or evhttp's own error page) of one request"""
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.mport}{path}", method=method, data=data)
        if data is not None:
            req.add_header("Content-Type", ctype)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                status, headers, raw = r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            status, headers, raw = e.code, dict(e.headers), e.read()
        is_json = headers.get("Content-Type") == "application/json"
        return status, headers, json.loads(raw) if raw and is_json else None

    def publish(self, ch, n):
        """n mandatory publishes on a confirm channel; the 1-based indexes pika saw nacked."""
        nacked = []
        for i in range(1, n + 1):
            try:
                ch.basic_publish("", self.queue, b"m%d" % i, mandatory=True)
            except pika.exceptions.NackError:
                nacked.append(i)
        return nacked


class MidStream(FaultApiTest):
    def test_post_acts_on_the_open_connection_then_delete_stops_it(self):
        tap = self.tap()
        self.assertEqual(self.api("GET", "/api/faults")[2], {"max": 16, "rules": []})
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tap.port))
        ch = c.channel()
        ch.confirm_delivery()
        self.assertEqual(self.publish(ch, 10), [], "no rule yet: every publish acked")

        status, headers, rule = self.api("POST", "/api/faults", {"rule": "nack:every=3"})
        self.assertEqual(status, 201, rule)
        rid = rule["id"]
        self.assertEqual((rule["action"], rule["text"], rule["acted"]), ("nack", "nack:every=3", 0))
        self.assertRegex(rule["added"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
        self.assertEqual(headers["Location"], f"/api/faults/{rid}")
        # counted from the rule's first look at this connection: its 3rd, 6th and 9th publish (seq 13, 16, 19)
        self.assertEqual(self.publish(ch, 9), [3, 6, 9])
        listed = self.api("GET", "/api/faults")[2]["rules"]
        self.assertEqual([(r["id"], r["text"], r["acted"]) for r in listed], [(rid, "nack:every=3", 3)])
        self.assertEqual(self.api("GET", f"/api/faults/{rid}")[2]["acted"], 3)
        status_rules = wait_for(lambda: (self.status_faults() or {}).get("rules"), 5)
        self.assertEqual([(r["id"], r["action"], r["acted"]) for r in status_rules], [(rid, "nack", 3)])

        self.assertEqual(self.api("DELETE", f"/api/faults/{rid}")[0], 204)
        self.assertEqual(self.publish(ch, 9), [], "removed: every later publish acked")
        self.assertEqual(self.api("GET", "/api/faults")[2]["rules"], [])
        self.assertEqual(self.api("DELETE", f"/api/faults/{rid}")[0], 404)
        c.close()

        tap.stop()
        pubs = sorted((r for r in tap.records("publish") if r["routing_key"] == self.queue), key=lambda r: r["seq"])
        self.assertEqual([r["seq"] for r in pubs], list(range(1, 29)), "one record per publish")
        saw = [(r["seq"], r.get("client_saw"), r.get("fault")) for r in pubs if "client_saw" in r]
        self.assertEqual(saw, [(13, "nack", rid), (16, "nack", rid), (19, "nack", rid)])
        self.assertTrue(all((r["route"], r["confirm"]) == ("routed", "ack") for r in pubs), "the broker's verdicts")
        self.assertEqual(sorted((f["action"], f["seq"], f["rule"]) for f in tap.records("fault")),
                         [("nack", 13, rid), ("nack", 16, rid), ("nack", 19, rid)])
        err = tap.stderr()
        self.assertIn("--fault-api: fault rules can be added at run time", err)
        self.assertIn(f"--fault rule {rid} active: nack:every=3 (added through --fault-api", err)
        self.assertIn(f"--fault rule {rid} removed through --fault-api after acting 3 times: nack:every=3", err)

    def status_faults(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.mport}/api/status", timeout=10) as r:
            return json.loads(r.read())["faults"]


class Refused(FaultApiTest):
    def test_bad_requests_change_nothing(self):
        self.tap()
        status, _, body = self.api("POST", "/api/faults", {"rule": "nack:evry=3"})
        self.assertEqual(status, 400)
        self.assertEqual(body, {"error": "--fault 'nack:evry=3': unknown key 'evry'"})
        status, _, body = self.api("POST", "/api/faults", b"nack:every=3")
        self.assertEqual(status, 400)
        self.assertIn("not JSON", body["error"])
        self.assertEqual(self.api("POST", "/api/faults", {"rules": "nack"})[0], 400)
        # a form a web page could send without asking first
        self.assertEqual(self.api("POST", "/api/faults", b'{"rule":"nack"}', ctype="text/plain")[0], 415)
        self.assertEqual(self.api("POST", "/api/faults", b"x" * 2000)[0], 413)
        self.assertEqual(self.api("DELETE", "/api/faults/99")[0], 404)
        self.assertEqual(self.api("GET", "/api/faults/99")[0], 404)
        self.assertEqual(self.api("DELETE", "/api/faults/abc")[0], 404)
        status, headers, _ = self.api("PUT", "/api/faults", {"rule": "nack"})
        self.assertEqual((status, headers.get("Allow")), (405, "GET, POST"))
        self.assertEqual(self.api("OPTIONS", "/api/faults")[0], 405)  # no CORS preflight passes
        self.assertEqual(self.api("GET", "/api/faults")[2]["rules"], [], "nothing was added")
        # 16 at most
        for i in range(16):
            self.assertEqual(self.api("POST", "/api/faults", {"rule": f"nack:every={i + 2}"})[0], 201)
        status, _, body = self.api("POST", "/api/faults", {"rule": "nack"})
        self.assertEqual(status, 409, body)

    def test_without_fault_api_there_is_no_api(self):
        mport = free_port()
        self.start_tap(["--metrics", f"127.0.0.1:{mport}", "--fault", "nack:every=5"], frames=False)
        self.mport = mport
        self.assertEqual(self.api("POST", "/api/faults", {"rule": "nack"})[0], 404)
        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/api/status", timeout=10) as r:
            faults = json.loads(r.read())["faults"]
        self.assertEqual(faults["api"], False)
        self.assertEqual([x["text"] for x in faults["rules"]], ["nack:every=5"])


class Token(FaultApiTest):
    def token_file(self, mode=0o600, text=TOKEN + "\n"):
        fd, path = tempfile.mkstemp(prefix="amqptap-token-")
        os.write(fd, text.encode())
        os.close(fd)
        os.chmod(path, mode)
        self.addCleanup(os.unlink, path)
        return path

    def test_401_without_or_with_another_token(self):
        self.tap("--fault-api-token", self.token_file())
        status, headers, body = self.api("GET", "/api/faults")
        self.assertEqual(status, 401)
        self.assertEqual(headers.get("WWW-Authenticate"), 'Bearer realm="amqptap"')
        self.assertEqual(self.api("POST", "/api/faults", {"rule": "nack"}, token=TOKEN + "y")[0], 401)
        self.assertEqual(self.api("POST", "/api/faults", {"rule": "nack"}, token=TOKEN[:-1])[0], 401)
        self.assertEqual(self.api("DELETE", "/api/faults/1")[0], 401)
        status, _, rule = self.api("POST", "/api/faults", {"rule": "nack"}, token=TOKEN)
        self.assertEqual(status, 201, rule)
        self.assertEqual(self.api("GET", "/api/faults", token=TOKEN)[2]["rules"][0]["id"], rule["id"])
        # the other pages ask for no token, as before
        with urllib.request.urlopen(f"http://127.0.0.1:{self.mport}/healthz", timeout=10) as r:
            self.assertEqual(r.status, 200)

    def test_token_file_refused_at_start(self):
        for path, why in ((self.token_file(0o644), "mode 0644 lets group or others at it"),
                          (self.token_file(0o600, "short\n"), "expected one line of 16 to 4096"),
                          ("/nonexistent/token", "No such file")):
            run = subprocess.run([AMQPTAP_BIN, "--upstream", f"127.0.0.1:{BROKER_PORT}", "--listen", "127.0.0.1:0",
                                  "--metrics", f"127.0.0.1:{free_port()}", "--fault-api", "--fault-api-token", path,
                                  "-o", "/dev/null"], capture_output=True, text=True, timeout=20)
            self.assertEqual(run.returncode, 2, run.stderr)
            self.assertIn(f"amqptap: --fault-api-token {path}: {why}", run.stderr)

    def test_off_loopback_needs_the_token(self):
        cmd = [AMQPTAP_BIN, "--upstream", f"127.0.0.1:{BROKER_PORT}", "--listen", "127.0.0.1:0", "--metrics",
               f"0.0.0.0:{free_port()}", "--fault-api", "-o", "/dev/null"]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        self.assertEqual(run.returncode, 2, run.stderr)
        lines = run.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, run.stderr)
        self.assertRegex(lines[0], r"^amqptap: --fault-api: --metrics 0\.0\.0\.0:\d+ is not on loopback: give "
                                   r"--fault-api-token FILE")
        # with the token it starts (and says the endpoint is off loopback)
        mport = free_port()
        tap = self.start_tap(["--metrics", f"0.0.0.0:{mport}", "--fault-api", "--fault-api-token",
                              self.token_file()], frames=False)
        self.mport = mport
        self.assertIn("is not on loopback", tap.stderr())
        self.assertEqual(self.api("GET", "/api/faults")[0], 401)


class GoClient(FaultApiTest):
    def test_go_sees_a_posted_rule(self):
        go = build_go_client()
        tap = self.tap()
        status, _, rule = self.api("POST", "/api/faults", {"rule": "nack:every=2,name=faults_go"})
        self.assertEqual(status, 201, rule)
        out = subprocess.run([go, f"amqp://guest:guest@127.0.0.1:{tap.port}/", self.queue, "8", "5000"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        res = json.loads(out.stdout)
        self.assertEqual(res["nacks"], [2, 4, 6, 8])
        self.assertEqual(res["acks"], [1, 3, 5, 7])
        self.assertEqual(self.api("GET", "/api/faults")[2]["rules"][0]["acted"], 4)


class StatusPage(FaultApiTest):
    def test_page_lists_the_rules(self):
        tap = self.tap("--fault", "kill:after=1000")
        self.assertEqual(self.api("POST", "/api/faults", {"rule": "nack:every=2"})[0], 201)
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tap.port))
        ch = c.channel()
        ch.confirm_delivery()
        self.assertEqual(self.publish(ch, 4), [2, 4])
        c.close()
        run = chromium(self, f"http://127.0.0.1:{self.mport}/", "--dump-dom")
        self.assertEqual(run.returncode, 0, run.stderr.decode()[-2000:])
        dom = run.stdout.decode("utf-8", "replace")
        table = re.search(r'<table id="faults">(.*?)</table>', dom, re.S)
        self.assertIsNotNone(table, dom[:3000])
        rows = [[re.sub(r"<[^>]+>", "", td) for td in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
                for tr in re.findall(r'<tr class="fault"[^>]*>(.*?)</tr>', table.group(1), re.S)]
        self.assertEqual([r[:4] for r in rows], [["1", "kill", "kill:after=1000", "0"], ["2", "nack", "nack:every=2", "2"]])
        self.assertIn("2 fault rule(s) in force (--fault, --fault-api)", dom)


if __name__ == "__main__":
    main()
