/* libFuzzer harness for amqptap audit's reckoning (src/core/audit.c): the input is lines of JSON (a verdict file, or
 * anything), each placed by its own "ts" as the command places them and fed to one audit, then both reports are
 * rendered. What it must keep: no crash, no leak, and what it counts consistent (never more resent, duplicates or
 * missing than publishes). Seeds: tests/fuzz/corpus/audit/. */
#include "amqptap/audit.h"
#include "amqptap/status.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

static json_int_t member(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	return json_is_integer(v) ? json_integer_value(v) : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > 1 << 20)
		return 0;
	/* a short window (the first byte, in seconds) so that inputs reach the window's end */
	struct tap_audit *a = tap_audit_new(size ? (int64_t)(data[0] % 8 + 1) * 1000000 : 1000000);
	if (!a)
		return 0;
	const char *p = (const char *)data, *end = p + size;
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t len = (size_t)((nl ? nl : end) - p);
		int64_t ts;
		if (tap_audit_line_ts(p, len, &ts))
			tap_audit_advance(a, ts);
		if (tap_audit_line(a, p, len) != TAP_OK)
			break;
		p += len + 1;
	}
	tap_audit_finish(a);
	struct tap_buf b;
	tap_buf_init(&b);
	tap_audit_report(a, TAP_AUDIT_TABLE, &b);
	tap_buf_reset(&b);
	tap_audit_report(a, TAP_AUDIT_JSON, &b);
	json_error_t err;
	json_t *o = b.oom ? NULL : json_loadb(b.data, b.len, 0, &err);
	if (!b.oom && !o)
		abort(); /* the --json report is always JSON */
	if (o) {
		json_int_t pubs = member(o, "publishes");
		if (member(o, "resent") > pubs || member(o, "duplicates") > pubs || member(o, "unknown") > pubs ||
		    (json_int_t)tap_audit_missing(a) != member(o, "missing"))
			abort();
		json_decref(o);
	}
	tap_buf_deinit(&b);
	tap_audit_free(a);
	return 0;
}
