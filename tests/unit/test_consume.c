/* The consumer tracker (src/core/consume.c): one `delivery` record per delivery whatever happens (settled, auto-ack,
 * channel or connection closed, recovered, evicted, cut), multiple acks over interleaved consumers of one channel,
 * delivery tags per channel, basic.get, consumer records, and a randomized run holding the one-record invariant. */
#include "amqptap/conn.h"
#include "amqptap/consume.h"
#include "amqptap/identity.h"
#include "amqptap/spec.h"

#include "track_fixture.h"

static struct tap_delivery dlv(const char *ctag, uint64_t tag, const char *id)
{
	struct tap_delivery d = {.consumer_tag = S(ctag), .exchange = S(""), .routing_key = S("q1"),
	                         .delivery_tag = tag, .body_size = 5};
	if (id) {
		d.message_id = S(id);
		d.has_message_id = true;
	}
	return d;
}

static void consume(uint16_t ch, const char *tag, const char *queue, bool no_ack)
{
	tap_consume_consume(c, ch, S(""), S(queue), no_ack, false, false, T0);
	tap_consume_consume_ok(c, ch, S(tag), T0);
}

/* The delivery record of channel ch with this delivery tag, or fails (and fails if there are two). */
static const char *dlv_rec(uint16_t ch, uint64_t tag)
{
	char want_ch[16], want_tag[32];
	snprintf(want_ch, sizeof want_ch, "%u", ch);
	snprintf(want_tag, sizeof want_tag, "%llu", (unsigned long long)tag);
	const char *hit = NULL;
	for (size_t i = 0; i < n_recs; i++) {
		if (!is_type(recs[i], "delivery") || strcmp(get(recs[i], "channel"), want_ch) ||
		    strcmp(get(recs[i], "delivery_tag"), want_tag))
			continue;
		ck_assert_msg(!hit, "two records for channel %u tag %s", ch, want_tag);
		hit = recs[i];
	}
	ck_assert_msg(hit != NULL, "no delivery record for channel %u tag %s", ch, want_tag);
	return hit;
}

static struct tap_consume_stats cstats(void)
{
	struct tap_consume_stats s;
	tap_consume_get_stats(t, &s);
	return s;
}

START_TEST(multiple_ack_over_interleaved_consumers)
{
	tap_track_channel_open(c, 1, T0);
	tap_consume_qos(c, 1, 10, false, T0);
	consume(1, "ctag-a", "qa", false);
	consume(1, "ctag-b", "qb", false);
	ck_assert_uint_eq(count_type("consumer"), 2);
	assert_field(nth("consumer", 0), "event", "\"consume\"");
	assert_field(nth("consumer", 1), "consumer_tag", "\"ctag-b\"");
	assert_field(nth("consumer", 1), "prefetch", "10");
	for (uint64_t tag = 1; tag <= 6; tag++) {
		struct tap_delivery d = dlv(tag % 2 ? "ctag-a" : "ctag-b", tag, "m");
		tap_consume_deliver(c, 1, &d, T0 + (int64_t)tag);
	}
	ck_assert_uint_eq(cstats().unacked, 6);
	tap_consume_settle(c, 1, TAP_CONSUME_ACK, 2, false, false, T0 + 100); /* a single ack first */
	tap_consume_settle(c, 1, TAP_CONSUME_ACK, 4, true, false, T0 + 200); /* then 1, 3, 4 at once */
	ck_assert_uint_eq(count_type("delivery"), 4);
	assert_field(dlv_rec(1, 2), "multiple", "false");
	assert_field(dlv_rec(1, 2), "settle_us", "98");
	for (uint64_t tag = 1; tag <= 4; tag++) {
		const char *r = dlv_rec(1, tag);
		assert_field(r, "outcome", "\"ack\"");
		assert_field(r, "consumer_tag", tag % 2 ? "\"ctag-a\"" : "\"ctag-b\"");
		assert_field(r, "queue", tag % 2 ? "\"qa\"" : "\"qb\"");
		if (tag != 2)
			assert_field(r, "multiple", "true");
	}
	assert_field(dlv_rec(1, 3), "settle_us", "197");
	tap_consume_settle(c, 1, TAP_CONSUME_ACK, 0, true, false, T0 + 300); /* tag 0, multiple: all */
	ck_assert_uint_eq(count_type("delivery"), 6);
	ck_assert_uint_eq(cstats().unacked, 0);
	ck_assert_uint_eq(cstats().stray_settles, 0);
	tap_consume_settle(c, 1, TAP_CONSUME_ACK, 3, false, false, T0 + 400); /* twice: no second record */
	ck_assert_uint_eq(count_type("delivery"), 6);
	ck_assert_uint_eq(cstats().stray_settles, 1);
	assert_field(dlv_rec(1, 5), "conn", "3");
	assert_field(dlv_rec(1, 5), "user", "\"guest\"");
	assert_field(dlv_rec(1, 5), "message_id", "\"m\"");
	assert_field(dlv_rec(1, 5), "body_size", "5");
	assert_field(dlv_rec(1, 5), "delivery_count", "null");
}
END_TEST

struct listed {
	size_t n;
	struct tap_consume_consumer_info info[4];
	char tag[4][32];
};

static void list_one(void *ctx, const struct tap_consume_consumer_info *k)
{
	struct listed *l = ctx;
	ck_assert_uint_lt(l->n, 4);
	l->info[l->n] = *k;
	snprintf(l->tag[l->n], sizeof l->tag[0], "%.*s", (int)k->tag.len, (const char *)k->tag.ptr);
	l->n++;
}

/* The status page's consumer list: each started consumer with its own unacked deliveries (two consumers on one
 * channel are told apart by their tags; a basic.get's delivery is no consumer's) and its oldest unacked delivery;
 * past max they are counted, not listed; past the scan bound their unacked are not counted. */
