/* The publisher warnings of src/DESIGN.md §4 (src/core/track_warn.c) and the blocked annotation, through the tracker's
 * API: each rule fires on its anti-pattern, once per channel (channel_churn: per connection), is counted by rule,
 * and stays quiet on a well-behaved publisher (persistent, unique message ids, pipelined confirms, one channel). */
#include "amqptap/track.h"

#include <check.h>

#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RECS 20000
#define T0 1795947302000000LL

static char *recs[MAX_RECS];
static size_t n_recs;
static struct tap_track *t;
static struct tap_track_conn *c;

static void capture(void *ctx, const char *json, size_t len)
{
	(void)ctx;
	if (n_recs == MAX_RECS)
		ck_abort_msg("too many records");
	recs[n_recs] = malloc(len + 1);
	memcpy(recs[n_recs], json, len);
	recs[n_recs][len] = '\0';
	n_recs++;
}

static struct tap_slice S(const char *s)
{
	return (struct tap_slice){(const uint8_t *)s, strlen(s)};
}

static void setup(void)
{
	t = tap_track_new(NULL, capture, NULL);
	ck_assert_ptr_nonnull(t);
	c = tap_track_conn_new(t, 7, "127.0.0.1:40000", "127.0.0.1:5672", T0);
	tap_track_conn_open(c, S("/"), T0);
}

static void teardown(void)
{
	tap_track_free(t);
	for (size_t i = 0; i < n_recs; i++)
		free(recs[i]);
	n_recs = 0;
}

/* Warnings of rule (NULL: any) written so far. */
static size_t warnings(const char *rule)
{
	char want[80];
	snprintf(want, sizeof want, "\"rule\":\"%s\"", rule ? rule : "");
	size_t n = 0;
	for (size_t i = 0; i < n_recs; i++)
		if (!strncmp(recs[i], "{\"type\":\"warning\"", 17) && (!rule || strstr(recs[i], want)))
			n++;
	return n;
}

static const char *warning_of(const char *rule)
{
	char want[80];
	snprintf(want, sizeof want, "\"rule\":\"%s\"", rule);
	for (size_t i = 0; i < n_recs; i++)
		if (!strncmp(recs[i], "{\"type\":\"warning\"", 17) && strstr(recs[i], want))
			return recs[i];
	ck_abort_msg("no %s warning", rule);
	return NULL;
}

static uint64_t counted(enum tap_track_rule rule)
{
	struct tap_track_stats s;
	tap_track_get_stats(t, &s);
	return s.warnings_by_rule[rule];
}

/* A well-behaved publish: persistent, with a message id unique in the test. */
static struct tap_publish good(void)
{
	static char ids[64][24];
	static unsigned k;
	char *id = ids[k++ % 64];
	snprintf(id, sizeof ids[0], "id-%u", k);
	return (struct tap_publish){.exchange = S("x"), .routing_key = S("k"), .has_message_id = true,
	                            .message_id = S(id), .has_delivery_mode = true, .delivery_mode = 2,
	                            .body_size = 10};
}

static void confirm_channel(uint16_t ch, int64_t now)
{
	tap_track_channel_open(c, ch, now);
	tap_track_confirm_select(c, ch, now);
}

/* ---- the well-behaved publisher ---- */

START_TEST(quiet_on_a_well_behaved_publisher)
{
	confirm_channel(1, T0);
	int64_t now = T0;
	for (int batch = 0; batch < 50; batch++) { /* 100 in flight, then the broker acks them all */
		for (int i = 0; i < 100; i++) {
			struct tap_publish p = good();
			tap_track_publish(c, 1, &p, now += 5);
		}
		tap_track_ack(c, 1, (uint64_t)(batch + 1) * 100, true, now += 300);
	}
	tap_track_channel_close(c, 1, TAP_BY_CLIENT, 200, S("bye"), now);
	tap_track_channel_close_ok(c, 1, now);
	tap_track_conn_end(c, "eof", now);
	ck_assert_uint_eq(warnings(NULL), 1); /* confirm_without_mandatory only: these are not mandatory */
	ck_assert_uint_eq(warnings("confirm_without_mandatory"), 1);
	for (int r = TAP_TRACK_RULE_TRANSIENT_IN_CONFIRM_MODE; r < TAP_TRACK_N_RULES; r++)
		ck_assert_uint_eq(counted((enum tap_track_rule)r), 0);
}
END_TEST

