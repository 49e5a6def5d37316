/* latency and bandwidth (src/core/fault_shape.c): the token bucket's arithmetic; their rules parsed and refused;
 * bytes held until due and released in order, jitter never reordering them; a rate kept over a long transfer;
 * dir= respected; the bound past which the sender is not read; rules that select another connection, or ended,
 * leave the bytes alone; one `fault` record per rule and connection. */
#include "amqptap/fault.h"
#include "amqptap/status.h"
#include "tap_check.h"

#include <stdlib.h>
#include <string.h>

/* ---- the token bucket ---- */

START_TEST(pace_bucket)
{
	struct tap_fault_pace p;
	tap_fault_pace_init(&p, 64 * 1024, 1000);
	ck_assert_uint_eq(p.burst, 655); /* 10 ms of 65536 B/s */
	ck_assert_uint_eq(tap_fault_pace_take(&p, 1000, 10000), 655); /* full at the start */
	ck_assert_uint_eq(tap_fault_pace_take(&p, 1000, 10000), 0);
	/* 655 bytes take 655 / 65536 s = 9994.5 us: due at 1000 + 9995 */
	ck_assert_int_eq(tap_fault_pace_when(&p, 1000, 10000), 1000 + 9995);
	ck_assert_uint_eq(tap_fault_pace_take(&p, 1000 + 9994, 10000), 654);
	ck_assert_int_eq(tap_fault_pace_when(&p, 1000 + 9994, 1), 1000 + 9995); /* the part of a byte earned counts */
	ck_assert_uint_eq(tap_fault_pace_take(&p, 1000 + 9995, 1), 1);
	ck_assert_int_eq(tap_fault_pace_when(&p, 5000000, 1), 5000000); /* an idle second: full again */
	ck_assert_uint_eq(tap_fault_pace_take(&p, 5000000, 100000), 655);
	/* exact over a long run: one second of 10 us steps gives the rate, no drift from rounding */
	uint64_t got = 0;
	for (int64_t t = 5000000 + 10; t <= 6000000; t += 10)
		got += tap_fault_pace_take(&p, t, 100000);
	ck_assert_uint_eq(got, 65536);
	/* a slow rate still moves: 1 KiB/s has a 10-byte bucket, and the clock never going back is tolerated */
	tap_fault_pace_init(&p, 1024, 0);
	ck_assert_uint_eq(p.burst, 10);
	ck_assert_uint_eq(tap_fault_pace_take(&p, 0, 100), 10);
	ck_assert_uint_eq(tap_fault_pace_take(&p, -5, 100), 0);
	ck_assert_int_eq(tap_fault_pace_when(&p, 0, 100), 9766); /* 10 bytes at 1024 B/s: 9765.6 us */
	tap_fault_pace_init(&p, 50, 0); /* under 100 B/s: a bucket of one byte */
	ck_assert_uint_eq(p.burst, 1);
}
END_TEST

/* ---- the rules ---- */

static void refused(const char *spec, const char *why)
{
	struct tap_fault_rule r;
	char err[300] = "";
	ck_assert_int_eq(tap_fault_parse(spec, &r, err, sizeof err), TAP_E_USAGE);
	ck_assert_msg(strstr(err, spec) != NULL, "'%s' does not name the rule", err);
	ck_assert_msg(strstr(err, why) != NULL, "'%s' does not say '%s'", err, why);
}

