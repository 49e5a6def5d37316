/* The routing model (route.h) against RabbitMQ's rules (PROTOCOL §14): topic words, headers x-match and value
 * comparison, the default exchange, exchange-to-exchange chains and cycles, alternate exchanges by argument and by
 * policy, internal and unknown exchange types, vhosts apart, limits; and the topic trie against the slow matcher on
 * random keys. */
#include "amqptap/route.h"
#include "amqptap/status.h"

#include <check.h>

#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S(s) (s), strlen(s)
#define VH "/", 1

static struct tap_route_model *model(void)
{
	struct tap_route_model *m = tap_route_model_new(NULL);
	ck_assert_ptr_nonnull(m);
	return m;
}

static void ex(struct tap_route_model *m, const char *name, const char *type)
{
	ck_assert_int_eq(tap_route_add_exchange(m, VH, S(name), S(type), false, NULL, 0), 0);
}

static void q(struct tap_route_model *m, const char *name)
{
	ck_assert_int_eq(tap_route_add_queue(m, VH, S(name)), 0);
}

static void bind(struct tap_route_model *m, const char *src, const char *dest, const char *key)
{
	ck_assert_msg(tap_route_add_binding(m, VH, S(src), false, S(dest), S(key), NULL, 0) == 0, "%s",
	              tap_route_error(m));
}

