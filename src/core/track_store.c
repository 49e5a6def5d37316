/* Where the tracker keeps outstanding publishes (the bottom layer): per connection a sorted array of channels
 * created on first use, per channel a ring of 64-byte slots, a FIFO arena for their strings and queues of slot
 * numbers for the timers. Every byte allocated here is counted in t->mem (the budget of
 * tap_track_conf.max_memory), and given back when a channel empties or its ring and arena fall to a quarter of
 * their size. */
#include "track_store.h"

#include "amqptap/identity.h"

#include "mem.h"

#include <stdlib.h>
#include <string.h>

/* Queues this small stay when their channel empties. */
#define FIFO_MIN_CAP 64u

void *trk_alloc(struct tap_track *t, size_t n)
{
	return tap_mem_alloc(&t->mem, n);
}

void *trk_calloc(struct tap_track *t, size_t n)
{
	return tap_mem_calloc(&t->mem, n);
}

void *trk_realloc(struct tap_track *t, void *p, size_t old, size_t n)
{
	return tap_mem_realloc(&t->mem, p, old, n);
}

void trk_free(struct tap_track *t, void *p, size_t n)
{
	tap_mem_free(&t->mem, p, n);
}

void trk_free_str(struct tap_track *t, char **s)
{
	if (*s)
		trk_free(t, *s, strlen(*s) + 1);
	*s = NULL;
}

char *trk_dup(struct tap_track *t, const uint8_t *s, size_t len)
{
	char *p = trk_alloc(t, len + 1);
	if (!p)
		return NULL;
	if (len)
		memcpy(p, s, len);
	p[len] = '\0';
	return p;
}

bool trk_set_str(struct tap_track *t, char **dst, struct tap_slice s)
{
	trk_free_str(t, dst);
	const uint8_t *nul = s.len ? memchr(s.ptr, '\0', s.len) : NULL;
	*dst = trk_dup(t, s.ptr, nul ? (size_t)(nul - s.ptr) : s.len);
	if (*dst)
		return true;
	t->st.oom++; /* written as null */
	return false;
}

bool trk_set_cstr(struct tap_track *t, char **dst, const char *s)
{
	trk_free_str(t, dst);
	if (!s || (*dst = trk_dup(t, (const uint8_t *)s, strlen(s))))
		return true;
	t->st.oom++; /* written as null */
	return false;
}

/* ---- slot number queues ---- */

static bool fifo_resize(struct tap_track *t, struct trk_fifo *f, uint32_t cap)
{
	uint64_t *nv = trk_alloc(t, (size_t)cap * sizeof *nv);
	if (!nv)
		return false;
	for (uint32_t i = 0; i < f->len; i++)
		nv[i] = f->v[(f->head + i) & (f->cap - 1)];
	trk_free(t, f->v, (size_t)f->cap * sizeof *f->v);
	f->v = nv;
	f->cap = cap;
	f->head = 0;
	return true;
}

bool trk_fifo_push(struct tap_track *t, struct trk_fifo *f, uint64_t v)
{
	if (f->len == f->cap && !fifo_resize(t, f, f->cap ? f->cap * 2 : FIFO_MIN_CAP))
		return false;
	f->v[(f->head + f->len) & (f->cap - 1)] = v;
	f->len++;
	return true;
}

uint64_t trk_fifo_front(const struct trk_fifo *f)
{
	return f->v[f->head];
}

void trk_fifo_pop(struct trk_fifo *f)
{
	f->head = (f->head + 1) & (f->cap - 1);
	f->len--;
}

static void fifo_clear(struct tap_track *t, struct trk_fifo *f)
{
	f->len = 0;
	f->head = 0;
	if (f->cap > FIFO_MIN_CAP) {
		trk_free(t, f->v, (size_t)f->cap * sizeof *f->v);
		f->v = NULL;
		f->cap = 0;
	}
}

/* ---- channels ---- */