START_TEST(parse_rules)
{
	struct tap_fault_rule r;
	char err[300] = "";
	ck_assert_int_eq(tap_fault_parse("latency:300", &r, err, sizeof err), 0);
	ck_assert_int_eq(r.action, TAP_FAULT_LATENCY);
	ck_assert_uint_eq(r.ms, 300);
	ck_assert_uint_eq(r.jitter_ms, 0);
	ck_assert_int_eq(r.way, TAP_FAULT_BOTH);
	ck_assert_int_eq(tap_fault_parse("latency:ms=50,jitter=20,dir=up,user=guest,for=9", &r, err, sizeof err), 0);
	ck_assert_uint_eq(r.ms, 50);
	ck_assert_uint_eq(r.jitter_ms, 20);
	ck_assert_int_eq(r.way, TAP_FAULT_UP);
	ck_assert_str_eq(r.user, "guest");
	ck_assert_int_eq(tap_fault_parse("bandwidth:64", &r, err, sizeof err), 0);
	ck_assert_int_eq(r.action, TAP_FAULT_BANDWIDTH);
	ck_assert_uint_eq(r.kib, 64);
	ck_assert_int_eq(tap_fault_parse("bandwidth:kib=1,dir=down,conn=3", &r, err, sizeof err), 0);
	ck_assert_int_eq(r.way, TAP_FAULT_DOWN);
	ck_assert_uint_eq(r.conn, 3);
	ck_assert_str_eq(tap_fault_way_name(TAP_FAULT_DOWN), "down");
	ck_assert_str_eq(tap_fault_action_name(TAP_FAULT_BANDWIDTH), "bandwidth");
	refused("latency", "latency needs ms=MS");
	refused("latency:ms=0", "ms: expected milliseconds");
	refused("latency:ms=5,jitter=x", "jitter: expected milliseconds");
	refused("latency:ms=5,dir=sideways", "dir: expected up, down or both");
	refused("latency:ms=5,kib=3", "kib: not a parameter of latency");
	refused("latency:ms=5,every=2", "every: latency is not selected by publish");
	refused("latency:ms=5,channel=1", "channel: latency is not selected by publish");
	refused("bandwidth", "bandwidth needs kib=KIB");
	refused("bandwidth:kib=0", "kib: expected KiB a second");
	refused("bandwidth:kib=99999999999", "kib: expected KiB a second");
	refused("bandwidth:kib=5,jitter=1", "jitter: not a parameter of bandwidth");
	refused("bandwidth:kib=5,ms=1", "ms: not a parameter of bandwidth");
	refused("nack:dir=up", "dir: not a parameter of nack");
	refused("stall-heartbeats:channel=1", "channel: stall-heartbeats is not selected by publish");
}
END_TEST

/* ---- the rewriter under them ---- */

#define OUT_CAP (3u << 20)

struct sink {
	uint8_t *out[2];
	size_t n[2];
	struct tap_fault_act acts[8];
	size_t n_acts;
};

static void emit(void *ctx, enum tap_dir dir, const uint8_t *p, size_t len)
{
	struct sink *s = ctx;
	ck_assert_uint_gt(len, 0);
	ck_assert_uint_le(s->n[dir] + len, OUT_CAP);
	memcpy(s->out[dir] + s->n[dir], p, len);
	s->n[dir] += len;
}

static void on_act(void *ctx, const struct tap_fault_act *a)
{
	struct sink *s = ctx;
	ck_assert_uint_lt(s->n_acts, 8);
	s->acts[s->n_acts++] = *a;
}

struct fx {
	struct tap_fault_set set;
	struct tap_fault_conn *fc;
	struct sink sink;
	struct tap_fault_io io;
};

static struct fx *fx_new(const char *const *rules, uint64_t conn)
{
	char err[300];
	struct fx *f = calloc(1, sizeof *f);
	ck_assert_ptr_nonnull(f);
	tap_fault_set_init(&f->set);
	for (; *rules; rules++) {
		struct tap_fault_rule r;
		ck_assert_msg(tap_fault_parse(*rules, &r, err, sizeof err) == 0, "%s", err);
		ck_assert_int_eq(tap_fault_set_add(&f->set, &r, 0, NULL), 0);
	}
	f->fc = tap_fault_conn_new(&f->set, conn, "127.0.0.1:40000");
	ck_assert_ptr_nonnull(f->fc);
	for (int d = 0; d < 2; d++) {
		f->sink.out[d] = malloc(OUT_CAP);
		ck_assert_ptr_nonnull(f->sink.out[d]);
	}
	f->io = (struct tap_fault_io){.ctx = &f->sink, .emit = emit, .act = on_act};
	return f;
}

static void fx_free(struct fx *f)
{
	tap_fault_conn_free(f->fc);
	free(f->sink.out[0]);
	free(f->sink.out[1]);
	free(f);
}

/* A stream for direction dir: (client: the protocol header, then) body frames of `each` payload bytes on channel
 * 1, `total` bytes in all (whole frames: a bit more), their payload bytes counting up so a reordering shows. */
