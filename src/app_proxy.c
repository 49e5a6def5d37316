/* The live proxy (the main job): clients connect to the tap, each gets its own connection to the broker, every byte
 * is forwarded at once and a copy goes to the connection's observer; signals stop it with grace, reopen the outputs
 * or print the summary. */
#include "app.h"

#include "amqptap/fault_http.h"
#include "amqptap/log.h"
#include "amqptap/proxy.h"
#include "amqptap/tls.h"

#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

struct proxy_app {
	struct app app;
	struct tap_proxy *proxy;
	struct tap_tls *tls;
	struct tap_fault_set faults; /* --fault; n 0: none */
	struct tap_fault_http *fault_http; /* --fault-api; NULL: off */
	struct event *grace_timer;
	int64_t next_deadline;      /* the tracker's next timer */
	unsigned closed_since_trim; /* sessions ended since the heap was last trimmed */
	uint64_t tracking_high;     /* the most tracking and decoder memory since the heap was last trimmed */
	int64_t last_close_us, last_trim_us;
	bool stopping;
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

/* 1,000 clients need 2,000 descriptors: lift the soft limit to the hard one. */
static void raise_fd_limit(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

static void *hook_open(void *ctx, uint64_t conn_id, const char *client, const char *upstream, int64_t now_us)
{
	struct proxy_app *pa = ctx;
	tap_log_verbose("conn %llu from %s to %s", (unsigned long long)conn_id, client, upstream);
	struct tap_conn *c = tap_conn_new(&pa->app.observer, conn_id, client, upstream, now_us);
	if (!c) /* counted by the tracker; the bytes are still forwarded */
		tap_log_error("conn %llu from %s: no memory to follow it: forwarded without records",
		              (unsigned long long)conn_id, client);
	return c;
}

static void hook_refused(void *ctx)
{
	struct proxy_app *pa = ctx;
	tap_track_conn_unfollowed(pa->app.track); /* no records, like a connection the tracker cannot follow */
	tap_log_error("a client connection was closed at once: no memory for its session");
}

/* Deadlines that passed are settled before new bytes are looked at, in the
 * same order replay settles them, so live and replay records agree. */
static void settle_deadlines(struct proxy_app *pa, int64_t now_us)
{
	if (now_us >= pa->next_deadline)
		pa->next_deadline = tap_track_tick(pa->app.track, now_us);
}

/* The tracker was handed a deadline at now_us: it is at least the shortest window away. */
static void deadline_from(struct proxy_app *pa, int64_t now_us)
{
	if (now_us + pa->app.min_window_us < pa->next_deadline)
		pa->next_deadline = now_us + pa->app.min_window_us;
}

static void hook_data(void *ctx, void *sess, enum tap_dir dir, const uint8_t *data, size_t len, int64_t now_us)
{
	struct proxy_app *pa = ctx;
	settle_deadlines(pa, now_us);
	if (sess)
		tap_conn_feed(sess, dir, data, len, now_us);
	deadline_from(pa, now_us); /* made by these bytes */
}

static void hook_upstream_moved(void *ctx, void *sess, const char *upstream)
{
	(void)ctx;
	tap_conn_upstream(sess, upstream);
}

static void hook_upstream_local(void *ctx, void *sess, uint64_t conn_id, const char *local)
{
	(void)ctx;
	tap_log_verbose("conn %llu connected to the broker from %s", (unsigned long long)conn_id, local);
	tap_conn_upstream_local(sess, local);
}

static void hook_held(void *ctx, void *sess, bool held, int64_t now_us)
{
	struct proxy_app *pa = ctx;
	tap_conn_held(sess, held ? TAP_TRACK_HELD : TAP_TRACK_UNHELD, now_us);
	if (!held)
		deadline_from(pa, now_us); /* the windows run again in full */
}

static void hook_fault_mark(void *ctx, void *sess, uint16_t ch, uint64_t seq, enum tap_fault_saw saw, uint32_t rule)
{
	(void)ctx;
	tap_conn_fault_mark(sess, ch, seq, saw, rule);
}

static void hook_fault_act(void *ctx, void *sess, uint64_t conn_id, const struct tap_fault_act *a, int64_t now_us)
{
	struct proxy_app *pa = ctx;
	settle_deadlines(pa, now_us);
	tap_log_verbose("conn %llu: --fault rule %u acted: %s on channel %u, publish %llu", (unsigned long long)conn_id,
			a->rule, tap_fault_action_name(a->action), a->channel, (unsigned long long)a->seq);
	tap_conn_fault(sess, a, now_us);
}

static void hook_close(void *ctx, void *sess, uint64_t conn_id, enum tap_proxy_end why, const char *detail,
		       int64_t now_us)
{
	struct proxy_app *pa = ctx;
	pa->closed_since_trim++;
	pa->last_close_us = now_us;
	tap_log_verbose("conn %llu closed: %s%s%s", (unsigned long long)conn_id, tap_proxy_end_name(why),
			detail ? ": " : "", detail ? detail : "");
	if (detail)
		tap_conn_note(sess, detail);
	tap_conn_end(sess, tap_proxy_end_name(why), now_us);
}


/* Tracking and decoder memory freed since the last trim that is worth handing back to the kernel. */
#define TRIM_AFTER_TRACKING_BYTES (16u << 20)

/* Return windows, late-return holds, and the 10 ms flush of the outputs. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct proxy_app *pa = arg;
	(void)fd;
	(void)what;
	int64_t now_us = tap_now_us();
	settle_deadlines(pa, now_us);
	app_outputs_flush(&pa->app);
	/* glibc keeps the heap pages of ended sessions (1,000 closed connections left about 24 MB resident):
	 * hand them back once a wave of closes is over (200 ms without one), or every 10 s under steady churn */
	bool wave_over = pa->closed_since_trim >= 64 &&
	                 (now_us - pa->last_close_us >= 200000 || now_us - pa->last_trim_us >= 10000000);
	/* the same after a burst of outstanding publishes or of contents in progress: the tracker and the decoder freed
	 * most of what they held */
	struct tap_track_stats st;
	tap_track_get_stats(pa->app.track, &st);
	uint64_t held = st.memory + pa->app.observer.pending_mem;
	if (held > pa->tracking_high)
		pa->tracking_high = held;
	bool burst_over = pa->tracking_high - held >= TRIM_AFTER_TRACKING_BYTES && held < pa->tracking_high / 2;
	if (wave_over || burst_over) {
		malloc_trim(0);
		pa->closed_since_trim = 0;
		pa->last_trim_us = now_us;
		pa->tracking_high = held;
	}
}


static void on_idle(void *arg)
{
	struct proxy_app *pa = arg;
	if (pa->stopping)
		app_loop_exit(&pa->app);
}

static void on_grace_over(evutil_socket_t fd, short what, void *arg)
{
	struct proxy_app *pa = arg;
	(void)fd;
	(void)what;
	tap_proxy_close_all(pa->proxy);
	app_loop_exit(&pa->app);
}

static void begin_shutdown(struct proxy_app *pa)
{
	if (pa->stopping) { /* a second signal: close everything now */
		on_grace_over(-1, 0, pa);
		return;
	}
	pa->stopping = true;
	tap_proxy_stop_accepting(pa->proxy);
	tap_admin_stopping(pa->app.admin);
	if (tap_proxy_active(pa->proxy) == 0) {
		app_loop_exit(&pa->app);
		return;
	}
	uint32_t grace_ms = pa->app.conf->grace_ms;
	tap_log_info("stopping; %zu session(s) get %u ms to finish", tap_proxy_active(pa->proxy), grace_ms);
	struct timeval tv = {grace_ms / 1000, (grace_ms % 1000) * 1000};
	pa->grace_timer = evtimer_new(pa->app.base, on_grace_over, pa);
	if (!pa->grace_timer || evtimer_add(pa->grace_timer, &tv) < 0)
		on_grace_over(-1, 0, pa); /* no memory for the timer: no grace, rather than no end */
}


static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct proxy_app *pa = arg;
	(void)what;
	switch (sig) {
	case SIGINT:
	case SIGTERM:
		begin_shutdown(pa);
		break;
	case SIGHUP:
		app_outputs_reopen(&pa->app);
		app_topology_reload(&pa->app);
		break;
	case SIGUSR1: {
		struct tap_proxy_stats st;
		tap_proxy_get_stats(pa->proxy, &st);
		tap_log_info("%llu connections accepted, %llu active, %llu unreachable, %llu bytes c2s, %llu s2c",
			(unsigned long long)st.accepted, (unsigned long long)st.active, (unsigned long long)st.unreachable,
			(unsigned long long)st.bytes_c2s, (unsigned long long)st.bytes_s2c);
		if (pa->app.conf->tls_cert || pa->app.conf->upstream_tls)
			tap_log_info("%llu TLS legs keeping their record buffers (busy in the last second)",
				     (unsigned long long)st.tls_busy_legs);
		app_print_summary(&pa->app, 0);
		break;
	}
	}
}

