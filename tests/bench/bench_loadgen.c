/* Load generator for the side-by-side benchmark (scripts/bench.sh): P forked publisher connections, each with a
 * confirm channel keeping W publishes of S bytes in flight until N are confirmed, into a queue it declares itself
 * (x-max-length + drop-head, x-expires) so the broker never fills up. Prints one JSON line: totals, seconds, msgs/s,
 * MB/s and the client-side confirm latency p50/p99/max in µs over every publish of every connection. With -T every
 * connection speaks TLS (rabbitmq-c's OpenSSL socket; scripts/bench-tls.sh), optionally with a client certificate.
 * With -S FILE a connection stops publishing once FILE exists (looked for before each publish), waits for the confirms
 * outstanding and reports what was confirmed: N is then an upper bound, and the publisher a bystander that runs as long
 * as something else takes (scripts/bench-tls.sh keeps one connected through each reconnect storm).
 * Usage: bench_loadgen [-H host] [-p port] [-c conns] [-w window] [-n msgs-per-conn] [-s bytes] [-m] [-d] [-q queue]
 *                      [-S stopfile] [-T [-C cafile] [-E certfile -K keyfile]]
 */
#if defined(__has_include)
#if __has_include(<rabbitmq-c/amqp.h>)
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/ssl_socket.h>
#include <rabbitmq-c/tcp_socket.h>
#define LG_HAVE_NEW_HEADERS 1
#endif
#endif
#ifndef LG_HAVE_NEW_HEADERS
#include <amqp.h> /* rabbitmq-c 0.11 as Debian packages it installs the headers at the top level */
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#endif
#include "bench_util.h"

#include "amqptap/jsonl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LG_CHANNEL 1
#define LG_FRAME_MAX 131072
#define LG_QUEUE_MAX_LEN 10000
#define LG_QUEUE_MAX_BYTES (64 * 1024 * 1024)
#define LG_QUEUE_EXPIRES_MS 60000

struct lg_conf {
	const char *host, *queue;
	const char *stopfile; /* -S: stop publishing once it exists */
	int port, conns;
	uint64_t window, count;
	size_t size;
	bool mandatory, persistent;
	bool tls;
	const char *cafile, *certfile, *keyfile; /* TLS: peer and hostname are verified only when cafile is set */
};

/* One per connection, in memory shared with the parent. */
struct lg_result {
	uint64_t sent, acked, nacked, returned, n_lat;
	uint64_t end_us;
	char error[96];
};

struct lg_conn {
	struct rmq_confirms c;
	uint64_t *sent_at;   /* [1..count] */
	uint32_t *lat;       /* this connection's slice of the shared latency array */
	uint64_t confirm_at; /* when the confirm being applied arrived */
	struct lg_result *r;
};

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static uint32_t quantile(const uint32_t *v, uint64_t n, double q)
{
	if (!n)
		return 0;
	uint64_t i = (uint64_t)(q * (double)(n - 1) + 0.5);
	return v[i < n ? i : n - 1];
}

