/* The per-connection observer: a hand-built client/broker exchange is fed whole, split at every offset and one
 * byte at a time; the records, and the capture copy with its password overwritten, must not depend on the split.
 * No byte of a password reaches the capture copy or a record, whatever the client sent: AMQP 0-8 headers, a
 * start-ok cut before its end, AMQPLAIN with two PASSWORD keys, a start-ok that does not decode, a foreign
 * protocol. A body longer than its header announced is a decode error; client properties are read by type. */
#include "amqptap/conn.h"
#include "amqptap/redact.h"
#include "amqptap/status.h"
#include "amqptap/track.h"

#include <check.h>
#include <malloc.h>

#include "tap_build.h"
#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PASSWORD "s3cr3t-pw"
#define PASSWORD2 "0ther-pw"

/* ---- streams ---- */

static void plain_start_ok(struct tap_bytes *c)
{
	tap_build_start_ok(c, NULL, "PLAIN", "\0guest\0" PASSWORD, 7 + strlen(PASSWORD));
}

/* tune-ok, connection.open "/", channel.open 1 */
static void open_session(struct tap_bytes *c)
{
	tap_build_tune_ok_open(c, "/");
	tap_build_method(c, 1, TAP_CHANNEL_OPEN, "", 1);
}

/* basic.publish on ch, a header announcing `announced` bytes with a message-id, and `body` in two frames. */
static void publish(struct tap_bytes *c, uint16_t ch, const char *rk, const char *id, uint64_t announced,
		    const char *body)
{
	struct tap_bytes a = {0};
	tap_build_u16(&a, 0);
	tap_build_shortstr(&a, "x.d");
	tap_build_shortstr(&a, rk);
	tap_build_u8(&a, 1); /* mandatory */
	tap_build_method(c, ch, TAP_BASIC_PUBLISH, a.d, a.n);
	a.n = 0;
	tap_build_u16(&a, 60);
	tap_build_u16(&a, 0);
	tap_build_u64(&a, announced);
	tap_build_u16(&a, 1u << 7); /* message-id */
	tap_build_shortstr(&a, id);
	tap_build_frame(c, 2, ch, a.d, a.n);
	size_t half = strlen(body) / 2;
	tap_build_frame(c, 3, ch, body, half);
	tap_build_frame(c, 3, ch, body + half, strlen(body) - half);
	tap_build_free(&a);
}

static void client_stream(struct tap_bytes *c)
{
	tap_build_raw(c, "AMQP\0\0\x09\x01", 8);
	plain_start_ok(c);
	open_session(c);
	tap_build_method(c, 1, TAP_CONFIRM_SELECT, "\0", 1);
	publish(c, 1, "match", "id-1", 12, "hello hello ");
	publish(c, 1, "nomatch", "id-2", 12, "hello hello ");
}

static void broker_stream(struct tap_bytes *s)
{
	struct tap_bytes a = {0};
	tap_build_shortstr(&a, "");
	tap_build_method(s, 0, TAP_CONNECTION_OPEN_OK, a.d, a.n);
	a.n = 0;
	tap_build_u16(&a, 312);
	tap_build_shortstr(&a, "NO_ROUTE");
	tap_build_shortstr(&a, "x.d");
	tap_build_shortstr(&a, "nomatch");
	tap_build_method(s, 1, TAP_BASIC_RETURN, a.d, a.n);
	a.n = 0;
	tap_build_u16(&a, 60);
	tap_build_u16(&a, 0);
	tap_build_u64(&a, 12);
	tap_build_u16(&a, 1u << 7);
	tap_build_shortstr(&a, "id-2");
	tap_build_frame(s, 2, 1, a.d, a.n);
	tap_build_frame(s, 3, 1, "hello hello ", 12);
	a.n = 0;
	tap_build_u64(&a, 2);
	tap_build_u8(&a, 1); /* multiple */
	tap_build_method(s, 1, TAP_BASIC_ACK, a.d, a.n);
	tap_build_free(&a);
}

/* ---- sinks ---- */