static void bind_x(struct tap_route_model *m, const char *src, const char *dest, const char *key)
{
	ck_assert_int_eq(tap_route_add_binding(m, VH, S(src), true, S(dest), S(key), NULL, 0), 0);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The queues reached, sorted and joined by commas ("" for none), in a static buffer; "!outcome" when not OK. */
static const char *route_h(struct tap_route_model *m, const char *x, const char *key, const struct tap_route_field *h,
                           size_t nh, bool *alternate)
{
	static char out[4096];
	struct tap_route_msg msg = {.vhost = "/",
	                            .vhost_len = 1,
	                            .exchange = x,
	                            .exchange_len = strlen(x),
	                            .key = key,
	                            .key_len = strlen(key),
	                            .headers = h,
	                            .n_headers = nh};
	struct tap_route_result r;
	ck_assert_int_eq(tap_route(m, &msg, &r), 0);
	if (alternate)
		*alternate = r.alternate;
	if (r.outcome != TAP_ROUTE_OK) {
		snprintf(out, sizeof out, "!%s", tap_route_outcome_name(r.outcome));
		return out;
	}
	const char *names[256];
	ck_assert_uint_le(r.n_queues, 256);
	for (uint32_t i = 0; i < r.n_queues; i++) {
		size_t len;
		names[i] = tap_route_queue_name(m, r.queues[i], &len);
	}
	qsort(names, r.n_queues, sizeof names[0], cmp_str);
	out[0] = '\0';
	for (uint32_t i = 0; i < r.n_queues; i++) {
		if (i)
			strcat(out, ",");
		strcat(out, names[i]);
	}
	return out;
}

static const char *route(struct tap_route_model *m, const char *x, const char *key)
{
	return route_h(m, x, key, NULL, 0, NULL);
}

static void finish(struct tap_route_model *m)
{
	ck_assert_msg(tap_route_finish(m) == 0, "%s", tap_route_error(m));
}

static bool tm(const char *b, const char *r)
{
	char why[200];
	return tap_route_topic_match(S(b), S(r), why, sizeof why);
}

START_TEST(topic_words)
{
	/* DESIGN §7 scenario 5 */
	ck_assert(tm("sensor.#", "sensor.floor1.temperature.critical"));
	ck_assert(tm("sensor.floor1.#", "sensor.floor1.temperature.critical"));
	ck_assert(!tm("sensor.*", "sensor.floor1.temperature.critical"));
	ck_assert(!tm("sensor.*.temp", "sensor.floor1.temp.critical"));
	ck_assert(tm("sensor.*.temp", "sensor.floor1.temp"));
	/* '*' is exactly one word, '#' zero or more */
	ck_assert(tm("a.#", "a"));
	ck_assert(!tm("a.*", "a"));
	ck_assert(tm("#", ""));
	ck_assert(tm("#", "a.b.c"));
	ck_assert(!tm("*", ""));
	ck_assert(tm("*", "a"));
	ck_assert(tm("#.#", ""));
	ck_assert(tm("#.#", "a.b"));
	ck_assert(tm("", ""));
	ck_assert(!tm("", "a"));
	ck_assert(!tm("a", ""));
	/* empty words, leading and trailing dots */
	ck_assert(tm("a..b", "a..b"));
	ck_assert(tm("a.*.b", "a..b"));
	ck_assert(!tm("a.b", "a..b"));
	ck_assert(tm("a.#.b", "a..b"));
	ck_assert(tm(".a", ".a"));
	ck_assert(tm("*.a", ".a"));
	ck_assert(!tm("a", ".a"));
	ck_assert(tm("a.", "a."));
	ck_assert(tm("a.*", "a."));
	ck_assert(tm("#", "."));
	ck_assert(tm("*.*", "."));
	ck_assert(!tm("*", "."));
	/* a '#' or '*' inside a word is literal */
	ck_assert(tm("a#", "a#"));
	ck_assert(!tm("a#", "ab"));
	ck_assert(!tm("*a", "ba"));
	/* multi-byte words */
	ck_assert(tm("capteur.*.température", "capteur.étage1.température"));
	ck_assert(tm("датчик.#", "датчик.этаж.темп"));
	ck_assert(!tm("датчик.*", "датчик.этаж.темп"));
	ck_assert(tm("#.温度", "センサー.温度"));
	char why[200];
	ck_assert(!tap_route_topic_match(S("sensor.*.temp"), S("sensor.floor1.temp.critical"), why, sizeof why));
	ck_assert_str_eq(why, "3 words against 4");
}
END_TEST

/* The same edge cases through the trie of a topic exchange. */
START_TEST(topic_exchange)
{
	struct tap_route_model *m = model();
	ex(m, "t", "topic");
	const char *keys[] = {"sensor.#",
	                      "sensor.*.temp",
	                      "sensor.floor1.#",
	                      "sensor.*",
	                      "#",
	                      "*",
	                      "#.#",
	                      "",
	                      "a..b",
	                      "a.*.b",
	                      ".a",
	                      "a.",
	                      "*.*",
	                      "a.#.b",
	                      "#.b",
	                      "датчик.*",
	                      "a#"};
	char name[32];
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
		snprintf(name, sizeof name, "q%02zu", i);
		q(m, name);
		bind(m, "t", name, keys[i]);
	}
	finish(m);
	ck_assert_str_eq(route(m, "t", "sensor.floor1.temperature.critical"), "q00,q02,q04,q06");
	ck_assert_str_eq(route(m, "t", "sensor.floor1.temp"), "q00,q01,q02,q04,q06");
	ck_assert_str_eq(route(m, "t", "sensor.x"), "q00,q03,q04,q06,q12");
	ck_assert_str_eq(route(m, "t", ""), "q04,q06,q07");
	ck_assert_str_eq(route(m, "t", "a..b"), "q04,q06,q08,q09,q13,q14");
	ck_assert_str_eq(route(m, "t", ".a"), "q04,q06,q10,q12");
	ck_assert_str_eq(route(m, "t", "a."), "q04,q06,q11,q12");
	ck_assert_str_eq(route(m, "t", "x"), "q04,q05,q06");
	ck_assert_str_eq(route(m, "t", "a.b"), "q04,q06,q12,q13,q14");
	ck_assert_str_eq(route(m, "t", "датчик.этаж"), "q04,q06,q12,q15");
	ck_assert_str_eq(route(m, "t", "a#"), "q04,q05,q06,q16");
	tap_route_model_free(m);
}
END_TEST