START_TEST(consumers_listed_with_their_unacked)
{
	tap_track_channel_open(c, 1, T0);
	tap_consume_qos(c, 1, 10, false, T0);
	consume(1, "ctag-a", "qa", false);
	consume(1, "ctag-b", "qb", true);
	tap_consume_consume(c, 1, S(""), S("qc"), false, false, false, T0); /* no consume-ok yet: not listed */
	for (uint64_t tag = 1; tag <= 5; tag++) {
		struct tap_delivery d = dlv(tag <= 3 ? "ctag-a" : "ctag-b", tag, NULL);
		tap_consume_deliver(c, 1, &d, T0 + (int64_t)tag * 10);
	}
	tap_consume_get(c, 1, S("qa"), false, T0 + 60);
	struct tap_delivery g = dlv("", 6, NULL);
	tap_consume_deliver(c, 1, &g, T0 + 60);
	tap_consume_settle(c, 1, TAP_CONSUME_ACK, 1, false, false, T0 + 70);
	struct listed l = {0};
	ck_assert_uint_eq(tap_consume_each_consumer(t, 4, UINT64_MAX, list_one, &l), 2);
	ck_assert_uint_eq(l.n, 2);
	ck_assert_str_eq(l.tag[0], "ctag-a");
	ck_assert_uint_eq(l.info[0].channel, 1);
	ck_assert_uint_eq(l.info[0].prefetch, 10);
	ck_assert(!l.info[0].no_ack);
	ck_assert_uint_eq(l.info[0].deliveries, 3);
	ck_assert_uint_eq(l.info[0].unacked, 2); /* 2 and 3 */
	ck_assert_int_eq(l.info[0].oldest_us, T0 + 20);
	ck_assert(l.info[0].unacked_known);
	ck_assert_str_eq(l.tag[1], "ctag-b"); /* auto-ack: nothing waits for its settle */
	ck_assert(l.info[1].no_ack);
	ck_assert(l.info[1].unacked_known);
	ck_assert_uint_eq(l.info[1].unacked, 0);
	ck_assert_int_eq(l.info[1].oldest_us, 0);
	l.n = 0;
	ck_assert_uint_eq(tap_consume_each_consumer(t, 1, UINT64_MAX, list_one, &l), 2);
	ck_assert_uint_eq(l.n, 1);
	/* the passes look at the channel's 3 unacked deliveries each (tags 2, 3 and the get's 6; the auto-acked ones were
	 * written at once): a bound of 3 counts the first consumer's and not the second's, 2 neither */
	l.n = 0;
	tap_consume_each_consumer(t, 4, 3, list_one, &l);
	ck_assert(l.info[0].unacked_known);
	ck_assert_uint_eq(l.info[0].unacked, 2);
	ck_assert(!l.info[1].unacked_known);
	l.n = 0;
	tap_consume_each_consumer(t, 4, 2, list_one, &l);
	ck_assert(!l.info[0].unacked_known);
	ck_assert(!l.info[1].unacked_known);
}
END_TEST

START_TEST(tags_are_per_channel)
{
	tap_track_channel_open(c, 1, T0);
	tap_track_channel_open(c, 2, T0);
	consume(1, "c1", "q", false);
	consume(2, "c2", "q", false);
	for (uint64_t tag = 1; tag <= 3; tag++) {
		struct tap_delivery d1 = dlv("c1", tag, NULL), d2 = dlv("c2", tag, NULL);
		tap_consume_deliver(c, 1, &d1, T0);
		tap_consume_deliver(c, 2, &d2, T0);
	}
	tap_consume_settle(c, 2, TAP_CONSUME_ACK, 3, true, false, T0 + 10);
	ck_assert_uint_eq(count_type("delivery"), 3);
	for (uint64_t tag = 1; tag <= 3; tag++)
		assert_field(dlv_rec(2, tag), "outcome", "\"ack\"");
	ck_assert_uint_eq(cstats().unacked, 3);
	tap_consume_settle(c, 1, TAP_CONSUME_NACK, 2, true, true, T0 + 20);
	tap_consume_settle(c, 1, TAP_CONSUME_REJECT, 3, false, false, T0 + 30);
	assert_field(dlv_rec(1, 1), "outcome", "\"nack\"");
	assert_field(dlv_rec(1, 1), "requeue", "true");
	assert_field(dlv_rec(1, 3), "outcome", "\"reject\"");
	assert_field(dlv_rec(1, 3), "requeue", "false");
	ck_assert_uint_eq(cstats().requeued, 2);
	ck_assert_uint_eq(cstats().by_outcome[TAP_CONSUME_OUT_NACK], 2);
	ck_assert_uint_eq(cstats().by_outcome[TAP_CONSUME_OUT_REJECT], 1);
	ck_assert_uint_eq(cstats().unacked, 0);
}
END_TEST

START_TEST(get_ok_and_get_empty)
{
	tap_track_channel_open(c, 1, T0);
	tap_consume_get(c, 1, S("q-empty"), false, T0);
	tap_consume_get(c, 1, S("q-manual"), false, T0);
	tap_consume_get(c, 1, S("q-auto"), true, T0);
	tap_consume_get_empty(c, 1, T0);
	struct tap_delivery d = dlv("", 1, "g1");
	d.get = true;
	d.redelivered = true;
	d.has_delivery_count = true;
	d.delivery_count = 2;
	tap_consume_deliver(c, 1, &d, T0 + 5);
	ck_assert_uint_eq(count_type("delivery"), 0);
	d.delivery_tag = 2;
	tap_consume_deliver(c, 1, &d, T0 + 6); /* no_ack get: written at once */
	ck_assert_uint_eq(count_type("delivery"), 1);
	assert_field(dlv_rec(1, 2), "outcome", "\"auto_ack\"");
	assert_field(dlv_rec(1, 2), "queue", "\"q-auto\"");
	assert_field(dlv_rec(1, 2), "get", "true");
	assert_field(dlv_rec(1, 2), "consumer_tag", "null");
	ck_assert_ptr_null(get(dlv_rec(1, 2), "settle_us"));
	tap_consume_settle(c, 1, TAP_CONSUME_ACK, 1, false, false, T0 + 50);
	const char *r = dlv_rec(1, 1);
	assert_field(r, "queue", "\"q-manual\"");
	assert_field(r, "redelivered", "true");
	assert_field(r, "delivery_count", "2");
	assert_field(r, "settle_us", "45");
	/* a get-ok with no basic.get seen (a capture begun after it): the queue is not known */
	d.delivery_tag = 3;
	d.get = false;
	d.consumer_tag = S("nobody");
	tap_consume_deliver(c, 1, &d, T0 + 60);
	struct tap_delivery g = dlv("", 4, NULL);
	g.get = true;
	tap_consume_deliver(c, 1, &g, T0 + 60);
	tap_consume_settle(c, 1, TAP_CONSUME_ACK, 4, true, false, T0 + 70);
	assert_field(dlv_rec(1, 4), "queue", "null");
	assert_field(dlv_rec(1, 3), "queue", "null"); /* an unknown consumer: taken as needing acks */
	assert_field(dlv_rec(1, 3), "outcome", "\"ack\"");
}
END_TEST

