/* Frame-trace lines: exact JSON for each frame kind, error lines for undecodable payloads, AMQP 0-8 method
 * names, and redaction: no password or secret byte sequence appears anywhere in the output; the SASL user is
 * extracted. */
#include "amqptap/frames.h"
#include "amqptap/dialect.h"
#include "amqptap/spec.h"
#include "amqptap/status.h"

#include <check.h>

#include "tap_check.h"
#include "tap_build.h"
#include <stdlib.h>
#include <string.h>

#define TS 1764411302000412LL
#define PREFIX "{\"ts\":\"2025-11-29T10:15:02.000412Z\",\"conn\":3,"

static char *line_in(enum tap_amqp_version v, enum tap_dir dir, enum tap_frame_ev_kind kind, uint8_t type,
		     uint16_t ch, const struct tap_bytes *w, const uint8_t *prefix, size_t plen)
{
	struct tap_frame_ev ev = {
		.kind = kind,
		.channel = ch,
		.type = type,
		.size = (uint32_t)w->n,
		.offset = 100,
		.data = w->d,
		.len = w->n,
		.frame_end = true,
		.version = v,
	};
	struct tap_buf b;
	tap_buf_init(&b);
	tap_frames_line(&b, NULL, 3, dir, TS, &ev, prefix, plen);
	tap_buf_putc(&b, 0);
	ck_assert(!b.oom);
	return b.data;
}

static char *line(enum tap_dir dir, enum tap_frame_ev_kind kind, uint8_t type, uint16_t ch, const struct tap_bytes *w,
		  const uint8_t *prefix, size_t plen)
{
	return line_in(TAP_AMQP_0_9_1, dir, kind, type, ch, w, prefix, plen);
}

static bool contains(const char *hay, size_t hay_len, const void *needle, size_t n)
{
	return memmem(hay, hay_len, needle, n) != NULL;
}

START_TEST(method_line)
{
	struct tap_bytes w = {0};
	tap_build_u32(&w, TAP_BASIC_PUBLISH);
	tap_build_u16(&w, 0);
	tap_build_shortstr(&w, "x.d");
	tap_build_shortstr(&w, "rk\"1");
	tap_build_u8(&w, 1);
	char *s = line(TAP_C2S, TAP_EV_METHOD, 1, 1, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"c2s\",\"channel\":1,\"frame\":\"method\",\"size\":16,\"method\":\"basic.publish\","
			    "\"class_id\":60,\"method_id\":40,\"args\":{\"exchange\":\"x.d\",\"routing_key\":\"rk\\\"1\","
			    "\"mandatory\":true,\"immediate\":false}}");
	free(s);
	/* a table argument */
	w.n = 0;
	tap_build_u32(&w, TAP_QUEUE_DECLARE);
	tap_build_u16(&w, 0);
	tap_build_shortstr(&w, "q");
	tap_build_u8(&w, 0x02);
	struct tap_bytes t = {0};
	tap_build_shortstr(&t, "x-max-length");
	tap_build_u8(&t, 'l');
	tap_build_u32(&t, 0);
	tap_build_u32(&t, 1);
	tap_build_longstr(&w, t.d, t.n);
	s = line(TAP_C2S, TAP_EV_METHOD, 1, 1, &w, NULL, 0);
	ck_assert_ptr_nonnull(strstr(s, "\"args\":{\"queue\":\"q\",\"passive\":false,\"durable\":true,\"exclusive\":false,"
					"\"auto_delete\":false,\"no_wait\":false,\"arguments\":{\"x-max-length\":{\"l\":1}}}}"));
	free(s);
	/* truncated and unknown */
	w.n = 7;
	w.d[3] = 40;
	w.d[1] = 60;
	s = line(TAP_S2C, TAP_EV_METHOD, 1, 2, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"s2c\",\"channel\":2,\"frame\":\"method\",\"size\":7,\"method\":\"basic.publish\","
			    "\"class_id\":60,\"method_id\":40,\"error\":\"truncated frame payload or argument\"}");
	free(s);
	w.d[3] = 41;
	s = line(TAP_S2C, TAP_EV_METHOD, 1, 2, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"s2c\",\"channel\":2,\"frame\":\"method\",\"size\":7,"
			    "\"class_id\":60,\"method_id\":41,\"error\":\"unknown class or method\"}");
	free(s);
	w.n = 2;
	s = line(TAP_S2C, TAP_EV_METHOD, 1, 2, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"s2c\",\"channel\":2,\"frame\":\"method\",\"size\":2,"
			    "\"error\":\"truncated frame payload or argument\"}");
	free(s);
	tap_build_free(&t);
	tap_build_free(&w);
}
END_TEST

