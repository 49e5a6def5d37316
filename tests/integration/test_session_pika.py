# A real pika session through the tap against the throwaway broker: declare a queue, publish 10,000
# messages with publisher confirms, consume them all back, and check that each arrives once and in order.

import uuid

import pika

from tapharness import BROKER_PORT, TapTestCase, check_confirmed_publishes, main, require_broker

COUNT = 10000


class PikaSessionTest(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)
        self.tap = self.start_tap(upstream_port=BROKER_PORT)

    def connect(self):
        params = pika.ConnectionParameters(host="127.0.0.1", port=self.tap.port, connection_attempts=1,
                                           socket_timeout=10, blocked_connection_timeout=30)
        return pika.BlockingConnection(params)

    def test_confirmed_roundtrip(self):
        queue = f"amqptap-it-pika-{uuid.uuid4().hex[:8]}"
        conn = self.connect()
        try:
            ch = conn.channel()
            ch.queue_declare(queue, auto_delete=False)
            ch.confirm_delivery()
            props = pika.BasicProperties(content_type="text/plain", delivery_mode=1)
            for i in range(COUNT):
                # With confirms on, basic_publish returns once the broker acked (nack/return would raise).
                ch.basic_publish("", queue, f"msg {i}".encode(), props, mandatory=True)
            self.assertEqual(ch.queue_declare(queue, passive=True).method.message_count, COUNT)

            ch.basic_qos(prefetch_count=1000)
            got = []
            for method, _props, body in ch.consume(queue, inactivity_timeout=10):
                self.assertIsNotNone(method, f"no delivery for 10 s after {len(got)} messages")
                got.append(body)
                if len(got) % 500 == 0 or len(got) == COUNT:
                    ch.basic_ack(method.delivery_tag, multiple=True)
                if len(got) == COUNT:
                    break
            ch.cancel()
            self.assertEqual(got, [f"msg {i}".encode() for i in range(COUNT)])
            ch.queue_delete(queue)
            ch.close()
        finally:
            if conn.is_open:
                conn.close()
        self.assertTrue(self.tap.alive())
        self.assertEqual(self.tap.stop(), 0)
        check_confirmed_publishes(self, self.tap.records(), COUNT)


if __name__ == "__main__":
    main()
