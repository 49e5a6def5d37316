/* The tracker's store (the bottom layer, track_store.c): allocation counted in the memory budget, strings,
 * channels, slot rings and queues, releasing slots and giving memory back, the views records are written from,
 * and the two heaps: the channels by their oldest outstanding publish, the connections by their next deadline. */
#ifndef AMQPTAP_TRACK_STORE_H
#define AMQPTAP_TRACK_STORE_H

#include "track_int.h"

#include "heap.h"

/* Allocations counted in t->mem. */
void *trk_alloc(struct tap_track *t, size_t n);
void *trk_calloc(struct tap_track *t, size_t n); /* zeroed */
/* p of old bytes made n long, its contents kept; NULL without memory (p then untouched). */
void *trk_realloc(struct tap_track *t, void *p, size_t old, size_t n);
void trk_free(struct tap_track *t, void *p, size_t n);
/* --fault: stores that the client was shown `saw` for publish seq of channel ch by rule `rule` (false without
 * memory, or past TAP_FAULT_TAGS_MAX marks waiting; replace: over a mark the publish has, else that one stays); takes
 * it back (true, *out) when its record is written. */
bool trk_fault_put(struct tap_track_conn *c, uint16_t ch, uint64_t seq, uint8_t saw, uint32_t rule, bool replace);
bool trk_fault_take(struct tap_track_conn *c, uint16_t ch, uint64_t seq, struct trk_fault_mark *out);
void trk_fault_free(struct tap_track_conn *c);
/* len bytes and a NUL (free with trk_free(t, p, len + 1)); NULL when out of memory. */
char *trk_dup(struct tap_track *t, const uint8_t *s, size_t len);
/* C strings (printed up to their first NUL: they are kept up to it). */
/* Copies s into *dst (the old value freed); false, *dst NULL and a shortage counted when there was no memory. */
bool trk_set_str(struct tap_track *t, char **dst, struct tap_slice s);
bool trk_set_cstr(struct tap_track *t, char **dst, const char *s); /* s NULL: *dst NULL, true */
void trk_free_str(struct tap_track *t, char **s);

struct trk_chan *trk_chan_find(const struct tap_track_conn *c, uint16_t id);
/* The channel the broker's answers on `id` are for: a retired one first (its answers come before the broker
 * takes the new open), else trk_chan_find's. */
struct trk_chan *trk_chan_answering(const struct tap_track_conn *c, uint16_t id);
/* Takes ch out of chans and keeps it as c->retired (the one before must be gone). */
void trk_chan_retire(struct tap_track_conn *c, struct trk_chan *ch);
/* The channel, created when new (NULL when out of memory). */
struct trk_chan *trk_chan_get(struct tap_track_conn *c, uint16_t id);
void trk_chan_free(struct tap_track_conn *c, struct trk_chan *ch);
/* Rings this small (and arenas of TAP_ARENA_MIN_CAP) stay when their channel empties: a publish-and-wait client
 * allocates nothing. Small, as a replay may hold 65,536 connections with a channel each: 256 bytes. */
#define TRK_RING_MIN_CAP 4u

/* Bytes growing the ring by one slot would allocate: 0 when a slot is free. */
static inline uint64_t trk_ring_growth(const struct trk_chan *ch)
{
	if (ch->next - ch->base < ch->cap)
		return 0;
	return tap_mem_cost((ch->cap ? ch->cap * 2 : TRK_RING_MIN_CAP) * sizeof *ch->ring);
}
bool trk_ring_reserve(struct tap_track_conn *c, struct trk_chan *ch);
bool trk_fifo_push(struct tap_track *t, struct trk_fifo *f, uint64_t v);
uint64_t trk_fifo_front(const struct trk_fifo *f);
void trk_fifo_pop(struct trk_fifo *f);
/* A slot was stored at n (the ring's new tail): count it, put its channel on the active list. */
void trk_slot_stored(struct tap_track_conn *c, struct trk_chan *ch, uint64_t n);
/* The slot's record has been written (or is being dropped): release what it holds, move the head, give memory
 * back (unless pinned) when the channel empties or its ring and arena are mostly unused. */
void trk_slot_release(struct tap_track_conn *c, struct trk_chan *ch, uint64_t n);
/* Gives memory back when the channel is empty or its ring or arena is a quarter used. */
void trk_chan_shrink(struct tap_track *t, struct trk_chan *ch);

/* Ends a pinned stretch: gives back what the releases in it would have. */
static inline void trk_chan_unpin(struct tap_track *t, struct trk_chan *ch)
{
	ch->pinned = false;
	if (ch->shrink_pending) {
		ch->shrink_pending = false;
		trk_chan_shrink(t, ch);
	}
}
/* Every publish of c still waiting is flagged BLOCKED. */
void trk_mark_blocked(struct tap_track_conn *c);
/* The channel whose base slot is the oldest outstanding publish of the process, or NULL. */
struct trk_chan *trk_oldest_chan(const struct tap_track *t);
void trk_view_of_slot(struct trk_view *v, const struct tap_track_conn *c, const struct trk_chan *ch, uint64_t n);

/* ---- the deadline heap: every connection with a timer running, keyed by next_due ---- */

/* A timer of c's channels runs out at start + window: tap_track_tick must not skip c past it. Inline: started
 * for most publishes. */
static inline void trk_due_at(struct tap_track_conn *c, int64_t start, int64_t window)
{
	int64_t due;
	if (__builtin_add_overflow(start, window, &due))
		due = INT64_MAX;
	if (due < c->next_due) {
		c->next_due = due;
		(void)tap_heap_set(&c->t->due, c, due); /* tap_track_conn_new made room for every connection */
	}
}

/* The tick is to look at c at now_us (its paused windows run again). */
static inline void trk_due_now(struct tap_track_conn *c, int64_t now_us)
{
	trk_due_at(c, now_us, 0);
}

#endif