struct sink {
	char records[16384];
	size_t len;
	char frames[65536]; /* the frame trace, with 64 body bytes a body */
	size_t frames_len;
	uint8_t captured[TAP_DIR_COUNT][8192];
	size_t cap_len[TAP_DIR_COUNT];
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

/* Appends records to a caller's buffer of CHANNELS KiB (headers_tables_are_not_kept_whole). */
static void emit_big(void *ctx, const char *json, size_t len)
{
	char *out = ctx;
	size_t at = strlen(out);
	ck_assert_uint_lt(at + len + 2, 200 * 1024);
	memcpy(out + at, json, len);
	out[at + len] = '\n';
	out[at + len + 1] = '\0';
}

static void *cap_open(void *ctx, uint64_t conn, const char *client, const char *server, int64_t ts)
{
	struct sink *s = ctx;
	(void)conn;
	(void)client;
	(void)server;
	(void)ts;
	s->opened++;
	return s;
}

static void cap_data(void *ctx, void *sc, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts)
{
	struct sink *s = ctx;
	(void)sc;
	(void)ts;
	size_t have = s->cap_len[dir] < sizeof s->captured[dir] ? s->cap_len[dir] : sizeof s->captured[dir];
	size_t room = sizeof s->captured[dir] - have;
	memcpy(s->captured[dir] + have, data, len < room ? len : room);
	s->cap_len[dir] += len; /* past the buffer only counted (frame_max_is_the_brokers_at_most) */
}

static void cap_close(void *ctx, void *sc, const char *how, int64_t ts)
{
	struct sink *s = ctx;
	(void)sc;
	(void)how;
	(void)ts;
	s->closed++;
}

static const struct tap_capture_sink capture = {NULL, cap_open, cap_data, cap_close, NULL};

static void frames_line(void *ctx, const char *json, size_t len)
{
	struct sink *s = ctx;
	ck_assert_uint_lt(s->frames_len + len + 1, sizeof s->frames);
	memcpy(s->frames + s->frames_len, json, len);
	s->frames_len += len;
	s->frames[s->frames_len++] = '\n';
}

/* Feeds the client stream cut into `step`-byte pieces (0: one piece) and, when `cut` > 0, one extra cut at that
 * offset, and the broker stream (if any) after it or, broker_first, before it; then ends the connection. */
static void feed_streams(struct sink *s, const struct tap_bytes *cl, const struct tap_bytes *br, size_t step,
			 size_t cut, bool broker_first)
{
	memset(s, 0, sizeof *s);
	struct tap_track_conf tc = {0};
	struct tap_track *t = tap_track_new(&tc, emit, s);
	struct tap_observer o;
	struct tap_capture_sink cs = capture;
	cs.ctx = s;
	struct tap_frames_sink fs = {s, frames_line};
	tap_observer_init(&o, t, emit, s, &fs, 64);
	o.capture = &cs;
	struct tap_conn *c = tap_conn_new(&o, 7, "127.0.0.1:40000", "127.0.0.1:5672", 1000);
	ck_assert_ptr_nonnull(c);
	if (br && broker_first)
		tap_conn_feed(c, TAP_S2C, br->d, br->n, 1500);
	size_t off = 0;
	while (off < cl->n) {
		size_t n = step ? step : cl->n;
		if (cut > off && cut < off + n)
			n = cut - off;
		if (n > cl->n - off)
			n = cl->n - off;
		tap_conn_feed(c, TAP_C2S, cl->d + off, n, 2000);
		off += n;
	}
	if (br && !broker_first)
		tap_conn_feed(c, TAP_S2C, br->d, br->n, 3000);
	tap_conn_end(c, "client_eof", 4000);
	tap_track_shutdown(t, 5000);
	tap_track_free(t);
	tap_observer_deinit(&o);
	ck_assert_uint_eq(s->cap_len[TAP_C2S], cl->n);
	ck_assert_uint_eq(s->cap_len[TAP_S2C], br ? br->n : 0);
}

static void run_streams(struct sink *s, const struct tap_bytes *cl, const struct tap_bytes *br, size_t step, size_t cut)
{
	feed_streams(s, cl, br, step, cut, false);
}

static void run(struct sink *s, size_t step, size_t cut)
{
	struct tap_bytes cl = {0}, br = {0};
	client_stream(&cl);
	broker_stream(&br);
	run_streams(s, &cl, &br, step, cut);
	tap_build_free(&cl);
	tap_build_free(&br);
}

static size_t count(const char *hay, const char *needle)
{
	size_t n = 0;
	for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
		n++;
	return n;
}

/* No output holds a byte string of the password of 3 bytes or more. */
static void assert_no_password(const struct sink *s, const char *pw)
{
	for (size_t i = 0; i + 3 <= strlen(pw); i++) {
		ck_assert_msg(!memmem(s->captured[TAP_C2S], s->cap_len[TAP_C2S], pw + i, 3), "capture holds %.3s",
			      pw + i);
		ck_assert_msg(!memmem(s->records, s->len, pw + i, 3), "records hold %.3s", pw + i);
		ck_assert_msg(!memmem(s->frames, s->frames_len, pw + i, 3), "the frame trace holds %.3s", pw + i);
	}
	char hex[2 * 64 + 1]; /* as a body_hex or decode_error hex would show it */
	for (size_t i = 0; pw[i] && i < 64; i++)
		snprintf(hex + 2 * i, 3, "%02x", (unsigned char)pw[i]);
	ck_assert_msg(!memmem(s->records, s->len, hex, 6), "records hold %.6s", hex);
	ck_assert_msg(!memmem(s->frames, s->frames_len, hex, 6), "the frame trace holds %.6s", hex);
}

START_TEST(records_of_a_session)
{
	static struct sink s;
	run(&s, 0, 0);
	ck_assert_uint_eq(count(s.records, "\"type\":\"publish\""), 2);
	ck_assert_ptr_nonnull(strstr(s.records, "\"user\":\"guest\""));
	ck_assert_ptr_nonnull(strstr(s.records, "\"vhost\":\"/\""));
	ck_assert_ptr_nonnull(strstr(s.records, "\"seq\":1,\"published\":\""));
	ck_assert_ptr_nonnull(strstr(s.records, "Z\",\"exchange\":\"x.d\",\"routing_key\":\"match\""));
	ck_assert_ptr_nonnull(strstr(s.records, "\"route\":\"returned\",\"reply_code\":312"));
	ck_assert_ptr_nonnull(strstr(s.records, "\"order\":\"return_before_ack\""));
	ck_assert_ptr_nonnull(strstr(s.records, "\"route\":\"routed\""));
	ck_assert_ptr_null(strstr(s.records, "decode_error"));
	assert_no_password(&s, PASSWORD);
	ck_assert_int_eq(s.opened, 1);
	ck_assert_int_eq(s.closed, 1);
}
END_TEST

START_TEST(capture_overwrites_only_the_password)
{
	static struct sink s;
	struct tap_bytes cl = {0};
	client_stream(&cl);
	run(&s, 0, 0);
	const uint8_t *pw = memmem(cl.d, cl.n, PASSWORD, strlen(PASSWORD));
	ck_assert_ptr_nonnull(pw);
	size_t at = (size_t)(pw - cl.d);
	for (size_t i = 0; i < cl.n; i++) {
		if (i >= at && i < at + strlen(PASSWORD))
			ck_assert_uint_eq(s.captured[TAP_C2S][i], TAP_REDACT_FILL);
		else
			ck_assert_uint_eq(s.captured[TAP_C2S][i], cl.d[i]);
	}
	ck_assert_ptr_nonnull(memmem(s.captured[TAP_C2S], s.cap_len[TAP_C2S], "\0guest\0", 7));
	tap_build_free(&cl);
}
END_TEST

/* Records carry ts; the splits change no time, so the text must be equal. */
START_TEST(any_split_gives_the_same_result)
{
	static struct sink whole, part;
	run(&whole, 0, 0);
	struct tap_bytes cl = {0};
	client_stream(&cl);
	for (size_t cut = 1; cut < cl.n; cut++) {
		run(&part, 0, cut);
		ck_assert_str_eq(part.records, whole.records);
		ck_assert_mem_eq(part.captured[TAP_C2S], whole.captured[TAP_C2S], whole.cap_len[TAP_C2S]);
	}
	run(&part, 1, 0);
	ck_assert_str_eq(part.records, whole.records);
	ck_assert_mem_eq(part.captured[TAP_C2S], whole.captured[TAP_C2S], whole.cap_len[TAP_C2S]);
	tap_build_free(&cl);
}
END_TEST

/* AMQPLAIN with two PASSWORD keys: both are overwritten, LOGIN stays and is the user; at every split. */
START_TEST(amqplain_two_passwords)
{
	static const char *const pw[] = {PASSWORD, PASSWORD2};
	struct tap_bytes t = {0};
	tap_build_amqplain(&t, "guest", pw, 2);
	struct tap_bytes cl = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	tap_build_start_ok(&cl, NULL, "AMQPLAIN", t.d, t.n);
	open_session(&cl);
	struct tap_bytes br = {0};
	tap_build_method(&br, 0, TAP_CONNECTION_OPEN_OK, "\0", 1);
	static struct sink s;
	for (size_t cut = 0; cut < cl.n; cut++) {
		run_streams(&s, &cl, &br, 0, cut);
		assert_no_password(&s, PASSWORD);
		assert_no_password(&s, PASSWORD2);
		ck_assert_ptr_nonnull(memmem(s.captured[TAP_C2S], s.cap_len[TAP_C2S], "LOGIN\x53\0\0\0\x05guest", 15));
		ck_assert_ptr_nonnull(strstr(s.records, "\"user\":\"guest\""));
	}
	tap_build_free(&br);
	tap_build_free(&cl);
	tap_build_free(&t);
}
END_TEST

/* A connection that ends anywhere inside its start-ok, even just before the end octet, leaves no byte of the
 * password in the capture; the bytes are still there, overwritten. */
START_TEST(cut_start_ok_is_overwritten)
{
	struct tap_bytes cl = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	plain_start_ok(&cl);
	static struct sink s;
	for (size_t end = 9; end <= cl.n; end++) {
		struct tap_bytes part = {0};
		tap_build_raw(&part, cl.d, end);
		for (size_t step = 0; step < 3; step++) {
			run_streams(&s, &part, NULL, step, 0);
			assert_no_password(&s, PASSWORD);
			ck_assert_mem_eq(s.captured[TAP_C2S], "AMQP\0\0\x09\x01", 8);
		}
		tap_build_free(&part);
	}
	tap_build_free(&cl);
}
END_TEST

/* Before the login, frames of the client's own making: a content header and a body frame whose payloads are a
 * password, and a "method" that is one. None of it is shown: no frame line, no byte in a decode_error, the capture
 * copy overwritten from there on; at every split. (Before: the capture kept both passwords, the trace showed the
 * body's as body_hex, the decode_error 4 bytes of the method's.) */
START_TEST(client_frames_before_the_login_are_shown_nowhere)
{
	for (int k = 0; k < 3; k++) {
		struct tap_bytes cl = {0};
		tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
		if (k == 0)
			tap_build_frame(&cl, 2, 0, PASSWORD PASSWORD2, strlen(PASSWORD PASSWORD2));
		else if (k == 1)
			tap_build_frame(&cl, 3, 1, PASSWORD PASSWORD2, strlen(PASSWORD PASSWORD2));
		else
			tap_build_frame(&cl, 1, 0, PASSWORD PASSWORD2, strlen(PASSWORD PASSWORD2));
		plain_start_ok(&cl);
		static struct sink s;
		for (size_t cut = 0; cut < cl.n; cut++) {
			run_streams(&s, &cl, NULL, 0, cut);
			assert_no_password(&s, PASSWORD);
			assert_no_password(&s, PASSWORD2);
			ck_assert_ptr_nonnull(strstr(s.records, "\"type\":\"decode_error\""));
			ck_assert_ptr_null(memmem(s.frames, s.frames_len, "body", 4));
		}
		tap_build_free(&cl);
	}
}
END_TEST

/* The connection ends between a publish's method and its content header (a broker stopped mid-publish): the publish
 * has its record, with body_size null (it was 0, as for an empty message), and no warning judges the properties that
 * never came (it was once "transient" and "without a message id"). */
START_TEST(publish_cut_before_its_header_is_not_judged)
{
	struct tap_bytes cl = {0}, one = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	plain_start_ok(&cl);
	open_session(&cl);
	tap_build_method(&cl, 1, TAP_CONFIRM_SELECT, "\0", 1);
	publish(&one, 1, "rk", "id-1", 4, "abcd");
	const uint8_t *m = (const uint8_t *)one.d; /* the method frame: its header, its payload size, its end octet */
	tap_build_raw(&cl, one.d, 7 + ((size_t)m[3] << 24 | (size_t)m[4] << 16 | (size_t)m[5] << 8 | m[6]) + 1);
	struct sink s;
	run_streams(&s, &cl, NULL, 0, 0);
	ck_assert_uint_eq(count(s.records, "\"type\":\"publish\""), 1);
	ck_assert_msg(!strstr(s.records, "transient_in_confirm_mode"), "%s", s.records);
	ck_assert_msg(!strstr(s.records, "missing_message_id"), "%s", s.records);
	ck_assert_msg(strstr(s.records, "\"body_size\":null,"), "its size never came: %s", s.records);
	tap_build_free(&cl);
	tap_build_free(&one);
}
END_TEST

static void emit_none(void *ctx, const char *json, size_t len)
{
	(void)ctx;
	(void)json;
	(void)len;
}

/* A client that cycles through 20,000 channel numbers, 10 open at a time, each carrying a publish with long strings
 * (kept while the content is in progress) and closed (close, close-ok): the decoder keeps nothing of a closed
 * channel. Before: an entry for every number ever used (344 B each) and its store (up to 4 KiB, counted in the
 * observer's 64 MiB for contents in progress, so one such client made every other one's records lose their
 * details). */
START_TEST(closed_channels_are_forgotten)
{
	static char rk[256];
	memset(rk, 'k', 255);
	struct tap_track_conf tc = {0};
	struct tap_track *t = tap_track_new(&tc, emit_none, NULL);
	struct tap_observer o;
	tap_observer_init(&o, t, emit_none, NULL, NULL, 0);
	struct tap_conn *c = tap_conn_new(&o, 7, "127.0.0.1:40000", "127.0.0.1:5672", 1000);
	struct tap_bytes cl = {0}, br = {0}, a = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	plain_start_ok(&cl);
	open_session(&cl);
	tap_conn_feed(c, TAP_C2S, cl.d, cl.n, 2000);
	struct mallinfo2 before = mallinfo2();
	for (unsigned n = 2; n <= 20000; n++) {
		cl.n = br.n = 0;
		tap_build_method(&cl, (uint16_t)n, TAP_CHANNEL_OPEN, "\0", 1);
		publish(&cl, (uint16_t)n, rk, rk, 4, "body");
		if (n >= 11) { /* the one opened 9 before closes */
			a.n = 0;
			tap_build_u16(&a, 200);
			tap_build_shortstr(&a, "bye");
			tap_build_u32(&a, 0);
			tap_build_method(&cl, (uint16_t)(n - 9), TAP_CHANNEL_CLOSE, a.d, a.n);
			tap_build_method(&br, (uint16_t)(n - 9), TAP_CHANNEL_CLOSE_OK, NULL, 0);
		}
		tap_conn_feed(c, TAP_C2S, cl.d, cl.n, 3000);
		tap_conn_feed(c, TAP_S2C, br.d, br.n, 3000);
	}
	struct mallinfo2 after = mallinfo2();
	ck_assert_uint_lt(o.pending_mem, 11 * 4096);
	if (before.uordblks) /* 0 under ASan, whose allocator mallinfo2 does not see */
		ck_assert_uint_lt(after.uordblks, before.uordblks + 512 * 1024);
	ck_assert_uint_eq(o.pending_over, 0);
	tap_conn_end(c, "client_eof", 4000);
	tap_track_free(t);
	tap_observer_deinit(&o);
	tap_build_free(&a);
	tap_build_free(&br);
	tap_build_free(&cl);
}
END_TEST

/* A start-ok whose mechanism is no mechanism's name but a password: the mechanism is hidden like the response, in
 * the capture and the trace (before: both showed it). */
START_TEST(unknown_mechanism_is_hidden)
{
	static const char resp[] = "\0guest\0" PASSWORD2;
	struct tap_bytes cl = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	tap_build_start_ok(&cl, NULL, "PLAIN" PASSWORD, resp, sizeof resp - 1);
	static struct sink s;
	for (size_t cut = 0; cut < cl.n; cut++) {
		run_streams(&s, &cl, NULL, 0, cut);
		assert_no_password(&s, PASSWORD);
		assert_no_password(&s, PASSWORD2);
		static const char shown[] = "\"mechanism\":\"<redacted 14 bytes>\"";
		ck_assert_ptr_nonnull(memmem(s.frames, s.frames_len, shown, sizeof shown - 1));
	}
	tap_build_free(&cl);
}
END_TEST

/* A connection.update-secret after the login, on channel 0 and (wrongly) on channel 1, split at every offset:
 * the new secret never reaches the capture. */
START_TEST(update_secret_split_anywhere)
{
	struct tap_bytes a = {0};
	tap_build_longstr(&a, PASSWORD2, strlen(PASSWORD2));
	tap_build_shortstr(&a, "refresh");
	struct tap_bytes cl = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	plain_start_ok(&cl);
	open_session(&cl);
	for (int i = 0; i < 20; i++) /* publishes around it: frames of other classes split on other channels */
		publish(&cl, 1, "k", "id", 4, "abcd");
	tap_build_method(&cl, 0, TAP_CONNECTION_UPDATE_SECRET, a.d, a.n);
	publish(&cl, 1, "k", "id", 4, "abcd");
	tap_build_method(&cl, 1, TAP_CONNECTION_UPDATE_SECRET, a.d, a.n);
	static struct sink s;
	for (size_t cut = 8; cut < cl.n; cut++) {
		run_streams(&s, &cl, NULL, 0, cut);
		assert_no_password(&s, PASSWORD2);
	}
	for (size_t step = 1; step < 40; step++) {
		run_streams(&s, &cl, NULL, step, 0);
		assert_no_password(&s, PASSWORD2);
	}
	tap_build_free(&cl);
	tap_build_free(&a);
}
END_TEST

/* A start-ok whose arguments do not decode (the locale runs past the frame) is overwritten whole. */
START_TEST(undecodable_start_ok_is_overwritten)
{
	struct tap_bytes a = {0};
	tap_build_u32(&a, 0);
	tap_build_shortstr(&a, "PLAIN");
	tap_build_longstr(&a, "\0guest\0" PASSWORD, 7 + strlen(PASSWORD));
	tap_build_u8(&a, 200); /* locale length past the end */
	struct tap_bytes cl = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	tap_build_method(&cl, 0, TAP_CONNECTION_START_OK, a.d, a.n);
	open_session(&cl);
	static struct sink s;
	run_streams(&s, &cl, NULL, 0, 0);
	assert_no_password(&s, PASSWORD);
	ck_assert_ptr_null(memmem(s.captured[TAP_C2S], s.cap_len[TAP_C2S], "guest", 5));
	ck_assert_ptr_nonnull(strstr(s.records, "\"type\":\"connection\""));
	tap_build_free(&cl);
	tap_build_free(&a);
}
END_TEST

/* AMQP 1.0 (SASL PLAIN would follow): one decode_error whose hex shows no byte past the protocol header, and
 * every client byte from the error on overwritten in the capture, also those fed after it ("AMQP" had been
 * passed on before the error was known). */
START_TEST(foreign_protocol_is_a_decode_error_and_overwritten)
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
	static const uint8_t amqp10[] = "AMQP\x03\x01\x00\x00\x00\x00\x00\x1a\x02\x01\x00\x00" PASSWORD;
	tap_conn_feed(c, TAP_C2S, amqp10, 4, 2);
	tap_conn_feed(c, TAP_C2S, amqp10 + 4, sizeof amqp10 - 5, 2);
	tap_conn_feed(c, TAP_C2S, (const uint8_t *)PASSWORD, 3, 3);
	tap_conn_end(c, "client_eof", 4);
	tap_track_free(t);
	tap_observer_deinit(&o);
	ck_assert_uint_eq(count(s.records, "\"type\":\"decode_error\""), 1);
	ck_assert_ptr_nonnull(strstr(s.records, "\"dir\":\"c2s\",\"offset\":4"));
	ck_assert_ptr_nonnull(strstr(s.records, "\"hex\":\"03010000\""));
	ck_assert_uint_eq(s.cap_len[TAP_C2S], sizeof amqp10 - 1 + 3);
	ck_assert_mem_eq(s.captured[TAP_C2S], "AMQP", 4);
	for (size_t i = 4; i < s.cap_len[TAP_C2S]; i++)
		ck_assert_uint_eq(s.captured[TAP_C2S][i], TAP_REDACT_FILL);
}
END_TEST