START_TEST(default_direct_fanout)
{
	struct tap_route_model *m = model();
	ex(m, "d", "direct");
	ex(m, "f", "fanout");
	ex(m, "empty", "fanout");
	q(m, "q1");
	q(m, "q2");
	bind(m, "d", "q1", "k");
	bind(m, "d", "q2", "k");
	bind(m, "d", "q2", "");
	bind(m, "f", "q1", "ignored");
	bind(m, "amq.direct", "q2", "x");
	finish(m);
	ck_assert_str_eq(route(m, "", "q1"), "q1");
	ck_assert_str_eq(route(m, "", "nope"), "");
	ck_assert_str_eq(route(m, "", "amq.rabbitmq.reply-to.abc"), "");
	ck_assert_str_eq(route(m, "d", "k"), "q1,q2");
	ck_assert_str_eq(route(m, "d", ""), "q2");
	ck_assert_str_eq(route(m, "d", "K"), "");
	ck_assert_str_eq(route(m, "f", "whatever"), "q1");
	ck_assert_str_eq(route(m, "empty", "k"), "");
	ck_assert_str_eq(route(m, "amq.direct", "x"), "q2");
	ck_assert_str_eq(route(m, "nope", "k"), "!no_exchange");
	ck_assert_str_eq(route(m, "amq.rabbitmq.trace", "k"), "!internal");
	tap_route_model_free(m);
}
END_TEST

static struct tap_route_value vs(const char *s)
{
	return (struct tap_route_value){.kind = TAP_RV_STR, .type = 'S', .s = s, .len = (uint32_t)strlen(s)};
}

static struct tap_route_value vi(char type, int64_t i)
{
	return (struct tap_route_value){.kind = TAP_RV_INT, .type = type, .i = i};
}

static struct tap_route_value vd(char type, double d)
{
	return (struct tap_route_value){.kind = TAP_RV_FLOAT, .type = type, .d = d};
}

static struct tap_route_field F(const char *k, struct tap_route_value v) {
	return (struct tap_route_field){.key = k, .key_len = (uint32_t)strlen(k), .v = v};
}

static bool
hm(const struct tap_route_field *a, size_t na, const struct tap_route_field *h, size_t nh)
{
	char why[200];
	return tap_route_headers_match(a, na, h, nh, why, sizeof why);
}

START_TEST(headers_x_match)
{
	struct tap_route_field all[] = {F("x-match", vs("all")), F("a", vs("1")), F("b", vi('l', 2))};
	struct tap_route_field any[] = {F("x-match", vs("any")), F("a", vs("1")), F("b", vi('l', 2))};
	struct tap_route_field h_ab[] = {F("b", vi('b', 2)), F("a", vs("1"))};
	struct tap_route_field h_a[] = {F("a", vs("1"))};
	struct tap_route_field h_b3[] = {F("a", vs("1")), F("b", vi('l', 3))};
	struct tap_route_field h_none[] = {F("c", vs("1"))};
	ck_assert(hm(all, 3, h_ab, 2));
	ck_assert(!hm(all, 3, h_a, 1));
	ck_assert(!hm(all, 3, h_b3, 2));
	ck_assert(hm(any, 3, h_a, 1));
	ck_assert(hm(any, 3, h_b3, 2));
	ck_assert(!hm(any, 3, h_none, 1));
	ck_assert(!hm(any, 3, NULL, 0));
	ck_assert(!hm(all, 3, NULL, 0));
	/* no x-match: all; no other argument: all matches anything, any nothing */
	ck_assert(hm(all + 1, 2, h_ab, 2));
	ck_assert(hm(all, 1, NULL, 0));
	ck_assert(!hm(any, 1, h_a, 1));
	/* x- keys: ignored by all/any, compared by the -with-x forms (x-match itself never) */
	struct tap_route_field allx_plain[] = {F("x-match", vs("all")), F("x-k", vs("v")), F("a", vs("1"))};
	struct tap_route_field allx[] = {F("x-match", vs("all-with-x")), F("x-k", vs("v")), F("a", vs("1"))};
	struct tap_route_field anyx[] = {F("x-match", vs("any-with-x")), F("x-k", vs("v"))};
	struct tap_route_field any_plain_x[] = {F("x-match", vs("any")), F("x-k", vs("v"))};
	struct tap_route_field h_xk[] = {F("x-k", vs("v")), F("a", vs("1"))};
	ck_assert(hm(allx_plain, 3, h_a, 1));
	ck_assert(!hm(allx, 3, h_a, 1));
	ck_assert(hm(allx, 3, h_xk, 2));
	ck_assert(hm(anyx, 2, h_xk, 2));
	ck_assert(!hm(any_plain_x, 2, h_xk, 2));
	tap_route_model_free(NULL);
}
END_TEST