static amqp_connection_state_t lg_connect(const struct lg_conf *c, const char **err)
{
	*err = NULL;
	amqp_connection_state_t conn = amqp_new_connection();
	amqp_socket_t *sock = c->tls ? amqp_ssl_socket_new(conn) : amqp_tcp_socket_new(conn);
	if (!sock) {
		*err = c->tls ? "cannot create a TLS socket" : "cannot create a socket";
		amqp_destroy_connection(conn);
		return NULL;
	}
	if (c->tls) {
		bool verify = c->cafile != NULL;
		amqp_ssl_socket_set_verify_peer(sock, verify);
		amqp_ssl_socket_set_verify_hostname(sock, verify);
		if (verify && amqp_ssl_socket_set_cacert(sock, c->cafile) != AMQP_STATUS_OK)
			*err = "cannot load the CA file";
		else if (c->certfile && amqp_ssl_socket_set_key(sock, c->certfile, c->keyfile) != AMQP_STATUS_OK)
			*err = "cannot load the client certificate or key";
		if (*err) {
			amqp_destroy_connection(conn);
			return NULL;
		}
	}
	int rc = amqp_socket_open(sock, c->host, c->port);
	if (rc != AMQP_STATUS_OK) {
		*err = c->tls ? amqp_error_string2(rc) : "cannot connect";
		amqp_destroy_connection(conn);
		return NULL;
	}
	*err = rpc_error(amqp_login(conn, "/", 0, LG_FRAME_MAX, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest"));
	if (!*err) {
		amqp_channel_open(conn, LG_CHANNEL);
		*err = rpc_error(amqp_get_rpc_reply(conn));
	}
	if (*err) {
		amqp_destroy_connection(conn);
		return NULL;
	}
	return conn;
}

static void lg_close(amqp_connection_state_t conn)
{
	amqp_channel_close(conn, LG_CHANNEL, AMQP_REPLY_SUCCESS);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
}

/* A bounded queue: drop-head keeps the newest messages, so publishes are never refused (no nacks). */
static const char *declare_queue(const struct lg_conf *c)
{
	const char *err;
	amqp_connection_state_t conn = lg_connect(c, &err);
	if (!conn)
		return err;
	amqp_table_entry_t args[4] = {
	    {.key = amqp_cstring_bytes("x-max-length"),
	     .value = {.kind = AMQP_FIELD_KIND_I64, .value.i64 = LG_QUEUE_MAX_LEN}},
	    {.key = amqp_cstring_bytes("x-max-length-bytes"),
	     .value = {.kind = AMQP_FIELD_KIND_I64, .value.i64 = LG_QUEUE_MAX_BYTES}},
	    {.key = amqp_cstring_bytes("x-overflow"),
	     .value = {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes("drop-head")}},
	    {.key = amqp_cstring_bytes("x-expires"),
	     .value = {.kind = AMQP_FIELD_KIND_I64, .value.i64 = LG_QUEUE_EXPIRES_MS}},
	};
	amqp_table_t table = {.num_entries = 4, .entries = args};
	amqp_queue_declare(conn, LG_CHANNEL, amqp_cstring_bytes(c->queue), 0, 0, 0, 0, table);
	err = rpc_error(amqp_get_rpc_reply(conn));
	if (!err)
		lg_close(conn);
	else
		amqp_destroy_connection(conn);
	return err;
}

static void delete_queue(const struct lg_conf *c)
{
	const char *err;
	amqp_connection_state_t conn = lg_connect(c, &err);
	if (!conn)
		return;
	amqp_queue_delete(conn, LG_CHANNEL, amqp_cstring_bytes(c->queue), 0, 0);
	if (!rpc_error(amqp_get_rpc_reply(conn)))
		lg_close(conn);
	else
		amqp_destroy_connection(conn);
}

/* Counted into the shared result as each seq is confirmed, with its latency. */
static void on_confirmed(void *arg, uint64_t seq, bool nack)
{
	struct lg_conn *s = arg;
	if (nack)
		s->r->nacked++;
	else
		s->r->acked++;
	uint64_t d = s->confirm_at - s->sent_at[seq];
	s->lat[s->r->n_lat++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
}

static const char *on_frame(amqp_connection_state_t conn, struct lg_conn *s, const amqp_frame_t *f)
{
	struct rmq_confirm k = rmq_confirm_of(f);
	if (k.kind != RMQ_NOT_A_CONFIRM) {
		s->confirm_at = now_us();
		rmq_confirm_apply(&s->c, k, on_confirmed, s);
		return NULL;
	}
	if (f->frame_type != AMQP_FRAME_METHOD)
		return NULL;
	switch (f->payload.method.id) {
	case AMQP_BASIC_RETURN_METHOD: {
		amqp_message_t msg;
		if (amqp_read_message(conn, f->channel, &msg, 0).reply_type != AMQP_RESPONSE_NORMAL)
			return "could not read a returned message";
		amqp_destroy_message(&msg);
		s->r->returned++;
		return NULL;
	}
	case AMQP_CONNECTION_CLOSE_METHOD:
		return "connection.close from the broker";
	case AMQP_CHANNEL_CLOSE_METHOD:
		return "channel.close from the broker";
	default:
		return NULL;
	}
}

static const char *publish_loop(const struct lg_conf *c, amqp_connection_state_t conn, struct lg_conn *s)
{
	char *body = malloc(c->size ? c->size : 1);
	if (!body)
		return "out of memory";
	memset(body, 'x', c->size);
	amqp_bytes_t body_bytes = {.len = c->size, .bytes = body};
	amqp_basic_properties_t props = {
	    ._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG,
	    .content_type = amqp_cstring_bytes("application/octet-stream"),
	    .delivery_mode = c->persistent ? 2 : 1,
	};
	amqp_bytes_t exchange = amqp_cstring_bytes(""), rk = amqp_cstring_bytes(c->queue);
	const char *err = NULL;
	uint64_t count = c->count;
	while (!err && s->c.confirmed < count) {
		if (c->stopfile && count > s->c.sent && access(c->stopfile, F_OK) == 0)
			count = s->c.sent; /* told to stop: only the confirms outstanding are waited for */
		while (s->c.sent < count && s->c.sent - s->c.confirmed < c->window) {
			uint64_t seq = s->c.sent + 1;
			s->sent_at[seq] = now_us();
			int rc =
			    amqp_basic_publish(conn, LG_CHANNEL, exchange, rk, c->mandatory, 0, &props, body_bytes);
			if (rc != AMQP_STATUS_OK) {
				err = amqp_error_string2(rc);
				break;
			}
			s->c.sent = seq;
		}
		if (err || s->c.confirmed >= count)
			break;
		amqp_frame_t f;
		int rc = amqp_simple_wait_frame(conn, &f);
		if (rc != AMQP_STATUS_OK) {
			err = amqp_error_string2(rc);
			break;
		}
		err = on_frame(conn, s, &f);
		/* drain what is already buffered before publishing more */
		while (!err && (amqp_frames_enqueued(conn) || amqp_data_in_buffer(conn))) {
			struct timeval zero = {0, 0};
			rc = amqp_simple_wait_frame_noblock(conn, &f, &zero);
			if (rc == AMQP_STATUS_TIMEOUT)
				break;
			if (rc != AMQP_STATUS_OK) {
				err = amqp_error_string2(rc);
				break;
			}
			err = on_frame(conn, s, &f);
		}
	}
	free(body);
	return err;
}

/* The child for one connection: set up, report ready on `ready`, wait for the parent to close `go`, publish. */
static int run_conn(const struct lg_conf *c, struct lg_result *r, uint32_t *lat, int ready, int go)
{
	struct lg_conn s = {.lat = lat, .r = r};
	bool seqs = rmq_confirms_init(&s.c, c->count);
	s.sent_at = calloc(c->count + 1, sizeof *s.sent_at);
	const char *err = NULL;
	amqp_connection_state_t conn = NULL;
	if (!seqs || !s.sent_at)
		err = "out of memory";
	if (!err)
		conn = lg_connect(c, &err);
	if (!err) {
		amqp_confirm_select(conn, LG_CHANNEL);
		err = rpc_error(amqp_get_rpc_reply(conn));
	}
	char b = err ? 'e' : 'r';
	if (write(ready, &b, 1) != 1 && !err)
		err = "cannot report ready";
	close(ready);
	if (!err && read(go, &b, 1) < 0)
		err = "cannot wait for go";
	close(go);
	if (!err)
		err = publish_loop(c, conn, &s);
	r->end_us = now_us();
	r->sent = s.c.sent;
	if (err)
		snprintf(r->error, sizeof r->error, "%s", err);
	else
		lg_close(conn);
	free(s.sent_at);
	rmq_confirms_deinit(&s.c);
	return err ? 1 : 0;
}

static void usage(const char *argv0)
{
	fprintf(stderr,
	        "usage: %s [-H host] [-p port] [-c conns] [-w window] [-n msgs-per-conn] [-s bytes] [-m] [-d] "
	        "[-q queue] [-S stopfile] [-T [-C cafile] [-E certfile -K keyfile]]\n"
	        "  -m mandatory, -d persistent (delivery_mode 2), -S stop publishing once stopfile exists\n"
	        "  -T TLS (port 5671 unless -p), -C CA file (enables peer and hostname verification),\n"
	        "  -E/-K client certificate and key (PEM)\n",
	        argv0);
}

int main(int argc, char **argv)
{
	struct lg_conf c = {.host = "127.0.0.1", .port = 5672, .conns = 1, .window = 1000, .count = 100000, .size = 64};
	char qname[64];
	snprintf(qname, sizeof qname, "amqptap-bench-%ld", (long)getpid());
	c.queue = qname;
	int opt;
	bool port_set = false;
	while ((opt = getopt(argc, argv, "H:p:c:w:n:s:mdq:S:TC:E:K:h")) != -1) {
		switch (opt) {
		case 'H':
			c.host = optarg;
			break;
		case 'p':
			c.port = atoi(optarg);
			port_set = true;
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
		case 'c':
			c.conns = atoi(optarg);
			break;
		case 'w':
			c.window = strtoull(optarg, NULL, 10);
			break;
		case 'n':
			c.count = strtoull(optarg, NULL, 10);
			break;
		case 's':
			c.size = strtoull(optarg, NULL, 10);
			break;
		case 'm':
			c.mandatory = true;
			break;
		case 'd':
			c.persistent = true;
			break;
		case 'q':
			c.queue = optarg;
			break;
		case 'S':
			c.stopfile = optarg;
			break;
		default:
			usage(argv[0]);
			return opt == 'h' ? 0 : 2;
		}
	}
	if (c.tls && !port_set)
		c.port = 5671;
	if (optind != argc || c.port <= 0 || c.port > 65535 || c.conns <= 0 || c.conns > 10000 || !c.window ||
	    !c.count || (!c.tls && (c.cafile || c.certfile || c.keyfile)) || !c.certfile != !c.keyfile) {
		usage(argv[0]);
		return 2;
	}

	const char *err = declare_queue(&c);
	if (err) {
		fprintf(stderr, "bench_loadgen: queue.declare via %s:%d failed: %s\n", c.host, c.port, err);
		return 1;
	}

	size_t n_conn = (size_t)c.conns;
	size_t res_bytes = n_conn * sizeof(struct lg_result);
	size_t lat_bytes = n_conn * (size_t)c.count * sizeof(uint32_t);
	void *shm = mmap(NULL, res_bytes + lat_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shm == MAP_FAILED) {
		perror("bench_loadgen: mmap");
		return 1;
	}
	struct lg_result *res = shm;
	uint32_t *lat = (uint32_t *)((char *)shm + res_bytes);

	int ready[2], go[2];
	if (pipe(ready) || pipe(go)) {
		perror("bench_loadgen: pipe");
		return 1;
	}
	pid_t *pids = calloc(n_conn, sizeof *pids);
	if (!pids)
		return 1;
	fflush(NULL);
	for (size_t i = 0; i < n_conn; i++) {
		pids[i] = fork();
		if (pids[i] < 0) {
			perror("bench_loadgen: fork");
			return 1;
		}
		if (pids[i] == 0) {
			close(ready[0]);
			close(go[1]);
			_exit(run_conn(&c, &res[i], lat + i * c.count, ready[1], go[0]));
		}
	}
	close(ready[1]);
	close(go[0]);
	size_t n_ready = 0, n_failed = 0;
	char b;
	while (n_ready + n_failed < n_conn) {
		ssize_t k = read(ready[0], &b, 1);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		if (b == 'r')
			n_ready++;
		else
			n_failed++;
	}
	close(ready[0]);
	uint64_t t0 = now_us();
	close(go[1]); /* every child's read(go) returns 0: start */
	int failed = 0;
	for (size_t i = 0; i < n_conn; i++) {
		int st;
		while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR)
			;
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			failed++;
	}

	uint64_t t1 = t0, sent = 0, acked = 0, nacked = 0, returned = 0, n_lat = 0;
	const char *first_error = NULL;
	for (size_t i = 0; i < n_conn; i++) {
		struct lg_result *r = &res[i];
		if (r->end_us > t1)
			t1 = r->end_us;
		sent += r->sent;
		acked += r->acked;
		nacked += r->nacked;
		returned += r->returned;
		if (!first_error && r->error[0])
			first_error = r->error;
		/* compact the latencies to the front of the array */
		memmove(lat + n_lat, lat + i * c.count, r->n_lat * sizeof *lat);
		n_lat += r->n_lat;
	}
	qsort(lat, n_lat, sizeof *lat, cmp_u32);
	uint64_t msgs = acked + nacked;
	double secs = (double)(t1 - t0) / 1e6;
	double rate = secs > 0 ? (double)msgs / secs : 0;
	struct tap_buf out;
	struct tap_json j;
	tap_buf_init(&out);
	tap_json_init(&j, &out);
	tap_json_obj_begin(&j);
	tap_json_kv_str(&j, "host", c.host);
	tap_json_kv_int(&j, "port", c.port);
	tap_json_kv_int(&j, "conns", c.conns);
	tap_json_kv_uint(&j, "window", c.window);
	tap_json_kv_uint(&j, "size", c.size);
	tap_json_kv_bool(&j, "mandatory", c.mandatory);
	tap_json_kv_bool(&j, "persistent", c.persistent);
	tap_json_kv_bool(&j, "tls", c.tls);
	tap_json_kv_uint(&j, "msgs", msgs);
	tap_json_kv_uint(&j, "sent", sent);
	tap_json_kv_uint(&j, "nacked", nacked);
	tap_json_kv_uint(&j, "returned", returned);
	kv_fixed(&j, "seconds", secs, 6);
	kv_fixed(&j, "msgs_per_s", rate, 1);
	kv_fixed(&j, "mb_per_s", rate * (double)c.size / 1e6, 3);
	tap_json_kv_uint(&j, "p50_us", quantile(lat, n_lat, 0.5));
	tap_json_kv_uint(&j, "p99_us", quantile(lat, n_lat, 0.99));
	tap_json_kv_uint(&j, "max_us", n_lat ? lat[n_lat - 1] : 0);
	tap_json_kv_int(&j, "failed_conns", failed);
	if (first_error)
		tap_json_kv_str(&j, "error", first_error);
	tap_json_obj_end(&j);
	tap_buf_putc(&out, '\n');
	fwrite(out.data, 1, out.len, stdout);
	tap_buf_deinit(&out);
	fflush(stdout);
	delete_queue(&c);
	munmap(shm, res_bytes + lat_bytes);
	free(pids);
	return failed ? 1 : 0;
}
