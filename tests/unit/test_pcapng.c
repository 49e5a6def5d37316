/* pcapng writer: a synthetic two-connection AMQP exchange (IPv4 and IPv6, a body split over several packets) is
 * read back with the capture reader byte for byte, and tshark must decode every AMQP frame with good checksums; the
 * head written apart makes the same file, and a second section appended reads too. */
#include "amqptap/capture.h"
#include "amqptap/jsonl.h"
#include "amqptap/pcapng.h"
#include "amqptap/spec.h"
#include "amqptap/status.h"

#include <check.h>

#include "tap_build.h"
#include "tap_check.h"
#include "tap_file.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The pcapng blocks go to a stdio file; the tap's own writer (src/io/out.c) is tested in test_out. */
static void file_write(void *ctx, const void *block, size_t len)
{
	ck_assert_uint_eq(fwrite(block, 1, len, ctx), len);
}

/* channel.open, confirm.select, basic.publish + header + body (client); the answers and basic.ack (broker). */
static void exchange(struct tap_buf *c2s, struct tap_buf *s2c, size_t body_len)
{
	struct tap_bytes c = {0}, s = {0}, a = {0}, body = {0};
	tap_build_raw(&c, "AMQP\0\0\x09\x01", 8);
	tap_build_method(&c, 1, TAP_METHOD_ID(20, 10), "\0", 1);
	tap_build_method(&s, 1, TAP_METHOD_ID(20, 11), "\0\0\0\0", 4);
	tap_build_method(&c, 1, TAP_METHOD_ID(85, 10), "\0", 1);
	tap_build_method(&s, 1, TAP_METHOD_ID(85, 11), NULL, 0);
	tap_build_u16(&a, 0);
	tap_build_shortstr(&a, "");
	tap_build_shortstr(&a, "q");
	tap_build_u8(&a, 1);
	tap_build_method(&c, 1, TAP_METHOD_ID(60, 40), a.d, a.n);
	tap_build_header(&c, 1, body_len);
	for (size_t i = 0; i < body_len; i++)
		tap_build_u8(&body, (uint8_t)('a' + i % 26));
	tap_build_frame(&c, 3, 1, body.d, body.n);
	a.n = 0;
	tap_build_u64(&a, 1);
	tap_build_u8(&a, 0);
	tap_build_method(&s, 1, TAP_METHOD_ID(60, 80), a.d, a.n);
	tap_buf_append(c2s, c.d, c.n);
	tap_buf_append(s2c, s.d, s.n);
	tap_build_free(&c);
	tap_build_free(&s);
	tap_build_free(&a);
	tap_build_free(&body);
}

struct rb {
	struct tap_buf bytes[4][2];
	char addr[4][2][64];
	int how[4];
	bool mid[4];
	size_t n;
};

static void *r_open(void *ctx, uint64_t id, const char *client, const char *server, bool midstream, int64_t ts)
{
	struct rb *r = ctx;
	(void)ts;
	ck_assert_uint_eq(id, r->n + 1);
	ck_assert_uint_lt(r->n, 4);
	size_t i = r->n++;
	snprintf(r->addr[i][1], 64, "%s", client);
	snprintf(r->addr[i][0], 64, "%s", server);
	r->mid[i] = midstream;
	r->how[i] = -1;
	return (void *)(uintptr_t)(i + 1);
}

static void r_data(void *ctx, void *user, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts)
{
	struct rb *r = ctx;
	(void)ts;
	tap_buf_append(&r->bytes[(uintptr_t)user - 1][dir], data, len);
}

static void r_close(void *ctx, void *user, enum tap_capture_end how, int64_t ts)
{
	struct rb *r = ctx;
	(void)ts;
	r->how[(uintptr_t)user - 1] = (int)how;
}

static int read_back(const char *path, struct rb *r, char *err, size_t cap)
{
	memset(r, 0, sizeof *r);
	struct tap_capture_cb cb = {.ctx = r, .open = r_open, .data = r_data, .close = r_close};
	struct tap_buf file;
	tap_file_slurp(path, &file);
	struct tap_capture *c;
	int rc = tap_capture_open_mem(&c, file.data, file.len, path, err, cap);
	if (rc == 0) {
		rc = tap_capture_run(c, 5672, &cb, err, cap);
		tap_capture_free(c);
	}
	tap_buf_deinit(&file);
	return rc;
}

