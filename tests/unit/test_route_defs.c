/* Definitions JSON into the routing model (route_defs.h): an export as rabbitmqctl writes it, a single vhost's
 * export, and hostile or broken files, each refused with one line saying what and where and no model. */
#include "amqptap/route_defs.h"
#include "amqptap/status.h"

#include <check.h>

#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *rel, size_t *len)
{
	char path[512];
	snprintf(path, sizeof path, "%s/%s", TAP_SOURCE_DIR, rel);
	FILE *f = fopen(path, "rb");
	ck_assert_ptr_nonnull(f);
	static char buf[1 << 16];
	*len = fread(buf, 1, sizeof buf, f);
	fclose(f);
	return buf;
}

static const char *route1(struct tap_route_model *m, const char *vh, const char *x, const char *key,
                          const struct tap_route_field *h, size_t nh)
{
	static char out[512];
	struct tap_route_msg msg = {.vhost = vh,
	                            .vhost_len = strlen(vh),
	                            .exchange = x,
	                            .exchange_len = strlen(x),
	                            .key = key,
	                            .key_len = strlen(key),
	                            .headers = h,
	                            .n_headers = nh};
	struct tap_route_result r;
	ck_assert_int_eq(tap_route(m, &msg, &r), 0);
	if (r.outcome != TAP_ROUTE_OK) {
		snprintf(out, sizeof out, "!%s", tap_route_outcome_name(r.outcome));
		return out;
	}
	/* sorted by name: few queues here */
	const char *names[16];
	for (uint32_t i = 0; i < r.n_queues; i++) {
		size_t l;
		names[i] = tap_route_queue_name(m, r.queues[i], &l);
		for (uint32_t j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
			const char *t = names[j];
			names[j] = names[j - 1];
			names[j - 1] = t;
		}
	}
	out[0] = 0;
	for (uint32_t i = 0; i < r.n_queues; i++)
		snprintf(out + strlen(out), sizeof out - strlen(out), "%s%s", i ? "," : "", names[i]);
	if (r.alternate)
		strcat(out, "+ae");
	return out;
}

START_TEST(an_export_loads)
{
	size_t len;
	char *d = slurp("tests/data/route/definitions.json", &len);
	struct tap_route_model *m = NULL;
	char err[300];
	ck_assert_msg(tap_route_defs_load(d, len, NULL, NULL, &m, err, sizeof err) == 0, "%s", err);
	ck_assert_str_eq(route1(m, "/", "sensors", "sensor.floor1.temp", NULL, 0), "all-sensors,floor1,temps");
	ck_assert_str_eq(route1(m, "/", "sensors", "sensor.floor1.temp.critical", NULL, 0), "all-sensors,floor1");
	ck_assert_str_eq(route1(m, "/", "amq.topic", "sensor.x.temp", NULL, 0), "all-sensors,temps");
	ck_assert_str_eq(route1(m, "/", "sensors", "other", NULL, 0), "");
	ck_assert_str_eq(route1(m, "/", "orders.in", "eu", NULL, 0), "orders.eu");
	ck_assert_str_eq(route1(m, "/", "orders.in", "us", NULL, 0), "lost+ae"); /* the policy's alternate */
	ck_assert_str_eq(route1(m, "/", "unrouted", "", NULL, 0), "!internal");
	ck_assert_str_eq(route1(m, "/", "delayed", "k", NULL, 0), "!unknown_type");
	ck_assert_str_eq(route1(m, "/", "", "celery", NULL, 0), "celery");
	ck_assert_str_eq(route1(m, "/", "", "elsewhere", NULL, 0), "");
	ck_assert_str_eq(route1(m, "other", "", "elsewhere", NULL, 0), "elsewhere");
	struct tap_route_field h[] = {
	    {.key = "format", .key_len = 6, .v = {.kind = TAP_RV_STR, .type = 'S', .s = "pdf", .len = 3}},
	    {.key = "pages", .key_len = 5, .v = {.kind = TAP_RV_INT, .type = 'I', .i = 2}}};
	ck_assert_str_eq(route1(m, "/", "docs", "", h, 2), "pdf");
	ck_assert_str_eq(route1(m, "/", "docs", "", h, 1), "");
	tap_route_model_free(m);
}
END_TEST

static int load(const char *json, char *err, size_t cap, const struct tap_route_defs_limits *lim)
{
	struct tap_route_model *m = (struct tap_route_model *)&m; /* must stay untouched on failure */
	struct tap_route_model *before = m;
	int rc = tap_route_defs_load(json, strlen(json), NULL, lim, &m, err, cap);
	if (rc)
		ck_assert_ptr_eq(m, before);
	else
		tap_route_model_free(m);
	return rc;
}

