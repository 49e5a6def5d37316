/* Push frame decoder: a real client stream fed whole, split at every offset and byte by byte gives the same
 * events; malformed input (bad end octet, oversize, 0xFFFFFFFF size, bad type, AMQP 1.0, TLS, HTTP) fails
 * cleanly at the right offset, without allocating from the wire length, and stays stopped. */
#include "amqptap/frame.h"
#include "amqptap/jsonl.h"
#include "amqptap/spec.h"
#include "amqptap/status.h"

#include <check.h>

#include "tap_check.h"
#include <stdlib.h>
#include <string.h>

struct wbuf {
	uint8_t *d;
	size_t n, cap;
};

static void put(struct wbuf *w, const void *p, size_t n)
{
	if (n == 0)
		return;
	if (w->n + n > w->cap) {
		w->cap = (w->n + n) * 2;
		w->d = realloc(w->d, w->cap);
		ck_assert_ptr_nonnull(w->d);
	}
	memcpy(w->d + w->n, p, n);
	w->n += n;
}

static void put8(struct wbuf *w, uint8_t v)
{
	put(w, &v, 1);
}

static void put16(struct wbuf *w, uint16_t v)
{
	put8(w, (uint8_t)(v >> 8));
	put8(w, (uint8_t)v);
}

static void put32(struct wbuf *w, uint32_t v)
{
	put16(w, (uint16_t)(v >> 16));
	put16(w, (uint16_t)v);
}

static void put64(struct wbuf *w, uint64_t v)
{
	put32(w, (uint32_t)(v >> 32));
	put32(w, (uint32_t)v);
}

static void sstr(struct wbuf *w, const char *s)
{
	put8(w, (uint8_t)strlen(s));
	put(w, s, strlen(s));
}

static void frame(struct wbuf *w, uint8_t type, uint16_t ch, const void *payload, uint32_t len)
{
	put8(w, type);
	put16(w, ch);
	put32(w, len);
	put(w, payload, len);
	put8(w, 0xCE);
}

static void method(struct wbuf *w, uint16_t ch, struct wbuf *args, uint32_t id)
{
	struct wbuf p = {0};
	put32(&p, id);
	if (args)
		put(&p, args->d, args->n);
	frame(w, 1, ch, p.d, (uint32_t)p.n);
	free(p.d);
}

static void publish(struct wbuf *w, uint16_t ch, const char *rk, size_t body, size_t frame_body)
{
	struct wbuf a = {0};
	put16(&a, 0);
	sstr(&a, "x.direct");
	sstr(&a, rk);
	put8(&a, 1);
	method(w, ch, &a, TAP_BASIC_PUBLISH);
	free(a.d);
	struct wbuf h = {0};
	put16(&h, 60);
	put16(&h, 0);
	put64(&h, body);
	put16(&h, 0x8000 | 0x1000 | 0x0080);
	sstr(&h, "text/plain");
	put8(&h, 2);
	sstr(&h, "msg-1");
	frame(w, 2, ch, h.d, (uint32_t)h.n);
	free(h.d);
	uint8_t *b = malloc(body + 1);
	for (size_t i = 0; i < body; i++)
		b[i] = (uint8_t)(i * 7 + ch);
	for (size_t off = 0; off < body; off += frame_body)
		frame(w, 3, ch, b + off, (uint32_t)(body - off < frame_body ? body - off : frame_body));
	free(b);
}

/* A client-side stream: header, handshake methods, publishes with multi-frame bodies on two channels, an
 * empty body frame, a heartbeat. */
