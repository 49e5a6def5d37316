/* The fault rules' parser and the per-connection rewriter (src/core/fault.c, fault_rw.c): rules accepted and
 * refused with one line naming them; a `multiple` ack split around a nack; withheld and delayed confirms; frames
 * held only until they are complete; a kill cutting the client's stream after its publish. */
#include "amqptap/fault.h"
#include "amqptap/status.h"
#include "tap_check.h"

#include <stdlib.h>
#include <string.h>

/* ---- the parser ---- */

START_TEST(parse_ok)
{
	struct tap_fault_rule r;
	char err[300] = "";
	ck_assert_int_eq(tap_fault_parse("nack:every=10", &r, err, sizeof err), 0);
	ck_assert_int_eq(r.action, TAP_FAULT_NACK);
	ck_assert_uint_eq(r.every, 10);
	ck_assert_str_eq(r.text, "nack:every=10");
	ck_assert_int_eq(tap_fault_parse("kill:after=500", &r, err, sizeof err), 0);
	ck_assert_int_eq(r.action, TAP_FAULT_KILL);
	ck_assert_uint_eq(r.after, 500);
	ck_assert_int_eq(r.kill_mode, TAP_FAULT_KILL_RESET);
	ck_assert_int_eq(tap_fault_parse("kill:close,after=3", &r, err, sizeof err), 0);
	ck_assert_int_eq(r.kill_mode, TAP_FAULT_KILL_CLOSE);
	ck_assert_int_eq(tap_fault_parse("withhold-confirms:every=3,conn=1", &r, err, sizeof err), 0);
	ck_assert_int_eq(r.action, TAP_FAULT_WITHHOLD);
	ck_assert_uint_eq(r.conn, 1);
	ck_assert_int_eq(tap_fault_parse("delay-confirms:250,channel=2,exchange=,rk=a.b", &r, err, sizeof err), 0);
	ck_assert_uint_eq(r.ms, 250);
	ck_assert(r.has_channel && r.channel == 2);
	ck_assert(r.has_exchange && r.exchange[0] == '\0');
	ck_assert(r.has_routing_key);
	ck_assert_str_eq(r.routing_key, "a.b");
	ck_assert_int_eq(tap_fault_parse("nack:p=0.25,seed=7,for=30,times=2,client=127.0.0.1,user=guest,vhost=/,"
	                                 "name=orders",
	                                 &r, err, sizeof err),
	                 0);
	ck_assert(r.p == 0.25);
	ck_assert_uint_eq(r.seed, 7);
	ck_assert_uint_eq(r.for_ms, 30000);
	ck_assert_uint_eq(r.times, 2);
	ck_assert_str_eq(r.client, "127.0.0.1");
	ck_assert_str_eq(r.user, "guest");
	ck_assert_str_eq(r.vhost, "/");
	ck_assert_str_eq(r.name, "orders");
	ck_assert_int_eq(tap_fault_parse("nack", &r, err, sizeof err), 0);
}
END_TEST

static void refused(const char *spec, const char *why)
{
	struct tap_fault_rule r;
	char err[300] = "";
	ck_assert_int_eq(tap_fault_parse(spec, &r, err, sizeof err), TAP_E_USAGE);
	ck_assert_msg(strstr(err, spec) != NULL, "'%s' does not name the rule", err);
	ck_assert_msg(strstr(err, why) != NULL, "'%s' does not say '%s'", err, why);
	ck_assert_ptr_null(strchr(err, '\n'));
}

