/* Interned string pairs: see intern.h. */
#include "intern.h"

#include "mem.h"

#include <string.h>

/* Unreferenced keys are swept once there are more than this many and they outnumber the live ones, or when none
 * is referenced any more and the arrays have grown past this many. */
#define SWEEP_MIN_DEAD 256u

static void forget_recent(struct tap_intern *in)
{
	for (size_t i = 0; i < TAP_INTERN_RECENT_TAGS; i++)
		in->recent[i] = TAP_INTERN_NONE;
}

void tap_intern_init(struct tap_intern *in, uint64_t *mem)
{
	memset(in, 0, sizeof *in);
	in->mem = mem;
	forget_recent(in);
}

static void free_arrays(struct tap_intern *in)
{
	tap_mem_free(in->mem, in->keys, (size_t)in->cap_keys * sizeof *in->keys);
	tap_mem_free(in->mem, in->free_ids, (size_t)in->cap_keys * sizeof *in->free_ids);
	tap_mem_free(in->mem, in->index, (size_t)in->index_cap * sizeof *in->index);
	in->keys = NULL;
	in->free_ids = NULL;
	in->index = NULL;
	in->cap_keys = in->n_keys = in->n_free = in->index_cap = 0;
}

static size_t key_bytes(const struct tap_intern_key *k)
{
	return (size_t)k->alen + k->blen + 1;
}

static void key_free_data(struct tap_intern *in, struct tap_intern_key *k)
{
	tap_mem_free(in->mem, k->data, key_bytes(k));
	k->data = NULL;
}

void tap_intern_deinit(struct tap_intern *in)
{
	for (uint32_t id = 0; id < in->n_keys; id++)
		key_free_data(in, &in->keys[id]);
	free_arrays(in);
	tap_intern_init(in, in->mem);
}

/* Mixes len bytes into h eight at a time (every publish hashes its exchange, routing key and property JSON: a
 * byte-at-a-time hash showed in profiles). */
static uint64_t hash_bytes(uint64_t h, const uint8_t *p, size_t len)
{
	const uint64_t k = UINT64_C(0x9E3779B97F4A7C15);
	while (len >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		h = (h ^ w) * k;
		h ^= h >> 32;
		p += 8;
		len -= 8;
	}
	if (len) {
		uint64_t w = 0;
		memcpy(&w, p, len);
		h = (h ^ w ^ ((uint64_t)len << 56)) * k;
		h ^= h >> 32;
	}
	return h;
}

static uint32_t key_hash(uint8_t tag, const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
	uint64_t h = hash_bytes(((uint64_t)tag << 32) ^ alen, a, alen);
	h = hash_bytes(h ^ blen, b, blen);
	h = (h ^ (h >> 29)) * UINT64_C(0xBF58476D1CE4E5B9);
	uint32_t r = (uint32_t)(h ^ (h >> 32));
	return r ? r : 1;
}

static bool key_is(const struct tap_intern_key *k, uint8_t tag, const uint8_t *a, size_t alen, const uint8_t *b,
                   size_t blen)
{
	return k->data && k->tag == tag && k->alen == alen && k->blen == blen &&
	       (alen == 0 || memcmp(k->data, a, alen) == 0) && (blen == 0 || memcmp(k->data + alen, b, blen) == 0);
}

static bool key_eq(const struct tap_intern_key *k, uint32_t hash, uint8_t tag, const uint8_t *a, size_t alen,
                   const uint8_t *b, size_t blen)
{
	return k->hash == hash && key_is(k, tag, a, alen, b, blen);
}

static uint32_t find_hashed(const struct tap_intern *in, uint32_t hash, uint8_t tag, const uint8_t *a, size_t alen,
                            const uint8_t *b, size_t blen)
{
	if (!in->index_cap)
		return TAP_INTERN_NONE;
	uint32_t s = hash & (in->index_cap - 1);
	while (in->index[s]) {
		uint32_t id = in->index[s] - 1;
		if (key_eq(&in->keys[id], hash, tag, a, alen, b, blen))
			return id;
		s = (s + 1) & (in->index_cap - 1);
	}
	return TAP_INTERN_NONE;
}