/* Erlang's ==: numbers by value whatever their type, S equals x, bool only bool; inside arrays the types too. */
START_TEST(headers_values)
{
	struct tap_route_field one[] = {F("n", vi('l', 1))};
	struct tap_route_field h1[][1] = {
	    {F("n", vi('b', 1))}, {F("n", vd('d', 1.0))}, {F("n", vi('T', 1))}, {F("n", vd('f', 1.0))}};
	for (size_t i = 0; i < 4; i++)
		ck_assert(hm(one, 1, h1[i], 1));
	struct tap_route_field no[][1] = {
	    {F("n", vs("1"))},
	    {F("n", vd('d', 1.5))},
	    {F("n", (struct tap_route_value){.kind = TAP_RV_BOOL, .type = 't', .b = true})},
	    {F("n", (struct tap_route_value){.kind = TAP_RV_DECIMAL, .type = 'D', .i = 1})}};
	for (size_t i = 0; i < 4; i++)
		ck_assert(!hm(one, 1, no[i], 1));
	struct tap_route_field s[] = {F("s", vs("ab"))};
	struct tap_route_field hx[] = {
	    F("s", (struct tap_route_value){.kind = TAP_RV_STR, .type = 'x', .s = "ab", .len = 2})};
	ck_assert(hm(s, 1, hx, 1));
	/* a void argument asks only that the header be there */
	struct tap_route_field v[] = {F("p", (struct tap_route_value){.kind = TAP_RV_VOID, .type = 'V'})};
	struct tap_route_field hp[] = {F("p", vs("anything"))};
	ck_assert(hm(v, 1, hp, 1));
	ck_assert(!hm(v, 1, s, 1));
	/* arrays: item types matter */
	struct tap_route_value a1[] = {vi('l', 1), vs("x")}, a2[] = {vi('l', 1), vs("x")}, a3[] = {vi('I', 1), vs("x")};
	struct tap_route_field fa[] = {
	    F("a", (struct tap_route_value){.kind = TAP_RV_ARRAY, .type = 'A', .items = a1, .len = 2})};
	struct tap_route_field ha2[] = {
	    F("a", (struct tap_route_value){.kind = TAP_RV_ARRAY, .type = 'A', .items = a2, .len = 2})};
	struct tap_route_field ha3[] = {
	    F("a", (struct tap_route_value){.kind = TAP_RV_ARRAY, .type = 'A', .items = a3, .len = 2})};
	ck_assert(hm(fa, 1, ha2, 1));
	ck_assert(!hm(fa, 1, ha3, 1));
	/* a timestamp past 2^63 */
	struct tap_route_field big[] = {
	    F("t", (struct tap_route_value){.kind = TAP_RV_INT, .type = 'T', .big = true, .i = INT64_MIN})};
	struct tap_route_field hbig[] = {F("t", vd('d', 9223372036854775808.0))};
	struct tap_route_field hneg[] = {F("t", vi('l', INT64_MIN))};
	ck_assert(hm(big, 1, hbig, 1));
	ck_assert(!hm(big, 1, hneg, 1));
}
END_TEST