/* RabbitMQ accepts the AMQP 0-8 headers "AMQP" 1 1 8 0 and 1 1 9 1 (rabbit_reader): the session is decoded with
 * 0-8's method numbers (connection.close 10/60, channel.open-ok without arguments): its publish gets its record,
 * the broker's close is a close (not connection.blocked), the password is overwritten. */
START_TEST(amqp_0_8_session)
{
	static const char *const headers[] = {"AMQP\x01\x01\x08\x00", "AMQP\x01\x01\x09\x01"};
	for (size_t h = 0; h < 2; h++) {
		struct tap_bytes cl = {0}, br = {0}, a = {0};
		tap_build_raw(&cl, headers[h], 8);
		plain_start_ok(&cl);
		open_session(&cl);
		publish(&cl, 1, "nomatch", "id-1", 4, "abcd");
		tap_build_shortstr(&a, "");
		tap_build_method(&br, 0, TAP_CONNECTION_OPEN_OK, a.d, a.n);
		tap_build_method(&br, 1, TAP_CHANNEL_OPEN_OK, NULL, 0);
		a.n = 0;
		tap_build_u16(&a, 320);
		tap_build_shortstr(&a, "CONNECTION_FORCED - broker forced connection closure");
		tap_build_u16(&a, 0);
		tap_build_u16(&a, 0);
		tap_build_method(&br, 0, TAP_METHOD_ID(10, 60), a.d, a.n);
		static struct sink s;
		run_streams(&s, &cl, &br, 0, 0);
		ck_assert_ptr_null(strstr(s.records, "decode_error"));
		ck_assert_ptr_null(strstr(s.records, "blocked"));
		ck_assert_uint_eq(count(s.records, "\"type\":\"publish\""), 1);
		ck_assert_ptr_nonnull(strstr(s.records, "\"routing_key\":\"nomatch\""));
		ck_assert_ptr_nonnull(strstr(s.records, "\"user\":\"guest\""));
		ck_assert_ptr_nonnull(strstr(s.records, "\"by\":\"broker\",\"code\":320"));
		assert_no_password(&s, PASSWORD);
		tap_build_free(&a);
		tap_build_free(&cl);
		tap_build_free(&br);
	}
}
END_TEST

