/* Replay driver: a synthetic capture (written with the pcapng writer) of a confirm-mode publish and its ack gives
 * exactly the expected records with latencies from the capture; the same capture cut before the handshake
 * (mid-connection start, first bytes inside a frame) still yields the publish verdict; a connection silent for
 * the idle time is closed with a record that claims no reset, and a later packet of it starts a new one. */
#include "amqptap/capture.h"
#include "amqptap/conn.h"
#include "amqptap/jsonl.h"
#include "amqptap/pcapng.h"
#include "amqptap/replay.h"
#include "amqptap/spec.h"
#include "amqptap/status.h"
#include "amqptap/track.h"

#include <check.h>

#include "tap_build.h"
#include "tap_check.h"
#include "tap_file.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The pcapng blocks go to a stdio file; the tap's own writer (src/io/out.c) is tested in test_out. */
static void file_write(void *ctx, const void *block, size_t len)
{
	ck_assert_uint_eq(fwrite(block, 1, len, ctx), len);
}

struct lines {
	char *v[64];
	size_t n;
};

static void collect(void *ctx, const char *json, size_t len)
{
	struct lines *l = ctx;
	ck_assert_uint_lt(l->n, 64);
	l->v[l->n] = strndup(json, len);
	l->n++;
}

static void lines_free(struct lines *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	l->n = 0;
}

static size_t count_type(const struct lines *l, const char *type)
{
	char want[64];
	snprintf(want, sizeof want, "{\"type\":\"%s\"", type);
	size_t n = 0;
	for (size_t i = 0; i < l->n; i++)
		n += strncmp(l->v[i], want, strlen(want)) == 0;
	return n;
}

static const char *find_type(const struct lines *l, const char *type)
{
	char want[64];
	snprintf(want, sizeof want, "{\"type\":\"%s\"", type);
	for (size_t i = 0; i < l->n; i++)
		if (strncmp(l->v[i], want, strlen(want)) == 0)
			return l->v[i];
	return NULL;
}

#define T0 1764411302000000
static char tmpdir[64];

/* Handshake, channel 1 in confirm mode, one mandatory publish acked 530 µs after its body, connection.close.
 * cut_at: the first client chunk written (0 = all) — earlier chunks are left out of the file, and the cut
 * chunk starts 5 bytes into its first frame. */
