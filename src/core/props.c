/* Content header decoding: 0-9-1 §4.2.6.1 (header frame layout), §4.2.6.2 (property flags, continuation
 * bit 0), basic class properties in XML order. */
#include "amqptap/props.h"

#include "amqptap/spec.h"
#include "amqptap/status.h"
#include "amqptap/table.h"
#include "rd.h"

#include <string.h>

/* The property decoders below write their field whether it is present or not (absent: zero), so no
 * memset of the whole struct is needed. They take and return the flags still to honour: after the
 * first error they get 0, which zeroes every later property, as the contract in props.h asks. */

static inline uint16_t prop_shortstr(struct tap_rd *r, uint16_t flags, uint16_t bit, struct tap_slice *s, int *rc)
{
	uint32_t n;
	if ((flags & bit) && tap_rd_shortstr(r, &s->ptr, &n)) {
		s->len = n;
		return flags;
	}
	s->ptr = NULL;
	s->len = 0;
	if (!(flags & bit))
		return flags;
	*rc = TAP_E_TRUNCATED;
	return 0;
}

static inline uint16_t prop_u8(struct tap_rd *r, uint16_t flags, uint16_t bit, uint8_t *v, int *rc)
{
	*v = 0;
	if (!(flags & bit))
		return flags;
	if (tap_rd_u8(r, v))
		return flags;
	*rc = TAP_E_TRUNCATED;
	return 0;
}

/* Header frame fields before the properties, when they are not the common case handled inline: a short
 * payload, a class other than basic, a bad flag, continuation words. Returns 1 with *flags and r past
 * the flag words when the properties follow, else the status to return (all properties zero). */
static int head_slow(struct tap_rd *r, struct tap_props *p, uint16_t *flags)
{
	uint16_t f, more;
	memset(p, 0, sizeof *p);
	if (!tap_rd_u16(r, &p->class_id) || !tap_rd_u16(r, &p->weight) || !tap_rd_u64(r, &p->body_size) ||
	    !tap_rd_u16(r, &f))
		return TAP_E_TRUNCATED;
	if (p->class_id != TAP_CLASS_BASIC)
		return TAP_E_UNKNOWN_CLASS;
	/* basic has 14 properties: bits 15..2 of the first word; bit 1 and any continuation word are unused */
	if (f & 0x0002)
		return TAP_E_BAD_PROPERTY_FLAGS;
	for (more = f; more & TAP_PROP_CONTINUATION;) {
		if (!tap_rd_u16(r, &more))
			return TAP_E_TRUNCATED;
		if (more & ~TAP_PROP_CONTINUATION)
			return TAP_E_BAD_PROPERTY_FLAGS;
	}
	*flags = f & (uint16_t)~TAP_PROP_CONTINUATION;
	return 1;
}

int tap_props_decode(const uint8_t *payload, size_t len, struct tap_props *p)
{
	struct tap_rd r;
	uint16_t flags;
	int rc = TAP_OK;
	tap_rd_init(&r, payload, len);
	if (len >= TAP_PROPS_MIN_SIZE && tap_be16(payload) == TAP_CLASS_BASIC && !(tap_be16(payload + 12) & 0x0003)) {
		p->class_id = TAP_CLASS_BASIC;
		p->weight = tap_be16(payload + 2);
		p->body_size = tap_be64(payload + 4);
		flags = tap_be16(payload + 12);
		r.p += TAP_PROPS_MIN_SIZE;
	} else if ((rc = head_slow(&r, p, &flags)) <= 0) {
		return rc;
	} else {
		rc = TAP_OK;
	}
	p->flags = flags;
	flags = prop_shortstr(&r, flags, TAP_PROP_CONTENT_TYPE, &p->content_type, &rc);
	flags = prop_shortstr(&r, flags, TAP_PROP_CONTENT_ENCODING, &p->content_encoding, &rc);
	p->headers.ptr = NULL;
	p->headers.len = 0;
	if (flags & TAP_PROP_HEADERS) {
		uint32_t n;
		int trc;
		if (!tap_rd_longstr(&r, &p->headers.ptr, &n)) {
			rc = TAP_E_TRUNCATED;
			flags = 0;
		} else if (p->headers.len = n, (trc = tap_table_validate(p->headers.ptr, n)) < 0) {
			rc = trc;
			flags = 0;
		}
	}
	flags = prop_u8(&r, flags, TAP_PROP_DELIVERY_MODE, &p->delivery_mode, &rc);
	flags = prop_u8(&r, flags, TAP_PROP_PRIORITY, &p->priority, &rc);
	flags = prop_shortstr(&r, flags, TAP_PROP_CORRELATION_ID, &p->correlation_id, &rc);
	flags = prop_shortstr(&r, flags, TAP_PROP_REPLY_TO, &p->reply_to, &rc);
	flags = prop_shortstr(&r, flags, TAP_PROP_EXPIRATION, &p->expiration, &rc);
	flags = prop_shortstr(&r, flags, TAP_PROP_MESSAGE_ID, &p->message_id, &rc);
	p->timestamp = 0;
	if ((flags & TAP_PROP_TIMESTAMP) && !tap_rd_u64(&r, &p->timestamp)) {
		rc = TAP_E_TRUNCATED;
		flags = 0;
	}
	flags = prop_shortstr(&r, flags, TAP_PROP_TYPE, &p->type, &rc);
	flags = prop_shortstr(&r, flags, TAP_PROP_USER_ID, &p->user_id, &rc);
	flags = prop_shortstr(&r, flags, TAP_PROP_APP_ID, &p->app_id, &rc);
	prop_shortstr(&r, flags, TAP_PROP_CLUSTER_ID, &p->cluster_id, &rc);
	return rc;
}
