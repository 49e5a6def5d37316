#!/bin/sh
# Decoder benchmark: bench_decode on a large in-memory publish stream (64 B and 4 KiB bodies), then the
# same decode loop under callgrind on a smaller stream to report instructions per 64 B publish.
# Usage: scripts/bench-decode.sh [build-dir]   (default build-bench, configured RelWithDebInfo)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-bench}
cmake -B "$build" -S "$root" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j2 --target bench_decode >/dev/null
bin="$build/bench/bench_decode"
"$bin" 200000 64 4096
if command -v valgrind >/dev/null; then
	n=20000
	out=$(mktemp)
	valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect=decode "$bin" $n 64 >/dev/null 2>&1
	ir=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
	rm -f "$out"
	# bench_decode decodes the stream 5 times when n >= 1000
	echo "callgrind: $ir instructions for 5 x $n publishes of 64 B = $(awk -v ir="$ir" -v n=$n 'BEGIN {printf "%.0f", ir / (5 * n)}') instructions per publish (method + header + body frame)"
fi
