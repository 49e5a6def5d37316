/* FIFO byte arena: see arena.h. */
#include "arena.h"

#include "mem.h"

#include <string.h>

void tap_arena_init(struct tap_arena *a, uint64_t *mem)
{
	memset(a, 0, sizeof *a);
	a->mem = mem;
}

void tap_arena_deinit(struct tap_arena *a)
{
	tap_mem_free(a->mem, a->buf, a->cap);
	a->buf = NULL;
	a->cap = 0;
	a->head = a->tail = 0;
}

/* Moves the live bytes into a buffer of cap bytes at the same logical offsets. Growing by a power of two keeps
 * every blob contiguous: it did not straddle a multiple of the old capacity, so not one of the new. */
static bool arena_move(struct tap_arena *a, uint64_t cap)
{
	uint8_t *nb = tap_mem_alloc(a->mem, cap);
	if (!nb)
		return false;
	for (uint64_t off = a->head; off < a->tail;) {
		uint64_t p = off & (a->cap - 1);
		uint64_t run = a->cap - p;
		if (run > a->tail - off)
			run = a->tail - off;
		uint64_t q = off & (cap - 1);
		uint64_t qrun = cap - q;
		if (run > qrun)
			run = qrun;
		memcpy(nb + q, a->buf + p, run);
		off += run;
	}
	tap_mem_free(a->mem, a->buf, a->cap);
	a->buf = nb;
	a->cap = cap;
	return true;
}

bool tap_arena_reserve(struct tap_arena *a, uint64_t n)
{
	uint64_t cap = tap_arena_cap_for(a->cap, n);
	return cap == a->cap || arena_move(a, cap);
}

uint64_t tap_arena_alloc(struct tap_arena *a, uint64_t n)
{
	if (n == 0)
		return a->tail;
	for (;;) {
		uint64_t start;
		if (tap_arena_fit(a, n, &start)) {
			a->tail = start + n;
			return start;
		}
		if (!tap_arena_reserve(a, a->tail - a->head + 2 * n))
			return TAP_ARENA_NONE;
	}
}

void tap_arena_release(struct tap_arena *a)
{
	if (a->head != a->tail)
		return;
	tap_arena_deinit(a);
}