/* cut_at > 0: the capture starts (without the SYN) `skip` bytes into the client's chunk cut_at. */
static void write_capture(const char *path, int cut_at, size_t skip)
{
	struct tap_bytes c[16] = {{0}}, s[16] = {{0}}, a = {0};
	tap_build_raw(&c[0], "AMQP\0\0\x09\x01", 8);
	tap_build_u8(&a, 0);
	tap_build_u8(&a, 9);
	tap_build_u32(&a, 0);
	tap_build_longstr(&a, "PLAIN", 5);
	tap_build_longstr(&a, "en_US", 5);
	tap_build_method(&s[0], 0, TAP_CONNECTION_START, a.d, a.n);
	tap_build_start_ok(&c[1], NULL, "PLAIN", "\0guest\0guest", 12);
	a.n = 0;
	tap_build_u16(&a, 2047);
	tap_build_u32(&a, 131072);
	tap_build_u16(&a, 60);
	tap_build_method(&s[1], 0, TAP_CONNECTION_TUNE, a.d, a.n);
	tap_build_tune_ok_open(&c[2], "/");
	a.n = 0;
	tap_build_shortstr(&a, "");
	tap_build_method(&s[2], 0, TAP_CONNECTION_OPEN_OK, a.d, a.n);
	tap_build_method(&c[3], 1, TAP_CHANNEL_OPEN, a.d, a.n);
	a.n = 0;
	tap_build_longstr(&a, "", 0);
	tap_build_method(&s[3], 1, TAP_CHANNEL_OPEN_OK, a.d, a.n);
	tap_build_method(&c[4], 1, TAP_CONFIRM_SELECT, "\0", 1);
	tap_build_method(&s[4], 1, TAP_CONFIRM_SELECT_OK, NULL, 0);
	a.n = 0;
	tap_build_u16(&a, 0);
	tap_build_shortstr(&a, "amq.direct");
	tap_build_shortstr(&a, "q1");
	tap_build_u8(&a, 1);
	tap_build_method(&c[5], 1, TAP_BASIC_PUBLISH, a.d, a.n);
	a.n = 0;
	tap_build_u16(&a, 60);
	tap_build_u16(&a, 0);
	tap_build_u64(&a, 5);
	tap_build_u16(&a, 0x1000);
	tap_build_u8(&a, 2); /* delivery_mode 2 */
	tap_build_frame(&c[5], 2, 1, a.d, a.n);
	tap_build_frame(&c[5], 3, 1, "hello", 5);
	a.n = 0;
	tap_build_u64(&a, 1);
	tap_build_u8(&a, 0);
	tap_build_method(&s[5], 1, TAP_BASIC_ACK, a.d, a.n);
	a.n = 0;
	tap_build_u16(&a, 200);
	tap_build_shortstr(&a, "bye");
	tap_build_u16(&a, 0);
	tap_build_u16(&a, 0);
	tap_build_method(&c[6], 0, TAP_CONNECTION_CLOSE, a.d, a.n);
	tap_build_method(&s[6], 0, TAP_CONNECTION_CLOSE_OK, NULL, 0);

	FILE *out = fopen(path, "wb");
	ck_assert_ptr_nonnull(out);
	struct tap_pcapng *p = tap_pcapng_new(file_write, out);
	struct tap_pcapng_conn *cn = tap_pcapng_conn_open(p, "127.0.0.1:40000", "127.0.0.1:5672", T0);
	int64_t t = T0;
	for (int i = 0; i < 7; i++) {
		t += 1000;
		if (i >= cut_at) {
			size_t from = (cut_at && i == cut_at) ? skip : 0;
			tap_pcapng_conn_data(cn, TAP_C2S, c[i].d + from, c[i].n - from, t);
		}
		if (i >= cut_at)
			tap_pcapng_conn_data(cn, TAP_S2C, s[i].d, s[i].n, t + 530);
	}
	tap_pcapng_conn_close(cn, TAP_PCAPNG_CLIENT_FIN, t + 1000);
	tap_pcapng_free(p);
	fclose(out);
	if (cut_at) { /* drop the SYN: rewrite the file without the first three packet blocks */
		FILE *f = fopen(path, "rb");
		static uint8_t buf[1 << 16];
		size_t n = fread(buf, 1, sizeof buf, f);
		fclose(f);
		uint32_t shb, idb, len;
		memcpy(&shb, buf + 4, 4);
		memcpy(&idb, buf + shb + 4, 4);
		size_t off = shb + idb;
		for (int k = 0; k < 3; k++) {
			memcpy(&len, buf + off + 4, 4);
			off += len;
		}
		f = fopen(path, "wb");
		fwrite(buf, 1, shb + idb, f);
		fwrite(buf + off, 1, n - off, f);
		fclose(f);
	}
	for (int i = 0; i < 16; i++) {
		tap_build_free(&c[i]);
		tap_build_free(&s[i]);
	}
	tap_build_free(&a);
}

static int replay(const char *path, struct lines *l, char *err, size_t cap)
{
	struct tap_track *t = tap_track_new(NULL, collect, l);
	ck_assert_ptr_nonnull(t);
	struct tap_observer o;
	tap_observer_init(&o, t, collect, l, NULL, 0);
	struct tap_buf file;
	tap_file_slurp(path, &file);
	int rc = tap_replay_run_mem(file.data, file.len, path, 5672, &o, t, NULL, err, cap);
	tap_buf_deinit(&file);
	tap_observer_deinit(&o);
	tap_track_free(t);
	return rc;
}

