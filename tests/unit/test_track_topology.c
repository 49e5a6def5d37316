/* --definitions in the tracker (src/core/track_topo.c): the "topology" member of publish records, dropped_by_topology
 * for a publish that is not mandatory and that the model routes nowhere (once per exchange and key per interval,
 * counted by exchange), topology_mismatch when a Return or a routed mandatory ack disagrees with the model, headers
 * exchanges judged from the publish's headers table, and nothing of it without a model. */
#include "amqptap/route.h"
#include "amqptap/track.h"

#include <check.h>

#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RECS 2000
#define T0 1795947302000000LL

static char *recs[MAX_RECS];
static size_t n_recs;
static struct tap_track *t;
static struct tap_track_conn *c;
static struct tap_route_model *m;

static void capture(void *ctx, const char *json, size_t len)
{
	(void)ctx;
	ck_assert_uint_lt(n_recs, MAX_RECS);
	recs[n_recs] = malloc(len + 1);
	memcpy(recs[n_recs], json, len);
	recs[n_recs][len] = '\0';
	n_recs++;
}

static struct tap_slice S(const char *s) {
	return (struct tap_slice){(const uint8_t *)s, strlen(s)};
}

#define L(s) (s), strlen(s)

static void
setup(void)
{
	m = tap_route_model_new(NULL);
	ck_assert_int_eq(tap_route_add_exchange(m, L("/"), L("orders"), L("direct"), false, NULL, 0), 0);
	ck_assert_int_eq(tap_route_add_exchange(m, L("/"), L("docs"), L("headers"), false, NULL, 0), 0);
	ck_assert_int_eq(tap_route_add_queue(m, L("/"), L("eu")), 0);
	ck_assert_int_eq(tap_route_add_binding(m, L("/"), L("orders"), false, L("eu"), L("eu"), NULL, 0), 0);
	struct tap_route_field args[] = {
	    {.key = "format", .key_len = 6, .v = {.kind = TAP_RV_STR, .type = 'S', .s = "pdf", .len = 3}},
	    {.key = "pages", .key_len = 5, .v = {.kind = TAP_RV_INT, .type = 'l', .i = 2}}};
	ck_assert_int_eq(tap_route_add_binding(m, L("/"), L("docs"), false, L("eu"), L(""), args, 2), 0);
	ck_assert_int_eq(tap_route_finish(m), 0);
	struct tap_track_conf conf = {.topology_interval_us = 1000000};
	t = tap_track_new(&conf, capture, NULL);
	ck_assert_ptr_nonnull(t);
	c = tap_track_conn_new(t, 7, "127.0.0.1:40000", "127.0.0.1:5672", T0);
	tap_track_conn_open(c, S("/"), T0);
}

static void teardown(void)
{
	tap_track_free(t);
	tap_route_model_free(m);
	for (size_t i = 0; i < n_recs; i++)
		free(recs[i]);
	n_recs = 0;
}

static size_t count(const char *needle)
{
	size_t n = 0;
	for (size_t i = 0; i < n_recs; i++)
		n += strstr(recs[i], needle) != NULL;
	return n;
}

static const char *last(const char *type)
{
	char want[40];
	snprintf(want, sizeof want, "{\"type\":\"%s\"", type);
	for (size_t i = n_recs; i-- > 0;)
		if (!strncmp(recs[i], want, strlen(want)))
			return recs[i];
	return "";
}

static struct tap_publish pub(const char *x, const char *rk, bool mandatory)
{
	return (struct tap_publish){.exchange = S(x),
	                            .routing_key = S(rk),
	                            .mandatory = mandatory,
	                            .has_message_id = true,
	                            .message_id = S("id"),
	                            .has_delivery_mode = true,
	                            .delivery_mode = 2};
}

START_TEST(no_model_no_topology)
{
	tap_track_channel_open(c, 1, T0);
	struct tap_publish p = pub("orders", "us", false);
	tap_track_publish(c, 1, &p, T0);
	tap_track_tick(t, T0 + 1000000);
	ck_assert_ptr_null(strstr(last("publish"), "topology"));
	ck_assert_uint_eq(count("dropped_by_topology"), 0);
}
END_TEST

