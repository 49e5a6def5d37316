/* amqptap sniff: a passive capture (libpcap) of the broker's ports on one interface, its packets reassembled and
 * decoded as a replay decodes a capture, with the packets' clock; the kernel's drops are reported as they happen. */
#include "app.h"

#include "amqptap/log.h"
#include "amqptap/replay.h"
#include "amqptap/sniff.h"
#include "amqptap/status.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

struct sniff_app {
	struct app app;
	struct tap_sniff *sniff;
	struct tap_replay_live *live; /* where the captured packets go */
	uint64_t drops_reported;      /* kernel drops already written as capture_drops records */
	int64_t drops_reported_us;    /* when the last capture_drops record was written */
};

/* When drops are looked at: at most every DROPS_REPORT_US while the capture runs, and once more at its end. */
enum drops_look {
	DROPS_WHILE_RUNNING,
	DROPS_AT_END,
};

/* Kernel or interface drops since the last look become one capture_drops record and a log line. */
#define DROPS_REPORT_US 1000000
static void report_drops(struct sniff_app *sa, int64_t now_us, enum drops_look look)
{
	if (look == DROPS_WHILE_RUNNING && now_us - sa->drops_reported_us < DROPS_REPORT_US)
		return; /* a lasting loss: one record and one line a second, not one per tick */
	struct tap_sniff_stats st;
	tap_sniff_get_stats(sa->sniff, &st);
	if (st.dropped <= sa->drops_reported)
		return;
	sa->drops_reported_us = now_us;
	uint64_t fresh = st.dropped - sa->drops_reported;
	sa->drops_reported = st.dropped;
	app_report_drops(&sa->app, fresh, st.dropped, now_us);
}

static void on_sniff_tick(evutil_socket_t fd, short what, void *arg)
{
	struct sniff_app *sa = arg;
	(void)fd;
	(void)what;
	int64_t now_us = tap_now_us();
	/* the packets' clock drives the tracker; a quiet capture's clock is moved on here, behind what may still
	 * be coming, so that a verdict held for a window is written once the window is over, not at the next packet */
	tap_sniff_read(sa->sniff);
	tap_replay_live_advance(sa->live, now_us - TAP_SNIFF_LAG_US);
	report_drops(sa, now_us, DROPS_WHILE_RUNNING);
	app_outputs_flush(&sa->app);
}

static void on_sniff_signal(evutil_socket_t sig, short what, void *arg)
{
	struct sniff_app *sa = arg;
	(void)what;
	if (sig == SIGINT || sig == SIGTERM) {
		app_loop_exit(&sa->app);
	} else if (sig == SIGHUP) {
		app_outputs_reopen(&sa->app);
		app_topology_reload(&sa->app);
	} else if (sig == SIGUSR1) {
		struct tap_sniff_stats st;
		tap_sniff_get_stats(sa->sniff, &st);
		tap_log_info("%" PRIu64 " packets captured (%" PRIu64 " queued by the kernel), %" PRIu64
			     " dropped by the kernel", st.packets, st.received, st.dropped);
		app_print_summary(&sa->app, 0);
	}
}

/* The parts after the capture: the outputs, where the packets go, --metrics, the tick. 0 or the exit code. */
static int start_sniff(struct sniff_app *sa)
{
	const struct tap_conf *conf = sa->app.conf;
	int code = app_outputs_open(&sa->app);
	if (!code && tap_replay_live_new(&sa->live, conf->ports, conf->n_ports, sa->app.min_window_us,
					 &sa->app.observer, sa->app.track) != TAP_OK) {
		fprintf(stderr, "amqptap: cannot start: out of memory\n");
		code = 1;
	}
	if (!code)
		tap_sniff_attach(sa->sniff, sa->live);
	char capture_name[300];
	int at = snprintf(capture_name, sizeof capture_name, "capture on %s, port", conf->interface);
	for (size_t i = 0; i < conf->n_ports && at > 0 && (size_t)at < sizeof capture_name; i++)
		at += snprintf(capture_name + at, sizeof capture_name - (size_t)at, "%s %u", i ? "," : "", conf->ports[i]);
	if (!code && conf->metrics.host[0]) {
		struct tap_admin_sources src = {
			.upstream_name = capture_name, .track = sa->app.track, .observer = &sa->app.observer,
			.sniff = sa->sniff,
			.outputs = {sa->app.out[OUT_VERDICTS], sa->app.out[OUT_FRAMES], sa->app.out[OUT_PCAP]}};
		code = app_start_metrics(&sa->app, &src);
	}
	if (!code)
		code = app_topology_poll(&sa->app);
	return code ? code : app_loop_start(&sa->app, on_sniff_tick, sa);
}

int app_run_sniff(const struct tap_conf *conf)
{
	signal(SIGPIPE, SIG_IGN);
	struct sniff_app sa = {.app = {.conf = conf}};
	struct app *app = &sa.app;
	char err[400];
	int code = app_check_metrics_addr(conf);
	if (code)
		return code;
	app->base = event_base_new();
	if (!app->base) {
		fprintf(stderr, "amqptap: cannot start: %s\n", strerror(errno));
		return 1;
	}
	/* the capture first: a missing interface or permission is one line, before any output exists */
	sa.sniff = tap_sniff_new(app->base, conf->interface, conf->ports, conf->n_ports, conf->buffer_kib, err,
				 sizeof err, &code);
	if (!sa.sniff) {
		fprintf(stderr, "amqptap: %s\n", err);
		app_loop_free(app);
		return code;
	}
	code = start_sniff(&sa);
	if (code) {
		tap_admin_free(app->admin);
		tap_sniff_free(sa.sniff);
		tap_replay_live_end(sa.live, tap_now_us(), NULL);
		(void)app_outputs_close(app, app_outputs_stop_deadline(), APP_END_START_FAILED);
		app_loop_free(app);
		return code;
	}
	app_loop_add_signals(app, on_sniff_signal, &sa);
	tap_log_info("sniffing on %s (link type %s), filter: %s", conf->interface, tap_sniff_link_name(sa.sniff),
		     tap_sniff_filter(sa.sniff));

	int64_t deadline = app_loop_dispatch(app);

	report_drops(&sa, tap_now_us(), DROPS_AT_END);
	if (tap_sniff_failed(sa.sniff) && app->exit_code == 0)
		app->exit_code = 1;
	struct tap_replay_stats rs;
	tap_replay_live_end(sa.live, tap_now_us(), &rs);
	if (rs.gaps > 0)
		tap_log_error("capture gaps: %" PRIu64 " (%" PRIu64 " bytes missing); the publishes they may have "
			      "affected are written route unknown, by capture_gap", rs.gaps, rs.gap_bytes);
	if (!app_outputs_close(app, deadline, APP_END_RAN) && app->exit_code == 0)
		app->exit_code = 1;
	tap_admin_free(app->admin); /* it reads the capture: before that goes */
	tap_sniff_free(sa.sniff);
	app_loop_free(app);
	app_log_stop(app, tap_out_clock_us() + LOG_FLUSH_MS * 1000);
	return app->exit_code;
}