START_TEST(publish_and_ack_give_the_expected_records)
{
	char path[128], err[256] = "";
	snprintf(path, sizeof path, "%s/pa.pcapng", tmpdir);
	write_capture(path, 0, 0);
	struct lines l = {0};
	ck_assert_msg(replay(path, &l, err, sizeof err) == 0, "%s", err);
	for (size_t i = 0; i < l.n; i++)
		fprintf(stderr, "%s\n", l.v[i]);
	ck_assert_uint_eq(count_type(&l, "publish"), 1);
	ck_assert_uint_eq(count_type(&l, "connection"), 2);
	ck_assert_uint_eq(count_type(&l, "decode_error"), 0);
	const char *pub = find_type(&l, "publish");
	ck_assert_ptr_nonnull(strstr(pub, "\"conn\":1,"));
	ck_assert_ptr_nonnull(strstr(pub, "\"client\":\"127.0.0.1:40000\""));
	ck_assert_ptr_nonnull(strstr(pub, "\"seq\":1,"));
	ck_assert_ptr_nonnull(strstr(pub, "\"exchange\":\"amq.direct\""));
	ck_assert_ptr_nonnull(strstr(pub, "\"routing_key\":\"q1\""));
	ck_assert_ptr_nonnull(strstr(pub, "\"mandatory\":true"));
	ck_assert_ptr_nonnull(strstr(pub, "\"delivery_mode\":2"));
	ck_assert_ptr_nonnull(strstr(pub, "\"body_size\":5"));
	ck_assert_ptr_nonnull(strstr(pub, "\"route\":\"routed\""));
	ck_assert_ptr_nonnull(strstr(pub, "\"confirm\":\"ack\""));
	ck_assert_ptr_nonnull(strstr(pub, "\"confirm_us\":530"));
	ck_assert_ptr_nonnull(strstr(pub, "\"user\":\"guest\""));
	ck_assert_ptr_null(strstr(pub, "guest\\u0000guest"));
	const char *last = l.v[l.n - 1];
	ck_assert_ptr_nonnull(strstr(last, "\"type\":\"connection\""));
	ck_assert_ptr_nonnull(strstr(last, "close"));
	lines_free(&l);
	unlink(path);
}
END_TEST

/* Packets pushed one by one (the sniff path) give the records the file gives. */
START_TEST(pushed_packets_give_the_file_records)
{
	char path[128], err[256] = "";
	snprintf(path, sizeof path, "%s/push.pcapng", tmpdir);
	write_capture(path, 0, 0);
	struct lines want = {0}, got = {0};
	ck_assert_msg(replay(path, &want, err, sizeof err) == 0, "%s", err);

	FILE *f = fopen(path, "rb");
	ck_assert_ptr_nonnull(f);
	static uint8_t buf[1 << 16];
	size_t n = fread(buf, 1, sizeof buf, f);
	fclose(f);
	struct tap_track *t = tap_track_new(NULL, collect, &got);
	struct tap_observer o;
	tap_observer_init(&o, t, collect, &got, NULL, 0);
	struct tap_replay_live *live;
	uint16_t port = 5672;
	ck_assert_int_eq(tap_replay_live_new(&live, &port, 1, 0, &o, t), 0);
	uint32_t linktype = 0;
	size_t pushed = 0;
	for (size_t off = 0; off + 12 <= n;) { /* pcapng blocks of our own writer: host byte order, µs */
		uint32_t type, len;
		memcpy(&type, buf + off, 4);
		memcpy(&len, buf + off + 4, 4);
		if (type == 1) {
			uint16_t lt;
			memcpy(&lt, buf + off + 8, 2);
			linktype = lt;
		} else if (type == 6) {
			uint32_t hi, lo, caplen;
			memcpy(&hi, buf + off + 12, 4);
			memcpy(&lo, buf + off + 16, 4);
			memcpy(&caplen, buf + off + 20, 4);
			int64_t ts = (int64_t)((uint64_t)hi << 32 | lo);
			ck_assert_int_eq(tap_replay_live_packet(live, linktype, ts, buf + off + 28, caplen, caplen), 0);
			pushed++;
		}
		off += len;
	}
	ck_assert_uint_gt(pushed, 10);
	tap_replay_live_end(live, 0, NULL);
	tap_observer_deinit(&o);
	tap_track_free(t);
	ck_assert_uint_eq(got.n, want.n);
	for (size_t i = 0; i < want.n; i++)
		ck_assert_str_eq(got.v[i], want.v[i]);
	lines_free(&want);
	lines_free(&got);
	unlink(path);
}
END_TEST

