/* amqptap: wiring of configuration, the forwarding engine, the decoders and
 * the verdict tracker, signals and the event loop. */
#include "amqptap/conf.h"
#include "amqptap/conn.h"
#include "amqptap/jsonl.h"
#include "amqptap/pcapng.h"
#include "amqptap/proxy.h"
#include "amqptap/replay.h"
#include "amqptap/status.h"
#include "amqptap/tls.h"
#include "amqptap/track.h"

#include <errno.h>
#include <event2/event.h>
#include <malloc.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

struct app {
	const struct tap_conf *conf;
	struct event_base *base;
	struct tap_proxy *proxy;
	struct event *sig_int, *sig_term, *sig_hup, *sig_usr1;
	struct event *grace_timer;
	struct event *tick_timer;
	struct tap_out verdicts;
	bool verdicts_on;
	struct tap_out frames;
	bool frames_on;
	struct tap_out pcap_out;
	bool pcap_on;
	struct tap_pcapng *pcap;
	struct tap_capture_sink pcap_sink;
	bool outputs_ready;
	int64_t next_deadline; /* the tracker's next timer */
	int64_t min_window_us; /* the shortest timer the tracker can start */
	struct tap_track *track;
	struct tap_tls *tls;
	struct tap_observer observer;
	unsigned closed_since_trim; /* sessions ended since the heap was last trimmed */
	int64_t last_close_us, last_trim_us;
	bool stopping;
	int exit_code;
};

/* Bulk traffic queues bytes in 256 KiB evbuffer chains that come and go all
 * the time. glibc's defaults serve those from fresh mmaps or trim them off
 * the heap top, so every chain is page-faulted in again: a quarter of the
 * tap's CPU with 1 MiB messages. Keep them on the heap and up to 4 MiB of
 * free heap top; malloc_trim after a wave of closes still gives it back. */
static void keep_heap_warm(void)
{
#ifdef M_MMAP_THRESHOLD
	mallopt(M_MMAP_THRESHOLD, 1024 * 1024);
	mallopt(M_TRIM_THRESHOLD, 4 * 1024 * 1024);
#endif
}

static int resolve(const struct tap_conf_addr *a, bool passive, struct sockaddr_storage *out, int *out_len,
		   char *err, size_t cap)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_protocol = IPPROTO_TCP};
	if (passive)
		hints.ai_flags = AI_PASSIVE;
	char port[8];
	snprintf(port, sizeof port, "%u", a->port);
	struct addrinfo *res = NULL;
	int rc = getaddrinfo(a->host, port, &hints, &res);
	if (rc != 0 || !res) {
		snprintf(err, cap, "cannot resolve '%s': %s", a->host, gai_strerror(rc));
		return -1;
	}
	memcpy(out, res->ai_addr, res->ai_addrlen);
	*out_len = (int)res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

/* 1,000 clients need 2,000 descriptors: lift the soft limit to the hard one. */
static void raise_fd_limit(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

static void emit_record(void *ctx, const char *json, size_t len)
{
	struct app *app = ctx;
	tap_out_line(&app->verdicts, json, len);
}

static void *hook_open(void *ctx, uint64_t conn_id, const char *client, const char *upstream, int64_t now_us)
{
	struct app *app = ctx;
	return tap_conn_new(&app->observer, conn_id, client, upstream, now_us);
}

/* Deadlines that passed are settled before new bytes are looked at, in the
 * same order replay settles them, so live and replay records agree. */
static void settle_deadlines(struct app *app, int64_t now_us)
{
	if (now_us >= app->next_deadline)
		app->next_deadline = tap_track_tick(app->track, now_us);
}

static void hook_data(void *ctx, void *sess, enum tap_dir dir, const uint8_t *data, size_t len, int64_t now_us)
{
	struct app *app = ctx;
	settle_deadlines(app, now_us);
	if (sess)
		tap_conn_feed(sess, dir, data, len, now_us);
	/* a deadline created by these bytes is at least the shortest window away */
	if (now_us + app->min_window_us < app->next_deadline)
		app->next_deadline = now_us + app->min_window_us;
}

static void hook_close(void *ctx, void *sess, enum tap_proxy_end why, const char *detail, int64_t now_us)
{
	struct app *app = ctx;
	app->closed_since_trim++;
	app->last_close_us = now_us;
	if (detail)
		tap_conn_note(sess, detail);
	tap_conn_end(sess, tap_proxy_end_name(why), now_us);
}

static void flush_outputs(struct app *app)
{
	tap_out_flush(&app->verdicts);
	if (app->frames_on)
		tap_out_flush(&app->frames);
	if (app->pcap_on)
		tap_out_flush(&app->pcap_out);
}

/* Return windows, late-return holds, and the 10 ms flush of the outputs. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct app *app = arg;
	(void)fd;
	(void)what;
	int64_t now_us = tap_now_us();
	settle_deadlines(app, now_us);
	flush_outputs(app);
	/* glibc keeps the heap pages of ended sessions (1,000 closed connections left about 24 MB resident):
	 * hand them back once a wave of closes is over (200 ms without one), or every 10 s under steady churn */
	if (app->closed_since_trim >= 64 &&
	    (now_us - app->last_close_us >= 200000 || now_us - app->last_trim_us >= 10000000)) {
		malloc_trim(0);
		app->closed_since_trim = 0;
		app->last_trim_us = now_us;
	}
}