static void rb_free(struct rb *r)
{
	for (int i = 0; i < 4; i++)
		for (int d = 0; d < 2; d++)
			tap_buf_deinit(&r->bytes[i][d]);
}

static char tmpdir[64];

static void write_two(const char *path, struct tap_buf want[2][2])
{
	FILE *out = fopen(path, "wb");
	ck_assert_ptr_nonnull(out);
	struct tap_pcapng *p = tap_pcapng_new(file_write, out);
	ck_assert_ptr_nonnull(p);
	int64_t t = 1764411302000000;
	struct tap_pcapng_conn *a = tap_pcapng_conn_open(p, "127.0.0.1:40000", "127.0.0.2:5672", t);
	struct tap_pcapng_conn *b = tap_pcapng_conn_open(p, "[::1]:50000", "[2001:db8::2]:5672", t + 5);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	for (int i = 0; i < 2; i++) {
		tap_buf_init(&want[i][0]);
		tap_buf_init(&want[i][1]);
	}
	exchange(&want[0][1], &want[0][0], 12);
	exchange(&want[1][1], &want[1][0], 150000); /* > TAP_PCAPNG_MAX_SEGMENT: split */
	/* Interleave the two connections, each direction in a few chunks cut at odd places, except that the first
	 * frame of each direction comes whole as in real traffic: tshark 4.0 does not reassemble a first frame split
	 * over two packets (later ones it does). */
	size_t off[2][2] = {{16, 21}, {16, 21}};
	for (int k = 0; k < 2; k++)
		for (int d = 1; d >= 0; d--)
			tap_pcapng_conn_data(k ? b : a, d, (const uint8_t *)want[k][d].data, off[k][d], t += 10);
	for (int step = 0; step < 6; step++) {
		for (int k = 0; k < 2; k++) {
			struct tap_pcapng_conn *cc = k ? b : a;
			for (int d = 1; d >= 0; d--) {
				struct tap_buf *w = &want[k][d];
				size_t n = step == 5 ? w->len - off[k][d] : (w->len / 5 + 3 * (size_t)step);
				if (off[k][d] + n > w->len)
					n = w->len - off[k][d];
				t += 100;
				tap_pcapng_conn_data(cc, d, (const uint8_t *)w->data + off[k][d], n, t);
				off[k][d] += n;
			}
		}
	}
	tap_pcapng_conn_close(a, TAP_PCAPNG_CLIENT_FIN, t + 10);
	tap_pcapng_conn_close(b, TAP_PCAPNG_CLIENT_FIN, t + 20);
	tap_pcapng_free(p);
	fclose(out);
}

START_TEST(round_trip_through_the_reader)
{
	char path[128];
	snprintf(path, sizeof path, "%s/two.pcapng", tmpdir);
	struct tap_buf want[2][2];
	write_two(path, want);
	struct rb r;
	char err[256] = "";
	ck_assert_msg(read_back(path, &r, err, sizeof err) == 0, "%s", err);
	ck_assert_uint_eq(r.n, 2);
	ck_assert_str_eq(r.addr[0][1], "127.0.0.1:40000");
	ck_assert_str_eq(r.addr[0][0], "127.0.0.2:5672");
	ck_assert_str_eq(r.addr[1][1], "[::1]:50000");
	ck_assert_str_eq(r.addr[1][0], "[2001:db8::2]:5672");
	for (int k = 0; k < 2; k++) {
		ck_assert(!r.mid[k]);
		ck_assert_int_eq(r.how[k], TAP_CAPTURE_END_CLIENT_FIN);
		for (int d = 0; d < 2; d++) {
			ck_assert_uint_eq(r.bytes[k][d].len, want[k][d].len);
			ck_assert(memcmp(r.bytes[k][d].data, want[k][d].data, want[k][d].len) == 0);
			tap_buf_deinit(&want[k][d]);
		}
	}
	rb_free(&r);
	unlink(path);
}
END_TEST

/* Only what a peer did ends a connection in the file: one the tap stopped following (it stopped, the capture ended,
 * TLS failed) gets no FIN or RST, so a replay of the file ends it with the capture, as the live records did, and
 * does not blame the client (before: a FIN from the client, read back as client_eof). */
