/* The tracker's records as written: the connection open record, a publish record's members (lost details,
 * optional properties and escaping, header keys and values, traceparent) and what every record carries. */
#include "amqptap/track.h"

#include <check.h>

#include "fail_alloc.h"
#include "tap_build.h"
#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "track_fixture.h"

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

/* connection_name and capabilities come from the client's properties: bounded, escaped; null when not sent. */
START_TEST(connection_name_and_capabilities)
{
	assert_field(recs[0], "connection_name", "null");
	assert_field(recs[0], "capabilities", "null");
	struct tap_track_conn *c2 = tap_track_conn_new(t, 4, "127.0.0.1:40001", "127.0.0.1:5672", T0);
	char name[1000];
	memset(name, 'n', sizeof name);
	memcpy(name, "orders \"svc\"\n", 13);
	tap_track_conn_client_caps(c2, (struct tap_slice){(const uint8_t *)name, sizeof name}, true,
	                           TAP_TRACK_CAP_PUBLISHER_CONFIRMS | TAP_TRACK_CAP_BASIC_NACK |
	                               TAP_TRACK_CAP_CONNECTION_BLOCKED,
	                           TAP_TRACK_CAP_PUBLISHER_CONFIRMS | TAP_TRACK_CAP_CONSUMER_CANCEL_NOTIFY);
	tap_track_conn_open(c2, S("/"), T0 + 1);
	const char *r = nth("connection", 1);
	ck_assert(valid_json_object(r));
	const char *v = get(r, "connection_name");
	ck_assert_ptr_nonnull(v);
	ck_assert_int_eq(strncmp(v, "\"orders \\\"svc\\\"\\n", 17), 0);
	/* 256 bytes kept: 13 escaped to 16, the rest plain, and the quotes */
	ck_assert_uint_eq(strlen(v), 2 + 16 + TAP_TRACK_CONN_NAME_MAX - 13);
	/* only what the client named; consumer_cancel_notify was not named, so it is not said true */
	assert_field(r, "capabilities", "{\"connection.blocked\":false,\"publisher_confirms\":true,\"basic.nack\":false}");
	tap_track_conn_end(c2, "client_eof", T0 + 2);
}
END_TEST