static void print_summary(struct app *app)
{
	struct tap_buf b;
	tap_buf_init(&b);
	tap_track_summary(app->track, &b);
	if (b.len)
		fwrite(b.data, 1, b.len, stderr);
	tap_buf_deinit(&b);
}

static void reopen_outputs(struct app *app)
{
	if (tap_out_reopen(&app->verdicts) != TAP_OK)
		fprintf(stderr, "amqptap: --verdicts: cannot reopen: %s\n", strerror(errno));
	if (app->frames_on && tap_out_reopen(&app->frames) != TAP_OK)
		fprintf(stderr, "amqptap: --frames: cannot reopen: %s\n", strerror(errno));
	/* --pcap is not reopened: a pcapng file cannot continue without its header blocks */
}

static void on_idle(void *arg)
{
	struct app *app = arg;
	if (app->stopping)
		event_base_loopexit(app->base, NULL);
}

static void on_grace_over(evutil_socket_t fd, short what, void *arg)
{
	struct app *app = arg;
	(void)fd;
	(void)what;
	tap_proxy_close_all(app->proxy);
	event_base_loopexit(app->base, NULL);
}

static void begin_shutdown(struct app *app)
{
	if (app->stopping) { /* a second signal: close everything now */
		on_grace_over(-1, 0, app);
		return;
	}
	app->stopping = true;
	tap_proxy_stop_accepting(app->proxy);
	if (tap_proxy_active(app->proxy) == 0) {
		event_base_loopexit(app->base, NULL);
		return;
	}
	fprintf(stderr, "amqptap: stopping; %zu session(s) get %u ms to finish\n", tap_proxy_active(app->proxy),
		app->conf->grace_ms);
	struct timeval tv = {app->conf->grace_ms / 1000, (app->conf->grace_ms % 1000) * 1000};
	app->grace_timer = evtimer_new(app->base, on_grace_over, app);
	if (app->grace_timer)
		evtimer_add(app->grace_timer, &tv);
	else
		on_grace_over(-1, 0, app);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct app *app = arg;
	(void)what;
	switch (sig) {
	case SIGINT:
	case SIGTERM:
		begin_shutdown(app);
		break;
	case SIGHUP:
		reopen_outputs(app);
		break;
	case SIGUSR1: {
		struct tap_proxy_stats st;
		tap_proxy_get_stats(app->proxy, &st);
		fprintf(stderr, "amqptap: %llu connections accepted, %llu active, %llu unreachable, %llu bytes c2s, %llu s2c\n",
			(unsigned long long)st.accepted, (unsigned long long)st.active, (unsigned long long)st.unreachable,
			(unsigned long long)st.bytes_c2s, (unsigned long long)st.bytes_s2c);
		print_summary(app);
		break;
	}
	}
}

/* ---- outputs shared by the live proxy and replay ---- */

static void *pcap_open(void *ctx, uint64_t conn, const char *client, const char *server, int64_t ts_us)
{
	struct app *app = ctx;
	(void)conn;
	return tap_pcapng_conn_open(app->pcap, client, server, ts_us);
}

