/* What --metrics serves, rendered without a socket: the histogram fold into fixed le bounds, the tally a real
 * tracker's verdict and connection hooks feed (problem publishes, returns, return latency, the bounded
 * per-exchange series), the Prometheus exposition of a real tracker's counters (checked line by line against the
 * format's rules) and the JSON of /api/status and /healthz; plus the --metrics option's forms. */
#include "amqptap/conf.h"
#include "amqptap/conn.h"
#include "amqptap/metrics.h"
#include "amqptap/status.h"
#include "amqptap/track.h"

#include <check.h>

#include "tap_check.h"
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(cond, ...)                                                                                             \
	do {                                                                                                           \
		if (!(cond))                                                                                           \
			ck_abort_msg(__VA_ARGS__);                                                                     \
	} while (0)

static struct tap_slice sl(const char *s)
{
	return (struct tap_slice){(const uint8_t *)s, strlen(s)};
}

/* ---- a minimal JSON validator: true when s is exactly one JSON value ---- */

static const char *json_value(const char *p);

static const char *json_ws(const char *p)
{
	while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')
		p++;
	return p;
}

static const char *json_string(const char *p)
{
	for (p++; *p != '"'; p++) {
		if (!*p || (unsigned char)*p < 0x20)
			return NULL;
		if (*p == '\\' && !*++p)
			return NULL;
	}
	return p + 1;
}

static const char *json_container(const char *p)
{
	char close = *p == '{' ? '}' : ']';
	bool obj = *p == '{';
	p = json_ws(p + 1);
	if (*p == close)
		return p + 1;
	for (;;) {
		if (obj) {
			if (*p != '"' || !(p = json_string(p)) || *(p = json_ws(p)) != ':')
				return NULL;
			p++;
		}
		if (!(p = json_value(p)))
			return NULL;
		p = json_ws(p);
		if (*p == close)
			return p + 1;
		if (*p != ',')
			return NULL;
		p = json_ws(p + 1);
	}
}

static const char *json_value(const char *p)
{
	p = json_ws(p);
	if (*p == '"')
		return json_string(p);
	if (*p == '{' || *p == '[')
		return json_container(p);
	const char *start = p;
	while (*p && (isalnum((unsigned char)*p) || *p == '-' || *p == '+' || *p == '.'))
		p++;
	return p > start ? p : NULL;
}

static bool json_valid(const char *s)
{
	const char *end = json_value(s);
	return end && *json_ws(end) == '\0';
}

/* A tally as the admin side starts one (it is too large for the stack); free() it. */
static struct tap_metrics_tally *new_tally(void)
{
	struct tap_metrics_tally *t = malloc(sizeof *t);
	REQUIRE(t, "no memory for a tally");
	tap_metrics_tally_init(t);
	return t;
}

static char *text_of(struct tap_buf *b)
{
	REQUIRE(!b->oom, "buffer out of memory");
	tap_buf_putc(b, '\0');
	b->len--;
	return b->data;
}

/* ---- histogram ---- */

START_TEST(hist_folds_buckets_by_their_midpoint)
{
	struct tap_metrics_hist h = {0};
	tap_metrics_hist_add(&h, 96, 104, 3);       /* midpoint 100: le 100 µs */
	tap_metrics_hist_add(&h, 104, 112, 2);      /* 108: le 150 µs */
	tap_metrics_hist_add(&h, 5, 6, 1);          /* exact small value: le 100 µs */
	tap_metrics_hist_add(&h, 9961472, 10485760, 4); /* 10.2 s: above every bound */
	tap_metrics_hist_add(&h, 6815744, 7340032, 1);  /* 7.08 s: le 10 s */
	ck_assert_uint_eq(h.in_le[0], 4);
	ck_assert_uint_eq(h.in_le[1], 2);
	ck_assert_uint_eq(h.in_le[TAP_METRICS_N_LE - 1], 1);
	ck_assert_uint_eq(h.in_le[TAP_METRICS_N_LE], 4);
	ck_assert_uint_eq(h.count, 11);
	ck_assert_uint_eq(h.sum_us, 3 * 100 + 2 * 108 + 5 + 4 * 10223616ull + 7077888ull);
	for (size_t k = 1; k < TAP_METRICS_N_LE; k++)
		ck_assert_uint_lt(tap_metrics_le_us[k - 1], tap_metrics_le_us[k]);
	ck_assert_uint_eq(tap_metrics_le_us[0], 100);
	ck_assert_uint_eq(tap_metrics_le_us[TAP_METRICS_N_LE - 1], 10000000);
}
END_TEST

/* ---- the tally, fed by a real tracker's hooks ---- */

#define T0 1796000000000000LL

/* The records a tracker wrote, the last one kept whole: what the tally must have kept of a problem publish. */
struct sink {
	char last[4096];
	size_t last_len;
	uint64_t records;
};

static void to_sink(void *ctx, const char *json, size_t len)
{
	struct sink *k = ctx;
	k->records++;
	k->last_len = len < sizeof k->last ? len : 0;
	memcpy(k->last, json, k->last_len);
}

/* A tracker whose hooks feed t, as src/app_loop.c wires them for --metrics. */
static struct tap_track *hooked_tracker(struct tap_metrics_tally *t, struct sink *k)
{
	struct tap_track *tr = tap_track_new(NULL, to_sink, k);
	tap_track_set_verdict_hook(tr, tap_metrics_tally_verdict, t);
	tap_track_set_conn_hook(tr, tap_metrics_tally_conn, t);
	return tr;
}

static bool kept_last_record(const struct tap_metrics_tally *t, const struct sink *k)
{
	const struct tap_metrics_problem *p = &t->problems[(t->problem_next + TAP_METRICS_PROBLEMS - 1) % TAP_METRICS_PROBLEMS];
	return p->len == k->last_len && memcmp(p->json, k->last, p->len) == 0;
}

