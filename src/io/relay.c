/* The relay: the one read loop of both transports. A leg is read through
 * its struct leg_ops (plainleg.c, tlsleg.c), into the scratch buffer when
 * the bytes can be sent on at once, else straight onto the peer's queue;
 * each chunk is shown to the observer right after it was passed on (or,
 * read onto the queue, before it is committed there), counted, and past
 * TAP_PROXY_HIGH_WATER queued for the peer, reading stops (backpressure
 * as in libevent's sample/le-proxy.c). What the session must decide (a
 * leg ended, a client waits for its broker) goes up through px->up.
 *
 * Buffers, per direction (client -> broker shown; the other is symmetric):
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
 * reading from the leg that fills it stops until it drains to half. */
#include "proxy_int.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* First in a leg's read callback: true when tap_leg_watch failed for it and its session was ended (it may be gone). */
static inline bool end_if_unwatched(struct leg *l)
{
	return l->unwatched && tap_leg_end_unwatched(l);
}

/* The leg's output, when bytes for it have to be queued anyway: some
 * already wait there, it is still connecting (or in its TLS handshake), it
 * was sent its FIN, or a TLS write is to be repeated. NULL when they can go
 * straight into its socket. */
static struct evbuffer *queue_for(const struct leg *to)
{
	if (evbuffer_get_length(to->out) > 0 || to->shut_wr || !to->connected)
		return to->out;
	if (to->tls && (!to->handshaken || to->retry_len || to->write_wants_read))
		return to->out;
	return NULL;
}

/* Turns reading from a leg on or off. A leg that cannot be read yet (a plain
 * upstream connecting, a TLS leg in its handshake) keeps the wish, applied
 * then. */
static void set_reading(struct leg *l, bool on)
{
	struct tap_proxy *px = l->s->px;
	if (on && l->side == SIDE_CLIENT && (l->s->fault_blocked || l->s->fault_kill_armed))
		on = false; /* --fault: a block or a kill keeps the client unread (faultio.c) */
	if (on && l->s->fault_full[l->side])
		on = false; /* --fault: what it sent waits in the rewriter, past its bound (faultio.c) */
	if (l->side == SIDE_UPSTREAM && on != l->reading && px->hooks.held)
		px->hooks.held(px->hooks.ctx, l->s->obs, !on, tap_now_us());
	l->reading = on;
	if (tap_leg_awaits_broker(l)) { /* see connect_upstream in session.c */
		px->up->await_broker(l);
		return;
	}
	l->ops->apply_reading(l);
}

void tap_relay_start_reading(struct leg *l)
{
	set_reading(l, true);
}

void tap_relay_stop_reading(struct leg *l)
{
	set_reading(l, false);
}

void tap_relay_apply_reading(struct leg *l)
{
	set_reading(l, l->reading);
}

/* Counts bytes read from `from`; past TAP_PROXY_HIGH_WATER queued for its
 * peer, stops reading `from` until that output drains to half. */
static void account(struct leg *from, size_t len)
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
		to->ops->set_low_water(to, TAP_PROXY_HIGH_WATER / 2);
	}
}

static void observe(struct leg *from, const void *data, size_t len, int64_t now)
{
	struct tap_proxy *px = from->s->px;
	if (px->hooks.data)
		px->hooks.data(px->hooks.ctx, from->s->obs, from->from_here, data, len, now);
}

/* Passes `len` bytes read from `from` to its peer, then shows them to the
 * observer (forwarding first keeps the decoder off the latency path):
 * straight into the peer's socket when nothing has to be queued, and what
 * the socket does not take onto the peer's output. A failed plain send is
 * left for the bufferevent's own write to find and report, a failed TLS
 * one for the write event's flush. */
static inline void forward(struct leg *to, const void *data, size_t len)
{
	if (to->out) {
		struct evbuffer *q = queue_for(to);
		size_t sent = 0;
		if (!q) {
			sent = to->ops->send(to, data, len);
			q = to->out;
		}
		if (sent < len)
			evbuffer_add(q, (const char *)data + sent, len - sent);
	}
}

void tap_relay_forward(struct leg *to, const void *data, size_t len)
{
	forward(to, data, len);
}

void tap_relay_account_observe(struct leg *from, const void *data, size_t len, int64_t now)
{
	account(from, len);
	observe(from, data, len, now);
}

static void pass_on(struct leg *from, const void *data, size_t len, int64_t now)
{
	if (from->s->fault) { /* --fault: the rewriter decides what goes on (faultio.c) */
		tap_fault_pass_on(from, data, len, now);
		return;
	}
	forward(from->peer, data, len);
	account(from, len);
	observe(from, data, len, now);
}

/* Reads `from` once into `q`, its peer's queue, so that bytes that would
 * wait there anyway are not copied into it. They are observed before they
 * are committed, as a TLS peer's write may follow their commit. Without
 * memory for the queue, the copying path says what happens. */
