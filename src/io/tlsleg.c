/* A TLS leg of a session (struct leg_ops): OpenSSL reads the leg's socket through tls.c's
 * reading BIO (one read() per burst of records, handed over a record at a
 * time) and writes it itself, SSL_read decrypts straight into the peer's
 * queue (or into the scratch buffer when the bytes can be sent on at once),
 * and the leg's plaintext queue is written with one SSL_write per
 * full-size record. No filter bufferevent and no ciphertext evbuffer.
 *
 *   states: CONNECTING (upstream TCP) --writable--> HANDSHAKE --done--> OPEN
 *
 * A client's first handshake step (its ClientHello answered with the
 * server's flight: the signature, the costly part) runs on the handshaker's
 * thread (tlswork.c), in the order the clients arrived; the loop meanwhile
 * moves the bytes of the sessions already carrying traffic and runs every
 * other step (the client's Finished, every upstream step), so a handshake
 * once started finishes without waiting behind the ones not started yet
 * (the broker gives up on a TLS handshake after 5 s). */
#include "proxy_int.h"

#include "amqptap/tls.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

static void step_handshake(struct leg *l);
static void flush(struct leg *l);
static void tls_apply_reading(struct leg *l);

static void arm_write(struct leg *l)
{
	struct timeval drain = {TAP_PROXY_DRAIN_SECONDS, 0};
	tap_leg_watch(l, l->wr, l->draining ? &drain : NULL);
}

static void on_first_step(struct leg *l, bool gone, enum tap_tls_step st, int err, const char *why);

/* Hands a client's first handshake step to the handshaker (tlswork.c); the
 * loop does it itself only when there is no memory to hand it over. */
static void hand_over(struct leg *l)
{
	if (l->job)
		return;
	event_del(l->rd); /* the SSL and the socket are the handshaker's until the step is back */
	event_del(l->wr);
	/* --handshake-timeout bounds the client, not the handshaker's queue:
	 * its clock stops meanwhile, and goes on with what was left when the
	 * step is back */
	if (l->setup_timer && evtimer_pending(l->setup_timer, NULL)) {
		int64_t left = l->setup_due_us - tap_now_us();
		l->setup_left_us = left > 0 ? left : 1;
		evtimer_del(l->setup_timer);
	}
	if (!tap_tls_work_add(l->s->px->handshaker, l)) {
		l->first_step_done = true;
		tap_leg_arm_setup(l);
		step_handshake(l);
	}
}

/* OpenSSL's record buffers (about 34 KiB a leg with both directions):
 * a leg gives them back after every record, so that quiet connections (a
 * reconnect storm's, an idle publisher's) cost little, until it is busy
 * (at least BUSY_IOS reads and writes in a sweep period); then it keeps
 * them, as freeing and allocating 16 KiB around every record cost 6 % of
 * the tap's instructions at W=1000 / 64 B (callgrind), until a period in
 * which it is no longer busy. */
#define BUFFER_SWEEP_SECONDS 1
#define BUSY_IOS 100

static void on_buffer_sweep(evutil_socket_t fd, short what, void *arg)
{
	struct tap_proxy *px = arg;
	(void)fd;
	(void)what;
	struct tap_session *s;
	uint64_t busy = 0;
	TAILQ_FOREACH(s, &px->sessions, link) {
		for (size_t i = 0; i < 2; i++) {
			struct leg *l = &s->leg[i];
			if (l->ssl && l->handshaken) {
				if (l->ios >= BUSY_IOS) {
					tap_tls_keep_buffers(l->ssl);
					busy++;
				} else {
					tap_tls_release_buffers(l->ssl);
				}
			}
			l->ios = 0;
		}
	}
	px->stats.tls_busy_legs = busy;
}

int tap_tls_proxy_init(struct tap_proxy *px)
{
	px->buffer_sweep = event_new(px->base, -1, EV_PERSIST, on_buffer_sweep, px);
	struct timeval every = {BUFFER_SWEEP_SECONDS, 0};
	if (!px->buffer_sweep || (px->tls && evtimer_add(px->buffer_sweep, &every) < 0))
		return -1;
	if (tap_tls_listener(px->tls) && !(px->handshaker = tap_tls_work_new(px->base, on_first_step)))
		return -1;
	return 0;
}