START_TEST(mid_connection_capture_resyncs)
{
	char path[128], err[256] = "";
	snprintf(path, sizeof path, "%s/mid.pcapng", tmpdir);
	write_capture(path, 2, 5); /* starts 5 bytes into tune-ok; connection.open follows */
	struct lines l = {0};
	ck_assert_msg(replay(path, &l, err, sizeof err) == 0, "%s", err);
	for (size_t i = 0; i < l.n; i++)
		fprintf(stderr, "mid: %s\n", l.v[i]);
	ck_assert_uint_eq(count_type(&l, "decode_error"), 0);
	ck_assert_uint_eq(count_type(&l, "publish"), 1);
	const char *pub = find_type(&l, "publish");
	ck_assert_ptr_nonnull(strstr(pub, "\"routing_key\":\"q1\""));
	ck_assert_ptr_nonnull(strstr(pub, "\"confirm\":\"ack\""));
	ck_assert_ptr_nonnull(strstr(pub, "\"confirm_us\":530"));
	lines_free(&l);
	unlink(path);
}
END_TEST

/* The capture starts at the basic.publish: channel 1's confirm.select was not seen, so its mode is unknown and the
 * publish is written unknown/unknown, seq null, by capture_start; the ack after it decides nothing. */
START_TEST(mid_connection_capture_mode_unknown)
{
	char path[128], err[256] = "";
	snprintf(path, sizeof path, "%s/mid5.pcapng", tmpdir);
	write_capture(path, 5, 0);
	struct lines l = {0};
	ck_assert_msg(replay(path, &l, err, sizeof err) == 0, "%s", err);
	ck_assert_uint_eq(count_type(&l, "decode_error"), 0);
	ck_assert_uint_eq(count_type(&l, "publish"), 1);
	const char *pub = find_type(&l, "publish");
	ck_assert_ptr_nonnull(strstr(pub, "\"seq\":null"));
	ck_assert_ptr_nonnull(strstr(pub, "\"route\":\"unknown\",\"confirm\":\"unknown\""));
	ck_assert_ptr_nonnull(strstr(pub, "\"reason\":{\"by\":\"capture_start\"}"));
	const char *ch = find_type(&l, "channel");
	ck_assert_ptr_nonnull(ch);
	ck_assert_ptr_nonnull(strstr(ch, "\"event\":\"mode_unknown\""));
	lines_free(&l);
	unlink(path);
}
END_TEST

START_TEST(corrupt_capture_is_reported)
{
	char err[256] = "";
	struct lines l = {0};
	/* (a capture that cannot be opened at all is the file source's: test_capfile) */
	char path[128];
	snprintf(path, sizeof path, "%s/cut.pcapng", tmpdir);
	write_capture(path, 0, 0);
	ck_assert_int_eq(truncate(path, 702), 0);
	ck_assert_int_eq(replay(path, &l, err, sizeof err), TAP_E_BAD_CAPTURE);
	ck_assert_ptr_nonnull(strstr(err, "offset"));
	/* what was before the cut is replayed; the connection ends at the end of the capture */
	ck_assert_uint_ge(count_type(&l, "connection"), 1);
	lines_free(&l);
	unlink(path);
}
END_TEST

/* Connection 1 publishes (confirm mode, no ack) and falls silent; connection 2 appears past the idle time:
 * connection 1 is closed as capture_idle (its publish unknown for that reason), not as a reset or eof. A
 * later data packet of connection 1 starts a mid-stream connection 3. */