START_TEST(channel_close_ends_unacked_and_consumers)
{
	tap_track_channel_open(c, 1, T0);
	tap_consume_qos(c, 1, 5, false, T0);
	consume(1, "ct", "q", false);
	for (uint64_t tag = 1; tag <= 3; tag++) {
		struct tap_delivery d = dlv("ct", tag, NULL);
		tap_consume_deliver(c, 1, &d, T0);
	}
	tap_consume_settle(c, 1, TAP_CONSUME_ACK, 2, false, false, T0 + 1);
	tap_consume_channel_close(c, 1, TAP_BY_CLIENT, 200, S("Normal shutdown"), T0 + 2);
	tap_track_channel_close(c, 1, TAP_BY_CLIENT, 200, S("Normal shutdown"), T0 + 2);
	ck_assert_uint_eq(count_type("delivery"), 3);
	for (uint64_t tag = 1; tag <= 3; tag += 2) {
		const char *r = dlv_rec(1, tag);
		assert_field(r, "outcome", "\"unknown\"");
		assert_field(r, "reason", "{\"by\":\"channel_closed\",\"peer\":\"client\",\"code\":200,"
		                          "\"text\":\"Normal shutdown\"}");
		ck_assert_ptr_null(get(r, "settle_us"));
	}
	ck_assert_uint_eq(count_type("consumer"), 2);
	const char *k = nth("consumer", 1);
	assert_field(k, "event", "\"cancel\"");
	assert_field(k, "by", "\"channel_closed\"");
	assert_field(k, "deliveries", "3");
	/* an ack crossing the close: nothing more */
	tap_consume_settle(c, 1, TAP_CONSUME_ACK, 3, false, false, T0 + 3);
	ck_assert_uint_eq(count_type("delivery"), 3);
	/* the channel opened again: tags start at 1, a redelivery of the same message */
	tap_track_channel_close_ok(c, 1, T0 + 4);
	tap_track_channel_open(c, 1, T0 + 5);
	consume(1, "ct2", "q", false);
	struct tap_delivery d = dlv("ct2", 1, NULL);
	d.redelivered = true;
	tap_consume_deliver(c, 1, &d, T0 + 6);
	tap_consume_settle(c, 1, TAP_CONSUME_ACK, 1, false, false, T0 + 7);
	ck_assert_uint_eq(count_type("delivery"), 4);
	ck_assert_uint_eq(cstats().consumers_open, 1);
	ck_assert_uint_eq(cstats().redelivered, 1);
}
END_TEST

START_TEST(broker_cancel_and_client_cancel)
{
	tap_track_channel_open(c, 1, T0);
	consume(1, "gone", "deleted-q", false);
	tap_consume_consume(c, 1, S("mine"), S("q2"), true, true, true, T0); /* nowait: starts at once */
	ck_assert_uint_eq(count_type("consumer"), 2);
	assert_field(nth("consumer", 1), "exclusive", "true");
	assert_field(nth("consumer", 1), "no_ack", "true");
	assert_field(nth("consumer", 1), "prefetch", "null");
	struct tap_delivery d = dlv("gone", 1, NULL);
	tap_consume_deliver(c, 1, &d, T0);
	tap_consume_cancel(c, 1, S("gone"), TAP_BY_BROKER, true, T0 + 10);
	assert_field(nth("consumer", 2), "by", "\"broker\"");
	assert_field(nth("consumer", 2), "consumer_tag", "\"gone\"");
	tap_consume_settle(c, 1, TAP_CONSUME_ACK, 1, false, false, T0 + 20); /* acked after its consumer went */
	assert_field(dlv_rec(1, 1), "outcome", "\"ack\"");
	assert_field(dlv_rec(1, 1), "queue", "\"deleted-q\"");
	tap_consume_cancel(c, 1, S("mine"), TAP_BY_CLIENT, false, T0 + 30);
	ck_assert_uint_eq(count_type("consumer"), 3); /* until its cancel-ok */
	tap_consume_cancel_ok(c, 1, S("mine"), T0 + 31);
	assert_field(nth("consumer", 3), "by", "\"client\"");
	assert_field(nth("consumer", 3), "duration_us", "31");
	ck_assert_uint_eq(cstats().consumers_open, 0);
	ck_assert_uint_eq(cstats().consumers_total, 2);
}
END_TEST