START_TEST(tally_counts_problem_publishes_and_returns)
{
	struct tap_metrics_tally *t = new_tally();
	struct sink k = {0};
	struct tap_track *tr = hooked_tracker(t, &k);
	struct tap_track_conn *c = tap_track_conn_new(tr, 1, "127.0.0.1:4000", "127.0.0.1:5672", T0);
	tap_track_conn_open(c, sl("/"), T0);
	tap_track_channel_open(c, 1, T0);
	tap_track_confirm_select(c, 1, T0);
	tap_track_channel_open(c, 2, T0); /* no confirms */
	struct tap_publish plain = {.exchange = sl(""), .routing_key = sl("q"), .body_size = 1};
	struct tap_publish mand = {.exchange = sl("x"), .routing_key = sl("nomatch"), .mandatory = true, .body_size = 1};
	/* settled well: routed/ack (ch 1), unproven/none (ch 2) */
	tap_track_publish(c, 1, &plain, T0 + 10);
	tap_track_ack(c, 1, 1, false, T0 + 20);
	tap_track_publish(c, 2, &plain, T0 + 30);
	tap_track_tick(tr, T0 + 10000000);
	ck_assert_uint_eq(t->problems_seen, 0);
	/* returned 312 then acked (ch 1, seq 2): the record is kept verbatim */
	tap_track_publish(c, 1, &mand, T0 + 100);
	struct tap_return r = {.reply_code = 312, .reply_text = sl("NO_ROUTE"), .exchange = sl("x"),
	                       .routing_key = sl("nomatch"), .body_size = 1};
	tap_track_return(c, 1, &r, T0 + 400);
	tap_track_ack(c, 1, 2, false, T0 + 500);
	ck_assert_uint_eq(t->problems_seen, 1);
	ck_assert(kept_last_record(t, &k));
	ck_assert_ptr_nonnull(strstr(t->problems[0].json, "\"reply_code\":312"));
	/* returned 313 without confirms (ch 2) */
	tap_track_publish(c, 2, &mand, T0 + 600);
	r.reply_code = 313;
	r.reply_text = sl("NO_CONSUMERS");
	tap_track_return(c, 2, &r, T0 + 2600);
	tap_track_tick(tr, T0 + 20000000);
	ck_assert_uint_eq(t->problems_seen, 2);
	ck_assert(kept_last_record(t, &k));
	/* nacked (ch 1, seq 3) */
	tap_track_publish(c, 1, &plain, T0 + 3000);
	tap_track_nack(c, 1, 3, false, T0 + 3100);
	ck_assert_uint_eq(t->problems_seen, 3);
	ck_assert_ptr_nonnull(strstr(t->problems[2].json, "\"confirm\":\"nack\""));
	/* unknown: still outstanding when the connection ends */
	tap_track_publish(c, 1, &plain, T0 + 4000);
	tap_track_conn_end(c, "client_eof", T0 + 5000);
	ck_assert_uint_eq(t->problems_seen, 4);
	ck_assert_ptr_nonnull(strstr(t->problems[3].json, "\"route\":\"unknown\""));
	ck_assert_uint_eq(t->n_codes, 2);
	ck_assert_uint_eq(t->codes[0], 312);
	ck_assert_uint_eq(t->returns_by_code[0], 1);
	ck_assert_uint_eq(t->codes[1], 313);
	ck_assert_uint_eq(t->returns_by_code[1], 1);
	/* return latency: 300 µs and 2000 µs after their publishes */
	ck_assert_uint_eq(t->return_us.n, 2);
	ck_assert_uint_eq(t->return_us.max, 2000);
	ck_assert_uint_eq(tap_hist_quantile(&t->return_us, 0.5), 304); /* [288, 320) */

	/* a record too long to keep, or lost for lack of memory, leaves a stub with its verdict */
	struct tap_track_verdict v = {.conn = 7, .channel = 2, .route = TAP_TRACK_ROUTE_RETURNED,
	                              .confirm = TAP_TRACK_CONFIRM_ACK, .reply_code = 312, .return_us = 5,
	                              .record = {(const uint8_t *)"x", TAP_METRICS_PROBLEM_BYTES + 1}};
	tap_metrics_tally_verdict(t, &v);
	ck_assert_str_eq(t->problems[4].json, "{\"type\":\"publish\",\"conn\":7,\"channel\":2,\"route\":\"returned\","
	                                      "\"confirm\":\"ack\",\"truncated\":true,\"bytes\":2049}");
	ck_assert_uint_eq(t->problems[4].len, strlen(t->problems[4].json));
	v.record = (struct tap_slice){NULL, 0};
	v.route = TAP_TRACK_ROUTE_UNKNOWN;
	v.confirm = TAP_TRACK_CONFIRM_UNKNOWN;
	tap_metrics_tally_verdict(t, &v);
	ck_assert_ptr_nonnull(strstr(t->problems[5].json, "\"route\":\"unknown\",\"confirm\":\"unknown\",\"truncated\":true"));
	ck_assert_uint_eq(t->returns_by_code[0], 2);
	ck_assert_uint_eq(t->problems_seen, 6);
	tap_track_free(tr);
	free(t);
}
END_TEST

START_TEST(tally_keeps_the_newest_problems)
{
	struct tap_metrics_tally *t = new_tally();
	char rec[256];
	for (int i = 0; i < TAP_METRICS_PROBLEMS + 9; i++) {
		int n = snprintf(rec, sizeof rec, "{\"type\":\"publish\",\"message_id\":\"m-%d\",\"route\":\"unknown\"}", i);
		struct tap_track_verdict v = {.route = TAP_TRACK_ROUTE_UNKNOWN, .confirm = TAP_TRACK_CONFIRM_UNKNOWN,
		                              .record = {(const uint8_t *)rec, (size_t)n}};
		tap_metrics_tally_verdict(t, &v);
	}
	ck_assert_uint_eq(t->problems_seen, TAP_METRICS_PROBLEMS + 9);
	struct tap_metrics_snapshot s = {.version = "1", .listening = true};
	struct tap_buf b;
	tap_buf_init(&b);
	tap_metrics_render_status(&s, t, NULL, &b);
	char *json = text_of(&b);
	ck_assert_msg(json_valid(json), "not JSON: %s", json);
	char *rows = strstr(json, "\"problems\":{\"seen\":41,\"rows\":[");
	ck_assert_ptr_nonnull(rows);
	/* newest first; the oldest 9 are gone */
	char *newest = strstr(rows, "m-40"), *oldest = strstr(rows, "m-9\"");
	ck_assert_ptr_nonnull(newest);
	ck_assert_ptr_nonnull(oldest);
	ck_assert_msg(newest < oldest, "newest first");
	ck_assert_ptr_null(strstr(rows, "m-8\""));
	tap_buf_deinit(&b);
	free(t);
}
END_TEST

/* The status page's latest missing resends: the last TAP_METRICS_MISSING resend_missing records, newest first; one
 * too long to keep, or not rendered for memory, leaves a stub. */
START_TEST(tally_keeps_the_newest_missing_resends)
{
	struct tap_metrics_tally *t = new_tally();
	char rec[256];
	for (int i = 0; i < TAP_METRICS_MISSING + 3; i++) {
		int n = snprintf(rec, sizeof rec, "{\"type\":\"resend_missing\",\"message_id\":\"m-%d\"}", i);
		tap_metrics_tally_missing(t, (struct tap_slice){(const uint8_t *)rec, (size_t)n});
	}
	tap_metrics_tally_missing(t, (struct tap_slice){NULL, 0});
	struct tap_metrics_snapshot s = {.version = "1", .listening = true};
	struct tap_buf b;
	tap_buf_init(&b);
	tap_metrics_render_status(&s, t, NULL, &b);
	char *json = text_of(&b);
	ck_assert_msg(json_valid(json), "not JSON: %s", json);
	char *rows = strstr(json, "\"resend_missing\":{\"seen\":36,\"rows\":[{\"type\":\"resend_missing\",\"truncated\":true,"
	                          "\"bytes\":0},{\"type\":\"resend_missing\",\"message_id\":\"m-34\"}");
	ck_assert_msg(rows != NULL, "%s", json);
	ck_assert_ptr_nonnull(strstr(rows, "\"m-4\""));
	ck_assert_ptr_null(strstr(rows, "\"m-3\"")); /* the oldest 4 are gone */
	ck_assert_ptr_nonnull(strstr(json, "\"problems\":{\"seen\":0,\"rows\":[]}"));
	tap_buf_deinit(&b);
	free(t);
}
END_TEST

