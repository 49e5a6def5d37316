#!/usr/bin/env bash
# TLS benchmark (issue 6): streaming-confirm loads (tests/bench/bench_loadgen.c -T) straight to a throwaway RabbitMQ's
# mTLS listener and through amqptap with TLS on both legs, alternating in every round; prints medians of msgs/s,
# the tap/direct ratio, p50/p99 latency and what the tap adds, tap CPU per message and a check that the tap wrote
# one publish record per message, as a Markdown table (also written to .run/bench-tls/latest.md).
#
# Environment: TAP_BENCH_ROUNDS (5), TAP_BENCH_LOADS (space-separated NAME:CONNS:WINDOW:BYTES:MSGS-PER-CONN, default
# "w1000:1:1000:64:100000 w100_4k:1:100:4096:40000"), TAP_BENCH_SCALE (multiplies every message count),
# TAP_BENCH_BUILD (build dir, default build-tlsb), TAP_BENCH_BUILD_TYPE (Release), TAP_BENCH_OUT (default
# .run/bench-tls), TAP_BENCH_TAP_PORT (5762).
# The broker: plain port 5760, TLS port 5761, node benchtls@localhost, data in $TAP_BENCH_OUT/broker.
# `scripts/bench-tls.sh report` only re-renders the table from the last run's results.jsonl. Exits 1 if a run
# failed or a tap run's publish-record count differs from what was sent.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${TAP_BENCH_OUT:-$repo/.run/bench-tls}
export TAP_BROKER_PORT=${TAP_BROKER_PORT:-5760}
export TAP_BROKER_DIST_PORT=${TAP_BROKER_DIST_PORT:-25760}
export TAP_BROKER_DIR=${TAP_BROKER_DIR:-$out/broker}
export TAP_BROKER_NODE=${TAP_BROKER_NODE:-benchtls@localhost}
export TAP_BROKER_TLS_PORT=${TAP_BROKER_TLS_PORT:-5761}
pki=$out/pki
export TAP_BROKER_TLS_CA=$pki/ca.pem TAP_BROKER_TLS_CERT=$pki/server.pem TAP_BROKER_TLS_KEY=$pki/server.key
# shellcheck source=scripts/lib.sh
. "$repo/scripts/lib.sh"

rounds=${TAP_BENCH_ROUNDS:-5}
scale=${TAP_BENCH_SCALE:-1}
build=${TAP_BENCH_BUILD:-$repo/build-tlsb}
tap_port=${TAP_BENCH_TAP_PORT:-5762}
loads=${TAP_BENCH_LOADS:-"w1000:1:1000:64:100000 w100_4k:1:100:4096:40000"}
mode=${1:-run}
results=$out/results.jsonl

for l in $loads; do
	[[ $l =~ ^[A-Za-z0-9_]+:[0-9]+:[0-9]+:[0-9]+:[0-9]+$ ]] || tap_die "bad load '$l' (want NAME:CONNS:WINDOW:BYTES:MSGS)"
done