START_TEST(topology_member_and_dropped)
{
	ck_assert_int_eq(tap_track_set_topology(t, m), 0);
	tap_track_channel_open(c, 1, T0);
	struct tap_publish routed = pub("orders", "eu", false), lost = pub("orders", "us", false);
	struct tap_publish nox = pub("nope", "k", false), dflt = pub("", "eu", false);
	tap_track_publish(c, 1, &routed, T0);
	tap_track_tick(t, T0 + 1000000);
	ck_assert_msg(strstr(last("publish"), "\"topology\":{\"queues\":[\"eu\"],\"count\":1}"), "%s", last("publish"));
	for (int i = 0; i < 5; i++)
		tap_track_publish(c, 1, &lost, T0 + 10 + i);
	tap_track_tick(t, T0 + 1000000);
	ck_assert_msg(strstr(last("publish"), "\"topology\":{\"queues\":[],\"count\":0}"), "%s", last("publish"));
	/* once per exchange and key per interval */
	ck_assert_uint_eq(count("\"rule\":\"dropped_by_topology\""), 1);
	ck_assert_msg(strstr(last("warning"), "\"exchange\":\"orders\",\"routing_key\":\"us\""), "%s", last("warning"));
	tap_track_publish(c, 1, &lost, T0 + 2000000);
	ck_assert_uint_eq(count("\"rule\":\"dropped_by_topology\""), 2);
	tap_track_publish(c, 1, &nox, T0 + 2000001);
	tap_track_publish(c, 1, &dflt, T0 + 2000002);
	tap_track_tick(t, T0 + 4000000);
	ck_assert_uint_eq(count("\"topology\":{\"outcome\":\"no_exchange\"}"), 1);
	ck_assert_uint_eq(count("\"rule\":\"dropped_by_topology\""), 2); /* a missing exchange is not a drop */
	struct tap_track_stats st;
	tap_track_get_stats(t, &st);
	ck_assert_uint_eq(st.dropped_by_topology, 6);
	ck_assert_uint_eq(st.topology_judged, 9);
	ck_assert_uint_eq(st.warnings_by_rule[TAP_TRACK_RULE_DROPPED_BY_TOPOLOGY], 2);
	/* a mandatory publish the model routes nowhere is the broker's to judge: no warning */
	struct tap_publish mand = pub("orders", "zz", true);
	tap_track_publish(c, 1, &mand, T0 + 5000000);
	ck_assert_uint_eq(count("\"rule\":\"dropped_by_topology\""), 2);
	tap_track_tick(t, T0 + 9000000);
}
END_TEST

static void sum_drops(void *ctx, const char *x, size_t len, uint64_t n)
{
	char *out = ctx;
	snprintf(out + strlen(out), 200 - strlen(out), "%.*s=%llu;", (int)len, x ? x : "(other)",
	         (unsigned long long)n);
}

START_TEST(drops_by_exchange)
{
	ck_assert_int_eq(tap_track_set_topology(t, m), 0);
	tap_track_channel_open(c, 1, T0);
	struct tap_publish a = pub("orders", "us", false), b = pub("", "nosuchqueue", false);
	tap_track_publish(c, 1, &a, T0);
	tap_track_publish(c, 1, &a, T0);
	tap_track_publish(c, 1, &b, T0);
	char out[200] = "";
	tap_track_each_topology_drop(t, sum_drops, out);
	ck_assert_msg(strstr(out, "orders=2;") && strstr(out, "=1;"), "%s", out);
	tap_track_tick(t, T0 + 1000000);
}
END_TEST

