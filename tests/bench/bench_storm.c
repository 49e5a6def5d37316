/* Reconnect storm for scripts/bench-tls.sh: C clients connect at once (one thread, non-blocking sockets, epoll),
 * each does a TLS handshake (OpenSSL; the peer and host name verified against -C), logs in, opens a channel in
 * confirm mode, publishes one mandatory message to a queue and waits for its confirm; all stay open until the last
 * one is confirmed and then -P ms more (so that an observer can measure memory per idle connection), then each
 * closes cleanly (connection.close, close_notify). A first connection declares the queue (bounded, drop-head, so
 * it never refuses a publish); with -D the queue exists already and there is no such connection. Prints one JSON line: the time to the last TLS handshake and handshakes per second
 * over it, the time to the last confirm, acks, nacks, returns and failures. Without -T the clients speak plain TCP.
 * Usage: bench_storm [-H host] [-p port] [-c conns] [-s bytes] [-q queue] [-D] [-T] [-C cafile] [-E cert -K key]
 *                    [-N name] [-P hold-ms] [-t timeout-s]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define ST_IN_CAP 16384
#define ST_QUEUE_MAX_LEN 10000
#define ST_QUEUE_EXPIRES_MS 60000

struct st_conf {
	const char *host, *queue, *cafile, *certfile, *keyfile, *name;
	int port, conns, hold_ms, timeout_s;
	size_t size;
	bool tls;
	bool declared; /* -D: the queue exists, no setup connection */
};

/*   CONNECTING --writable--> HANDSHAKE --SSL_connect done--> AMQP (one expected method at a time)
 *   AMQP --ack/nack--> CONFIRMED --everyone confirmed, hold over--> CLOSING --close-ok--> DONE
 *   any state --error, broker close, timeout--> FAILED */
enum st_state { ST_CONNECTING, ST_HANDSHAKE, ST_AMQP, ST_CONFIRMED, ST_CLOSING, ST_DONE, ST_FAILED };

/* What a connection waits for next, in order; DECLARE only on the setup connection. */
enum st_step { WAIT_START, WAIT_TUNE, WAIT_OPEN, WAIT_CHANNEL, WAIT_DECLARE, WAIT_SELECT, WAIT_CONFIRM, WAIT_CLOSE };

struct st_conn {
	int fd;
	SSL *ssl;
	enum st_state state;
	enum st_step step;
	bool declare; /* the setup connection: declares the queue, publishes nothing */
	uint32_t events;
	uint8_t *out;
	size_t out_len, out_off;
	uint8_t in[ST_IN_CAP];
	size_t in_len;
	uint64_t t_handshake, t_confirm;
	bool published, acked, nacked, returned;
	char error[200];
};

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---- AMQP 0-9-1 encoding: just the frames this client sends ---- */

struct wbuf {
	uint8_t *p;
	size_t len, cap;
};

static void put(struct wbuf *w, const void *data, size_t n)
{
	if (w->len + n > w->cap) {
		w->cap = (w->len + n) * 2 + 256;
		w->p = realloc(w->p, w->cap);
		if (!w->p) {
			perror("realloc");
			exit(2);
		}
	}
	memcpy(w->p + w->len, data, n);
	w->len += n;
}

static void put_u8(struct wbuf *w, uint8_t v)
{
	put(w, &v, 1);
}

static void put_u16(struct wbuf *w, uint16_t v)
{
	uint8_t b[2] = {(uint8_t)(v >> 8), (uint8_t)v};
	put(w, b, 2);
}

static void put_u32(struct wbuf *w, uint32_t v)
{
	uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
	put(w, b, 4);
}

static void put_u64(struct wbuf *w, uint64_t v)
{
	put_u32(w, (uint32_t)(v >> 32));
	put_u32(w, (uint32_t)v);
}

static void put_shortstr(struct wbuf *w, const char *s)
{
	size_t n = strlen(s);
	put_u8(w, (uint8_t)n);
	put(w, s, n);
}

/* Starts a frame; end_frame fills in its size and adds the end octet. */
static size_t begin_frame(struct wbuf *w, uint8_t type, uint16_t channel)
{
	put_u8(w, type);
	put_u16(w, channel);
	put_u32(w, 0);
	return w->len;
}

