/* A TLS leg of a session: OpenSSL reads the leg's socket through tls.c's
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
#include "session.h"

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
#include <unistd.h>

static void step_handshake(struct leg *l);
static void flush(struct leg *l);

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
				bool keep = l->ios >= BUSY_IOS;
				tap_tls_keep_buffers(l->ssl, keep);
				busy += keep;
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

/* The peer's output when the decrypted bytes must be queued there, else
 * NULL (they go to px->scratch and straight on). */
static struct evbuffer *target(const struct leg *from)
{
	return from->peer->out ? tap_leg_queue_for(from->peer) : NULL;
}

/* Decrypts what the leg has, up to TAP_PROXY_HIGH_WATER per wakeup. */
static void read_some(struct leg *from)
{
	struct tap_proxy *px = from->s->px;
	char why[160] = "";
	size_t budget = TAP_PROXY_HIGH_WATER;
	enum tap_tls_step st = TAP_TLS_OK;
	int err = 0; /* the failed read's errno: passing on what came before it may set errno again */
	from->ios++;
	while (budget > 0 && from->reading && st == TAP_TLS_OK) {
		struct evbuffer *q = target(from);
		size_t got = 0, cap = TAP_PROXY_MAX_IO;
		struct evbuffer_iovec v;
		uint8_t *dst = px->scratch;
		if (q) {
			if (evbuffer_reserve_space(q, TAP_TLS_READ_SPACE, &v, 1) != 1) {
				q = NULL; /* no memory for the queue: the copying path says what happens */
			} else {
				dst = v.iov_base;
				cap = v.iov_len;
			}
		}
		/* one record per SSL_read: fill the space with as many as have
		 * arrived; once OpenSSL holds nothing more, the socket is empty
		 * (or, if the read() filled the BIO, readable again: epoll says so),
		 * so no read() is spent on EAGAIN */
		bool emptied = false;
		while (got < cap) {
			size_t n = 0;
			st = tap_tls_read(from->ssl, dst + got, cap - got, &n, why, sizeof why);
			if (st != TAP_TLS_OK) {
				err = errno;
				break;
			}
			got += n;
			if (!tap_tls_pending(from->ssl)) {
				emptied = true;
				break;
			}
		}
		int64_t now = tap_now_us();
		if (q) {
			v.iov_len = got;
			if (got)
				tap_leg_observe(from, dst, got, now);
			evbuffer_commit_space(q, &v, got ? 1 : 0);
			if (got)
				tap_leg_account(from, got);
		} else if (got) {
			tap_leg_pass_on(from, dst, got, now);
		}
		budget = got < budget ? budget - got : 0;
		if (emptied)
			return;
	}
	switch (st) {
	case TAP_TLS_OK: /* out of budget, or reading was turned off */
		if (from->reading && tap_tls_pending(from->ssl))
			event_active(from->rd, EV_READ, 1); /* no readiness event will say so */
		return;
	case TAP_TLS_WANT_READ:
		return;
	case TAP_TLS_WANT_WRITE:
		from->read_wants_write = true;
		arm_write(from);
		return;
	case TAP_TLS_CLOSED:
		tap_leg_event(from, BEV_EVENT_READING | BEV_EVENT_EOF, 0, NULL);
		return;
	case TAP_TLS_FAILED:
		from->failed = true;
		tap_leg_event(from, BEV_EVENT_READING | BEV_EVENT_ERROR, err, why[0] ? why : NULL);
		return;
	}
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
	struct leg *l = arg;
	(void)fd;
	(void)what;
	if (tap_leg_end_if_unwatched(l))
		return;
	if (!l->handshaken) {
		if (l->side == SIDE_CLIENT && !l->first_step_done)
			hand_over(l);
		else
			step_handshake(l);
		return;
	}
	if (l->write_wants_read) {
		l->write_wants_read = false;
		flush(l);
		return; /* the session may be gone; a readable socket wakes us again */
	}
	read_some(l);
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
		tap_leg_event(l, BEV_EVENT_WRITING | BEV_EVENT_ERROR, err, why[0] ? why : NULL);
		return;
	}
	if (len == 0 && !l->read_wants_write)
		event_del(l->wr);
	if (progress && evbuffer_get_length(l->out) <= l->low_water)
		tap_leg_written(l); /* last: the session may be gone */
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
	struct leg *l = arg;
	if (what & EV_TIMEOUT) {
		tap_leg_event(l, BEV_EVENT_WRITING | BEV_EVENT_TIMEOUT, 0, NULL);
		return;
	}
	if (l->side == SIDE_UPSTREAM && !l->tcp_up) {
		int err = 0;
		socklen_t len = sizeof err;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			err = errno;
		if (err) {
			tap_leg_event(l, BEV_EVENT_ERROR, err, NULL);
			return;
		}
		l->tcp_up = true;
		tap_leg_tcp_up(l);
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
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
		read_some(l);
		return;
	}
	flush(l);
}

