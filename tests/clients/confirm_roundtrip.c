/* A rabbitmq-c publisher/consumer for amqptap's integration tests: streams N publishes with confirms
 * (a window of unconfirmed messages, acks counted including multiple=true), then consumes them back and
 * checks that every message arrives once and in order. Usage: confirm_roundtrip HOST PORT QUEUE N [WINDOW] */

#if __has_include(<rabbitmq-c/amqp.h>)
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/tcp_socket.h>
#else
#include <amqp.h>
#include <amqp_tcp_socket.h>
#endif

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmq_util.h"

static bool rpc_ok(amqp_connection_state_t conn, const char *what)
{
	amqp_rpc_reply_t r = amqp_get_rpc_reply(conn);
	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return true;
	if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
		fprintf(stderr, "confirm_roundtrip: %s: %s\n", what, amqp_error_string2(r.library_error));
	else
		fprintf(stderr, "confirm_roundtrip: %s: server replied method 0x%08x\n", what, r.reply.id);
	return false;
}

struct confirms {
	struct rmq_confirms seqs; /* tags are 1..n */
	uint64_t n, multiple, duplicate;
};

/* A tag outside 1..n, or a single confirm of a tag already confirmed, counts as a duplicate. */
static void confirm_tag(struct confirms *c, struct rmq_confirm k)
{
	if (k.tag == 0 || k.tag > c->n) {
		c->duplicate++;
		return;
	}
	if (k.multiple)
		c->multiple++;
	if (rmq_confirm_apply(&c->seqs, k, NULL, NULL) == 0 && !k.multiple)
		c->duplicate++;
}

/* Blocks for the next frame on channel 1 and applies it if it is an ack or nack. */
static bool wait_confirm(amqp_connection_state_t conn, struct confirms *c)
{
	amqp_frame_t f;
	int rc = amqp_simple_wait_frame(conn, &f);
	if (rc != AMQP_STATUS_OK) {
		fprintf(stderr, "confirm_roundtrip: waiting for confirms: %s\n", amqp_error_string2(rc));
		return false;
	}
	if (f.frame_type != AMQP_FRAME_METHOD)
		return true;
	struct rmq_confirm k = rmq_confirm_of(&f);
	if (k.kind == RMQ_NOT_A_CONFIRM) {
		fprintf(stderr, "confirm_roundtrip: unexpected method 0x%08x while publishing\n", f.payload.method.id);
		return false;
	}
	confirm_tag(c, k);
	return true;
}

static bool publish_all(amqp_connection_state_t conn, amqp_bytes_t queue, uint64_t n, uint64_t window,
			struct confirms *c)
{
	amqp_confirm_select(conn, 1);
	if (!rpc_ok(conn, "confirm.select"))
		return false;
	amqp_basic_properties_t props = {
		._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG,
		.content_type = amqp_cstring_bytes("text/plain"),
		.delivery_mode = 1,
	};
	char body[64], id[32];
	for (uint64_t i = 1; i <= n; i++) {
		while (i - c->seqs.lowest >= window || (i > 1 && amqp_data_in_buffer(conn)))
			if (!wait_confirm(conn, c))
				return false;
		int len = snprintf(body, sizeof(body), "msg %" PRIu64, i);
		snprintf(id, sizeof(id), "m-%" PRIu64, i);
		props.message_id = amqp_cstring_bytes(id);
		amqp_bytes_t b = {.len = (size_t)len, .bytes = body};
		int rc = amqp_basic_publish(conn, 1, amqp_empty_bytes, queue, 1, 0, &props, b);
		if (rc != AMQP_STATUS_OK) {
			fprintf(stderr, "confirm_roundtrip: publish %" PRIu64 ": %s\n", i, amqp_error_string2(rc));
			return false;
		}
		c->seqs.sent = i;
	}
	while (c->seqs.lowest <= n)
		if (!wait_confirm(conn, c))
			return false;
	return true;
}