static size_t read_queued(struct leg *from, struct evbuffer *q, struct leg_read *rd)
{
	struct evbuffer_iovec v[2];
	struct iovec iov[2];
	int n = evbuffer_reserve_space(q, from->ops->read_space, v, from->ops->read_vecs);
	if (n <= 0) {
		struct iovec scratch = {from->s->px->scratch, TAP_PROXY_MAX_IO};
		size_t got = from->ops->recv(from, &scratch, 1, rd);
		if (got)
			pass_on(from, scratch.iov_base, got, tap_leg_now_us());
		return got;
	}
	for (int i = 0; i < n; i++) {
		iov[i].iov_base = v[i].iov_base;
		iov[i].iov_len = v[i].iov_len;
	}
	size_t got = from->ops->recv(from, iov, n, rd);
	int used = 0;
	if (got) {
		int64_t now = tap_leg_now_us();
		size_t left = got;
		for (; used < n && left > 0; used++) {
			if (v[used].iov_len > left)
				v[used].iov_len = left;
			left -= v[used].iov_len;
			observe(from, v[used].iov_base, v[used].iov_len, now);
		}
	}
	evbuffer_commit_space(q, v, used);
	if (got)
		account(from, got);
	return got;
}

/* Reads a leg: one recv per wakeup in the common case (no FIONREAD probe,
 * no 4 KiB cap as in libevent 2.1's bufferevent reads; TLS: as many records
 * as have arrived into the space, so no read() is spent on EAGAIN), on while
 * reads come back full, up to TAP_PROXY_HIGH_WATER per wakeup so that one
 * busy session cannot starve the others. */
static void read_leg(struct leg *from)
{
	struct iovec scratch = {from->s->px->scratch, TAP_PROXY_MAX_IO};
	const struct leg_up *up = from->s->px->up;
	struct leg_read rd; /* not zeroed as a whole: this runs on every wakeup */
	rd.end = LEG_READ_EMPTY;
	rd.err = 0;
	rd.why[0] = '\0';
	from->ios++;
	for (size_t budget = TAP_PROXY_HIGH_WATER; budget > 0 && from->reading;) {
		/* with a rewriter (--fault) the bytes are read into the scratch buffer: it chooses what is queued */
		struct evbuffer *q = from->peer->out && !from->s->fault ? queue_for(from->peer) : NULL;
		size_t got;
		if (q) {
			got = read_queued(from, q, &rd);
		} else {
			got = from->ops->recv(from, &scratch, 1, &rd);
			if (got)
				pass_on(from, scratch.iov_base, got, tap_leg_now_us());
		}
		switch (rd.end) {
		case LEG_READ_FULL:
			budget = got < budget ? budget - got : 0;
			continue;
		case LEG_READ_EMPTY:
		case LEG_READ_WAIT:
			return;
		case LEG_READ_EOF:
			up->event(from, BEV_EVENT_READING | BEV_EVENT_EOF, rd.err, NULL);
			return; /* the session may be gone */
		case LEG_READ_ERROR:
			up->event(from, BEV_EVENT_READING | BEV_EVENT_ERROR, rd.err, rd.why[0] ? rd.why : NULL);
			return;
		}
	}
	/* out of budget, or reading was turned off: what OpenSSL still holds wakes nobody */
	if (rd.end == LEG_READ_FULL && from->reading && from->ops->holds_input)
		event_active(from->rd, EV_READ, 1);
}

void tap_relay_read(struct leg *from)
{
	read_leg(from);
}

void tap_relay_readable(evutil_socket_t fd, short what, void *arg)
{
	struct leg *from = arg;
	(void)fd;
	(void)what;
	if (end_if_unwatched(from))
		return;
	if (from->s->reset_later) { /* the client spoke (or left): reset it now (end_with_reset in session.c) */
		from->s->px->up->end(from->s);
		return;
	}
	if (from->tls && (!from->handshaken || from->write_wants_read)) {
		from->ops->readable(from);
		return; /* the session may be gone; a readable socket wakes us again */
	}
	read_leg(from); /* inline: it runs on every wakeup */
}

/* What a session that is ending read from `from` (read_rest): passed on when it can go straight into the
 * peer's socket, else only observed: bytes queued now would be freed unsent, and a client that keeps writing
 * would decide how much memory they take. */
static void pass_on_rest(struct leg *from, const void *data, size_t len)
{
	int64_t now = tap_leg_now_us();
	if (from->peer->out && !queue_for(from->peer)) {
		pass_on(from, data, len, now);
		return;
	}
	account(from, len);
	observe(from, data, len, now);
}

/* A broker's connection.close explaining why a write to it failed, a
 * client's publishes held back by backpressure when the broker went away or
 * when the tap stops: at most TAP_PROXY_REST_MAX or the socket's receive
 * buffer, whichever is more: all the socket holds (the kernel grows a busy
 * socket's buffer up to net.ipv4.tcp_rmem's maximum, 32 MiB here, past the
 * 16 MiB that once cut the rest, and the publishes past the cut had no
 * record), while a client that keeps writing into a closing session cannot
 * keep the tap reading. A TLS leg is decrypted a record at a time, until
 * its socket is empty. */
void tap_relay_read_rest(struct leg *l)
{
	uint8_t *buf = l->s->px->scratch;
	size_t left = TAP_PROXY_REST_MAX;
	int rcvbuf = 0;
	socklen_t optlen = sizeof rcvbuf;
	if (l->fd >= 0 && getsockopt(l->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &optlen) == 0 && (size_t)rcvbuf > left)
		left = (size_t)rcvbuf;
	size_t got;
	while (left > 0 && (got = l->ops->recv_rest(l, buf, left < TAP_PROXY_MAX_IO ? left : TAP_PROXY_MAX_IO)) > 0) {
		pass_on_rest(l, buf, got);
		left -= got < left ? got : left;
	}
}
