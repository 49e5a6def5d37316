/* The verdict tracker driven with synthetic AMQP events: verdicts are checked through the tracker's verdict hook,
 * the records it writes are captured, parsed and checked against DESIGN §3-§4, and a randomized run checks the
 * invariant (one `publish` record per publish, and the hook saw the same verdict as the record). */
#include "amqptap/track.h"

#include <check.h>

#include "fail_alloc.h"
#include "tap_build.h"
#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- captured records and a minimal JSON reader for their top-level members ---- */

/* check logs every passing ck_assert; hot helpers and loops only report failures */
#define REQUIRE(cond, ...)                                                                                             \
	do {                                                                                                           \
		if (!(cond))                                                                                           \
			ck_abort_msg(__VA_ARGS__);                                                                     \
	} while (0)

#define MAX_RECS 200000

static char **recs;
static size_t n_recs;

static void capture(void *ctx, const char *json, size_t len)
{
	(void)ctx;
	REQUIRE(n_recs < MAX_RECS, "too many records");
	REQUIRE(!memchr(json, '\n', len), "newline in a record");
	FAIL_ALLOC_PAUSE(); /* the test keeps every record, whatever the tracker is made to go without */
	char *r = malloc(len + 1);
	FAIL_ALLOC_RESUME();
	REQUIRE(r != NULL, "out of memory");
	memcpy(r, json, len);
	r[len] = '\0';
	recs[n_recs++] = r;
}

static void reset_recs(void)
{
	for (size_t i = 0; i < n_recs; i++)
		free(recs[i]);
	n_recs = 0;
}

static const char *skip_ws(const char *p)
{
	while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')
		p++;
	return p;
}

