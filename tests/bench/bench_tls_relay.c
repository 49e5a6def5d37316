/* The TLS floor for scripts/bench-tls.sh: the least a user-space relay that
 * terminates TLS from clients and originates TLS to the broker can do. One
 * thread, level-triggered epoll, OpenSSL reading and writing the sockets
 * itself (read-ahead on), and per wakeup: decrypt what one side has into a
 * buffer, encrypt it to the other side, no decoding, no records, no event
 * library. Handshakes and the upstream connect are non-blocking, so it is
 * also the floor for the reconnect storm: per wakeup, every other event
 * first, then one step of a client's handshake (taken all at once, a
 * storm's client handshakes would leave the broker's handshakes waiting
 * until RabbitMQ drops them after 5 s);
 * the upstream leg offers the broker's last session, as HAProxy and the tap
 * do. Whatever this relay costs on a machine, no TLS relay in user space can
 * undercut it by much: the benchmark shows it next to HAProxy and the tap.
 *
 * Usage: bench_tls_relay LISTEN_PORT UPSTREAM_PORT CERT KEY CA CLIENT_CERT CLIENT_KEY [NAME]
 * (ports on 127.0.0.1; the broker's certificate is verified against CA and
 * NAME, default localhost, which is also sent as SNI). Runs until killed.
 * Not a product: a peer that misbehaves just ends its pair. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define RELAY_BUF (64 * 1024)
#define RECORD_MAX 16384

/* One direction: plaintext read from one side that the other has not taken yet. */
struct pipe {
	SSL *to;
	size_t off, len;
	int retry; /* after SSL_ERROR_WANT_WRITE: the length SSL_write must be called with again */
	uint8_t buf[RELAY_BUF];
};

/*   CLIENT_HANDSHAKE --done--> CONNECTING --writable--> UPSTREAM_HANDSHAKE --done--> RELAYING
 *   any phase --error, hang-up--> closed */
enum phase { CLIENT_HANDSHAKE, CONNECTING, UPSTREAM_HANDSHAKE, RELAYING };

struct pair {
	struct pipe dir[2]; /* [0] client -> upstream, [1] upstream -> client */
	SSL *ssl[2];
	int fd[2];
	enum phase phase;
};

struct end {
	struct pair *p;
	int side;
	uint32_t armed;
};

static int ep;
static struct end listener;
static SSL_CTX *server_ctx, *client_ctx;
static const char *name = "localhost";
static int upstream_port;
static SSL_SESSION *upstream_session; /* the broker's latest, offered by the next upstream connection */

static struct sockaddr_in loopback(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

static void nodelay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void set_nonblocking(int fd)
{
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static void rearm(struct pair *p, struct end *ends, int i)
{
	struct pipe *in = &p->dir[i], *out = &p->dir[!i];
	struct epoll_event ev = {.data.ptr = &ends[i]};
	if (in->len == 0)
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
		SSL_free(p->ssl[i]);
		if (p->fd[i] < 0)
			continue;
		epoll_ctl(ep, EPOLL_CTL_DEL, p->fd[i], NULL);
		close(p->fd[i]);
	}
	free(ends);
	free(p);
}

/* Encrypts what pipe `d` holds to its side, a record of at most RECORD_MAX bytes per call. False on error. */
static bool flush(struct pipe *d)
{
	while (d->len > 0) {
		int n = d->retry ? d->retry : (int)(d->len < RECORD_MAX ? d->len : RECORD_MAX);
		int w = SSL_write(d->to, d->buf + d->off, n);
		if (w <= 0) {
			int e = SSL_get_error(d->to, w);
			if (e != SSL_ERROR_WANT_WRITE && e != SSL_ERROR_WANT_READ)
				return false;
			d->retry = n;
			return true;
		}
		d->retry = 0;
		d->off += (size_t)w;
		d->len -= (size_t)w;
	}
	d->off = 0;
	return true;
}

/* Decrypts what side `i` has (records OpenSSL already holds included) into its pipe, until it would block or the
 * pipe is full. False at EOF or on error. */
static bool fill(struct pair *p, int i)
{
	struct pipe *in = &p->dir[i];
	while (in->len < RELAY_BUF) {
		int r = SSL_read(p->ssl[i], in->buf + in->len, (int)(RELAY_BUF - in->len));
		if (r <= 0) {
			int e = SSL_get_error(p->ssl[i], r);
			return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE;
		}
		in->len += (size_t)r;
	}
	return true;
}

/* Moves side `i`'s input on while its pipe can take it. What OpenSSL already read and decrypted does not wake
 * epoll: it is read whenever the pipe is empty. False when the pair is finished. */
static bool pump(struct pair *p, int i, bool readable)
{
	struct pipe *in = &p->dir[i];
	while (in->len == 0 && (readable || SSL_has_pending(p->ssl[i]))) {
		readable = false;
		if (!fill(p, i) || !flush(in))
			return false;
	}
	return true;
}

static bool on_event(struct pair *p, int i, uint32_t events)
{
	if ((events & EPOLLOUT) && (!flush(&p->dir[!i]) || !pump(p, !i, false)))
		return false;
	return pump(p, i, events & (EPOLLIN | EPOLLHUP | EPOLLERR));
}

static void watch(struct end *e, int fd, uint32_t events)
{
	struct epoll_event ev = {.events = events, .data.ptr = e};
	if (events != e->armed)
		epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
	e->armed = events;
}

/* One handshake step on side i; 1 done, 0 waiting (side i's socket armed for it), -1 failed. */
static int shake(struct pair *p, struct end *ends, int i)
{
	int r = SSL_do_handshake(p->ssl[i]);
	if (r == 1)
		return 1;
	int e = SSL_get_error(p->ssl[i], r);
	if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
		ERR_print_errors_fp(stderr);
		return -1;
	}
	watch(&ends[i], p->fd[i], e == SSL_ERROR_WANT_READ ? EPOLLIN : EPOLLOUT);
	return 0;
}

