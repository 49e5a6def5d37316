/* --fault-api's JSON (src/core/fault_api.c): a POST body into a rule, refused bodies with one printable line saying
 * why (the parser's own message for a bad rule), and the rules in force as JSON that reads back whole. */
#include "amqptap/fault_api.h"
#include "amqptap/status.h"
#include "tap_check.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static int body(const char *b, struct tap_fault_rule *r, char *err, size_t cap)
{
	return tap_fault_api_rule(b, strlen(b), r, err, cap);
}

START_TEST(body_accepted)
{
	struct tap_fault_rule r;
	char err[400] = "";
	ck_assert_int_eq(body("{\"rule\": \"nack:every=10\"}", &r, err, sizeof err), 0);
	ck_assert_int_eq(r.action, TAP_FAULT_NACK);
	ck_assert_uint_eq(r.every, 10);
	ck_assert_str_eq(r.text, "nack:every=10");
	ck_assert_int_eq(body(" {\"rule\":\"kill:close,after=3\"}\r\n", &r, err, sizeof err), 0);
	ck_assert_int_eq(r.action, TAP_FAULT_KILL);
	ck_assert_int_eq(r.kill_mode, TAP_FAULT_KILL_CLOSE);
	ck_assert_uint_eq(r.id, 0); /* the set gives it */
}
END_TEST

static void refused(const char *b, size_t len, const char *why)
{
	struct tap_fault_rule r;
	char err[400] = "";
	ck_assert_int_eq(tap_fault_api_rule(b, len, &r, err, sizeof err), TAP_E_USAGE);
	ck_assert_msg(strstr(err, why) != NULL, "'%s' does not say '%s'", err, why);
	for (const char *q = err; *q; q++)
		ck_assert_msg(*q >= ' ' && *q <= '~', "'%s' is not one printable line", err);
}

START_TEST(body_refused)
{
	static const struct {
		const char *body, *why;
	} cases[] = {
	    {"", "empty body"},
	    {"nack:every=10", "not JSON"},
	    {"{\"rule\": \"nack\"", "not JSON"},
	    {"[\"nack\"]", "not a JSON object"},
	    {"{}", "no \"rule\""},
	    {"{\"rule\": 10}", "not a string"},
	    {"{\"rule\": null}", "not a string"},
	    {"{\"rules\": \"nack\"}", "unknown member \"rules\""}, /* a typo adds nothing rather than 201 */
	    {"{\"rule\": \"nack\", \"every\": 3}", "unknown member \"every\""},
	    {"{\"rule\": \"nack\", \"rule\": \"kill\"}", "duplicate"},
	    {"{\"rule\": \"nack\\u0000:every=1\"}", "NUL"},
	    {"{\"rule\": \"nack:evry=3\"}", "--fault 'nack:evry=3': unknown key 'evry'"},
	    {"{\"rule\": \"close-channel:code=320\"}", "code: expected a channel exception"},
	    {"{\"rule\": \"nack:rk=\\u00e9\"}", "routing_key"},
	    {"{\"rule\": \"\"}", "empty rule"},
	    {"{\"rule\": \"nack\"} {}", "not JSON"},
	    {"{\"rule\": \"\xff\"}", "not JSON"}, /* not UTF-8: jansson refuses it */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		refused(cases[i].body, strlen(cases[i].body), cases[i].why);
	char big[TAP_FAULT_API_BODY_MAX + 2];
	memset(big, ' ', sizeof big);
	refused(big, sizeof big, "at most 1024");
	refused("{\"rule\": \"nack\"}\0x", 18, "not JSON"); /* a NUL in the body */
}
END_TEST

static json_t *rendered(const struct tap_fault_set *s)
{
	struct tap_buf b;
	tap_buf_init(&b);
	struct tap_json j;
	tap_json_init(&j, &b);
	tap_fault_api_rules_json(&j, s);
	json_error_t je;
	json_t *v = json_loadb((const char *)b.data, b.len, 0, &je);
	ck_assert_msg(v != NULL, "%.*s: %s", (int)b.len, b.data, je.text);
	tap_buf_deinit(&b);
	return v;
}

/* The rules read back in the order they are tried; a rule's acts stay its own when one before it goes. */
START_TEST(rules_as_json)
{
	struct tap_fault_set s;
	tap_fault_set_init(&s);
	struct tap_fault_rule r;
	char err[400];
	ck_assert_int_eq(body("{\"rule\": \"nack:every=3\"}", &r, err, sizeof err), 0);
	ck_assert_int_eq(tap_fault_set_add(&s, &r, 1764800000000000, NULL), 0);
	ck_assert_int_eq(body("{\"rule\": \"delay-confirms:ms=50,rk=a\\\"b\"}", &r, err, sizeof err), 0);
	ck_assert_int_eq(tap_fault_set_add(&s, &r, 1764800001000000, NULL), 0);
	s.rule_acted[0] = 7;
	s.rule_acted[1] = 5;
	json_t *v = rendered(&s);
	ck_assert_uint_eq(json_array_size(v), 2);
	json_t *b = json_array_get(v, 1);
	ck_assert_int_eq(json_integer_value(json_object_get(b, "id")), 2);
	ck_assert_str_eq(json_string_value(json_object_get(b, "action")), "delay-confirms");
	ck_assert_str_eq(json_string_value(json_object_get(b, "text")), "delay-confirms:ms=50,rk=a\"b");
	ck_assert_str_eq(json_string_value(json_object_get(b, "added")), "2025-12-03T22:13:21.000000Z");
	ck_assert_int_eq(json_integer_value(json_object_get(b, "acted")), 5);
	json_decref(v);
	ck_assert(tap_fault_set_remove(&s, 1));
	v = rendered(&s);
	ck_assert_uint_eq(json_array_size(v), 1);
	ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(v, 0), "id")), 2);
	ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(v, 0), "acted")), 5);
	json_decref(v);
	/* a rule added where one was removed starts at 0 */
	ck_assert_int_eq(tap_fault_set_add(&s, &r, 0, NULL), 0);
	ck_assert_uint_eq(s.rule_acted[1], 0);
	ck_assert_uint_eq(s.rules[1].id, 3);
}
END_TEST

START_TEST(error_json)
{
	struct tap_buf b;
	tap_buf_init(&b);
	tap_fault_api_error_json(&b, "--fault 'x\"y': unknown action");
	json_t *v = json_loadb((const char *)b.data, b.len, 0, NULL);
	ck_assert_ptr_nonnull(v);
	ck_assert_str_eq(json_string_value(json_object_get(v, "error")), "--fault 'x\"y': unknown action");
	json_decref(v);
	tap_buf_deinit(&b);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fault_api");
	TCase *tc = tcase_create("json");
	tcase_add_test(tc, body_accepted);
	tcase_add_test(tc, body_refused);
	tcase_add_test(tc, rules_as_json);
	tcase_add_test(tc, error_json);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