static void end_frame(struct wbuf *w, size_t start)
{
	uint32_t size = (uint32_t)(w->len - start);
	uint8_t *p = w->p + start - 4;
	p[0] = (uint8_t)(size >> 24);
	p[1] = (uint8_t)(size >> 16);
	p[2] = (uint8_t)(size >> 8);
	p[3] = (uint8_t)size;
	put_u8(w, 0xce);
}

static size_t begin_method(struct wbuf *w, uint16_t channel, uint16_t class_id, uint16_t method_id)
{
	size_t start = begin_frame(w, 1, channel);
	put_u16(w, class_id);
	put_u16(w, method_id);
	return start;
}

/* ---- connections ---- */

static SSL_CTX *ctx;
static const struct st_conf *conf;
static int ep;

static void fail(struct st_conn *c, const char *fmt, const char *detail)
{
	if (c->state == ST_FAILED || c->state == ST_DONE)
		return;
	c->state = ST_FAILED;
	snprintf(c->error, sizeof c->error, fmt, detail ? detail : "");
	epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
}

static void want(struct st_conn *c, uint32_t events)
{
	if (c->events == events)
		return;
	struct epoll_event ev = {.events = events, .data.ptr = c};
	if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0)
		fail(c, "epoll: %s", strerror(errno));
	c->events = events;
}

static void queue_out(struct st_conn *c, struct wbuf *w)
{
	c->out = realloc(c->out, c->out_len + w->len);
	if (!c->out) {
		perror("realloc");
		exit(2);
	}
	memcpy(c->out + c->out_len, w->p, w->len);
	c->out_len += w->len;
	free(w->p);
	*w = (struct wbuf){0};
}

static void send_close(struct st_conn *c)
{
	struct wbuf w = {0};
	size_t f = begin_method(&w, 0, 10, 50);
	put_u16(&w, 200);
	put_shortstr(&w, "storm over");
	put_u16(&w, 0);
	put_u16(&w, 0);
	end_frame(&w, f);
	queue_out(c, &w);
	c->state = ST_CLOSING;
	c->step = WAIT_CLOSE;
}

