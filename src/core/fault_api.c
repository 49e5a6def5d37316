/* The JSON of --fault-api (amqptap/fault_api.h): a POST body into a rule, and the rules in force as JSON. The body
 * is small (TAP_FAULT_API_BODY_MAX) and has one member, "rule", in the grammar of --fault, so a rule reads the same
 * on the command line, in the API and in the log; an unknown member is refused rather than ignored (a typo such as
 * "rules" must not add nothing with a 201). */
#include "amqptap/fault_api.h"

#include "amqptap/status.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int body_error(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int body_error(char *err, size_t cap, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, cap, fmt, ap);
	va_end(ap);
	for (char *q = err; cap && *q; q++) /* jansson's text quotes the body: one printable line whatever it held */
		if (*q < ' ' || *q > '~')
			*q = '?';
	return TAP_E_USAGE;
}

#define EXPECTED "expected {\"rule\": \"ACTION[:KEY=VALUE,...]\"}"

int tap_fault_api_rule(const char *body, size_t len, struct tap_fault_rule *out, char *err, size_t cap)
{
	memset(out, 0, sizeof *out);
	if (len > TAP_FAULT_API_BODY_MAX)
		return body_error(err, cap, "body of %zu bytes (at most %d)", len, TAP_FAULT_API_BODY_MAX);
	if (len == 0)
		return body_error(err, cap, "empty body: " EXPECTED);
	json_error_t je;
	json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return body_error(err, cap, "body is not JSON (line %d column %d: %s): " EXPECTED, je.line, je.column,
				  je.text);
	int rc = TAP_OK;
	const char *key;
	json_t *v;
	json_t *rule = json_is_object(root) ? json_object_get(root, "rule") : NULL;
	if (!json_is_object(root)) {
		rc = body_error(err, cap, "body is not a JSON object: " EXPECTED);
		goto out;
	}
	json_object_foreach(root, key, v) {
		if (strcmp(key, "rule") != 0) {
			rc = body_error(err, cap, "unknown member \"%.40s\": " EXPECTED, key);
			goto out;
		}
	}
	if (!rule) {
		rc = body_error(err, cap, "no \"rule\": " EXPECTED);
		goto out;
	}
	if (!json_is_string(rule)) {
		rc = body_error(err, cap, "\"rule\" is not a string: " EXPECTED);
		goto out;
	}
	const char *text = json_string_value(rule);
	if (strlen(text) != json_string_length(rule)) { /* "\u0000" would cut the rule short unseen */
		rc = body_error(err, cap, "\"rule\" holds a NUL character");
		goto out;
	}
	rc = tap_fault_parse(text, out, err, cap);
out:
	json_decref(root);
	return rc;
}

void tap_fault_api_rule_json(struct tap_json *j, const struct tap_fault_set *s, size_t i)
{
	const struct tap_fault_rule *r = &s->rules[i];
	tap_json_obj_begin(j);
	tap_json_kv_uint(j, "id", r->id);
	tap_json_kv_str(j, "action", tap_fault_action_name(r->action));
	tap_json_kv_str(j, "text", r->text);
	tap_json_kv_ts(j, "added", s->added_us[i]);
	tap_json_kv_uint(j, "acted", s->rule_acted[i]);
	tap_json_obj_end(j);
}

void tap_fault_api_rules_json(struct tap_json *j, const struct tap_fault_set *s)
{
	tap_json_arr_begin(j);
	for (size_t i = 0; i < s->n; i++)
		tap_fault_api_rule_json(j, s, i);
	tap_json_arr_end(j);
}

void tap_fault_api_error_json(struct tap_buf *out, const char *why)
{
	struct tap_json j;
	tap_json_init(&j, out);
	tap_json_obj_begin(&j);
	tap_json_kv_str(&j, "error", why);
	tap_json_obj_end(&j);
}