START_TEST(auto_ack_cut_recover_and_connection_end)
{
	tap_track_channel_open(c, 1, T0);
	consume(1, "auto", "q", true);
	consume(1, "manual", "q", false);
	struct tap_delivery d = dlv("auto", 1, NULL);
	tap_consume_deliver(c, 1, &d, T0);
	assert_field(dlv_rec(1, 1), "outcome", "\"auto_ack\"");
	d = dlv("manual", 2, NULL);
	tap_consume_deliver(c, 1, &d, T0);
	d = dlv("manual", 3, NULL);
	tap_consume_deliver(c, 1, &d, T0);
	tap_consume_recover(c, 1, true, T0 + 1);
	assert_field(dlv_rec(1, 2), "reason", "{\"by\":\"recover\"}");
	assert_field(dlv_rec(1, 3), "outcome", "\"unknown\"");
	d = dlv("manual", 4, NULL);
	tap_consume_deliver(c, 1, &d, T0 + 2);
	d = dlv("manual", 5, NULL);
	d.content_cut = true;
	d.header_lost = true;
	tap_consume_deliver(c, 1, &d, T0 + 3);
	assert_field(dlv_rec(1, 5), "reason", "{\"by\":\"content_cut\"}");
	assert_field(dlv_rec(1, 5), "body_size", "null");
	tap_track_conn_end(c, "client_eof", T0 + 4);
	c = NULL;
	ck_assert_uint_eq(count_type("delivery"), 5);
	assert_field(dlv_rec(1, 4), "reason", "{\"by\":\"connection_closed\",\"peer\":\"client_eof\"}");
	/* records of the consumers come before the connection's close record */
	ck_assert(is_type(recs[n_recs - 1], "connection"));
	ck_assert_uint_eq(count_type("consumer"), 4);
	struct tap_consume_stats s = cstats();
	ck_assert_uint_eq(s.deliveries, s.delivery_records);
	ck_assert_uint_eq(s.unacked, 0);
	ck_assert_uint_eq(s.consumers_open, 0);
}
END_TEST

START_TEST(unacked_bounded_by_prefetch)
{
	tap_track_channel_open(c, 1, T0);
	tap_consume_qos(c, 1, 2, false, T0);
	consume(1, "ct", "q", false);
	uint64_t n = 2 + TAP_CONSUME_GET_SLACK + 3;
	for (uint64_t tag = 1; tag <= n; tag++) {
		struct tap_delivery d = dlv("ct", tag, NULL);
		tap_consume_deliver(c, 1, &d, T0 + (int64_t)tag);
	}
	ck_assert_uint_eq(count_type("delivery"), 3);
	assert_field(dlv_rec(1, 1), "reason", "{\"by\":\"evicted\",\"text\":\"unacked bound\"}");
	ck_assert_uint_eq(cstats().evicted, 3);
	ck_assert_uint_eq(cstats().unacked, n - 3);
	tap_consume_settle(c, 1, TAP_CONSUME_ACK, 0, true, false, T0 + 9999);
	ck_assert_uint_eq(count_type("delivery"), n);
}
END_TEST

START_TEST(unacked_counted_in_tracking_memory)
{
	struct tap_track_conf conf = {.max_memory = 256 * 1024};
	teardown();
	setup_conf(&conf);
	tap_track_channel_open(c, 1, T0);
	consume(1, "a-consumer-tag-of-some-length", "q", false);
	uint64_t before = stats().memory;
	struct tap_delivery d = dlv("a-consumer-tag-of-some-length", 1, "a-message-id-of-some-length");
	tap_consume_deliver(c, 1, &d, T0);
	ck_assert_uint_gt(stats().memory, before);
	for (uint64_t tag = 2; tag <= 20000; tag++) {
		d.delivery_tag = tag;
		tap_consume_deliver(c, 1, &d, T0);
	}
	ck_assert_uint_le(stats().memory, conf.max_memory);
	size_t evicted = cstats().evicted;
	ck_assert_uint_gt(evicted, 0);
	ck_assert_uint_eq(count_type("delivery"), evicted);
	assert_field(dlv_rec(1, 1), "reason", "{\"by\":\"evicted\",\"text\":\"max-tracking-memory\"}");
	tap_consume_settle(c, 1, TAP_CONSUME_ACK, 0, true, false, T0 + 1);
	ck_assert_uint_eq(count_type("delivery"), 20000);
	tap_consume_channel_close(c, 1, TAP_BY_CLIENT, 200, S(""), T0 + 2);
	tap_track_channel_close(c, 1, TAP_BY_CLIENT, 200, S(""), T0 + 2);
	tap_track_channel_close_ok(c, 1, T0 + 2);
	ck_assert_uint_le(stats().memory, before);
}
END_TEST


