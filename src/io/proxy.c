/* The forwarding engine: one upstream connection per accepted client, bytes
 * relayed both ways the moment they arrive, each chunk shown to the observer
 * right after it was passed on. Plain legs are read by the session itself
 * and written straight to the peer's socket when nothing is queued; TLS
 * legs are moved by OpenSSL on their own sockets (tlsleg.c). Backpressure
 * and drain-then-close follow libevent's sample/le-proxy.c. */
#include "session.h"

#include "amqptap/log.h"
#include "amqptap/tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <time.h>

/* Buffers, per direction (client -> broker shown; the other is symmetric):
 *
 *   client socket --recv--> px->scratch --send--> broker socket
 *                                 |  (what the socket does not take)
 *                                 +--> upstream leg's `out` --> broker socket
 *
 * A TLS leg is read with SSL_read the same way (into the scratch buffer, or
 * straight into the peer's `out` when the bytes must wait there anyway),
 * and a TLS peer is always written from its `out`, one record per
 * SSL_write. Invariant: no input is kept after a read callback; all queued
 * bytes live in the peer's `out`. When that passes TAP_PROXY_HIGH_WATER,
 * reading from the leg that fills it stops until it drains to half.
 *
 * Close: a FIN from one side is passed on as a FIN (shutdown(SHUT_WR)) once
 * everything before it was written, and the other direction keeps flowing
 * until it ends too. A reset or error on one side drains what is queued
 * for the other side, then closes it. TLS has no half-close: a FIN on
 * either side of a session with a TLS leg drains, then closes both. */