/* Returns the end of the JSON value at p, or NULL when it is malformed. */
static const char *skip_value(const char *p)
{
	p = skip_ws(p);
	if (*p == '"') {
		for (p++; *p && *p != '"'; p++) {
			if ((unsigned char)*p < 0x20)
				return NULL;
			if (*p == '\\' && !*++p)
				return NULL;
		}
		return *p == '"' ? p + 1 : NULL;
	}
	if (*p == '{' || *p == '[') {
		char close = *p == '{' ? '}' : ']';
		bool obj = *p == '{';
		p = skip_ws(p + 1);
		if (*p == close)
			return p + 1;
		for (;;) {
			if (obj) {
				p = skip_value(p);
				if (!p || *(p = skip_ws(p)) != ':')
					return NULL;
				p++;
			}
			p = skip_value(p);
			if (!p)
				return NULL;
			p = skip_ws(p);
			if (*p == ',') {
				p++;
				continue;
			}
			return *p == close ? p + 1 : NULL;
		}
	}
	if (!strncmp(p, "true", 4))
		return p + 4;
	if (!strncmp(p, "false", 5))
		return p + 5;
	if (!strncmp(p, "null", 4))
		return p + 4;
	const char *s = p;
	if (*p == '-')
		p++;
	while ((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E' || *p == '+' || *p == '-')
		p++;
	return p > s ? p : NULL;
}

static bool valid_json_object(const char *r)
{
	const char *e = skip_value(r);
	return r[0] == '{' && e && *skip_ws(e) == '\0';
}

/* The raw text of member `key` of the top-level object (strings keep their quotes), or NULL. Duplicate keys fail
 * the test. Result is in a rotating static buffer. */
static const char *get(const char *rec, const char *key)
{
	static char out[8][4096];
	static int k;
	const char *found = NULL;
	size_t found_len = 0;
	const char *p = skip_ws(rec);
	REQUIRE(*p == '{', "not an object: %s", rec);
	p = skip_ws(p + 1);
	while (*p && *p != '}') {
		const char *ks = p;
		const char *ke = skip_value(p);
		REQUIRE(ke, "bad key in %s", rec);
		p = skip_ws(ke);
		REQUIRE(*p == ':', "no colon in %s", rec);
		const char *vs = skip_ws(p + 1);
		const char *ve = skip_value(vs);
		REQUIRE(ve, "bad value in %s", rec);
		if ((size_t)(ke - ks) == strlen(key) + 2 && !strncmp(ks + 1, key, strlen(key))) {
			REQUIRE(!found, "duplicate key %s in %s", key, rec);
			found = vs;
			found_len = (size_t)(ve - vs);
		}
		p = skip_ws(ve);
		if (*p == ',')
			p = skip_ws(p + 1);
	}
	if (!found)
		return NULL;
	char *o = out[k++ & 7];
	if (found_len >= sizeof out[0])
		found_len = sizeof out[0] - 1;
	memcpy(o, found, found_len);
	o[found_len] = '\0';
	return o;
}

static void assert_field(const char *rec, const char *key, const char *want)
{
	const char *v = get(rec, key);
	ck_assert_msg(v != NULL, "no %s in %s", key, rec);
	ck_assert_msg(!strcmp(v, want), "%s is %s, want %s in %s", key, v, want, rec);
}

static bool is_type(const char *rec, const char *type)
{
	char q[64];
	snprintf(q, sizeof q, "\"%s\"", type);
	const char *v = get(rec, "type");
	return v && !strcmp(v, q);
}

static size_t count_type(const char *type)
{
	size_t n = 0;
	for (size_t i = 0; i < n_recs; i++)
		n += is_type(recs[i], type);
	return n;
}

/* The k-th (0-based) record of a type, or fails. */
static const char *nth(const char *type, size_t k)
{
	for (size_t i = 0; i < n_recs; i++)
		if (is_type(recs[i], type) && k-- == 0)
			return recs[i];
	ck_abort_msg("no record %s #%zu", type, k);
	return NULL;
}

/* Warning records of a rule (the publishes of these tests also trip the rules of missing ids and transient
 * messages, which tests/unit/test_track_warn.c checks). */
static size_t count_rule(const char *rule)
{
	char want[64];
	snprintf(want, sizeof want, "\"%s\"", rule);
	size_t n = 0;
	for (size_t i = 0; i < n_recs; i++)
		n += is_type(recs[i], "warning") && !strcmp(get(recs[i], "rule"), want);
	return n;
}

/* The k-th (0-based) warning of a rule, or fails. */
static const char *nth_rule(const char *rule, size_t k)
{
	char want[64];
	snprintf(want, sizeof want, "\"%s\"", rule);
	for (size_t i = 0; i < n_recs; i++)
		if (is_type(recs[i], "warning") && !strcmp(get(recs[i], "rule"), want) && k-- == 0)
			return recs[i];
	ck_abort_msg("no warning %s #%zu", rule, k);
	return NULL;
}

/* The publish record with this seq, or fails. */
static const char *pub_seq(uint64_t seq)
{
	char want[32];
	snprintf(want, sizeof want, "%llu", (unsigned long long)seq);
	const char *hit = NULL;
	for (size_t i = 0; i < n_recs; i++) {
		if (!is_type(recs[i], "publish"))
			continue;
		const char *s = get(recs[i], "seq");
		if (s && !strcmp(s, want)) {
			ck_assert_msg(!hit, "two records for seq %s", want);
			hit = recs[i];
		}
	}
	ck_assert_msg(hit != NULL, "no record for seq %s", want);
	return hit;
}

/* ---- verdicts seen by the hook, copied (their slices live only during the call) ---- */

struct seen {
	struct tap_track_verdict v;
	char exchange[64], routing_key[64], message_id[64], reason_by[32], reason_text[128], reply_text[64];
};

static struct seen *seen;
static size_t n_seen;

static void copy_slice(char *dst, size_t cap, struct tap_slice s)
{
	size_t n = s.len < cap - 1 ? s.len : cap - 1;
	if (n)
		memcpy(dst, s.ptr, n);
	dst[n] = '\0';
}

static void on_verdict(void *ctx, const struct tap_track_verdict *v)
{
	(void)ctx;
	REQUIRE(n_seen < MAX_RECS, "too many verdicts");
	struct seen *s = &seen[n_seen++];
	s->v = *v;
	copy_slice(s->exchange, sizeof s->exchange, v->exchange);
	copy_slice(s->routing_key, sizeof s->routing_key, v->routing_key);
	copy_slice(s->message_id, sizeof s->message_id, v->message_id);
	copy_slice(s->reason_text, sizeof s->reason_text, v->reason_text);
	copy_slice(s->reply_text, sizeof s->reply_text, v->reply_text);
	snprintf(s->reason_by, sizeof s->reason_by, "%s", v->reason_by ? v->reason_by : "");
}

/* The k-th verdict (0-based), or fails. */
static const struct seen *verdict(size_t k)
{
	ck_assert_msg(k < n_seen, "no verdict #%zu (%zu seen)", k, n_seen);
	return &seen[k];
}

/* The verdict of channel ch's publish with this confirm seq, or fails. */
static const struct seen *verdict_seq(uint16_t ch, uint64_t seq)
{
	const struct seen *hit = NULL;
	for (size_t i = 0; i < n_seen; i++) {
		if (!seen[i].v.has_seq || seen[i].v.seq != seq || seen[i].v.channel != ch)
			continue;
		ck_assert_msg(!hit, "two verdicts for channel %u seq %llu", ch, (unsigned long long)seq);
		hit = &seen[i];
	}
	ck_assert_msg(hit != NULL, "no verdict for channel %u seq %llu", ch, (unsigned long long)seq);
	return hit;
}

static void assert_verdict(const struct seen *s, enum tap_track_route route, enum tap_track_confirm confirm,
                           enum tap_track_order order)
{
	ck_assert_int_eq(s->v.route, route);
	ck_assert_int_eq(s->v.confirm, confirm);
	ck_assert_int_eq(s->v.order, order);
}

static void assert_reason(const struct seen *s, const char *by, int code, const char *text)
{
	ck_assert_str_eq(s->reason_by, by);
	ck_assert_int_eq(s->v.has_reason_code, code >= 0);
	if (code >= 0)
		ck_assert_int_eq(s->v.reason_code, code);
	ck_assert_str_eq(s->reason_text, text);
}

#define ROUTED TAP_TRACK_ROUTE_ROUTED
#define RETURNED TAP_TRACK_ROUTE_RETURNED
#define UNPROVEN TAP_TRACK_ROUTE_UNPROVEN
#define UNKNOWN TAP_TRACK_ROUTE_UNKNOWN
#define ACK TAP_TRACK_CONFIRM_ACK
#define NACK TAP_TRACK_CONFIRM_NACK
#define NONE TAP_TRACK_CONFIRM_NONE
#define CONFIRM_UNKNOWN TAP_TRACK_CONFIRM_UNKNOWN
#define NO_ORDER TAP_TRACK_ORDER_NONE
#define RETURN_FIRST TAP_TRACK_ORDER_RETURN_BEFORE_ACK
#define ACK_FIRST TAP_TRACK_ORDER_ACK_BEFORE_RETURN

/* ---- fixture ---- */

#define T0 1795947302000000LL /* 2026-11-29T10:15:02Z */

static struct tap_track *t;
static struct tap_track_conn *c;

static struct tap_slice S(const char *s) {
	return (struct tap_slice){(const uint8_t *)s, strlen(s)};
}

static void
setup_conf(const struct tap_track_conf *conf)
{
	if (!recs)
		recs = calloc(MAX_RECS, sizeof *recs);
	if (!seen)
		seen = calloc(MAX_RECS, sizeof *seen);
	reset_recs();
	n_seen = 0;
	t = tap_track_new(conf, capture, NULL);
	ck_assert_ptr_nonnull(t);
	tap_track_set_verdict_hook(t, on_verdict, NULL);
	c = tap_track_conn_new(t, 3, "127.0.0.1:51234", "127.0.0.1:5672", T0);
	tap_track_conn_user(c, S("guest"));
	tap_track_conn_client_props(c, S("pika"), S("1.2.0"), S("Python 3.11"));
	tap_track_conn_tune(c, 2047, 131072, 60);
	tap_track_conn_open(c, S("/"), T0);
}

static void setup(void)
{
	struct tap_track_conf conf = {0};
	setup_conf(&conf);
}

static void teardown(void)
{
#ifdef FAIL_ALLOC_WORKS
	fail_alloc = fail_realloc = false; /* a test that failed half-way: not into the next (unforked) */
#endif
	tap_track_free(t);
	t = NULL;
	c = NULL;
	reset_recs();
}

static struct tap_publish pub(const char *x, const char *rk, bool mandatory)
{
	return (struct tap_publish){.exchange = S(x), .routing_key = S(rk), .mandatory = mandatory, .body_size = 12};
}

static struct tap_publish pub_id(const char *x, const char *rk, bool mandatory, const char *id)
{
	struct tap_publish p = pub(x, rk, mandatory);
	p.message_id = S(id);
	p.has_message_id = true;
	return p;
}

static struct tap_return ret(const char *x, const char *rk)
{
	return (struct tap_return){
	    .reply_code = 312, .reply_text = S("NO_ROUTE"), .exchange = S(x), .routing_key = S(rk), .body_size = 12};
}

static void confirm_channel(uint16_t ch)
{
	tap_track_channel_open(c, ch, T0);
	tap_track_confirm_select(c, ch, T0);
}

static struct tap_track_stats stats(void)
{
	struct tap_track_stats s;
	tap_track_get_stats(t, &s);
	return s;
}

/* ---- tests ---- */

START_TEST(connection_open_record)
{
	ck_assert_uint_eq(n_recs, 1);
	const char *r = recs[0];
	ck_assert(valid_json_object(r));
	assert_field(r, "type", "\"connection\"");
	assert_field(r, "event", "\"open\"");
	assert_field(r, "ts", "\"2026-11-29T10:15:02.000000Z\"");
	assert_field(r, "conn", "3");
	assert_field(r, "client", "\"127.0.0.1:51234\"");
	assert_field(r, "user", "\"guest\"");
	assert_field(r, "vhost", "\"/\"");
	assert_field(r, "product", "\"pika\"");
	assert_field(r, "version", "\"1.2.0\"");
	assert_field(r, "platform", "\"Python 3.11\"");
	assert_field(r, "frame_max", "131072");
	assert_field(r, "heartbeat", "60");
	assert_field(r, "channel_max", "2047");
	tap_track_conn_open(c, S("/"), T0); /* once */
	ck_assert_uint_eq(n_recs, 1);
	/* no publish yet: the peak still counts the connection's memory, in the stats and in the summary */
	struct tap_track_stats st = stats();
	ck_assert_uint_gt(st.memory, 0);
	ck_assert_uint_ge(st.memory_peak, st.memory);
	struct tap_buf b;
	tap_buf_init(&b);
	tap_track_summary(t, &b);
	tap_buf_putc(&b, '\0');
	unsigned long long mem = 0, peak = 0;
	const char *line = strstr(b.data, "tracking memory ");
	ck_assert_ptr_nonnull(line);
	ck_assert_int_eq(sscanf(line, "tracking memory %llu bytes (peak %llu", &mem, &peak), 2);
	ck_assert_uint_ge(peak, mem);
	tap_buf_deinit(&b);
}
END_TEST

START_TEST(routed_after_late_return_window)
{
	confirm_channel(1);
	struct tap_publish p = pub("x.d", "match", true);
	p.has_message_id = true;
	p.message_id = S("id-42");
	p.has_delivery_mode = true;
	p.delivery_mode = 2;
	tap_track_publish(c, 1, &p, T0 + 100);
	tap_track_ack(c, 1, 1, false, T0 + 630);
	ck_assert_uint_eq(count_type("publish"), 0); /* held for a late Return */
	ck_assert_uint_eq(stats().held, 1);
	int64_t next = tap_track_tick(t, T0 + 700);
	ck_assert_int_eq(next, T0 + 630 + TAP_TRACK_LATE_RETURN_US_DEFAULT);
	ck_assert_uint_eq(count_type("publish"), 0);
	ck_assert_int_eq(tap_track_tick(t, next), INT64_MAX);
	const char *r = nth("publish", 0);
	ck_assert(valid_json_object(r));
	assert_field(r, "conn", "3");
	assert_field(r, "client", "\"127.0.0.1:51234\"");
	assert_field(r, "vhost", "\"/\"");
	assert_field(r, "user", "\"guest\"");
	assert_field(r, "channel", "1");
	assert_field(r, "seq", "1");
	assert_field(r, "exchange", "\"x.d\"");
	assert_field(r, "routing_key", "\"match\"");
	assert_field(r, "mandatory", "true");
	assert_field(r, "message_id", "\"id-42\"");
	assert_field(r, "correlation_id", "null");
	assert_field(r, "delivery_mode", "2");
	assert_field(r, "body_size", "12");
	assert_field(r, "route", "\"routed\"");
	assert_field(r, "confirm", "\"ack\"");
	assert_field(r, "confirm_us", "530");
	assert_field(r, "multiple", "false");
	assert_field(r, "order", "null");
	ck_assert_ptr_null(get(r, "reason"));
	ck_assert_ptr_null(get(r, "tx"));
	ck_assert_ptr_null(get(r, "reply_code"));
	ck_assert_ptr_null(get(r, "content_type"));
	ck_assert_uint_eq(n_seen, 1);
	const struct seen *v = verdict(0);
	assert_verdict(v, ROUTED, ACK, NO_ORDER);
	ck_assert_uint_eq(v->v.conn, 3);
	ck_assert_uint_eq(v->v.channel, 1);
	ck_assert(v->v.has_seq);
	ck_assert_uint_eq(v->v.seq, 1);
	ck_assert_str_eq(v->exchange, "x.d");
	ck_assert_str_eq(v->routing_key, "match");
	ck_assert_str_eq(v->message_id, "id-42");
	ck_assert(v->v.mandatory);
	ck_assert(!v->v.multiple);
	ck_assert_int_eq(v->v.confirm_us, 530);
	ck_assert_int_eq(v->v.return_us, -1);
	ck_assert_int_eq(v->v.t_pub, T0 + 100);
	ck_assert_int_eq(v->v.t_record, T0 + 630 + TAP_TRACK_LATE_RETURN_US_DEFAULT);
	ck_assert_ptr_null(v->v.reason_by);
	struct tap_track_stats s = stats();
	ck_assert_uint_eq(s.routed, 1);
	ck_assert_uint_eq(s.acked, 1);
	ck_assert_uint_eq(s.outstanding, 0);
	ck_assert_uint_eq(s.held, 0);
}
END_TEST

START_TEST(returned_before_ack)
{
	confirm_channel(1);
	struct tap_publish p = pub("x.d", "nomatch", true);
	tap_track_publish(c, 1, &p, T0);
	struct tap_return r = ret("x.d", "nomatch");
	tap_track_return(c, 1, &r, T0 + 410);
	ck_assert_uint_eq(n_seen, 0);
	tap_track_ack(c, 1, 1, false, T0 + 530);
	const struct seen *v = verdict(0);
	assert_verdict(v, RETURNED, ACK, RETURN_FIRST);
	ck_assert_uint_eq(v->v.reply_code, 312);
	ck_assert_str_eq(v->reply_text, "NO_ROUTE");
	ck_assert_int_eq(v->v.return_us, 410);
	ck_assert_int_eq(v->v.confirm_us, 530);
	ck_assert_int_eq(v->v.t_record, T0 + 530);
	const char *rec = nth("publish", 0);
	assert_field(rec, "route", "\"returned\"");
	assert_field(rec, "reply_code", "312");
	assert_field(rec, "reply_text", "\"NO_ROUTE\"");
	assert_field(rec, "return_us", "410");
	assert_field(rec, "order", "\"return_before_ack\"");
	assert_field(rec, "ts", "\"2026-11-29T10:15:02.000530Z\"");
	ck_assert_uint_eq(count_rule("confirm_without_mandatory") + count_rule("ack_before_return"), 0);
	ck_assert_uint_eq(stats().returned, 1);
}
END_TEST

START_TEST(nacked)
{
	confirm_channel(1);
	struct tap_publish p = pub("", "q.full", true);
	tap_track_publish(c, 1, &p, T0);
	tap_track_nack(c, 1, 1, false, T0 + 50);
	assert_verdict(verdict(0), UNPROVEN, NACK, NO_ORDER);
	ck_assert_str_eq(verdict(0)->exchange, "");
	ck_assert_int_eq(verdict(0)->v.confirm_us, 50);
	ck_assert_uint_eq(stats().nacked, 1);
}
END_TEST

START_TEST(confirm_without_mandatory_warns_once)
{
	confirm_channel(1);
	struct tap_publish p = pub("x.d", "nomatch", false);
	for (int i = 0; i < 3; i++)
		tap_track_publish(c, 1, &p, T0);
	for (int i = 1; i <= 3; i++)
		tap_track_ack(c, 1, (uint64_t)i, false, T0 + 10);
	ck_assert_uint_eq(n_seen, 3);
	for (uint64_t i = 1; i <= 3; i++)
		assert_verdict(verdict_seq(1, i), UNPROVEN, ACK, NO_ORDER);
	ck_assert_uint_eq(count_rule("confirm_without_mandatory"), 1);
	const char *w = nth_rule("confirm_without_mandatory", 0);
	assert_field(w, "channel", "1");
	assert_field(w, "conn", "3");
}
END_TEST

START_TEST(multiple_ack_covers_range)
{
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", false);
	for (int i = 0; i < 10; i++)
		tap_track_publish(c, 1, &p, T0 + i);
	tap_track_ack(c, 1, 7, true, T0 + 100);
	ck_assert_uint_eq(n_seen, 7);
	for (uint64_t s = 1; s <= 7; s++) {
		ck_assert(verdict_seq(1, s)->v.multiple);
		ck_assert_int_eq(verdict_seq(1, s)->v.confirm_us, (int64_t)(100 - (s - 1)));
	}
	assert_field(pub_seq(7), "multiple", "true");
	assert_field(pub_seq(7), "confirm_us", "94");
	tap_track_ack(c, 1, 9, false, T0 + 200);
	ck_assert(!verdict_seq(1, 9)->v.multiple);
	tap_track_ack(c, 1, 10, true, T0 + 300);
	ck_assert_uint_eq(n_seen, 10);
	ck_assert(verdict_seq(1, 8)->v.multiple);
	ck_assert_uint_eq(stats().stray_confirms, 0);
	tap_track_ack(c, 1, 10, true, T0 + 300);
	ck_assert_uint_eq(stats().stray_confirms, 1);
}
END_TEST

START_TEST(out_of_order_acks)
{
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", false);
	for (int i = 0; i < 5; i++)
		tap_track_publish(c, 1, &p, T0);
	const uint64_t order[] = {3, 1, 5, 2, 4};
	for (int i = 0; i < 5; i++) {
		tap_track_ack(c, 1, order[i], false, T0 + 10 * (i + 1));
		ck_assert_uint_eq(n_seen, (size_t)i + 1);
		ck_assert_uint_eq(verdict((size_t)i)->v.seq, order[i]);
	}
	ck_assert_int_eq(verdict_seq(1, 3)->v.confirm_us, 10);
	ck_assert_int_eq(verdict_seq(1, 4)->v.confirm_us, 50);
	tap_track_ack(c, 1, 3, false, T0 + 99);  /* already answered */
	tap_track_ack(c, 1, 77, false, T0 + 99); /* never published */
	tap_track_ack(c, 1, 0, false, T0 + 99);
	ck_assert_uint_eq(n_seen, 5);
	ck_assert_uint_eq(stats().stray_confirms, 3);
	ck_assert_uint_eq(stats().outstanding, 0);
}
END_TEST

START_TEST(multiple_ack_spanning_nack)
{
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", false);
	for (int i = 0; i < 5; i++)
		tap_track_publish(c, 1, &p, T0);
	tap_track_nack(c, 1, 3, false, T0 + 5);
	tap_track_ack(c, 1, 5, true, T0 + 9);
	ck_assert_uint_eq(n_seen, 5);
	assert_verdict(verdict_seq(1, 3), UNPROVEN, NACK, NO_ORDER);
	ck_assert(!verdict_seq(1, 3)->v.multiple);
	for (uint64_t s = 1; s <= 5; s++)
		if (s != 3)
			assert_verdict(verdict_seq(1, s), UNPROVEN, ACK, NO_ORDER);
	ck_assert_uint_eq(stats().acked, 4);
	ck_assert_uint_eq(stats().nacked, 1);
}
END_TEST

START_TEST(multiple_tag_zero_means_all)
{
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", false);
	for (int i = 0; i < 4; i++)
		tap_track_publish(c, 1, &p, T0);
	tap_track_ack(c, 1, 0, true, T0 + 5);
	ck_assert_uint_eq(n_seen, 4);
	for (uint64_t s = 1; s <= 4; s++)
		ck_assert(verdict_seq(1, s)->v.multiple);
}
END_TEST

START_TEST(ack_before_return)
{
	confirm_channel(1);
	struct tap_publish p = pub_id("x.d", "nomatch", true, "a");
	tap_track_publish(c, 1, &p, T0);
	p.message_id = S("b");
	tap_track_publish(c, 1, &p, T0);
	tap_track_ack(c, 1, 2, true, T0 + 100);
	struct tap_return r = ret("x.d", "nomatch");
	r.has_message_id = true;
	r.message_id = S("a");
	tap_track_return(c, 1, &r, T0 + 120);
	r.message_id = S("b");
	tap_track_return(c, 1, &r, T0 + 130);
	ck_assert_uint_eq(n_seen, 2);
	const struct seen *a = verdict_seq(1, 1);
	assert_verdict(a, RETURNED, ACK, ACK_FIRST);
	ck_assert_int_eq(a->v.confirm_us, 100);
	ck_assert_int_eq(a->v.return_us, 120);
	ck_assert(a->v.multiple);
	assert_field(pub_seq(1), "order", "\"ack_before_return\"");
	assert_verdict(verdict_seq(1, 2), RETURNED, ACK, ACK_FIRST);
	ck_assert_uint_eq(count_rule("ack_before_return"), 1);
	assert_field(nth_rule("ack_before_return", 0), "seq", "1");
	ck_assert_int_eq(tap_track_tick(t, T0 + 10000000), INT64_MAX);
	ck_assert_uint_eq(n_seen, 2);
}
END_TEST

/* The decoder had no memory to keep a publish's strings: its exchange, routing key and ids are null, never "" (the
 * default exchange), and the record says details_lost; its verdict is still the broker's. */
START_TEST(publish_details_lost_are_null)
{
	confirm_channel(1);
	struct tap_publish p = pub("", "", true); /* what the decoder hands over: empty slices */
	p.has_message_id = true;
	p.details_lost = true;
	tap_track_publish(c, 1, &p, T0);
	tap_track_ack(c, 1, 1, false, T0 + 100);
	tap_track_tick(t, T0 + 1000000);
	const char *rec = nth("publish", 0);
	assert_field(rec, "exchange", "null");
	assert_field(rec, "routing_key", "null");
	assert_field(rec, "message_id", "null");
	assert_field(rec, "details_lost", "true");
	assert_field(rec, "route", "\"routed\"");
	ck_assert_uint_eq(stats().oom, 1);
	struct tap_publish q = pub("", "", false); /* plain: written at once, the same */
	q.details_lost = true;
	tap_track_publish(c, 1, &q, T0 + 2000000);
	tap_track_ack(c, 1, 2, false, T0 + 2000100);
	rec = nth("publish", 1);
	assert_field(rec, "exchange", "null");
	assert_field(rec, "details_lost", "true");
	struct tap_publish whole = pub("", "q", true); /* kept whole: the default exchange is "" */
	tap_track_publish(c, 1, &whole, T0 + 3000000);
	tap_track_ack(c, 1, 3, false, T0 + 3000100);
	tap_track_tick(t, T0 + 4000000);
	rec = nth("publish", 2);
	assert_field(rec, "exchange", "\"\"");
	ck_assert_ptr_null(get(rec, "details_lost"));
}
END_TEST

/* A Return whose strings the decoder could not keep cannot be paired: the mandatory publishes waiting on its
 * channel end unknown (no_memory) rather than routed, the others keep their course. */
START_TEST(return_details_lost_ends_the_candidates_unknown)
{
	confirm_channel(1);
	struct tap_publish m1 = pub("x", "a", true), m2 = pub("x", "b", true), plain = pub("x", "c", false);
	tap_track_publish(c, 1, &m1, T0);
	tap_track_publish(c, 1, &plain, T0 + 1);
	tap_track_publish(c, 1, &m2, T0 + 2);
	struct tap_return r = {.reply_code = 312, .body_size = 12, .details_lost = true};
	tap_track_return(c, 1, &r, T0 + 50);
	ck_assert_uint_eq(n_seen, 2);
	for (size_t i = 0; i < 2; i++) {
		assert_verdict(verdict(i), TAP_TRACK_ROUTE_UNKNOWN, CONFIRM_UNKNOWN, NO_ORDER);
		assert_reason(verdict(i), "no_memory", -1, "");
	}
	tap_track_ack(c, 1, 3, true, T0 + 100);
	ck_assert_uint_eq(n_seen, 3);
	assert_verdict(verdict(2), TAP_TRACK_ROUTE_UNPROVEN, ACK, NO_ORDER); /* the plain one: acked as it was */
	ck_assert_uint_eq(stats().unmatched_returns, 0);
}
END_TEST

#ifdef FAIL_ALLOC_WORKS
/* No memory to store a channel as it opened or selected confirms: its first publish cannot know its mode, so the
 * channel's mode is unknown and its publishes unknown (no_memory), never written as unconfirmed. A channel stored
 * whole on the same connection keeps its verdicts. */
START_TEST(channel_lost_for_memory_has_an_unknown_mode)
{
	confirm_channel(1);
	fail_alloc = true;
	tap_track_channel_open(c, 5, T0);
	tap_track_confirm_select(c, 5, T0);
	fail_alloc = false;
	struct tap_publish p = pub("x", "a", true);
	tap_track_publish(c, 5, &p, T0 + 10);
	ck_assert_uint_eq(n_seen, 1);
	assert_verdict(verdict(0), UNKNOWN, CONFIRM_UNKNOWN, NO_ORDER);
	assert_reason(verdict(0), "no_memory", -1, "");
	ck_assert_ptr_nonnull(strstr(nth("channel", count_type("channel") - 1), "\"event\":\"mode_unknown\""));
	ck_assert_uint_gt(stats().oom, 0);
	struct tap_publish q = pub("x", "a", true);
	tap_track_publish(c, 1, &q, T0 + 20);
	tap_track_ack(c, 1, 1, false, T0 + 30);
	tap_track_tick(t, T0 + 1000000);
	ck_assert_uint_eq(n_seen, 2);
	assert_verdict(verdict(1), ROUTED, ACK, NO_ORDER);
	struct tap_publish m = pub("x", "b", true); /* no memory for its channel even now: unknown, not a crash */
	fail_alloc = true;
	tap_track_publish(c, 7, &m, T0 + 2000000);
	fail_alloc = false;
	ck_assert_uint_eq(n_seen, 3);
	assert_verdict(verdict(2), UNKNOWN, CONFIRM_UNKNOWN, NO_ORDER);
	assert_reason(verdict(2), "no_memory", -1, "");
}
END_TEST

/* A connection string the tracker could not copy is null and its records say details_lost; when the rendered
 * conn/client/vhost/user prefix could not grow, publish records still carry those members. */
START_TEST(connection_details_lost_are_said)
{
	fail_alloc = true;
	tap_track_conn_client_props(c, S("pika-but-no-room"), S("9"), S("x"));
	fail_alloc = false;
	tap_track_conn_close(c, TAP_BY_CLIENT, 200, S("bye"), T0 + 1);
	char vhost[2048];
	memset(vhost, 'v', sizeof vhost - 1);
	vhost[sizeof vhost - 1] = '\0';
	struct tap_track_conn *k = tap_track_conn_new(t, 4, "127.0.0.1:2", "127.0.0.1:5672", T0);
	fail_realloc = true; /* the vhost is copied; the prefix that holds it cannot grow */
	tap_track_conn_open(k, S(vhost), T0);
	fail_realloc = false;
	tap_track_channel_open(k, 1, T0);
	struct tap_publish p = pub("x", "a", false);
	tap_track_publish(k, 1, &p, T0 + 2);
	tap_track_tick(t, T0 + 5000000); /* past its hold */
	const char *rec = nth("publish", 0);
	assert_field(rec, "conn", "4");
	assert_field(rec, "client", "\"127.0.0.1:2\"");
	ck_assert_ptr_nonnull(strstr(rec, vhost));
	ck_assert_ptr_null(get(rec, "details_lost")); /* all there */
	tap_track_conn_end(c, "client_eof", T0 + 3);
	const char *close = nth("connection", count_type("connection") - 1);
	assert_field(close, "event", "\"close\"");
	assert_field(close, "details_lost", "true");
	ck_assert_uint_gt(stats().oom, 0);
}
END_TEST

/* No memory for a connection's tracking: NULL, counted as a connection not followed. */
START_TEST(connection_without_memory_is_counted)
{
	fail_alloc = true;
	struct tap_track_conn *k = tap_track_conn_new(t, 9, "127.0.0.1:1", "127.0.0.1:5672", T0);
	fail_alloc = false;
	ck_assert_ptr_null(k);
	ck_assert_uint_eq(stats().conns_unfollowed, 1);
	ck_assert_uint_eq(stats().connections_total, 1); /* the fixture's */
}
END_TEST
#endif

START_TEST(unmatched_return)
{
	confirm_channel(1);
	struct tap_publish p = pub("x.d", "a", true);
	tap_track_publish(c, 1, &p, T0);
	struct tap_return r = ret("x.d", "b");
	tap_track_return(c, 1, &r, T0 + 1);
	r = ret("x.d", "a");
	r.body_size = 13; /* same key, other size */
	tap_track_return(c, 1, &r, T0 + 2);
	r = ret("x.d", "a");
	tap_track_return(c, 9, &r, T0 + 3); /* channel never seen */
	ck_assert_uint_eq(count_type("publish"), 0);
	ck_assert_uint_eq(count_rule("unmatched_return"), 3);
	const char *w = nth_rule("unmatched_return", 0);
	assert_field(w, "routing_key", "\"b\"");
	assert_field(w, "reply_code", "312");
	ck_assert_uint_eq(stats().unmatched_returns, 3);
	tap_track_ack(c, 1, 1, false, T0 + 10);
	tap_track_tick(t, T0 + 1000000);
	assert_verdict(verdict_seq(1, 1), ROUTED, ACK, NO_ORDER);
}
END_TEST

START_TEST(return_pairs_earliest_match_with_message_id)
{
	tap_track_channel_open(c, 1, T0);
	struct tap_publish p = pub("x", "k", true);
	p.has_timestamp = true; /* stored before the message_id */
	p.timestamp = 1795947302;
	p.has_message_id = true;
	p.message_id = S("m1");
	tap_track_publish(c, 1, &p, T0 + 1);
	p.message_id = S("m2");
	tap_track_publish(c, 1, &p, T0 + 2);
	p.message_id = S("m3");
	tap_track_publish(c, 1, &p, T0 + 3);
	struct tap_return r = ret("x", "k");
	r.has_message_id = true;
	r.message_id = S("m2");
	tap_track_return(c, 1, &r, T0 + 10);
	ck_assert_uint_eq(n_seen, 1);
	ck_assert_str_eq(verdict(0)->message_id, "m2");
	assert_verdict(verdict(0), RETURNED, NONE, NO_ORDER);
	ck_assert(!verdict(0)->v.has_seq);
	ck_assert_int_eq(verdict(0)->v.confirm_us, -1);
	const char *rec = nth("publish", 0);
	assert_field(rec, "seq", "null");
	assert_field(rec, "order", "null");
	/* without its id the Return may be m1's or m3's: neither is guessed */
	r.has_message_id = false;
	tap_track_return(c, 1, &r, T0 + 11);
	ck_assert_uint_eq(n_seen, 1);
	ck_assert_uint_eq(count_rule("ambiguous_return"), 1);
	const char *w = nth_rule("ambiguous_return", 0);
	assert_field(w, "candidates", "2");
	assert_field(w, "seq_first", "null");
	assert_field(w, "reply_code", "312");
	tap_track_tick(t, T0 + 3 + TAP_TRACK_RETURN_WINDOW_US_DEFAULT);
	ck_assert_uint_eq(n_seen, 3);
	for (size_t k = 1; k < 3; k++) {
		assert_verdict(verdict(k), UNKNOWN, NONE, NO_ORDER);
		ck_assert_str_eq(verdict(k)->reason_by, "ambiguous_return");
	}
	ck_assert_str_eq(verdict(1)->message_id, "m1");
	assert_field(nth("publish", 1), "timestamp", "1795947302");
	ck_assert_str_eq(verdict(2)->message_id, "m3");
}
END_TEST

/* RabbitMQ sends a publish's Return before its Ack (PROTOCOL §9): a Return without a message_id goes to the one
 * publish alike still unacked, not to an older one already acked (which would read as ack_before_return). With
 * two alike unacked, it could be either: both end unknown (ambiguous_return), while the acked one stays routed. */
START_TEST(return_prefers_the_unacked_and_never_guesses)
{
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", true);
	for (int i = 0; i < 2; i++)
		tap_track_publish(c, 1, &p, T0 + i);
	tap_track_ack(c, 1, 1, false, T0 + 10);
	struct tap_return r = ret("x", "k");
	tap_track_return(c, 1, &r, T0 + 20);
	tap_track_ack(c, 1, 2, false, T0 + 21);
	assert_verdict(verdict_seq(1, 2), RETURNED, ACK, RETURN_FIRST);
	ck_assert_uint_eq(count_rule("ack_before_return"), 0);
	for (int i = 0; i < 3; i++)
		tap_track_publish(c, 1, &p, T0 + 30 + i);
	tap_track_ack(c, 1, 3, false, T0 + 40);
	tap_track_return(c, 1, &r, T0 + 50);
	ck_assert_uint_eq(count_rule("ambiguous_return"), 1);
	const char *w = nth_rule("ambiguous_return", 0);
	assert_field(w, "candidates", "2");
	assert_field(w, "seq_first", "4");
	assert_field(w, "seq_last", "5");
	tap_track_ack(c, 1, 5, true, T0 + 51);
	tap_track_tick(t, T0 + 10000000);
	assert_verdict(verdict_seq(1, 1), ROUTED, ACK, NO_ORDER);
	assert_verdict(verdict_seq(1, 3), ROUTED, ACK, NO_ORDER);
	for (uint64_t q = 4; q <= 5; q++) {
		assert_verdict(verdict_seq(1, q), UNKNOWN, ACK, NO_ORDER);
		ck_assert_str_eq(verdict_seq(1, q)->reason_by, "ambiguous_return");
	}
	ck_assert_uint_eq(n_seen, 5);
}
END_TEST

START_TEST(channel_closed_by_broker_404)
{
	confirm_channel(1);
	struct tap_publish p = pub("x.d", "k", true);
	for (int i = 0; i < 3; i++)
		tap_track_publish(c, 1, &p, T0);
	tap_track_ack(c, 1, 1, false, T0 + 5);
	struct tap_publish bad = pub("nope", "k", false);
	tap_track_publish(c, 1, &bad, T0 + 6);
	const char *text = "NOT_FOUND - no exchange 'nope' in vhost '/'";
	tap_track_channel_close(c, 1, TAP_BY_BROKER, 404, S(text), T0 + 7);
	tap_track_publish(c, 1, &bad, T0 + 8); /* sent before the client saw the close */
	ck_assert_uint_eq(count_type("publish"), 0);
	tap_track_channel_close_ok(c, 1, T0 + 9);
	ck_assert_uint_eq(n_seen, 5);
	assert_verdict(verdict_seq(1, 1), ROUTED, ACK, NO_ORDER); /* held ack keeps its verdict */
	for (uint64_t s = 2; s <= 5; s++) {
		const struct seen *v = verdict_seq(1, s);
		assert_verdict(v, UNKNOWN, CONFIRM_UNKNOWN, NO_ORDER);
		assert_reason(v, "broker", 404, text);
		ck_assert_int_eq(v->v.confirm_us, -1);
	}
	assert_field(pub_seq(5), "reason",
	             "{\"by\":\"broker\",\"code\":404,\"text\":\"NOT_FOUND - no exchange 'nope' in vhost '/'\"}");
	ck_assert_ptr_null(get(pub_seq(5), "confirm_us"));
	const char *ch = nth("channel", 2);
	assert_field(ch, "event", "\"close\"");
	assert_field(ch, "by", "\"broker\"");
	assert_field(ch, "code", "404");
	assert_field(ch, "unconfirmed", "4");
	ck_assert_uint_eq(stats().outstanding, 0);
	tap_track_ack(c, 1, 2, false, T0 + 10); /* channel gone */
	ck_assert_uint_eq(n_seen, 5);
}
END_TEST

START_TEST(channel_close_by_client)
{
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", false);
	tap_track_publish(c, 1, &p, T0);
	tap_track_publish(c, 1, &p, T0);
	tap_track_channel_close(c, 1, TAP_BY_CLIENT, 200, S("Normal shutdown"), T0 + 1);
	tap_track_ack(c, 1, 1, false, T0 + 2); /* still arrives before close-ok */
	tap_track_channel_close_ok(c, 1, T0 + 3);
	assert_verdict(verdict_seq(1, 1), UNPROVEN, ACK, NO_ORDER);
	assert_verdict(verdict_seq(1, 2), UNKNOWN, CONFIRM_UNKNOWN, NO_ORDER);
	assert_reason(verdict_seq(1, 2), "client", 200, "Normal shutdown");
	assert_field(pub_seq(2), "reason", "{\"by\":\"client\",\"code\":200,\"text\":\"Normal shutdown\"}");
	assert_field(nth("channel", 2), "unconfirmed", "1");
}
END_TEST

/* The client's channel.close crosses the broker's 404: the broker's reason is the one the records carry. */
START_TEST(crossed_closes_keep_the_brokers_reason)
{
	confirm_channel(1);
	struct tap_publish p = pub("nope", "k", true);
	tap_track_publish(c, 1, &p, T0);
	tap_track_channel_close(c, 1, TAP_BY_CLIENT, 0, S("Normal shutdown"), T0 + 1);
	tap_track_channel_close(c, 1, TAP_BY_BROKER, 404, S("NOT_FOUND - no exchange 'nope' in vhost '/'"), T0 + 2);
	tap_track_channel_close_ok(c, 1, T0 + 3);
	assert_reason(verdict_seq(1, 1), "broker", 404, "NOT_FOUND - no exchange 'nope' in vhost '/'");
	assert_field(nth("channel", 2), "by", "\"broker\"");
}
END_TEST

START_TEST(reopened_channel_restarts_at_one)
{
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", false);
	tap_track_publish(c, 1, &p, T0);
	tap_track_publish(c, 1, &p, T0);
	tap_track_ack(c, 1, 2, true, T0 + 1);
	tap_track_channel_close(c, 1, TAP_BY_CLIENT, 200, S(""), T0 + 2);
	tap_track_channel_close_ok(c, 1, T0 + 3);
	confirm_channel(1);
	tap_track_publish(c, 1, &p, T0 + 4);
	tap_track_ack(c, 1, 1, false, T0 + 5);
	ck_assert_uint_eq(n_seen, 3);
	ck_assert_uint_eq(verdict(2)->v.seq, 1);
	ck_assert_int_eq(verdict(2)->v.confirm_us, 1);
	assert_field(nth("channel", 0), "event", "\"open\"");
	assert_field(nth("channel", 1), "event", "\"confirm_select\"");
}
END_TEST

START_TEST(reselect_does_not_reset)
{
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", false);
	tap_track_publish(c, 1, &p, T0);
	tap_track_publish(c, 1, &p, T0);
	tap_track_confirm_select(c, 1, T0);
	tap_track_publish(c, 1, &p, T0);
	tap_track_ack(c, 1, 3, false, T0 + 1);
	ck_assert_uint_eq(n_seen, 1);
	ck_assert_uint_eq(verdict(0)->v.seq, 3);
}
END_TEST

START_TEST(non_confirm_publishes_before_select)
{
	tap_track_channel_open(c, 1, T0);
	struct tap_publish m = pub("x", "k", true);
	tap_track_publish(c, 1, &m, T0); /* waits for a Return, no seq */
	tap_track_confirm_select(c, 1, T0 + 1);
	tap_track_publish(c, 1, &m, T0 + 2);
	tap_track_ack(c, 1, 1, true, T0 + 3);
	tap_track_tick(t, T0 + 3 + TAP_TRACK_LATE_RETURN_US_DEFAULT);
	ck_assert_uint_eq(n_seen, 1);
	ck_assert_uint_eq(verdict(0)->v.seq, 1);
	assert_verdict(verdict(0), ROUTED, ACK, NO_ORDER);
	tap_track_tick(t, T0 + TAP_TRACK_RETURN_WINDOW_US_DEFAULT);
	ck_assert(!verdict(1)->v.has_seq);
	assert_verdict(verdict(1), UNPROVEN, NONE, NO_ORDER);
	assert_field(nth("publish", 1), "seq", "null");
}
END_TEST

/* A transaction's publishes wait for its end, however long: tx.commit-ok (a mandatory one without a Return
 * routed, the others unproven), tx.rollback-ok (unknown, tx_rollback: the broker discarded them), or the
 * channel's close (unknown, the close's reason), never a timer. A commit ends only what was published before it:
 * a publish pipelined after the client's tx.commit belongs to the next transaction. */
START_TEST(tx_channel)
{
	tap_track_channel_open(c, 2, T0);
	tap_track_tx_select(c, 2, T0);
	struct tap_publish p = pub("x", "k", false);
	struct tap_publish m = pub("x", "k", true);
	tap_track_publish(c, 2, &p, T0 + 1);
	tap_track_publish(c, 2, &m, T0 + 1);
	tap_track_tick(t, T0 + 10 * TAP_TRACK_RETURN_WINDOW_US_DEFAULT);
	ck_assert_uint_eq(n_seen, 0);
	tap_track_tx_end(c, 2, false, T0 + 5);
	tap_track_publish(c, 2, &m, T0 + 6); /* the next transaction */
	tap_track_tx_end_ok(c, 2, false, T0 + 7);
	ck_assert_uint_eq(n_seen, 2);
	assert_verdict(verdict(0), UNPROVEN, NONE, NO_ORDER);
	assert_verdict(verdict(1), ROUTED, NONE, NO_ORDER);
	ck_assert(verdict(0)->v.tx);
	tap_track_tx_end(c, 2, true, T0 + 8);
	tap_track_tx_end_ok(c, 2, true, T0 + 9);
	ck_assert_uint_eq(n_seen, 3);
	assert_verdict(verdict(2), UNKNOWN, NONE, NO_ORDER);
	ck_assert_str_eq(verdict(2)->reason_by, "tx_rollback");
	tap_track_publish(c, 2, &m, T0 + 10); /* never committed: the client closes the channel */
	tap_track_channel_close(c, 2, TAP_BY_CLIENT, 200, S("Normal shutdown"), T0 + 11);
	tap_track_channel_close_ok(c, 2, T0 + 12);
	ck_assert_uint_eq(n_seen, 4);
	assert_verdict(verdict(3), UNKNOWN, NONE, NO_ORDER);
	ck_assert_str_eq(verdict(3)->reason_by, "client");

	tap_track_channel_open(c, 2, T0 + 13);
	tap_track_tx_select(c, 2, T0 + 13);
	tap_track_publish(c, 2, &p, T0 + 14);
	tap_track_tx_end(c, 2, false, T0 + 15);
	tap_track_tx_end_ok(c, 2, false, T0 + 16);
	ck_assert_uint_eq(n_seen, 5);
	assert_verdict(verdict(4), UNPROVEN, NONE, NO_ORDER);
	ck_assert(verdict(4)->v.tx);
	ck_assert(!verdict(0)->v.has_seq);
	const char *r = nth("publish", 0);
	assert_field(r, "seq", "null");
	assert_field(r, "tx", "true");
	tap_track_confirm_select(c, 2, T0 + 17); /* the broker refuses (406); tracking stays tx */
	tap_track_publish(c, 2, &p, T0 + 18);
	tap_track_tx_end(c, 2, false, T0 + 19);
	tap_track_tx_end_ok(c, 2, false, T0 + 19);
	ck_assert(verdict(5)->v.tx);
	assert_field(nth("channel", 1), "event", "\"tx_select\"");
}
END_TEST

/* Issue 14 item 2: a plain-channel burst ok, missing exchange, ok-after. The broker's 404 (class 60 method 40)
 * names the culprit; the publish before it keeps its verdict, it and those after it (sent before or after the
 * close) end unknown with the broker's reason, whatever their mandatory flag, and the close record names it. */
static const char nf_text[] = "NOT_FOUND - no exchange 'gone' in vhost '/'";


/* The client answers the broker's channel close with a connection.close instead of channel.close-ok: the broker's
 * close-ok to that settles the connection, not the refused channel, whose publishes keep the broker's reason. */
START_TEST(refused_channel_ended_by_the_clients_connection_close)
{
	tap_track_channel_open(c, 1, T0);
	struct tap_publish bad = pub_id("gone", "b", _i == 1, "m1");
	struct tap_publish after = pub_id("x", "c", false, "m2");
	tap_track_publish(c, 1, &bad, T0 + 1);
	tap_track_publish(c, 1, &after, T0 + 2);
	tap_track_channel_close(c, 1, TAP_BY_BROKER, 404, S(nf_text), T0 + 300);
	tap_track_publish_refused(c, 1, T0 + 300);
	tap_track_conn_close(c, TAP_BY_CLIENT, 200, S("Normal shutdown"), T0 + 310);
	tap_track_conn_close_ok(c, T0 + 320);
	tap_track_conn_end(c, "client_eof", T0 + 330);
	c = NULL;
	ck_assert_uint_eq(n_seen, 2);
	for (size_t i = 0; i < 2; i++) {
		assert_verdict(verdict(i), UNKNOWN, NONE, NO_ORDER);
		ck_assert_str_eq(verdict(i)->reason_by, "broker");
		ck_assert_uint_eq(verdict(i)->v.reason_code, 404);
	}
	assert_field(nth("publish", 0), "refused", "\"culprit\"");
	assert_field(nth("publish", 1), "refused", "\"after_culprit\"");
}
END_TEST

/* Two waiting publishes to the exchange a 404 names: the broker may have routed the first before the exchange was
 * deleted and refused the second, or refused the first. Neither is named: both are candidates, those before them
 * keep their verdict, and the close record names no culprit. */
START_TEST(close_naming_two_waiting_publishes_names_neither)
{
	tap_track_channel_open(c, 1, T0);
	struct tap_publish ok = pub_id("x", "a", false, "m1");
	struct tap_publish a = pub_id("gone", "b", _i == 1, "m2");
	struct tap_publish b = pub_id("gone", "b", _i == 1, "m3");
	tap_track_publish(c, 1, &ok, T0 + 1);
	tap_track_publish(c, 1, &a, T0 + 2);
	tap_track_publish(c, 1, &b, T0 + 3);
	tap_track_channel_close(c, 1, TAP_BY_BROKER, 404, S(nf_text), T0 + 300);
	tap_track_publish_refused(c, 1, T0 + 300);
	tap_track_channel_close_ok(c, 1, T0 + 400);
	ck_assert_uint_eq(n_seen, 3);
	assert_verdict(verdict(0), UNPROVEN, NONE, NO_ORDER);
	for (size_t i = 1; i < 3; i++) {
		assert_verdict(verdict(i), UNKNOWN, NONE, NO_ORDER);
		ck_assert_uint_eq(verdict(i)->v.reason_code, 404);
		assert_field(nth("publish", i), "refused", "\"candidate\"");
	}
	ck_assert_ptr_null(get(nth("channel", 1), "culprit"));
}
END_TEST

START_TEST(publish_caused_close_names_the_culprit)
{
	tap_track_channel_open(c, 1, T0);
	struct tap_publish ok = pub_id("x", "a", false, "m1");
	struct tap_publish bad = pub_id("gone", "b", _i == 1, "m2");
	struct tap_publish after = pub_id("x", "c", false, "m3");
	struct tap_publish late = pub_id("x", "d", false, "m4");
	tap_track_publish(c, 1, &ok, T0 + 1);
	tap_track_publish(c, 1, &bad, T0 + 2);
	tap_track_publish(c, 1, &after, T0 + 3);
	ck_assert_uint_eq(n_seen, 0);
	tap_track_channel_close(c, 1, TAP_BY_BROKER, 404, S(nf_text), T0 + 300);
	tap_track_publish_refused(c, 1, T0 + 300);
	ck_assert_uint_eq(n_seen, 1);
	ck_assert_str_eq(verdict(0)->message_id, "m1");
	assert_verdict(verdict(0), UNPROVEN, NONE, NO_ORDER);
	tap_track_publish(c, 1, &late, T0 + 301); /* crossed the close: the broker discards it */
	tap_track_tick(t, T0 + 10 * TAP_TRACK_LATE_RETURN_US_DEFAULT); /* refused ones wait for close-ok */
	ck_assert_uint_eq(n_seen, 1);
	tap_track_channel_close_ok(c, 1, T0 + 400);
	ck_assert_uint_eq(n_seen, 4);
	const char *want[] = {"m2", "m3", "m4"};
	for (size_t i = 1; i < 4; i++) {
		ck_assert_str_eq(verdict(i)->message_id, want[i - 1]);
		assert_verdict(verdict(i), UNKNOWN, NONE, NO_ORDER);
		ck_assert_str_eq(verdict(i)->reason_by, "broker");
		ck_assert(verdict(i)->v.has_reason_code);
		ck_assert_uint_eq(verdict(i)->v.reason_code, 404);
		ck_assert_str_eq(verdict(i)->reason_text, nf_text);
	}
	assert_field(nth("publish", 0), "route", "\"unproven\"");
	ck_assert_ptr_null(get(nth("publish", 0), "refused"));
	assert_field(nth("publish", 1), "refused", "\"culprit\"");
	assert_field(nth("publish", 2), "refused", "\"after_culprit\"");
	assert_field(nth("publish", 3), "refused", "\"after_culprit\"");
	const char *close = nth("channel", 1);
	assert_field(close, "code", "404");
	assert_field(close, "culprit",
	             "{\"conn\":3,\"channel\":1,\"seq\":null,\"message_id\":\"m2\",\"exchange\":\"gone\",\"routing_key\":\"b\"}");
}
END_TEST

/* In confirm mode the culprit carries its seq; publishes acked before the close keep their verdict. */
START_TEST(publish_caused_close_in_confirm_mode)
{
	tap_track_channel_open(c, 1, T0);
	tap_track_confirm_select(c, 1, T0);
	struct tap_publish ok = pub_id("x", "a", false, "m1");
	struct tap_publish bad = pub_id("gone", "b", false, "m2");
	tap_track_publish(c, 1, &ok, T0 + 1);
	tap_track_ack(c, 1, 1, false, T0 + 2);
	tap_track_publish(c, 1, &bad, T0 + 3);
	tap_track_channel_close(c, 1, TAP_BY_BROKER, 404, S(nf_text), T0 + 4);
	tap_track_publish_refused(c, 1, T0 + 4);
	tap_track_channel_close_ok(c, 1, T0 + 5);
	ck_assert_uint_eq(n_seen, 2);
	assert_verdict(verdict(0), UNPROVEN, ACK, NO_ORDER);
	assert_verdict(verdict(1), UNKNOWN, CONFIRM_UNKNOWN, NO_ORDER);
	ck_assert_uint_eq(verdict(1)->v.reason_code, 404);
	ck_assert_ptr_nonnull(strstr(nth("channel", 2), "\"culprit\":{\"conn\":3,\"channel\":1,\"seq\":2,"));
}
END_TEST

/* Three publishes on a plain channel, the broker's publish-caused close with this code and text, close-ok: the
 * records, in publish order, are returned by nth("publish", i). */
static void refused_burst(struct tap_publish *p, uint16_t code, const char *text)
{
	tap_track_channel_open(c, 1, T0);
	for (int i = 0; i < 3; i++)
		tap_track_publish(c, 1, &p[i], T0 + 1 + i);
	tap_track_channel_close(c, 1, TAP_BY_BROKER, code, S(text), T0 + 10);
	tap_track_publish_refused(c, 1, T0 + 10);
	tap_track_channel_close_ok(c, 1, T0 + 11);
	ck_assert_uint_eq(n_seen, 3);
}

static void assert_refused_from_second(uint16_t code, const char *exchange)
{
	ck_assert_ptr_null(get(nth("publish", 0), "refused"));
	assert_verdict(verdict(0), UNPROVEN, NONE, NO_ORDER);
	assert_field(nth("publish", 1), "refused", "\"culprit\"");
	assert_field(nth("publish", 2), "refused", "\"after_culprit\"");
	for (size_t i = 1; i < 3; i++) {
		assert_verdict(verdict(i), UNKNOWN, NONE, NO_ORDER);
		ck_assert_uint_eq(verdict(i)->v.reason_code, code);
	}
	char want[160];
	snprintf(want, sizeof want,
	         "{\"conn\":3,\"channel\":1,\"seq\":null,\"message_id\":\"m2\",\"exchange\":\"%s\",\"routing_key\":\"b\"}",
	         exchange);
	assert_field(nth("channel", 1), "culprit", want);
}

/* RabbitMQ's 406 for a user_id names no exchange: the culprit is the first publish whose user_id is not the
 * login user's. */
START_TEST(publish_caused_close_by_user_id)
{
	tap_track_conn_user(c, S("guest"));
	struct tap_publish p[3] = {pub_id("x", "a", false, "m1"), pub_id("x", "b", false, "m2"),
	                           pub_id("x", "c", false, "m3")};
	p[0].has_user_id = true;
	p[0].user_id = S("guest"); /* the login user: allowed */
	p[1].has_user_id = true;
	p[1].user_id = S("bob");
	refused_burst(p, 406, "PRECONDITION_FAILED - user_id property set to 'bob' but authenticated user was 'guest'");
	assert_refused_from_second(406, "x");
}
END_TEST

/* A 406 for a message over max_message_size gives the size: the culprit is the first publish of that body size. */
START_TEST(publish_caused_close_by_message_size)
{
	struct tap_publish p[3] = {pub_id("x", "a", false, "m1"), pub_id("x", "b", false, "m2"),
	                           pub_id("x", "c", false, "m3")};
	p[1].body_size = 2000;
	refused_burst(p, 406, "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1024");
	assert_refused_from_second(406, "x");
}
END_TEST

/* A publish-caused close whose text points at no publish: each one still waiting may be the culprit, so each ends
 * unknown with the broker's reason ("refused":"candidate"), never unproven; the close record names none. */
START_TEST(publish_caused_close_naming_nothing)
{
	struct tap_publish p[3] = {pub_id("x", "a", false, "m1"), pub_id("x", "b", false, "m2"),
	                           pub_id("x", "c", false, "m3")};
	refused_burst(p, 406, "PRECONDITION_FAILED - something no publish field names");
	for (size_t i = 0; i < 3; i++) {
		assert_verdict(verdict(i), UNKNOWN, NONE, NO_ORDER);
		ck_assert_uint_eq(verdict(i)->v.reason_code, 406);
		assert_field(nth("publish", i), "refused", "\"candidate\"");
	}
	ck_assert_ptr_null(get(nth("channel", 1), "culprit"));
}
END_TEST

/* A connection.close caused by a publish: the culprit is found on whichever channel sent it. */
START_TEST(publish_caused_connection_close)
{
	tap_track_channel_open(c, 1, T0);
	tap_track_channel_open(c, 2, T0);
	struct tap_publish ok = pub_id("x", "a", false, "m1");
	struct tap_publish bad = pub_id("", "b", false, "m2");
	tap_track_publish(c, 1, &ok, T0 + 1);
	tap_track_publish(c, 2, &bad, T0 + 2);
	tap_track_conn_close(c, TAP_BY_BROKER, 403,
	                     S("ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' refused for user 'u'"),
	                     T0 + 3);
	tap_track_publish_refused(c, 0, T0 + 3);
	tap_track_conn_end(c, "eof", T0 + 4);
	c = NULL;
	ck_assert_uint_eq(n_seen, 2);
	ck_assert_str_eq(verdict(0)->message_id, "m1");
	assert_verdict(verdict(0), UNPROVEN, NONE, NO_ORDER);
	assert_verdict(verdict(1), UNKNOWN, NONE, NO_ORDER);
	ck_assert_uint_eq(verdict(1)->v.reason_code, 403);
	assert_field(nth("channel", 3), "culprit",
	             "{\"conn\":3,\"channel\":2,\"seq\":null,\"message_id\":\"m2\",\"exchange\":\"\",\"routing_key\":\"b\"}");
}
END_TEST

/* RabbitMQ does not implement immediate: a connection.close 540 "immediate=true" whose culprit is the publish that
 * set it; the one before it on the same channel keeps its verdict. */
START_TEST(publish_caused_connection_close_by_immediate)
{
	tap_track_channel_open(c, 1, T0);
	struct tap_publish p[3] = {pub_id("x", "a", false, "m1"), pub_id("x", "b", false, "m2"),
	                           pub_id("x", "c", false, "m3")};
	p[1].immediate = true;
	for (int i = 0; i < 3; i++)
		tap_track_publish(c, 1, &p[i], T0 + 1 + i);
	tap_track_conn_close(c, TAP_BY_BROKER, 540, S("NOT_IMPLEMENTED - immediate=true"), T0 + 10);
	tap_track_publish_refused(c, 0, T0 + 10);
	tap_track_conn_end(c, "eof", T0 + 11);
	c = NULL;
	ck_assert_uint_eq(n_seen, 3);
	assert_refused_from_second(540, "x");
}
END_TEST

/* Held plain publishes that no close refuses end as before: unproven at once when the connection ends. */
START_TEST(plain_publish_held_ends_unproven)
{
	tap_track_channel_open(c, 1, T0);
	struct tap_publish p = pub("x", "a", false);
	tap_track_publish(c, 1, &p, T0 + 1);
	ck_assert_uint_eq(n_seen, 0);
	ck_assert_int_eq(tap_track_tick(t, T0 + 2), T0 + 1 + TAP_TRACK_LATE_RETURN_US_DEFAULT);
	tap_track_publish(c, 1, &p, T0 + 3);
	tap_track_conn_end(c, "eof", T0 + 4);
	c = NULL;
	ck_assert_uint_eq(n_seen, 2);
	assert_verdict(verdict(0), UNPROVEN, NONE, NO_ORDER);
	assert_verdict(verdict(1), UNPROVEN, NONE, NO_ORDER);
	ck_assert_int_eq(verdict(1)->v.t_record, T0 + 3);
	ck_assert_ptr_null(get(nth("publish", 0), "reason"));
}
END_TEST

/* ---- issue 14 items 3-4: header values (opt-in) and trace context ---- */

static void hdr_str(struct tap_bytes *b, const char *k, const char *v)
{
	tap_build_key(b, k, 'S');
	tap_build_longstr(b, v, strlen(v));
}

/* One plain publish with these headers, written (held plain publishes are flushed by a tick); its record. */
static const char *publish_with_headers(const struct tap_bytes *h)
{
	tap_track_channel_open(c, 1, T0);
	struct tap_publish p = pub("celery", "celery", false);
	p.headers = (struct tap_slice){h->d, h->n};
	size_t before = count_type("publish");
	tap_track_publish(c, 1, &p, T0 + 1);
	tap_track_tick(t, T0 + 1 + TAP_TRACK_LATE_RETURN_US_DEFAULT);
	return nth("publish", before);
}

static void celery_headers(struct tap_bytes *h)
{
	hdr_str(h, "lang", "py");
	hdr_str(h, "task", "proj.add");
	hdr_str(h, "id", "6f1c2a4e-0b7d-4c11-9a3e-000000000001");
	tap_build_key(h, "retries", 'l');
	tap_build_u64(h, 3);
	struct tap_bytes inner = {0};
	tap_build_key(&inner, "k", 't');
	tap_build_u8(&inner, 1);
	tap_build_key(h, "meta", 'F');
	tap_build_longstr(h, inner.d, inner.n);
	tap_build_free(&inner);
	struct tap_bytes arr = {0};
	tap_build_u8(&arr, 'I');
	tap_build_u32(&arr, 1);
	tap_build_u8(&arr, 'S');
	tap_build_longstr(&arr, "a", 1);
	tap_build_key(h, "list", 'A');
	tap_build_longstr(h, arr.d, arr.n);
	tap_build_free(&arr);
	tap_build_key(h, "say \"hi\"", 'b');
	tap_build_u8(h, 0xFF);
}

START_TEST(header_values_written_when_asked)
{
	struct tap_track_conf conf = {.header_values = "task,id,retries,meta,list,missing,say \"hi\""};
	teardown();
	setup_conf(&conf);
	struct tap_bytes h = {0};
	celery_headers(&h);
	const char *r = publish_with_headers(&h);
	assert_field(r, "header_values",
	             "{\"task\":\"proj.add\",\"id\":\"6f1c2a4e-0b7d-4c11-9a3e-000000000001\",\"retries\":3,"
	             "\"meta\":{\"k\":{\"t\":true}},\"list\":[{\"I\":1},{\"S\":\"a\"}],\"say \\\"hi\\\"\":-1}");
	ck_assert_ptr_null(get(r, "header_values_truncated"));
	tap_build_free(&h);
}
END_TEST

START_TEST(header_values_never_by_default)
{
	struct tap_bytes h = {0};
	celery_headers(&h);
	const char *r = publish_with_headers(&h);
	ck_assert_ptr_null(get(r, "header_values"));
	ck_assert_ptr_null(strstr(r, "proj.add"));
	tap_build_free(&h);
}
END_TEST

START_TEST(header_values_bounded)
{
	struct tap_track_conf conf = {.header_values = "big,k0,k1,k2,k3,k4,k5,k6,k7,k8,tbl"};
	teardown();
	setup_conf(&conf);
	char big[1000];
	memset(big, 'a', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	struct tap_bytes h = {0};
	hdr_str(&h, "big", big);
	const char *r = publish_with_headers(&h);
	const char *v = get(r, "header_values");
	ck_assert_ptr_nonnull(v);
	ck_assert_uint_le(strlen(v), TAP_TRACK_HEADER_VALUE_BYTES_MAX + sizeof "{\"big\":}" - 1);
	ck_assert_ptr_nonnull(strstr(v, "aaa\xe2\x80\xa6\"}"));
	assert_field(r, "header_values_truncated", "true");
	/* more keys than TAP_TRACK_HEADER_VALUES_KEYS_MAX: the first 8 stay */
	tap_build_free(&h);
	for (int i = 0; i < 9; i++) {
		char k[8];
		snprintf(k, sizeof k, "k%d", i);
		hdr_str(&h, k, "v");
	}
	r = publish_with_headers(&h);
	ck_assert_ptr_nonnull(strstr(r, "\"k7\":\"v\"}"));
	ck_assert_ptr_null(strstr(r, "\"k8\""));
	assert_field(r, "header_values_truncated", "true");
	/* a table too big for one value is null */
	tap_build_free(&h);
	struct tap_bytes inner = {0};
	for (int i = 0; i < 40; i++) {
		char k[8];
		snprintf(k, sizeof k, "n%d", i);
		tap_build_key(&inner, k, 'l');
		tap_build_u64(&inner, (uint64_t)i);
	}
	tap_build_key(&h, "tbl", 'F');
	tap_build_longstr(&h, inner.d, inner.n);
	tap_build_free(&inner);
	r = publish_with_headers(&h);
	assert_field(r, "header_values", "{\"tbl\":null}");
	struct tap_track_stats st;
	tap_track_get_stats(t, &st);
	ck_assert_uint_eq(st.header_values_truncated, 3);
	tap_build_free(&h);
}
END_TEST

START_TEST(traceparent_written)
{
	struct tap_bytes h = {0};
	hdr_str(&h, "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
	const char *r = publish_with_headers(&h);
	assert_field(r, "trace_id", "\"4bf92f3577b34da6a3ce929d0e0e4736\"");
	assert_field(r, "span_id", "\"00f067aa0ba902b7\"");
	tap_build_free(&h);
	hdr_str(&h, "traceparent", "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later");
	r = publish_with_headers(&h); /* a later version may append fields */
	assert_field(r, "trace_id", "\"4bf92f3577b34da6a3ce929d0e0e4736\"");
	struct tap_track_stats st;
	tap_track_get_stats(t, &st);
	ck_assert_uint_eq(st.traceparent_malformed, 0);
	tap_build_free(&h);
}
END_TEST

START_TEST(traceparent_malformed_ignored_and_counted)
{
	static const char *const bad[] = {
	    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", /* upper case */
	    "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  /* short trace id */
	    "00-00000000000000000000000000000000-00f067aa0ba902b7-01", /* zero trace id */
	    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", /* zero span id */
	    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", /* version ff */
	    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", /* 00 with more */
	    "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01", /* separators */
	    "",
	};
	size_t n = sizeof bad / sizeof bad[0];
	for (size_t i = 0; i < n; i++) {
		struct tap_bytes h = {0};
		hdr_str(&h, "traceparent", bad[i]);
		const char *r = publish_with_headers(&h);
		ck_assert_msg(!get(r, "trace_id") && !get(r, "span_id"), "%s: %s", bad[i], r);
		tap_build_free(&h);
	}
	struct tap_bytes h = {0};
	tap_build_key(&h, "traceparent", 'l'); /* not a string */
	tap_build_u64(&h, 1);
	(void)publish_with_headers(&h);
	tap_build_free(&h);
	struct tap_track_stats st;
	tap_track_get_stats(t, &st);
	ck_assert_uint_eq(st.traceparent_malformed, n + 1);
	struct tap_buf sum;
	tap_buf_init(&sum);
	tap_track_summary(t, &sum);
	char want[64];
	snprintf(want, sizeof want, "malformed traceparent %zu", n + 1);
	ck_assert_msg(sum.len && memmem(sum.data, sum.len, want, strlen(want)), "%.*s", (int)sum.len, sum.data);
	tap_buf_deinit(&sum);
}
END_TEST

START_TEST(non_confirm_mandatory_window)
{
	struct tap_track_conf conf = {.return_window_us = 1000, .late_return_us = 5};
	teardown();
	setup_conf(&conf);
	tap_track_channel_open(c, 1, T0);
	struct tap_publish p = pub("x", "gone", true);
	tap_track_publish(c, 1, &p, T0);
	p.routing_key = S("back");
	tap_track_publish(c, 1, &p, T0 + 10);
	struct tap_publish q = pub("x", "other", false);
	tap_track_publish(c, 1, &q, T0 + 20);
	ck_assert_uint_eq(n_seen, 0); /* not mandatory: held late_return_us only */
	tap_track_tick(t, T0 + 25);
	ck_assert_uint_eq(n_seen, 1);
	assert_verdict(verdict(0), UNPROVEN, NONE, NO_ORDER);
	struct tap_return r = ret("x", "back");
	tap_track_return(c, 1, &r, T0 + 30);
	ck_assert_uint_eq(n_seen, 2);
	assert_verdict(verdict(1), RETURNED, NONE, NO_ORDER);
	ck_assert_int_eq(verdict(1)->v.return_us, 20);
	assert_field(nth("publish", 1), "return_us", "20");
	ck_assert_int_eq(tap_track_tick(t, T0 + 999), T0 + 1000);
	ck_assert_uint_eq(n_seen, 2);
	ck_assert_int_eq(tap_track_tick(t, T0 + 1000), INT64_MAX);
	ck_assert_uint_eq(n_seen, 3);
	ck_assert_str_eq(verdict(2)->routing_key, "gone");
	assert_verdict(verdict(2), UNPROVEN, NONE, NO_ORDER);
	ck_assert_int_eq(verdict(2)->v.t_record, T0 + 1000);
	assert_field(nth("publish", 2), "ts", "\"2026-11-29T10:15:02.001000Z\"");
}
END_TEST

/* The broker's close-ok to the client's close, and tx.commit-ok, come after any Return: a non-confirm
 * mandatory publish still in its return window got none (unproven, not unknown); a committed one was routed
 * (the broker had it and found a queue). A broker-initiated close settles nothing. */
START_TEST(clean_close_and_commit_settle_the_return_window)
{
	tap_track_channel_open(c, 1, T0);
	struct tap_publish p = pub("x", "k", true);
	tap_track_publish(c, 1, &p, T0);
	tap_track_channel_close(c, 1, TAP_BY_CLIENT, 200, S("Normal shutdown"), T0 + 1);
	tap_track_channel_close_ok(c, 1, T0 + 2);
	ck_assert_uint_eq(n_seen, 1);
	assert_verdict(verdict(0), UNPROVEN, NONE, NO_ORDER);
	ck_assert_ptr_null(verdict(0)->v.reason_by);
	ck_assert_ptr_null(strstr(nth("publish", 0), "\"reason\""));

	tap_track_channel_open(c, 2, T0);
	tap_track_tx_select(c, 2, T0);
	tap_track_publish(c, 2, &p, T0 + 3);
	ck_assert_uint_eq(count_type("publish"), 1);
	tap_track_tx_end(c, 2, false, T0 + 4);
	tap_track_tx_end_ok(c, 2, false, T0 + 4);
	ck_assert_uint_eq(n_seen, 2);
	assert_verdict(verdict(1), ROUTED, NONE, NO_ORDER);
	ck_assert(verdict(1)->v.tx);

	tap_track_channel_open(c, 3, T0);
	tap_track_publish(c, 3, &p, T0 + 5);
	tap_track_channel_close(c, 3, TAP_BY_BROKER, 406, S("PRECONDITION_FAILED"), T0 + 6);
	tap_track_channel_close_ok(c, 3, T0 + 7);
	assert_verdict(verdict(2), UNKNOWN, NONE, NO_ORDER);
	assert_reason(verdict(2), "broker", 406, "PRECONDITION_FAILED");

	tap_track_channel_open(c, 4, T0);
	tap_track_publish(c, 4, &p, T0 + 8);
	tap_track_conn_close(c, TAP_BY_CLIENT, 200, S("bye"), T0 + 9);
	tap_track_conn_close_ok(c, T0 + 10);
	tap_track_conn_end(c, "client_eof", T0 + 11);
	c = NULL;
	assert_verdict(verdict(3), UNPROVEN, NONE, NO_ORDER);
	ck_assert_ptr_null(verdict(3)->v.reason_by);
}
END_TEST

START_TEST(channels_anywhere_in_the_id_range)
{
	/* channels opened out of order, across the 16-bit range, one closed in the middle: each publish keeps its
	 * own channel and sequence, and the connection's end closes the rest in channel order */
	static const uint16_t ids[] = {300, 5, 65535, 1, 2047, 0x100};
	tap_track_conn_tune(c, 0, 131072, 60); /* channel_max 0: no limit below 65535 */
	struct tap_publish p = pub("x", "k", false);
	for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
		confirm_channel(ids[i]);
		for (size_t k = 0; k <= i; k++)
			tap_track_publish(c, ids[i], &p, T0 + (int64_t)i);
	}
	tap_track_ack(c, 65535, 3, true, T0 + 10);
	ck_assert_uint_eq(count_type("publish"), 3);
	tap_track_channel_close(c, 5, TAP_BY_CLIENT, 200, S("done"), T0 + 11);
	tap_track_channel_close_ok(c, 5, T0 + 12);
	tap_track_conn_end(c, "client_eof", T0 + 13);
	c = NULL;
	ck_assert_uint_eq(count_type("publish"), 21);
	static const char *const closed[] = {"5", "1", "256", "300", "2047", "65535"};
	size_t n_closed = 0;
	for (size_t i = 0; i < count_type("channel"); i++) {
		const char *r = nth("channel", i);
		if (strncmp(get(r, "event"), "\"close\"", 7) != 0)
			continue;
		ck_assert_uint_lt(n_closed, 6);
		assert_field(r, "channel", closed[n_closed++]);
	}
	ck_assert_uint_eq(n_closed, 6);
	size_t on_2047 = 0, seq_max = 0;
	for (size_t i = 0; i < 21; i++) {
		const char *r = nth("publish", i);
		if (strncmp(get(r, "channel"), "2047", 4) == 0) {
			on_2047++;
			size_t seq = (size_t)strtoul(get(r, "seq"), NULL, 10);
			seq_max = seq > seq_max ? seq : seq_max;
		}
	}
	ck_assert_uint_eq(on_2047, 5);
	ck_assert_uint_eq(seq_max, 5);
}
END_TEST

START_TEST(eviction_at_max_outstanding)
{
	struct tap_track_conf conf = {.max_outstanding = 3};
	teardown();
	setup_conf(&conf);
	confirm_channel(1);
	confirm_channel(2);
	struct tap_publish p = pub("x", "k", false);
	tap_track_publish(c, 1, &p, T0 + 1);
	tap_track_publish(c, 2, &p, T0 + 2);
	tap_track_publish(c, 1, &p, T0 + 3);
	ck_assert_uint_eq(count_type("publish"), 0);
	tap_track_publish(c, 2, &p, T0 + 4);
	tap_track_publish(c, 2, &p, T0 + 5);
	ck_assert_uint_eq(n_seen, 2);
	const struct seen *a = verdict(0), *b = verdict(1);
	ck_assert_uint_eq(a->v.channel, 1);
	ck_assert_uint_eq(a->v.seq, 1);
	assert_verdict(a, UNKNOWN, CONFIRM_UNKNOWN, NO_ORDER);
	assert_reason(a, "evicted", -1, "");
	assert_field(nth("publish", 0), "reason", "{\"by\":\"evicted\"}");
	ck_assert_uint_eq(b->v.channel, 2);
	ck_assert_uint_eq(b->v.seq, 1);
	ck_assert_uint_eq(stats().evicted, 2);
	ck_assert_uint_eq(stats().outstanding, 3);
	tap_track_ack(c, 2, 3, true, T0 + 6);
	ck_assert_uint_eq(n_seen, 4);
	ck_assert_uint_eq(stats().stray_confirms, 0);
}
END_TEST

START_TEST(conn_end_with_outstanding)
{
	confirm_channel(1);
	tap_track_channel_open(c, 5, T0);
	struct tap_publish p = pub("x", "k", true);
	tap_track_publish(c, 1, &p, T0);
	tap_track_publish(c, 1, &p, T0);
	tap_track_publish(c, 5, &p, T0); /* non-confirm, in its return window */
	tap_track_ack(c, 1, 1, false, T0 + 1);
	tap_track_conn_end(c, "eof", T0 + 2);
	c = NULL;
	ck_assert_uint_eq(n_seen, 3);
	assert_verdict(verdict_seq(1, 1), ROUTED, ACK, NO_ORDER);
	assert_verdict(verdict_seq(1, 2), UNKNOWN, CONFIRM_UNKNOWN, NO_ORDER);
	assert_reason(verdict_seq(1, 2), "eof", -1, "");
	assert_field(pub_seq(2), "reason", "{\"by\":\"eof\"}");
	ck_assert_uint_eq(verdict(2)->v.channel, 5);
	assert_verdict(verdict(2), UNKNOWN, NONE, NO_ORDER);
	ck_assert_uint_eq(count_type("channel"), 5); /* open, select, open, close, close */
	const char *cc = nth("connection", 1);
	assert_field(cc, "event", "\"close\"");
	assert_field(cc, "by", "\"eof\"");
	assert_field(cc, "publishes", "3");
	assert_field(cc, "routed", "1");
	assert_field(cc, "unknown", "2");
	assert_field(cc, "acked", "1");
	struct tap_track_stats s = stats();
	ck_assert_uint_eq(s.connections_open, 0);
	ck_assert_uint_eq(s.publishes, s.publish_records);
}
END_TEST

START_TEST(conn_end_after_connection_close)
{
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", false);
	tap_track_publish(c, 1, &p, T0);
	tap_track_conn_close(c, TAP_BY_BROKER, 320, S("CONNECTION_FORCED - broker forced connection closure"), T0 + 1);
	tap_track_conn_end(c, "eof", T0 + 2);
	c = NULL;
	assert_reason(verdict_seq(1, 1), "broker", 320, "CONNECTION_FORCED - broker forced connection closure");
	assert_field(
	    pub_seq(1), "reason",
	    "{\"by\":\"broker\",\"code\":320,\"text\":\"CONNECTION_FORCED - broker forced connection closure\"}");
	assert_field(nth("connection", 1), "code", "320");
}
END_TEST

START_TEST(shutdown_writes_everything)
{
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", true);
	tap_track_publish(c, 1, &p, T0);
	tap_track_publish(c, 1, &p, T0);
	tap_track_ack(c, 1, 1, false, T0 + 1);
	struct tap_track_conn *c2 = tap_track_conn_new(t, 4, "127.0.0.1:2", "127.0.0.1:5672", T0);
	tap_track_channel_open(c2, 1, T0);
	tap_track_publish(c2, 1, &p, T0);
	tap_track_shutdown(t, T0 + 5);
	c = NULL;
	struct tap_track_stats s = stats();
	ck_assert_uint_eq(s.publishes, 3);
	ck_assert_uint_eq(s.publish_records, 3);
	ck_assert_uint_eq(s.outstanding, 0);
	ck_assert_uint_eq(s.connections_open, 0);
	ck_assert_uint_eq(n_seen, 3);
	assert_verdict(verdict_seq(1, 1), ROUTED, ACK, NO_ORDER);
	assert_reason(verdict_seq(1, 2), "shutdown", -1, "");
	assert_field(pub_seq(2), "reason", "{\"by\":\"shutdown\"}");
	ck_assert_uint_eq(count_type("connection"), 3);
}
END_TEST

START_TEST(consumer_side_does_not_confuse)
{
	/* channel 1 consumes (no confirm mode): consumer acks never reach tap_track_confirm, but even if a tag
	 * shows up on a non-confirm channel it confirms nothing */
	tap_track_channel_open(c, 1, T0);
	confirm_channel(2);
	struct tap_publish p = pub("x", "k", false);
	tap_track_publish(c, 2, &p, T0);
	tap_track_ack(c, 1, 1, false, T0 + 1);
	tap_track_ack(c, 1, 5, true, T0 + 1);
	ck_assert_uint_eq(n_seen, 0);
	ck_assert_uint_eq(stats().stray_confirms, 2);
	tap_track_ack(c, 2, 1, false, T0 + 2);
	ck_assert_uint_eq(verdict(0)->v.channel, 2);
	ck_assert_int_eq(verdict(0)->v.confirm_us, 2);
}
END_TEST

START_TEST(optional_properties_and_escaping)
{
	confirm_channel(1);
	struct tap_slice keys[] = {S("x-retry"), S("trace\"id")};
	struct tap_publish p = pub("x\n", "k\xff", false);
	p.content_type = S("application/json");
	p.type = S("order.created");
	p.app_id = S("shop");
	p.has_timestamp = true;
	p.timestamp = 1795947302;
	p.header_keys = keys;
	p.n_header_keys = 2;
	p.has_correlation_id = true;
	p.correlation_id = S("c-1");
	tap_track_publish(c, 1, &p, T0);
	tap_track_ack(c, 1, 1, false, T0 + 1);
	const char *r = nth("publish", 0);
	ck_assert(valid_json_object(r));
	assert_field(r, "type", "\"publish\"");
	assert_field(r, "exchange", "\"x\\n\"");
	assert_field(r, "routing_key", "\"k\\u00ff\"");
	assert_field(r, "content_type", "\"application/json\"");
	assert_field(r, "message_type", "\"order.created\"");
	assert_field(r, "app_id", "\"shop\"");
	assert_field(r, "timestamp", "1795947302");
	assert_field(r, "headers", "[\"x-retry\",\"trace\\\"id\"]");
	assert_field(r, "correlation_id", "\"c-1\"");
	assert_field(r, "delivery_mode", "null");
}
END_TEST

START_TEST(latency_beyond_the_histogram_range)
{
	/* from 2^36 µs (19 h) latencies share the top bucket; a quantile that lands there is the exact max */
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", false);
	int64_t huge = INT64_C(1) << 40;
	tap_track_publish(c, 1, &p, T0);
	tap_track_publish(c, 1, &p, T0);
	tap_track_ack(c, 1, 1, false, T0 + 100);
	tap_track_ack(c, 1, 2, false, T0 + huge);
	ck_assert_uint_le(tap_track_confirm_quantile(t, 0.5), 100 + 100 / 16);
	ck_assert_uint_eq(tap_track_confirm_quantile(t, 0.99), (uint64_t)huge);
	struct tap_buf b;
	tap_buf_init(&b);
	tap_track_summary(t, &b);
	tap_buf_putc(&b, '\0');
	ck_assert_ptr_nonnull(strstr(b.data, "max=1099511627776"));
	tap_buf_deinit(&b);
}
END_TEST

/* Channels past the channel_max the client's tune-ok set: RabbitMQ counts the channels open, not their numbers, and
 * refuses one more with a connection error. With 100 open the tracker keeps no state for another however many a
 * client names; each publish still gets its record, unknown with reason channel_max, without counting as a memory
 * shortage. A channel numbered 5001 is tracked once one of the 100 has closed (before: any number above 100 was
 * refused, and a publish the broker acked on channel 5000 was written unknown). */
START_TEST(channels_beyond_channel_max_keep_no_state)
{
	tap_track_conn_tune(c, 100, 131072, 0);
	for (unsigned ch = 1; ch <= 100; ch++)
		confirm_channel((uint16_t)ch);
	struct tap_track_stats before = stats();
	struct tap_publish p = pub("x", "k", true);
	for (unsigned ch = 101; ch <= 5000; ch++) {
		tap_track_channel_open(c, (uint16_t)ch, T0);
		tap_track_confirm_select(c, (uint16_t)ch, T0);
		tap_track_publish(c, (uint16_t)ch, &p, T0 + 1);
	}
	struct tap_track_stats after = stats();
	ck_assert_uint_eq(n_seen, 5000 - 100);
	assert_verdict(verdict(0), UNKNOWN, CONFIRM_UNKNOWN, NO_ORDER);
	ck_assert_str_eq(verdict(0)->reason_by, "channel_max");
	ck_assert_uint_eq(after.oom, before.oom);
	ck_assert_uint_lt(after.memory_peak, before.memory_peak + 64 * 1024);
	tap_track_publish(c, 100, &p, T0 + 2); /* the open ones are tracked */
	tap_track_ack(c, 100, 1, false, T0 + 3);
	tap_track_channel_close(c, 1, TAP_BY_CLIENT, 200, S("bye"), T0 + 4);
	tap_track_channel_close_ok(c, 1, T0 + 5);
	confirm_channel(5001);
	tap_track_publish(c, 5001, &p, T0 + 6);
	tap_track_ack(c, 5001, 1, false, T0 + 7);
	tap_track_tick(t, T0 + 10000000);
	assert_verdict(verdict(n_seen - 2), ROUTED, ACK, NO_ORDER);
	assert_verdict(verdict(n_seen - 1), ROUTED, ACK, NO_ORDER);
}
END_TEST

/* RabbitMQ reads nothing of a blocked connection (PROTOCOL §6): a non-confirm mandatory publish's return window
 * and a plain publish's hold do not run out while it is blocked, however long the alarm; they run again from
 * connection.unblocked, so a Return or a refusing close that follows the alarm still finds its publish. The
 * publish that made the broker block the connection (it came before connection.blocked) is flagged too. */
START_TEST(blocked_connection_pauses_the_windows)
{
	tap_track_channel_open(c, 1, T0);
	struct tap_publish m = pub("x", "gone", true);
	struct tap_publish p = pub("x", "k", false);
	tap_track_publish(c, 1, &m, T0 + 1); /* the trigger */
	tap_track_conn_blocked(c, true, S("low on memory"), T0 + 10);
	tap_track_publish(c, 1, &p, T0 + 20);
	tap_track_tick(t, T0 + 20 * TAP_TRACK_RETURN_WINDOW_US_DEFAULT);
	ck_assert_uint_eq(n_seen, 0);
	int64_t unblocked = T0 + 30 * TAP_TRACK_RETURN_WINDOW_US_DEFAULT;
	tap_track_conn_blocked(c, false, S(""), unblocked);
	struct tap_return r = ret("x", "gone");
	tap_track_return(c, 1, &r, unblocked + 100);
	ck_assert_uint_eq(n_seen, 1);
	assert_verdict(verdict(0), RETURNED, NONE, NO_ORDER);
	assert_field(nth("publish", 0), "blocked", "true");
	ck_assert_int_eq(tap_track_tick(t, unblocked + 200), unblocked + TAP_TRACK_LATE_RETURN_US_DEFAULT);
	tap_track_tick(t, unblocked + TAP_TRACK_LATE_RETURN_US_DEFAULT);
	ck_assert_uint_eq(n_seen, 2);
	assert_verdict(verdict(1), UNPROVEN, NONE, NO_ORDER);
	assert_field(nth("publish", 1), "blocked", "true");
}
END_TEST

/* The tap stopped reading the broker (a client that reads slowly holds its side back): a Return may wait unread in
 * the tap's socket, so no window runs out while held, an acked publish's late-return hold included; each runs
 * again in full from the end of the hold. */
START_TEST(held_broker_side_pauses_every_window)
{
	tap_track_channel_open(c, 1, T0);
	confirm_channel(2);
	struct tap_publish m = pub("x", "gone", true);
	tap_track_publish(c, 1, &m, T0 + 1);
	tap_track_publish(c, 2, &m, T0 + 2);
	tap_track_ack(c, 2, 1, false, T0 + 3);
	tap_track_conn_held(c, true, T0 + 10);
	tap_track_tick(t, T0 + 20 * TAP_TRACK_RETURN_WINDOW_US_DEFAULT);
	ck_assert_uint_eq(n_seen, 0);
	int64_t unheld = T0 + 30 * TAP_TRACK_RETURN_WINDOW_US_DEFAULT;
	tap_track_conn_held(c, false, unheld);
	tap_track_tick(t, unheld + TAP_TRACK_LATE_RETURN_US_DEFAULT - 1);
	ck_assert_uint_eq(n_seen, 0);
	tap_track_tick(t, unheld + TAP_TRACK_LATE_RETURN_US_DEFAULT);
	ck_assert_uint_eq(n_seen, 1);
	assert_verdict(verdict(0), ROUTED, ACK, NO_ORDER);
	struct tap_return r = ret("x", "gone");
	tap_track_return(c, 1, &r, unheld + TAP_TRACK_RETURN_WINDOW_US_DEFAULT - 1); /* still in its window */
	ck_assert_uint_eq(n_seen, 2);
	assert_verdict(verdict(1), RETURNED, NONE, NO_ORDER);
}
END_TEST

/* A client that opens a channel again before the broker's close-ok to its channel.close: the acks the broker still
 * sends are for the old channel's publishes, never for the new channel's (RabbitMQ then ends the connection, 504
 * "second 'channel.open' seen"); the broker's close-ok ends the old channel, and the new one's publish ends with
 * the broker's connection.close, unanswered. */
START_TEST(reopen_before_close_ok_keeps_the_answers_apart)
{
	confirm_channel(1);
	struct tap_publish m = pub("x", "k", true);
	tap_track_publish(c, 1, &m, T0 + 1);
	tap_track_publish(c, 1, &m, T0 + 2);
	tap_track_channel_close(c, 1, TAP_BY_CLIENT, 200, S("bye"), T0 + 3);
	tap_track_channel_open(c, 1, T0 + 4);
	tap_track_confirm_select(c, 1, T0 + 5);
	tap_track_publish(c, 1, &m, T0 + 6);
	tap_track_ack(c, 1, 2, true, T0 + 7); /* the old channel's two */
	tap_track_channel_close_ok(c, 1, T0 + 8);
	tap_track_tick(t, T0 + 8 + TAP_TRACK_LATE_RETURN_US_DEFAULT);
	ck_assert_uint_eq(n_seen, 2);
	assert_verdict(verdict(0), ROUTED, ACK, NO_ORDER);
	assert_verdict(verdict(1), ROUTED, ACK, NO_ORDER);
	tap_track_conn_close(c, TAP_BY_BROKER, 504, S("CHANNEL_ERROR - second 'channel.open' seen"), T0 + 9);
	tap_track_conn_end(c, "broker_eof", T0 + 10);
	c = NULL;
	ck_assert_uint_eq(n_seen, 3);
	ck_assert_int_eq(verdict(2)->v.route, UNKNOWN);
	ck_assert_int_ne(verdict(2)->v.confirm, ACK);
	ck_assert_str_eq(verdict(2)->reason_by, "broker");
	ck_assert_uint_eq(verdict(2)->v.reason_code, 504);
}
END_TEST

/* The same client, had the broker finished the close before the new open came: its open-ok ends the old channel
 * (nothing more comes for it) and the acks after it are the new channel's. */
START_TEST(reopen_taken_by_the_broker)
{
	confirm_channel(1);
	struct tap_publish m = pub("x", "k", true);
	tap_track_publish(c, 1, &m, T0 + 1);
	tap_track_channel_close(c, 1, TAP_BY_CLIENT, 200, S("bye"), T0 + 2);
	tap_track_channel_open(c, 1, T0 + 3);
	tap_track_confirm_select(c, 1, T0 + 4);
	tap_track_publish(c, 1, &m, T0 + 5);
	tap_track_channel_open_ok(c, 1, T0 + 6); /* no close-ok seen: the old publish was never answered */
	ck_assert_uint_eq(n_seen, 1);
	ck_assert_int_eq(verdict(0)->v.route, UNKNOWN);
	tap_track_ack(c, 1, 1, false, T0 + 7);
	tap_track_tick(t, T0 + 7 + TAP_TRACK_LATE_RETURN_US_DEFAULT);
	ck_assert_uint_eq(n_seen, 2);
	assert_verdict(verdict(1), ROUTED, ACK, NO_ORDER);
}
END_TEST

START_TEST(blocked_and_unblocked)
{
	tap_track_conn_blocked(c, true, S("low on memory"), T0 + 10);
	tap_track_conn_blocked(c, false, S(""), T0 + 510);
	assert_field(nth("blocked", 0), "reason", "\"low on memory\"");
	assert_field(nth("unblocked", 0), "blocked_us", "500");
	assert_field(nth("unblocked", 0), "conn", "3");
}
END_TEST

START_TEST(summary_and_latency)
{
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", false);
	for (int i = 0; i < 100; i++)
		tap_track_publish(c, 1, &p, T0);
	for (int i = 1; i <= 100; i++)
		tap_track_ack(c, 1, (uint64_t)i, false, T0 + i * 10);
	uint64_t p50 = tap_track_confirm_quantile(t, 0.5);
	ck_assert_uint_ge(p50, 500 - 500 / 16);
	ck_assert_uint_le(p50, 500 + 500 / 16);
	ck_assert_uint_eq(tap_track_confirm_quantile(t, 1.0), 1000);
	struct tap_buf b;
	tap_buf_init(&b);
	tap_track_summary(t, &b);
	tap_buf_putc(&b, '\0');
	ck_assert_ptr_nonnull(strstr(b.data, "conn 3 127.0.0.1:51234"));
	ck_assert_ptr_nonnull(strstr(b.data, "publishes=100 routed=0 returned=0 unproven=100 unknown=0 acked=100"));
	ck_assert_ptr_nonnull(strstr(b.data, "max=1000"));
	tap_buf_deinit(&b);
}
END_TEST

/* How many lines of text begin with prefix. */
static size_t count_lines_starting(const char *text, const char *prefix)
{
	size_t n = 0, len = strlen(prefix);
	for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL)
		n += strncmp(l, prefix, len) == 0;
	return n;
}

/* The summary names the connections with the most publishes waiting (ties: the older first), at most
 * TAP_TRACK_SUMMARY_CONNS of them, says how many it left out, and counts them all in the total. */
START_TEST(summary_names_the_busiest_connections)
{
	enum { EXTRA = 2 * TAP_TRACK_SUMMARY_CONNS };
	struct tap_publish p = pub("x", "k", false);
	for (int i = 0; i < EXTRA; i++) { /* ids 100..139, i / 2 publishes waiting */
		struct tap_track_conn *k = tap_track_conn_new(t, 100 + (uint64_t)i, "127.0.0.1:2", "127.0.0.1:5672", T0);
		ck_assert_ptr_nonnull(k);
		tap_track_conn_open(k, S("/"), T0);
		tap_track_channel_open(k, 1, T0);
		tap_track_confirm_select(k, 1, T0);
		for (int n = 0; n < i / 2; n++)
			tap_track_publish(k, 1, &p, T0 + 1);
	}
	struct tap_buf b;
	tap_buf_init(&b);
	tap_track_summary(t, &b);
	tap_buf_putc(&b, '\0');
	ck_assert_int_eq((int)count_lines_starting(b.data, "conn "), TAP_TRACK_SUMMARY_CONNS);
	char name[64];
	for (int i = 0; i < EXTRA; i++) { /* the top half by publishes waiting: 120..139 */
		snprintf(name, sizeof name, "\nconn %d 127.0.0.1:2 outstanding=%d ", 100 + i, i / 2);
		if (i >= EXTRA / 2)
			ck_assert_msg(strstr(b.data, name) != NULL, "missing%s", name);
		else
			ck_assert_msg(strstr(b.data, name) == NULL, "listed%s", name);
	}
	const char *c138 = strstr(b.data, "\nconn 138 "), *c139 = strstr(b.data, "\nconn 139 ");
	const char *c136 = strstr(b.data, "\nconn 136 ");
	ck_assert(c138 && c139 && c136 && c138 < c139 && c139 < c136); /* most waiting first, then by age */
	snprintf(name, sizeof name, "\nand %d more connections (in the total below)\n",
	         EXTRA + 1 - TAP_TRACK_SUMMARY_CONNS);
	ck_assert_msg(strstr(b.data, name) != NULL, "%s", b.data);
	ck_assert_ptr_nonnull(strstr(b.data, "\ntotal outstanding=380 publishes=380 ")); /* 2 x (0 + 1 + ... + 19) */
	tap_buf_deinit(&b);
}
END_TEST

START_TEST(every_record_has_type_and_ts)
{
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", true);
	tap_track_publish(c, 1, &p, T0);
	struct tap_return r = ret("y", "k");
	tap_track_return(c, 1, &r, T0);
	tap_track_conn_blocked(c, true, S("disk"), T0);
	tap_track_shutdown(t, T0 + 1);
	c = NULL;
	ck_assert_uint_eq(stats().records, n_recs);
	for (size_t i = 0; i < n_recs; i++) {
		ck_assert_msg(valid_json_object(recs[i]), "bad json %s", recs[i]);
		ck_assert_ptr_nonnull(get(recs[i], "type"));
		ck_assert_ptr_nonnull(get(recs[i], "ts"));
	}
}
END_TEST

/* ---- bounds: header keys, JSON validity, the memory budget ---- */

/* A JSON string at p (strictly: every escape complete, every byte >= 0x80 part of valid UTF-8); returns its end
 * or NULL. */
static const char *strict_string(const char *p)
{
	if (*p++ != '"')
		return NULL;
	while (*p != '"') {
		unsigned char ch = (unsigned char)*p;
		if (ch == '\0' || ch < 0x20)
			return NULL;
		if (ch == '\\') {
			p++;
			if (*p == 'u') {
				for (int i = 1; i <= 4; i++)
					if (!strchr("0123456789abcdefABCDEF", p[i]) || !p[i])
						return NULL;
				p += 5;
			} else if (*p && strchr("\"\\/bfnrt", *p)) {
				p++;
			} else {
				return NULL;
			}
			continue;
		}
		size_t n = ch < 0x80 ? 1 : ch >= 0xC2 && ch <= 0xDF ? 2 : ch >= 0xE0 && ch <= 0xEF ? 3 : ch >= 0xF0 && ch <= 0xF4 ? 4 : 0;
		if (!n)
			return NULL;
		for (size_t i = 1; i < n; i++)
			if (((unsigned char)p[i] & 0xC0) != 0x80)
				return NULL;
		p += n;
	}
	return p + 1;
}

/* The elements of the "headers" array of rec, checked strictly; returns how many, and the bytes between the
 * brackets in *inner. */
static size_t header_array(const char *rec, size_t *inner)
{
	const char *a = get(rec, "headers");
	ck_assert_ptr_nonnull(a);
	ck_assert_int_eq(a[0], '[');
	const char *p = a + 1;
	size_t n = 0;
	while (*p != ']') {
		if (n)
			ck_assert_msg(*p++ == ',', "no comma in %s", a);
		const char *e = strict_string(p);
		ck_assert_msg(e != NULL, "element %zu is no JSON string: %s", n, p);
		p = e;
		n++;
	}
	*inner = (size_t)(p - a - 1);
	return n;
}

START_TEST(header_keys_capped_in_number)
{
	confirm_channel(1);
	struct tap_slice keys[40];
	char names[40][8];
	for (int i = 0; i < 40; i++) {
		snprintf(names[i], sizeof names[i], "k%02d", i);
		keys[i] = S(names[i]);
	}
	struct tap_publish p = pub("x", "k", false);
	p.header_keys = keys;
	p.n_header_keys = TAP_TRACK_HEADER_KEYS_MAX;
	tap_track_publish(c, 1, &p, T0);
	p.n_header_keys = 40;
	tap_track_publish(c, 1, &p, T0);
	tap_track_ack(c, 1, 2, true, T0 + 1);
	size_t inner;
	ck_assert_uint_eq(header_array(pub_seq(1), &inner), TAP_TRACK_HEADER_KEYS_MAX);
	ck_assert_ptr_null(get(pub_seq(1), "headers_truncated"));
	ck_assert_uint_eq(header_array(pub_seq(2), &inner), TAP_TRACK_HEADER_KEYS_MAX);
	assert_field(pub_seq(2), "headers_truncated", "true");
	ck_assert_uint_eq(stats().headers_truncated, 1);
}
END_TEST

/* 64 keys of 250 x 0x01 (6 bytes each escaped), bytes that are no UTF-8, and two-byte characters around the cut:
 * the array stops at TAP_TRACK_HEADER_BYTES_MAX on a character boundary, marked, and the record parses. */
START_TEST(header_keys_capped_in_bytes_on_character_boundaries)
{
	confirm_channel(1);
	static uint8_t ctl[250], bad[250], utf8[250];
	memset(ctl, 0x01, sizeof ctl);
	for (size_t i = 0; i < sizeof bad; i++)
		bad[i] = (uint8_t)(0x80 + i % 0x7f); /* continuation bytes and leads without their tails */
	for (size_t i = 0; i + 1 < sizeof utf8; i += 2) {
		utf8[i] = 0xC3; /* é */
		utf8[i + 1] = 0xA9;
	}
	struct tap_slice hostile[64], bytes[3], chars[8];
	for (int i = 0; i < 64; i++)
		hostile[i] = (struct tap_slice){ctl, sizeof ctl};
	for (int i = 0; i < 3; i++)
		bytes[i] = (struct tap_slice){bad, sizeof bad - (size_t)i};
	for (int i = 0; i < 8; i++) /* 2 + 250 + 1 each: the cut lands inside the fifth, at an odd offset */
		chars[i] = (struct tap_slice){utf8, sizeof utf8 - (i == 4 ? 1 : 0)};
	struct tap_slice *sets[] = {hostile, bytes, chars};
	size_t sizes[] = {64, 3, 8};
	struct tap_publish p = pub("x", "k", true);
	for (int k = 0; k < 3; k++) {
		p.header_keys = sets[k];
		p.n_header_keys = sizes[k];
		tap_track_publish(c, 1, &p, T0);
	}
	tap_track_ack(c, 1, 3, true, T0 + 1);
	tap_track_tick(t, T0 + 1 + TAP_TRACK_LATE_RETURN_US_DEFAULT);
	ck_assert_uint_eq(n_seen, 3);
	for (uint64_t seq = 1; seq <= 3; seq++) {
		const char *r = pub_seq(seq);
		ck_assert(valid_json_object(r));
		size_t inner, n = header_array(r, &inner);
		ck_assert_uint_ge(n, 1);
		ck_assert_uint_le(inner, TAP_TRACK_HEADER_BYTES_MAX);
		ck_assert_uint_gt(inner, TAP_TRACK_HEADER_BYTES_MAX - 8); /* filled up to the last whole character */
		assert_field(r, "headers_truncated", "true");
		ck_assert_uint_lt(strlen(r), 2048);
	}
	/* the first key of 0x01 bytes alone is 1,502 bytes escaped: it is kept up to its 170th byte */
	const char *h = get(pub_seq(1), "headers");
	ck_assert_uint_eq(strlen(h), 2 + 2 + 170 * 6);
	ck_assert_uint_eq(stats().headers_truncated, 3);
}
END_TEST

/* A confirm client that never reads its acks: past the budget the oldest publishes are written unknown/evicted,
 * the tracker's memory never exceeds the budget, every publish gets exactly one record (the acks that come at
 * last find the evicted ones gone), and the memory is given back when they are answered. */
START_TEST(memory_budget_evicts_the_oldest)
{
	enum { BUDGET = 256 * 1024, N = 20000 };
	struct tap_track_conf conf = {.max_memory = BUDGET};
	teardown();
	setup_conf(&conf);
	confirm_channel(1);
	uint64_t base = stats().memory;
	ck_assert_uint_lt(base, 16384);
	char mid[32], key[96];
	struct tap_slice hk = {(const uint8_t *)key, 0};
	struct tap_publish p = pub("x", "k", true);
	p.has_message_id = true;
	p.header_keys = &hk;
	p.n_header_keys = 1;
	uint64_t peak = 0;
	for (int i = 1; i <= N; i++) {
		snprintf(mid, sizeof mid, "m%d", i);
		hk.len = (size_t)snprintf(key, sizeof key, "x-unique-header-key-%d-%040d", i, i); /* no sharing */
		p.message_id = S(mid);
		tap_track_publish(c, 1, &p, T0 + i);
		uint64_t m = stats().memory;
		peak = m > peak ? m : peak;
		REQUIRE(m <= BUDGET, "publish %d: %llu bytes over the budget", i, (unsigned long long)m);
	}
	struct tap_track_stats s = stats();
	ck_assert_uint_gt(peak, BUDGET - BUDGET / 8); /* it did fill the budget */
	ck_assert_uint_gt(s.evicted_memory, N / 2);
	ck_assert_uint_eq(s.evicted, s.evicted_memory);
	ck_assert_uint_eq(s.memory_peak, peak);
	ck_assert_uint_eq(n_seen, s.evicted_memory);
	for (size_t i = 0; i < n_seen; i++) { /* the oldest went first, in order */
		REQUIRE(seen[i].v.seq == i + 1, "eviction %zu took seq %llu", i, (unsigned long long)seen[i].v.seq);
		REQUIRE(seen[i].v.route == UNKNOWN && seen[i].v.confirm == CONFIRM_UNKNOWN, "verdict of %zu", i);
		REQUIRE(!strcmp(seen[i].reason_by, "evicted") && !strcmp(seen[i].reason_text, "max-tracking-memory"),
		        "reason of %zu", i);
	}
	assert_field(pub_seq(1), "reason", "{\"by\":\"evicted\",\"text\":\"max-tracking-memory\"}");
	tap_track_ack(c, 1, N, true, T0 + N + 1);
	tap_track_tick(t, T0 + N + 1 + TAP_TRACK_LATE_RETURN_US_DEFAULT);
	s = stats();
	ck_assert_uint_eq(s.publish_records, N);
	ck_assert_uint_eq(s.outstanding, 0);
	ck_assert_uint_eq(n_seen, N);
	ck_assert_uint_eq(s.routed, N - s.evicted_memory);
	/* rings, arena and strings given back; the window of recent message ids (duplicate_message_id) stays */
	ck_assert_uint_lt(s.memory, base + 8192 + TAP_TRACK_RECENT_IDS * 16 + 256);
}
END_TEST

START_TEST(memory_budget_evicts_across_connections)
{
	enum { BUDGET = 128 * 1024 };
	struct tap_track_conf conf = {.max_memory = BUDGET};
	teardown();
	setup_conf(&conf);
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", false);
	for (int i = 0; i < 100; i++)
		tap_track_publish(c, 1, &p, T0 + i); /* older, on conn 3 */
	struct tap_track_conn *c2 = tap_track_conn_new(t, 4, "127.0.0.1:2", "127.0.0.1:5672", T0);
	tap_track_channel_open(c2, 1, T0);
	tap_track_confirm_select(c2, 1, T0);
	char mid[32];
	p.has_message_id = true;
	for (int i = 0; i < 5000 && stats().evicted_memory < 150; i++) {
		snprintf(mid, sizeof mid, "%d", i);
		struct tap_publish q = pub(mid, mid, false);
		tap_track_publish(c2, 1, &q, T0 + 1000 + i);
	}
	ck_assert_uint_ge(stats().evicted_memory, 150);
	for (size_t i = 0; i < 100; i++) /* conn 3's first: they are the oldest */
		ck_assert_uint_eq(verdict(i)->v.conn, 3);
	ck_assert_uint_eq(verdict(100)->v.conn, 4);
	ck_assert_uint_le(stats().memory, BUDGET);
}
END_TEST

static uint64_t rng_state;
static uint32_t rnd(uint32_t n)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state % n);
}