static void pcap_data(void *ctx, void *sc, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts_us)
{
	(void)ctx;
	tap_pcapng_conn_data(sc, dir, data, len, ts_us);
}

static void pcap_close(void *ctx, void *sc, int64_t ts_us)
{
	(void)ctx;
	tap_pcapng_conn_close(sc, ts_us);
}

/* Opens --verdicts, --frames and --pcap, creates the tracker and the
 * observer. Returns 0, or an exit code after printing why. */
static int outputs_open(struct app *app)
{
	const struct tap_conf *conf = app->conf;
	if (tap_out_open(&app->verdicts, conf->verdicts) != TAP_OK) {
		fprintf(stderr, "amqptap: --verdicts %s: %s\n", conf->verdicts, strerror(errno));
		return 2;
	}
	app->verdicts_on = true;
	if (conf->frames) {
		if (tap_out_open(&app->frames, conf->frames) != TAP_OK) {
			fprintf(stderr, "amqptap: --frames %s: %s\n", conf->frames, strerror(errno));
			return 2;
		}
		app->frames_on = true;
	}
	if (conf->pcap) {
		if (tap_out_open(&app->pcap_out, conf->pcap) != TAP_OK) {
			fprintf(stderr, "amqptap: --pcap %s: %s\n", conf->pcap, strerror(errno));
			return 2;
		}
		app->pcap_on = true;
		app->pcap = tap_pcapng_new(&app->pcap_out);
		if (!app->pcap) {
			fprintf(stderr, "amqptap: out of memory at start\n");
			return 1;
		}
		app->pcap_sink = (struct tap_capture_sink){app, pcap_open, pcap_data, pcap_close};
	}
	struct tap_track_conf tconf = {
		.return_window_us = (int64_t)conf->return_window_ms * 1000,
		.late_return_us = (int64_t)conf->late_return_ms * 1000,
		.max_outstanding = conf->max_outstanding,
	};
	app->track = tap_track_new(&tconf, emit_record, app);
	app->min_window_us = tconf.late_return_us < tconf.return_window_us ? tconf.late_return_us : tconf.return_window_us;
	if (!app->track) {
		fprintf(stderr, "amqptap: out of memory at start\n");
		return 1;
	}
	tap_observer_init(&app->observer, app->track, emit_record, app, app->frames_on ? &app->frames : NULL,
			  conf->body_bytes);
	if (app->pcap)
		app->observer.capture = &app->pcap_sink;
	app->outputs_ready = true;
	return 0;
}

/* Flushes and closes every output; the tracker must be shut down first. */
static void outputs_close(struct app *app)
{
	if (app->outputs_ready) {
		print_summary(app);
		tap_observer_deinit(&app->observer);
	}
	tap_track_free(app->track);
	app->track = NULL;
	tap_pcapng_free(app->pcap);
	app->pcap = NULL;
	if (app->pcap_on)
		tap_out_close(&app->pcap_out);
	if (app->frames_on)
		tap_out_close(&app->frames);
	if (app->verdicts_on)
		tap_out_close(&app->verdicts);
}

static int run_replay(const struct tap_conf *conf)
{
	struct app app = {.conf = conf};
	int code = outputs_open(&app);
	if (code == 0) {
		char err[512];
		int rc = tap_replay_run(conf->replay_file, (uint16_t)conf->replay_port, &app.observer, app.track, err,
					sizeof err);
		if (rc != TAP_OK) {
			fprintf(stderr, "amqptap: replay %s\n", err);
			code = 1;
		}
	}
	outputs_close(&app);
	return code;
}

