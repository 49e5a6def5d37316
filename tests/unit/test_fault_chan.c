/* close-channel, return and return-after-ack in the fault rewriter (src/core/fault_chan.c, fault_return.c): the
 * rules parsed and refused; a channel closed on both sides, the peers' close-oks swallowed, the broker's frames on
 * it dropped once the client was shown the close, a reopened channel held until the broker's close-ok, crossing
 * closes answered; a Return made of the publish's own content (across chunk and frame boundaries) before its ack
 * or after it, and the cases it is skipped (too large, the broker's own Return, a nack). */
#include "amqptap/fault.h"
#include "amqptap/status.h"
#include "tap_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the parser ---- */

START_TEST(parse_channel_actions)
{
	struct tap_fault_rule r;
	char err[300] = "";
	ck_assert_int_eq(tap_fault_parse("return:every=2", &r, err, sizeof err), 0);
	ck_assert_int_eq(r.action, TAP_FAULT_RETURN);
	ck_assert_int_eq(tap_fault_parse("return-after-ack:times=1,rk=orders", &r, err, sizeof err), 0);
	ck_assert_int_eq(r.action, TAP_FAULT_RETURN_AFTER_ACK);
	ck_assert_str_eq(tap_fault_close_code_name(406), "PRECONDITION_FAILED");
	ck_assert_ptr_null(tap_fault_close_code_name(200));
}
END_TEST

static void refused(const char *spec, const char *why)
{
	struct tap_fault_rule r;
	char err[300] = "";
	ck_assert_int_eq(tap_fault_parse(spec, &r, err, sizeof err), TAP_E_USAGE);
	ck_assert_msg(strstr(err, why) != NULL, "'%s' does not say '%s'", err, why);
	ck_assert_ptr_null(strchr(err, '\n'));
}

START_TEST(parse_channel_refused)
{
	refused("close-channel:code=320", "code: expected a channel exception");
	refused("close-channel:text=", "text: expected 1 to");
	refused("nack:code=406", "code: not a parameter of nack");
	refused("return:text=x", "text: not a parameter of return");
}
END_TEST

/* ---- the rewriter ---- */

struct sink {
	char texts[64][256]; /* the acts' texts (borrowed for the call) */
	uint8_t out[2][1 << 19];
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
	s->acts[s->n_acts] = *a;
	if (a->text) {
		snprintf(s->texts[s->n_acts], sizeof s->texts[0], "%s", a->text);
		s->acts[s->n_acts].text = s->texts[s->n_acts];
	}
	s->n_acts++;
}

struct fx {
	struct tap_fault_set set;
	struct tap_fault_conn *fc;
	struct sink sink;
	struct tap_fault_io io;
};

static struct fx *fx_new(const char *rule)
{
	char err[300];
	struct fx *f = calloc(1, sizeof *f);
	ck_assert_ptr_nonnull(f);
	tap_fault_set_init(&f->set);
	struct tap_fault_rule r;
	ck_assert_msg(tap_fault_parse(rule, &r, err, sizeof err) == 0, "%s", err);
	ck_assert_int_eq(tap_fault_set_add(&f->set, &r, 0, NULL), 0);
	f->fc = tap_fault_conn_new(&f->set, 1, "127.0.0.1:40000");
	ck_assert_ptr_nonnull(f->fc);
	f->io = (struct tap_fault_io){.ctx = &f->sink, .emit = emit, .mark = on_mark, .act = on_act};
	return f;
}

static void fx_free(struct fx *f)
{
	tap_fault_conn_free(f->fc);
	free(f);
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
	if (len)
		memcpy(p + 4, args, len);
	return frame(out, 1, ch, p, 4 + len);
}

static size_t open_select(uint8_t *out, uint16_t ch)
{
	size_t k = method(out, ch, 20, 10, (const uint8_t *)"\0", 1);
	return k + method(out + k, ch, 85, 10, (const uint8_t *)"\0", 1);
}

/* A mandatory basic.publish to the default exchange, routing key "q", on ch: its content header (body_len) and
 * body frames of at most frame_body bytes each, the body's bytes 'a' + its number. */
