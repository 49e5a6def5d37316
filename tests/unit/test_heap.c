/* The indexed min-heap: against a plain array that is searched every time, through random insertions, re-keyings
 * and removals; every member's place field is where the heap holds it, and every byte is counted and given back. */
#include "heap.h"
#include "mem.h"

#include <check.h>

#include "tap_check.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

struct member {
	uint32_t place;
	int64_t key; /* the reference: its key while it is in */
	bool in;
};

/* The least key of the members that are in, INT64_MAX when none is. */
static int64_t least(const struct member *m, size_t n)
{
	int64_t k = INT64_MAX;
	for (size_t i = 0; i < n; i++)
		if (m[i].in && m[i].key < k)
			k = m[i].key;
	return k;
}

static void check_places(const struct tap_heap *h, const struct member *m, size_t n)
{
	uint32_t in = 0;
	for (size_t i = 0; i < n; i++) {
		ck_assert_int_eq(tap_heap_has(h, &m[i]), m[i].in);
		if (!m[i].in)
			continue;
		in++;
		ck_assert_ptr_eq(h->e[m[i].place - 1].item, &m[i]);
		ck_assert_int_eq(h->e[m[i].place - 1].key, m[i].key);
	}
	ck_assert_uint_eq(h->n, in);
	for (uint32_t i = 1; i < h->n; i++) /* the heap order */
		ck_assert_int_le(h->e[(i - 1) / 2].key, h->e[i].key);
}

START_TEST(random_operations_match_a_searched_array)
{
	enum { N = 300, OPS = 20000 };
	static struct member m[N];
	uint64_t mem = 0;
	struct tap_heap h;
	tap_heap_init(&h, offsetof(struct member, place), &mem);
	srand(7);
	for (int op = 0; op < OPS; op++) {
		struct member *x = &m[rand() % N];
		int64_t key = rand() % 1000; /* many equal keys */
		switch (rand() % 4) {
		case 0:
		case 1: /* in, or re-keyed up or down */
			ck_assert(tap_heap_set(&h, x, key));
			x->in = true;
			x->key = key;
			break;
		case 2:
			tap_heap_remove(&h, x);
			x->in = false;
			break;
		default: /* the least one out, as a timer loop takes it */
			if (h.n) {
				struct member *top = tap_heap_top(&h);
				ck_assert_int_eq(top->key, least(m, N));
				tap_heap_remove(&h, top);
				top->in = false;
			}
		}
		ck_assert_int_eq(tap_heap_top_key(&h), least(m, N));
		if (op % 97 == 0)
			check_places(&h, m, N);
	}
	check_places(&h, m, N);
	ck_assert_uint_gt(mem, 0);
	tap_heap_deinit(&h);
	ck_assert_uint_eq(mem, 0);
	for (size_t i = 0; i < N; i++)
		ck_assert(!tap_heap_has(&h, &m[i])); /* deinit leaves no member thinking it is in */
	ck_assert_ptr_null(tap_heap_top(&h));
	ck_assert_int_eq(tap_heap_top_key(&h), INT64_MAX);
}
END_TEST

START_TEST(reserved_room_is_not_allocated_again)
{
	static struct member m[100];
	uint64_t mem = 0;
	struct tap_heap h;
	tap_heap_init(&h, offsetof(struct member, place), &mem);
	ck_assert(tap_heap_reserve(&h, 100));
	const struct tap_heap_entry *e = h.e;
	uint64_t counted = mem;
	for (int i = 99; i >= 0; i--)
		ck_assert(tap_heap_set(&h, &m[i], i));
	ck_assert_ptr_eq(h.e, e);
	ck_assert_uint_eq(mem, counted);
	for (int i = 0; i < 100; i++) { /* ascending, whatever the order they went in */
		struct member *top = tap_heap_top(&h);
		ck_assert_ptr_eq(top, &m[i]);
		tap_heap_remove(&h, top);
	}
	tap_heap_remove(&h, &m[0]); /* not in: nothing */
	ck_assert_uint_eq(h.n, 0);
	tap_heap_deinit(&h);
	ck_assert_uint_eq(mem, 0);
}
END_TEST

/* After a peak the array shrinks, a halving at a time, as members go; never below the room the caller keeps (what it
 * reserved), nor below what the members in need; and the heap stays a heap. */
START_TEST(the_array_shrinks_after_a_peak_down_to_what_is_kept)
{
	enum { N = 1000 };
	static struct member m[N];
	uint64_t mem = 0;
	struct tap_heap h;
	tap_heap_init(&h, offsetof(struct member, place), &mem);
	for (int i = 0; i < N; i++) {
		ck_assert(tap_heap_set(&h, &m[i], (i * 7919) % N));
		m[i].in = true;
		m[i].key = (i * 7919) % N;
	}
	ck_assert_uint_eq(h.cap, 1024);
	tap_heap_fit(&h, 0); /* full: nothing to give back */
	ck_assert_uint_eq(h.cap, 1024);
	for (int i = 0; i < N - 10; i++) { /* keeping room for 300 of them, as a caller that reserved it */
		tap_heap_remove(&h, &m[i]);
		m[i].in = false;
		tap_heap_fit(&h, 300);
		ck_assert_msg(h.cap >= 300 && h.cap >= h.n, "cap %u with %u in", h.cap, h.n);
	}
	ck_assert_uint_eq(h.cap, 1024); /* 1024 / 4 < 300: halving would leave less than four times the kept room */
	tap_heap_fit(&h, 200);
	ck_assert_uint_eq(h.cap, 512);
	tap_heap_fit(&h, 200); /* 512 / 4 < 200 */
	ck_assert_uint_eq(h.cap, 512);
	for (int i = 0; i < 6; i++)
		tap_heap_fit(&h, 0);
	ck_assert_uint_eq(h.cap, 64); /* 10 in: 16 is the least need; 64 / 4 is not more than 16 */
	ck_assert_uint_eq(mem, tap_mem_cost(64 * sizeof(struct tap_heap_entry)));
	check_places(&h, m, N);
	ck_assert_int_eq(tap_heap_top_key(&h), least(m, N));
	for (int i = 0; i < N - 10; i++) /* and it grows again */
		ck_assert(tap_heap_set(&h, &m[i], i));
	ck_assert_uint_eq(h.cap, 1024);
	tap_heap_deinit(&h);
	ck_assert_uint_eq(mem, 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("heap");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, random_operations_match_a_searched_array);
	tcase_add_test(tc, reserved_room_is_not_allocated_again);
	tcase_add_test(tc, the_array_shrinks_after_a_peak_down_to_what_is_kept);
	suite_add_tcase(s, tc);
	return tap_check_failures(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