if [ "$mode" = run ]; then
tap_pid='' broker_started=''
cleanup() {
	local rc=$?
	if [ -n "$tap_pid" ]; then
		kill -TERM "$tap_pid" 2>/dev/null || true
		wait "$tap_pid" 2>/dev/null || true
	fi
	if [ -n "$broker_started" ]; then
		"$repo/scripts/broker.sh" stop || true
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM



# CA, server certificate for localhost/127.0.0.1 and client certificate, as tests/integration/test_tls.py makes them;
# kept between runs while they are valid for another day.
make_pki() {
	if [ -s "$pki/client.key" ] && openssl x509 -checkend 86400 -noout -in "$pki/server.pem" >/dev/null 2>&1 &&
		openssl x509 -checkend 86400 -noout -in "$pki/client.pem" >/dev/null 2>&1; then
		return 0
	fi
	tap_log "writing a CA, server and client certificates into $pki"
	rm -rf "$pki"
	mkdir -p "$pki"
	(
		cd "$pki"
		openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 30 -subj "/CN=amqptap bench ca"
		echo "subjectAltName=DNS:localhost,IP:127.0.0.1" >server.ext
		openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost
		openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 30 \
			-extfile server.ext
		openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=amqptap-bench-client
		openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 30
	) >"$out/pki.log" 2>&1 || { cat "$out/pki.log" >&2; tap_die "openssl failed"; }
	# the broker runs as this user and reads the key
	chmod 600 "$pki"/*.key
}

mkdir -p "$out"
tap_log "building (${TAP_BENCH_BUILD_TYPE:-Release}) in $build"
tap_build "$build" -DCMAKE_BUILD_TYPE="${TAP_BENCH_BUILD_TYPE:-Release}" >/dev/null
loadgen=$build/bench/bench_loadgen
[ -x "$loadgen" ] || tap_die "$loadgen was not built (is librabbitmq-dev installed?)"
make_pki

if ! "$repo/scripts/broker.sh" status >/dev/null 2>&1; then
	"$repo/scripts/broker.sh" start
	broker_started=1
else
	tap_log "reusing the running broker $TAP_BROKER_NODE (it must have been started with this PKI)"
fi
tap_wait_port "$TAP_BROKER_TLS_PORT"

verdicts=$out/verdicts.jsonl
: >"$verdicts"
"$build/amqptap" --listen "127.0.0.1:$tap_port" --tls-cert "$pki/server.pem" --tls-key "$pki/server.key" \
	--upstream "localhost:$TAP_BROKER_TLS_PORT" --upstream-tls --upstream-ca "$pki/ca.pem" \
	--upstream-cert "$pki/client.pem" --upstream-key "$pki/client.key" --verdicts "$verdicts" 2>"$out/amqptap.log" &
tap_pid=$!
tap_wait_port "$tap_port"

# The loadgen verifies the server certificate against our CA and the name localhost (127.0.0.1 in /etc/hosts) on
# both paths; the broker wants a client certificate, the tap does not.
tls_args() {
	case $1 in
	direct) echo "-T -H localhost -p $TAP_BROKER_TLS_PORT -C $pki/ca.pem -E $pki/client.pem -K $pki/client.key" ;;
	tap) echo "-T -H localhost -p $tap_port -C $pki/ca.pem" ;;
	esac
}

: >"$results"
tck=$(getconf CLK_TCK)

# Runs one load against one target and appends its JSON line, with the tap's CPU and verdict count.
run_one() {
	local round=$1 spec=$2 target=$3
	local name c w s n before=0 after=0 line verdict_count=null
	IFS=: read -r name c w s n <<<"$spec"
	n=$(awk -v n="$n" -v k="$scale" 'BEGIN { v = int(n * k); print v < 1 ? 1 : v }')
	before=$(tap_cpu_ticks "$tap_pid")
	# shellcheck disable=SC2046 # the TLS options are words
	line=$(timeout 600 "$loadgen" $(tls_args "$target") -c "$c" -w "$w" -s "$s" -n "$n") ||
		tap_log "round $round $name via $target: loadgen failed: $line"
	after=$(tap_cpu_ticks "$tap_pid")
	if [ "$target" = tap ]; then
		sleep 0.3 # the tap flushes every 10 ms and holds acked mandatory publishes 50 ms for a late Return
		verdict_count=$(grep -c '"type":"publish"' "$verdicts" || true)
		: >"$verdicts"
	fi
	[ -n "$line" ] || line='{"error":"no output"}'
	printf '{"round":%d,"load":"%s","target":"%s","cpu_s":%s,"verdicts":%s,"run":%s}\n' "$round" "$name" \
		"$target" "$(awk -v t=$((after - before)) -v k="$tck" 'BEGIN { printf "%.2f", t / k }')" \
		"$verdict_count" "$line" >>"$results"
	tap_log "round $round $name $target: $line"
}

for r in $(seq "$rounds"); do
	for l in $loads; do
		for t in direct tap; do
			run_one "$r" "$l" "$t"
			sleep 0.2
		done
	done
done
awk '/^VmHWM:/ { print $2 }' "/proc/$tap_pid/status" >"$out/peak_kb"
kill -0 "$tap_pid" 2>/dev/null || tap_die "the tap died during the run (see $out/amqptap.log)"

elif [ "$mode" != report ]; then
	tap_die "usage: ${0##*/} [run|report]"
fi

PYTHONPATH="$repo/scripts" /usr/bin/python3 - "$results" "$out/latest.md" "$(cat "$out/peak_kb" 2>/dev/null || true)" <<'PY'
import os, sys
from bench_report import Runs, f
results, md_path, peak_kb = sys.argv[1:4]
R = Runs(results)
loads, errors, checked, desc, med = R.loads, R.errors, R.checked, R.desc, R.med

def paired(load):
    return R.paired(load, "tap", "direct")

def diff(a, b):
    return None if a is None or b is None else a - b

rounds = R.rounds
lines = [f"TLS on both legs (client→tap→broker, mTLS to the broker) vs the client speaking TLS to the broker directly. "
         f"Rounds: {rounds} (direct, then tap, per load), {os.cpu_count()} CPUs. Medians over rounds; "
         "'paired' = median of the per-round ratios.\n",
         "| load | direct msg/s | tap msg/s | tap/direct | tap/direct paired | p50 µs direct / tap | +p50 µs "
         "| p99 µs direct / tap | +p99 µs | tap CPU s/M msgs | publish records = sent |",
         "|" + "---|" * 11]
headline = []
for l in loads:
    d, t = med(l, "direct", "msgs_per_s"), med(l, "tap", "msgs_per_s")
    p50d, p50t, p99d, p99t = med(l, "direct", "p50_us"), med(l, "tap", "p50_us"), med(l, "direct", "p99_us"), med(l, "tap", "p99_us")
    td = None if d in (None, 0) or t is None else t / d
    ok, bad = checked.get(l, [0, 0])
    headline.append(f"{l}: tap/direct = {f(td, '{:.3f}')} (paired {f(paired(l), '{:.3f}')})")
    lines.append(f"| {l} ({desc.get(l, '')}) | {f(d)} | {f(t)} | {f(td, '{:.3f}')} | {f(paired(l), '{:.3f}')} "
                 f"| {f(p50d)} / {f(p50t)} | {f(diff(p50t, p50d), '{:+.0f}')} | {f(p99d)} / {f(p99t)} "
                 f"| {f(diff(p99t, p99d), '{:+.0f}')} | {f(med(l, 'tap', 'cpu_per_m'), '{:.2f}')} "
                 f"| {'yes' if ok and not bad else 'NO'} ({ok}/{ok + bad} runs) |")
lines.append("")
lines.append("Ratio: " + "; ".join(headline) + ".")
if peak_kb:
    lines.append(f"Tap peak RSS (VmHWM over the whole run): {int(peak_kb) / 1024:.1f} MiB.")
if errors:
    lines += ["", "Problems:"] + [f"- {e}" for e in errors]
text = "\n".join(lines) + "\n"
open(md_path, "w").write(text)
print(text, end="")
sys.exit(1 if errors else 0)  # a failed run or a wrong record count fails the benchmark
PY
