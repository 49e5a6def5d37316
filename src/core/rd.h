/* Bounded big-endian cursor for AMQP 0-9-1 wire data (0-9-1 §4.2.5: integers are network byte order).
 * Every getter returns false, without moving, when the bytes are not there; callers parse on a copy of
 * the cursor and commit it (*r = c) only when everything they needed was read. Internal to src/core. */
#ifndef AMQPTAP_RD_H
#define AMQPTAP_RD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct tap_rd {
	const uint8_t *p;
	const uint8_t *end;
};

static inline void tap_rd_init(struct tap_rd *r, const uint8_t *p, size_t len)
{
	r->p = p;
	r->end = p + len;
}

static inline size_t tap_rd_left(const struct tap_rd *r)
{
	return (size_t)(r->end - r->p);
}

static inline uint16_t tap_be16(const uint8_t *p)
{
	return (uint16_t)((uint16_t)p[0] << 8 | p[1]);
}

static inline uint32_t tap_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t tap_be64(const uint8_t *p)
{
	return (uint64_t)tap_be32(p) << 32 | tap_be32(p + 4);
}

__attribute__((warn_unused_result)) static inline bool tap_rd_u8(struct tap_rd *r, uint8_t *v)
{
	if (r->p == r->end)
		return false;
	*v = *r->p++;
	return true;
}

__attribute__((warn_unused_result)) static inline bool tap_rd_u16(struct tap_rd *r, uint16_t *v)
{
	if (tap_rd_left(r) < 2)
		return false;
	*v = tap_be16(r->p);
	r->p += 2;
	return true;
}

__attribute__((warn_unused_result)) static inline bool tap_rd_u32(struct tap_rd *r, uint32_t *v)
{
	if (tap_rd_left(r) < 4)
		return false;
	*v = tap_be32(r->p);
	r->p += 4;
	return true;
}

__attribute__((warn_unused_result)) static inline bool tap_rd_u64(struct tap_rd *r, uint64_t *v)
{
	if (tap_rd_left(r) < 8)
		return false;
	*v = tap_be64(r->p);
	r->p += 8;
	return true;
}

/* n raw bytes as a slice of the input. */
__attribute__((warn_unused_result)) static inline bool tap_rd_bytes(struct tap_rd *r, size_t n, const uint8_t **p)
{
	if (tap_rd_left(r) < n)
		return false;
	*p = r->p;
	r->p += n;
	return true;
}

/* short string: u8 length + bytes (0-9-1 §4.2.5.3). Moves only on success. */
__attribute__((warn_unused_result)) static inline bool tap_rd_shortstr(struct tap_rd *r, const uint8_t **p,
								       uint32_t *len)
{
	if (r->p == r->end || tap_rd_left(r) - 1 < *r->p)
		return false;
	*len = *r->p;
	*p = r->p + 1;
	r->p += 1 + *len;
	return true;
}

/* long string (and field table / array body): u32 length + bytes. Moves only on success. */
__attribute__((warn_unused_result)) static inline bool tap_rd_longstr(struct tap_rd *r, const uint8_t **p,
								      uint32_t *len)
{
	if (tap_rd_left(r) < 4)
		return false;
	uint32_t n = tap_be32(r->p);
	if (tap_rd_left(r) - 4 < n)
		return false;
	*len = n;
	*p = r->p + 4;
	r->p += 4 + (size_t)n;
	return true;
}

#endif
