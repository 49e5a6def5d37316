/* The proxy: its listener, its upstream addresses, setting it up and
 * freeing it. What happens to each accepted client is session.c's; see
 * proxy_int.h for how the engine's files call one another. */
#include "proxy_int.h"

#include "amqptap/log.h"
#include "amqptap/tls.h"

#include <errno.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>


static const char *const end_names[] = {
	[TAP_END_CLIENT_EOF] = "client_eof",     [TAP_END_BROKER_EOF] = "broker_eof",
	[TAP_END_CLIENT_RESET] = "client_reset", [TAP_END_BROKER_RESET] = "broker_reset",
	[TAP_END_UNREACHABLE] = "unreachable",   [TAP_END_SHUTDOWN] = "shutdown",
	[TAP_END_CLIENT_TLS] = "client_tls_error", [TAP_END_BROKER_TLS] = "broker_tls_error",
	[TAP_END_FD_LIMIT] = "tap_fd_limit",     [TAP_END_NO_MEMORY] = "tap_no_memory",
	[TAP_END_FAULT] = "tap_fault",
};

const char *tap_proxy_end_name(enum tap_proxy_end why)
{
	return (unsigned)why < sizeof end_names / sizeof end_names[0] ? end_names[why] : "unknown";
}

static void on_accept(struct evconnlistener *listener, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
	(void)listener;
	(void)salen;
	tap_session_accept(arg, fd, sa);
}

static void on_accept_error(struct evconnlistener *l, void *arg)
{
	(void)l;
	tap_session_accept_failed(arg, EVUTIL_SOCKET_ERROR());
}

struct tap_proxy *tap_proxy_new(struct event_base *base, const struct sockaddr *upstream, int upstream_len,
				const char *upstream_name, struct tap_tls *tls, const struct tap_proxy_hooks *hooks)
{
	if (upstream_len <= 0 || (size_t)upstream_len > sizeof(struct sockaddr_storage)) {
		errno = EINVAL;
		return NULL;
	}
	struct tap_proxy *px = calloc(1, sizeof *px);
	if (!px)
		return NULL;
	px->base = base;
	px->tls = tls;
	px->scratch = malloc(TAP_PROXY_MAX_IO);
	px->up = &tap_session_up;
	px->readable = tap_relay_readable;
	px->read = tap_relay_read;
	px->resume_accept = evtimer_new(base, tap_session_on_resume_accept, px);
	px->shortage_over = evtimer_new(base, tap_session_on_shortage_over, px);
	if (!px->scratch || !px->resume_accept || !px->shortage_over || tap_tls_proxy_init(px) < 0) {
		if (px->resume_accept)
			event_free(px->resume_accept);
		if (px->shortage_over)
			event_free(px->shortage_over);
		tap_tls_proxy_free(px);
		free(px->scratch);
		free(px);
		return NULL;
	}
	snprintf(px->upstream_name, sizeof px->upstream_name, "%s", upstream_name);
	(void)tap_proxy_add_upstream(px, upstream, upstream_len); /* the first: fits, and its length was checked */
	tap_session_use_upstream(px, 0);
	if (hooks)
		px->hooks = *hooks;
	TAILQ_INIT(&px->sessions);
	return px;
}

int tap_proxy_add_upstream(struct tap_proxy *px, const struct sockaddr *addr, int len)
{
	if (px->n_upstreams == TAP_PROXY_UPSTREAM_ADDRS || len <= 0 || (size_t)len > sizeof(struct sockaddr_storage))
		return -1;
	memcpy(&px->upstreams[px->n_upstreams], addr, (size_t)len);
	px->upstream_lens[px->n_upstreams++] = len;
	return 0;
}

int tap_proxy_listen(struct tap_proxy *px, const struct sockaddr *addr, int addr_len, char *bound, size_t bound_cap)
{
	unsigned flags = LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC;
	px->listener = evconnlistener_new_bind(px->base, on_accept, px, flags, 1024, addr, addr_len);
	if (!px->listener)
		return -1;
	evconnlistener_set_error_cb(px->listener, on_accept_error);
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	if (getsockname(evconnlistener_get_fd(px->listener), (struct sockaddr *)&ss, &len) == 0)
		tap_format_sockaddr((struct sockaddr *)&ss, bound, bound_cap);
	else
		snprintf(bound, bound_cap, "?");
	return 0;
}

void tap_proxy_stop_accepting(struct tap_proxy *px)
{
	px->stopped = true;
	px->accept_paused = false;
	event_del(px->resume_accept);
	if (px->listener) {
		evconnlistener_free(px->listener);
		px->listener = NULL;
	}
}

void tap_proxy_close_all(struct tap_proxy *px)
{
	struct tap_session *s;
	while ((s = TAILQ_FIRST(&px->sessions)) != NULL)
		tap_session_close(s);
}

size_t tap_proxy_active(const struct tap_proxy *px)
{
	return (size_t)px->stats.active;
}

void tap_proxy_get_stats(const struct tap_proxy *px, struct tap_proxy_stats *st)
{
	*st = px->stats;
}

void tap_proxy_set_handshake_timeout(struct tap_proxy *px, uint32_t ms)
{
	px->handshake_ms = ms;
}

void tap_proxy_on_idle(struct tap_proxy *px, void (*cb)(void *arg), void *arg)
{
	px->idle_cb = cb;
	px->idle_arg = arg;
}

void tap_proxy_free(struct tap_proxy *px)
{
	if (!px)
		return;
	px->idle_cb = NULL;
	tap_proxy_stop_accepting(px);
	tap_proxy_close_all(px);
	event_free(px->resume_accept);
	event_free(px->shortage_over);
	tap_tls_proxy_free(px);
	free(px->scratch);
	free(px);
}

void tap_proxy_set_faults(struct tap_proxy *p, struct tap_fault_set *set)
{
	p->faults = set;
}