/* Fifty connections, two channels each, publishing in a random order and acking some: whatever the budget evicts
 * goes in publish order (the oldest outstanding publish of the process first). */
/* Many connections, each holding one acked mandatory publish for a late Return, acked in an order unlike the
 * order the connections were opened in: a tick writes exactly the publishes whose hold has ended, in the order
 * their holds end, and returns the next end (the tracker finds the due connections by deadline). */
START_TEST(ticks_write_due_holds_in_deadline_order_across_connections)
{
	enum { CONNS = 300, STEP = 10 };
	struct tap_track_conn *cs[CONNS];
	int order[CONNS]; /* order[j]: the connection acked j-th */
	for (int i = 0; i < CONNS; i++) {
		cs[i] = tap_track_conn_new(t, 100 + (uint64_t)i, "c", "u", T0);
		tap_track_channel_open(cs[i], 1, T0);
		tap_track_confirm_select(cs[i], 1, T0);
		struct tap_publish p = pub("x", "k", true);
		tap_track_publish(cs[i], 1, &p, T0 + 1);
		order[i] = i;
	}
	rng_state = 777;
	for (int i = CONNS - 1; i > 0; i--) {
		int k = (int)rnd((uint64_t)i + 1), x = order[i];
		order[i] = order[k];
		order[k] = x;
	}
	for (int j = 0; j < CONNS; j++)
		tap_track_ack(cs[order[j]], 1, 1, false, T0 + 100 + (int64_t)j * STEP); /* held until + LATE */
	ck_assert_uint_eq(stats().held, CONNS);
	const int64_t end0 = T0 + 100 + TAP_TRACK_LATE_RETURN_US_DEFAULT; /* the first hold's end */
	ck_assert_int_eq(tap_track_tick(t, end0 - 1), end0);
	ck_assert_uint_eq(n_seen, 0);
	/* one tick per hold's end for the first half, then one tick for the rest: the same order either way */
	for (int j = 0; j < CONNS / 2; j++) {
		int64_t next = tap_track_tick(t, end0 + (int64_t)j * STEP);
		REQUIRE(n_seen == (size_t)j + 1, "tick %d wrote %zu verdicts", j, n_seen);
		REQUIRE(next == end0 + (int64_t)(j + 1) * STEP, "tick %d: next deadline %lld", j, (long long)next);
	}
	ck_assert_int_eq(tap_track_tick(t, end0 + CONNS * STEP), INT64_MAX);
	ck_assert_uint_eq(n_seen, CONNS);
	for (int j = 0; j < CONNS; j++) {
		REQUIRE(seen[j].v.conn == 100 + (uint64_t)order[j], "verdict %d is of conn %llu, not %d", j,
		        (unsigned long long)seen[j].v.conn, 100 + order[j]);
		REQUIRE(seen[j].v.route == ROUTED && seen[j].v.confirm == ACK, "verdict %d", j);
	}
	ck_assert_uint_eq(stats().held, 0);
}
END_TEST

