/* The parts of metrics every page shares: the confirm latency histogram in fixed Prometheus buckets, the tracker's
 * part of a snapshot, and the names of routes, confirms, outputs and close reasons. The pages are rendered in
 * metrics_prom.c and metrics_status.c from what metrics_tally.c counts; every one-number metric is defined once, in
 * METRICS_SCALARS (metrics_int.h), which feeds both /metrics and the "counters" object of /api/status. */
#include "metrics_int.h"

#include <string.h>

const char *const metrics_route_names[TAP_METRICS_N_ROUTES] = {"routed", "returned", "unproven", "unknown"};
const char *const metrics_confirm_names[4] = {"ack", "nack", "none", "unknown"};
const char *const metrics_out_names[TAP_METRICS_N_OUT] = {"verdicts", "frames", "pcap"};
const char *const tap_metrics_close_by_names[TAP_METRICS_N_CLOSE_BY] = {
#define TAP_METRICS_CLOSE_BY_NAME(name) #name,
	TAP_METRICS_CLOSE_BY(TAP_METRICS_CLOSE_BY_NAME)
#undef TAP_METRICS_CLOSE_BY_NAME
};

const uint64_t tap_metrics_le_us[TAP_METRICS_N_LE] = {
	100,     150,     200,     300,     500,     700,                                          /* 100 µs */
	1000,    1500,    2000,    3000,    5000,    7000,                                         /* 1 ms */
	10000,   15000,   20000,   30000,   50000,   70000,                                        /* 10 ms */
	100000,  150000,  200000,  300000,  500000,  700000,                                       /* 100 ms */
	1000000, 1500000, 2000000, 3000000, 5000000, 7000000, 10000000,                            /* 1 s */
};

void tap_metrics_hist_add(struct tap_metrics_hist *h, uint64_t lo_us, uint64_t hi_us, uint64_t count)
{
	uint64_t mid = hi_us > lo_us ? lo_us + (hi_us - lo_us) / 2 : lo_us; /* what tap_track_confirm_quantile reports */
	size_t k = 0;
	while (k < TAP_METRICS_N_LE && tap_metrics_le_us[k] < mid)
		k++;
	h->in_le[k] += count;
	h->count += count;
	h->sum_us += count * mid;
}

void tap_metrics_hist_fold(struct tap_metrics_hist *h, const struct tap_hist *from)
{
	uint64_t lo = 0;
	for (unsigned i = 0; i < TAP_HIST_BUCKETS; i++) {
		uint64_t top = tap_hist_bucket_max(i);
		uint64_t hi = i == TAP_HIST_BUCKETS - 1 ? from->max + 1 : top + 1; /* the last takes every larger value */
		if (from->bucket[i])
			tap_metrics_hist_add(h, lo, hi, from->bucket[i]);
		lo = top + 1;
	}
}

/* ---- collecting the tracker's part ---- */

static void add_conn(void *ctx, const struct tap_track_conn_info *c)
{
	struct tap_metrics_snapshot *s = ctx;
	s->channels_open += c->channels;
	if (c->blocked)
		s->connections_blocked++;
}

void tap_metrics_collect_track(struct tap_metrics_snapshot *s, const struct tap_track *t)
{
	tap_track_get_stats(t, &s->track);
	memset(&s->confirm, 0, sizeof s->confirm);
	tap_metrics_hist_fold(&s->confirm, tap_track_confirm_hist(t));
	s->confirm_p50_us = tap_track_confirm_quantile(t, 0.5);
	s->confirm_p90_us = tap_track_confirm_quantile(t, 0.9);
	s->confirm_p99_us = tap_track_confirm_quantile(t, 0.99);
	s->confirm_max_us = tap_track_confirm_quantile(t, 1.0);
	tap_consume_get_stats(t, &s->consume);
	memset(&s->settle, 0, sizeof s->settle);
	tap_metrics_hist_fold(&s->settle, tap_consume_settle_hist(t));
	memset(&s->queue, 0, sizeof s->queue);
	tap_metrics_hist_fold(&s->queue, tap_consume_queue_hist(t));
	s->channels_open = 0;
	s->connections_blocked = 0;
	tap_track_each_conn(t, add_conn, s);
}
