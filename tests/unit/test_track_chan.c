/* Channels and connections as the tracker follows them: opens, closes from either side and crossed, reopens
 * before close-ok, modes, channel_max, blocked and held connections, ends with publishes outstanding, shutdown,
 * memory shortages at open, and the summary. */
#include "amqptap/track.h"

#include <check.h>

#include "fail_alloc.h"
#include "tap_build.h"
#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "track_fixture.h"

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

/* --fault close-channel: the tap closed the channel on the broker's side after publish 2; the channel ends at the
 * second close-ok, whichever peer's it is. A publish the client sent after the broker's close-ok, before its own,
 * keeps its seq and is shown channel_closed; what the broker acked before its close-ok keeps the ack. */
static void fault_close(enum tap_peer first)
{
	confirm_channel(1);
	struct tap_publish p = pub("", "q", true);
	tap_track_publish(c, 1, &p, T0);
	tap_track_publish(c, 1, &p, T0);
	struct tap_fault_act a = {.rule = 3, .action = TAP_FAULT_CLOSE_CHANNEL, .channel = 1, .seq = 2, .code = 406,
	                          .text = "PRECONDITION_FAILED - amqptap fault injection"};
	tap_track_fault(c, &a, T0 + 1);
	tap_track_ack(c, 1, 1, false, T0 + 2);
	enum tap_peer second = first == TAP_BY_BROKER ? TAP_BY_CLIENT : TAP_BY_BROKER;
	ck_assert(tap_track_channel_fault_close_wait(c, 1, first));
	tap_track_publish(c, 1, &p, T0 + 3); /* on its way before the client saw the close */
	ck_assert_uint_eq(n_seen, 0); /* publish 1 acked, held for a late Return; 2 and 3 wait */
	ck_assert(!tap_track_channel_fault_close_wait(c, 1, second));
	tap_track_channel_close_ok(c, 1, T0 + 4);
	ck_assert_uint_eq(n_seen, 3);
	assert_verdict(verdict_seq(1, 1), ROUTED, ACK, NO_ORDER);
	for (uint64_t seq = 2; seq <= 3; seq++) {
		assert_verdict(verdict_seq(1, seq), UNKNOWN, CONFIRM_UNKNOWN, NO_ORDER);
		assert_reason(verdict_seq(1, seq), "fault", 406, "PRECONDITION_FAILED - amqptap fault injection");
		assert_field(pub_seq(seq), "client_saw", "\"channel_closed\"");
		assert_field(pub_seq(seq), "fault", "3");
	}
	ck_assert(!tap_track_channel_fault_close_wait(c, 1, first)); /* over: a close-ok now is no fault's */
}

START_TEST(fault_closed_channel_ends_at_the_second_close_ok)
{
	fault_close(TAP_BY_BROKER);
}
END_TEST

START_TEST(fault_closed_channel_client_answers_first)
{
	fault_close(TAP_BY_CLIENT);
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

/* RabbitMQ reads nothing of a blocked connection (src/PROTOCOL.md §6): a non-confirm mandatory publish's return window
 * and a plain publish's hold do not run out while it is blocked, however long the alarm; they run again from
 * connection.unblocked, so a Return or a refusing close that follows the alarm still finds its publish. The
 * publish that made the broker block the connection (it came before connection.blocked) is flagged too. */
START_TEST(blocked_connection_pauses_the_windows)
{
	tap_track_channel_open(c, 1, T0);
	struct tap_publish m = pub("x", "gone", true);
	struct tap_publish p = pub("x", "k", false);
	tap_track_publish(c, 1, &m, T0 + 1); /* the trigger */
	tap_track_conn_blocked(c, S("low on memory"), T0 + 10);
	tap_track_publish(c, 1, &p, T0 + 20);
	tap_track_tick(t, T0 + 20 * TAP_TRACK_RETURN_WINDOW_US_DEFAULT);
	ck_assert_uint_eq(n_seen, 0);
	int64_t unblocked = T0 + 30 * TAP_TRACK_RETURN_WINDOW_US_DEFAULT;
	tap_track_conn_unblocked(c, unblocked);
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
	tap_track_conn_held(c, TAP_TRACK_HELD, T0 + 10);
	tap_track_tick(t, T0 + 20 * TAP_TRACK_RETURN_WINDOW_US_DEFAULT);
	ck_assert_uint_eq(n_seen, 0);
	int64_t unheld = T0 + 30 * TAP_TRACK_RETURN_WINDOW_US_DEFAULT;
	tap_track_conn_held(c, TAP_TRACK_UNHELD, unheld);
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
	tap_track_conn_blocked(c, S("low on memory"), T0 + 10);
	tap_track_conn_unblocked(c, T0 + 510);
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

int main(void)
{
	Suite *s = suite_create("track_chan");
	TCase *tc = track_tcase("channels_and_connections");
#ifdef FAIL_ALLOC_WORKS
	tcase_add_test(tc, channel_lost_for_memory_has_an_unknown_mode);
	tcase_add_test(tc, connection_without_memory_is_counted);
	tcase_add_test(tc, connection_details_lost_are_said);
#endif
	tcase_add_test(tc, channel_closed_by_broker_404);
	tcase_add_test(tc, channel_close_by_client);
	tcase_add_test(tc, reopened_channel_restarts_at_one);
	tcase_add_test(tc, crossed_closes_keep_the_brokers_reason);
	tcase_add_test(tc, reselect_does_not_reset);
	tcase_add_test(tc, non_confirm_publishes_before_select);
	tcase_add_test(tc, conn_end_with_outstanding);
	tcase_add_test(tc, conn_end_after_connection_close);
	tcase_add_test(tc, shutdown_writes_everything);
	tcase_add_test(tc, blocked_and_unblocked);
	tcase_add_test(tc, blocked_connection_pauses_the_windows);
	tcase_add_test(tc, held_broker_side_pauses_every_window);
	tcase_add_test(tc, reopen_before_close_ok_keeps_the_answers_apart);
	tcase_add_test(tc, reopen_taken_by_the_broker);
	tcase_add_test(tc, channels_beyond_channel_max_keep_no_state);
	tcase_add_test(tc, channels_anywhere_in_the_id_range);
	tcase_add_test(tc, summary_and_latency);
	tcase_add_test(tc, summary_names_the_busiest_connections);
	tcase_add_test(tc, fault_closed_channel_ends_at_the_second_close_ok);
	tcase_add_test(tc, fault_closed_channel_client_answers_first);
	suite_add_tcase(s, tc);
	return track_suite_run(s);
}