/* The body frame that completes a content, with one of its slices. */
static void body_frames(struct tap_bytes *c, uint16_t ch, uint64_t announced, const char *const *frames, size_t n)
{
	struct tap_bytes a = {0};
	tap_build_u16(&a, 0);
	tap_build_shortstr(&a, "x.d");
	tap_build_shortstr(&a, "k");
	tap_build_u8(&a, 0);
	tap_build_method(c, ch, TAP_BASIC_PUBLISH, a.d, a.n);
	tap_build_header(c, ch, announced);
	for (size_t i = 0; i < n; i++)
		tap_build_frame(c, 3, ch, frames[i], strlen(frames[i]));
	tap_build_free(&a);
}

/* More body than the header announced is a decode error (PROTOCOL.md §4), in one frame that crosses the size
 * (RabbitMQ never completes that content) or in a frame after the content ended (RabbitMQ's 505): the publish
 * keeps its one record, nothing after it is decoded, and every client byte from the bad frame on is overwritten
 * in the capture. The announced size exactly, in any number of frames, is no error. */
START_TEST(body_longer_than_announced)
{
	static const char *const crossing[] = {"hello world"};
	static const char *const after_end[] = {"hello", " world"};
	static const char *const exact[] = {"hel", "", "lo"};
	const char *const *cases[] = {crossing, after_end, exact};
	const size_t n_frames[] = {1, 2, 3};
	for (size_t k = 0; k < 3; k++) {
		struct tap_bytes cl = {0};
		tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
		plain_start_ok(&cl);
		open_session(&cl);
		size_t before = cl.n;
		body_frames(&cl, 1, 5, cases[k], n_frames[k]);
		size_t bad = before + (8 + 4 + 2 + 4 + 2 + 1) + (8 + 14) + (k == 1 ? 8 + 5 : 0);
		size_t after = cl.n;
		publish(&cl, 2, "k2", "id-2", 2, "ok");
		static struct sink s;
		for (size_t step = 0; step < 2; step++) {
			run_streams(&s, &cl, NULL, step, 0);
			ck_assert_uint_eq(count(s.records, "\"type\":\"decode_error\""), k < 2);
			if (k == 2) {
				ck_assert_uint_eq(count(s.records, "\"type\":\"publish\""), 2);
				ck_assert_mem_eq(s.captured[TAP_C2S] + before, cl.d + before, cl.n - before);
				continue;
			}
			ck_assert_ptr_nonnull(strstr(s.records, "\"status\":\"TAP_E_BODY_TOO_LONG\""));
			char at[32];
			snprintf(at, sizeof at, "\"offset\":%zu,", bad);
			ck_assert_msg(strstr(s.records, at), "%s in %s", at, s.records);
			ck_assert_uint_eq(count(s.records, "\"type\":\"publish\""), 1);
			ck_assert_ptr_null(strstr(s.records, "\"routing_key\":\"k2\""));
			/* fed whole, from the bad frame on; fed byte by byte, what was passed on before the error was
			 * known (that frame's header and body bytes up to the announced size) stays */
			size_t from = step ? after : bad;
			ck_assert_mem_eq(s.captured[TAP_C2S] + before, cl.d + before, bad - before);
			for (size_t i = from; i < cl.n; i++)
				ck_assert_uint_eq(s.captured[TAP_C2S][i], TAP_REDACT_FILL);
		}
		tap_build_free(&cl);
	}
}
END_TEST