static size_t stream(uint8_t *out, enum tap_dir dir, size_t total, size_t each)
{
	size_t k = 0;
	if (dir == TAP_C2S) {
		memcpy(out, "AMQP\0\0\x09\x01", 8);
		k = 8;
	}
	for (uint8_t v = 0; k < total; v++) {
		out[k] = 3;
		out[k + 1] = 0;
		out[k + 2] = 1;
		out[k + 3] = (uint8_t)(each >> 24);
		out[k + 4] = (uint8_t)(each >> 16);
		out[k + 5] = (uint8_t)(each >> 8);
		out[k + 6] = (uint8_t)each;
		for (size_t i = 0; i < each; i++)
			out[k + 7 + i] = (uint8_t)(v + i);
		out[k + 7 + each] = 0xCE;
		k += 8 + each;
	}
	return k;
}

START_TEST(latency_holds_in_order)
{
	const char *rules[] = {"latency:ms=300", NULL};
	struct fx *f = fx_new(rules, 1);
	static uint8_t c[4096], b[4096];
	size_t cl = stream(c, TAP_C2S, 2000, 100), bl = stream(b, TAP_S2C, 1000, 50);
	unsigned st = tap_fault_feed(f->fc, TAP_C2S, c, 1000, 0, &f->io);
	ck_assert(st & TAP_FAULT_HOLDING);
	ck_assert_uint_eq(f->sink.n[TAP_C2S], 0);
	ck_assert_uint_eq(tap_fault_held(f->fc, TAP_C2S), 1000);
	ck_assert_int_eq(tap_fault_due(f->fc), 300000);
	tap_fault_feed(f->fc, TAP_S2C, b, bl, 100000, &f->io);
	tap_fault_feed(f->fc, TAP_C2S, c + 1000, cl - 1000, 150000, &f->io);
	ck_assert_uint_eq(f->sink.n[TAP_S2C], 0);
	tap_fault_release(f->fc, 299999, &f->io);
	ck_assert_uint_eq(f->sink.n[TAP_C2S], 0);
	st = tap_fault_release(f->fc, 300000, &f->io);
	ck_assert_uint_eq(f->sink.n[TAP_C2S], 1000); /* the first chunk only: the rest came 150 ms later */
	ck_assert_int_eq(tap_fault_due(f->fc), 400000);
	tap_fault_release(f->fc, 400000, &f->io);
	ck_assert_uint_eq(f->sink.n[TAP_S2C], bl);
	ck_assert_mem_eq(f->sink.out[TAP_S2C], b, bl);
	ck_assert_int_eq(tap_fault_due(f->fc), 450000);
	st = tap_fault_release(f->fc, 460000, &f->io);
	ck_assert(!(st & TAP_FAULT_HOLDING));
	ck_assert_int_eq(tap_fault_due(f->fc), INT64_MAX);
	ck_assert_uint_eq(f->sink.n[TAP_C2S], cl);
	ck_assert_mem_eq(f->sink.out[TAP_C2S], c, cl);
	ck_assert_uint_eq(tap_fault_held(f->fc, TAP_C2S), 0);
	/* one record for the rule on this connection, both directions */
	ck_assert_uint_eq(f->sink.n_acts, 1);
	ck_assert_int_eq(f->sink.acts[0].action, TAP_FAULT_LATENCY);
	ck_assert_uint_eq(f->sink.acts[0].ms, 300);
	ck_assert_int_eq(f->sink.acts[0].way, TAP_FAULT_BOTH);
	ck_assert_uint_eq(f->sink.acts[0].rule, 1);
	ck_assert_uint_eq(f->set.acted[TAP_FAULT_LATENCY], 1);
	fx_free(f);
}
END_TEST

START_TEST(jitter_keeps_order)
{
	const char *rules[] = {"latency:ms=100,jitter=80", NULL};
	struct fx *f = fx_new(rules, 7);
	static uint8_t c[70000];
	size_t cl = stream(c, TAP_C2S, 60000, 37);
	int64_t t = 0, seen_min = INT64_MAX, seen_max = 0;
	for (size_t at = 0; at < cl; at += 600, t += 1000) { /* a chunk a millisecond */
		size_t n = cl - at < 600 ? cl - at : 600;
		tap_fault_feed(f->fc, TAP_C2S, c + at, n, t, &f->io);
	}
	for (int64_t now = 0; tap_fault_due(f->fc) != INT64_MAX; now += 500) {
		size_t before = f->sink.n[TAP_C2S];
		tap_fault_release(f->fc, now, &f->io);
		if (f->sink.n[TAP_C2S] > before) {
			seen_min = now < seen_min ? now : seen_min;
			seen_max = now;
		}
	}
	ck_assert_uint_eq(f->sink.n[TAP_C2S], cl);
	ck_assert_mem_eq(f->sink.out[TAP_C2S], c, cl); /* the jitter never reorders */
	ck_assert_int_ge(seen_min, 20000);              /* at least ms - jitter */
	ck_assert_int_le(seen_max, (t - 1000) + 180000 + 500);
	fx_free(f);
}
END_TEST

