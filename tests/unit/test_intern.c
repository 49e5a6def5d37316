/* The interning table: equal pairs share an id and its bytes, ids stay put while referenced, unreferenced keys are
 * cached up to TAP_INTERN_CACHE_BYTES or dropped, sweeps give the arrays back, and every byte is counted. */
#include "intern.h"

#include <check.h>

#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint8_t *B(const char *s)
{
	return (const uint8_t *)s;
}

START_TEST(equal_pairs_share_an_id)
{
	uint64_t mem = 0;
	struct tap_intern in;
	tap_intern_init(&in, &mem);
	uint32_t a = tap_intern_get(&in, 0, B("ex"), 2, B("key"), 3);
	uint32_t b = tap_intern_get(&in, 0, B("ex"), 2, B("key"), 3);
	uint32_t c = tap_intern_get(&in, 0, B("exk"), 3, B("ey"), 2); /* same bytes, other split */
	uint32_t d = tap_intern_get(&in, 1, B("ex"), 2, B("key"), 3); /* other tag */
	ck_assert_uint_eq(a, b);
	ck_assert_uint_ne(a, c);
	ck_assert_uint_ne(a, d);
	ck_assert_uint_eq(tap_intern_key(&in, a)->refs, 2);
	ck_assert_uint_eq(tap_intern_key(&in, a)->alen, 2);
	ck_assert_uint_eq(tap_intern_key(&in, a)->blen, 3);
	ck_assert(!memcmp(tap_intern_key(&in, a)->data, "exkey", 5));
	ck_assert_uint_eq(tap_intern_find(&in, 0, B("ex"), 2, B("key"), 3), a);
	ck_assert_uint_eq(tap_intern_find(&in, 0, B("ex"), 2, B("kez"), 3), TAP_INTERN_NONE);
	ck_assert_uint_gt(mem, 0);
	tap_intern_deinit(&in);
	ck_assert_uint_eq(mem, 0);
}
END_TEST

/* The id a tag got last is tried first: only a live key with the same bytes may be taken from it. */
START_TEST(the_last_id_is_only_a_shortcut)
{
	uint64_t mem = 0;
	struct tap_intern in;
	tap_intern_init(&in, &mem);
	uint32_t a = tap_intern_get(&in, 0, B("ex"), 2, B("key"), 3);
	ck_assert_uint_eq(tap_intern_get(&in, 0, B("ex"), 2, B("key"), 3), a);
	ck_assert_uint_eq(tap_intern_key(&in, a)->refs, 2);
	tap_intern_put(&in, a, TAP_INTERN_KEEP_DROP);
	tap_intern_put(&in, a, TAP_INTERN_KEEP_DROP);
	ck_assert_uint_eq(tap_intern_key(&in, a)->state, TAP_INTERN_STATE_DROPPED);
	uint32_t b = tap_intern_get(&in, 0, B("ex"), 2, B("key"), 3); /* the last id's key is gone */
	ck_assert_uint_ne(b, a);
	ck_assert_uint_eq(tap_intern_key(&in, b)->state, TAP_INTERN_STATE_LIVE);
	ck_assert_uint_eq(tap_intern_key(&in, b)->refs, 1);
	ck_assert(!memcmp(tap_intern_key(&in, b)->data, "exkey", 5));
	tap_intern_put(&in, b, TAP_INTERN_KEEP_CACHE);
	ck_assert_uint_eq(tap_intern_key(&in, b)->state, TAP_INTERN_STATE_CACHED);
	ck_assert_uint_gt(in.cached_bytes, 0);
	ck_assert_uint_eq(tap_intern_get(&in, 0, B("ex"), 2, B("key"), 3), b); /* cached: taken back, not just counted */
	ck_assert_uint_eq(tap_intern_key(&in, b)->state, TAP_INTERN_STATE_LIVE);
	ck_assert_uint_eq(tap_intern_key(&in, b)->refs, 1);
	ck_assert_uint_eq(in.cached_bytes, 0);
	uint32_t c = tap_intern_get(&in, 0, B("ex"), 2, B("kez"), 3); /* other bytes, same tag */
	ck_assert_uint_ne(c, b);
	ck_assert_uint_eq(tap_intern_get(&in, 0, B("ex"), 2, B("key"), 3), b);
	ck_assert_uint_eq(tap_intern_key(&in, b)->refs, 2);
	ck_assert_uint_eq(tap_intern_key(&in, c)->refs, 1);
	tap_intern_deinit(&in);
	ck_assert_uint_eq(mem, 0);
}
END_TEST

START_TEST(too_long_is_refused_not_cut)
{
	struct tap_intern in;
	tap_intern_init(&in, NULL);
	uint8_t *big = calloc(70000, 1);
	ck_assert_uint_eq(tap_intern_get(&in, 0, big, 70000, NULL, 0), TAP_INTERN_NONE);
	ck_assert_uint_ne(tap_intern_get(&in, 0, big, 65535, NULL, 0), TAP_INTERN_NONE);
	free(big);
	tap_intern_deinit(&in);
}
END_TEST

