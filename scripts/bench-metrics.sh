#!/usr/bin/env bash
# What --metrics costs the forwarding: two taps in front of the same throwaway broker, one plain and one with
# --metrics scraped every second (GET /metrics, as Prometheus would), the same publisher load
# (tests/bench/bench_loadgen) through each in turn, the order swapped every round. Prints per round and as medians:
# msgs/s and the tap's CPU per message, and the ratios metrics/plain (paired per round).
#
# Environment: TAP_BENCH_ROUNDS (8), TAP_BENCH_LOAD ("conns window bytes messages", default "1 1000 64 200000"),
# TAP_BENCH_BUILD (build dir, default build), TAP_BROKER_PORT / TAP_BROKER_DIST_PORT (a broker.sh node; started and
# stopped here when none runs).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$repo/scripts/lib.sh"

rounds=${TAP_BENCH_ROUNDS:-8}
read -r conns window size count <<<"${TAP_BENCH_LOAD:-1 1000 64 200000}"
build=${TAP_BENCH_BUILD:-$repo/build}
loadgen=$build/bench/bench_loadgen
[ -x "$loadgen" ] && [ -x "$build/amqptap" ] || tap_die "build $build first (amqptap and bench/bench_loadgen)"
out=$(mktemp -d)
plain_pid= metrics_pid= scraper_pid= broker_started=
cleanup() {
	for p in $scraper_pid $plain_pid $metrics_pid; do kill -TERM "$p" 2>/dev/null || true; done
	for p in $scraper_pid $plain_pid $metrics_pid; do wait "$p" 2>/dev/null || true; done
	[ -n "$broker_started" ] && "$repo/scripts/broker.sh" stop
	rm -rf "$out"
}
trap cleanup EXIT
if ! "$repo/scripts/broker.sh" status >/dev/null 2>&1; then
	"$repo/scripts/broker.sh" start
	broker_started=1
fi

free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
plain_port=$(free_port) metrics_port=$(free_port) http_port=$(free_port)
"$build/amqptap" --listen "127.0.0.1:$plain_port" --upstream "127.0.0.1:$TAP_BROKER_PORT" \
	--verdicts "$out/plain.jsonl" 2>"$out/plain.log" &
plain_pid=$!
"$build/amqptap" --listen "127.0.0.1:$metrics_port" --upstream "127.0.0.1:$TAP_BROKER_PORT" \
	--verdicts "$out/metrics.jsonl" --metrics "127.0.0.1:$http_port" 2>"$out/metrics.log" &
metrics_pid=$!
tap_wait_port "$http_port"
tap_wait_port "$plain_port"
tap_wait_port "$metrics_port"
(while sleep 1; do curl -s -o /dev/null "http://127.0.0.1:$http_port/metrics" || true; done) &
scraper_pid=$!

tck=$(getconf CLK_TCK)
# utime and stime of a process in clock ticks (/proc/PID/stat fields 14 and 15, after the parenthesised name)
user_sys_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12, $13 }'; }
run() { # target port pid round
	local u0 s0 u1 s1 line
	read -r u0 s0 < <(user_sys_ticks "$3")
	line=$("$loadgen" -p "$2" -c "$conns" -w "$window" -s "$size" -n "$count")
	read -r u1 s1 < <(user_sys_ticks "$3")
	printf '{"round":%d,"target":"%s","cpu_s":%s,"user_s":%s,"run":%s}\n' "$4" "$1" \
		"$(awk -v t=$((u1 + s1 - u0 - s0)) -v k="$tck" 'BEGIN { printf "%.2f", t / k }')" \
		"$(awk -v t=$((u1 - u0)) -v k="$tck" 'BEGIN { printf "%.2f", t / k }')" "$line" >>"$out/results.jsonl"
	tap_log "round $4 $1: $line"
}
for r in $(seq "$rounds"); do
	if [ $((r % 2)) = 1 ]; then
		run plain "$plain_port" "$plain_pid" "$r"
		run metrics "$metrics_port" "$metrics_pid" "$r"
	else
		run metrics "$metrics_port" "$metrics_pid" "$r"
		run plain "$plain_port" "$plain_pid" "$r"
	fi
done
scrapes=$(curl -s "http://127.0.0.1:$http_port/metrics" | awk '$1 == "amqptap_http_connections_total" { print $2 }')
tap_log "the metrics tap served $scrapes scrape connections"

/usr/bin/python3 - "$out/results.jsonl" "$conns" "$window" "$size" "$count" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
conns, window, size, count = sys.argv[2:6]
by = {}
for r in rows:
    run = r["run"]
    msgs = run["msgs"]
    by.setdefault(r["round"], {})[r["target"]] = (run["msgs_per_s"], r["cpu_s"] / msgs * 1e6)
print(f"load: {conns} connection(s), window {window}, {size}-byte bodies, {count} messages per run; "
      f"{len(by)} rounds, order swapped every round\n")
print("| round | plain msg/s | metrics msg/s | ratio | plain CPU µs/msg | metrics CPU µs/msg | ratio |")
print("|---|---|---|---|---|---|---|")
tr, cr = [], []
for rnd in sorted(by):
    p, m = by[rnd]["plain"], by[rnd]["metrics"]
    tr.append(m[0] / p[0])
    cr.append(m[1] / p[1])
    print(f"| {rnd} | {p[0]:,.0f} | {m[0]:,.0f} | {tr[-1]:.3f} | {p[1]:.2f} | {m[1]:.2f} | {cr[-1]:.3f} |")
med = lambda t, i: statistics.median(by[r][t][i] for r in by)
print(f"| median | {med('plain', 0):,.0f} | {med('metrics', 0):,.0f} | {statistics.median(tr):.3f} (paired) "
      f"| {med('plain', 1):.2f} | {med('metrics', 1):.2f} | {statistics.median(cr):.3f} (paired) |")
user = statistics.median(r["user_s"] / r["cpu_s"] for r in rows if r["cpu_s"] > 0)
print(f"\nuser-space share of the taps' CPU: {user:.0%} (the rest is the kernel's socket work)")
PY