/* bandwidth:kib=8 (8192 B/s, an 81-byte bucket) over 20 KiB: 2.5 s; never ahead of the rate. */
START_TEST(bandwidth_paces)
{
	const char *rules[] = {"bandwidth:kib=8,dir=up", NULL};
	struct fx *f = fx_new(rules, 1);
	static uint8_t c[30000], b[30000];
	size_t cl = stream(c, TAP_C2S, 20480, 1000), bl = stream(b, TAP_S2C, 20480, 1000);
	tap_fault_feed(f->fc, TAP_C2S, c, cl, 0, &f->io);
	ck_assert_uint_eq(f->sink.n[TAP_C2S], 81); /* the full bucket goes at once */
	tap_fault_feed(f->fc, TAP_S2C, b, bl, 0, &f->io);
	ck_assert_uint_eq(f->sink.n[TAP_S2C], bl); /* dir=up: the broker's bytes are not paced */
	int64_t now = 0;
	int wakeups = 0;
	while (tap_fault_due(f->fc) != INT64_MAX) {
		int64_t due = tap_fault_due(f->fc);
		ck_assert_int_gt(due, now);
		now = due;
		tap_fault_release(f->fc, now, &f->io);
		wakeups++;
		/* the bucket's size plus what the rate earned by now, never more */
		ck_assert_uint_le(f->sink.n[TAP_C2S], 81 + (uint64_t)now * 8192 / 1000000 + 1);
	}
	ck_assert_uint_eq(f->sink.n[TAP_C2S], cl);
	ck_assert_mem_eq(f->sink.out[TAP_C2S], c, cl);
	int64_t want = (int64_t)((cl - 81) * 1000000 / 8192);
	ck_assert_int_ge(now, want);
	ck_assert_int_le(now, want + 10000);
	ck_assert_int_le(wakeups, (int)(cl / 81) + 2); /* a bucket's worth a wakeup, not a byte */
	ck_assert_uint_eq(f->sink.n_acts, 1);
	ck_assert_int_eq(f->sink.acts[0].action, TAP_FAULT_BANDWIDTH);
	ck_assert_uint_eq(f->sink.acts[0].kib, 8);
	ck_assert_int_eq(f->sink.acts[0].way, TAP_FAULT_UP);
	fx_free(f);
}
END_TEST

/* latency and bandwidth on one direction: bytes wait for their due time, then go at the rate. */
START_TEST(latency_then_bandwidth)
{
	const char *rules[] = {"latency:ms=200,dir=down", "bandwidth:kib=4,dir=down", NULL};
	struct fx *f = fx_new(rules, 1);
	static uint8_t b[8192];
	size_t bl = stream(b, TAP_S2C, 4096, 500);
	tap_fault_feed(f->fc, TAP_S2C, b, bl, 0, &f->io);
	tap_fault_release(f->fc, 199999, &f->io);
	ck_assert_uint_eq(f->sink.n[TAP_S2C], 0);
	int64_t now = 0;
	while (tap_fault_due(f->fc) != INT64_MAX) {
		now = tap_fault_due(f->fc);
		tap_fault_release(f->fc, now, &f->io);
	}
	ck_assert_mem_eq(f->sink.out[TAP_S2C], b, bl);
	int64_t want = 200000 + (int64_t)((bl - 40) * 1000000 / 4096);
	ck_assert_int_ge(now, want);
	ck_assert_int_le(now, want + 10000);
	ck_assert_uint_eq(f->sink.n_acts, 2);
	fx_free(f);
}
END_TEST

