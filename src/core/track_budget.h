/* The memory budget and the outstanding bound (track_budget.c): past tap_track_conf.max_memory the oldest
 * outstanding publishes of the process are evicted, past max_outstanding the oldest of the connection; and the
 * channels, strings and allocations the layers above ask for are made room for first. Above the lifecycle:
 * an eviction ends a publish through trk_slot_step. */
#ifndef AMQPTAP_TRACK_BUDGET_H
#define AMQPTAP_TRACK_BUDGET_H

#include "track_int.h"

static inline bool trk_fits(const struct tap_track *t, uint64_t need)
{
	return t->mem + need <= t->conf.max_memory;
}

/* The oldest outstanding publish of the whole process is written now as evicted for memory, after the cached
 * strings of its connection are freed. Returns false when nothing is outstanding. */
bool trk_evict_for_memory(struct tap_track *t, int64_t now_us);
/* Evicts the oldest outstanding publishes of the process until need more bytes fit in conf.max_memory, or
 * nothing is left to evict. */
void trk_make_room(struct tap_track *t, uint64_t need, int64_t now_us);
/* Zeroed and counted, room made first; NULL when out of memory. */
void *trk_alloc_in_budget(struct tap_track *t, size_t n, int64_t now_us);
/* An interned string with room made for it: an existing one costs nothing. */
uint32_t trk_intern_in_budget(struct tap_track_conn *c, enum trk_tag tag, const uint8_t *a, size_t alen,
                              const uint8_t *b, size_t blen, int64_t now_us);

/* Whether a channel not known yet would go past the channel_max the client's tune-ok set: as many channels are open
 * already (RabbitMQ counts open channels, whatever their numbers, and refuses one more with a connection error), so
 * no state is kept for it. */
bool trk_chan_beyond_max(const struct tap_track_conn *c);
/* The channel, created (room made first) when new; NULL when out of memory or beyond channel_max. */
struct trk_chan *trk_chan_in_budget(struct tap_track_conn *c, uint16_t id, int64_t now_us);

/* The oldest outstanding publish of the connection, and of ch, written now as evicted. */
void trk_evict_conn_oldest(struct tap_track_conn *c, int64_t now_us);
void trk_evict_chan_oldest(struct tap_track_conn *c, struct trk_chan *ch, int64_t now_us);

/* A publish was stored on ch: past max_outstanding the connection's oldest goes, and a channel more than twice past
 * it loses its own oldest. Inline: looked at for every publish. */
static inline void trk_bound_outstanding(struct tap_track_conn *c, struct trk_chan *ch, int64_t now_us)
{
	uint64_t max = c->t->conf.max_outstanding;
	if (c->outstanding > max)
		trk_evict_conn_oldest(c, now_us);
	if (ch->next - ch->base > max * 2)
		trk_evict_chan_oldest(c, ch, now_us);
}

#endif