START_TEST(idle_connection_is_closed_with_a_record)
{
	char path[128], err[256] = "";
	snprintf(path, sizeof path, "%s/idle.pcapng", tmpdir);
	struct tap_bytes cl = {0}, br = {0}, a = {0};
	tap_build_raw(&cl, "AMQP\0\0\x09\x01", 8);
	tap_build_u16(&a, 2047);
	tap_build_u32(&a, 131072);
	tap_build_u16(&a, 0);
	tap_build_method(&cl, 0, TAP_CONNECTION_TUNE_OK, a.d, a.n);
	tap_build_method(&cl, 1, TAP_CONFIRM_SELECT, "\0", 1);
	a.n = 0;
	tap_build_u16(&a, 0);
	tap_build_shortstr(&a, "");
	tap_build_shortstr(&a, "q1");
	tap_build_u8(&a, 0);
	tap_build_method(&cl, 1, TAP_BASIC_PUBLISH, a.d, a.n);
	tap_build_header(&cl, 1, 2);
	tap_build_frame(&cl, 3, 1, "hi", 2);
	tap_build_method(&br, 0, TAP_CONNECTION_CLOSE_OK, NULL, 0);
	FILE *out = fopen(path, "wb");
	ck_assert_ptr_nonnull(out);
	struct tap_pcapng *p = tap_pcapng_new(file_write, out);
	struct tap_pcapng_conn *c1 = tap_pcapng_conn_open(p, "127.0.0.1:40001", "127.0.0.1:5672", T0);
	tap_pcapng_conn_data(c1, TAP_C2S, cl.d, cl.n, T0 + 1000);
	int64_t later = T0 + TAP_CAPTURE_IDLE_US_DEFAULT + 2000;
	struct tap_pcapng_conn *c2 = tap_pcapng_conn_open(p, "127.0.0.1:40002", "127.0.0.1:5672", later);
	tap_pcapng_conn_data(c2, TAP_C2S, (const uint8_t *)"AMQP\0\0\x09\x01", 8, later);
	tap_pcapng_conn_data(c1, TAP_S2C, br.d, br.n, later + 1000);
	tap_pcapng_conn_close(c2, TAP_PCAPNG_CLIENT_FIN, later + 2000);
	tap_pcapng_conn_close(c1, TAP_PCAPNG_CLIENT_FIN, later + 3000);
	tap_pcapng_free(p);
	fclose(out);
	struct lines l = {0};
	ck_assert_msg(replay(path, &l, err, sizeof err) == 0, "%s", err);
	ck_assert_uint_eq(count_type(&l, "publish"), 1);
	const char *pub = find_type(&l, "publish");
	ck_assert_ptr_nonnull(strstr(pub, "\"conn\":1,"));
	ck_assert_ptr_nonnull(strstr(pub, "\"route\":\"unknown\""));
	ck_assert_ptr_nonnull(strstr(pub, "\"reason\":{\"by\":\"capture_idle\"}"));
	bool closed1 = false, conn3 = false;
	for (size_t i = 0; i < l.n; i++) {
		ck_assert_ptr_null(strstr(l.v[i], "reset"));
		closed1 |= strstr(l.v[i], "\"type\":\"connection\"") && strstr(l.v[i], "\"conn\":1,") &&
			   strstr(l.v[i], "\"event\":\"close\"") && strstr(l.v[i], "\"by\":\"capture_idle\"");
		conn3 |= strstr(l.v[i], "\"conn\":3,") != NULL;
	}
	ck_assert(closed1);
	ck_assert(conn3); /* the close-ok after the idle close: a new mid-stream connection */
	lines_free(&l);
	unlink(path);
	tap_build_free(&a);
	tap_build_free(&cl);
	tap_build_free(&br);
}
END_TEST

int main(void)
{
	snprintf(tmpdir, sizeof tmpdir, "/tmp/test_replay.XXXXXX");
	if (!mkdtemp(tmpdir))
		return EXIT_FAILURE;
	Suite *s = suite_create("replay");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, publish_and_ack_give_the_expected_records);
	tcase_add_test(tc, mid_connection_capture_resyncs);
	tcase_add_test(tc, mid_connection_capture_mode_unknown);
	tcase_add_test(tc, pushed_packets_give_the_file_records);
	tcase_add_test(tc, corrupt_capture_is_reported);
	tcase_add_test(tc, idle_connection_is_closed_with_a_record);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	rmdir(tmpdir);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
