/* Message identity across reconnects (src/DESIGN.md §4b, src/core/identity.c, src/core/track_ident.c): the fingerprint
 * is the same however the body is cut and ignores the timestamp; a repeat is classified by how the previous attempt
 * ended (resend, duplicate, unverified); an unknown publish not resent within --resend-window gets resend_missing;
 * and the identity table stays inside its share of the budget whatever a client sends. */
#include "amqptap/identity.h"

#include "track_fixture.h"

#include <check.h>

#include "tap_check.h"

#define WINDOW_US 1000000

static void setup_window(void)
{
	struct tap_track_conf conf = {.resend_window_us = WINDOW_US, .run = "0a1b2c3d4e5f", .tap_id = "t"};
	setup_conf(&conf);
}

static struct tap_publish pub_ident(const char *id)
{
	struct tap_publish p = pub_id("x", "k", false, id);
	p.identity_kind = TAP_IDENTITY_ID;
	p.identity = tap_identity_of_id((const uint8_t *)id, strlen(id));
	return p;
}

static size_t count_missing(void)
{
	return count_type("resend_missing");
}

/* The publish record (in record order) whose message_id is id, the k-th of them. */
static const char *pub_of(const char *id, size_t k)
{
	char want[80];
	snprintf(want, sizeof want, "\"message_id\":\"%s\"", id);
	for (size_t i = 0; i < n_recs; i++)
		if (is_type(recs[i], "publish") && strstr(recs[i], want) && k-- == 0)
			return recs[i];
	ck_abort_msg("no publish %s", id);
	return NULL;
}

START_TEST(classify_by_previous_end)
{
	ck_assert_int_eq(tap_identity_classify(UNKNOWN, CONFIRM_UNKNOWN), TAP_REPEAT_RESEND);
	ck_assert_int_eq(tap_identity_classify(UNPROVEN, NACK), TAP_REPEAT_RESEND);
	ck_assert_int_eq(tap_identity_classify(RETURNED, ACK), TAP_REPEAT_DUPLICATE); /* acked: the broker had it */
	ck_assert_int_eq(tap_identity_classify(RETURNED, NONE), TAP_REPEAT_RESEND);
	ck_assert_int_eq(tap_identity_classify(UNKNOWN, NONE), TAP_REPEAT_RESEND); /* tx rolled back */
	ck_assert_int_eq(tap_identity_classify(UNPROVEN, ACK), TAP_REPEAT_DUPLICATE);
	ck_assert_int_eq(tap_identity_classify(ROUTED, ACK), TAP_REPEAT_DUPLICATE);
	ck_assert_int_eq(tap_identity_classify(ROUTED, NONE), TAP_REPEAT_DUPLICATE); /* committed, mandatory */
	ck_assert_int_eq(tap_identity_classify(UNPROVEN, NONE), TAP_REPEAT_UNVERIFIED);
	ck_assert_str_eq(tap_identity_repeat_name(TAP_REPEAT_RESEND), "resend");
	ck_assert(tap_identity_wants_resend(CONFIRM_UNKNOWN, "broker"));
	ck_assert(tap_identity_wants_resend(CONFIRM_UNKNOWN, NULL));
	ck_assert(!tap_identity_wants_resend(CONFIRM_UNKNOWN, "evicted"));
	ck_assert(!tap_identity_wants_resend(NACK, "broker"));
	ck_assert(!tap_identity_wants_resend(ACK, NULL));
}
END_TEST

/* A content header payload: content_type, [timestamp], [type], and its decoding. */
struct hdr {
	uint8_t b[256];
	size_t len;
	struct tap_props props;
};

static void put8(struct hdr *h, uint8_t v)
{
	h->b[h->len++] = v;
}

static void put_str(struct hdr *h, const char *s)
{
	put8(h, (uint8_t)strlen(s));
	memcpy(h->b + h->len, s, strlen(s));
	h->len += strlen(s);
}

static void make_hdr(struct hdr *h, const char *ctype, bool has_ts, uint64_t ts, const char *type)
{
	uint16_t flags = TAP_PROP_CONTENT_TYPE | (has_ts ? TAP_PROP_TIMESTAMP : 0) | (type ? TAP_PROP_TYPE : 0);
	h->len = 0;
	put8(h, 0);
	put8(h, 60); /* basic */
	put8(h, 0);
	put8(h, 0);
	for (int i = 7; i >= 0; i--)
		put8(h, i == 0 ? 100 : 0); /* body size */
	put8(h, (uint8_t)(flags >> 8));
	put8(h, (uint8_t)flags);
	put_str(h, ctype);
	if (has_ts)
		for (int i = 7; i >= 0; i--)
			put8(h, (uint8_t)(ts >> (8 * i)));
	if (type)
		put_str(h, type);
	ck_assert_int_eq(tap_props_decode(h->b, h->len, &h->props), 0);
}

