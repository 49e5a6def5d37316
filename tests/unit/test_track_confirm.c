/* The verdicts of the tracker's lifecycle: acks and nacks (multiple, out of order, stray), Returns paired before
 * and after their ack or left unmatched, return windows, late-return holds, transactions and plain publishes,
 * and a randomized run that checks one `publish` record per publish with the verdict the hook saw. */
#include "amqptap/track.h"

#include <check.h>

#include "fail_alloc.h"
#include "tap_build.h"
#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "track_fixture.h"

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

/* RabbitMQ sends a publish's Return before its Ack (src/PROTOCOL.md §9): a Return without a message_id goes to the one
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
	tap_track_tx_end(c, 2, TAP_TRACK_TX_COMMIT, T0 + 5);
	tap_track_publish(c, 2, &m, T0 + 6); /* the next transaction */
	tap_track_tx_end_ok(c, 2, TAP_TRACK_TX_COMMIT, T0 + 7);
	ck_assert_uint_eq(n_seen, 2);
	assert_verdict(verdict(0), UNPROVEN, NONE, NO_ORDER);
	assert_verdict(verdict(1), ROUTED, NONE, NO_ORDER);
	ck_assert(verdict(0)->v.tx);
	tap_track_tx_end(c, 2, TAP_TRACK_TX_ROLLBACK, T0 + 8);
	tap_track_tx_end_ok(c, 2, TAP_TRACK_TX_ROLLBACK, T0 + 9);
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
	tap_track_tx_end(c, 2, TAP_TRACK_TX_COMMIT, T0 + 15);
	tap_track_tx_end_ok(c, 2, TAP_TRACK_TX_COMMIT, T0 + 16);
	ck_assert_uint_eq(n_seen, 5);
	assert_verdict(verdict(4), UNPROVEN, NONE, NO_ORDER);
	ck_assert(verdict(4)->v.tx);
	ck_assert(!verdict(0)->v.has_seq);
	const char *r = nth("publish", 0);
	assert_field(r, "seq", "null");
	assert_field(r, "tx", "true");
	tap_track_confirm_select(c, 2, T0 + 17); /* the broker refuses (406); tracking stays tx */
	tap_track_publish(c, 2, &p, T0 + 18);
	tap_track_tx_end(c, 2, TAP_TRACK_TX_COMMIT, T0 + 19);
	tap_track_tx_end_ok(c, 2, TAP_TRACK_TX_COMMIT, T0 + 19);
	ck_assert(verdict(5)->v.tx);
	assert_field(nth("channel", 1), "event", "\"tx_select\"");
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
	tap_track_tx_end(c, 2, TAP_TRACK_TX_COMMIT, T0 + 4);
	tap_track_tx_end_ok(c, 2, TAP_TRACK_TX_COMMIT, T0 + 4);
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

START_TEST(connection_latency_run_matches_the_whole_histogram)
{
	/* a connection keeps only the run of buckets its latencies fell in, widened both ways as they come: its summary
	 * line says what the process's whole histogram says of the same acks */
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", false);
	const int64_t lat[] = {5000, 4800, 70, 3, 900000, 0, 12, 250000000, 1, 5000, 33, INT64_C(1) << 38, 777};
	const size_t n = sizeof lat / sizeof lat[0];
	int64_t max = 0;
	for (size_t k = 0; k < 10 * n; k++) {
		int64_t us = lat[(k * 7) % n] + (int64_t)k;
		max = us > max ? us : max;
		tap_track_publish(c, 1, &p, T0);
		tap_track_ack(c, 1, k + 1, false, T0 + us);
	}
	struct tap_buf b;
	tap_buf_init(&b);
	tap_track_summary(t, &b);
	tap_buf_putc(&b, '\0');
	const char *conn_line = strstr(b.data, "confirm_us"), *total = strstr(b.data, "total outstanding");
	ck_assert_ptr_nonnull(conn_line);
	ck_assert_ptr_nonnull(total);
	const char *total_line = strstr(total, "confirm_us");
	ck_assert(conn_line < total);
	size_t len = (size_t)(strchr(total_line, '\n') - total_line);
	ck_assert_msg(strncmp(conn_line, total_line, len) == 0 && conn_line[len] == '\n', "%s", b.data);
	char want[40];
	snprintf(want, sizeof want, "max=%lld\n", (long long)max);
	ck_assert_ptr_nonnull(strstr(total_line, want));
	tap_buf_deinit(&b);
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
	Suite *s = suite_create("track_confirm");
	TCase *tc = track_tcase("verdicts");
	tcase_add_test(tc, routed_after_late_return_window);
	tcase_add_test(tc, plain_publish_held_ends_unproven);
	tcase_add_test(tc, returned_before_ack);
	tcase_add_test(tc, return_details_lost_ends_the_candidates_unknown);
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
	tcase_add_test(tc, tx_channel);
	tcase_add_test(tc, non_confirm_mandatory_window);
	tcase_add_test(tc, clean_close_and_commit_settle_the_return_window);
	tcase_add_test(tc, latency_beyond_the_histogram_range);
	tcase_add_test(tc, connection_latency_run_matches_the_whole_histogram);
	tcase_add_test(tc, random_interleavings);
	suite_add_tcase(s, tc);
	return track_suite_run(s);
}