/* --fault: the rules in force from the start, each said on stderr (they make the tap lie to its clients). With
 * --fault-api every session has a rewriter from its start, rules or none, so that a rule added later acts on the
 * connections already open (forwarding through a rewriter without rules changes no byte). */
static int start_faults(struct proxy_app *pa)
{
	const struct tap_conf *conf = pa->app.conf;
	tap_fault_set_init(&pa->faults);
	for (size_t i = 0; i < conf->n_faults; i++) {
		struct tap_fault_rule r;
		char err[300];
		uint32_t id;
		if (tap_fault_parse(conf->faults[i], &r, err, sizeof err) ||
		    tap_fault_set_add(&pa->faults, &r, tap_now_us(), &id)) { /* parsed once in conf.c already */
			fprintf(stderr, "amqptap: %s\n", err);
			return 2;
		}
		tap_log_error("WARNING: --fault rule %u active: %s (clients are shown failures the broker did not cause)",
			      id, r.text);
	}
	if (pa->faults.n || conf->fault_api)
		tap_proxy_set_faults(pa->proxy, &pa->faults);
	if (!conf->fault_api)
		return 0;
	char err[400];
	int code = 0;
	pa->fault_http = tap_fault_http_new(pa->app.base, &pa->faults, conf->fault_api_token, err, sizeof err, &code);
	if (!pa->fault_http) {
		fprintf(stderr, "amqptap: %s\n", err);
		return code;
	}
	tap_log_error("WARNING: --fault-api: fault rules can be added at run time with POST /api/faults on --metrics "
		      "(%s); each change is said here", conf->fault_api_token ? "with the --fault-api-token token" : "no token: loopback only");
	return 0;
}