static uint64_t head_of(const char *x, const char *rk, const struct hdr *h)
{
	return tap_identity_head(S(x), S(rk), h->b, h->len, &h->props);
}

START_TEST(fingerprint_whatever_the_pieces)
{
	uint8_t body[100000];
	for (size_t i = 0; i < sizeof body; i++)
		body[i] = (uint8_t)(i * 7 + 3);
	struct hdr h;
	make_hdr(&h, "text/plain", true, 1700000000, "order");
	uint64_t head = head_of("x", "k", &h);
	uint64_t whole = tap_identity_body(head, body, sizeof body);
	struct tap_identity_stream *s = tap_identity_stream_new();
	ck_assert_ptr_nonnull(s);
	for (size_t step = 1; step < 5000; step = step * 3 + 1) {
		tap_identity_stream_reset(s, head);
		for (size_t at = 0; at < sizeof body; at += step)
			tap_identity_stream_update(s, body + at, at + step > sizeof body ? sizeof body - at : step);
		ck_assert_uint_eq(tap_identity_stream_digest(s), whole);
	}
	tap_identity_stream_free(s);
	/* a resend that stamps a new timestamp has the same fingerprint, with a property after it or none */
	make_hdr(&h, "text/plain", true, 1800000000, "order");
	ck_assert_uint_eq(head_of("x", "k", &h), head);
	make_hdr(&h, "text/plain", true, 1, NULL);
	uint64_t no_type = head_of("x", "k", &h);
	make_hdr(&h, "text/plain", true, 2, NULL);
	ck_assert_uint_eq(head_of("x", "k", &h), no_type);
	ck_assert_uint_ne(no_type, head);
	/* anything else tells them apart: a byte of the body, the key, a property, where a string ends */
	body[500] ^= 1;
	ck_assert_uint_ne(tap_identity_body(head, body, sizeof body), whole);
	make_hdr(&h, "text/plain", true, 1, "order");
	ck_assert_uint_eq(head_of("x", "k", &h), head);
	ck_assert_uint_ne(head_of("x", "k2", &h), head);
	ck_assert_uint_ne(head_of("xk", "", &h), head_of("x", "k", &h));
	make_hdr(&h, "text/html", true, 1, "order");
	ck_assert_uint_ne(head_of("x", "k", &h), head);
	make_hdr(&h, "text/plain", false, 0, "order");
	ck_assert_uint_ne(head_of("x", "k", &h), 0);
	/* and an id is never taken for a fingerprint of the same bytes */
	ck_assert_uint_ne(tap_identity_of_id((const uint8_t *)"a", 1), tap_identity_body(head, (const uint8_t *)"a", 1));
}
END_TEST

START_TEST(identity_text_round_trip)
{
	char text[TAP_IDENTITY_TEXT_LEN + 1];
	tap_identity_format(text, TAP_IDENTITY_FINGERPRINT, UINT64_C(0x0123456789abcdef));
	ck_assert_str_eq(text, "fp:0123456789abcdef");
	enum tap_identity_kind k;
	uint64_t h;
	ck_assert(tap_identity_parse(text, strlen(text), &k, &h));
	ck_assert_int_eq(k, TAP_IDENTITY_FINGERPRINT);
	ck_assert_uint_eq(h, UINT64_C(0x0123456789abcdef));
	ck_assert(tap_identity_parse("id:ffffffffffffffff", 19, &k, &h));
	ck_assert_int_eq(k, TAP_IDENTITY_ID);
	ck_assert(!tap_identity_parse("id:fffffffffffffffF", 19, &k, &h));
	ck_assert(!tap_identity_parse("xx:ffffffffffffffff", 19, &k, &h));
	ck_assert(!tap_identity_parse("id:fff", 6, &k, &h));
}
END_TEST

