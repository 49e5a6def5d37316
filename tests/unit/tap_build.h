/* The AMQP byte builder shared by the unit tests, the fuzz seeds and the benchmarks: a growable byte string
 * and appenders for the 0-9-1 encodings (§4.2.3 frames, §4.2.5 integers, short and long strings, field-table
 * keys). Allocation failure aborts: this is test code. */
#ifndef TAP_BUILD_H
#define TAP_BUILD_H

#include "amqptap/spec.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Zero-initialise ({0}); tap_build_free releases it. */
struct tap_bytes {
	uint8_t *d;
	size_t n, cap;
};

static inline void tap_build_free(struct tap_bytes *b)
{
	free(b->d);
	*b = (struct tap_bytes){0};
}

static inline void tap_build_raw(struct tap_bytes *b, const void *p, size_t n)
{
	if (n == 0)
		return;
	if (b->n + n > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->n + n)
			cap *= 2;
		uint8_t *d = realloc(b->d, cap);
		if (!d)
			abort();
		b->d = d;
		b->cap = cap;
	}
	memcpy(b->d + b->n, p, n);
	b->n += n;
}

static inline void tap_build_u8(struct tap_bytes *b, uint8_t v)
{
	tap_build_raw(b, &v, 1);
}

static inline void tap_build_u16(struct tap_bytes *b, uint16_t v)
{
	const uint8_t p[2] = {(uint8_t)(v >> 8), (uint8_t)v};
	tap_build_raw(b, p, 2);
}

static inline void tap_build_u32(struct tap_bytes *b, uint32_t v)
{
	tap_build_u16(b, (uint16_t)(v >> 16));
	tap_build_u16(b, (uint16_t)v);
}

static inline void tap_build_u64(struct tap_bytes *b, uint64_t v)
{
	tap_build_u32(b, (uint32_t)(v >> 32));
	tap_build_u32(b, (uint32_t)v);
}

/* u8 length + bytes (§4.2.5.3) */
static inline void tap_build_shortstr(struct tap_bytes *b, const char *s)
{
	tap_build_u8(b, (uint8_t)strlen(s));
	tap_build_raw(b, s, strlen(s));
}

/* u32 length + bytes: a long string, or a field table / array body */
static inline void tap_build_longstr(struct tap_bytes *b, const void *s, size_t n)
{
	tap_build_u32(b, (uint32_t)n);
	tap_build_raw(b, s, n);
}

/* A field-table key and its type letter (§4.2.5.5); the value follows. */
static inline void tap_build_key(struct tap_bytes *b, const char *name, char type)
{
	tap_build_shortstr(b, name);
	tap_build_u8(b, (uint8_t)type);
}

/* An AMQPLAIN response (a field table body): LOGIN, then a PASSWORD key for each of the n passwords. */
static inline void tap_build_amqplain(struct tap_bytes *b, const char *login, const char *const *passwords, size_t n)
{
	tap_build_key(b, "LOGIN", 'S');
	tap_build_longstr(b, login, strlen(login));
	for (size_t i = 0; i < n; i++) {
		tap_build_key(b, "PASSWORD", 'S');
		tap_build_longstr(b, passwords[i], strlen(passwords[i]));
	}
}

/* type, channel, size, payload, 0xCE */
static inline void tap_build_frame(struct tap_bytes *out, uint8_t type, uint16_t ch, const void *payload, size_t len)
{
	tap_build_u8(out, type);
	tap_build_u16(out, ch);
	tap_build_u32(out, (uint32_t)len);
	tap_build_raw(out, payload, len);
	tap_build_u8(out, 0xCE);
}

/* A method frame: method_id is TAP_METHOD_ID(class, method) (class-id and method-id on the wire), then the
 * encoded arguments. */
static inline void tap_build_method(struct tap_bytes *out, uint16_t ch, uint32_t method_id, const void *args,
				    size_t len)
{
	tap_build_u8(out, 1);
	tap_build_u16(out, ch);
	tap_build_u32(out, (uint32_t)(4 + len));
	tap_build_u32(out, method_id);
	tap_build_raw(out, args, len);
	tap_build_u8(out, 0xCE);
}

/* connection.start-ok on channel 0: client properties (a table body, may be empty), mechanism, response, en_US. */
static inline void tap_build_start_ok(struct tap_bytes *out, const struct tap_bytes *props, const char *mechanism,
				      const void *response, size_t len)
{
	struct tap_bytes a = {0};
	tap_build_longstr(&a, props ? props->d : NULL, props ? props->n : 0);
	tap_build_shortstr(&a, mechanism);
	tap_build_longstr(&a, response, len);
	tap_build_shortstr(&a, "en_US");
	tap_build_method(out, 0, TAP_CONNECTION_START_OK, a.d, a.n);
	tap_build_free(&a);
}

/* The rest of the handshake: tune-ok (channel-max 2047, frame-max 131072, heartbeat 60), connection.open vhost. */
static inline void tap_build_tune_ok_open(struct tap_bytes *out, const char *vhost)
{
	struct tap_bytes a = {0};
	tap_build_u16(&a, 2047);
	tap_build_u32(&a, 131072);
	tap_build_u16(&a, 60);
	tap_build_method(out, 0, TAP_CONNECTION_TUNE_OK, a.d, a.n);
	a.n = 0;
	tap_build_shortstr(&a, vhost);
	tap_build_shortstr(&a, "");
	tap_build_u8(&a, 0);
	tap_build_method(out, 0, TAP_CONNECTION_OPEN, a.d, a.n);
	tap_build_free(&a);
}

/* A content header frame of class basic with no properties (§4.2.6.1). */
static inline void tap_build_header(struct tap_bytes *out, uint16_t ch, uint64_t body_size)
{
	struct tap_bytes h = {0};
	tap_build_u16(&h, 60);
	tap_build_u16(&h, 0);
	tap_build_u64(&h, body_size);
	tap_build_u16(&h, 0);
	tap_build_frame(out, 2, ch, h.d, h.n);
	tap_build_free(&h);
}

#endif
