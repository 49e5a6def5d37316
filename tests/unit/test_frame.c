/* Push frame decoder: a real client stream fed whole, split at every offset and byte by byte gives the same
 * events; malformed input (bad end octet, oversize, 0xFFFFFFFF size, bad type, AMQP 1.0, TLS, HTTP) fails
 * cleanly at the right offset, without allocating from the wire length, and stays stopped. */
#include "amqptap/frame.h"
#include "amqptap/jsonl.h"
#include "amqptap/spec.h"
#include "amqptap/status.h"

#include <check.h>

#include "tap_build.h"
#include "tap_check.h"
#include <stdlib.h>
#include <string.h>

static void publish(struct tap_bytes *w, uint16_t ch, const char *rk, size_t body, size_t frame_body)
{
	struct tap_bytes a = {0};
	tap_build_u16(&a, 0);
	tap_build_shortstr(&a, "x.direct");
	tap_build_shortstr(&a, rk);
	tap_build_u8(&a, 1);
	tap_build_method(w, ch, TAP_BASIC_PUBLISH, a.d, a.n);
	tap_build_free(&a);
	struct tap_bytes h = {0};
	tap_build_u16(&h, 60);
	tap_build_u16(&h, 0);
	tap_build_u64(&h, body);
	tap_build_u16(&h, 0x8000 | 0x1000 | 0x0080);
	tap_build_shortstr(&h, "text/plain");
	tap_build_u8(&h, 2);
	tap_build_shortstr(&h, "msg-1");
	tap_build_frame(w, 2, ch, h.d, (uint32_t)h.n);
	tap_build_free(&h);
	uint8_t *b = malloc(body + 1);
	for (size_t i = 0; i < body; i++)
		b[i] = (uint8_t)(i * 7 + ch);
	for (size_t off = 0; off < body; off += frame_body)
		tap_build_frame(w, 3, ch, b + off, (uint32_t)(body - off < frame_body ? body - off : frame_body));
	free(b);
}

/* A client-side stream: header, handshake methods, publishes with multi-frame bodies on two channels, an
 * empty body frame, a heartbeat. */
static void client_stream(struct tap_bytes *w)
{
	w->n = 0;
	tap_build_raw(w, "AMQP\0\0\x09\x01", 8);
	tap_build_start_ok(w, NULL, "PLAIN", "\0guest\0guest", 12);
	tap_build_tune_ok_open(w, "/");
	struct tap_bytes a = {0};
	tap_build_shortstr(&a, "");
	tap_build_method(w, 1, TAP_CHANNEL_OPEN, a.d, a.n);
	tap_build_method(w, 2, TAP_CHANNEL_OPEN, a.d, a.n);
	a.n = 0;
	tap_build_u8(&a, 0);
	tap_build_method(w, 1, TAP_CONFIRM_SELECT, a.d, a.n);
	publish(w, 1, "k1", 10000, 4000);
	tap_build_frame(w, 8, 0, NULL, 0);
	publish(w, 2, "k2", 64, 64);
	publish(w, 1, "k3", 0, 1);
	tap_build_frame(w, 3, 2, NULL, 0);
	publish(w, 2, "big", 131064 * 2 + 5, 131064);
	tap_build_free(&a);
}

/* Event log: every event's fields and payload; bodies concatenated per frame and logged at frame_end. */
struct log {
	struct tap_buf b;
	struct tap_buf body;
	unsigned events, body_frames;
};

static void log_event(struct log *l, const struct tap_frame_ev *ev)
{
	l->events++;
	if (ev->kind == TAP_EV_BODY) {
		ck_assert(ev->len > 0 || ev->frame_end);
		tap_buf_append(&l->body, ev->data, ev->len);
		if (!ev->frame_end)
			return;
		l->body_frames++;
		tap_buf_printf(&l->b, "B ch=%u size=%u off=%llu len=%zu|", ev->channel, ev->size,
			       (unsigned long long)ev->offset, l->body.len);
		ck_assert_uint_eq(l->body.len, ev->size);
		tap_buf_append(&l->b, l->body.data, l->body.len);
		tap_buf_reset(&l->body);
		return;
	}
	tap_buf_printf(&l->b, "E kind=%d ch=%u type=%u size=%u off=%llu len=%zu|", ev->kind, ev->channel, ev->type,
		       ev->size, (unsigned long long)ev->offset, ev->len);
	ck_assert_uint_eq(ev->len, ev->size);
	tap_buf_append(&l->b, ev->data, ev->len);
}

