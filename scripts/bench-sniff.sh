#!/usr/bin/env bash
# What passive capture costs (issue 15): one publisher (tests/bench/bench_loadgen.c, 1 connection, W=1000, 64 B)
# straight to a throwaway RabbitMQ without a sniffer ("direct"), straight to it while `amqptap sniff -i lo` runs
# ("sniffed"), straight to it while the least a libpcap capture can do runs (tcpdump with the same buffer and
# kernel filter, writing to /dev/null: "floor"), and through the amqptap proxy ("tap", for the CPU per message a
# sniffer must not exceed), alternating in every round, each round starting one target later than the one before
# (a machine that slows down or speeds up within a round then favours none). A sniffer is started for each sniffed
# run and stopped after it, so the direct runs carry none of its cost. Prints the medians, the paired ratios
# sniffed/direct and floor/direct with a bootstrapped 95 % interval of each median, the paired ratio sniffed/floor
# (what the sniffer costs beyond the capture itself), CPU seconds per million messages of the sniffer and of the
# proxy, the kernel drops and publish records of each sniffed run, how busy the whole machine was during each
# target's runs and what it spent per message (so the CPU per message a 0.99 target leaves a sniffer: 1 % of the
# direct runs'), and PASS/FAIL for each target: throughput >= 0.99 x direct, sniffer CPU per message <= the
# proxy's, no drops (and one publish record per message) with the default --buffer-size. Markdown also goes to
# .run/bench-sniff/latest.md.
#
# Environment: as scripts/bench.sh: TAP_BENCH_ROUNDS (5), TAP_BENCH_SCALE (multiplies the message count, e.g. 0.1
# for a smoke run), TAP_BENCH_BUILD (build dir, shared with bench.sh), TAP_BENCH_BUILD_TYPE (Release),
# TAP_BENCH_OUT (default .run/bench-sniff), TAP_BENCH_TAP_PORT (5721); TAP_BENCH_SNIFF_ARGS (extra sniff options).
# Needs CAP_NET_RAW (root) for the sniffer. `scripts/bench-sniff.sh report` re-renders the last run's results.
# Exits 1 if a run failed; the targets' PASS/FAIL are printed, not the exit status (a shared machine misses them).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export TAP_BROKER_PORT=${TAP_BROKER_PORT:-5720}
export TAP_BROKER_DIST_PORT=${TAP_BROKER_DIST_PORT:-25720}
export TAP_BROKER_DIR=${TAP_BROKER_DIR:-$repo/.run/bench-broker}
export TAP_BROKER_NODE=${TAP_BROKER_NODE:-bench@localhost}
. "$repo/scripts/lib.sh"

rounds=${TAP_BENCH_ROUNDS:-5}
scale=${TAP_BENCH_SCALE:-1}
build=${TAP_BENCH_BUILD:-$repo/build-bench}
tap_port=${TAP_BENCH_TAP_PORT:-5721}
out=${TAP_BENCH_OUT:-$repo/.run/bench-sniff}
mode=${1:-run}
conns=1 window=1000 size=64
msgs=$(awk -v n=250000 -v k="$scale" 'BEGIN { v = int(n * k); print v < 1 ? 1 : v }')
results=$out/results.jsonl

