/* The forwarding engine: one upstream connection per accepted client, bytes
 * relayed both ways the moment they arrive (evbuffer_add_buffer moves the
 * chains, nothing is copied), observers fed a peek of each chunk first.
 * Backpressure and drain-then-close follow libevent's sample/le-proxy.c. */
#include "amqptap/proxy.h"

#include "amqptap/tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

enum side { SIDE_CLIENT = 0, SIDE_UPSTREAM = 1 };

/* Buffers, per direction (client -> broker shown; the other is symmetric):
 *
 *   client socket -> bev[CLIENT].input --add_buffer--> bev[UPSTREAM].output -> broker socket
 *                          ^ peeked by the observer first
 *
 * Invariant: a side's input is empty after every read callback; all queued
 * bytes live in the other side's output. When that output passes
 * TAP_PROXY_HIGH_WATER, reading from the side that fills it stops until the
 * output drains to half.
 *
 * Close: a FIN from one side is passed on as a FIN (shutdown(SHUT_WR)) once
 * everything before it was written, and the other direction keeps flowing
 * until it ends too. A reset or error on one side drains what is queued
 * for the other side, then closes it. */
struct tap_session {
	TAILQ_ENTRY(tap_session) link;
	struct tap_proxy *px;
	uint64_t id;
	struct bufferevent *bev[2];
	bool connected;    /* the upstream connect completed */
	bool eof[2];       /* that side sent FIN: nothing more to read from it */
	bool shut_wr[2];   /* we sent FIN to that side */
	bool tls[2];       /* that leg is TLS: no half-close, a FIN ends the session after draining */
	bool handshaken[2]; /* TLS leg: handshake complete (plain upstream: connected) */
	bool closing;      /* one side is gone (reset): drain the other, then close it */
	enum tap_proxy_end why;
	char detail[160];
	void *obs;
};

TAILQ_HEAD(session_list, tap_session);

struct tap_proxy {
	struct event_base *base;
	struct evconnlistener *listener;
	struct sockaddr_storage upstream;
	int upstream_len;
	char upstream_name[300]; /* as configured, for messages */
	char upstream_addr[80];  /* numeric, for observers */
	struct tap_proxy_hooks hooks;
	struct tap_tls *tls;
	struct session_list sessions;
	uint64_t next_id;
	struct tap_proxy_stats stats;
	bool stopped;
	void (*idle_cb)(void *);
	void *idle_arg;
};

static const char *const end_names[] = {
	[TAP_END_CLIENT_EOF] = "client_eof",     [TAP_END_BROKER_EOF] = "broker_eof",
	[TAP_END_CLIENT_RESET] = "client_reset", [TAP_END_BROKER_RESET] = "broker_reset",
	[TAP_END_UNREACHABLE] = "unreachable",   [TAP_END_SHUTDOWN] = "shutdown",
	[TAP_END_CLIENT_TLS] = "client_tls_error", [TAP_END_BROKER_TLS] = "broker_tls_error",
};

const char *tap_proxy_end_name(enum tap_proxy_end why)
{
	return (unsigned)why < sizeof end_names / sizeof end_names[0] ? end_names[why] : "unknown";
}

