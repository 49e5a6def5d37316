/* The one SASL parser (sasl.h) and the redaction ranges built on it (redact.h): PLAIN with and without authzid,
 * AMQPLAIN with one, two and more PASSWORD keys, of string and other types, in any case, malformed tables, other
 * mechanisms. After masking the ranges no byte of a password is left, and LOGIN stays readable. */
#include "amqptap/redact.h"
#include "amqptap/sasl.h"
#include "amqptap/spec.h"

#include <check.h>

#include "tap_build.h"
#include "tap_check.h"
#include <stdlib.h>
#include <string.h>

static struct tap_slice sl(const void *p, size_t n)
{
	return (struct tap_slice){p, n};
}

static struct tap_slice text(const char *s)
{
	return sl(s, strlen(s));
}

static bool user_is(const struct tap_sasl *a, const char *want)
{
	return a->user.len == strlen(want) && memcmp(a->user.ptr, want, a->user.len) == 0;
}

/* The response with every secret range overwritten by '*'; caller frees. */
static uint8_t *masked(const uint8_t *resp, size_t len, const struct tap_sasl *a)
{
	uint8_t *m = malloc(len + 1);
	memcpy(m, resp, len);
	size_t end = 0;
	for (size_t i = 0; i < a->n_secrets; i++) {
		ck_assert_uint_ge(a->secret[i].off, end); /* in order, not overlapping */
		ck_assert_uint_le(a->secret[i].off + a->secret[i].len, len);
		memset(m + a->secret[i].off, '*', a->secret[i].len);
		end = a->secret[i].off + a->secret[i].len;
	}
	return m;
}

START_TEST(plain)
{
	struct tap_sasl a;
	const char r1[] = "\0guest\0s3cr3t";
	tap_sasl_parse(text("PLAIN"), sl(r1, sizeof r1 - 1), &a);
	ck_assert(user_is(&a, "guest"));
	ck_assert_uint_eq(a.n_secrets, 1);
	ck_assert_uint_eq(a.secret[0].off, 7);
	ck_assert_uint_eq(a.secret[0].len, 6);
	const char r2[] = "authz\0alice\0pw";
	tap_sasl_parse(text("PLAIN"), sl(r2, sizeof r2 - 1), &a);
	ck_assert(user_is(&a, "alice"));
	ck_assert_uint_eq(a.secret[0].off, 12);
	/* no second NUL: all of it may be the password */
	tap_sasl_parse(text("PLAIN"), sl("\0nopassword", 11), &a);
	ck_assert_uint_eq(a.user.len, 0);
	ck_assert_uint_eq(a.n_secrets, 1);
	ck_assert_uint_eq(a.secret[0].off, 0);
	ck_assert_uint_eq(a.secret[0].len, 11);
	/* empty user, empty password */
	tap_sasl_parse(text("PLAIN"), sl("\0\0", 2), &a);
	ck_assert_uint_eq(a.user.len, 0);
	ck_assert_uint_eq(a.n_secrets, 0);
	/* a long user is cut */
	struct tap_bytes b = {0};
	tap_build_u8(&b, 0);
	for (int i = 0; i < 300; i++)
		tap_build_u8(&b, 'u');
	tap_build_raw(&b, "\0pw", 3);
	tap_sasl_parse(text("PLAIN"), sl(b.d, b.n), &a);
	ck_assert_uint_eq(a.user.len, TAP_SASL_USER_MAX);
	tap_build_free(&b);
	/* other mechanisms: the whole response */
	tap_sasl_parse(text("RABBIT-CR-DEMO"), text("guest"), &a);
	ck_assert_uint_eq(a.user.len, 0);
	ck_assert_uint_eq(a.n_secrets, 1);
	ck_assert_uint_eq(a.secret[0].len, 5);
	tap_sasl_parse(text("EXTERNAL"), sl("", 0), &a);
	ck_assert_uint_eq(a.n_secrets, 0);
}
END_TEST

