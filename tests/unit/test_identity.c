/* Record identity (issue 17): with a run id, every record the tracker writes carries "run" next to "conn" (the
 * join key of records merged from several taps and restarts), and the connection open record names the tap, the
 * start of the run and the schema; without one (replay) none of these members appear. */
#include "amqptap/track.h"

#include <check.h>

#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RECS 64
#define T0 INT64_C(1795947302000000) /* 2026-11-29T10:15:02Z */
#define STARTED INT64_C(1795947000123456)
#define S(lit) ((struct tap_slice){(const uint8_t *)(lit), sizeof(lit) - 1})

static char *recs[MAX_RECS];
static size_t n_recs;

static void capture(void *ctx, const char *json, size_t len)
{
	(void)ctx;
	ck_assert_uint_lt(n_recs, MAX_RECS);
	char *r = malloc(len + 1);
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

/* One connection with a confirm channel, a publish acked, then the end: every kind of record a connection has. */
static void one_session(const struct tap_track_conf *conf)
{
	reset_recs();
	struct tap_track *t = tap_track_new(conf, capture, NULL);
	ck_assert_ptr_nonnull(t);
	struct tap_track_conn *c = tap_track_conn_new(t, 3, "127.0.0.1:51234", "127.0.0.1:5672", T0);
	tap_track_conn_user(c, S("guest"));
	tap_track_conn_tune(c, 2047, 131072, 60);
	tap_track_conn_open(c, S("/"), T0);
	tap_track_channel_open(c, 1, T0);
	tap_track_confirm_select(c, 1, T0);
	struct tap_publish p = {.exchange = S(""), .routing_key = S("q"), .body_size = 12};
	tap_track_publish(c, 1, &p, T0 + 10);
	tap_track_ack(c, 1, 1, false, T0 + 20);
	tap_track_conn_end(c, "eof", T0 + 30);
	tap_track_free(t);
}

static const char *find_rec(const char *type, const char *event)
{
	char want_type[64], want_event[64];
	snprintf(want_type, sizeof want_type, "{\"type\":\"%s\"", type);
	snprintf(want_event, sizeof want_event, "\"event\":\"%s\"", event);
	for (size_t i = 0; i < n_recs; i++)
		if (strncmp(recs[i], want_type, strlen(want_type)) == 0 && (!event[0] || strstr(recs[i], want_event)))
			return recs[i];
	ck_abort_msg("no %s %s record", type, event);
	return NULL;
}

START_TEST(open_record_names_tap_run_schema)
{
	struct tap_track_conf conf = {.tap_id = "node-a", .run = "0a1b2c3d4e5f", .started_us = STARTED};
	one_session(&conf);
	ck_assert_str_eq(find_rec("connection", "open"),
			 "{\"type\":\"connection\",\"ts\":\"2026-11-29T10:15:02.000000Z\",\"run\":\"0a1b2c3d4e5f\","
			 "\"conn\":3,\"event\":\"open\",\"tap\":\"node-a\",\"started\":\"2026-11-29T10:10:00.123456Z\","
			 "\"schema\":2,\"client\":\"127.0.0.1:51234\",\"upstream\":\"127.0.0.1:5672\",\"user\":\"guest\","
			 "\"vhost\":\"/\",\"product\":null,\"version\":null,\"platform\":null,\"connection_name\":null,"
			 "\"capabilities\":null,\"frame_max\":131072,"
			 "\"heartbeat\":60,\"channel_max\":2047}");
}
END_TEST

START_TEST(every_record_carries_run_before_conn)
{
	struct tap_track_conf conf = {.tap_id = "node-a", .run = "0a1b2c3d4e5f", .started_us = STARTED};
	one_session(&conf);
	ck_assert_uint_ge(n_recs, 5); /* connection open, channel open, publish, channel close, connection close */
	for (size_t i = 0; i < n_recs; i++) {
		const char *ts_end = strstr(recs[i], "Z\",");
		ck_assert_msg(ts_end && strncmp(ts_end + 3, "\"run\":\"0a1b2c3d4e5f\",\"conn\":3,", 30) == 0,
			      "record without run next to conn: %s", recs[i]);
	}
	ck_assert_ptr_null(strstr(find_rec("publish", ""), "\"tap\""));
	ck_assert_ptr_null(strstr(find_rec("connection", "close"), "\"tap\""));
}
END_TEST

START_TEST(no_identity_without_run)
{
	struct tap_track_conf conf = {.tap_id = "node-a"};
	one_session(&conf);
	ck_assert_uint_ge(n_recs, 5);
	for (size_t i = 0; i < n_recs; i++) {
		ck_assert_ptr_null(strstr(recs[i], "\"run\""));
		ck_assert_ptr_null(strstr(recs[i], "\"tap\""));
		ck_assert_ptr_null(strstr(recs[i], "\"schema\""));
		ck_assert_ptr_null(strstr(recs[i], "\"started\""));
	}
	static const char want[] =
	    "{\"type\":\"connection\",\"ts\":\"2026-11-29T10:15:02.000000Z\",\"conn\":3,\"event\":\"open\",\"client\"";
	ck_assert(strncmp(find_rec("connection", "open"), want, sizeof want - 1) == 0);
}
END_TEST

START_TEST(tap_id_escaped_run_bounded)
{
	struct tap_track_conf conf = {.tap_id = "a\"b\\c", .run = "0123456789abcdef-too-long", .started_us = STARTED};
	one_session(&conf);
	const char *open = find_rec("connection", "open");
	ck_assert_ptr_nonnull(strstr(open, "\"tap\":\"a\\\"b\\\\c\""));
	ck_assert_ptr_nonnull(strstr(open, "\"run\":\"0123456789abcdef\",\"conn\":3,"));
}
END_TEST

/* A tracker of tap node-a, run 0a1b2c3d4e5f, with no records yet. */
static struct tap_track *node_a_tracker(void)
{
	struct tap_track_conf conf = {.tap_id = "node-a", .run = "0a1b2c3d4e5f", .started_us = STARTED};
	reset_recs();
	struct tap_track *t = tap_track_new(&conf, capture, NULL);
	ck_assert_ptr_nonnull(t);
	return t;
}

/* A connection that ends before connection.open (a login the broker refused, an unreachable broker) has no open
 * record: its close record names the tap, the broker, the proxy's own end towards it (a refused login reached the
 * broker, which logged that address) and the user itself, so merged logs can still place it. */
START_TEST(close_without_open_names_tap_and_user)
{
	struct tap_track *t = node_a_tracker();
	struct tap_track_conn *c = tap_track_conn_new(t, 4, "127.0.0.1:51235", "127.0.0.1:5672", T0);
	tap_track_conn_upstream_local(c, "127.0.0.1:40100");
	tap_track_conn_user(c, S("mallory"));
	tap_track_conn_close(c, TAP_BY_BROKER, 403, S("ACCESS_REFUSED"), T0 + 5);
	tap_track_conn_end(c, "broker_eof", T0 + 6);
	tap_track_free(t);
	ck_assert_uint_eq(n_recs, 1);
	ck_assert_str_eq(recs[0],
			 "{\"type\":\"connection\",\"ts\":\"2026-11-29T10:15:02.000006Z\",\"run\":\"0a1b2c3d4e5f\","
			 "\"conn\":4,\"event\":\"close\",\"tap\":\"node-a\",\"started\":\"2026-11-29T10:10:00.123456Z\","
			 "\"schema\":2,\"client\":\"127.0.0.1:51235\",\"upstream\":\"127.0.0.1:5672\","
			 "\"upstream_local\":\"127.0.0.1:40100\",\"user\":\"mallory\","
			 "\"by\":\"broker\",\"code\":403,\"text\":\"ACCESS_REFUSED\",\"duration_us\":6,\"publishes\":0,"
			 "\"routed\":0,\"returned\":0,\"unproven\":0,\"unknown\":0,\"acked\":0,\"nacked\":0}");
}
END_TEST

/* A proxy's close record repeats its end towards the broker, so a connection whose open record was rotated away
 * still joins to a sniffer's or the broker's view of it; a connection replayed or sniffed has no such leg. */
START_TEST(close_names_the_proxy_end_towards_the_broker)
{
	struct tap_track *t = node_a_tracker();
	struct tap_track_conn *proxied = tap_track_conn_new(t, 5, "127.0.0.1:51236", "127.0.0.1:5672", T0);
	tap_track_conn_upstream_local(proxied, "127.0.0.1:40101");
	struct tap_track_conn *sniffed = tap_track_conn_new(t, 6, "127.0.0.1:51237", "127.0.0.1:5672", T0);
	struct tap_track_conn *both[] = {proxied, sniffed};
	for (size_t i = 0; i < 2; i++) {
		tap_track_conn_open(both[i], S("/"), T0 + 1);
		tap_track_conn_close(both[i], TAP_BY_CLIENT, 200, S("bye"), T0 + 5);
		tap_track_conn_end(both[i], "client_eof", T0 + 6);
	}
	tap_track_free(t);
	ck_assert_uint_eq(n_recs, 4); /* open and close of each */
	ck_assert_ptr_nonnull(strstr(recs[1], "\"event\":\"close\",\"client\":\"127.0.0.1:51236\","
	                                      "\"upstream_local\":\"127.0.0.1:40101\",\"by\":\"client\""));
	ck_assert_ptr_nonnull(strstr(recs[3], "\"event\":\"close\",\"client\":\"127.0.0.1:51237\",\"by\":\"client\""));
}
END_TEST

/* A session that went on to the broker name's next address names that one, and not the local end of its
 * connection to the last (which a TLS failure there left behind): the next address never connected. */
START_TEST(moved_upstream_forgets_the_last_local_end)
{
	struct tap_track *t = node_a_tracker();
	struct tap_track_conn *c = tap_track_conn_new(t, 7, "127.0.0.1:51238", "[::1]:5672", T0);
	tap_track_conn_upstream_local(c, "[::1]:40102");
	tap_track_conn_upstream(c, "127.0.0.1:5672");
	tap_track_conn_close(c, TAP_BY_CLIENT, 0, S(""), T0 + 5);
	tap_track_conn_end(c, "unreachable", T0 + 6);
	tap_track_free(t);
	ck_assert_uint_eq(n_recs, 1);
	ck_assert_ptr_nonnull(strstr(recs[0], "\"upstream\":\"127.0.0.1:5672\",\"upstream_local\":null,"));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("identity");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, open_record_names_tap_run_schema);
	tcase_add_test(tc, every_record_carries_run_before_conn);
	tcase_add_test(tc, no_identity_without_run);
	tcase_add_test(tc, tap_id_escaped_run_bounded);
	tcase_add_test(tc, close_without_open_names_tap_and_user);
	tcase_add_test(tc, close_names_the_proxy_end_towards_the_broker);
	tcase_add_test(tc, moved_upstream_forgets_the_last_local_end);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	reset_recs();
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