/* py-amqp sends product, product_version and capabilities, no version and no platform: the record must not show
 * the capabilities table as version or platform. Values of the wrong type are left out. */
START_TEST(client_properties_by_type)
{
	struct tap_bytes p = {0};
	tap_build_key(&p, "product", 'S');
	tap_build_longstr(&p, "py-amqp", 7);
	tap_build_key(&p, "product_version", 'S');
	tap_build_longstr(&p, "5.1.1", 5);
	tap_build_key(&p, "capabilities", 'F');
	tap_build_longstr(&p, "\x12" "connection.blocked" "t\x01", 21);
	struct tap_bytes cl = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	tap_build_start_ok(&cl, &p, "PLAIN", "\0guest\0" PASSWORD, 7 + strlen(PASSWORD));
	open_session(&cl);
	struct tap_bytes br = {0};
	tap_build_method(&br, 0, TAP_CONNECTION_OPEN_OK, "\0", 1);
	static struct sink s;
	run_streams(&s, &cl, &br, 0, 0);
	ck_assert_ptr_nonnull(strstr(s.records, "\"product\":\"py-amqp\",\"version\":\"5.1.1\",\"platform\":null"));
	ck_assert_ptr_nonnull(strstr(s.records, "\"connection_name\":null,\"capabilities\":{\"connection.blocked\":true}"));
	ck_assert_ptr_null(strstr(s.records, "\"version\":{"));
	/* wrong types: a numeric version, a table as platform; product_version is taken when version is no string */
	p.n = 0;
	tap_build_key(&p, "product", 'I');
	tap_build_u32(&p, 7);
	tap_build_key(&p, "version", 'I');
	tap_build_u32(&p, 1);
	tap_build_key(&p, "product_version", 'S');
	tap_build_longstr(&p, "2.0", 3);
	tap_build_key(&p, "platform", 'F');
	tap_build_longstr(&p, "\x01k\x56", 3);
	cl.n = 8;
	tap_build_start_ok(&cl, &p, "PLAIN", "\0guest\0" PASSWORD, 7 + strlen(PASSWORD));
	open_session(&cl);
	run_streams(&s, &cl, &br, 0, 0);
	ck_assert_ptr_nonnull(strstr(s.records, "\"product\":null,\"version\":\"2.0\",\"platform\":null"));
	tap_build_free(&p);
	tap_build_free(&cl);
	tap_build_free(&br);
}
END_TEST

/* Every basic.publish whose method frame got through gets exactly one
 * record, even when the connection ends inside its content. */
START_TEST(cut_content_still_gets_its_record)
{
	struct tap_bytes cl = {0};
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
		tap_conn_feed(c, TAP_C2S, cl.d, cut, 2);
		tap_conn_end(c, "client_eof", 3);
		tap_track_free(t);
		tap_observer_deinit(&o);
		size_t expect = (cut >= publish_ends[0]) + (cut >= publish_ends[1]);
		ck_assert_msg(count(s.records, "\"type\":\"publish\"") == expect, "cut at %zu: %zu records, want %zu", cut,
			      count(s.records, "\"type\":\"publish\""), expect);
		ck_assert_uint_eq(count(s.records, "\"route\":\"unknown\""), expect);
	}
	tap_build_free(&cl);
}
END_TEST