START_TEST(amqplain_every_password)
{
	static const char *const pw[] = {"first-pw", "second-pw"};
	struct tap_bytes t = {0};
	tap_build_amqplain(&t, "bob", pw, 2);
	tap_build_key(&t, "password", 'x');
	tap_build_longstr(&t, "third-pw", 8);
	tap_build_key(&t, "PassWord", 'l');
	tap_build_u64(&t, 0x4142434445464748ull);
	tap_build_key(&t, "LOGIN", 'S');
	tap_build_longstr(&t, "mallory", 7);
	struct tap_sasl a;
	tap_sasl_parse(text("AMQPLAIN"), sl(t.d, t.n), &a);
	ck_assert(user_is(&a, "bob")); /* the first LOGIN, as RabbitMQ reads it */
	ck_assert_uint_eq(a.n_secrets, 4);
	uint8_t *m = masked(t.d, t.n, &a);
	ck_assert_ptr_null(memmem(m, t.n, "-pw", 3));
	ck_assert_ptr_null(memmem(m, t.n, "ABCDEFGH", 8));
	ck_assert_ptr_nonnull(memmem(m, t.n, "bob", 3));
	ck_assert_ptr_nonnull(memmem(m, t.n, "mallory", 7));
	ck_assert_ptr_nonnull(memmem(m, t.n, "PASSWORD", 8)); /* the keys stay: the table still parses */
	free(m);
	/* more PASSWORD keys than ranges: the last range runs to the end */
	tap_build_key(&t, "PASSWORD", 'S');
	tap_build_longstr(&t, "fifth-pw", 8);
	tap_build_key(&t, "tail", 'S');
	tap_build_longstr(&t, "visible?", 8);
	tap_sasl_parse(text("AMQPLAIN"), sl(t.d, t.n), &a);
	ck_assert_uint_eq(a.n_secrets, TAP_SASL_MAX_SECRETS);
	ck_assert_uint_eq(a.secret[3].off + a.secret[3].len, t.n);
	m = masked(t.d, t.n, &a);
	ck_assert_ptr_null(memmem(m, t.n, "-pw", 3));
	ck_assert_ptr_null(memmem(m, t.n, "visible", 7));
	free(m);
	tap_build_free(&t);
}
END_TEST

START_TEST(amqplain_malformed)
{
	struct tap_bytes t = {0};
	tap_build_key(&t, "LOGIN", 'S');
	tap_build_longstr(&t, "bob", 3);
	size_t bad = t.n;
	tap_build_key(&t, "PASSWORD", 'S');
	tap_build_u32(&t, 1000); /* longer than the table */
	tap_build_raw(&t, "s3cret", 6);
	struct tap_sasl a;
	tap_sasl_parse(text("AMQPLAIN"), sl(t.d, t.n), &a);
	ck_assert(user_is(&a, "bob"));
	ck_assert_uint_eq(a.n_secrets, 1);
	ck_assert_uint_eq(a.secret[0].off, bad);
	ck_assert_uint_eq(a.secret[0].len, t.n - bad);
	/* cut anywhere: no byte of the password survives */
	for (size_t cut = 0; cut <= t.n; cut++) {
		tap_sasl_parse(text("AMQPLAIN"), sl(t.d, cut), &a);
		uint8_t *m = masked(t.d, cut, &a);
		ck_assert_ptr_null(memmem(m, cut, "s3", 2));
		free(m);
	}
	/* LOGIN of another type: no user */
	t.n = 0;
	tap_build_key(&t, "LOGIN", 'I');
	tap_build_u32(&t, 7);
	tap_sasl_parse(text("AMQPLAIN"), sl(t.d, t.n), &a);
	ck_assert_uint_eq(a.user.len, 0);
	ck_assert_uint_eq(a.n_secrets, 0);
	tap_build_free(&t);
}
END_TEST

/* tap_redact_ranges over a whole start-ok payload: offsets from the payload start; all of the response but the
 * user and what finds it (as the frame trace hides all but the user), so neither a PLAIN authzid nor an AMQPLAIN
 * key besides LOGIN is left in the capture copy, and a reader of the copy still finds the user. */
