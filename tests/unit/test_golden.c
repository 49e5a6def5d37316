/* Golden captures (every captures/NAME.pcapng, src/DESIGN.md §6): the TCP streams extracted with the capture API and fed to tap_conn
 * observers the way replay does give exactly the committed records, and the same records however the stream bytes
 * are cut into feed calls: split in two at every byte offset (beyond 64 KiB every 97th) and one byte at a time. */
#include "amqptap/capture.h"
#include "amqptap/conn.h"
#include "amqptap/jsonl.h"
#include "amqptap/track.h"

#include <check.h>

#include "tap_check.h"
#include "tap_file.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STREAMS 64
#define SPLIT_ALL_BELOW (64u << 10)
#define SPLIT_STRIDE 97

enum ev_kind { EV_PACKET, EV_OPEN, EV_DATA, EV_CLOSE };

struct ev {
	enum ev_kind kind;
	enum tap_dir dir;
	uint64_t stream;
	int64_t ts;
	size_t off, len; /* EV_DATA: slice of struct golden.bytes */
	enum tap_capture_end how;
	char client[64], server[64];
};

/* One capture, recorded as the sequence of callbacks tap_capture_run made. */
struct golden {
	struct ev *ev;
	size_t n, cap;
	struct tap_buf bytes; /* every data slice, in delivery order */
};

static struct ev *ev_add(struct golden *g, enum ev_kind kind)
{
	if (g->n == g->cap) {
		g->cap = g->cap ? g->cap * 2 : 1024;
		g->ev = realloc(g->ev, g->cap * sizeof *g->ev);
		ck_assert_ptr_nonnull(g->ev);
	}
	struct ev *e = &g->ev[g->n++];
	memset(e, 0, sizeof *e);
	e->kind = kind;
	return e;
}

static void cb_packet(void *ctx, int64_t ts)
{
	ev_add(ctx, EV_PACKET)->ts = ts;
}

static void *cb_open(void *ctx, uint64_t stream, const char *client, const char *server, bool midstream, int64_t ts)
{
	ck_assert_msg(!midstream, "golden captures start with the SYN");
	ck_assert_uint_lt(stream, MAX_STREAMS);
	struct ev *e = ev_add(ctx, EV_OPEN);
	e->stream = stream;
	e->ts = ts;
	snprintf(e->client, sizeof e->client, "%s", client);
	snprintf(e->server, sizeof e->server, "%s", server);
	return (void *)(uintptr_t)stream;
}

static void cb_data(void *ctx, void *user, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts)
{
	struct golden *g = ctx;
	struct ev *e = ev_add(g, EV_DATA);
	e->stream = (uintptr_t)user;
	e->dir = dir;
	e->ts = ts;
	e->off = g->bytes.len;
	e->len = len;
	tap_buf_append(&g->bytes, data, len);
	ck_assert(!g->bytes.oom);
}

static void cb_gap(void *ctx, void *user, enum tap_dir dir, uint64_t missing, int64_t ts)
{
	(void)ctx, (void)user, (void)dir, (void)ts;
	ck_abort_msg("golden capture has a hole of %llu bytes", (unsigned long long)missing);
}

static void cb_close(void *ctx, void *user, enum tap_capture_end how, int64_t ts)
{
	struct ev *e = ev_add(ctx, EV_CLOSE);
	e->stream = (uintptr_t)user;
	e->how = how;
	e->ts = ts;
}

static void golden_load(struct golden *g, const char *path)
{
	memset(g, 0, sizeof *g);
	tap_buf_init(&g->bytes);
	char port_path[1024], err[256];
	snprintf(port_path, sizeof port_path, "%.*s.port", (int)(strlen(path) - strlen(".pcapng")), path);
	FILE *f = fopen(port_path, "r");
	ck_assert_msg(f != NULL, "%s missing", port_path);
	unsigned port = 0;
	ck_assert_int_eq(fscanf(f, "%u", &port), 1);
	fclose(f);
	struct tap_buf file;
	tap_file_slurp(path, &file);
	struct tap_capture *c;
	ck_assert_int_eq(tap_capture_open_mem(&c, file.data, file.len, path, err, sizeof err), 0);
	struct tap_capture_cb cb = {
		.ctx = g, .packet = cb_packet, .open = cb_open, .data = cb_data, .gap = cb_gap, .close = cb_close,
	};
	int rc = tap_capture_run(c, (uint16_t)port, &cb, err, sizeof err);
	ck_assert_msg(rc == 0, "%s: %s", path, err);
	tap_capture_free(c);
	tap_buf_deinit(&file);
}

static void golden_free(struct golden *g)
{
	free(g->ev);
	tap_buf_deinit(&g->bytes);
}

static void collect(void *ctx, const char *json, size_t len)
{
	tap_buf_append(ctx, json, len);
	tap_buf_putc(ctx, '\n');
}

enum split { SPLIT_NONE, SPLIT_AT, SPLIT_BYTES };

/* Replays the recorded callbacks into fresh observers exactly as src/core/replay.c does (the clock is the latest
 * packet time; the tracker ticks at every packet), feeding each data slice whole, cut in two at byte `at` of
 * g->bytes, or one byte at a time; every record goes to out. */