int64_t tap_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void format_sockaddr(const struct sockaddr *sa, char *out, size_t cap)
{
	char host[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;
	if (sa->sa_family == AF_INET) {
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

static void set_nodelay(evutil_socket_t fd)
{
	int one = 1;
	if (fd >= 0)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void session_end(struct tap_session *s)
{
	struct tap_proxy *px = s->px;
	TAILQ_REMOVE(&px->sessions, s, link);
	px->stats.active--;
	if (px->hooks.close)
		px->hooks.close(px->hooks.ctx, s->obs, s->why, s->detail[0] ? s->detail : NULL, tap_now_us());
	for (int i = 0; i < 2; i++)
		if (s->bev[i])
			bufferevent_free(s->bev[i]);
	free(s);
	if (px->stopped && px->stats.active == 0 && px->idle_cb)
		px->idle_cb(px->idle_arg);
}

/* Hands every byte of `in` to the observer, in order, without consuming it. */
static void observe(struct tap_session *s, enum side from, struct evbuffer *in)
{
	struct tap_proxy *px = s->px;
	size_t left = evbuffer_get_length(in);
	if (!px->hooks.data || left == 0)
		return;
	int64_t now = tap_now_us();
	struct evbuffer_ptr pos;
	evbuffer_ptr_set(in, &pos, 0, EVBUFFER_PTR_SET);
	while (left > 0) {
		struct evbuffer_iovec v[16];
		int n = evbuffer_peek(in, (ev_ssize_t)left, &pos, v, 16);
		if (n <= 0)
			break;
		if (n > 16)
			n = 16;
		size_t done = 0;
		for (int i = 0; i < n && left > 0; i++) {
			size_t len = v[i].iov_len < left ? v[i].iov_len : left;
			px->hooks.data(px->hooks.ctx, s->obs, from == SIDE_CLIENT, v[i].iov_base, len, now);
			left -= len;
			done += len;
		}
		if (left > 0 && evbuffer_ptr_set(in, &pos, done, EVBUFFER_PTR_ADD) < 0)
			break;
	}
}

/* Moves what `from` has read into the other side's output. */
static void relay(struct tap_session *s, enum side from)
{
	struct bufferevent *src = s->bev[from], *dst = s->bev[!from];
	struct evbuffer *in = bufferevent_get_input(src);
	size_t len = evbuffer_get_length(in);
	if (len == 0)
		return;
	observe(s, from, in);
	if (from == SIDE_CLIENT)
		s->px->stats.bytes_c2s += len;
	else
		s->px->stats.bytes_s2c += len;
	if (!dst) {
		evbuffer_drain(in, len);
		return;
	}
	struct evbuffer *out = bufferevent_get_output(dst);
	enum side to = from == SIDE_CLIENT ? SIDE_UPSTREAM : SIDE_CLIENT;
	if (evbuffer_get_length(out) == 0 && !s->tls[to] && !s->shut_wr[to] && (to == SIDE_CLIENT || s->connected)) {
		/* Nothing queued: write straight to the socket, as much as it takes. When all of it goes, the
		 * output never turns non-empty and no write event is armed and disarmed (two epoll_ctl calls
		 * and a wakeup saved per chunk); what the socket does not take is queued as usual. */
		evbuffer_write(in, bufferevent_getfd(dst));
		if (evbuffer_get_length(in) == 0)
			return;
	}
	evbuffer_add_buffer(out, in);
	if (evbuffer_get_length(out) >= TAP_PROXY_HIGH_WATER) {
		bufferevent_disable(src, EV_READ);
		bufferevent_setwatermark(dst, EV_WRITE, TAP_PROXY_HIGH_WATER / 2, 0);
	}
}

static enum side side_of(const struct tap_session *s, const struct bufferevent *bev)
{
	return bev == s->bev[SIDE_CLIENT] ? SIDE_CLIENT : SIDE_UPSTREAM;
}

/* libevent 2.1 reads at most 4 KiB per readiness event (EVBUFFER_MAX_READ),
 * so a bulk stream costs an epoll_wait, an ioctl and a readv per 4 KiB.
 * When that much arrived, read on into the same input buffer with large
 * reads until the socket is empty (EOF and errors are left to libevent's
 * next read, which sees them again). Plain TCP legs only. */
static void read_more(struct tap_session *s, enum side from)
{
	struct bufferevent *bev = s->bev[from], *dst = s->bev[!from];
	struct evbuffer *in = bufferevent_get_input(bev);
	if (s->tls[from] || evbuffer_get_length(in) < 4096)
		return;
	evutil_socket_t fd = bufferevent_getfd(bev);
	size_t budget = TAP_PROXY_HIGH_WATER;
	/* a bufferevent keeps the end of its input frozen outside its own reads */
	evbuffer_unfreeze(in, 0);
	while (budget > 0 && (!dst || evbuffer_get_length(bufferevent_get_output(dst)) < TAP_PROXY_HIGH_WATER)) {
		struct evbuffer_iovec v[2];
		int n = evbuffer_reserve_space(in, TAP_PROXY_MAX_IO, v, 2);
		if (n <= 0)
			break;
		struct iovec iov[2];
		for (int i = 0; i < n; i++) {
			iov[i].iov_base = v[i].iov_base;
			iov[i].iov_len = v[i].iov_len;
		}
		ssize_t got = readv(fd, iov, n);
		if (got <= 0) {
			evbuffer_commit_space(in, v, 0);
			break;
		}
		size_t left = (size_t)got;
		for (int i = 0; i < n; i++) {
			if (v[i].iov_len > left)
				v[i].iov_len = left;
			left -= v[i].iov_len;
		}
		evbuffer_commit_space(in, v, n);
		budget = (size_t)got < budget ? budget - (size_t)got : 0;
		if ((size_t)got < TAP_PROXY_MAX_IO)
			break; /* the socket is empty */
	}
	evbuffer_freeze(in, 0);
}

/* A write to `side` failed (the peer is gone), but what it sent before it
 * went may still sit unread in the socket: a broker's connection.close
 * explaining why. Read it, so it is observed and passed on. */
static void read_rest(struct tap_session *s, enum side side)
{
	if (s->tls[side])
		return;
	struct evbuffer *in = bufferevent_get_input(s->bev[side]);
	evutil_socket_t fd = bufferevent_getfd(s->bev[side]);
	evbuffer_unfreeze(in, 0);
	while (evbuffer_read(in, fd, TAP_PROXY_MAX_IO) > 0)
		;
	evbuffer_freeze(in, 0);
	relay(s, side);
}

static void on_read(struct bufferevent *bev, void *arg)
{
	struct tap_session *s = arg;
	enum side from = side_of(s, bev);
	read_more(s, from);
	relay(s, from);
}

static bool drained(const struct tap_session *s, enum side side)
{
	return !s->bev[side] || evbuffer_get_length(bufferevent_get_output(s->bev[side])) == 0;
}

/* One side is gone: what is queued for the other is written, then it is
 * closed. The survivor is still read (and observed: a client may go on
 * publishing into a dead connection, and each publish needs its record) so
 * that a peer blocked in a write can make progress and read what is left;
 * a peer that reads nothing for TAP_PROXY_DRAIN_SECONDS is cut off. */
static void begin_closing(struct tap_session *s)
{
	s->closing = true;
	for (int i = 0; i < 2; i++) {
		if (!s->bev[i])
			continue;
		struct timeval drain = {TAP_PROXY_DRAIN_SECONDS, 0};
		bufferevent_setwatermark(s->bev[i], EV_WRITE, 0, 0);
		bufferevent_set_timeouts(s->bev[i], NULL, &drain);
		bufferevent_enable(s->bev[i], EV_READ);
	}
}

/* Passes a FIN on to `side` once its output is empty; ends the session when
 * both directions are finished. Returns true if the session was freed. */
static bool settle(struct tap_session *s)
{
	for (int side = 0; side < 2; side++) {
		if (s->eof[!side] && !s->shut_wr[side] && s->bev[side] && (side == SIDE_CLIENT || s->connected)) {
			if (s->tls[side] || s->tls[!side]) {
				if (!s->closing)
					begin_closing(s); /* TLS has no half-close: drain, then close */
			} else if (drained(s, (enum side)side)) {
				shutdown(bufferevent_getfd(s->bev[side]), SHUT_WR);
				s->shut_wr[side] = true;
			}
		}
	}
	if ((s->closing && drained(s, SIDE_CLIENT) && drained(s, SIDE_UPSTREAM)) ||
	    (s->eof[SIDE_CLIENT] && s->eof[SIDE_UPSTREAM] && s->shut_wr[SIDE_CLIENT] && s->shut_wr[SIDE_UPSTREAM])) {
		session_end(s);
		return true;
	}
	return false;
}

/* Called when a side's output fell to its low watermark. */
static void on_write(struct bufferevent *bev, void *arg)
{
	struct tap_session *s = arg;
	enum side side = side_of(s, bev);
	if (s->closing || s->eof[!side]) {
		settle(s);
		return;
	}
	struct bufferevent *other = s->bev[!side];
	bufferevent_setwatermark(bev, EV_WRITE, 0, 0);
	if (other)
		bufferevent_enable(other, EV_READ);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	struct tap_session *s = arg;
	enum side side = side_of(s, bev);
	if (what & BEV_EVENT_CONNECTED) { /* TCP connect done, or a TLS handshake done (either leg) */
		s->handshaken[side] = true;
		if (side == SIDE_UPSTREAM) {
			s->connected = true;
			set_nodelay(bufferevent_getfd(bev));
			settle(s);
		}
		return;
	}
	if (what & BEV_EVENT_TIMEOUT) { /* only armed while draining */
		session_end(s);
		return;
	}
	if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
		return;
	int err = EVUTIL_SOCKET_ERROR();
	if (s->tls[side] && !s->handshaken[side] && (what & BEV_EVENT_ERROR) &&
	    tap_tls_error(bev, s->detail, sizeof s->detail)) {
		/* a handshake failure: say why, close, touch no other session */
		s->why = side == SIDE_CLIENT ? TAP_END_CLIENT_TLS : TAP_END_BROKER_TLS;
		fprintf(stderr, "amqptap: conn %llu: TLS with the %s failed: %s\n", (unsigned long long)s->id,
			side == SIDE_CLIENT ? "client" : "broker", s->detail);
		session_end(s);
		return;
	}
	if (side == SIDE_UPSTREAM && !s->connected) {
		s->why = TAP_END_UNREACHABLE;
		snprintf(s->detail, sizeof s->detail, "%s", err ? evutil_socket_error_to_string(err) : "connection closed");
		s->px->stats.unreachable++;
		fprintf(stderr, "amqptap: conn %llu: upstream %s unreachable: %s\n", (unsigned long long)s->id,
			s->px->upstream_name, s->detail);
		session_end(s);
		return;
	}
	if (s->closing) { /* the side we were draining into went away too */
		session_end(s);
		return;
	}
	relay(s, side); /* whatever arrived with the EOF */
	/* with deferred callbacks a failed write and the EOF that follows it can
	 * arrive as one event: an error wins, or the bytes queued for a dead peer
	 * would wait forever */
	bool eof = (what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR);
	if (!s->eof[!side]) /* the first side to go names the reason */
		s->why = side == SIDE_CLIENT ? (eof ? TAP_END_CLIENT_EOF : TAP_END_CLIENT_RESET)
					     : (eof ? TAP_END_BROKER_EOF : TAP_END_BROKER_RESET);
	struct bufferevent *other = s->bev[!side];
	if (eof) {
		s->eof[side] = true;
		bufferevent_disable(bev, EV_READ);
		if (other)
			bufferevent_setwatermark(other, EV_WRITE, 0, 0);
		/* half-closed: a side that stops taking bytes for TAP_PROXY_DRAIN_SECONDS ends the session */
		struct timeval drain = {TAP_PROXY_DRAIN_SECONDS, 0};
		for (int i = 0; i < 2; i++)
			if (s->bev[i])
				bufferevent_set_timeouts(s->bev[i], NULL, &drain);
		settle(s);
		return;
	}
	if (!s->eof[!side])
		snprintf(s->detail, sizeof s->detail, "%s", evutil_socket_error_to_string(err));
	if (what & BEV_EVENT_WRITING)
		read_rest(s, side);
	bufferevent_free(bev);
	s->bev[side] = NULL;
	begin_closing(s);
	settle(s);
}

/* A socket bufferevent; when tls, an OpenSSL filter over one. As a filter
 * (rather than OpenSSL reading the socket itself) the socket is read in
 * large chunks and OpenSSL takes its records from memory: no read for each
 * record header and body. */
static struct bufferevent *new_bev(struct tap_proxy *px, evutil_socket_t fd, bool tls, enum bufferevent_ssl_state st)
{
	int opts = BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS;
	struct bufferevent *raw = bufferevent_socket_new(px->base, fd, opts);
	if (!raw)
		return NULL;
	/* evbuffer_read takes at most 4 KiB per call in libevent 2.1 (read_more goes past that on plain legs);
	 * writes may be larger */
	bufferevent_set_max_single_read(raw, TAP_PROXY_MAX_IO);
	bufferevent_set_max_single_write(raw, TAP_PROXY_MAX_IO);
	if (!tls)
		return raw;
	SSL *ssl = st == BUFFEREVENT_SSL_ACCEPTING ? tap_tls_accept_ssl(px->tls) : tap_tls_connect_ssl(px->tls);
	struct bufferevent *bev = ssl ? bufferevent_openssl_filter_new(px->base, raw, ssl, st, opts) : NULL;
	if (!bev) {
		if (ssl)
			SSL_free(ssl);
		bufferevent_free(raw);
		return NULL;
	}
	/* a peer that closes TCP without close_notify is an EOF, not an error */
	bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
	return bev;
}

/* The socket bufferevent under a leg (itself on a plain leg). */
static struct bufferevent *socket_bev(struct bufferevent *bev)
{
	struct bufferevent *under = bufferevent_get_underlying(bev);
	return under ? under : bev;
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
	struct tap_proxy *px = arg;
	(void)l;
	(void)salen;
	struct tap_session *s = calloc(1, sizeof *s);
	if (!s) {
		evutil_closesocket(fd);
		return;
	}
	s->px = px;
	s->id = ++px->next_id;
	set_nodelay(fd);
	s->tls[SIDE_CLIENT] = tap_tls_listener(px->tls);
	s->tls[SIDE_UPSTREAM] = tap_tls_upstream(px->tls);
	s->bev[SIDE_CLIENT] = new_bev(px, fd, s->tls[SIDE_CLIENT], BUFFEREVENT_SSL_ACCEPTING);
	s->bev[SIDE_UPSTREAM] = new_bev(px, -1, s->tls[SIDE_UPSTREAM], BUFFEREVENT_SSL_CONNECTING);
	if (!s->bev[SIDE_CLIENT] || !s->bev[SIDE_UPSTREAM]) {
		if (s->bev[SIDE_CLIENT])
			bufferevent_free(s->bev[SIDE_CLIENT]);
		else
			evutil_closesocket(fd);
		if (s->bev[SIDE_UPSTREAM])
			bufferevent_free(s->bev[SIDE_UPSTREAM]);
		free(s);
		return;
	}
	TAILQ_INSERT_TAIL(&px->sessions, s, link);
	px->stats.accepted++;
	px->stats.active++;
	char client[80];
	format_sockaddr(sa, client, sizeof client);
	if (px->hooks.open)
		s->obs = px->hooks.open(px->hooks.ctx, s->id, client, px->upstream_addr, tap_now_us());
	for (int i = 0; i < 2; i++) {
		bufferevent_setcb(s->bev[i], on_read, on_write, on_event, s);
		bufferevent_enable(s->bev[i], EV_READ | EV_WRITE);
	}
	if (bufferevent_socket_connect(socket_bev(s->bev[SIDE_UPSTREAM]), (struct sockaddr *)&px->upstream,
				       px->upstream_len) < 0) {
		s->why = TAP_END_UNREACHABLE;
		snprintf(s->detail, sizeof s->detail, "%s", evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
		px->stats.unreachable++;
		fprintf(stderr, "amqptap: conn %llu: upstream %s unreachable: %s\n", (unsigned long long)s->id,
			px->upstream_name, s->detail);
		session_end(s);
	}
}

static void on_accept_error(struct evconnlistener *l, void *arg)
{
	(void)l;
	(void)arg;
	int err = EVUTIL_SOCKET_ERROR();
	fprintf(stderr, "amqptap: accept failed: %s\n", evutil_socket_error_to_string(err));
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
	memcpy(&px->upstream, upstream, (size_t)upstream_len);
	px->upstream_len = upstream_len;
	snprintf(px->upstream_name, sizeof px->upstream_name, "%s", upstream_name);
	format_sockaddr(upstream, px->upstream_addr, sizeof px->upstream_addr);
	if (hooks)
		px->hooks = *hooks;
	TAILQ_INIT(&px->sessions);
	return px;
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
		format_sockaddr((struct sockaddr *)&ss, bound, bound_cap);
	else
		snprintf(bound, bound_cap, "?");
	return 0;
}

void tap_proxy_stop_accepting(struct tap_proxy *px)
{
	px->stopped = true;
	if (px->listener) {
		evconnlistener_free(px->listener);
		px->listener = NULL;
	}
}

void tap_proxy_close_all(struct tap_proxy *px)
{
	struct tap_session *s;
	while ((s = TAILQ_FIRST(&px->sessions)) != NULL) {
		if (!s->closing && !s->eof[SIDE_CLIENT] && !s->eof[SIDE_UPSTREAM]) {
			s->why = TAP_END_SHUTDOWN; /* a session already ending keeps its own reason */
			s->detail[0] = '\0';
		}
		session_end(s);
	}
}

size_t tap_proxy_active(const struct tap_proxy *px)
{
	return (size_t)px->stats.active;
}

void tap_proxy_get_stats(const struct tap_proxy *px, struct tap_proxy_stats *st)
{
	*st = px->stats;
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
	free(px);
}
