/* The identity table (src/DESIGN.md §4b). Entries live in one pool (an array that doubles, free entries chained),
 * found through an open-addressing index of twice the pool's size (linear probing, deletion by moving back), and
 * each is on one of two lists in the order of its deadline: SETTLED (the latest attempt was answered, or needs no
 * resend: kept --resend-window to call a later attempt a duplicate) and UNRESOLVED (the latest ended unknown: its
 * resend_missing is due at the end of the window). Deadlines only grow along a list, as each entry goes on at its
 * tail with a deadline no earlier than the one before it.
 *
 * Bounded whatever clients send: the table takes at most conf.max_memory / TRK_IDENT_SHARE_DIV of the tracker's
 * budget (pool, index and the unresolved ones' message ids, all counted in t->mem); past it the oldest settled
 * identity is forgotten first, then the oldest unresolved (counted: ident_evicted, ident_evicted_unresolved). It
 * never makes room by evicting an outstanding publish. Per identity about 96 bytes (80 of entry, 8 of index at half
 * load, 8 of slack), 344 at most for an unresolved one with a long message_id: the default 32 MiB holds about
 * 380,000. */
#include "track_ident.h"

#include "track_budget.h"
#include "track_record.h"
#include "track_store.h"

#include <string.h>

#define IDENT_MIN_CAP 256u

static struct trk_ident_entry *entry(const struct trk_ident *id, uint32_t i1)
{
	return &id->pool[i1 - 1];
}

static uint32_t index_mask(const struct trk_ident *id)
{
	return id->cap * 2 - 1;
}

/* The entry of key (index + 1), or 0. */
static uint32_t find(const struct trk_ident *id, uint64_t key)
{
	if (!id->cap)
		return 0;
	uint32_t mask = index_mask(id);
	for (uint32_t i = (uint32_t)key & mask; id->index[i]; i = (i + 1) & mask)
		if (entry(id, id->index[i])->key == key)
			return id->index[i];
	return 0;
}

static void index_put(struct trk_ident *id, uint32_t i1)
{
	uint32_t mask = index_mask(id);
	uint32_t i = (uint32_t)entry(id, i1)->key & mask;
	while (id->index[i])
		i = (i + 1) & mask;
	id->index[i] = i1;
}

static void index_drop(struct trk_ident *id, uint32_t i1)
{
	uint32_t mask = index_mask(id);
	uint32_t i = (uint32_t)entry(id, i1)->key & mask;
	while (id->index[i] != i1)
		i = (i + 1) & mask;
	for (uint32_t j = (i + 1) & mask; id->index[j]; j = (j + 1) & mask) {
		uint32_t home = (uint32_t)entry(id, id->index[j])->key & mask;
		bool stays = i <= j ? home > i && home <= j : home > i || home <= j; /* home in (i, j], cyclically */
		if (!stays) {
			id->index[i] = id->index[j];
			i = j;
		}
	}
	id->index[i] = 0;
}

static void list_unlink(struct trk_ident *id, uint32_t i1)
{
	struct trk_ident_entry *e = entry(id, i1);
	struct trk_ident_list_ends *l = &id->lists[e->list];
	if (e->prev)
		entry(id, e->prev)->next = e->next;
	else
		l->head = e->next;
	if (e->next)
		entry(id, e->next)->prev = e->prev;
	else
		l->tail = e->prev;
	e->prev = e->next = 0;
}

/* On list's tail, due no earlier than the tail before it. */
static void list_append(struct trk_ident *id, uint32_t i1, enum trk_ident_list list, int64_t due)
{
	struct trk_ident_entry *e = entry(id, i1);
	struct trk_ident_list_ends *l = &id->lists[list];
	if (l->tail && entry(id, l->tail)->due > due)
		due = entry(id, l->tail)->due;
	e->list = (uint8_t)list;
	e->due = due;
	e->prev = l->tail;
	e->next = 0;
	if (l->tail)
		entry(id, l->tail)->next = i1;
	else
		l->head = i1;
	l->tail = i1;
}

static uint64_t id_cost(size_t len)
{
	return tap_mem_cost(len);
}

static void drop_message_id(struct tap_track *t, struct trk_ident_entry *e)
{
	if (!e->message_id)
		return;
	trk_free(t, e->message_id, e->message_id_len);
	t->ident.mem -= id_cost(e->message_id_len);
	e->message_id = NULL;
	e->message_id_len = 0;
}

/* Forgets entry i1: off its list and the index, onto the free list. */
static void forget(struct tap_track *t, uint32_t i1)
{
	struct trk_ident *id = &t->ident;
	struct trk_ident_entry *e = entry(id, i1);
	drop_message_id(t, e);
	list_unlink(id, i1);
	index_drop(id, i1);
	e->list = TRK_IDENT_FREE;
	e->next = id->free_head;
	id->free_head = i1;
	id->n--;
}