size_t tap_tls_leg_send(struct leg *to, const void *data, size_t len)
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
		tap_tls_leg_reading(l);
		tap_leg_event(l, BEV_EVENT_CONNECTED, 0, NULL);
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
		tap_leg_event(l, BEV_EVENT_READING | BEV_EVENT_EOF, 0, NULL);
		return;
	case TAP_TLS_FAILED:
		l->failed = true;
		tap_leg_event(l, BEV_EVENT_READING | BEV_EVENT_ERROR, err, why[0] ? why : NULL);
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
		tap_leg_event(l, BEV_EVENT_READING | BEV_EVENT_EOF, 0, NULL);
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
	l->rd = event_new(px->base, fd, EV_READ | EV_PERSIST, on_readable, l);
	l->wr = event_new(px->base, fd, EV_WRITE | EV_PERSIST, on_writable, l);
	if (!l->rd || !l->wr || !l->ssl)
		return ENOMEM;
	if (!evbuffer_add_cb(l->out, on_queued, l) || evbuffer_defer_callbacks(l->out, px->base) < 0)
		return ENOMEM;
	return 0;
}

int tap_tls_leg_accept(struct leg *l, evutil_socket_t fd)
{
	l->ssl = tap_tls_accept_ssl(l->s->px->tls, fd);
	int err = leg_setup(l, fd);
	if (err)
		return err;
	return event_add(l->rd, NULL) == 0 ? 0 : ENOMEM; /* the ClientHello */
}

int tap_tls_leg_connect(struct leg *l)
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

void tap_tls_leg_reading(struct leg *l)
{
	if (!l->handshaken || !l->rd)
		return;
	bool awaits_broker = tap_leg_awaits_broker(l);
	if (!l->reading || awaits_broker) {
		event_del(l->rd);
		if (awaits_broker)
			tap_leg_await_broker(l); /* a client is read once its broker is connected */
		return;
	}
	tap_leg_watch(l, l->rd, NULL);
	if (tap_tls_pending(l->ssl))
		event_active(l->rd, EV_READ, 1); /* what OpenSSL already holds wakes nobody */
}

void tap_tls_leg_read_rest(struct leg *l, size_t cap)
{
	uint8_t *buf = l->s->px->scratch;
	char why[160];
	size_t got;
	if (!l->ssl || !l->handshaken || l->failed)
		return;
	while (cap > 0 && tap_tls_read(l->ssl, buf, cap < TAP_PROXY_MAX_IO ? cap : TAP_PROXY_MAX_IO, &got, why,
				       sizeof why) == TAP_TLS_OK) {
		tap_leg_pass_on_rest(l, buf, got);
		cap -= got < cap ? got : cap;
	}
}

void tap_tls_leg_drain(struct leg *l)
{
	l->draining = true;
	if (l->wr && event_pending(l->wr, EV_WRITE, NULL))
		arm_write(l);
}

void tap_tls_leg_free(struct leg *l, bool reset)
{
	struct tap_proxy *px = l->s->px;
	tap_tls_work_cancel(px->handshaker, l);
	if (l->wr)
		event_free(l->wr);
	if (l->setup_timer)
		event_free(l->setup_timer);
	l->wr = l->setup_timer = NULL;
	tap_tls_free_ssl(l->ssl, l->handshaken && !l->failed && !reset);
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
