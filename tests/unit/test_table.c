/* Field tables: every RabbitMQ type letter, exact JSON, iterator values, truncation at every offset,
 * depth limit (including 100,000 levels, which must not recurse), unknown letters. */
#include "amqptap/status.h"
#include "amqptap/table.h"

#include <check.h>

#include "tap_check.h"
#include "tap_build.h"
#include <stdlib.h>
#include <string.h>

/* Field boundaries of the table built by build_all, for the truncation test. */
static size_t bounds[32];
static size_t nbounds;

static void mark(struct tap_bytes *w)
{
	bounds[nbounds++] = w->n;
}

static void build_all(struct tap_bytes *w)
{
	static const uint8_t f32_1_5[] = {0x3f, 0xc0, 0, 0};
	static const uint8_t f64_m2_25[] = {0xc0, 0x02, 0, 0, 0, 0, 0, 0};
	w->n = 0;
	nbounds = 0;
	mark(w);
	tap_build_key(w, "t", 't');
	tap_build_u8(w, 1);
	mark(w);
	tap_build_key(w, "b", 'b');
	tap_build_u8(w, 0xfe);
	mark(w);
	tap_build_key(w, "B", 'B');
	tap_build_u8(w, 0xfe);
	mark(w);
	tap_build_key(w, "s", 's');
	tap_build_raw(w, "\xff\xfe", 2);
	mark(w);
	tap_build_key(w, "u", 'u');
	tap_build_raw(w, "\xff\xfe", 2);
	mark(w);
	tap_build_key(w, "I", 'I');
	tap_build_u32(w, 0xfffffffe);
	mark(w);
	tap_build_key(w, "i", 'i');
	tap_build_u32(w, 0xfffffffe);
	mark(w);
	tap_build_key(w, "l", 'l');
	tap_build_u32(w, 0xffffffff);
	tap_build_u32(w, 0xfffffffe);
	mark(w);
	tap_build_key(w, "L", 'L');
	tap_build_u32(w, 0);
	tap_build_u32(w, 7);
	mark(w);
	tap_build_key(w, "f", 'f');
	tap_build_raw(w, f32_1_5, 4);
	mark(w);
	tap_build_key(w, "d", 'd');
	tap_build_raw(w, f64_m2_25, 8);
	mark(w);
	tap_build_key(w, "D", 'D');
	tap_build_u8(w, 2);
	tap_build_u32(w, 0xfffffff6);
	mark(w);
	tap_build_key(w, "S", 'S');
	tap_build_u32(w, 5);
	tap_build_raw(w, "a\"\n\xff", 4);
	tap_build_u8(w, 'z');
	mark(w);
	tap_build_key(w, "x", 'x');
	tap_build_u32(w, 2);
	tap_build_raw(w, "\x00\xab", 2);
	mark(w);
	tap_build_key(w, "T", 'T');
	tap_build_u32(w, 0);
	tap_build_u32(w, 1700000000);
	mark(w);
	tap_build_key(w, "V", 'V');
	mark(w);
	tap_build_key(w, "A", 'A');
	tap_build_u32(w, 11);
	tap_build_u8(w, 'I');
	tap_build_u32(w, 1);
	tap_build_u8(w, 'S');
	tap_build_u32(w, 1);
	tap_build_u8(w, 'q');
	mark(w);
	tap_build_key(w, "F", 'F');
	tap_build_u32(w, 3);
	tap_build_key(w, "k", 'V');
	mark(w);
}

static const char all_json[] =
	"{\"t\":{\"t\":true},\"b\":{\"b\":-2},\"B\":{\"B\":254},\"s\":{\"s\":-2},\"u\":{\"u\":65534},"
	"\"I\":{\"I\":-2},\"i\":{\"i\":4294967294},\"l\":{\"l\":-2},\"L\":{\"L\":7},\"f\":{\"f\":1.5},"
	"\"d\":{\"d\":-2.25},\"D\":{\"D\":{\"scale\":2,\"value\":-10}},\"S\":{\"S\":\"a\\\"\\n\\u00ffz\"},"
	"\"x\":{\"x\":\"00ab\"},\"T\":{\"T\":1700000000},\"V\":{\"V\":null},\"A\":{\"A\":[{\"I\":1},{\"S\":\"q\"}]},"
	"\"F\":{\"F\":{\"k\":{\"V\":null}}}}";