void tap_tls_proxy_free(struct tap_proxy *px)
{
	tap_tls_work_free(px->handshaker);
	if (px->buffer_sweep)
		event_free(px->buffer_sweep);
	px->handshaker = NULL;
	px->buffer_sweep = NULL;
}

/* How a read stopped short (st is not TAP_TLS_OK): what it asks for. */
static void read_stopped(struct leg *from, enum tap_tls_step st, struct leg_read *rd)
{
	switch (st) {
	case TAP_TLS_OK:
	case TAP_TLS_WANT_READ:
		rd->end = LEG_READ_WAIT;
		return;
	case TAP_TLS_WANT_WRITE:
		rd->end = LEG_READ_WAIT;
		from->read_wants_write = true;
		arm_write(from);
		return;
	case TAP_TLS_CLOSED:
		rd->end = LEG_READ_EOF;
		rd->err = 0;
		return;
	case TAP_TLS_FAILED:
		rd->end = LEG_READ_ERROR;
		from->failed = true;
		return;
	}
}

/* One record per SSL_read: fills the space with as many as have arrived;
 * once OpenSSL holds nothing more, the socket is empty (or, if the read()
 * filled the BIO, readable again: epoll says so), so no read() is spent on
 * EAGAIN. */
static size_t tls_recv(struct leg *from, const struct iovec *iov, int n, struct leg_read *rd)
{
	uint8_t *dst = iov[0].iov_base;
	size_t cap = iov[0].iov_len, got = 0;
	(void)n; /* read_vecs is 1 */
	while (got < cap) {
		size_t k = 0;
		enum tap_tls_step st = tap_tls_read(from->ssl, dst + got, cap - got, &k, rd->why, sizeof rd->why);
		if (st != TAP_TLS_OK) {
			rd->err = errno; /* the failed read's: passing on what came before it may set errno again */
			read_stopped(from, st, rd);
			return got;
		}
		got += k;
		if (!tap_tls_pending(from->ssl)) {
			rd->end = LEG_READ_EMPTY;
			return got;
		}
	}
	rd->end = LEG_READ_FULL;
	return got;
}

/* A read wakeup before the handshake is done, or for a write that needs the
 * socket readable. */
static void tls_readable(struct leg *l)
{
	if (!l->handshaken) {
		if (l->side == SIDE_CLIENT && !l->first_step_done)
			hand_over(l);
		else
			step_handshake(l);
		return;
	}
	l->write_wants_read = false;
	flush(l); /* the session may be gone */
}

/* Writes the queue, one record per SSL_write; arms the write event when the
 * socket is full, and says so when the queue drained to its low watermark. */
static void flush(struct leg *l)
{
	char why[160] = "";
	bool progress = false;
	size_t len;
	l->ios++;
	while ((len = evbuffer_get_length(l->out)) > 0) {
		size_t n = len < TAP_TLS_RECORD ? len : TAP_TLS_RECORD;
		if (n < l->retry_len)
			n = l->retry_len;
		const uint8_t *p = evbuffer_pullup(l->out, (ev_ssize_t)n);
		size_t put = 0;
		enum tap_tls_step st = p ? tap_tls_write(l->ssl, p, n, &put, why, sizeof why) : TAP_TLS_FAILED;
		if (st == TAP_TLS_OK) {
			evbuffer_drain(l->out, put);
			l->retry_len = 0;
			progress = true;
			continue;
		}
		if (st == TAP_TLS_WANT_WRITE || st == TAP_TLS_WANT_READ) {
			l->retry_len = n;
			l->write_wants_read = st == TAP_TLS_WANT_READ;
			if (st == TAP_TLS_WANT_WRITE)
				arm_write(l);
			break;
		}
		int err = p ? errno : ENOMEM;
		if (!err && !why[0]) /* OpenSSL's "EOF", which a write cannot meet: a BIO failed and did not say why */
			snprintf(why, sizeof why, "TLS write failed without an error code");
		l->failed = true;
		l->s->px->up->event(l, BEV_EVENT_WRITING | BEV_EVENT_ERROR, err, why[0] ? why : NULL);
		return;
	}
	if (len == 0 && !l->read_wants_write)
		event_del(l->wr);
	if (progress && evbuffer_get_length(l->out) <= l->low_water)
		l->s->px->up->written(l); /* last: the session may be gone */
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
	struct leg *l = arg;
	if (what & EV_TIMEOUT) {
		l->s->px->up->event(l, BEV_EVENT_WRITING | BEV_EVENT_TIMEOUT, 0, NULL);
		return;
	}
	if (l->side == SIDE_UPSTREAM && !l->tcp_up) {
		int err = 0;
		socklen_t len = sizeof err;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			err = errno;
		if (err) {
			l->s->px->up->event(l, BEV_EVENT_ERROR, err, NULL);
			return;
		}
		l->tcp_up = true;
		tap_leg_tcp_up(l);
		tap_set_nodelay(fd);
		step_handshake(l);
		return;
	}
	if (!l->handshaken) {
		if (l->side == SIDE_CLIENT && !l->first_step_done)
			hand_over(l);
		else
			step_handshake(l);
		return;
	}
	if (l->read_wants_write) {
		l->read_wants_write = false;
		event_del(l->wr);
		l->s->px->read(l); /* the relay's read loop */
		return;
	}
	flush(l);
}