START_TEST(status_says_each_outputs_losses)
{
	struct tap_metrics_tally *t = new_tally();
	struct tap_metrics_snapshot s = {.version = "1", .listening = true};
	s.out[TAP_METRICS_OUT_VERDICTS] = (struct tap_metrics_output){
	    .on = true, .lines = 12, .lost = 7, .write_errors = 1,
	    .lost_by = {[TAP_OUT_LOST_BACKLOG_FULL] = 4, [TAP_OUT_LOST_WRITE_FAILED] = 3}};
	s.out[TAP_METRICS_OUT_PCAP] = (struct tap_metrics_output){.on = true, .lines = 3};
	s.track.conns_unfollowed = 2;
	struct tap_buf b;
	tap_buf_init(&b);
	tap_metrics_render_status(&s, t, NULL, &b);
	char *json = text_of(&b);
	ck_assert_msg(json_valid(json), "not JSON: %s", json);
	/* outputs that are off are not listed */
	ck_assert_ptr_nonnull(strstr(json, "\"outputs\":{\"verdicts\":{\"records\":12,\"lost\":7,"
	                                   "\"lost_by\":{\"backlog_full\":4,\"write_failed\":3},\"write_errors\":1},"
	                                   "\"pcap\":{\"records\":3,\"lost\":0,\"lost_by\":{},\"write_errors\":0}}"));
	ck_assert_ptr_nonnull(strstr(json, "\"connections_unfollowed\":2"));
	/* /metrics: every reason of each output that is on has its series */
	tap_buf_reset(&b);
	tap_metrics_render_prometheus(&s, t, &b);
	char *text = text_of(&b);
	ck_assert_ptr_nonnull(strstr(text, "amqptap_output_records_lost_total{output=\"verdicts\",reason=\"backlog_full\"} 4\n"
	                                   "amqptap_output_records_lost_total{output=\"verdicts\",reason=\"no_memory\"} 0\n"
	                                   "amqptap_output_records_lost_total{output=\"verdicts\",reason=\"write_failed\"} 3\n"
	                                   "amqptap_output_records_lost_total{output=\"verdicts\",reason=\"unflushed\"} 0\n"
	                                   "amqptap_output_records_lost_total{output=\"pcap\",reason=\"backlog_full\"} 0\n"));
	ck_assert_ptr_null(strstr(text, "output=\"frames\""));
	tap_buf_deinit(&b);
	free(t);
}
END_TEST

START_TEST(connections_closed_by_their_records_by)
{
	struct tap_metrics_tally *t = new_tally();
	struct sink k = {0};
	struct tap_track *tr = hooked_tracker(t, &k);
	/* a connection.close seen: "client" whatever the TCP end; none seen: the TCP end; an unknown one: "other" */
	struct tap_track_conn *a = tap_track_conn_new(tr, 1, "127.0.0.1:1", "127.0.0.1:2", T0);
	tap_track_conn_close(a, TAP_BY_CLIENT, 200, sl("Goodbye"), T0);
	tap_track_conn_end(a, "client_eof", T0 + 1);
	tap_track_conn_end(tap_track_conn_new(tr, 2, "127.0.0.1:3", "127.0.0.1:2", T0), "broker_tls_error", T0 + 1);
	tap_track_conn_end(tap_track_conn_new(tr, 3, "127.0.0.1:4", "127.0.0.1:2", T0), "broker_tls_error", T0 + 1);
	tap_track_conn_end(tap_track_conn_new(tr, 4, "127.0.0.1:5", "127.0.0.1:2", T0), "something_new", T0 + 1);
	ck_assert_uint_eq(t->closed_by[TAP_CLOSE_BY_client], 1);
	ck_assert_uint_eq(t->closed_by[TAP_CLOSE_BY_client_eof], 0);
	ck_assert_uint_eq(t->closed_by[TAP_CLOSE_BY_broker_tls_error], 2);
	ck_assert_uint_eq(t->closed_by[TAP_CLOSE_BY_other], 1);
	/* TLS towards the broker failed before any connection.open: no client gets through */
	ck_assert_int_eq(t->upstream, TAP_UPSTREAM_UNREACHABLE);
	ck_assert_int_eq(t->upstream_failure, TAP_CLOSE_BY_broker_tls_error);
	/* a TLS stream that breaks after the broker answered says nothing about the next attempt */
	struct tap_track_conn *opened = tap_track_conn_new(tr, 5, "127.0.0.1:6", "127.0.0.1:2", T0);
	tap_track_conn_open(opened, sl("/"), T0);
	ck_assert_int_eq(t->upstream, TAP_UPSTREAM_REACHABLE);
	tap_track_conn_end(opened, "broker_tls_error", T0 + 1);
	ck_assert_int_eq(t->upstream, TAP_UPSTREAM_REACHABLE);
	ck_assert_uint_eq(t->closed_by[TAP_CLOSE_BY_broker_tls_error], 3);

	struct tap_metrics_snapshot s = {.version = "1", .listening = true};
	struct tap_buf b;
	tap_buf_init(&b);
	tap_metrics_render_prometheus(&s, t, &b);
	char *text = text_of(&b);
	ck_assert_ptr_nonnull(strstr(text, "\namqptap_connections_closed_total{by=\"client\"} 1\n"));
	ck_assert_ptr_nonnull(strstr(text, "\namqptap_connections_closed_total{by=\"broker_tls_error\"} 3\n"));
	ck_assert_ptr_nonnull(strstr(text, "\namqptap_connections_closed_total{by=\"other\"} 1\n"));
	/* every series from the start */
	ck_assert_ptr_nonnull(strstr(text, "\namqptap_connections_closed_total{by=\"tap_no_memory\"} 0\n"));
	tap_buf_reset(&b);
	tap_metrics_render_status(&s, t, NULL, &b);
	char *json = text_of(&b);
	ck_assert_msg(json_valid(json), "not JSON: %s", json);
	ck_assert_ptr_nonnull(strstr(json, "\"connections_closed_by\":{\"client\":1,\"broker_tls_error\":3,\"other\":1}"));
	tap_buf_deinit(&b);
	tap_track_free(tr);
	free(t);
}
END_TEST

/* /api/status: the fault rules in force (the status page lists them), null without --fault and --fault-api. */
START_TEST(status_lists_fault_rules)
{
	struct tap_metrics_tally *t = new_tally();
	struct tap_metrics_snapshot s = {.version = "1", .listening = true};
	struct tap_buf b;
	tap_buf_init(&b);
	tap_metrics_render_status(&s, t, NULL, &b);
	ck_assert_ptr_nonnull(strstr(text_of(&b), "\"faults\":null"));
	struct tap_fault_set set;
	tap_fault_set_init(&set);
	struct tap_fault_rule r;
	char err[300];
	ck_assert_int_eq(tap_fault_parse("nack:every=3", &r, err, sizeof err), 0);
	ck_assert_int_eq(tap_fault_set_add(&set, &r, 0, NULL), 0);
	set.rule_acted[0] = 2;
	s.fault_set = &set;
	s.fault_api = true;
	tap_buf_reset(&b);
	tap_metrics_render_status(&s, t, NULL, &b);
	char *json = text_of(&b);
	ck_assert_msg(json_valid(json), "not JSON: %s", json);
	ck_assert_ptr_nonnull(strstr(json, "\"faults\":{\"api\":true,\"max\":16,\"rules\":[{\"id\":1,\"action\":\"nack\","
	                                   "\"text\":\"nack:every=3\",\"added\":\"1970-01-01T00:00:00.000000Z\",\"acted\":2}]}"));
	tap_buf_deinit(&b);
	free(t);
}
END_TEST