START_TEST(an_end_no_peer_made_is_not_written)
{
	ck_assert_int_eq(tap_pcapng_end_of("client_eof"), TAP_PCAPNG_CLIENT_FIN);
	ck_assert_int_eq(tap_pcapng_end_of("broker_eof"), TAP_PCAPNG_BROKER_FIN);
	ck_assert_int_eq(tap_pcapng_end_of("client_reset"), TAP_PCAPNG_CLIENT_RST);
	ck_assert_int_eq(tap_pcapng_end_of("broker_reset"), TAP_PCAPNG_BROKER_RST);
	static const char *const tap_made[] = {"shutdown", "capture_end", "capture_idle", "client_tls_error", NULL};
	for (size_t i = 0; i < sizeof tap_made / sizeof tap_made[0]; i++)
		ck_assert_int_eq(tap_pcapng_end_of(tap_made[i]), TAP_PCAPNG_OPEN);
	char path[128];
	snprintf(path, sizeof path, "%s/open.pcapng", tmpdir);
	FILE *out = fopen(path, "wb");
	ck_assert_ptr_nonnull(out);
	struct tap_pcapng *p = tap_pcapng_new(file_write, out);
	struct tap_pcapng_conn *a = tap_pcapng_conn_open(p, "10.1.1.1:1234", "10.1.1.2:5672", 1000000);
	tap_pcapng_conn_data(a, TAP_C2S, (const uint8_t *)"AMQP\0\0\x09\x01", 8, 1000001);
	tap_pcapng_conn_close(a, tap_pcapng_end_of("shutdown"), 1000002);
	tap_pcapng_free(p);
	fclose(out);
	struct rb r;
	char err[256] = "";
	ck_assert_msg(read_back(path, &r, err, sizeof err) == 0, "%s", err);
	ck_assert_uint_eq(r.n, 1);
	ck_assert_int_eq(r.how[0], TAP_CAPTURE_END_CAPTURE);
	rb_free(&r);
	unlink(path);
}
END_TEST

/* A process killed after a flush leaves whole blocks only: the file reads cleanly up to there. */
START_TEST(flushed_prefix_is_readable)
{
	char path[128];
	snprintf(path, sizeof path, "%s/cut.pcapng", tmpdir);
	FILE *out = fopen(path, "wb");
	ck_assert_ptr_nonnull(out);
	struct tap_pcapng *p = tap_pcapng_new(file_write, out);
	struct tap_pcapng_conn *a = tap_pcapng_conn_open(p, "10.1.1.1:1234", "10.1.1.2:5672", 1000000);
	tap_pcapng_conn_data(a, TAP_C2S, (const uint8_t *)"AMQP\0\0\x09\x01", 8, 1000001);
	fflush(out);
	struct stat st;
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_int_gt(st.st_size, 0);
	struct rb r;
	char err[256] = "";
	ck_assert_msg(read_back(path, &r, err, sizeof err) == 0, "%s", err);
	ck_assert_uint_eq(r.n, 1);
	ck_assert_uint_eq(r.bytes[0][1].len, 8);
	ck_assert_int_eq(r.how[0], TAP_CAPTURE_END_CAPTURE);
	rb_free(&r);
	tap_pcapng_conn_close(a, TAP_PCAPNG_CLIENT_FIN, 1000002);
	tap_pcapng_free(p);
	fclose(out);
	/* unparsable addresses fall back to documentation addresses, still a valid stream */
	unlink(path);
	out = fopen(path, "wb");
	ck_assert_ptr_nonnull(out);
	p = tap_pcapng_new(file_write, out);
	a = tap_pcapng_conn_open(p, "unix-socket", "rabbit.example:5672", 1000000);
	tap_pcapng_conn_data(a, TAP_S2C, (const uint8_t *)"x", 1, 1000001);
	tap_pcapng_conn_close(a, TAP_PCAPNG_CLIENT_FIN, 1000002);
	tap_pcapng_free(p);
	fclose(out);
	ck_assert_msg(read_back(path, &r, err, sizeof err) == 0, "%s", err);
	ck_assert_uint_eq(r.n, 1);
	ck_assert_str_eq(r.addr[0][1], "192.0.2.1:0");
	ck_assert_str_eq(r.addr[0][0], "192.0.2.2:5672");
	rb_free(&r);
	unlink(path);
}
END_TEST

static bool have_tshark(void)
{
	return access("/usr/bin/tshark", X_OK) == 0;
}