START_TEST(other_lines)
{
	struct tap_bytes w = {0};
	tap_build_u16(&w, 60);
	tap_build_u16(&w, 0);
	tap_build_u32(&w, 0);
	tap_build_u32(&w, 12);
	tap_build_u16(&w, 0x8000 | 0x2000 | 0x1000 | 0x0080 | 0x0040);
	tap_build_shortstr(&w, "text/plain");
	struct tap_bytes t = {0};
	tap_build_shortstr(&t, "k");
	tap_build_u8(&t, 'S');
	tap_build_longstr(&t, "v\xff", 2);
	tap_build_longstr(&w, t.d, t.n);
	tap_build_u8(&w, 2);
	tap_build_shortstr(&w, "id-42");
	tap_build_u32(&w, 0);
	tap_build_u32(&w, 1700000000);
	char *s = line(TAP_C2S, TAP_EV_HEADER, 2, 1, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"c2s\",\"channel\":1,\"frame\":\"header\",\"size\":53,\"class_id\":60,"
			    "\"body_size\":12,\"props\":{\"content_type\":\"text/plain\",\"headers\":{\"k\":{\"S\":\"v\\u00ff\"}},"
			    "\"delivery_mode\":2,\"message_id\":\"id-42\",\"timestamp\":1700000000}}");
	free(s);
	w.n = 13;
	s = line(TAP_C2S, TAP_EV_HEADER, 2, 1, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"c2s\",\"channel\":1,\"frame\":\"header\",\"size\":13,\"class_id\":60,"
			    "\"body_size\":12,\"error\":\"truncated frame payload or argument\"}");
	free(s);

	w.n = 0;
	tap_build_raw(&w, "hello world!", 12);
	s = line(TAP_S2C, TAP_EV_BODY, 3, 1, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"s2c\",\"channel\":1,\"frame\":\"body\",\"size\":12}");
	free(s);
	s = line(TAP_S2C, TAP_EV_BODY, 3, 1, &w, w.d, 4);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"s2c\",\"channel\":1,\"frame\":\"body\",\"size\":12,\"body_hex\":\"68656c6c\"}");
	free(s);

	w.n = 0;
	s = line(TAP_S2C, TAP_EV_HEARTBEAT, 8, 0, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"s2c\",\"channel\":0,\"frame\":\"heartbeat\",\"size\":0}");
	free(s);
	tap_build_raw(&w, "AMQP\0\0\x09\x01", 8);
	s = line(TAP_C2S, TAP_EV_PROTOCOL_HEADER, 0, 0, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"c2s\",\"channel\":0,\"frame\":\"protocol_header\",\"size\":8,"
			    "\"protocol\":\"0-9-1\"}");
	free(s);
	tap_build_free(&t);
	tap_build_free(&w);
}
END_TEST

static char *start_ok(const char *mech, const void *resp, size_t resp_len)
{
	struct tap_bytes w = {0};
	tap_build_u32(&w, TAP_CONNECTION_START_OK);
	struct tap_bytes t = {0};
	tap_build_key(&t, "product", 'S');
	tap_build_longstr(&t, "pika", 4);
	tap_build_longstr(&w, t.d, t.n);
	tap_build_shortstr(&w, mech);
	tap_build_longstr(&w, resp, resp_len);
	tap_build_shortstr(&w, "en_US");
	char *s = line(TAP_C2S, TAP_EV_METHOD, 1, 0, &w, NULL, 0);
	tap_build_free(&t);
	tap_build_free(&w);
	return s;
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
	const char authz[] = "authz\0alice\0pw";
	s = start_ok("PLAIN", authz, sizeof authz - 1);
	ck_assert_ptr_nonnull(strstr(s, "\"user\":\"alice\""));
	free(s);
	s = start_ok("PLAIN", "garbage", 7);
	ck_assert_ptr_null(strstr(s, "\"user\""));
	ck_assert(!contains(s, strlen(s), "garbage", 7));
	free(s);
}
END_TEST

START_TEST(redact_amqplain)
{
	static const char *const pw[] = {"hunter2xyz", "second-pw"};
	struct tap_bytes t = {0};
	tap_build_amqplain(&t, "bob", pw, 2);
	char *s = start_ok("AMQPLAIN", t.d, t.n);
	ck_assert_ptr_nonnull(strstr(s, "\"response\":\"<redacted 61 bytes>\""));
	ck_assert_ptr_nonnull(strstr(s, "\"user\":\"bob\""));
	ck_assert(!contains(s, strlen(s), "hunter2", 7));
	ck_assert(!contains(s, strlen(s), "second-pw", 9));
	ck_assert(!contains(s, strlen(s), "PASSWORD", 8));
	free(s);
	tap_build_free(&t);
}
END_TEST

/* AMQP 0-8 (dialect.h): connection.close is 10/60, which 0-9-1 calls connection.blocked; 0-8 has no confirm
 * class; its channel.open-ok has no arguments. Its protocol headers have names. */