START_TEST(warnings_by_rule_from_the_tracker_stats)
{
	struct tap_metrics_tally *t = new_tally();
	struct tap_metrics_snapshot s = {.version = "9.9.9", .listening = true};
	s.track.warnings_by_rule[TAP_TRACK_RULE_DUPLICATE_MESSAGE_ID] = 4;
	s.track.warnings_by_rule[TAP_TRACK_RULE_CHANNEL_CHURN] = 1;
	struct tap_buf b;
	tap_buf_init(&b);
	tap_metrics_render_prometheus(&s, t, &b);
	char *text = text_of(&b);
	ck_assert_ptr_nonnull(strstr(text, "\namqptap_warnings_total{rule=\"duplicate_message_id\"} 4\n"));
	ck_assert_ptr_nonnull(strstr(text, "\namqptap_warnings_total{rule=\"channel_churn\"} 1\n"));
	ck_assert_ptr_nonnull(strstr(text, "\namqptap_warnings_total{rule=\"publish_and_wait\"} 0\n"));
	for (int r = 0; r < TAP_TRACK_N_RULES; r++) {
		char want[96];
		snprintf(want, sizeof want, "amqptap_warnings_total{rule=\"%s\"}", tap_track_rule_name((enum tap_track_rule)r));
		ck_assert_ptr_nonnull(strstr(text, want));
	}
	tap_buf_deinit(&b);
	free(t);
}
END_TEST

START_TEST(tally_sees_the_upstream_and_the_observer_counts_decode_errors_and_gaps)
{
	struct tap_metrics_tally *t = new_tally();
	struct sink k = {0};
	struct tap_track *tr = hooked_tracker(t, &k);
	ck_assert_int_eq(t->upstream, TAP_UPSTREAM_UNSEEN);
	struct tap_track_conn *c = tap_track_conn_new(tr, 1, "127.0.0.1:1", "127.0.0.1:2", T0);
	tap_track_conn_end(c, "unreachable", T0 + 1);
	ck_assert_int_eq(t->upstream, TAP_UPSTREAM_UNREACHABLE);
	c = tap_track_conn_new(tr, 2, "127.0.0.1:1", "127.0.0.1:2", T0 + 2);
	tap_track_conn_open(c, sl("/"), T0 + 3);
	ck_assert_int_eq(t->upstream, TAP_UPSTREAM_REACHABLE);
	tap_track_conn_end(c, "client_eof", T0 + 4);
	ck_assert_int_eq(t->upstream, TAP_UPSTREAM_REACHABLE);
	c = tap_track_conn_new(tr, 3, "127.0.0.1:1", "127.0.0.1:2", T0 + 5);
	tap_track_conn_end(c, NULL, T0 + 6);
	ck_assert_int_eq(t->upstream, TAP_UPSTREAM_REACHABLE);

	/* a client that does not speak AMQP: one decode_error record, counted by the observer */
	struct tap_observer o;
	tap_observer_init(&o, tr, to_sink, &k, NULL, 0);
	struct tap_conn *tc = tap_conn_new(&o, 4, "127.0.0.1:1", "127.0.0.1:2", T0 + 7);
	static const uint8_t http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
	tap_conn_feed(tc, TAP_C2S, http, sizeof http - 1, T0 + 8);
	ck_assert_uint_eq(o.decode_errors, 1);
	/* and a capture that lost 100 bytes of the broker's side */
	tap_conn_gap(tc, TAP_S2C, 0, 100, T0 + 9);
	ck_assert_uint_eq(o.capture_gaps, 1);
	ck_assert_uint_eq(o.gap_bytes, 100);
	tap_conn_end(tc, "client_eof", T0 + 10);
	struct tap_metrics_snapshot s = {.version = "1", .listening = true, .decode_errors = o.decode_errors};
	struct tap_buf b;
	tap_buf_init(&b);
	tap_metrics_render_prometheus(&s, t, &b);
	ck_assert_ptr_nonnull(strstr(text_of(&b), "\namqptap_decode_errors_total 1\n"));
	tap_buf_deinit(&b);
	tap_observer_deinit(&o);
	tap_track_free(tr);
	free(t);
}
END_TEST

/* ---- Prometheus text from a real tracker ---- */

/* One connection, a confirm channel: publish 1 acked after 250 µs (routed), publish 2 returned and acked after
 * 1.2 ms, publish 3 unanswered; the connection is blocked. */
static struct tap_track *scenario(struct tap_metrics_tally *t, struct sink *k)
{
	struct tap_track *tr = hooked_tracker(t, k);
	struct tap_track_conn *c = tap_track_conn_new(tr, 1, "127.0.0.1:4000", "127.0.0.1:5672", T0);
	tap_track_conn_client_props(c, sl("pika"), sl("1.2"), sl("Python"));
	tap_track_conn_user(c, sl("guest"));
	tap_track_conn_open(c, sl("/"), T0);
	tap_track_channel_open(c, 1, T0);
	tap_track_confirm_select(c, 1, T0);
	struct tap_publish p = {.exchange = sl("x"), .routing_key = sl("k"), .mandatory = true, .body_size = 3};
	tap_track_publish(c, 1, &p, T0 + 1000);
	p.body_size = 4; /* the Return (3 bytes) can only be publish 1's */
	tap_track_publish(c, 1, &p, T0 + 2000);
	tap_track_publish(c, 1, &p, T0 + 3000);
	tap_track_ack(c, 1, 1, false, T0 + 1250);
	struct tap_return r = {.reply_code = 312, .reply_text = sl("NO_ROUTE"), .exchange = sl("x"), .routing_key = sl("k"),
	                       .body_size = 3};
	tap_track_return(c, 1, &r, T0 + 3100);
	tap_track_ack(c, 1, 2, false, T0 + 3200);
	tap_track_conn_blocked(c, sl("low on memory"), T0 + 3300);
	tap_track_tick(tr, T0 + 1000000); /* the held ack of publish 1 is written */
	return tr;
}

/* The exposition format's rules (text format 0.0.4) and the project's: every sample follows the HELP and TYPE of
 * its family, names are amqptap_ or process_, counters end in _total, values are numbers, and no series (name and
 * labels) comes twice: Prometheus would keep one of its samples and drop the other. */
static void lint_exposition(const char *text)
{
	char family[128] = "", type[16] = "";
	const char *line = text;
	size_t families = 0;
	const char *series[1024];
	size_t series_len[1024], n_series = 0;
	while (*line) {
		const char *eol = strchr(line, '\n');
		REQUIRE(eol, "the last line has no newline");
		size_t len = (size_t)(eol - line);
		char l[2048];
		REQUIRE(len < sizeof l, "line too long");
		memcpy(l, line, len);
		l[len] = '\0';
		if (strncmp(l, "# HELP ", 7) == 0) {
			REQUIRE(sscanf(l + 7, "%127s", family) == 1, "HELP without a name: %s", l);
			REQUIRE(strncmp(family, "amqptap_", 8) == 0 || strncmp(family, "process_", 8) == 0, "%s", l);
			type[0] = '\0';
			families++;
		} else if (strncmp(l, "# TYPE ", 7) == 0) {
			char name[128];
			REQUIRE(sscanf(l + 7, "%127s %15s", name, type) == 2, "%s", l);
			REQUIRE(strcmp(name, family) == 0, "TYPE %s after HELP %s", name, family);
			REQUIRE(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 || strcmp(type, "histogram") == 0,
			        "%s", l);
			size_t nl = strlen(name);
			if (strcmp(type, "counter") == 0)
				REQUIRE(nl > 6 && strcmp(name + nl - 6, "_total") == 0, "counter %s without _total", name);
		} else {
			REQUIRE(type[0], "sample before its TYPE: %s", l);
			char name[128];
			size_t n = strcspn(l, "{ ");
			REQUIRE(n < sizeof name, "%s", l);
			memcpy(name, l, n);
			name[n] = '\0';
			bool ok = strcmp(name, family) == 0;
			if (strcmp(type, "histogram") == 0) {
				size_t f = strlen(family);
				ok = strncmp(name, family, f) == 0 && (strcmp(name + f, "_bucket") == 0 ||
				                                        strcmp(name + f, "_sum") == 0 || strcmp(name + f, "_count") == 0);
			}
			REQUIRE(ok, "sample %s outside its family %s", name, family);
			const char *v = strrchr(l, ' ');
			REQUIRE(v, "%s", l);
			char *end;
			(void)strtod(v + 1, &end);
			REQUIRE(*end == '\0' && end > v + 1, "not a number: %s", l);
			if (l[n] == '{')
				REQUIRE(strstr(l, "\"} ") || strstr(l, "\"}"), "labels: %s", l);
			size_t key = (size_t)(v - l);
			for (size_t i = 0; i < n_series; i++)
				REQUIRE(series_len[i] != key || memcmp(series[i], line, key) != 0, "series twice: %s", l);
			REQUIRE(n_series < sizeof series / sizeof series[0], "too many samples");
			series[n_series] = line;
			series_len[n_series++] = key;
		}
		line = eol + 1;
	}
	REQUIRE(families > 30, "only %zu families", families);
}

