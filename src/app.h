/* The executable's modes (proxy, sniff, replay; src/main.c picks one) and what they share: the outputs, the tracker
 * and observer that write into them (app_outputs.c), the event loop with its signals and the --metrics endpoint
 * (app_loop.c). Calls go one way: main.c -> app_<mode>.c -> app_loop.c -> app_outputs.c (a mode calls both). */
#ifndef AMQPTAP_APP_H
#define AMQPTAP_APP_H

#include "amqptap/admin.h"
#include "amqptap/conf.h"
#include "amqptap/conn.h"
#include "amqptap/out.h"
#include "amqptap/pcapng.h"
#include "amqptap/proxy.h" /* tap_now_us: the wall clock every mode reads */
#include "amqptap/track.h"

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

/* The record outputs, in the order they are opened and named in messages. */
enum app_out {
	OUT_VERDICTS,
	OUT_FRAMES,
	OUT_PCAP,
	OUT_COUNT,
};

/* SIGINT, SIGTERM, SIGHUP, SIGUSR1: what a live mode's loop listens for. */
#define APP_N_SIGNALS 4

struct tap_route_model;

/* What every mode has; a live mode's own state wraps it (struct proxy_app, struct sniff_app). */
struct app {
	const struct tap_conf *conf;
	struct event_base *base;      /* live modes */
	struct event *sigs[APP_N_SIGNALS];
	struct event *tick_timer;
	struct tap_out *out[OUT_COUNT]; /* NULL: not asked for */
	struct tap_out_stats out_final[OUT_COUNT];
	bool outputs_closed;
	bool upstream_movable; /* the proxy's broker name has several addresses: a session may move to the next */
	struct tap_frames_sink frames_sink;
	struct tap_pcapng *pcap;
	struct tap_capture_sink pcap_sink;
	bool outputs_ready;
	int64_t min_window_us; /* the shortest timer the tracker can start */
	struct tap_track *track;
	struct tap_observer observer;
	struct tap_admin *admin; /* --metrics; NULL: off */
	int exit_code;
	char run[TAP_TRACK_RUN_MAX + 1]; /* this process's run id; "" in replay */
	int64_t started_us;
	struct tap_route_model *topology; /* --definitions or --management (app_outputs.c); NULL: none yet */
	struct tap_mgmt *mgmt;            /* --management's poller */
	bool mgmt_failing;                /* the last poll failed (said once until one succeeds) */
	bool topology_at_first;           /* a poll has succeeded (the first is said) */
	struct tap_metrics_topology topology_stats; /* reads and the model in use (loaded_us: when), for --metrics */
};

/* What stderr gets at exit on top of the outputs' flush time, for the summary. */
#define LOG_FLUSH_MS 500

int app_run_proxy(const struct tap_conf *conf);
int app_run_sniff(const struct tap_conf *conf);
int app_run_replay(const struct tap_conf *conf);
/* `amqptap route`: argv[0] is "route"; its own options (app_route.c). Returns the exit code. */
int app_run_route(int argc, char **argv);
/* --definitions: loads the file into a model and hands it to the tracker (at start: 0, or 2 with a line naming the
 * option); on SIGHUP the file is read again and replaces the model only when it loads whole (else the last good one
 * stays, and the failure is logged). */
int app_topology_load(struct app *app);
void app_topology_reload(struct app *app);
/* --management: starts polling on app->base (0, or 2 with a line naming the option). */
int app_topology_poll(struct app *app);
/* amqptap audit FILE... (its own options, argv[0] "audit"): the exit status. */
int app_run_audit(int argc, char **argv);

/* ---- app_outputs.c ---- */

/* Opens --verdicts, --frames and --pcap, creates the tracker and the observer. Returns 0, or an exit code after
 * printing why. */
int app_outputs_open(struct app *app);
/* Whether the mode ran when its outputs close: a run ends with the summary, a start that failed said why in one
 * line (not with a summary of nothing). */
enum app_end {
	APP_END_RAN,
	APP_END_START_FAILED,
};
/* Writes what is left until deadline_us, closes every output, prints the summary (APP_END_RAN) and names the
 * outputs that lost records. The tracker must be shut down first. Returns true when no record was lost. */
bool app_outputs_close(struct app *app, int64_t deadline_us, enum app_end end);
/* From now until deadline_us the outputs wait for room instead of dropping: nothing is forwarded any more (or
 * ever, in replay), and the records still to come are the last. */
void app_outputs_drain_until(struct app *app, int64_t deadline_us);
/* When what the outputs still hold must be written by once a live mode stops (tap_out_clock_us): TAP_OUT_FLUSH_MS
 * from now. */
int64_t app_outputs_stop_deadline(void);
/* Hands each output's batch to its writer (the 10 ms tick; a replay pipe that waits). */
void app_outputs_flush(struct app *app);
/* SIGHUP: every output opens its path again. */
void app_outputs_reopen(struct app *app);
/* The tracker's summary, each output's records and losses, the peak memory. With memory short it waits for the
 * log's reserve until wait_until_us (tap_out_clock_us; 0: not at all). */
void app_print_summary(struct app *app, int64_t wait_until_us);
/* One capture_drops record and its log line: `fresh` packets the kernel dropped since the last one, `total` in all. */
void app_report_drops(struct app *app, uint64_t fresh, uint64_t total, int64_t now_us);

/* ---- app_loop.c ---- */

/* What an address is resolved for: a listener's with AI_PASSIVE. */
enum app_resolve {
	APP_RESOLVE_TO_CONNECT,
	APP_RESOLVE_TO_LISTEN,
};
/* Resolves a once, at start, into up to max addresses (each once, in the resolver's order); *n is how many.
 * Returns 0, or the exit code: 1 when resolution failed for now (no answer from the name server, as at boot before
 * the network is up: a service manager should try again), 2 when the name does not exist (a mistake in the
 * configuration). */
int app_resolve(const struct tap_conf_addr *a, enum app_resolve use, struct sockaddr_storage *out, int *out_len,
		size_t max, size_t *n, char *err, size_t cap);
/* --metrics names a host that resolves, said before anything starts, and one on loopback for --fault-api without
 * --fault-api-token. Returns 0 or the exit code. */
int app_check_metrics_addr(const struct tap_conf *conf);
/* --metrics: the endpoint, and the tracker's hooks feeding its tally. Returns the exit code. */
int app_start_metrics(struct app *app, const struct tap_admin_sources *sources);
/* The tick (every 10 ms, on_tick(arg)) and the stderr writer, the last parts a running tap needs. Returns 0 or the
 * exit code (1) after saying why. */
int app_loop_start(struct app *app, event_callback_fn on_tick, void *arg);
/* The four signals go to on_signal(arg) from now on, until app_loop_free. */
void app_loop_add_signals(struct app *app, event_callback_fn on_signal, void *arg);
/* Runs the loop until it is ended (app_loop_exit); then the outputs wait for room until the returned deadline
 * (tap_out_clock_us), the one the modes' teardown writes by. */
int64_t app_loop_dispatch(struct app *app);
/* Ends the loop after this turn's callbacks; never lost to a failed allocation. */
void app_loop_exit(struct app *app);
/* The signals, the tick and the event base (the mode freed what of its own is on the base first). */
void app_loop_free(struct app *app);
/* Stops the log writer by deadline_us; log lines lost make the exit code 1 as records lost do. */
void app_log_stop(struct app *app, int64_t deadline_us);

#endif
