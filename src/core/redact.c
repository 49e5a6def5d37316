/* Secrets on the wire and where their bytes are; see redact.h. */
#include "amqptap/redact.h"

bool tap_redact_is_secret(uint32_t method_id, unsigned arg)
{
	switch (method_id) {
	case TAP_CONNECTION_START_OK: return arg == TAP_ARG_CONNECTION_START_OK_RESPONSE;
	case TAP_CONNECTION_SECURE_OK: return arg == TAP_ARG_CONNECTION_SECURE_OK_RESPONSE;
	case TAP_CONNECTION_UPDATE_SECRET: return arg == TAP_ARG_CONNECTION_UPDATE_SECRET_NEW_SECRET;
	default: return false;
	}
}

static struct tap_slice arg_slice(const struct tap_arg *a)
{
	return (struct tap_slice){a->ptr, a->len};
}

size_t tap_redact_ranges(const struct tap_method *m, const uint8_t *payload, struct tap_range out[TAP_REDACT_MAX_RANGES])
{
	if (!m->def)
		return 0;
	for (unsigned i = 0; i < m->def->nargs; i++) {
		if (!tap_redact_is_secret(m->def->id, i))
			continue;
		const struct tap_arg *a = &m->args[i];
		if (!a->ptr || a->len == 0)
			return 0;
		size_t base = (size_t)(a->ptr - payload);
		if (m->def->id != TAP_CONNECTION_START_OK) {
			out[0] = (struct tap_range){base, a->len};
			return 1;
		}
		struct tap_sasl s;
		tap_sasl_parse(arg_slice(&m->args[TAP_ARG_CONNECTION_START_OK_MECHANISM]), arg_slice(a), &s);
		for (size_t k = 0; k < s.n_secrets; k++)
			out[k] = (struct tap_range){base + s.secret[k].off, s.secret[k].len};
		return s.n_secrets;
	}
	return 0;
}