START_TEST(headers_exchange)
{
	struct tap_route_model *m = model();
	ex(m, "h", "headers");
	q(m, "qall");
	q(m, "qany");
	struct tap_route_field all[] = {F("x-match", vs("all")), F("a", vs("1")), F("b", vi('l', 2))};
	struct tap_route_field any[] = {F("x-match", vs("any")), F("a", vs("1")), F("b", vi('l', 2))};
	struct tap_route_field bad[] = {F("x-match", vs("some"))};
	ck_assert_int_eq(tap_route_add_binding(m, VH, S("h"), false, S("qall"), S(""), all, 3), 0);
	ck_assert_int_eq(tap_route_add_binding(m, VH, S("h"), false, S("qany"), S(""), any, 3), 0);
	finish(m);
	struct tap_route_field h_ab[] = {F("b", vi('s', 2)), F("a", vs("1")), F("z", vs("z"))};
	struct tap_route_field h_a[] = {F("a", vs("1"))};
	ck_assert_str_eq(route_h(m, "h", "", h_ab, 3, NULL), "qall,qany");
	ck_assert_str_eq(route_h(m, "h", "", h_a, 1, NULL), "qany");
	ck_assert_str_eq(route_h(m, "h", "", NULL, 0, NULL), "");
	tap_route_model_free(m);
	m = model();
	ex(m, "h", "headers");
	q(m, "q");
	ck_assert_int_ne(tap_route_add_binding(m, VH, S("h"), false, S("q"), S(""), bad, 1), 0);
	ck_assert_ptr_nonnull(strstr(tap_route_error(m), "x-match"));
	tap_route_model_free(m);
}
END_TEST

START_TEST(exchange_chains_and_cycles)
{
	struct tap_route_model *m = model();
	ex(m, "a", "fanout");
	ex(m, "b", "topic");
	ex(m, "c", "direct");
	q(m, "qa");
	q(m, "qb");
	q(m, "qc");
	bind_x(m, "a", "b", "");
	bind_x(m, "b", "c", "#");
	bind_x(m, "c", "a", "k"); /* a cycle: each exchange is visited once */
	bind_x(m, "c", "b", "k");
	bind(m, "a", "qa", "");
	bind(m, "b", "qb", "x.#");
	bind(m, "c", "qc", "k");
	bind(m, "c", "qa", "k"); /* qa twice: counted once */
	finish(m);
	ck_assert_str_eq(route(m, "a", "k"), "qa,qc");
	ck_assert_str_eq(route(m, "a", "x.y"), "qa,qb");
	ck_assert_str_eq(route(m, "c", "k"), "qa,qc");
	ck_assert_str_eq(route(m, "b", "x"), "qb");
	tap_route_model_free(m);
}
END_TEST

START_TEST(alternate_exchanges)
{
	struct tap_route_model *m = model();
	ck_assert_int_eq(tap_route_add_exchange(m, VH, S("x"), S("direct"), false, S("ae")), 0);
	ck_assert_int_eq(tap_route_add_exchange(m, VH, S("ae"), S("fanout"), true, NULL, 0), 0); /* internal is fine */
	ck_assert_int_eq(tap_route_add_exchange(m, VH, S("y"), S("direct"), false, S("missing")), 0);
	ex(m, "p1", "direct");
	ex(m, "p2", "direct");
	ex(m, "pz", "topic");
	ex(m, "ae2", "fanout");
	ex(m, "dead", "direct");
	q(m, "q");
	q(m, "qae");
	q(m, "qae2");
	bind(m, "x", "q", "k");
	bind(m, "ae", "qae", "");
	bind(m, "ae2", "qae2", "");
	bind_x(m, "p2", "dead", "k"); /* matches, leads nowhere: not "nothing", no alternate */
	/* policies: the highest priority wins, one without an alternate shadows lower ones; the argument wins */
	ck_assert_int_eq(tap_route_add_policy(m, VH, S("low"), S("^p"), "exchanges", 1, S("ae")), 0);
	ck_assert_int_eq(tap_route_add_policy(m, VH, S("high"), S("^p[0-9]$"), "all", 5, S("ae2")), 0);
	ck_assert_int_eq(tap_route_add_policy(m, VH, S("shadow"), S("z"), "exchanges", 9, NULL, 0), 0);
	ck_assert_int_eq(tap_route_add_policy(m, VH, S("queues"), S("^x$"), "queues", 99, S("ae2")), 0);
	ck_assert_int_eq(tap_route_add_policy(m, VH, S("onx"), S("^x$"), "exchanges", 99, S("ae2")), 0);
	finish(m);
	bool alt;
	ck_assert_str_eq(route_h(m, "x", "k", NULL, 0, &alt), "q");
	ck_assert(!alt);
	ck_assert_str_eq(route_h(m, "x", "other", NULL, 0, &alt), "qae");
	ck_assert(alt);
	ck_assert_str_eq(route_h(m, "y", "other", NULL, 0, &alt), "");
	ck_assert(!alt);
	ck_assert_str_eq(route_h(m, "p1", "k", NULL, 0, &alt), "qae2");
	ck_assert(alt);
	ck_assert_str_eq(route_h(m, "p2", "k", NULL, 0, &alt), "");
	ck_assert(!alt);
	ck_assert_str_eq(route_h(m, "p2", "j", NULL, 0, &alt), "qae2");
	ck_assert_str_eq(route_h(m, "pz", "j", NULL, 0, &alt), "");
	ck_assert(!alt);
	tap_route_model_free(m);
}
END_TEST

