/* Every status code has a name and a string; unknown values are named so. */
#include "amqptap/status.h"

#include <check.h>

#include "tap_check.h"
#include <stdlib.h>
#include <string.h>

static const int all_codes[] = {
#define TAP_STATUS_VALUE(name, value, text) value,
	TAP_STATUS_LIST(TAP_STATUS_VALUE)
#undef TAP_STATUS_VALUE
};

START_TEST(every_code_has_text)
{
	for (size_t i = 0; i < sizeof all_codes / sizeof all_codes[0]; i++) {
		ck_assert_ptr_nonnull(tap_status_name(all_codes[i]));
		ck_assert_str_ne(tap_strerror(all_codes[i]), "unknown status");
	}
}
END_TEST

START_TEST(codes_are_unique_and_ranged)
{
	size_t n = sizeof all_codes / sizeof all_codes[0];
	for (size_t i = 0; i < n; i++) {
		ck_assert_int_le(all_codes[i], 0);
		ck_assert_int_gt(all_codes[i], -0x0400);
		for (size_t k = i + 1; k < n; k++)
			ck_assert_int_ne(all_codes[i], all_codes[k]);
	}
}
END_TEST

START_TEST(unknown_code)
{
	ck_assert_str_eq(tap_strerror(-0x7777), "unknown status");
	ck_assert_ptr_null(tap_status_name(-0x7777));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("status");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, every_code_has_text);
	tcase_add_test(tc, codes_are_unique_and_ranged);
	tcase_add_test(tc, unknown_code);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
