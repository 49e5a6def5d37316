#!/usr/bin/env bash
# Scale and soak check of one amqptap process in front of a throwaway RabbitMQ: (1) 1,000 concurrent confirm-mode
# publisher connections (tests/bench/bench_manyconn.c) with every verdict checked; (2) a steady streaming-confirm load
# (bench_loadgen runs back to back) for TAP_SOAK_SECONDS with the tap's VmRSS sampled, judged against
# 20 MiB + 150 B per outstanding publish and for flatness. Markdown summary on stdout and in .run/soak/latest.md.
#
# Environment: TAP_SOAK_SECONDS (600), TAP_SOAK_CONNS (1000), TAP_SOAK_MC_WINDOW (10), TAP_SOAK_MC_MSGS (50 per
# connection), TAP_SOAK_LOAD ("4 1000 64": connections window body-bytes of the soak), TAP_SOAK_RUN_SECONDS (15, the
# length each loadgen run aims at), TAP_SOAK_SAMPLE (10 s between RSS samples), TAP_SOAK_BUILD (build dir),
# TAP_SOAK_OUT (output dir), TAP_SOAK_TAP_PORT (5771), TAP_SOAK_KEEP=1 keeps the verdict files.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export TAP_BROKER_PORT=${TAP_BROKER_PORT:-5770}
export TAP_BROKER_DIST_PORT=${TAP_BROKER_DIST_PORT:-45770}
export TAP_BROKER_DIR=${TAP_BROKER_DIR:-$repo/.run/soak/broker}
export TAP_BROKER_NODE=${TAP_BROKER_NODE:-soak@localhost}
. "$repo/scripts/lib.sh"

soak_secs=${TAP_SOAK_SECONDS:-600}
mc_conns=${TAP_SOAK_CONNS:-1000}
mc_window=${TAP_SOAK_MC_WINDOW:-10}
mc_msgs=${TAP_SOAK_MC_MSGS:-50}
read -r soak_conns soak_window soak_size <<<"${TAP_SOAK_LOAD:-4 1000 64}"
run_secs=${TAP_SOAK_RUN_SECONDS:-15}
sample_every=${TAP_SOAK_SAMPLE:-10}
build=${TAP_SOAK_BUILD:-$repo/build-soak}
out=${TAP_SOAK_OUT:-$repo/.run/soak}
tap_port=${TAP_SOAK_TAP_PORT:-5771}
verdicts=$out/verdicts.jsonl
facts=$out/facts.txt