START_TEST(memory_budget_evicts_in_publish_order_across_many_connections)
{
	enum { BUDGET = 2 * 1024 * 1024, CONNS = 50 };
	struct tap_track_conf conf = {.max_memory = BUDGET};
	teardown();
	setup_conf(&conf);
	struct tap_track_conn *cs[CONNS];
	uint64_t seqs[CONNS][3] = {{0}};
	for (int i = 0; i < CONNS; i++) {
		cs[i] = tap_track_conn_new(t, 100 + (uint64_t)i, "c", "u", T0);
		tap_track_channel_open(cs[i], 1, T0);
		tap_track_confirm_select(cs[i], 1, T0);
		tap_track_channel_open(cs[i], 2, T0);
		tap_track_confirm_select(cs[i], 2, T0);
	}
	rng_state = 12345;
	char key[48];
	struct tap_slice hk = {(const uint8_t *)key, 0};
	for (int i = 0; i < 20000; i++) {
		int k = (int)rnd(CONNS);
		uint16_t ch = (uint16_t)(1 + rnd(2));
		struct tap_publish p = pub("x", "k", false);
		hk.len = (size_t)snprintf(key, sizeof key, "unique-%d", i);
		p.header_keys = &hk;
		p.n_header_keys = 1;
		tap_track_publish(cs[k], ch, &p, T0 + i);
		seqs[k][ch]++;
		if (rnd(8) == 0 && seqs[k][ch] > 200)
			tap_track_ack(cs[k], ch, seqs[k][ch] - 200, true, T0 + i);
		REQUIRE(stats().memory <= BUDGET, "publish %d: %llu bytes", i, (unsigned long long)stats().memory);
	}
	struct tap_track_stats s = stats();
	ck_assert_uint_gt(s.evicted_memory, 1000);
	int64_t last = 0;
	size_t n = 0;
	for (size_t i = 0; i < n_seen; i++) {
		if (strcmp(seen[i].reason_text, "max-tracking-memory") != 0)
			continue;
		REQUIRE(seen[i].v.t_pub >= last, "eviction %zu of a publish at %lld after one at %lld", i,
		        (long long)seen[i].v.t_pub, (long long)last);
		last = seen[i].v.t_pub;
		n++;
	}
	ck_assert_uint_eq(n, s.evicted_memory);
	tap_track_shutdown(t, T0 + 30000);
	c = NULL;
	ck_assert_uint_eq(stats().publish_records, 20000);
}
END_TEST