START_TEST(unknown_types_and_vhosts)
{
	struct tap_route_model *m = model();
	ex(m, "delayed", "x-delayed-message");
	ex(m, "f", "fanout");
	ex(m, "g", "fanout");
	q(m, "q");
	bind_x(m, "f", "delayed", "");
	bind(m, "g", "q", "");
	ck_assert_int_eq(tap_route_add_exchange(m, S("other"), S("g"), S("fanout"), false, NULL, 0), 0);
	ck_assert_int_eq(tap_route_add_queue(m, S("other"), S("q2")), 0);
	ck_assert_int_eq(tap_route_add_binding(m, S("other"), S("g"), false, S("q2"), S(""), NULL, 0), 0);
	/* a binding names queues of its own vhost only */
	ck_assert_int_ne(tap_route_add_binding(m, S("other"), S("g"), false, S("q"), S(""), NULL, 0), 0);
	tap_route_model_free(m);
	m = model();
	ex(m, "delayed", "x-delayed-message");
	ex(m, "f", "fanout");
	ex(m, "g", "fanout");
	q(m, "q");
	bind_x(m, "f", "delayed", "");
	bind(m, "g", "q", "");
	ck_assert_int_eq(tap_route_add_exchange(m, S("other"), S("g"), S("fanout"), false, NULL, 0), 0);
	ck_assert_int_eq(tap_route_add_queue(m, S("other"), S("q2")), 0);
	ck_assert_int_eq(tap_route_add_binding(m, S("other"), S("g"), false, S("q2"), S(""), NULL, 0), 0);
	finish(m);
	ck_assert_str_eq(route(m, "delayed", "k"), "!unknown_type");
	ck_assert_str_eq(route(m, "f", "k"), "!unknown_type");
	ck_assert_str_eq(route(m, "g", "k"), "q");
	struct tap_route_msg msg = {.vhost = "other", .vhost_len = 5, .exchange = "g", .exchange_len = 1};
	struct tap_route_result r;
	ck_assert_int_eq(tap_route(m, &msg, &r), 0);
	ck_assert_uint_eq(r.n_queues, 1);
	size_t len;
	ck_assert_str_eq(tap_route_queue_name(m, r.queues[0], &len), "q2");
	msg.vhost = "none";
	msg.vhost_len = 4;
	ck_assert_int_eq(tap_route(m, &msg, &r), 0);
	ck_assert_int_eq(r.outcome, TAP_ROUTE_NO_VHOST);
	struct tap_route_counts c;
	tap_route_counts(m, &c);
	ck_assert_uint_eq(c.vhosts, 2);
	ck_assert_uint_eq(c.unknown_type, 1);
	tap_route_model_free(m);
}
END_TEST

