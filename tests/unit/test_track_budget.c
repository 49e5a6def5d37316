/* The tracker's bounds: max_outstanding and the memory budget evict the oldest outstanding publishes (of the
 * connection, of the process, in publish order), the tick writes due holds in deadline order, and memory is given
 * back after a burst or a peak of connections. */
#include "amqptap/track.h"

#include <check.h>

#include "fail_alloc.h"
#include "tap_build.h"
#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "track_fixture.h"

START_TEST(eviction_at_max_outstanding)
{
	struct tap_track_conf conf = {.max_outstanding = 3};
	teardown();
	setup_conf(&conf);
	confirm_channel(1);
	confirm_channel(2);
	struct tap_publish p = pub("x", "k", false);
	tap_track_publish(c, 1, &p, T0 + 1);
	tap_track_publish(c, 2, &p, T0 + 2);
	tap_track_publish(c, 1, &p, T0 + 3);
	ck_assert_uint_eq(count_type("publish"), 0);
	tap_track_publish(c, 2, &p, T0 + 4);
	tap_track_publish(c, 2, &p, T0 + 5);
	ck_assert_uint_eq(n_seen, 2);
	const struct seen *a = verdict(0), *b = verdict(1);
	ck_assert_uint_eq(a->v.channel, 1);
	ck_assert_uint_eq(a->v.seq, 1);
	assert_verdict(a, UNKNOWN, CONFIRM_UNKNOWN, NO_ORDER);
	assert_reason(a, "evicted", -1, "");
	assert_field(nth("publish", 0), "reason", "{\"by\":\"evicted\"}");
	ck_assert_uint_eq(b->v.channel, 2);
	ck_assert_uint_eq(b->v.seq, 1);
	ck_assert_uint_eq(stats().evicted, 2);
	ck_assert_uint_eq(stats().outstanding, 3);
	tap_track_ack(c, 2, 3, true, T0 + 6);
	ck_assert_uint_eq(n_seen, 4);
	ck_assert_uint_eq(stats().stray_confirms, 0);
}
END_TEST

/* A confirm client that never reads its acks: past the budget the oldest publishes are written unknown/evicted,
 * the tracker's memory never exceeds the budget, every publish gets exactly one record (the acks that come at
 * last find the evicted ones gone), and the memory is given back when they are answered. */
START_TEST(memory_budget_evicts_the_oldest)
{
	enum { BUDGET = 256 * 1024, N = 20000 };
	struct tap_track_conf conf = {.max_memory = BUDGET};
	teardown();
	setup_conf(&conf);
	confirm_channel(1);
	uint64_t base = stats().memory;
	ck_assert_uint_lt(base, 16384);
	char mid[32], key[96];
	struct tap_slice hk = {(const uint8_t *)key, 0};
	struct tap_publish p = pub("x", "k", true);
	p.has_message_id = true;
	p.header_keys = &hk;
	p.n_header_keys = 1;
	uint64_t peak = 0;
	for (int i = 1; i <= N; i++) {
		snprintf(mid, sizeof mid, "m%d", i);
		hk.len = (size_t)snprintf(key, sizeof key, "x-unique-header-key-%d-%040d", i, i); /* no sharing */
		p.message_id = S(mid);
		tap_track_publish(c, 1, &p, T0 + i);
		uint64_t m = stats().memory;
		peak = m > peak ? m : peak;
		REQUIRE(m <= BUDGET, "publish %d: %llu bytes over the budget", i, (unsigned long long)m);
	}
	struct tap_track_stats s = stats();
	ck_assert_uint_gt(peak, BUDGET - BUDGET / 8); /* it did fill the budget */
	ck_assert_uint_gt(s.evicted_memory, N / 2);
	ck_assert_uint_eq(s.evicted, s.evicted_memory);
	ck_assert_uint_eq(s.memory_peak, peak);
	ck_assert_uint_eq(n_seen, s.evicted_memory);
	for (size_t i = 0; i < n_seen; i++) { /* the oldest went first, in order */
		REQUIRE(seen[i].v.seq == i + 1, "eviction %zu took seq %llu", i, (unsigned long long)seen[i].v.seq);
		REQUIRE(seen[i].v.route == UNKNOWN && seen[i].v.confirm == CONFIRM_UNKNOWN, "verdict of %zu", i);
		REQUIRE(!strcmp(seen[i].reason_by, "evicted") && !strcmp(seen[i].reason_text, "max-tracking-memory"),
		        "reason of %zu", i);
	}
	assert_field(pub_seq(1), "reason", "{\"by\":\"evicted\",\"text\":\"max-tracking-memory\"}");
	tap_track_ack(c, 1, N, true, T0 + N + 1);
	tap_track_tick(t, T0 + N + 1 + TAP_TRACK_LATE_RETURN_US_DEFAULT);
	s = stats();
	ck_assert_uint_eq(s.publish_records, N);
	ck_assert_uint_eq(s.outstanding, 0);
	ck_assert_uint_eq(n_seen, N);
	ck_assert_uint_eq(s.routed, N - s.evicted_memory);
	/* rings, arena and strings given back; the window of recent message ids (duplicate_message_id) stays */
	ck_assert_uint_lt(s.memory, base + 8192 + TAP_TRACK_RECENT_IDS * 24 + 256);
}
END_TEST