static size_t publish(uint8_t *out, uint16_t ch, int nr, uint32_t body_len, uint32_t frame_body)
{
	static const uint8_t args[] = {0, 0, 0, 1, 'q', 1};
	size_t k = method(out, ch, 60, 40, args, sizeof args);
	uint8_t h[14] = {0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
	h[8] = (uint8_t)(body_len >> 24);
	h[9] = (uint8_t)(body_len >> 16);
	h[10] = (uint8_t)(body_len >> 8);
	h[11] = (uint8_t)body_len;
	k += frame(out + k, 2, ch, h, sizeof h);
	static uint8_t b[1 << 16];
	for (uint32_t left = body_len; left > 0;) {
		uint32_t n = left < frame_body ? left : frame_body;
		memset(b, 'a' + nr, n);
		k += frame(out + k, 3, ch, b, n);
		left -= n;
	}
	return k;
}

static size_t close_ok(uint8_t *out, uint16_t ch)
{
	return method(out, ch, 20, 41, NULL, 0);
}

static unsigned feed(struct fx *f, enum tap_dir dir, const uint8_t *p, size_t len, size_t cut)
{
	unsigned st = 0;
	for (size_t at = 0; at < len; at += cut)
		st = tap_fault_feed(f->fc, dir, p + at, at + cut < len ? cut : len - at, 0, &f->io);
	return st;
}

static size_t confirm(uint8_t *out, uint16_t ch, uint64_t tag, bool multiple)
{
	return tap_fault_confirm_frame(out, ch, false, tag, multiple, false);
}

static const uint8_t proto[8] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};

/* The channel.close frame the client is shown for a 406 with the default text. */
static size_t client_close(uint8_t *out, uint16_t ch)
{
	return tap_fault_close_method(out, 300, 20, ch, 406, "PRECONDITION_FAILED - amqptap fault injection", 60, 40);
}

static size_t broker_close(uint8_t *out, uint16_t ch)
{
	return tap_fault_close_method(out, 300, 20, ch, 200, "amqptap fault injection: close-channel", 0, 0);
}

/* close-channel on the 2nd publish of channel 1: the broker gets the stream up to its end; the 3rd publish (sent
 * before the client saw the close) is dropped, channel 2's goes on; the client is shown channel.close 406 for
 * basic.publish at once. The broker's channel.close waits for its confirm of the 2nd publish (every publish it got
 * then has its verdict); that ack is dropped (the client's channel is closed), the broker's close-ok swallowed,
 * and the client's; then channel 1 is free again. Fed in one chunk and in cuts from 1 to 41 bytes, the same. */