/* Thousands of channels, opened in a scrambled order, with publishes whose frames interleave across channels:
 * every publish gets one record on its own channel with its own message id (the channel lookup keeps each
 * channel's partial content apart). */
#define MANY_CHANNELS 3000

struct many_sink {
	unsigned seen[MANY_CHANNELS + 1][2];
	size_t publishes, wrong;
};

static void many_emit(void *ctx, const char *json, size_t len)
{
	struct many_sink *m = ctx;
	static const char publish_rec[] = "{\"type\":\"publish\",";
	if (len < sizeof publish_rec - 1 || strncmp(json, publish_rec, sizeof publish_rec - 1) != 0)
		return;
	m->publishes++;
	unsigned ch = 0, id_ch = 0, k = 0;
	const char *p = strstr(json, "\"channel\":"), *q = strstr(json, "\"message_id\":\"c");
	if (!p || !q || sscanf(p, "\"channel\":%u", &ch) != 1 || sscanf(q, "\"message_id\":\"c%u-%u", &id_ch, &k) != 2 ||
	    ch != id_ch || ch == 0 || ch > MANY_CHANNELS || k > 1) {
		m->wrong++;
		return;
	}
	m->seen[ch][k]++;
}

START_TEST(thousands_of_channels_keep_their_publishes_apart)
{
	static struct many_sink m;
	memset(&m, 0, sizeof m);
	struct tap_bytes cl = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	plain_start_ok(&cl);
	tap_build_tune_ok_open(&cl, "/");
	for (unsigned i = 0; i < MANY_CHANNELS; i++) /* every channel number once, scrambled */
		tap_build_method(&cl, (uint16_t)((i * 1777u) % MANY_CHANNELS + 1), TAP_CHANNEL_OPEN, "", 1);
	for (unsigned k = 0; k < 2; k++) {
		/* each step: a basic.publish on one channel, the header of the previous one, the body of the one before */
		char id[32];
		for (unsigned i = 0; i < MANY_CHANNELS + 2; i++) {
			struct tap_bytes a = {0};
			if (i < MANY_CHANNELS) {
				uint16_t ch = (uint16_t)((i * 2333u + k) % MANY_CHANNELS + 1);
				tap_build_u16(&a, 0);
				tap_build_shortstr(&a, "");
				tap_build_shortstr(&a, "q");
				tap_build_u8(&a, 0);
				tap_build_method(&cl, ch, TAP_BASIC_PUBLISH, a.d, a.n);
			}
			if (i >= 1 && i - 1 < MANY_CHANNELS) {
				uint16_t ch = (uint16_t)(((i - 1) * 2333u + k) % MANY_CHANNELS + 1);
				a.n = 0;
				tap_build_u16(&a, 60);
				tap_build_u16(&a, 0);
				tap_build_u64(&a, 4);
				tap_build_u16(&a, 1u << 7);
				snprintf(id, sizeof id, "c%u-%u", ch, k);
				tap_build_shortstr(&a, id);
				tap_build_frame(&cl, 2, ch, a.d, a.n);
			}
			if (i >= 2) {
				uint16_t ch = (uint16_t)(((i - 2) * 2333u + k) % MANY_CHANNELS + 1);
				tap_build_frame(&cl, 3, ch, "body", 4);
			}
			tap_build_free(&a);
		}
	}
	struct tap_track_conf tc = {0};
	struct tap_track *t = tap_track_new(&tc, many_emit, &m);
	struct tap_observer o;
	tap_observer_init(&o, t, many_emit, &m, NULL, 0);
	struct tap_conn *c = tap_conn_new(&o, 1, "127.0.0.1:1", "127.0.0.1:2", 1);
	ck_assert_ptr_nonnull(c);
	tap_conn_feed(c, TAP_C2S, cl.d, cl.n, 2);
	tap_conn_end(c, "client_eof", 3);
	tap_track_shutdown(t, 4);
	tap_track_free(t);
	tap_observer_deinit(&o);
	tap_build_free(&cl);
	ck_assert_uint_eq(m.wrong, 0);
	ck_assert_uint_eq(m.publishes, 2 * MANY_CHANNELS);
	for (unsigned ch = 1; ch <= MANY_CHANNELS; ch++)
		ck_assert_msg(m.seen[ch][0] == 1 && m.seen[ch][1] == 1, "channel %u: %u and %u records", ch, m.seen[ch][0],
			      m.seen[ch][1]);
}
END_TEST

/* A method frame that does not decode (a class this dialect does not have; a known method cut short) keeps its
 * frame boundaries: decoding goes on and a later publish gets its record. The first of each direction is a
 * decode_error record showing the frame header and the two ids, nothing of the arguments; later ones repeat
 * nothing. */
START_TEST(undecodable_method_is_reported_once_and_decoding_goes_on)
{
	struct tap_bytes cl = {0}, br = {0}, a = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	plain_start_ok(&cl);
	open_session(&cl);
	size_t unknown_at = cl.n;
	tap_build_method(&cl, 1, TAP_METHOD_ID(99, 7), PASSWORD, 2);
	tap_build_method(&cl, 1, TAP_BASIC_QOS, "\0\0", 2); /* prefetch-size cut short */
	publish(&cl, 1, "after", "id-1", 2, "ok");
	tap_build_shortstr(&a, "");
	tap_build_method(&br, 0, TAP_CONNECTION_OPEN_OK, a.d, a.n);
	size_t cut_at = br.n;
	tap_build_method(&br, 1, TAP_BASIC_RETURN, "\x01", 1); /* reply-code cut short */
	tap_build_method(&br, 1, TAP_BASIC_RETURN, "\x01", 1);
	static struct sink s;
	run_streams(&s, &cl, &br, 0, 0);
	ck_assert_uint_eq(count(s.records, "\"type\":\"decode_error\""), 2);
	char want[160];
	snprintf(want, sizeof want, "\"dir\":\"c2s\",\"offset\":%zu,\"reason\":\"unknown class or method\","
		 "\"status\":\"TAP_E_UNKNOWN_METHOD\",\"hex\":\"0100010000000600630007\"", unknown_at);
	ck_assert_msg(strstr(s.records, want), "no %s in %s", want, s.records);
	snprintf(want, sizeof want, "\"dir\":\"s2c\",\"offset\":%zu,", cut_at);
	ck_assert_msg(strstr(s.records, want), "no %s in %s", want, s.records);
	ck_assert_ptr_nonnull(strstr(s.records, "\"status\":\"TAP_E_TRUNCATED\",\"hex\":\"01000100000005003c0032\""));
	ck_assert_uint_eq(count(s.records, "\"type\":\"publish\""), 1);
	ck_assert_ptr_nonnull(strstr(s.records, "\"routing_key\":\"after\""));
	tap_build_free(&a);
	tap_build_free(&cl);
	tap_build_free(&br);
}
END_TEST

