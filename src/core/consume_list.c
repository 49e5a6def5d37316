/* What the consumer tracker's state (consume_int.h) shows the metrics and the status page: the counters, the
 * histograms, the consumers of the live connections; and the delivery hook they are fed by. Changes no state. */
#include "consume_int.h"

#include <string.h>

/* The deliveries of consumer k that ch still has unacked, and when the oldest of them was delivered; false when
 * that would look at more than *scan deliveries (which it takes from *scan otherwise). A delivery whose strings no
 * memory kept (CSM_FLAG_LOST) names no consumer and is counted for none. */
static bool unacked_of(const struct csm_chan *ch, const struct csm_consumer *k, uint64_t *scan, uint64_t *n,
                       int64_t *oldest)
{
	*n = 0;
	*oldest = 0;
	if (!k->tag)
		return false; /* no memory kept its tag: its deliveries cannot be told apart */
	if (ch->len - ch->head > *scan)
		return false;
	*scan -= ch->len - ch->head;
	for (uint32_t i = ch->head; i < ch->len; i++) {
		const struct csm_dlv *d = &ch->dlv[i];
		if (d->flags & (CSM_FLAG_DONE | CSM_FLAG_GET | CSM_FLAG_LOST) || !d->blob)
			continue;
		if (d->ctag_len != k->tag_len || memcmp(d->blob, k->tag, k->tag_len) != 0)
			continue;
		if (!*n)
			*oldest = d->t_dlv; /* the ring is in delivery order */
		(*n)++;
	}
	return true;
}

uint64_t tap_consume_each_consumer(const struct tap_track *t, size_t max, uint64_t scan_max, tap_consume_consumer_fn fn,
                                   void *ctx)
{
	uint64_t total = 0;
	for (const struct tap_track_conn *c = t->conns; c; c = c->next) {
		const struct csm_conn *cc = c->csm;
		for (uint32_t i = 0; cc && i < cc->n_chans; i++) {
			const struct csm_chan *ch = cc->chans[i];
			for (uint32_t j = 0; j < ch->n_cons; j++) {
				const struct csm_consumer *k = &ch->cons[j];
				if (!k->started)
					continue;
				if (total++ >= max)
					continue; /* counted, not listed */
				struct tap_consume_consumer_info info = {
				    .conn = c->id,
				    .channel = ch->id,
				    .tag = {(const uint8_t *)k->tag, k->tag ? k->tag_len : 0},
				    .queue = {(const uint8_t *)k->queue, k->queue ? k->queue_len : 0},
				    .no_ack = k->no_ack,
				    .prefetch = ch->qos_seen ? ch->prefetch : 0,
				    .global_qos = ch->global,
				    .deliveries = k->deliveries,
				    .since_us = k->t_start,
				};
				info.unacked_known = unacked_of(ch, k, &scan_max, &info.unacked, &info.oldest_us);
				fn(ctx, &info);
			}
		}
	}
	return total;
}

/* ---- stats and the delivery hook ---- */

void tap_consume_get_stats(const struct tap_track *t, struct tap_consume_stats *s)
{
	*s = t->csm_st;
}

const struct tap_hist *tap_consume_settle_hist(const struct tap_track *t)
{
	return &t->csm_hist;
}

const struct tap_hist *tap_consume_queue_hist(const struct tap_track *t)
{
	return &t->csm_queue_hist;
}

void tap_consume_set_delivery_hook(struct tap_track *t, tap_consume_delivery_fn fn, void *ctx)
{
	t->csm_hook = fn;
	t->csm_hook_ctx = ctx;
}