/* ---- transient_in_confirm_mode ---- */

START_TEST(transient_in_confirm_mode)
{
	confirm_channel(1, T0);
	confirm_channel(2, T0);
	tap_track_channel_open(c, 3, T0); /* no confirms: transient messages are no anti-pattern there */
	struct tap_publish p = good();
	tap_track_publish(c, 1, &p, T0 + 1); /* persistent: quiet */
	ck_assert_uint_eq(warnings("transient_in_confirm_mode"), 0);
	for (int i = 0; i < 3; i++) {
		p = good();
		p.delivery_mode = 1;
		tap_track_publish(c, 1, &p, T0 + 2);
		p = good();
		tap_track_publish(c, 3, &p, T0 + 2);
	}
	p = good();
	p.has_delivery_mode = false; /* no property: the broker takes it as transient */
	tap_track_publish(c, 2, &p, T0 + 3);
	ck_assert_uint_eq(warnings("transient_in_confirm_mode"), 2); /* once per channel */
	const char *w = warning_of("transient_in_confirm_mode");
	ck_assert_ptr_nonnull(strstr(w, "\"conn\":7,\"channel\":1,"));
	ck_assert_ptr_nonnull(strstr(w, "\"seq\":2}"));
	ck_assert_uint_eq(counted(TAP_TRACK_RULE_TRANSIENT_IN_CONFIRM_MODE), 2);
}
END_TEST

/* A publish whose connection ended between its method and its content header (a broker stopped mid-publish):
 * its properties are not known, so it is neither transient nor without a message id. */
START_TEST(no_property_rule_for_a_publish_cut_before_its_header)
{
	confirm_channel(1, T0);
	struct tap_publish p = {.exchange = S("x"), .routing_key = S("k"), .content_cut = true, .header_lost = true};
	tap_track_publish(c, 1, &p, T0 + 1);
	tap_track_conn_end(c, "broker_eof", T0 + 2);
	ck_assert_uint_eq(warnings("transient_in_confirm_mode"), 0);
	ck_assert_uint_eq(warnings("missing_message_id"), 0);
	ck_assert_uint_eq(counted(TAP_TRACK_RULE_TRANSIENT_IN_CONFIRM_MODE) + counted(TAP_TRACK_RULE_MISSING_MESSAGE_ID), 0);
}
END_TEST

/* ---- missing_message_id ---- */

START_TEST(missing_message_id)
{
	tap_track_channel_open(c, 1, T0);
	tap_track_channel_open(c, 2, T0);
	struct tap_publish p = good();
	tap_track_publish(c, 1, &p, T0);
	ck_assert_uint_eq(warnings("missing_message_id"), 0);
	for (int i = 0; i < 3; i++) {
		p = good();
		p.has_message_id = false;
		tap_track_publish(c, 1, &p, T0 + 1);
	}
	p = good();
	p.message_id = S(""); /* present but empty: nothing to match either */
	tap_track_publish(c, 2, &p, T0 + 2);
	ck_assert_uint_eq(warnings("missing_message_id"), 2);
	ck_assert_ptr_nonnull(strstr(warning_of("missing_message_id"), "\"seq\":null")); /* no confirm mode */
	ck_assert_uint_eq(counted(TAP_TRACK_RULE_MISSING_MESSAGE_ID), 2);
}
END_TEST

/* ---- publish_and_wait ---- */

/* n publishes on confirm channel ch from seq first, each sent gap_us after the ack of the one before (acked
 * 200 µs after it is sent). */
static int64_t publish_and_wait(uint16_t ch, uint64_t first, int n, int64_t gap_us, int64_t now)
{
	for (int i = 0; i < n; i++) {
		struct tap_publish p = good();
		tap_track_publish(c, ch, &p, now);
		now += 200;
		tap_track_ack(c, ch, first + (uint64_t)i, false, now);
		now += gap_us;
	}
	return now;
}