static bool consume_all(amqp_connection_state_t conn, amqp_bytes_t queue, uint64_t n, uint64_t *consumed,
			uint64_t *out_of_order)
{
	amqp_basic_qos(conn, 1, 0, 1000, 0);
	if (!rpc_ok(conn, "basic.qos"))
		return false;
	amqp_basic_consume(conn, 1, queue, amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
	if (!rpc_ok(conn, "basic.consume"))
		return false;
	char want[64];
	while (*consumed < n) {
		amqp_envelope_t env;
		amqp_maybe_release_buffers(conn);
		amqp_rpc_reply_t r = amqp_consume_message(conn, &env, NULL, 0);
		if (r.reply_type != AMQP_RESPONSE_NORMAL) {
			fprintf(stderr, "confirm_roundtrip: consume stopped after %" PRIu64 " messages\n", *consumed);
			return false;
		}
		++*consumed;
		int len = snprintf(want, sizeof(want), "msg %" PRIu64, *consumed);
		if (env.message.body.len != (size_t)len || memcmp(env.message.body.bytes, want, (size_t)len) != 0)
			++*out_of_order;
		if (*consumed % 500 == 0 || *consumed == n)
			amqp_basic_ack(conn, 1, env.delivery_tag, 1);
		amqp_destroy_envelope(&env);
	}
	return true;
}

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: confirm_roundtrip HOST PORT QUEUE N [WINDOW]\n");
		return 2;
	}
	const char *host = argv[1];
	int port = atoi(argv[2]);
	amqp_bytes_t queue = amqp_cstring_bytes(argv[3]);
	uint64_t n = strtoull(argv[4], NULL, 10);
	uint64_t window = argc > 5 ? strtoull(argv[5], NULL, 10) : 1000;
	if (n == 0 || window == 0) {
		fprintf(stderr, "confirm_roundtrip: N and WINDOW must be positive\n");
		return 2;
	}

	amqp_connection_state_t conn = amqp_new_connection();
	amqp_socket_t *sock = amqp_tcp_socket_new(conn);
	if (!sock || amqp_socket_open(sock, host, port) != AMQP_STATUS_OK) {
		fprintf(stderr, "confirm_roundtrip: cannot connect to %s:%d\n", host, port);
		return 1;
	}
	amqp_rpc_reply_t lr = amqp_login(conn, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest");
	if (lr.reply_type != AMQP_RESPONSE_NORMAL) {
		fprintf(stderr, "confirm_roundtrip: login failed\n");
		return 1;
	}
	amqp_channel_open(conn, 1);
	if (!rpc_ok(conn, "channel.open"))
		return 1;
	amqp_queue_declare(conn, 1, queue, 0, 0, 0, 0, amqp_empty_table);
	if (!rpc_ok(conn, "queue.declare"))
		return 1;

	struct confirms c = {.n = n};
	uint64_t consumed = 0, out_of_order = 0;
	bool ok = rmq_confirms_init(&c.seqs, n) && publish_all(conn, queue, n, window, &c);
	ok = ok && consume_all(conn, queue, n, &consumed, &out_of_order);
	if (ok) {
		amqp_queue_delete(conn, 1, queue, 0, 0);
		ok = rpc_ok(conn, "queue.delete");
	}
	printf("confirm_roundtrip: published=%" PRIu64 " acked=%" PRIu64 " nacked=%" PRIu64 " multiple=%" PRIu64
	       " duplicate=%" PRIu64 " consumed=%" PRIu64 " out_of_order=%" PRIu64 "\n",
	       n, c.seqs.acked, c.seqs.nacked, c.multiple, c.duplicate, consumed, out_of_order);
	rmq_confirms_deinit(&c.seqs);
	amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	ok = ok && c.seqs.acked == n && c.seqs.nacked == 0 && c.duplicate == 0 && consumed == n && out_of_order == 0;
	return ok ? 0 : 1;
}
