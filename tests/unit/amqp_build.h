/* A tiny AMQP 0-9-1 encoder for test and benchmark streams (0-9-1 §4.2.3
 * frames, §4.2.5 field encodings), appending to a tap_buf. */
#ifndef TAP_AMQP_BUILD_H
#define TAP_AMQP_BUILD_H

#include "amqptap/jsonl.h"

#include <stdint.h>
#include <string.h>

static inline void amqp_be16(struct tap_buf *b, uint16_t v)
{
	uint8_t p[2] = {(uint8_t)(v >> 8), (uint8_t)v};
	tap_buf_append(b, p, 2);
}

static inline void amqp_be32(struct tap_buf *b, uint32_t v)
{
	amqp_be16(b, (uint16_t)(v >> 16));
	amqp_be16(b, (uint16_t)v);
}

static inline void amqp_be64(struct tap_buf *b, uint64_t v)
{
	amqp_be32(b, (uint32_t)(v >> 32));
	amqp_be32(b, (uint32_t)v);
}

static inline void amqp_shortstr(struct tap_buf *b, const char *s)
{
	tap_buf_putc(b, (char)strlen(s));
	tap_buf_puts(b, s);
}

static inline void amqp_longstr(struct tap_buf *b, const void *s, size_t len)
{
	amqp_be32(b, (uint32_t)len);
	tap_buf_append(b, s, len);
}

/* type, channel, size, payload, 0xCE */
static inline void amqp_frame(struct tap_buf *out, uint8_t type, uint16_t ch, const void *payload, size_t len)
{
	tap_buf_putc(out, (char)type);
	amqp_be16(out, ch);
	amqp_be32(out, (uint32_t)len);
	tap_buf_append(out, payload, len);
	tap_buf_putc(out, (char)0xCE);
}

/* A method frame: class-id, method-id, then the encoded arguments. */
static inline void amqp_method(struct tap_buf *out, uint16_t ch, uint16_t cls, uint16_t mid, const void *args,
			       size_t len)
{
	const uint8_t ids[4] = {(uint8_t)(cls >> 8), (uint8_t)cls, (uint8_t)(mid >> 8), (uint8_t)mid};
	tap_buf_putc(out, 1);
	amqp_be16(out, ch);
	amqp_be32(out, (uint32_t)(4 + len));
	tap_buf_append(out, ids, 4);
	tap_buf_append(out, args, len);
	tap_buf_putc(out, (char)0xCE);
}

#endif