static uint64_t pool_cost(uint32_t cap)
{
	return tap_mem_cost((size_t)cap * sizeof(struct trk_ident_entry)) + tap_mem_cost((size_t)cap * 2 * sizeof(uint32_t));
}

/* The pool and index at cap (entries keep their places); false when out of memory or budget. The pool grows in
 * place where it can and only its new entries are set (as free ones); the index is made anew, zeroed by calloc. */
static bool grow(struct tap_track *t, uint32_t cap)
{
	struct trk_ident *id = &t->ident;
	uint64_t need = pool_cost(cap);
	if (id->mem - (id->cap ? pool_cost(id->cap) : 0) + need > id->share || !trk_fits(t, need))
		return false;
	uint32_t *index = trk_calloc(t, (size_t)cap * 2 * sizeof *index);
	if (!index)
		return false;
	struct trk_ident_entry *pool =
	    trk_realloc(t, id->pool, (size_t)id->cap * sizeof *pool, (size_t)cap * sizeof *pool);
	if (!pool) {
		trk_free(t, index, (size_t)cap * 2 * sizeof *index);
		return false;
	}
	for (uint32_t k = cap; k > id->cap; k--) { /* the new entries onto the free list, lowest first */
		struct trk_ident_entry *e = &pool[k - 1];
		e->list = TRK_IDENT_FREE;
		e->message_id = NULL;
		e->message_id_len = 0;
		e->next = id->free_head;
		id->free_head = k;
	}
	uint32_t old = id->cap;
	if (old) {
		trk_free(t, id->index, (size_t)old * 2 * sizeof *id->index);
		id->mem -= pool_cost(old);
	}
	id->pool = pool;
	id->index = index;
	id->cap = cap;
	id->mem += need;
	for (uint32_t k = 1; k <= old; k++)
		if (pool[k - 1].list != TRK_IDENT_FREE)
			index_put(id, k);
	return true;
}

/* The oldest settled identity, else the oldest unresolved one, is forgotten; false when the table is empty. */
static bool evict_one(struct tap_track *t)
{
	struct trk_ident *id = &t->ident;
	if (id->lists[TRK_IDENT_SETTLED].head) {
		forget(t, id->lists[TRK_IDENT_SETTLED].head);
		t->st.ident_evicted++;
		return true;
	}
	if (id->lists[TRK_IDENT_UNRESOLVED].head) {
		forget(t, id->lists[TRK_IDENT_UNRESOLVED].head);
		t->st.ident_evicted_unresolved++;
		return true;
	}
	return false;
}

/* A free entry (index + 1), made room for; 0 when none can be. */
static uint32_t take_free(struct tap_track *t)
{
	struct trk_ident *id = &t->ident;
	if (!id->free_head && !grow(t, id->cap ? id->cap * 2 : IDENT_MIN_CAP))
		(void)evict_one(t);
	uint32_t i1 = id->free_head;
	if (!i1)
		return 0;
	id->free_head = entry(id, i1)->next;
	id->n++;
	return i1;
}

/* What the previous attempt in e says about the one written now. */
static void repeat_of(const struct trk_ident_entry *e, const struct trk_view *v, struct trk_repeat *r)
{
	*r = (struct trk_repeat){
	    .seen = true,
	    .repeat = (uint8_t)tap_identity_classify((enum tap_track_route)e->route, (enum tap_track_confirm)e->confirm),
	    .route = e->route,
	    .confirm = e->confirm,
	    .channel = e->channel,
	    .has_seq = e->seq != 0,
	    .attempt = e->attempt + 1,
	    .conn = e->conn,
	    .seq = e->seq,
	    .ago_us = v->t_pub - e->t_pub,
	};
}

static void count_repeat(struct tap_track *t, const struct trk_repeat *r)
{
	switch ((enum tap_identity_repeat)r->repeat) {
	case TAP_REPEAT_RESEND:
		t->st.resends++;
		t->st.resend_delay_count++;
		t->st.resend_delay_sum_us += r->ago_us > 0 ? (uint64_t)r->ago_us : 0;
		tap_hist_add(&t->resend_hist, r->ago_us > 0 ? r->ago_us : 0);
		break;
	case TAP_REPEAT_DUPLICATE: t->st.duplicates++; break;
	case TAP_REPEAT_UNVERIFIED: t->st.unverified++; break;
	}
}

