/* The session policy: one upstream connection per accepted client, opened
 * (and, an address unreachable, tried at the name's next one) before the
 * client is read; setup and drain timers; FINs passed on; teardown. The
 * bytes are moved by relay.c over the legs' transports (plainleg.c,
 * tlsleg.c), which tell this file what happened through tap_session_up.
 *
 * Close: a FIN from one side is passed on as a FIN (shutdown(SHUT_WR)) once
 * everything before it was written, and the other direction keeps flowing
 * until it ends too. A reset or error on one side drains what is queued
 * for the other side, then closes it. TLS has no half-close: a FIN on
 * either side of a session with a TLS leg drains, then closes both.
 * Drain-then-close follows libevent's sample/le-proxy.c. */
#include "proxy_int.h"

#include "amqptap/log.h"
#include "amqptap/tls.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

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

void tap_session_on_shortage_over(evutil_socket_t fd, short what, void *arg)
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

void tap_session_on_resume_accept(evutil_socket_t fd, short what, void *arg)
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
	l->ops->free(l);
	l->out = NULL;
}

/* The client is no longer watched for leaving while its broker connect is pending (await_broker). */
static void stop_awaiting_broker(struct tap_session *s)
{
	if (s->client_gone) {
		event_free(s->client_gone);
		s->client_gone = NULL;
	}
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
	tap_fault_session_free(s);
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
	tap_format_sockaddr((struct sockaddr *)&px->upstreams[at], px->upstream_text, sizeof px->upstream_text);
	return px->upstream_text;
}

void tap_session_use_upstream(struct tap_proxy *px, size_t at)
{
	px->upstream_at = at;
	tap_format_sockaddr((struct sockaddr *)&px->upstreams[at], px->upstream_addr, sizeof px->upstream_addr);
}

/* A session sent to upstream address `failed` found it unreachable: the next sessions go to the next address, if
 * the name has another and no other session moved on already. */
static void next_upstream(struct tap_proxy *px, size_t failed)
{
	if (px->n_upstreams < 2 || failed != px->upstream_at)
		return;
	char was[sizeof px->upstream_addr];
	snprintf(was, sizeof was, "%s", px->upstream_addr);
	tap_session_use_upstream(px, (failed + 1) % px->n_upstreams);
	tap_log_error("upstream %s: %s is unreachable; new connections go to %s", px->upstream_name, was,
		      px->upstream_addr);
}

static bool connect_upstream(struct tap_session *s);
static void leg_init(struct tap_session *s, enum side side);
static void read_rest_if_open(struct leg *l);


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
	leg_init(s, SIDE_UPSTREAM);
	s->upstream_at = (s->upstream_at + 1) % px->n_upstreams;
	s->detail[0] = '\0';
	const char *to = upstream_text(px, s->upstream_at);
	tap_log_error("conn %llu: trying %s", (unsigned long long)s->id, to);
	if (px->hooks.upstream_moved)
		px->hooks.upstream_moved(px->hooks.ctx, s->obs, to);
	if (up->ops->open(up, -1))
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
	tap_relay_apply_reading(client);
}

static void await_broker(struct leg *client)
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


