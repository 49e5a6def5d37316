/* The log-linear histogram: every value lands in a bucket whose midpoint is within 1/16 of it, quantiles and the
 * exact max, and the cumulative walk a Prometheus histogram is built from. */
#include "amqptap/hist.h"

#include <check.h>

#include "tap_check.h"
#include <stdlib.h>

START_TEST(empty)
{
	struct tap_hist h = {0};
	ck_assert_uint_eq(tap_hist_quantile(&h, 0.5), 0);
	struct tap_hist_it it = {0};
	ck_assert(!tap_hist_next(&h, &it));
}
END_TEST

START_TEST(quantiles_within_a_sixteenth)
{
	static struct tap_hist h;
	h = (struct tap_hist){0};
	for (int64_t v = 1; v <= 100000; v++)
		tap_hist_add(&h, v);
	ck_assert_uint_eq(h.n, 100000);
	ck_assert_uint_eq(h.max, 100000);
	ck_assert_uint_eq(h.sum, 100000ull * 100001ull / 2);
	const double qs[] = {0.01, 0.1, 0.5, 0.9, 0.99, 0.999};
	for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
		double want = qs[i] * 100000;
		double got = (double)tap_hist_quantile(&h, qs[i]);
		ck_assert_msg(got >= want - want / 16 - 1 && got <= want + want / 16 + 1, "q%.3f: %.0f for %.0f", qs[i],
		              got, want);
	}
	ck_assert_uint_eq(tap_hist_quantile(&h, 1.0), 100000);
}
END_TEST

START_TEST(negative_counts_as_zero_and_top_bucket_keeps_max)
{
	struct tap_hist h = {0};
	tap_hist_add(&h, -5);
	tap_hist_add(&h, INT64_C(1) << 50);
	ck_assert_uint_eq(h.bucket[0], 1);
	ck_assert_uint_eq(h.bucket[TAP_HIST_BUCKETS - 1], 1);
	ck_assert_uint_eq(tap_hist_quantile(&h, 0.99), UINT64_C(1) << 50);
}
END_TEST

START_TEST(bucket_bounds_are_contiguous)
{
	/* bucket i holds (max(i-1), max(i)]; the small values have a bucket each */
	for (unsigned i = 0; i < TAP_HIST_SUB; i++)
		ck_assert_uint_eq(tap_hist_bucket_max(i), i);
	for (unsigned i = 1; i + 1 < TAP_HIST_BUCKETS; i++) {
		uint64_t lo = tap_hist_bucket_max(i - 1) + 1, hi = tap_hist_bucket_max(i);
		ck_assert_uint_le(lo, hi);
		struct tap_hist h = {0};
		tap_hist_add(&h, (int64_t)lo);
		tap_hist_add(&h, (int64_t)hi);
		ck_assert_uint_eq(h.bucket[i], 2);
	}
	ck_assert_uint_eq(tap_hist_bucket_max(TAP_HIST_BUCKETS - 1), UINT64_MAX);
}
END_TEST

START_TEST(cumulative_walk)
{
	struct tap_hist h = {0};
	const int64_t vals[] = {3, 3, 100, 1000, 1000, 1000, 70000};
	for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
		tap_hist_add(&h, vals[i]);
	struct tap_hist_it it = {0};
	uint64_t prev_le = 0, steps = 0;
	while (tap_hist_next(&h, &it)) {
		ck_assert(steps == 0 || it.le > prev_le);
		/* every value <= le is counted, none above it */
		uint64_t want = 0;
		for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
			want += (uint64_t)vals[i] <= it.le;
		ck_assert_uint_eq(it.cumulative, want);
		prev_le = it.le;
		steps++;
	}
	ck_assert_uint_eq(steps, 4);
	ck_assert_uint_eq(it.cumulative, h.n);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("hist");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, empty);
	tcase_add_test(tc, quantiles_within_a_sixteenth);
	tcase_add_test(tc, negative_counts_as_zero_and_top_bucket_keeps_max);
	tcase_add_test(tc, bucket_bounds_are_contiguous);
	tcase_add_test(tc, cumulative_walk);
	suite_add_tcase(s, tc);
	return tap_check_failures(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
