/* The FIFO byte arena: blobs keep their bytes at their logical offsets across wraps and growth, the head frees
 * space for the tail, growth is predicted before it happens, and every byte is counted. */
#include "arena.h"

#include <check.h>

#include "tap_check.h"
#include <stdlib.h>
#include <string.h>

START_TEST(fifo_wraps_and_grows_keeping_offsets)
{
	uint64_t mem = 0;
	struct tap_arena a;
	tap_arena_init(&a, &mem);
	/* a window of live blobs of varying sizes slides through the arena; each is checked when released */
	enum { N = 5000, WINDOW = 40 };
	static uint64_t off[N];
	static uint8_t len[N];
	for (int i = 0; i < N; i++) {
		len[i] = (uint8_t)(1 + (i * 37) % 200);
		if (i >= WINDOW)
			a.head = off[i - WINDOW + 1];
		uint64_t grow = tap_arena_growth(&a, len[i]);
		uint64_t cap = a.cap;
		off[i] = tap_arena_alloc(&a, len[i]);
		ck_assert_uint_ne(off[i], TAP_ARENA_NONE);
		ck_assert_uint_eq(a.cap - cap, grow);
		uint64_t p = off[i] & (a.cap - 1);
		ck_assert_uint_le(p + len[i], a.cap); /* contiguous */
		memset(tap_arena_ptr(&a, off[i]), (int)(i & 0xff), len[i]);
		for (int k = i - WINDOW + 1; i % 10 == 0 && k <= i; k++) {
			if (k < 0)
				continue;
			uint8_t want[256];
			memset(want, k & 0xff, len[k]);
			if (memcmp(tap_arena_ptr(&a, off[k]), want, len[k]) != 0)
				ck_abort_msg("blob %d lost its bytes after blob %d", k, i);
		}
	}
	ck_assert_uint_le(a.cap, 16384); /* the window never needed more than 40 * 200 * 2 */
	ck_assert_uint_gt(mem, a.cap);
	tap_arena_deinit(&a);
	ck_assert_uint_eq(mem, 0);
}
END_TEST

START_TEST(release_only_when_empty)
{
	uint64_t mem = 0;
	struct tap_arena a;
	tap_arena_init(&a, &mem);
	uint64_t o = tap_arena_alloc(&a, 5000);
	ck_assert_uint_eq(a.cap, 16384);
	tap_arena_release(&a);
	ck_assert_uint_eq(a.cap, 16384); /* still holds a blob */
	a.head = o + 5000;
	tap_arena_release(&a);
	ck_assert_uint_eq(a.cap, 0);
	ck_assert_uint_eq(mem, 0);
	ck_assert_uint_eq(tap_arena_growth(&a, 0), 0);
	ck_assert_uint_eq(tap_arena_growth(&a, 10), TAP_ARENA_MIN_CAP);
}
END_TEST

START_TEST(reserve)
{
	struct tap_arena a;
	tap_arena_init(&a, NULL);
	ck_assert(tap_arena_reserve(&a, 3000));
	ck_assert_uint_eq(a.cap, 4096);
	ck_assert_uint_eq(tap_arena_growth(&a, 4096), 0);
	ck_assert_uint_eq(tap_arena_growth(&a, 4097), 16384 - 4096); /* room for twice the blob: a wrap may pad */
	tap_arena_deinit(&a);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("arena");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, fifo_wraps_and_grows_keeping_offsets);
	tcase_add_test(tc, release_only_when_empty);
	tcase_add_test(tc, reserve);
	suite_add_tcase(s, tc);
	return tap_check_failures(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
