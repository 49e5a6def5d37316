/* A connection's channels: the table from channel number to its state (open addressing), and the store each
 * channel keeps of the strings of a content in progress, counted against the observer's pending_max. */
#include "conn_int.h"

#include <stdlib.h>
#include <string.h>

static size_t index_home(size_t cap, uint16_t number)
{
	return ((uint32_t)number * 2654435761u) & (cap - 1);
}

/* Where channel number's entry is, or the free one it would take (linear probing from index_home). */
static size_t index_slot(const uint32_t *index, size_t cap, const struct channel *chans, uint16_t number)
{
	size_t i = index_home(cap, number);
	while (index[i] && chans[index[i] - 1].number != number)
		i = (i + 1) & (cap - 1);
	return i;
}

/* Counts n more bytes of the table in the tracker's budget (room made first); false when they do not fit. */
static bool table_charge(struct tap_conn *c, uint64_t n, int64_t now_us)
{
	if (!tap_track_conn_charge(c->tc, n, now_us))
		return false;
	c->chans_charged += n;
	return true;
}

static void table_uncharge(struct tap_conn *c, uint64_t n)
{
	tap_track_conn_uncharge(c->tc, n);
	c->chans_charged -= n;
}

/* Makes room in the index for one more channel; false when out of memory or budget. */
static bool index_reserve(struct tap_conn *c, int64_t now_us)
{
	if ((c->n_chans + 1) * 2 <= c->index_cap)
		return true;
	size_t cap = c->index_cap ? c->index_cap * 2 : 16;
	if (!table_charge(c, (cap - c->index_cap) * sizeof *c->chan_index, now_us))
		return false;
	uint32_t *index = calloc(cap, sizeof *index);
	if (!index) {
		table_uncharge(c, (cap - c->index_cap) * sizeof *index);
		return false;
	}
	for (size_t k = 0; k < c->n_chans; k++)
		index[index_slot(index, cap, c->chans, c->chans[k].number)] = (uint32_t)k + 1;
	free(c->chan_index);
	c->chan_index = index;
	c->index_cap = cap;
	return true;
}

/* Forgets channel number at its close-ok (either side's), so that what a client makes the decoder keep follows the
 * channels open, not every number it ever used (cycling through 65,535 numbers kept 22 MB a connection). The close
 * and the close-ok ended any content on it (a method does); one in progress now belongs to the channel reopened
 * under that number before the close-ok, which keeps the entry. The index entry goes with the entries after it in
 * its probe run moved back; the last channel takes the freed place in chans. */
void conn_channel_drop(struct tap_conn *c, uint16_t number)
{
	if (!c->index_cap)
		return;
	size_t i = index_slot(c->chan_index, c->index_cap, c->chans, number), mask = c->index_cap - 1;
	uint32_t at = c->chan_index[i];
	if (!at)
		return;
	struct channel *ch = &c->chans[at - 1];
	if (ch->dir[TAP_C2S].kind != PENDING_NONE || ch->dir[TAP_S2C].kind != PENDING_NONE)
		return;
	for (int d = 0; d < TAP_DIR_COUNT; d++)
		conn_store_free(c, &ch->dir[d].store);
	conn_fp_free(c, ch);
	c->chan_index[i] = 0;
	for (size_t j = (i + 1) & mask; c->chan_index[j]; j = (j + 1) & mask) {
		size_t home = index_home(c->index_cap, c->chans[c->chan_index[j] - 1].number);
		bool stays = i <= j ? home > i && home <= j : home > i || home <= j; /* home in (i, j], cyclically */
		if (!stays) {
			c->chan_index[i] = c->chan_index[j];
			c->chan_index[j] = 0;
			i = j;
		}
	}
	size_t k = at - 1, last = c->n_chans - 1;
	if (k != last) { /* chans[last] still has its number: index_slot finds its entry */
		c->chans[k] = c->chans[last];
		c->chan_index[index_slot(c->chan_index, c->index_cap, c->chans, c->chans[k].number)] = (uint32_t)k + 1;
	}
	c->n_chans--;
	c->last_chan = SIZE_MAX;
}

struct channel *conn_channel_find(struct tap_conn *c, uint16_t number)
{
	if (c->last_chan < c->n_chans && c->chans[c->last_chan].number == number)
		return &c->chans[c->last_chan];
	if (c->index_cap) {
		uint32_t at = c->chan_index[index_slot(c->chan_index, c->index_cap, c->chans, number)];
		if (at) {
			c->last_chan = at - 1;
			return &c->chans[at - 1];
		}
	}
	return NULL;
}

struct channel *conn_channel_get(struct tap_conn *c, uint16_t number, int64_t now_us)
{
	struct channel *found = conn_channel_find(c, number);
	if (found)
		return found;
	if (!index_reserve(c, now_us))
		return NULL;
	if (c->n_chans == c->cap_chans) {
		size_t cap = c->cap_chans ? c->cap_chans * 2 : 1; /* most connections publish on one channel */
		if (!table_charge(c, (cap - c->cap_chans) * sizeof *c->chans, now_us))
			return NULL;
		struct channel *p = realloc(c->chans, cap * sizeof *p);
		if (!p) {
			table_uncharge(c, (cap - c->cap_chans) * sizeof *p);
			return NULL;
		}
		c->chans = p;
		c->cap_chans = cap;
	}
	struct channel *ch = &c->chans[c->n_chans];
	memset(ch, 0, sizeof *ch);
	ch->number = number;
	tap_buf_init(&ch->dir[TAP_S2C].store);
	tap_buf_init(&ch->dir[TAP_C2S].store);
	c->chan_index[index_slot(c->chan_index, c->index_cap, c->chans, number)] = (uint32_t)c->n_chans + 1;
	c->last_chan = c->n_chans++;
	return ch;
}

/* Appends to a channel's store, counted in the observer's pending_mem. Past its pending_max a store does
 * not grow: its content keeps nothing (as when out of memory: the record says details_lost), so that clients with
 * thousands of channels, each with a content in progress, cannot grow the tap without bound. */
void conn_store_put(const struct tap_conn *c, struct pending *p, const void *data, size_t len)
{
	struct tap_observer *o = c->o;
	size_t cap = p->store.cap;
	if (p->store.len + len > cap && o->pending_mem >= o->pending_max) {
		if (!p->store.oom)
			o->pending_over++;
		p->store.oom = true;
		return;
	}
	tap_buf_append(&p->store, data, len);
	o->pending_mem += p->store.cap - cap;
}

void conn_store_free(const struct tap_conn *c, struct tap_buf *store)
{
	c->o->pending_mem -= store->cap;
	tap_buf_deinit(store);
}

void conn_fp_free(const struct tap_conn *c, struct channel *ch)
{
	for (int d = 0; d < TAP_DIR_COUNT; d++) {
		if (!ch->fp[d])
			continue;
		tap_identity_stream_free(ch->fp[d]);
		ch->fp[d] = NULL;
		c->o->pending_mem -= tap_identity_stream_size();
	}
}