START_TEST(prometheus_text_of_a_real_tracker)
{
	struct tap_metrics_tally *t = new_tally();
	struct sink k = {0};
	struct tap_track *tr = scenario(t, &k);
	struct tap_metrics_snapshot s = {.version = "9.9.9", .tap_id = "rabbit-1", .run = "5f0c2a9e41d7", .listening = true,
	                                 .accepted = 5, .active = 1,
	                                 .bytes = {[TAP_C2S] = 100, [TAP_S2C] = 50},
	                                 .out = {[TAP_METRICS_OUT_VERDICTS] = {.on = true, .lines = 7}},
	                                 .have_process = true, .rss_bytes = 4096, .cpu_seconds = 1.5};
	tap_metrics_collect_track(&s, tr);
	struct tap_buf b;
	tap_buf_init(&b);
	tap_metrics_render_prometheus(&s, t, &b);
	char *text = text_of(&b);
	lint_exposition(text);
	static const char *const want[] = {
		"\namqptap_publishes_total 3\n",
		"\namqptap_publish_records_total 2\n",
		"\namqptap_publishes_outstanding 1\n",
		"\namqptap_publish_routes_total{route=\"routed\"} 1\n",
		"\namqptap_publish_routes_total{route=\"returned\"} 1\n",
		"\namqptap_publish_confirms_total{confirm=\"ack\"} 2\n",
		"\namqptap_publish_confirms_total{confirm=\"unknown\"} 0\n",
		"\namqptap_returns_total{reply_code=\"312\"} 1\n",
		"\namqptap_warnings_total{rule=\"confirm_without_mandatory\"} 0\n",
		"\namqptap_channels_open 1\n",
		"\namqptap_connections_blocked 1\n",
		"\namqptap_connections_open 1\n",
		"\namqptap_connections_total 5\n",
		"\namqptap_records_written_total 7\n",
		"\namqptap_forwarded_bytes_total{dir=\"c2s\"} 100\n",
		"\namqptap_forwarded_bytes_total{dir=\"s2c\"} 50\n",
		/* 250 µs falls in the tracker's [240, 256) bucket (midpoint 248: le 300 µs); 1.2 ms in [1152, 1280)
		 * (1216: le 1.5 ms) */
		"\namqptap_confirm_latency_seconds_bucket{le=\"0.0002\"} 0\n",
		"\namqptap_confirm_latency_seconds_bucket{le=\"0.0003\"} 1\n",
		"\namqptap_confirm_latency_seconds_bucket{le=\"0.001\"} 1\n",
		"\namqptap_confirm_latency_seconds_bucket{le=\"0.0015\"} 2\n",
		"\namqptap_confirm_latency_seconds_bucket{le=\"10\"} 2\n",
		"\namqptap_confirm_latency_seconds_bucket{le=\"+Inf\"} 2\n",
		"\namqptap_confirm_latency_seconds_sum 0.001464\n",
		"\namqptap_confirm_latency_seconds_count 2\n",
		/* the Return matched publish 1 (acked, held for a late Return): 2.1 ms after it, [2048, 2304), midpoint
		 * 2176 µs */
		"\namqptap_return_latency_seconds_bucket{le=\"0.002\"} 0\n",
		"\namqptap_return_latency_seconds_bucket{le=\"0.003\"} 1\n",
		"\namqptap_return_latency_seconds_bucket{le=\"+Inf\"} 1\n",
		"\namqptap_return_latency_seconds_sum 0.002176\n",
		"\namqptap_return_latency_seconds_count 1\n",
		"\namqptap_exchange_publishes_total{exchange=\"x\",route=\"routed\"} 1\n",
		"\namqptap_exchange_publishes_total{exchange=\"x\",route=\"returned\"} 1\n",
		"\namqptap_exchange_publishes_total{exchange=\"x\",route=\"unknown\"} 0\n",
		"\namqptap_exchange_publishes_total{exchange=\"(other)\",route=\"routed\"} 0\n",
		"\namqptap_decode_errors_total 0\n",
		"\namqptap_upstream_up 1\n",
		"\namqptap_listening 1\n",
		"\namqptap_build_info{version=\"9.9.9\",tap=\"rabbit-1\",run=\"5f0c2a9e41d7\"} 1\n",
		"\nprocess_resident_memory_bytes 4096\n",
		"\nprocess_cpu_seconds_total 1.50\n",
	};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
		REQUIRE(strstr(text, want[i]), "missing %s in:\n%.3000s", want[i], strstr(text, "amqptap_return_latency") ? strstr(text, "amqptap_return_latency") : text);
	ck_assert_ptr_null(strstr(text, "routing_key"));
	ck_assert_ptr_null(strstr(text, "amqptap_upstream_up 0"));
	ck_assert_ptr_null(strstr(text, "amqptap_capture_")); /* not capturing */
	tap_buf_deinit(&b);

	s.have_capture = true;
	s.capture_packets = 10;
	s.capture_drops = 2;
	s.capture_gaps = 3;
	s.capture_gap_bytes = 4000;
	tap_buf_init(&b);
	tap_metrics_render_prometheus(&s, t, &b);
	text = text_of(&b);
	lint_exposition(text);
	static const char *const want_capture[] = {
		"\namqptap_capture_packets_total 10\n",
		"\namqptap_capture_drops_total 2\n",
		"\namqptap_capture_gaps_total 3\n",
		"\namqptap_capture_gap_bytes_total 4000\n",
	};
	for (size_t i = 0; i < sizeof want_capture / sizeof want_capture[0]; i++)
		REQUIRE(strstr(text, want_capture[i]), "missing %s", want_capture[i]);
	tap_buf_deinit(&b);

	tap_buf_init(&b);
	tap_metrics_render_status(&s, t, tr, &b);
	char *json = text_of(&b);
	ck_assert_msg(json_valid(json), "not JSON: %s", json);
	static const char *const want_json[] = {
		"\"status\":\"ok\"",
		"\"upstream_reachable\":true",
		"\"routes\":{\"routed\":1,\"returned\":1,\"unproven\":0,\"unknown\":0}",
		"\"confirms\":{\"ack\":2,\"nack\":0,\"none\":0,\"unknown\":0}",
		"\"returns_by_code\":{\"312\":1}",
		"\"p50_us\":248",
		"{\"le_us\":300,\"count\":1}",
		"{\"le_us\":1500,\"count\":1}",
		"{\"le_us\":null,\"count\":0}",
		("\"rows\":[{\"conn\":1,\"client\":\"127.0.0.1:4000\",\"product\":\"pika\",\"user\":\"guest\",\"vhost\":\"/\","
		 "\"publishes\":3,\"routed\":1,\"returned\":1,"),
		"\"outstanding\":1,\"channels\":1,\"blocked\":true",
		"\"total\":1",
		"\"problems\":{\"seen\":1,\"rows\":[{\"type\":\"publish\"",
		"\"return_latency\":{\"count\":1,\"p50_us\":2100,",
		("\"exchanges\":{\"rows\":[{\"exchange\":\"x\",\"routed\":1,\"returned\":1,\"unproven\":0,\"unknown\":0}],"
		 "\"other\":{\"routed\":0,"),
		"\"capture\":{\"packets\":10,\"drops\":2,\"gaps\":3,\"gap_bytes\":4000}",
	};
	for (size_t i = 0; i < sizeof want_json / sizeof want_json[0]; i++)
		REQUIRE(strstr(json, want_json[i]), "missing %s in:\n%.3000s", want_json[i], strstr(json, "\"problems\"") ? strstr(json, "\"problems\"") : json);
	tap_buf_deinit(&b);

	s.listening = false;
	tap_buf_init(&b);
	tap_metrics_render_health(&s, t, &b);
	json = text_of(&b);
	ck_assert_msg(json_valid(json), "not JSON: %s", json);
	ck_assert_ptr_nonnull(strstr(json, "\"status\":\"stopping\",\"listening\":false"));
	ck_assert_ptr_nonnull(strstr(json, "\"tap\":\"rabbit-1\",\"run\":\"5f0c2a9e41d7\""));
	ck_assert_ptr_nonnull(strstr(json, "\"upstream_reachable\":true"));
	tap_buf_deinit(&b);

	tap_track_shutdown(tr, T0 + 2000000);
	tap_track_free(tr);
	free(t);
}
END_TEST

