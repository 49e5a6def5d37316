/* A FIFO byte arena: blobs are allocated at the tail in order and released by moving the head past them, so
 * storing the strings of outstanding publishes costs one copy and no allocation per publish.
 *
 *   logical offsets:  head ........ tail    (live bytes; a blob never straddles the physical end, the gap
 *   physical:         off & (cap - 1)        before a wrap is padding and is released with its successor)
 *
 * Offsets are logical and survive growth; the owner moves `head` to the offset of its oldest live blob (or to
 * `tail` when none is left). */
#ifndef AMQPTAP_ARENA_H
#define AMQPTAP_ARENA_H

#include <stdbool.h>
#include <stdint.h>

#define TAP_ARENA_MIN_CAP 128u /* kept by an idle channel (track_store.h): small */
#define TAP_ARENA_NONE UINT64_MAX

struct tap_arena {
	uint8_t *buf;
	uint64_t cap; /* power of two or 0 */
	uint64_t head, tail;
	uint64_t *mem; /* budget counter, or NULL */
};

/* Zero-filled is empty too; mem may be NULL. */
void tap_arena_init(struct tap_arena *a, uint64_t *mem);
void tap_arena_deinit(struct tap_arena *a);
/* Reserves n contiguous bytes; returns their logical offset, or TAP_ARENA_NONE when out of memory. */
uint64_t tap_arena_alloc(struct tap_arena *a, uint64_t n);
/* Makes the capacity at least n bytes; false when out of memory. */
bool tap_arena_reserve(struct tap_arena *a, uint64_t n);
/* Frees the buffer of an empty arena (head == tail); offsets restart at 0. */
void tap_arena_release(struct tap_arena *a);

/* The capacity that holds need bytes: cap doubled as often as it takes (TAP_ARENA_MIN_CAP from 0). */
static inline uint64_t tap_arena_cap_for(uint64_t cap, uint64_t need)
{
	if (!cap)
		cap = TAP_ARENA_MIN_CAP;
	while (cap < need)
		cap *= 2;
	return cap;
}

/* Where a blob of n bytes would start, and whether it fits without growing. */
static inline bool tap_arena_fit(const struct tap_arena *a, uint64_t n, uint64_t *start)
{
	*start = a->tail;
	if (!a->cap)
		return false;
	uint64_t p = *start & (a->cap - 1);
	if (p + n > a->cap)
		*start += a->cap - p;
	return *start + n - a->head <= a->cap;
}

/* How many more bytes tap_arena_alloc(a, n) would allocate, 0 when n fits. Growing keeps offsets; room for n more
 * covers the padding before a wrap. */
static inline uint64_t tap_arena_growth(const struct tap_arena *a, uint64_t n)
{
	uint64_t start;
	if (n == 0 || tap_arena_fit(a, n, &start))
		return 0;
	return tap_arena_cap_for(a->cap, a->tail - a->head + 2 * n) - a->cap;
}

static inline uint8_t *tap_arena_ptr(const struct tap_arena *a, uint64_t off)
{
	return a->buf + (off & (a->cap - 1));
}

static inline uint64_t tap_arena_used(const struct tap_arena *a)
{
	return a->tail - a->head;
}

#endif