/* Builds the answer to the method just received and moves to the next step. */
static void on_method(struct st_conn *c, uint16_t class_id, uint16_t method_id, const uint8_t *args, size_t len)
{
	struct wbuf w = {0};
	size_t f;
	if (class_id == 10 && method_id == 50) { /* connection.close from the broker */
		char text[100] = "";
		if (len >= 3 && (size_t)args[2] + 3 <= len)
			snprintf(text, sizeof text, "%.*s", (int)args[2], (const char *)args + 3);
		fail(c, "broker closed the connection: %s", text);
		return;
	}
	if (class_id == 20 && method_id == 40) {
		fail(c, "broker closed the channel%s", NULL);
		return;
	}
	if (class_id == 60 && method_id == 50) { /* basic.return: the confirm follows */
		c->returned = true;
		return;
	}
	switch (c->step) {
	case WAIT_START:
		if (class_id != 10 || method_id != 10)
			break;
		f = begin_method(&w, 0, 10, 11);
		put_u32(&w, 0); /* client-properties: empty table */
		put_shortstr(&w, "PLAIN");
		put_u32(&w, 12);
		put(&w, "\0guest\0guest", 12);
		put_shortstr(&w, "en_US");
		end_frame(&w, f);
		c->step = WAIT_TUNE;
		queue_out(c, &w);
		return;
	case WAIT_TUNE:
		if (class_id != 10 || method_id != 30)
			break;
		f = begin_method(&w, 0, 10, 31);
		put_u16(&w, 16);
		put_u32(&w, 131072);
		put_u16(&w, 0);
		end_frame(&w, f);
		f = begin_method(&w, 0, 10, 40);
		put_shortstr(&w, "/");
		put_shortstr(&w, "");
		put_u8(&w, 0);
		end_frame(&w, f);
		c->step = WAIT_OPEN;
		queue_out(c, &w);
		return;
	case WAIT_OPEN:
		if (class_id != 10 || method_id != 41)
			break;
		f = begin_method(&w, 1, 20, 10);
		put_shortstr(&w, "");
		end_frame(&w, f);
		c->step = WAIT_CHANNEL;
		queue_out(c, &w);
		return;
	case WAIT_CHANNEL:
		if (class_id != 20 || method_id != 11)
			break;
		if (c->declare) {
			f = begin_method(&w, 1, 50, 10);
			put_u16(&w, 0);
			put_shortstr(&w, conf->queue);
			put_u8(&w, 0); /* passive, durable, exclusive, auto-delete, no-wait: all off */
			struct wbuf t = {0};
			put_shortstr(&t, "x-max-length");
			put_u8(&t, 'l');
			put_u64(&t, ST_QUEUE_MAX_LEN);
			put_shortstr(&t, "x-overflow");
			put_u8(&t, 'S');
			put_u32(&t, 9);
			put(&t, "drop-head", 9);
			put_shortstr(&t, "x-expires");
			put_u8(&t, 'l');
			put_u64(&t, ST_QUEUE_EXPIRES_MS);
			put_u32(&w, (uint32_t)t.len);
			put(&w, t.p, t.len);
			free(t.p);
			end_frame(&w, f);
			c->step = WAIT_DECLARE;
		} else {
			f = begin_method(&w, 1, 85, 10);
			put_u8(&w, 0);
			end_frame(&w, f);
			c->step = WAIT_SELECT;
		}
		queue_out(c, &w);
		return;
	case WAIT_DECLARE:
		if (class_id != 50 || method_id != 11)
			break;
		c->t_confirm = now_us();
		c->state = ST_CONFIRMED;
		return;
	case WAIT_SELECT:
		if (class_id != 85 || method_id != 11)
			break;
		f = begin_method(&w, 1, 60, 40);
		put_u16(&w, 0);
		put_shortstr(&w, "");
		put_shortstr(&w, conf->queue);
		put_u8(&w, 1); /* mandatory */
		end_frame(&w, f);
		f = begin_frame(&w, 2, 1);
		put_u16(&w, 60);
		put_u16(&w, 0);
		put_u64(&w, conf->size);
		put_u16(&w, 0); /* no properties */
		end_frame(&w, f);
		if (conf->size) {
			f = begin_frame(&w, 3, 1);
			for (size_t i = 0; i < conf->size; i++)
				put_u8(&w, (uint8_t)('a' + i % 26));
			end_frame(&w, f);
		}
		c->step = WAIT_CONFIRM;
		c->published = true;
		queue_out(c, &w);
		return;
	case WAIT_CONFIRM:
		if (class_id != 60 || (method_id != 80 && method_id != 120))
			break;
		c->acked = method_id == 80;
		c->nacked = method_id == 120;
		c->t_confirm = now_us();
		c->state = ST_CONFIRMED;
		return;
	case WAIT_CLOSE:
		if (class_id != 10 || method_id != 51)
			break;
		c->state = ST_DONE;
		epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
		return;
	}
	char what[40];
	snprintf(what, sizeof what, "%u.%u", class_id, method_id);
	fail(c, "unexpected method %s", what);
}

/* Takes the complete frames out of c->in. */
static void on_input(struct st_conn *c)
{
	size_t off = 0;
	while (c->in_len - off >= 8 && c->state != ST_FAILED) {
		const uint8_t *p = c->in + off;
		uint32_t size = (uint32_t)p[3] << 24 | (uint32_t)p[4] << 16 | (uint32_t)p[5] << 8 | p[6];
		if (size + 8 > ST_IN_CAP) {
			fail(c, "frame too large%s", NULL);
			return;
		}
		if (c->in_len - off < size + 8)
			break;
		if (p[0] == 1 && size >= 4)
			on_method(c, (uint16_t)(p[7] << 8 | p[8]), (uint16_t)(p[9] << 8 | p[10]), p + 11, size - 4);
		off += size + 8;
	}
	memmove(c->in, c->in + off, c->in_len - off);
	c->in_len -= off;
}

static const char *ssl_reason(void)
{
	static char buf[160];
	unsigned long e = ERR_get_error();
	ERR_clear_error();
	if (!e)
		return "no OpenSSL error";
	ERR_error_string_n(e, buf, sizeof buf);
	return buf;
}