/* A burst of non-confirm mandatory publishes held for their return window: once their records are written, the
 * channel's ring, arena and queues and the connection's strings are given back. */
START_TEST(memory_given_back_after_a_burst)
{
	tap_track_channel_open(c, 1, T0);
	uint64_t base = stats().memory;
	char key[40];
	struct tap_slice hk = {(const uint8_t *)key, 0};
	for (int i = 0; i < 6000; i++) {
		struct tap_publish p = pub("x", "k", true);
		hk.len = (size_t)snprintf(key, sizeof key, "h%d", i);
		p.header_keys = &hk;
		p.n_header_keys = 1;
		tap_track_publish(c, 1, &p, T0 + i);
	}
	uint64_t full = stats().memory;
	ck_assert_uint_gt(full, base + 6000 * 64);
	ck_assert_uint_lt(full, base + 6000 * 300);
	tap_track_tick(t, T0 + 3000 + TAP_TRACK_RETURN_WINDOW_US_DEFAULT); /* the first half */
	ck_assert_uint_lt(stats().memory, full);
	tap_track_tick(t, T0 + 6000 + TAP_TRACK_RETURN_WINDOW_US_DEFAULT);
	ck_assert_uint_eq(stats().outstanding, 0);
	ck_assert_uint_eq(n_seen, 6000);
	ck_assert_uint_lt(stats().memory, base + 8192);
}
END_TEST

