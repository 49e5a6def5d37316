/* A plain TCP leg (struct leg_ops): read by the relay straight from its
 * socket (recv, or readv onto the peer's queue), written straight to the
 * socket when nothing is queued, and otherwise through a socket bufferevent
 * whose output is the leg's queue. The bufferevent never reads: libevent
 * 2.1 caps its reads at 4 KiB and probes FIONREAD first. */
#include "proxy_int.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* The bufferevent's output fell to its low watermark. */
static void on_write(struct bufferevent *bev, void *arg)
{
	struct leg *l = arg;
	(void)bev;
	l->s->px->up->written(l);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	struct leg *l = arg;
	(void)bev;
	l->s->px->up->event(l, what, EVUTIL_SOCKET_ERROR(), NULL);
}

/* A socket bufferevent (fd -1: the upstream, not connected yet) whose output
 * is the leg's queue; the relay reads the socket. */
static int plain_open(struct leg *l, evutil_socket_t fd)
{
	struct tap_proxy *px = l->s->px;
	l->bev = bufferevent_socket_new(px->base, fd, BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
	if (!l->bev) {
		if (fd >= 0)
			evutil_closesocket(fd);
		return ENOMEM;
	}
	bufferevent_set_max_single_write(l->bev, TAP_PROXY_MAX_IO);
	bufferevent_setcb(l->bev, NULL, on_write, on_event, l);
	bufferevent_enable(l->bev, EV_WRITE);
	l->out = bufferevent_get_output(l->bev);
	l->fd = fd;
	if (fd < 0)
		return 0;
	return tap_leg_new_read_event(l) ? 0 : ENOMEM;
}

static int plain_connect(struct leg *l)
{
	struct tap_proxy *px = l->s->px;
	size_t at = l->s->upstream_at;
	int err;
	if (bufferevent_socket_connect(l->bev, (struct sockaddr *)&px->upstreams[at], px->upstream_lens[at]) < 0 &&
	    (err = EVUTIL_SOCKET_ERROR()) != 0)
		return err;
	l->fd = bufferevent_getfd(l->bev);
	return tap_leg_new_read_event(l) ? 0 : LEG_NO_MEMORY;
}

static size_t plain_recv(struct leg *l, const struct iovec *iov, int n, struct leg_read *rd)
{
	ssize_t got = n == 1 ? recv(l->fd, iov[0].iov_base, iov[0].iov_len, 0) : readv(l->fd, iov, n);
	if (got > 0) {
		rd->end = (size_t)got < TAP_PROXY_MAX_IO ? LEG_READ_EMPTY : LEG_READ_FULL;
		return (size_t)got;
	}
	if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
		rd->end = LEG_READ_WAIT;
		return 0;
	}
	rd->end = got == 0 ? LEG_READ_EOF : LEG_READ_ERROR;
	rd->err = errno;
	return 0;
}

static size_t plain_send(struct leg *to, const void *data, size_t len)
{
	ssize_t n = send(to->fd, data, len, MSG_NOSIGNAL);
	return n > 0 ? (size_t)n : 0;
}

static size_t plain_recv_rest(struct leg *l, void *buf, size_t cap)
{
	ssize_t got = recv(l->fd, buf, cap, 0);
	return got > 0 ? (size_t)got : 0;
}

/* A plain upstream leg's read event waits for the connect. */
static void plain_apply_reading(struct leg *l)
{
	if (!l->rd || !l->connected)
		return;
	if (l->reading)
		tap_leg_watch(l, l->rd, NULL);
	else
		event_del(l->rd);
}

/* The bufferevent's EV_WRITE low watermark. */
static void plain_set_low_water(struct leg *l, size_t low)
{
	bufferevent_setwatermark(l->bev, EV_WRITE, low, 0);
}

static void plain_drain(struct leg *l)
{
	struct timeval drain = {TAP_PROXY_DRAIN_SECONDS, 0};
	bufferevent_set_timeouts(l->bev, NULL, &drain);
}

static void plain_free(struct leg *l)
{
	if (l->bev) {
		bufferevent_free(l->bev); /* closes the socket */
		l->bev = NULL;
	}
	if (l->setup_timer) { /* the upstream's connect timer */
		event_free(l->setup_timer);
		l->setup_timer = NULL;
	}
}

const struct leg_ops tap_plain_leg_ops = {
	.open = plain_open,
	.connect = plain_connect,
	.recv = plain_recv,
	.send = plain_send,
	.recv_rest = plain_recv_rest,
	.readable = NULL,
	.apply_reading = plain_apply_reading,
	.set_low_water = plain_set_low_water,
	.drain = plain_drain,
	.free = plain_free,
	.read_space = TAP_PROXY_MAX_IO,
	.read_vecs = 2,
	.holds_input = false,
};