/* Where channel id is in c->chans, or where it would go. */
static uint32_t chan_pos(const struct tap_track_conn *c, uint16_t id)
{
	uint32_t lo = 0, hi = c->n_chans;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (c->chans[mid]->id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

struct trk_chan *trk_chan_find(const struct tap_track_conn *c, uint16_t id)
{
	uint32_t i = chan_pos(c, id);
	return i < c->n_chans && c->chans[i]->id == id ? c->chans[i] : NULL;
}

struct trk_chan *trk_chan_answering(const struct tap_track_conn *c, uint16_t id)
{
	return c->retired && c->retired->id == id ? c->retired : trk_chan_find(c, id);
}

struct trk_chan *trk_chan_get(struct tap_track_conn *c, uint16_t id)
{
	struct tap_track *t = c->t;
	uint32_t i = chan_pos(c, id);
	if (i < c->n_chans && c->chans[i]->id == id)
		return c->chans[i];
	if (c->n_chans == c->cap_chans) {
		uint32_t cap = c->cap_chans ? c->cap_chans * 2 : 4;
		struct trk_chan **a = trk_alloc(t, cap * sizeof *a);
		if (!a)
			return NULL;
		if (c->n_chans)
			memcpy(a, c->chans, c->n_chans * sizeof *a);
		trk_free(t, c->chans, c->cap_chans * sizeof *c->chans);
		c->chans = a;
		c->cap_chans = cap;
	}
	struct trk_chan *ch = tap_mem_calloc(&t->mem, sizeof *ch);
	if (!ch)
		return NULL;
	ch->id = id;
	ch->base = ch->next = 1;
	ch->active_idx = -1;
	ch->conn = c;
	tap_arena_init(&ch->arena, &t->mem);
	memmove(&c->chans[i + 1], &c->chans[i], (c->n_chans - i) * sizeof *c->chans);
	c->chans[i] = ch;
	c->n_chans++;
	trk_note_peak(t);
	return ch;
}

/* ---- the channels with outstanding publishes, oldest first (t->oldest, keyed by their base slot's t_pub) ---- */

static int64_t oldest_key(const struct trk_chan *ch)
{
	return trk_slot(ch, ch->base)->t_pub;
}

struct trk_chan *trk_oldest_chan(const struct tap_track *t)
{
	return tap_heap_top(&t->oldest);
}

/* ---- channels of a connection with outstanding publishes ---- */

static void active_remove(struct tap_track_conn *c, struct trk_chan *ch)
{
	tap_heap_remove(&c->t->oldest, ch);
	tap_heap_fit(&c->t->oldest, 0);
	if (ch->active_idx < 0)
		return;
	struct trk_chan *last = c->active[--c->n_active];
	c->active[ch->active_idx] = last;
	last->active_idx = ch->active_idx;
	ch->active_idx = -1;
}

static void active_add(struct tap_track_conn *c, struct trk_chan *ch)
{
	if (ch->active_idx >= 0)
		return;
	if (!tap_heap_set(&c->t->oldest, ch, oldest_key(ch)))
		return; /* not in the lists: tick and eviction do not see it, its end still writes it */
	if (c->n_active == c->cap_active) {
		uint32_t cap = c->cap_active ? c->cap_active * 2 : 8;
		struct trk_chan **a = trk_alloc(c->t, cap * sizeof *a);
		if (!a) {
			tap_heap_remove(&c->t->oldest, ch);
			return;
		}
		if (c->n_active)
			memcpy(a, c->active, c->n_active * sizeof *a);
		trk_free(c->t, c->active, c->cap_active * sizeof *c->active);
		c->active = a;
		c->cap_active = cap;
	}
	ch->active_idx = (int32_t)c->n_active;
	c->active[c->n_active++] = ch;
}

static void chans_remove(struct tap_track_conn *c, const struct trk_chan *ch)
{
	uint32_t i = chan_pos(c, ch->id);
	memmove(&c->chans[i], &c->chans[i + 1], (c->n_chans - i - 1) * sizeof *c->chans);
	c->n_chans--;
}

void trk_chan_retire(struct tap_track_conn *c, struct trk_chan *ch)
{
	chans_remove(c, ch);
	c->retired = ch;
}

void trk_chan_free(struct tap_track_conn *c, struct trk_chan *ch)
{
	struct tap_track *t = c->t;
	active_remove(c, ch);
	if (c->retired == ch)
		c->retired = NULL;
	else
		chans_remove(c, ch);
	if (ch->close_text)
		trk_free(t, ch->close_text, ch->close_text_len + 1);
	trk_free(t, ch->ring, ch->cap * sizeof *ch->ring);
	tap_arena_deinit(&ch->arena);
	trk_free(t, ch->held_q.v, (size_t)ch->held_q.cap * sizeof *ch->held_q.v);
	trk_free(t, ch->win_q.v, (size_t)ch->win_q.cap * sizeof *ch->win_q.v);
	trk_free(t, ch->plain_q.v, (size_t)ch->plain_q.cap * sizeof *ch->plain_q.v);
	trk_free(t, ch->tx_q.v, (size_t)ch->tx_q.cap * sizeof *ch->tx_q.v);
	if (ch->culprit)
		trk_free(t, ch->culprit, ch->culprit_len + 1);
	if (ch->timed_out)
		trk_free(t, ch->timed_out, ch->timed_out_len + 1);
	trk_free(t, ch, sizeof *ch);
}

/* ---- the ring of slots ---- */

static bool ring_resize(struct tap_track *t, struct trk_chan *ch, uint64_t cap)
{
	struct trk_slot *r = trk_alloc(t, cap * sizeof *r);
	if (!r)
		return false;
	for (uint64_t n = ch->base; n < ch->next; n++)
		r[n & (cap - 1)] = ch->ring[n & (ch->cap - 1)];
	trk_free(t, ch->ring, ch->cap * sizeof *ch->ring);
	ch->ring = r;
	ch->cap = cap;
	return true;
}

bool trk_ring_reserve(struct tap_track_conn *c, struct trk_chan *ch)
{
	return ch->next - ch->base < ch->cap || ring_resize(c->t, ch, ch->cap ? ch->cap * 2 : TRK_RING_MIN_CAP);
}

/* ---- giving memory back ---- */

static uint64_t blob_len(const struct trk_slot *e)
{
	return ((e->flags & TRK_FLAG_HAS_TIMESTAMP) ? sizeof(uint64_t) : 0) + e->message_id_len + e->correlation_id_len +
	       ((e->flags & (TRK_FLAG_IDENT_ID | TRK_FLAG_IDENT_FP)) ? sizeof(uint64_t) : 0);
}

/* Copies the blobs of the live slots, in order, into an arena of half the size (holes of finished slots
 * vanish). On failure the old arena stays. */
static void arena_compact(struct tap_track *t, struct trk_chan *ch)
{
	struct tap_arena na;
	tap_arena_init(&na, &t->mem);
	if (!tap_arena_reserve(&na, ch->arena.cap / 2))
		return;
	for (uint64_t n = ch->base; n < ch->next; n++) {
		struct trk_slot *e = trk_slot(ch, n);
		if (e->state == TRK_STATE_DONE || (e->flags & TRK_FLAG_NO_BLOB))
			continue;
		uint64_t len = blob_len(e);
		uint64_t off = tap_arena_alloc(&na, len);
		if (off == TAP_ARENA_NONE) {
			tap_arena_deinit(&na);
			return;
		}
		if (len)
			memcpy(tap_arena_ptr(&na, off), tap_arena_ptr(&ch->arena, e->blob), len);
		e->blob = off;
	}
	tap_arena_deinit(&ch->arena);
	ch->arena = na;
}

/* The channel emptied: keep only small buffers, and none while room is being made or the budget is spent (idle
 * channels by the thousand would otherwise hold 2 KB each that no eviction can take back). */
static void chan_shrink_empty(struct tap_track *t, struct trk_chan *ch)
{
	bool keep_small = !t->squeeze && t->mem <= t->conf.max_memory;
	fifo_clear(t, &ch->held_q);
	fifo_clear(t, &ch->win_q);
	fifo_clear(t, &ch->plain_q);
	if (ch->cap > (keep_small ? TRK_RING_MIN_CAP : 0)) {
		trk_free(t, ch->ring, ch->cap * sizeof *ch->ring);
		ch->ring = NULL;
		ch->cap = 0;
	}
	if (ch->arena.cap > (keep_small ? TAP_ARENA_MIN_CAP : 0))
		tap_arena_release(&ch->arena);
}

/* Halves the ring and the arena when a quarter of them is used: growth doubled them, so each halving follows
 * at least as many releases as the copy costs. */
static void chan_shrink(struct tap_track *t, struct trk_chan *ch)
{
	if (ch->cap > TRK_RING_MIN_CAP && (ch->next - ch->base) * 4 <= ch->cap) {
		/* a failed resize leaves the ring as it was */
		(void)ring_resize(t, ch, ch->cap / 2);
	}
	if (ch->arena.cap > TAP_ARENA_MIN_CAP && tap_arena_used(&ch->arena) * 4 <= ch->arena.cap)
		arena_compact(t, ch);
}

void trk_slot_stored(struct tap_track_conn *c, struct trk_chan *ch, uint64_t n)
{
	struct trk_slot *e = trk_slot(ch, n);
	if (ch->live++ == 0) {
		active_add(c, ch);
		ch->arena.head = (e->flags & TRK_FLAG_NO_BLOB) ? ch->arena.tail : e->blob;
	}
	c->outstanding++;
	c->t->st.outstanding++;
	trk_note_peak(c->t);
}

void trk_slot_release(struct tap_track_conn *c, struct trk_chan *ch, uint64_t n)
{
	struct tap_track *t = c->t;
	struct trk_slot *e = trk_slot(ch, n);
	enum tap_intern_keep keep = t->squeeze || t->mem > t->conf.max_memory ? TAP_INTERN_KEEP_DROP
	                                                                      : TAP_INTERN_KEEP_CACHE;
	if (e->state == TRK_STATE_HELD)
		t->st.held--;
	e->state = TRK_STATE_DONE;
	tap_intern_put(&c->keys, e->route_key, keep);
	tap_intern_put(&c->keys, e->extra, keep);
	if (e->flags & TRK_FLAG_RETURNED)
		tap_intern_put(&c->keys, e->reply_text, keep);
	ch->live--;
	c->outstanding--;
	t->st.outstanding--;
	while (ch->base < ch->next && trk_slot(ch, ch->base)->state == TRK_STATE_DONE)
		ch->base++;
	if (ch->base == ch->next) {
		ch->arena.head = ch->arena.tail;
		ch->held_q.len = 0;
		ch->win_q.len = 0;
		ch->plain_q.len = 0;
		active_remove(c, ch);
	} else {
		const struct trk_slot *h = trk_slot(ch, ch->base);
		if (!(h->flags & TRK_FLAG_NO_BLOB))
			ch->arena.head = h->blob;
		if (tap_heap_has(&t->oldest, ch)) /* its base moved: usually later, in replay maybe earlier */
			(void)tap_heap_set(&t->oldest, ch, oldest_key(ch)); /* it is in: nothing to allocate */
	}
	if (ch->pinned)
		ch->shrink_pending = true;
	else
		trk_chan_shrink(t, ch);
}

void trk_chan_shrink(struct tap_track *t, struct trk_chan *ch)
{
	if (ch->base == ch->next)
		chan_shrink_empty(t, ch);
	else
		chan_shrink(t, ch);
}

void trk_mark_blocked(struct tap_track_conn *c)
{
	for (uint32_t i = 0; i < c->n_active; i++) {
		struct trk_chan *ch = c->active[i];
		for (uint64_t n = ch->base; n < ch->next; n++) {
			struct trk_slot *e = trk_slot(ch, n);
			if (e->state == TRK_STATE_WAIT)
				e->flags |= TRK_FLAG_BLOCKED;
		}
	}
}

/* Where the interned properties x hold the header values (track.c interns them after the properties). */
static struct trk_values values_of(const struct tap_intern_key *x)
{
	struct trk_values values;
	memcpy(&values, x->data + x->alen, sizeof values);
	return values;
}

void trk_view_of_slot(struct trk_view *v, const struct tap_track_conn *c, const struct trk_chan *ch, uint64_t n)
{
	const struct trk_slot *e = trk_slot(ch, n);
	const struct tap_intern_key *k = e->route_key != TAP_INTERN_NONE ? tap_intern_key(&c->keys, e->route_key) : NULL;
	const struct tap_intern_key *x = e->extra != TAP_INTERN_NONE ? tap_intern_key(&c->keys, e->extra) : NULL;
	bool no_blob = e->flags & TRK_FLAG_NO_BLOB;
	const uint8_t *blob = no_blob || !ch->arena.cap ? NULL : tap_arena_ptr(&ch->arena, e->blob);
	uint64_t ts = 0;
	if (blob && (e->flags & TRK_FLAG_HAS_TIMESTAMP)) {
		memcpy(&ts, blob, sizeof ts);
		blob += sizeof ts;
	}
	*v = (struct trk_view){
	    .exchange = k ? k->data : NULL,
	    .exchange_len = k ? k->alen : 0,
	    .routing_key = k ? k->data + k->alen : NULL,
	    .routing_key_len = k ? k->blen : 0,
	    .message_id = blob,
	    .message_id_len = blob ? e->message_id_len : 0,
	    .correlation_id = blob ? blob + e->message_id_len : NULL,
	    .correlation_id_len = blob ? e->correlation_id_len : 0,
	    .extra = x ? x->data : NULL,
	    .extra_len = x ? x->alen : 0,
	    .values = x && x->blen == sizeof v->values ? values_of(x) : (struct trk_values){0, 0},
	    .mandatory = e->flags & TRK_FLAG_MANDATORY,
	    .has_message_id = (e->flags & TRK_FLAG_HAS_MESSAGE_ID) && !no_blob,
	    .has_correlation_id = (e->flags & TRK_FLAG_HAS_CORRELATION_ID) && !no_blob,
	    .route_lost = !k,
	    .details_lost = !k || (no_blob && (e->flags & (TRK_FLAG_HAS_MESSAGE_ID | TRK_FLAG_HAS_CORRELATION_ID |
	                                                   TRK_FLAG_HAS_TIMESTAMP))),
	    .has_delivery_mode = e->flags & TRK_FLAG_HAS_DELIVERY_MODE,
	    .has_timestamp = blob && (e->flags & TRK_FLAG_HAS_TIMESTAMP),
	    .timestamp = ts,
	    .confirm_mode = (e->flags & (TRK_FLAG_CONFIRM | TRK_FLAG_SEQ_LOST)) == TRK_FLAG_CONFIRM,
	    .tx = e->flags & TRK_FLAG_TX,
	    .blocked = e->flags & TRK_FLAG_BLOCKED,
	    .refused = e->flags & TRK_FLAG_REFUSED,
	    .culprit = e->flags & TRK_FLAG_CULPRIT,
	    .refused_unnamed = ch->refusal == TRK_REFUSAL_UNNAMED,
	    .delivery_mode = e->delivery_mode,
	    .body_size = e->body_size,
	    .header_lost = e->flags & TRK_FLAG_NO_HEADER,
	    .topo = e->flags & (TRK_FLAG_TOPO_NONE | TRK_FLAG_TOPO_SOME),
	    .seq = n - ch->sel_off,
	    .t_pub = e->t_pub,
	};
	if (blob && (e->flags & (TRK_FLAG_IDENT_ID | TRK_FLAG_IDENT_FP))) {
		memcpy(&v->identity, blob + e->message_id_len + e->correlation_id_len, sizeof v->identity);
		v->identity_kind = (e->flags & TRK_FLAG_IDENT_ID) ? TAP_IDENTITY_ID : TAP_IDENTITY_FINGERPRINT;
	}
}

bool trk_fault_put(struct tap_track_conn *c, uint16_t ch, uint64_t seq, uint8_t saw, uint32_t rule, bool replace)
{
	for (uint32_t i = 0; i < c->n_fault_marks; i++) { /* a kill's marks may follow a nack's of one publish */
		struct trk_fault_mark *m = &c->fault_marks[i];
		if (m->ch == ch && m->seq == seq) {
			if (replace) {
				m->saw = saw;
				m->rule = rule;
			}
			return true;
		}
	}
	if (c->n_fault_marks == c->cap_fault_marks) {
		if (c->cap_fault_marks >= TAP_FAULT_TAGS_MAX)
			return false;
		uint32_t cap = c->cap_fault_marks ? c->cap_fault_marks * 2 : 16;
		struct trk_fault_mark *n = trk_alloc(c->t, cap * sizeof *n);
		if (!n)
			return false;
		if (c->n_fault_marks)
			memcpy(n, c->fault_marks, c->n_fault_marks * sizeof *n);
		trk_free(c->t, c->fault_marks, c->cap_fault_marks * sizeof *n);
		c->fault_marks = n;
		c->cap_fault_marks = cap;
	}
	c->fault_marks[c->n_fault_marks++] = (struct trk_fault_mark){.seq = seq, .rule = rule, .ch = ch, .saw = saw};
	return true;
}

bool trk_fault_take(struct tap_track_conn *c, uint16_t ch, uint64_t seq, struct trk_fault_mark *out)
{
	for (uint32_t i = 0; i < c->n_fault_marks; i++) {
		if (c->fault_marks[i].ch != ch || c->fault_marks[i].seq != seq)
			continue;
		*out = c->fault_marks[i];
		c->fault_marks[i] = c->fault_marks[--c->n_fault_marks];
		return true;
	}
	return false;
}

void trk_fault_free(struct tap_track_conn *c)
{
	trk_free(c->t, c->fault_marks, c->cap_fault_marks * sizeof *c->fault_marks);
	c->fault_marks = NULL;
	c->n_fault_marks = c->cap_fault_marks = 0;
}
