/* An indexed binary min-heap on int64_t keys, as libevent keeps its timers: each member stores its place in the
 * heap (place + 1; 0: not in it) in a uint32_t of its own struct, at the offset given to tap_heap_init, so that it
 * can be re-keyed or removed in O(log n). The keys live in the heap beside their members: sifting reads no member.
 * The array is counted in the caller's budget counter (mem.h). */
#ifndef AMQPTAP_HEAP_H
#define AMQPTAP_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tap_heap_entry {
	int64_t key;
	void *item;
};

struct tap_heap {
	struct tap_heap_entry *e;
	uint32_t n, cap;
	size_t idx_off; /* where a member keeps its place + 1 */
	uint64_t *mem;  /* budget counter, or NULL */
};

/* idx_off: offsetof(member type, its uint32_t place field), which must start at 0; mem may be NULL. */
void tap_heap_init(struct tap_heap *h, size_t idx_off, uint64_t *mem);
void tap_heap_deinit(struct tap_heap *h);
/* Room for n members without allocating again; false when out of memory. */
bool tap_heap_reserve(struct tap_heap *h, uint32_t n);
/* Gives memory back after a peak: once the array has room for more than four times max(keep, members in, 16)
 * it is halved, keeping room for keep members (what the caller reserved). Halving at a quarter full, doubling when
 * full: a heap that shrinks and grows around one size does not reallocate every time. Out of memory: no change. */
void tap_heap_fit(struct tap_heap *h, uint32_t keep);
/* Puts item in at key, or moves it to key when it is in already; false when out of memory (then it is not in):
 * never once tap_heap_reserve made room for it. */
bool tap_heap_set(struct tap_heap *h, void *item, int64_t key);
/* Takes item out; nothing when it is not in. */
void tap_heap_remove(struct tap_heap *h, void *item);

static inline bool tap_heap_has(const struct tap_heap *h, const void *item)
{
	return *(const uint32_t *)((const char *)item + h->idx_off) != 0;
}

/* The member with the least key, NULL when empty. */
static inline void *tap_heap_top(const struct tap_heap *h)
{
	return h->n ? h->e[0].item : NULL;
}

/* The least key, INT64_MAX when empty. */
static inline int64_t tap_heap_top_key(const struct tap_heap *h)
{
	return h->n ? h->e[0].key : INT64_MAX;
}

#endif
