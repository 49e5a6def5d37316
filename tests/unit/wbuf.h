/* A fixed-size big-endian byte writer for hand-built test payloads
 * (0-9-1 §4.2.5 encodings: octets, shorts, longs, short and long strings). */
#ifndef TAP_TEST_WBUF_H
#define TAP_TEST_WBUF_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct wbuf {
	uint8_t d[4096];
	size_t n;
};

static inline void put(struct wbuf *w, const void *p, size_t n)
{
	ck_assert_uint_le(w->n + n, sizeof w->d);
	memcpy(w->d + w->n, p, n);
	w->n += n;
}

static inline void put8(struct wbuf *w, uint8_t v)
{
	put(w, &v, 1);
}

static inline void put16(struct wbuf *w, uint16_t v)
{
	put8(w, (uint8_t)(v >> 8));
	put8(w, (uint8_t)v);
}

static inline void put32(struct wbuf *w, uint32_t v)
{
	put16(w, (uint16_t)(v >> 16));
	put16(w, (uint16_t)v);
}

static inline void sstr(struct wbuf *w, const char *s)
{
	put8(w, (uint8_t)strlen(s));
	put(w, s, strlen(s));
}

static inline void lstr(struct wbuf *w, const void *s, size_t n)
{
	put32(w, (uint32_t)n);
	put(w, s, n);
}

#endif