#if defined(__SANITIZE_ADDRESS__)
#define HEAP_COUNTED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HEAP_COUNTED 0
#endif
#endif
#ifndef HEAP_COUNTED
#define HEAP_COUNTED 1 /* glibc's own allocator: mallinfo2 counts the heap in use */
#endif

/* A header field of type S. */
static void header_field(struct tap_bytes *t, const char *name, const char *value, size_t len)
{
	tap_build_shortstr(t, name);
	tap_build_u8(t, 'S');
	tap_build_u32(t, (uint32_t)len);
	tap_build_raw(t, value, len);
}

/* A client sends a 100 KB headers table on each of 200 channels: the decoder keeps of it only what a record may
 * show (the --header-values keys, traceparent), so its memory does not grow with what the client sent (it kept
 * every table whole, and each channel kept the room after its publish). A kept value over 1 KiB is cut, and the
 * record says so. */
START_TEST(headers_tables_are_not_kept_whole)
{
	enum { CHANNELS = 200, BIG = 100 * 1024 };
	static char big[BIG];
	memset(big, 'b', sizeof big);
	struct tap_bytes cl = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	plain_start_ok(&cl);
	tap_build_tune_ok_open(&cl, "/");
	for (unsigned ch = 1; ch <= CHANNELS; ch++) {
		tap_build_method(&cl, (uint16_t)ch, TAP_CHANNEL_OPEN, "", 1);
		struct tap_bytes a = {0}, t = {0};
		tap_build_u16(&a, 0);
		tap_build_shortstr(&a, "x");
		tap_build_shortstr(&a, "k");
		tap_build_u8(&a, 0);
		tap_build_method(&cl, (uint16_t)ch, TAP_BASIC_PUBLISH, a.d, a.n);
		char task[16];
		int n = snprintf(task, sizeof task, "t-%u", ch);
		header_field(&t, "big", big, sizeof big);
		header_field(&t, "task", ch == 1 ? big : task, ch == 1 ? 5000 : (size_t)n);
		a.n = 0;
		tap_build_u16(&a, 60);
		tap_build_u16(&a, 0);
		tap_build_u64(&a, 0);
		tap_build_u16(&a, 1u << 13); /* headers */
		tap_build_u32(&a, (uint32_t)t.n);
		tap_build_raw(&a, t.d, t.n);
		tap_build_frame(&cl, 2, (uint16_t)ch, a.d, a.n);
		tap_build_free(&a);
		tap_build_free(&t);
	}
	static struct sink s;
	memset(&s, 0, sizeof s);
	static char records[CHANNELS * 1024];
	struct tap_track_conf tc = {.header_values = "task"};
	struct tap_track *t = tap_track_new(&tc, emit_big, records);
	records[0] = '\0';
	struct tap_observer o;
	tap_observer_init(&o, t, emit_big, records, NULL, 0);
	struct tap_conn *c = tap_conn_new(&o, 1, "127.0.0.1:1", "127.0.0.1:2", 1);
	size_t before = mallinfo2().uordblks;
	tap_conn_feed(c, TAP_C2S, cl.d, cl.n, 2);
	size_t grown = mallinfo2().uordblks - before;
	tap_conn_end(c, "client_eof", 3);
	tap_track_free(t);
	tap_observer_deinit(&o);
	tap_build_free(&cl);
	if (HEAP_COUNTED)
		ck_assert_msg(grown < 4u << 20, "the decoder and tracker grew by %zu bytes", grown);
	ck_assert_uint_eq(count(records, "\"type\":\"publish\""), CHANNELS);
	ck_assert_ptr_nonnull(strstr(records, "\"header_values\":{\"task\":\"t-200\"}"));
	ck_assert_ptr_nonnull(strstr(records, "\"headers\":[\"big\",\"task\"]"));
	ck_assert_uint_eq(count(records, "\"header_values_truncated\":true"), 1);
}
END_TEST

/* One connection's client: on each of `channels` channels a publish whose content header carries 64 header keys of
 * 250 bytes and whose body never comes. */
static void contents_left_open(struct tap_bytes *cl, unsigned channels)
{
	static char key[251];
	tap_build_raw(cl, "AMQP\0\0\x09\x01", 8);
	plain_start_ok(cl);
	tap_build_tune_ok_open(cl, "/");
	for (unsigned ch = 1; ch <= channels; ch++) {
		tap_build_method(cl, (uint16_t)ch, TAP_CHANNEL_OPEN, "", 1);
		struct tap_bytes a = {0}, t = {0};
		tap_build_u16(&a, 0);
		tap_build_shortstr(&a, "x");
		tap_build_shortstr(&a, "k");
		tap_build_u8(&a, 0);
		tap_build_method(cl, (uint16_t)ch, TAP_BASIC_PUBLISH, a.d, a.n);
		for (unsigned k = 0; k < 64; k++) {
			memset(key, 'k', 250);
			snprintf(key, sizeof key, "%02u", k);
			key[2] = 'k';
			header_field(&t, key, "v", 1);
		}
		a.n = 0;
		tap_build_u16(&a, 60);
		tap_build_u16(&a, 0);
		tap_build_u64(&a, 1); /* a body that never comes */
		tap_build_u16(&a, 1u << 13);
		tap_build_u32(&a, (uint32_t)t.n);
		tap_build_raw(&a, t.d, t.n);
		tap_build_frame(cl, 2, (uint16_t)ch, a.d, a.n);
		tap_build_free(&a);
		tap_build_free(&t);
	}
}

/* A client whose tune-ok asks for frames without limit (frame_max 0) from a broker whose tune said 131072: the
 * decoder holds it to the broker's limit (the broker refuses bigger frames), so a 1 MiB method frame is a
 * decode_error, not 1 MiB buffered (up to 16 MiB a direction were, for every such connection). The same when the
 * client sends its tune-ok, and the big frame, before the broker's tune came (it had set no limit then). */
START_TEST(frame_max_is_the_brokers_at_most)
{
	static char big[1 << 20];
	struct tap_bytes br = {0}, cl = {0}, a = {0};
	tap_build_u16(&a, 2047);
	tap_build_u32(&a, 131072);
	tap_build_u16(&a, 60);
	tap_build_method(&br, 0, TAP_CONNECTION_TUNE, a.d, a.n);
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	plain_start_ok(&cl);
	a.n = 0;
	tap_build_u16(&a, 2047);
	tap_build_u32(&a, 0);
	tap_build_u16(&a, 60);
	tap_build_method(&cl, 0, TAP_CONNECTION_TUNE_OK, a.d, a.n);
	tap_build_method(&cl, 1, TAP_CHANNEL_OPEN, big, sizeof big);
	static struct sink s;
	for (int broker_first = 1; broker_first >= 0; broker_first--) {
		feed_streams(&s, &cl, &br, 0, 0, broker_first);
		ck_assert_uint_eq(count(s.records, "\"type\":\"decode_error\""), 1);
		ck_assert_ptr_nonnull(strstr(s.records, "\"status\":\"TAP_E_FRAME_TOO_LARGE\""));
	}
	tap_build_free(&a);
	tap_build_free(&br);
	tap_build_free(&cl);
}
END_TEST