tap_pid='' broker_started='' sampler_pid='' fdmon_pid='' client_pid=''
# Stops a background sampler subshell and the sleep it may be waiting on.
stop_bg() {
	pkill -TERM -P "$1" 2>/dev/null || true
	kill -TERM "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}
cleanup() {
	local rc=$?
	for p in $sampler_pid $fdmon_pid; do
		stop_bg "$p"
	done
	for p in $client_pid $tap_pid; do
		kill -TERM "$p" 2>/dev/null || true
	done
	for p in $client_pid $tap_pid; do
		wait "$p" 2>/dev/null || true
	done
	if [ -n "$broker_started" ]; then "$repo/scripts/broker.sh" stop || true; fi
	[ "${TAP_SOAK_KEEP:-0}" = 1 ] || rm -f "$out"/verdicts*.jsonl "$out"/manyconn-verdicts.jsonl
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

status_kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
fd_count() { local f=(/proc/"$1"/fd/*); echo ${#f[@]}; }
fact() { printf '%s=%s\n' "$1" "$2" >>"$facts"; }

# Runs a client in the background (so the EXIT trap can stop it) and waits for it; its stdout goes to $1.
run_client() {
	local dest=$1 rc=0
	shift
	"$@" >"$dest" &
	client_pid=$!
	wait "$client_pid" || rc=$?
	client_pid=
	return $rc
}

# Moves the verdict file aside and has the tap reopen its path (SIGHUP); prints the old file's new name.
rotate_verdicts() {
	local to=$1
	mv "$verdicts" "$to"
	kill -HUP "$tap_pid"
	for _ in $(seq 50); do [ -e "$verdicts" ] && break; sleep 0.02; done
	sleep 0.1 # a write already in flight when the signal arrived still lands in the old file
}

# The tap's descriptors need 2 per connection; the clients and the broker one each.
need_fds=$((mc_conns * 2 + 256))
if [ "$(ulimit -n)" -lt "$need_fds" ]; then
	hard=$(ulimit -Hn)
	[ "$hard" = unlimited ] || [ "$hard" -ge "$need_fds" ] || tap_die "fd hard limit $hard < $need_fds needed"
	ulimit -n "$need_fds"
fi

tap_log "building (Release) in $build"
tap_build "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
loadgen=$build/bench/bench_loadgen
manyconn=$build/bench/bench_manyconn
[ -x "$loadgen" ] || tap_die "$loadgen was not built (is librabbitmq-dev installed?)"
[ -x "$manyconn" ] || tap_die "bench clients were not built (is librabbitmq-dev installed?)"

mkdir -p "$out"
rm -f "$out"/verdicts*.jsonl "$out/manyconn-verdicts.jsonl" "$out/rss.tsv" "$out/fds.txt" "$out/runs.jsonl" \
	"$out"/amqptap*.log
: >"$facts"
if ! "$repo/scripts/broker.sh" status >/dev/null 2>&1; then
	"$repo/scripts/broker.sh" start
	broker_started=1
else
	tap_log "reusing the running broker $TAP_BROKER_NODE (its fd limit was fixed when it started)"
fi
fact broker_fd_limit "$(awk '/Max open files/ { print $4 }' "/proc/$(cat "$TAP_BROKER_DIR/node.pid" 2>/dev/null || echo 0)/limits" 2>/dev/null || echo '?')"

# Starts amqptap writing to $1 and waits for its "listening" line (no probe connection: it would be a record too).
start_tap() {
	tap_port_busy "$tap_port" && tap_die "port $tap_port is in use; set TAP_SOAK_TAP_PORT"
	"$build/amqptap" --listen "127.0.0.1:$tap_port" --upstream "127.0.0.1:$TAP_BROKER_PORT" --verdicts "$1" \
		2>"$2" &
	tap_pid=$!
	for _ in $(seq 100); do
		grep -q 'listening on' "$2" 2>/dev/null && return 0
		kill -0 "$tap_pid" 2>/dev/null || break
		sleep 0.1
	done
	tap_die "amqptap did not start: $(cat "$2")"
}

# Stops the tap (SIGTERM: it writes every pending verdict and flushes) and records its exit status as fact $1.
stop_tap() {
	local rc=0
	kill -TERM "$tap_pid"
	wait "$tap_pid" || rc=$?
	tap_pid=''
	fact "$1" "$rc"
}

start_tap "$out/manyconn-verdicts.jsonl" "$out/amqptap-manyconn.log"
fact tap_fd_limit "$(awk '/Max open files/ { print $4 }' "/proc/$tap_pid/limits")"
fact fds_idle "$(fd_count "$tap_pid")"
fact mc_rss_idle_kb "$(status_kb "$tap_pid" VmRSS)"

# ---- 1. many concurrent connections ------------------------------------------------------------------------------
tap_log "phase 1: $mc_conns concurrent connections × $mc_msgs publishes (W=$mc_window, mandatory, confirm)"
(
	while kill -0 "$tap_pid" 2>/dev/null; do
		fd_count "$tap_pid"
		sleep 0.1
	done
) >"$out/fds.txt" 2>/dev/null &
fdmon_pid=$!
mc_rc=0
run_client "$out/manyconn.json" "$manyconn" -p "$tap_port" -c "$mc_conns" -w "$mc_window" -n "$mc_msgs" -s 64 \
	-P 2000 || mc_rc=$?
sleep 0.5 # records are written within ~60 ms; an acked mandatory publish waits 50 ms for a late Return
stop_bg "$fdmon_pid"
fdmon_pid=
fact mc_rc "$mc_rc"
fact mc_client "$(cat "$out/manyconn.json")"
fact fds_peak "$(sort -n "$out/fds.txt" | tail -n 1)"
fact fds_after "$(fd_count "$tap_pid")"
fact mc_hwm_kb "$(status_kb "$tap_pid" VmHWM)"
fact mc_rss_after_kb "$(status_kb "$tap_pid" VmRSS)"
stop_tap mc_tap_exit
/usr/bin/python3 - "$out/manyconn-verdicts.jsonl" "$mc_conns" >>"$facts" <<'PY'
import json, sys
path, conns = sys.argv[1], int(sys.argv[2])
pubs = 0
keys = set()
dups = 0
bad = {}
pub_conns = set()
open_conns = set()
closes = 0
close_pubs = 0
close_bad = 0
for line in open(path):
    r = json.loads(line)
    t = r["type"]
    if t == "publish":
        pubs += 1
        k = (r["conn"], r["channel"], r["seq"])
        if k in keys:
            dups += 1
        keys.add(k)
        pub_conns.add(r["conn"])
        if r["route"] != "routed" or r["confirm"] != "ack":
            v = f'{r["route"]}/{r["confirm"]}'
            bad[v] = bad.get(v, 0) + 1
    elif t == "connection" and r.get("event") == "open":
        open_conns.add(r["conn"])
    elif t == "connection" and r.get("event") == "close":
        closes += 1
        close_pubs += r.get("publishes", 0)
        if r.get("by") != "client" or r.get("code") != 200 or r.get("unknown", 0) or r["conn"] not in open_conns:
            close_bad += 1
            print(f"mc_close_not_clean_example={json.dumps(r)}")
print(f"mc_publish_records={pubs}")
print(f"mc_unique_keys={len(keys)}")
print(f"mc_duplicate_keys={dups}")
print(f"mc_not_routed_ack={sum(bad.values())}")
print(f"mc_not_routed_ack_kinds={json.dumps(bad)}")
print(f"mc_publish_conns={len(pub_conns)}")
print(f"mc_open_records={len(open_conns)}")
print(f"mc_close_records={closes}")
print(f"mc_close_publishes={close_pubs}")
print(f"mc_close_not_clean={close_bad}")
PY
[ "${TAP_SOAK_KEEP:-0}" = 1 ] || rm -f "$out/manyconn-verdicts.jsonl"

# ---- 2. soak -----------------------------------------------------------------------------------------------------
# A fresh tap process, so the soak's peak is not the 1,000-connection phase's.
start_tap "$verdicts" "$out/amqptap-soak.log"
fact soak_rss_start_kb "$(status_kb "$tap_pid" VmRSS)"
tap_log "phase 2: soak for $soak_secs s: $soak_conns conns × W=$soak_window × $soak_size B, mandatory, confirm"
t0=$(date +%s.%N)
(
	i=1
	while kill -0 "$tap_pid" 2>/dev/null; do
		sleep "$(awk -v t0="$t0" -v now="$(date +%s.%N)" -v i="$i" -v s="$sample_every" \
			'BEGIN { d = t0 + i * s - now; printf "%.3f", (d > 0 ? d : 0) }')"
		printf '%d\t%s\t%s\n' "$((i * sample_every))" "$(status_kb "$tap_pid" VmRSS)" "$(status_kb "$tap_pid" VmHWM)"
		i=$((i + 1))
	done
) >"$out/rss.tsv" 2>/dev/null &
sampler_pid=$!

end=$(awk -v t0="$t0" -v s="$soak_secs" 'BEGIN { printf "%d", t0 + s }')
per_conn=100000 # first run; later runs are sized from the measured rate to last about $run_secs
sent_total=0 acked_total=0 records_total=0 ok_total=0 runs=0 failed_runs=0
: >"$out/runs.jsonl"
count_file() { # publish records ($recs) and routed+ack records of one rotated file, added to the totals
	local o
	recs=$(grep -c -F '"type":"publish"' "$1" || true)
	o=$(grep -c -F '"route":"routed","confirm":"ack"' "$1" || true)
	records_total=$((records_total + recs))
	ok_total=$((ok_total + o))
}
while :; do
	left=$((end - $(date +%s)))
	[ "$left" -gt 0 ] || break
	line=
	if ! run_client "$out/run.json" "$loadgen" -p "$tap_port" -c "$soak_conns" -w "$soak_window" -s "$soak_size" \
		-n "$per_conn" -m; then
		failed_runs=$((failed_runs + 1))
	fi
	line=$(cat "$out/run.json")
	[ -n "$line" ] || line='{"error":"no output","sent":0,"msgs":0,"msgs_per_s":0}'
	read -r sent msgs rate < <(/usr/bin/python3 -c 'import json,sys; r=json.loads(sys.argv[1]);
print(r.get("sent",0), r.get("msgs",0), int(r.get("msgs_per_s",0)))' "$line")
	sent_total=$((sent_total + sent))
	acked_total=$((acked_total + msgs))
	runs=$((runs + 1))
	sleep 0.3
	rotate_verdicts "$out/verdicts.prev.jsonl"
	count_file "$out/verdicts.prev.jsonl"
	rm -f "$out/verdicts.prev.jsonl"
	printf '{"run":%d,"records":%s,"loadgen":%s}\n' "$runs" "$recs" "$line" >>"$out/runs.jsonl"
	tap_log "soak run $runs: sent $sent, $rate msg/s, $recs publish records; RSS $(status_kb "$tap_pid" VmRSS) kB"
	left=$((end - $(date +%s)))
	per_conn=$(awk -v r="$rate" -v s="$run_secs" -v l="$left" -v c="$soak_conns" -v w="$soak_window" \
		'BEGIN { t = l < s ? l : s; n = int(r * t / c); if (n < w * 2) n = w * 2; print n }')
done
soak_elapsed=$(awk -v t0="$t0" -v now="$(date +%s.%N)" 'BEGIN { printf "%.0f", now - t0 }')
stop_bg "$sampler_pid"
sampler_pid=
fact soak_hwm_kb "$(status_kb "$tap_pid" VmHWM)"
fact soak_rss_end_kb "$(status_kb "$tap_pid" VmRSS)"
fact fds_end "$(fd_count "$tap_pid")"
stop_tap tap_exit
count_file "$verdicts"
fact soak_seconds "$soak_elapsed"
fact soak_runs "$runs"
fact soak_failed_runs "$failed_runs"
fact soak_sent "$sent_total"
fact soak_acked "$acked_total"
fact soak_records "$records_total"
fact soak_routed_ack "$ok_total"
fact soak_outstanding "$((soak_conns * soak_window))"
fact soak_load "$soak_conns conns × W=$soak_window × $soak_size B, mandatory, confirm"
fact mc_outstanding "$((mc_conns * mc_window))"
fact mc_conns "$mc_conns"
fact mc_sent_expected "$((mc_conns * mc_msgs))"

/usr/bin/python3 - "$facts" "$out/rss.tsv" "$out/latest.md" <<'PY'
import json, statistics, sys
facts_path, rss_path, md_path = sys.argv[1:4]
F = {}
for line in open(facts_path):
    k, _, v = line.rstrip("\n").partition("=")
    F[k] = v
def num(k, default=0):
    try:
        return int(F.get(k, default))
    except ValueError:
        return default
samples = []
for line in open(rss_path):
    p = line.split()
    if len(p) >= 2 and p[1].isdigit():
        samples.append((int(p[0]), int(p[1]), int(p[2]) if len(p) > 2 and p[2].isdigit() else 0))
MiB = 1024.0
L = []
ok_all = True
def check(label, ok, detail):
    global ok_all
    ok_all &= bool(ok)
    L.append(f"- **{'PASS' if ok else 'FAIL'}**: {label} — {detail}")

client = json.loads(F.get("mc_client") or "{}")
conns = num("mc_conns")
expected = num("mc_sent_expected")
sent = client.get("sent", 0)
L.append(f"## 1. {conns} concurrent connections through one tap\n")
L.append(f"Client: {conns} confirm-mode connections, W={client.get('window')}, "
         f"{expected // max(conns, 1)} mandatory publishes each, 64 B; all opened in {client.get('open_seconds')} s "
         f"and held open together until the last confirm; publishing took {client.get('seconds')} s "
         f"({client.get('msgs_per_s')} msg/s). fd limits: tap {F.get('tap_fd_limit')}, broker {F.get('broker_fd_limit')}.\n")
L.append("| figure | value |")
L.append("|---|---|")
rows = [
    ("client: opened / sent / acked / nacked / returned / failed conns",
     f"{client.get('opened')} / {sent} / {client.get('acked')} / {client.get('nacked')} / {client.get('returned')} / "
     f"{client.get('failed_conns')}"),
    ("tap fds: idle / peak while open / after close", f"{F.get('fds_idle')} / {F.get('fds_peak')} / {F.get('fds_after')}"),
    ("publish records", F.get("mc_publish_records")),
    ("records not routed+ack", f"{F.get('mc_not_routed_ack')} {F.get('mc_not_routed_ack_kinds')}"),
    ("distinct (conn, channel, seq) / duplicates", f"{F.get('mc_unique_keys')} / {F.get('mc_duplicate_keys')}"),
    ("distinct conn ids with publishes / connection open records", f"{F.get('mc_publish_conns')} / {F.get('mc_open_records')}"),
    ("connection close records (not clean)", f"{F.get('mc_close_records')} ({F.get('mc_close_not_clean')})"),
    ("tap VmRSS idle / VmHWM / VmRSS after all closed",
     f"{num('mc_rss_idle_kb') / MiB:.1f} / {num('mc_hwm_kb') / MiB:.1f} / {num('mc_rss_after_kb') / MiB:.1f} MiB "
     f"(≈ {(num('mc_hwm_kb') - num('mc_rss_idle_kb')) * 1024 / max(conns, 1):,.0f} B per connection above idle; "
     f"outstanding ≤ {F.get('mc_outstanding')})"),
]
if F.get("mc_close_not_clean_example"):
    rows.append(("first close record that was not clean", F["mc_close_not_clean_example"]))
L += [f"| {a} | {b} |" for a, b in rows]
L.append("")
check("every connection worked", num("mc_rc") == 0 and client.get("opened") == conns and not client.get("failed_conns")
      and sent == expected and client.get("acked") == expected,
      f"client exit {F.get('mc_rc')}, {client.get('acked')} of {expected} acked")
check("connections really overlapped", num("fds_peak") > 2 * conns, f"peak tap fds {F.get('fds_peak')} > {2 * conns}")
check("one publish record per publish", num("mc_publish_records") == sent == expected,
      f"{F.get('mc_publish_records')} records, {sent} sent")
check("every verdict routed + ack", num("mc_not_routed_ack", -1) == 0, f"{F.get('mc_not_routed_ack')} others")
check("exactly one record per (conn, channel, seq)",
      num("mc_duplicate_keys", -1) == 0 and num("mc_unique_keys") == expected,
      f"{F.get('mc_unique_keys')} distinct, {F.get('mc_duplicate_keys')} duplicates")
check(f"{conns} distinct connections", num("mc_publish_conns") == conns and num("mc_open_records") == conns,
      f"{F.get('mc_publish_conns')} with publishes, {F.get('mc_open_records')} opened")
check(f"{conns} connection close records", num("mc_close_records") == conns and num("mc_close_not_clean", -1) == 0
      and num("mc_close_publishes") == expected,
      f"{F.get('mc_close_records')} closes, {F.get('mc_close_not_clean')} not clean, "
      f"per-connection publish counts sum to {F.get('mc_close_publishes')}")
check("descriptors released", num("fds_after") <= num("fds_idle") + 2, f"{F.get('fds_after')} vs {F.get('fds_idle')} idle")
check("tap exited cleanly on SIGTERM", num("mc_tap_exit", -1) == 0, f"exit {F.get('mc_tap_exit')}")

L.append(f"\n## 2. Soak: {F.get('soak_load')}, {F.get('soak_seconds')} s\n")
out = num("soak_outstanding")
budget = 20 * MiB + 150 * out / 1024.0
rss = [s[1] for s in samples]
# The kernel updates VmHWM lazily (and RSS counters are cached per CPU), so the peak is the larger of it and the samples.
hwm = max([num("soak_hwm_kb")] + rss)
n = len(rss)
if n >= 3:
    mid = statistics.mean(rss[n // 3: 2 * n // 3])
    last = statistics.mean(rss[2 * n // 3:])
else:
    mid = last = float(rss[-1]) if rss else 0.0
growth = last - mid
half = samples[n // 2:]
slope = 0.0
if len(half) >= 2:
    mt = statistics.mean(t for t, _, _ in half)
    mr = statistics.mean(r for _, r, _ in half)
    den = sum((t - mt) ** 2 for t, _, _ in half)
    slope = sum((t - mt) * (r - mr) for t, r, _ in half) / den if den else 0.0
rate = num("soak_acked") / max(num("soak_seconds"), 1)
L.append(f"{F.get('soak_runs')} loadgen runs back to back ({F.get('soak_failed_runs')} failed), "
         f"{num('soak_sent'):,} publishes ({rate:,.0f} msg/s average incl. gaps between runs).\n")
if rss:
    L.append(f"VmRSS samples every {samples[0][0]} s ({n}): first {rss[0] / MiB:.2f} MiB, min {min(rss) / MiB:.2f}, "
             f"max {max(rss) / MiB:.2f}, last {rss[-1] / MiB:.2f}; RSS at soak start {num('soak_rss_start_kb') / MiB:.2f} MiB.\n")
    L.append("```")
    L.append("  t(s)  VmRSS(MiB)")
    for t, r, _ in samples:
        L.append(f"{t:6d}  {r / MiB:8.2f}")
    L.append("```\n")
L.append(f"Peak (max of VmHWM {num('soak_hwm_kb') / MiB:.2f} MiB and the samples; the soak has its own tap process): "
         f"{hwm / MiB:.2f} MiB; max outstanding publishes {out} (the window total); "
         f"budget 20 MiB + 150 B × {out} = {budget / MiB:.2f} MiB.")
L.append(f"Flatness: mean RSS middle third {mid / MiB:.2f} MiB, last third {last / MiB:.2f} MiB, "
         f"growth {growth / 1024:+.3f} MiB ({(growth / mid * 100 if mid else 0):+.2f} %); "
         f"least-squares slope over the second half {slope * 600 / 1024:+.3f} MiB per 10 min.\n")
check("peak RSS under 20 MiB + 150 B per outstanding publish", 0 < hwm <= budget,
      f"{hwm / MiB:.2f} ≤ {budget / MiB:.2f} MiB")
check("flat across the run (last vs middle third < 5 % and < 2 MiB)", n >= 3 and growth < 0.05 * mid and growth < 2 * MiB,
      f"{growth / 1024:+.3f} MiB")
check("one publish record per publish over the whole soak",
      num("soak_records") == num("soak_sent") > 0 and num("soak_failed_runs", -1) == 0,
      f"{num('soak_records'):,} records, {num('soak_sent'):,} sent, {num('soak_acked'):,} confirmed")
check("every soak verdict routed + ack", num("soak_routed_ack") == num("soak_records"),
      f"{num('soak_routed_ack'):,} of {num('soak_records'):,}")
check("tap exited cleanly on SIGTERM", num("tap_exit", -1) == 0, f"exit {F.get('tap_exit')}")
L.append(f"\n**Overall: {'PASS' if ok_all else 'FAIL'}**")
text = "\n".join(L) + "\n"
open(md_path, "w").write(text)
print(text, end="")
sys.exit(0 if ok_all else 1)
PY
