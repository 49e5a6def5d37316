/* Many-connection load for scripts/bench-soak.sh: one process opens C publisher connections (confirm mode), holds
 * them all open at once, then has each keep W mandatory publishes in flight until N are confirmed, multiplexed with
 * poll(), into one bounded queue (drop-head) declared over the first connection; all stay open until the last confirm.
 * Prints one JSON line (totals, acks, nacks, returns, failures). -P MS holds every connection open that long after
 * they are all up and again after the last confirm, so an observer can count the tap's descriptors.
 * Usage: bench_manyconn [-H host] [-p port] [-c conns] [-w window] [-n msgs-per-conn] [-s bytes] [-q queue] [-P ms]
 */
#if defined(__has_include)
#if __has_include(<rabbitmq-c/amqp.h>)
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/tcp_socket.h>
#define MC_HAVE_NEW_HEADERS 1
#endif
#endif
#ifndef MC_HAVE_NEW_HEADERS
#include <amqp.h> /* rabbitmq-c 0.11 as Debian packages it installs the headers at the top level */
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#endif
#include "bench_util.h"

#include "amqptap/jsonl.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MC_CHANNEL 1
#define MC_FRAME_MAX 131072
#define MC_QUEUE_MAX_LEN 10000
#define MC_QUEUE_EXPIRES_MS 60000

struct mc_conf {
	const char *host, *queue;
	int port, conns, pause_ms;
	uint64_t window, count;
	size_t size;
};

struct mc_conn {
	amqp_connection_state_t conn;
	struct rmq_confirms c;
	uint64_t returned;
	const char *error;
};

/* A bounded queue: drop-head keeps the newest messages, so publishes are never refused (no nacks). */
static const char *declare_queue(const struct mc_conf *c, amqp_connection_state_t conn)
{
	amqp_table_entry_t args[3] = {
	    {.key = amqp_cstring_bytes("x-max-length"),
	     .value = {.kind = AMQP_FIELD_KIND_I64, .value.i64 = MC_QUEUE_MAX_LEN}},
	    {.key = amqp_cstring_bytes("x-overflow"),
	     .value = {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes("drop-head")}},
	    {.key = amqp_cstring_bytes("x-expires"),
	     .value = {.kind = AMQP_FIELD_KIND_I64, .value.i64 = MC_QUEUE_EXPIRES_MS}},
	};
	amqp_table_t table = {.num_entries = 3, .entries = args};
	amqp_queue_declare(conn, MC_CHANNEL, amqp_cstring_bytes(c->queue), 0, 0, 0, 0, table);
	return rpc_error(amqp_get_rpc_reply(conn));
}