START_TEST(limits_and_bad_input)
{
	struct tap_route_limits l;
	tap_route_limits_default(&l);
	l.max_bindings = 3;
	l.max_bytes = 1 << 20;
	struct tap_route_model *m = tap_route_model_new(&l);
	ex(m, "t", "topic");
	q(m, "q");
	for (int i = 0; i < 3; i++)
		bind(m, "t", "q", "a");
	ck_assert_int_eq(tap_route_add_binding(m, VH, S("t"), false, S("q"), S("a"), NULL, 0), TAP_E_FULL);
	ck_assert_ptr_nonnull(strstr(tap_route_error(m), "bindings"));
	ck_assert_int_ne(tap_route_finish(m), 0); /* a model that failed is never used */
	tap_route_model_free(m);
	/* bytes: a model that outgrows max_bytes stops, counted */
	tap_route_limits_default(&l);
	l.max_bytes = 200000;
	m = tap_route_model_new(&l);
	ex(m, "t", "topic");
	q(m, "q");
	char key[64];
	int rc = 0, i;
	for (i = 0; i < 100000 && !rc; i++) {
		snprintf(key, sizeof key, "w%d.x%d.y%d", i, i, i);
		rc = tap_route_add_binding(m, VH, S("t"), false, S("q"), S(key), NULL, 0);
	}
	ck_assert_int_eq(rc, TAP_E_FULL);
	ck_assert_uint_le(tap_route_model_bytes(m), 200000);
	tap_route_model_free(m);
	/* names, keys, patterns */
	m = model();
	char longname[300];
	memset(longname, 'n', sizeof longname);
	ck_assert_int_eq(tap_route_add_queue(m, VH, longname, sizeof longname), TAP_E_FULL);
	tap_route_model_free(m);
	m = model();
	ck_assert_int_ne(tap_route_add_policy(m, VH, S("p"), S("^a\\d"), "exchanges", 0, S("ae")), 0);
	ck_assert_ptr_nonnull(strstr(tap_route_error(m), "PCRE"));
	tap_route_model_free(m);
	m = model();
	ck_assert_int_ne(tap_route_add_policy(m, VH, S("p"), S("(unclosed"), "exchanges", 0, S("ae")), 0);
	tap_route_model_free(m);
	/* stacked repetitions: regcomp copied the expression for each '+' (fuzz_route_defs: 1 GB); escaped and
	 * bracketed ones are literal characters and stay allowed */
	m = model();
	ck_assert_int_ne(tap_route_add_policy(m, VH, S("p"), S("^orde+++++++++rs"), "exchanges", 0, S("ae")), 0);
	ck_assert_ptr_nonnull(strstr(tap_route_error(m), "repeats a repetition"));
	tap_route_model_free(m);
	m = model();
	ck_assert_int_ne(tap_route_add_policy(m, VH, S("p2"), S("a*{2}"), "exchanges", 0, S("ae")), 0);
	tap_route_model_free(m);
	m = model();
	ck_assert_int_eq(tap_route_add_policy(m, VH, S("p3"), S("^a\\++[+*]+b{2}"), "exchanges", 0, S("ae")), 0);
	tap_route_model_free(m);
	m = model();
	ck_assert_int_ne(tap_route_add_binding(m, VH, S("nope"), false, S("q"), S(""), NULL, 0), 0);
	tap_route_model_free(m);
	/* deep arguments */
	m = model();
	ex(m, "h", "headers");
	q(m, "q");
	struct tap_route_value lv[20];
	for (int d = 0; d < 20; d++)
		lv[d] =
		    d == 19
		        ? vs("x")
		        : (struct tap_route_value){.kind = TAP_RV_ARRAY, .type = 'A', .items = &lv[d + 1], .len = 1};
	struct tap_route_field deep[] = {F("a", lv[0])};
	ck_assert_int_eq(tap_route_add_binding(m, VH, S("h"), false, S("q"), S(""), deep, 1), TAP_E_FULL);
	ck_assert_ptr_nonnull(strstr(tap_route_error(m), "nested"));
	tap_route_model_free(m);
}
END_TEST

/* The trie against the slow matcher: random binding keys and routing keys over a small alphabet, so that words
 * meet often, with '#', '*', empty words and multi-byte words. */
static void random_key(unsigned *seed, char *out, size_t cap, bool wild)
{
	static const char *words[] = {"a", "b", "", "ü", "ab"};
	static const char *wilds[] = {"#", "*"};
	int n = rand_r(seed) % 5;
	out[0] = '\0';
	for (int i = 0; i < n; i++) {
		if (i)
			strncat(out, ".", cap - strlen(out) - 1);
		const char *w = wild && rand_r(seed) % 3 == 0 ? wilds[rand_r(seed) % 2] : words[rand_r(seed) % 5];
		strncat(out, w, cap - strlen(out) - 1);
	}
}

