/* What every layer above a leg uses (session.c, relay.c, plainleg.c,
 * tlsleg.c): watching a leg's events when libevent may have no memory, the
 * setup timer, addresses, the clock. It calls nothing above it: what it has
 * to tell goes up through px->up. */
#include "proxy_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>

int64_t tap_now_us(void)
{
	return tap_leg_now_us();
}

/* An IPv4-mapped IPv6 address (a dual-stack socket speaking IPv4) is written as the IPv4 one, as the peer, the
 * broker and a sniffer see it. */
void tap_format_sockaddr(const struct sockaddr *sa, char *out, size_t cap)
{
	char host[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;
	const struct sockaddr_in6 *mapped = (const struct sockaddr_in6 *)(const void *)sa;
	if (sa->sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&mapped->sin6_addr)) {
		inet_ntop(AF_INET, &mapped->sin6_addr.s6_addr[12], host, sizeof host);
		snprintf(out, cap, "%s:%u", host, (unsigned)ntohs(mapped->sin6_port));
	} else if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
		inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
		port = ntohs(in->sin_port);
		snprintf(out, cap, "%s:%u", host, port);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
		port = ntohs(in6->sin6_port);
		snprintf(out, cap, "[%s]:%u", host, port);
	} else {
		snprintf(out, cap, "unknown");
	}
}

void tap_set_nodelay(evutil_socket_t fd)
{
	int one = 1;
	if (fd >= 0)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void tap_leg_watch(struct leg *l, struct event *ev, const struct timeval *tv)
{
	if (ev && event_add(ev, tv) == 0)
		return;
	l->unwatched = true;
	if (l->rd)
		event_active(l->rd, EV_READ, 1);
}

bool tap_leg_end_unwatched(struct leg *l)
{
	l->s->px->up->event(l, BEV_EVENT_READING | BEV_EVENT_ERROR, ENOMEM, "no memory to watch the connection");
	return true;
}

static void on_setup_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct leg *l = arg;
	(void)fd;
	(void)what;
	l->s->px->up->event(l, BEV_EVENT_TIMEOUT, 0, NULL);
}

/* Bounds how long a leg may take to be set up (a TLS handshake; an upstream connect) with a timer of its own,
 * deleted once it is. Not a bufferevent write timeout: libevent 2.1 keeps one armed after it is cleared, and a
 * broker that then stopped reading for that long (a resource alarm) had its live session ended as unreachable. */
void tap_leg_arm_setup(struct leg *l)
{
	struct tap_proxy *px = l->s->px;
	if (!px->handshake_ms || l->handshaken || (!l->tls && l->connected))
		return;
	if (!l->setup_timer)
		l->setup_timer = evtimer_new(px->base, on_setup_timeout, l);
	int64_t left = l->setup_left_us > 0 ? l->setup_left_us : (int64_t)px->handshake_ms * 1000;
	struct timeval tv = {(time_t)(left / 1000000), (suseconds_t)(left % 1000000)};
	l->setup_due_us = tap_now_us() + left;
	l->setup_left_us = 0;
	tap_leg_watch(l, l->setup_timer, &tv);
}

void tap_leg_tcp_up(struct leg *l)
{
	struct tap_proxy *px = l->s->px;
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	if (!px->hooks.upstream_local || l->fd < 0 || getsockname(l->fd, (struct sockaddr *)&ss, &len) != 0)
		return;
	char name[80];
	tap_format_sockaddr((struct sockaddr *)&ss, name, sizeof name);
	px->hooks.upstream_local(px->hooks.ctx, l->s->obs, l->s->id, name);
}

bool tap_leg_new_read_event(struct leg *l)
{
	struct tap_proxy *px = l->s->px;
	l->rd = event_new(px->base, l->fd, EV_READ | EV_PERSIST, px->readable, l);
	return l->rd != NULL;
}

bool tap_leg_awaits_broker(const struct leg *l)
{
	return l->side == SIDE_CLIENT && !l->peer->connected && !l->s->client_left;
}
