/* Indexed binary min-heap: see heap.h. */
#include "heap.h"

#include "mem.h"

#include <string.h>

static uint32_t *place_of(const struct tap_heap *h, void *item)
{
	return (uint32_t *)((char *)item + h->idx_off);
}

static void put(struct tap_heap *h, uint32_t i, struct tap_heap_entry e)
{
	h->e[i] = e;
	*place_of(h, e.item) = i + 1;
}

/* Moves the entry at i up past every parent with a greater key. */
static void sift_up(struct tap_heap *h, uint32_t i)
{
	struct tap_heap_entry e = h->e[i];
	while (i > 0) {
		uint32_t parent = (i - 1) / 2;
		if (h->e[parent].key <= e.key)
			break;
		put(h, i, h->e[parent]);
		i = parent;
	}
	put(h, i, e);
}

/* Moves the entry at i down past every child with a smaller key. */
static void sift_down(struct tap_heap *h, uint32_t i)
{
	struct tap_heap_entry e = h->e[i];
	for (;;) {
		uint32_t child = 2 * i + 1;
		if (child >= h->n)
			break;
		if (child + 1 < h->n && h->e[child + 1].key < h->e[child].key)
			child++;
		if (h->e[child].key >= e.key)
			break;
		put(h, i, h->e[child]);
		i = child;
	}
	put(h, i, e);
}

void tap_heap_init(struct tap_heap *h, size_t idx_off, uint64_t *mem)
{
	memset(h, 0, sizeof *h);
	h->idx_off = idx_off;
	h->mem = mem;
}

void tap_heap_deinit(struct tap_heap *h)
{
	for (uint32_t i = 0; i < h->n; i++)
		*place_of(h, h->e[i].item) = 0;
	tap_mem_free(h->mem, h->e, h->cap * sizeof *h->e);
	h->e = NULL;
	h->n = h->cap = 0;
}

/* The least array a heap with members has. */
#define HEAP_MIN_CAP 16u

/* Moves the members to an array of cap entries (cap >= n). */
static bool resize(struct tap_heap *h, uint32_t cap)
{
	struct tap_heap_entry *a = tap_mem_alloc(h->mem, cap * sizeof *a);
	if (!a)
		return false;
	if (h->n)
		memcpy(a, h->e, h->n * sizeof *a);
	tap_mem_free(h->mem, h->e, h->cap * sizeof *h->e);
	h->e = a;
	h->cap = cap;
	return true;
}

bool tap_heap_reserve(struct tap_heap *h, uint32_t n)
{
	if (n <= h->cap)
		return true;
	uint32_t cap = h->cap ? h->cap : HEAP_MIN_CAP;
	while (cap < n)
		cap *= 2;
	return resize(h, cap);
}

void tap_heap_fit(struct tap_heap *h, uint32_t keep)
{
	uint32_t need = keep > h->n ? keep : h->n;
	if (need < HEAP_MIN_CAP)
		need = HEAP_MIN_CAP;
	if (h->cap / 4 > need)
		(void)resize(h, h->cap / 2);
}

bool tap_heap_set(struct tap_heap *h, void *item, int64_t key)
{
	uint32_t place = *place_of(h, item);
	if (place) {
		h->e[place - 1].key = key;
		sift_up(h, place - 1);
		sift_down(h, *place_of(h, item) - 1);
		return true;
	}
	if (!tap_heap_reserve(h, h->n + 1))
		return false;
	put(h, h->n++, (struct tap_heap_entry){.key = key, .item = item});
	sift_up(h, h->n - 1);
	return true;
}

void tap_heap_remove(struct tap_heap *h, void *item)
{
	uint32_t place = *place_of(h, item);
	if (!place)
		return;
	*place_of(h, item) = 0;
	struct tap_heap_entry last = h->e[--h->n];
	if (place - 1 == h->n)
		return;
	put(h, place - 1, last);
	sift_up(h, place - 1);
	sift_down(h, *place_of(h, last.item) - 1);
}