/* Feeds data in chunks of the given sizes (0 = the rest); returns the last status. */
static int feed_chunks(struct tap_frame_dec *d, const uint8_t *p, size_t n, const size_t *cuts, size_t ncuts,
		       struct log *l)
{
	size_t start = 0;
	for (size_t c = 0; c <= ncuts; c++) {
		size_t end = c < ncuts ? cuts[c] : n;
		while (start < end) {
			struct tap_frame_ev ev;
			ssize_t k = tap_frame_feed(d, p + start, end - start, &ev);
			if (k < 0)
				return (int)k;
			ck_assert(k > 0 || ev.kind != TAP_EV_NONE);
			start += (size_t)k;
			if (ev.kind != TAP_EV_NONE)
				log_event(l, &ev);
		}
	}
	return 0;
}

static void log_init(struct log *l)
{
	memset(l, 0, sizeof *l);
	tap_buf_init(&l->b);
	tap_buf_init(&l->body);
}

static void log_deinit(struct log *l)
{
	tap_buf_deinit(&l->b);
	tap_buf_deinit(&l->body);
}

START_TEST(splits_give_identical_events)
{
	struct tap_bytes w = {0};
	client_stream(&w);
	struct tap_frame_dec d;
	struct log ref;
	log_init(&ref);
	tap_frame_dec_init_client(&d);
	ck_assert_int_eq(feed_chunks(&d, w.d, w.n, NULL, 0, &ref), 0);
	ck_assert_uint_eq(tap_frame_dec_offset(&d), w.n);
	ck_assert_uint_eq(d.cap, 0); /* every frame was whole in the input: nothing buffered */
	tap_frame_dec_deinit(&d);
	/* 1 header + 6 methods + 4 publishes x (method + header) + heartbeat; 3+1+0+1+3 body frames + 1 empty */
	ck_assert_uint_eq(ref.body_frames, 3 + 1 + 1 + 3);
	ck_assert_uint_eq(ref.events, 1 + 6 + 8 + 1 + ref.body_frames);

	/* split at every byte offset (two chunks), and at every offset followed by a 3-byte chunk; one log for all
	 * (a fresh one each time had the sanitizer build map and fault in its buffers thousands of times) */
	struct log l;
	log_init(&l);
	for (size_t cut = 1; cut < w.n; cut += (cut < 2000 || w.n - cut < 2000) ? 1 : 97) {
		for (int v = 0; v < 2; v++) {
			size_t cuts[2] = {cut, cut + 3 < w.n ? cut + 3 : w.n};
			tap_buf_reset(&l.b);
			tap_buf_reset(&l.body);
			l.events = l.body_frames = 0;
			tap_frame_dec_init_client(&d);
			ck_assert_int_eq(feed_chunks(&d, w.d, w.n, cuts, v ? 2 : 1, &l), 0);
			ck_assert_msg(l.b.len == ref.b.len && memcmp(l.b.data, ref.b.data, l.b.len) == 0, "cut %zu", cut);
			tap_frame_dec_deinit(&d);
		}
	}
	log_deinit(&l);

	/* one byte at a time */
	log_init(&l);
	tap_frame_dec_init_client(&d);
	size_t *cuts = malloc(w.n * sizeof *cuts);
	for (size_t i = 0; i < w.n; i++)
		cuts[i] = i + 1;
	ck_assert_int_eq(feed_chunks(&d, w.d, w.n, cuts, w.n, &l), 0);
	ck_assert_uint_le(d.cap, 131072 - 8);
	ck_assert_uint_eq(l.b.len, ref.b.len);
	ck_assert_mem_eq(l.b.data, ref.b.data, l.b.len);
	free(cuts);
	tap_frame_dec_deinit(&d);
	log_deinit(&l);
	log_deinit(&ref);
	tap_build_free(&w);
}
END_TEST

static int feed_all(struct tap_frame_dec *d, const uint8_t *p, size_t n, unsigned *events)
{
	size_t pos = 0;
	while (pos < n) {
		struct tap_frame_ev ev;
		ssize_t k = tap_frame_feed(d, p + pos, n - pos, &ev);
		if (k < 0)
			return (int)k;
		pos += (size_t)k;
		*events += ev.kind != TAP_EV_NONE;
	}
	return 0;
}

