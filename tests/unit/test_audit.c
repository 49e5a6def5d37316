/* amqptap audit's reckoning (amqptap/audit.h): resends, duplicates and missing ones across lines fed in "ts" order,
 * the window, the connection names, and what hostile input cannot make it hold. The files and the exit codes are
 * tested with real clients in tests/integration/test_resend.py. */
#include "amqptap/audit.h"
#include "amqptap/status.h"

#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap_check.h"

#define T0 "2026-12-04T10:00:"

/* A publish record of message id at second sec (its "ts" and "published"), ending confirm (route to match). */
static void publish(struct tap_audit *a, int sec, int conn, const char *id, const char *confirm)
{
	char line[512];
	const char *route = !strcmp(confirm, "ack") ? "routed" : "unknown";
	const char *reason = !strcmp(confirm, "unknown") ? ",\"reason\":{\"by\":\"client_reset\"}" : "";
	int n = snprintf(line, sizeof line,
			 "{\"type\":\"publish\",\"ts\":\"" T0 "%02d.000000Z\",\"conn\":%d,\"channel\":1,\"seq\":1,"
			 "\"published\":\"" T0 "%02d.000000Z\",\"exchange\":\"orders\",\"routing_key\":\"k\","
			 "\"message_id\":\"%s\",\"route\":\"%s\",\"confirm\":\"%s\"%s}",
			 sec, conn, sec, id, route, confirm, reason);
	int64_t ts;
	ck_assert(tap_audit_line_ts(line, (size_t)n, &ts));
	tap_audit_advance(a, ts);
	ck_assert_int_eq(tap_audit_line(a, line, (size_t)n), TAP_OK);
}

static void line(struct tap_audit *a, const char *text)
{
	ck_assert_int_eq(tap_audit_line(a, text, strlen(text)), TAP_OK);
}

/* The --json report, parsed. */
static json_t *report(struct tap_audit *a)
{
	tap_audit_finish(a);
	struct tap_buf b;
	tap_buf_init(&b);
	tap_audit_report(a, TAP_AUDIT_JSON, &b);
	ck_assert(!b.oom);
	json_error_t err;
	json_t *o = json_loadb(b.data, b.len, 0, &err);
	ck_assert_msg(o != NULL, "report is no JSON: %s", err.text);
	tap_buf_deinit(&b);
	return o;
}

static json_int_t num(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	ck_assert_msg(json_is_integer(v), "no %s", key);
	return json_integer_value(v);
}

START_TEST(unknown_then_resent_within_the_window)
{
	struct tap_audit *a = tap_audit_new(10 * 1000000LL);
	publish(a, 0, 1, "m-1", "unknown");
	publish(a, 3, 2, "m-1", "ack");
	json_t *o = report(a);
	ck_assert_int_eq(num(o, "publishes"), 2);
	ck_assert_int_eq(num(o, "unknown"), 1);
	ck_assert_int_eq(num(o, "resent"), 1);
	ck_assert_int_eq(num(o, "missing"), 0);
	ck_assert_int_eq(tap_audit_missing(a), 0);
	json_t *d = json_object_get(o, "resend_delay_us");
	ck_assert_int_ge(json_integer_value(json_object_get(d, "p50")), 3000000 * 15 / 16);
	json_decref(o);
	tap_audit_free(a);
}
END_TEST

/* A publish record with no time of its own before any record that had one (the clock not set yet), resent by one
 * with a time before the clock moves (amqptap audit advances it line by line, and the untimed attempt is then due
 * at the first time seen: missing): it counts as resent, with no delay (the fuzzer's case: the delay overflowed). */
START_TEST(untimed_attempt_has_no_delay)
{
	struct tap_audit *a = tap_audit_new(10 * 1000000LL);
	line(a, "{\"type\":\"publish\",\"conn\":1,\"message_id\":\"m-1\",\"route\":\"unknown\",\"confirm\":\"unknown\","
	        "\"reason\":{\"by\":\"client_reset\"}}");
	line(a, "{\"type\":\"publish\",\"ts\":\"" T0 "03.000000Z\",\"published\":\"" T0 "03.000000Z\",\"conn\":2,"
	        "\"message_id\":\"m-1\",\"route\":\"routed\",\"confirm\":\"ack\"}");
	json_t *o = report(a);
	ck_assert_int_eq(num(o, "resent"), 1);
	ck_assert_int_eq(num(o, "missing"), 0);
	ck_assert(json_is_null(json_object_get(json_object_get(o, "resend_delay_us"), "p50")));
	json_decref(o);
	tap_audit_free(a);
}
END_TEST

