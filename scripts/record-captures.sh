#!/usr/bin/env bash
# Re-records captures/: every src/DESIGN.md §7 scenario of tests/integration/capture_scenarios.py run by pika through
# an amqptap with --pcap in front of the throwaway broker, and its expected records made by replaying it.
# Usage: record-captures.sh [SCENARIO...]   (env: AMQPTAP_BIN, TAP_BROKER_* as for broker.sh; KEEP_BROKER=1)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

export TAP_BROKER_PORT TAP_BROKER_DIST_PORT TAP_BROKER_DIR TAP_BROKER_NODE
export AMQPTAP_BIN=${AMQPTAP_BIN:-$TAP_REPO/build/amqptap}
[ -x "$AMQPTAP_BIN" ] || tap_build "$(dirname "$AMQPTAP_BIN")"

started=
if ! "$TAP_REPO/scripts/broker.sh" status >/dev/null 2>&1; then
	"$TAP_REPO/scripts/broker.sh" start
	started=1
fi
stop_broker() { [ -z "$started" ] || [ -n "${KEEP_BROKER:-}" ] || "$TAP_REPO/scripts/broker.sh" stop; }
trap stop_broker EXIT

/usr/bin/python3 "$TAP_REPO/tests/integration/capture_scenarios.py" --out "$TAP_REPO/captures" "$@"
du -ch "$TAP_REPO"/captures/*.pcapng | tail -n 1 >&2