/* Moves bytes both ways until the socket would block; sets the events to wait for. */
static void pump(struct st_conn *c)
{
	for (;;) {
		if (c->state == ST_FAILED || c->state == ST_DONE)
			return;
		bool progress = false;
		uint32_t events = EPOLLIN;
		if (c->out_off < c->out_len) {
			size_t n = c->out_len - c->out_off;
			ssize_t w;
			if (c->ssl) {
				int r = SSL_write(c->ssl, c->out + c->out_off, (int)n);
				if (r <= 0) {
					int e = SSL_get_error(c->ssl, r);
					if (e == SSL_ERROR_WANT_WRITE)
						events |= EPOLLOUT;
					else if (e != SSL_ERROR_WANT_READ) {
						fail(c, "TLS write: %s", ssl_reason());
						return;
					}
					w = 0;
				} else {
					w = r;
				}
			} else {
				w = send(c->fd, c->out + c->out_off, n, MSG_NOSIGNAL);
				if (w < 0 && errno != EAGAIN) {
					fail(c, "send: %s", strerror(errno));
					return;
				}
				if (w < 0) {
					events |= EPOLLOUT;
					w = 0;
				}
			}
			c->out_off += (size_t)w;
			if (c->out_off == c->out_len)
				c->out_off = c->out_len = 0;
			progress = w > 0;
		}
		ssize_t r;
		if (c->ssl) {
			int k = SSL_read(c->ssl, c->in + c->in_len, (int)(ST_IN_CAP - c->in_len));
			if (k <= 0) {
				int e = SSL_get_error(c->ssl, k);
				if (e == SSL_ERROR_ZERO_RETURN) {
					fail(c, "TLS closed by the peer%s", NULL);
					return;
				}
				if (e == SSL_ERROR_WANT_WRITE)
					events |= EPOLLOUT;
				else if (e != SSL_ERROR_WANT_READ) {
					fail(c, "TLS read: %s",
					     e == SSL_ERROR_SYSCALL ? "connection lost" : ssl_reason());
					return;
				}
				r = 0;
			} else {
				r = k;
			}
		} else {
			r = recv(c->fd, c->in + c->in_len, ST_IN_CAP - c->in_len, 0);
			if (r == 0) {
				fail(c, "closed by the peer%s", NULL);
				return;
			}
			if (r < 0 && errno != EAGAIN) {
				fail(c, "recv: %s", strerror(errno));
				return;
			}
			if (r < 0)
				r = 0;
		}
		if (r > 0) {
			c->in_len += (size_t)r;
			on_input(c);
			progress = true;
		}
		if (!progress) {
			want(c, events);
			return;
		}
	}
}

static void handshake(struct st_conn *c)
{
	int r = SSL_connect(c->ssl);
	if (r == 1) {
		c->t_handshake = now_us();
		c->state = ST_AMQP;
		struct wbuf w = {0};
		put(&w, "AMQP\0\0\x09\x01", 8);
		queue_out(c, &w);
		pump(c);
		return;
	}
	int e = SSL_get_error(c->ssl, r);
	if (e == SSL_ERROR_WANT_READ)
		want(c, EPOLLIN);
	else if (e == SSL_ERROR_WANT_WRITE)
		want(c, EPOLLOUT);
	else
		fail(c, "TLS handshake: %s", e == SSL_ERROR_SYSCALL ? "connection lost" : ssl_reason());
}

static void on_event(struct st_conn *c)
{
	if (c->state == ST_CONNECTING) {
		int err = 0;
		socklen_t len = sizeof err;
		getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
		if (err) {
			fail(c, "connect: %s", strerror(err));
			return;
		}
		int one = 1;
		setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		if (!conf->tls) {
			c->t_handshake = now_us();
			c->state = ST_AMQP;
			struct wbuf w = {0};
			put(&w, "AMQP\0\0\x09\x01", 8);
			queue_out(c, &w);
			pump(c);
			return;
		}
		c->ssl = SSL_new(ctx);
		if (!c->ssl) {
			fail(c, "SSL_new%s", NULL);
			return;
		}
		SSL_set_fd(c->ssl, c->fd);
		SSL_set_tlsext_host_name(c->ssl, conf->name);
		if (conf->cafile)
			SSL_set1_host(c->ssl, conf->name);
		c->state = ST_HANDSHAKE;
	}
	if (c->state == ST_HANDSHAKE)
		handshake(c);
	else
		pump(c);
}

static int start_connect(struct st_conn *c, const struct sockaddr_storage *ss, socklen_t sslen)
{
	c->fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		fail(c, "socket: %s", strerror(errno));
		return -1;
	}
	c->state = ST_CONNECTING;
	if (connect(c->fd, (const struct sockaddr *)ss, sslen) < 0 && errno != EINPROGRESS) {
		snprintf(c->error, sizeof c->error, "connect: %s", strerror(errno));
		c->state = ST_FAILED;
		return -1;
	}
	c->events = EPOLLOUT;
	struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = c};
	epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
	return 0;
}