START_TEST(cache_then_drop)
{
	uint64_t mem = 0;
	struct tap_intern in;
	tap_intern_init(&in, &mem);
	uint32_t a = tap_intern_get(&in, 0, B("recurring"), 9, NULL, 0);
	tap_intern_put(&in, a, TAP_INTERN_KEEP_CACHE);
	ck_assert_uint_eq(tap_intern_key(&in, a)->state, TAP_INTERN_STATE_CACHED);
	ck_assert_uint_eq(tap_intern_get(&in, 0, B("recurring"), 9, NULL, 0), a); /* revived, same id */
	ck_assert_uint_eq(tap_intern_key(&in, a)->state, TAP_INTERN_STATE_LIVE);
	tap_intern_put(&in, a, TAP_INTERN_KEEP_DROP);
	ck_assert_uint_eq(tap_intern_key(&in, a)->state, TAP_INTERN_STATE_DROPPED);
	ck_assert_ptr_null(tap_intern_key(&in, a)->data);
	ck_assert_uint_eq(tap_intern_find(&in, 0, B("recurring"), 9, NULL, 0), TAP_INTERN_NONE);
	uint32_t b = tap_intern_get(&in, 0, B("recurring"), 9, NULL, 0);
	ck_assert_uint_ne(b, a);

	/* the cache holds TAP_INTERN_CACHE_BYTES; past it keys are dropped */
	uint8_t kb[1000];
	memset(kb, 'k', sizeof kb);
	uint32_t ids[10];
	for (int i = 0; i < 10; i++) {
		kb[0] = (uint8_t)i;
		ids[i] = tap_intern_get(&in, 0, kb, sizeof kb, NULL, 0);
	}
	for (int i = 0; i < 10; i++)
		tap_intern_put(&in, ids[i], TAP_INTERN_KEEP_CACHE);
	ck_assert_uint_le(in.cached_bytes, TAP_INTERN_CACHE_BYTES);
	ck_assert_uint_eq(tap_intern_key(&in, ids[0])->state, TAP_INTERN_STATE_CACHED);
	ck_assert_uint_eq(tap_intern_key(&in, ids[9])->state, TAP_INTERN_STATE_DROPPED);
	tap_intern_drop_cached(&in);
	ck_assert_uint_eq(in.cached_bytes, 0);
	ck_assert_uint_eq(tap_intern_key(&in, ids[0])->state, TAP_INTERN_STATE_DROPPED);
	tap_intern_put(&in, b, TAP_INTERN_KEEP_CACHE);
	tap_intern_deinit(&in);
	ck_assert_uint_eq(mem, 0);
}
END_TEST

START_TEST(sweeps_keep_live_ids_and_give_memory_back)
{
	uint64_t mem = 0;
	struct tap_intern in;
	tap_intern_init(&in, &mem);
	enum { N = 100000 };
	static uint32_t ids[N];
	char k[32];
	uint64_t base = mem;
	for (int i = 0; i < N; i++) {
		int n = snprintf(k, sizeof k, "routing.key.%d", i);
		ids[i] = tap_intern_get(&in, 0, B(k), (size_t)n, NULL, 0);
		ck_assert_uint_ne(ids[i], TAP_INTERN_NONE);
	}
	uint64_t peak = mem;
	/* release all but the first 100; the survivors keep their ids and bytes through the sweeps, and the arrays
	 * shrink to the highest id still used */
	for (int i = N - 1; i >= 100; i--)
		tap_intern_put(&in, ids[i], TAP_INTERN_KEEP_CACHE);
	ck_assert_uint_lt(in.n_dead, in.n_indexed);
	for (int i = 0; i < 100; i++) {
		int n = snprintf(k, sizeof k, "routing.key.%d", i);
		ck_assert_uint_eq(tap_intern_find(&in, 0, B(k), (size_t)n, NULL, 0), ids[i]);
		ck_assert(!memcmp(tap_intern_key(&in, ids[i])->data, k, (size_t)n));
	}
	ck_assert_uint_lt(mem - base, (peak - base) / 16);
	for (int i = 0; i < 100; i++)
		tap_intern_put(&in, ids[i], TAP_INTERN_KEEP_DROP);
	/* fewer dead keys than the sweep threshold remain; the next put beyond it frees the arrays */
	for (int i = 0; i < 300; i++) {
		int n = snprintf(k, sizeof k, "again.%d", i);
		tap_intern_put(&in, tap_intern_get(&in, 0, B(k), (size_t)n, NULL, 0), TAP_INTERN_KEEP_DROP);
	}
	ck_assert_uint_lt(mem - base, 64 * 1024);
	tap_intern_deinit(&in);
	ck_assert_uint_eq(mem, 0);
}
END_TEST

START_TEST(cost_bound_covers_a_get)
{
	uint64_t mem = 0;
	struct tap_intern in;
	tap_intern_init(&in, &mem);
	char k[32];
	for (int i = 0; i < 5000; i++) {
		int n = snprintf(k, sizeof k, "k%d", i);
		uint64_t bound = tap_intern_cost_bound(&in, (size_t)n), before = mem;
		tap_intern_get(&in, 0, B(k), (size_t)n, NULL, 0);
		ck_assert_uint_le(mem - before, bound);
	}
	tap_intern_deinit(&in);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("intern");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, equal_pairs_share_an_id);
	tcase_add_test(tc, the_last_id_is_only_a_shortcut);
	tcase_add_test(tc, too_long_is_refused_not_cut);
	tcase_add_test(tc, cache_then_drop);
	tcase_add_test(tc, sweeps_keep_live_ids_and_give_memory_back);
	tcase_add_test(tc, cost_bound_covers_a_get);
	suite_add_tcase(s, tc);
	return tap_check_failures(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
