/* Method frame payload decoding driven by the generated argument tables of spec.c
 * (0-9-1 §4.2.4 method payload, §4.2.5 field types, §4.2.5.2 bit packing). */
#include "amqptap/spec.h"

#include "amqptap/status.h"
#include "amqptap/table.h"
#include "rd.h"

int tap_method_decode(const uint8_t *payload, size_t len, struct tap_method *m)
{
	struct tap_rd r;
	tap_rd_init(&r, payload, len);
	m->def = NULL;
	m->class_id = m->method_id = 0;
	if (!tap_rd_u16(&r, &m->class_id) || !tap_rd_u16(&r, &m->method_id))
		return TAP_E_TRUNCATED;
	const struct tap_method_def *def = tap_spec_method(m->class_id, m->method_id);
	if (!def)
		return TAP_E_UNKNOWN_METHOD;
	unsigned bitpos = 8; /* 8: no open octet of packed bits */
	uint8_t bits = 0;
	for (unsigned i = 0; i < def->nargs; i++) {
		struct tap_arg *a = &m->args[i];
		enum tap_arg_type t = def->args[i].type;
		a->type = t;
		a->u = 0;
		a->ptr = NULL;
		a->len = 0;
		if (t == TAP_ARG_BIT) {
			if (bitpos == 8) {
				if (!tap_rd_u8(&r, &bits))
					return TAP_E_TRUNCATED;
				bitpos = 0;
			}
			a->u = (bits >> bitpos++) & 1;
			continue;
		}
		bitpos = 8;
		bool ok;
		switch (t) {
		case TAP_ARG_OCTET: {
			uint8_t v = 0;
			ok = tap_rd_u8(&r, &v);
			a->u = v;
			break;
		}
		case TAP_ARG_SHORT: {
			uint16_t v = 0;
			ok = tap_rd_u16(&r, &v);
			a->u = v;
			break;
		}
		case TAP_ARG_LONG: {
			uint32_t v = 0;
			ok = tap_rd_u32(&r, &v);
			a->u = v;
			break;
		}
		case TAP_ARG_LONGLONG:
		case TAP_ARG_TIMESTAMP:
			ok = tap_rd_u64(&r, &a->u);
			break;
		case TAP_ARG_SHORTSTR:
			ok = tap_rd_shortstr(&r, &a->ptr, &a->len);
			break;
		case TAP_ARG_LONGSTR:
			ok = tap_rd_longstr(&r, &a->ptr, &a->len);
			break;
		case TAP_ARG_TABLE: {
			ok = tap_rd_longstr(&r, &a->ptr, &a->len);
			int rc = ok ? tap_table_validate(a->ptr, a->len) : 0;
			if (rc < 0)
				return rc;
			break;
		}
		default:
			ok = false;
			break;
		}
		if (!ok)
			return TAP_E_TRUNCATED;
	}
	m->def = def;
	return TAP_OK;
}