static void client_stream(struct wbuf *w)
{
	w->n = 0;
	put(w, "AMQP\0\0\x09\x01", 8);
	struct wbuf a = {0};
	put32(&a, 0); /* empty client-properties */
	sstr(&a, "PLAIN");
	put32(&a, 12);
	put(&a, "\0guest\0guest", 12);
	sstr(&a, "en_US");
	method(w, 0, &a, TAP_CONNECTION_START_OK);
	a.n = 0;
	put16(&a, 2047), put32(&a, 131072), put16(&a, 60);
	method(w, 0, &a, TAP_CONNECTION_TUNE_OK);
	a.n = 0;
	sstr(&a, "/"), sstr(&a, ""), put8(&a, 0);
	method(w, 0, &a, TAP_CONNECTION_OPEN);
	a.n = 0;
	sstr(&a, "");
	method(w, 1, &a, TAP_CHANNEL_OPEN);
	method(w, 2, &a, TAP_CHANNEL_OPEN);
	a.n = 0;
	put8(&a, 0);
	method(w, 1, &a, TAP_CONFIRM_SELECT);
	publish(w, 1, "k1", 10000, 4000);
	frame(w, 8, 0, NULL, 0);
	publish(w, 2, "k2", 64, 64);
	publish(w, 1, "k3", 0, 1);
	frame(w, 3, 2, NULL, 0);
	publish(w, 2, "big", 131064 * 2 + 5, 131064);
	free(a.d);
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
	struct wbuf w = {0};
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

	/* split at every byte offset (two chunks), and at every offset followed by a 3-byte chunk */
	for (size_t cut = 1; cut < w.n; cut += (cut < 2000 || w.n - cut < 2000) ? 1 : 97) {
		for (int v = 0; v < 2; v++) {
			size_t cuts[2] = {cut, cut + 3 < w.n ? cut + 3 : w.n};
			struct log l;
			log_init(&l);
			tap_frame_dec_init_client(&d);
			ck_assert_int_eq(feed_chunks(&d, w.d, w.n, cuts, v ? 2 : 1, &l), 0);
			ck_assert_msg(l.b.len == ref.b.len && memcmp(l.b.data, ref.b.data, l.b.len) == 0, "cut %zu", cut);
			tap_frame_dec_deinit(&d);
			log_deinit(&l);
		}
	}

	/* one byte at a time */
	struct log l;
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
	free(w.d);
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
	} cases[] = {
		{"AMQP\0\0\x09\x01", 0, 0},
		{"AMQP\x01\x01\x00\x09", 0, 0},
		{"AMQP\x00\x01\x00\x00", TAP_E_BAD_PROTOCOL_HEADER, 5}, /* AMQP 1.0 */
		{"AMQP\x03\x01\x00\x00", TAP_E_BAD_PROTOCOL_HEADER, 4}, /* AMQP 1.0 SASL */
		{"AMQP\0\0\x09\x00", TAP_E_BAD_PROTOCOL_HEADER, 7},     /* 0-9-0 */
		{"\x16\x03\x01\x02\x00\x01\x00\x01", TAP_E_BAD_PROTOCOL_HEADER, 0}, /* TLS ClientHello */
		{"GET / HT", TAP_E_BAD_PROTOCOL_HEADER, 0},
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
	struct wbuf w = {0};
	put(&w, "AMQP\0\0\x09\x01", 8);
	uint8_t payload[] = {0, 20, 0, 41};
	frame(&w, 1, 1, payload, 4);
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
	frame(&w, 3, 1, "hello", 5);
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
	free(w.d);
}
END_TEST

static uint8_t hdr_bytes[7];

static const uint8_t *header(uint8_t type, uint16_t ch, uint32_t size)
{
	hdr_bytes[0] = type;
	hdr_bytes[1] = (uint8_t)(ch >> 8), hdr_bytes[2] = (uint8_t)ch;
	hdr_bytes[3] = (uint8_t)(size >> 24), hdr_bytes[4] = (uint8_t)(size >> 16);
	hdr_bytes[5] = (uint8_t)(size >> 8), hdr_bytes[6] = (uint8_t)size;
	return hdr_bytes;
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
	struct wbuf w = {0};
	frame(&w, 3, 7, "0123456789", 10);
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
	free(w.d);
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
		struct wbuf w = {0};
		frame(&w, TAP_FRAME_METHOD, 0, "\x00\x0a\x00\x33", 4); /* connection.close-ok */
		frame(&w, TAP_FRAME_BODY, 1, big, bound < 4097 ? bound : 4096);
		frame(&w, TAP_FRAME_HEADER, 1, big, 3);
		frame(&w, TAP_FRAME_BODY, 2, big, 0);
		frame(&w, TAP_FRAME_HEARTBEAT, 0, big, 0);
		size_t bad_at = w.n;
		if (fm != 0 && fm < 4096)
			frame(&w, TAP_FRAME_BODY, 1, big, bound + 1);
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
		free(w.d);
	}
	free(big);
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
	tcase_add_test(tc, bad_type_and_heartbeat);
	tcase_add_test(tc, body_slices_point_into_input);
	tcase_add_test(tc, fast_path_matches_slow_path);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
