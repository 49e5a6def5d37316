/* Log-linear histogram: see include/amqptap/hist.h. Bucket i < 8 holds the value i; above, each power of two
 * 2^e (e >= 3) is split into 8 equal sub-buckets of width 2^(e-3). */
#include "amqptap/hist.h"

#include <string.h>

static unsigned bucket_of(uint64_t v)
{
	if (v < TAP_HIST_SUB)
		return (unsigned)v;
	if (v >> TAP_HIST_TOP_BITS)
		return TAP_HIST_BUCKETS - 1;
	unsigned e = 63u - (unsigned)__builtin_clzll(v);
	unsigned sub = (unsigned)(v >> (e - TAP_HIST_SUB_BITS)) & (TAP_HIST_SUB - 1);
	return TAP_HIST_SUB + (e - TAP_HIST_SUB_BITS) * TAP_HIST_SUB + sub;
}

static uint64_t bucket_low(unsigned i)
{
	if (i < TAP_HIST_SUB)
		return i;
	unsigned e = (i - TAP_HIST_SUB) / TAP_HIST_SUB + TAP_HIST_SUB_BITS;
	uint64_t sub = (i - TAP_HIST_SUB) % TAP_HIST_SUB;
	return (TAP_HIST_SUB + sub) << (e - TAP_HIST_SUB_BITS);
}

static uint64_t bucket_width(unsigned i)
{
	if (i < TAP_HIST_SUB)
		return 1;
	unsigned e = (i - TAP_HIST_SUB) / TAP_HIST_SUB + TAP_HIST_SUB_BITS;
	return UINT64_C(1) << (e - TAP_HIST_SUB_BITS);
}

void tap_hist_add(struct tap_hist *h, int64_t v)
{
	uint64_t u = v < 0 ? 0 : (uint64_t)v;
	h->bucket[bucket_of(u)]++;
	h->n++;
	h->sum += u;
	if (u > h->max)
		h->max = u;
}

/* The quantile over buckets [lo, lo + len) of a histogram (bucket[0] is bucket lo) of n values, max the largest. */
static uint64_t quantile(const uint64_t *bucket, unsigned lo, unsigned len, uint64_t n, uint64_t max, double q)
{
	if (n == 0)
		return 0;
	if (q <= 0)
		q = 0;
	if (q >= 1)
		return max;
	uint64_t rank = (uint64_t)(q * (double)n);
	if ((double)rank < q * (double)n)
		rank++;
	if (rank == 0)
		rank = 1;
	uint64_t seen = 0;
	for (unsigned k = 0; k < len; k++) {
		seen += bucket[k];
		if (seen >= rank) {
			unsigned i = lo + k;
			uint64_t mid = bucket_low(i) + bucket_width(i) / 2;
			return mid > max || i == TAP_HIST_BUCKETS - 1 ? max : mid;
		}
	}
	return max;
}

uint64_t tap_hist_quantile(const struct tap_hist *h, double q)
{
	return quantile(h->bucket, 0, TAP_HIST_BUCKETS, h->n, h->max, q);
}

unsigned tap_hist_bucket(int64_t v)
{
	return bucket_of(v < 0 ? 0 : (uint64_t)v);
}

void tap_hist_span_move(struct tap_hist_span *to, unsigned lo, unsigned len, const struct tap_hist_span *from)
{
	memset(to, 0, tap_hist_span_size(len));
	to->lo = (uint16_t)lo;
	to->len = (uint16_t)len;
	if (!from)
		return;
	to->n = from->n;
	to->max = from->max;
	memcpy(&to->bucket[from->lo - lo], from->bucket, from->len * sizeof *from->bucket);
}

void tap_hist_span_add(struct tap_hist_span *h, int64_t v)
{
	uint64_t u = v < 0 ? 0 : (uint64_t)v;
	unsigned i = bucket_of(u);
	i = i < h->lo ? h->lo : i >= (unsigned)h->lo + h->len ? (unsigned)h->lo + h->len - 1u : i;
	h->bucket[i - h->lo]++;
	h->n++;
	if (u > h->max)
		h->max = u;
}

uint64_t tap_hist_span_quantile(const struct tap_hist_span *h, double q)
{
	return h ? quantile(h->bucket, h->lo, h->len, h->n, h->max, q) : 0;
}

uint64_t tap_hist_bucket_max(unsigned i)
{
	if (i >= TAP_HIST_BUCKETS - 1)
		return UINT64_MAX;
	return bucket_low(i) + bucket_width(i) - 1;
}

bool tap_hist_next(const struct tap_hist *h, struct tap_hist_it *it)
{
	while (it->next < TAP_HIST_BUCKETS) {
		unsigned i = it->next++;
		if (!h->bucket[i])
			continue;
		it->cumulative += h->bucket[i];
		it->le = tap_hist_bucket_max(i);
		return true;
	}
	return false;
}