/* The sample of exchange_publishes_total for (exchange, route), -1 when there is none. */
static long long exchange_sample(const char *text, const char *exchange, const char *route)
{
	char want[600];
	snprintf(want, sizeof want, "\namqptap_exchange_publishes_total{exchange=\"%s\",route=\"%s\"} ", exchange, route);
	const char *p = strstr(text, want);
	return p ? strtoll(p + strlen(want), NULL, 10) : -1;
}

static size_t count_of(const char *text, const char *needle)
{
	size_t n = 0;
	for (const char *p = text; (p = strstr(p, needle)); p++)
		n++;
	return n;
}

static void publish_to(struct tap_metrics_tally *t, const char *exchange, size_t len, enum tap_track_route route,
                       int times)
{
	struct tap_track_verdict v = {.exchange = {(const uint8_t *)exchange, len}, .route = route,
	                              .confirm = TAP_TRACK_CONFIRM_NONE, .return_us = -1, .confirm_us = -1};
	for (int i = 0; i < times; i++)
		tap_metrics_tally_verdict(t, &v);
}

static char *render(const struct tap_metrics_tally *t, struct tap_buf *b)
{
	struct tap_metrics_snapshot s = {.version = "1", .listening = true};
	tap_buf_reset(b);
	tap_metrics_render_prometheus(&s, t, b);
	char *text = text_of(b);
	lint_exposition(text);
	return text;
}

START_TEST(exchanges_are_bounded_ranked_and_escaped)
{
	struct tap_metrics_tally *t = new_tally();
	struct tap_buf b;
	tap_buf_init(&b);
	/* the default exchange, names that need escaping and a byte that is no UTF-8 */
	publish_to(t, "", 0, TAP_TRACK_ROUTE_ROUTED, 5);
	publish_to(t, "a\"b\\c\nd", 7, TAP_TRACK_ROUTE_RETURNED, 2);
	publish_to(t, "caf\xc3\xa9\xff", 6, TAP_TRACK_ROUTE_ROUTED, 1);
	char *text = render(t, &b);
	ck_assert_int_eq(exchange_sample(text, "(AMQP default)", "routed"), 5);
	/* label value a"b\\c<newline>d (the backslash doubled), then the text format's escapes */
	ck_assert_int_eq(exchange_sample(text, "a\\\"b\\\\\\\\c\\nd", "returned"), 2);
	ck_assert_int_eq(exchange_sample(text, "caf\xc3\xa9\\\\xff", "routed"), 1); /* label value café\xff */
	ck_assert_int_eq(exchange_sample(text, "(other)", "routed"), 0);

	/* 30 more exchanges: the first 10 seen have series (3 taken above, 7 more), the rest count in "(other)" */
	char name[16];
	for (int i = 0; i < 30; i++) {
		snprintf(name, sizeof name, "ex%02d", i);
		publish_to(t, name, strlen(name), TAP_TRACK_ROUTE_ROUTED, 1);
	}
	tap_metrics_tally_rank(t); /* no one is busier by an eighth than the least busy with a series: nothing moves */
	text = render(t, &b);
	ck_assert_uint_eq(count_of(text, "amqptap_exchange_publishes_total{"), (TAP_METRICS_EXCHANGES + 1) * 4);
	ck_assert_int_eq(exchange_sample(text, "ex06", "routed"), 1);
	ck_assert_int_eq(exchange_sample(text, "ex07", "routed"), -1);
	long long other = exchange_sample(text, "(other)", "routed");
	ck_assert_int_eq(other, 23); /* ex07..ex29 */

	/* ex29 becomes the busiest: the next ranking gives it a series (counting from then) and takes the least busy
	 * one's (the first with 1 publish: the café one); "(other)" only grows */
	publish_to(t, "ex29", 4, TAP_TRACK_ROUTE_ROUTED, 50);
	tap_metrics_tally_rank(t);
	publish_to(t, "ex29", 4, TAP_TRACK_ROUTE_UNKNOWN, 3);
	publish_to(t, "caf\xc3\xa9\xff", 6, TAP_TRACK_ROUTE_ROUTED, 1);
	text = render(t, &b);
	ck_assert_int_eq(exchange_sample(text, "ex29", "routed"), 0);
	ck_assert_int_eq(exchange_sample(text, "ex29", "unknown"), 3);
	ck_assert_int_eq(exchange_sample(text, "caf\xc3\xa9\\\\xff", "routed"), -1);
	ck_assert_int_eq(exchange_sample(text, "ex00", "routed"), 1);
	ck_assert_int_eq(exchange_sample(text, "(other)", "routed"), other + 50 + 1);
	ck_assert_uint_eq(count_of(text, "amqptap_exchange_publishes_total{"), (TAP_METRICS_EXCHANGES + 1) * 4);

	/* a thousand distinct exchanges later the candidates and the series are still bounded, and a steady heavy
	 * exchange among them gets its series */
	for (int i = 0; i < 1000; i++) {
		snprintf(name, sizeof name, "burst%d", i);
		publish_to(t, name, strlen(name), TAP_TRACK_ROUTE_ROUTED, 1);
		publish_to(t, "heavy", 5, TAP_TRACK_ROUTE_ROUTED, 1);
	}
	tap_metrics_tally_rank(t);
	ck_assert_uint_le(t->exchanges.n, TAP_METRICS_EXCHANGE_CANDIDATES);
	text = render(t, &b);
	ck_assert_int_ge(exchange_sample(text, "heavy", "routed"), 0);
	ck_assert_uint_eq(count_of(text, "amqptap_exchange_publishes_total{"), (TAP_METRICS_EXCHANGES + 1) * 4);
	ck_assert_ptr_null(strstr(text, "burst"));
	tap_buf_deinit(&b);
	free(t);
}
END_TEST

static long long queue_sample(const char *text, const char *queue, const char *outcome)
{
	char want[600];
	snprintf(want, sizeof want, "\namqptap_queue_deliveries_total{queue=\"%s\",outcome=\"%s\"} ", queue, outcome);
	const char *p = strstr(text, want);
	return p ? strtoll(p + strlen(want), NULL, 10) : -1;
}

