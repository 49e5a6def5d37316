/* Method frame payload decoding driven by the generated per-method wire programs of spec.c
 * (0-9-1 §4.2.4 method payload, §4.2.5 field types, §4.2.5.2 bit packing). */
#include "amqptap/spec.h"

#include "amqptap/status.h"
#include "amqptap/table.h"
#include "rd.h"

/* One argument per iteration, each field of *a written exactly once. The bounds checks compare the bytes
 * left (end - p) with what the field needs, so nothing is read past end; on a short read the failing
 * argument is left as {type, 0, NULL, 0} and those before it are filled in. */
int tap_method_decode(const uint8_t *payload, size_t len, struct tap_method *m)
{
	m->def = NULL;
	if (len < 4) {
		m->class_id = len >= 2 ? tap_be16(payload) : 0;
		m->method_id = 0;
		return TAP_E_TRUNCATED;
	}
	m->class_id = tap_be16(payload);
	m->method_id = tap_be16(payload + 2);
	const struct tap_method_def *def = tap_spec_method(m->class_id, m->method_id);
	if (!def)
		return TAP_E_UNKNOWN_METHOD;
	const uint8_t *p = payload + 4, *end = payload + len;
	struct tap_arg *a = m->args;
	unsigned bits = 0;
	for (unsigned i = 0; i < def->nargs; i++, a++) {
		uint8_t w = def->wire[i];
		size_t left = (size_t)(end - p);
		enum tap_arg_type t = (enum tap_arg_type)(w & TAP_WIRE_TYPE_MASK);
		a->type = t;
		if (t == TAP_ARG_BIT) {
			if (w & TAP_WIRE_NEW_OCTET) {
				if (left < 1)
					goto truncated;
				bits = *p++;
			}
			a->u = (bits >> ((w >> TAP_WIRE_BIT_SHIFT) & 7)) & 1;
			a->ptr = NULL;
			a->len = 0;
			continue;
		}
		switch (t) {
		case TAP_ARG_SHORTSTR: /* §4.2.5.3 */
			if (left < 1 || left - 1 < *p)
				goto truncated;
			a->u = 0;
			a->len = *p;
			a->ptr = p + 1;
			p += 1 + (size_t)*p;
			break;
		case TAP_ARG_SHORT:
			if (left < 2)
				goto truncated;
			a->u = tap_be16(p);
			a->ptr = NULL;
			a->len = 0;
			p += 2;
			break;
		case TAP_ARG_OCTET:
			if (left < 1)
				goto truncated;
			a->u = *p++;
			a->ptr = NULL;
			a->len = 0;
			break;
		case TAP_ARG_LONG:
			if (left < 4)
				goto truncated;
			a->u = tap_be32(p);
			a->ptr = NULL;
			a->len = 0;
			p += 4;
			break;
		case TAP_ARG_LONGLONG:
		case TAP_ARG_TIMESTAMP:
			if (left < 8)
				goto truncated;
			a->u = tap_be64(p);
			a->ptr = NULL;
			a->len = 0;
			p += 8;
			break;
		case TAP_ARG_LONGSTR:
		case TAP_ARG_TABLE: {
			if (left < 4 || left - 4 < tap_be32(p))
				goto truncated;
			uint32_t n = tap_be32(p);
			a->u = 0;
			a->ptr = p + 4;
			a->len = n;
			p += 4 + (size_t)n;
			if (t == TAP_ARG_TABLE) {
				int rc = tap_table_validate(a->ptr, n);
				if (rc < 0)
					return rc;
			}
			break;
		}
		default:
			goto truncated;
		}
	}
	m->def = def;
	return TAP_OK;
truncated:
	a->u = 0;
	a->ptr = NULL;
	a->len = 0;
	return TAP_E_TRUNCATED;
}
