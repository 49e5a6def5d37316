/* What the live modes (proxy, sniff) share around their event loop: resolving the addresses they are given, the
 * --metrics endpoint, the tick and the stderr writer, the signal events, the loop's end and its teardown. */
#include "app.h"

#include "amqptap/log.h"
#include "amqptap/metrics.h"

#include <errno.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

int app_resolve(const struct tap_conf_addr *a, enum app_resolve use, struct sockaddr_storage *out, int *out_len,
		size_t max, size_t *n, char *err, size_t cap)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_protocol = IPPROTO_TCP};
	if (use == APP_RESOLVE_TO_LISTEN)
		hints.ai_flags = AI_PASSIVE;
	char port[8];
	snprintf(port, sizeof port, "%u", a->port);
	struct addrinfo *res = NULL;
	int rc = getaddrinfo(a->host, port, &hints, &res);
	if (rc != 0 || !res) {
		bool for_now = rc == EAI_AGAIN || rc == EAI_FAIL || rc == EAI_MEMORY || rc == EAI_SYSTEM;
		snprintf(err, cap, "cannot resolve '%s': %s%s", a->host, rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc),
			 for_now ? " (for now: exit 1, so that a service manager starts the tap again)" : "");
		return for_now ? 1 : 2;
	}
	*n = 0;
	for (struct addrinfo *r = res; r && *n < max; r = r->ai_next) {
		bool skip = r->ai_addrlen > sizeof *out; /* too long to keep (never for TCP), or kept already */
		for (size_t k = 0; k < *n && !skip; k++)
			skip = out_len[k] == (int)r->ai_addrlen && memcmp(&out[k], r->ai_addr, r->ai_addrlen) == 0;
		if (skip)
			continue;
		memcpy(&out[*n], r->ai_addr, r->ai_addrlen);
		out_len[(*n)++] = (int)r->ai_addrlen;
	}
	freeaddrinfo(res);
	return 0;
}

