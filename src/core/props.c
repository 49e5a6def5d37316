/* Content header decoding: 0-9-1 §4.2.6.1 (header frame layout), §4.2.6.2 (property flags, continuation
 * bit 0), basic class properties in XML order. */
#include "amqptap/props.h"

#include "amqptap/spec.h"
#include "amqptap/status.h"
#include "amqptap/table.h"
#include "rd.h"

#include <stddef.h>
#include <string.h>

/* Every property to zero. In pieces of at most 64 bytes, which compilers emit as a few vector stores
 * (a single memset of the ~200 bytes becomes rep stos or a call, about three times the instructions). */
static inline void clear_props(struct tap_props *p)
{
	enum { N = sizeof(struct tap_props) - offsetof(struct tap_props, content_type) };
	_Static_assert(N > 128 && N <= 192, "clear_props: struct tap_props changed size");
	uint8_t *z = (uint8_t *)&p->content_type;
	memset(z, 0, 64);
	memset(z + 64, 0, 64);
	memset(z + 128, 0, N - 128);
}

static inline bool shortslice(struct tap_rd *r, struct tap_slice *s)
{
	uint32_t n;
	if (!tap_rd_shortstr(r, &s->ptr, &n))
		return false;
	s->len = n;
	return true;
}

/* Header frame fields before the properties, when they are not the common case handled inline: a short
 * payload, a class other than basic, a bad flag, continuation words. Returns the bytes up to the first
 * property with p->flags set, or the status to return (every property zero). */
__attribute__((noinline)) static int head_slow(const uint8_t *payload, size_t len, struct tap_props *p)
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
	p->flags = flags & (uint16_t)~TAP_PROP_CONTINUATION;
	return (int)(r.p - payload);
}

/* The headers table is validated after the other properties are read, which keeps the common path free
 * of calls. A bad table still wins over a later truncation and leaves every later property zero, as if
 * decoding had stopped at the table. */
__attribute__((noinline)) static int check_headers(struct tap_props *p, int rc)
{
	int trc = tap_table_validate(p->headers.ptr, p->headers.len);
	if (trc >= 0)
		return rc;
	p->delivery_mode = p->priority = 0;
	p->correlation_id = p->reply_to = p->expiration = p->message_id = (struct tap_slice){NULL, 0};
	p->timestamp = 0;
	p->type = p->user_id = p->app_id = p->cluster_id = (struct tap_slice){NULL, 0};
	return trc;
}

int tap_props_decode(const uint8_t *payload, size_t len, struct tap_props *p)
{
	struct tap_rd r;
	uint16_t flags;
	if (len >= TAP_PROPS_MIN_SIZE && tap_be16(payload) == TAP_CLASS_BASIC && !(tap_be16(payload + 12) & 0x0003)) {
		p->class_id = TAP_CLASS_BASIC;
		p->weight = tap_be16(payload + 2);
		p->body_size = tap_be64(payload + 4);
		p->flags = flags = tap_be16(payload + 12);
		tap_rd_init(&r, payload + TAP_PROPS_MIN_SIZE, len - TAP_PROPS_MIN_SIZE);
	} else {
		int n = head_slow(payload, len, p);
		if (n <= 0)
			return n;
		flags = p->flags;
		tap_rd_init(&r, payload + n, len - (size_t)n);
	}
	clear_props(p);
	if (!flags)
		return TAP_OK;
	if ((flags & TAP_PROP_CONTENT_TYPE) && !shortslice(&r, &p->content_type))
		return TAP_E_TRUNCATED;
	if ((flags & TAP_PROP_CONTENT_ENCODING) && !shortslice(&r, &p->content_encoding))
		return TAP_E_TRUNCATED;
	if (flags & TAP_PROP_HEADERS) {
		uint32_t n;
		if (!tap_rd_longstr(&r, &p->headers.ptr, &n))
			return TAP_E_TRUNCATED;
		p->headers.len = n;
	}
	if ((flags & TAP_PROP_DELIVERY_MODE) && !tap_rd_u8(&r, &p->delivery_mode))
		goto truncated;
	if ((flags & TAP_PROP_PRIORITY) && !tap_rd_u8(&r, &p->priority))
		goto truncated;
	if ((flags & TAP_PROP_CORRELATION_ID) && !shortslice(&r, &p->correlation_id))
		goto truncated;
	if ((flags & TAP_PROP_REPLY_TO) && !shortslice(&r, &p->reply_to))
		goto truncated;
	if ((flags & TAP_PROP_EXPIRATION) && !shortslice(&r, &p->expiration))
		goto truncated;
	if ((flags & TAP_PROP_MESSAGE_ID) && !shortslice(&r, &p->message_id))
		goto truncated;
	if ((flags & TAP_PROP_TIMESTAMP) && !tap_rd_u64(&r, &p->timestamp))
		goto truncated;
	if ((flags & TAP_PROP_TYPE) && !shortslice(&r, &p->type))
		goto truncated;
	if ((flags & TAP_PROP_USER_ID) && !shortslice(&r, &p->user_id))
		goto truncated;
	if ((flags & TAP_PROP_APP_ID) && !shortslice(&r, &p->app_id))
		goto truncated;
	if ((flags & TAP_PROP_CLUSTER_ID) && !shortslice(&r, &p->cluster_id))
		goto truncated;
	return flags & TAP_PROP_HEADERS ? check_headers(p, TAP_OK) : TAP_OK;
truncated:
	return flags & TAP_PROP_HEADERS ? check_headers(p, TAP_E_TRUNCATED) : TAP_E_TRUNCATED;
}
