#!/usr/bin/env bash
# The CI guard on the core path's cost, in a unit that does not move with the machine's load: instructions per
# publish of `amqptap replay` (decode, track, render; the main thread only: callgrind --toggle-collect on the replay
# loop, so neither start-up nor the writer threads count) on a fixed capture, against the budget kept in
# tests/bench/instructions.budget. Fails when a figure grows more than 5 % past its budget; says so, without
# failing, when one has shrunk more than 5 % (the budget is stale: lower it). The figures hold for the default
# build (RelWithDebInfo, Debian's gcc); another compiler or build type needs its own budget.
# Usage: scripts/bench-instructions.sh [--update]   (--update writes the figures measured now as the budget)
# Env: TAP_BUILD_DIR (build).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

build=${TAP_BUILD_DIR:-$TAP_REPO/build}
budget=$TAP_REPO/tests/bench/instructions.budget
capture=$TAP_REPO/tests/data/capture/core-budget.pcapng.gz
port=5690 # the broker's port when the capture was recorded (not the test broker's: nothing connects)
update=
case ${1:-} in
--update) update=1 ;;
"") ;;
*) tap_log "unknown option: $1"; exit 2 ;;
esac

tap_need_pkgs valgrind || tap_die "could not install valgrind"
[ -x "$build/amqptap" ] || tap_die "$build/amqptap is not built"
work=$(mktemp -d "${TMPDIR:-/tmp}/amqptap-instructions.XXXXXX")
trap 'rm -rf "$work"' EXIT
zcat "$capture" >"$work/capture.pcapng"

# Instructions per publish of one replay with the outputs given ($@), e.g. --frames FILE.
per_publish() {
	valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" --toggle-collect='tap_replay_capture' \
		"$build/amqptap" replay "$work/capture.pcapng" --port "$port" --verdicts "$work/verdicts.jsonl" "$@" \
		2>"$work/stderr" || tap_die "replay failed: $(grep -v '^==' "$work/stderr" | head -3)"
	local ir publishes
	ir=$(awk '/^summary:/ { print $2 }' "$work/callgrind.out")
	publishes=$(grep -o 'publishes=[0-9]*' "$work/stderr" | head -1 | cut -d= -f2)
	[ -n "$ir" ] && [ "${publishes:-0}" -gt 0 ] && [ "$ir" -gt 0 ] ||
		tap_die "no instruction count or no publishes (ir=${ir:-none}, publishes=${publishes:-none})"
	echo $((ir / publishes))
}

declare -A now
now[verdicts]=$(per_publish)
now[verdicts+frames]=$(per_publish --frames "$work/frames.jsonl")
# The capture's publishes share one body (each one a repeat of the one before); a copy in which every body is its
# own gives the common case, with identity tracking (the default, auto) and without it.
/usr/bin/python3 "$TAP_REPO/tests/bench/distinct_bodies.py" "$work/capture.pcapng" "$work/distinct.pcapng" "$port" \
	2>/dev/null || tap_die "could not write the distinct-body copy of the capture"
cp "$work/distinct.pcapng" "$work/capture.pcapng"
now[distinct]=$(per_publish)
now[distinct+identity-off]=$(per_publish --identity off)

if [ -n "$update" ]; then
	{
		sed -n '/^#/p' "$budget"
		for k in verdicts verdicts+frames distinct distinct+identity-off; do echo "$k ${now[$k]}"; done
	} >"$work/budget" && cp "$work/budget" "$budget"
	tap_log "budget written: $(grep -v '^#' "$budget" | tr '\n' ' ')"
	exit 0
fi

rc=0
while read -r k allowed; do
	case $k in '#'* | '') continue ;; esac
	got=${now[$k]:-}
	[ -n "$got" ] || { tap_log "$k: no such measurement"; rc=1; continue; }
	pct=$(awk -v g="$got" -v a="$allowed" 'BEGIN { printf "%+.1f", (g - a) * 100 / a }')
	if [ "$got" -gt $((allowed + allowed / 20)) ]; then
		tap_log "$k: $got instructions per publish, $pct % over the budget of $allowed: FAILED"
		rc=1
	elif [ "$got" -lt $((allowed - allowed / 20)) ]; then
		tap_log "$k: $got instructions per publish ($pct % of $allowed): lower the budget (--update)"
	else
		tap_log "$k: $got instructions per publish ($pct % of the budget of $allowed): ok"
	fi
done <"$budget"
# The default identity tracking may cost at most 10 % over none, on the common case (src/DESIGN.md §4b).
on=${now[distinct]} off=${now[distinct+identity-off]}
pct=$(awk -v a="$on" -v b="$off" 'BEGIN { printf "%+.1f", (a - b) * 100 / b }')
if [ "$on" -gt $((off + off / 10)) ]; then
	tap_log "identity auto over off on distinct messages: $pct % (at most +10 %): FAILED"
	rc=1
else
	tap_log "identity auto over off on distinct messages: $pct % (at most +10 %): ok"
fi
exit $rc