static bool finished(const struct st_conn *c)
{
	return c->state == ST_DONE || c->state == ST_FAILED;
}

/* Runs n connections to the end: all confirmed (or failed), held hold_ms, closed. */
static void run(struct st_conn *cs, int n, const struct sockaddr_storage *ss, socklen_t sslen, uint64_t deadline)
{
	for (int i = 0; i < n; i++)
		start_connect(&cs[i], ss, sslen);
	struct epoll_event evs[256];
	uint64_t hold_until = 0;
	bool closing = false;
	for (;;) {
		int open = 0, unconfirmed = 0;
		for (int i = 0; i < n; i++) {
			open += !finished(&cs[i]);
			unconfirmed += cs[i].state < ST_CONFIRMED;
		}
		if (!open)
			return;
		uint64_t now = now_us();
		if (now > deadline) {
			for (int i = 0; i < n; i++)
				fail(&cs[i], "timed out%s", NULL);
			return;
		}
		if (!unconfirmed && !closing) {
			if (!hold_until) {
				hold_until = now + (uint64_t)conf->hold_ms * 1000;
				if (conf->hold_ms)
					fprintf(stderr, "bench_storm: all %d confirmed, holding them open for %d ms\n", n,
						conf->hold_ms);
			}
			if (now >= hold_until) {
				closing = true;
				for (int i = 0; i < n; i++)
					if (cs[i].state == ST_CONFIRMED) {
						send_close(&cs[i]);
						pump(&cs[i]);
					}
			}
		}
		int timeout = hold_until && !closing ? (int)((hold_until - now) / 1000) + 1 : 100;
		int k = epoll_wait(ep, evs, 256, timeout);
		for (int i = 0; i < k; i++)
			on_event(evs[i].data.ptr);
	}
}