static int feed_bytewise(struct tap_frame_dec *d, const uint8_t *p, size_t n, unsigned *events)
{
	for (size_t i = 0; i < n; i++) {
		int rc = feed_all(d, p + i, 1, events);
		if (rc < 0)
			return rc;
	}
	return 0;
}

START_TEST(protocol_headers)
{
	static const struct {
		const char *bytes;
		int rc;
		uint64_t off;
		enum tap_amqp_version version;
	} cases[] = {
		{"AMQP\0\0\x09\x01", 0, 0, TAP_AMQP_0_9_1},
		{"AMQP\x01\x01\x00\x09", 0, 0, TAP_AMQP_0_9_1},                     /* 0-9 */
		{"AMQP\x01\x01\x08\x00", 0, 0, TAP_AMQP_0_8},                       /* 0-8 */
		{"AMQP\x01\x01\x09\x01", 0, 0, TAP_AMQP_0_8},                       /* 0-8 as on the AMQP site */
		{"AMQP\x01\x01\x09\x00", TAP_E_BAD_PROTOCOL_HEADER, 7, TAP_AMQP_0_9_1},
		{"AMQP\x00\x01\x00\x00", TAP_E_BAD_PROTOCOL_HEADER, 5, TAP_AMQP_0_9_1}, /* AMQP 1.0 */
		{"AMQP\x03\x01\x00\x00", TAP_E_BAD_PROTOCOL_HEADER, 4, TAP_AMQP_0_9_1}, /* AMQP 1.0 SASL */
		{"AMQP\0\0\x09\x00", TAP_E_BAD_PROTOCOL_HEADER, 7, TAP_AMQP_0_9_1},     /* 0-9-0 */
		{"\x16\x03\x01\x02\x00\x01\x00\x01", TAP_E_BAD_PROTOCOL_HEADER, 0, TAP_AMQP_0_9_1}, /* TLS */
		{"GET / HT", TAP_E_BAD_PROTOCOL_HEADER, 0, TAP_AMQP_0_9_1},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		for (int bytewise = 0; bytewise < 2; bytewise++) {
			struct tap_frame_dec d;
			unsigned ev = 0;
			tap_frame_dec_init_client(&d);
			const uint8_t *p = (const uint8_t *)cases[i].bytes;
			int rc = bytewise ? feed_bytewise(&d, p, 8, &ev) : feed_all(&d, p, 8, &ev);
			ck_assert_msg(rc == cases[i].rc, "case %zu", i);
			if (rc < 0) {
				ck_assert_uint_eq(tap_frame_dec_error_offset(&d), cases[i].off);
				ck_assert_int_eq(tap_frame_dec_error(&d), rc);
				struct tap_frame_ev e;
				ck_assert_int_eq(tap_frame_feed(&d, p, 8, &e), TAP_E_DECODER_STOPPED);
			} else {
				ck_assert_uint_eq(ev, 1);
				/* the version tags every later event */
				const uint8_t hb[] = {8, 0, 0, 0, 0, 0, 0, 0xCE};
				struct tap_frame_ev e;
				ck_assert_int_eq(tap_frame_feed(&d, hb, sizeof hb, &e), 8);
				ck_assert_int_eq(e.kind, TAP_EV_HEARTBEAT);
				ck_assert_int_eq(e.version, cases[i].version);
				enum tap_amqp_version v = TAP_AMQP_0_9_1;
				ck_assert_ptr_nonnull(tap_frame_protocol(p, &v));
				ck_assert_int_eq(v, cases[i].version);
			}
			tap_frame_dec_deinit(&d);
		}
	/* the broker side: a version header answering a bad client header is an event; frames otherwise */
	struct tap_frame_dec d;
	struct tap_frame_ev e;
	tap_frame_dec_init(&d);
	ck_assert_int_eq(tap_frame_feed(&d, (const uint8_t *)"AMQP\0\0\x09\x01", 8, &e), 8);
	ck_assert_int_eq(e.kind, TAP_EV_PROTOCOL_HEADER);
	ck_assert_mem_eq(e.data, "AMQP\0\0\x09\x01", 8);
	tap_frame_dec_deinit(&d);
	tap_frame_dec_init(&d);
	const uint8_t hb[] = {8, 0, 0, 0, 0, 0, 0, 0xCE};
	ck_assert_int_eq(tap_frame_feed(&d, hb, sizeof hb, &e), 8);
	ck_assert_int_eq(e.kind, TAP_EV_HEARTBEAT);
	tap_frame_dec_deinit(&d);
}
END_TEST

START_TEST(bad_end_octet)
{
	struct tap_bytes w = {0};
	tap_build_raw(&w, "AMQP\0\0\x09\x01", 8);
	uint8_t payload[] = {0, 20, 0, 41};
	tap_build_frame(&w, 1, 1, payload, 4);
	w.d[w.n - 1] = 0xCD;
	for (int bytewise = 0; bytewise < 2; bytewise++) {
		struct tap_frame_dec d;
		unsigned ev = 0;
		tap_frame_dec_init_client(&d);
		int rc = bytewise ? feed_bytewise(&d, w.d, w.n, &ev) : feed_all(&d, w.d, w.n, &ev);
		ck_assert_int_eq(rc, TAP_E_BAD_FRAME_END);
		ck_assert_uint_eq(ev, 1);
		ck_assert_uint_eq(tap_frame_dec_error_offset(&d), w.n - 1);
		tap_frame_dec_deinit(&d);
	}
	/* on a body frame, split before and after its end octet */
	w.n = 0;
	tap_build_frame(&w, 3, 1, "hello", 5);
	w.d[w.n - 1] = 0;
	for (size_t cut = 1; cut < w.n; cut++) {
		struct tap_frame_dec d;
		unsigned ev = 0;
		tap_frame_dec_init(&d);
		int rc = feed_all(&d, w.d, cut, &ev);
		ck_assert_int_eq(rc, 0);
		rc = feed_all(&d, w.d + cut, w.n - cut, &ev);
		ck_assert_int_eq(rc, TAP_E_BAD_FRAME_END);
		ck_assert_uint_eq(tap_frame_dec_error_offset(&d), w.n - 1);
		tap_frame_dec_deinit(&d);
	}
	tap_build_free(&w);
}
END_TEST

/* A 7-byte frame header, valid until the next call. */
static const uint8_t *header(uint8_t type, uint16_t ch, uint32_t size)
{
	static struct tap_bytes h;
	h.n = 0;
	tap_build_u8(&h, type);
	tap_build_u16(&h, ch);
	tap_build_u32(&h, size);
	return h.d;
}

START_TEST(frame_max_bound)
{
	struct tap_frame_dec d;
	unsigned ev = 0;
	/* default 131072: payload 131064 plus RabbitMQ's 8-byte fudge is the largest allowed */
	tap_frame_dec_init(&d);
	ck_assert_int_eq(feed_all(&d, header(1, 1, 131072), 7, &ev), 0);
	ck_assert_uint_le(d.cap, 131072);
	tap_frame_dec_deinit(&d);
	tap_frame_dec_init(&d);
	ck_assert_int_eq(feed_all(&d, header(1, 1, 131073), 7, &ev), TAP_E_FRAME_TOO_LARGE);
	ck_assert_uint_eq(d.cap, 0);
	ck_assert_uint_eq(tap_frame_dec_error_offset(&d), 0);
	tap_frame_dec_deinit(&d);
	/* negotiated 4096, for bodies too */
	tap_frame_dec_init(&d);
	tap_frame_dec_set_frame_max(&d, 4096);
	ck_assert_int_eq(feed_all(&d, header(3, 1, 4096), 7, &ev), 0);
	tap_frame_dec_deinit(&d);
	tap_frame_dec_init(&d);
	tap_frame_dec_set_frame_max(&d, 4096);
	ck_assert_int_eq(feed_bytewise(&d, header(3, 1, 4097), 7, &ev), TAP_E_FRAME_TOO_LARGE);
	tap_frame_dec_deinit(&d);
}
END_TEST

/* A negotiated frame_max of 4 GB does not let a method or header frame size the decoder's buffer: above
 * TAP_FRAME_BUFFER_MAX it is TAP_E_FRAME_TOO_LARGE, below it the buffer grows with the bytes that came, on both
 * paths. */
START_TEST(huge_frame_max_does_not_size_the_buffer)
{
	struct tap_frame_dec d;
	unsigned ev = 0;
	for (uint8_t type = 1; type <= 2; type++) {
		tap_frame_dec_init(&d);
		tap_frame_dec_set_frame_max(&d, 0xFFFFFFF0u);
		ck_assert_int_eq(feed_all(&d, header(type, 1, TAP_FRAME_BUFFER_MAX + 1), 7, &ev), TAP_E_FRAME_TOO_LARGE);
		tap_frame_dec_deinit(&d);
		tap_frame_dec_init(&d);
		tap_frame_dec_set_frame_max(&d, 0xFFFFFFF0u);
		ck_assert_int_eq(feed_all(&d, header(type, 1, TAP_FRAME_BUFFER_MAX), 7, &ev), 0);
		ck_assert_uint_eq(d.cap, 0);
		ck_assert_int_eq(feed_all(&d, (const uint8_t *)"\0\x0a\0\x32\0\0", 6, &ev), 0);
		ck_assert_uint_le(d.cap, 512);
		tap_frame_dec_deinit(&d);
	}
	/* the fast path agrees: a whole method frame above the bound in one input */
	size_t n = TAP_FRAME_OVERHEAD + TAP_FRAME_BUFFER_MAX + 1;
	uint8_t *big = calloc(1, n);
	memcpy(big, header(1, 1, TAP_FRAME_BUFFER_MAX + 1), 7);
	big[n - 1] = 0xCE;
	tap_frame_dec_init(&d);
	tap_frame_dec_set_frame_max(&d, 0);
	ck_assert_int_eq(feed_all(&d, big, n, &ev), TAP_E_FRAME_TOO_LARGE);
	tap_frame_dec_deinit(&d);
	free(big);
}
END_TEST

/* size 0xFFFFFFFF: an error, or (bodies, frame_max 0) waiting without buffering anything. */
START_TEST(size_ffffffff)
{
	struct tap_frame_dec d;
	unsigned ev = 0;
	uint8_t junk[4096];
	memset(junk, 0x5a, sizeof junk);
	for (uint8_t type = 1; type <= 3; type++) {
		tap_frame_dec_init(&d);
		ck_assert_int_eq(feed_all(&d, header(type, 1, 0xFFFFFFFF), 7, &ev), TAP_E_FRAME_TOO_LARGE);
		ck_assert_uint_eq(d.cap, 0);
		tap_frame_dec_deinit(&d);
		tap_frame_dec_init(&d);
		tap_frame_dec_set_frame_max(&d, 0);
		int rc = feed_all(&d, header(type, 1, 0xFFFFFFFF), 7, &ev);
		if (type == 3) {
			ck_assert_int_eq(rc, 0);
			for (int i = 0; i < 64; i++)
				ck_assert_int_eq(feed_all(&d, junk, sizeof junk, &ev), 0);
			ck_assert_uint_eq(d.cap, 0);
		} else {
			ck_assert_int_eq(rc, TAP_E_FRAME_TOO_LARGE);
			ck_assert_uint_eq(d.cap, 0);
		}
		tap_frame_dec_deinit(&d);
	}
}
END_TEST

START_TEST(bad_type_and_heartbeat)
{
	struct tap_frame_dec d;
	unsigned ev = 0;
	const uint8_t types[] = {0, 4, 5, 9, 'A', 0xCE, 0xFF};
	for (size_t i = 0; i < sizeof types; i++) {
		uint8_t f[8] = {types[i], 0, 0, 0, 0, 0, 0, 0xCE};
		tap_frame_dec_init(&d);
		uint8_t hb[8] = {8, 0, 0, 0, 0, 0, 0, 0xCE};
		ck_assert_int_eq(feed_all(&d, hb, 8, &ev), 0);
		ck_assert_int_eq(feed_all(&d, f, 8, &ev), TAP_E_BAD_FRAME_TYPE);
		ck_assert_uint_eq(tap_frame_dec_error_offset(&d), 8);
		struct tap_frame_ev e;
		ck_assert_int_eq(tap_frame_feed(&d, hb, 8, &e), TAP_E_DECODER_STOPPED);
		tap_frame_dec_deinit(&d);
	}
	uint8_t hb_ch[8] = {8, 0, 1, 0, 0, 0, 0, 0xCE};
	tap_frame_dec_init(&d);
	ck_assert_int_eq(feed_all(&d, hb_ch, 8, &ev), TAP_E_BAD_HEARTBEAT);
	tap_frame_dec_deinit(&d);
	uint8_t hb_len[9] = {8, 0, 0, 0, 0, 0, 1, 0, 0xCE};
	tap_frame_dec_init(&d);
	ck_assert_int_eq(feed_all(&d, hb_len, 9, &ev), TAP_E_BAD_HEARTBEAT);
	tap_frame_dec_deinit(&d);
}
END_TEST

/* Bodies are slices of the caller's input, never copies; a body ending exactly at the end of the input
 * is followed by an empty frame_end slice. */
START_TEST(body_slices_point_into_input)
{
	struct tap_bytes w = {0};
	tap_build_frame(&w, 3, 7, "0123456789", 10);
	struct tap_frame_dec d;
	struct tap_frame_ev e;
	tap_frame_dec_init(&d);
	ck_assert_int_eq(tap_frame_feed(&d, w.d, 4, &e), 4); /* header only */
	ck_assert_int_eq(e.kind, TAP_EV_NONE);
	ck_assert_int_eq(tap_frame_feed(&d, w.d + 4, 3, &e), 3); /* header done */
	ck_assert_int_eq(e.kind, TAP_EV_NONE);
	ck_assert_int_eq(tap_frame_feed(&d, w.d + 7, 4, &e), 4);
	ck_assert_int_eq(e.kind, TAP_EV_BODY);
	ck_assert_ptr_eq(e.data, w.d + 7);
	ck_assert_uint_eq(e.len, 4);
	ck_assert(!e.frame_end);
	ck_assert_int_eq(tap_frame_feed(&d, w.d + 11, 6, &e), 6);
	ck_assert_ptr_eq(e.data, w.d + 11);
	ck_assert(!e.frame_end);
	ck_assert_int_eq(tap_frame_feed(&d, w.d + 17, 1, &e), 1);
	ck_assert_int_eq(e.kind, TAP_EV_BODY);
	ck_assert_uint_eq(e.len, 0);
	ck_assert(e.frame_end);
	ck_assert_uint_eq(e.size, 10);
	ck_assert_uint_eq(e.channel, 7);
	ck_assert_uint_eq(d.cap, 0);
	tap_frame_dec_deinit(&d);
	tap_build_free(&w);
}
END_TEST

/* Whole frames go through tap_frame_feed's fast path, byte-wise feeds through the slow path: both must
 * report the same events, the same error at the same offset, under frame_max 0, the default and a small
 * negotiated value, with a frame exactly at the bound and one just past it; and a broker-side decoder
 * takes the fast path from offset 0 (a type byte is never the 'A' of a protocol header). */
START_TEST(fast_path_matches_slow_path)
{
	static const uint32_t maxes[] = {0, 131072, 4096, 9};
	uint8_t *big = calloc(1, 4097);
	for (size_t k = 0; k < sizeof maxes / sizeof maxes[0]; k++) {
		uint32_t fm = maxes[k];
		uint32_t bound = fm == 0 ? 4097 : fm; /* largest payload allowed: frame_max - 8 + 8 */
		struct tap_bytes w = {0};
		tap_build_frame(&w, TAP_FRAME_METHOD, 0, "\x00\x0a\x00\x33", 4); /* connection.close-ok */
		tap_build_frame(&w, TAP_FRAME_BODY, 1, big, bound < 4097 ? bound : 4096);
		tap_build_frame(&w, TAP_FRAME_HEADER, 1, big, 3);
		tap_build_frame(&w, TAP_FRAME_BODY, 2, big, 0);
		tap_build_frame(&w, TAP_FRAME_HEARTBEAT, 0, big, 0);
		size_t bad_at = w.n;
		if (fm != 0 && fm < 4096)
			tap_build_frame(&w, TAP_FRAME_BODY, 1, big, bound + 1);
		struct tap_frame_dec whole, bytes;
		struct log lw, lb;
		log_init(&lw);
		log_init(&lb);
		tap_frame_dec_init(&whole);
		tap_frame_dec_init(&bytes);
		tap_frame_dec_set_frame_max(&whole, fm);
		tap_frame_dec_set_frame_max(&bytes, fm);
		size_t *cuts = malloc(w.n * sizeof *cuts);
		for (size_t i = 0; i < w.n; i++)
			cuts[i] = i + 1;
		int rw = feed_chunks(&whole, w.d, w.n, NULL, 0, &lw);
		int rb = feed_chunks(&bytes, w.d, w.n, cuts, w.n, &lb);
		ck_assert_int_eq(rw, rb);
		ck_assert_int_eq(rw, bad_at < w.n ? TAP_E_FRAME_TOO_LARGE : 0);
		ck_assert_uint_eq(tap_frame_dec_error_offset(&whole), tap_frame_dec_error_offset(&bytes));
		if (bad_at < w.n)
			ck_assert_uint_eq(tap_frame_dec_error_offset(&whole), bad_at);
		ck_assert_uint_eq(lw.events, 5);
		ck_assert_uint_eq(lw.b.len, lb.b.len);
		ck_assert_mem_eq(lw.b.data, lb.b.data, lw.b.len);
		ck_assert_uint_eq(whole.cap, 0); /* nothing buffered on the fast path */
		free(cuts);
		tap_frame_dec_deinit(&whole);
		tap_frame_dec_deinit(&bytes);
		log_deinit(&lw);
		log_deinit(&lb);
		tap_build_free(&w);
	}
	free(big);
}
END_TEST

/* tap_frame_dec_partial names the frame being assembled, at every split of a method and a body frame. */
START_TEST(partial_frames)
{
	struct tap_bytes w = {0};
	tap_build_raw(&w, "AMQP\x01\x01\x08\x00", 8);
	tap_build_method(&w, 0, TAP_CONNECTION_TUNE_OK, "\x07\xff\x00\x02\x00\x00\x00\x3c", 8);
	size_t body_at = w.n;
	tap_build_frame(&w, 3, 5, "hello", 5);
	for (size_t cut = 0; cut <= w.n; cut++) {
		struct tap_frame_dec d;
		unsigned ev = 0;
		tap_frame_dec_init_client(&d);
		ck_assert_int_eq(feed_all(&d, w.d, cut, &ev), 0);
		struct tap_frame_partial f = {.offset = 99};
		bool in = tap_frame_dec_partial(&d, &f);
		if (cut <= 8 || cut == body_at || cut == w.n) {
			ck_assert_msg(!in, "cut %zu", cut);
		} else {
			size_t start = cut < body_at ? 8 : body_at;
			ck_assert_msg(in, "cut %zu", cut);
			ck_assert_uint_eq(f.offset, start);
			if (cut - start < 7) {
				ck_assert_uint_eq(f.type, 0);
			} else {
				ck_assert_uint_eq(f.type, cut < body_at ? TAP_FRAME_METHOD : TAP_FRAME_BODY);
				ck_assert_uint_eq(f.channel, cut < body_at ? 0 : 5);
				ck_assert_uint_eq(f.class_id, cut < body_at && cut - start >= 9 ? 10 : 0);
			}
		}
		tap_frame_dec_deinit(&d);
	}
	/* after an error: nothing */
	struct tap_frame_dec d;
	unsigned ev = 0;
	struct tap_frame_partial f;
	tap_frame_dec_init(&d);
	ck_assert_int_eq(feed_all(&d, (const uint8_t *)"\x01\x00\x00\x00", 4, &ev), 0);
	ck_assert(tap_frame_dec_partial(&d, &f));
	ck_assert_int_eq(feed_all(&d, (const uint8_t *)"\xff\xff\xff", 3, &ev), TAP_E_FRAME_TOO_LARGE);
	ck_assert(!tap_frame_dec_partial(&d, &f));
	tap_frame_dec_deinit(&d);
	tap_build_free(&w);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("frame");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, splits_give_identical_events);
	tcase_add_test(tc, protocol_headers);
	tcase_add_test(tc, bad_end_octet);
	tcase_add_test(tc, frame_max_bound);
	tcase_add_test(tc, size_ffffffff);
	tcase_add_test(tc, huge_frame_max_does_not_size_the_buffer);
	tcase_add_test(tc, bad_type_and_heartbeat);
	tcase_add_test(tc, body_slices_point_into_input);
	tcase_add_test(tc, fast_path_matches_slow_path);
	tcase_add_test(tc, partial_frames);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