START_TEST(consumer_stalled_and_near_timeout)
{
	struct tap_track_conf conf = {.stall_after_us = 2000000, .consumer_timeout_us = 10000000};
	teardown();
	setup_conf(&conf);
	tap_track_channel_open(c, 1, T0);
	tap_consume_qos(c, 1, 3, false, T0);
	consume(1, "slow", "q", false);
	ck_assert_uint_eq(count_rule("unbounded_prefetch"), 0);
	for (uint64_t tag = 1; tag <= 3; tag++) {
		struct tap_delivery d = dlv("slow", tag, "m1");
		tap_consume_deliver(c, 1, &d, T0 + (int64_t)tag * 1000);
	}
	int64_t next = tap_track_tick(t, T0 + 1000000);
	ck_assert_uint_eq(count_rule("consumer_stalled"), 0);
	ck_assert_int_le(next, T0 + 3000 + 2000000);
	tap_consume_settle(c, 1, TAP_CONSUME_ACK, 1, false, false, T0 + 1500000); /* a settle: the clock starts over */
	struct tap_delivery d = dlv("slow", 4, "m4");
	tap_consume_deliver(c, 1, &d, T0 + 1600000); /* full again */
	(void)tap_track_tick(t, T0 + 3000000);
	ck_assert_uint_eq(count_rule("consumer_stalled"), 0);
	(void)tap_track_tick(t, T0 + 3600000);
	ck_assert_uint_eq(count_rule("consumer_stalled"), 1);
	const char *w = nth_rule("consumer_stalled", 0);
	assert_field(w, "unacked", "3");
	assert_field(w, "delivery_tag", "2");
	assert_field(w, "consumer_tag", "\"slow\"");
	assert_field(w, "stalled_us", "2000000");
	assert_field(w, "seq", "null");
	(void)tap_track_tick(t, T0 + 7999999);
	ck_assert_uint_eq(count_rule("unacked_near_timeout"), 0);
	(void)tap_track_tick(t, T0 + 8002000); /* 80 % of 10 s after tag 2 */
	ck_assert_uint_eq(count_rule("unacked_near_timeout"), 1);
	assert_field(nth_rule("unacked_near_timeout", 0), "delivery_tag", "2");
	assert_field(nth_rule("unacked_near_timeout", 0), "consumer_timeout_us", "10000000");
	(void)tap_track_tick(t, T0 + 9000000);
	ck_assert_uint_eq(count_rule("consumer_stalled") + count_rule("unacked_near_timeout"), 2); /* once each */
	ck_assert_uint_eq(stats().warnings_by_rule[TAP_TRACK_RULE_CONSUMER_STALLED], 1);
	/* the broker's consumer timeout: the channel close record names the delivery */
	const char *text = "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value used: "
	                   "10000 ms. This timeout value can be configured, see consumers doc guide to learn more";
	tap_consume_channel_close(c, 1, TAP_BY_BROKER, 406, S(text), T0 + 10002000);
	tap_track_channel_close(c, 1, TAP_BY_BROKER, 406, S(text), T0 + 10002000);
	tap_track_channel_close_ok(c, 1, T0 + 10002001);
	const char *close = NULL;
	for (size_t i = 0; i < n_recs; i++)
		if (is_type(recs[i], "channel") && !strcmp(get(recs[i], "event"), "\"close\""))
			close = recs[i];
	ck_assert_ptr_nonnull(close);
	assert_field(close, "timed_out_delivery", "{\"delivery_tag\":2,\"consumer_tag\":\"slow\",\"queue\":\"q\","
	                                          "\"message_id\":\"m1\",\"unacked_us\":10000000}");
	assert_field(dlv_rec(1, 2), "outcome", "\"unknown\"");
}
END_TEST

START_TEST(requeue_loop_unbounded_prefetch_global_qos)
{
	tap_track_channel_open(c, 1, T0);
	consume(1, "greedy", "q", false); /* manual acks, no basic.qos */
	ck_assert_uint_eq(count_rule("unbounded_prefetch"), 1);
	assert_field(nth_rule("unbounded_prefetch", 0), "consumer_tag", "\"greedy\"");
	assert_field(nth_rule("unbounded_prefetch", 0), "queue", "\"q\"");
	consume(1, "greedy2", "q", true); /* auto-ack: nothing to bound */
	ck_assert_uint_eq(count_rule("unbounded_prefetch"), 1);
	tap_consume_qos(c, 1, 50, true, T0);
	ck_assert_uint_eq(count_rule("global_qos"), 1);
	assert_field(nth_rule("global_qos", 0), "prefetch", "50");
	uint64_t tag = 1;
	for (unsigned i = 0; i < TAP_CONSUME_LOOP_REDELIVERIES + 5; i++) {
		struct tap_delivery other = dlv("greedy", tag++, "fine"); /* other messages come between */
		tap_consume_deliver(c, 1, &other, T0 + i);
		tap_consume_settle(c, 1, TAP_CONSUME_ACK, other.delivery_tag, false, false, T0 + i);
		struct tap_delivery d = dlv("greedy", tag++, "poison");
		d.redelivered = i > 0;
		tap_consume_deliver(c, 1, &d, T0 + i);
		tap_consume_settle(c, 1, TAP_CONSUME_REJECT, d.delivery_tag, false, true, T0 + i);
		if (i < TAP_CONSUME_LOOP_REDELIVERIES)
			ck_assert_uint_eq(count_rule("requeue_loop"), 0);
	}
	ck_assert_uint_eq(count_rule("requeue_loop"), 1);
	const char *w = nth_rule("requeue_loop", 0);
	assert_field(w, "message_id", "\"poison\"");
	assert_field(w, "redeliveries", "20");
	/* redeliveries spread out more than the window are no loop */
	tap_track_channel_open(c, 2, T0);
	consume(2, "slow", "q", false);
	for (unsigned i = 0; i < 40; i++) {
		struct tap_delivery d = dlv("slow", i + 1, "retried");
		d.redelivered = true;
		tap_consume_deliver(c, 2, &d, T0 + (int64_t)i * (TAP_CONSUME_LOOP_WINDOW_US / 10));
		tap_consume_settle(c, 2, TAP_CONSUME_NACK, d.delivery_tag, false, true, T0 + (int64_t)i * 6000000);
	}
	ck_assert_uint_eq(count_rule("requeue_loop"), 1);
}
END_TEST

START_TEST(fan_out_links_each_delivery_to_its_publish)
{
	struct tap_publish early = pub_id("x", "k", false, "before-any-consumer");
	tap_track_channel_open(c, 9, T0);
	tap_track_publish(c, 9, &early, T0);
	for (uint16_t ch = 1; ch <= 3; ch++) {
		tap_track_channel_open(c, ch, T0);
		consume(ch, "k", ch == 1 ? "q1" : ch == 2 ? "q2" : "q3", false);
	}
	struct tap_publish p = pub_id("fan", "", false, "fanned");
	tap_track_publish(c, 9, &p, T0 + 1000);
	for (uint16_t ch = 1; ch <= 3; ch++) {
		struct tap_delivery d = dlv("k", 1, "fanned");
		tap_consume_deliver(c, ch, &d, T0 + 1000 + 100 * ch);
		d = dlv("k", 2, "before-any-consumer");
		tap_consume_deliver(c, ch, &d, T0 + 1000 + 100 * ch);
		tap_consume_settle(c, ch, TAP_CONSUME_ACK, 2, true, false, T0 + 5000);
	}
	for (uint16_t ch = 1; ch <= 3; ch++) {
		char want[32];
		snprintf(want, sizeof want, "%d", 100 * ch);
		assert_field(dlv_rec(ch, 1), "queue_us", want);
		assert_field(dlv_rec(ch, 1), "end_to_end_us", "4000");
		ck_assert_ptr_null(get(dlv_rec(ch, 2), "queue_us")); /* published before the tap saw a consumer */
	}
}
END_TEST