START_TEST(parse_refused)
{
	refused("", "empty rule");
	refused("explode", "unknown action");
	refused("nack:", "nothing after");
	refused("nack:every=0", "every: expected a whole number >= 1");
	refused("nack:every=x", "got 'x'");
	refused("nack:every=2,every=3", "every given twice");
	refused("nack:colour=red", "unknown key 'colour'");
	refused("nack:5", "expected KEY=VALUE");
	refused("nack:ms=5", "ms: not a parameter of nack");
	refused("kill:mode=explode", "mode: expected reset or close");
	refused("delay-confirms", "delay-confirms needs ms=MS");
	refused("delay-confirms:0", "ms: expected milliseconds");
	refused("nack:p=0", "p: expected a probability");
	refused("nack:p=1.5", "p: expected a probability");
	refused("nack:seed=3", "seed: only with p=");
	refused("nack:channel=0", "channel: expected");
	refused("stall-heartbeats:every=2", "every: stall-heartbeats is not selected by publish");
	refused("nack:conn=abc", "conn: expected");
	refused("block", "block needs seconds=SECONDS");
	refused("block:seconds=0", "seconds: expected seconds from 1");
	refused("close-channel:code=200", "code: expected a channel exception");
	refused("close-channel:text=a,b", "'b': expected KEY=VALUE"); /* a comma ends the text */
}
END_TEST

START_TEST(set_ids)
{
	struct tap_fault_set s;
	struct tap_fault_rule r;
	char err[200];
	tap_fault_set_init(&s);
	ck_assert_int_eq(tap_fault_parse("nack", &r, err, sizeof err), 0);
	uint32_t a, b;
	ck_assert_int_eq(tap_fault_set_add(&s, &r, 0, &a), 0);
	ck_assert_int_eq(tap_fault_set_add(&s, &r, 0, &b), 0);
	ck_assert_uint_eq(a, 1);
	ck_assert_uint_eq(b, 2);
	ck_assert(tap_fault_set_remove(&s, 1));
	ck_assert(!tap_fault_set_remove(&s, 1));
	ck_assert_uint_eq(s.n, 1);
	ck_assert_uint_eq(s.rules[0].id, 2);
	for (int i = 1; i < TAP_FAULT_RULES_MAX; i++)
		ck_assert_int_eq(tap_fault_set_add(&s, &r, 0, NULL), 0);
	ck_assert_int_eq(tap_fault_set_add(&s, &r, 0, NULL), TAP_E_FULL);
}
END_TEST

/* ---- the rewriter ---- */

struct sink {
	uint8_t out[2][1 << 16];
	size_t n[2];
	struct tap_fault_act acts[64];
	size_t n_acts;
	struct {
		uint16_t ch;
		uint64_t seq;
		enum tap_fault_saw saw;
		uint32_t rule;
	} marks[64];
	size_t n_marks;
};

static void emit(void *ctx, enum tap_dir dir, const uint8_t *p, size_t len)
{
	struct sink *s = ctx;
	ck_assert_uint_le(s->n[dir] + len, sizeof s->out[dir]);
	memcpy(s->out[dir] + s->n[dir], p, len);
	s->n[dir] += len;
}

static void on_mark(void *ctx, uint16_t ch, uint64_t seq, enum tap_fault_saw saw, uint32_t rule)
{
	struct sink *s = ctx;
	ck_assert_uint_lt(s->n_marks, 64);
	s->marks[s->n_marks].ch = ch;
	s->marks[s->n_marks].seq = seq;
	s->marks[s->n_marks].saw = saw;
	s->marks[s->n_marks++].rule = rule;
}

static void on_act(void *ctx, const struct tap_fault_act *a)
{
	struct sink *s = ctx;
	ck_assert_uint_lt(s->n_acts, 64);
	s->acts[s->n_acts++] = *a;
}

struct fx {
	struct tap_fault_set set;
	struct tap_fault_conn *fc;
	struct sink sink;
	struct tap_fault_io io;
};

static void fx_init(struct fx *f, const char *const *rules)
{
	char err[300];
	memset(f, 0, sizeof *f);
	tap_fault_set_init(&f->set);
	for (; *rules; rules++) {
		struct tap_fault_rule r;
		ck_assert_msg(tap_fault_parse(*rules, &r, err, sizeof err) == 0, "%s", err);
		ck_assert_int_eq(tap_fault_set_add(&f->set, &r, 0, NULL), 0);
	}
	f->fc = tap_fault_conn_new(&f->set, 1, "127.0.0.1:40000");
	ck_assert_ptr_nonnull(f->fc);
	f->io = (struct tap_fault_io){.ctx = &f->sink, .emit = emit, .mark = on_mark, .act = on_act};
}