/* Past TAP_FAULT_SHAPE_MAX held in a direction the relay is told to stop reading its sender, until released. */
START_TEST(bound_stops_the_sender)
{
	const char *rules[] = {"latency:ms=50", NULL};
	struct fx *f = fx_new(rules, 1);
	size_t total = TAP_FAULT_SHAPE_MAX + 70000;
	uint8_t *c = malloc(total + 70000), *b = malloc(total + 70000);
	ck_assert_ptr_nonnull(c);
	ck_assert_ptr_nonnull(b);
	size_t cl = stream(c, TAP_C2S, total, 65000), bl = stream(b, TAP_S2C, total, 65000);
	unsigned st = tap_fault_feed(f->fc, TAP_C2S, c, TAP_FAULT_SHAPE_MAX, 0, &f->io);
	ck_assert(!(st & TAP_FAULT_CLIENT_FULL));
	st = tap_fault_feed(f->fc, TAP_C2S, c + TAP_FAULT_SHAPE_MAX, cl - TAP_FAULT_SHAPE_MAX, 0, &f->io);
	ck_assert(st & TAP_FAULT_CLIENT_FULL);
	ck_assert(!(st & TAP_FAULT_FULL));
	st = tap_fault_feed(f->fc, TAP_S2C, b, bl, 1000, &f->io);
	ck_assert(st & TAP_FAULT_FULL);
	st = tap_fault_release(f->fc, 50000, &f->io);
	ck_assert(!(st & TAP_FAULT_CLIENT_FULL));
	ck_assert(st & TAP_FAULT_FULL);
	st = tap_fault_release(f->fc, 51000, &f->io);
	ck_assert(!(st & (TAP_FAULT_FULL | TAP_FAULT_HOLDING)));
	ck_assert_mem_eq(f->sink.out[TAP_C2S], c, cl);
	ck_assert_mem_eq(f->sink.out[TAP_S2C], b, bl);
	free(c);
	free(b);
	fx_free(f);
}
END_TEST

/* A rule for another connection, or one that ended (for=), leaves the bytes alone; what an ended rule held still
 * goes first. */
START_TEST(unselected_and_ended)
{
	const char *other[] = {"latency:ms=300,conn=2", "bandwidth:kib=1,client=10.0.0.1", NULL};
	struct fx *f = fx_new(other, 1);
	static uint8_t c[4096];
	size_t cl = stream(c, TAP_C2S, 3000, 100);
	unsigned st = tap_fault_feed(f->fc, TAP_C2S, c, cl, 0, &f->io);
	ck_assert(!(st & TAP_FAULT_HOLDING));
	ck_assert_uint_eq(f->sink.n[TAP_C2S], cl);
	ck_assert_uint_eq(f->sink.n_acts, 0);
	fx_free(f);

	const char *ending[] = {"latency:ms=300,for=1,client=127.0.0.1", NULL};
	f = fx_new(ending, 1);
	tap_fault_feed(f->fc, TAP_C2S, c, 1000, 900000, &f->io); /* due at 1.2 s */
	ck_assert_uint_eq(f->sink.n[TAP_C2S], 0);
	tap_fault_feed(f->fc, TAP_C2S, c + 1000, 1000, 1000000, &f->io); /* the rule ended: behind the held ones */
	ck_assert_uint_eq(f->sink.n[TAP_C2S], 0);
	tap_fault_release(f->fc, 1200000, &f->io);
	ck_assert_uint_eq(f->sink.n[TAP_C2S], 2000);
	tap_fault_feed(f->fc, TAP_C2S, c + 2000, cl - 2000, 1300000, &f->io); /* nothing held: at once */
	ck_assert_uint_eq(f->sink.n[TAP_C2S], cl);
	ck_assert_mem_eq(f->sink.out[TAP_C2S], c, cl);
	ck_assert_uint_eq(f->sink.n_acts, 1);
	fx_free(f);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fault_shape");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, pace_bucket);
	tcase_add_test(tc, parse_rules);
	tcase_add_test(tc, latency_holds_in_order);
	tcase_add_test(tc, jitter_keeps_order);
	tcase_add_test(tc, bandwidth_paces);
	tcase_add_test(tc, latency_then_bandwidth);
	tcase_add_test(tc, bound_stops_the_sender);
	tcase_add_test(tc, unselected_and_ended);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