START_TEST(publish_and_wait_fires_on_the_eleventh)
{
	confirm_channel(1, T0);
	int64_t now = publish_and_wait(1, 1, TAP_TRACK_WAIT_RUN, 50, T0);
	ck_assert_uint_eq(warnings("publish_and_wait"), 0); /* the first waited for nothing: 9 in a row */
	struct tap_publish p = good();
	tap_track_publish(c, 1, &p, now);
	ck_assert_uint_eq(warnings("publish_and_wait"), 1);
	ck_assert_ptr_nonnull(strstr(warning_of("publish_and_wait"), "\"seq\":11}"));
	tap_track_ack(c, 1, 11, false, now + 200);
	(void)publish_and_wait(1, 12, 30, 50, now + 250);
	ck_assert_uint_eq(warnings("publish_and_wait"), 1); /* once per channel */
	confirm_channel(2, now);
	(void)publish_and_wait(2, 1, 11, 50, now + 100000);
	ck_assert_uint_eq(warnings("publish_and_wait"), 2);
	ck_assert_uint_eq(counted(TAP_TRACK_RULE_PUBLISH_AND_WAIT), 2);
}
END_TEST

START_TEST(publish_and_wait_quiet_when_slow_or_pipelined)
{
	confirm_channel(1, T0);
	int64_t now = publish_and_wait(1, 1, 30, TAP_TRACK_WAIT_GAP_US + 1, T0); /* one every 10 ms: just a slow source */
	confirm_channel(2, now);
	for (int i = 1; i <= 40; i++) { /* two in flight at every publish: pipelined */
		struct tap_publish p = good();
		tap_track_publish(c, 2, &p, now += 10);
		if (i >= 2)
			tap_track_ack(c, 2, (uint64_t)i - 1, false, now += 100);
	}
	tap_track_channel_open(c, 3, now); /* no confirms at all */
	for (int i = 0; i < 40; i++) {
		struct tap_publish p = good();
		tap_track_publish(c, 3, &p, now += 10);
	}
	ck_assert_uint_eq(warnings("publish_and_wait"), 0);
}
END_TEST

START_TEST(publish_and_wait_quiet_once_the_channel_pipelined)
{
	confirm_channel(1, T0);
	int64_t now = publish_and_wait(1, 1, 9, 50, T0); /* 8 waited in a row */
	struct tap_publish p = good();
	tap_track_publish(c, 1, &p, now); /* 9th waited */
	p = good();
	tap_track_publish(c, 1, &p, now + 1); /* one more before the ack: two in flight, the client pipelines */
	tap_track_ack(c, 1, 11, true, now + 200);
	(void)publish_and_wait(1, 12, 3 * TAP_TRACK_WAIT_RUN, 50, now + 300); /* then 30 one at a time */
	ck_assert_uint_eq(warnings("publish_and_wait"), 0);
	confirm_channel(2, now); /* per channel: another channel that only ever waits is still told */
	(void)publish_and_wait(2, 1, TAP_TRACK_WAIT_RUN + 1, 50, now + 100000);
	ck_assert_uint_eq(warnings("publish_and_wait"), 1);
}
END_TEST

/* ---- channel_churn ---- */

/* A channel opened, used for `publishes` publishes and closed by the client. */
static void one_shot(uint16_t ch, int publishes, int64_t now)
{
	tap_track_channel_open(c, ch, now);
	for (int i = 0; i < publishes; i++) {
		struct tap_publish p = good();
		tap_track_publish(c, ch, &p, now + 1);
	}
	tap_track_channel_close(c, ch, TAP_BY_CLIENT, 200, S("Normal shutdown"), now + 2);
	tap_track_channel_close_ok(c, ch, now + 3);
}