/* libevent would resolve it itself, later, with a warning of its own and no reason. */
static bool is_loopback(const struct sockaddr_storage *ss)
{
	if (ss->ss_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
	if (ss->ss_family != AF_INET6)
		return false;
	const struct in6_addr *a6 = &((const struct sockaddr_in6 *)ss)->sin6_addr;
	return IN6_IS_ADDR_LOOPBACK(a6) || (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127);
}

int app_check_metrics_addr(const struct tap_conf *conf)
{
	if (!conf->metrics.host[0])
		return 0;
	struct sockaddr_storage ss[8];
	int len[8];
	char err[400];
	size_t n;
	int bad = app_resolve(&conf->metrics, APP_RESOLVE_TO_LISTEN, ss, len, 8, &n, err, sizeof err);
	if (bad) {
		fprintf(stderr, "amqptap: --metrics: %s\n", err);
		return bad;
	}
	/* --fault-api makes the tap lie to its clients: off loopback only for whoever holds the token (every address
	 * the name has, as the one the endpoint binds is the resolver's first) */
	for (size_t i = 0; i < n && conf->fault_api && !conf->fault_api_token; i++) {
		if (is_loopback(&ss[i]))
			continue;
		char shown[300];
		tap_conf_addr_format(&conf->metrics, shown, sizeof shown);
		fprintf(stderr, "amqptap: --fault-api: --metrics %s is not on loopback: give --fault-api-token FILE (whoever "
			"reaches the endpoint could make the tap fail its clients)\n", shown);
		return 2;
	}
	return 0;
}

int app_start_metrics(struct app *app, const struct tap_admin_sources *sources)
{
	char metrics_at[80], err[400];
	struct tap_admin_sources src = *sources;
	src.tap_id = app->conf->tap_id;
	src.run = app->run;
	src.hosts = app->conf->metrics_hosts;
	src.topology = &app->topology_stats;
	app->admin = tap_admin_new(app->base, &app->conf->metrics, &src, metrics_at, sizeof metrics_at, err, sizeof err);
	if (!app->admin) {
		tap_log_error("%s", err);
		return 1;
	}
	tap_log_info("metrics on http://%s/", metrics_at);
	tap_track_set_verdict_hook(app->track, tap_metrics_tally_verdict, tap_admin_tally(app->admin));
	tap_track_set_conn_hook(app->track, tap_metrics_tally_conn, tap_admin_tally(app->admin));
	tap_track_set_missing_hook(app->track, tap_metrics_tally_missing, tap_admin_tally(app->admin));
	tap_consume_set_delivery_hook(app->track, tap_metrics_tally_delivery, tap_admin_tally(app->admin));
	return 0;
}

/* libevent's loopexit needs memory (a timer); without it the loop is broken at once, which needs none: a stop must
 * never be lost to a failed allocation (the tap ran on, ignoring the SIGTERM). */
void app_loop_exit(struct app *app)
{
	if (event_base_loopexit(app->base, NULL) != 0)
		(void)event_base_loopbreak(app->base);
}

/* libevent gives a signal back, when its event is freed, the action it had when the event was added; for these four
 * the default action is to die. Once the loop has ended the tap is stopping anyway and what is left of its teardown
 * is bounded by the flush deadlines, so a late signal (a supervisor repeating its SIGTERM, a stop sent just as the
 * last session ended) must not kill it with the last log lines unwritten and its exit status lost: the action to
 * be given back is "ignore". The signals are blocked meanwhile (one that comes stays pending and reaches libevent),
 * and a signal whose event could not be added keeps its default action: it still ends the tap. */
static void add_signal_events(struct event **sigs, size_t n)
{
	sigset_t set, was;
	sigemptyset(&set);
	for (size_t i = 0; i < n; i++)
		if (sigs[i])
			sigaddset(&set, event_get_signal(sigs[i]));
	pthread_sigmask(SIG_BLOCK, &set, &was);
	for (size_t i = 0; i < n; i++) {
		if (!sigs[i])
			continue;
		int sig = event_get_signal(sigs[i]);
		signal(sig, SIG_IGN);
		if (evsignal_add(sigs[i], NULL) < 0)
			signal(sig, SIG_DFL);
	}
	pthread_sigmask(SIG_SETMASK, &was, NULL);
}

void app_loop_add_signals(struct app *app, event_callback_fn on_signal, void *arg)
{
	static const int nums[APP_N_SIGNALS] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
	for (size_t i = 0; i < APP_N_SIGNALS; i++)
		app->sigs[i] = evsignal_new(app->base, nums[i], on_signal, arg);
	add_signal_events(app->sigs, APP_N_SIGNALS);
}

int64_t app_loop_dispatch(struct app *app)
{
	event_base_dispatch(app->base);
	int64_t deadline = app_outputs_stop_deadline();
	app_outputs_drain_until(app, deadline);
	return deadline;
}

void app_loop_free(struct app *app)
{
	for (size_t i = 0; i < APP_N_SIGNALS; i++)
		if (app->sigs[i])
			event_free(app->sigs[i]);
	if (app->tick_timer)
		event_free(app->tick_timer);
	if (app->base)
		event_base_free(app->base);
}

/* The tick runs deadlines, flushes and metrics; without the stderr writer a log line written while stderr lags
 * would hold the event loop up. Without either the tap does not start. */
int app_loop_start(struct app *app, event_callback_fn on_tick, void *arg)
{
	struct timeval tick = {0, 10000};
	app->tick_timer = event_new(app->base, -1, EV_PERSIST, on_tick, arg);
	if (!app->tick_timer || evtimer_add(app->tick_timer, &tick) != 0) {
		fprintf(stderr, "amqptap: cannot start: no memory for its timer\n");
		return 1;
	}
	if (tap_log_start() != 0) {
		fprintf(stderr, "amqptap: cannot start the stderr writer: %s\n", strerror(errno));
		return 1;
	}
	return 0;
}

void app_log_stop(struct app *app, int64_t deadline_us)
{
	(void)tap_log_stop(deadline_us);
	if (tap_log_lost() && app->exit_code == 0)
		app->exit_code = 1;
}