/* Every publish record says when the tap saw it ("published"), whatever its verdict's ts. */
START_TEST(published_is_when_the_publish_was_seen)
{
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", false);
	tap_track_publish(c, 1, &p, T0 + 1500);
	tap_track_ack(c, 1, 1, false, T0 + 2000000);
	const char *r = pub_seq(1);
	assert_field(r, "published", "\"2026-11-29T10:15:02.001500Z\"");
	assert_field(r, "ts", "\"2026-11-29T10:15:04.000000Z\"");
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

/* The verdict hook's values_at and values_len: the record without those bytes is the record a tap without
 * --header-values writes, wherever the values fall among the properties and however the publish is kept. */
struct cut_sink {
	char rec[4096];
	size_t len, values_len;
	size_t n;
};

static void keep_cut(void *ctx, const struct tap_track_verdict *v)
{
	struct cut_sink *k = ctx;
	ck_assert_uint_le(v->values_at + v->values_len, v->record.len);
	ck_assert_uint_le(v->record.len - v->values_len, sizeof k->rec);
	memcpy(k->rec, v->record.ptr, v->values_at);
	memcpy(k->rec + v->values_at, v->record.ptr + v->values_at + v->values_len,
	       v->record.len - v->values_at - v->values_len);
	k->len = v->record.len - v->values_len;
	k->values_len = v->values_len;
	k->n++;
}

static void ignore_record(void *ctx, const char *json, size_t len)
{
	(void)ctx;
	(void)json;
	(void)len;
}

enum cut_kept { CUT_PLAIN, CUT_CONFIRM, CUT_UNTRACKED };

static void publish_both(const struct tap_publish *p, enum cut_kept how, bool want_values)
{
	struct tap_track_conf with = {.header_values = "task,id"}, without = {0};
	struct cut_sink sink[2] = {0};
	for (int i = 0; i < 2; i++) {
		struct tap_track *tr = tap_track_new(i ? &without : &with, ignore_record, NULL);
		tap_track_set_verdict_hook(tr, keep_cut, &sink[i]);
		struct tap_track_conn *cn = tap_track_conn_new(tr, 3, "127.0.0.1:51234", "127.0.0.1:5672", T0);
		tap_track_conn_open(cn, S("/"), T0);
		if (how == CUT_UNTRACKED)
			tap_track_conn_unseen(cn, "capture_start", T0);
		else
			tap_track_channel_open(cn, 1, T0);
		if (how == CUT_CONFIRM)
			tap_track_confirm_select(cn, 1, T0);
		tap_track_publish(cn, 1, p, T0 + 1);
		if (how == CUT_CONFIRM)
			tap_track_ack(cn, 1, 1, false, T0 + 2);
		tap_track_tick(tr, T0 + 1 + TAP_TRACK_LATE_RETURN_US_DEFAULT);
		ck_assert_uint_eq(sink[i].n, 1);
		tap_track_free(tr);
	}
	ck_assert_msg(sink[0].len == sink[1].len && memcmp(sink[0].rec, sink[1].rec, sink[0].len) == 0,
	              "with the values cut: %.*s\nwithout --header-values: %.*s", (int)sink[0].len, sink[0].rec,
	              (int)sink[1].len, sink[1].rec);
	ck_assert_msg((sink[0].values_len > 0) == want_values, "values_len %zu", sink[0].values_len);
	ck_assert_uint_eq(sink[1].values_len, 0);
}

START_TEST(header_values_span_in_verdict)
{
	struct tap_bytes h = {0};
	hdr_str(&h, "task", "proj.add");
	hdr_str(&h, "id", "6f1c");
	hdr_str(&h, "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
	struct tap_slice keys[] = {S("task"), S("id"), S("traceparent")};
	for (int how = CUT_PLAIN; how <= CUT_UNTRACKED; how++) {
		struct tap_publish p = pub("x", "k", false);
		p.headers = (struct tap_slice){h.d, h.n};
		publish_both(&p, (enum cut_kept)how, true); /* the values first, a trace after them */
		p.content_type = S("text/plain");
		p.header_keys = keys;
		p.n_header_keys = 3;
		publish_both(&p, (enum cut_kept)how, true); /* members before them */
		p.headers_cut = true;
		publish_both(&p, (enum cut_kept)how, true); /* with their truncation flag */
		p.headers = (struct tap_slice){NULL, 0};
		publish_both(&p, (enum cut_kept)how, true); /* the flag alone */
		p.headers_cut = false;
		publish_both(&p, (enum cut_kept)how, false); /* none */
	}
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

START_TEST(every_record_has_type_and_ts)
{
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", true);
	tap_track_publish(c, 1, &p, T0);
	struct tap_return r = ret("y", "k");
	tap_track_return(c, 1, &r, T0);
	tap_track_conn_blocked(c, S("disk"), T0);
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

int main(void)
{
	Suite *s = suite_create("track_publish");
	TCase *tc = track_tcase("publish_records");
	tcase_add_test(tc, connection_open_record);
	tcase_add_test(tc, connection_name_and_capabilities);
	tcase_add_test(tc, published_is_when_the_publish_was_seen);
	tcase_add_test(tc, header_values_written_when_asked);
	tcase_add_test(tc, header_values_never_by_default);
	tcase_add_test(tc, header_values_bounded);
	tcase_add_test(tc, header_values_span_in_verdict);
	tcase_add_test(tc, traceparent_written);
	tcase_add_test(tc, traceparent_malformed_ignored_and_counted);
	tcase_add_test(tc, publish_details_lost_are_null);
	tcase_add_test(tc, consumer_side_does_not_confuse);
	tcase_add_test(tc, optional_properties_and_escaping);
	tcase_add_test(tc, every_record_has_type_and_ts);
	tcase_add_test(tc, header_keys_capped_in_number);
	tcase_add_test(tc, header_keys_capped_in_bytes_on_character_boundaries);
	suite_add_tcase(s, tc);
	return track_suite_run(s);
}