static void read_rest_if_open(struct leg *l)
{
	if (l->out && l->connected && !l->eof)
		tap_relay_read_rest(l);
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

static bool settle(struct tap_session *s);

/* Nothing waits for the leg: in its output, nor (--fault) held for it by the rewriter. */
static bool drained(const struct leg *l)
{
	if (!l->out)
		return true;
	return evbuffer_get_length(l->out) == 0 && !(l->s->fault && tap_fault_held(l->s->fault, l->peer->from_here));
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
		l->ops->set_low_water(l, 0);
		l->ops->drain(l);
		if (!l->eof)
			tap_relay_start_reading(l);
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

/* Backpressure is lifted once the leg drained to its low watermark (half
 * TAP_PROXY_HIGH_WATER); a closing session may be done. */
static void written(struct leg *to)
{
	if (to->s->closing || to->peer->eof) {
		settle(to->s);
		return;
	}
	to->ops->set_low_water(to, 0);
	if (to->peer->out)
		tap_relay_start_reading(to->peer);
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

/* px->up->event: see struct leg_up. */
static void leg_event(struct leg *l, short what, int err, const char *why)
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
			tap_set_nodelay(l->fd);
			tap_relay_apply_reading(l);
			stop_awaiting_broker(s); /* the client is read from now on: its EOF is seen there */
			tap_relay_apply_reading(l->peer); /* its bytes waited for this */
			settle(s);
		} else {
			tap_relay_apply_reading(l); /* not until its broker is connected */
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
		tap_relay_stop_reading(l);
		if (l->peer->out)
			l->peer->ops->set_low_water(l->peer, 0);
		/* half-closed: a side that stops taking bytes for TAP_PROXY_DRAIN_SECONDS ends the session */
		for (int i = 0; i < 2; i++)
			if (s->leg[i].out)
				s->leg[i].ops->drain(&s->leg[i]);
		settle(s);
		return;
	}
	if (!l->peer->eof)
		snprintf(s->detail, sizeof s->detail, "%s", error_text(err, why));
	if (what & BEV_EVENT_WRITING)
		tap_relay_read_rest(l);
	leg_free(l);
	begin_closing(s);
	settle(s);
}

/* A client to be reset spoke (end_with_reset). */
static void end_now(struct tap_session *s)
{
	session_end(s);
}

const struct leg_up tap_session_up = {
	.event = leg_event,
	.written = written,
	.await_broker = await_broker,
	.end = end_now,
};

/* A leg is TLS where the proxy's listener (the client leg) or its upstream is. */
static void leg_init(struct tap_session *s, enum side side)
{
	struct leg *l = &s->leg[side];
	bool tls = side == SIDE_CLIENT ? tap_tls_listener(s->px->tls) : tap_tls_upstream(s->px->tls);
	l->s = s;
	l->peer = &s->leg[side == SIDE_CLIENT ? SIDE_UPSTREAM : SIDE_CLIENT];
	l->side = side;
	l->from_here = side == SIDE_CLIENT ? TAP_C2S : TAP_S2C;
	l->fd = -1;
	l->tls = tls;
	l->ops = tls ? &tap_tls_leg_ops : &tap_plain_leg_ops;
	l->connected = side == SIDE_CLIENT;
	l->reading = true;
}

/* Opens the connection to the broker. A TLS client's session opens it
 * only once the client's handshake is done, as HAProxy does: a client that
 * never finishes its handshake costs the broker no connection, and in a
 * reconnect storm the broker's handshakes are not started long before the
 * tap can take its part in them (RabbitMQ drops a TLS handshake that takes
 * more than 5 s). The client is not read until the broker is connected
 * (tap_relay_start_reading): its bytes wait in its socket, so a session whose address
 * is unreachable can still go to another (retry_upstream). Returns false
 * when the session was ended or went to another address. */
static bool connect_upstream(struct tap_session *s)
{
	struct tap_proxy *px = s->px;
	struct leg *upstream = &s->leg[SIDE_UPSTREAM];
	tap_leg_arm_setup(upstream);
	int err = upstream->ops->connect(upstream);
	if (err == LEG_NO_MEMORY) {
		session_fail(s, TAP_END_NO_MEMORY, "out of memory");
		return false;
	}
	if (err) {
		if (out_of_fds(err)) {
			fd_shortage(px, err);
			session_fail(s, TAP_END_FD_LIMIT, "%s", evutil_socket_error_to_string(err));
		} else {
			session_fail(s, blame(err, TAP_END_UNREACHABLE), "%s", evutil_socket_error_to_string(err));
		}
		return false;
	}
	return true;
}

void tap_session_accept(struct tap_proxy *px, evutil_socket_t fd, const struct sockaddr *sa)
{
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
	tap_set_nodelay(fd);
	leg_init(s, SIDE_CLIENT);
	leg_init(s, SIDE_UPSTREAM);
	struct leg *client = &s->leg[SIDE_CLIENT];
	struct leg *upstream = &s->leg[SIDE_UPSTREAM];
	TAILQ_INSERT_TAIL(&px->sessions, s, link);
	px->stats.accepted++;
	px->stats.active++;
	char peer_name[80];
	tap_format_sockaddr(sa, peer_name, sizeof peer_name);
	if (px->hooks.open)
		s->obs = px->hooks.open(px->hooks.ctx, s->id, peer_name, px->upstream_addr, tap_now_us());
	if (!tap_fault_session_open(s, peer_name) || client->ops->open(client, fd) || upstream->ops->open(upstream, -1)) {
		session_fail(s, TAP_END_NO_MEMORY, "out of memory");
		return;
	}
	if (client->tls) {
		tap_leg_arm_setup(client);
		return; /* the upstream is opened once the handshake is done */
	}
	if (connect_upstream(s))
		tap_relay_start_reading(client); /* the upstream is read once it is connected */
}

void tap_session_accept_failed(struct tap_proxy *px, int err)
{
	if (!out_of_fds(err)) {
		tap_log_error("accept failed: %s", evutil_socket_error_to_string(err));
		return;
	}
	/* the pending client stays queued and the listener would wake at once:
	 * wait for a session to end (or a while) before trying again */
	fd_shortage(px, err);
	px->accept_paused = true;
	px->accept_pauses++;
	evconnlistener_disable(px->listener);
	struct timeval pause = {0, TAP_PROXY_ACCEPT_PAUSE_MS * 1000};
	if (px->resume_accept)
		evtimer_add(px->resume_accept, &pause);
}

void tap_session_close(struct tap_session *s)
{
	if (!s->closing && !s->leg[SIDE_CLIENT].eof && !s->leg[SIDE_UPSTREAM].eof) {
		s->why = TAP_END_SHUTDOWN; /* a session already ending keeps its own reason */
		s->detail[0] = '\0';
	}
	session_end_reading_rest(s);
}

void tap_session_fault_kill(struct tap_session *s, enum tap_fault_kill_mode mode, uint32_t rule)
{
	(void)rule;
	s->why = TAP_END_FAULT;
	snprintf(s->detail, sizeof s->detail, "--fault kill (%s)", mode == TAP_FAULT_KILL_RESET ? "reset" : "close");
	if (mode == TAP_FAULT_KILL_RESET) {
		reset_client_on_close(s);
		session_end_reading_rest(s);
		return;
	}
	/* close: connection.close 320 as a broker going away sends it, then the client is drained and closed; the
	 * broker's connection is closed now (it gets a FIN: what it had is processed, its answers are not read) */
	struct leg *client = &s->leg[SIDE_CLIENT];
	uint8_t frame[300];
	size_t n = tap_fault_close_frame(frame, sizeof frame, "CONNECTION_FORCED - amqptap fault injection");
	if (client->out)
		tap_relay_forward(client, frame, n);
	struct leg *upstream = &s->leg[SIDE_UPSTREAM];
	if (upstream->out) {
		read_rest_if_open(upstream);
		leg_free(upstream);
	}
	if (!s->closing)
		begin_closing(s);
	settle(s);
}