START_TEST(close_channel_both_sides)
{
	for (size_t cut = 1; cut <= 41; cut += cut < 8 ? 1 : 11) {
		struct fx *f = fx_new("close-channel:after=1,times=1");
		static uint8_t c[4096], want[4096], s[1024], tmp[512];
		size_t cl = 0, wl;
		memcpy(c, proto, 8);
		cl = 8 + open_select(c + 8, 1);
		cl += publish(c + cl, 1, 1, 5, 5);
		cl += publish(c + cl, 1, 2, 300, 128); /* the selected one: three body frames */
		wl = cl;
		memcpy(want, c, wl);
		cl += publish(c + cl, 1, 3, 5, 5);
		size_t other = publish(tmp, 2, 4, 5, 5); /* another channel goes on */
		memcpy(c + cl, tmp, other);
		cl += other;
		memcpy(want + wl, tmp, other);
		wl += other;
		unsigned st = feed(f, TAP_C2S, c, cl, cut);
		ck_assert(!(st & TAP_FAULT_CLIENT_WAIT));
		ck_assert_uint_eq(f->sink.n[TAP_C2S], wl);
		ck_assert_mem_eq(f->sink.out[TAP_C2S], want, wl);
		size_t sl = client_close(s, 1);
		ck_assert_uint_eq(f->sink.n[TAP_S2C], sl);
		ck_assert_mem_eq(f->sink.out[TAP_S2C], s, sl);
		ck_assert_uint_eq(f->sink.n_acts, 1);
		ck_assert_int_eq(f->sink.acts[0].action, TAP_FAULT_CLOSE_CHANNEL);
		ck_assert_uint_eq(f->sink.acts[0].seq, 2);
		ck_assert_uint_eq(f->sink.acts[0].code, 406);
		ck_assert_str_eq(f->sink.acts[0].text, "PRECONDITION_FAILED - amqptap fault injection");
		ck_assert_uint_eq(f->sink.n_marks, 3); /* 1 and 2 unconfirmed when shown, 3 sent after */
		for (int i = 0; i < 3; i++) {
			ck_assert_uint_eq(f->sink.marks[i].seq, (uint64_t)i + 1);
			ck_assert_int_eq(f->sink.marks[i].saw, TAP_FAULT_SAW_CHANNEL_CLOSED);
		}
		/* the broker: ack 1, an ack on channel 2, then ack 2: now the tap closes the broker's channel */
		size_t bl = confirm(s, 1, 1, false);
		size_t keep = bl;
		bl += confirm(s + bl, 2, 1, false);
		feed(f, TAP_S2C, s, bl, cut);
		ck_assert_uint_eq(f->sink.n[TAP_C2S], wl); /* not yet: 2 is unconfirmed */
		bl = confirm(s, 1, 2, false);
		feed(f, TAP_S2C, s, bl, cut);
		size_t closed = broker_close(want + wl, 1);
		wl += closed;
		ck_assert_uint_eq(f->sink.n[TAP_C2S], wl);
		ck_assert_mem_eq(f->sink.out[TAP_C2S] + wl - closed, want + wl - closed, closed);
		confirm(s, 2, 1, false);
		ck_assert_uint_eq(f->sink.n[TAP_S2C], client_close(tmp, 1) + 21); /* channel 2's ack only */
		ck_assert_mem_eq(f->sink.out[TAP_S2C] + client_close(tmp, 1), s, 21);
		(void)keep;
		bl = close_ok(s, 1);
		feed(f, TAP_S2C, s, bl, cut);
		ck_assert_uint_eq(f->sink.n[TAP_S2C], client_close(tmp, 1) + 21); /* swallowed */
		/* the client's close-ok: swallowed; then it opens channel 1 again, which goes on at once */
		size_t n = close_ok(tmp, 1);
		feed(f, TAP_C2S, tmp, n, cut);
		ck_assert_uint_eq(f->sink.n[TAP_C2S], wl);
		n = open_select(tmp, 1);
		st = feed(f, TAP_C2S, tmp, n, cut);
		ck_assert(!(st & TAP_FAULT_CLIENT_WAIT));
		ck_assert_uint_eq(f->sink.n[TAP_C2S], wl + n);
		ck_assert_mem_eq(f->sink.out[TAP_C2S] + wl, tmp, n);
		fx_free(f);
	}
}
END_TEST

/* The client answers and reopens the channel before the broker's close-ok: the open and everything after it wait
 * (the relay stops reading the client), and go on, in order, right after the broker's close-ok. */