START_TEST(memory_budget_evicts_across_connections)
{
	enum { BUDGET = 128 * 1024 };
	struct tap_track_conf conf = {.max_memory = BUDGET};
	teardown();
	setup_conf(&conf);
	confirm_channel(1);
	struct tap_publish p = pub("x", "k", false);
	for (int i = 0; i < 100; i++)
		tap_track_publish(c, 1, &p, T0 + i); /* older, on conn 3 */
	struct tap_track_conn *c2 = tap_track_conn_new(t, 4, "127.0.0.1:2", "127.0.0.1:5672", T0);
	tap_track_channel_open(c2, 1, T0);
	tap_track_confirm_select(c2, 1, T0);
	char mid[32];
	p.has_message_id = true;
	for (int i = 0; i < 5000 && stats().evicted_memory < 150; i++) {
		snprintf(mid, sizeof mid, "%d", i);
		struct tap_publish q = pub(mid, mid, false);
		tap_track_publish(c2, 1, &q, T0 + 1000 + i);
	}
	ck_assert_uint_ge(stats().evicted_memory, 150);
	for (size_t i = 0; i < 100; i++) /* conn 3's first: they are the oldest */
		ck_assert_uint_eq(verdict(i)->v.conn, 3);
	ck_assert_uint_eq(verdict(100)->v.conn, 4);
	ck_assert_uint_le(stats().memory, BUDGET);
}
END_TEST

/* Many connections, each holding one acked mandatory publish for a late Return, acked in an order unlike the
 * order the connections were opened in: a tick writes exactly the publishes whose hold has ended, in the order
 * their holds end, and returns the next end (the tracker finds the due connections by deadline). */
START_TEST(ticks_write_due_holds_in_deadline_order_across_connections)
{
	enum { CONNS = 300, STEP = 10 };
	struct tap_track_conn *cs[CONNS];
	int order[CONNS]; /* order[j]: the connection acked j-th */
	for (int i = 0; i < CONNS; i++) {
		cs[i] = tap_track_conn_new(t, 100 + (uint64_t)i, "c", "u", T0);
		tap_track_channel_open(cs[i], 1, T0);
		tap_track_confirm_select(cs[i], 1, T0);
		struct tap_publish p = pub("x", "k", true);
		tap_track_publish(cs[i], 1, &p, T0 + 1);
		order[i] = i;
	}
	rng_state = 777;
	for (int i = CONNS - 1; i > 0; i--) {
		int k = (int)rnd((uint64_t)i + 1), x = order[i];
		order[i] = order[k];
		order[k] = x;
	}
	for (int j = 0; j < CONNS; j++)
		tap_track_ack(cs[order[j]], 1, 1, false, T0 + 100 + (int64_t)j * STEP); /* held until + LATE */
	ck_assert_uint_eq(stats().held, CONNS);
	const int64_t end0 = T0 + 100 + TAP_TRACK_LATE_RETURN_US_DEFAULT; /* the first hold's end */
	ck_assert_int_eq(tap_track_tick(t, end0 - 1), end0);
	ck_assert_uint_eq(n_seen, 0);
	/* one tick per hold's end for the first half, then one tick for the rest: the same order either way */
	for (int j = 0; j < CONNS / 2; j++) {
		int64_t next = tap_track_tick(t, end0 + (int64_t)j * STEP);
		REQUIRE(n_seen == (size_t)j + 1, "tick %d wrote %zu verdicts", j, n_seen);
		REQUIRE(next == end0 + (int64_t)(j + 1) * STEP, "tick %d: next deadline %lld", j, (long long)next);
	}
	ck_assert_int_eq(tap_track_tick(t, end0 + CONNS * STEP), INT64_MAX);
	ck_assert_uint_eq(n_seen, CONNS);
	for (int j = 0; j < CONNS; j++) {
		REQUIRE(seen[j].v.conn == 100 + (uint64_t)order[j], "verdict %d is of conn %llu, not %d", j,
		        (unsigned long long)seen[j].v.conn, 100 + order[j]);
		REQUIRE(seen[j].v.route == ROUTED && seen[j].v.confirm == ACK, "verdict %d", j);
	}
	ck_assert_uint_eq(stats().held, 0);
}
END_TEST