uint32_t tap_intern_find(const struct tap_intern *in, uint8_t tag, const uint8_t *a, size_t alen, const uint8_t *b,
                         size_t blen)
{
	if (alen > UINT16_MAX || blen > UINT16_MAX)
		return TAP_INTERN_NONE;
	return find_hashed(in, key_hash(tag, a, alen, b, blen), tag, a, alen, b, blen);
}

/* Fills idx (cap slots, zeroed, a power of two) from every key that is not FREE and makes it the index. */
static void index_fill(struct tap_intern *in, uint32_t *idx, uint32_t cap)
{
	for (uint32_t id = 0; id < in->n_keys; id++) {
		if (in->keys[id].state == TAP_INTERN_STATE_FREE)
			continue;
		uint32_t s = in->keys[id].hash & (cap - 1);
		while (idx[s])
			s = (s + 1) & (cap - 1);
		idx[s] = id + 1;
	}
	tap_mem_free(in->mem, in->index, (size_t)in->index_cap * sizeof *in->index);
	in->index = idx;
	in->index_cap = cap;
}

static bool rehash(struct tap_intern *in, uint32_t cap)
{
	uint32_t *idx = tap_mem_calloc(in->mem, (size_t)cap * sizeof *idx);
	if (!idx)
		return false;
	index_fill(in, idx, cap);
	return true;
}

static bool resize_keys(struct tap_intern *in, uint32_t cap)
{
	struct tap_intern_key *k = tap_mem_alloc(in->mem, (size_t)cap * sizeof *k);
	uint32_t *f = tap_mem_alloc(in->mem, (size_t)cap * sizeof *f);
	if (!k || !f) {
		tap_mem_free(in->mem, k, (size_t)cap * sizeof *k);
		tap_mem_free(in->mem, f, (size_t)cap * sizeof *f);
		return false;
	}
	if (in->n_keys)
		memcpy(k, in->keys, (size_t)in->n_keys * sizeof *k);
	if (in->n_free)
		memcpy(f, in->free_ids, (size_t)in->n_free * sizeof *f);
	tap_mem_free(in->mem, in->keys, (size_t)in->cap_keys * sizeof *in->keys);
	tap_mem_free(in->mem, in->free_ids, (size_t)in->cap_keys * sizeof *in->free_ids);
	in->keys = k;
	in->free_ids = f;
	in->cap_keys = cap;
	return true;
}

static uint32_t pow2_at_least(uint32_t n, uint32_t min)
{
	uint32_t c = min;
	while (c < n)
		c *= 2;
	return c;
}

/* Every unreferenced key becomes FREE; the arrays shrink to what is left. Ids of live keys do not change. When
 * the new index cannot be had, only the bytes of cached keys are freed and the sweep is tried again later. */
static void sweep(struct tap_intern *in)
{
	tap_intern_drop_cached(in);
	uint32_t live = in->n_indexed - in->n_dead;
	if (live == 0) {
		for (uint32_t id = 0; id < in->n_keys; id++)
			in->keys[id].state = TAP_INTERN_STATE_FREE;
		free_arrays(in);
		in->n_indexed = in->n_dead = 0;
		return;
	}
	uint32_t index_cap = pow2_at_least(4 * live, TAP_INTERN_MIN_INDEX);
	if (index_cap > in->index_cap)
		index_cap = in->index_cap;
	uint32_t *idx = tap_mem_calloc(in->mem, (size_t)index_cap * sizeof *idx);
	if (!idx)
		return;
	uint32_t top = 0; /* one past the highest id still in use */
	for (uint32_t id = 0; id < in->n_keys; id++) {
		if (in->keys[id].state == TAP_INTERN_STATE_DROPPED)
			in->keys[id].state = TAP_INTERN_STATE_FREE;
		if (in->keys[id].state != TAP_INTERN_STATE_FREE)
			top = id + 1;
	}
	in->n_indexed = live;
	in->n_dead = 0;
	in->n_keys = top;
	in->n_free = 0;
	for (uint32_t id = 0; id < top; id++)
		if (in->keys[id].state == TAP_INTERN_STATE_FREE)
			in->free_ids[in->n_free++] = id;
	index_fill(in, idx, index_cap);
	uint32_t keys_cap = pow2_at_least(2 * top, TAP_INTERN_MIN_KEYS);
	if (keys_cap < in->cap_keys) {
		/* if the smaller arrays cannot be had, the larger ones stay */
		(void)resize_keys(in, keys_cap);
	}
}