static char *to_json(const uint8_t *p, size_t len, int *rc)
{
	struct tap_buf b;
	struct tap_json j;
	tap_buf_init(&b);
	tap_json_init(&j, &b);
	*rc = tap_table_to_json(&j, p, len);
	tap_buf_putc(&b, 0);
	return b.data;
}

START_TEST(every_type_letter)
{
	struct tap_bytes w = {0};
	build_all(&w);
	ck_assert_int_eq(tap_table_validate(w.d, w.n), 0);
	int rc;
	char *s = to_json(w.d, w.n, &rc);
	ck_assert_int_eq(rc, 0);
	ck_assert_str_eq(s, all_json);
	free(s);
	tap_build_free(&w);
}
END_TEST

START_TEST(iterator_values)
{
	struct tap_bytes w = {0};
	build_all(&w);
	struct tap_field f;
	ck_assert(tap_table_find(w.d, w.n, "s", &f));
	ck_assert_int_eq(f.type, 's');
	ck_assert_int_eq(f.i, -2);
	ck_assert(tap_table_find(w.d, w.n, "i", &f));
	ck_assert_uint_eq(f.u, 4294967294u);
	ck_assert(tap_table_find(w.d, w.n, "l", &f));
	ck_assert_int_eq(f.i, -2);
	ck_assert(tap_table_find(w.d, w.n, "D", &f));
	ck_assert_int_eq(f.scale, 2);
	ck_assert_int_eq(f.i, -10);
	ck_assert(tap_table_find(w.d, w.n, "S", &f));
	ck_assert_uint_eq(f.len, 5);
	ck_assert(tap_table_find(w.d, w.n, "A", &f));
	struct tap_table_it it;
	tap_array_it_init(&it, f.ptr, f.len);
	ck_assert_int_eq(tap_table_next(&it, &f), 1);
	ck_assert_int_eq(f.type, 'I');
	ck_assert_ptr_null(f.name);
	ck_assert_int_eq(tap_table_next(&it, &f), 1);
	ck_assert_int_eq(f.type, 'S');
	ck_assert_int_eq(tap_table_next(&it, &f), 0);
	ck_assert(!tap_table_find(w.d, w.n, "missing", &f));
	ck_assert(!tap_table_find(w.d, w.n, "", &f));
	tap_build_free(&w);
}
END_TEST

/* A miss leaves nothing behind: not the last field walked (py-amqp's client properties end in a capabilities
 * table, which was read as "version"), and not a field before a malformed one. */
START_TEST(find_miss_leaves_nothing)
{
	struct tap_bytes w = {0};
	tap_build_key(&w, "product", 'S');
	tap_build_longstr(&w, "py-amqp", 7);
	tap_build_key(&w, "capabilities", 'F');
	tap_build_longstr(&w, "\x16" "consumer_cancel_notify" "t\x01", 25);
	struct tap_field f;
	memset(&f, 0x5a, sizeof f);
	ck_assert(!tap_table_find(w.d, w.n, "version", &f));
	ck_assert_ptr_null(f.ptr);
	ck_assert_ptr_null(f.name);
	ck_assert_uint_eq(f.len, 0);
	ck_assert_int_eq(f.type, 0);
	ck_assert(tap_table_find(w.d, w.n, "product", &f));
	ck_assert_int_eq(f.type, 'S');
	ck_assert_uint_eq(f.len, 7);
	tap_build_key(&w, "broken", 'S');
	tap_build_u32(&w, 99);
	memset(&f, 0x5a, sizeof f);
	ck_assert(!tap_table_find(w.d, w.n, "after", &f));
	ck_assert_ptr_null(f.ptr);
	ck_assert_int_eq(f.type, 0);
	tap_build_free(&w);
}
END_TEST

/* A cut at a field boundary is a shorter valid table; a cut anywhere else is TAP_E_TRUNCATED. */
START_TEST(truncated_everywhere)
{
	struct tap_bytes w = {0};
	build_all(&w);
	for (size_t cut = 0; cut < w.n; cut++) {
		bool boundary = false;
		for (size_t k = 0; k < nbounds; k++)
			boundary |= bounds[k] == cut;
		int rc = tap_table_validate(w.d, cut);
		ck_assert_msg(boundary ? rc == 0 : rc == TAP_E_TRUNCATED, "cut %zu rc %d", cut, rc);
		char *s = to_json(w.d, cut, &rc);
		if (!boundary)
			ck_assert_str_eq(s, "null");
		free(s);
	}
	tap_build_free(&w);
}
END_TEST