static int run_proxy(const struct tap_conf *conf)
{
	char err[700];
	struct sockaddr_storage up, lis;
	int up_len, lis_len;
	if (resolve(&conf->upstream, false, &up, &up_len, err, sizeof err) < 0) {
		fprintf(stderr, "amqptap: --upstream: %s\n", err);
		return 2;
	}
	if (resolve(&conf->listen, true, &lis, &lis_len, err, sizeof err) < 0) {
		fprintf(stderr, "amqptap: --listen: %s\n", err);
		return 2;
	}
	raise_fd_limit();
	keep_heap_warm();
	signal(SIGPIPE, SIG_IGN);

	struct app app = {.conf = conf, .exit_code = 0};
	int code = 0;
	app.tls = tap_tls_new(conf, err, sizeof err, &code);
	if (!app.tls) {
		fprintf(stderr, "amqptap: %s\n", err);
		return code;
	}
	if (conf->upstream_insecure)
		fprintf(stderr, "amqptap: WARNING: --upstream-insecure: the broker's certificate is NOT verified; "
				"anyone on the path can read and change this traffic\n");
	code = outputs_open(&app);
	app.base = code ? NULL : event_base_new();
	char upstream_name[300];
	tap_conf_addr_format(&conf->upstream, upstream_name, sizeof upstream_name);
	struct tap_proxy_hooks hooks = {.ctx = &app, .open = hook_open, .data = hook_data, .close = hook_close};
	if (app.base)
		app.proxy = tap_proxy_new(app.base, (struct sockaddr *)&up, up_len, upstream_name, app.tls, &hooks);
	if (app.proxy)
		tap_proxy_on_idle(app.proxy, on_idle, &app);
	if (app.proxy)
		tap_proxy_set_handshake_timeout(app.proxy, conf->handshake_timeout_ms);
	char bound[80];
	if (!code && !app.proxy) {
		fprintf(stderr, "amqptap: cannot start: %s\n", strerror(errno));
		code = 1;
	} else if (!code && tap_proxy_listen(app.proxy, (struct sockaddr *)&lis, lis_len, bound, sizeof bound) < 0) {
		char shown[300];
		tap_conf_addr_format(&conf->listen, shown, sizeof shown);
		fprintf(stderr, "amqptap: --listen %s: %s\n", shown, strerror(errno));
		code = 1;
	}
	if (code) {
		tap_proxy_free(app.proxy);
		outputs_close(&app);
		if (app.base)
			event_base_free(app.base);
		tap_tls_free(app.tls);
		return code;
	}
	app.sig_int = evsignal_new(app.base, SIGINT, on_signal, &app);
	app.sig_term = evsignal_new(app.base, SIGTERM, on_signal, &app);
	app.sig_hup = evsignal_new(app.base, SIGHUP, on_signal, &app);
	app.sig_usr1 = evsignal_new(app.base, SIGUSR1, on_signal, &app);
	struct event *sigs[] = {app.sig_int, app.sig_term, app.sig_hup, app.sig_usr1};
	for (size_t i = 0; i < 4; i++)
		if (sigs[i])
			evsignal_add(sigs[i], NULL);
	app.tick_timer = event_new(app.base, -1, EV_PERSIST, on_tick, &app);
	struct timeval tick = {0, 10000};
	if (app.tick_timer)
		evtimer_add(app.tick_timer, &tick);
	fprintf(stderr, "amqptap: listening on %s, forwarding to %s%s%s\n", bound, upstream_name,
		tap_tls_listener(app.tls) ? " (TLS from clients)" : "", tap_tls_upstream(app.tls) ? " (TLS to broker)" : "");

	event_base_dispatch(app.base);

	tap_proxy_free(app.proxy); /* ends what is left: reason "shutdown" */
	tap_track_shutdown(app.track, tap_now_us());
	outputs_close(&app);
	for (size_t i = 0; i < 4; i++)
		if (sigs[i])
			event_free(sigs[i]);
	if (app.grace_timer)
		event_free(app.grace_timer);
	if (app.tick_timer)
		event_free(app.tick_timer);
	event_base_free(app.base);
	tap_tls_free(app.tls);
	return app.exit_code;
}

int main(int argc, char **argv)
{
	struct tap_conf conf;
	char err[400];
	tap_conf_defaults(&conf);
	if (tap_conf_parse(&conf, argc, argv, err, sizeof err) != TAP_OK) {
		fprintf(stderr, "amqptap: %s\n", err);
		return 2;
	}
	switch (conf.mode) {
	case TAP_MODE_HELP: {
		char usage[4096];
		tap_conf_usage(usage, sizeof usage);
		fputs(usage, stdout);
		return 0;
	}
	case TAP_MODE_VERSION:
		printf("amqptap %s\n", TAP_VERSION);
		return 0;
	case TAP_MODE_REPLAY:
		return run_replay(&conf);
	case TAP_MODE_PROXY:
		break;
	}
	return run_proxy(&conf);
}
