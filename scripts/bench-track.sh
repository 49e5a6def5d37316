#!/bin/sh
# Builds the tracker benchmark (release flags, own build dir) and runs it: ns per publish, peak RSS and bytes per
# outstanding publish. Usage: scripts/bench-track.sh [publishes] [outstanding]
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=${TAP_BENCH_BUILD:-$src/build-trk}
cmake -B "$build" -S "$src" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target bench_track -j2 >/dev/null
exec "$build/bench/bench_track" "$@"
