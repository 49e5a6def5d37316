# shellcheck shell=bash disable=SC2034
# Shared shell helpers for amqptap's scripts: repository paths, logging, and the
# environment of the throwaway RabbitMQ node that broker.sh runs. Source it; do not run it.

TAP_REPO=${TAP_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
TAP_RUN_DIR=${TAP_RUN_DIR:-$TAP_REPO/.run}
TAP_BROKER_DIR=${TAP_BROKER_DIR:-$TAP_RUN_DIR/broker}
TAP_BROKER_PORT=${TAP_BROKER_PORT:-5690}
# Erlang distribution port of the node. The CLI tools bind DIST_PORT+10000..+10010, so keep both ranges
# clear of RabbitMQ's defaults (25672, 35672-35682); and keep the node's port below the kernel's ephemeral
# range (32768+), where a client socket of an earlier test may still hold it.
TAP_BROKER_DIST_PORT=${TAP_BROKER_DIST_PORT:-25690}
TAP_BROKER_NODE=${TAP_BROKER_NODE:-amqptap-test-$TAP_BROKER_PORT@localhost}
RMQ_BIN=/usr/lib/rabbitmq/bin

tap_log() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
tap_die() { tap_log "$*"; exit 1; }

# `report` of a benchmark script: its results file $1 must be there (a run wrote it).
tap_need_results() { [ -f "$1" ] || tap_die "no results in ${1%/*}: run the benchmark first"; }

# What building amqptap needs from Debian; TAP_BENCH_PKGS adds the load generators' client library and HAProxy.
TAP_BUILD_PKGS=(build-essential cmake pkg-config libevent-dev libssl-dev libpcap-dev libxxhash-dev libjansson-dev)
TAP_BENCH_PKGS=("${TAP_BUILD_PKGS[@]}" librabbitmq-dev haproxy)

# Installs the Debian packages given that are not installed yet (apt-get update at most once).
tap_need_pkgs() {
	local missing=() p
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	tap_log "installing: ${missing[*]}"
	local sudo=
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	if [ -z "${TAP_APT_UPDATED:-}" ]; then
		$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq || return 1
		TAP_APT_UPDATED=1
	fi
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Runs "$@" with the private broker environment (never the system node's files).
tap_broker_env() {
	env HOME="$TAP_BROKER_DIR/home" \
		RABBITMQ_NODENAME="$TAP_BROKER_NODE" \
		RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
		RABBITMQ_NODE_PORT="$TAP_BROKER_PORT" \
		RABBITMQ_DIST_PORT="$TAP_BROKER_DIST_PORT" \
		RABBITMQ_MNESIA_BASE="$TAP_BROKER_DIR/mnesia" \
		RABBITMQ_LOG_BASE="$TAP_BROKER_DIR/log" \
		RABBITMQ_CONFIG_FILE="$TAP_BROKER_DIR/rabbitmq.conf" \
		RABBITMQ_ADVANCED_CONFIG_FILE="$TAP_BROKER_DIR/advanced.config" \
		RABBITMQ_CONF_ENV_FILE="$TAP_BROKER_DIR/rabbitmq-env.conf" \
		RABBITMQ_ENABLED_PLUGINS_FILE="$TAP_BROKER_DIR/enabled_plugins" \
		RABBITMQ_PID_FILE="$TAP_BROKER_DIR/node.pid" \
		"$@"
}

# Builds the tree into $1 (extra cmake arguments after it) unless it is up to date.
tap_build() {
	local dir=$1
	shift
	cmake -S "$TAP_REPO" -B "$dir" "$@" >/dev/null && cmake --build "$dir" -j"$(nproc)"
}

# True if something accepts on 127.0.0.1:PORT (a probe connection: only for peers that do not count
# connections, e.g. the broker or HAProxy).
tap_port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Waits up to 10 s until something accepts on 127.0.0.1:PORT (probing as tap_port_busy does).
tap_wait_port() {
	for _ in $(seq 100); do
		tap_port_busy "$1" && return 0
		sleep 0.1
	done
	tap_die "nothing listens on 127.0.0.1:$1"
}

# Whole-machine CPU ticks from /proc/stat as "busy total" (busy: user, nice, system, irq, softirq, steal).
tap_machine_ticks() {
	awk '$1 == "cpu" { busy = $2 + $3 + $4 + $7 + $8 + $9; print busy, busy + $5 + $6; exit }' /proc/stat
}

# utime+stime of a process, in clock ticks (/proc/PID/stat fields 14 and 15; the name in field 2 may hold spaces).
tap_cpu_ticks() {
	local s
	s=$(cat "/proc/$1/stat") || { echo 0; return; }
	s=${s##*) }
	# shellcheck disable=SC2086 # split into fields on purpose
	set -- $s
	echo $((${12} + ${13}))
}