/* A peak of connections, each with a publish outstanding (so in the timer heap and in the heap of channels by oldest
 * publish), then all of them gone: the heaps' arrays shrink with them and the memory comes back. */
START_TEST(memory_given_back_after_a_peak_of_connections)
{
	enum { CONNS = 4000 };
	static struct tap_track_conn *cs[CONNS];
	uint64_t base = stats().memory;
	for (int i = 0; i < CONNS; i++) {
		cs[i] = tap_track_conn_new(t, 100 + (uint64_t)i, "c", "u", T0);
		REQUIRE(cs[i], "connection %d", i);
		tap_track_channel_open(cs[i], 1, T0);
		struct tap_publish p = pub("x", "k", true);
		tap_track_publish(cs[i], 1, &p, T0 + 1);
	}
	uint64_t peak = stats().memory;
	ck_assert_uint_gt(peak, base + CONNS * 2 * 16); /* both heaps hold every connection */
	for (int i = 0; i < CONNS; i++)
		tap_track_conn_end(cs[i], "client_reset", T0 + 2);
	ck_assert_uint_eq(n_seen, CONNS);
	ck_assert_uint_eq(stats().connections_open, 1);
	/* what is left of the heaps: at most 4 x 16 entries each, where the peak had 4,096 each (128 KiB) */
	ck_assert_uint_lt(stats().memory, base + 2 * 64 * 16 + 8192);
	/* and they grow again: a timer and an outstanding publish on a new connection */
	struct tap_track_conn *d = tap_track_conn_new(t, 99, "c", "u", T0 + 3);
	ck_assert_ptr_nonnull(d);
	tap_track_channel_open(d, 1, T0 + 3);
	struct tap_publish p = pub("x", "k", true);
	tap_track_publish(d, 1, &p, T0 + 3);
	tap_track_tick(t, T0 + 3 + TAP_TRACK_RETURN_WINDOW_US_DEFAULT);
	ck_assert_uint_eq(n_seen, CONNS + 1);
}
END_TEST

