/* amqptap replay: a recorded capture (a file, a FIFO or standard input, src/io/capfile.c) run through the same
 * observers and tracker as live traffic with the capture's timestamps as the clock (src/core/replay.c); signals end
 * it where it is read to, reopen the outputs or print the summary. */
#include "app.h"

#include "amqptap/capfile.h"
#include "amqptap/replay.h"
#include "amqptap/status.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>

/* Replay from a pipe waits for packets: what the outputs batched goes out meanwhile (a live view). */
static void replay_idle(void *ctx)
{
	app_outputs_flush(ctx);
}

static int64_t replay_clock(void *ctx)
{
	(void)ctx;
	return tap_now_us();
}

/* SIGINT or SIGTERM during a replay (Ctrl-C ends `tcpdump -U -w - | amqptap replay -`): the capture ends where it
 * is read to, as at its end, so every record is still written. A second signal kills (SA_RESETHAND). SIGHUP and
 * SIGUSR1 do what they do for the proxy (reopen the outputs, print the summary) at the next packet or wait. */
static volatile sig_atomic_t replay_stop_signal, replay_hup, replay_usr1;

static void on_replay_signal(int sig)
{
	if (sig == SIGHUP)
		replay_hup = 1;
	else if (sig == SIGUSR1)
		replay_usr1 = 1;
	else
		replay_stop_signal = sig;
}

static bool replay_stop(void *ctx)
{
	struct app *app = ctx;
	if (replay_hup) {
		replay_hup = 0;
		app_outputs_reopen(app);
		app_topology_reload(app);
	}
	if (replay_usr1) {
		replay_usr1 = 0;
		app_print_summary(app, 0);
	}
	return replay_stop_signal != 0;
}

/* What a replay that found little may have been given wrong: the port (the capture's TCP is on others), or a snap
 * length that cut the packets (their ends are gaps). A capture that ends in a broken block (rc, the replay's
 * status, not TAP_OK) has its own error line, and a connection cut off before the broker's first byte is no sign of
 * a one-way capture. */
static void replay_hints(const struct tap_conf *conf, const struct tap_capture_stats *st, int rc)
{
	if (st->tcp_packets == 0 && st->other_tcp > 0) {
		char ports[200] = "";
		size_t at = 0;
		for (size_t i = 0; i < TAP_CAPTURE_OTHER_PORTS && st->other_ports[i].segments && at < sizeof ports; i++) {
			int w = snprintf(ports + at, sizeof ports - at, "%s%u (%" PRIu64 " segments)", i ? ", " : "",
					 st->other_ports[i].port, st->other_ports[i].segments);
			at += w > 0 ? (size_t)w : 0;
		}
		fprintf(stderr, "amqptap: replay: no TCP on port%s %u%s of the capture's %" PRIu64 " packets; its TCP is "
			"on port %s: give the broker's with --port\n", conf->n_ports > 1 ? "s" : "", conf->ports[0],
			conf->n_ports > 1 ? ", ..." : "", st->packets, ports);
	}
	if (st->cut_short > 0)
		fprintf(stderr, "amqptap: replay: %" PRIu64 " packet(s) were cut short by the capture's snap length (what "
			"they lost is a gap): capture whole packets (tcpdump -s 0)\n", st->cut_short);
	if (st->unknown_link > 0)
		fprintf(stderr, "amqptap: replay: %" PRIu64 " packet(s) have link type %" PRIu32 ", which amqptap does not "
			"read (Ethernet, Linux cooked SLL/SLL2, loopback, raw IP): nothing of them was decoded\n",
			st->unknown_link, st->unknown_linktype);
	if (st->clock_steps > 0 || st->clock_back > 0)
		fprintf(stderr, "amqptap: replay: the capture's time jumped forward by %.0f minutes or more %" PRIu64
			" time(s) and went back by a second or more at %" PRIu64 " packet(s) (captures of hosts whose clocks "
			"differ merged, or a clock stepped): latencies across a jump are not meaningful, and no connection "
			"was ended as idle across one\n", TAP_CAPTURE_IDLE_US_DEFAULT / 60e6, st->clock_steps, st->clock_back);
	if (st->one_way > 0 && rc == TAP_OK)
		fprintf(stderr, "amqptap: replay: %" PRIu64 " connection(s) had client bytes and not one byte from the "
			"broker: was only one direction captured? Their publishes could get no answer\n", st->one_way);
	if (st->fragments > 0)
		fprintf(stderr, "amqptap: replay: %" PRIu64 " packet(s) were IP fragments, which amqptap does not "
			"reassemble: what they carried is a gap\n", st->fragments);
}


/* The capture opened (a FIFO waits for its writer: a signal may stop that) and replayed: 0 or the exit code. */
static int replay_file(struct app *app)
{
	const struct tap_conf *conf = app->conf;
	char err[512];
	struct tap_replay_stats rs = {0};
	struct tap_replay_hooks hooks = {
		.ctx = app, .idle = replay_idle, .clock = replay_clock, .stop = replay_stop, .ports = conf->ports + 1,
		.n_ports = conf->n_ports - 1, .min_window_us = app->min_window_us,
	};
	struct tap_capture *c;
	int rc = tap_capfile_open_until(&c, conf->replay_file, replay_stop, app, err, sizeof err);
	if (rc == TAP_OK) {
		rc = tap_replay_capture(c, conf->ports[0], &app->observer, app->track, &hooks, &rs, err, sizeof err);
		tap_capture_free(c);
	}
	replay_hints(conf, &rs.capture, rc);
	if (replay_stop_signal)
		fprintf(stderr, "amqptap: replay stopped by %s: the records of what was read are written, and the "
			"connections still open end as capture_end\n", replay_stop_signal == SIGINT ? "SIGINT" : "SIGTERM");
	if (rs.gaps > 0)
		fprintf(stderr, "amqptap: capture gaps: %" PRIu64 " (%" PRIu64 " bytes missing); the publishes they "
			"may have affected are written route unknown, by capture_gap\n", rs.gaps, rs.gap_bytes);
	if (rc != TAP_OK) {
		fprintf(stderr, "amqptap: replay %s\n", err);
		return 1;
	}
	return 0;
}

int app_run_replay(const struct tap_conf *conf)
{
	struct app app = {.conf = conf};
	int code = app_outputs_open(&app);
	app_outputs_drain_until(&app, INT64_MAX);
	/* no SA_RESTART: a read waiting on a pipe returns, and the capture asks replay_stop */
	struct sigaction sa = {.sa_handler = on_replay_signal, .sa_flags = SA_RESETHAND};
	sigemptyset(&sa.sa_mask);
	(void)sigaction(SIGINT, &sa, NULL);
	(void)sigaction(SIGTERM, &sa, NULL);
	sa.sa_flags = 0;
	(void)sigaction(SIGHUP, &sa, NULL);
	(void)sigaction(SIGUSR1, &sa, NULL);
	enum app_end end = code == 0 ? APP_END_RAN : APP_END_START_FAILED;
	if (end == APP_END_RAN)
		code = replay_file(&app);
	if (!app_outputs_close(&app, INT64_MAX, end) && code == 0)
		code = 1;
	return code;
}