static const char *mc_open(const struct mc_conf *c, struct mc_conn *s, bool declare)
{
	if (!rmq_confirms_init(&s->c, c->count))
		return "out of memory";
	s->conn = amqp_new_connection();
	amqp_socket_t *sock = amqp_tcp_socket_new(s->conn);
	if (!sock)
		return "cannot create a socket";
	if (amqp_socket_open(sock, c->host, c->port) != AMQP_STATUS_OK)
		return "cannot connect";
	const char *err =
	    rpc_error(amqp_login(s->conn, "/", 0, MC_FRAME_MAX, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest"));
	if (!err) {
		amqp_channel_open(s->conn, MC_CHANNEL);
		err = rpc_error(amqp_get_rpc_reply(s->conn));
	}
	if (!err && declare)
		err = declare_queue(c, s->conn);
	if (!err) {
		amqp_confirm_select(s->conn, MC_CHANNEL);
		err = rpc_error(amqp_get_rpc_reply(s->conn));
	}
	return err;
}

static const char *on_frame(struct mc_conn *s, const amqp_frame_t *f)
{
	struct rmq_confirm k = rmq_confirm_of(f);
	if (k.kind != RMQ_NOT_A_CONFIRM) {
		rmq_confirm_apply(&s->c, k, NULL, NULL);
		return NULL;
	}
	if (f->frame_type != AMQP_FRAME_METHOD)
		return NULL;
	switch (f->payload.method.id) {
	case AMQP_BASIC_RETURN_METHOD: {
		amqp_message_t msg;
		if (amqp_read_message(s->conn, f->channel, &msg, 0).reply_type != AMQP_RESPONSE_NORMAL)
			return "could not read a returned message";
		amqp_destroy_message(&msg);
		s->returned++;
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

static const char *fill_window(const struct mc_conf *c, struct mc_conn *s, amqp_bytes_t body)
{
	amqp_basic_properties_t props = {
	    ._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG,
	    .content_type = amqp_cstring_bytes("application/octet-stream"),
	    .delivery_mode = 1,
	};
	while (s->c.sent < c->count && s->c.sent - s->c.confirmed < c->window) {
		int rc = amqp_basic_publish(s->conn, MC_CHANNEL, amqp_cstring_bytes(""), amqp_cstring_bytes(c->queue),
		                            1, 0, &props, body);
		if (rc != AMQP_STATUS_OK)
			return amqp_error_string2(rc);
		s->c.sent++;
	}
	return NULL;
}

/* Reads every frame already available on the connection without blocking. */
static const char *drain(struct mc_conn *s)
{
	for (;;) {
		amqp_frame_t f;
		struct timeval zero = {0, 0};
		int rc = amqp_simple_wait_frame_noblock(s->conn, &f, &zero);
		if (rc == AMQP_STATUS_TIMEOUT)
			return NULL;
		if (rc != AMQP_STATUS_OK)
			return amqp_error_string2(rc);
		const char *err = on_frame(s, &f);
		if (err)
			return err;
		if (!amqp_frames_enqueued(s->conn) && !amqp_data_in_buffer(s->conn))
			return NULL;
	}
}

static bool active(const struct mc_conf *c, const struct mc_conn *s)
{
	return s->conn && !s->error && s->c.confirmed < c->count;
}

static void publish_all(const struct mc_conf *c, struct mc_conn *cs, size_t n)
{
	char *body = malloc(c->size ? c->size : 1);
	struct pollfd *pfd = calloc(n, sizeof *pfd);
	size_t *idx = calloc(n, sizeof *idx);
	if (!body || !pfd || !idx) {
		for (size_t i = 0; i < n; i++)
			if (active(c, &cs[i]))
				cs[i].error = "out of memory";
		goto out;
	}
	memset(body, 'x', c->size ? c->size : 1);
	amqp_bytes_t b = {.len = c->size, .bytes = body};
	for (;;) {
		size_t k = 0;
		for (size_t i = 0; i < n; i++) {
			struct mc_conn *s = &cs[i];
			if (!active(c, s))
				continue;
			s->error = fill_window(c, s, b);
			if (s->error)
				continue;
			pfd[k] = (struct pollfd){.fd = amqp_get_sockfd(s->conn), .events = POLLIN};
			idx[k++] = i;
		}
		if (!k)
			break;
		int r = poll(pfd, k, 10000);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			for (size_t j = 0; j < k; j++)
				cs[idx[j]].error = r ? "poll failed" : "no confirm within 10 s";
			break;
		}
		for (size_t j = 0; j < k; j++) {
			struct mc_conn *s = &cs[idx[j]];
			if (pfd[j].revents || amqp_frames_enqueued(s->conn) || amqp_data_in_buffer(s->conn))
				s->error = drain(s);
		}
	}
out:
	free(body);
	free(pfd);
	free(idx);
}

static void usage(const char *argv0)
{
	fprintf(stderr,
	        "usage: %s [-H host] [-p port] [-c conns] [-w window] [-n msgs-per-conn] [-s bytes] [-q queue] "
	        "[-P hold-ms]\n",
	        argv0);
}

int main(int argc, char **argv)
{
	struct mc_conf c = {.host = "127.0.0.1", .port = 5672, .conns = 1000, .window = 10, .count = 50, .size = 64};
	char qname[64];
	snprintf(qname, sizeof qname, "amqptap-manyconn-%ld", (long)getpid());
	c.queue = qname;
	int opt;
	while ((opt = getopt(argc, argv, "H:p:c:w:n:s:q:P:h")) != -1) {
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
		case 'w':
			c.window = strtoull(optarg, NULL, 10);
			break;
		case 'n':
			c.count = strtoull(optarg, NULL, 10);
			break;
		case 's':
			c.size = strtoull(optarg, NULL, 10);
			break;
		case 'q':
			c.queue = optarg;
			break;
		case 'P':
			c.pause_ms = atoi(optarg);
			break;
		default:
			usage(argv[0]);
			return opt == 'h' ? 0 : 2;
		}
	}
	if (optind != argc || c.port <= 0 || c.port > 65535 || c.conns <= 0 || c.conns > 100000 || !c.window ||
	    !c.count || c.pause_ms < 0) {
		usage(argv[0]);
		return 2;
	}

	size_t n = (size_t)c.conns;
	struct mc_conn *cs = calloc(n, sizeof *cs);
	if (!cs)
		return 1;
	uint64_t t0 = now_us();
	size_t opened = 0;
	for (size_t i = 0; i < n; i++) {
		cs[i].error = mc_open(&c, &cs[i], i == 0);
		if (!cs[i].error)
			opened++;
		else if (i == 0)
			break; /* no queue: nothing to publish to */
	}
	uint64_t t1 = now_us();
	fprintf(stderr, "bench_manyconn: %zu of %zu connections open in %.1f s\n", opened, n, (double)(t1 - t0) / 1e6);
	if (c.pause_ms)
		usleep((useconds_t)c.pause_ms * 1000u);
	uint64_t t2 = now_us();
	if (opened)
		publish_all(&c, cs, n);
	uint64_t t3 = now_us();
	if (c.pause_ms)
		usleep((useconds_t)c.pause_ms * 1000u);

	uint64_t sent = 0, acked = 0, nacked = 0, returned = 0;
	size_t failed = 0;
	const char *first_error = NULL;
	for (size_t i = 0; i < n; i++) {
		struct mc_conn *s = &cs[i];
		sent += s->c.sent;
		acked += s->c.acked;
		nacked += s->c.nacked;
		returned += s->returned;
		if (s->error) {
			failed++;
			if (!first_error)
				first_error = s->error;
		}
	}
	/* Every connection closes cleanly, the first last after deleting the queue. */
	for (size_t i = n; i-- > 0;) {
		struct mc_conn *s = &cs[i];
		if (s->conn && !s->error) {
			if (i == 0) {
				amqp_queue_delete(s->conn, MC_CHANNEL, amqp_cstring_bytes(c.queue), 0, 0);
				(void)amqp_get_rpc_reply(s->conn);
			}
			amqp_channel_close(s->conn, MC_CHANNEL, AMQP_REPLY_SUCCESS);
			amqp_connection_close(s->conn, AMQP_REPLY_SUCCESS);
		}
		if (s->conn)
			amqp_destroy_connection(s->conn);
		rmq_confirms_deinit(&s->c);
	}
	free(cs);

	double secs = (double)(t3 - t2) / 1e6;
	struct tap_buf out;
	struct tap_json j;
	tap_buf_init(&out);
	tap_json_init(&j, &out);
	tap_json_obj_begin(&j);
	tap_json_kv_str(&j, "host", c.host);
	tap_json_kv_int(&j, "port", c.port);
	tap_json_kv_int(&j, "conns", c.conns);
	tap_json_kv_uint(&j, "opened", opened);
	tap_json_kv_uint(&j, "window", c.window);
	tap_json_kv_uint(&j, "size", c.size);
	tap_json_kv_bool(&j, "mandatory", true);
	tap_json_kv_uint(&j, "msgs", acked + nacked);
	tap_json_kv_uint(&j, "sent", sent);
	tap_json_kv_uint(&j, "acked", acked);
	tap_json_kv_uint(&j, "nacked", nacked);
	tap_json_kv_uint(&j, "returned", returned);
	kv_fixed(&j, "open_seconds", (double)(t1 - t0) / 1e6, 3);
	kv_fixed(&j, "seconds", secs, 6);
	kv_fixed(&j, "msgs_per_s", secs > 0 ? (double)(acked + nacked) / secs : 0, 1);
	tap_json_kv_uint(&j, "failed_conns", failed);
	if (first_error)
		tap_json_kv_str(&j, "error", first_error);
	tap_json_obj_end(&j);
	tap_buf_putc(&out, '\n');
	fwrite(out.data, 1, out.len, stdout);
	tap_buf_deinit(&out);
	return failed || opened != n ? 1 : 0;
}