START_TEST(one_vhost_export)
{
	const char *j = "{\"queues\":[{\"name\":\"q\"}],\"exchanges\":[{\"name\":\"x\",\"type\":\"fanout\"}],"
	                "\"bindings\":[{\"source\":\"x\",\"destination\":\"q\",\"destination_type\":\"queue\","
	                "\"routing_key\":\"\",\"arguments\":{}}]}";
	struct tap_route_model *m;
	char err[300];
	ck_assert_msg(tap_route_defs_load(j, strlen(j), "v1", NULL, &m, err, sizeof err) == 0, "%s", err);
	ck_assert_str_eq(route1(m, "v1", "x", "", NULL, 0), "q");
	ck_assert_str_eq(route1(m, "/", "x", "", NULL, 0), "!no_vhost");
	tap_route_model_free(m);
}
END_TEST

START_TEST(bad_files_say_why)
{
	char err[300];
	ck_assert_int_ne(load("{\"queues\":[{\"name\":\"q\"}", err, sizeof err, NULL), 0); /* cut short */
	ck_assert_msg(strstr(err, "line 1"), "%s", err);
	ck_assert_int_ne(load("[]", err, sizeof err, NULL), 0);
	ck_assert_int_ne(load("{\"queues\":[{\"name\":1}]}", err, sizeof err, NULL), 0);
	ck_assert_msg(strstr(err, "queues[0]"), "%s", err);
	ck_assert_int_ne(load("{\"queues\":[],\"queues\":[]}", err, sizeof err, NULL), 0); /* duplicate keys */
	ck_assert_int_ne(load("{\"bindings\":[{\"source\":\"amq.direct\",\"destination\":\"nope\","
	                      "\"destination_type\":\"queue\"}]}",
	                      err, sizeof err, NULL),
	                 0);
	ck_assert_msg(strstr(err, "bindings[0]: binding to queue 'nope'"), "%s", err);
	ck_assert_int_ne(load("{\"queues\":[{\"name\":\"q\"}],\"bindings\":[{\"source\":\"amq.headers\","
	                      "\"destination\":\"q\",\"destination_type\":\"queue\",\"arguments\":{\"a\":null}}]}",
	                      err, sizeof err, NULL),
	                 0);
	ck_assert_msg(strstr(err, "null"), "%s", err);
	ck_assert_int_ne(
	    load("{\"queues\":[{\"name\":\"q\"}],\"bindings\":[{\"source\":\"amq.headers\","
	         "\"destination\":\"q\",\"destination_type\":\"queue\",\"arguments\":{\"x-match\":\"most\"}}]}",
	         err, sizeof err, NULL),
	    0);
	ck_assert_msg(strstr(err, "x-match 'most'"), "%s", err);
}
END_TEST