static size_t frame(uint8_t *out, uint8_t type, uint16_t ch, const uint8_t *payload, uint32_t len)
{
	out[0] = type;
	out[1] = (uint8_t)(ch >> 8);
	out[2] = (uint8_t)ch;
	out[3] = (uint8_t)(len >> 24);
	out[4] = (uint8_t)(len >> 16);
	out[5] = (uint8_t)(len >> 8);
	out[6] = (uint8_t)len;
	if (len)
		memcpy(out + 7, payload, len);
	out[7 + len] = 0xCE;
	return 8 + len;
}

static size_t method(uint8_t *out, uint16_t ch, uint16_t cls, uint16_t m, const uint8_t *args, uint32_t len)
{
	uint8_t p[512] = {(uint8_t)(cls >> 8), (uint8_t)cls, (uint8_t)(m >> 8), (uint8_t)m};
	memcpy(p + 4, args, len);
	return frame(out, 1, ch, p, 4 + len);
}

/* The client's stream: protocol header, confirm.select on channel 1, n publishes of body_len bytes each. */
static size_t client_stream(uint8_t *out, int n, uint32_t body_len)
{
	size_t k = 0;
	memcpy(out, "AMQP\0\0\x09\x01", 8);
	k += 8;
	k += method(out + k, 1, 20, 10, (const uint8_t *)"\0", 1);
	k += method(out + k, 1, 85, 10, (const uint8_t *)"\0", 1);
	for (int i = 0; i < n; i++) {
		static const uint8_t args[] = {0, 0, 0, 1, 'q', 0};
		k += method(out + k, 1, 60, 40, args, sizeof args);
		uint8_t h[14] = {0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
		h[8] = (uint8_t)(body_len >> 24);
		h[9] = (uint8_t)(body_len >> 16);
		h[10] = (uint8_t)(body_len >> 8);
		h[11] = (uint8_t)body_len;
		k += frame(out + k, 2, 1, h, sizeof h);
		if (body_len) {
			uint8_t b[256];
			memset(b, 'x', body_len);
			k += frame(out + k, 3, 1, b, body_len);
		}
	}
	return k;
}

static void feed_client(struct fx *f, int n)
{
	static uint8_t c[1 << 15];
	size_t len = client_stream(c, n, 3);
	tap_fault_feed(f->fc, TAP_C2S, c, len, 0, &f->io);
	ck_assert_uint_eq(f->sink.n[TAP_C2S], len);
	ck_assert_mem_eq(f->sink.out[TAP_C2S], c, len);
}

static size_t confirm(uint8_t *out, bool nack, uint64_t tag, bool multiple)
{
	return tap_fault_confirm_frame(out, 1, nack, tag, multiple, false);
}

/* What the client got, as a list of confirm frames (or the test fails on a frame that is not one). */
static size_t confirms_seen(const struct sink *s, uint64_t tags[], char kinds[], bool mult[], size_t cap)
{
	size_t n = 0;
	for (size_t at = 0; at < s->n[TAP_S2C]; at += 21) {
		const uint8_t *f = s->out[TAP_S2C] + at;
		ck_assert_uint_le(at + 21, s->n[TAP_S2C]);
		ck_assert_uint_eq(f[0], 1);
		ck_assert_uint_eq(f[20], 0xCE);
		ck_assert_uint_lt(n, cap);
		uint64_t t = 0;
		for (int i = 0; i < 8; i++)
			t = t << 8 | f[11 + i];
		tags[n] = t;
		kinds[n] = f[10] == 120 ? 'n' : 'a';
		mult[n] = f[19] & 1;
		n++;
	}
	return n;
}

START_TEST(multiple_ack_split_around_nack)
{
	const char *rules[] = {"nack:every=3", NULL};
	struct fx f;
	fx_init(&f, rules);
	feed_client(&f, 7);
	uint8_t a[21];
	confirm(a, false, 5, true); /* ack 1..5 multiple */
	tap_fault_feed(f.fc, TAP_S2C, a, sizeof a, 0, &f.io);
	uint64_t tags[8];
	char kinds[8];
	bool mult[8];
	size_t n = confirms_seen(&f.sink, tags, kinds, mult, 8);
	ck_assert_uint_eq(n, 3);
	ck_assert(tags[0] == 2 && kinds[0] == 'a' && mult[0]);
	ck_assert(tags[1] == 3 && kinds[1] == 'n' && !mult[1]);
	ck_assert(tags[2] == 5 && kinds[2] == 'a' && mult[2]);
	ck_assert_uint_eq(f.sink.n_acts, 1);
	ck_assert_int_eq(f.sink.acts[0].action, TAP_FAULT_NACK);
	ck_assert_uint_eq(f.sink.acts[0].seq, 3);
	ck_assert_uint_eq(f.sink.acts[0].rule, 1);
	ck_assert_uint_eq(f.sink.n_marks, 1);
	ck_assert_int_eq(f.sink.marks[0].saw, TAP_FAULT_SAW_NACK);
	/* single acks 6 and 7: 6 is selected (the 6th publish), 7 passes as it came */
	f.sink.n[TAP_S2C] = 0;
	confirm(a, false, 6, false);
	tap_fault_feed(f.fc, TAP_S2C, a, sizeof a, 0, &f.io);
	confirm(a, false, 7, false);
	tap_fault_feed(f.fc, TAP_S2C, a, sizeof a, 0, &f.io);
	n = confirms_seen(&f.sink, tags, kinds, mult, 8);
	ck_assert_uint_eq(n, 2);
	ck_assert(tags[0] == 6 && kinds[0] == 'n');
	ck_assert(tags[1] == 7 && kinds[1] == 'a');
	ck_assert_mem_eq(f.sink.out[TAP_S2C] + 21, a, 21);
	tap_fault_conn_free(f.fc);
}
END_TEST

START_TEST(nack_at_the_edges)
{
	const char *rules[] = {"nack:every=4", NULL};
	struct fx f;
	fx_init(&f, rules);
	feed_client(&f, 8);
	uint8_t a[21];
	confirm(a, false, 4, true); /* 1..4: N = M */
	tap_fault_feed(f.fc, TAP_S2C, a, sizeof a, 0, &f.io);
	confirm(a, false, 8, true); /* 5..8: N = M again */
	tap_fault_feed(f.fc, TAP_S2C, a, sizeof a, 0, &f.io);
	uint64_t tags[8];
	char kinds[8];
	bool mult[8];
	size_t n = confirms_seen(&f.sink, tags, kinds, mult, 8);
	ck_assert_uint_eq(n, 4);
	ck_assert(tags[0] == 3 && kinds[0] == 'a' && mult[0]);
	ck_assert(tags[1] == 4 && kinds[1] == 'n');
	ck_assert(tags[2] == 7 && kinds[2] == 'a' && mult[2]);
	ck_assert(tags[3] == 8 && kinds[3] == 'n');
	tap_fault_conn_free(f.fc);
}
END_TEST

START_TEST(withheld_then_one_at_a_time)
{
	const char *rules[] = {"withhold-confirms:after=1,times=1", NULL};
	struct fx f;
	fx_init(&f, rules);
	feed_client(&f, 5);
	uint8_t a[21];
	confirm(a, false, 4, true);
	tap_fault_feed(f.fc, TAP_S2C, a, sizeof a, 0, &f.io);
	confirm(a, false, 5, true);
	tap_fault_feed(f.fc, TAP_S2C, a, sizeof a, 0, &f.io);
	uint64_t tags[8];
	char kinds[8];
	bool mult[8];
	size_t n = confirms_seen(&f.sink, tags, kinds, mult, 8);
	ck_assert_uint_eq(n, 4); /* 1, (2 withheld), 3, 4, 5: none multiple after 2 */
	ck_assert(tags[0] == 1 && kinds[0] == 'a');
	ck_assert(tags[1] == 3 && !mult[1]);
	ck_assert(tags[2] == 4 && !mult[2]);
	ck_assert(tags[3] == 5 && !mult[3]);
	ck_assert_uint_eq(f.sink.n_marks, 1);
	ck_assert_uint_eq(f.sink.marks[0].seq, 2);
	ck_assert_int_eq(f.sink.marks[0].saw, TAP_FAULT_SAW_NONE);
	tap_fault_conn_free(f.fc);
}
END_TEST

START_TEST(delayed_in_order)
{
	const char *rules[] = {"delay-confirms:ms=100,every=2", NULL};
	struct fx f;
	fx_init(&f, rules);
	feed_client(&f, 3);
	uint8_t a[21], d[64];
	confirm(a, false, 1, false);
	unsigned st = tap_fault_feed(f.fc, TAP_S2C, a, sizeof a, 1000, &f.io);
	ck_assert_uint_eq(st, 0);
	ck_assert_uint_eq(f.sink.n[TAP_S2C], 21);
	confirm(a, false, 2, false); /* delayed until 101000 */
	st = tap_fault_feed(f.fc, TAP_S2C, a, sizeof a, 1000, &f.io);
	ck_assert(st & TAP_FAULT_HOLDING);
	ck_assert_int_eq(tap_fault_due(f.fc), 101000);
	size_t dl = method(d, 1, 60, 60, (const uint8_t *)"\0\0\0\0", 4); /* any later frame: held behind it */
	tap_fault_feed(f.fc, TAP_S2C, d, dl, 2000, &f.io);
	confirm(a, false, 3, false);
	tap_fault_feed(f.fc, TAP_S2C, a, sizeof a, 3000, &f.io);
	ck_assert_uint_eq(f.sink.n[TAP_S2C], 21);
	st = tap_fault_release(f.fc, 100999, &f.io);
	ck_assert(st & TAP_FAULT_HOLDING);
	ck_assert_uint_eq(f.sink.n[TAP_S2C], 21);
	st = tap_fault_release(f.fc, 101000, &f.io);
	ck_assert_uint_eq(st, 0);
	ck_assert_uint_eq(f.sink.n[TAP_S2C], 21 + 21 + dl + 21);
	ck_assert_mem_eq(f.sink.out[TAP_S2C] + 42, d, dl);
	ck_assert_mem_eq(f.sink.out[TAP_S2C] + 42 + dl, a, 21);
	ck_assert_uint_eq(f.sink.n_acts, 1);
	ck_assert_uint_eq(f.sink.acts[0].ms, 100);
	ck_assert_int_eq(tap_fault_due(f.fc), INT64_MAX);
	tap_fault_conn_free(f.fc);
}
END_TEST

/* A frame is held only until it is complete: a confirm fed a byte at a time comes out whole at its last byte; a
 * body frame streams through as its bytes arrive. */
START_TEST(held_frame_by_frame)
{
	const char *rules[] = {"nack:every=2", NULL};
	struct fx f;
	fx_init(&f, rules);
	feed_client(&f, 2);
	uint8_t a[21];
	confirm(a, false, 2, true);
	for (size_t i = 0; i < sizeof a; i++) {
		tap_fault_feed(f.fc, TAP_S2C, a + i, 1, 0, &f.io);
		ck_assert_uint_eq(f.sink.n[TAP_S2C], i + 1 < sizeof a ? 0 : 42);
	}
	uint64_t tags[4];
	char kinds[4];
	bool mult[4];
	ck_assert_uint_eq(confirms_seen(&f.sink, tags, kinds, mult, 4), 2);
	ck_assert(tags[0] == 1 && kinds[0] == 'a' && tags[1] == 2 && kinds[1] == 'n');
	/* a delivery's body: out as it comes, its header bytes included once the header is complete */
	uint8_t b[8 + 100];
	uint8_t body[100];
	memset(body, 'y', sizeof body);
	size_t bl = frame(b, 3, 1, body, sizeof body);
	f.sink.n[TAP_S2C] = 0;
	tap_fault_feed(f.fc, TAP_S2C, b, 3, 0, &f.io); /* part of the header: waits */
	ck_assert_uint_eq(f.sink.n[TAP_S2C], 0);
	tap_fault_feed(f.fc, TAP_S2C, b + 3, 20, 0, &f.io);
	ck_assert_uint_eq(f.sink.n[TAP_S2C], 23);
	tap_fault_feed(f.fc, TAP_S2C, b + 23, bl - 23, 0, &f.io);
	ck_assert_uint_eq(f.sink.n[TAP_S2C], bl);
	ck_assert_mem_eq(f.sink.out[TAP_S2C], b, bl);
	tap_fault_conn_free(f.fc);
}
END_TEST

/* Without a selected publish, both streams come out as they went in, however they are cut. */
START_TEST(unselected_unchanged)
{
	const char *rules[] = {"nack:channel=9", NULL};
	static uint8_t c[1 << 15], s[1 << 14];
	size_t cl = client_stream(c, 20, 200);
	size_t sl = 0;
	for (int i = 1; i <= 20; i++)
		sl += confirm(s + sl, false, (uint64_t)i, i % 3 == 0);
	for (size_t cut = 1; cut < 64; cut += 7) {
		struct fx f;
		fx_init(&f, rules);
		for (size_t at = 0; at < cl; at += cut)
			tap_fault_feed(f.fc, TAP_C2S, c + at, at + cut < cl ? cut : cl - at, 0, &f.io);
		for (size_t at = 0; at < sl; at += cut)
			tap_fault_feed(f.fc, TAP_S2C, s + at, at + cut < sl ? cut : sl - at, 0, &f.io);
		ck_assert_uint_eq(f.sink.n[TAP_C2S], cl);
		ck_assert_mem_eq(f.sink.out[TAP_C2S], c, cl);
		ck_assert_uint_eq(f.sink.n[TAP_S2C], sl);
		ck_assert_mem_eq(f.sink.out[TAP_S2C], s, sl);
		tap_fault_conn_free(f.fc);
	}
}
END_TEST

START_TEST(kill_cuts_after_publish)
{
	const char *rules[] = {"kill:after=2", NULL};
	struct fx f;
	fx_init(&f, rules);
	static uint8_t c[1 << 15];
	size_t cl = client_stream(c, 5, 3);
	size_t three = client_stream(c + cl, 3, 3); /* the same stream's bytes up to the end of the 3rd publish */
	unsigned st = tap_fault_feed(f.fc, TAP_C2S, c, cl, 0, &f.io);
	ck_assert(st & TAP_FAULT_KILL_ARMED);
	ck_assert(!(st & TAP_FAULT_KILL_NOW));
	ck_assert_uint_eq(f.sink.n[TAP_C2S], three);
	ck_assert_mem_eq(f.sink.out[TAP_C2S], c, three);
	ck_assert_uint_eq(f.sink.n_acts, 1);
	ck_assert_int_eq(f.sink.acts[0].action, TAP_FAULT_KILL);
	ck_assert_uint_eq(f.sink.acts[0].seq, 3);
	ck_assert_uint_eq(f.sink.acts[0].outstanding, 3);
	st = tap_fault_feed(f.fc, TAP_C2S, c, 10, 0, &f.io); /* nothing more goes to the broker */
	ck_assert_uint_eq(f.sink.n[TAP_C2S], three);
	uint8_t a[21];
	confirm(a, false, 2, true);
	st = tap_fault_feed(f.fc, TAP_S2C, a, sizeof a, 0, &f.io);
	ck_assert(!(st & TAP_FAULT_KILL_NOW));
	confirm(a, false, 3, false);
	st = tap_fault_feed(f.fc, TAP_S2C, a, sizeof a, 0, &f.io);
	ck_assert(st & TAP_FAULT_KILL_NOW);
	ck_assert_uint_eq(f.sink.n[TAP_S2C], 0); /* the client saw none of them */
	ck_assert_uint_eq(f.sink.n_marks, 3);
	tap_fault_conn_free(f.fc);
}
END_TEST

START_TEST(confirm_faults_need_confirm_mode)
{
	const char *rules[] = {"nack", NULL};
	struct fx f;
	fx_init(&f, rules);
	static uint8_t c[4096];
	size_t k = 0;
	memcpy(c, "AMQP\0\0\x09\x01", 8);
	k = 8;
	static const uint8_t args[] = {0, 0, 0, 1, 'q', 0};
	k += method(c + k, 1, 60, 40, args, sizeof args);
	tap_fault_feed(f.fc, TAP_C2S, c, k, 0, &f.io);
	ck_assert_uint_eq(f.sink.n_acts, 0);
	ck_assert_uint_eq(f.set.acted[TAP_FAULT_NACK], 0);
	tap_fault_conn_free(f.fc);
}
END_TEST

START_TEST(selectors)
{
	const char *rules[] = {"nack:client=10.0.0.1", "nack:rk=other", "nack:conn=1,rk=q,times=1", NULL};
	struct fx f;
	fx_init(&f, rules);
	feed_client(&f, 3);
	uint8_t a[21];
	confirm(a, false, 3, true);
	tap_fault_feed(f.fc, TAP_S2C, a, sizeof a, 0, &f.io);
	ck_assert_uint_eq(f.sink.n_acts, 1);
	ck_assert_uint_eq(f.sink.acts[0].rule, 3);
	ck_assert_uint_eq(f.sink.acts[0].seq, 1);
	tap_fault_conn_free(f.fc);
}
END_TEST

/* stall-heartbeats: the broker's heartbeats are kept from the client (one fault record), everything else passes. */
START_TEST(heartbeats_stalled)
{
	const char *rules[] = {"stall-heartbeats:client=127.0.0.1", NULL};
	struct fx f;
	fx_init(&f, rules);
	feed_client(&f, 1);
	uint8_t s[64], hb[8];
	size_t k = frame(hb, 8, 0, NULL, 0);
	size_t n = 0;
	memcpy(s + n, hb, k);
	n += k;
	n += confirm(s + n, false, 1, false);
	memcpy(s + n, hb, k);
	n += k;
	for (size_t i = 0; i < n; i++) /* a byte at a time: the cut falls everywhere */
		tap_fault_feed(f.fc, TAP_S2C, s + i, 1, 0, &f.io);
	ck_assert_uint_eq(f.sink.n[TAP_S2C], 21);
	ck_assert_mem_eq(f.sink.out[TAP_S2C], s + k, 21);
	ck_assert_uint_eq(f.sink.n_acts, 1);
	ck_assert_int_eq(f.sink.acts[0].action, TAP_FAULT_STALL_HEARTBEATS);
	ck_assert_uint_eq(f.set.acted[TAP_FAULT_STALL_HEARTBEATS], 1);
	tap_fault_conn_free(f.fc);
	/* another client's heartbeats pass */
	const char *other[] = {"stall-heartbeats:client=10.9.9.9", NULL};
	fx_init(&f, other);
	tap_fault_feed(f.fc, TAP_S2C, hb, k, 0, &f.io);
	ck_assert_uint_eq(f.sink.n[TAP_S2C], k);
	tap_fault_conn_free(f.fc);
}
END_TEST

/* block: the client's stream stops at the end of the selected publish (the rest waits), connection.blocked goes to
 * the client at the broker stream's next frame boundary; unblock sends connection.unblocked and the rest on. */
START_TEST(block_holds_client)
{
	const char *rules[] = {"block:seconds=3,after=1,times=1", NULL};
	struct fx f;
	fx_init(&f, rules);
	static uint8_t c[1 << 15], two[1 << 15];
	size_t cl = client_stream(c, 4, 3), tl = client_stream(two, 2, 3);
	unsigned st = tap_fault_feed(f.fc, TAP_C2S, c, cl, 0, &f.io);
	ck_assert(st & TAP_FAULT_BLOCKED);
	ck_assert_uint_eq(tap_fault_block_ms(f.fc), 3000);
	ck_assert_uint_eq(f.sink.n[TAP_C2S], tl);
	ck_assert_uint_eq(f.sink.n_acts, 1);
	ck_assert_uint_eq(f.sink.acts[0].seq, 2);
	/* no client capability was seen (no start-ok): no blocked frame, but the broker's frames pass */
	uint8_t a[21];
	confirm(a, false, 1, false);
	tap_fault_feed(f.fc, TAP_S2C, a, 10, 0, &f.io);
	tap_fault_feed(f.fc, TAP_S2C, a + 10, 11, 0, &f.io);
	ck_assert_uint_eq(f.sink.n[TAP_S2C], 21);
	st = tap_fault_unblock(f.fc, 3000000, &f.io);
	ck_assert(!(st & TAP_FAULT_BLOCKED));
	ck_assert_uint_eq(f.sink.n[TAP_C2S], cl);
	ck_assert_mem_eq(f.sink.out[TAP_C2S], c, cl);
	ck_assert_uint_eq(f.sink.n[TAP_S2C], 21);
	tap_fault_conn_free(f.fc);
}
END_TEST

/* --fault-api: a rule added while a connection is open acts on its next publishes, counted from its first look
 * (the publishes before it are not counted), with its acts in rule_acted; once removed it selects nothing more. */
START_TEST(rule_added_and_removed_at_run_time)
{
	const char *none[] = {NULL};
	struct fx f;
	fx_init(&f, none);
	static uint8_t c[1 << 15];
	size_t len2 = client_stream(c, 2, 3), len6 = client_stream(c, 6, 3), len8 = client_stream(c, 8, 3);
	tap_fault_feed(f.fc, TAP_C2S, c, len2, 0, &f.io); /* publishes 1 and 2: no rule yet */
	char err[300];
	struct tap_fault_rule r;
	ck_assert_int_eq(tap_fault_parse("nack:every=2", &r, err, sizeof err), 0);
	uint32_t id;
	ck_assert_int_eq(tap_fault_set_add(&f.set, &r, 0, &id), 0);
	tap_fault_feed(f.fc, TAP_C2S, c + len2, len6 - len2, 0, &f.io); /* 3..6: the rule's 2nd and 4th, 4 and 6 */
	uint8_t a[21];
	confirm(a, false, 6, true);
	tap_fault_feed(f.fc, TAP_S2C, a, sizeof a, 0, &f.io);
	uint64_t tags[8];
	char kinds[8];
	bool mult[8];
	size_t n = confirms_seen(&f.sink, tags, kinds, mult, 8);
	size_t nacks = 0;
	for (size_t i = 0; i < n; i++)
		if (kinds[i] == 'n') {
			ck_assert_msg(tags[i] == 4 || tags[i] == 6, "nacked %llu", (unsigned long long)tags[i]);
			nacks++;
		}
	ck_assert_uint_eq(nacks, 2);
	ck_assert_uint_eq(f.set.rule_acted[0], 2);
	ck_assert_uint_eq(f.set.acted[TAP_FAULT_NACK], 2);
	/* removed: 7 and 8 go unharmed, their ack as it came */
	ck_assert(tap_fault_set_remove(&f.set, id));
	tap_fault_feed(f.fc, TAP_C2S, c + len6, len8 - len6, 0, &f.io);
	f.sink.n[TAP_S2C] = 0;
	confirm(a, false, 8, true);
	tap_fault_feed(f.fc, TAP_S2C, a, sizeof a, 0, &f.io);
	ck_assert_uint_eq(f.sink.n[TAP_S2C], 21);
	ck_assert_mem_eq(f.sink.out[TAP_S2C], a, 21);
	ck_assert_uint_eq(f.sink.n_acts, 2);
	tap_fault_conn_free(f.fc);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fault");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, parse_ok);
	tcase_add_test(tc, parse_refused);
	tcase_add_test(tc, set_ids);
	tcase_add_test(tc, multiple_ack_split_around_nack);
	tcase_add_test(tc, nack_at_the_edges);
	tcase_add_test(tc, withheld_then_one_at_a_time);
	tcase_add_test(tc, delayed_in_order);
	tcase_add_test(tc, held_frame_by_frame);
	tcase_add_test(tc, unselected_unchanged);
	tcase_add_test(tc, kill_cuts_after_publish);
	tcase_add_test(tc, confirm_faults_need_confirm_mode);
	tcase_add_test(tc, selectors);
	tcase_add_test(tc, heartbeats_stalled);
	tcase_add_test(tc, block_holds_client);
	tcase_add_test(tc, rule_added_and_removed_at_run_time);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