START_TEST(unknown_never_resent_is_missing_and_named)
{
	struct tap_audit *a = tap_audit_new(1000000LL);
	publish(a, 0, 1, "lost-1", "unknown");
	publish(a, 1, 1, "ok-1", "ack");
	/* past the window and the lateness a record may have: settled while the input goes on */
	publish(a, 20, 1, "ok-2", "ack");
	ck_assert_int_eq(tap_audit_missing(a), 1);
	publish(a, 21, 2, "lost-1", "ack"); /* too late: a new first attempt, not a resend */
	json_t *o = report(a);
	ck_assert_int_eq(num(o, "missing"), 1);
	ck_assert_int_eq(num(o, "resent"), 0);
	json_t *ids = json_object_get(o, "missing_ids");
	ck_assert_int_eq(json_array_size(ids), 1);
	ck_assert_str_eq(json_string_value(json_array_get(ids, 0)), "lost-1");
	json_decref(o);
	tap_audit_free(a);
}
END_TEST

START_TEST(repeat_of_an_acked_one_is_a_duplicate)
{
	struct tap_audit *a = tap_audit_new(60 * 1000000LL);
	publish(a, 0, 1, "m-1", "ack");
	publish(a, 1, 2, "m-1", "ack");
	publish(a, 2, 2, "m-2", "ack");
	json_t *o = report(a);
	ck_assert_int_eq(num(o, "duplicates"), 1);
	ck_assert_int_eq(num(o, "resent"), 0);
	ck_assert_int_eq(num(o, "missing"), 0);
	json_decref(o);
	tap_audit_free(a);
}
END_TEST

/* Files merge by "ts", the settling time: a resend can be written before the unknown it resends (the unknown one
 * was settled later, when its connection died). The earlier "published" is the first attempt either way. */
START_TEST(attempts_ordered_by_published_not_by_arrival)
{
	struct tap_audit *a = tap_audit_new(60 * 1000000LL);
	line(a, "{\"type\":\"publish\",\"ts\":\"" T0 "05.000000Z\",\"conn\":2,\"published\":\"" T0 "04.000000Z\","
		"\"message_id\":\"m-1\",\"route\":\"routed\",\"confirm\":\"ack\",\"exchange\":\"\"}");
	line(a, "{\"type\":\"publish\",\"ts\":\"" T0 "06.000000Z\",\"conn\":1,\"published\":\"" T0 "01.000000Z\","
		"\"message_id\":\"m-1\",\"route\":\"unknown\",\"confirm\":\"unknown\",\"exchange\":\"\","
		"\"reason\":{\"by\":\"broker_reset\"}}");
	json_t *o = report(a);
	ck_assert_int_eq(num(o, "resent"), 1);
	ck_assert_int_eq(num(o, "missing"), 0);
	json_decref(o);
	tap_audit_free(a);
}
END_TEST

START_TEST(evicted_ones_want_no_resend)
{
	struct tap_audit *a = tap_audit_new(1000000LL);
	line(a, "{\"type\":\"publish\",\"ts\":\"" T0 "00.000000Z\",\"message_id\":\"m-1\",\"confirm\":\"unknown\","
		"\"route\":\"unknown\",\"reason\":{\"by\":\"evicted\"}}");
	json_t *o = report(a);
	ck_assert_int_eq(num(o, "unknown"), 0);
	ck_assert_int_eq(num(o, "missing"), 0);
	json_decref(o);
	tap_audit_free(a);
}
END_TEST

START_TEST(connection_names_group_publishes_until_the_close)
{
	struct tap_audit *a = tap_audit_new(60 * 1000000LL);
	line(a, "{\"type\":\"connection\",\"ts\":\"" T0 "00.000000Z\",\"conn\":7,\"event\":\"open\","
		"\"connection_name\":\"billing\"}");
	publish(a, 1, 7, "m-1", "ack");
	line(a, "{\"type\":\"connection\",\"ts\":\"" T0 "02.000000Z\",\"conn\":7,\"event\":\"close\"}");
	publish(a, 3, 7, "m-2", "ack");
	json_t *o = report(a);
	json_t *apps = json_object_get(o, "by_application");
	ck_assert_int_eq(json_array_size(apps), 2);
	ck_assert_str_eq(json_string_value(json_object_get(json_array_get(apps, 0), "name")), "billing");
	ck_assert_int_eq(num(json_array_get(apps, 0), "publishes"), 1);
	ck_assert_str_eq(json_string_value(json_object_get(json_array_get(apps, 1), "name")), "-");
	json_t *ex = json_object_get(o, "by_exchange");
	ck_assert_str_eq(json_string_value(json_object_get(json_array_get(ex, 0), "name")), "orders");
	json_decref(o);
	tap_audit_free(a);
}
END_TEST