/* Deep nesting, huge patterns, too many items, too much to parse: refused before memory follows the input. */
START_TEST(hostile_files)
{
	char err[300];
	size_t n = 200000;
	char *deep = malloc(2 * n + 1);
	memset(deep, '[', n);
	memset(deep + n, ']', n);
	deep[2 * n] = 0;
	ck_assert_int_eq(load(deep, err, sizeof err, NULL), TAP_E_FULL);
	ck_assert_msg(strstr(err, "nested deeper than 32 levels"), "%s", err);
	free(deep);
	/* a bracket inside a string is not nesting */
	ck_assert_int_eq(
	    load("{\"vhosts\":[{\"name\":\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\\"[[[[\"}]}", err, sizeof err, NULL),
	    0);
	size_t pl = 100000;
	char *pol = malloc(pl + 200);
	int o = sprintf(pol, "{\"policies\":[{\"name\":\"p\",\"vhost\":\"/\",\"pattern\":\"");
	memset(pol + o, 'a', pl);
	strcpy(pol + o + pl, "\",\"apply-to\":\"exchanges\",\"definition\":{}}]}");
	ck_assert_int_eq(load(pol, err, sizeof err, NULL), TAP_E_USAGE);
	ck_assert_msg(strstr(err, "policies[0]: policy 'p': pattern of 100000 bytes (at most 1024)"), "%s", err);
	free(pol);
	struct tap_route_defs_limits lim;
	tap_route_defs_limits_default(&lim);
	lim.model.max_queues = 2;
	ck_assert_int_ne(
	    load("{\"queues\":[{\"name\":\"a\"},{\"name\":\"b\"},{\"name\":\"c\"}]}", err, sizeof err, &lim), 0);
	ck_assert_msg(strstr(err, "queues[2]: more than 2 queues"), "%s", err);
	tap_route_defs_limits_default(&lim);
	lim.max_input = 10;
	ck_assert_int_eq(load("{\"queues\":[]}", err, sizeof err, &lim), TAP_E_FULL);
	/* what jansson allocates is bounded: a flat array of many small objects */
	tap_route_defs_limits_default(&lim);
	lim.max_parse = 1 << 20;
	size_t items = 100000;
	char *many = malloc(items * 3 + 64);
	size_t k = (size_t)sprintf(many, "{\"x\":[");
	for (size_t i = 0; i < items; i++)
		k += (size_t)sprintf(many + k, "%s{}", i ? "," : "");
	strcpy(many + k, "]}");
	ck_assert_int_ne(load(many, err, sizeof err, &lim), 0);
	ck_assert_msg(strstr(err, "more than 1048576 bytes to parse"), "%s", err);
	free(many);
}
END_TEST

START_TEST(json_values)
{
	json_error_t je;
	json_t *o = json_loads(
	    "{\"i\":1,\"d\":1.5,\"s\":\"x\",\"b\":true,\"n\":null,\"a\":[1,\"y\"],\"t\":{\"z\":1,\"a\":2}}", 0, &je);
	struct tap_route_json_hold *hold;
	const struct tap_route_field *f;
	size_t n;
	char err[200];
	ck_assert_int_eq(tap_route_json_fields(o, true, 8, &hold, &f, &n, err, sizeof err), 0);
	ck_assert_uint_eq(n, 7);
	for (size_t i = 0; i < n; i++) {
		const struct tap_route_value *v = &f[i].v;
		switch (f[i].key[0]) {
		case 'i':
			ck_assert(v->kind == TAP_RV_INT && v->type == 'l' && v->i == 1);
			break;
		case 'd':
			ck_assert(v->kind == TAP_RV_FLOAT && v->d == 1.5);
			break;
		case 's':
			ck_assert(v->kind == TAP_RV_STR && v->len == 1);
			break;
		case 'b':
			ck_assert(v->kind == TAP_RV_BOOL && v->b);
			break;
		case 'n':
			ck_assert(v->kind == TAP_RV_VOID);
			break;
		case 'a':
			ck_assert(v->kind == TAP_RV_ARRAY && v->len == 2 && v->items[1].kind == TAP_RV_STR);
			break;
		case 't':
			ck_assert(v->kind == TAP_RV_TABLE && v->len == 2 && v->fields[0].key[0] == 'a');
			break;
		default:
			ck_abort();
		}
	}
	tap_route_json_free(hold);
	ck_assert_int_ne(tap_route_json_fields(o, false, 8, &hold, &f, &n, err, sizeof err), 0);
	json_decref(o);
}
END_TEST

/* rabbitmqctl export_definitions leaves internal exchanges out but keeps their bindings; the management API's export
 * has them, with "internal". What meets an exchange left out is not judged; a missing alternate is missing only
 * where the export says which exchanges are internal. */
START_TEST(internal_exchanges_left_out)
{
	const char *ctl = "{\"queues\":[{\"name\":\"q\",\"vhost\":\"/\"}],"
			  "\"exchanges\":[{\"name\":\"x\",\"vhost\":\"/\",\"type\":\"fanout\",\"arguments\":{}},"
			  "{\"name\":\"y\",\"vhost\":\"/\",\"type\":\"direct\",\"arguments\":{\"alternate-exchange\":\"ae\"}}],"
			  "\"bindings\":[{\"source\":\"x\",\"vhost\":\"/\",\"destination\":\"hidden\","
			  "\"destination_type\":\"exchange\",\"routing_key\":\"\",\"arguments\":{}},"
			  "{\"source\":\"hidden\",\"vhost\":\"/\",\"destination\":\"q\",\"destination_type\":\"queue\","
			  "\"routing_key\":\"\",\"arguments\":{}}]}";
	struct tap_route_model *m;
	char err[300];
	ck_assert_msg(tap_route_defs_load(ctl, strlen(ctl), NULL, NULL, &m, err, sizeof err) == 0, "%s", err);
	ck_assert_str_eq(route1(m, "/", "x", "", NULL, 0), "!unknown_type");
	ck_assert_str_eq(route1(m, "/", "hidden", "", NULL, 0), "!internal");
	ck_assert_str_eq(route1(m, "/", "y", "k", NULL, 0), "!unknown_type"); /* its alternate may be internal */
	tap_route_model_free(m);
	const char *api = "{\"exchanges\":[{\"name\":\"y\",\"vhost\":\"/\",\"type\":\"direct\",\"internal\":false,"
			  "\"arguments\":{\"alternate-exchange\":\"ae\"}}]}";
	ck_assert_msg(tap_route_defs_load(api, strlen(api), NULL, NULL, &m, err, sizeof err) == 0, "%s", err);
	ck_assert_str_eq(route1(m, "/", "y", "k", NULL, 0), ""); /* a missing alternate: dropped */
	tap_route_model_free(m);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("route_defs");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, an_export_loads);
	tcase_add_test(tc, one_vhost_export);
	tcase_add_test(tc, bad_files_say_why);
	tcase_add_test(tc, hostile_files);
	tcase_add_test(tc, json_values);
	tcase_add_test(tc, internal_exchanges_left_out);
	suite_add_tcase(s, tc);
	return tap_check_failures(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