/* Through the observer (conn_method.c, conn_content.c): a deliver whose header carries a message id and
 * x-delivery-count and whose body comes in two frames, the client's ack, and a second deliver cut by the end of the
 * connection before its body: both get their record. */
START_TEST(observer_decodes_the_consumer_side)
{
	struct tap_bytes cl = {0}, br = {0}, a = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	tap_build_tune_ok_open(&cl, "/");
	tap_build_method(&cl, 1, TAP_CHANNEL_OPEN, "", 1);
	tap_build_u32(&a, 0);
	tap_build_u16(&a, 10);
	tap_build_u8(&a, 0);
	tap_build_method(&cl, 1, TAP_BASIC_QOS, a.d, a.n);
	a.n = 0;
	tap_build_u16(&a, 0);
	tap_build_shortstr(&a, "q");
	tap_build_shortstr(&a, "");
	tap_build_u8(&a, 0);
	tap_build_u32(&a, 0);
	tap_build_method(&cl, 1, TAP_BASIC_CONSUME, a.d, a.n);
	a.n = 0;
	tap_build_shortstr(&a, "");
	tap_build_method(&br, 0, TAP_CONNECTION_OPEN_OK, a.d, a.n);
	a.n = 0;
	tap_build_shortstr(&a, "ctag");
	tap_build_method(&br, 1, TAP_BASIC_CONSUME_OK, a.d, a.n);
	for (uint64_t tag = 1; tag <= 2; tag++) {
		a.n = 0;
		tap_build_shortstr(&a, "ctag");
		tap_build_u64(&a, tag);
		tap_build_u8(&a, tag == 1);
		tap_build_shortstr(&a, "x");
		tap_build_shortstr(&a, "rk");
		tap_build_method(&br, 1, TAP_BASIC_DELIVER, a.d, a.n);
		a.n = 0;
		tap_build_u16(&a, 60);
		tap_build_u16(&a, 0);
		tap_build_u64(&a, 10);
		tap_build_u16(&a, (1u << 13) | (1u << 7)); /* headers, message-id */
		struct tap_bytes tbl = {0};
		tap_build_key(&tbl, "x-delivery-count", 'l');
		tap_build_u64(&tbl, 3);
		tap_build_u32(&a, (uint32_t)tbl.n);
		tap_build_raw(&a, tbl.d, tbl.n);
		tap_build_free(&tbl);
		tap_build_shortstr(&a, tag == 1 ? "m-1" : "m-2");
		tap_build_frame(&br, 2, 1, a.d, a.n);
		if (tag == 1) {
			tap_build_frame(&br, 3, 1, "hello", 5);
			tap_build_frame(&br, 3, 1, "world", 5);
		}
	}
	a.n = 0;
	tap_build_u64(&a, 1);
	tap_build_u8(&a, 0);
	size_t before_ack = cl.n;
	tap_build_method(&cl, 1, TAP_BASIC_ACK, a.d, a.n);
	struct tap_observer o;
	tap_observer_init(&o, t, capture, NULL, NULL, 0);
	struct tap_conn *k = tap_conn_new(&o, 9, "127.0.0.1:1", "127.0.0.1:2", T0);
	tap_conn_feed(k, TAP_C2S, (const uint8_t *)cl.d, before_ack, T0 + 1); /* all but the ack */
	tap_conn_feed(k, TAP_S2C, (const uint8_t *)br.d, br.n, T0 + 2);
	tap_conn_feed(k, TAP_C2S, (const uint8_t *)cl.d + before_ack, cl.n - before_ack, T0 + 10);
	ck_assert_uint_eq(count_type("delivery"), 1);
	const char *r = nth("delivery", 0);
	assert_field(r, "message_id", "\"m-1\"");
	assert_field(r, "delivery_count", "3");
	assert_field(r, "redelivered", "true");
	assert_field(r, "body_size", "10");
	assert_field(r, "exchange", "\"x\"");
	assert_field(r, "queue", "\"q\"");
	assert_field(r, "settle_us", "8");
	assert_field(r, "conn", "9");
	tap_conn_end(k, "broker_reset", T0 + 20);
	ck_assert_uint_eq(count_type("delivery"), 2);
	r = nth("delivery", 1);
	assert_field(r, "message_id", "\"m-2\"");
	assert_field(r, "reason", "{\"by\":\"content_cut\"}");
	tap_observer_deinit(&o);
	tap_build_free(&cl);
	tap_build_free(&br);
	tap_build_free(&a);
}
END_TEST

/* A content header (class 60, content-type "text/plain", no message id) and the body "hello" "world" in two frames,
 * the second left for the caller: what a publish and its delivery carry alike. */
static void build_content(struct tap_bytes *b, uint16_t ch)
{
	struct tap_bytes a = {0};
	tap_build_u16(&a, 60);
	tap_build_u16(&a, 0);
	tap_build_u64(&a, 10);
	tap_build_u16(&a, 1u << 15); /* content-type */
	tap_build_shortstr(&a, "text/plain");
	tap_build_frame(b, 2, ch, a.d, a.n);
	tap_build_frame(b, 3, ch, "hello", 5);
	tap_build_free(&a);
}

/* Without a message id a delivery is linked to its publish by their fingerprint (exchange, routing key, properties,
 * body), made as the frames pass: here the publish's and the delivery's bodies cross on one channel, each direction
 * hashed apart. With --identity off, nothing links them. */
