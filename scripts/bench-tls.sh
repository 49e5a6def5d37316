#!/usr/bin/env bash
# TLS benchmark, side by side: the publisher loads of bench.sh (tests/bench/bench_loadgen.c -T, rabbitmq-c's OpenSSL
# socket) straight to a throwaway RabbitMQ's mTLS listener ("direct"), through HAProxy terminating and originating
# TLS (bind ... ssl crt; server ... ssl verify required ca-file, SNI and host name checked, client certificate),
# through the TLS floor relay (tests/bench/bench_tls_relay.c: OpenSSL on the sockets and nothing else, the least a
# TLS relay can cost here) and through amqptap with TLS on both legs, alternating in every round; then a reconnect storm (tests/bench/bench_storm.c:
# 1,000 TLS clients connecting at once, each one confirmed mandatory publish) against the same three; and, with fresh
# processes, the memory each idle TLS connection costs the tap and HAProxy. Prints Markdown tables (also written to
# .run/bench-tls/latest.md): medians of msgs/s and the ratios, p50/p99 and what each relay adds, relay CPU per
# million messages, peak RSS per load, storm handshakes per second and time to the last confirm, the confirm p99 and
# worst of a publisher connected through each storm, and checks that the tap wrote exactly one publish record per
# publish (for the storm: 1,000, every one routed and acked).
#
# Environment: TAP_BENCH_ROUNDS (5), TAP_BENCH_LOADS (names from the list below, default all), TAP_BENCH_SCALE
# (multiplies every message count; 0.3 keeps a whole run within about 15 minutes on 2 cores), TAP_BENCH_STORM (clients
# per storm, 1000; 0 skips the storm and the idle measurement), TAP_BENCH_STORM_ROUNDS (storms in the first 3 rounds
# only), TAP_BENCH_BYSTANDER (0: no publisher stays connected through the storms), TAP_BENCH_BUILD (build dir, default
# build-tlsb), TAP_BENCH_BUILD_TYPE (Release), TAP_BENCH_OUT (default .run/bench-tls), TAP_BENCH_TAP_PORT (5762; HAProxy
# listens one above, the idle-memory tap and HAProxy two and three above, the floor relay four above),
# TAP_BENCH_TAP_ARGS (extra amqptap options), TAP_BENCH_TAP_WRAP (a command the tap is started under, e.g. "chrt -b 0"),
# TAP_BENCH_PERF=1 (also profile the tap with perf during TAP_BENCH_PERF_LOAD, default w100_4k, into
# $TAP_BENCH_OUT/perf-*.txt).
# The broker: plain port 5760, TLS port 5761, node benchtls@localhost, data in $TAP_BENCH_OUT/broker; its listen
# backlog is raised to 4096 (RabbitMQ's 128 drops SYNs in a storm, which would time the broker's backlog instead of
# the relays). TAP_BENCH_BROKER_TICKETS=1 has it issue TLS 1.3 session tickets (off in RabbitMQ by default), so that
# the relays resume their upstream sessions (HAProxy, the floor relay and the tap all offer the broker's last one).
# `scripts/bench-tls.sh storm` runs only the storm rounds and the idle measurement (TAP_BENCH_IDLE=0 skips the
# latter); `scripts/bench-tls.sh report` only re-renders the tables from the last run. Exits 1 if a run failed or the tap's
# records do not match what was sent.
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
storm=${TAP_BENCH_STORM:-1000}
storm_rounds=${TAP_BENCH_STORM_ROUNDS:-3}
build=${TAP_BENCH_BUILD:-$repo/build-tlsb}
tap_port=${TAP_BENCH_TAP_PORT:-5762}
hap_port=$((tap_port + 1))
idle_tap_port=$((tap_port + 2))
idle_hap_port=$((tap_port + 3))
floor_port=$((tap_port + 4))
perf_load=${TAP_BENCH_PERF_LOAD:-w100_4k}
mode=${1:-run}
results=$out/results.jsonl
storms=$out/storm.jsonl
idle=$out/idle.jsonl
targets="direct haproxy floor tap"

# name: connections window body-bytes messages-per-connection (the loads of bench.sh)
declare -A LOAD=(
	[w1]="1 1 64 30000"
	[w1000]="1 1000 64 250000"
	[w100_4k]="1 100 4096 100000"
	[w10_1m]="1 10 1048576 3000"
	[c100_w100]="100 100 64 2500"
)
loads=${TAP_BENCH_LOADS:-"w1 w1000 w100_4k w10_1m c100_w100"}
for l in $loads; do [ -n "${LOAD[$l]:-}" ] || tap_die "unknown load '$l' (known: ${!LOAD[*]})"; done

