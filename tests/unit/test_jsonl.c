/* JSON building blocks: commas, escaping of control bytes and invalid UTF-8,
 * timestamps. The output files are tested in test_out. */
#include "amqptap/jsonl.h"

#include <check.h>
#include <inttypes.h>

#include "tap_check.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *render(void (*fill)(struct tap_json *))
{
	static char out[1024];
	struct tap_buf b;
	struct tap_json j;
	tap_buf_init(&b);
	tap_json_init(&j, &b);
	fill(&j);
	ck_assert(!b.oom);
	ck_assert_uint_lt(b.len, sizeof out);
	memcpy(out, b.data, b.len);
	out[b.len] = '\0';
	tap_buf_deinit(&b);
	return out;
}

static void fill_nested(struct tap_json *j)
{
	tap_json_obj_begin(j);
	tap_json_kv_str(j, "type", "publish");
	tap_json_kv_int(j, "n", -3);
	tap_json_key(j, "a");
	tap_json_arr_begin(j);
	tap_json_uint(j, 1);
	tap_json_obj_begin(j);
	tap_json_obj_end(j);
	tap_json_null(j);
	tap_json_arr_end(j);
	tap_json_kv_bool(j, "m", true);
	tap_json_kv_null(j, "z");
	tap_json_obj_end(j);
}

START_TEST(commas_and_nesting)
{
	ck_assert_str_eq(render(fill_nested), "{\"type\":\"publish\",\"n\":-3,\"a\":[1,{},null],\"m\":true,\"z\":null}");
}
END_TEST

static void fill_escapes(struct tap_json *j)
{
	static const char raw[] = "q\"b\\n\n\x01\x7f" "\xc3\xa9" "\xff" "\xe2\x82";
	tap_json_strn(j, raw, sizeof raw - 1);
}

START_TEST(escapes_control_and_invalid_utf8)
{
	/* é stays UTF-8; 0xff and a truncated sequence become \u00XX */
	ck_assert_str_eq(render(fill_escapes), "\"q\\\"b\\\\n\\n\\u0001\\u007f\xc3\xa9\\u00ff\\u00e2\\u0082\"");
}
END_TEST

/* The writers into reserved space (the publish record's) write what the buffered ones do, within their bounds. */
START_TEST(writers_into_reserved_space_match)
{
#define BYTES(lit) {lit, sizeof lit - 1}
	static const struct {
		const char *s;
		size_t len;
	} in[] = {
	    BYTES(""),
	    BYTES("amq.topic"),
	    BYTES("tab\tcr\r\"\\"),
	    BYTES("\xf0\x9f\x98\x80 \xed\xa0\x80 \xc0\x80"), /* 4-byte UTF-8 kept; a surrogate and an overlong escaped */
	    BYTES("\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01"), /* the worst case: 6 bytes each */
	};
#undef BYTES
	for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
		struct tap_buf b;
		tap_buf_init(&b);
		tap_json_escape(&b, in[i].s, in[i].len);
		char at[TAP_JSON_ESCAPED_MAX(10) + 1];
		size_t n = (size_t)(tap_json_escape_at(at, in[i].s, in[i].len) - at);
		ck_assert_uint_le(n, TAP_JSON_ESCAPED_MAX(in[i].len));
		ck_assert_uint_eq(n, b.len);
		ck_assert(!memcmp(at, b.data, n));
		if (i == 4)
			ck_assert_uint_eq(n, TAP_JSON_ESCAPED_MAX(in[i].len));
		if (i == 3)
			ck_assert(!memcmp(at, "\"\xf0\x9f\x98\x80 \\u00ed\\u00a0\\u0080 \\u00c0\\u0080\"", n));
		tap_buf_deinit(&b);
	}
	char num[TAP_JSON_NUMBER_MAX];
	ck_assert_uint_eq((size_t)(tap_json_int_at(num, INT64_MIN) - num), TAP_JSON_NUMBER_MAX);
	ck_assert(!memcmp(num, "-9223372036854775808", TAP_JSON_NUMBER_MAX));
	ck_assert_uint_eq((size_t)(tap_json_uint_at(num, UINT64_MAX) - num), TAP_JSON_NUMBER_MAX);
	ck_assert(!memcmp(num, "18446744073709551615", TAP_JSON_NUMBER_MAX));
}
END_TEST

/* Every length of number, at both ends of it (9, 10, 99, 100, ...) and between, the same as printf's. */
START_TEST(numbers_of_every_length_as_printf)
{
	char got[TAP_JSON_NUMBER_MAX + 1], want[32];
	for (uint64_t p = 1, i = 0; i < 20; i++, p *= 10) {
		uint64_t cases[] = {p - 1, p, p + 1, p * 5 + 7, p == 1 ? 3 : p / 2 * 3 - 1};
		for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
			uint64_t v = cases[k];
			*tap_json_uint_at(got, v) = '\0';
			snprintf(want, sizeof want, "%" PRIu64, v);
			ck_assert_str_eq(got, want);
			int64_t sv = -(int64_t)(v >> 1);
			*tap_json_int_at(got, sv) = '\0';
			snprintf(want, sizeof want, "%" PRId64, sv);
			ck_assert_str_eq(got, want);
		}
	}
}
END_TEST

static void fill_numbers(struct tap_json *j)
{
	tap_json_arr_begin(j);
	tap_json_int(j, 0);
	tap_json_int(j, INT64_MIN);
	tap_json_int(j, INT64_MAX);
	tap_json_uint(j, UINT64_MAX);
	tap_json_uint(j, 10);
	tap_json_arr_end(j);
}

START_TEST(integers_at_the_limits)
{
	ck_assert_str_eq(render(fill_numbers),
			 "[0,-9223372036854775808,9223372036854775807,18446744073709551615,10]");
}
END_TEST

static void fill_plain_and_empty(struct tap_json *j)
{
	tap_json_arr_begin(j);
	tap_json_strn(j, "", 0);
	tap_json_str(j, "amq.topic");
	tap_json_strn(j, "a\"b", 3);
	tap_json_arr_end(j);
}

START_TEST(plain_strings_in_one_copy)
{
	ck_assert_str_eq(render(fill_plain_and_empty), "[\"\",\"amq.topic\",\"a\\\"b\"]");
}
END_TEST

START_TEST(timestamps)
{
	char ts[32];
	tap_format_ts(ts, INT64_C(1795947302000412));
	ck_assert_str_eq(ts, "2026-11-29T10:15:02.000412Z");
	tap_format_ts(ts, 0);
	ck_assert_str_eq(ts, "1970-01-01T00:00:00.000000Z");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("jsonl");
	TCase *tc = tcase_create("json");
	tcase_add_test(tc, commas_and_nesting);
	tcase_add_test(tc, escapes_control_and_invalid_utf8);
	tcase_add_test(tc, writers_into_reserved_space_match);
	tcase_add_test(tc, integers_at_the_limits);
	tcase_add_test(tc, numbers_of_every_length_as_printf);
	tcase_add_test(tc, plain_strings_in_one_copy);
	tcase_add_test(tc, timestamps);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