static size_t tls_send(struct leg *to, const void *data, size_t len)
{
	char why[160];
	size_t done = 0;
	to->ios++;
	while (done < len) {
		size_t n = len - done < TAP_TLS_RECORD ? len - done : TAP_TLS_RECORD;
		size_t put = 0;
		enum tap_tls_step st = tap_tls_write(to->ssl, (const uint8_t *)data + done, n, &put, why, sizeof why);
		if (st == TAP_TLS_OK) {
			done += put;
			continue;
		}
		if (st == TAP_TLS_WANT_READ) {
			to->retry_len = n;
			to->write_wants_read = true;
		} else if (st == TAP_TLS_WANT_WRITE) {
			to->retry_len = n;
			arm_write(to);
		} else {
			arm_write(to); /* the write event's flush meets the failure again and reports it */
		}
		break;
	}
	return done;
}

/* New bytes in the queue (a deferred callback: what one loop turn queued is
 * written together). */
static void on_queued(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
	struct leg *l = arg;
	(void)buf;
	if (info->n_added > 0 && l->handshaken && !l->retry_len && !l->write_wants_read)
		flush(l);
}

/* What a handshake step's outcome asks for; err is its errno. */
static void after_step(struct leg *l, enum tap_tls_step st, int err, const char *why)
{
	switch (st) {
	case TAP_TLS_OK:
		l->handshaken = true;
		if (l->setup_timer)
			evtimer_del(l->setup_timer);
		event_del(l->wr);
		if (evbuffer_get_length(l->out) > 0)
			event_active(l->wr, EV_WRITE, 1); /* what was queued during the handshake */
		tls_apply_reading(l);
		l->s->px->up->event(l, BEV_EVENT_CONNECTED, 0, NULL);
		/* the session may be gone (its upstream could not be opened) */
		return;
	case TAP_TLS_WANT_READ:
		event_del(l->wr);
		tap_leg_watch(l, l->rd, NULL);
		return;
	case TAP_TLS_WANT_WRITE:
		tap_leg_watch(l, l->wr, NULL);
		return;
	case TAP_TLS_CLOSED:
		l->s->px->up->event(l, BEV_EVENT_READING | BEV_EVENT_EOF, 0, NULL);
		return;
	case TAP_TLS_FAILED:
		l->failed = true;
		l->s->px->up->event(l, BEV_EVENT_READING | BEV_EVENT_ERROR, err, why[0] ? why : NULL);
		return;
	}
}

static void step_handshake(struct leg *l)
{
	char why[160] = "";
	enum tap_tls_step st = tap_tls_handshake(l->ssl, why, sizeof why);
	after_step(l, st, errno, why);
}

/* The handshaker gave a client's first step back. */
static void on_first_step(struct leg *l, bool gone, enum tap_tls_step st, int err, const char *why)
{
	l->first_step_done = true;
	if (gone) {
		l->s->px->up->event(l, BEV_EVENT_READING | BEV_EVENT_EOF, 0, NULL);
		return;
	}
	tap_leg_arm_setup(l);
	after_step(l, st, err, why); /* may end l's session */
}

/* The events and queue of a TLS leg on socket fd; 0 or an errno. */
static int leg_setup(struct leg *l, evutil_socket_t fd)
{
	struct tap_proxy *px = l->s->px;
	l->fd = fd;
	(void)tap_leg_new_read_event(l); /* checked below */
	l->wr = event_new(px->base, fd, EV_WRITE | EV_PERSIST, on_writable, l);
	if (!l->rd || !l->wr || !l->ssl)
		return ENOMEM;
	if (!evbuffer_add_cb(l->out, on_queued, l) || evbuffer_defer_callbacks(l->out, px->base) < 0)
		return ENOMEM;
	return 0;
}

