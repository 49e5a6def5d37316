/* Method frame payload decoding (0-9-1 §4.2.4 method payload: class-id, method-id, arguments). The
 * arguments are read by the straight-line per-method decoders that scripts/codegen.py generates into
 * spec.c (§4.2.5 field types, §4.2.5.2 bit packing); they set m->def on success. */
#include "amqptap/spec.h"

#include "amqptap/status.h"
#include "rd.h"

int tap_method_decode(const uint8_t *payload, size_t len, struct tap_method *m)
{
	m->def = NULL;
	if (len < 4) {
		m->class_id = len >= 2 ? tap_be16(payload) : 0;
		m->method_id = 0;
		return TAP_E_TRUNCATED;
	}
	uint16_t class_id = tap_be16(payload), method_id = tap_be16(payload + 2);
	m->class_id = class_id;
	m->method_id = method_id;
	const struct tap_method_def *def = tap_spec_method_find(class_id, method_id);
	if (!def)
		return TAP_E_UNKNOWN_METHOD;
	return def->decode_args(payload + 4, payload + len, m);
}