static void link_by_fingerprint(unsigned identity_mode, bool linked)
{
	struct tap_track_conf conf = {.identity_mode = identity_mode};
	struct tap_track *tr = tap_track_new(&conf, capture, NULL);
	struct tap_bytes cl = {0}, br = {0}, cl2 = {0}, br2 = {0}, a = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	tap_build_tune_ok_open(&cl, "/");
	tap_build_method(&cl, 1, TAP_CHANNEL_OPEN, "", 1);
	tap_build_u16(&a, 0);
	tap_build_shortstr(&a, "q");
	tap_build_shortstr(&a, "");
	tap_build_u8(&a, 0);
	tap_build_u32(&a, 0);
	tap_build_method(&cl, 1, TAP_BASIC_CONSUME, a.d, a.n);
	a.n = 0;
	tap_build_u16(&a, 0);
	tap_build_shortstr(&a, "x");
	tap_build_shortstr(&a, "rk");
	tap_build_u8(&a, 0);
	tap_build_method(&cl, 1, TAP_BASIC_PUBLISH, a.d, a.n);
	build_content(&cl, 1);
	tap_build_frame(&cl2, 3, 1, "world", 5);
	a.n = 0;
	tap_build_shortstr(&a, "");
	tap_build_method(&br, 0, TAP_CONNECTION_OPEN_OK, a.d, a.n);
	a.n = 0;
	tap_build_shortstr(&a, "ctag");
	tap_build_method(&br, 1, TAP_BASIC_CONSUME_OK, a.d, a.n);
	a.n = 0;
	tap_build_shortstr(&a, "ctag");
	tap_build_u64(&a, 1);
	tap_build_u8(&a, 0);
	tap_build_shortstr(&a, "x");
	tap_build_shortstr(&a, "rk");
	tap_build_method(&br, 1, TAP_BASIC_DELIVER, a.d, a.n);
	build_content(&br, 1);
	tap_build_frame(&br2, 3, 1, "world", 5);
	struct tap_observer o;
	tap_observer_init(&o, tr, capture, NULL, NULL, 0);
	struct tap_conn *k = tap_conn_new(&o, 4, "127.0.0.1:1", "127.0.0.1:2", T0);
	tap_conn_feed(k, TAP_C2S, (const uint8_t *)cl.d, cl.n, T0 + 1);
	tap_conn_feed(k, TAP_S2C, (const uint8_t *)br.d, br.n, T0 + 2);
	tap_conn_feed(k, TAP_C2S, (const uint8_t *)cl2.d, cl2.n, T0 + 3); /* the publish ends */
	tap_conn_feed(k, TAP_S2C, (const uint8_t *)br2.d, br2.n, T0 + 5); /* and its delivery */
	tap_conn_end(k, "client_eof", T0 + 9);
	ck_assert_uint_eq(count_type("delivery"), 1);
	if (linked)
		assert_field(nth("delivery", 0), "queue_us", "2");
	else
		ck_assert_ptr_null(get(nth("delivery", 0), "queue_us"));
	tap_observer_deinit(&o);
	tap_track_free(tr);
	tap_build_free(&cl);
	tap_build_free(&cl2);
	tap_build_free(&br);
	tap_build_free(&br2);
	tap_build_free(&a);
}

START_TEST(delivery_linked_by_fingerprint)
{
	link_by_fingerprint(TAP_IDENTITY_AUTO, true);
	reset_recs();
	link_by_fingerprint(TAP_IDENTITY_OFF, false);
}
END_TEST

/* One broker delivery (deliver, header with a message id, a 4-byte body) on channel ch. */
static void build_delivery(struct tap_bytes *br, uint16_t ch, uint64_t tag)
{
	struct tap_bytes a = {0};
	tap_build_shortstr(&a, "ctag");
	tap_build_u64(&a, tag);
	tap_build_u8(&a, 0);
	tap_build_shortstr(&a, "x");
	tap_build_shortstr(&a, "rk");
	tap_build_method(br, ch, TAP_BASIC_DELIVER, a.d, a.n);
	a.n = 0;
	tap_build_u16(&a, 60);
	tap_build_u16(&a, 0);
	tap_build_u64(&a, 4);
	tap_build_u16(&a, 1u << 7); /* message-id */
	tap_build_shortstr(&a, "m");
	tap_build_frame(br, 2, ch, a.d, a.n);
	tap_build_frame(br, 3, ch, "body", 4);
	tap_build_free(&a);
}

/* Deliveries on 3,000 channels of one connection under a 64 KiB budget: past it the decoder has no state for a
 * channel (conn_channel_get), or the tracker none to keep a delivery in; each is still written, at once, unknown,
 * reason no_memory ("channel not followed" when its content was never read: body_size and message_id null,
 * details_lost), and counted. Exactly one record per delivery; the tracker's memory never passes the budget. */
START_TEST(deliveries_past_the_budget_are_written_at_once)
{
	enum { BUDGET = 64 * 1024, N = 3000 };
	struct tap_track_conf conf = {.max_memory = BUDGET};
	teardown();
	setup_conf(&conf);
	struct tap_bytes cl = {0}, br = {0}, a = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	tap_build_tune_ok_open(&cl, "/");
	tap_build_shortstr(&a, "");
	tap_build_method(&br, 0, TAP_CONNECTION_OPEN_OK, a.d, a.n);
	for (uint16_t ch = 1; ch <= N; ch++)
		build_delivery(&br, ch, 1);
	struct tap_observer o;
	tap_observer_init(&o, t, capture, NULL, NULL, 0);
	struct tap_conn *k = tap_conn_new(&o, 9, "127.0.0.1:1", "127.0.0.1:2", T0);
	tap_conn_feed(k, TAP_C2S, (const uint8_t *)cl.d, cl.n, T0 + 1);
	tap_conn_feed(k, TAP_S2C, (const uint8_t *)br.d, br.n, T0 + 2);
	ck_assert_uint_le(stats().memory_peak, BUDGET);
	struct tap_consume_stats s = cstats();
	ck_assert_uint_eq(s.deliveries, N);
	ck_assert_uint_gt(s.unfollowed, N / 2);
	ck_assert_uint_eq(s.delivery_records + s.unacked, N);
	ck_assert_uint_eq(count_type("delivery"), s.unfollowed);
	size_t unread = 0;
	for (size_t i = 0; i < n_recs; i++) {
		if (!is_type(recs[i], "delivery"))
			continue;
		assert_field(recs[i], "outcome", "\"unknown\"");
		if (strcmp(get(recs[i], "reason"), "{\"by\":\"no_memory\",\"text\":\"channel not followed\"}"))
			continue;
		unread++;
		assert_field(recs[i], "body_size", "null");
		assert_field(recs[i], "message_id", "null");
		assert_field(recs[i], "details_lost", "true");
		assert_field(recs[i], "consumer_tag", "\"ctag\"");
		assert_field(recs[i], "routing_key", "\"rk\"");
	}
	ck_assert_uint_gt(unread, 0);
	/* the ones kept are acked (channel 1's) or end with the connection */
	a.n = 0;
	tap_build_u64(&a, 1);
	tap_build_u8(&a, 0);
	cl.n = 0;
	tap_build_method(&cl, 1, TAP_BASIC_ACK, a.d, a.n);
	tap_conn_feed(k, TAP_C2S, (const uint8_t *)cl.d, cl.n, T0 + 10);
	assert_field(dlv_rec(1, 1), "outcome", "\"ack\"");
	tap_conn_end(k, "broker_reset", T0 + 20);
	ck_assert_uint_eq(count_type("delivery"), N);
	ck_assert_uint_eq(cstats().delivery_records, N);
	ck_assert_uint_eq(cstats().unacked, 0);
	tap_observer_deinit(&o);
	tap_build_free(&cl);
	tap_build_free(&br);
	tap_build_free(&a);
}
END_TEST