START_TEST(channel_churn_per_connection)
{
	for (uint16_t ch = 1; ch < TAP_TRACK_CHURN_CHANNELS; ch++)
		one_shot(ch, 1, T0 + ch * 10);
	one_shot(50, 2, T0 + 500); /* two publishes: not one per channel */
	one_shot(51, 0, T0 + 510); /* none: a channel for a declare */
	ck_assert_uint_eq(warnings("channel_churn"), 0);
	one_shot(1, 1, T0 + 600); /* the tenth, reusing a number */
	ck_assert_uint_eq(warnings("channel_churn"), 1);
	const char *w = warning_of("channel_churn");
	ck_assert_ptr_nonnull(strstr(w, "\"channel\":1,"));
	/* after the channel's close record */
	ck_assert_ptr_nonnull(strstr(recs[n_recs - 2], "\"type\":\"channel\""));
	for (uint16_t ch = 100; ch < 130; ch++)
		one_shot(ch, 1, T0 + 1000 + ch);
	ck_assert_uint_eq(warnings("channel_churn"), 1); /* once per connection */
	ck_assert_uint_eq(counted(TAP_TRACK_RULE_CHANNEL_CHURN), 1);
}
END_TEST

START_TEST(channel_churn_quiet_on_one_long_channel)
{
	tap_track_channel_open(c, 1, T0);
	for (int i = 0; i < 100; i++) {
		struct tap_publish p = good();
		tap_track_publish(c, 1, &p, T0 + i);
	}
	tap_track_conn_end(c, "eof", T0 + 200);
	ck_assert_uint_eq(warnings("channel_churn"), 0);
}
END_TEST

/* ---- duplicate_message_id ---- */

static void publish_id(uint16_t ch, const char *id, int64_t now)
{
	struct tap_publish p = good();
	p.message_id = S(id);
	tap_track_publish(c, ch, &p, now);
}

START_TEST(duplicate_message_id_within_the_window)
{
	tap_track_channel_open(c, 1, T0);
	tap_track_channel_open(c, 2, T0);
	publish_id(1, "order-1", T0);
	char id[32];
	for (unsigned i = 0; i < TAP_TRACK_RECENT_IDS - 1; i++) { /* order-1 stays the oldest of the window */
		snprintf(id, sizeof id, "other-%u", i);
		publish_id(1, id, T0 + 1);
	}
	ck_assert_uint_eq(warnings("duplicate_message_id"), 0);
	publish_id(2, "order-1", T0 + 2); /* another channel of the same connection */
	ck_assert_uint_eq(warnings("duplicate_message_id"), 1);
	ck_assert_ptr_nonnull(strstr(warning_of("duplicate_message_id"), "\"channel\":2,"));
	/* it names the id and the connection's first publish of it */
	ck_assert_msg(strstr(warning_of("duplicate_message_id"),
	                             "\"message_id\":\"order-1\",\"first\":{\"conn\":7,\"channel\":1,\"seq\":null}}"), "%s", warning_of("duplicate_message_id"));
	publish_id(2, "other-5", T0 + 3);
	ck_assert_uint_eq(warnings("duplicate_message_id"), 1); /* once per channel */
	publish_id(1, "other-7", T0 + 3);
	ck_assert_uint_eq(warnings("duplicate_message_id"), 2);
	ck_assert_uint_eq(counted(TAP_TRACK_RULE_DUPLICATE_MESSAGE_ID), 2);
}
END_TEST

