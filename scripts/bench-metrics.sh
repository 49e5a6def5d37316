#!/usr/bin/env bash
# What --metrics costs the forwarding, two ways:
#
# 1. Wall clock: two taps in front of the same throwaway broker, one plain and one with --metrics scraped every
#    second (GET /metrics, as Prometheus would), the same publisher load (tests/bench/bench_loadgen) through each in
#    turn, the order swapped every round. Prints per round and as medians: msgs/s and the tap's CPU per message, and
#    the ratios metrics/plain (paired per round); PASS when the median throughput ratio is at least 0.98 and the
#    median CPU ratio at most 1.02 (issue 16: within 2 %), else FAIL (exit 1). Needs a quiet machine to mean much.
# 2. Instructions (deterministic, valgrind's callgrind): each tap alone under callgrind for two message counts; the
#    difference of the totals divided by the difference of the counts is the tap's instructions per publish (start
#    and exit cancel out). The metrics tap is scraped only after the load, and what the scrapes cost (on_request on
#    the http thread and on_want on the loop, inclusive) is taken out and shown per scrape. Also the inclusive cost of the tally's verdict hook per publish.
# 3. A request flood: a W=1 publisher (5,000 messages) through the --metrics tap alone, beside a process that only
#    burns a CPU, and beside a client asking for /metrics as fast as it can (keep-alive, pipelined: the test's
#    FLOOD client), in turn, the order rotated every round. The burner is the flood's own CPU without its requests,
#    so flood/burner is what answering the requests costs the traffic. Prints medians and the tap's threads' CPU;
#    PASS when the flood's median throughput is at least 0.9 × the burner's.
#
# Environment: TAP_BENCH_ROUNDS (8; 0 skips part 1), TAP_BENCH_FLOOD_ROUNDS (5; 0 skips part 3), TAP_BENCH_LOAD ("conns window bytes messages", default
# "1 1000 64 200000"), TAP_BENCH_CALLGRIND ("5000 25000": the two message counts; "" skips part 2),
# TAP_BENCH_BUILD (build dir, default build), TAP_BROKER_PORT / TAP_BROKER_DIST_PORT (a broker.sh node; started and
# stopped here when none runs).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$repo/scripts/lib.sh"

rounds=${TAP_BENCH_ROUNDS:-8}
read -r conns window size count <<<"${TAP_BENCH_LOAD:-1 1000 64 200000}"
cg_counts=${TAP_BENCH_CALLGRIND-5000 25000}
build=${TAP_BENCH_BUILD:-$repo/build}
loadgen=$build/bench/bench_loadgen
[ -x "$loadgen" ] && [ -x "$build/amqptap" ] || tap_die "build $build first (amqptap and bench/bench_loadgen)"
out=$(mktemp -d)
plain_pid= metrics_pid= scraper_pid= cg_pid= broker_started=
cleanup() {
	for p in $scraper_pid $plain_pid $metrics_pid $cg_pid; do kill -TERM "$p" 2>/dev/null || true; done
	for p in $scraper_pid $plain_pid $metrics_pid $cg_pid; do wait "$p" 2>/dev/null || true; done
	[ -n "$broker_started" ] && "$repo/scripts/broker.sh" stop
	rm -rf "$out"
}
trap cleanup EXIT
if ! "$repo/scripts/broker.sh" status >/dev/null 2>&1; then
	"$repo/scripts/broker.sh" start
	broker_started=1
fi

free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
verdict=PASS

# ---- 1. wall clock, alternating ----

if [ "$rounds" -gt 0 ]; then
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
	kill -TERM "$scraper_pid" "$plain_pid" "$metrics_pid" 2>/dev/null || true
	wait "$scraper_pid" "$plain_pid" "$metrics_pid" 2>/dev/null || true
	scraper_pid= plain_pid= metrics_pid=

	/usr/bin/python3 - "$out/results.jsonl" "$conns" "$window" "$size" "$count" >"$out/wall.txt" <<'PY' || verdict=FAIL
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
    cr.append(m[1] / p[1] if p[1] > 0 else float("nan"))
    print(f"| {rnd} | {p[0]:,.0f} | {m[0]:,.0f} | {tr[-1]:.3f} | {p[1]:.2f} | {m[1]:.2f} | {cr[-1]:.3f} |")
med = lambda t, i: statistics.median(by[r][t][i] for r in by)
t_ratio, c_ratio = statistics.median(tr), statistics.median(cr)
print(f"| median | {med('plain', 0):,.0f} | {med('metrics', 0):,.0f} | {t_ratio:.3f} (paired) "
      f"| {med('plain', 1):.2f} | {med('metrics', 1):.2f} | {c_ratio:.3f} (paired) |")