/* Random consumers, deliveries, settles, gets, recovers and closes on a few channels: every delivery gets exactly
 * one record, and none is left once the connection ends. */
START_TEST(randomized_one_record_per_delivery)
{
	rng_state = 0x9e3779b97f4a7c15ull + (uint64_t)_i;
	uint64_t next_tag[4] = {1, 1, 1, 1};
	uint64_t delivered = 0;
	for (uint16_t ch = 1; ch <= 3; ch++) {
		tap_track_channel_open(c, ch, T0);
		consume(ch, "k1", "q", false);
		consume(ch, "k2", "q", rnd(2));
	}
	for (int step = 0; step < 3000; step++) {
		uint16_t ch = (uint16_t)(1 + rnd(3));
		int64_t now = T0 + step;
		switch (rnd(10)) {
		case 0: case 1: case 2: case 3: {
			struct tap_delivery d = dlv(rnd(2) ? "k1" : "k2", next_tag[ch]++, NULL);
			if (rnd(8) == 0) {
				d.get = true;
				tap_consume_get(c, ch, S("q"), rnd(2), now);
			}
			d.content_cut = rnd(50) == 0;
			tap_consume_deliver(c, ch, &d, now);
			delivered++;
			break;
		}
		case 4: case 5:
			tap_consume_settle(c, ch, TAP_CONSUME_ACK, next_tag[ch] - rnd(5), rnd(2), false, now);
			break;
		case 6:
			tap_consume_settle(c, ch, TAP_CONSUME_NACK, next_tag[ch] - rnd(5), rnd(2), rnd(2), now);
			break;
		case 7:
			tap_consume_settle(c, ch, TAP_CONSUME_REJECT, next_tag[ch] - rnd(5), false, rnd(2), now);
			break;
		case 8:
			if (rnd(10) == 0)
				tap_consume_recover(c, ch, true, now);
			break;
		default:
			if (rnd(20) == 0) {
				tap_consume_channel_close(c, ch, TAP_BY_BROKER, 406, S("PRECONDITION_FAILED"), now);
				tap_track_channel_close(c, ch, TAP_BY_BROKER, 406, S("PRECONDITION_FAILED"), now);
				tap_track_channel_close_ok(c, ch, now);
				tap_track_channel_open(c, ch, now);
				next_tag[ch] = 1;
				consume(ch, "k1", "q", false);
				consume(ch, "k2", "q", false);
			}
			break;
		}
		struct tap_consume_stats s = cstats();
		REQUIRE(s.delivery_records + s.unacked == delivered, "records %llu + unacked %llu != %llu",
		        (unsigned long long)s.delivery_records, (unsigned long long)s.unacked,
		        (unsigned long long)delivered);
	}
	tap_track_conn_end(c, "broker_reset", T0 + 5000);
	c = NULL;
	ck_assert_uint_eq(count_type("delivery"), delivered);
	for (uint16_t ch = 1; ch <= 3; ch++)
		for (uint64_t tag = 1; tag < next_tag[ch]; tag++)
			(void)tag; /* tags repeat across reopened channels: the count above is the check */
	ck_assert_uint_eq(cstats().unacked, 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("consume");
	TCase *tc = tcase_create("core");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, multiple_ack_over_interleaved_consumers);
	tcase_add_test(tc, consumers_listed_with_their_unacked);
	tcase_add_test(tc, delivery_linked_by_fingerprint);
	tcase_add_test(tc, tags_are_per_channel);
	tcase_add_test(tc, get_ok_and_get_empty);
	tcase_add_test(tc, channel_close_ends_unacked_and_consumers);
	tcase_add_test(tc, broker_cancel_and_client_cancel);
	tcase_add_test(tc, auto_ack_cut_recover_and_connection_end);
	tcase_add_test(tc, unacked_bounded_by_prefetch);
	tcase_add_test(tc, unacked_counted_in_tracking_memory);
	tcase_add_test(tc, consumer_stalled_and_near_timeout);
	tcase_add_test(tc, requeue_loop_unbounded_prefetch_global_qos);
	tcase_add_test(tc, fan_out_links_each_delivery_to_its_publish);
	tcase_add_test(tc, observer_decodes_the_consumer_side);
	tcase_add_test(tc, deliveries_past_the_budget_are_written_at_once);
	tcase_add_loop_test(tc, randomized_one_record_per_delivery, 0, 4);
	suite_add_tcase(s, tc);
	return track_suite_run(s);
}