START_TEST(amqp_0_8_lines)
{
	struct tap_bytes w = {0};
	tap_build_u32(&w, TAP_METHOD_ID(10, 60));
	tap_build_u16(&w, 320);
	tap_build_shortstr(&w, "CONNECTION_FORCED");
	tap_build_u16(&w, 0);
	tap_build_u16(&w, 0);
	char *s = line_in(TAP_AMQP_0_8, TAP_S2C, TAP_EV_METHOD, 1, 0, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"s2c\",\"channel\":0,\"frame\":\"method\",\"size\":28,"
			    "\"method\":\"connection.close\",\"class_id\":10,\"method_id\":60,\"args\":{\"reply_code\":320,"
			    "\"reply_text\":\"CONNECTION_FORCED\",\"class_id\":0,\"method_id\":0}}");
	free(s);
	s = line(TAP_S2C, TAP_EV_METHOD, 1, 0, &w, NULL, 0);
	ck_assert_ptr_nonnull(strstr(s, "\"method\":\"connection.blocked\""));
	free(s);
	w.n = 0;
	tap_build_u32(&w, TAP_CONFIRM_SELECT);
	tap_build_u8(&w, 0);
	s = line_in(TAP_AMQP_0_8, TAP_C2S, TAP_EV_METHOD, 1, 1, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"c2s\",\"channel\":1,\"frame\":\"method\",\"size\":5,"
			    "\"class_id\":85,\"method_id\":10,\"error\":\"unknown class or method\"}");
	free(s);
	w.n = 0;
	tap_build_u32(&w, TAP_CHANNEL_OPEN_OK);
	s = line_in(TAP_AMQP_0_8, TAP_S2C, TAP_EV_METHOD, 1, 1, &w, NULL, 0);
	ck_assert_str_eq(s, PREFIX "\"dir\":\"s2c\",\"channel\":1,\"frame\":\"method\",\"size\":4,"
			    "\"method\":\"channel.open-ok\",\"class_id\":20,\"method_id\":11,\"args\":{}}");
	free(s);
	w.n = 0;
	tap_build_u32(&w, TAP_METHOD_ID(30, 10));
	tap_build_shortstr(&w, "/data");
	tap_build_u8(&w, 0x1e);
	s = line_in(TAP_AMQP_0_8, TAP_C2S, TAP_EV_METHOD, 1, 1, &w, NULL, 0);
	ck_assert_ptr_nonnull(strstr(s, "\"method\":\"access.request\",\"class_id\":30,\"method_id\":10,\"args\":{"
					"\"realm\":\"/data\",\"exclusive\":false,\"passive\":true,\"active\":true,"
					"\"write\":true,\"read\":true}}"));
	free(s);
	w.n = 0;
	tap_build_raw(&w, "AMQP\x01\x01\x08\x00", 8);
	s = line_in(TAP_AMQP_0_8, TAP_C2S, TAP_EV_PROTOCOL_HEADER, 0, 0, &w, NULL, 0);
	ck_assert_ptr_nonnull(strstr(s, "\"protocol\":\"0-8 (AMQP 1 1 8 0)\"}"));
	free(s);
	w.n = 0;
	tap_build_raw(&w, "AMQP\x03\x01\x00\x00", 8);
	s = line(TAP_C2S, TAP_EV_PROTOCOL_HEADER, 0, 0, &w, NULL, 0);
	ck_assert_ptr_nonnull(strstr(s, "\"protocol\":\"414d515003010000\"}"));
	free(s);
	tap_build_free(&w);
}
END_TEST

START_TEST(redact_secure_ok_and_update_secret)
{
	struct tap_bytes w = {0};
	tap_build_u32(&w, TAP_CONNECTION_SECURE_OK);
	tap_build_longstr(&w, "tok3n-abc", 9);
	char *s = line(TAP_C2S, TAP_EV_METHOD, 1, 0, &w, NULL, 0);
	ck_assert_ptr_nonnull(strstr(s, "\"args\":{\"response\":\"<redacted 9 bytes>\"}"));
	ck_assert(!contains(s, strlen(s), "tok3n", 5));
	free(s);
	w.n = 0;
	tap_build_u32(&w, TAP_CONNECTION_UPDATE_SECRET);
	tap_build_longstr(&w, "jwt.eyJzZWNyZXQ", 15);
	tap_build_shortstr(&w, "refresh");
	s = line(TAP_C2S, TAP_EV_METHOD, 1, 0, &w, NULL, 0);
	ck_assert_ptr_nonnull(
		strstr(s, "\"method\":\"connection.update-secret\",\"class_id\":10,\"method_id\":70,"
			  "\"args\":{\"new_secret\":\"<redacted 15 bytes>\",\"reason\":\"refresh\"}}"));
	ck_assert(!contains(s, strlen(s), "eyJ", 3));
	free(s);
	/* a secure (challenge) is not a secret and is shown */
	w.n = 0;
	tap_build_u32(&w, TAP_CONNECTION_SECURE);
	tap_build_longstr(&w, "chal", 4);
	s = line(TAP_S2C, TAP_EV_METHOD, 1, 0, &w, NULL, 0);
	ck_assert_ptr_nonnull(strstr(s, "\"args\":{\"challenge\":\"chal\"}"));
	free(s);
	tap_build_free(&w);
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
	tcase_add_test(tc, amqp_0_8_lines);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
