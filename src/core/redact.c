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

static size_t keep_none(struct tap_range out[TAP_REDACT_MAX_RANGES], size_t off, size_t len)
{
	out[0] = (struct tap_range){off, len};
	return 1;
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
		if (m->def->id != TAP_CONNECTION_START_OK)
			return keep_none(out, base, a->len);
		/* all but the user, which the frame trace shows too: a PLAIN authzid or an AMQPLAIN key besides LOGIN
		 * is the client's as much as its password; what is kept lets a replay find the user */
		struct tap_sasl s;
		tap_sasl_parse(arg_slice(&m->args[TAP_ARG_CONNECTION_START_OK_MECHANISM]), arg_slice(a), &s);
		if (s.kept.len == 0)
			return keep_none(out, base, a->len);
		size_t n = 0, kept_end = s.kept.off + s.kept.len;
		if (s.kept.off > 0)
			out[n++] = (struct tap_range){base, s.kept.off};
		if (kept_end < a->len)
			out[n++] = (struct tap_range){base + kept_end, a->len - kept_end};
		return n;
	}
	return 0;
}