user = statistics.median(r["user_s"] / r["cpu_s"] for r in rows if r["cpu_s"] > 0)
print(f"\nuser-space share of the taps' CPU: {user:.0%} (the rest is the kernel's socket work)")
ok = t_ratio >= 0.98 and c_ratio <= 1.02
print(f"wall clock: throughput ratio {t_ratio:.3f} (>= 0.980), CPU per message ratio {c_ratio:.3f} (<= 1.020): "
      f"{'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
	cat "$out/wall.txt"
fi

# ---- 2. instructions per publish under callgrind ----

# Total instructions of a callgrind file, and the inclusive instructions of the functions named (0 when absent).
cg_ir() { # file function...
	local f=$1
	shift
	callgrind_annotate --inclusive=yes --threshold=100 "$f" 2>/dev/null | awk -v want="$*" '
		BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) got[w[i]] = 0 }
		/PROGRAM TOTALS/ { gsub(",", "", $1); total = $1 }
		{ for (i = 1; i <= n; i++) if (index($0, ":" w[i] " ") || index($0, ":" w[i] "\047")) {
			v = $1; gsub(",", "", v); if (v + 0 > got[w[i]]) got[w[i]] = v + 0 } }
		END { printf "%s", total; for (i = 1; i <= n; i++) printf " %s", got[w[i]]; print "" }'
}

cg_run() { # target msgs -> "total on_request on_want tally_verdict slot_step scrapes"
	local port http file
	port=$(free_port) http=$(free_port)
	file=$out/callgrind.$1.$2
	local extra=()
	[ "$1" = metrics ] && extra=(--metrics "127.0.0.1:$http")
	valgrind --tool=callgrind --callgrind-out-file="$file" "$build/amqptap" --listen "127.0.0.1:$port" \
		--upstream "127.0.0.1:$TAP_BROKER_PORT" --verdicts "$out/cg.jsonl" "${extra[@]}" 2>"$out/cg.log" &
	cg_pid=$!
	for _ in $(seq 300); do tap_port_busy "$port" && break; sleep 0.1; done
	"$loadgen" -p "$port" -c "$conns" -w "$window" -s "$size" -n "$2" >/dev/null
	local scrapes=0
	if [ "$1" = metrics ]; then
		for _ in 1 2 3 4 5; do curl -s -o /dev/null "http://127.0.0.1:$http/metrics" && scrapes=$((scrapes + 1)); done
	fi
	kill -TERM "$cg_pid"
	wait "$cg_pid" || true
	cg_pid=
	echo "$(cg_ir "$file" on_request on_want tap_metrics_tally_verdict trk_slot_step) $scrapes"
}

if [ -n "$cg_counts" ]; then
	command -v valgrind >/dev/null || tap_die "valgrind is not installed (apt-get install valgrind)"
	read -r n1 n2 <<<"$cg_counts"
	for target in plain metrics; do
		for n in "$n1" "$n2"; do
			echo "$target $n $(cg_run "$target" "$n")" >>"$out/cg.txt"
			tap_log "callgrind $target $n: $(tail -1 "$out/cg.txt")"
		done
	done
	/usr/bin/python3 - "$out/cg.txt" "$conns" "$window" "$size" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    target, n, total, req, render, tally, settle, scrapes = line.split()
    # a scrape: answered on the http thread (on_request), rendered on the loop (on_want)
    rows[(target, int(n))] = (int(total), int(req) + int(render), int(tally), int(scrapes), int(settle))
conns, window, size = sys.argv[2:5]
(n1, n2) = sorted({n for _, n in rows})
per = {}
for t in ("plain", "metrics"):
    a, b = rows[(t, n1)], rows[(t, n2)]
    per[t] = ((b[0] - b[1]) - (a[0] - a[1])) / (n2 - n1)  # scrapes taken out
print(f"\ncallgrind ({conns} connection(s), window {window}, {size}-byte bodies; {n1} and {n2} messages, "
      f"instructions of the whole tap process, start and exit cancelled by the difference):")
print(f"  plain tap:      {per['plain']:,.0f} instructions per publish")
print(f"  --metrics tap:  {per['metrics']:,.0f} instructions per publish "
      f"({per['metrics'] - per['plain']:+,.0f}, {per['metrics'] / per['plain'] - 1:+.2%})")
print("  (the whole process varies by a few % from run to run with how the event loop batches reads; the settling of a\n"
      "  publish below does not)")
settle = {t: rows[(t, n2)][4] / n2 for t in ("plain", "metrics")}
print(f"  settling a publish (trk_slot_step, inclusive: verdict, record, counts, verdict hook): "
      f"plain {settle['plain']:,.1f}, --metrics {settle['metrics']:,.1f} instructions per publish "
      f"({settle['metrics'] - settle['plain']:+,.1f}: the metrics path)")