START_TEST(reopened_channel_waits)
{
	for (size_t cut = 1; cut <= 64; cut = cut * 2 + 1) {
		struct fx *f = fx_new("close-channel:code=404,text=NOT_FOUND - gone,times=1");
		static uint8_t c[4096], s[1024], later[1024], tmp[512];
		size_t cl = 8 + open_select(c + 8, 1);
		memcpy(c, proto, 8);
		cl += publish(c + cl, 1, 1, 10, 4);
		unsigned st = feed(f, TAP_C2S, c, cl, cut);
		ck_assert_uint_eq(f->sink.n[TAP_C2S], cl);
		size_t shown = tap_fault_close_method(s, sizeof s, 20, 1, 404, "NOT_FOUND - gone", 60, 40);
		ck_assert_uint_eq(f->sink.n[TAP_S2C], shown);
		ck_assert_mem_eq(f->sink.out[TAP_S2C], s, shown);
		size_t ll = close_ok(later, 1);
		size_t reuse = ll;
		ll += open_select(later + ll, 1);
		ll += publish(later + ll, 1, 2, 3, 3);
		ll += publish(later + ll, 2, 3, 3, 3);
		st = feed(f, TAP_C2S, later, ll, cut);
		ck_assert(st & TAP_FAULT_CLIENT_WAIT);
		ck_assert_uint_eq(f->sink.n[TAP_C2S], cl); /* nothing yet */
		st = feed(f, TAP_C2S, later, 5, cut); /* what the relay read before it stopped waits too */
		ck_assert(st & TAP_FAULT_CLIENT_WAIT);
		size_t bl = confirm(s, 1, 1, false); /* dropped; the broker's close goes now */
		st = feed(f, TAP_S2C, s, bl, cut);
		ck_assert(st & TAP_FAULT_CLIENT_WAIT);
		size_t to_broker = cl + broker_close(tmp, 1);
		ck_assert_uint_eq(f->sink.n[TAP_C2S], to_broker);
		ck_assert_mem_eq(f->sink.out[TAP_C2S] + cl, tmp, to_broker - cl);
		bl = close_ok(s, 1);
		st = feed(f, TAP_S2C, s, bl, cut);
		ck_assert(!(st & TAP_FAULT_CLIENT_WAIT));
		ck_assert_uint_eq(f->sink.n[TAP_S2C], shown);
		ck_assert_uint_eq(f->sink.n[TAP_C2S], to_broker + (ll - reuse)); /* the 5 extra bytes: a header part */
		ck_assert_mem_eq(f->sink.out[TAP_C2S] + to_broker, later + reuse, ll - reuse);
		ck_assert_uint_eq(f->sink.n_marks, 1);
		/* the new channel 1 is a fresh one: its publish 1 is not closed, its ack passes */
		confirm(s, 1, 1, false);
		feed(f, TAP_S2C, s, 21, cut);
		ck_assert_uint_eq(f->sink.n[TAP_S2C], shown + 21);
		fx_free(f);
	}
}
END_TEST

/* The closes cross: the broker closes the channel itself (its 404 for the publish) before it confirmed it, and the
 * client closes it too before it saw the tap's close. Each gets close-ok from the tap; neither close reaches the
 * other peer, and the tap's own close is never sent (the broker's side is over). A non-confirm channel's close
 * goes to the broker at once. */
START_TEST(crossing_closes_answered)
{
	struct fx *f = fx_new("close-channel");
	static uint8_t c[2048], s[1024], tmp[512];
	size_t cl = 8 + open_select(c + 8, 1);
	memcpy(c, proto, 8);
	cl += publish(c + cl, 1, 1, 3, 3);
	feed(f, TAP_C2S, c, cl, cl);
	size_t to_broker = f->sink.n[TAP_C2S], shown = f->sink.n[TAP_S2C];
	ck_assert_uint_eq(to_broker, cl);
	size_t bl = tap_fault_close_method(s, sizeof s, 20, 1, 404, "NOT_FOUND - no exchange", 60, 40);
	feed(f, TAP_S2C, s, bl, 7);
	ck_assert_uint_eq(f->sink.n[TAP_S2C], shown); /* not shown: the client has the tap's close */
	ck_assert_uint_eq(f->sink.n[TAP_C2S], to_broker + 12);
	ck_assert_mem_eq(f->sink.out[TAP_C2S] + to_broker, tmp, close_ok(tmp, 1));
	size_t n = tap_fault_close_method(tmp, sizeof tmp, 20, 1, 200, "bye", 0, 0);
	feed(f, TAP_C2S, tmp, n, 3);
	ck_assert_uint_eq(f->sink.n[TAP_C2S], to_broker + 12);
	ck_assert_uint_eq(f->sink.n[TAP_S2C], shown + 12);
	ck_assert_mem_eq(f->sink.out[TAP_S2C] + shown, tmp, close_ok(tmp, 1));
	feed(f, TAP_C2S, tmp, close_ok(tmp, 1), 5);
	ck_assert_uint_eq(f->sink.n[TAP_C2S], to_broker + 12);
	n = open_select(tmp, 1); /* both done: channel 1 goes on at once */
	unsigned st = feed(f, TAP_C2S, tmp, n, 2);
	ck_assert(!(st & TAP_FAULT_CLIENT_WAIT));
	ck_assert_uint_eq(f->sink.n[TAP_C2S], to_broker + 12 + n);
	fx_free(f);
	/* no confirms on the channel: the broker's close right after the publish */
	f = fx_new("close-channel:text=closed by the test");
	cl = 8 + method(c + 8, 1, 20, 10, (const uint8_t *)"\0", 1);
	cl += publish(c + cl, 1, 1, 3, 3);
	feed(f, TAP_C2S, c, cl, 6);
	ck_assert_uint_eq(f->sink.n[TAP_C2S], cl + broker_close(tmp, 1));
	ck_assert_mem_eq(f->sink.out[TAP_C2S] + cl, tmp, broker_close(tmp, 1));
	n = tap_fault_close_method(tmp, sizeof tmp, 20, 1, 406, "closed by the test", 60, 40);
	ck_assert_uint_eq(f->sink.n[TAP_S2C], n);
	ck_assert_mem_eq(f->sink.out[TAP_S2C], tmp, n);
	ck_assert_uint_eq(f->sink.acts[0].seq, 0);
	fx_free(f);
}
END_TEST

