# The connection record's client properties for py-amqp (issue 14 §1), the library under Celery and kombu: it sends
# product and product_version (and a capabilities table) but no version and no platform. Through the tap to the
# real broker the record must read product "py-amqp", version = amqp.__version__, platform null — never the inside
# of the capabilities table. pika, which sends all three, keeps its values.

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pika  # noqa: E402

from scenario_lib import params  # noqa: E402
from tapharness import TapTestCase, main, require_broker, wait_for  # noqa: E402


class ClientPropertiesCase(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)

    def opened(self, tap, n):
        wait_for(lambda: len([r for r in tap.records("connection") if r.get("event") == "open"]) >= n, 10)
        return [r for r in tap.records("connection") if r.get("event") == "open"]

    def test_py_amqp(self):
        tap = self.start_tap()
        script = (f"import amqp; c = amqp.Connection('127.0.0.1:{tap.port}'); c.connect(); c.close(); "
                  "print(amqp.__version__)")
        out = subprocess.run(["/usr/bin/python3", "-c", script], check=True, timeout=30, capture_output=True,
                             text=True)
        version = out.stdout.strip()
        rec = self.opened(tap, 1)[0]
        self.assertEqual((rec.get("product"), rec.get("version"), rec.get("platform")), ("py-amqp", version, None),
                         json.dumps(rec))
        self.assertEqual(rec.get("user"), "guest")

    def test_pika_keeps_its_properties(self):
        tap = self.start_tap()
        pika.BlockingConnection(params(tap.port)).close()
        rec = self.opened(tap, 1)[0]
        self.assertEqual(rec.get("product"), "Pika Python Client Library")
        self.assertEqual(rec.get("version"), pika.__version__)
        self.assertTrue(rec.get("platform", "").startswith("Python "), json.dumps(rec))


if __name__ == "__main__":
    main()