/* Fifty connections, two channels each, publishing in a random order and acking some: whatever the budget evicts
 * goes in publish order (the oldest outstanding publish of the process first). */
START_TEST(memory_budget_evicts_in_publish_order_across_many_connections)
{
	enum { BUDGET = 2 * 1024 * 1024, CONNS = 50 };
	struct tap_track_conf conf = {.max_memory = BUDGET};
	teardown();
	setup_conf(&conf);
	struct tap_track_conn *cs[CONNS];
	uint64_t seqs[CONNS][3] = {{0}};
	for (int i = 0; i < CONNS; i++) {
		cs[i] = tap_track_conn_new(t, 100 + (uint64_t)i, "c", "u", T0);
		tap_track_channel_open(cs[i], 1, T0);
		tap_track_confirm_select(cs[i], 1, T0);
		tap_track_channel_open(cs[i], 2, T0);
		tap_track_confirm_select(cs[i], 2, T0);
	}
	rng_state = 12345;
	char key[48];
	struct tap_slice hk = {(const uint8_t *)key, 0};
	for (int i = 0; i < 20000; i++) {
		int k = (int)rnd(CONNS);
		uint16_t ch = (uint16_t)(1 + rnd(2));
		struct tap_publish p = pub("x", "k", false);
		hk.len = (size_t)snprintf(key, sizeof key, "unique-%d", i);
		p.header_keys = &hk;
		p.n_header_keys = 1;
		tap_track_publish(cs[k], ch, &p, T0 + i);
		seqs[k][ch]++;
		if (rnd(8) == 0 && seqs[k][ch] > 200)
			tap_track_ack(cs[k], ch, seqs[k][ch] - 200, true, T0 + i);
		REQUIRE(stats().memory <= BUDGET, "publish %d: %llu bytes", i, (unsigned long long)stats().memory);
	}
	struct tap_track_stats s = stats();
	ck_assert_uint_gt(s.evicted_memory, 1000);
	int64_t last = 0;
	size_t n = 0;
	for (size_t i = 0; i < n_seen; i++) {
		if (strcmp(seen[i].reason_text, "max-tracking-memory") != 0)
			continue;
		REQUIRE(seen[i].v.t_pub >= last, "eviction %zu of a publish at %lld after one at %lld", i,
		        (long long)seen[i].v.t_pub, (long long)last);
		last = seen[i].v.t_pub;
		n++;
	}
	ck_assert_uint_eq(n, s.evicted_memory);
	tap_track_shutdown(t, T0 + 30000);
	c = NULL;
	ck_assert_uint_eq(stats().publish_records, 20000);
}
END_TEST

/* A burst of non-confirm mandatory publishes held for their return window: once their records are written, the
 * channel's ring, arena and queues and the connection's strings are given back. */
START_TEST(memory_given_back_after_a_burst)
{
	tap_track_channel_open(c, 1, T0);
	uint64_t base = stats().memory;
	char key[40];
	struct tap_slice hk = {(const uint8_t *)key, 0};
	for (int i = 0; i < 6000; i++) {
		struct tap_publish p = pub("x", "k", true);
		hk.len = (size_t)snprintf(key, sizeof key, "h%d", i);
		p.header_keys = &hk;
		p.n_header_keys = 1;
		tap_track_publish(c, 1, &p, T0 + i);
	}
	uint64_t full = stats().memory;
	ck_assert_uint_gt(full, base + 6000 * 64);
	ck_assert_uint_lt(full, base + 6000 * 300);
	tap_track_tick(t, T0 + 3000 + TAP_TRACK_RETURN_WINDOW_US_DEFAULT); /* the first half */
	ck_assert_uint_lt(stats().memory, full);
	tap_track_tick(t, T0 + 6000 + TAP_TRACK_RETURN_WINDOW_US_DEFAULT);
	ck_assert_uint_eq(stats().outstanding, 0);
	ck_assert_uint_eq(n_seen, 6000);
	ck_assert_uint_lt(stats().memory, base + 8192);
}
END_TEST

/* A peak of connections, each with a publish outstanding (so in the timer heap and in the heap of channels by oldest
 * publish), then all of them gone: the heaps' arrays shrink with them and the memory comes back. */