/* ---- randomized property: one publish record per publish, whatever happens ---- */


static const char *const route_json[] = {"\"routed\"", "\"returned\"", "\"unproven\"", "\"unknown\""};
static const char *const confirm_json[] = {"\"ack\"", "\"nack\"", "\"none\"", "\"unknown\""};
static const char *const order_json[] = {"null", "\"return_before_ack\"", "\"ack_before_return\""};

/* The hook saw one verdict per publish record, in record order, and the same one. */
static void check_hook_matches_records(uint64_t published)
{
	REQUIRE(n_seen == published, "%zu verdicts for %llu publishes", n_seen, (unsigned long long)published);
	size_t k = 0;
	for (size_t i = 0; i < n_recs; i++) {
		if (!is_type(recs[i], "publish"))
			continue;
		const struct seen *v = &seen[k++];
		char want[80];
		REQUIRE(!strcmp(get(recs[i], "route"), route_json[v->v.route]), "route of %s", recs[i]);
		REQUIRE(!strcmp(get(recs[i], "confirm"), confirm_json[v->v.confirm]), "confirm of %s", recs[i]);
		REQUIRE(!strcmp(get(recs[i], "order"), order_json[v->v.order]), "order of %s", recs[i]);
		snprintf(want, sizeof want, "\"%s\"", v->message_id);
		REQUIRE(!strcmp(get(recs[i], "message_id"), want), "message_id of %s", recs[i]);
		snprintf(want, sizeof want, "%u", v->v.channel);
		REQUIRE(!strcmp(get(recs[i], "channel"), want), "channel of %s", recs[i]);
		if (v->v.has_seq)
			snprintf(want, sizeof want, "%llu", (unsigned long long)v->v.seq);
		else
			snprintf(want, sizeof want, "null");
		REQUIRE(!strcmp(get(recs[i], "seq"), want), "seq of %s", recs[i]);
		REQUIRE((get(recs[i], "reason") != NULL) == (v->v.reason_by != NULL), "reason of %s", recs[i]);
	}
}