/* The Return the client is shown for publish nr: basic.return 312 NO_ROUTE "" "q" then its content frames as the
 * client sent them. */
static size_t return_of(uint8_t *out, uint16_t ch, int nr, uint32_t body_len, uint32_t frame_body)
{
	static const uint8_t args[] = {1, 56, 8, 'N', 'O', '_', 'R', 'O', 'U', 'T', 'E', 0, 1, 'q'};
	size_t k = method(out, ch, 60, 50, args, sizeof args);
	static uint8_t pub[1 << 17];
	size_t pl = publish(pub, ch, nr, body_len, frame_body);
	size_t ml = 8 + 4 + 6; /* the publish's method frame */
	memcpy(out + k, pub + ml, pl - ml);
	return k + pl - ml;
}

/* return on the 2nd of 3 publishes (its body in three frames, the stream fed in small cuts): at the broker's ack 3
 * multiple the client gets the Return of the 2nd, then that ack, unchanged. */
START_TEST(return_before_ack)
{
	for (size_t cut = 1; cut <= 50; cut += 7) {
		struct fx *f = fx_new("return:after=1,times=1");
		static uint8_t c[8192], s[8192], want[8192];
		size_t cl = 8 + open_select(c + 8, 1);
		memcpy(c, proto, 8);
		for (int i = 1; i <= 3; i++)
			cl += publish(c + cl, 1, i, 1000, 400);
		feed(f, TAP_C2S, c, cl, cut);
		ck_assert_uint_eq(f->sink.n[TAP_C2S], cl);
		ck_assert_mem_eq(f->sink.out[TAP_C2S], c, cl); /* the broker gets every byte as it was */
		size_t bl = confirm(s, 1, 3, true);
		feed(f, TAP_S2C, s, bl, cut);
		size_t wl = return_of(want, 1, 2, 1000, 400);
		memcpy(want + wl, s, bl);
		wl += bl;
		ck_assert_uint_eq(f->sink.n[TAP_S2C], wl);
		ck_assert_mem_eq(f->sink.out[TAP_S2C], want, wl);
		ck_assert_uint_eq(f->sink.n_acts, 1);
		ck_assert_int_eq(f->sink.acts[0].action, TAP_FAULT_RETURN);
		ck_assert_uint_eq(f->sink.acts[0].seq, 2);
		ck_assert_ptr_null(f->sink.acts[0].skipped);
		ck_assert_uint_eq(f->sink.n_marks, 1);
		ck_assert_int_eq(f->sink.marks[0].saw, TAP_FAULT_SAW_RETURN);
		fx_free(f);
	}
}
END_TEST

/* return-after-ack: the broker's ack first, the Return right after it (a genuine-looking Return a client that
 * trusts "Returns come before their ack" would miss). */
