/* A rabbitmq-c publisher for the streaming-confirm scenarios (src/DESIGN.md §7 items 8-9): keeps `window` publishes in
 * flight on one confirm channel, counts acks (including multiple=true ones), nacks and returns, and prints one JSON
 * line with the totals and its own confirm latency; a progress line is flushed every 1000 confirms.
 * Usage: stream_publisher host port count size window mandatory(0/1) routing_key exchange */
#if defined(__has_include)
#if __has_include(<rabbitmq-c/amqp.h>)
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/tcp_socket.h>
#define SP_HAVE_NEW_HEADERS 1
#endif
#endif
#ifndef SP_HAVE_NEW_HEADERS
#include <amqp.h> /* rabbitmq-c 0.11 as Debian packages it installs the headers at the top level */
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#endif
#include "rmq_util.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SP_CHANNEL 1

struct sp_state {
	struct rmq_confirms c;
	uint64_t count, returned, multiple_acks;
	uint64_t *sent_at;   /* [1..count] monotonic µs when the publish was handed to the socket */
	uint64_t *lat;       /* confirm latencies, n_lat of them */
	uint64_t n_lat;
	uint64_t confirm_at; /* when the confirm being applied arrived */
	uint64_t next_progress;
	const char *error;
};

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static uint64_t quantile(const uint64_t *v, uint64_t n, double q)
{
	if (!n)
		return 0;
	uint64_t i = (uint64_t)(q * (double)(n - 1) + 0.5);
	return v[i < n ? i : n - 1];
}

static void on_confirmed(void *arg, uint64_t seq, bool nack)
{
	(void)nack;
	struct sp_state *s = arg;
	s->lat[s->n_lat++] = s->confirm_at - s->sent_at[seq];
}

static void on_confirm(struct sp_state *s, struct rmq_confirm k)
{
	s->confirm_at = now_us();
	if (k.multiple && k.kind == RMQ_ACK)
		s->multiple_acks++;
	rmq_confirm_apply(&s->c, k, on_confirmed, s);
	uint64_t confirmed = s->c.confirmed;
	if (confirmed >= s->next_progress) {
		printf("{\"progress\":%" PRIu64 "}\n", confirmed);
		fflush(stdout);
		s->next_progress = (confirmed / 1000 + 1) * 1000;
	}
}

