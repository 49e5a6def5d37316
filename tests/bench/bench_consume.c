/* The consumer benchmark's client (scripts/bench-consume.sh), rabbitmq-c: `fill` publishes N messages of S bytes
 * (with message ids) into a queue it declares, straight to the broker, and waits until the queue holds them all;
 * `consume` takes N messages from it with prefetch P and manual acks (one ack per message), and prints one JSON line:
 * deliveries, seconds, deliveries/s.
 * Usage: bench_consume fill|consume [-H host] [-p port] [-q queue] [-n msgs] [-s bytes] [-P prefetch] */
#if defined(__has_include)
#if __has_include(<rabbitmq-c/amqp.h>)
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/tcp_socket.h>
#define BC_HAVE_NEW_HEADERS 1
#endif
#endif
#ifndef BC_HAVE_NEW_HEADERS
#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
	fprintf(stderr, "bench_consume: %s\n", what);
	exit(1);
}

static void check(amqp_rpc_reply_t r, const char *what)
{
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
		die(what);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static amqp_connection_state_t connect_to(const char *host, int port)
{
	amqp_connection_state_t conn = amqp_new_connection();
	amqp_socket_t *sock = amqp_tcp_socket_new(conn);
	if (!sock || amqp_socket_open(sock, host, port) != AMQP_STATUS_OK)
		die("cannot connect");
	check(amqp_login(conn, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest"), "login");
	amqp_channel_open(conn, 1);
	check(amqp_get_rpc_reply(conn), "channel.open");
	return conn;
}

static uint32_t queue_depth(amqp_connection_state_t conn, const char *queue)
{
	amqp_queue_declare_ok_t *ok =
	    amqp_queue_declare(conn, 1, amqp_cstring_bytes(queue), 0, 0, 0, 0, amqp_empty_table);
	check(amqp_get_rpc_reply(conn), "queue.declare");
	return ok->message_count;
}

int main(int argc, char **argv)
{
	const char *host = "127.0.0.1", *queue = "bench-consume";
	int port = 5672, prefetch = 100;
	long n = 100000, size = 64;
	if (argc < 2)
		die("usage: bench_consume fill|consume [-H host] [-p port] [-q queue] [-n msgs] [-s bytes] "
		    "[-P prefetch]");
	const char *mode = argv[1];
	int opt;
	optind = 2;
	while ((opt = getopt(argc, argv, "H:p:q:n:s:P:")) != -1) {
		switch (opt) {
		case 'H': host = optarg; break;
		case 'p': port = atoi(optarg); break;
		case 'q': queue = optarg; break;
		case 'n': n = atol(optarg); break;
		case 's': size = atol(optarg); break;
		case 'P': prefetch = atoi(optarg); break;
		default: die("bad option");
		}
	}
	amqp_connection_state_t conn = connect_to(host, port);
	if (!strcmp(mode, "fill")) {
		char *body = calloc(1, (size_t)size + 1);
		memset(body, 'x', (size_t)size);
		(void)queue_depth(conn, queue);
		for (long i = 0; i < n; i++) {
			char id[32];
			snprintf(id, sizeof id, "bench-%ld", i);
			amqp_basic_properties_t props = {._flags = AMQP_BASIC_MESSAGE_ID_FLAG,
			                                 .message_id = amqp_cstring_bytes(id)};
			if (amqp_basic_publish(conn, 1, amqp_empty_bytes, amqp_cstring_bytes(queue), 0, 0, &props,
			                       (amqp_bytes_t){(size_t)size, body}) != AMQP_STATUS_OK)
				die("publish");
		}
		for (int tries = 0; queue_depth(conn, queue) < (uint32_t)n; tries++) {
			if (tries > 600)
				die("the queue never held every message");
			usleep(50000);
		}
		free(body);
	} else if (!strcmp(mode, "consume")) {
		amqp_basic_qos(conn, 1, 0, (uint16_t)prefetch, 0);
		check(amqp_get_rpc_reply(conn), "basic.qos");
		amqp_basic_consume(conn, 1, amqp_cstring_bytes(queue), amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
		check(amqp_get_rpc_reply(conn), "basic.consume");
		double t0 = now_s();
		for (long i = 0; i < n; i++) {
			amqp_envelope_t env;
			amqp_maybe_release_buffers(conn);
			check(amqp_consume_message(conn, &env, NULL, 0), "consume");
			if (amqp_basic_ack(conn, 1, env.delivery_tag, 0) != AMQP_STATUS_OK)
				die("ack");
			amqp_destroy_envelope(&env);
		}
		double secs = now_s() - t0;
		printf("{\"deliveries\":%ld,\"seconds\":%.3f,\"deliveries_per_s\":%.0f}\n", n, secs, (double)n / secs);
	} else {
		die("mode: fill or consume");
	}
	amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	return 0;
}
