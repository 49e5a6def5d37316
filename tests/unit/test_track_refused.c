/* Publish-caused closes: the channel or connection close that names the publish the broker refused (by its
 * exchange, user_id, message size or immediate flag), the ones after it, and a close that names none. */
#include "amqptap/track.h"

#include <check.h>

#include "fail_alloc.h"
#include "tap_build.h"
#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "track_fixture.h"

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

/* The client answers the broker's refusing close long after --return-window (pika's BlockingConnection idle after
 * publishing): the close decided the refused mandatory publishes, so their window running out does not make them
 * unproven; they end with the channel, unknown with the broker's reason. A mandatory publish before them that the
 * close did not refuse ends with its window, unproven, as it would without the close. */
START_TEST(refused_mandatory_waits_past_the_return_window)
{
	tap_track_channel_open(c, 1, T0);
	struct tap_publish ok = pub_id("x", "a", true, "m1");
	struct tap_publish bad = pub_id("gone", "b", true, "m2");
	struct tap_publish after = pub_id("x", "c", true, "m3");
	tap_track_publish(c, 1, &ok, T0 + 1);
	tap_track_publish(c, 1, &bad, T0 + 2);
	tap_track_publish(c, 1, &after, T0 + 3);
	tap_track_channel_close(c, 1, TAP_BY_BROKER, 404, S(nf_text), T0 + 300);
	tap_track_publish_refused(c, 1, T0 + 300);
	ck_assert_uint_eq(n_seen, 1); /* m1: the close came before its window ended, and refused it not */
	tap_track_tick(t, T0 + 3 * TAP_TRACK_RETURN_WINDOW_US_DEFAULT);
	ck_assert_uint_eq(n_seen, 1);
	tap_track_channel_close_ok(c, 1, T0 + 3 * TAP_TRACK_RETURN_WINDOW_US_DEFAULT + 1);
	ck_assert_uint_eq(n_seen, 3);
	assert_verdict(verdict(0), UNPROVEN, NONE, NO_ORDER);
	for (size_t i = 1; i < 3; i++) {
		assert_verdict(verdict(i), UNKNOWN, NONE, NO_ORDER);
		ck_assert_str_eq(verdict(i)->reason_by, "broker");
		ck_assert_uint_eq(verdict(i)->v.reason_code, 404);
		ck_assert_str_eq(verdict(i)->reason_text, nf_text);
	}
	assert_field(nth("publish", 1), "refused", "\"culprit\"");
	assert_field(nth("publish", 2), "refused", "\"after_culprit\"");
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

int main(void)
{
	Suite *s = suite_create("track_refused");
	TCase *tc = track_tcase("refused_publishes");
	tcase_add_loop_test(tc, publish_caused_close_names_the_culprit, 0, 2);
	tcase_add_loop_test(tc, refused_channel_ended_by_the_clients_connection_close, 0, 2);
	tcase_add_loop_test(tc, close_naming_two_waiting_publishes_names_neither, 0, 2);
	tcase_add_test(tc, refused_mandatory_waits_past_the_return_window);
	tcase_add_test(tc, publish_caused_close_in_confirm_mode);
	tcase_add_test(tc, publish_caused_close_by_user_id);
	tcase_add_test(tc, publish_caused_close_by_message_size);
	tcase_add_test(tc, publish_caused_close_naming_nothing);
	tcase_add_test(tc, publish_caused_connection_close);
	tcase_add_test(tc, publish_caused_connection_close_by_immediate);
	suite_add_tcase(s, tc);
	return track_suite_run(s);
}