uint32_t tap_intern_get(struct tap_intern *in, uint8_t tag, const uint8_t *a, size_t alen, const uint8_t *b,
                        size_t blen)
{
	if (alen > UINT16_MAX || blen > UINT16_MAX)
		return TAP_INTERN_NONE; /* never cut: a cut could split a character or an escape */
	uint32_t *recent = tag < TAP_INTERN_RECENT_TAGS ? &in->recent[tag] : NULL;
	if (recent && *recent < in->n_keys) {
		struct tap_intern_key *k = &in->keys[*recent];
		if (k->state == TAP_INTERN_STATE_LIVE && key_is(k, tag, a, alen, b, blen)) {
			k->refs++;
			return *recent;
		}
	}
	uint32_t hash = key_hash(tag, a, alen, b, blen);
	uint32_t id = find_hashed(in, hash, tag, a, alen, b, blen);
	if (recent)
		*recent = id; /* or the new key's, below */
	if (id != TAP_INTERN_NONE) {
		struct tap_intern_key *k = &in->keys[id];
		if (k->state == TAP_INTERN_STATE_CACHED) {
			k->state = TAP_INTERN_STATE_LIVE;
			in->n_dead--;
			in->cached_bytes -= key_bytes(k);
		}
		k->refs++;
		return id;
	}
	if ((uint64_t)(in->n_indexed + 1) * 2 > in->index_cap) {
		uint32_t cap = in->index_cap ? in->index_cap * 2 : TAP_INTERN_MIN_INDEX;
		if (!rehash(in, cap))
			return TAP_INTERN_NONE;
	}
	if (in->n_free == 0 && in->n_keys == in->cap_keys && !resize_keys(in, in->cap_keys ? in->cap_keys * 2 : TAP_INTERN_MIN_KEYS))
		return TAP_INTERN_NONE;
	uint8_t *data = tap_mem_alloc(in->mem, alen + blen + 1);
	if (!data)
		return TAP_INTERN_NONE;
	if (alen)
		memcpy(data, a, alen);
	if (blen)
		memcpy(data + alen, b, blen);
	id = in->n_free ? in->free_ids[--in->n_free] : in->n_keys++;
	in->keys[id] = (struct tap_intern_key){.data = data,
	                                       .hash = hash,
	                                       .refs = 1,
	                                       .alen = (uint16_t)alen,
	                                       .blen = (uint16_t)blen,
	                                       .tag = tag,
	                                       .state = TAP_INTERN_STATE_LIVE};
	uint32_t s = hash & (in->index_cap - 1);
	while (in->index[s])
		s = (s + 1) & (in->index_cap - 1);
	in->index[s] = id + 1;
	in->n_indexed++;
	if (recent)
		*recent = id;
	return id;
}

void tap_intern_put(struct tap_intern *in, uint32_t id, enum tap_intern_keep keep)
{
	if (id == TAP_INTERN_NONE)
		return;
	struct tap_intern_key *k = &in->keys[id];
	if (--k->refs)
		return;
	size_t bytes = key_bytes(k);
	if (keep == TAP_INTERN_KEEP_CACHE && in->cached_bytes + bytes <= TAP_INTERN_CACHE_BYTES) {
		k->state = TAP_INTERN_STATE_CACHED;
		in->cached_bytes += bytes;
	} else {
		key_free_data(in, k);
		k->state = TAP_INTERN_STATE_DROPPED;
	}
	in->n_dead++;
	uint32_t live = in->n_indexed - in->n_dead;
	/* the last reference of a burst also gives the grown arrays back; small tables keep their cache */
	if ((in->n_dead > SWEEP_MIN_DEAD && in->n_dead > live) || (live == 0 && in->cap_keys > SWEEP_MIN_DEAD))
		sweep(in);
}

void tap_intern_drop_cached(struct tap_intern *in)
{
	if (!in->cached_bytes)
		return;
	for (uint32_t id = 0; id < in->n_keys; id++) {
		struct tap_intern_key *k = &in->keys[id];
		if (k->state == TAP_INTERN_STATE_CACHED) {
			key_free_data(in, k);
			k->state = TAP_INTERN_STATE_DROPPED;
		}
	}
	in->cached_bytes = 0;
}
