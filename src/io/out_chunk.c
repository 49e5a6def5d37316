/* The bottom of the output layer (see out_int.h): the batches handed from the loop to a writer and their recycling,
 * the clocks, and the report callback every other part reports through. */
#include "out_int.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static tap_out_report_fn report_fn; /* set by tap_out_set_report, read by any thread (atomic) */

tap_out_report_fn tap_out_set_report(tap_out_report_fn fn)
{
	return __atomic_exchange_n(&report_fn, fn, __ATOMIC_ACQ_REL);
}

void out_report(enum tap_out_report_level level, const char *fmt, ...)
{
	tap_out_report_fn fn = __atomic_load_n(&report_fn, __ATOMIC_ACQUIRE);
	if (!fn)
		return;
	va_list ap;
	va_start(ap, fmt);
	fn(level, fmt, ap);
	va_end(ap);
}

int64_t tap_out_clock_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t out_wall_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

uint64_t out_count_newlines(const char *p, size_t len)
{
	uint64_t n = 0;
	const char *end = p + len;
	while (p < end && (p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
		n++;
		p++;
	}
	return n;
}

struct chunk *out_chunk_new(void)
{
	struct chunk *c = calloc(1, sizeof *c);
	if (c)
		tap_buf_init(&c->data);
	return c;
}

void out_chunk_free(struct chunk *c)
{
	if (!c)
		return;
	tap_buf_deinit(&c->data);
	free(c->ends);
	free(c);
}

void out_chunk_reset(struct chunk *c)
{
	tap_buf_reset(&c->data);
	c->records = 0;
	c->kind = CHUNK_DATA;
	c->next = NULL;
}

void out_chunk_recycle(struct tap_out *o, struct chunk *c)
{
	if (c->reserve) {
		out_chunk_reset(c);
		o->reserve = c;
		return;
	}
	if (o->n_spare >= SPARE_CHUNKS || c->data.cap > SPARE_MAX_BYTES) {
		out_chunk_free(c);
		return;
	}
	out_chunk_reset(c);
	c->next = o->spare;
	o->spare = c;
	o->n_spare++;
}

struct chunk *out_chunk_take(struct tap_out *o)
{
	struct chunk *c = o->spare;
	if (!c)
		return out_chunk_new();
	o->spare = c->next;
	o->n_spare--;
	c->next = NULL;
	return c;
}

struct chunk *out_chunk_with_room(struct tap_out *o, size_t len)
{
	struct chunk *c = out_chunk_take(o);
	if (c && tap_buf_reserve(&c->data, len))
		return c;
	if (c)
		out_chunk_recycle(o, c);
	c = o->reserve;
	if (!c || len > c->data.cap)
		return NULL;
	o->reserve = NULL;
	return c;
}
