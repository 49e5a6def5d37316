/* libFuzzer harness for --fault-api's POST body (src/core/fault_api.c): the input is the body. An accepted one must
 * give a rule tap_fault_parse accepts alone (its text parses to the same action) and render, once added to a set,
 * as JSON that reads back with that text; a refused one gets one printable line. Seeds: tests/fuzz/corpus/fault_api/. */
#include "amqptap/fault_api.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tap_fault_rule r, again;
	char err[400];
	if (tap_fault_api_rule((const char *)data, size, &r, err, sizeof err) != 0) {
		if (!err[0])
			abort();
		for (const char *q = err; *q; q++)
			if (*q < ' ' || *q > '~')
				abort();
		return 0;
	}
	if ((unsigned)r.action >= TAP_FAULT_ACTIONS || tap_fault_parse(r.text, &again, err, sizeof err) != 0 ||
	    again.action != r.action)
		abort();
	struct tap_fault_set set;
	tap_fault_set_init(&set);
	if (tap_fault_set_add(&set, &r, 0, NULL) != 0)
		abort();
	struct tap_buf b;
	tap_buf_init(&b);
	struct tap_json j;
	tap_json_init(&j, &b);
	tap_fault_api_rule_json(&j, &set, 0);
	json_t *v = json_loadb(b.data, b.len, 0, NULL);
	const char *text = v ? json_string_value(json_object_get(v, "text")) : NULL;
	if (!text || strcmp(text, r.text) != 0)
		abort();
	json_decref(v);
	tap_buf_deinit(&b);
	return 0;
}
