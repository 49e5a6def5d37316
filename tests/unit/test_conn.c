/* The per-connection observer: a hand-built client/broker exchange is fed
 * whole, split at every offset and one byte at a time; the records, and the
 * capture copy with its password overwritten, must not depend on the split. */
#include "amqptap/conn.h"
#include "amqptap/redact.h"
#include "amqptap/track.h"

#include <check.h>

#include "tap_check.h"
#include <stdlib.h>
#include <string.h>

/* ---- a tiny AMQP encoder for the test streams ---- */

struct bytes {
	uint8_t d[8192];
	size_t n;
};

static void put(struct bytes *b, const void *p, size_t n)
{
	ck_assert_uint_le(b->n + n, sizeof b->d);
	memcpy(b->d + b->n, p, n);
	b->n += n;
}
static void u8(struct bytes *b, uint8_t v) { put(b, &v, 1); }
static void u16(struct bytes *b, uint16_t v) { u8(b, v >> 8); u8(b, v & 0xff); }
static void u32(struct bytes *b, uint32_t v) { u16(b, v >> 16); u16(b, v & 0xffff); }
static void u64(struct bytes *b, uint64_t v) { u32(b, v >> 32); u32(b, v & 0xffffffff); }
static void sstr(struct bytes *b, const char *s) { u8(b, (uint8_t)strlen(s)); put(b, s, strlen(s)); }
static void lstr(struct bytes *b, const void *s, size_t n) { u32(b, (uint32_t)n); put(b, s, n); }

static void frame(struct bytes *out, uint8_t type, uint16_t ch, const struct bytes *payload)
{
	u8(out, type);
	u16(out, ch);
	u32(out, (uint32_t)payload->n);
	put(out, payload->d, payload->n);
	u8(out, 0xCE);
}

static void method(struct bytes *out, uint16_t ch, uint16_t cls, uint16_t mth, const struct bytes *args)
{
	struct bytes p = {.n = 0};
	u16(&p, cls);
	u16(&p, mth);
	if (args)
		put(&p, args->d, args->n);
	frame(out, 1, ch, &p);
}

#define PASSWORD "s3cr3t-pw"

static void client_stream(struct bytes *c)
{
	put(c, "AMQP\0\0\x09\x01", 8);
	struct bytes a = {.n = 0};
	u32(&a, 0); /* client-properties: empty table */
	sstr(&a, "PLAIN");
	lstr(&a, "\0guest\0" PASSWORD, 7 + strlen(PASSWORD));
	sstr(&a, "en_US");
	method(c, 0, 10, 11, &a); /* connection.start-ok */
	a.n = 0;
	u16(&a, 2047);
	u32(&a, 131072);
	u16(&a, 60);
	method(c, 0, 10, 31, &a); /* tune-ok */
	a.n = 0;
	sstr(&a, "/");
	sstr(&a, "");
	u8(&a, 0);
	method(c, 0, 10, 40, &a); /* connection.open */
	a.n = 0;
	sstr(&a, "");
	method(c, 1, 20, 10, &a); /* channel.open */
	a.n = 0;
	u8(&a, 0);
	method(c, 1, 85, 10, &a); /* confirm.select */
	for (int i = 0; i < 2; i++) {
		a.n = 0;
		u16(&a, 0);
		sstr(&a, "x.d");
		sstr(&a, i == 0 ? "match" : "nomatch");
		u8(&a, 1); /* mandatory */
		method(c, 1, 60, 40, &a); /* basic.publish */
		struct bytes h = {.n = 0};
		u16(&h, 60);
		u16(&h, 0);
		u64(&h, 12);
		u16(&h, 1u << 7); /* message-id */
		sstr(&h, i == 0 ? "id-1" : "id-2");
		frame(c, 2, 1, &h);
		struct bytes body = {.n = 0};
		put(&body, "hello ", 6);
		frame(c, 3, 1, &body);
		frame(c, 3, 1, &body);
	}
}

static void broker_stream(struct bytes *s)
{
	struct bytes a = {.n = 0};
	sstr(&a, "");
	method(s, 0, 10, 41, &a); /* connection.open-ok */
	a.n = 0;
	u16(&a, 312);
	sstr(&a, "NO_ROUTE");
	sstr(&a, "x.d");
	sstr(&a, "nomatch");
	method(s, 1, 60, 50, &a); /* basic.return */
	struct bytes h = {.n = 0};
	u16(&h, 60);
	u16(&h, 0);
	u64(&h, 12);
	u16(&h, 1u << 7);
	sstr(&h, "id-2");
	frame(s, 2, 1, &h);
	struct bytes body = {.n = 0};
	put(&body, "hello hello ", 12);
	frame(s, 3, 1, &body);
	a.n = 0;
	u64(&a, 2);
	u8(&a, 1); /* multiple */
	method(s, 1, 60, 80, &a); /* basic.ack */
}

