# Helpers of the routing tests (test_route, test_route_differential): the broker's definitions and policies, through
# the management API when TAP_BROKER_MGMT_PORT names its port (scripts/broker.sh enables the plugin then), else
# through rabbitmqctl (scripts/broker.sh ctl: slower, an Erlang VM per call); `amqptap route` run on a file.

import base64
import json
import os
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request

from tapharness import AMQPTAP_BIN, SOURCE_DIR

MGMT_PORT = os.environ.get("TAP_BROKER_MGMT_PORT")
BROKER_SH = os.path.join(SOURCE_DIR, "scripts", "broker.sh")


def _mgmt(method, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{MGMT_PORT}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


def _ctl(*args):
    return subprocess.run([BROKER_SH, "ctl", *args], check=True, capture_output=True, timeout=120).stdout


def export_definitions(path):
    """Writes the broker's definitions (all vhosts) to path."""
    if MGMT_PORT:
        with open(path, "wb") as f:
            f.write(_mgmt("GET", "/api/definitions"))
    else:
        _ctl("export_definitions", path)


def set_policy(name, pattern, definition, priority=0, apply_to="exchanges", vhost="/"):
    if MGMT_PORT:
        _mgmt("PUT", f"/api/policies/{urllib.parse.quote(vhost, safe='')}/{urllib.parse.quote(name, safe='')}",
              {"pattern": pattern, "definition": definition, "priority": priority, "apply-to": apply_to})
    else:
        _ctl("set_policy", "-p", vhost, "--priority", str(priority), "--apply-to", apply_to, name, pattern,
             json.dumps(definition))


def clear_policy(name, vhost="/"):
    if MGMT_PORT:
        try:
            _mgmt("DELETE", f"/api/policies/{urllib.parse.quote(vhost, safe='')}/{urllib.parse.quote(name, safe='')}")
        except urllib.error.HTTPError:
            pass
    else:
        subprocess.run([BROKER_SH, "ctl", "clear_policy", "-p", vhost, name], capture_output=True, timeout=120)


def route(*args, timeout=120):
    """Runs `amqptap route ARGS`; returns the CompletedProcess (text)."""
    return subprocess.run([AMQPTAP_BIN, "route", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL,
                          env=dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "detect_leaks=1")))


def write_cases(cases, directory):
    """The cases as a JSON Lines file in directory; returns its path."""
    fd, path = tempfile.mkstemp(prefix="cases-", suffix=".jsonl", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for c in cases:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    return path
