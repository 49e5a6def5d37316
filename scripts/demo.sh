#!/usr/bin/env bash
# Shows amqptap at work: builds (incrementally), starts the throwaway broker and a tap in front of it, runs the
# publish scenarios below through the tap with pika, and prints the records the tap wrote.
# Add a scenario: write a function in the Python block and append it to SCENARIOS.
# Env: TAP_BUILD_DIR (build), TAP_BROKER_PORT (5690), TAP_DEMO_PORT (5673).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

build=${TAP_BUILD_DIR:-$TAP_REPO/build}
tap_port=${TAP_DEMO_PORT:-5673}
out=$TAP_RUN_DIR/demo
tap_pid=
broker_started=

cleanup() {
	if [ -n "$tap_pid" ] && kill -0 "$tap_pid" 2>/dev/null; then
		kill -TERM "$tap_pid"
		wait "$tap_pid" || tap_log "amqptap exited $?"
	fi
	[ -n "$broker_started" ] && "$TAP_REPO/scripts/broker.sh" stop
	return 0
}
trap cleanup EXIT

tap_build "$build" >/dev/null || tap_die "build failed in $build"
tap_need_pkgs rabbitmq-server python3-pika

if ! "$TAP_REPO/scripts/broker.sh" status >/dev/null 2>&1; then
	"$TAP_REPO/scripts/broker.sh" start
	broker_started=1
fi

mkdir -p "$out"
rm -f "$out"/verdicts.jsonl "$out"/frames.jsonl
"$build/amqptap" --listen "127.0.0.1:$tap_port" --upstream "127.0.0.1:$TAP_BROKER_PORT" \
	--verdicts "$out/verdicts.jsonl" --frames "$out/frames.jsonl" 2>"$out/amqptap.log" &
tap_pid=$!
for _ in $(seq 100); do
	grep -q 'listening on' "$out/amqptap.log" 2>/dev/null && break
	kill -0 "$tap_pid" 2>/dev/null || { cat "$out/amqptap.log" >&2; tap_die "amqptap did not start"; }
	sleep 0.05
done
tap_log "amqptap on 127.0.0.1:$tap_port -> broker 127.0.0.1:$TAP_BROKER_PORT"

/usr/bin/python3 - "$tap_port" <<'PY'
import sys
import pika

PORT = int(sys.argv[1])
QUEUE = "amqptap-demo"


def confirmed_publishes(ch):
    """Three routable publishes with confirms and mandatory: expect route=routed, confirm=ack."""
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", QUEUE, f"hello {i}".encode(),
                         pika.BasicProperties(message_id=f"demo-{i}", delivery_mode=2), mandatory=True)
        print(f"  published hello {i}: acked")


def unroutable_mandatory(ch):
    """A mandatory publish no queue takes: the broker returns it (312 NO_ROUTE) and then acks it."""
    try:
        ch.basic_publish("amq.direct", "nobody-listens", b"lost?",
                         pika.BasicProperties(message_id="demo-unroutable"), mandatory=True)
        print("  unroutable publish: acked without a return?!")
    except pika.exceptions.UnroutableError:
        print("  unroutable publish: returned by the broker (312 NO_ROUTE)")


def consume_back(ch):
    """Consume what the first scenario published."""
    for _ in range(3):
        method, _props, body = ch.basic_get(QUEUE, auto_ack=True)
        print(f"  got {body!r}" if method else "  queue empty")


SCENARIOS = [confirmed_publishes, unroutable_mandatory, consume_back]

conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", PORT))
ch = conn.channel()
ch.queue_declare(QUEUE, auto_delete=False)
ch.queue_purge(QUEUE)
for scenario in SCENARIOS:
    print(f"{scenario.__name__}: {scenario.__doc__}")
    scenario(ch)
ch.queue_delete(QUEUE)
conn.close()
PY

# Stop the tap so every pending verdict is flushed before printing.
kill -TERM "$tap_pid"
wait "$tap_pid" || tap_log "amqptap exited $?"
tap_pid=
echo
echo "== verdicts written by amqptap ($out/verdicts.jsonl)"
cat "$out/verdicts.jsonl"
echo
echo "== $(wc -l <"$out/frames.jsonl") frames traced in $out/frames.jsonl; amqptap's stderr:"
cat "$out/amqptap.log"