/* The connection dies with a publish unanswered; the client resends it on its next connection. */
START_TEST(resend_after_reconnect)
{
	confirm_channel(1);
	struct tap_publish p = pub_ident("m-1");
	tap_track_publish(c, 1, &p, T0 + 10);
	tap_track_conn_end(c, "broker_eof", T0 + 100);
	const char *first = pub_of("m-1", 0);
	assert_field(first, "confirm", "\"unknown\"");
	assert_field(first, "identity", "\"id:f9365e03c44b7918\"");
	ck_assert_ptr_null(get(first, "attempt"));
	c = tap_track_conn_new(t, 4, "127.0.0.1:40001", "127.0.0.1:5672", T0 + 200);
	confirm_channel(1);
	tap_track_publish(c, 1, &p, T0 + 510);
	tap_track_ack(c, 1, 1, false, T0 + 600);
	const char *again = pub_of("m-1", 1);
	assert_field(again, "attempt", "2");
	assert_field(again, "repeat", "\"resend\"");
	assert_field(again, "previous",
	             "{\"run\":\"0a1b2c3d4e5f\",\"conn\":3,\"channel\":1,\"seq\":1,\"confirm\":\"unknown\","
	             "\"route\":\"unknown\",\"ago_us\":500}");
	struct tap_track_stats s = stats();
	ck_assert_uint_eq(s.resends, 1);
	ck_assert_uint_eq(s.duplicates, 0);
	/* resent in time: no resend_missing, ever */
	tap_track_tick(t, T0 + 10 * WINDOW_US);
	ck_assert_uint_eq(count_missing(), 0);
	/* and once more after it was acked: a duplicate of an acked one */
	tap_track_publish(c, 1, &p, T0 + 10 * WINDOW_US + 1);
	tap_track_ack(c, 1, 2, false, T0 + 10 * WINDOW_US + 2);
	ck_assert_ptr_null(get(pub_of("m-1", 2), "attempt")); /* forgotten: the window was over */
	tap_track_publish(c, 1, &p, T0 + 10 * WINDOW_US + 3);
	tap_track_ack(c, 1, 3, false, T0 + 10 * WINDOW_US + 4);
	assert_field(pub_of("m-1", 3), "repeat", "\"duplicate\"");
	assert_field(pub_of("m-1", 3), "attempt", "2");
	ck_assert_uint_eq(stats().duplicates, 1);
}
END_TEST

START_TEST(plain_repeat_is_unverified)
{
	tap_track_channel_open(c, 1, T0);
	struct tap_publish p = pub_ident("p-1");
	tap_track_publish(c, 1, &p, T0);
	tap_track_publish(c, 1, &p, T0 + 1);
	tap_track_tick(t, T0 + 1 + TAP_TRACK_LATE_RETURN_US_DEFAULT);
	assert_field(pub_of("p-1", 1), "repeat", "\"unverified\"");
	ck_assert_uint_eq(stats().unverified, 1);
	ck_assert_uint_eq(count_missing(), 0);
}
END_TEST

/* Unknown and never resent: resend_missing once its window is over, naming it; a nack asks for none. */
START_TEST(resend_missing_after_the_window)
{
	confirm_channel(1);
	struct tap_publish p = pub_ident("lost-1"), q = pub_ident("nacked"), r = pub_ident("at-shutdown");
	tap_track_publish(c, 1, &p, T0 + 5);
	tap_track_publish(c, 1, &q, T0 + 6);
	tap_track_nack(c, 1, 2, false, T0 + 7);
	tap_track_conn_end(c, "client_reset", T0 + 50);
	tap_track_tick(t, T0 + 50 + WINDOW_US - 1);
	ck_assert_uint_eq(count_missing(), 0);
	int64_t next = tap_track_tick(t, T0 + 50 + WINDOW_US - 1);
	ck_assert_int_eq(next, T0 + 50 + WINDOW_US);
	tap_track_tick(t, T0 + 50 + WINDOW_US);
	ck_assert_uint_eq(count_missing(), 1);
	const char *m = nth("resend_missing", 0);
	ck_assert(valid_json_object(m));
	assert_field(m, "message_id", "\"lost-1\"");
	assert_field(m, "conn", "3");
	assert_field(m, "seq", "1");
	assert_field(m, "window_over", "true");
	assert_field(m, "published", "\"2026-11-29T10:15:02.000005Z\"");
	ck_assert_uint_eq(stats().resend_missing, 1);
	/* the process ends before the window of another: its resend_missing is written then, the window not over */
	c = tap_track_conn_new(t, 5, "127.0.0.1:40002", "127.0.0.1:5672", T0);
	confirm_channel(1);
	tap_track_publish(c, 1, &r, T0 + 2 * WINDOW_US);
	tap_track_shutdown(t, T0 + 2 * WINDOW_US + 1);
	ck_assert_uint_eq(count_missing(), 2);
	assert_field(nth("resend_missing", 1), "window_over", "false");
	assert_field(nth("resend_missing", 1), "message_id", "\"at-shutdown\"");
}
END_TEST

/* A resend of a resend: attempt 3, previous the second attempt. */
START_TEST(attempts_count_up)
{
	struct tap_publish p = pub_ident("m");
	for (int k = 0; k < 3; k++) {
		if (k)
			c = tap_track_conn_new(t, 10 + (uint64_t)k, "127.0.0.1:40001", "127.0.0.1:5672", T0);
		confirm_channel(1);
		tap_track_publish(c, 1, &p, T0 + 100 * k);
		tap_track_conn_end(c, "broker_eof", T0 + 100 * k + 50);
	}
	assert_field(pub_of("m", 2), "attempt", "3");
	ck_assert_ptr_nonnull(strstr(get(pub_of("m", 2), "previous"), "\"conn\":11,"));
	tap_track_tick(t, T0 + 200 + 50 + WINDOW_US);
	ck_assert_uint_eq(count_missing(), 1); /* the last attempt only */
	assert_field(nth("resend_missing", 0), "attempt", "3");
}
END_TEST