START_TEST(mismatch_with_the_broker)
{
	ck_assert_int_eq(tap_track_set_topology(t, m), 0);
	tap_track_channel_open(c, 1, T0);
	tap_track_confirm_select(c, 1, T0);
	/* the model routes it, the broker returns it */
	struct tap_publish p = pub("orders", "eu", true);
	tap_track_publish(c, 1, &p, T0);
	struct tap_return r = {.reply_code = 312,
	                       .reply_text = S("NO_ROUTE"),
	                       .exchange = S("orders"),
	                       .routing_key = S("eu"),
	                       .message_id = S("id"),
	                       .has_message_id = true};
	tap_track_return(c, 1, &r, T0 + 100);
	tap_track_ack(c, 1, 1, false, T0 + 200);
	ck_assert_uint_eq(count("\"rule\":\"topology_mismatch\""), 1);
	ck_assert_msg(strstr(last("warning"), "\"route\":\"returned\",\"model_routes\":true"), "%s", last("warning"));
	/* the model routes it nowhere, the broker acks it unreturned */
	struct tap_publish q = pub("orders", "us", true);
	tap_track_publish(c, 1, &q, T0 + 300);
	tap_track_ack(c, 1, 2, false, T0 + 400);
	tap_track_tick(t, T0 + 1000000);
	ck_assert_uint_eq(count("\"rule\":\"topology_mismatch\""), 2);
	ck_assert_msg(strstr(last("warning"), "\"route\":\"routed\",\"model_routes\":false"), "%s", last("warning"));
	/* agreement says nothing */
	struct tap_publish ok = pub("orders", "eu", true);
	tap_track_publish(c, 1, &ok, T0 + 2000000);
	tap_track_ack(c, 1, 3, false, T0 + 2000100);
	tap_track_tick(t, T0 + 3000000);
	ck_assert_uint_eq(count("\"rule\":\"topology_mismatch\""), 2);
}
END_TEST

START_TEST(headers_from_the_table)
{
	ck_assert_int_eq(tap_track_set_topology(t, m), 0);
	ck_assert(tap_track_header_wanted(t, (const uint8_t *)"format", 6)); /* every header kept for the model */
	tap_track_channel_open(c, 1, T0);
	/* {format: S "pdf", pages: I 2} as on the wire */
	static const uint8_t table[] = {6,   'f', 'o', 'r', 'm', 'a', 't', 'S', 0,   0, 0, 3, 'p',
	                                'd', 'f', 5,   'p', 'a', 'g', 'e', 's', 'I', 0, 0, 0, 2};
	struct tap_publish p = pub("docs", "", false);
	p.headers = (struct tap_slice){table, sizeof table};
	tap_track_publish(c, 1, &p, T0);
	tap_track_tick(t, T0 + 1000000);
	ck_assert_msg(strstr(last("publish"), "\"topology\":{\"queues\":[\"eu\"],\"count\":1}"), "%s", last("publish"));
	p.headers = (struct tap_slice){table, 15}; /* format only */
	tap_track_publish(c, 1, &p, T0 + 1000001);
	tap_track_tick(t, T0 + 2000000);
	ck_assert_msg(strstr(last("publish"), "\"count\":0"), "%s", last("publish"));
	ck_assert_uint_eq(count("\"rule\":\"dropped_by_topology\""), 1);
}
END_TEST

START_TEST(model_swapped_and_removed)
{
	ck_assert_int_eq(tap_track_set_topology(t, m), 0);
	tap_track_channel_open(c, 1, T0);
	struct tap_route_model *m2 = tap_route_model_new(NULL);
	ck_assert_int_eq(tap_route_add_exchange(m2, L("/"), L("orders"), L("fanout"), false, NULL, 0), 0);
	ck_assert_int_eq(tap_route_add_queue(m2, L("/"), L("all")), 0);
	ck_assert_int_eq(tap_route_add_binding(m2, L("/"), L("orders"), false, L("all"), L(""), NULL, 0), 0);
	ck_assert_int_eq(tap_route_finish(m2), 0);
	ck_assert_int_eq(tap_track_set_topology(t, m2), 0);
	struct tap_publish p = pub("orders", "us", false);
	tap_track_publish(c, 1, &p, T0);
	tap_track_tick(t, T0 + 1000000);
	ck_assert_msg(strstr(last("publish"), "\"queues\":[\"all\"]"), "%s", last("publish"));
	ck_assert_int_eq(tap_track_set_topology(t, NULL), 0);
	tap_route_model_free(m2);
	tap_track_publish(c, 1, &p, T0 + 1000001);
	tap_track_tick(t, T0 + 2000000);
	ck_assert_ptr_null(strstr(last("publish"), "topology"));
	ck_assert(!tap_track_header_wanted(t, (const uint8_t *)"format", 6));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("track_topology");
	TCase *tc = tcase_create("core");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, no_model_no_topology);
	tcase_add_test(tc, topology_member_and_dropped);
	tcase_add_test(tc, drops_by_exchange);
	tcase_add_test(tc, mismatch_with_the_broker);
	tcase_add_test(tc, headers_from_the_table);
	tcase_add_test(tc, model_swapped_and_removed);
	suite_add_tcase(s, tc);
	return tap_check_failures(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
