#!/usr/bin/env bash
# The whole amqptap check, as CI runs it (.ci/run): install missing Debian packages, build a normal and (in the
# background) a sanitizer (ASan+UBSan) tree, check the core path's instructions per publish against their budget,
# start the throwaway broker, run ctest (unit + integration) in both, run the benchmark script and the fuzzers
# briefly, stop the broker. Exits non-zero if anything failed.
# Env: TAP_BUILD_DIR (build), TAP_ASAN_BUILD_DIR (build-asan), TAP_BROKER_PORT (5690), TAP_FUZZ_SECONDS (10).
set -uo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

t0=$SECONDS
build=${TAP_BUILD_DIR:-$TAP_REPO/build}
asan=${TAP_ASAN_BUILD_DIR:-$TAP_REPO/build-asan}
export TAP_BROKER_PORT
# the management API on loopback: test_management_poll polls it (--management), the routing tests read it
export TAP_BROKER_MGMT_PORT=${TAP_BROKER_MGMT_PORT:-15690}
# and over HTTPS with a test CA of the node's own (test_topology_metrics polls it with verification on)
export TAP_BROKER_MGMT_TLS_PORT=${TAP_BROKER_MGMT_TLS_PORT:-15691}
failed=()
broker_started=

finish() {
	[ -n "${bg_pid:-}" ] && pkill -TERM -P "$bg_pid" 2>/dev/null && kill "$bg_pid" 2>/dev/null
	[ -n "$broker_started" ] && "$TAP_REPO/scripts/broker.sh" stop
	local took=$((SECONDS - t0))
	if [ ${#failed[@]} -eq 0 ]; then
		tap_log "all passed in $((took / 60))m$((took % 60))s"
	else
		tap_log "FAILED: ${failed[*]} (after $((took / 60))m$((took % 60))s)"
	fi
}
trap finish EXIT
trap 'exit 130' INT TERM

step() {
	local name=$1
	shift
	local started=$SECONDS rc=0
	tap_log "== $name"
	"$@" || rc=1
	tap_log "== $name: $([ $rc = 0 ] && echo ok || echo FAILED) in $((SECONDS - started)) s"
	[ $rc = 0 ] || failed+=("$name")
	return $rc
}

step packages tap_need_pkgs "${TAP_BUILD_PKGS[@]}" check librabbitmq-dev \
	rabbitmq-server python3-pika python3-amqp jq golang-go golang-github-rabbitmq-amqp091-go-dev nodejs amqp-specs tshark clang \
	valgrind haproxy tcpdump libclang-rt-14-dev dpkg-dev file man-db bash-completion systemd logrotate strace lintian \
	prometheus chromium python3-kombu librabbitmq-client-java default-jdk-headless || exit 1

step build tap_build "$build" || exit 1

# What needs the CPU and no broker runs in the background at nice 19 while the normal tree is checked (its
# integration tests mostly wait on the broker), so it takes the CPU those leave idle and the run is shorter by it:
# the sanitizer tree's build and then its unit tests, the fuzz harnesses' build and then the fuzzers. Each has its
# step below, which waits for it and shows its output.
# ctest sets AMQPTAP_BIN / TAP_CLIENTS_DIR per build tree, so the ASan run exercises the ASan binary.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fuzz_build=${TAP_FUZZ_BUILD_DIR:-$TAP_REPO/build-fuzz}
bg_dir=$TAP_RUN_DIR/background
mkdir -p "$bg_dir"
rm -f "$bg_dir"/*.rc
# bg NAME CMD...: runs CMD at nice 19 into NAME.log, its exit status into NAME.rc.
bg() {
	local name=$1
	shift
	nice -n 19 "$@" >"$bg_dir/$name.log" 2>&1
	echo $? >"$bg_dir/$name.rc"
}
(
	# shellcheck disable=SC2016 # expanded by the inner shell
	bg asan bash -c '. "$1/scripts/lib.sh"; tap_build "$2" -DTAP_SANITIZE=ON' _ "$TAP_REPO" "$asan"
	have_fuzz=
	[ -f "$TAP_REPO/scripts/fuzz.sh" ] && have_fuzz=1
	[ -z "$have_fuzz" ] || bg fuzz-build sh "$TAP_REPO/scripts/fuzz.sh" --build "$fuzz_build"
	if [ "$(cat "$bg_dir/asan.rc")" = 0 ]; then
		bg asan-unit ctest --test-dir "$asan" --output-on-failure -L unit -j"$(nproc)"
	fi
	if [ -n "$have_fuzz" ] && [ "$(cat "$bg_dir/fuzz-build.rc")" = 0 ]; then
		bg fuzz sh "$TAP_REPO/scripts/fuzz.sh" "${TAP_FUZZ_SECONDS:-10}" "$fuzz_build"
	fi
) &
bg_pid=$!
# bg_wait NAME [all]: waits until the background job NAME has ended and returns its exit status; shows its log
# (all of it with "all", else its end if it failed). A job that never ran (what it needs failed) is a failure.
bg_wait() {
	while [ ! -f "$bg_dir/$1.rc" ] && kill -0 "$bg_pid" 2>/dev/null; do sleep 1; done
	local rc
	rc=$(cat "$bg_dir/$1.rc" 2>/dev/null || echo 1)
	if [ "${2:-}" = all ]; then
		cat "$bg_dir/$1.log" 2>/dev/null || echo "$1 did not run"
	elif [ "$rc" != 0 ]; then
		tail -n 60 "$bg_dir/$1.log" 2>/dev/null || echo "$1 did not run"
	fi
	return "$rc"
}

# The core path's instructions per publish (callgrind, the normal build) against tests/bench/instructions.budget.
step instructions env TAP_BUILD_DIR="$build" "$TAP_REPO/scripts/bench-instructions.sh"

if step broker "$TAP_REPO/scripts/broker.sh" start; then
	broker_started=1
fi

# Unit tests in parallel, in both trees (the sanitizer tree's in the background, above). Integration tests one at a time (some kill, restart or alarm the shared
# broker), each once per run, so that the run stays under 20 minutes: in the sanitizer tree, unless it is one of
# NORMAL_ONLY below, which run in the normal tree (the build the package ships). Those need the normal build or
# spend their time waiting, where the sanitizers add nothing the unit tests and fuzzers (both under ASan+UBSan) do
# not already cover:
#   needs the normal build  test_alloc_failures (LD_PRELOAD replaces the allocator), test_metrics (a valgrind case, RSS
#                           bounds), test_sniff, test_tracking_memory, test_backpressure (RSS bounds the sanitizers'
#                           shadow memory would swamp)
#   waits                   test_resend (broker restarts, client back-offs), test_streaming (broker kill and stop_app),
#                           test_faults and test_fault_bytes (confirms delayed and withheld, latency, bandwidth; the
#                           rewriter is fuzzed and unit-tested under the sanitizers, and test_faults_channel and
#                           test_fault_api run there), test_outputs (stalled readers), test_consumer (unacked deliveries
#                           timing out), test_secrets (broker users)
#   replays                 test_captures, test_capture_gaps (every golden capture cut at every segment: 100 s under
#                           ASan; the same replay path runs under the sanitizers in the unit test_golden and in
#                           fuzz_capture and fuzz_replay)
# TAP_ALL_INTEGRATION=1 runs every integration test in both trees instead.
NORMAL_ONLY='integration/(test_alloc_failures|test_metrics|test_sniff|test_tracking_memory|test_backpressure|test_resend|'
NORMAL_ONLY+='test_streaming|test_faults|test_fault_bytes|test_outputs|test_consumer|test_secrets|test_captures|test_capture_gaps)$'
for dir in "$build" "$asan"; do
	name=ctest-$(basename "$dir")
	select=()
	if [ -z "${TAP_ALL_INTEGRATION:-}" ]; then
		if [ "$dir" = "$asan" ]; then select=(-E "$NORMAL_ONLY"); else select=(-R "$NORMAL_ONLY"); fi
	fi
	if [ "$dir" = "$asan" ]; then
		step build-asan bg_wait asan || continue
		step "$name-unit" bg_wait asan-unit all
	else
		step "$name-unit" ctest --test-dir "$dir" --output-on-failure -L unit -j"$(nproc)"
	fi
	step "$name-integration" ctest --test-dir "$dir" --output-on-failure -L integration "${select[@]}"
done

# The Debian package, built, installed with dpkg -i, run against the broker and removed (normal build only).
step package ctest --test-dir "$build" --output-on-failure -L package

# The benchmark scripts, briefly (one round, 2 % of the messages, two loads each, the normal build): they keep
# working, and every publish through the tap still gets its record under load. Figures from this run mean nothing. bench.sh and
# bench-sniff.sh use the test broker; bench-tls.sh starts its own (a TLS listener, its ports 5760-5766), with a
# storm of 50 clients and its bystander.
bench_smoke() {
	local out=$TAP_RUN_DIR/bench-smoke name
	mkdir -p "$out"
	for name in bench bench-sniff bench-tls; do
		local broker=(TAP_BROKER_DIR="$TAP_BROKER_DIR" TAP_BROKER_NODE="$TAP_BROKER_NODE"
			TAP_BROKER_DIST_PORT="$TAP_BROKER_DIST_PORT")
		[ "$name" = bench-tls ] && broker=(TAP_BROKER_PORT= TAP_BROKER_DIST_PORT= TAP_BROKER_MGMT_PORT=
			TAP_BROKER_MGMT_TLS_PORT= TAP_BROKER_DIR= TAP_BROKER_NODE= TAP_BENCH_STORM=50 TAP_BENCH_STORM_ROUNDS=1)
		env "${broker[@]}" TAP_BENCH_BUILD="$build" TAP_BENCH_BUILD_TYPE=RelWithDebInfo TAP_BENCH_ROUNDS=1 \
			TAP_BENCH_LOADS="w1 c100_w100" \
			TAP_BENCH_SCALE=0.02 TAP_BENCH_OUT="$out/$name" "$TAP_REPO/scripts/$name.sh" >"$out/$name.log" 2>&1 || {
			cat "$out/$name.log"
			return 1
		}
	done
}
# The fuzzers' results (run in the background, above), before the benchmarks take the CPU.
if [ -f "$TAP_REPO/scripts/fuzz.sh" ]; then
	step fuzz-build bg_wait fuzz-build && step fuzz bg_wait fuzz all
fi
step bench-smoke bench_smoke


[ ${#failed[@]} -eq 0 ]