/* Handles one frame; returns false when the stream is over (an error was recorded). */
static bool on_frame(amqp_connection_state_t conn, struct sp_state *s, const amqp_frame_t *f)
{
	struct rmq_confirm k = rmq_confirm_of(f);
	if (k.kind != RMQ_NOT_A_CONFIRM) {
		on_confirm(s, k);
		return true;
	}
	if (f->frame_type != AMQP_FRAME_METHOD)
		return true;
	switch (f->payload.method.id) {
	case AMQP_BASIC_RETURN_METHOD: {
		amqp_message_t msg;
		amqp_rpc_reply_t r = amqp_read_message(conn, f->channel, &msg, 0);
		if (r.reply_type != AMQP_RESPONSE_NORMAL) {
			s->error = "could not read a returned message";
			return false;
		}
		amqp_destroy_message(&msg);
		s->returned++;
		return true;
	}
	case AMQP_CONNECTION_CLOSE_METHOD: {
		amqp_connection_close_ok_t ok;
		amqp_send_method(conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
		s->error = "connection.close from the broker";
		return false;
	}
	case AMQP_CHANNEL_CLOSE_METHOD: {
		amqp_channel_close_ok_t ok;
		amqp_send_method(conn, f->channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
		s->error = "channel.close from the broker";
		return false;
	}
	default:
		return true;
	}
}

int main(int argc, char **argv)
{
	if (argc != 9) {
		fprintf(stderr, "usage: %s host port count size window mandatory(0/1) routing_key exchange\n", argv[0]);
		return 2;
	}
	const char *host = argv[1];
	int port = atoi(argv[2]);
	uint64_t count = strtoull(argv[3], NULL, 10);
	size_t size = strtoull(argv[4], NULL, 10);
	uint64_t window = strtoull(argv[5], NULL, 10);
	int mandatory = atoi(argv[6]) != 0;
	const char *rk = argv[7], *exchange = argv[8];
	if (!count || !window || port <= 0) {
		fprintf(stderr, "count, window and port must be positive\n");
		return 2;
	}

	struct sp_state s = {.count = count, .next_progress = 1000};
	bool seqs = rmq_confirms_init(&s.c, count);
	s.sent_at = calloc(count + 1, sizeof *s.sent_at);
	s.lat = calloc(count, sizeof *s.lat);
	char *body = malloc(size ? size : 1);
	if (!seqs || !s.sent_at || !s.lat || !body) {
		fprintf(stderr, "out of memory\n");
		return 1;
	}
	memset(body, 'x', size);

	amqp_connection_state_t conn = amqp_new_connection();
	amqp_socket_t *sock = amqp_tcp_socket_new(conn);
	if (!sock || amqp_socket_open(sock, host, port) != AMQP_STATUS_OK) {
		fprintf(stderr, "cannot connect to %s:%d\n", host, port);
		return 1;
	}
	const char *err = rpc_error(amqp_login(conn, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest"));
	if (!err) {
		amqp_channel_open(conn, SP_CHANNEL);
		err = rpc_error(amqp_get_rpc_reply(conn));
	}
	if (!err) {
		amqp_confirm_select(conn, SP_CHANNEL);
		err = rpc_error(amqp_get_rpc_reply(conn));
	}
	if (err) {
		fprintf(stderr, "setup failed: %s\n", err);
		return 1;
	}

	char mid[32];
	amqp_basic_properties_t props = {
		._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG,
		.content_type = amqp_cstring_bytes("application/octet-stream"),
		.delivery_mode = 2,
	};
	amqp_bytes_t body_bytes = {.len = size, .bytes = body};
	while (!s.error && s.c.confirmed < count) {
		while (s.c.sent < count && s.c.sent - s.c.confirmed < window) {
			uint64_t seq = s.c.sent + 1;
			snprintf(mid, sizeof mid, "s-%" PRIu64, seq);
			props.message_id = amqp_cstring_bytes(mid);
			s.sent_at[seq] = now_us();
			int rc = amqp_basic_publish(conn, SP_CHANNEL, amqp_cstring_bytes(exchange), amqp_cstring_bytes(rk),
						    mandatory, 0, &props, body_bytes);
			if (rc != AMQP_STATUS_OK) {
				s.error = amqp_error_string2(rc);
				break;
			}
			s.c.sent = seq;
		}
		if (s.error)
			break;
		amqp_frame_t f;
		int rc = amqp_simple_wait_frame(conn, &f);
		if (rc != AMQP_STATUS_OK) {
			s.error = amqp_error_string2(rc);
			break;
		}
		if (!on_frame(conn, &s, &f))
			break;
		/* drain what is already buffered before publishing more */
		while (!s.error && (amqp_frames_enqueued(conn) || amqp_data_in_buffer(conn))) {
			struct timeval zero = {0, 0};
			rc = amqp_simple_wait_frame_noblock(conn, &f, &zero);
			if (rc == AMQP_STATUS_TIMEOUT)
				break;
			if (rc != AMQP_STATUS_OK) {
				s.error = amqp_error_string2(rc);
				break;
			}
			if (!on_frame(conn, &s, &f))
				break;
		}
	}

	qsort(s.lat, s.n_lat, sizeof *s.lat, cmp_u64);
	printf("{\"sent\":%" PRIu64 ",\"acked\":%" PRIu64 ",\"nacked\":%" PRIu64 ",\"returned\":%" PRIu64
	       ",\"multiple_acks\":%" PRIu64 ",\"p50_us\":%" PRIu64 ",\"p99_us\":%" PRIu64 ",\"max_us\":%" PRIu64,
	       s.c.sent, s.c.acked, s.c.nacked, s.returned, s.multiple_acks, quantile(s.lat, s.n_lat, 0.5),
	       quantile(s.lat, s.n_lat, 0.99), s.n_lat ? s.lat[s.n_lat - 1] : 0);
	if (s.error)
		printf(",\"error\":\"%s\"", s.error);
	printf("}\n");
	fflush(stdout);

	if (!s.error) {
		amqp_channel_close(conn, SP_CHANNEL, AMQP_REPLY_SUCCESS);
		amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	}
	amqp_destroy_connection(conn);
	free(s.sent_at);
	rmq_confirms_deinit(&s.c);
	free(s.lat);
	free(body);
	return s.error ? 1 : 0;
}