START_TEST(redact_ranges_start_ok)
{
	static const char *const pw[] = {"pw-one", "pw-two"};
	struct tap_bytes t = {0};
	tap_build_amqplain(&t, "bob", pw, 2);
	struct tap_bytes p = {0};
	tap_build_u32(&p, TAP_CONNECTION_START_OK);
	tap_build_u32(&p, 0);
	tap_build_shortstr(&p, "AMQPLAIN");
	tap_build_longstr(&p, t.d, t.n);
	tap_build_shortstr(&p, "en_US");
	struct tap_method m;
	ck_assert_int_eq(tap_method_decode(p.d, p.n, &m), 0);
	struct tap_range r[TAP_REDACT_MAX_RANGES];
	size_t n = tap_redact_ranges(&m, p.d, r);
	size_t resp = 4 + 4 + 1 + 8 + 4, login = 1 + 5 + 1 + 4 + 3;
	ck_assert_uint_eq(n, 1); /* LOGIN comes first: only what follows it */
	ck_assert_uint_eq(r[0].off, resp + login);
	ck_assert_uint_eq(r[0].len, t.n - login);
	memset(p.d + r[0].off, '*', r[0].len);
	ck_assert_ptr_null(memmem(p.d, p.n, "pw-", 3));
	ck_assert_ptr_null(memmem(p.d, p.n, "PASSWORD", 8));
	ck_assert_ptr_nonnull(memmem(p.d, p.n, "LOGINS\0\0\0\x03" "bob", 13));
	struct tap_sasl a;
	tap_sasl_parse(text("AMQPLAIN"), sl(p.d + resp, t.n), &a);
	ck_assert(user_is(&a, "bob"));
	/* PLAIN with an authzid: the authzid and the password, "\0bob\0" kept */
	static const char plain[] = "authz-id\0bob\0pw-three";
	p.n = 0;
	tap_build_u32(&p, TAP_CONNECTION_START_OK);
	tap_build_u32(&p, 0);
	tap_build_shortstr(&p, "PLAIN");
	tap_build_longstr(&p, plain, sizeof plain - 1);
	tap_build_shortstr(&p, "en_US");
	ck_assert_int_eq(tap_method_decode(p.d, p.n, &m), 0);
	n = tap_redact_ranges(&m, p.d, r);
	resp = 4 + 4 + 1 + 5 + 4;
	ck_assert_uint_eq(n, 2);
	ck_assert_uint_eq(r[0].off, resp);
	ck_assert_uint_eq(r[0].len, 8);
	ck_assert_uint_eq(r[1].off, resp + 13);
	ck_assert_uint_eq(r[1].len, 8);
	/* another mechanism: the whole response */
	p.n = 0;
	tap_build_u32(&p, TAP_CONNECTION_START_OK);
	tap_build_u32(&p, 0);
	tap_build_shortstr(&p, "EXTERNAL");
	tap_build_longstr(&p, "CN=bob", 6);
	tap_build_shortstr(&p, "en_US");
	ck_assert_int_eq(tap_method_decode(p.d, p.n, &m), 0);
	n = tap_redact_ranges(&m, p.d, r);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(r[0].off, 4 + 4 + 1 + 8 + 4);
	ck_assert_uint_eq(r[0].len, 6);
	/* secure-ok: the whole response */
	p.n = 0;
	tap_build_u32(&p, TAP_CONNECTION_SECURE_OK);
	tap_build_longstr(&p, "chal-answer", 11);
	ck_assert_int_eq(tap_method_decode(p.d, p.n, &m), 0);
	n = tap_redact_ranges(&m, p.d, r);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(r[0].off, 8);
	ck_assert_uint_eq(r[0].len, 11);
	/* update-secret: the whole new-secret */
	p.n = 0;
	tap_build_u32(&p, TAP_CONNECTION_UPDATE_SECRET);
	tap_build_longstr(&p, "tok3n", 5);
	tap_build_shortstr(&p, "refresh");
	ck_assert_int_eq(tap_method_decode(p.d, p.n, &m), 0);
	n = tap_redact_ranges(&m, p.d, r);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(r[0].off, 8);
	ck_assert_uint_eq(r[0].len, 5);
	tap_build_free(&p);
	tap_build_free(&t);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("sasl");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, plain);
	tcase_add_test(tc, amqplain_every_password);
	tcase_add_test(tc, amqplain_malformed);
	tcase_add_test(tc, redact_ranges_start_ok);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
