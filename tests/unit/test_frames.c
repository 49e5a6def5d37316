/* Frame-trace lines: exact JSON for each frame kind, error lines for undecodable payloads, and redaction:
 * no password or secret byte sequence appears anywhere in the output; the SASL user is extracted. */
#include "amqptap/frames.h"
#include "amqptap/spec.h"
#include "amqptap/status.h"

#include <check.h>

#include "tap_check.h"
#include "wbuf.h"
#include <stdlib.h>
#include <string.h>

#define TS 1764411302000412LL
#define PREFIX "{\"ts\":\"2025-11-29T10:15:02.000412Z\",\"conn\":3,"

static char *line(bool c2s, enum tap_frame_ev_kind kind, uint8_t type, uint16_t ch, const struct wbuf *w,
		  const uint8_t *prefix, size_t plen)
{
	struct tap_frame_ev ev = {kind, ch, type, (uint32_t)w->n, 100, w->d, w->n, true};
	struct tap_buf b;
	tap_buf_init(&b);
	tap_frames_line(&b, 3, c2s, TS, &ev, prefix, plen);
	tap_buf_putc(&b, 0);
	ck_assert(!b.oom);
	return b.data;
}

static bool contains(const char *hay, size_t hay_len, const void *needle, size_t n)
{
	return memmem(hay, hay_len, needle, n) != NULL;
}

START_TEST(method_line)
{
	struct wbuf w = {.n = 0};
	put32(&w, TAP_BASIC_PUBLISH);
	put16(&w, 0);
	sstr(&w, "x.d");
	sstr(&w, "rk\"1");
	put8(&w, 1);
	char *s = line(true, TAP_EV_METHOD, 1, 1, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"c2s\",\"channel\":1,\"frame\":\"method\",\"size\":16,\"method\":\"basic.publish\","
			    "\"class_id\":60,\"method_id\":40,\"args\":{\"exchange\":\"x.d\",\"routing_key\":\"rk\\\"1\","
			    "\"mandatory\":true,\"immediate\":false}}");
	free(s);
	/* a table argument */
	w.n = 0;
	put32(&w, TAP_QUEUE_DECLARE);
	put16(&w, 0);
	sstr(&w, "q");
	put8(&w, 0x02);
	struct wbuf t = {.n = 0};
	sstr(&t, "x-max-length");
	put8(&t, 'l');
	put32(&t, 0), put32(&t, 1);
	lstr(&w, t.d, t.n);
	s = line(true, TAP_EV_METHOD, 1, 1, &w, NULL, 0);
	ck_assert_ptr_nonnull(strstr(s, "\"args\":{\"queue\":\"q\",\"passive\":false,\"durable\":true,\"exclusive\":false,"
					"\"auto_delete\":false,\"no_wait\":false,\"arguments\":{\"x-max-length\":{\"l\":1}}}}"));
	free(s);
	/* truncated and unknown */
	w.n = 7;
	w.d[3] = 40;
	w.d[1] = 60;
	s = line(false, TAP_EV_METHOD, 1, 2, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"s2c\",\"channel\":2,\"frame\":\"method\",\"size\":7,\"method\":\"basic.publish\","
			    "\"class_id\":60,\"method_id\":40,\"error\":\"truncated frame payload or argument\"}");
	free(s);
	w.d[3] = 41;
	s = line(false, TAP_EV_METHOD, 1, 2, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"s2c\",\"channel\":2,\"frame\":\"method\",\"size\":7,"
			    "\"class_id\":60,\"method_id\":41,\"error\":\"unknown class or method\"}");
	free(s);
	w.n = 2;
	s = line(false, TAP_EV_METHOD, 1, 2, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"s2c\",\"channel\":2,\"frame\":\"method\",\"size\":2,"
			    "\"error\":\"truncated frame payload or argument\"}");
	free(s);
}
END_TEST

START_TEST(other_lines)
{
	struct wbuf w = {.n = 0};
	put16(&w, 60), put16(&w, 0), put32(&w, 0), put32(&w, 12);
	put16(&w, 0x8000 | 0x2000 | 0x1000 | 0x0080 | 0x0040);
	sstr(&w, "text/plain");
	struct wbuf t = {.n = 0};
	sstr(&t, "k");
	put8(&t, 'S');
	lstr(&t, "v\xff", 2);
	lstr(&w, t.d, t.n);
	put8(&w, 2);
	sstr(&w, "id-42");
	put32(&w, 0), put32(&w, 1700000000);
	char *s = line(true, TAP_EV_HEADER, 2, 1, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"c2s\",\"channel\":1,\"frame\":\"header\",\"size\":53,\"class_id\":60,"
			    "\"body_size\":12,\"props\":{\"content_type\":\"text/plain\",\"headers\":{\"k\":{\"S\":\"v\\u00ff\"}},"
			    "\"delivery_mode\":2,\"message_id\":\"id-42\",\"timestamp\":1700000000}}");
	free(s);
	w.n = 13;
	s = line(true, TAP_EV_HEADER, 2, 1, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"c2s\",\"channel\":1,\"frame\":\"header\",\"size\":13,\"class_id\":60,"
			    "\"body_size\":12,\"error\":\"truncated frame payload or argument\"}");
	free(s);

	w.n = 0;
	put(&w, "hello world!", 12);
	s = line(false, TAP_EV_BODY, 3, 1, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"s2c\",\"channel\":1,\"frame\":\"body\",\"size\":12}");
	free(s);
	s = line(false, TAP_EV_BODY, 3, 1, &w, w.d, 4);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"s2c\",\"channel\":1,\"frame\":\"body\",\"size\":12,\"body_hex\":\"68656c6c\"}");
	free(s);

	w.n = 0;
	s = line(false, TAP_EV_HEARTBEAT, 8, 0, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"s2c\",\"channel\":0,\"frame\":\"heartbeat\",\"size\":0}");
	free(s);
	put(&w, "AMQP\0\0\x09\x01", 8);
	s = line(true, TAP_EV_PROTOCOL_HEADER, 0, 0, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"c2s\",\"channel\":0,\"frame\":\"protocol_header\",\"size\":8,"
			    "\"protocol\":\"0-9-1\"}");
	free(s);
}
END_TEST