m = rows[("metrics", n2)]
print(f"  of which the tally (tap_metrics_tally_verdict, inclusive): {m[2] / n2:,.1f} instructions per publish")
if m[3]:
    print(f"  one scrape of /metrics (on_request and on_want, inclusive): {m[1] / m[3]:,.0f} instructions")
PY
fi
# ---- 3. a request flood beside a W=1 publisher ----

flood_rounds=${TAP_BENCH_FLOOD_ROUNDS:-5}
if [ "$flood_rounds" -gt 0 ]; then
	port=$(free_port) http=$(free_port)
	"$build/amqptap" --listen "127.0.0.1:$port" --upstream "127.0.0.1:$TAP_BROKER_PORT" \
		--verdicts "$out/flood.jsonl" --metrics "127.0.0.1:$http" 2>"$out/flood.log" &
	metrics_pid=$!
	tap_wait_port "$http"
	tap_wait_port "$port"
	/usr/bin/python3 -c 'import re, sys; print(re.search(r"FLOOD = r\"\"\"(.*?)\"\"\"", sys.stdin.read(), re.S).group(1))' \
		<"$repo/tests/integration/test_admin.py" >"$out/flood.py"
	thread_ticks() { # pid -> "loop http" CPU ticks
		local loop=0 http=0 t f
		for t in /proc/"$1"/task/*; do
			f=$(sed 's/.*) //' "$t/stat" | awk '{ print $12 + $13 }')
			if [ "${t##*/}" = "$1" ]; then loop=$f; elif [ "$(cat "$t/comm")" = http ]; then http=$f; fi
		done
		echo "$loop $http"
	}
	flood_run() { # arm round
		local side= l0 h0 l1 h1 line
		case $1 in
		burner) timeout 6 /usr/bin/python3 -c 'while True: pass' & side=$! ;;
		flood) /usr/bin/python3 "$out/flood.py" "$http" /metrics 6 >"$out/flood.$2.json" & side=$! ;;
		esac
		[ -n "$side" ] && sleep 0.5
		read -r l0 h0 < <(thread_ticks "$metrics_pid")
		line=$("$loadgen" -p "$port" -w 1 -s 64 -n 5000)
		read -r l1 h1 < <(thread_ticks "$metrics_pid")
		[ -n "$side" ] && { kill "$side" 2>/dev/null || true; wait "$side" 2>/dev/null || true; }
		printf '{"round":%d,"arm":"%s","loop_ticks":%d,"http_ticks":%d,"run":%s}\n' "$2" "$1" $((l1 - l0)) \
			$((h1 - h0)) "$line" >>"$out/flood.jsonl.res"
		tap_log "flood round $2 $1: $line"
	}
	arms=(alone burner flood)
	for r in $(seq "$flood_rounds"); do
		for i in 0 1 2; do flood_run "${arms[$(((r + i) % 3))]}" "$r"; done
	done
	kill -TERM "$metrics_pid" 2>/dev/null || true
	wait "$metrics_pid" 2>/dev/null || true
	metrics_pid=
	/usr/bin/python3 - "$out/flood.jsonl.res" "$(getconf CLK_TCK)" <<'PY' || verdict=FAIL
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
tck = int(sys.argv[2])
med = lambda arm, f: statistics.median(f(r) for r in rows if r["arm"] == arm)
print(f"\nrequest flood: W=1, 64 B, 5,000 messages per run through the --metrics tap; "
      f"{len(rows) // 3} rounds, order rotated\n")
print("| beside the publisher | msg/s | p50 µs | p99 µs | tap loop CPU s | tap http thread CPU s |")
print("|---|---|---|---|---|---|")
for arm, what in (("alone", "nothing"), ("burner", "a process burning a CPU"),
                  ("flood", "a client asking for /metrics as fast as it can")):
    print(f"| {what} | {med(arm, lambda r: r['run']['msgs_per_s']):,.0f} | {med(arm, lambda r: r['run']['p50_us']):.0f} "
          f"| {med(arm, lambda r: r['run']['p99_us']):.0f} | {med(arm, lambda r: r['loop_ticks']) / tck:.2f} "
          f"| {med(arm, lambda r: r['http_ticks']) / tck:.2f} |")
ratio = med("flood", lambda r: r["run"]["msgs_per_s"]) / med("burner", lambda r: r["run"]["msgs_per_s"])
print(f"\nflood / burner throughput {ratio:.3f} (>= 0.900): {'PASS' if ratio >= 0.9 else 'FAIL'}")
sys.exit(0 if ratio >= 0.9 else 1)
PY
fi

[ "$rounds" -gt 0 ] || verdict="$verdict (no wall-clock rounds)"
echo "bench-metrics: $verdict"
[ "${verdict%% *}" = PASS ]
