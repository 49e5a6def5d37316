#!/usr/bin/env bash
# Shows amqptap at work: installs what it needs, builds (incrementally), starts the throwaway broker and a tap in front of it, runs the
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

# Everything the build and the demo need, installed before anything is built (a fresh machine has none of it).
tap_need_pkgs "${TAP_BUILD_PKGS[@]}" rabbitmq-server python3-pika ||
	tap_die "could not install the packages the demo needs"
tap_build "$build" >/dev/null || tap_die "build failed in $build"

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


def confirm_without_mandatory(ch):
    """Confirmed but not mandatory, to a key no queue takes: acked, yet it vanished (route=unproven)."""
    ch.basic_publish("amq.direct", "nobody-listens", b"gone", pika.BasicProperties(message_id="demo-vanished"))
    print("  acked, and silently dropped by the broker")


def nacked(ch):
    """A full queue with x-overflow=reject-publish: the broker nacks (confirm=nack)."""
    ch.queue_declare(QUEUE + ".full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    for i in range(2):
        try:
            ch.basic_publish("", QUEUE + ".full", b"x", pika.BasicProperties(message_id=f"demo-full-{i}"),
                             mandatory=True)
            print(f"  publish {i} to the full queue: acked")
        except pika.exceptions.NackError:
            print(f"  publish {i} to the full queue: nacked")


def missing_exchange(ch):
    """A publish to an exchange that does not exist: the broker closes the channel (404); nobody answers it."""
    try:
        ch.basic_publish("no-such-exchange", "k", b"?", pika.BasicProperties(message_id="demo-404"), mandatory=True)
    except pika.exceptions.ChannelClosedByBroker as e:
        print(f"  channel closed by the broker: {e}")


SCENARIOS = [confirmed_publishes, unroutable_mandatory, consume_back, confirm_without_mandatory, nacked,
             missing_exchange]

conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", PORT))
admin = conn.channel()
admin.queue_declare(QUEUE, auto_delete=False)
admin.queue_purge(QUEUE)
admin.queue_delete(QUEUE + ".full")
ch = conn.channel()
ch.confirm_delivery()
for scenario in SCENARIOS:
    print(f"{scenario.__name__}: {scenario.__doc__}")
    scenario(ch)
admin.queue_delete(QUEUE)
admin.queue_delete(QUEUE + ".full")
conn.close()
PY

# Stop the tap so every pending verdict is flushed before printing.
kill -TERM "$tap_pid"
wait "$tap_pid" || tap_log "amqptap exited $?"
tap_pid=
echo
echo "== one verdict per publish, as amqptap saw them on the wire"
/usr/bin/python3 - "$out/verdicts.jsonl" <<'PY'
import json
import sys

print(f"{'message_id':<16} {'ch':>2} {'seq':>4} {'exchange':<17} {'routing_key':<20} {'route':<9} {'confirm':<8} "
      f"{'confirm_us':>10}  why")
records = [json.loads(line) for line in open(sys.argv[1])]
# Written in the order the broker settled them (an acked mandatory publish is held --late-return ms in case a
# Return is late); shown here in publish order.
for r in sorted((r for r in records if r["type"] == "publish"), key=lambda r: (r["conn"], r["channel"], r["seq"] or 0)):
    why = ""
    if r.get("reply_code"):
        why = f"{r['reply_code']} {r['reply_text']} ({r['order']})"
    elif r.get("reason"):
        why = " ".join(str(v) for v in r["reason"].values())
    print(f"{str(r['message_id']):<16} {r['channel']:>2} {str(r['seq']):>4} {r['exchange'] or '(default)':<17} "
          f"{r['routing_key']:<20} {r['route']:<9} {r['confirm']:<8} {str(r.get('confirm_us', '')):>10}  {why}")
for r in records:
    if r["type"] == "warning":
        print(f"warning: {r['rule']} (conn {r['conn']}, channel {r['channel']}, seq {r.get('seq')})")
PY
echo
echo "== the raw records ($out/verdicts.jsonl)"
cat "$out/verdicts.jsonl"
echo
echo "== $(wc -l <"$out/frames.jsonl") frames traced in $out/frames.jsonl; amqptap's stderr:"
cat "$out/amqptap.log"
