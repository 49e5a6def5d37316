/* A growable byte buffer. See include/amqptap/buf.h. */
#include "amqptap/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tap_buf_init(struct tap_buf *b)
{
	memset(b, 0, sizeof *b);
}

void tap_buf_deinit(struct tap_buf *b)
{
	free(b->data);
	memset(b, 0, sizeof *b);
}

void tap_buf_reset(struct tap_buf *b)
{
	b->len = 0;
	b->oom = false;
}

bool tap_buf_grow(struct tap_buf *b, size_t extra)
{
	if (b->oom)
		return false;
	if (extra <= b->cap - b->len)
		return true;
	size_t cap = b->cap ? b->cap : 256;
	while (cap - b->len < extra) {
		if (cap > SIZE_MAX / 2) {
			b->oom = true;
			return false;
		}
		cap *= 2;
	}
	char *p = realloc(b->data, cap);
	if (!p) {
		b->oom = true;
		return false;
	}
	b->data = p;
	b->cap = cap;
	return true;
}

void tap_buf_presize(struct tap_buf *b, size_t cap)
{
	if (b->len != 0 || b->cap >= cap)
		return;
	char *p = realloc(b->data, cap);
	if (p) {
		b->data = p;
		b->cap = cap;
	}
}

void tap_buf_puts(struct tap_buf *b, const char *s)
{
	tap_buf_append(b, s, strlen(s));
}

void tap_buf_printf(struct tap_buf *b, const char *fmt, ...)
{
	char small[128];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(small, sizeof small, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n < sizeof small) {
		tap_buf_append(b, small, (size_t)n);
		return;
	}
	if (!tap_buf_reserve(b, (size_t)n + 1))
		return;
	va_start(ap, fmt);
	vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}
