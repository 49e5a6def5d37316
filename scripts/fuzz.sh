#!/bin/sh
# Builds the libFuzzer harnesses (tests/fuzz/fuzz_*.c) with clang in build-fuzz and runs each for N seconds
# (default 30), one per core at a time, on a scratch copy of its seed corpus. Exits non-zero if any harness finds a
# crash.
# Usage: scripts/fuzz.sh [seconds] [build-dir]; scripts/fuzz.sh --build [build-dir] builds them and stops.
set -eu
build_only=
if [ "${1:-}" = --build ]; then
	build_only=1
	shift
	set -- 0 "$@"
fi
secs=${1:-30}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${2:-$root/build-fuzz}
CC=clang cmake -B "$build" -S "$root" -DTAP_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
# only the harnesses (the unit tests and the executable are built and run elsewhere)
targets=$(for f in "$root"/tests/fuzz/fuzz_*.c; do printf ' --target %s' "$(basename "$f" .c)"; done)
# shellcheck disable=SC2086
cmake --build "$build" -j2 $targets >/dev/null
[ -z "$build_only" ] || exit 0
# Runs one harness; its verdict line (and on failure the end of its log) goes to $build/$name.result.
fuzz_one() {
	h=$1
	name=$(basename "$h")
	corpus="$build/fuzz-corpus/${name#fuzz_}"
	mkdir -p "$corpus"
	seeds="$root/tests/fuzz/corpus/${name#fuzz_}"
	[ -d "$seeds" ] && cp -n "$seeds"/* "$corpus"/ 2>/dev/null || true
	if "$h" -seed="${TAP_FUZZ_SEED:-1}" -max_total_time="$secs" -max_len=70000 -rss_limit_mb=1024 -artifact_prefix="$build/$name-" \
		-print_final_stats=1 "$corpus" >"$build/$name.log" 2>&1; then
		echo "$name: ok ($(grep -m1 'stat::number_of_executed_units' "$build/$name.log" | awk '{print $2}') runs)"
	else
		echo "$name: FAILED, see $build/$name.log; its end:"
		# the sanitizer's report and the input's path, for a CI log that keeps only what was printed
		grep -v -e '^#[0-9]' -e '^INFO:' -e '^  "' "$build/$name.log" | tail -n 40 | sed 's/^/    /'
		for a in "$build/$name"-crash-* "$build/$name"-leak-* "$build/$name"-oom-* "$build/$name"-timeout-*; do
			if [ -f "$a" ] && [ "$(wc -c <"$a")" -le 16384 ]; then
				echo "    $(basename "$a") (base64): $(base64 -w0 "$a")"
			fi
		done
		return 1
	fi
} >"$build/$(basename "$1").result"

# One harness per core at a time (each is single-threaded and runs for the same time); results in name order.
cores=$(nproc)
pids=
trap 'kill $pids 2>/dev/null; exit 130' INT TERM # the harnesses running in the background go with the script
set -- "$build"/fuzz/fuzz_*
while [ $# -gt 0 ]; do
	n=0
	pids=
	while [ $# -gt 0 ] && [ $n -lt "$cores" ]; do
		fuzz_one "$1" &
		pids="$pids $!"
		shift
		n=$((n + 1))
	done
	wait
done
status=0
for h in "$build"/fuzz/fuzz_*; do
	result="$build/$(basename "$h").result"
	cat "$result"
	grep -q ': ok (' "$result" || status=1
done
exit $status