/* The proxy's parts that are on the event base, started: 0 or the exit code after saying why. */
static int start_proxy(struct proxy_app *pa, const struct sockaddr_storage *up, const int *up_len, size_t n_up,
		       const struct sockaddr_storage *lis, int lis_len, const char *upstream_name, char bound[80])
{
	const struct tap_conf *conf = pa->app.conf;
	struct tap_proxy_hooks hooks = {
	    .ctx = pa, .open = hook_open, .data = hook_data, .close = hook_close, .refused = hook_refused,
	    .held = hook_held, .upstream_moved = hook_upstream_moved, .upstream_local = hook_upstream_local,
	    .fault_mark = hook_fault_mark, .fault_act = hook_fault_act};
	if (pa->app.base)
		pa->proxy = tap_proxy_new(pa->app.base, (struct sockaddr *)&up[0], up_len[0], upstream_name, pa->tls,
					  &hooks);
	if (!pa->proxy) {
		int err = errno; /* EAGAIN: the one thread the proxy starts, the TLS listener's handshaker */
		fprintf(stderr, "amqptap: cannot start%s: %s\n",
		        err == EAGAIN && tap_tls_listener(pa->tls) ? " its TLS handshake thread" : "", strerror(err));
		return 1;
	}
	for (size_t i = 1; i < n_up; i++) /* the name's other addresses, for when one is unreachable */
		(void)tap_proxy_add_upstream(pa->proxy, (struct sockaddr *)&up[i], up_len[i]); /* fit: n_up <= max */
	tap_proxy_on_idle(pa->proxy, on_idle, pa);
	int code = start_faults(pa);
	if (code)
		return code;
	tap_proxy_set_handshake_timeout(pa->proxy, conf->handshake_timeout_ms);
	if (tap_proxy_listen(pa->proxy, (struct sockaddr *)lis, lis_len, bound, 80) < 0) {
		char shown[300];
		tap_conf_addr_format(&conf->listen, shown, sizeof shown);
		fprintf(stderr, "amqptap: --listen %s: %s\n", shown, strerror(errno));
		return 1;
	}
	if (conf->metrics.host[0]) {
		struct tap_admin_sources src = {
			.faults = pa->faults.n || conf->fault_api ? &pa->faults : NULL, .fault_http = pa->fault_http,
			.upstream_name = upstream_name, .track = pa->app.track, .proxy = pa->proxy,
			.observer = &pa->app.observer,
			.outputs = {pa->app.out[OUT_VERDICTS], pa->app.out[OUT_FRAMES], pa->app.out[OUT_PCAP]}};
		code = app_start_metrics(&pa->app, &src);
	}
	return code ? code : app_loop_start(&pa->app, on_tick, pa);
}

