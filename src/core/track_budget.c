/* The memory budget (tap_track_conf.max_memory) and the outstanding bound (max_outstanding): what the tracker
 * keeps is counted in t->mem by the store; before something new is kept, the oldest outstanding publishes are
 * evicted (written now, reason {"by":"evicted"}) until it fits, or nothing is left to evict. */
#include "track_budget.h"

#include "track_store.h"
#include "track_verdict.h"

#include "mem.h"

static const struct trk_reason evicted = {.by = "evicted"};
static const struct trk_reason evicted_for_memory = {
    .by = "evicted", .text = (const uint8_t *)"max-tracking-memory", .text_len = sizeof "max-tracking-memory" - 1};

bool trk_evict_for_memory(struct tap_track *t, int64_t now_us)
{
	struct trk_chan *oldest = trk_oldest_chan(t);
	if (!oldest)
		return false;
	tap_intern_drop_cached(&oldest->conn->keys);
	t->st.evicted++;
	t->st.evicted_memory++;
	t->squeeze = true;
	trk_slot_step(oldest->conn, oldest, oldest->base, TRK_EVENT_END, &evicted_for_memory, now_us);
	t->squeeze = false;
	return true;
}

void trk_make_room(struct tap_track *t, uint64_t need, int64_t now_us)
{
	while (!trk_fits(t, need)) {
		if (!trk_evict_for_memory(t, now_us))
			return; /* nothing left to evict: the allocation goes past the budget */
	}
}

uint32_t trk_intern_in_budget(struct tap_track_conn *c, enum trk_tag tag, const uint8_t *a, size_t alen,
                              const uint8_t *b, size_t blen, int64_t now_us)
{
	struct tap_track *t = c->t;
	while (!trk_fits(t, tap_intern_cost_bound(&c->keys, alen + blen)) &&
	       tap_intern_find(&c->keys, tag, a, alen, b, blen) == TAP_INTERN_NONE) {
		if (!trk_evict_for_memory(t, now_us)) /* the oldest go first, the pinned channel's own included */
			break;
	}
	return tap_intern_get(&c->keys, tag, a, alen, b, blen);
}

void *trk_alloc_in_budget(struct tap_track *t, size_t n, int64_t now_us)
{
	trk_make_room(t, tap_mem_cost(n), now_us);
	return tap_mem_calloc(&t->mem, n);
}

bool tap_track_conn_charge(struct tap_track_conn *c, uint64_t n, int64_t now_us)
{
	struct tap_track *t = c->t;
	trk_make_room(t, n, now_us);
	if (!trk_fits(t, n))
		return false;
	t->mem += n;
	trk_note_peak(t);
	return true;
}

void tap_track_conn_uncharge(struct tap_track_conn *c, uint64_t n)
{
	c->t->mem -= n;
}

bool trk_chan_beyond_max(const struct tap_track_conn *c)
{
	return c->tuned && c->channel_max && c->n_chans >= c->channel_max;
}

/* Out of line: finding a known channel, as most publishes do, saves no registers for making room. */
__attribute__((noinline)) static struct trk_chan *chan_create(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	uint64_t need = tap_mem_cost(sizeof(struct trk_chan)) + tap_mem_cost(c->cap_chans * 2 * sizeof *c->chans);
	trk_make_room(c->t, need, now_us);
	if (!trk_fits(c->t, need)) {
		/* nothing left to evict: the channels already followed hold the budget (a client with thousands of them
		 * must not grow the tap past it), so this one is not followed */
		return NULL;
	}
	return trk_chan_get(c, id);
}

struct trk_chan *trk_chan_in_budget(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	struct trk_chan *ch = trk_chan_find(c, id);
	if (ch || trk_chan_beyond_max(c))
		return ch;
	return chan_create(c, id, now_us);
}

void trk_evict_conn_oldest(struct tap_track_conn *c, int64_t now_us)
{
	struct trk_chan *oldest = NULL;
	for (uint32_t i = 0; i < c->n_active; i++) {
		struct trk_chan *ch = c->active[i];
		if (ch->base < ch->next &&
		    (!oldest || trk_slot(ch, ch->base)->t_pub < trk_slot(oldest, oldest->base)->t_pub))
			oldest = ch;
	}
	if (!oldest)
		return;
	trk_evict_chan_oldest(c, oldest, now_us);
}

void trk_evict_chan_oldest(struct tap_track_conn *c, struct trk_chan *ch, int64_t now_us)
{
	c->t->st.evicted++;
	trk_slot_step(c, ch, ch->base, TRK_EVENT_END, &evicted, now_us);
}