if [ "$mode" = run ] || [ "$mode" = storm ]; then
tap_pid='' hap_pid='' floor_pid='' idle_pid='' perf_pid='' broker_started=''
cleanup() {
	local rc=$?
	[ -n "$perf_pid" ] && kill -INT "$perf_pid" 2>/dev/null && wait "$perf_pid" 2>/dev/null
	for p in $tap_pid $hap_pid $floor_pid $idle_pid; do
		kill -TERM "$p" 2>/dev/null || true
	done
	for p in $tap_pid $hap_pid $floor_pid $idle_pid; do
		wait "$p" 2>/dev/null || true
	done
	if [ -n "$broker_started" ]; then
		"$repo/scripts/broker.sh" stop || true
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# CA, server certificate for localhost/127.0.0.1 and client certificate, as tests/integration/test_tls.py makes them;
# kept between runs while they are valid for another day. HAProxy wants each certificate and its key in one file.
make_pki() {
	if [ -s "$pki/client.key" ] && [ -s "$pki/haproxy-client.pem" ] &&
		openssl x509 -checkend 86400 -noout -in "$pki/server.pem" >/dev/null 2>&1 &&
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
		cat server.pem server.key >haproxy-server.pem
		cat client.pem client.key >haproxy-client.pem
	) >"$out/pki.log" 2>&1 || { cat "$out/pki.log" >&2; tap_die "openssl failed"; }
	# the broker runs as this user and reads the key
	chmod 600 "$pki"/*.key "$pki"/haproxy-*.pem
}

mkdir -p "$out"
rm -f "$out"/perf-*.txt
tap_log "building (${TAP_BENCH_BUILD_TYPE:-Release}) in $build"
tap_build "$build" -DCMAKE_BUILD_TYPE="${TAP_BENCH_BUILD_TYPE:-Release}" >/dev/null
loadgen=$build/bench/bench_loadgen
stormgen=$build/bench/bench_storm
floorgen=$build/bench/bench_tls_relay
[ -x "$loadgen" ] || tap_die "$loadgen was not built (is librabbitmq-dev installed?)"
[ -x "$stormgen" ] || tap_die "$stormgen was not built"
[ -x "$floorgen" ] || tap_die "$floorgen was not built"
command -v haproxy >/dev/null || tap_need_pkgs haproxy || tap_die "cannot install haproxy"
make_pki

if ! "$repo/scripts/broker.sh" status >/dev/null 2>&1; then
	mkdir -p "$TAP_BROKER_DIR"
	# broker.sh keeps an advanced.config it finds: the listen backlog for the storm, and with
	# TAP_BENCH_BROKER_TICKETS=1 the TLS options again with TLS 1.3 session tickets (RabbitMQ gives none by default,
	# so no relay can resume its upstream sessions unless they are on)
	tickets=''
	if [ "${TAP_BENCH_BROKER_TICKETS:-0}" = 1 ]; then
		tickets=",
  {ssl_options, [{cacertfile, \"$pki/ca.pem\"}, {certfile, \"$pki/server.pem\"}, {keyfile, \"$pki/server.key\"},
                 {verify, verify_peer}, {fail_if_no_peer_cert, true}, {session_tickets, stateless}]}"
	fi
	cat >"$TAP_BROKER_DIR/advanced.config" <<ERL
[{rabbit, [{tcp_listen_options, [{backlog, 4096}, {nodelay, true}, {linger, {true, 0}}, {exit_on_close, false}]}$tickets]}].
ERL
	echo "${TAP_BENCH_BROKER_TICKETS:-0}" >"$TAP_BROKER_DIR/tickets"
	"$repo/scripts/broker.sh" start
	broker_started=1
else
	tap_log "reusing the running broker $TAP_BROKER_NODE (it must have been started with this PKI)"
	[ "$(cat "$TAP_BROKER_DIR/tickets" 2>/dev/null || echo 0)" = "${TAP_BENCH_BROKER_TICKETS:-0}" ] ||
		tap_die "the running broker was started with another TAP_BENCH_BROKER_TICKETS: stop it first"
fi
tap_wait_port "$TAP_BROKER_TLS_PORT"
cat "$TAP_BROKER_DIR/tickets" >"$out/broker-tickets" 2>/dev/null || echo 0 >"$out/broker-tickets"
printf '%s\n' "${TAP_BENCH_TAP_WRAP:-}" >"$out/tap-wrap" # the report names it

# HAProxy terminating TLS from clients and originating TLS to the broker, verified as the tap verifies it.
write_haproxy_cfg() { # port file
	cat >"$2" <<CFG
# generated by scripts/bench-tls.sh: TLS in, TLS out (verified, SNI, client certificate)
global
	nbthread 1
	maxconn 8192
defaults
	mode tcp
	timeout connect 5s
	timeout client 1h
	timeout server 1h
frontend amqps
	bind 127.0.0.1:$1 ssl crt $pki/haproxy-server.pem
	default_backend broker
backend broker
	server rabbit 127.0.0.1:$TAP_BROKER_TLS_PORT ssl verify required ca-file $pki/ca.pem crt $pki/haproxy-client.pem sni str(localhost) verifyhost localhost
CFG
}

# Starts amqptap with TLS on both legs on port $1, records into $2; prints its pid.
start_tap() {
	# shellcheck disable=SC2086 # extra options and the wrapper are words
	${TAP_BENCH_TAP_WRAP:-} "$build/amqptap" --listen "127.0.0.1:$1" --tls-cert "$pki/server.pem" --tls-key "$pki/server.key" \
		--upstream "localhost:$TAP_BROKER_TLS_PORT" --upstream-tls --upstream-ca "$pki/ca.pem" \
		--upstream-cert "$pki/client.pem" --upstream-key "$pki/client.key" --verdicts "$2" \
		${TAP_BENCH_TAP_ARGS:-} >/dev/null 2>>"$out/amqptap.log" &
	echo $!
}

write_haproxy_cfg "$hap_port" "$out/haproxy.cfg"
haproxy -f "$out/haproxy.cfg" -db >"$out/haproxy.log" 2>&1 &
hap_pid=$!
verdicts=$out/verdicts.jsonl
: >"$verdicts"
: >"$out/amqptap.log"
tap_pid=$(start_tap "$tap_port" "$verdicts")
"$floorgen" "$floor_port" "$TAP_BROKER_TLS_PORT" "$pki/server.pem" "$pki/server.key" "$pki/ca.pem" \
	"$pki/client.pem" "$pki/client.key" localhost 2>"$out/floor.log" &
floor_pid=$!
tap_wait_port "$hap_port"
tap_wait_port "$floor_port"
tap_wait_port "$tap_port"

# The clients verify the server certificate against our CA and the name localhost (127.0.0.1 in /etc/hosts) on every
# path; the broker wants a client certificate, the relays do not.
port_of() {
	case $1 in direct) echo "$TAP_BROKER_TLS_PORT" ;; haproxy) echo "$hap_port" ;; floor) echo "$floor_port" ;;
	tap) echo "$tap_port" ;; esac
}
pid_of() {
	case $1 in haproxy) echo "$hap_pid" ;; floor) echo "$floor_pid" ;; tap) echo "$tap_pid" ;; *) echo "" ;; esac
}
client_cert() {
	[ "$1" = direct ] && echo "-E $pki/client.pem -K $pki/client.key"
	return 0
}
kb_of() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }

: >"$results"
: >"$storms"
: >"$idle"
tck=$(getconf CLK_TCK)

# Runs one load against one target and appends its JSON line, with the relay's CPU and peak RSS and the tap's
# record count.
run_one() {
	local round=$1 load=$2 target=$3
	local c w s n pid before=0 after=0 line verdict_count=null peak=null busy0 total0 busy1 total1
	read -r c w s n <<<"${LOAD[$load]}"
	n=$(awk -v n="$n" -v k="$scale" 'BEGIN { v = int(n * k); print v < 1 ? 1 : v }')
	pid=$(pid_of "$target")
	if [ -n "$pid" ]; then
		echo 5 >"/proc/$pid/clear_refs" # resets VmHWM: the peak of this run only
		before=$(tap_cpu_ticks "$pid")
	fi
	read -r busy0 total0 < <(tap_machine_ticks)
	# shellcheck disable=SC2046 # the certificate options are words
	line=$(timeout 600 "$loadgen" -T -H localhost -p "$(port_of "$target")" -C "$pki/ca.pem" $(client_cert "$target") \
		-c "$c" -w "$w" -s "$s" -n "$n") || tap_log "round $round $load via $target: loadgen failed: $line"
	read -r busy1 total1 < <(tap_machine_ticks)
	if [ -n "$pid" ]; then
		after=$(tap_cpu_ticks "$pid")
		peak=$(kb_of "$pid" VmHWM)
	fi
	if [ "$target" = tap ]; then
		sleep 0.3 # records are written within ~60 ms; an acked mandatory publish waits 50 ms for a late Return
		verdict_count=$(grep -c '"type":"publish"' "$verdicts" || true)
		: >"$verdicts"
	fi
	[ -n "$line" ] || line='{"error":"no output"}'
	printf '{"round":%d,"load":"%s","target":"%s","cpu_s":%s,"peak_kb":%s,"machine_busy":%s,"verdicts":%s,"run":%s}\n' \
		"$round" "$load" "$target" "$(awk -v t=$((after - before)) -v k="$tck" 'BEGIN { printf "%.2f", t / k }')" \
		"$peak" "$(awk -v b=$((busy1 - busy0)) -v t=$((total1 - total0)) 'BEGIN { printf "%.3f", (t > 0 ? b / t : 0) }')" \
		"$verdict_count" "$line" >>"$results"
	tap_log "round $round $load $target: $line"
}

# Counts the tap's publish records in $1 with routing key $2 as "records routed_and_acked".
count_records() {
	/usr/bin/python3 - "$1" "$2" <<'PY'
import json, sys
pubs = [r for r in map(json.loads, open(sys.argv[1]))
        if r.get("type") == "publish" and r.get("routing_key") == sys.argv[2]]
print(len(pubs), sum(r.get("route") == "routed" and r.get("confirm") == "ack" for r in pubs))
PY
}

# One storm against one target: $storm TLS clients at once, each a confirmed mandatory publish. A bystander, one
# publisher with one publish in flight on its own queue (TAP_BENCH_BYSTANDER=0: none), connects 1 s before the storm
# and stops when the storm's last client is confirmed: its confirm latencies are what the storm does to traffic that
# already flows through the relay.
storm_one() {
	local round=$1 target=$2 pid line before=0 after=0 peak=null records=null good=null
	local by_pid='' by=null by_records=null stop=$out/bystander.stop
	rm -f "$stop"
	if [ "${TAP_BENCH_BYSTANDER:-1}" = 1 ]; then
		# shellcheck disable=SC2046 # the certificate options are words
		"$loadgen" -T -H localhost -p "$(port_of "$target")" -C "$pki/ca.pem" $(client_cert "$target") -c 1 -w 1 \
			-s 64 -n 1000000 -S "$stop" -q "amqptap.bystander.$target" >"$out/bystander.json" \
			2>>"$out/storm.log" &
		by_pid=$!
		sleep 1
	fi
	pid=$(pid_of "$target")
	if [ -n "$pid" ]; then
		echo 5 >"/proc/$pid/clear_refs"
		before=$(tap_cpu_ticks "$pid")
	fi
	# shellcheck disable=SC2046 # the certificate options are words
	line=$(timeout 300 "$stormgen" -T -H localhost -p "$(port_of "$target")" -C "$pki/ca.pem" $(client_cert "$target") \
		-c "$storm" -q "amqptap.storm.$target" 2>>"$out/storm.log") || tap_log "round $round storm via $target failed: $line"
	if [ -n "$pid" ]; then
		after=$(tap_cpu_ticks "$pid")
		peak=$(kb_of "$pid" VmHWM)
	fi
	if [ -n "$by_pid" ]; then
		touch "$stop"
		wait "$by_pid" || tap_log "round $round: the bystander via $target failed: $(cat "$out/bystander.json")"
		by=$(cat "$out/bystander.json")
		[ -n "$by" ] || by='{"error":"no output"}'
	fi
	if [ "$target" = tap ]; then
		sleep 0.3
		read -r records good < <(count_records "$verdicts" "amqptap.storm.$target")
		if [ -n "$by_pid" ]; then
			read -r by_records _ < <(count_records "$verdicts" "amqptap.bystander.$target")
		fi
		: >"$verdicts"
	fi
	[ -n "$line" ] || line='{"error":"no output"}'
	local fmt='{"round":%d,"target":"%s","cpu_s":%s,"peak_kb":%s,"records":%s,"routed_acked":%s,'
	fmt+='"bystander":%s,"bystander_records":%s,"run":%s}\n'
	# shellcheck disable=SC2059 # the format is the line above
	printf "$fmt" "$round" "$target" "$(awk -v t=$((after - before)) -v k="$tck" 'BEGIN { printf "%.2f", t / k }')" \
		"$peak" "$records" "$good" "$by" "$by_records" "$line" >>"$storms"
	tap_log "round $round storm $target: $line"
}

[ "$mode" = storm ] && loads=''
for r in $(seq "$rounds"); do
	for l in $loads; do
		for t in $targets; do
			run_one "$r" "$l" "$t"
			sleep 0.2
		done
	done
	if [ "$storm" -gt 0 ] && [ "$r" -le "$storm_rounds" ]; then
		for t in $targets; do
			storm_one "$r" "$t"
			sleep 1 # let the broker finish closing the last storm's connections
		done
	fi
done
kill -0 "$tap_pid" 2>/dev/null || tap_die "the tap died during the run (see $out/amqptap.log)"
kill -0 "$hap_pid" 2>/dev/null || tap_die "HAProxy died during the run (see $out/haproxy.log)"
kb_of "$tap_pid" VmHWM >"$out/peak_kb"

if [ "${TAP_BENCH_PERF:-0}" = 1 ] && [ "$mode" = run ]; then
	command -v perf >/dev/null || tap_need_pkgs linux-perf || tap_die "cannot install perf"
	read -r c w s n <<<"${LOAD[$perf_load]}"
	perf record -F 1999 -g -p "$tap_pid" -o "$out/perf.data" >"$out/perf-record.log" 2>&1 &
	perf_pid=$!
	sleep 0.5
	"$loadgen" -T -H localhost -p "$tap_port" -C "$pki/ca.pem" -c "$c" -w "$w" -s "$s" -n "$n" >"$out/perf-run.json"
	kill -INT "$perf_pid"
	wait "$perf_pid" || true
	perf_pid=''
	: >"$verdicts"
	perf report -i "$out/perf.data" --no-children --sort dso,sym --stdio -g none 2>/dev/null |
		grep -E '^ +[0-9]' >"$out/perf-all.txt" || true
	head -n 25 "$out/perf-all.txt" >"$out/perf-top.txt"
	perf report -i "$out/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null |
		grep -E '^ +[0-9]' | head -n 8 >"$out/perf-dso.txt" || true
fi

# Memory per idle TLS connection: a fresh relay, its RSS before a storm and while the storm's clients are all
# connected, confirmed and idle.
idle_one() {
	local target=$1 port pid line rss0 rss1 hwm log=$out/idle-$1.log
	if [ "$target" = tap ]; then
		port=$idle_tap_port
		pid=$(start_tap "$port" "$out/idle-verdicts.jsonl")
	else
		port=$idle_hap_port
		write_haproxy_cfg "$port" "$out/haproxy-idle.cfg"
		haproxy -f "$out/haproxy-idle.cfg" -db >>"$out/haproxy.log" 2>&1 &
		pid=$!
	fi
	idle_pid=$pid
	tap_wait_port "$port"
	sleep 0.5
	rss0=$(kb_of "$pid" VmRSS)
	: >"$log"
	"$stormgen" -T -H localhost -p "$port" -C "$pki/ca.pem" -c "$storm" -q amqptap.storm.idle -P 4000 \
		>"$log.json" 2>"$log" &
	local gen=$!
	for _ in $(seq 600); do grep -q holding "$log" && break; sleep 0.1; done
	sleep 2 # idle: TLS 1.3 tickets sent, nothing in flight
	rss1=$(kb_of "$pid" VmRSS)
	wait "$gen" || tap_log "idle storm via $target failed: $(cat "$log.json")"
	hwm=$(kb_of "$pid" VmHWM)
	kill -TERM "$pid"
	wait "$pid" 2>/dev/null || true
	idle_pid=''
	line=$(cat "$log.json")
	[ -n "$line" ] || line='{"error":"no output"}'
	printf '{"target":"%s","conns":%d,"rss0_kb":%s,"rss_idle_kb":%s,"hwm_kb":%s,"run":%s}\n' "$target" "$storm" \
		"$rss0" "$rss1" "$hwm" "$line" >>"$idle"
	tap_log "idle $target: RSS $rss0 kB before, $rss1 kB with $storm idle TLS connections"
}
if [ "$storm" -gt 0 ] && [ "${TAP_BENCH_IDLE:-1}" = 1 ]; then
	idle_one tap
	idle_one haproxy
fi

elif [ "$mode" != report ]; then
	tap_die "usage: ${0##*/} [run|storm|report]"
fi
tap_need_results "$results"

PYTHONPATH="$repo/scripts" /usr/bin/python3 "$repo/scripts/bench_report.py" tls "$out"