/* ---- sinks ---- */

struct sink {
	char records[16384];
	size_t len;
	uint8_t captured[2][8192];
	size_t cap_len[2];
	int opened, closed;
};

static void emit(void *ctx, const char *json, size_t len)
{
	struct sink *s = ctx;
	ck_assert_uint_lt(s->len + len + 1, sizeof s->records);
	memcpy(s->records + s->len, json, len);
	s->len += len;
	s->records[s->len++] = '\n';
	s->records[s->len] = '\0';
}

static void *cap_open(void *ctx, uint64_t conn, const char *client, const char *server, int64_t ts)
{
	struct sink *s = ctx;
	(void)conn, (void)client, (void)server, (void)ts;
	s->opened++;
	return s;
}

static void cap_data(void *ctx, void *sc, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts)
{
	struct sink *s = ctx;
	(void)sc, (void)ts;
	ck_assert_uint_le(s->cap_len[dir] + len, sizeof s->captured[dir]);
	memcpy(s->captured[dir] + s->cap_len[dir], data, len);
	s->cap_len[dir] += len;
}

static void cap_close(void *ctx, void *sc, int64_t ts)
{
	struct sink *s = ctx;
	(void)sc, (void)ts;
	s->closed++;
}

static const struct tap_capture_sink capture = {NULL, cap_open, cap_data, cap_close};

/* Feeds both streams with the client side cut into `step`-byte pieces
 * (0: one piece) and, when `cut` > 0, one extra cut at that offset. */
static void run(struct sink *s, size_t step, size_t cut)
{
	memset(s, 0, sizeof *s);
	struct tap_track_conf tc = {0};
	struct tap_track *t = tap_track_new(&tc, emit, s);
	struct tap_observer o;
	struct tap_capture_sink cs = capture;
	cs.ctx = s;
	tap_observer_init(&o, t, emit, s, NULL, 0);
	o.capture = &cs;
	struct tap_conn *c = tap_conn_new(&o, 7, "127.0.0.1:40000", "127.0.0.1:5672", 1000);
	ck_assert_ptr_nonnull(c);
	static struct bytes cl, br;
	cl.n = br.n = 0;
	client_stream(&cl);
	broker_stream(&br);
	size_t off = 0;
	while (off < cl.n) {
		size_t n = step ? step : cl.n;
		if (cut > off && cut < off + n)
			n = cut - off;
		if (n > cl.n - off)
			n = cl.n - off;
		tap_conn_feed(c, true, cl.d + off, n, 2000);
		off += n;
	}
	tap_conn_feed(c, false, br.d, br.n, 3000);
	tap_conn_end(c, "client_eof", 4000);
	tap_track_shutdown(t, 5000);
	tap_track_free(t);
	tap_observer_deinit(&o);
	ck_assert_uint_eq(s->cap_len[1], cl.n);
	ck_assert_uint_eq(s->cap_len[0], br.n);
}

static size_t count(const char *hay, const char *needle)
{
	size_t n = 0;
	for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
		n++;
	return n;
}

START_TEST(records_of_a_session)
{
	static struct sink s;
	run(&s, 0, 0);
	ck_assert_uint_eq(count(s.records, "\"type\":\"publish\""), 2);
	ck_assert_ptr_nonnull(strstr(s.records, "\"user\":\"guest\""));
	ck_assert_ptr_nonnull(strstr(s.records, "\"vhost\":\"/\""));
	ck_assert_ptr_nonnull(strstr(s.records, "\"seq\":1,\"exchange\":\"x.d\",\"routing_key\":\"match\""));
	ck_assert_ptr_nonnull(strstr(s.records, "\"route\":\"returned\",\"reply_code\":312"));
	ck_assert_ptr_nonnull(strstr(s.records, "\"order\":\"return_before_ack\""));
	ck_assert_ptr_nonnull(strstr(s.records, "\"route\":\"routed\""));
	ck_assert_ptr_null(strstr(s.records, PASSWORD));
	ck_assert_int_eq(s.opened, 1);
	ck_assert_int_eq(s.closed, 1);
}
END_TEST

START_TEST(capture_overwrites_only_the_password)
{
	static struct sink s;
	static struct bytes cl;
	cl.n = 0;
	client_stream(&cl);
	run(&s, 0, 0);
	const uint8_t *pw = memmem(cl.d, cl.n, PASSWORD, strlen(PASSWORD));
	ck_assert_ptr_nonnull(pw);
	size_t at = (size_t)(pw - cl.d);
	ck_assert_ptr_null(memmem(s.captured[1], s.cap_len[1], PASSWORD, strlen(PASSWORD)));
	for (size_t i = 0; i < cl.n; i++) {
		if (i >= at && i < at + strlen(PASSWORD))
			ck_assert_uint_eq(s.captured[1][i], TAP_REDACT_FILL);
		else
			ck_assert_uint_eq(s.captured[1][i], cl.d[i]);
	}
	ck_assert_ptr_nonnull(memmem(s.captured[1], s.cap_len[1], "\0guest\0", 7));
}
END_TEST