START_TEST(identity_off_in_records_without_one)
{
	confirm_channel(1);
	struct tap_publish p = pub_id("x", "k", false, "none");
	tap_track_publish(c, 1, &p, T0);
	tap_track_publish(c, 1, &p, T0);
	tap_track_conn_end(c, "broker_eof", T0 + 1);
	ck_assert_ptr_null(get(pub_of("none", 1), "identity"));
	ck_assert_ptr_null(get(pub_of("none", 1), "attempt"));
	tap_track_tick(t, T0 + 2 * WINDOW_US);
	ck_assert_uint_eq(count_missing(), 0);
}
END_TEST

static uint64_t emitted;
static void count_only(void *ctx, const char *json, size_t len)
{
	(void)ctx;
	(void)json;
	(void)len;
	emitted++;
}

/* A hostile client: a million distinct, huge ids, every one left unknown. The table stays in its share of the
 * budget (and so does everything), forgetting the oldest and counting them. */
START_TEST(hostile_ids_stay_bounded)
{
	struct tap_track_conf conf = {.max_memory = 8u << 20, .resend_window_us = 3600 * (int64_t)1000000};
	struct tap_track *h = tap_track_new(&conf, count_only, NULL);
	ck_assert_ptr_nonnull(h);
	static char id[16384]; /* longer than any record keeps (255) */
	memset(id, 'i', sizeof id);
	uint64_t peak = 0;
	const unsigned conns = 1000, per = 1000;
	for (unsigned k = 0; k < conns; k++) {
		struct tap_track_conn *hc = tap_track_conn_new(h, k + 1, "127.0.0.1:1", "127.0.0.1:2", T0);
		ck_assert_ptr_nonnull(hc);
		tap_track_channel_open(hc, 1, T0);
		tap_track_confirm_select(hc, 1, T0);
		for (unsigned i = 0; i < per; i++) {
			size_t len = (k * per + i) % 7 == 0 ? sizeof id : 300;
			snprintf(id, 24, "%020u", k * per + i);
			id[20] = 'i';
			struct tap_publish p = {.exchange = S("x"), .routing_key = S("k"), .body_size = 1,
			                        .message_id = {(const uint8_t *)id, len}, .has_message_id = true,
			                        .identity_kind = TAP_IDENTITY_ID};
			p.identity = tap_identity_of_id(p.message_id.ptr, len);
			tap_track_publish(hc, 1, &p, T0 + k);
		}
		tap_track_conn_end(hc, "broker_eof", T0 + k);
		struct tap_track_stats s;
		tap_track_get_stats(h, &s);
		if (s.ident_memory > peak)
			peak = s.ident_memory;
		ck_assert_uint_le(s.memory, conf.max_memory);
	}
	struct tap_track_stats s;
	tap_track_get_stats(h, &s);
	ck_assert_uint_le(peak, conf.max_memory / 8);
	ck_assert_uint_gt(s.ident_evicted_unresolved, (uint64_t)conns * per / 2);
	ck_assert_uint_eq(s.publish_records, (uint64_t)conns * per);
	tap_track_shutdown(h, T0 + conns);
	tap_track_get_stats(h, &s);
	ck_assert_uint_eq(s.resend_missing + s.ident_evicted_unresolved + s.ident_untracked, (uint64_t)conns * per);
	ck_assert_uint_le(s.ident_memory, conf.max_memory / 8); /* the pool stays, empty */
	tap_track_free(h);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("resend");
	TCase *pure = tcase_create("identity");
	tcase_add_test(pure, classify_by_previous_end);
	tcase_add_test(pure, fingerprint_whatever_the_pieces);
	tcase_add_test(pure, identity_text_round_trip);
	tcase_add_test(pure, hostile_ids_stay_bounded);
	tcase_set_timeout(pure, 300);
	suite_add_tcase(s, pure);
	TCase *tc = tcase_create("table");
	tcase_add_checked_fixture(tc, setup_window, teardown);
	tcase_add_test(tc, resend_after_reconnect);
	tcase_add_test(tc, plain_repeat_is_unverified);
	tcase_add_test(tc, resend_missing_after_the_window);
	tcase_add_test(tc, attempts_count_up);
	tcase_add_test(tc, identity_off_in_records_without_one);
	suite_add_tcase(s, tc);
	return track_suite_run(s);
}
