/* Content header decoding: 0-9-1 §4.2.6.1 (header frame layout), §4.2.6.2 (property flags, continuation
 * bit 0), basic class properties in XML order. */
#include "amqptap/props.h"

#include "amqptap/spec.h"
#include "amqptap/status.h"
#include "amqptap/table.h"
#include "rd.h"

#include <string.h>

static bool rd_shortslice(struct tap_rd *r, struct tap_slice *s)
{
	uint32_t n;
	if (!tap_rd_shortstr(r, &s->ptr, &n))
		return false;
	s->len = n;
	return true;
}

int tap_props_decode(const uint8_t *payload, size_t len, struct tap_props *p)
{
	struct tap_rd r;
	uint16_t flags, more;
	memset(p, 0, sizeof *p);
	tap_rd_init(&r, payload, len);
	if (!tap_rd_u16(&r, &p->class_id) || !tap_rd_u16(&r, &p->weight) || !tap_rd_u64(&r, &p->body_size) ||
	    !tap_rd_u16(&r, &flags))
		return TAP_E_TRUNCATED;
	if (p->class_id != TAP_CLASS_BASIC)
		return TAP_E_UNKNOWN_CLASS;
	/* basic has 14 properties: bits 15..2 of the first word; bit 1 and any continuation word are unused */
	if (flags & 0x0002)
		return TAP_E_BAD_PROPERTY_FLAGS;
	for (more = flags; more & TAP_PROP_CONTINUATION;) {
		if (!tap_rd_u16(&r, &more))
			return TAP_E_TRUNCATED;
		if (more & ~TAP_PROP_CONTINUATION)
			return TAP_E_BAD_PROPERTY_FLAGS;
	}
	flags &= (uint16_t)~TAP_PROP_CONTINUATION;
	p->flags = flags;
	if (!flags)
		return TAP_OK;
	if ((flags & TAP_PROP_CONTENT_TYPE) && !rd_shortslice(&r, &p->content_type))
		return TAP_E_TRUNCATED;
	if ((flags & TAP_PROP_CONTENT_ENCODING) && !rd_shortslice(&r, &p->content_encoding))
		return TAP_E_TRUNCATED;
	if (flags & TAP_PROP_HEADERS) {
		uint32_t n;
		if (!tap_rd_longstr(&r, &p->headers.ptr, &n))
			return TAP_E_TRUNCATED;
		p->headers.len = n;
		int rc = tap_table_validate(p->headers.ptr, n);
		if (rc < 0)
			return rc;
	}
	if ((flags & TAP_PROP_DELIVERY_MODE) && !tap_rd_u8(&r, &p->delivery_mode))
		return TAP_E_TRUNCATED;
	if ((flags & TAP_PROP_PRIORITY) && !tap_rd_u8(&r, &p->priority))
		return TAP_E_TRUNCATED;
	if ((flags & TAP_PROP_CORRELATION_ID) && !rd_shortslice(&r, &p->correlation_id))
		return TAP_E_TRUNCATED;
	if ((flags & TAP_PROP_REPLY_TO) && !rd_shortslice(&r, &p->reply_to))
		return TAP_E_TRUNCATED;
	if ((flags & TAP_PROP_EXPIRATION) && !rd_shortslice(&r, &p->expiration))
		return TAP_E_TRUNCATED;
	if ((flags & TAP_PROP_MESSAGE_ID) && !rd_shortslice(&r, &p->message_id))
		return TAP_E_TRUNCATED;
	if ((flags & TAP_PROP_TIMESTAMP) && !tap_rd_u64(&r, &p->timestamp))
		return TAP_E_TRUNCATED;
	if ((flags & TAP_PROP_TYPE) && !rd_shortslice(&r, &p->type))
		return TAP_E_TRUNCATED;
	if ((flags & TAP_PROP_USER_ID) && !rd_shortslice(&r, &p->user_id))
		return TAP_E_TRUNCATED;
	if ((flags & TAP_PROP_APP_ID) && !rd_shortslice(&r, &p->app_id))
		return TAP_E_TRUNCATED;
	if ((flags & TAP_PROP_CLUSTER_ID) && !rd_shortslice(&r, &p->cluster_id))
		return TAP_E_TRUNCATED;
	return TAP_OK;
}