START_TEST(lines_that_are_no_record_are_counted_and_skipped)
{
	struct tap_audit *a = tap_audit_new(60 * 1000000LL);
	line(a, "not json");
	line(a, "[1,2]");
	line(a, "{\"type\":\"publish\"");
	size_t big = TAP_AUDIT_LINE_MAX + 1;
	char *huge = malloc(big);
	memset(huge, ' ', big);
	huge[0] = '{';
	ck_assert_int_eq(tap_audit_line(a, huge, big), TAP_OK); /* not even parsed */
	free(huge);
	int64_t ts;
	ck_assert(!tap_audit_line_ts("{\"ts\":\"2026-12-04T10:00\"}", 24, &ts));
	ck_assert(!tap_audit_line_ts("{\"ts\":\"", 7, &ts));
	json_t *o = report(a);
	ck_assert_int_eq(num(o, "lines"), 4);
	ck_assert_int_eq(num(o, "bad_lines"), 4);
	ck_assert_int_eq(num(o, "publishes"), 0);
	json_decref(o);
	tap_audit_free(a);
}
END_TEST

/* Connections opened and never closed, and groups past the limit: bounded, the rest counted. */
START_TEST(hostile_input_is_bounded)
{
	struct tap_audit *a = tap_audit_new(1000000LL);
	char text[256];
	for (unsigned i = 0; i < TAP_AUDIT_GROUPS_MAX + 50; i++) {
		int n = snprintf(text, sizeof text,
				 "{\"type\":\"publish\",\"ts\":\"" T0 "00.000000Z\",\"exchange\":\"x%u\",\"message_id\":\"%u\","
				 "\"route\":\"routed\",\"confirm\":\"ack\"}", i, i);
		ck_assert_int_eq(tap_audit_line(a, text, (size_t)n), TAP_OK);
	}
	json_t *o = report(a);
	json_t *ex = json_object_get(o, "by_exchange");
	ck_assert_int_eq(json_array_size(ex), TAP_AUDIT_GROUPS_MAX + 1); /* and "(other)" */
	json_t *other = json_array_get(ex, TAP_AUDIT_GROUPS_MAX);
	ck_assert_str_eq(json_string_value(json_object_get(other, "name")), "(other)");
	ck_assert_int_eq(num(other, "publishes"), 50);
	json_decref(o);
	tap_audit_free(a);
}
END_TEST

START_TEST(the_table_names_what_was_not_resent)
{
	struct tap_audit *a = tap_audit_new(1000000LL);
	publish(a, 0, 1, "lost-7", "unknown");
	tap_audit_finish(a);
	struct tap_buf b;
	tap_buf_init(&b);
	tap_audit_report(a, TAP_AUDIT_TABLE, &b);
	tap_buf_append(&b, "", 1);
	ck_assert_ptr_nonnull(strstr(b.data, "not resent (1): lost-7"));
	ck_assert_ptr_nonnull(strstr(b.data, "orders"));
	tap_buf_deinit(&b);
	tap_audit_free(a);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("audit");
	TCase *tc = tcase_create("audit");
	tcase_add_test(tc, unknown_then_resent_within_the_window);
	tcase_add_test(tc, untimed_attempt_has_no_delay);
	tcase_add_test(tc, unknown_never_resent_is_missing_and_named);
	tcase_add_test(tc, repeat_of_an_acked_one_is_a_duplicate);
	tcase_add_test(tc, attempts_ordered_by_published_not_by_arrival);
	tcase_add_test(tc, evicted_ones_want_no_resend);
	tcase_add_test(tc, connection_names_group_publishes_until_the_close);
	tcase_add_test(tc, lines_that_are_no_record_are_counted_and_skipped);
	tcase_add_test(tc, hostile_input_is_bounded);
	tcase_add_test(tc, the_table_names_what_was_not_resent);
	suite_add_tcase(s, tc);
	return tap_check_failures(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