/* Counts the records contents_in_progress_are_bounded cares about. */
struct record_counts {
	size_t publishes, details_lost, headers_cut;
};

static void emit_counted(void *ctx, const char *json, size_t len)
{
	struct record_counts *n = ctx;
	char line[16384];
	ck_assert_uint_lt(len, sizeof line);
	memcpy(line, json, len);
	line[len] = '\0';
	if (!strstr(line, "\"type\":\"publish\""))
		return;
	n->publishes++;
	n->details_lost += strstr(line, "\"details_lost\":true") != NULL;
	n->headers_cut += strstr(line, "\"headers_truncated\":true") != NULL;
}

/* Contents in progress keep their strings, per channel: a client that leaves one open on each of 2,000 channels
 * with 64 long header keys costs a few KB a channel (what a record shows: 32 keys, 1 KiB of them), not the 32 KB
 * it did; and across connections the stores stop growing at the observer's pending_max: a content that finds it
 * full keeps no details (details_lost), yet every publish still gets its record. */
START_TEST(contents_in_progress_are_bounded)
{
	enum { CHANNELS = 2000 };
	struct tap_bytes cl = {0};
	contents_left_open(&cl, CHANNELS);
	struct record_counts n = {0};
	struct tap_track_conf tc = {0};
	struct tap_track *t = tap_track_new(&tc, emit_counted, &n);
	struct tap_observer o;
	tap_observer_init(&o, t, emit_counted, &n, NULL, 0);
	struct tap_conn *c = tap_conn_new(&o, 1, "127.0.0.1:1", "127.0.0.1:2", 1);
	tap_conn_feed(c, TAP_C2S, cl.d, cl.n, 2);
	ck_assert_msg(o.pending_mem <= CHANNELS * 4096u, "%zu bytes kept for %d contents", o.pending_mem, CHANNELS);
	ck_assert_uint_eq(o.pending_over, 0);
	o.pending_max = 1u << 20; /* a second connection finds the stores at their bound */
	struct tap_conn *c2 = tap_conn_new(&o, 2, "127.0.0.1:3", "127.0.0.1:2", 3);
	tap_conn_feed(c2, TAP_C2S, cl.d, cl.n, 4);
	ck_assert_uint_le(o.pending_mem, CHANNELS * 4096u + 8192);
	ck_assert_uint_eq(o.pending_over, CHANNELS);
	tap_conn_end(c, "client_eof", 5);
	tap_conn_end(c2, "client_eof", 6);
	ck_assert_uint_eq(o.pending_mem, 0);
	ck_assert_uint_eq(n.publishes, 2 * CHANNELS);
	ck_assert_uint_eq(n.details_lost, CHANNELS);
	ck_assert_uint_eq(n.headers_cut, CHANNELS);
	tap_track_free(t);
	tap_observer_deinit(&o);
	tap_build_free(&cl);
}
END_TEST

/* 2,047 channels, each with one publish done and then idle: a channel's store keeps its room for the next content
 * only while the observer's stores hold less than a sixteenth of pending_max. Before, each kept 256 B whatever
 * (300 such connections: 67 MB, the whole 64 MiB), and past pending_max later contents kept no details: here the
 * second half of the channels' publishes were details_lost. */
START_TEST(idle_channels_give_their_store_room_back)
{
	enum { CHANNELS = 2047 };
	struct tap_bytes cl = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	plain_start_ok(&cl);
	open_session(&cl);
	for (unsigned ch = 2; ch <= CHANNELS; ch++) {
		tap_build_method(&cl, (uint16_t)ch, TAP_CHANNEL_OPEN, "\0", 1);
		publish(&cl, (uint16_t)ch, "k", "id", 4, "body");
	}
	struct record_counts n = {0};
	struct tap_track_conf tc = {0};
	struct tap_track *t = tap_track_new(&tc, emit_counted, &n);
	struct tap_observer o;
	tap_observer_init(&o, t, emit_counted, &n, NULL, 0);
	o.pending_max = 256u << 10; /* 2,047 stores of 256 B would fill it twice */
	struct tap_conn *c = tap_conn_new(&o, 1, "127.0.0.1:1", "127.0.0.1:2", 1);
	tap_conn_feed(c, TAP_C2S, cl.d, cl.n, 2);
	ck_assert_msg(o.pending_mem <= o.pending_max / 16 + 512, "%zu bytes kept", o.pending_mem);
	ck_assert_uint_eq(o.pending_over, 0);
	tap_conn_end(c, "client_eof", 3);
	ck_assert_uint_eq(o.pending_mem, 0);
	ck_assert_uint_ge(n.publishes, CHANNELS - 1); /* channel 1 of open_session may carry none */
	ck_assert_uint_eq(n.details_lost, 0);
	tap_track_free(t);
	tap_observer_deinit(&o);
	tap_build_free(&cl);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("conn");
	TCase *tc = tcase_create("observer");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, publish_cut_before_its_header_is_not_judged);
	tcase_add_test(tc, records_of_a_session);
	tcase_add_test(tc, capture_overwrites_only_the_password);
	tcase_add_test(tc, any_split_gives_the_same_result);
	tcase_add_test(tc, amqplain_two_passwords);
	tcase_add_test(tc, cut_start_ok_is_overwritten);
	tcase_add_test(tc, client_frames_before_the_login_are_shown_nowhere);
	tcase_add_test(tc, unknown_mechanism_is_hidden);
	tcase_add_test(tc, closed_channels_are_forgotten);
	tcase_add_test(tc, undecodable_start_ok_is_overwritten);
	tcase_add_test(tc, update_secret_split_anywhere);
	tcase_add_test(tc, foreign_protocol_is_a_decode_error_and_overwritten);
	tcase_add_test(tc, amqp_0_8_session);
	tcase_add_test(tc, body_longer_than_announced);
	tcase_add_test(tc, client_properties_by_type);
	tcase_add_test(tc, cut_content_still_gets_its_record);
	tcase_add_test(tc, thousands_of_channels_keep_their_publishes_apart);
	tcase_add_test(tc, undecodable_method_is_reported_once_and_decoding_goes_on);
	tcase_add_test(tc, headers_tables_are_not_kept_whole);
	tcase_add_test(tc, contents_in_progress_are_bounded);
	tcase_add_test(tc, idle_channels_give_their_store_room_back);
	tcase_add_test(tc, frame_max_is_the_brokers_at_most);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