static char *start_ok(const char *mech, const void *resp, size_t resp_len)
{
	struct wbuf w = {.n = 0};
	put32(&w, TAP_CONNECTION_START_OK);
	struct wbuf t = {.n = 0};
	sstr(&t, "product");
	put8(&t, 'S');
	lstr(&t, "pika", 4);
	lstr(&w, t.d, t.n);
	sstr(&w, mech);
	lstr(&w, resp, resp_len);
	sstr(&w, "en_US");
	return line(true, TAP_EV_METHOD, 1, 0, &w, NULL, 0);
}

START_TEST(redact_plain)
{
	const char resp[] = "\0guest\0s3cr3t-pw";
	char *s = start_ok("PLAIN", resp, sizeof resp - 1);
	ck_assert_ptr_nonnull(strstr(s, "\"response\":\"<redacted 16 bytes>\""));
	ck_assert_ptr_nonnull(strstr(s, "\"user\":\"guest\""));
	ck_assert_ptr_nonnull(strstr(s, "\"client_properties\":{\"product\":{\"S\":\"pika\"}}"));
	ck_assert(!contains(s, strlen(s), "s3cr3t", 6));
	ck_assert(!contains(s, strlen(s), "cr3t-pw", 7));
	free(s);
	char user[8];
	ck_assert(tap_sasl_user((const uint8_t *)"PLAIN", 5, (const uint8_t *)"authz\0alice\0pw", 14, user, sizeof user));
	ck_assert_str_eq(user, "alice");
	ck_assert(tap_sasl_user((const uint8_t *)"PLAIN", 5, (const uint8_t *)"\0averyverylonguser\0pw", 21, user, 8));
	ck_assert_str_eq(user, "averyve");
	ck_assert(!tap_sasl_user((const uint8_t *)"PLAIN", 5, (const uint8_t *)"\0nopassword", 11, user, 8));
	ck_assert(!tap_sasl_user((const uint8_t *)"PLAIN", 5, (const uint8_t *)"garbage", 7, user, 8));
	ck_assert(!tap_sasl_user((const uint8_t *)"EXTERNAL", 8, (const uint8_t *)"", 0, user, 8));
}
END_TEST

START_TEST(redact_amqplain)
{
	struct wbuf t = {.n = 0};
	sstr(&t, "LOGIN");
	put8(&t, 'S');
	lstr(&t, "bob", 3);
	sstr(&t, "PASSWORD");
	put8(&t, 'S');
	lstr(&t, "hunter2xyz", 10);
	char *s = start_ok("AMQPLAIN", t.d, t.n);
	ck_assert_ptr_nonnull(strstr(s, "\"response\":\"<redacted 38 bytes>\""));
	ck_assert_ptr_nonnull(strstr(s, "\"user\":\"bob\""));
	ck_assert(!contains(s, strlen(s), "hunter2", 7));
	ck_assert(!contains(s, strlen(s), "PASSWORD", 8));
	free(s);
	char user[16];
	ck_assert(tap_sasl_user((const uint8_t *)"AMQPLAIN", 8, t.d, t.n, user, sizeof user));
	ck_assert_str_eq(user, "bob");
	ck_assert(!tap_sasl_user((const uint8_t *)"AMQPLAIN", 8, t.d + 1, t.n - 1, user, sizeof user));
}
END_TEST

START_TEST(redact_secure_ok_and_update_secret)
{
	struct wbuf w = {.n = 0};
	put32(&w, TAP_CONNECTION_SECURE_OK);
	lstr(&w, "tok3n-abc", 9);
	char *s = line(true, TAP_EV_METHOD, 1, 0, &w, NULL, 0);
	ck_assert_ptr_nonnull(strstr(s, "\"args\":{\"response\":\"<redacted 9 bytes>\"}"));
	ck_assert(!contains(s, strlen(s), "tok3n", 5));
	free(s);
	w.n = 0;
	put32(&w, TAP_CONNECTION_UPDATE_SECRET);
	lstr(&w, "jwt.eyJzZWNyZXQ", 15);
	sstr(&w, "refresh");
	s = line(true, TAP_EV_METHOD, 1, 0, &w, NULL, 0);
	ck_assert_ptr_nonnull(
		strstr(s, "\"method\":\"connection.update-secret\",\"class_id\":10,\"method_id\":70,"
			  "\"args\":{\"new_secret\":\"<redacted 15 bytes>\",\"reason\":\"refresh\"}}"));
	ck_assert(!contains(s, strlen(s), "eyJ", 3));
	free(s);
	/* a secure (challenge) is not a secret and is shown */
	w.n = 0;
	put32(&w, TAP_CONNECTION_SECURE);
	lstr(&w, "chal", 4);
	s = line(false, TAP_EV_METHOD, 1, 0, &w, NULL, 0);
	ck_assert_ptr_nonnull(strstr(s, "\"args\":{\"challenge\":\"chal\"}"));
	free(s);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("frames");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, method_line);
	tcase_add_test(tc, other_lines);
	tcase_add_test(tc, redact_plain);
	tcase_add_test(tc, redact_amqplain);
	tcase_add_test(tc, redact_secure_ok_and_update_secret);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