static const char *const end_names[] = {
	[TAP_END_CLIENT_EOF] = "client_eof",     [TAP_END_BROKER_EOF] = "broker_eof",
	[TAP_END_CLIENT_RESET] = "client_reset", [TAP_END_BROKER_RESET] = "broker_reset",
	[TAP_END_UNREACHABLE] = "unreachable",   [TAP_END_SHUTDOWN] = "shutdown",
	[TAP_END_CLIENT_TLS] = "client_tls_error", [TAP_END_BROKER_TLS] = "broker_tls_error",
	[TAP_END_FD_LIMIT] = "tap_fd_limit",     [TAP_END_NO_MEMORY] = "tap_no_memory",
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

/* "ip:port" or "[ip6]:port"; an IPv4-mapped IPv6 address (a dual-stack socket speaking IPv4) as the IPv4 one, as
 * the peer, the broker and a sniffer see it. */
static void format_sockaddr(const struct sockaddr *sa, char *out, size_t cap)
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

static void set_nodelay(evutil_socket_t fd)
{
	int one = 1;
	if (fd >= 0)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static bool out_of_fds(int err)
{
	return err == EMFILE || err == ENFILE;
}

/* The process has no descriptor for a new socket. Said on stderr once per
 * shortage, not once per client (the records name each client it cost); the
 * shortage is over when none was met for TAP_PROXY_FD_QUIET_SECONDS. */
static void fd_shortage(struct tap_proxy *px, int err)
{
	struct timeval quiet = {TAP_PROXY_FD_QUIET_SECONDS, 0};
	evtimer_add(px->shortage_over, &quiet);
	if (px->out_of_fds)
		return;
	px->out_of_fds = true;
	px->fd_limit_before = px->stats.fd_limit;
	px->accept_pauses = 0;
	struct rlimit rl;
	char limit[32] = "?";
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		snprintf(limit, sizeof limit, "%llu", (unsigned long long)rl.rlim_cur);
	tap_log_error(
	    "out of file descriptors (%s; the limit is %s, %llu sessions active): new clients wait in "
	    "the accept queue or are closed with reason tap_fd_limit until connections end; raise it with ulimit -n",
	    evutil_socket_error_to_string(err), limit, (unsigned long long)px->stats.active);
}

static void on_shortage_over(evutil_socket_t fd, short what, void *arg)
{
	struct tap_proxy *px = arg;
	(void)fd;
	(void)what;
	px->out_of_fds = false;
	tap_log_error("no file descriptor shortage for %d s: %llu clients were closed for want of one, accepting "
	              "paused %llu times",
	              TAP_PROXY_FD_QUIET_SECONDS, (unsigned long long)(px->stats.fd_limit - px->fd_limit_before),
	              (unsigned long long)px->accept_pauses);
}

static void resume_accepting(struct tap_proxy *px)
{
	px->accept_paused = false;
	if (px->resume_accept)
		event_del(px->resume_accept);
	if (px->listener)
		evconnlistener_enable(px->listener);
}

static void on_resume_accept(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	resume_accepting(arg);
}

/* Frees one leg (its read event first: the socket is closed with it). */
static void leg_free(struct leg *l)
{
	if (l->rd) {
		event_free(l->rd);
		l->rd = NULL;
	}
	if (l->tls) {
		tap_tls_leg_free(l, l->side == SIDE_CLIENT && l->s->reset_client);
	} else if (l->bev) {
		bufferevent_free(l->bev); /* closes the socket */
		l->bev = NULL;
	}
	if (l->setup_timer) { /* a plain upstream's connect timer (a TLS leg's went with it above) */
		event_free(l->setup_timer);
		l->setup_timer = NULL;
	}
	l->out = NULL;
}

/* The client is no longer watched for leaving while its broker connect is pending (tap_leg_await_broker). */
static void stop_awaiting_broker(struct tap_session *s)
{
	if (s->client_gone) {
		event_free(s->client_gone);
		s->client_gone = NULL;
	}
}

bool tap_leg_awaits_broker(const struct leg *l)
{
	return l->side == SIDE_CLIENT && !l->peer->connected && !l->s->client_left;
}

static void session_end(struct tap_session *s)
{
	struct tap_proxy *px = s->px;
	TAILQ_REMOVE(&px->sessions, s, link);
	px->stats.active--;
	if (px->hooks.close)
		px->hooks.close(px->hooks.ctx, s->obs, s->id, s->why, s->detail[0] ? s->detail : NULL, tap_now_us());
	stop_awaiting_broker(s); /* before its socket is closed */
	leg_free(&s->leg[SIDE_CLIENT]);
	leg_free(&s->leg[SIDE_UPSTREAM]);
	if (s->reset_later)
		event_free(s->reset_later);
	free(s);
	if (px->accept_paused)
		resume_accepting(px); /* its descriptors are free now */
	if (px->stopped && px->stats.active == 0 && px->idle_cb)
		px->idle_cb(px->idle_arg);
}

/* Makes closing the client's socket send a reset instead of a FIN, the
 * closest the tap can come to the "connection refused" a client gets from a
 * broker that is down: client libraries take their connection-error path
 * (py-amqp raises ConnectionResetError, not "Server unexpectedly closed
 * connection"). */
static void reset_client_on_close(struct tap_session *s)
{
	struct linger now = {.l_onoff = 1, .l_linger = 0};
	s->reset_client = true;
	if (s->leg[SIDE_CLIENT].fd >= 0)
		(void)setsockopt(s->leg[SIDE_CLIENT].fd, SOL_SOCKET, SO_LINGER, &now,
				 sizeof now); /* failing that, a FIN still closes it */
}

static void on_reset_later(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	session_end(arg);
}

/* Ends a session whose client is to be reset. A client that has not spoken
 * yet is reset once it has (any readiness ends the session) or after
 * TAP_PROXY_RESET_GRACE_MS: on a fast link a reset right after the accept
 * can reach the client between its connect and its first look at the
 * socket, where some libraries (pika 1.2: a ValueError from getpeername())
 * do not take their connection-error path. */
static void end_with_reset(struct tap_session *s)
{
	struct leg *client = &s->leg[SIDE_CLIENT];
	if (s->reset_later)
		return; /* already waiting */
	stop_awaiting_broker(s); /* turned away now: a close of the client's from here on does not change why */
	reset_client_on_close(s);
	struct timeval grace = {0, TAP_PROXY_RESET_GRACE_MS * 1000};
	if (s->client_spoke || client->tls || !client->rd ||
	    !(s->reset_later = evtimer_new(s->px->base, on_reset_later, s))) {
		session_end(s);
		return;
	}
	leg_free(&s->leg[SIDE_UPSTREAM]); /* its socket, if any, is of no use */
	if (evtimer_add(s->reset_later, &grace) < 0) {
		session_end(s);
		return;
	}
	tap_leg_watch(client, client->rd, NULL);
}

/* Ends a session that failed before it could carry bytes: names the reason
 * (detail, a printf format), says so on stderr, and closes both legs. */
static void session_fail(struct tap_session *s, enum tap_proxy_end why, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The stderr line of a TLS failure (why: TAP_END_CLIENT_TLS or TAP_END_BROKER_TLS). */
static void log_tls_failure(const struct tap_session *s, enum tap_proxy_end why, const char *text)
{
	tap_log_error("conn %llu: TLS with the %s failed: %s", (unsigned long long)s->id,
		      why == TAP_END_CLIENT_TLS ? "client" : "broker", text);
}

/* Address number `at` of the upstream name, numeric (in a buffer of the proxy's own: until the next call). */
static const char *upstream_text(struct tap_proxy *px, size_t at)
{
	format_sockaddr((struct sockaddr *)&px->upstreams[at], px->upstream_text, sizeof px->upstream_text);
	return px->upstream_text;
}

static void use_upstream(struct tap_proxy *px, size_t at)
{
	px->upstream_at = at;
	format_sockaddr((struct sockaddr *)&px->upstreams[at], px->upstream_addr, sizeof px->upstream_addr);
}

/* A session sent to upstream address `failed` found it unreachable: the next sessions go to the next address, if
 * the name has another and no other session moved on already. */
static void next_upstream(struct tap_proxy *px, size_t failed)
{
	if (px->n_upstreams < 2 || failed != px->upstream_at)
		return;
	char was[sizeof px->upstream_addr];
	snprintf(was, sizeof was, "%s", px->upstream_addr);
	use_upstream(px, (failed + 1) % px->n_upstreams);
	tap_log_error("upstream %s: %s is unreachable; new connections go to %s", px->upstream_name, was,
		      px->upstream_addr);
}

static bool connect_upstream(struct tap_session *s);
static int plain_leg_new(struct leg *l, evutil_socket_t fd);
static void leg_init(struct tap_session *s, enum side side, bool tls);
static void read_rest_if_open(struct leg *l);
static void set_reading(struct leg *l, bool on);

/* A session whose address was unreachable goes on to the name's next one, as a client library connecting
 * directly tries each address in turn, until it has tried them all (or the tap is stopping). Nothing has passed
 * yet: the client is read only once the broker is connected, so the upstream leg is made anew and the record
 * and --pcap name the address it goes to. Returns false when it is not retried (the caller ends it). */
static bool retry_upstream(struct tap_session *s)
{
	struct tap_proxy *px = s->px;
	if (px->stopped || s->client_left || ++s->upstream_tries >= px->n_upstreams)
		return false;
	struct leg *up = &s->leg[SIDE_UPSTREAM];
	leg_free(up);
	memset(up, 0, sizeof *up);
	leg_init(s, SIDE_UPSTREAM, tap_tls_upstream(px->tls));
	s->upstream_at = (s->upstream_at + 1) % px->n_upstreams;
	s->detail[0] = '\0';
	const char *to = upstream_text(px, s->upstream_at);
	tap_log_error("conn %llu: trying %s", (unsigned long long)s->id, to);
	if (px->hooks.upstream_moved)
		px->hooks.upstream_moved(px->hooks.ctx, s->obs, to);
	int err = up->tls ? ((up->out = evbuffer_new()) ? 0 : ENOMEM) : plain_leg_new(up, -1);
	if (err)
		session_fail(s, TAP_END_NO_MEMORY, "out of memory");
	else
		(void)connect_upstream(s); /* on failure the session is gone, or retried once more */
	return true;
}

static void session_fail(struct tap_session *s, enum tap_proxy_end why, const char *fmt, ...)
{
	struct tap_proxy *px = s->px;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->detail, sizeof s->detail, fmt, ap);
	va_end(ap);
	s->why = why;
	switch (why) {
	case TAP_END_UNREACHABLE:
		px->stats.address_failures++;
		tap_log_error("conn %llu: upstream %s unreachable at %s: %s", (unsigned long long)s->id,
		              px->upstream_name, upstream_text(px, s->upstream_at), s->detail);
		next_upstream(px, s->upstream_at);
		if (retry_upstream(s))
			return;
		px->stats.unreachable++; /* a client turned away: every address was tried, or the tap is stopping */
		end_with_reset(s);
		return;
	case TAP_END_FD_LIMIT:
		px->stats.fd_limit++; /* fd_shortage said it on stderr */
		end_with_reset(s);
		return;
	case TAP_END_CLIENT_TLS:
	case TAP_END_BROKER_TLS:
		log_tls_failure(s, why, s->detail);
		break;
	default:
		tap_log_error("conn %llu: %s", (unsigned long long)s->id, s->detail);
		break;
	}
	/* what a client sent while its broker was being connected is read (and observed) first: closing a socket with
	 * bytes unread sends a reset, and such a failure (a broker's TLS, no memory) closes the client, as any other */
	if (!s->leg[SIDE_UPSTREAM].connected)
		read_rest_if_open(&s->leg[SIDE_CLIENT]);
	session_end(s);
}

/* How often a client waiting for its broker's connect is looked at: has it gone? */
#define CLIENT_GONE_CHECK_MS 500

/* A client that closed (a FIN, or a reset) while its broker connect was pending is read from then on, as every
 * client was before the connect, so its end is seen and handled as any (a reset ends the session, a FIN is passed
 * on once the broker is connected, within the drain timeout), rather than once the connect is done or given up
 * (minutes, without a --handshake-timeout). Its session goes to no other address after that. A timer and poll(),
 * not the event loop: epoll would report the waiting bytes on every turn (libevent keeps no edge trigger on a
 * socket whose bufferevent also watches it). */
static void on_client_check(evutil_socket_t fd, short what, void *arg)
{
	struct tap_session *s = arg;
	struct leg *client = &s->leg[SIDE_CLIENT];
	(void)fd;
	(void)what;
	struct pollfd p = {.fd = client->fd, .events = POLLRDHUP};
	if (poll(&p, 1, 0) != 1 || !(p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
		return;
	stop_awaiting_broker(s);
	s->client_left = true;
	set_reading(client, client->reading);
}

void tap_leg_await_broker(struct leg *client)
{
	struct tap_session *s = client->s;
	if (s->client_gone || client->fd < 0)
		return;
	/* without memory for it, a client that leaves is noticed once the connect is done, as any EOF */
	struct timeval every = {0, CLIENT_GONE_CHECK_MS * 1000};
	s->client_gone = event_new(s->px->base, -1, EV_PERSIST, on_client_check, s);
	if (s->client_gone && evtimer_add(s->client_gone, &every) < 0)
		stop_awaiting_broker(s);
}

/* Turns reading from a leg on or off. A plain upstream leg's read event
 * waits for the connect; the wish is kept and applied then. */
static void set_reading(struct leg *l, bool on)
{
	struct tap_proxy *px = l->s->px;
	if (l->side == SIDE_UPSTREAM && on != l->reading && px->hooks.held)
		px->hooks.held(px->hooks.ctx, l->s->obs, !on, tap_now_us());
	l->reading = on;
	if (tap_leg_awaits_broker(l)) { /* see connect_upstream */
		tap_leg_await_broker(l);
		return;
	}
	if (l->tls) {
		tap_tls_leg_reading(l);
		return;
	}
	if (!l->rd || !l->connected)
		return;
	if (on)
		tap_leg_watch(l, l->rd, NULL);
	else
		event_del(l->rd);
}

/* The leg's output, when bytes for it have to be queued anyway: some
 * already wait there, it is still connecting (or in its TLS handshake), it
 * was sent its FIN, or a TLS write is to be repeated. NULL when they can go
 * straight into its socket. */
struct evbuffer *tap_leg_queue_for(const struct leg *to)
{
	if (evbuffer_get_length(to->out) > 0 || to->shut_wr || !to->connected)
		return to->out;
	if (to->tls && (!to->handshaken || to->retry_len || to->write_wants_read))
		return to->out;
	return NULL;
}

/* Calls tap_leg_written once the leg's output drained to `low` bytes (the
 * bufferevent's EV_WRITE low watermark on a plain leg). */
static void set_low_water(struct leg *l, size_t low)
{
	if (l->tls)
		l->low_water = low;
	else
		bufferevent_setwatermark(l->bev, EV_WRITE, low, 0);
}

/* From now on a leg whose writes make no progress for
 * TAP_PROXY_DRAIN_SECONDS ends the session. */
static void set_drain_timeout(struct leg *l)
{
	struct timeval drain = {TAP_PROXY_DRAIN_SECONDS, 0};
	if (l->tls)
		tap_tls_leg_drain(l);
	else
		bufferevent_set_timeouts(l->bev, NULL, &drain);
}

/* Counts bytes read from `from`; past TAP_PROXY_HIGH_WATER queued for its
 * peer, stops reading `from` until that output drains to half. */
void tap_leg_account(struct leg *from, size_t len)
{
	struct tap_proxy *px = from->s->px;
	struct leg *to = from->peer;
	if (from->side == SIDE_CLIENT)
		from->s->client_spoke = true;
	if (from->from_here == TAP_C2S)
		px->stats.bytes_c2s += len;
	else
		px->stats.bytes_s2c += len;
	if (to->out && evbuffer_get_length(to->out) >= TAP_PROXY_HIGH_WATER) {
		set_reading(from, false);
		set_low_water(to, TAP_PROXY_HIGH_WATER / 2);
	}
}

void tap_leg_observe(struct leg *from, const void *data, size_t len, int64_t now)
{
	struct tap_proxy *px = from->s->px;
	if (px->hooks.data)
		px->hooks.data(px->hooks.ctx, from->s->obs, from->from_here, data, len, now);
}

/* Passes `len` bytes read from `from` to its peer, then shows them to the
 * observer (forwarding first keeps the decoder off the latency path):
 * straight into the peer's socket when nothing has to be queued, and what
 * the socket does not take onto the peer's output. */
void tap_leg_pass_on(struct leg *from, const void *data, size_t len, int64_t now)
{
	struct leg *to = from->peer;
	if (to->out) {
		struct evbuffer *q = tap_leg_queue_for(to);
		size_t sent = 0;
		if (!q && to->tls) {
			sent = tap_tls_leg_send(to, data, len);
			q = to->out;
		} else if (!q) {
			/* a failed send is left for the bufferevent's own write to find and report */
			ssize_t n = send(to->fd, data, len, MSG_NOSIGNAL);
			sent = n > 0 ? (size_t)n : 0;
			q = to->out;
		}
		if (sent < len)
			evbuffer_add(q, (const char *)data + sent, len - sent);
	}
	tap_leg_account(from, len);
	tap_leg_observe(from, data, len, now);
}

/* Reads a plain leg straight onto its peer's output queue `q`, so that
 * bytes that would wait there anyway are not copied into it. They are
 * observed before they are committed, as a TLS peer's write may follow
 * their commit. Returns what recv would. */
static ssize_t recv_queued(struct leg *from, struct evbuffer *q)
{
	struct evbuffer_iovec v[2];
	struct iovec iov[2];
	int n = evbuffer_reserve_space(q, TAP_PROXY_MAX_IO, v, 2);
	if (n <= 0) { /* no memory for the queue: the copying path says what happens */
		ssize_t got = recv(from->fd, from->s->px->scratch, TAP_PROXY_MAX_IO, 0);
		if (got > 0)
			tap_leg_pass_on(from, from->s->px->scratch, (size_t)got, tap_now_us());
		return got;
	}
	for (int i = 0; i < n; i++) {
		iov[i].iov_base = v[i].iov_base;
		iov[i].iov_len = v[i].iov_len;
	}
	ssize_t got = readv(from->fd, iov, n);
	if (got <= 0) {
		int err = errno;
		evbuffer_commit_space(q, v, 0);
		errno = err;
		return got;
	}
	int64_t now = tap_now_us();
	size_t left = (size_t)got;
	int used = 0;
	for (; used < n && left > 0; used++) {
		if (v[used].iov_len > left)
			v[used].iov_len = left;
		left -= v[used].iov_len;
		tap_leg_observe(from, v[used].iov_base, v[used].iov_len, now);
	}
	evbuffer_commit_space(q, v, used);
	tap_leg_account(from, (size_t)got);
	return got;
}

/* Reads a plain leg's socket: one recv per wakeup in the common case (no
 * FIONREAD probe, no 4 KiB cap as in libevent 2.1's bufferevent reads), into
 * the scratch buffer when the bytes can be sent on at once, else straight
 * onto the peer's queue; on while reads come back full, up to
 * TAP_PROXY_HIGH_WATER per wakeup so that one busy session cannot starve
 * the others. */
static void on_readable(evutil_socket_t fd, short what, void *arg)
{
	struct leg *from = arg;
	uint8_t *buf = from->s->px->scratch;
	(void)what;
	if (tap_leg_end_if_unwatched(from))
		return;
	if (from->s->reset_later) { /* the client spoke (or left): reset it now */
		session_end(from->s);
		return;
	}
	for (size_t budget = TAP_PROXY_HIGH_WATER; budget > 0 && from->reading;) {
		struct evbuffer *q = from->peer->out ? tap_leg_queue_for(from->peer) : NULL;
		ssize_t got = q ? recv_queued(from, q) : recv(fd, buf, TAP_PROXY_MAX_IO, 0);
		if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return;
		if (got <= 0) {
			tap_leg_event(from, BEV_EVENT_READING | (got == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR), errno, NULL);
			return; /* the session may be gone */
		}
		if (!q)
			tap_leg_pass_on(from, buf, (size_t)got, tap_now_us());
		if ((size_t)got < TAP_PROXY_MAX_IO)
			return; /* the socket is empty */
		budget = (size_t)got < budget ? budget - (size_t)got : 0;
	}
}

/* Reads what a leg sent that still sits unread in its socket, so that it
 * is observed and passed on: a broker's connection.close explaining why a
 * write to it failed, a client's publishes held back by backpressure when
 * the broker went away or when the tap stops. At most TAP_PROXY_REST_MAX or
 * the socket's receive buffer, whichever is more: all the socket holds (the
 * kernel grows a busy socket's buffer up to net.ipv4.tcp_rmem's maximum, 32
 * MiB here, past the 16 MiB that once cut the rest, and the publishes past
 * the cut had no record), while a client that keeps writing into a closing
 * session cannot keep the tap reading. */
static void read_rest(struct leg *l)
{
	size_t left = TAP_PROXY_REST_MAX;
	int rcvbuf = 0;
	socklen_t optlen = sizeof rcvbuf;
	if (l->fd >= 0 && getsockopt(l->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &optlen) == 0 && (size_t)rcvbuf > left)
		left = (size_t)rcvbuf;
	ssize_t got;
	if (l->tls) {
		tap_tls_leg_read_rest(l, left);
		return;
	}
	while (left > 0 && (got = recv(l->fd, l->s->px->scratch, left < TAP_PROXY_MAX_IO ? left : TAP_PROXY_MAX_IO,
				      0)) > 0) {
		tap_leg_pass_on_rest(l, l->s->px->scratch, (size_t)got);
		left -= (size_t)got;
	}
}

void tap_leg_pass_on_rest(struct leg *from, const void *data, size_t len)
{
	int64_t now = tap_now_us();
	if (from->peer->out && !tap_leg_queue_for(from->peer)) {
		tap_leg_pass_on(from, data, len, now);
		return;
	}
	tap_leg_account(from, len);
	tap_leg_observe(from, data, len, now);
}

static void read_rest_if_open(struct leg *l)
{
	if (l->out && l->connected && !l->eof)
		read_rest(l);
}

/* Ends a session, first observing what either side sent that the tap has
 * not read yet: the broker's confirms first, then the client's publishes
 * (each needs its record), both passed on as far as they go. */
static void session_end_reading_rest(struct tap_session *s)
{
	read_rest_if_open(&s->leg[SIDE_UPSTREAM]);
	read_rest_if_open(&s->leg[SIDE_CLIENT]);
	session_end(s);
}

static bool drained(const struct leg *l)
{
	return !l->out || evbuffer_get_length(l->out) == 0;
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
		struct leg *l = &s->leg[i];
		if (!l->out)
			continue;
		set_low_water(l, 0);
		set_drain_timeout(l);
		if (!l->eof)
			set_reading(l, true);
	}
}

/* Passes a FIN on to `to` once its output is empty (TLS: starts closing
 * the session instead, there is no half-close). */
static void pass_fin(struct leg *to)
{
	struct tap_session *s = to->s;
	if (!to->peer->eof || to->shut_wr || !to->out || !to->connected)
		return;
	if (to->tls || to->peer->tls) {
		if (!s->closing)
			begin_closing(s);
	} else if (drained(to)) {
		shutdown(to->fd, SHUT_WR);
		to->shut_wr = true;
	}
}

/* Passes FINs on; ends the session when both directions are finished.
 * Returns true if the session was freed. */
static bool settle(struct tap_session *s)
{
	struct leg *client = &s->leg[SIDE_CLIENT];
	struct leg *upstream = &s->leg[SIDE_UPSTREAM];
	pass_fin(client);
	pass_fin(upstream);
	/* a survivor may still hold bytes it sent before the end, unread
	 * behind backpressure */
	if ((s->closing && drained(client) && drained(upstream)) ||
	    (client->eof && upstream->eof && client->shut_wr && upstream->shut_wr)) {
		session_end_reading_rest(s);
		return true;
	}
	return false;
}

void tap_leg_written(struct leg *to)
{
	if (to->s->closing || to->peer->eof) {
		settle(to->s);
		return;
	}
	set_low_water(to, 0);
	if (to->peer->out)
		set_reading(to->peer, true);
}

/* Plain legs: the bufferevent's output fell to its low watermark. */
static void on_write(struct bufferevent *bev, void *arg)
{
	(void)bev;
	tap_leg_written(arg);
}

static void on_setup_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct leg *l = arg;
	(void)fd;
	(void)what;
	tap_leg_event(l, BEV_EVENT_TIMEOUT, 0, NULL);
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

/* A leg was not set up within --handshake-timeout. An upstream address that took the TCP connection and never
 * sent a byte back (a hung node, a balancer with no backend) is as unreachable as one that does not answer the
 * connect: the session goes on to the name's next address. One that answered and stalled is a TLS failure. */
static void setup_timed_out(struct leg *l)
{
	struct tap_session *s = l->s;
	unsigned ms = s->px->handshake_ms;
	if (l->side == SIDE_CLIENT) {
		session_fail(s, TAP_END_CLIENT_TLS, "TLS handshake timed out after %u ms", ms);
		return;
	}
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	bool tcp_up = l->fd >= 0 && getpeername(l->fd, (struct sockaddr *)&ss, &len) == 0;
	if (!tcp_up || !l->ssl)
		session_fail(s, TAP_END_UNREACHABLE, "connect timed out after %u ms", ms);
	else if (tap_tls_heard(l->ssl))
		session_fail(s, TAP_END_BROKER_TLS, "TLS handshake timed out after %u ms", ms);
	else
		session_fail(s, TAP_END_UNREACHABLE, "no answer to the TLS handshake within %u ms", ms);
}

void tap_leg_watch(struct leg *l, struct event *ev, const struct timeval *tv)
{
	if (ev && event_add(ev, tv) == 0)
		return;
	l->unwatched = true;
	if (l->rd)
		event_active(l->rd, EV_READ, 1);
}

bool tap_leg_end_if_unwatched(struct leg *l)
{
	if (!l->unwatched)
		return false;
	tap_leg_event(l, BEV_EVENT_READING | BEV_EVENT_ERROR, ENOMEM, "no memory to watch the connection");
	return true;
}

/* Who ended a leg with error err: the tap itself when it had no memory (an
 * allocation in the tap, libevent or OpenSSL failed), else `otherwise`. */
static enum tap_proxy_end blame(int err, enum tap_proxy_end otherwise)
{
	return err == ENOMEM ? TAP_END_NO_MEMORY : otherwise;
}

/* What ended a leg, in words; "" (no text in the record) when neither says: errno can be gone by the time a
 * deferred event runs, and strerror(0) is "Success". */
static const char *error_text(int err, const char *why)
{
	if (why)
		return why;
	return err ? evutil_socket_error_to_string(err) : "";
}

void tap_leg_tcp_up(struct leg *l)
{
	struct tap_proxy *px = l->s->px;
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	if (!px->hooks.upstream_local || l->fd < 0 || getsockname(l->fd, (struct sockaddr *)&ss, &len) != 0)
		return;
	char name[80];
	format_sockaddr((struct sockaddr *)&ss, name, sizeof name);
	px->hooks.upstream_local(px->hooks.ctx, l->s->obs, l->s->id, name);
}

void tap_leg_event(struct leg *l, short what, int err, const char *why)
{
	struct tap_session *s = l->s;
	if (what & BEV_EVENT_CONNECTED) { /* TCP connect done, or a TLS handshake done (either leg) */
		l->handshaken = true;
		if (!l->tls && l->setup_timer)
			evtimer_del(l->setup_timer); /* set up: the setup timeout is done */
		if (l->side == SIDE_UPSTREAM) {
			if (!l->tls) /* a TLS leg said so when its TCP connect completed */
				tap_leg_tcp_up(l);
			l->connected = true;
			set_nodelay(l->fd);
			set_reading(l, l->reading);
			stop_awaiting_broker(s); /* the client is read from now on: its EOF is seen there */
			set_reading(l->peer, l->peer->reading); /* its bytes waited for this */
			settle(s);
		} else {
			(void)connect_upstream(s); /* on failure the session is gone */
		}
		return;
	}
	if (what & BEV_EVENT_TIMEOUT) {
		if (s->closing || l->eof || l->peer->eof) /* a drain timeout: the peer took nothing for TAP_PROXY_DRAIN_SECONDS */
			session_end_reading_rest(s);
		else
			setup_timed_out(l);
		return;
	}
	if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
		return;
	if (l->tls && !l->handshaken) { /* ended during its handshake */
		if ((what & BEV_EVENT_ERROR) && why) {
			/* a handshake failure: say why, close, touch no other session */
			session_fail(s, blame(err, l->side == SIDE_CLIENT ? TAP_END_CLIENT_TLS : TAP_END_BROKER_TLS), "%s",
				     why);
			return;
		}
		if (l->side == SIDE_CLIENT) { /* gone before the upstream was opened: nothing to pass on */
			s->why = what & BEV_EVENT_ERROR ? blame(err, TAP_END_CLIENT_RESET) : TAP_END_CLIENT_EOF;
			if (what & BEV_EVENT_ERROR)
				snprintf(s->detail, sizeof s->detail, "%s", error_text(err, NULL));
			session_end(s);
			return;
		}
	}
	if (!l->connected) { /* only the upstream is ever unconnected */
		session_fail(s, blame(err, TAP_END_UNREACHABLE), "%s",
			     err ? evutil_socket_error_to_string(err) : "connection closed");
		return;
	}
	if (s->closing) { /* the side we were draining into went away too */
		session_end_reading_rest(s);
		return;
	}
	/* with deferred callbacks a failed write and the EOF that follows it can
	 * arrive as one event: an error wins, or the bytes queued for a dead peer
	 * would wait forever */
	bool eof = (what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR);
	/* OpenSSL named what broke (a bad record, or an alert: in TLS 1.3 a broker refuses the tap's client
	 * certificate after the tap's handshake is done), not the socket */
	bool tls_error = l->tls && !eof && why;
	if (!l->peer->eof) { /* the first side to go names the reason */
		if (l->side == SIDE_CLIENT)
			s->why = eof ? TAP_END_CLIENT_EOF : blame(err, tls_error ? TAP_END_CLIENT_TLS : TAP_END_CLIENT_RESET);
		else
			s->why = eof ? TAP_END_BROKER_EOF : blame(err, tls_error ? TAP_END_BROKER_TLS : TAP_END_BROKER_RESET);
		if (s->why == TAP_END_CLIENT_TLS || s->why == TAP_END_BROKER_TLS)
			log_tls_failure(s, s->why, why);
	}
	if (eof) {
		l->eof = true;
		set_reading(l, false);
		if (l->peer->out)
			set_low_water(l->peer, 0);
		/* half-closed: a side that stops taking bytes for TAP_PROXY_DRAIN_SECONDS ends the session */
		for (int i = 0; i < 2; i++)
			if (s->leg[i].out)
				set_drain_timeout(&s->leg[i]);
		settle(s);
		return;
	}
	if (!l->peer->eof)
		snprintf(s->detail, sizeof s->detail, "%s", error_text(err, why));
	if (what & BEV_EVENT_WRITING)
		read_rest(l);
	leg_free(l);
	begin_closing(s);
	settle(s);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	(void)bev;
	tap_leg_event(arg, what, EVUTIL_SOCKET_ERROR(), NULL);
}

/* A plain leg: a socket bufferevent (fd -1: the upstream, not connected
 * yet) whose output is the leg's queue; the session reads the socket. */
static int plain_leg_new(struct leg *l, evutil_socket_t fd)
{
	struct tap_proxy *px = l->s->px;
	l->bev = bufferevent_socket_new(px->base, fd, BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
	if (!l->bev)
		return ENOMEM;
	bufferevent_set_max_single_write(l->bev, TAP_PROXY_MAX_IO);
	bufferevent_setcb(l->bev, NULL, on_write, on_event, l);
	bufferevent_enable(l->bev, EV_WRITE);
	l->out = bufferevent_get_output(l->bev);
	l->fd = fd;
	if (fd < 0)
		return 0;
	l->rd = event_new(px->base, fd, EV_READ | EV_PERSIST, on_readable, l);
	return l->rd ? 0 : ENOMEM;
}

static void leg_init(struct tap_session *s, enum side side, bool tls)
{
	struct leg *l = &s->leg[side];
	l->s = s;
	l->peer = &s->leg[side == SIDE_CLIENT ? SIDE_UPSTREAM : SIDE_CLIENT];
	l->side = side;
	l->from_here = side == SIDE_CLIENT ? TAP_C2S : TAP_S2C;
	l->fd = -1;
	l->tls = tls;
	l->connected = side == SIDE_CLIENT;
	l->reading = true;
}

/* Opens the connection to the broker. A TLS client's session opens it
 * only once the client's handshake is done, as HAProxy does: a client that
 * never finishes its handshake costs the broker no connection, and in a
 * reconnect storm the broker's handshakes are not started long before the
 * tap can take its part in them (RabbitMQ drops a TLS handshake that takes
 * more than 5 s). The client is not read until the broker is connected
 * (set_reading): its bytes wait in its socket, so a session whose address
 * is unreachable can still go to another (retry_upstream). Returns false
 * when the session was ended or went to another address. */
static bool connect_upstream(struct tap_session *s)
{
	struct tap_proxy *px = s->px;
	struct leg *upstream = &s->leg[SIDE_UPSTREAM];
	tap_leg_arm_setup(upstream);
	int err = 0;
	if (upstream->tls)
		err = tap_tls_leg_connect(upstream);
	else if (bufferevent_socket_connect(upstream->bev, (struct sockaddr *)&px->upstreams[s->upstream_at],
					    px->upstream_lens[s->upstream_at]) < 0)
		err = EVUTIL_SOCKET_ERROR();
	if (err) {
		if (out_of_fds(err)) {
			fd_shortage(px, err);
			session_fail(s, TAP_END_FD_LIMIT, "%s", evutil_socket_error_to_string(err));
		} else {
			session_fail(s, blame(err, TAP_END_UNREACHABLE), "%s", evutil_socket_error_to_string(err));
		}
		return false;
	}
	if (upstream->tls)
		return true;
	upstream->fd = bufferevent_getfd(upstream->bev);
	upstream->rd = event_new(px->base, upstream->fd, EV_READ | EV_PERSIST, on_readable, upstream);
	if (!upstream->rd) {
		session_fail(s, TAP_END_NO_MEMORY, "out of memory");
		return false;
	}
	return true;
}

static void on_accept(struct evconnlistener *listener, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
	struct tap_proxy *px = arg;
	(void)listener;
	(void)salen;
	struct tap_session *s = calloc(1, sizeof *s);
	if (!s) {
		evutil_closesocket(fd);
		if (px->hooks.refused)
			px->hooks.refused(px->hooks.ctx);
		return;
	}
	s->px = px;
	s->id = ++px->next_id;
	s->upstream_at = px->upstream_at; /* the address its record names, also for a later TLS connect */
	set_nodelay(fd);
	leg_init(s, SIDE_CLIENT, tap_tls_listener(px->tls));
	leg_init(s, SIDE_UPSTREAM, tap_tls_upstream(px->tls));
	struct leg *client = &s->leg[SIDE_CLIENT];
	struct leg *upstream = &s->leg[SIDE_UPSTREAM];
	TAILQ_INSERT_TAIL(&px->sessions, s, link);
	px->stats.accepted++;
	px->stats.active++;
	char peer_name[80];
	format_sockaddr(sa, peer_name, sizeof peer_name);
	if (px->hooks.open)
		s->obs = px->hooks.open(px->hooks.ctx, s->id, peer_name, px->upstream_addr, tap_now_us());
	int err;
	if (client->tls) {
		client->out = evbuffer_new();
		err = client->out ? tap_tls_leg_accept(client, fd) : ENOMEM;
		if (!client->out)
			evutil_closesocket(fd);
	} else {
		err = plain_leg_new(client, fd);
		if (!client->bev)
			evutil_closesocket(fd);
	}
	if (!err) {
		if (upstream->tls)
			err = (upstream->out = evbuffer_new()) ? 0 : ENOMEM;
		else
			err = plain_leg_new(upstream, -1);
	}
	if (err) {
		session_fail(s, TAP_END_NO_MEMORY, "out of memory");
		return;
	}
	if (client->tls) {
		tap_leg_arm_setup(client);
		return; /* the upstream is opened once the handshake is done */
	}
	if (connect_upstream(s))
		set_reading(client, true); /* the upstream is read once it is connected */
}

static void on_accept_error(struct evconnlistener *l, void *arg)
{
	struct tap_proxy *px = arg;
	int err = EVUTIL_SOCKET_ERROR();
	if (!out_of_fds(err)) {
		tap_log_error("accept failed: %s", evutil_socket_error_to_string(err));
		return;
	}
	/* the pending client stays queued and the listener would wake at once:
	 * wait for a session to end (or a while) before trying again */
	fd_shortage(px, err);
	px->accept_paused = true;
	px->accept_pauses++;
	evconnlistener_disable(l);
	struct timeval pause = {0, TAP_PROXY_ACCEPT_PAUSE_MS * 1000};
	if (px->resume_accept)
		evtimer_add(px->resume_accept, &pause);
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
	px->resume_accept = evtimer_new(base, on_resume_accept, px);
	px->shortage_over = evtimer_new(base, on_shortage_over, px);
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
	use_upstream(px, 0);
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
		format_sockaddr((struct sockaddr *)&ss, bound, bound_cap);
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
	while ((s = TAILQ_FIRST(&px->sessions)) != NULL) {
		if (!s->closing && !s->leg[SIDE_CLIENT].eof && !s->leg[SIDE_UPSTREAM].eof) {
			s->why = TAP_END_SHUTDOWN; /* a session already ending keeps its own reason */
			s->detail[0] = '\0';
		}
		session_end_reading_rest(s);
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
