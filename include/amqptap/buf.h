/* A growable byte buffer: the one every record, frame line and pcapng block is built in. An append that cannot
 * get memory sets oom and leaves the contents truncated; callers check oom once, after the whole record. */
#ifndef AMQPTAP_BUF_H
#define AMQPTAP_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

struct tap_buf {
	char *data;
	size_t len;
	size_t cap;
	bool oom; /* an append failed; contents are truncated */
};

void tap_buf_init(struct tap_buf *b);
void tap_buf_deinit(struct tap_buf *b);
void tap_buf_reset(struct tap_buf *b);
/* Makes room for extra more bytes; false (and oom set) if that failed. */
bool tap_buf_grow(struct tap_buf *b, size_t extra);
/* Gives an empty buffer a capacity of cap bytes at once, where memory allows (it is never marked oom): a buffer
 * that will be filled to about cap is then allocated once instead of doubled up to it. */
void tap_buf_presize(struct tap_buf *b, size_t cap);
void tap_buf_puts(struct tap_buf *b, const char *s);
void tap_buf_printf(struct tap_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The hot small pieces are inline: every record is a few dozen of them. */

static inline bool tap_buf_reserve(struct tap_buf *b, size_t extra)
{
	return (!b->oom && extra <= b->cap - b->len) || tap_buf_grow(b, extra);
}

static inline void tap_buf_append(struct tap_buf *b, const void *data, size_t len)
{
	if (len == 0 || !tap_buf_reserve(b, len))
		return;
	memcpy(b->data + b->len, data, len);
	b->len += len;
}

static inline void tap_buf_putc(struct tap_buf *b, char c)
{
	if (tap_buf_reserve(b, 1))
		b->data[b->len++] = c;
}

#endif