START_TEST(unknown_letters)
{
	/* 0-9-1 spec letters RabbitMQ does not use, and garbage */
	const char *bad = "UcZ?\x00";
	for (const char *c = bad; c < bad + 5; c++) {
		uint8_t t[] = {1, 'k', (uint8_t)*c, 0, 0, 0, 0, 0, 0, 0, 0};
		ck_assert_int_eq(tap_table_validate(t, sizeof t), TAP_E_BAD_FIELD_TYPE);
	}
	uint8_t arr[] = {'I', 0, 0, 0, 1, 'Q'};
	ck_assert_int_eq(tap_array_validate(arr, sizeof arr), TAP_E_BAD_FIELD_TYPE);
	/* a nested length running past its parent */
	uint8_t over[] = {1, 'k', 'F', 0, 0, 0, 9, 1, 'j', 'V'};
	ck_assert_int_eq(tap_table_validate(over, sizeof over), TAP_E_TRUNCATED);
	uint8_t hugelen[] = {1, 'k', 'S', 0xff, 0xff, 0xff, 0xff, 'a'};
	ck_assert_int_eq(tap_table_validate(hugelen, sizeof hugelen), TAP_E_TRUNCATED);
	ck_assert_int_eq(tap_table_validate(NULL, 0), 0);
}
END_TEST

/* A table whose field "k" holds a container nested depth levels deep in all (the outer table is level 1),
 * the innermost empty; kind 'F' nests tables {"k":{"F":...}}, 'A' nests arrays [[...]]. */
static uint8_t *nest(size_t depth, char kind, size_t *len)
{
	size_t per = kind == 'F' ? 7 : 5; /* key (1+1) + letter + u32 ; array element: letter + u32 */
	size_t total = depth * per;
	uint8_t *p = malloc(total);
	ck_assert_ptr_nonnull(p);
	size_t off = 0;
	for (size_t lvl = 1; lvl < depth; lvl++) {
		if (kind == 'F' || lvl == 1) {
			p[off++] = 1;
			p[off++] = 'k';
		}
		p[off++] = (uint8_t)kind;
		off += 4;
	}
	/* fill lengths back to front: each container holds everything after its length field */
	size_t used = off;
	size_t pos = 0;
	for (size_t lvl = 1; lvl < depth; lvl++) {
		if (kind == 'F' || lvl == 1)
			pos += 2;
		pos++;
		uint32_t n = (uint32_t)(used - pos - 4);
		p[pos] = (uint8_t)(n >> 24);
		p[pos + 1] = (uint8_t)(n >> 16);
		p[pos + 2] = (uint8_t)(n >> 8);
		p[pos + 3] = (uint8_t)n;
		pos += 4;
	}
	*len = used;
	return p;
}

START_TEST(depth_limit)
{
	size_t len;
	for (int k = 0; k < 2; k++) {
		char kind = k ? 'A' : 'F';
		uint8_t *p = nest(TAP_TABLE_MAX_DEPTH, kind, &len);
		ck_assert_msg(tap_table_validate(p, len) == 0, "%c at the limit", kind);
		int rc;
		char *s = to_json(p, len, &rc);
		ck_assert_int_eq(rc, 0);
		ck_assert_ptr_nonnull(strstr(s, kind == 'F' ? "{\"F\":{}}" : "{\"A\":[]}"));
		free(s);
		free(p);
		p = nest(TAP_TABLE_MAX_DEPTH + 1, kind, &len);
		ck_assert_int_eq(tap_table_validate(p, len), TAP_E_TABLE_TOO_DEEP);
		free(p);
	}
}
END_TEST

START_TEST(nested_100000_deep)
{
	size_t len;
	uint8_t *p = nest(100000, 'F', &len);
	ck_assert_int_eq(tap_table_validate(p, len), TAP_E_TABLE_TOO_DEEP);
	int rc;
	char *s = to_json(p, len, &rc);
	ck_assert_int_eq(rc, TAP_E_TABLE_TOO_DEEP);
	ck_assert_str_eq(s, "null");
	free(s);
	free(p);
	p = nest(100000, 'A', &len);
	ck_assert_int_eq(tap_table_validate(p, len), TAP_E_TABLE_TOO_DEEP);
	free(p);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("table");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, every_type_letter);
	tcase_add_test(tc, iterator_values);
	tcase_add_test(tc, find_miss_leaves_nothing);
	tcase_add_test(tc, truncated_everywhere);
	tcase_add_test(tc, unknown_letters);
	tcase_add_test(tc, depth_limit);
	tcase_add_test(tc, nested_100000_deep);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
