#!/usr/bin/env bash
# The consumer benchmark: a rabbitmq-c consumer (tests/bench/bench_consume.c) at prefetch 100 with one ack per
# message takes N messages of S bytes from a queue filled straight to the broker beforehand, straight from the
# broker, through HAProxy (TCP mode) and through amqptap, alternating in every round; prints deliveries/s and the
# proxy's CPU per delivery (utime+stime) per target and round, and checks that the tap wrote one delivery record
# per delivery. Uses the broker of TAP_BROKER_PORT (scripts/broker.sh start first).
# Env: TAP_BENCH_ROUNDS (5), TAP_BENCH_N (100000), TAP_BENCH_SIZE (64), TAP_BENCH_BUILD (build).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$repo/scripts/lib.sh"
rounds=${TAP_BENCH_ROUNDS:-5}
n=${TAP_BENCH_N:-100000}
size=${TAP_BENCH_SIZE:-64}
build=${TAP_BENCH_BUILD:-$repo/build}
out=$(mktemp -d "${TMPDIR:-/tmp}/amqptap-bench-consume.XXXXXX")
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
hap_port=$(free_port)
tap_port=$(free_port)
hap_pid= tap_pid=
cleanup() {
	for p in $tap_pid $hap_pid; do kill -TERM "$p" 2>/dev/null || true; done
	for p in $tap_pid $hap_pid; do wait "$p" 2>/dev/null || true; done
	rm -rf "$out"
}
trap cleanup EXIT
cat >"$out/haproxy.cfg" <<CFG
global
	nbthread 1
	maxconn 4096
defaults
	mode tcp
	timeout connect 5s
	timeout client 1h
	timeout server 1h
frontend amqp
	bind 127.0.0.1:$hap_port
	default_backend broker
backend broker
	server rabbit 127.0.0.1:$TAP_BROKER_PORT
CFG
haproxy -f "$out/haproxy.cfg" -db >"$out/haproxy.log" 2>&1 &
hap_pid=$!
"$build/amqptap" --listen "127.0.0.1:$tap_port" --upstream "127.0.0.1:$TAP_BROKER_PORT" --verdicts "$out/v.jsonl" \
	2>"$out/amqptap.log" &
tap_pid=$!
tap_wait_port "$hap_port"
tap_wait_port "$tap_port"
bc=$build/bench/bench_consume
queue=bench-consume-$$
hz=$(getconf CLK_TCK)
for r in $(seq "$rounds"); do
	for target in direct haproxy tap; do
		case $target in direct) port=$TAP_BROKER_PORT pid= ;; haproxy) port=$hap_port pid=$hap_pid ;;
		tap) port=$tap_port pid=$tap_pid ;; esac
		"$bc" fill -p "$TAP_BROKER_PORT" -q "$queue" -n "$n" -s "$size"
		before=0
		[ -n "$pid" ] && before=$(tap_cpu_ticks "$pid")
		res=$("$bc" consume -p "$port" -q "$queue" -n "$n" -P 100)
		after=0
		[ -n "$pid" ] && after=$(tap_cpu_ticks "$pid")
		echo "{\"round\":$r,\"target\":\"$target\",\"result\":$res,\"cpu_s\":$(awk -v a="$after" -v b="$before" -v hz="$hz" 'BEGIN { printf "%.3f", (a - b) / hz }')}"
	done
done
sleep 0.5
got=$(grep -c '"type":"delivery"' "$out/v.jsonl" || true)
want=$((rounds * n))
echo "{\"tap_delivery_records\":$got,\"deliveries_through_tap\":$want,\"tap_peak_rss_kb\":$(awk '/^VmHWM:/ { print $2 }' "/proc/$tap_pid/status")}"
[ "$got" -eq "$want" ] || { echo "bench-consume: $got delivery records for $want deliveries" >&2; exit 1; }
