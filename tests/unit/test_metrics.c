/* What --metrics serves, rendered without a socket: the histogram fold into fixed le bounds, the tally of the record
 * stream, the Prometheus exposition of a real tracker's counters (checked line by line against the format's rules)
 * and the JSON of /api/status and /healthz; plus the --metrics option's forms. */
#include "amqptap/conf.h"
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

static void feed(struct tap_metrics_tally *t, const char *json)
{
	tap_metrics_tally_record(t, json, strlen(json));
}

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

/* ---- the record stream ---- */

#define PUB_HEAD "{\"type\":\"publish\",\"ts\":\"2026-11-29T10:15:02.000412Z\",\"conn\":3,\"client\":\"127.0.0.1:5\",\"channel\":1,\"seq\":1,"

START_TEST(tally_counts_problem_publishes_and_returns)
{
	struct tap_metrics_tally *t = malloc(sizeof *t);
	tap_metrics_tally_init(t);
	feed(t, PUB_HEAD "\"exchange\":\"\",\"routing_key\":\"q\",\"body_size\":1,\"route\":\"routed\",\"confirm\":\"ack\","
	              "\"confirm_us\":5,\"multiple\":false,\"order\":null}");
	feed(t, PUB_HEAD "\"exchange\":\"\",\"routing_key\":\"q\",\"route\":\"unproven\",\"confirm\":\"none\",\"order\":null}");
	feed(t, PUB_HEAD "\"exchange\":\"\",\"routing_key\":\"q\",\"route\":\"unproven\",\"confirm\":\"none\",\"order\":null,"
	              "\"tx\":true}");
	feed(t, PUB_HEAD "\"exchange\":\"\",\"routing_key\":\"q\",\"route\":\"routed\",\"confirm\":\"ack\","
	              "\"confirm_us\":-3,\"multiple\":true,\"order\":null}");
	ck_assert_uint_eq(t->problems_seen, 0);
	/* the same tails, but a problem: the quick look from the end must not take them for settled ones */
	feed(t, PUB_HEAD "\"route\":\"unknown\",\"confirm\":\"none\",\"order\":null,\"tx\":true}");
	feed(t, PUB_HEAD "\"route\":\"routed\",\"confirm\":\"nack\",\"confirm_us\":5,\"multiple\":true,\"order\":null}");
	ck_assert_uint_eq(t->problems_seen, 2);
	t->problems_seen = 0;
	t->problem_next = 0;
	/* a routing key that spells a returned route inside its (escaped) string is still a routed publish */
	feed(t, PUB_HEAD "\"exchange\":\"\",\"routing_key\":\"\\\"route\\\":\\\"returned\\\"\",\"route\":\"routed\","
	              "\"confirm\":\"ack\",\"order\":null}");
	ck_assert_uint_eq(t->problems_seen, 0);
	feed(t, PUB_HEAD "\"exchange\":\"x\",\"routing_key\":\"nomatch\",\"route\":\"returned\",\"reply_code\":312,"
	              "\"reply_text\":\"NO_ROUTE\",\"return_us\":4,\"confirm\":\"ack\",\"order\":\"return_before_ack\"}");
	feed(t, PUB_HEAD "\"exchange\":\"x\",\"routing_key\":\"nomatch\",\"route\":\"returned\",\"reply_code\":313,"
	              "\"reply_text\":\"NO_CONSUMERS\",\"return_us\":4,\"confirm\":\"none\",\"order\":null}");
	feed(t, PUB_HEAD "\"exchange\":\"\",\"routing_key\":\"full\",\"route\":\"unproven\",\"confirm\":\"nack\","
	              "\"confirm_us\":9,\"multiple\":false,\"order\":null}");
	feed(t, PUB_HEAD "\"exchange\":\"nope\",\"routing_key\":\"k\",\"route\":\"unknown\",\"confirm\":\"unknown\","
	              "\"order\":null,\"reason\":{\"by\":\"broker\",\"code\":404,\"text\":\"NOT_FOUND\"}}");
	ck_assert_uint_eq(t->problems_seen, 4);
	ck_assert_uint_eq(t->n_codes, 2);
	ck_assert_uint_eq(t->codes[0], 312);
	ck_assert_uint_eq(t->returns_by_code[0], 1);
	ck_assert_uint_eq(t->codes[1], 313);
	ck_assert_uint_eq(t->returns_by_code[1], 1);
	/* kept verbatim, in the ring */
	ck_assert_ptr_nonnull(strstr(t->problems[0].json, "\"reply_code\":312"));
	ck_assert_ptr_nonnull(strstr(t->problems[3].json, "NOT_FOUND"));

	/* a record too long to keep leaves a stub with its verdict */
	size_t big = TAP_METRICS_PROBLEM_BYTES + 100;
	char *rec = malloc(big + 256);
	int n = snprintf(rec, big + 256, PUB_HEAD "\"exchange\":\"x\",\"routing_key\":\"%0*d\",\"route\":\"returned\","
	                                          "\"reply_code\":312,\"confirm\":\"ack\",\"order\":\"ack_before_return\"}",
	                 (int)big, 7);
	tap_metrics_tally_record(t, rec, (size_t)n);
	const struct tap_metrics_problem *p = &t->problems[4];
	ck_assert_uint_gt(p->len, 0);
	char want[160];
	snprintf(want, sizeof want,
	         "{\"type\":\"publish\",\"route\":\"returned\",\"confirm\":\"ack\",\"truncated\":true,\"bytes\":%d}", n);
	ck_assert_uint_eq(p->len, strlen(want));
	ck_assert_int_eq(memcmp(p->json, want, p->len), 0);
	free(rec);

	/* the same from a verdict hook, without a record */
	struct tap_metrics_verdict v = {.route = "returned", .route_len = 8, .confirm = "ack", .confirm_len = 3,
	                                .reply_code = 312};
	tap_metrics_tally_verdict(t, &v);
	ck_assert_uint_eq(t->returns_by_code[0], 3);
	ck_assert_uint_eq(t->problems_seen, 6);
	ck_assert_ptr_nonnull(strstr(t->problems[5].json, "\"route\":\"returned\",\"confirm\":\"ack\",\"truncated\":true"));
	v = (struct tap_metrics_verdict){.route = "routed", .route_len = 6, .confirm = "ack", .confirm_len = 3};
	tap_metrics_tally_verdict(t, &v);
	ck_assert_uint_eq(t->problems_seen, 6);
	free(t);
}
END_TEST