static void run(const struct golden *g, enum split how, size_t at, struct tap_buf *out)
{
	static const char *const reason[] = {
		[TAP_CAPTURE_END_CLIENT_FIN] = "client_eof",   [TAP_CAPTURE_END_SERVER_FIN] = "broker_eof",
		[TAP_CAPTURE_END_CLIENT_RST] = "client_reset", [TAP_CAPTURE_END_SERVER_RST] = "broker_reset",
		[TAP_CAPTURE_END_CAPTURE] = "capture_end",
	};
	struct tap_track_conf conf = {0};
	struct tap_track *t = tap_track_new(&conf, collect, out);
	ck_assert_ptr_nonnull(t);
	struct tap_observer o;
	tap_observer_init(&o, t, collect, out, NULL, 0);
	struct tap_conn *conn[MAX_STREAMS] = {0};
	int64_t now = 0;
	bool started = false;
	const uint8_t *bytes = (const uint8_t *)g->bytes.data;
	for (size_t i = 0; i < g->n; i++) {
		const struct ev *e = &g->ev[i];
		switch (e->kind) {
		case EV_PACKET:
			if (!started || e->ts > now)
				now = e->ts;
			started = true;
			tap_track_tick(t, now);
			break;
		case EV_OPEN: /* at its first byte, stamped with its first packet's time (as replay opens it) */
			conn[e->stream] = tap_conn_new(&o, e->stream, e->client, e->server, e->ts < now ? e->ts : now);
			ck_assert_ptr_nonnull(conn[e->stream]);
			break;
		case EV_DATA: {
			struct tap_conn *c = conn[e->stream];
			const uint8_t *p = bytes + e->off;
			if (how == SPLIT_BYTES) {
				for (size_t k = 0; k < e->len; k++)
					tap_conn_feed(c, e->dir, p + k, 1, now);
			} else if (how == SPLIT_AT && at > e->off && at < e->off + e->len) {
				tap_conn_feed(c, e->dir, p, at - e->off, now);
				tap_conn_feed(c, e->dir, bytes + at, e->off + e->len - at, now);
			} else {
				tap_conn_feed(c, e->dir, p, e->len, now);
			}
			break;
		}
		case EV_CLOSE:
			tap_conn_end(conn[e->stream], reason[e->how], now);
			conn[e->stream] = NULL;
			break;
		}
	}
	tap_track_tick(t, now);
	tap_track_shutdown(t, now);
	tap_observer_deinit(&o);
	tap_track_free(t);
	ck_assert(!out->oom);
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *p = malloc((size_t)n + 1);
	ck_assert_ptr_nonnull(p);
	ck_assert_uint_eq(fread(p, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return p;
}

/* Index of the first differing line, for the failure message. */
static size_t first_diff_line(const struct tap_buf *a, const char *b, size_t blen)
{
	size_t line = 1;
	for (size_t i = 0; i < a->len && i < blen; i++) {
		if (a->data[i] != b[i])
			return line;
		line += a->data[i] == '\n';
	}
	return line;
}

static size_t captures_n;
static char captures[32][1024];

static void find_captures(void)
{
	char dir[256];
	snprintf(dir, sizeof dir, "%s/captures", TAP_SOURCE_DIR);
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *de;
	while ((de = readdir(d)) && captures_n < 32) {
		size_t l = strlen(de->d_name);
		if (l > 7 && strcmp(de->d_name + l - 7, ".pcapng") == 0)
			snprintf(captures[captures_n++], sizeof captures[0], "%s/%s", dir, de->d_name);
	}
	closedir(d);
}

START_TEST(captures_present)
{
	ck_assert_uint_ge(captures_n, 10);
}
END_TEST

/* One capture per test index: whole feed == the committed records; every split and byte-at-a-time feed == whole. */
START_TEST(golden_capture)
{
	ck_assert_uint_lt((size_t)_i, captures_n);
	const char *path = captures[_i];
	struct golden g;
	golden_load(&g, path);
	ck_assert_uint_gt(g.bytes.len, 0);

	struct tap_buf whole, other;
	tap_buf_init(&whole);
	tap_buf_init(&other);
	run(&g, SPLIT_NONE, 0, &whole);

	char vpath[1024];
	snprintf(vpath, sizeof vpath, "%.*s.verdicts.jsonl", (int)(strlen(path) - strlen(".pcapng")), path);
	size_t vlen;
	char *want = slurp(vpath, &vlen);
	ck_assert_msg(whole.len == vlen && memcmp(whole.data, want, vlen) == 0,
		      "%s: records differ from %s at line %zu", path, vpath, first_diff_line(&whole, want, vlen));
	ck_assert_ptr_nonnull(strstr(want, "\"type\":\"publish\""));
	free(want);

	run(&g, SPLIT_BYTES, 0, &other);
	ck_assert_msg(other.len == whole.len && memcmp(other.data, whole.data, whole.len) == 0,
		      "%s: byte-at-a-time feed differs at line %zu", path, first_diff_line(&other, whole.data, whole.len));

	size_t splits = 0;
	for (size_t at = 1; at < g.bytes.len; at += at < SPLIT_ALL_BELOW ? 1 : SPLIT_STRIDE) {
		tap_buf_reset(&other);
		run(&g, SPLIT_AT, at, &other);
		ck_assert_msg(other.len == whole.len && memcmp(other.data, whole.data, whole.len) == 0,
			      "%s: split at byte %zu differs at line %zu", path, at,
			      first_diff_line(&other, whole.data, whole.len));
		splits++;
	}
	ck_assert_uint_gt(splits, 0);
	tap_buf_deinit(&whole);
	tap_buf_deinit(&other);
	golden_free(&g);
}
END_TEST

int main(void)
{
	find_captures();
	Suite *s = suite_create("golden");
	TCase *tc = tcase_create("captures");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, captures_present);
	tcase_add_loop_test(tc, golden_capture, 0, (int)captures_n);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