/* Takes the pair through its handshakes and the upstream connect as far as it goes now. False when it failed. */
static bool advance(struct pair *p, struct end *ends)
{
	int r;
	switch (p->phase) {
	case CLIENT_HANDSHAKE:
		r = shake(p, ends, 0);
		if (r <= 0)
			return r == 0;
		watch(&ends[0], p->fd[0], 0); /* what the client sends next waits for the broker */
		p->fd[1] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		struct sockaddr_in up = loopback(upstream_port);
		if (p->fd[1] < 0 || (connect(p->fd[1], (struct sockaddr *)&up, sizeof up) != 0 && errno != EINPROGRESS))
			return false;
		ends[1].armed = EPOLLOUT;
		struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = &ends[1]};
		epoll_ctl(ep, EPOLL_CTL_ADD, p->fd[1], &ev);
		p->phase = CONNECTING;
		return true;
	case CONNECTING: {
		int err = 0;
		socklen_t len = sizeof err;
		if (getsockopt(p->fd[1], SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
			return false;
		nodelay(p->fd[1]);
		p->ssl[1] = SSL_new(client_ctx);
		if (!p->ssl[1])
			return false;
		SSL_set_fd(p->ssl[1], p->fd[1]);
		SSL_set_connect_state(p->ssl[1]);
		SSL_set_tlsext_host_name(p->ssl[1], name);
		SSL_set1_host(p->ssl[1], name);
		if (upstream_session)
			SSL_set_session(p->ssl[1], upstream_session);
		p->dir[0].to = p->ssl[1];
		p->phase = UPSTREAM_HANDSHAKE;
	}
		/* fall through */
	case UPSTREAM_HANDSHAKE:
		r = shake(p, ends, 1);
		if (r <= 0)
			return r == 0;
		p->phase = RELAYING;
		/* the client may already have sent records that OpenSSL holds */
		if (!on_event(p, 0, EPOLLIN))
			return false;
		rearm(p, ends, 0);
		rearm(p, ends, 1);
		return true;
	case RELAYING:
		break;
	}
	return true;
}

static int on_new_session(SSL *ssl, SSL_SESSION *session)
{
	(void)ssl;
	SSL_SESSION_free(upstream_session);
	upstream_session = session;
	return 1;
}

static void start_pair(int c);

/* Takes every pending connection (the listener is non-blocking), each starting its handshake. */
static void on_accept(int lfd)
{
	int c;
	while ((c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0)
		start_pair(c);
}

static void start_pair(int c)
{
	nodelay(c);
	struct pair *p = calloc(1, sizeof *p);
	struct end *ends = calloc(2, sizeof *ends);
	SSL *cs = SSL_new(server_ctx);
	if (!p || !ends || !cs) {
		fprintf(stderr, "bench_tls_relay: cannot set up a pair\n");
		SSL_free(cs);
		close(c);
		free(p);
		free(ends);
		return;
	}
	SSL_set_fd(cs, c);
	SSL_set_accept_state(cs);
	p->fd[0] = c;
	p->fd[1] = -1;
	p->ssl[0] = cs;
	p->dir[1].to = cs;
	p->phase = CLIENT_HANDSHAKE;
	for (int i = 0; i < 2; i++)
		ends[i] = (struct end){.p = p, .side = i};
	ends[0].armed = EPOLLIN;
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &ends[0]};
	epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
}

static SSL_CTX *new_ctx(const SSL_METHOD *m)
{
	SSL_CTX *ctx = SSL_CTX_new(m);
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	SSL_CTX_set_read_ahead(ctx, 1);
	SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
	return ctx;
}

/* Runs event k of the n epoll reported; a pair it ends has its later events cleared. */
static void handle(struct epoll_event *evs, int n, int k)
{
	struct end *e = evs[k].data.ptr;
	struct pair *p = e->p;
	struct end *ends = e - e->side;
	bool ok;
	if (p->phase == RELAYING)
		ok = on_event(p, e->side, evs[k].events);
	else /* a hang-up or error before relaying ends the pair */
		ok = !(evs[k].events & (EPOLLHUP | EPOLLERR)) && advance(p, ends);
	evs[k].data.ptr = NULL;
	if (!ok) {
		for (int j = k + 1; j < n; j++)
			if (evs[j].data.ptr == &ends[0] || evs[j].data.ptr == &ends[1])
				evs[j].data.ptr = NULL;
		pair_close(p, ends);
		return;
	}
	if (p->phase != RELAYING)
		return;
	rearm(p, ends, e->side);
	rearm(p, ends, !e->side);
}

int main(int argc, char **argv)
{
	if (argc != 8 && argc != 9) {
		fprintf(stderr, "usage: %s LISTEN_PORT UPSTREAM_PORT CERT KEY CA CLIENT_CERT CLIENT_KEY [NAME]\n",
			argv[0]);
		return 2;
	}
	int listen_port = atoi(argv[1]);
	upstream_port = atoi(argv[2]);
	if (argc == 9)
		name = argv[8];
	server_ctx = new_ctx(TLS_server_method());
	client_ctx = new_ctx(TLS_client_method());
	SSL_CTX_set_verify(client_ctx, SSL_VERIFY_PEER, NULL);
	SSL_CTX_set_session_cache_mode(client_ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
	SSL_CTX_sess_set_new_cb(client_ctx, on_new_session);
	if (SSL_CTX_use_certificate_chain_file(server_ctx, argv[3]) != 1 ||
	    SSL_CTX_use_PrivateKey_file(server_ctx, argv[4], SSL_FILETYPE_PEM) != 1 ||
	    SSL_CTX_load_verify_locations(client_ctx, argv[5], NULL) != 1 ||
	    SSL_CTX_use_certificate_chain_file(client_ctx, argv[6]) != 1 ||
	    SSL_CTX_use_PrivateKey_file(client_ctx, argv[7], SSL_FILETYPE_PEM) != 1) {
		ERR_print_errors_fp(stderr);
		return 2;
	}
	int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in at = loopback(listen_port);
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&at, sizeof at) != 0 || listen(lfd, 4096) != 0) {
		perror("bench_tls_relay: listen");
		return 1;
	}
	set_nonblocking(lfd);
	ep = epoll_create1(0);
	struct epoll_event lev = {.events = EPOLLIN, .data.ptr = &listener};
	epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);
	struct epoll_event evs[64];
	for (;;) {
		int n = epoll_wait(ep, evs, 64, -1);
		/* everything else first, then one client handshake step per wakeup (the rest are reported again) */
		for (int k = 0; k < n; k++) {
			struct end *e = evs[k].data.ptr;
			if (e == &listener)
				on_accept(lfd);
			else if (e && e->p->phase != CLIENT_HANDSHAKE)
				handle(evs, n, k);
		}
		for (int k = 0; k < n; k++) {
			struct end *e = evs[k].data.ptr;
			if (e && e != &listener && e->p->phase == CLIENT_HANDSHAKE) {
				handle(evs, n, k);
				break;
			}
		}
	}
}
