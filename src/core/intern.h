/* A refcounted table of interned byte-string pairs (a, b) with a small tag, so that the strings many outstanding
 * publishes share (exchange and routing key, reply texts, rendered properties) are stored once per connection.
 * Ids are stable while referenced. A key whose last reference goes is either cached (a recurring routing key
 * then costs no allocation) or dropped at once; a sweep, amortized O(1), reclaims unreferenced ids and shrinks
 * the arrays. Every allocation is counted in *mem.
 *
 *   state:   FREE --get--> LIVE --put (cache room)--> CACHED --get--> LIVE
 *                          LIVE --put (no room, or DROP)--> DROPPED
 *            CACHED, DROPPED --sweep--> FREE;   CACHED --tap_intern_drop_cached--> DROPPED
 */
#ifndef AMQPTAP_INTERN_H
#define AMQPTAP_INTERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mem.h"

#define TAP_INTERN_NONE UINT32_MAX
/* Tags (0 up to this) whose last key is tried before the index: a publisher sends the same exchange, routing key
 * and properties again and again, and comparing them costs less than hashing them. */
#define TAP_INTERN_RECENT_TAGS 4u
/* Bytes of unreferenced keys a table keeps for reuse. */
#define TAP_INTERN_CACHE_BYTES 4096u

enum tap_intern_state {
	TAP_INTERN_STATE_FREE = 0,
	TAP_INTERN_STATE_LIVE,
	TAP_INTERN_STATE_CACHED,
	TAP_INTERN_STATE_DROPPED,
};

struct tap_intern_key {
	uint8_t *data; /* a bytes then b bytes; NULL when FREE or DROPPED */
	uint32_t hash;
	uint32_t refs;
	uint16_t alen, blen;
	uint8_t tag;
	uint8_t state; /* enum tap_intern_state */
};

struct tap_intern {
	struct tap_intern_key *keys;
	uint32_t n_keys, cap_keys; /* ids used so far (any state) */
	uint32_t *free_ids;
	uint32_t n_free;
	uint32_t *index; /* open addressing, id + 1, 0 empty */
	uint32_t index_cap;
	uint32_t n_indexed; /* LIVE, CACHED and DROPPED keys */
	uint32_t n_dead;    /* CACHED and DROPPED keys */
	uint64_t cached_bytes;
	uint64_t *mem; /* budget counter, or NULL */
	uint32_t recent[TAP_INTERN_RECENT_TAGS]; /* per tag: the id got last, checked first (a stale id never matches) */
};

/* What tap_intern_put does with a key nobody references any more. */
enum tap_intern_keep {
	TAP_INTERN_KEEP_CACHE, /* cache it while the cache has room */
	TAP_INTERN_KEEP_DROP,  /* free its bytes now (memory is short) */
};

void tap_intern_init(struct tap_intern *in, uint64_t *mem);
void tap_intern_deinit(struct tap_intern *in);
/* The id of (tag, a, b) without taking a reference, or TAP_INTERN_NONE. */
uint32_t tap_intern_find(const struct tap_intern *in, uint8_t tag, const uint8_t *a, size_t alen, const uint8_t *b,
                         size_t blen);
/* The id with one more reference; TAP_INTERN_NONE when out of memory or a string is longer than 65535 bytes. */
uint32_t tap_intern_get(struct tap_intern *in, uint8_t tag, const uint8_t *a, size_t alen, const uint8_t *b,
                        size_t blen);
/* Drops one reference (TAP_INTERN_NONE: nothing). */
void tap_intern_put(struct tap_intern *in, uint32_t id, enum tap_intern_keep keep);
/* Frees the bytes of every cached key. */
void tap_intern_drop_cached(struct tap_intern *in);

/* Small: every connection has a table, and most intern a few keys (an exchange and routing key or two). */
#define TAP_INTERN_MIN_KEYS 4u
#define TAP_INTERN_MIN_INDEX 8u

/* At most how many bytes tap_intern_get of a new key of len bytes would allocate (no lookup). */
static inline uint64_t tap_intern_cost_bound(const struct tap_intern *in, size_t len)
{
	uint64_t cost = tap_mem_cost(len + 1);
	if (in->n_free == 0 && in->n_keys == in->cap_keys) {
		uint64_t cap = in->cap_keys ? (uint64_t)in->cap_keys * 2 : TAP_INTERN_MIN_KEYS;
		cost += tap_mem_cost(cap * sizeof *in->keys) + tap_mem_cost(cap * sizeof *in->free_ids);
	}
	if ((uint64_t)(in->n_indexed + 1) * 2 > in->index_cap) {
		uint64_t cap = in->index_cap ? (uint64_t)in->index_cap * 2 : TAP_INTERN_MIN_INDEX;
		cost += tap_mem_cost(cap * sizeof *in->index);
	}
	return cost;
}

static inline const struct tap_intern_key *tap_intern_key(const struct tap_intern *in, uint32_t id)
{
	return &in->keys[id];
}

#endif