START_TEST(random_interleavings)
{
	static const char *const rks[] = {"a", "b", "c"};
	struct tap_track_stats sum = {0};
	for (int round = 0; round < 40; round++) {
		rng_state = 0x9E3779B97F4A7C15ull + (uint64_t)round * 7919;
		struct tap_track_conf conf = {.return_window_us = 1 + rnd(3000),
		                              .late_return_us = 1 + rnd(200),
		                              .max_outstanding = round % 3 == 0 ? 1 + rnd(40) : 0};
		teardown();
		setup_conf(&conf);
		struct tap_track_conn *conns[2] = {c, tap_track_conn_new(t, 4, "b", "u", T0)};
		uint64_t seq[2][4] = {{0}};
		uint64_t published = 0;
		int64_t now = T0;
		for (int step = 0; step < 3000; step++) {
			int ci = (int)rnd(2);
			struct tap_track_conn *cc = conns[ci];
			if (!cc) {
				conns[ci] = tap_track_conn_new(t, 10 + (uint64_t)step, "n", "u", now);
				memset(seq[ci], 0, sizeof seq[ci]);
				continue;
			}
			uint16_t ch = (uint16_t)(1 + rnd(3));
			now += rnd(50);
			uint32_t op = rnd(100);
			if (op < 40) {
				char mid[32];
				snprintf(mid, sizeof mid, "m%llu", (unsigned long long)published++);
				struct tap_publish p = pub("x", rks[rnd(3)], rnd(2));
				p.body_size = rnd(3);
				p.has_message_id = true;
				p.message_id = S(mid);
				tap_track_publish(cc, ch, &p, now);
				seq[ci][ch]++;
			} else if (op < 60) {
				uint64_t tag = seq[ci][ch] ? 1 + rnd((uint32_t)seq[ci][ch] + 2) : rnd(3);
				bool nack = rnd(8) == 0, multiple = rnd(3) == 0;
				if (nack)
					tap_track_nack(cc, ch, tag, multiple, now);
				else
					tap_track_ack(cc, ch, tag, multiple, now);
			} else if (op < 72) {
				struct tap_return r = ret("x", rks[rnd(3)]);
				r.body_size = rnd(3);
				tap_track_return(cc, ch, &r, now);
			} else if (op < 76) {
				tap_track_channel_close(cc, ch, rnd(2) ? TAP_BY_BROKER : TAP_BY_CLIENT, 404, S("NOT_FOUND"), now);
			} else if (op < 80) {
				tap_track_channel_close_ok(cc, ch, now);
			} else if (op < 84) {
				tap_track_channel_open(cc, ch, now);
				seq[ci][ch] = 0;
			} else if (op < 89) {
				tap_track_confirm_select(cc, ch, now);
			} else if (op < 90) {
				tap_track_tx_select(cc, ch, now);
			} else if (op < 98) {
				tap_track_tick(t, now);
			} else if (op < 99) {
				tap_track_conn_close(cc, rnd(2) ? TAP_BY_BROKER : TAP_BY_CLIENT, 320, S("forced"), now);
			} else {
				tap_track_conn_end(cc, "reset", now);
				conns[ci] = NULL;
			}
			struct tap_track_stats s = stats();
			REQUIRE(s.publish_records + s.outstanding == s.publishes,
			        "step %d: records + outstanding != publishes", step);
		}
		tap_track_shutdown(t, now + 1);
		c = NULL;
		struct tap_track_stats s = stats();
		ck_assert_uint_eq(s.publishes, published);
		ck_assert_uint_eq(s.publish_records, published);
		ck_assert_uint_eq(s.outstanding, 0);
		ck_assert_uint_eq(s.held, 0);
		ck_assert_uint_eq(s.routed + s.returned + s.unproven + s.unknown, published);
		ck_assert_uint_eq(s.acked + s.nacked + s.confirm_none + s.confirm_unknown, published);
		ck_assert_uint_eq(s.records, n_recs);
		unsigned char *written = calloc(published ? published : 1, 1);
		for (size_t i = 0; i < n_recs; i++) {
			REQUIRE(valid_json_object(recs[i]), "bad json %s", recs[i]);
			if (!is_type(recs[i], "publish"))
				continue;
			const char *m = get(recs[i], "message_id");
			REQUIRE(m, "no message_id in %s", recs[i]);
			unsigned long long k = strtoull(m + 2, NULL, 10);
			REQUIRE(k < published, "bad message_id %s", m);
			REQUIRE(!written[k], "publish m%llu written twice", k);
			written[k] = 1;
		}
		for (uint64_t k = 0; k < published; k++)
			REQUIRE(written[k], "publish m%llu never written", (unsigned long long)k);
		free(written);
		check_hook_matches_records(published);
		sum.routed += s.routed;
		sum.returned += s.returned;
		sum.unproven += s.unproven;
		sum.unknown += s.unknown;
		sum.nacked += s.nacked;
		sum.evicted += s.evicted;
		sum.stray_confirms += s.stray_confirms;
		sum.unmatched_returns += s.unmatched_returns;
		sum.publishes += s.publishes;
	}
	/* the walk reached every kind of ending */
	fprintf(stderr,
	        "random: %llu publishes: routed %llu returned %llu unproven %llu unknown %llu nacked %llu "
	        "evicted %llu stray %llu unmatched %llu\n",
	        (unsigned long long)sum.publishes, (unsigned long long)sum.routed, (unsigned long long)sum.returned,
	        (unsigned long long)sum.unproven, (unsigned long long)sum.unknown, (unsigned long long)sum.nacked,
	        (unsigned long long)sum.evicted, (unsigned long long)sum.stray_confirms,
	        (unsigned long long)sum.unmatched_returns);
	ck_assert_uint_gt(sum.routed, 0);
	ck_assert_uint_gt(sum.returned, 0);
	ck_assert_uint_gt(sum.unproven, 0);
	ck_assert_uint_gt(sum.unknown, 0);
	ck_assert_uint_gt(sum.nacked, 0);
	ck_assert_uint_gt(sum.evicted, 0);
	ck_assert_uint_gt(sum.unmatched_returns, 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("track");
	TCase *tc = tcase_create("core");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, connection_open_record);
	tcase_add_test(tc, routed_after_late_return_window);
	tcase_add_loop_test(tc, publish_caused_close_names_the_culprit, 0, 2);
	tcase_add_loop_test(tc, refused_channel_ended_by_the_clients_connection_close, 0, 2);
	tcase_add_loop_test(tc, close_naming_two_waiting_publishes_names_neither, 0, 2);
	tcase_add_test(tc, publish_caused_close_in_confirm_mode);
	tcase_add_test(tc, publish_caused_close_by_user_id);
	tcase_add_test(tc, publish_caused_close_by_message_size);
	tcase_add_test(tc, publish_caused_close_naming_nothing);
	tcase_add_test(tc, publish_caused_connection_close);
	tcase_add_test(tc, publish_caused_connection_close_by_immediate);
	tcase_add_test(tc, plain_publish_held_ends_unproven);
	tcase_add_test(tc, header_values_written_when_asked);
	tcase_add_test(tc, header_values_never_by_default);
	tcase_add_test(tc, header_values_bounded);
	tcase_add_test(tc, traceparent_written);
	tcase_add_test(tc, traceparent_malformed_ignored_and_counted);
	tcase_add_test(tc, returned_before_ack);
	tcase_add_test(tc, publish_details_lost_are_null);
	tcase_add_test(tc, return_details_lost_ends_the_candidates_unknown);
#ifdef FAIL_ALLOC_WORKS
	tcase_add_test(tc, channel_lost_for_memory_has_an_unknown_mode);
	tcase_add_test(tc, connection_without_memory_is_counted);
	tcase_add_test(tc, connection_details_lost_are_said);
#endif
	tcase_add_test(tc, nacked);
	tcase_add_test(tc, confirm_without_mandatory_warns_once);
	tcase_add_test(tc, multiple_ack_covers_range);
	tcase_add_test(tc, out_of_order_acks);
	tcase_add_test(tc, multiple_ack_spanning_nack);
	tcase_add_test(tc, multiple_tag_zero_means_all);
	tcase_add_test(tc, ack_before_return);
	tcase_add_test(tc, unmatched_return);
	tcase_add_test(tc, return_prefers_the_unacked_and_never_guesses);
	tcase_add_test(tc, return_pairs_earliest_match_with_message_id);
	tcase_add_test(tc, channel_closed_by_broker_404);
	tcase_add_test(tc, channel_close_by_client);
	tcase_add_test(tc, reopened_channel_restarts_at_one);
	tcase_add_test(tc, crossed_closes_keep_the_brokers_reason);
	tcase_add_test(tc, reselect_does_not_reset);
	tcase_add_test(tc, non_confirm_publishes_before_select);
	tcase_add_test(tc, tx_channel);
	tcase_add_test(tc, non_confirm_mandatory_window);
	tcase_add_test(tc, eviction_at_max_outstanding);
	tcase_add_test(tc, clean_close_and_commit_settle_the_return_window);
	tcase_add_test(tc, conn_end_with_outstanding);
	tcase_add_test(tc, conn_end_after_connection_close);
	tcase_add_test(tc, shutdown_writes_everything);
	tcase_add_test(tc, consumer_side_does_not_confuse);
	tcase_add_test(tc, optional_properties_and_escaping);
	tcase_add_test(tc, blocked_and_unblocked);
	tcase_add_test(tc, blocked_connection_pauses_the_windows);
	tcase_add_test(tc, held_broker_side_pauses_every_window);
	tcase_add_test(tc, reopen_before_close_ok_keeps_the_answers_apart);
	tcase_add_test(tc, reopen_taken_by_the_broker);
	tcase_add_test(tc, channels_beyond_channel_max_keep_no_state);
	tcase_add_test(tc, latency_beyond_the_histogram_range);
	tcase_add_test(tc, channels_anywhere_in_the_id_range);
	tcase_add_test(tc, summary_and_latency);
	tcase_add_test(tc, summary_names_the_busiest_connections);
	tcase_add_test(tc, every_record_has_type_and_ts);
	tcase_add_test(tc, header_keys_capped_in_number);
	tcase_add_test(tc, header_keys_capped_in_bytes_on_character_boundaries);
	tcase_add_test(tc, memory_budget_evicts_the_oldest);
	tcase_add_test(tc, memory_budget_evicts_across_connections);
	tcase_add_test(tc, memory_budget_evicts_in_publish_order_across_many_connections);
	tcase_add_test(tc, ticks_write_due_holds_in_deadline_order_across_connections);
	tcase_add_test(tc, memory_given_back_after_a_burst);
	tcase_add_test(tc, memory_given_back_after_a_peak_of_connections);
	tcase_add_test(tc, random_interleavings);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	for (size_t i = 0; i < n_recs; i++)
		free(recs[i]);
	free(recs);
	free(seen);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