/* An accepted client waits for its handshake; an upstream (fd -1) gets its
 * queue now and its socket when it connects. */
static int tls_open(struct leg *l, evutil_socket_t fd)
{
	l->out = evbuffer_new();
	if (fd < 0)
		return l->out ? 0 : ENOMEM;
	if (!l->out) {
		evutil_closesocket(fd);
		return ENOMEM;
	}
	l->ssl = tap_tls_accept_ssl(l->s->px->tls, fd);
	int err = leg_setup(l, fd);
	if (err)
		return err;
	return event_add(l->rd, NULL) == 0 ? 0 : ENOMEM; /* the ClientHello */
}

static int tls_connect(struct leg *l)
{
	struct tap_proxy *px = l->s->px;
	const struct sockaddr_storage *to = &px->upstreams[l->s->upstream_at];
	evutil_socket_t fd = socket(to->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return errno;
	if (connect(fd, (const struct sockaddr *)to, (socklen_t)px->upstream_lens[l->s->upstream_at]) < 0 &&
	    errno != EINPROGRESS) {
		int err = errno;
		close(fd);
		return err;
	}
	l->ssl = tap_tls_connect_ssl(px->tls, fd);
	int err = leg_setup(l, fd);
	if (err)
		return err; /* the fd is the leg's now: freed with it */
	return event_add(l->wr, NULL) == 0 ? 0 : ENOMEM; /* the connect */
}

/* A client waiting for its broker is not read (tap_leg_awaits_broker). */
static void tls_apply_reading(struct leg *l)
{
	if (!l->handshaken || !l->rd)
		return;
	if (!l->reading || tap_leg_awaits_broker(l)) {
		event_del(l->rd);
		return;
	}
	tap_leg_watch(l, l->rd, NULL);
	if (tap_tls_pending(l->ssl))
		event_active(l->rd, EV_READ, 1); /* what OpenSSL already holds wakes nobody */
}

/* Decrypts one record of what a handshaken leg still holds, unread. */
static size_t tls_recv_rest(struct leg *l, void *buf, size_t cap)
{
	char why[160];
	size_t got;
	if (!l->ssl || !l->handshaken || l->failed)
		return 0;
	return tap_tls_read(l->ssl, buf, cap, &got, why, sizeof why) == TAP_TLS_OK ? got : 0;
}

static void tls_set_low_water(struct leg *l, size_t low)
{
	l->low_water = low;
}

static void tls_drain(struct leg *l)
{
	l->draining = true;
	if (l->wr && event_pending(l->wr, EV_WRITE, NULL))
		arm_write(l);
}

/* A client to be reset gets no close_notify either. */
static void tls_free(struct leg *l)
{
	struct tap_proxy *px = l->s->px;
	bool reset = l->side == SIDE_CLIENT && l->s->reset_client;
	tap_tls_work_cancel(px->handshaker, l);
	if (l->wr)
		event_free(l->wr);
	if (l->setup_timer)
		event_free(l->setup_timer);
	l->wr = l->setup_timer = NULL;
	if (l->handshaken && !l->failed && !reset)
		tap_tls_close_ssl(l->ssl);
	else
		tap_tls_free_ssl(l->ssl);
	l->ssl = NULL;
	if (l->out) {
		/* a deferred callback may be pending: it holds the buffer, not the leg */
		(void)evbuffer_remove_cb(l->out, on_queued, l); /* -1: it was never added */
		evbuffer_free(l->out);
	}
	if (l->fd >= 0)
		close(l->fd);
	l->fd = -1;
}

const struct leg_ops tap_tls_leg_ops = {
	.open = tls_open,
	.connect = tls_connect,
	.recv = tls_recv,
	.send = tls_send,
	.recv_rest = tls_recv_rest,
	.readable = tls_readable,
	.apply_reading = tls_apply_reading,
	.set_low_water = tls_set_low_water,
	.drain = tls_drain,
	.free = tls_free,
	.read_space = TAP_TLS_READ_SPACE,
	.read_vecs = 1,
	.holds_input = true,
};