START_TEST(trie_equals_slow_matcher)
{
	unsigned seed = 36;
	for (int round = 0; round < 40; round++) {
		struct tap_route_model *m = model();
		ex(m, "t", "topic");
		char keys[40][64], name[16];
		for (int i = 0; i < 40; i++) {
			random_key(&seed, keys[i], sizeof keys[i], true);
			snprintf(name, sizeof name, "q%d", i);
			q(m, name);
			bind(m, "t", name, keys[i]);
		}
		finish(m);
		for (int k = 0; k < 200; k++) {
			char rk[64];
			random_key(&seed, rk, sizeof rk, false);
			struct tap_route_msg msg = {.vhost = "/",
			                            .vhost_len = 1,
			                            .exchange = "t",
			                            .exchange_len = 1,
			                            .key = rk,
			                            .key_len = strlen(rk)};
			struct tap_route_result r;
			ck_assert_int_eq(tap_route(m, &msg, &r), 0);
			bool want[40] = {0}, got[40] = {0};
			for (int i = 0; i < 40; i++)
				want[i] = tap_route_topic_match(keys[i], strlen(keys[i]), rk, strlen(rk), NULL, 0);
			for (uint32_t i = 0; i < r.n_queues; i++) {
				size_t len;
				got[atoi(tap_route_queue_name(m, r.queues[i], &len) + 1)] = true;
			}
			for (int i = 0; i < 40; i++)
				ck_assert_msg(want[i] == got[i], "binding '%s' key '%s': slow %d trie %d", keys[i], rk,
				              want[i], got[i]);
		}
		tap_route_model_free(m);
	}
}
END_TEST

struct why_log {
	char text[2048];
};

static void log_why(void *arg, const struct tap_route_why *w)
{
	struct why_log *l = arg;
	size_t n = strlen(l->text);
	snprintf(l->text + n, sizeof l->text - n, "%.*s->%.*s %s: %s\n", (int)w->key_len, w->key ? w->key : "",
	         (int)w->dest_len, w->dest, w->matched ? "yes" : "no", w->reason);
}

START_TEST(explain_says_why)
{
	struct tap_route_model *m = model();
	ck_assert_int_eq(tap_route_add_exchange(m, VH, S("sensors"), S("topic"), false, S("ae")), 0);
	ex(m, "ae", "fanout");
	q(m, "temps");
	q(m, "all");
	q(m, "lost");
	bind(m, "sensors", "temps", "sensor.*.temp");
	bind(m, "ae", "lost", "");
	finish(m);
	struct why_log l = {{0}};
	struct tap_route_msg msg = {.vhost = "/",
	                            .vhost_len = 1,
	                            .exchange = "sensors",
	                            .exchange_len = 7,
	                            .key = "sensor.floor1.temp.critical",
	                            .key_len = 27};
	struct tap_route_result r;
	ck_assert_int_eq(tap_route_explain(m, &msg, &r, log_why, &l), 0);
	ck_assert_uint_eq(r.n_queues, 1);
	ck_assert(r.alternate);
	ck_assert_msg(strstr(l.text, "sensor.*.temp->temps no: 3 words against 4"), "%s", l.text);
	ck_assert_msg(strstr(l.text, "->ae yes: no binding matched"), "%s", l.text);
	ck_assert_msg(strstr(l.text, "->lost yes: a fanout"), "%s", l.text);
	tap_route_model_free(m);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("route");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, topic_words);
	tcase_add_test(tc, topic_exchange);
	tcase_add_test(tc, default_direct_fanout);
	tcase_add_test(tc, headers_x_match);
	tcase_add_test(tc, headers_values);
	tcase_add_test(tc, headers_exchange);
	tcase_add_test(tc, exchange_chains_and_cycles);
	tcase_add_test(tc, alternate_exchanges);
	tcase_add_test(tc, unknown_types_and_vhosts);
	tcase_add_test(tc, limits_and_bad_input);
	tcase_add_test(tc, trie_equals_slow_matcher);
	tcase_add_test(tc, explain_says_why);
	suite_add_tcase(s, tc);
	return tap_check_failures(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