START_TEST(tally_keeps_the_newest_problems)
{
	struct tap_metrics_tally *t = malloc(sizeof *t);
	tap_metrics_tally_init(t);
	char rec[256];
	for (int i = 0; i < TAP_METRICS_PROBLEMS + 9; i++) {
		snprintf(rec, sizeof rec, PUB_HEAD "\"message_id\":\"m-%d\",\"route\":\"unknown\",\"confirm\":\"unknown\"}", i);
		feed(t, rec);
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

START_TEST(warnings_by_rule_from_the_tracker_stats)
{
	struct tap_metrics_tally *t = malloc(sizeof *t);
	tap_metrics_tally_init(t);
	feed(t, "{\"type\":\"warning\",\"ts\":\"x\",\"conn\":1,\"channel\":1,\"rule\":\"publish_and_wait\"}");
	struct tap_metrics_snapshot s = {.version = "9.9.9", .listening = true};
	s.track.warnings_by_rule[TAP_TRACK_RULE_DUPLICATE_MESSAGE_ID] = 4;
	s.track.warnings_by_rule[TAP_TRACK_RULE_CHANNEL_CHURN] = 1;
	struct tap_buf b;
	tap_buf_init(&b);
	tap_metrics_render_prometheus(&s, t, &b);
	char *text = text_of(&b);
	ck_assert_ptr_nonnull(strstr(text, "\namqptap_warnings_total{rule=\"duplicate_message_id\"} 4\n"));
	ck_assert_ptr_nonnull(strstr(text, "\namqptap_warnings_total{rule=\"channel_churn\"} 1\n"));
	/* the record stream is not counted twice: the tracker's stats are the one count */
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

START_TEST(tally_counts_decode_errors_and_sees_the_upstream)
{
	struct tap_metrics_tally *t = malloc(sizeof *t);
	tap_metrics_tally_init(t);
	ck_assert_int_eq(t->upstream, TAP_UPSTREAM_UNSEEN);
	feed(t, "{\"type\":\"decode_error\",\"ts\":\"x\",\"conn\":1,\"dir\":\"c2s\"}");
	feed(t, "{\"type\":\"connection\",\"ts\":\"x\",\"conn\":1,\"event\":\"close\",\"client\":\"a\",\"by\":\"unreachable\"}");
	ck_assert_uint_eq(t->decode_errors, 1);
	ck_assert_int_eq(t->upstream, TAP_UPSTREAM_UNREACHABLE);
	feed(t, "{\"type\":\"connection\",\"ts\":\"x\",\"conn\":2,\"event\":\"open\",\"client\":\"a\"}");
	ck_assert_int_eq(t->upstream, TAP_UPSTREAM_REACHABLE);
	feed(t, "{\"type\":\"connection\",\"ts\":\"x\",\"conn\":2,\"event\":\"close\",\"client\":\"a\",\"by\":\"client\"}");
	ck_assert_int_eq(t->upstream, TAP_UPSTREAM_REACHABLE);
	feed(t, "not json");
	feed(t, "");
	free(t);
}
END_TEST

/* ---- Prometheus text from a real tracker ---- */

static struct tap_metrics_tally *sink_tally;

static void to_tally(void *ctx, const char *json, size_t len)
{
	(void)ctx;
	tap_metrics_tally_record(sink_tally, json, len);
}

#define T0 1796000000000000LL

/* One connection, a confirm channel: publish 1 acked after 250 µs (routed), publish 2 returned and acked after
 * 1.2 ms, publish 3 unanswered; the connection is blocked. */
static struct tap_track *scenario(struct tap_metrics_tally *t)
{
	sink_tally = t;
	struct tap_track *tr = tap_track_new(NULL, to_tally, NULL);
	struct tap_track_conn *c = tap_track_conn_new(tr, 1, "127.0.0.1:4000", "127.0.0.1:5672", T0);
	tap_track_conn_client_props(c, sl("pika"), sl("1.2"), sl("Python"));
	tap_track_conn_user(c, sl("guest"));
	tap_track_conn_open(c, sl("/"), T0);
	tap_track_channel_open(c, 1, T0);
	tap_track_confirm_select(c, 1, T0);
	struct tap_publish p = {.exchange = sl("x"), .routing_key = sl("k"), .mandatory = true, .body_size = 3};
	tap_track_publish(c, 1, &p, T0 + 1000);
	tap_track_publish(c, 1, &p, T0 + 2000);
	tap_track_publish(c, 1, &p, T0 + 3000);
	tap_track_ack(c, 1, 1, false, T0 + 1250);
	struct tap_return r = {.reply_code = 312, .reply_text = sl("NO_ROUTE"), .exchange = sl("x"), .routing_key = sl("k"),
	                       .body_size = 3};
	tap_track_return(c, 1, &r, T0 + 3100);
	tap_track_ack(c, 1, 2, false, T0 + 3200);
	tap_track_conn_blocked(c, true, sl("low on memory"), T0 + 3300);
	tap_track_tick(tr, T0 + 1000000); /* the held ack of publish 1 is written */
	return tr;
}

/* The exposition format's rules (text format 0.0.4) and the project's: every sample follows the HELP and TYPE of
 * its family, names are amqptap_ or process_, counters end in _total, values are numbers. */
static void lint_exposition(const char *text)
{
	char family[128] = "", type[16] = "";
	const char *line = text;
	size_t families = 0;
	while (*line) {
		const char *eol = strchr(line, '\n');
		REQUIRE(eol, "the last line has no newline");
		size_t len = (size_t)(eol - line);
		char l[512];
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
		}
		line = eol + 1;
	}
	REQUIRE(families > 30, "only %zu families", families);
}

START_TEST(prometheus_text_of_a_real_tracker)
{
	struct tap_metrics_tally *t = malloc(sizeof *t);
	tap_metrics_tally_init(t);
	struct tap_track *tr = scenario(t);
	struct tap_metrics_snapshot s = {.version = "9.9.9", .listening = true, .accepted = 5, .active = 1,
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
		"\namqptap_upstream_up 1\n",
		"\namqptap_listening 1\n",
		"\namqptap_build_info{version=\"9.9.9\"} 1\n",
		"\nprocess_resident_memory_bytes 4096\n",
		"\nprocess_cpu_seconds_total 1.50\n",
	};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
		REQUIRE(strstr(text, want[i]), "missing %s in:\n%s", want[i], text);
	ck_assert_ptr_null(strstr(text, "routing_key"));
	ck_assert_ptr_null(strstr(text, "amqptap_upstream_up 0"));
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
	};
	for (size_t i = 0; i < sizeof want_json / sizeof want_json[0]; i++)
		REQUIRE(strstr(json, want_json[i]), "missing %s in:\n%s", want_json[i], json);
	tap_buf_deinit(&b);

	s.listening = false;
	tap_buf_init(&b);
	tap_metrics_render_health(&s, t, &b);
	json = text_of(&b);
	ck_assert_msg(json_valid(json), "not JSON: %s", json);
	ck_assert_ptr_nonnull(strstr(json, "\"status\":\"stopping\",\"listening\":false"));
	ck_assert_ptr_nonnull(strstr(json, "\"upstream_reachable\":true"));
	tap_buf_deinit(&b);

	tap_track_shutdown(tr, T0 + 2000000);
	tap_track_free(tr);
	free(t);
}
END_TEST

START_TEST(status_rows_are_bounded)
{
	struct tap_metrics_tally *t = malloc(sizeof *t);
	tap_metrics_tally_init(t);
	sink_tally = t;
	struct tap_track *tr = tap_track_new(NULL, to_tally, NULL);
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
	return tap_conf_parse(c, 3, argv, err, cap);
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
	tcase_add_test(tc, warnings_by_rule_from_the_tracker_stats);
	tcase_add_test(tc, tally_counts_decode_errors_and_sees_the_upstream);
	tcase_add_test(tc, prometheus_text_of_a_real_tracker);
	tcase_add_test(tc, status_rows_are_bounded);
	tcase_add_test(tc, metrics_option_forms);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
