/* A log-linear latency histogram (HdrHistogram's idea at 8 sub-buckets per power of two): constant memory,
 * O(1) to add, every value within 1/16 (6.25 %) of the midpoint of its bucket. The tracker keeps one per
 * connection and one for the process; the buckets can be walked in order, cumulatively, for a Prometheus
 * histogram. Values are unsigned (microseconds for the tracker); negative inputs count as 0. */
#ifndef AMQPTAP_HIST_H
#define AMQPTAP_HIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TAP_HIST_SUB_BITS 3
#define TAP_HIST_SUB (1u << TAP_HIST_SUB_BITS)
/* Values from 2^36 (19 hours in µs) on share the last bucket (max stays exact): 2.2 KB per histogram. */
#define TAP_HIST_TOP_BITS 36
#define TAP_HIST_BUCKETS (TAP_HIST_SUB + (TAP_HIST_TOP_BITS - TAP_HIST_SUB_BITS) * TAP_HIST_SUB)

/* Zero-initialized is empty. */
struct tap_hist {
	uint64_t n, max, sum;
	uint64_t bucket[TAP_HIST_BUCKETS];
};

void tap_hist_add(struct tap_hist *h, int64_t v);
/* The value at quantile q (0..1): the midpoint of the bucket holding it, h->max at the top; 0 when empty. */
uint64_t tap_hist_quantile(const struct tap_hist *h, double q);
/* The largest value bucket i holds (UINT64_MAX for the last one): the `le` bound of a cumulative bucket. */
uint64_t tap_hist_bucket_max(unsigned i);

/* Walks the buckets that hold values, in increasing order:
 *   struct tap_hist_it it = {0};
 *   while (tap_hist_next(h, &it)) use(it.le, it.cumulative);
 * it.le is the largest value of the bucket, it.cumulative the count of values <= it.le. */
struct tap_hist_it {
	unsigned next; /* the bucket to look at next */
	uint64_t le, cumulative;
};
bool tap_hist_next(const struct tap_hist *h, struct tap_hist_it *it);

/* The same buckets, only the run [lo, lo + len) of them that values fell in: the tracker keeps one per connection
 * (its summary line), and a connection's confirm latencies span a few powers of two, so it costs tens of bytes
 * where a whole tap_hist costs 2.2 KB. The owner allocates it (tap_hist_span_size) and grows it to take a value
 * outside its run (tap_hist_span_move); a value tap_hist_span_add finds outside goes to the nearest end. */
struct tap_hist_span {
	uint64_t n, max;
	uint16_t lo, len;
	uint64_t bucket[];
};

/* The bucket v falls in (negative values count as 0). */
unsigned tap_hist_bucket(int64_t v);
static inline size_t tap_hist_span_size(unsigned len)
{
	return sizeof(struct tap_hist_span) + (size_t)len * sizeof(uint64_t);
}
/* Makes to (tap_hist_span_size(len) bytes) the run [lo, lo + len) holding what from (NULL: nothing) held, which
 * must lie within it. */
void tap_hist_span_move(struct tap_hist_span *to, unsigned lo, unsigned len, const struct tap_hist_span *from);
void tap_hist_span_add(struct tap_hist_span *h, int64_t v);
/* As tap_hist_quantile; NULL is empty. */
uint64_t tap_hist_span_quantile(const struct tap_hist_span *h, double q);

#endif