/* Deliveries by queue: the busiest queues have series (the same Space-Saving as the exchanges), the rest count in
 * "(other)", a delivery whose queue is not known in "(unknown)"; a name is written as an exchange's. */
START_TEST(deliveries_by_queue)
{
	struct tap_metrics_tally *t = new_tally();
	struct tap_buf b;
	tap_buf_init(&b);
	char *text = render(t, &b);
	ck_assert_int_eq(queue_sample(text, "(other)", "ack"), 0); /* the family is there from the start */
	ck_assert_uint_eq(count_of(text, "amqptap_queue_deliveries_total{"), TAP_CONSUME_N_OUTCOMES);
	char name[16];
	for (int i = 0; i < 14; i++) {
		snprintf(name, sizeof name, "q%02d", i);
		for (int k = 0; k <= i; k++)
			tap_metrics_tally_delivery(t, (struct tap_slice){(const uint8_t *)name, strlen(name)},
			                           k % 3 ? TAP_CONSUME_OUT_ACK : TAP_CONSUME_OUT_REJECT);
	}
	tap_metrics_tally_delivery(t, (struct tap_slice){NULL, 0}, TAP_CONSUME_OUT_UNKNOWN);
	tap_metrics_tally_delivery(t, (struct tap_slice){(const uint8_t *)"(other)", 7}, TAP_CONSUME_OUT_AUTO_ACK);
	text = render(t, &b);
	ck_assert_int_eq(queue_sample(text, "q00", "reject"), 1);
	ck_assert_int_eq(queue_sample(text, "q02", "ack"), 2);
	ck_assert_int_eq(queue_sample(text, "q02", "reject"), 1);
	ck_assert_int_eq(queue_sample(text, "q09", "nack"), 0);
	ck_assert_int_eq(queue_sample(text, "q10", "ack"), -1); /* past the first 10: in "(other)" */
	ck_assert_int_eq(queue_sample(text, "(other)", "ack"), 7 + 8 + 8 + 9); /* q10..q13: 11..14 deliveries */
	ck_assert_int_eq(queue_sample(text, "(other)", "reject"), 4 + 4 + 5 + 5);
	ck_assert_int_eq(queue_sample(text, "(other)", "unknown"), 1); /* "(unknown)" has no series yet either */
	ck_assert_int_eq(queue_sample(text, "(other)", "auto_ack"), 1); /* a queue named "(other)": not a series */
	/* the busier queues get their series at the next ranking, the least busy lose theirs */
	tap_metrics_tally_rank(t);
	for (int k = 0; k < 3; k++)
		tap_metrics_tally_delivery(t, (struct tap_slice){(const uint8_t *)"q13", 3}, TAP_CONSUME_OUT_ACK);
	text = render(t, &b);
	ck_assert_int_eq(queue_sample(text, "q13", "ack"), 3);
	ck_assert_int_eq(queue_sample(text, "q00", "reject"), -1);
	ck_assert_uint_eq(count_of(text, "amqptap_queue_deliveries_total{"),
	                  (TAP_METRICS_EXCHANGES + 1) * TAP_CONSUME_N_OUTCOMES);
	tap_buf_deinit(&b);
	free(t);
}
END_TEST

/* RabbitMQ takes any shortstr as an exchange name: names like the pseudo ones, and names that differ only in bytes
 * that are not UTF-8, still get a series each, none of them a pseudo name's (lint_exposition fails on a series
 * twice). */
START_TEST(exchange_series_are_unique)
{
	struct tap_metrics_tally *t = new_tally();
	struct tap_buf b;
	tap_buf_init(&b);
	static const struct {
		const char *name;
		const char *sample; /* the label value as the exposition writes it */
	} names[TAP_METRICS_EXCHANGES] = {
		{"", "(AMQP default)"},
		{"(AMQP default)", "\\\\(AMQP default)"}, /* label value \(AMQP default) */
		{"(other)", "\\\\(other)"},
		{"\\(other)", "\\\\\\\\(other)"}, /* name \(other): label value \\(other) */
		{"x\xff", "x\\\\xff"},
		{"x\xfe", "x\\\\xfe"},
		{"x\\xff", "x\\\\\\\\xff"}, /* the four characters \xff */
		{"x\xef\xbf\xbd", "x\xef\xbf\xbd"}, /* a real U+FFFD */
		{"(", "\\\\("},
		{"\\", "\\\\\\\\"},
	};
	for (int i = 0; i < TAP_METRICS_EXCHANGES; i++)
		publish_to(t, names[i].name, strlen(names[i].name), TAP_TRACK_ROUTE_ROUTED, i + 1);
	publish_to(t, "y", 1, TAP_TRACK_ROUTE_ROUTED, 20); /* no series left: counts in the pseudo "(other)" */
	char *text = render(t, &b);
	for (int i = 0; i < TAP_METRICS_EXCHANGES; i++)
		ck_assert_msg(exchange_sample(text, names[i].sample, "routed") == i + 1, "%s: %lld in\n%s", names[i].sample,
		              exchange_sample(text, names[i].sample, "routed"), strstr(text, "# HELP amqptap_exchange"));
	ck_assert_int_eq(exchange_sample(text, "(other)", "routed"), 20);
	ck_assert_uint_eq(count_of(text, "amqptap_exchange_publishes_total{"), (TAP_METRICS_EXCHANGES + 1) * 4);

	/* the longest name, every byte not UTF-8: one line of 4 characters per byte */
	struct tap_metrics_tally *t2 = new_tally();
	char longest[255];
	memset(longest, 0x80, sizeof longest);
	longest[0] = '(';
	publish_to(t2, longest, sizeof longest, TAP_TRACK_ROUTE_ROUTED, 1);
	text = render(t2, &b);
	const char *at = strstr(text, "{exchange=\"\\\\(\\\\x80\\\\x80");
	ck_assert_ptr_nonnull(at);
	ck_assert_ptr_nonnull(strstr(at, "\\\\x80\",route=\"routed\"} 1\n"));
	tap_buf_deinit(&b);
	free(t2);
	free(t);
}
END_TEST

/* --header-values puts header values into publish records (for the files the operator asked for); the copy kept
 * for /api/status, which anyone who reaches the metrics port reads, leaves them out. */
