/* The TLS floor for scripts/bench-tls.sh: the least a user-space relay that
 * terminates TLS from clients and originates TLS to the broker can do. One
 * thread, level-triggered epoll, OpenSSL reading and writing the sockets
 * itself (read-ahead on), and per wakeup: decrypt what one side has into a
 * buffer, encrypt it to the other side, no decoding, no records, no event
 * library. Handshakes are blocking (the throughput loads connect once), so
 * it is no floor for the reconnect storm. Whatever this relay costs on a
 * machine, no TLS relay in user space can undercut it by much: the benchmark
 * shows it next to HAProxy and the tap.
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

struct pair {
	struct pipe dir[2]; /* [0] client -> upstream, [1] upstream -> client */
	SSL *ssl[2];
	int fd[2];
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
		epoll_ctl(ep, EPOLL_CTL_DEL, p->fd[i], NULL);
		SSL_free(p->ssl[i]);
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

static SSL *handshake(SSL_CTX *ctx, int fd, bool accept_side)
{
	SSL *ssl = SSL_new(ctx);
	if (!ssl)
		return NULL;
	SSL_set_fd(ssl, fd);
	if (!accept_side) {
		SSL_set_tlsext_host_name(ssl, name);
		SSL_set1_host(ssl, name);
	}
	if ((accept_side ? SSL_accept(ssl) : SSL_connect(ssl)) != 1) {
		ERR_print_errors_fp(stderr);
		SSL_free(ssl);
		return NULL;
	}
	return ssl;
}

static void on_accept(int lfd, int upstream_port)
{
	int c = accept(lfd, NULL, NULL);
	if (c < 0)
		return;
	nodelay(c);
	/* blocking handshakes and connect: the relay has nothing better to do meanwhile */
	SSL *cs = handshake(server_ctx, c, true);
	int u = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in up = loopback(upstream_port);
	SSL *us = NULL;
	if (cs && u >= 0 && connect(u, (struct sockaddr *)&up, sizeof up) == 0) {
		nodelay(u);
		us = handshake(client_ctx, u, false);
	}
	struct pair *p = calloc(1, sizeof *p);
	struct end *ends = calloc(2, sizeof *ends);
	if (!cs || !us || !p || !ends) {
		fprintf(stderr, "bench_tls_relay: cannot set up a pair\n");
		SSL_free(cs);
		SSL_free(us);
		close(c);
		if (u >= 0)
			close(u);
		free(p);
		free(ends);
		return;
	}
	set_nonblocking(c);
	set_nonblocking(u);
	p->fd[0] = c;
	p->fd[1] = u;
	p->ssl[0] = cs;
	p->ssl[1] = us;
	p->dir[0].to = us;
	p->dir[1].to = cs;
	for (int i = 0; i < 2; i++) {
		ends[i] = (struct end){.p = p, .side = i, .armed = EPOLLIN};
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &ends[i]};
		epoll_ctl(ep, EPOLL_CTL_ADD, p->fd[i], &ev);
	}
	/* the client may already have sent records that OpenSSL holds */
	if (!on_event(p, 0, 0)) {
		pair_close(p, ends);
		return;
	}
	rearm(p, ends, 0);
	rearm(p, ends, 1);
}

static SSL_CTX *new_ctx(const SSL_METHOD *m)
{
	SSL_CTX *ctx = SSL_CTX_new(m);
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	SSL_CTX_set_read_ahead(ctx, 1);
	SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
	return ctx;
}

int main(int argc, char **argv)
{
	if (argc != 8 && argc != 9) {
		fprintf(stderr, "usage: %s LISTEN_PORT UPSTREAM_PORT CERT KEY CA CLIENT_CERT CLIENT_KEY [NAME]\n",
			argv[0]);
		return 2;
	}
	int listen_port = atoi(argv[1]), upstream_port = atoi(argv[2]);
	if (argc == 9)
		name = argv[8];
	server_ctx = new_ctx(TLS_server_method());
	client_ctx = new_ctx(TLS_client_method());
	SSL_CTX_set_verify(client_ctx, SSL_VERIFY_PEER, NULL);
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
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&at, sizeof at) != 0 || listen(lfd, 1024) != 0) {
		perror("bench_tls_relay: listen");
		return 1;
	}
	ep = epoll_create1(0);
	struct epoll_event lev = {.events = EPOLLIN, .data.ptr = &listener};
	epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);
	struct epoll_event evs[64];
	for (;;) {
		int n = epoll_wait(ep, evs, 64, -1);
		for (int k = 0; k < n; k++) {
			struct end *e = evs[k].data.ptr;
			if (e == &listener) {
				on_accept(lfd, upstream_port);
				continue;
			}
			if (!e)
				continue;
			struct pair *p = e->p;
			struct end *ends = e - e->side;
			if (!on_event(p, e->side, evs[k].events)) {
				for (int j = k + 1; j < n; j++)
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