if [ "$mode" = run ]; then
tap_pid= sniff_pid= broker_started=
cleanup() {
	local rc=$?
	for p in $tap_pid $sniff_pid; do
		kill -TERM "$p" 2>/dev/null || true
	done
	for p in $tap_pid $sniff_pid; do
		wait "$p" 2>/dev/null || true
	done
	[ -n "$broker_started" ] && "$repo/scripts/broker.sh" stop || true
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

tap_log "building (${TAP_BENCH_BUILD_TYPE:-Release}) in $build"
tap_need_pkgs "${TAP_BENCH_PKGS[@]}" tcpdump || tap_die "could not install the packages the benchmark needs"
tap_build "$build" -DCMAKE_BUILD_TYPE="${TAP_BENCH_BUILD_TYPE:-Release}" >/dev/null
loadgen=$build/bench/bench_loadgen
[ -x "$loadgen" ] || tap_die "$loadgen was not built (is librabbitmq-dev installed?)"
mkdir -p "$out"
if ! "$repo/scripts/broker.sh" status >/dev/null 2>&1; then
	"$repo/scripts/broker.sh" start
	broker_started=1
fi
tap_verdicts=$out/tap-verdicts.jsonl
: >"$tap_verdicts"
"$build/amqptap" --listen "127.0.0.1:$tap_port" --upstream "127.0.0.1:$TAP_BROKER_PORT" --verdicts "$tap_verdicts" \
	2>"$out/amqptap.log" &
tap_pid=$!
tap_wait_port "$tap_port"
: >"$results"
tck=$(getconf CLK_TCK)

# Starts a sniffer on lo for the broker port and waits until it captures.
sniff_start() {
	: >"$out/sniff-verdicts.jsonl"
	# shellcheck disable=SC2086 # TAP_BENCH_SNIFF_ARGS is a list of options
	"$build/amqptap" sniff -i lo --port "$TAP_BROKER_PORT" --verdicts "$out/sniff-verdicts.jsonl" \
		${TAP_BENCH_SNIFF_ARGS:-} 2>"$out/sniff.log" &
	sniff_pid=$!
	for _ in $(seq 100); do
		grep -q "sniffing on" "$out/sniff.log" && return 0
		kill -0 "$sniff_pid" 2>/dev/null || tap_die "the sniffer did not start: $(cat "$out/sniff.log")"
		sleep 0.1
	done
	tap_die "the sniffer did not start within 10 s"
}

# The floor: tcpdump with the sniffer's kernel filter and buffer, every packet written to /dev/null.
floor_start() {
	local filter
	filter=$(sed -n 's/.*filter: //p' "$out/sniff.log")
	[ -n "$filter" ] || tap_die "no sniffer filter to give tcpdump (the floor runs after a sniffed run)"
	tcpdump -i lo -s 262144 -B 16384 -w /dev/null "$filter" 2>"$out/tcpdump.log" &
	sniff_pid=$!
	for _ in $(seq 100); do
		grep -q "listening on" "$out/tcpdump.log" && return 0
		sleep 0.1
	done
	tap_die "tcpdump did not start: $(cat "$out/tcpdump.log")"
}

run_one() {
	local round=$1 target=$2 port=$TAP_BROKER_PORT pid= before=0 after=0 line drops=null records=null
	local busy0 total0 busy1 total1
	[ "$target" = tap ] && port=$tap_port pid=$tap_pid
	if [ "$target" = sniffed ]; then
		sniff_start
		pid=$sniff_pid
	elif [ "$target" = floor ]; then
		floor_start
		pid=$sniff_pid
	fi
	[ -n "$pid" ] && before=$(tap_cpu_ticks "$pid")
	read -r busy0 total0 < <(tap_machine_ticks)
	line=$(timeout 600 "$loadgen" -p "$port" -c "$conns" -w "$window" -s "$size" -n "$msgs") ||
		tap_log "round $round $target: loadgen failed: $line"
	read -r busy1 total1 < <(tap_machine_ticks)
	sleep 0.3 # the last packets and the 50 ms late-return hold of acked mandatory publishes
	[ -n "$pid" ] && after=$(tap_cpu_ticks "$pid")
	if [ "$target" = sniffed ]; then
		kill -INT "$sniff_pid"
		wait "$sniff_pid" || tap_log "round $round: the sniffer exited $?"
		sniff_pid=
		drops=$(awk -F'"total":' '/"type":"capture_drops"/ { split($2, a, /[,}]/); t = a[1] } END { print t + 0 }' \
			"$out/sniff-verdicts.jsonl")
		records=$(grep -c '"type":"publish"' "$out/sniff-verdicts.jsonl" || true)
	elif [ "$target" = floor ]; then
		kill -INT "$sniff_pid"
		wait "$sniff_pid" || true
		sniff_pid=
		drops=$(sed -n 's/^\([0-9]*\) packets dropped by kernel.*/\1/p' "$out/tcpdump.log")
		[ -n "$drops" ] || drops=null
	elif [ "$target" = tap ]; then
		records=$(grep -c '"type":"publish"' "$tap_verdicts" || true)
		: >"$tap_verdicts"
	fi
	[ -n "$line" ] || line='{"error":"no output"}'
	local row='{"round":%d,"target":"%s","cpu_s":%s,"machine_busy":%s,"machine_cpu_s":%s,"drops":%s,"records":%s'
	printf "$row"',"run":%s}\n' \
		"$round" "$target" "$(awk -v t=$((after - before)) -v k="$tck" 'BEGIN { printf "%.2f", t / k }')" \
		"$(awk -v b=$((busy1 - busy0)) -v t=$((total1 - total0)) 'BEGIN { printf "%.3f", (t > 0 ? b / t : 0) }')" \
		"$(awk -v b=$((busy1 - busy0)) -v k="$tck" 'BEGIN { printf "%.2f", b / k }')" "$drops" "$records" \
		"$line" >>"$results"
	tap_log "round $round $target: $line (cpu ticks $((after - before)), drops $drops, records $records)"
}

targets=(direct sniffed floor tap)
for r in $(seq "$rounds"); do
	for i in "${!targets[@]}"; do
		run_one "$r" "${targets[(i + r - 1) % ${#targets[@]}]}"
		sleep 0.2
	done
done
elif [ "$mode" != report ]; then
	tap_die "usage: ${0##*/} [run|report]"
fi
tap_need_results "$results"

/usr/bin/python3 - "$results" "$out/latest.md" <<'PY'
import json, random, statistics, sys
results, md_path = sys.argv[1:3]
runs = [json.loads(line) for line in open(results) if line.strip()]
bad = [r for r in runs if "error" in r["run"] or r["run"].get("failed_conns")]
by = {}
for r in runs:
    if r in bad:
        continue
    by.setdefault(r["target"], {})[r["round"]] = r
rate = lambda t: [by.get(t, {})[k]["run"]["msgs_per_s"] for k in sorted(by.get(t, {}))]  # noqa: E731
cpu_per_m = lambda t: [r["cpu_s"] / r["run"]["sent"] * 1e6 for r in by.get(t, {}).values()  # noqa: E731
                       if r["run"].get("sent")]
med = lambda v: statistics.median(v) if v else None  # noqa: E731
pair = lambda t, base="direct": [by[t][k]["run"]["msgs_per_s"] / by[base][k]["run"]["msgs_per_s"]  # noqa: E731
                                 for k in by.get(t, {}) if k in by.get(base, {})]
paired, paired_floor, sniffed_floor = pair("sniffed"), pair("floor"), pair("sniffed", "floor")


def ci(v):
    """95 % interval of the median of v, bootstrapped (fixed seed: the same results give the same interval)."""
    if len(v) < 5:
        return "n/a"
    rng = random.Random(1)
    m = sorted(statistics.median(rng.choices(v, k=len(v))) for _ in range(2000))
    return f"{m[50]:.3f}–{m[1949]:.3f}"



sniffed = list(by.get("sniffed", {}).values())
drops = sum(r["drops"] or 0 for r in sniffed)
short = [(r["round"], r["records"], r["run"]["sent"]) for r in sniffed if r["records"] != r["run"]["sent"]]
fmt = lambda v, p=0: "n/a" if v is None else f"{v:,.{p}f}"  # noqa: E731
pct = lambda v: "n/a" if v is None else f"{v * 100:.0f} %"  # noqa: E731
busy = lambda t: [r["machine_busy"] for r in by.get(t, {}).values() if "machine_busy" in r]  # noqa: E731
machine_us = lambda t: [r["machine_cpu_s"] / r["run"]["sent"] * 1e6 for r in by.get(t, {}).values()  # noqa: E731
                        if "machine_cpu_s" in r and r["run"].get("sent")]
rounds = len({r["round"] for r in runs})
lines = [f"Rounds: {rounds} (direct, sniffed, floor = tcpdump -w /dev/null with the same filter, tap alternating, "
         "each round starting one later), "
         "1 connection, W=1000, 64 B; medians.\n",
         "| | direct | sniffed | floor (tcpdump) | tap |", "|---|---|---|---|---|",
         f"| msg/s | {fmt(med(rate('direct')))} | {fmt(med(rate('sniffed')))} | {fmt(med(rate('floor')))} | "
         f"{fmt(med(rate('tap')))} |",
         f"| × direct (paired median) | | {fmt(med(paired), 3)} | {fmt(med(paired_floor), 3)} | |",
         f"| 95 % interval of that median (bootstrap) | | {ci(paired)} | {ci(paired_floor)} | |",
         f"| × floor (paired median, interval) | | {fmt(med(sniffed_floor), 3)} ({ci(sniffed_floor)}) | | |",
         f"| CPU s per M msgs (capture / proxy) | | {fmt(med(cpu_per_m('sniffed')), 2)} | "
         f"{fmt(med(cpu_per_m('floor')), 2)} | {fmt(med(cpu_per_m('tap')), 2)} |",
         f"| kernel drops (all sniffed runs) | | {drops} | | |",
         f"| machine busy (all processes, during the publisher's run) | {pct(med(busy('direct')))} | "
         f"{pct(med(busy('sniffed')))} | {pct(med(busy('floor')))} | {pct(med(busy('tap')))} |",
         f"| machine CPU µs per message (all processes) | {fmt(med(machine_us('direct')), 1)} | "
         f"{fmt(med(machine_us('sniffed')), 1)} | {fmt(med(machine_us('floor')), 1)} | "
         f"{fmt(med(machine_us('tap')), 1)} |", ""]
# With the machine nearly busy, what a sniffer spends comes out of the broker's and the publisher's CPU: 0.99 x
# direct leaves it about 1 % of what they spend per message.
budget = med(machine_us("direct"))
if budget is not None:
    lines += [f"The 0.99 target leaves a sniffer about {budget / 100:.2f} µs of CPU per message (1 % of the "
              f"{budget:.1f} µs the machine spends per message in the direct runs, {pct(med(busy('direct')))} "
              f"busy); the sniffer spent {fmt(med(cpu_per_m('sniffed')), 2)}, tcpdump "
              f"{fmt(med(cpu_per_m('floor')), 2)}.", ""]
ratio = med(paired)
cs, ct = med(cpu_per_m("sniffed")), med(cpu_per_m("tap"))
checks = [
    ("throughput with the sniffer >= 0.99 x without (paired median)", f"{fmt(ratio, 3)}",
     ratio is not None and ratio >= 0.99),
    ("sniffer CPU per message <= the proxy's", f"{fmt(cs, 2)} vs {fmt(ct, 2)} s per M",
     cs is not None and ct is not None and cs <= ct),
    ("no drops at this rate with the default buffer", f"{drops} dropped", bool(sniffed) and drops == 0),
    ("one publish record per message sent, every sniffed run", f"short runs: {short}", bool(sniffed) and not short),
]
for name, value, ok in checks:
    lines.append(f"- {'PASS' if ok else 'FAIL'}: {name}: {value}")
if bad:
    lines.append(f"- {len(bad)} run(s) failed: {[(r['round'], r['target'], r['run']) for r in bad]}")
text = "\n".join(lines) + "\n"
open(md_path, "w").write(text)
print(text, end="")
sys.exit(1 if bad else 0)
PY
