#!/usr/bin/env bash
# Replay throughput: builds bench_replay (release build in build-bench-replay), writes a >= 200 MB capture of
# mixed publish traffic with the pcapng writer over CONNS connections, replays it with the tracker ticked at every
# packet and only when a deadline may be due, prints MB/s for both. Usage: bench-replay.sh [MB] [FILE] [CONNS]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
mb=${1:-200}
file=${2:-${TMPDIR:-/tmp}/amqptap-bench-replay.pcapng}
build=$TAP_REPO/build-bench-replay
cmake -B "$build" -S "$TAP_REPO" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target bench_replay >/dev/null
"$build/bench/bench_replay" "$file" "$mb" "${3:-8}"
rm -f "$file"