/* In confirm mode the first publish's seq is named; a huge id is cut to TAP_TRACK_DUP_ID_MAX bytes. */
START_TEST(duplicate_message_id_names_first_seq)
{
	confirm_channel(1, T0);
	char big[4000];
	memset(big, 'z', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	publish_id(1, "a", T0);
	publish_id(1, big, T0);
	publish_id(1, big, T0 + 1);
	const char *w = warning_of("duplicate_message_id");
	ck_assert_ptr_nonnull(strstr(w, "\"seq\":3,"));
	ck_assert_msg(strstr(w, "\"first\":{\"conn\":7,\"channel\":1,\"seq\":2}"), "%s", w);
	ck_assert_uint_lt(strlen(w), 600);
}
END_TEST

START_TEST(duplicate_message_id_forgotten_past_the_window)
{
	tap_track_channel_open(c, 1, T0);
	publish_id(1, "order-1", T0);
	char id[32];
	for (unsigned i = 0; i < TAP_TRACK_RECENT_IDS; i++) { /* pushes order-1 out */
		snprintf(id, sizeof id, "other-%u", i);
		publish_id(1, id, T0 + 1);
	}
	publish_id(1, "order-1", T0 + 2);
	ck_assert_uint_eq(warnings("duplicate_message_id"), 0);
	for (unsigned i = 0; i < 8000; i++) { /* a long run of unique ids: quiet, and memory stays bounded */
		snprintf(id, sizeof id, "u-%u", i);
		publish_id(1, id, T0 + 3);
	}
	ck_assert_uint_eq(warnings("duplicate_message_id"), 0);
	tap_track_tick(t, T0 + 3 + TAP_TRACK_LATE_RETURN_US_DEFAULT); /* plain publishes are held that long */
	struct tap_track_stats s;
	tap_track_get_stats(t, &s);
	ck_assert_uint_lt(s.memory, 64 * 1024);
	publish_id(1, "u-7000", T0 + 4); /* still in the window */
	ck_assert_uint_eq(warnings("duplicate_message_id"), 1);
}
END_TEST

START_TEST(duplicate_ids_on_other_connections_are_not_duplicates)
{
	struct tap_track_conn *c2 = tap_track_conn_new(t, 8, "127.0.0.1:40001", "127.0.0.1:5672", T0);
	tap_track_channel_open(c, 1, T0);
	tap_track_channel_open(c2, 1, T0);
	publish_id(1, "same", T0);
	struct tap_publish p = good();
	p.message_id = S("same");
	tap_track_publish(c2, 1, &p, T0 + 1);
	ck_assert_uint_eq(warnings("duplicate_message_id"), 0);
}
END_TEST

START_TEST(retransmission_after_nack_return_or_unknown_is_no_duplicate)
{
	confirm_channel(1, T0);
	publish_id(1, "n", T0);
	tap_track_nack(c, 1, 1, false, T0 + 10);
	publish_id(1, "n", T0 + 20); /* seq 2: resent after its nack */
	struct tap_publish p = good();
	p.message_id = S("r");
	p.mandatory = true;
	tap_track_publish(c, 1, &p, T0 + 30); /* seq 3, returned */
	struct tap_return r = {.reply_code = 312, .reply_text = S("NO_ROUTE"), .exchange = S("x"), .routing_key = S("k"),
	                       .message_id = S("r"), .has_message_id = true, .body_size = 10};
	tap_track_return(c, 1, &r, T0 + 40);
	tap_track_ack(c, 1, 3, true, T0 + 50);
	tap_track_publish(c, 1, &p, T0 + 60); /* seq 4: resent after its return */
	tap_track_channel_open(c, 2, T0 + 70);
	tap_track_confirm_select(c, 2, T0 + 70);
	publish_id(2, "u", T0 + 80);
	tap_track_channel_close(c, 2, TAP_BY_BROKER, 404, S("NOT_FOUND"), T0 + 90);
	tap_track_channel_close_ok(c, 2, T0 + 91); /* "u" ends unknown */
	confirm_channel(2, T0 + 100);
	publish_id(2, "u", T0 + 110);
	ck_assert_uint_eq(warnings("duplicate_message_id"), 0);
	publish_id(1, "n", T0 + 120); /* seq 2 is still waiting: this one is a duplicate */
	ck_assert_uint_eq(warnings("duplicate_message_id"), 1);
}
END_TEST

START_TEST(window_survives_forgotten_ids)
{
	confirm_channel(1, T0);
	char id[32];
	for (unsigned i = 0; i < 3 * TAP_TRACK_RECENT_IDS; i++) { /* every other one nacked: forgotten early */
		snprintf(id, sizeof id, "w-%u", i);
		publish_id(1, id, T0 + i);
		if (i % 2)
			tap_track_nack(c, 1, i + 1, false, T0 + i);
		else
			tap_track_ack(c, 1, i + 1, false, T0 + i);
	}
	ck_assert_uint_eq(warnings("duplicate_message_id"), 0);
	snprintf(id, sizeof id, "w-%u", 3 * TAP_TRACK_RECENT_IDS - 2); /* acked, recent */
	publish_id(1, id, T0 + 4 * TAP_TRACK_RECENT_IDS);
	ck_assert_uint_eq(warnings("duplicate_message_id"), 1);
}
END_TEST

/* ---- the blocked annotation ---- */

START_TEST(blocked_annotation)
{
	confirm_channel(1, T0);
	tap_track_channel_open(c, 2, T0);
	struct tap_publish p = good();
	tap_track_publish(c, 1, &p, T0 + 1); /* seq 1 before the block, unanswered when it comes: it waits too */
	tap_track_conn_blocked(c, S("low on memory"), T0 + 2);
	p = good();
	tap_track_publish(c, 1, &p, T0 + 3); /* seq 2, stored until its ack */
	p = good();
	tap_track_publish(c, 2, &p, T0 + 3); /* no confirm: held only for a publish-caused close */
	tap_track_conn_unblocked(c, T0 + 4);
	p = good();
	tap_track_publish(c, 1, &p, T0 + 5); /* seq 3 after */
	tap_track_ack(c, 1, 3, true, T0 + 6);
	tap_track_tick(t, T0 + 6 + TAP_TRACK_LATE_RETURN_US_DEFAULT);
	size_t pubs = 0, blocked = 0;
	for (size_t i = 0; i < n_recs; i++) {
		if (strncmp(recs[i], "{\"type\":\"publish\"", 17))
			continue;
		pubs++;
		if (strstr(recs[i], "\"blocked\":true")) {
			blocked++;
			ck_assert(strstr(recs[i], "\"seq\":1,") || strstr(recs[i], "\"seq\":2,") ||
			          strstr(recs[i], "\"channel\":2,"));
		} else {
			ck_assert_ptr_null(strstr(recs[i], "\"blocked\""));
		}
	}
	ck_assert_uint_eq(pubs, 4);
	ck_assert_uint_eq(blocked, 3);
}
END_TEST

START_TEST(rule_names)
{
	ck_assert_str_eq(tap_track_rule_name(TAP_TRACK_RULE_TRANSIENT_IN_CONFIRM_MODE), "transient_in_confirm_mode");
	ck_assert_str_eq(tap_track_rule_name(TAP_TRACK_RULE_DUPLICATE_MESSAGE_ID), "duplicate_message_id");
	for (int r = 0; r < TAP_TRACK_N_RULES; r++)
		ck_assert_ptr_nonnull(tap_track_rule_name((enum tap_track_rule)r));
	ck_assert_str_eq(tap_track_rule_name(TAP_TRACK_N_RULES), "unknown");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("track_warn");
	TCase *tc = tcase_create("core");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, quiet_on_a_well_behaved_publisher);
	tcase_add_test(tc, transient_in_confirm_mode);
	tcase_add_test(tc, missing_message_id);
	tcase_add_test(tc, publish_and_wait_fires_on_the_eleventh);
	tcase_add_test(tc, publish_and_wait_quiet_when_slow_or_pipelined);
	tcase_add_test(tc, publish_and_wait_quiet_once_the_channel_pipelined);
	tcase_add_test(tc, channel_churn_per_connection);
	tcase_add_test(tc, channel_churn_quiet_on_one_long_channel);
	tcase_add_test(tc, duplicate_message_id_within_the_window);
	tcase_add_test(tc, duplicate_message_id_forgotten_past_the_window);
	tcase_add_test(tc, duplicate_ids_on_other_connections_are_not_duplicates);
	tcase_add_test(tc, retransmission_after_nack_return_or_unknown_is_no_duplicate);
	tcase_add_test(tc, window_survives_forgotten_ids);
	tcase_add_test(tc, blocked_annotation);
	tcase_add_test(tc, rule_names);
	tcase_add_test(tc, duplicate_message_id_names_first_seq);
	tcase_add_test(tc, no_property_rule_for_a_publish_cut_before_its_header);
	suite_add_tcase(s, tc);
	return tap_check_failures(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