int app_run_proxy(const struct tap_conf *conf)
{
	char err[700];
	struct sockaddr_storage up[TAP_PROXY_UPSTREAM_ADDRS], lis;
	int up_len[TAP_PROXY_UPSTREAM_ADDRS], lis_len;
	size_t n_up, n_lis;
	int bad = app_resolve(&conf->upstream, APP_RESOLVE_TO_CONNECT, up, up_len, TAP_PROXY_UPSTREAM_ADDRS, &n_up, err,
			      sizeof err);
	if (bad) {
		fprintf(stderr, "amqptap: --upstream: %s\n", err);
		return bad;
	}
	if ((bad = app_resolve(&conf->listen, APP_RESOLVE_TO_LISTEN, &lis, &lis_len, 1, &n_lis, err, sizeof err))) {
		fprintf(stderr, "amqptap: --listen: %s\n", err);
		return bad;
	}
	if ((bad = app_check_metrics_addr(conf)))
		return bad;
	raise_fd_limit();
	keep_heap_warm();
	signal(SIGPIPE, SIG_IGN);

	struct proxy_app pa = {.app = {.conf = conf, .exit_code = 0, .upstream_movable = n_up > 1}};
	struct app *app = &pa.app;
	int code = 0;
	pa.tls = tap_tls_new(conf, err, sizeof err, &code);
	if (!pa.tls) {
		fprintf(stderr, "amqptap: %s\n", err);
		return code;
	}
	if (conf->upstream_insecure)
		fprintf(stderr, "amqptap: WARNING: --upstream-insecure: the broker's certificate is NOT verified; "
				"anyone on the path can read and change this traffic\n");
	code = app_outputs_open(app);
	app->base = code ? NULL : event_base_new();
	char upstream_name[300], bound[80];
	tap_conf_addr_format(&conf->upstream, upstream_name, sizeof upstream_name);
	if (!code)
		code = start_proxy(&pa, up, up_len, n_up, &lis, lis_len, upstream_name, bound);
	if (!code)
		code = app_topology_poll(app);
	if (code) {
		tap_admin_free(app->admin); /* its http thread asks fault_http */
		tap_fault_http_free(pa.fault_http);
		tap_proxy_free(pa.proxy);
		/* nothing was forwarded; the exit code says why */
		(void)app_outputs_close(app, app_outputs_stop_deadline(), APP_END_START_FAILED);
		app_loop_free(app);
		tap_tls_free(pa.tls);
		return code;
	}
	app_loop_add_signals(app, on_signal, &pa);
	tap_log_info("listening on %s, forwarding to %s%s%s", bound, upstream_name,
		     tap_tls_listener(pa.tls) ? " (TLS from clients)" : "", tap_tls_upstream(pa.tls) ? " (TLS to broker)" : "");

	int64_t deadline = app_loop_dispatch(app);

	tap_proxy_free(pa.proxy); /* ends what is left: reason "shutdown" */
	tap_track_shutdown(app->track, tap_now_us());
	if (!app_outputs_close(app, deadline, APP_END_RAN) && app->exit_code == 0)
		app->exit_code = 1;
	tap_admin_free(app->admin);
	tap_fault_http_free(pa.fault_http); /* after the http thread that asks it */
	if (pa.grace_timer)
		event_free(pa.grace_timer);
	app_loop_free(app);
	tap_tls_free(pa.tls);
	int64_t log_deadline = tap_out_clock_us() + LOG_FLUSH_MS * 1000;
	app_log_stop(app, log_deadline > deadline ? log_deadline : deadline); /* its losses were in the summary */
	return app->exit_code;
}
