# Header values and trace context (issue 14 §3-§4) through the tap to the real broker with py-amqp (Debian
# python3-amqp, the library under Celery and kombu), sending Celery's protocol-2 headers (task name in `task`, task
# id in `id`) and an OpenTelemetry `traceparent`. With --header-values task,id the record carries those values;
# without it, never (only the keys); trace_id/span_id are written either way, and a malformed traceparent is left out.

import json
import os
import subprocess
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tapharness import TapTestCase, main, require_broker, wait_for  # noqa: E402

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"

PUBLISH = r"""
import json, sys, amqp
port, queue, task_id = sys.argv[1], sys.argv[2], sys.argv[3]
c = amqp.Connection('127.0.0.1:' + port)
c.connect()
ch = c.channel()
ch.queue_declare(queue, auto_delete=True)
headers = {'lang': 'py', 'task': 'proj.add', 'id': task_id, 'retries': 0, 'argsrepr': '(2, 2)',
           'traceparent': '00-%s-%s-01' % (sys.argv[4], sys.argv[5])}
ch.basic_publish(amqp.Message('[[2, 2], {}, {}]', correlation_id=task_id, application_headers=headers,
                              content_type='application/json'), exchange='', routing_key=queue)
bad = dict(headers, traceparent='00-not-a-trace-01')
ch.basic_publish(amqp.Message('x', message_id='bad', application_headers=bad), exchange='', routing_key=queue)
c.close()
"""


class HeaderValuesCase(TapTestCase):
    def setUp(self):
        super().setUp()
        require_broker(self)

    def publish(self, extra_args):
        tap = self.start_tap(extra_args)
        task_id = str(uuid.uuid4())
        subprocess.run(["/usr/bin/python3", "-c", PUBLISH, str(tap.port), "hv." + uuid.uuid4().hex[:8], task_id,
                        TRACE, SPAN], check=True, timeout=30)
        wait_for(lambda: len(tap.records("publish")) >= 2, 10)
        recs = tap.records("publish")
        self.assertEqual(len(recs), 2, recs)
        return task_id, recs[0], recs[1]

    def test_celery_headers_with_header_values(self):
        task_id, rec, bad = self.publish(["--header-values", "task,id"])
        self.assertEqual(rec.get("header_values"), {"task": "proj.add", "id": task_id}, json.dumps(rec))
        self.assertEqual(rec.get("correlation_id"), task_id)
        self.assertEqual((rec.get("trace_id"), rec.get("span_id")), (TRACE, SPAN), json.dumps(rec))
        self.assertNotIn("trace_id", bad)
        self.assertNotIn("span_id", bad)

    def test_no_header_values_by_default(self):
        task_id, rec, _bad = self.publish([])
        self.assertNotIn("header_values", rec)
        self.assertNotIn("proj.add", json.dumps(rec))
        self.assertIn("task", rec.get("headers", []))
        self.assertEqual((rec.get("trace_id"), rec.get("span_id")), (TRACE, SPAN), json.dumps(rec))


if __name__ == "__main__":
    main()