START_TEST(tshark_decodes_every_frame)
{
	if (!have_tshark()) {
		fprintf(stderr, "tshark missing: skipping the tshark cross-check\n");
		return;
	}
	char path[128], cmd[512];
	snprintf(path, sizeof path, "%s/ts.pcapng", tmpdir);
	struct tap_buf want[2][2];
	write_two(path, want);
	for (int k = 0; k < 2; k++)
		for (int d = 0; d < 2; d++)
			tap_buf_deinit(&want[k][d]);
	/* Info column (method names), checksum verdicts (1 good, 0 bad) and any malformed-packet marker. */
	snprintf(cmd, sizeof cmd,
		 "tshark -r %s -d tcp.port==5672,amqp -o tcp.check_checksum:TRUE -o ip.check_checksum:TRUE "
		 "-T fields -e _ws.col.Info -e tcp.checksum.status -e ip.checksum.status -e _ws.malformed "
		 "-e amqp.method.method 2>/dev/null",
		 path);
	FILE *f = popen(cmd, "r");
	ck_assert_ptr_nonnull(f);
	char line[512];
	int publish = 0, ack = 0, open = 0, select = 0, bad = 0, lines = 0;
	while (fgets(line, sizeof line, f)) {
		lines++;
		char *fields[5] = {0};
		char *s = line;
		for (int i = 0; i < 5; i++) {
			fields[i] = strsep(&s, "\t\n");
			if (!fields[i])
				fields[i] = "";
		}
		for (const char *q = fields[0]; (q = strstr(q, "Basic.Publish")); q++)
			publish++;
		for (const char *q = fields[0]; (q = strstr(q, "Basic.Ack")); q++)
			ack++;
		for (const char *q = fields[0]; (q = strstr(q, "Channel.Open")); q++)
			open++;
		for (const char *q = fields[0]; (q = strstr(q, "Confirm.Select")); q++)
			select++;
		if (strcmp(fields[1], "0") == 0 || strcmp(fields[2], "0") == 0 || fields[3][0] ||
		    strstr(fields[0], "Malformed"))
			bad++, fprintf(stderr, "tshark: %s|%s|%s|%s\n", fields[0], fields[1], fields[2], fields[3]);
	}
	ck_assert_int_eq(pclose(f), 0);
	ck_assert_int_eq(bad, 0);
	ck_assert_int_eq(publish, 2);
	ck_assert_int_eq(ack, 2);
	ck_assert_int_ge(open, 4);
	ck_assert_int_ge(select, 4);
	ck_assert_int_ge(lines, 20);
	unlink(path);
}
END_TEST

/* One connection's packets through p, as the tap writes them. */
static void one_conn(struct tap_pcapng *p, const char *client, int64_t t)
{
	struct tap_pcapng_conn *a = tap_pcapng_conn_open(p, client, "10.1.1.2:5672", t);
	ck_assert_ptr_nonnull(a);
	tap_pcapng_conn_data(a, TAP_C2S, (const uint8_t *)"AMQP\0\0\x09\x01", 8, t + 1);
	tap_pcapng_conn_data(a, TAP_S2C, (const uint8_t *)"x", 1, t + 2);
	tap_pcapng_conn_close(a, TAP_PCAPNG_CLIENT_FIN, t + 3);
}

/* The proxy went on to the broker name's next address before any byte passed: the capture names that one, for
 * the whole connection (a v6 first address and a v4 second: no IPv4-mapped leftovers); once a packet is written
 * the server stays. */
START_TEST(server_moves_until_the_first_packet)
{
	char path[128];
	snprintf(path, sizeof path, "%s/moved.pcapng", tmpdir);
	FILE *out = fopen(path, "wb");
	ck_assert_ptr_nonnull(out);
	struct tap_pcapng *p = tap_pcapng_new(file_write, out);
	struct tap_pcapng_conn *a = tap_pcapng_conn_open(p, "127.0.0.1:40000", "[::1]:5672", 1000000);
	ck_assert_ptr_nonnull(a);
	tap_pcapng_conn_server(a, "127.0.0.2:5672");
	tap_pcapng_conn_data(a, TAP_C2S, (const uint8_t *)"AMQP\0\0\x09\x01", 8, 1000001);
	tap_pcapng_conn_server(a, "10.9.9.9:5672"); /* too late: ignored */
	tap_pcapng_conn_data(a, TAP_S2C, (const uint8_t *)"x", 1, 1000002);
	tap_pcapng_conn_close(a, TAP_PCAPNG_CLIENT_FIN, 1000003);
	tap_pcapng_free(p);
	fclose(out);
	struct rb r;
	char err[256];
	ck_assert_int_eq(read_back(path, &r, err, sizeof err), 0);
	ck_assert_uint_eq(r.n, 1);
	ck_assert_str_eq(r.addr[0][0], "127.0.0.2:5672");
	ck_assert_str_eq(r.addr[0][1], "127.0.0.1:40000");
	ck_assert_uint_eq(r.bytes[0][TAP_C2S].len, 8);
	ck_assert_uint_eq(r.bytes[0][TAP_S2C].len, 1);
	ck_assert(!r.mid[0]); /* the handshake is there */
	rb_free(&r);
}
END_TEST