/* Records carry ts; the splits change no time, so the text must be equal. */
START_TEST(any_split_gives_the_same_result)
{
	static struct sink whole, part;
	run(&whole, 0, 0);
	static struct bytes cl;
	cl.n = 0;
	client_stream(&cl);
	for (size_t cut = 1; cut < cl.n; cut++) {
		run(&part, 0, cut);
		ck_assert_str_eq(part.records, whole.records);
		ck_assert_mem_eq(part.captured[1], whole.captured[1], whole.cap_len[1]);
	}
	run(&part, 1, 0);
	ck_assert_str_eq(part.records, whole.records);
	ck_assert_mem_eq(part.captured[1], whole.captured[1], whole.cap_len[1]);
}
END_TEST

START_TEST(foreign_protocol_is_a_decode_error_and_still_captured)
{
	static struct sink s;
	memset(&s, 0, sizeof s);
	struct tap_track_conf tc = {0};
	struct tap_track *t = tap_track_new(&tc, emit, &s);
	struct tap_observer o;
	struct tap_capture_sink cs = capture;
	cs.ctx = &s;
	tap_observer_init(&o, t, emit, &s, NULL, 0);
	o.capture = &cs;
	struct tap_conn *c = tap_conn_new(&o, 1, "127.0.0.1:1", "127.0.0.1:2", 1);
	static const uint8_t amqp10[] = "AMQP\x00\x01\x00\x00garbage-after";
	tap_conn_feed(c, true, amqp10, 4, 2);
	tap_conn_feed(c, true, amqp10 + 4, sizeof amqp10 - 5, 2);
	tap_conn_feed(c, true, amqp10, 3, 3); /* after the error: still passed on */
	tap_conn_end(c, "client_eof", 4);
	tap_track_free(t);
	tap_observer_deinit(&o);
	ck_assert_uint_eq(count(s.records, "\"type\":\"decode_error\""), 1);
	ck_assert_ptr_nonnull(strstr(s.records, "\"dir\":\"c2s\",\"offset\":5"));
	ck_assert_uint_eq(s.cap_len[1], sizeof amqp10 - 1 + 3);
	ck_assert_mem_eq(s.captured[1], amqp10, sizeof amqp10 - 1);
}
END_TEST

/* Every basic.publish whose method frame got through gets exactly one
 * record, even when the connection ends inside its content. */
START_TEST(cut_content_still_gets_its_record)
{
	static struct bytes cl;
	cl.n = 0;
	client_stream(&cl);
	size_t publish_ends[8], n_publish = 0;
	for (size_t off = 8; off < cl.n;) { /* walk the frames */
		uint32_t size = (uint32_t)cl.d[off + 3] << 24 | (uint32_t)cl.d[off + 4] << 16 |
				(uint32_t)cl.d[off + 5] << 8 | cl.d[off + 6];
		size_t end = off + 8 + size;
		if (cl.d[off] == 1 && cl.d[off + 7] == 0 && cl.d[off + 8] == 60 && cl.d[off + 9] == 0 &&
		    cl.d[off + 10] == 40)
			publish_ends[n_publish++] = end;
		off = end;
	}
	ck_assert_uint_eq(n_publish, 2);
	for (size_t cut = 0; cut <= cl.n; cut++) {
		static struct sink s;
		memset(&s, 0, sizeof s);
		struct tap_track_conf tc = {0};
		struct tap_track *t = tap_track_new(&tc, emit, &s);
		struct tap_observer o;
		tap_observer_init(&o, t, emit, &s, NULL, 0);
		struct tap_conn *c = tap_conn_new(&o, 1, "127.0.0.1:1", "127.0.0.1:2", 1);
		tap_conn_feed(c, true, cl.d, cut, 2);
		tap_conn_end(c, "client_eof", 3);
		tap_track_free(t);
		tap_observer_deinit(&o);
		size_t expect = (cut >= publish_ends[0]) + (cut >= publish_ends[1]);
		ck_assert_msg(count(s.records, "\"type\":\"publish\"") == expect, "cut at %zu: %zu records, want %zu", cut,
			      count(s.records, "\"type\":\"publish\""), expect);
		ck_assert_uint_eq(count(s.records, "\"route\":\"unknown\""), expect);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("conn");
	TCase *tc = tcase_create("observer");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, records_of_a_session);
	tcase_add_test(tc, capture_overwrites_only_the_password);
	tcase_add_test(tc, any_split_gives_the_same_result);
	tcase_add_test(tc, foreign_protocol_is_a_decode_error_and_still_captured);
	tcase_add_test(tc, cut_content_still_gets_its_record);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
