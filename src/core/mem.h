/* Byte accounting for the tracker's memory budget: an allocation that grows with what clients send adds the
 * size it asked for plus the allocator's per-chunk overhead to a counter, and takes it off when freed. The
 * counter may be NULL (nothing is counted). */
#ifndef AMQPTAP_MEM_H
#define AMQPTAP_MEM_H

#include <stdint.h>
#include <stdlib.h>

/* glibc's malloc header plus its 16-byte rounding, on average. */
#define TAP_MEM_CHUNK_OVERHEAD 16

static inline uint64_t tap_mem_cost(size_t n)
{
	return (uint64_t)n + TAP_MEM_CHUNK_OVERHEAD;
}

static inline void *tap_mem_alloc(uint64_t *mem, size_t n)
{
	void *p = malloc(n);
	if (p && mem)
		*mem += tap_mem_cost(n);
	return p;
}

static inline void *tap_mem_calloc(uint64_t *mem, size_t n)
{
	void *p = calloc(1, n);
	if (p && mem)
		*mem += tap_mem_cost(n);
	return p;
}

/* p of old bytes (NULL: none) made n bytes long, its contents kept (a large block is moved by remapping, not
 * copying); NULL without memory, p then left as it was. */
static inline void *tap_mem_realloc(uint64_t *mem, void *p, size_t old, size_t n)
{
	void *q = realloc(p, n);
	if (q && mem)
		*mem = *mem - (p ? tap_mem_cost(old) : 0) + tap_mem_cost(n);
	return q;
}

/* p of n bytes (NULL: nothing). */
static inline void tap_mem_free(uint64_t *mem, void *p, size_t n)
{
	if (!p)
		return;
	free(p);
	if (mem)
		*mem -= tap_mem_cost(n);
}

#endif
