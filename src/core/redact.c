/* Secrets on the wire and where their bytes are; see redact.h. */
#include "amqptap/redact.h"

static struct tap_slice arg_slice(const struct tap_arg *a)
{
	return (struct tap_slice){a->ptr, a->len};
}

bool tap_redact_is_secret(const struct tap_method *m, unsigned arg)
{
	if (!m->def)
		return false;
	switch (m->def->id) {
	case TAP_CONNECTION_START_OK:
		return arg == TAP_ARG_CONNECTION_START_OK_RESPONSE ||
		       (arg == TAP_ARG_CONNECTION_START_OK_MECHANISM &&
		        !tap_sasl_mechanism_known(arg_slice(&m->args[TAP_ARG_CONNECTION_START_OK_MECHANISM])));
	case TAP_CONNECTION_SECURE_OK: return arg == TAP_ARG_CONNECTION_SECURE_OK_RESPONSE;
	case TAP_CONNECTION_UPDATE_SECRET: return arg == TAP_ARG_CONNECTION_UPDATE_SECRET_NEW_SECRET;
	default: return false;
	}
}

size_t tap_redact_ranges(const struct tap_method *m, const uint8_t *payload, struct tap_range out[TAP_REDACT_MAX_RANGES])
{
	size_t n = 0;
	if (!m->def)
		return 0;
	for (unsigned i = 0; i < m->def->nargs; i++) {
		if (!tap_redact_is_secret(m, i))
			continue;
		const struct tap_arg *a = &m->args[i];
		if (!a->ptr || a->len == 0)
			continue;
		size_t base = (size_t)(a->ptr - payload);
		struct tap_sasl s = {0};
		/* of a start-ok response all but the user, which the frame trace shows too: a PLAIN authzid or an AMQPLAIN
		 * key besides LOGIN is the client's as much as its password; what is kept lets a replay find the user */
		if (m->def->id == TAP_CONNECTION_START_OK && i == TAP_ARG_CONNECTION_START_OK_RESPONSE)
			tap_sasl_parse(arg_slice(&m->args[TAP_ARG_CONNECTION_START_OK_MECHANISM]), arg_slice(a), &s);
		if (s.kept.len == 0) {
			out[n++] = (struct tap_range){base, a->len};
			continue;
		}
		size_t kept_end = s.kept.off + s.kept.len;
		if (s.kept.off > 0)
			out[n++] = (struct tap_range){base, s.kept.off};
		if (kept_end < a->len)
			out[n++] = (struct tap_range){base + kept_end, a->len - kept_end};
	}
	return n;
}
