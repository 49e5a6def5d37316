/* Secrets on the wire and where their bytes are; see redact.h. */
#include "amqptap/redact.h"

#include "amqptap/table.h"

#include <string.h>

bool tap_redact_is_secret(uint32_t method_id, unsigned arg)
{
	switch (method_id) {
	case TAP_CONNECTION_START_OK: return arg == TAP_ARG_CONNECTION_START_OK_RESPONSE;
	case TAP_CONNECTION_SECURE_OK: return arg == TAP_ARG_CONNECTION_SECURE_OK_RESPONSE;
	case TAP_CONNECTION_UPDATE_SECRET: return arg == TAP_ARG_CONNECTION_UPDATE_SECRET_NEW_SECRET;
	default: return false;
	}
}

static bool slice_eq(const struct tap_arg *a, const char *s)
{
	return a->len == strlen(s) && memcmp(a->ptr, s, a->len) == 0;
}

/* The password part of a start-ok response, as (ptr, len) inside it. */
static void secret_of_response(const struct tap_arg *mech, const struct tap_arg *resp, const uint8_t **p, size_t *len)
{
	*p = resp->ptr;
	*len = resp->len;
	if (slice_eq(mech, "PLAIN")) { /* RFC 4616: [authzid] NUL authcid NUL passwd */
		const uint8_t *nul1 = memchr(resp->ptr, 0, resp->len);
		const uint8_t *nul2 = nul1 ? memchr(nul1 + 1, 0, resp->len - (size_t)(nul1 + 1 - resp->ptr)) : NULL;
		if (nul2) {
			*p = nul2 + 1;
			*len = resp->len - (size_t)(nul2 + 1 - resp->ptr);
		}
	} else if (slice_eq(mech, "AMQPLAIN")) { /* a field table without its length prefix */
		struct tap_field f;
		if (tap_table_find(resp->ptr, resp->len, "PASSWORD", &f) && f.ptr) {
			*p = f.ptr;
			*len = f.len;
		}
	}
}

size_t tap_redact_ranges(const struct tap_method *m, const uint8_t *payload, struct tap_range out[2])
{
	if (!m->def)
		return 0;
	for (unsigned i = 0; i < m->def->nargs; i++) {
		if (!tap_redact_is_secret(m->def->id, i))
			continue;
		const struct tap_arg *a = &m->args[i];
		const uint8_t *p = a->ptr;
		size_t len = a->len;
		if (m->def->id == TAP_CONNECTION_START_OK)
			secret_of_response(&m->args[TAP_ARG_CONNECTION_START_OK_MECHANISM], a, &p, &len);
		if (!p || len == 0)
			return 0;
		out[0].off = (size_t)(p - payload);
		out[0].len = len;
		return 1;
	}
	return 0;
}
