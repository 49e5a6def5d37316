# A real rabbitmq-c session through the tap against the throwaway broker (tests/clients/confirm_roundtrip.c):
# 10,000 publishes streamed with a window of 1,000 unconfirmed, acks counted (multiple=true included), then
# consumed back in order.

import os
import re
import subprocess
import uuid

from tapharness import BROKER_PORT, CLIENTS_DIR, TapTestCase, check_confirmed_publishes, main, require_broker

COUNT = 10000
CLIENT = os.path.join(CLIENTS_DIR, "confirm_roundtrip")


class RabbitmqcSessionTest(TapTestCase):
    def test_streaming_confirms_roundtrip(self):
        require_broker(self)
        self.assertTrue(os.access(CLIENT, os.X_OK), f"{CLIENT} not built (librabbitmq-dev missing?)")
        tap = self.start_tap(upstream_port=BROKER_PORT)
        queue = f"amqptap-it-c-{uuid.uuid4().hex[:8]}"
        r = subprocess.run([CLIENT, "127.0.0.1", str(tap.port), queue, str(COUNT), "1000"], capture_output=True,
                           timeout=120)
        out = r.stdout.decode() + r.stderr.decode()
        print(out.strip())
        self.assertEqual(r.returncode, 0, out)
        m = re.search(r"published=(\d+) acked=(\d+) nacked=(\d+) multiple=(\d+) duplicate=(\d+) consumed=(\d+) "
                      r"out_of_order=(\d+)", out)
        self.assertIsNotNone(m, out)
        published, acked, nacked, multiple, duplicate, consumed, disorder = map(int, m.groups())
        self.assertEqual((published, acked, nacked, duplicate, consumed, disorder), (COUNT, COUNT, 0, 0, COUNT, 0))
        self.assertGreater(multiple, 0, "no multiple=true ack seen: the window did not stream")
        self.assertTrue(tap.alive())
        self.assertEqual(tap.stop(), 0)
        pubs = check_confirmed_publishes(self, tap.records(), COUNT)
        self.assertTrue(any(r.get("multiple") for r in pubs), "no verdict records a multiple=true ack")


if __name__ == "__main__":
    main()
