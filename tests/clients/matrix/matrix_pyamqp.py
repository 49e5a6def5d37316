# The client-matrix cases (tests/integration/test_client_matrix.py) with py-amqp (the library under Celery and
# kombu): every publish on a confirm channel, one JSON line per publish on stdout saying what the library
# itself reported. Usage: matrix_pyamqp.py HOST:PORT EXCHANGE MISSING_EXCHANGE PREFIX
import json
import sys

import amqp


def report(message_id, what):
    print(json.dumps({"message_id": message_id, "outcome": what}), flush=True)


def publish(ch, exchange, key, message_id, mandatory):
    returned = []
    ch.events["basic_return"].add(lambda *args: returned.append(args))
    msg = amqp.Message(b"matrix " + message_id.encode(), message_id=message_id)
    try:
        # With confirms selected, basic_publish waits for the ack and raises on a nack.
        ch.basic_publish(msg, exchange=exchange, routing_key=key, mandatory=mandatory)
        what = "ack"
    except amqp.exceptions.MessageNacked:
        what = "nack"
    except amqp.exceptions.AMQPError as e:
        report(message_id, f"closed:{e.code}")
        return
    if returned:
        what = "returned+" + what
    report(message_id, what)


def main():
    hostport, exchange, missing, prefix = sys.argv[1:5]
    # confirm_publish: each channel selects confirms at its first publish, and basic_publish waits for the
    # broker's answer (how kombu and Celery publish with confirms).
    conn = amqp.Connection(hostport, confirm_publish=True)
    conn.connect()
    ch = conn.channel()
    publish(ch, exchange, "ok", prefix + "routable", True)
    publish(ch, exchange, "nomatch", prefix + "unroutable-mandatory", True)
    publish(ch, exchange, "nomatch", prefix + "unroutable-plain", False)
    publish(ch, exchange, "full", prefix + "fills-queue", True)
    publish(ch, exchange, "full", prefix + "overflow", True)
    publish(conn.channel(), missing, "ok", prefix + "missing-exchange", True)
    ch.close()
    conn.close()


if __name__ == "__main__":
    main()