void trk_ident_publish(struct tap_track *t, const struct tap_track_conn *c, uint16_t ch, const struct trk_view *v,
                       const struct trk_verdict *vd, int64_t now_us, struct trk_repeat *r)
{
	struct trk_ident *id = &t->ident;
	r->seen = false;
	if (!v->identity_kind)
		return;
	if (!id->share)
		id->share = t->conf.max_memory / TRK_IDENT_SHARE_DIV;
	uint64_t key = v->identity; /* the two kinds are hashed with seeds of their own */
	uint32_t i1 = find(id, key);
	if (i1) {
		struct trk_ident_entry *e = entry(id, i1);
		repeat_of(e, v, r);
		count_repeat(t, r);
		drop_message_id(t, e);
		list_unlink(id, i1);
	} else {
		i1 = take_free(t);
		if (!i1) {
			t->st.ident_untracked++;
			return;
		}
		entry(id, i1)->key = key;
		index_put(id, i1);
	}
	struct trk_ident_entry *e = entry(id, i1);
	e->conn = c->id;
	e->channel = ch;
	e->seq = v->confirm_mode ? v->seq : 0;
	e->t_pub = v->t_pub;
	e->t_end = now_us;
	e->route = (uint8_t)vd->route;
	e->confirm = (uint8_t)vd->confirm;
	e->attempt = r->seen ? r->attempt : 1;
	e->kind = v->identity_kind;
	bool unresolved = tap_identity_wants_resend(vd->confirm, vd->reason ? vd->reason->by : NULL);
	if (unresolved && v->has_message_id && v->message_id_len) {
		size_t len = v->message_id_len > TRK_IDENT_ID_MAX ? TRK_IDENT_ID_MAX : v->message_id_len;
		while (id->mem + id_cost(len) > id->share && id->n > 1 && evict_one(t))
			;
		if (id->mem + id_cost(len) <= id->share && trk_fits(t, id_cost(len)) &&
		    (e->message_id = trk_alloc(t, len))) {
			memcpy(e->message_id, v->message_id, len);
			e->message_id_len = (uint8_t)len;
			id->mem += id_cost(len);
		}
	}
	int64_t due;
	if (__builtin_add_overflow(now_us, t->conf.resend_window_us, &due))
		due = INT64_MAX;
	list_append(id, i1, unresolved ? TRK_IDENT_UNRESOLVED : TRK_IDENT_SETTLED, due);
}

/* The resend_missing record of the unresolved entry i1, then it is forgotten. */
static void missing(struct tap_track *t, uint32_t i1, bool window_over, int64_t now_us)
{
	struct trk_ident_entry *e = entry(&t->ident, i1);
	/* at shutdown it is stamped with when it ended unknown: the same live and in a replay of the capture */
	trk_record_resend_missing(&t->render, e, t->conf.resend_window_us, window_over, window_over ? now_us : e->t_end);
	trk_emit(t);
	t->st.resend_missing++;
	if (t->missing_hook) {
		bool ok = !t->render.rec.oom;
		t->missing_hook(t->missing_ctx, (struct tap_slice){ok ? (const uint8_t *)t->render.rec.data : NULL,
		                                                   ok ? t->render.rec.len : 0});
	}
	forget(t, i1);
}

int64_t trk_ident_tick(struct tap_track *t, int64_t now_us)
{
	struct trk_ident *id = &t->ident;
	uint32_t i1;
	while ((i1 = id->lists[TRK_IDENT_UNRESOLVED].head) && entry(id, i1)->due <= now_us)
		missing(t, i1, true, now_us);
	while ((i1 = id->lists[TRK_IDENT_SETTLED].head) && entry(id, i1)->due <= now_us)
		forget(t, i1);
	if (!id->n && id->cap) /* the burst is over: its memory goes back (the share stays for the next) */
		trk_ident_free(t);
	int64_t next = INT64_MAX;
	for (int l = TRK_IDENT_SETTLED; l <= TRK_IDENT_UNRESOLVED; l++)
		if (id->lists[l].head && entry(id, id->lists[l].head)->due < next)
			next = entry(id, id->lists[l].head)->due;
	return next;
}

void trk_ident_shutdown(struct tap_track *t, int64_t now_us)
{
	uint32_t i1;
	while ((i1 = t->ident.lists[TRK_IDENT_UNRESOLVED].head))
		missing(t, i1, false, now_us);
}

void trk_ident_free(struct tap_track *t)
{
	struct trk_ident *id = &t->ident;
	for (uint32_t k = 1; k <= id->cap; k++)
		drop_message_id(t, entry(id, k));
	if (id->cap) {
		trk_free(t, id->pool, (size_t)id->cap * sizeof *id->pool);
		trk_free(t, id->index, (size_t)id->cap * 2 * sizeof *id->index);
	}
	memset(id, 0, sizeof *id);
}