static void usage(const char *argv0)
{
	fprintf(stderr,
	        "usage: %s [-H host] [-p port] [-c conns] [-s bytes] [-q queue] [-D] [-T] [-C cafile] [-E cert -K key] "
	        "[-N name] [-P hold-ms] [-t timeout-s]\n",
	        argv0);
	exit(2);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	struct st_conf c = {
	    .host = "127.0.0.1", .port = 5671, .conns = 1000, .size = 64, .queue = "amqptap.storm", .timeout_s = 120};
	int opt;
	while ((opt = getopt(argc, argv, "H:p:c:s:q:DTC:E:K:N:P:t:h")) != -1) {
		switch (opt) {
		case 'H':
			c.host = optarg;
			break;
		case 'p':
			c.port = atoi(optarg);
			break;
		case 'c':
			c.conns = atoi(optarg);
			break;
		case 's':
			c.size = (size_t)strtoul(optarg, NULL, 10);
			break;
		case 'q':
			c.queue = optarg;
			break;
		case 'D':
			c.declared = true;
			break;
		case 'T':
			c.tls = true;
			break;
		case 'C':
			c.cafile = optarg;
			break;
		case 'E':
			c.certfile = optarg;
			break;
		case 'K':
			c.keyfile = optarg;
			break;
		case 'N':
			c.name = optarg;
			break;
		case 'P':
			c.hold_ms = atoi(optarg);
			break;
		case 't':
			c.timeout_s = atoi(optarg);
			break;
		default:
			usage(argv[0]);
		}
	}
	if (c.conns <= 0 || c.port <= 0 || c.size > 8192 || !c.certfile != !c.keyfile)
		usage(argv[0]);
	if (!c.name)
		c.name = c.host;
	conf = &c;
	signal(SIGPIPE, SIG_IGN); /* a close_notify to a peer that already closed */
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
	char port[16];
	snprintf(port, sizeof port, "%d", c.port);
	if (getaddrinfo(c.host, port, &hints, &ai) != 0) {
		fprintf(stderr, "cannot resolve %s\n", c.host);
		return 2;
	}
	struct sockaddr_storage ss;
	socklen_t sslen = (socklen_t)ai->ai_addrlen;
	memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
	freeaddrinfo(ai);
	if (c.tls) {
		ctx = SSL_CTX_new(TLS_client_method());
		SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
		if (c.cafile) {
			SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
			if (SSL_CTX_load_verify_locations(ctx, c.cafile, NULL) != 1) {
				fprintf(stderr, "-C %s: %s\n", c.cafile, ssl_reason());
				return 2;
			}
		}
		if (c.certfile && (SSL_CTX_use_certificate_chain_file(ctx, c.certfile) != 1 ||
		                   SSL_CTX_use_PrivateKey_file(ctx, c.keyfile, SSL_FILETYPE_PEM) != 1)) {
			fprintf(stderr, "-E/-K: %s\n", ssl_reason());
			return 2;
		}
	}
	ep = epoll_create1(EPOLL_CLOEXEC);
	uint64_t deadline = now_us() + (uint64_t)c.timeout_s * 1000000;

	struct st_conn *setup = calloc(1, sizeof *setup);
	struct st_conn *cs = calloc((size_t)c.conns, sizeof *cs);
	if (!setup || !cs) {
		perror("calloc");
		return 2;
	}
	if (!c.declared) {
		setup->declare = true;
		int hold = c.hold_ms;
		c.hold_ms = 0;
		run(setup, 1, &ss, sslen, deadline);
		c.hold_ms = hold;
		if (setup->state != ST_DONE) {
			printf("{\"error\":\"setup connection: %s\"}\n", setup->error);
			return 1;
		}
		close(setup->fd);
		SSL_free(setup->ssl);
		free(setup->out);
	}

	uint64_t t0 = now_us();
	run(cs, c.conns, &ss, sslen, deadline);
	uint64_t t_end = now_us();

	uint64_t *hs = calloc((size_t)c.conns, sizeof *hs), *cf = calloc((size_t)c.conns, sizeof *cf);
	int n_hs = 0, n_cf = 0, failed = 0, sent = 0, acked = 0, nacked = 0, returned = 0;
	const char *first_error = "";
	for (int i = 0; i < c.conns; i++) {
		struct st_conn *x = &cs[i];
		if (x->t_handshake)
			hs[n_hs++] = x->t_handshake - t0;
		if (x->t_confirm)
			cf[n_cf++] = x->t_confirm - t0;
		sent += x->published;
		acked += x->acked;
		nacked += x->nacked;
		returned += x->returned;
		if (x->state != ST_DONE) {
			failed++;
			if (!*first_error)
				first_error = x->error;
		}
		if (x->ssl) {
			(void)SSL_shutdown(x->ssl); /* close_notify; the answer is not awaited */
			SSL_free(x->ssl);
		}
		if (x->fd > 0)
			close(x->fd);
		free(x->out);
	}
	qsort(hs, (size_t)n_hs, sizeof *hs, cmp_u64);
	qsort(cf, (size_t)n_cf, sizeof *cf, cmp_u64);
	double hs_last = n_hs ? (double)hs[n_hs - 1] / 1e3 : 0, cf_last = n_cf ? (double)cf[n_cf - 1] / 1e3 : 0;
	printf("{\"conns\":%d,\"tls\":%s,\"size\":%zu,\"ok\":%d,\"failed\":%d,\"sent\":%d,\"acked\":%d,\"nacked\":%d,"
	       "\"returned\":%d,\"handshake_p50_ms\":%.1f,\"handshake_last_ms\":%.1f,\"handshakes_per_s\":%.0f,"
	       "\"confirm_p50_ms\":%.1f,\"confirm_last_ms\":%.1f,\"hold_ms\":%d,\"total_ms\":%.1f%s%s%s}\n",
	       c.conns, c.tls ? "true" : "false", c.size, c.conns - failed, failed, sent, acked, nacked, returned,
	       n_hs ? (double)hs[n_hs / 2] / 1e3 : 0, hs_last, hs_last > 0 ? n_hs / (hs_last / 1e3) : 0,
	       n_cf ? (double)cf[n_cf / 2] / 1e3 : 0, cf_last, c.hold_ms, (double)(t_end - t0) / 1e3,
	       *first_error ? ",\"first_error\":\"" : "", first_error, *first_error ? "\"" : "");
	free(hs);
	free(cf);
	free(cs);
	free(setup);
	if (ctx)
		SSL_CTX_free(ctx);
	return failed ? 1 : 0;
}