/* tap_pcapng_head followed by a headless writer's blocks is the file tap_pcapng_new writes; the same again appended
 * is a second section (what the tap's output writes into a file that exists, or one made again), and the reader
 * and tshark read both sections. */
START_TEST(head_apart_and_a_second_section)
{
	char whole[128], apart[128];
	snprintf(whole, sizeof whole, "%s/whole.pcapng", tmpdir);
	snprintf(apart, sizeof apart, "%s/apart.pcapng", tmpdir);
	FILE *out = fopen(whole, "wb");
	ck_assert_ptr_nonnull(out);
	struct tap_pcapng *p = tap_pcapng_new(file_write, out);
	one_conn(p, "10.1.1.1:1234", 1000000);
	tap_pcapng_free(p);
	fclose(out);

	out = fopen(apart, "wb");
	ck_assert_ptr_nonnull(out);
	for (int section = 0; section < 2; section++) {
		struct tap_buf head;
		tap_buf_init(&head);
		ck_assert(tap_pcapng_head(&head));
		ck_assert_uint_eq(fwrite(head.data, 1, head.len, out), head.len);
		tap_buf_deinit(&head);
		p = tap_pcapng_new_headless(file_write, out);
		one_conn(p, section ? "10.1.1.1:1235" : "10.1.1.1:1234", 1000000 + section * 10);
		tap_pcapng_free(p);
		if (section == 0) {
			fflush(out);
			size_t a_len, b_len;
			FILE *fa = fopen(whole, "rb"), *fb = fopen(apart, "rb");
			uint8_t a[4096], b[4096];
			a_len = fread(a, 1, sizeof a, fa);
			b_len = fread(b, 1, sizeof b, fb);
			fclose(fa);
			fclose(fb);
			ck_assert_uint_eq(a_len, b_len);
			ck_assert(memcmp(a, b, a_len) == 0);
		}
	}
	fclose(out);
	struct rb r;
	char err[256] = "";
	ck_assert_msg(read_back(apart, &r, err, sizeof err) == 0, "%s", err);
	ck_assert_uint_eq(r.n, 2);
	ck_assert_str_eq(r.addr[1][1], "10.1.1.1:1235");
	ck_assert_uint_eq(r.bytes[1][1].len, 8);
	rb_free(&r);
	if (have_tshark()) {
		char cmd[700]; /* its exit status, and 9 packets of each section */
		snprintf(cmd, sizeof cmd, "tshark -r %s >%s.txt 2>/dev/null; echo $? $(wc -l <%s.txt); rm -f %s.txt",
			 apart, apart, apart, apart);
		FILE *f = popen(cmd, "r");
		ck_assert_ptr_nonnull(f);
		char line[64] = "";
		ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
		pclose(f);
		ck_assert_str_eq(line, "0 18\n");
	}
	unlink(whole);
	unlink(apart);
}
END_TEST

int main(void)
{
	snprintf(tmpdir, sizeof tmpdir, "/tmp/test_pcapng.XXXXXX");
	if (!mkdtemp(tmpdir))
		return EXIT_FAILURE;
	Suite *s = suite_create("pcapng");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, round_trip_through_the_reader);
	tcase_add_test(tc, flushed_prefix_is_readable);
	tcase_add_test(tc, an_end_no_peer_made_is_not_written);
	tcase_add_test(tc, tshark_decodes_every_frame);
	tcase_add_test(tc, head_apart_and_a_second_section);
	tcase_add_test(tc, server_moves_until_the_first_packet);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	rmdir(tmpdir);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