START_TEST(problem_publishes_keep_no_header_values)
{
	struct tap_metrics_tally *t = new_tally();
	struct sink k = {0};
	struct tap_track_conf conf = {.header_values = "secret,n"};
	struct tap_track *tr = tap_track_new(&conf, to_sink, &k);
	tap_track_set_verdict_hook(tr, tap_metrics_tally_verdict, t);
	struct tap_track_conn *c = tap_track_conn_new(tr, 1, "127.0.0.1:4000", "127.0.0.1:5672", T0);
	tap_track_conn_open(c, sl("/"), T0);
	tap_track_channel_open(c, 1, T0);
	tap_track_confirm_select(c, 1, T0);
	/* headers {secret: "hunter2", n: 7} */
	static const uint8_t table[] = {6, 's', 'e', 'c', 'r', 'e', 't', 'S', 0, 0, 0, 7, 'h', 'u', 'n', 't', 'e', 'r', '2',
	                                1, 'n', 'I', 0, 0, 0, 7};
	struct tap_slice keys[] = {sl("secret"), sl("n")};
	struct tap_publish p = {.exchange = sl("x"), .routing_key = sl("k\"header_values\":"), .body_size = 1,
	                        .headers = {table, sizeof table}, .header_keys = keys, .n_header_keys = 2};
	tap_track_publish(c, 1, &p, T0 + 10);
	tap_track_nack(c, 1, 1, false, T0 + 20);
	ck_assert_uint_eq(t->problems_seen, 1);
	k.last[k.last_len] = '\0';
	ck_assert_msg(strstr(k.last, "\"header_values\":{\"secret\":\"hunter2\",\"n\":7}"), "the record: %s", k.last);
	const struct tap_metrics_problem *kept = &t->problems[0];
	char json[TAP_METRICS_PROBLEM_BYTES + 1];
	memcpy(json, kept->json, kept->len);
	json[kept->len] = '\0';
	ck_assert_msg(json_valid(json), "not JSON: %s", json);
	ck_assert_msg(!strstr(json, "hunter2") && !strstr(json, "\"header_values\":{"), "kept: %s", json);
	ck_assert_msg(strstr(json, "\"headers\":[\"secret\",\"n\"]"), "the keys stay: %s", json);
	ck_assert_msg(strstr(json, "\"routing_key\":\"k\\\"header_values\\\":\""), "kept: %s", json);
	ck_assert_msg(strstr(json, "\"confirm\":\"nack\""), "kept: %s", json);
	tap_track_free(tr);

	/* exactly the span the verdict names is left out, whatever it holds; none named, nothing */
	static const struct {
		const char *record, *span, *kept;
	} cases[] = {
		{"{\"header_values\":{\"a\":[1,{\"b\":\"}\"}]},\"route\":\"unknown\"}",
		 "\"header_values\":{\"a\":[1,{\"b\":\"}\"}]},", "{\"route\":\"unknown\"}"},
		{"{\"route\":\"unknown\",\"header_values\":{\"a\":\"\\\\\"},\"header_values_truncated\":true}",
		 ",\"header_values\":{\"a\":\"\\\\\"},\"header_values_truncated\":true", "{\"route\":\"unknown\"}"},
		{"{\"route\":\"unknown\",\"header_values_truncated\":true,\"x\":1}", ",\"header_values_truncated\":true",
		 "{\"route\":\"unknown\",\"x\":1}"},
		{"{\"route\":\"unknown\",\"headers\":[\"header_values\"]}", NULL,
		 "{\"route\":\"unknown\",\"headers\":[\"header_values\"]}"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const char *span = cases[i].span ? strstr(cases[i].record, cases[i].span) : NULL;
		struct tap_track_verdict v = {.route = TAP_TRACK_ROUTE_UNKNOWN, .confirm = TAP_TRACK_CONFIRM_UNKNOWN,
		                              .return_us = -1, .confirm_us = -1,
		                              .record = {(const uint8_t *)cases[i].record, strlen(cases[i].record)},
		                              .values_at = span ? (size_t)(span - cases[i].record) : 0,
		                              .values_len = span ? strlen(cases[i].span) : 0};
		tap_metrics_tally_verdict(t, &v);
		kept = &t->problems[(t->problem_next + TAP_METRICS_PROBLEMS - 1) % TAP_METRICS_PROBLEMS];
		ck_assert_msg(kept->len == strlen(cases[i].kept) && memcmp(kept->json, cases[i].kept, kept->len) == 0,
		              "%s kept as %.*s", cases[i].record, (int)kept->len, kept->json);
	}
	free(t);
}
END_TEST

START_TEST(status_rows_are_bounded)
{
	struct tap_metrics_tally *t = new_tally();
	struct sink k = {0};
	struct tap_track *tr = hooked_tracker(t, &k);
	for (uint64_t i = 0; i < TAP_METRICS_MAX_ROWS + 20; i++)
		(void)tap_track_conn_new(tr, i, "127.0.0.1:1", "127.0.0.1:2", T0); /* owned by the tracker */
	struct tap_metrics_snapshot s = {.version = "1", .listening = true};
	tap_metrics_collect_track(&s, tr);
	struct tap_buf b;
	tap_buf_init(&b);
	tap_metrics_render_status(&s, t, tr, &b);
	char *json = text_of(&b);
	ck_assert_msg(json_valid(json), "not JSON");
	size_t rows = 0;
	for (const char *p = json; (p = strstr(p, "{\"conn\":")); p++)
		rows++;
	ck_assert_uint_eq(rows, TAP_METRICS_MAX_ROWS);
	ck_assert_ptr_nonnull(strstr(json, "\"total\":120"));
	ck_assert_ptr_nonnull(strstr(json, "\"rows\":[{\"conn\":119,")); /* newest first */
	tap_buf_deinit(&b);
	tap_track_free(tr);
	free(t);
}
END_TEST

/* ---- --metrics ---- */

static int parse(struct tap_conf *c, const char *value, char *err, size_t cap)
{
	char *argv[] = {"amqptap", "--metrics", (char *)value};
	tap_conf_defaults(c);
	return tap_conf_parse(c, 3, argv, NULL, err, cap); /* no output paths: no file system look */
}

START_TEST(metrics_option_forms)
{
	struct tap_conf c;
	char err[256];
	tap_conf_defaults(&c);
	ck_assert_str_eq(c.metrics.host, ""); /* off by default */
	ck_assert_int_eq(parse(&c, "9464", err, sizeof err), TAP_OK);
	ck_assert_str_eq(c.metrics.host, "127.0.0.1");
	ck_assert_uint_eq(c.metrics.port, 9464);
	ck_assert_int_eq(parse(&c, ":0", err, sizeof err), TAP_OK);
	ck_assert_str_eq(c.metrics.host, "127.0.0.1");
	ck_assert_uint_eq(c.metrics.port, 0);
	ck_assert_int_eq(parse(&c, "0.0.0.0:9464", err, sizeof err), TAP_OK);
	ck_assert_str_eq(c.metrics.host, "0.0.0.0");
	ck_assert_int_eq(parse(&c, "[::1]:9464", err, sizeof err), TAP_OK);
	ck_assert_str_eq(c.metrics.host, "::1");
	static const char *const bad[] = {"", "nope", "host:", "1.2.3.4:70000", "::1:9464", "9464x"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		ck_assert_int_eq(parse(&c, bad[i], err, sizeof err), TAP_E_USAGE);
		ck_assert_msg(strncmp(err, "--metrics:", 10) == 0, "%s", err);
		ck_assert_msg(strstr(err, bad[i]) != NULL, "the message shows the value as given: %s", err);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("metrics");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, hist_folds_buckets_by_their_midpoint);
	tcase_add_test(tc, tally_counts_problem_publishes_and_returns);
	tcase_add_test(tc, tally_keeps_the_newest_problems);
	tcase_add_test(tc, tally_keeps_the_newest_missing_resends);
	tcase_add_test(tc, deliveries_by_queue);
	tcase_add_test(tc, status_says_each_outputs_losses);
	tcase_add_test(tc, connections_closed_by_their_records_by);
	tcase_add_test(tc, status_lists_fault_rules);
	tcase_add_test(tc, warnings_by_rule_from_the_tracker_stats);
	tcase_add_test(tc, tally_sees_the_upstream_and_the_observer_counts_decode_errors_and_gaps);
	tcase_add_test(tc, prometheus_text_of_a_real_tracker);
	tcase_add_test(tc, exchanges_are_bounded_ranked_and_escaped);
	tcase_add_test(tc, exchange_series_are_unique);
	tcase_add_test(tc, problem_publishes_keep_no_header_values);
	tcase_add_test(tc, status_rows_are_bounded);
	tcase_add_test(tc, metrics_option_forms);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