START_TEST(return_after_ack_order)
{
	struct fx *f = fx_new("return-after-ack:every=2");
	static uint8_t c[8192], s[8192], want[8192];
	size_t cl = 8 + open_select(c + 8, 1);
	memcpy(c, proto, 8);
	for (int i = 1; i <= 4; i++)
		cl += publish(c + cl, 1, i, 20, 8);
	feed(f, TAP_C2S, c, cl, 13);
	size_t bl = confirm(s, 1, 1, false);
	bl += confirm(s + bl, 1, 2, false);
	bl += confirm(s + bl, 1, 4, true);
	feed(f, TAP_S2C, s, bl, 5);
	size_t wl = 0;
	memcpy(want, s, 42);
	wl = 42;
	wl += return_of(want + wl, 1, 2, 20, 8);
	memcpy(want + wl, s + 42, 21);
	wl += 21;
	wl += return_of(want + wl, 1, 4, 20, 8);
	ck_assert_uint_eq(f->sink.n[TAP_S2C], wl);
	ck_assert_mem_eq(f->sink.out[TAP_S2C], want, wl);
	ck_assert_uint_eq(f->sink.n_marks, 2);
	ck_assert_int_eq(f->sink.marks[0].saw, TAP_FAULT_SAW_ACK_THEN_RETURN);
	ck_assert_uint_eq(f->sink.marks[1].seq, 4);
	fx_free(f);
}
END_TEST

/* Skipped, the client seeing the broker's confirm as it came: a content over TAP_FAULT_RETURN_CONTENT_MAX, a
 * publish the broker returned itself (a Return on the channel before the ack), one the broker nacked; a publish
 * that is not mandatory is never selected. */
START_TEST(return_skipped)
{
	struct fx *f = fx_new("return");
	static uint8_t c[1 << 18], s[1024];
	size_t cl = 8 + open_select(c + 8, 1);
	memcpy(c, proto, 8);
	cl += publish(c + cl, 1, 1, TAP_FAULT_RETURN_CONTENT_MAX, 60000);
	cl += publish(c + cl, 1, 2, 10, 10);
	cl += publish(c + cl, 1, 3, 10, 10);
	static const uint8_t plain[] = {0, 0, 0, 1, 'q', 0}; /* not mandatory */
	cl += method(c + cl, 1, 60, 40, plain, sizeof plain);
	uint8_t h[14] = {0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
	cl += frame(c + cl, 2, 1, h, sizeof h);
	feed(f, TAP_C2S, c, cl, 4096);
	ck_assert_uint_eq(f->sink.n[TAP_C2S], cl);
	size_t bl = confirm(s, 1, 1, false);
	bl += method(s + bl, 1, 60, 50, (const uint8_t *)"\1\70\10NO_ROUTE\0\1q", 14); /* the broker's own Return */
	bl += frame(s + bl, 2, 1, h, sizeof h);
	bl += confirm(s + bl, 1, 2, false);
	bl += tap_fault_confirm_frame(s + bl, 1, true, 3, false, false);
	bl += confirm(s + bl, 1, 4, false);
	feed(f, TAP_S2C, s, bl, 9);
	ck_assert_uint_eq(f->sink.n[TAP_S2C], bl);
	ck_assert_mem_eq(f->sink.out[TAP_S2C], s, bl);
	ck_assert_uint_eq(f->sink.n_acts, 3);
	ck_assert_str_eq(f->sink.acts[0].skipped, "too_large");
	ck_assert_str_eq(f->sink.acts[1].skipped, "broker_returned");
	ck_assert_str_eq(f->sink.acts[2].skipped, "broker_nacked");
	ck_assert_uint_eq(f->sink.n_marks, 0);
	fx_free(f);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fault_chan");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, parse_channel_actions);
	tcase_add_test(tc, parse_channel_refused);
	tcase_add_test(tc, close_channel_both_sides);
	tcase_add_test(tc, reopened_channel_waits);
	tcase_add_test(tc, crossing_closes_answered);
	tcase_add_test(tc, return_before_ack);
	tcase_add_test(tc, return_after_ack_order);
	tcase_add_test(tc, return_skipped);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
