/* The floor for scripts/bench.sh: the least a user-space TCP relay can do.
 * One thread, level-triggered epoll, and per wakeup one recv and one send
 * straight to the peer (the tap's own pattern for plain legs), with no
 * decoding, no records, no timestamps and no event library. Whatever this
 * relay costs on a machine, no relay in user space can undercut it; the
 * benchmark shows it next to HAProxy and the tap so that a target the
 * machine itself cannot reach is told apart from one the tap misses.
 *
 * Usage: bench_relay LISTEN_PORT UPSTREAM_PORT [SPIN_US] (ports on
 * 127.0.0.1). With SPIN_US the relay busy-polls that long after its last
 * event before it sleeps in epoll_wait: what it takes to buy latency with
 * CPU (scripts/bench.sh measures it as "floor+spin"). Runs until killed.
 * Not a product: a peer that misbehaves just ends its pair. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RELAY_BUF (256 * 1024)

/* One direction: bytes read from one socket that `to` has not taken yet. */
struct pipe {
	int to;
	size_t off, len;
	bool eof;  /* the reading side sent FIN */
	bool shut; /* FIN passed on to `to` */
	uint8_t buf[RELAY_BUF];
};

struct pair {
	struct pipe dir[2]; /* [0] client -> upstream, [1] upstream -> client */
	int fd[2];          /* [0] client, [1] upstream */
};

/* What one epoll registration points at: a socket of a pair. */
struct end {
	struct pair *p;
	int side;
	uint32_t armed; /* the events registered now */
};

static int ep;
static struct end listener; /* its `p` is NULL */

static int tcp_socket(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	if (fd >= 0)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

static struct sockaddr_in loopback(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

/* Registers side `i` of the pair for what it waits for now, when that
 * changed: input while its outgoing pipe is empty and open, output while
 * bytes wait for it. */
static void rearm(struct pair *p, struct end *ends, int i)
{
	struct pipe *in = &p->dir[i], *out = &p->dir[!i];
	struct epoll_event ev = {.data.ptr = &ends[i]};
	if (!in->eof && in->len == 0)
		ev.events |= EPOLLIN;
	if (out->len > 0)
		ev.events |= EPOLLOUT;
	if (ev.events != ends[i].armed)
		epoll_ctl(ep, EPOLL_CTL_MOD, p->fd[i], &ev);
	ends[i].armed = ev.events;
}

static void pair_close(struct pair *p, struct end *ends)
{
	for (int i = 0; i < 2; i++) {
		epoll_ctl(ep, EPOLL_CTL_DEL, p->fd[i], NULL);
		close(p->fd[i]);
	}
	free(ends);
	free(p);
}

/* Sends what pipe `d` holds; passes a FIN on once it is empty. False on error. */
static bool flush(struct pipe *d)
{
	while (d->len > 0) {
		ssize_t n = send(d->to, d->buf + d->off, d->len, MSG_NOSIGNAL);
		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
		d->off += (size_t)n;
		d->len -= (size_t)n;
	}
	d->off = 0;
	if (d->eof && !d->shut) {
		shutdown(d->to, SHUT_WR);
		d->shut = true;
	}
	return true;
}

/* Handles readiness on side `i` of a pair. False when the pair is finished. */
static bool on_event(struct pair *p, int i, uint32_t events)
{
	struct pipe *in = &p->dir[i], *out = &p->dir[!i];
	if ((events & EPOLLOUT) && !flush(out))
		return false;
	if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !in->eof && in->len == 0) {
		ssize_t n = recv(p->fd[i], in->buf, RELAY_BUF, 0);
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			return false;
		if (n == 0)
			in->eof = true;
		if (n > 0)
			in->len = (size_t)n;
		if (!flush(in))
			return false;
	}
	return !(in->shut && out->shut);
}

static void on_accept(int lfd, int upstream_port)
{
	int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
	if (c < 0)
		return;
	int one = 1;
	setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	int u = tcp_socket();
	struct sockaddr_in up = loopback(upstream_port);
	struct pair *p = calloc(1, sizeof *p);
	struct end *ends = calloc(2, sizeof *ends);
	/* a blocking connect to loopback: the relay has nothing better to do meanwhile */
	if (u < 0 || !p || !ends || connect(u, (struct sockaddr *)&up, sizeof up) != 0) {
		perror("bench_relay: upstream");
		close(c);
		if (u >= 0)
			close(u);
		free(p);
		free(ends);
		return;
	}
	fcntl(u, F_SETFL, fcntl(u, F_GETFL) | O_NONBLOCK);
	p->fd[0] = c;
	p->fd[1] = u;
	p->dir[0].to = u;
	p->dir[1].to = c;
	for (int i = 0; i < 2; i++) {
		ends[i] = (struct end){.p = p, .side = i, .armed = EPOLLIN};
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &ends[i]};
		epoll_ctl(ep, EPOLL_CTL_ADD, p->fd[i], &ev);
	}
}

static int64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* epoll_wait that first polls without sleeping for up to `spin_us` after `*last` (the last time it had events). */
static int wait_events(struct epoll_event *evs, int cap, int64_t spin_us, int64_t *last)
{
	int n;
	while (spin_us > 0 && now_us() - *last < spin_us)
		if ((n = epoll_wait(ep, evs, cap, 0)) != 0)
			goto got;
	n = epoll_wait(ep, evs, cap, -1);
got:
	if (n > 0 && spin_us > 0)
		*last = now_us();
	return n;
}

int main(int argc, char **argv)
{
	if (argc != 3 && argc != 4) {
		fprintf(stderr, "usage: %s LISTEN_PORT UPSTREAM_PORT [SPIN_US]\n", argv[0]);
		return 2;
	}
	int listen_port = atoi(argv[1]), upstream_port = atoi(argv[2]);
	int64_t spin_us = argc == 4 ? atoll(argv[3]) : 0, last = 0;
	int lfd = tcp_socket(), one = 1;
	struct sockaddr_in at = loopback(listen_port);
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&at, sizeof at) != 0 || listen(lfd, 1024) != 0) {
		perror("bench_relay: listen");
		return 1;
	}
	ep = epoll_create1(0);
	struct epoll_event lev = {.events = EPOLLIN, .data.ptr = &listener};
	epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);
	struct epoll_event evs[64];
	for (;;) {
		int n = wait_events(evs, 64, spin_us, &last);
		for (int k = 0; k < n; k++) {
			struct end *e = evs[k].data.ptr;
			if (e == &listener) {
				on_accept(lfd, upstream_port);
				continue;
			}
			if (!e) /* its pair ended earlier in this batch */
				continue;
			struct pair *p = e->p;
			struct end *ends = e - e->side;
			if (!on_event(p, e->side, evs[k].events)) {
				for (int j = k + 1; j < n; j++) /* forget its later events in this batch */
					if (evs[j].data.ptr == &ends[0] || evs[j].data.ptr == &ends[1])
						evs[j].data.ptr = NULL;
				pair_close(p, ends);
				continue;
			}
			rearm(p, ends, e->side);
			rearm(p, ends, !e->side);
		}
	}
}