START_TEST(memory_given_back_after_a_peak_of_connections)
{
	enum { CONNS = 4000 };
	static struct tap_track_conn *cs[CONNS];
	uint64_t base = stats().memory;
	for (int i = 0; i < CONNS; i++) {
		cs[i] = tap_track_conn_new(t, 100 + (uint64_t)i, "c", "u", T0);
		REQUIRE(cs[i], "connection %d", i);
		tap_track_channel_open(cs[i], 1, T0);
		struct tap_publish p = pub("x", "k", true);
		tap_track_publish(cs[i], 1, &p, T0 + 1);
	}
	uint64_t peak = stats().memory;
	ck_assert_uint_gt(peak, base + CONNS * 2 * 16); /* both heaps hold every connection */
	for (int i = 0; i < CONNS; i++)
		tap_track_conn_end(cs[i], "client_reset", T0 + 2);
	ck_assert_uint_eq(n_seen, CONNS);
	ck_assert_uint_eq(stats().connections_open, 1);
	/* what is left of the heaps: at most 4 x 16 entries each, where the peak had 4,096 each (128 KiB) */
	ck_assert_uint_lt(stats().memory, base + 2 * 64 * 16 + 8192);
	/* and they grow again: a timer and an outstanding publish on a new connection */
	struct tap_track_conn *d = tap_track_conn_new(t, 99, "c", "u", T0 + 3);
	ck_assert_ptr_nonnull(d);
	tap_track_channel_open(d, 1, T0 + 3);
	struct tap_publish p = pub("x", "k", true);
	tap_track_publish(d, 1, &p, T0 + 3);
	tap_track_tick(t, T0 + 3 + TAP_TRACK_RETURN_WINDOW_US_DEFAULT);
	ck_assert_uint_eq(n_seen, CONNS + 1);
}
END_TEST

/* Channels by the thousand, each with one publish answered, hold no publish the budget could evict: past the budget
 * a channel is not followed (its open record says so, its publishes are written at once, unknown, no_memory), the
 * idle ones keep no buffers once the budget is spent, and what the observer charges for its own channel table
 * counts in the same budget (refused when it does not fit). The tracker's memory never passes the budget. */
START_TEST(channels_past_the_budget_are_not_followed)
{
	enum { BUDGET = 64 * 1024, N = 2000 };
	struct tap_track_conf conf = {.max_memory = BUDGET};
	teardown();
	setup_conf(&conf);
	struct tap_publish p = pub("x", "k", false);
	for (uint16_t ch = 1; ch <= N; ch++) {
		confirm_channel(ch);
		tap_track_publish(c, ch, &p, T0 + ch);
		tap_track_ack(c, ch, 1, false, T0 + ch);
		ck_assert_uint_le(stats().memory, BUDGET);
	}
	ck_assert_uint_eq(count_type("publish"), N);
	ck_assert_uint_le(stats().memory_peak, BUDGET);
	size_t opens = 0, unfollowed = 0, unknown = 0;
	for (size_t i = 0; i < n_recs; i++) {
		if (!is_type(recs[i], "channel") || strcmp(get(recs[i], "event"), "\"open\""))
			continue;
		opens++;
		if (get(recs[i], "followed")) {
			assert_field(recs[i], "followed", "false");
			unfollowed++;
		}
	}
	for (size_t k = 0; k < N; k++)
		unknown += verdict(k)->v.route == TAP_TRACK_ROUTE_UNKNOWN;
	ck_assert_uint_eq(opens, N);
	ck_assert_uint_gt(unfollowed, N / 2); /* most: 2 KB a channel kept buffers, 300 B without */
	ck_assert_uint_eq(stats().chans_unfollowed, unfollowed);
	ck_assert_uint_ge(unknown, unfollowed);
	assert_reason(verdict(N - 1), "no_memory", -1, "");
	ck_assert(!tap_track_conn_charge(c, BUDGET, T0 + N + 1));
	ck_assert_uint_le(stats().memory, BUDGET);
	uint64_t room = BUDGET - stats().memory;
	ck_assert(tap_track_conn_charge(c, room, T0 + N + 2));
	ck_assert_uint_eq(stats().memory, BUDGET);
	tap_track_conn_uncharge(c, room);
	ck_assert_uint_eq(stats().memory, BUDGET - room);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("track_budget");
	TCase *tc = track_tcase("budget");
	tcase_add_test(tc, eviction_at_max_outstanding);
	tcase_add_test(tc, memory_budget_evicts_the_oldest);
	tcase_add_test(tc, memory_budget_evicts_across_connections);
	tcase_add_test(tc, memory_budget_evicts_in_publish_order_across_many_connections);
	tcase_add_test(tc, ticks_write_due_holds_in_deadline_order_across_connections);
	tcase_add_test(tc, memory_given_back_after_a_burst);
	tcase_add_test(tc, memory_given_back_after_a_peak_of_connections);
	tcase_add_test(tc, channels_past_the_budget_are_not_followed);
	suite_add_tcase(s, tc);
	return track_suite_run(s);
}
