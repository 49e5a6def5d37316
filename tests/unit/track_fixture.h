/* What the tracker's unit suites (test_track_*.c) share: records captured and read back with a minimal JSON reader,
 * the verdicts the tracker's hook saw, and a fixture with one connection open. Each suite is its own program, so
 * every helper is static (inline: a suite that does not use one is not warned about it). */
#ifndef TAP_TRACK_FIXTURE_H
#define TAP_TRACK_FIXTURE_H

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

static inline void capture(void *ctx, const char *json, size_t len)
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

static inline void reset_recs(void)
{
	for (size_t i = 0; i < n_recs; i++)
		free(recs[i]);
	n_recs = 0;
}

static inline const char *skip_ws(const char *p)
{
	while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')
		p++;
	return p;
}

/* Returns the end of the JSON value at p, or NULL when it is malformed. */
static inline const char *skip_value(const char *p)
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

static inline bool valid_json_object(const char *r)
{
	const char *e = skip_value(r);
	return r[0] == '{' && e && *skip_ws(e) == '\0';
}

/* The raw text of member `key` of the top-level object (strings keep their quotes), or NULL. Duplicate keys fail
 * the test. Result is in a rotating static buffer. */
static inline const char *get(const char *rec, const char *key)
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

static inline void assert_field(const char *rec, const char *key, const char *want)
{
	const char *v = get(rec, key);
	ck_assert_msg(v != NULL, "no %s in %s", key, rec);
	ck_assert_msg(!strcmp(v, want), "%s is %s, want %s in %s", key, v, want, rec);
}

static inline bool is_type(const char *rec, const char *type)
{
	char q[64];
	snprintf(q, sizeof q, "\"%s\"", type);
	const char *v = get(rec, "type");
	return v && !strcmp(v, q);
}

static inline size_t count_type(const char *type)
{
	size_t n = 0;
	for (size_t i = 0; i < n_recs; i++)
		n += is_type(recs[i], type);
	return n;
}

/* The k-th (0-based) record of a type, or fails. */
static inline const char *nth(const char *type, size_t k)
{
	for (size_t i = 0; i < n_recs; i++)
		if (is_type(recs[i], type) && k-- == 0)
			return recs[i];
	ck_abort_msg("no record %s #%zu", type, k);
	return NULL;
}

/* Warning records of a rule (the publishes of these tests also trip the rules of missing ids and transient
 * messages, which tests/unit/test_track_warn.c checks). */
static inline size_t count_rule(const char *rule)
{
	char want[64];
	snprintf(want, sizeof want, "\"%s\"", rule);
	size_t n = 0;
	for (size_t i = 0; i < n_recs; i++)
		n += is_type(recs[i], "warning") && !strcmp(get(recs[i], "rule"), want);
	return n;
}

/* The k-th (0-based) warning of a rule, or fails. */
static inline const char *nth_rule(const char *rule, size_t k)
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
static inline const char *pub_seq(uint64_t seq)
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

static inline void copy_slice(char *dst, size_t cap, struct tap_slice s)
{
	size_t n = s.len < cap - 1 ? s.len : cap - 1;
	if (n)
		memcpy(dst, s.ptr, n);
	dst[n] = '\0';
}

static inline void on_verdict(void *ctx, const struct tap_track_verdict *v)
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
static inline const struct seen *verdict(size_t k)
{
	ck_assert_msg(k < n_seen, "no verdict #%zu (%zu seen)", k, n_seen);
	return &seen[k];
}

/* The verdict of channel ch's publish with this confirm seq, or fails. */
static inline const struct seen *verdict_seq(uint16_t ch, uint64_t seq)
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

static inline void assert_verdict(const struct seen *s, enum tap_track_route route, enum tap_track_confirm confirm,
                           enum tap_track_order order)
{
	ck_assert_int_eq(s->v.route, route);
	ck_assert_int_eq(s->v.confirm, confirm);
	ck_assert_int_eq(s->v.order, order);
}

static inline void assert_reason(const struct seen *s, const char *by, int code, const char *text)
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

static inline struct tap_slice S(const char *s) {
	return (struct tap_slice){(const uint8_t *)s, strlen(s)};
}

static inline void
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

static inline void setup(void)
{
	struct tap_track_conf conf = {0};
	setup_conf(&conf);
}

static inline void teardown(void)
{
#ifdef FAIL_ALLOC_WORKS
	fail_alloc = fail_realloc = false; /* a test that failed half-way: not into the next (unforked) */
#endif
	tap_track_free(t);
	t = NULL;
	c = NULL;
	reset_recs();
}

static inline struct tap_publish pub(const char *x, const char *rk, bool mandatory)
{
	return (struct tap_publish){.exchange = S(x), .routing_key = S(rk), .mandatory = mandatory, .body_size = 12};
}

static inline struct tap_publish pub_id(const char *x, const char *rk, bool mandatory, const char *id)
{
	struct tap_publish p = pub(x, rk, mandatory);
	p.message_id = S(id);
	p.has_message_id = true;
	return p;
}

static inline struct tap_return ret(const char *x, const char *rk)
{
	return (struct tap_return){
	    .reply_code = 312, .reply_text = S("NO_ROUTE"), .exchange = S(x), .routing_key = S(rk), .body_size = 12};
}

static inline void confirm_channel(uint16_t ch)
{
	tap_track_channel_open(c, ch, T0);
	tap_track_confirm_select(c, ch, T0);
}

static inline struct tap_track_stats stats(void)
{
	struct tap_track_stats s;
	tap_track_get_stats(t, &s);
	return s;
}

/* A small xorshift generator for the randomized tests (seeded by each). */
static uint64_t rng_state;
static inline uint32_t rnd(uint32_t n)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state % n);
}

/* One seam of the tracker: a TCase with the fixture above. */
static inline TCase *track_tcase(const char *name)
{
	TCase *tc = tcase_create(name);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	return tc;
}

/* Runs the suite and frees what the fixture kept; the exit status of main. */
static inline int track_suite_run(Suite *s)
{
	int failed = tap_check_failures(s);
	for (size_t i = 0; i < n_recs; i++)
		free(recs[i]);
	free(recs);
	free(seen);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif
