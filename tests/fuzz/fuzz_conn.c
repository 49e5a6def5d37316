/* libFuzzer harness for the connection observer (conn.c) with a capture sink. Input: one byte (protocol header
 * index in the low 2 bits, chunk size - 1 above), the client stream's length (u16), the client stream (after one of
 * the four accepted protocol headers), the broker stream; both are fed interleaved in chunks. The
 * capture copy must keep every byte count. Exercises 0-8 method mapping, content assembly, body checks, the hold
 * and overwrite logic of the capture copy, and decode errors at any point, and the consumer tracker: every
 * delivery decoded has its one record once the connection ended. */
#include "amqptap/conn.h"
#include "amqptap/consume.h"
#include "amqptap/track.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct counts {
	size_t bytes[TAP_DIR_COUNT];
};

static void emit(void *ctx, const char *json, size_t len)
{
	(void)ctx;
	(void)json;
	(void)len;
}

static void *cap_open(void *ctx, uint64_t conn, const char *client, const char *server, int64_t ts)
{
	(void)conn;
	(void)client;
	(void)server;
	(void)ts;
	return ctx;
}

static void cap_data(void *ctx, void *sc, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts)
{
	struct counts *c = ctx;
	(void)sc;
	(void)ts;
	(void)data;
	c->bytes[dir] += len;
}

static void cap_close(void *ctx, void *sc, const char *how, int64_t ts)
{
	(void)ctx;
	(void)sc;
	(void)how;
	(void)ts;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const headers[] = {"AMQP\0\0\x09\x01", "AMQP\x01\x01\x00\x09", "AMQP\x01\x01\x08\x00",
					      "AMQP\x01\x01\x09\x01"};
	if (size < 3)
		return 0;
	const char *hdr = headers[data[0] & 3];
	size_t step = (size_t)(data[0] >> 2) + 1;
	size_t split = (size_t)data[1] << 8 | data[2]; /* the client stream's length */
	if (split > size - 3)
		split = size - 3;
	const uint8_t *cl = data + 3, *br = data + 3 + split;
	size_t cl_len = split, br_len = size - 3 - split;
	struct counts counts = {{0}};
	struct tap_capture_sink sink = {&counts, cap_open, cap_data, cap_close, NULL};
	struct tap_track *t = tap_track_new(NULL, emit, NULL);
	if (!t)
		return 0;
	struct tap_observer o;
	tap_observer_init(&o, t, emit, NULL, NULL, 0);
	o.capture = &sink;
	struct tap_conn *c = tap_conn_new(&o, 1, "127.0.0.1:1", "127.0.0.1:2", 1);
	if (c) {
		tap_conn_feed(c, TAP_C2S, (const uint8_t *)hdr, 8, 2);
		size_t ci = 0, bi = 0;
		int64_t now = 3;
		while (ci < cl_len || bi < br_len) {
			size_t n = cl_len - ci < step ? cl_len - ci : step;
			tap_conn_feed(c, TAP_C2S, cl + ci, n, now++);
			ci += n;
			n = br_len - bi < step ? br_len - bi : step;
			tap_conn_feed(c, TAP_S2C, br + bi, n, now++);
			bi += n;
			tap_track_tick(t, now);
		}
		tap_conn_end(c, "client_eof", now);
		if (counts.bytes[TAP_C2S] != cl_len + 8 || counts.bytes[TAP_S2C] != br_len)
			abort();
	}
	tap_track_shutdown(t, 1000000);
	struct tap_consume_stats cs; /* every delivery decoded got its one record, none is left unacked */
	tap_consume_get_stats(t, &cs);
	if (cs.deliveries != cs.delivery_records || cs.unacked || cs.consumers_open)
		abort();
	tap_track_free(t);
	tap_observer_deinit(&o);
	return 0;
}
