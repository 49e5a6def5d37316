/* The publish lifecycle (DESIGN §3-§4, PROTOCOL §7-§11): decoded events of both directions move each outstanding
 * publish through the states drawn in track_int.h; verdict_of() alone decides its route, confirm and order, and
 * every publish ends in exactly one `publish` record, counted here and rendered by track_record.c. Tracking
 * memory is bounded by tap_track_conf.max_memory: past it the oldest outstanding publishes are evicted. */
#include "track_int.h"

#include "mem.h"

#include <stdlib.h>
#include <string.h>

static const struct trk_reason no_memory = {.by = "no_memory"};
static const struct trk_reason ambiguous_return = {.by = "ambiguous_return"};
static const struct trk_reason beyond_channel_max = {.by = "channel_max"};
static const struct trk_reason evicted = {.by = "evicted"};
static const struct trk_reason evicted_for_memory = {
    .by = "evicted", .text = (const uint8_t *)"max-tracking-memory", .text_len = sizeof "max-tracking-memory" - 1};

void trk_emit(struct tap_track *t)
{
	t->st.records++;
	if (t->render.rec.oom) {
		t->st.oom++;
		t->st.records_oom++;
		return;
	}
	t->emit(t->ctx, t->render.rec.data, t->render.rec.len);
}

/* ---- the verdict ---- */

/* What ev does to the publish in slot e (see the drawing above enum trk_state): the state it moves to, and for
 * DONE the verdict its record is written with. Reads e, changes nothing. */
static enum trk_state route_of(const struct trk_slot *e, enum trk_event ev, const struct trk_reason *why,
                                 struct trk_verdict *vd)
{
	bool confirm_mode = e->flags & TRK_FLAG_CONFIRM;
	bool returned = e->flags & TRK_FLAG_RETURNED;
	*vd = (struct trk_verdict){.t_ack = e->t_ack, .t_ret = e->t_ret, .multiple = e->flags & TRK_FLAG_MULTIPLE};
	enum tap_track_confirm unanswered = confirm_mode ? TAP_TRACK_CONFIRM_UNKNOWN : TAP_TRACK_CONFIRM_NONE;

	if (e->state == TRK_STATE_HELD) {
		vd->confirm = TAP_TRACK_CONFIRM_ACK;
		if (ev == TRK_EVENT_GAP) { /* acked, but a late Return may have been in the lost bytes */
			vd->route = TAP_TRACK_ROUTE_UNKNOWN;
			vd->reason = why;
		} else if (ev == TRK_EVENT_RETURN) {
			vd->route = TAP_TRACK_ROUTE_RETURNED;
			vd->order = TAP_TRACK_ORDER_ACK_BEFORE_RETURN;
		} else {
			vd->route = TAP_TRACK_ROUTE_ROUTED;
		}
		return TRK_STATE_DONE;
	}
	if (e->flags & TRK_FLAG_CUT) { /* whatever ends it: the broker dropped what it had of it, or never had it */
		vd->route = TAP_TRACK_ROUTE_UNKNOWN;
		vd->confirm = unanswered;
		vd->reason = why;
		return TRK_STATE_DONE;
	}
	switch (ev) {
	case TRK_EVENT_ACK:
	case TRK_EVENT_NACK:
		vd->confirm = ev == TRK_EVENT_ACK ? TAP_TRACK_CONFIRM_ACK : TAP_TRACK_CONFIRM_NACK;
		if (returned) {
			vd->route = TAP_TRACK_ROUTE_RETURNED;
			vd->order = TAP_TRACK_ORDER_RETURN_BEFORE_ACK;
		} else if (ev == TRK_EVENT_ACK && (e->flags & TRK_FLAG_MANDATORY)) {
			return TRK_STATE_HELD;
		} else {
			vd->route = TAP_TRACK_ROUTE_UNPROVEN;
		}
		return TRK_STATE_DONE;
	case TRK_EVENT_RETURN:
		if (confirm_mode)
			return TRK_STATE_WAIT;
		vd->route = TAP_TRACK_ROUTE_RETURNED;
		vd->confirm = TAP_TRACK_CONFIRM_NONE;
		return TRK_STATE_DONE;
	case TRK_EVENT_TIMEOUT:
	case TRK_EVENT_UNTRACKED:
		vd->route = TAP_TRACK_ROUTE_UNPROVEN;
		vd->confirm = TAP_TRACK_CONFIRM_NONE;
		return TRK_STATE_DONE;
	case TRK_EVENT_END:
		if (returned) {
			vd->route = TAP_TRACK_ROUTE_RETURNED;
			vd->confirm = unanswered;
		} else if ((why->settled && !confirm_mode && !(e->flags & (TRK_FLAG_REFUSED | TRK_FLAG_TX))) ||
		           (e->flags & (TRK_FLAG_PLAIN | TRK_FLAG_REFUSED)) == TRK_FLAG_PLAIN) {
			/* its return window closed early: no Return came; or a plain publish no close refused */
			vd->route = TAP_TRACK_ROUTE_UNPROVEN;
			vd->confirm = TAP_TRACK_CONFIRM_NONE;
		} else {
			vd->route = TAP_TRACK_ROUTE_UNKNOWN;
			vd->confirm = unanswered;
		}
		if (vd->confirm == TAP_TRACK_CONFIRM_UNKNOWN || vd->route == TAP_TRACK_ROUTE_UNKNOWN)
			vd->reason = why;
		return TRK_STATE_DONE;
	case TRK_EVENT_COMMIT: /* a mandatory one without a Return was routed; of another nothing is proven */
		vd->route = (e->flags & TRK_FLAG_MANDATORY) ? TAP_TRACK_ROUTE_ROUTED : TAP_TRACK_ROUTE_UNPROVEN;
		vd->confirm = TAP_TRACK_CONFIRM_NONE;
		return TRK_STATE_DONE;
	case TRK_EVENT_GAP: /* whatever decided it may have been lost: only what was seen stands */
		vd->route = returned ? TAP_TRACK_ROUTE_RETURNED : TAP_TRACK_ROUTE_UNKNOWN;
		vd->confirm = unanswered;
		vd->reason = why;
		return TRK_STATE_DONE;
	}
	return TRK_STATE_WAIT;
}

/* route_of, and a publish an ambiguous Return may have been for is never routed or unproven: unknown. */
static enum trk_state verdict_of(const struct trk_slot *e, enum trk_event ev, const struct trk_reason *why,
                                 struct trk_verdict *vd)
{
	enum trk_state next = route_of(e, ev, why, vd);
	if (next == TRK_STATE_DONE && (e->flags & TRK_FLAG_AMBIGUOUS) &&
	    (vd->route == TAP_TRACK_ROUTE_ROUTED || vd->route == TAP_TRACK_ROUTE_UNPROVEN)) {
		vd->route = TAP_TRACK_ROUTE_UNKNOWN;
		if (!vd->reason)
			vd->reason = &ambiguous_return;
	}
	return next;
}

static void count_verdict(struct tap_track_conn *c, const struct trk_view *v, const struct trk_verdict *vd)
{
	struct tap_track *t = c->t;
	struct trk_counts *k = &c->counts;
	t->st.publish_records++;
	switch (vd->route) {
	case TAP_TRACK_ROUTE_ROUTED:
		k->routed++;
		t->st.routed++;
		break;
	case TAP_TRACK_ROUTE_RETURNED:
		k->returned++;
		t->st.returned++;
		break;
	case TAP_TRACK_ROUTE_UNPROVEN:
		k->unproven++;
		t->st.unproven++;
		break;
	case TAP_TRACK_ROUTE_UNKNOWN:
		k->unknown++;
		t->st.unknown++;
		break;
	}
	switch (vd->confirm) {
	case TAP_TRACK_CONFIRM_ACK:
	case TAP_TRACK_CONFIRM_NACK:
		if (vd->confirm == TAP_TRACK_CONFIRM_ACK) {
			k->acked++;
			t->st.acked++;
		} else {
			k->nacked++;
			t->st.nacked++;
		}
		if (c->hist)
			tap_hist_add(c->hist, vd->t_ack - v->t_pub);
		tap_hist_add(&t->hist, vd->t_ack - v->t_pub);
		break;
	case TAP_TRACK_CONFIRM_NONE:
		t->st.confirm_none++;
		break;
	case TAP_TRACK_CONFIRM_UNKNOWN:
		t->st.confirm_unknown++;
		break;
	}
}

static void call_verdict_hook(struct tap_track_conn *c, uint16_t ch, const struct trk_view *v,
                              const struct trk_verdict *vd, int64_t now_us)
{
	struct tap_track *t = c->t;
	bool answered = vd->confirm == TAP_TRACK_CONFIRM_ACK || vd->confirm == TAP_TRACK_CONFIRM_NACK;
	bool returned = vd->route == TAP_TRACK_ROUTE_RETURNED;
	const struct trk_reason *why = vd->reason;
	struct tap_track_verdict h = {
	    .conn = c->id,
	    .channel = ch,
	    .has_seq = v->confirm_mode,
	    .seq = v->confirm_mode ? v->seq : 0,
	    .exchange = {v->exchange, v->exchange_len},
	    .routing_key = {v->routing_key, v->routing_key_len},
	    .message_id = {v->has_message_id ? v->message_id : NULL, v->message_id_len},
	    .mandatory = v->mandatory,
	    .tx = v->tx,
	    .body_size = v->body_size,
	    .route = vd->route,
	    .confirm = vd->confirm,
	    .order = vd->order,
	    .multiple = answered && vd->multiple,
	    .reply_code = returned ? vd->reply_code : 0,
	    .reply_text = {returned ? vd->reply_text : NULL, returned ? vd->reply_text_len : 0},
	    .reason_by = why ? why->by : NULL,
	    .has_reason_code = why && why->has_code,
	    .reason_code = why ? why->code : 0,
	    .reason_text = {why ? why->text : NULL, why ? why->text_len : 0},
	    .t_pub = v->t_pub,
	    .t_record = now_us,
	    .return_us = returned ? vd->t_ret - v->t_pub : -1,
	    .confirm_us = answered ? vd->t_ack - v->t_pub : -1,
	    .record = {t->render.rec.oom ? NULL : (const uint8_t *)t->render.rec.data, t->render.rec.oom ? 0 : t->render.rec.len},
	};
	t->verdict_hook(t->verdict_ctx, &h);
}

/* The one place a publish ends: its record is written, counted and shown to the verdict hook (while the render
 * buffer still holds the record: a warning may be written next). */
static void publish_done(struct tap_track_conn *c, uint16_t ch, const struct trk_view *v, const struct trk_verdict *vd,
                         int64_t now_us)
{
	struct tap_track *t = c->t;
	trk_record_publish(&t->render, c, ch, v, vd, now_us);
	trk_emit(t);
	count_verdict(c, v, vd);
	if (t->verdict_hook)
		call_verdict_hook(c, ch, v, vd, now_us);
	trk_warn_done(c, v, vd);
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

/* A timer of c's channels runs out at start + window: tap_track_tick must not skip c past it. */
static void due_at(struct tap_track_conn *c, int64_t start, int64_t window)
{
	int64_t due;
	if (__builtin_add_overflow(start, window, &due))
		due = INT64_MAX;
	if (due < c->next_due) {
		c->next_due = due;
		(void)tap_heap_set(&c->t->due, c, due); /* tap_track_conn_new made room for every connection */
	}
}

void trk_due_now(struct tap_track_conn *c, int64_t now_us)
{
	due_at(c, now_us, 0);
}

void trk_slot_step(struct tap_track_conn *c, struct trk_chan *ch, uint64_t n, enum trk_event ev,
                   const struct trk_reason *why, int64_t stamp_us)
{
	struct tap_track *t = c->t;
	struct trk_slot *e = trk_slot(ch, n);
	struct trk_verdict vd;
	enum trk_state next = verdict_of(e, ev, why, &vd);
	if (e->flags & TRK_FLAG_PLAIN)
		stamp_us = e->t_pub; /* the ts it had before plain publishes were held */
	if (next == TRK_STATE_WAIT)
		return;
	trk_warn_settled(ch, e, ev, stamp_us);
	if (next == TRK_STATE_HELD) {
		bool queued = trk_fifo_push(t, &ch->held_q, n);
		e->state = TRK_STATE_HELD;
		t->st.held++;
		if (queued) {
			due_at(c, e->t_ack, t->conf.late_return_us);
			return;
		}
		t->st.oom++; /* no room to hold it: written now, as if its hold were over */
		next = verdict_of(e, TRK_EVENT_TIMEOUT, NULL, &vd);
	}
	if (e->flags & TRK_FLAG_RETURNED) {
		vd.reply_code = e->reply_code;
		if (e->reply_text != TAP_INTERN_NONE) {
			const struct tap_intern_key *k = tap_intern_key(&c->keys, e->reply_text);
			vd.reply_text = k->data;
			vd.reply_text_len = k->alen;
		}
	}
	struct trk_view v;
	trk_view_of_slot(&v, c, ch, n);
	publish_done(c, ch->id, &v, &vd, stamp_us);
	trk_slot_release(c, ch, n);
	if (vd.confirm == TAP_TRACK_CONFIRM_ACK && !v.mandatory && !ch->warned_confirm_without_mandatory) {
		ch->warned_confirm_without_mandatory = true;
		trk_warn(c, ch->id, TAP_TRACK_RULE_CONFIRM_WITHOUT_MANDATORY, v.seq, stamp_us);
	}
	if (vd.order == TAP_TRACK_ORDER_ACK_BEFORE_RETURN && !ch->warned_ack_before_return) {
		ch->warned_ack_before_return = true;
		trk_warn(c, ch->id, TAP_TRACK_RULE_ACK_BEFORE_RETURN, v.seq, stamp_us);
	}
}

/* ---- the memory budget ---- */

static bool fits(const struct tap_track *t, uint64_t need)
{
	return t->mem + need <= t->conf.max_memory;
}

/* The oldest outstanding publish of the whole process is written now as evicted for memory, after the cached
 * strings of its connection are freed. Returns false when nothing is outstanding. */
static bool evict_for_memory(struct tap_track *t, int64_t now_us)
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
	while (!fits(t, need)) {
		if (!evict_for_memory(t, now_us))
			return; /* nothing left to evict: the allocation goes past the budget */
	}
}

/* An interned string with room made for it: an existing one costs nothing. */
static uint32_t intern_in_budget(struct tap_track_conn *c, enum trk_tag tag, const uint8_t *a, size_t alen,
                                 const uint8_t *b, size_t blen, int64_t now_us)
{
	struct tap_track *t = c->t;
	while (!fits(t, tap_intern_cost_bound(&c->keys, alen + blen)) &&
	       tap_intern_find(&c->keys, tag, a, alen, b, blen) == TAP_INTERN_NONE) {
		if (!evict_for_memory(t, now_us)) /* the oldest go first, the pinned channel's own included */
			break;
	}
	return tap_intern_get(&c->keys, tag, a, alen, b, blen);
}

void *trk_alloc_in_budget(struct tap_track *t, size_t n, int64_t now_us)
{
	trk_make_room(t, tap_mem_cost(n), now_us);
	return tap_mem_calloc(&t->mem, n);
}

/* ---- publishes ---- */

/* The oldest outstanding publish of the connection is written now as evicted. */
static void evict_oldest(struct tap_track_conn *c, int64_t now_us)
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
	c->t->st.evicted++;
	trk_slot_step(c, oldest, oldest->base, TRK_EVENT_END, &evicted, now_us);
}

/* A publish with nothing to wait for (or no memory to wait) is written at once. */
static void publish_untracked(struct tap_track_conn *c, uint16_t id, struct trk_chan *ch, const struct tap_publish *p,
                              bool want, int64_t now_us)
{
	struct tap_track *t = c->t;
	bool confirm_mode = ch && ch->mode == TRK_MODE_CONFIRM;
	struct trk_slot e = {.state = TRK_STATE_WAIT,
	                     .flags = (uint32_t)((p->mandatory ? TRK_FLAG_MANDATORY : 0) |
	                                         (confirm_mode ? TRK_FLAG_CONFIRM : 0) |
	                                         (p->content_cut ? TRK_FLAG_CUT : 0) |
	                                         (p->header_lost ? TRK_FLAG_NO_HEADER : 0))};
	struct trk_verdict vd;
	struct trk_reason unseen = {.by = c->unseen_by ? c->unseen_by : no_memory.by};
	bool beyond = !ch && trk_chan_beyond_max(c);
	if (!ch || ch->mode == TRK_MODE_UNKNOWN) {
		/* nothing it is answered with can be placed (DESIGN §6b), no memory to know its channel's mode, or a
		 * channel the broker refuses (no state is kept for it) */
		vd = (struct trk_verdict){.route = TAP_TRACK_ROUTE_UNKNOWN,
		                          .confirm = TAP_TRACK_CONFIRM_UNKNOWN,
		                          .reason = ch ? &unseen : beyond ? &beyond_channel_max : &no_memory};
	} else {
		(void)verdict_of(&e, want ? TRK_EVENT_END : TRK_EVENT_UNTRACKED, &no_memory, &vd);
	}
	if ((want || !ch) && !beyond)
		t->st.oom++;
	struct trk_view v = {
	    .exchange = p->exchange.ptr,
	    .exchange_len = p->exchange.len,
	    .routing_key = p->routing_key.ptr,
	    .routing_key_len = p->routing_key.len,
	    .message_id = p->message_id.ptr,
	    .message_id_len = p->message_id.len,
	    .correlation_id = p->correlation_id.ptr,
	    .correlation_id_len = p->correlation_id.len,
	    .extra = (const uint8_t *)t->extra.data,
	    .extra_len = t->extra.len,
	    .mandatory = p->mandatory,
	    .has_message_id = p->has_message_id && !p->details_lost,
	    .has_correlation_id = p->has_correlation_id && !p->details_lost,
	    .route_lost = p->details_lost,
	    .details_lost = p->details_lost,
	    .has_delivery_mode = p->has_delivery_mode,
	    .has_timestamp = p->has_timestamp,
	    .confirm_mode = confirm_mode,
	    .tx = ch && ch->mode == TRK_MODE_TX,
	    .blocked = c->blocked,
	    .delivery_mode = p->delivery_mode,
	    .body_size = p->body_size,
	    .header_lost = p->header_lost,
	    .timestamp = p->timestamp,
	    .t_pub = now_us,
	};
	if (confirm_mode) {
		/* the ring is empty here: the sequence number is used up with nothing stored */
		v.seq = ch->next - ch->sel_off;
		ch->next++;
		ch->base = ch->next;
	}
	publish_done(c, id, &v, &vd, now_us);
}

/* What a stored publish keeps in its channel's arena: [timestamp] message_id correlation_id (each id cut to 255
 * bytes). */
struct blob_lens {
	size_t timestamp, message_id, correlation_id;
	uint64_t total;
};

static struct blob_lens blob_lens_of(const struct tap_publish *p)
{
	struct blob_lens l = {
	    .timestamp = p->has_timestamp ? sizeof p->timestamp : 0,
	    .message_id = p->has_message_id ? (p->message_id.len > 255 ? 255 : p->message_id.len) : 0,
	    .correlation_id = p->has_correlation_id ? (p->correlation_id.len > 255 ? 255 : p->correlation_id.len) : 0,
	};
	l.total = l.timestamp + l.message_id + l.correlation_id;
	return l;
}

/* Whether storing a publish can go past the budget. Growth at most doubles a ring, an arena or an intern array
 * (plus their minimum sizes and a blob of up to 518 bytes that may need 4x room), so while three times the
 * tracker's memory fits, nothing needs looking at: the common case costs one comparison. */
enum room {
	ROOM_AMPLE,
	ROOM_TIGHT,
};

static enum room room_for(const struct tap_track_conn *c, const struct trk_chan *ch, const struct tap_publish *p,
                          uint64_t blob_len)
{
	const struct tap_track *t = c->t;
	uint64_t strings = t->extra.len + p->exchange.len + p->routing_key.len;
	if (fits(t, 2 * t->mem + 4096 + 4 * blob_len + strings))
		return ROOM_AMPLE;
	uint64_t worst = trk_ring_growth(ch) + tap_arena_growth(&ch->arena, blob_len) +
	                 tap_intern_cost_bound(&c->keys, t->extra.len) +
	                 tap_intern_cost_bound(&c->keys, p->exchange.len + p->routing_key.len);
	return fits(t, worst) ? ROOM_AMPLE : ROOM_TIGHT;
}

/* Whether RabbitMQ may refuse p whatever its route: immediate (540, not implemented), or a user_id that is not
 * the login user (406; or the login was not seen). */
static bool refusable(const struct tap_track_conn *c, const struct tap_publish *p)
{
	if (p->immediate)
		return true;
	if (!p->has_user_id)
		return false;
	return !c->user || strlen(c->user) != p->user_id.len || memcmp(c->user, p->user_id.ptr, p->user_id.len) != 0;
}

/* Stores the publish in slot n = ch->next of a pinned channel whose ring has room, then makes it outstanding. */
static void publish_store(struct tap_track_conn *c, struct trk_chan *ch, const struct tap_publish *p,
                          const struct blob_lens *len, enum room room, bool plain, int64_t now_us)
{
	struct tap_track *t = c->t;
	bool confirm_mode = ch->mode == TRK_MODE_CONFIRM;
	uint64_t n = ch->next;
	struct trk_slot *e = trk_slot(ch, n);
	*e = (struct trk_slot){
	    .t_pub = now_us,
	    .body_size = p->body_size,
	    .reply_text = TAP_INTERN_NONE,
	    .extra = TAP_INTERN_NONE,
	    .message_id_len = (uint8_t)len->message_id,
	    .correlation_id_len = (uint8_t)len->correlation_id,
	    .state = TRK_STATE_WAIT,
	    .delivery_mode = p->delivery_mode,
	};
	e->flags = (uint32_t)((p->mandatory ? TRK_FLAG_MANDATORY : 0) | (confirm_mode ? TRK_FLAG_CONFIRM : 0) |
	                      (p->content_cut ? TRK_FLAG_CUT : 0) | (p->header_lost ? TRK_FLAG_NO_HEADER : 0) |
	                      (ch->mode == TRK_MODE_TX ? TRK_FLAG_TX : 0) |
	                      (p->has_message_id ? TRK_FLAG_HAS_MESSAGE_ID : 0) |
	                      (p->has_correlation_id ? TRK_FLAG_HAS_CORRELATION_ID : 0) |
	                      (p->has_delivery_mode ? TRK_FLAG_HAS_DELIVERY_MODE : 0) |
	                      (p->has_timestamp ? TRK_FLAG_HAS_TIMESTAMP : 0) | (c->blocked ? TRK_FLAG_BLOCKED : 0) |
	                      (plain ? TRK_FLAG_PLAIN : 0) | (ch->refusal ? TRK_FLAG_REFUSED : 0) |
	                      (refusable(c, p) ? TRK_FLAG_REFUSABLE : 0));
	uint64_t need;
	while (room == ROOM_TIGHT && (need = tap_arena_growth(&ch->arena, len->total)) && !fits(t, need)) {
		if (!evict_for_memory(t, now_us)) /* the oldest go first: this channel's own free arena space */
			break;
	}
	e->blob = p->details_lost ? TAP_ARENA_NONE : tap_arena_alloc(&ch->arena, len->total);
	if (p->details_lost) {
		e->flags |= TRK_FLAG_NO_BLOB; /* counted by tap_track_publish */
	} else if (e->blob == TAP_ARENA_NONE) {
		e->flags |= TRK_FLAG_NO_BLOB;
		t->st.oom++;
	} else if (len->total) {
		uint8_t *b = tap_arena_ptr(&ch->arena, e->blob);
		if (len->timestamp)
			memcpy(b, &p->timestamp, len->timestamp);
		if (len->message_id)
			memcpy(b + len->timestamp, p->message_id.ptr, len->message_id);
		if (len->correlation_id)
			memcpy(b + len->timestamp + len->message_id, p->correlation_id.ptr, len->correlation_id);
	}
	const uint8_t *extra = (const uint8_t *)t->extra.data;
	if (t->extra.len)
		e->extra = room == ROOM_TIGHT ? intern_in_budget(c, TRK_TAG_EXTRA, extra, t->extra.len, NULL, 0, now_us)
		                              : tap_intern_get(&c->keys, TRK_TAG_EXTRA, extra, t->extra.len, NULL, 0);
	const struct tap_slice *x = &p->exchange, *rk = &p->routing_key;
	if (p->details_lost)
		e->route_key = TAP_INTERN_NONE; /* written null, never "" (the default exchange) */
	else if (room == ROOM_TIGHT)
		e->route_key = intern_in_budget(c, TRK_TAG_ROUTE, x->ptr, x->len, rk->ptr, rk->len, now_us);
	else
		e->route_key = tap_intern_get(&c->keys, TRK_TAG_ROUTE, x->ptr, x->len, rk->ptr, rk->len);
	ch->next++;
	trk_slot_stored(c, ch, n);
	if (!confirm_mode && ch->mode != TRK_MODE_TX && p->mandatory && !ch->closing) {
		if (trk_fifo_push(t, &ch->win_q, n))
			due_at(c, now_us, t->conf.return_window_us);
		else
			t->st.oom++; /* written when the channel ends instead of at the window's end */
	}
	if (plain) {
		if (trk_fifo_push(t, &ch->plain_q, n))
			due_at(c, now_us, t->conf.late_return_us);
		else
			t->st.oom++; /* written when the channel ends instead of at the hold's end */
	}
}

bool tap_track_header_wanted(const struct tap_track *t, const uint8_t *name, size_t len)
{
	if (len == sizeof "traceparent" - 1 && memcmp(name, "traceparent", len) == 0)
		return true;
	for (const char *k = t->conf.header_values; k && *k;) {
		const char *end = strchr(k, ',');
		size_t klen = end ? (size_t)(end - k) : strlen(k);
		if (klen == len && memcmp(k, name, len) == 0)
			return true;
		if (!end)
			break;
		k = end + 1;
	}
	return false;
}

void tap_track_publish(struct tap_track_conn *c, uint16_t id, const struct tap_publish *p, int64_t now_us)
{
	struct tap_track *t = c->t;
	bool known = trk_chan_find(c, id) != NULL;
	struct trk_chan *ch = trk_chan_in_budget(c, id, now_us);
	if (ch && !known)
		trk_chan_first_publish(c, ch, now_us);
	c->counts.publishes++;
	t->st.publishes++;
	if (p->details_lost)
		t->st.oom++;
	trk_warn_publish(c, ch, p, now_us);
	unsigned notes = trk_render_extra(&t->extra, p, t->conf.header_values);
	if (notes & TRK_EXTRA_KEYS_CUT)
		t->st.headers_truncated++;
	if (notes & TRK_EXTRA_VALUES_CUT)
		t->st.header_values_truncated++;
	if (notes & TRK_EXTRA_TRACE_BAD)
		t->st.traceparent_malformed++;
	if (t->extra.oom) {
		t->extra.len = 0; /* a cut rendering is no JSON: the optional members are left out */
		t->st.oom++;
	}
	/* a publish after a channel.close is dropped by the broker: it waits for close-ok like the others; one in a
	 * transaction waits for its commit or rollback */
	bool want = p->mandatory || (ch && (ch->mode == TRK_MODE_CONFIRM || ch->mode == TRK_MODE_TX || ch->closing));
	/* a plain publish is held conf.late_return_us: the broker's close, if it refuses it, comes within that */
	bool plain = !want && ch && t->conf.late_return_us > 0;
	if (!ch || ch->mode == TRK_MODE_UNKNOWN) {
		/* nothing it is answered with can be placed, or no memory for its channel: written at once, unknown */
		publish_untracked(c, id, ch, p, false, now_us);
		return;
	}
	if (!(want || plain)) {
		publish_untracked(c, id, ch, p, want, now_us); /* nothing to wait for, or no memory to wait */
		return;
	}
	ch->pinned = true;
	struct blob_lens len = blob_lens_of(p);
	enum room room = room_for(c, ch, p, len.total);
	uint64_t need;
	while (room == ROOM_TIGHT && (need = trk_ring_growth(ch)) && !fits(t, need)) {
		if (!evict_for_memory(t, now_us)) /* the oldest go first: once one of this channel's goes, it has room */
			break;
	}
	while (!trk_ring_reserve(c, ch) && ch->base < ch->next) {
		t->st.oom++;
		trk_slot_step(c, ch, ch->base, TRK_EVENT_END, &no_memory, now_us);
	}
	if (ch->next - ch->base >= ch->cap) {
		trk_chan_unpin(t, ch);
		publish_untracked(c, id, ch, p, want, now_us);
		return;
	}
	publish_store(c, ch, p, &len, room, plain, now_us);
	trk_chan_unpin(t, ch);

	if (c->outstanding > t->conf.max_outstanding)
		evict_oldest(c, now_us);
	if (ch->next - ch->base > (uint64_t)t->conf.max_outstanding * 2) {
		t->st.evicted++;
		trk_slot_step(c, ch, ch->base, TRK_EVENT_END, &evicted, now_us);
	}
}

static void confirm(struct tap_track_conn *c, uint16_t id, uint64_t tag, bool multiple, enum trk_event answer,
                    int64_t now_us)
{
	struct trk_chan *ch = trk_chan_answering(c, id);
	if (!ch || ch->mode != TRK_MODE_CONFIRM || (tag == 0 && !multiple) || tag > UINT64_MAX - ch->sel_off) {
		c->t->st.stray_confirms++;
		return;
	}
	uint64_t lo = ch->base > ch->sel_off ? ch->base : ch->sel_off + 1;
	uint64_t hi = tag == 0 ? ch->next - 1 : tag + ch->sel_off; /* multiple with tag 0: everything outstanding */
	if (!multiple)
		lo = hi;
	if (hi >= ch->next)
		hi = ch->next - 1;
	uint64_t answered = 0;
	ch->pinned = true;
	for (uint64_t n = lo; n <= hi; n++) {
		if (n < ch->base)
			n = ch->base; /* answering the head moved it past slots answered earlier */
		if (n > hi || n >= ch->next)
			break;
		struct trk_slot *e = trk_slot(ch, n);
		if (e->state != TRK_STATE_WAIT || !(e->flags & TRK_FLAG_CONFIRM))
			continue;
		e->t_ack = now_us;
		if (multiple)
			e->flags |= TRK_FLAG_MULTIPLE;
		trk_slot_step(c, ch, n, answer, NULL, now_us);
		answered++;
	}
	trk_chan_unpin(c->t, ch);
	if (!answered)
		c->t->st.stray_confirms++;
}

void tap_track_ack(struct tap_track_conn *c, uint16_t ch, uint64_t tag, bool multiple, int64_t now_us)
{
	confirm(c, ch, tag, multiple, TRK_EVENT_ACK, now_us);
}

void tap_track_nack(struct tap_track_conn *c, uint16_t ch, uint64_t tag, bool multiple, int64_t now_us)
{
	confirm(c, ch, tag, multiple, TRK_EVENT_NACK, now_us);
}

/* Ends what ch still waits for (only the mandatory publishes not returned yet, if mandatory_only) as whatever
 * would have decided it was lost (TRK_EVENT_GAP, reason why), each given flags first. The channel is pinned
 * meanwhile, so that its ring keeps its place while slots are released. */
static void chan_end_waiting(struct tap_track_conn *c, struct trk_chan *ch, bool mandatory_only, uint32_t flags,
                             const struct trk_reason *why, int64_t now_us)
{
	ch->pinned = true;
	for (uint64_t n = ch->base; n < ch->next; n++) {
		if (n < ch->base)
			n = ch->base; /* ending the head moved it past slots ended earlier */
		if (n >= ch->next)
			break;
		struct trk_slot *e = trk_slot(ch, n);
		if (e->state == TRK_STATE_DONE ||
		    (mandatory_only && (e->flags & (TRK_FLAG_MANDATORY | TRK_FLAG_RETURNED)) != TRK_FLAG_MANDATORY))
			continue;
		e->flags |= flags;
		trk_slot_step(c, ch, n, TRK_EVENT_GAP, why, now_us);
	}
	trk_chan_unpin(c->t, ch);
}

/* Which outstanding mandatory publishes of ch the Return may be for: those not returned yet with its exchange,
 * routing key and body size, and its message_id when it has one. RabbitMQ sends a publish's Return before its
 * Ack (PROTOCOL §9), so those not yet acked (WAIT) come first; only when none is left do the acked ones held
 * for a late Return (HELD: the broker would have broken that order) count. Of the first kind found, n and the
 * first and last slot. */
struct return_match {
	uint32_t key; /* the interned exchange and routing key */
	enum trk_state state;
	uint64_t n, first, last;
};

static bool slot_may_be(const struct trk_chan *ch, const struct trk_slot *e, uint32_t key, const struct tap_return *r)
{
	if (e->state == TRK_STATE_DONE || e->route_key != key || e->body_size != r->body_size ||
	    (e->flags & (TRK_FLAG_MANDATORY | TRK_FLAG_RETURNED)) != TRK_FLAG_MANDATORY)
		return false;
	if (!r->has_message_id)
		return true;
	if (!(e->flags & TRK_FLAG_HAS_MESSAGE_ID) || (e->flags & TRK_FLAG_NO_BLOB) || e->message_id_len != r->message_id.len)
		return false;
	const uint8_t *mid = tap_arena_ptr(&ch->arena, e->blob) + ((e->flags & TRK_FLAG_HAS_TIMESTAMP) ? sizeof(uint64_t) : 0);
	return e->message_id_len == 0 || memcmp(mid, r->message_id.ptr, e->message_id_len) == 0;
}

static bool return_match(const struct tap_track_conn *c, const struct trk_chan *ch, const struct tap_return *r,
                         struct return_match *m)
{
	uint32_t key = tap_intern_find(&c->keys, TRK_TAG_ROUTE, r->exchange.ptr, r->exchange.len, r->routing_key.ptr,
	                               r->routing_key.len);
	if (key == TAP_INTERN_NONE)
		return false;
	struct return_match held = {.key = key, .state = TRK_STATE_HELD};
	*m = (struct return_match){.key = key, .state = TRK_STATE_WAIT};
	for (uint64_t n = ch->base; n < ch->next; n++) {
		const struct trk_slot *e = trk_slot(ch, n);
		if (!slot_may_be(ch, e, key, r))
			continue;
		struct return_match *k = e->state == TRK_STATE_WAIT ? m : &held;
		if (k->n++ == 0)
			k->first = n;
		k->last = n;
	}
	if (m->n == 0)
		*m = held;
	return m->n > 0;
}

/* A Return more than one publish may be for: each of them is flagged (its record will say unknown unless a
 * Return of its own comes), and one ambiguous_return warning names them. */
static void return_ambiguous(struct tap_track_conn *c, struct trk_chan *ch, const struct tap_return *r,
                             const struct return_match *m, int64_t now_us)
{
	for (uint64_t n = m->first; n <= m->last; n++) {
		struct trk_slot *e = trk_slot(ch, n);
		if (e->state == m->state && slot_may_be(ch, e, m->key, r))
			e->flags |= TRK_FLAG_AMBIGUOUS;
	}
	bool confirm_mode = trk_slot(ch, m->first)->flags & TRK_FLAG_CONFIRM;
	struct tap_track *t = c->t;
	trk_record_return_warning(&t->render, c, ch->id, r, "ambiguous_return", m->n,
	                          confirm_mode ? m->first - ch->sel_off : 0, confirm_mode ? m->last - ch->sel_off : 0,
	                          now_us);
	trk_emit(t);
	t->st.warnings++;
	t->st.warnings_by_rule[TAP_TRACK_RULE_AMBIGUOUS_RETURN]++;
}

void tap_track_return(struct tap_track_conn *c, uint16_t id, const struct tap_return *r, int64_t now_us)
{
	struct trk_chan *ch = trk_chan_answering(c, id);
	struct return_match m;
	if (r->details_lost) { /* any mandatory publish waiting on the channel may be the one: none is routed for sure */
		c->t->st.oom++;
		if (ch)
			chan_end_waiting(c, ch, true, 0, &no_memory, now_us);
		return;
	}
	if (!ch || !ch->live || !return_match(c, ch, r, &m)) {
		trk_record_return_warning(&c->t->render, c, id, r, "unmatched_return", 0, 0, 0, now_us);
		trk_emit(c->t);
		c->t->st.warnings++;
		c->t->st.warnings_by_rule[TAP_TRACK_RULE_UNMATCHED_RETURN]++;
		c->t->st.unmatched_returns++;
		return;
	}
	if (m.n > 1) {
		return_ambiguous(c, ch, r, &m, now_us);
		return;
	}
	uint64_t n = m.first;
	struct trk_slot *e = trk_slot(ch, n);
	e->flags |= TRK_FLAG_RETURNED;
	e->t_ret = now_us;
	e->reply_code = r->reply_code;
	e->reply_text = tap_intern_get(&c->keys, TRK_TAG_TEXT, r->reply_text.ptr, r->reply_text.len, NULL, 0);
	trk_slot_step(c, ch, n, TRK_EVENT_RETURN, NULL, now_us);
}

/* ---- publish-caused closes ---- */

/* Whether the close text names the publish's exchange ('X'; the default exchange is 'amq.default'), as the
 * broker's 404, 403 and 540 texts do. */
static bool names_exchange(const struct tap_intern_key *k, const uint8_t *text, size_t text_len)
{
	const uint8_t *x = k->data;
	size_t xlen = k->alen;
	if (xlen == 0) {
		x = (const uint8_t *)"amq.default";
		xlen = sizeof "amq.default" - 1;
	}
	for (size_t i = 0; i + xlen + 2 <= text_len; i++) {
		if (text[i] == '\'' && text[i + xlen + 1] == '\'' && memcmp(text + i + 1, x, xlen) == 0)
			return true;
	}
	return false;
}

static bool text_has(const uint8_t *text, size_t text_len, const char *word)
{
	return memmem(text, text_len, word, strlen(word)) != NULL;
}

/* The message size a 406 text gives ("message size N is larger than configured max size M"), or -1. */
static int64_t message_size_in(const uint8_t *text, size_t text_len)
{
	static const char lead[] = "message size ";
	const uint8_t *at = memmem(text, text_len, lead, sizeof lead - 1);
	if (!at)
		return -1;
	const uint8_t *d = at + sizeof lead - 1, *end = text + text_len;
	int64_t n = 0;
	if (d == end || *d < '0' || *d > '9')
		return -1;
	for (; d < end && *d >= '0' && *d <= '9'; d++) {
		if (n > (INT64_MAX - 9) / 10)
			return -1;
		n = n * 10 + (*d - '0');
	}
	return n;
}

/* The earliest publish of the channel still waiting that the close text points at (see tap_track_publish_refused),
 * or false. */
/* How many waiting publishes of ch the close text points at: 0, 1 (the culprit) or 2 (several: a publish the
 * broker routed before it refused a later one to the same exchange looks the same, so none is named). *found
 * is the first of them. */
static unsigned culprit_of(const struct tap_track_conn *c, const struct trk_chan *ch, const uint8_t *text,
                           size_t text_len, uint64_t *found)
{
	bool about_content = text_has(text, text_len, "user_id") || text_has(text, text_len, "immediate");
	int64_t size = message_size_in(text, text_len);
	unsigned matches = 0;
	for (uint64_t n = ch->base; n < ch->next && matches < 2; n++) {
		const struct trk_slot *e = trk_slot(ch, n);
		if (e->state != TRK_STATE_WAIT || (e->flags & (TRK_FLAG_RETURNED | TRK_FLAG_REFUSED)))
			continue;
		bool named = e->route_key != TAP_INTERN_NONE &&
		             names_exchange(tap_intern_key(&c->keys, e->route_key), text, text_len);
		if (named || (about_content && (e->flags & TRK_FLAG_REFUSABLE)) ||
		    (size >= 0 && e->body_size == (uint64_t)size)) {
			if (matches++ == 0)
				*found = n;
		}
	}
	return matches;
}

/* Marks the publishes of the channel from slot `at` on as refused (those still waiting, and any sent later);
 * the ones before it that wait for nothing but the close are written with the verdict they would have had. */
static void refuse_from(struct tap_track_conn *c, struct trk_chan *ch, uint64_t at, enum trk_refusal how,
                        int64_t now_us)
{
	static const struct trk_reason before = {.by = "publish_close", .settled = true};
	ch->refusal = (uint8_t)how;
	ch->pinned = true;
	for (uint64_t n = at; n < ch->next; n++) {
		struct trk_slot *e = trk_slot(ch, n);
		if (e->state == TRK_STATE_WAIT)
			e->flags |= TRK_FLAG_REFUSED;
	}
	for (uint64_t n = ch->base; n < at; n++) { /* an uncommitted transaction is lost with its channel */
		struct trk_slot *e = trk_slot(ch, n);
		if (e->state == TRK_STATE_WAIT && !(e->flags & (TRK_FLAG_CONFIRM | TRK_FLAG_TX)))
			trk_slot_step(c, ch, n, TRK_EVENT_END, &before, now_us);
	}
	trk_chan_unpin(c->t, ch);
}

/* The culprit at slot `at`: it and those after it are refused (they end with the channel: unknown, the broker's
 * reason), and the channel remembers it for its close record. */
static void refuse_culprit(struct tap_track_conn *c, struct trk_chan *ch, uint64_t at, int64_t now_us)
{
	struct trk_view v;
	trk_view_of_slot(&v, c, ch, at);
	struct tap_buf b;
	tap_buf_init(&b);
	trk_render_culprit(&b, c, ch->id, &v);
	if (!b.oom && !ch->culprit) {
		ch->culprit = trk_dup(c->t, (const uint8_t *)b.data, b.len);
		ch->culprit_len = ch->culprit ? b.len : 0;
	}
	tap_buf_deinit(&b);
	trk_slot(ch, at)->flags |= TRK_FLAG_CULPRIT;
	refuse_from(c, ch, at, TRK_REFUSAL_NAMED, now_us);
}

/* The close points at one publish of ch: it is the culprit. At several: each from the first on is a candidate. */
static void refuse_matched(struct tap_track_conn *c, struct trk_chan *ch, unsigned matches, uint64_t first,
                           int64_t now_us)
{
	if (matches == 1)
		refuse_culprit(c, ch, first, now_us);
	else
		refuse_from(c, ch, first, TRK_REFUSAL_UNNAMED, now_us);
}

void tap_track_publish_refused(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	uint64_t n;
	if (id == 0) {
		if (!c->closed)
			return;
		for (uint32_t i = 0; i < c->n_chans; i++) {
			struct trk_chan *ch = c->chans[i];
			unsigned matches = culprit_of(c, ch, (const uint8_t *)c->close_text, c->close_text_len, &n);
			if (matches) {
				refuse_matched(c, ch, matches, n, now_us);
				return;
			}
		}
		for (uint32_t i = 0; i < c->n_chans; i++)
			if (c->chans[i]->base < c->chans[i]->next)
				refuse_from(c, c->chans[i], c->chans[i]->base, TRK_REFUSAL_UNNAMED, now_us);
		return;
	}
	struct trk_chan *ch = trk_chan_answering(c, id);
	if (!ch || !ch->closing || !ch->close_by_broker || ch->refusal)
		return;
	unsigned matches = culprit_of(c, ch, (const uint8_t *)ch->close_text, ch->close_text_len, &n);
	if (matches)
		refuse_matched(c, ch, matches, n, now_us);
	else
		refuse_from(c, ch, ch->base, TRK_REFUSAL_UNNAMED, now_us);
}

/* ---- timers ---- */

/* One of a channel's timer queues: slots in the order their deadlines come, each due `window` after its start. */
struct timer_queue {
	struct trk_fifo *q;
	enum trk_state state; /* a slot still timed here is in this state */
	uint16_t skip_flags;  /* ... and has none of these flags */
	bool from_ack;        /* its deadline counts from its ack, else from its publish */
	int64_t window;
};

/* Settles the slots of one queue whose deadline has passed and lowers *next to the first one still to come.
 * False when that ended the channel's last outstanding publish. */
static bool settle_due(struct tap_track_conn *c, struct trk_chan *ch, const struct timer_queue *tq, int64_t now_us,
                       int64_t *next)
{
	while (tq->q->len) {
		uint64_t n = trk_fifo_front(tq->q);
		const struct trk_slot *e = n >= ch->base && n < ch->next ? trk_slot(ch, n) : NULL;
		if (!e || e->state != tq->state || (e->flags & tq->skip_flags)) {
			trk_fifo_pop(tq->q); /* settled since, or refused: it ends with its channel */
			continue;
		}
		int64_t start = tq->from_ack ? e->t_ack : e->t_pub;
		if (!tq->from_ack && start < c->unblocked_at)
			start = c->unblocked_at; /* paused while the connection was blocked */
		if (start < c->unheld_at)
			start = c->unheld_at; /* paused while the tap did not read the broker */
		int64_t due = start + tq->window;
		if (due > now_us) {
			if (due < *next)
				*next = due;
			return true;
		}
		trk_fifo_pop(tq->q);
		/* stamped with its deadline, not with whenever the timer ran: live and replay agree */
		trk_slot_step(c, ch, n, TRK_EVENT_TIMEOUT, NULL, due);
		if (!ch->live)
			return false;
	}
	return true;
}

static int64_t chan_tick(struct tap_track_conn *c, struct trk_chan *ch, int64_t now_us)
{
	const struct tap_track_conf *conf = &c->t->conf;
	const struct timer_queue queues[] = {
	    {&ch->held_q, TRK_STATE_HELD, 0, true, conf->late_return_us},                   /* acked, awaiting a late Return */
	    {&ch->win_q, TRK_STATE_WAIT, TRK_FLAG_CONFIRM, false, conf->return_window_us},  /* mandatory, no confirms */
	    {&ch->plain_q, TRK_STATE_WAIT, TRK_FLAG_REFUSED, false, conf->late_return_us}, /* plain: a refusing close */
	};
	int64_t next = INT64_MAX;
	/* a blocked connection's publishes wait unread: only acks (already answered) run on, until unblocked; while
	 * the tap holds the broker's side nothing runs out (what would settle it may be waiting unread) */
	size_t n_queues = c->held ? 0 : c->blocked ? 1 : sizeof queues / sizeof queues[0];
	for (size_t i = 0; i < n_queues; i++)
		if (!settle_due(c, ch, &queues[i], now_us, &next))
			return INT64_MAX;
	return next;
}

int64_t tap_track_tick(struct tap_track *t, int64_t now_us)
{
	while (tap_heap_top_key(&t->due) <= now_us) {
		struct tap_track_conn *c = tap_heap_top(&t->due);
		tap_heap_remove(&t->due, c);
		c->next_due = INT64_MAX; /* due_at may set it again while its channels are walked */
		int64_t conn_next = INT64_MAX;
		for (uint32_t i = 0; i < c->n_active;) {
			struct trk_chan *ch = c->active[i];
			int64_t d = chan_tick(c, ch, now_us);
			if (d < conn_next)
				conn_next = d;
			if (i < c->n_active && c->active[i] == ch)
				i++;
		}
		if (conn_next < c->next_due)
			c->next_due = conn_next;
		if (c->next_due == INT64_MAX)
			continue;
		if (c->next_due <= now_us)
			c->next_due = now_us + 1; /* walked in this tick: the next one looks again */
		(void)tap_heap_set(&t->due, c, c->next_due);
	}
	return tap_heap_top_key(&t->due);
}

/* ---- summary and stats ---- */

void tap_track_summary(struct tap_track *t, struct tap_buf *out)
{
	trk_summary(t, out);
}

void tap_track_get_stats(const struct tap_track *t, struct tap_track_stats *s)
{
	*s = t->st;
	s->memory = t->mem;
	s->memory_peak = trk_memory_peak(t);
}

uint64_t tap_track_confirm_quantile(const struct tap_track *t, double q)
{
	return tap_hist_quantile(&t->hist, q);
}

const struct tap_hist *tap_track_confirm_hist(const struct tap_track *t)
{
	return &t->hist;
}

/* ---- read access for the metrics endpoint (issue 16) ---- */

void tap_track_each_conn(const struct tap_track *t, tap_track_conn_fn fn, void *ctx)
{
	for (const struct tap_track_conn *c = t->conns; c; c = c->next) {
		struct tap_track_conn_info info = {
			.id = c->id,
			.client = c->client,
			.product = c->product,
			.user = c->user,
			.vhost = c->vhost,
			.publishes = c->counts.publishes,
			.routed = c->counts.routed,
			.returned = c->counts.returned,
			.unproven = c->counts.unproven,
			.unknown = c->counts.unknown,
			.acked = c->counts.acked,
			.nacked = c->counts.nacked,
			.outstanding = c->outstanding,
			.channels = c->n_chans,
			.blocked = c->blocked,
			.since_us = c->t_new,
		};
		fn(ctx, &info);
	}
}

void tap_track_each_confirm_bucket(const struct tap_track *t, tap_track_bucket_fn fn, void *ctx)
{
	uint64_t lo = 0;
	for (unsigned i = 0; i < TAP_HIST_BUCKETS; i++) {
		uint64_t top = tap_hist_bucket_max(i);
		uint64_t hi = i == TAP_HIST_BUCKETS - 1 ? t->hist.max + 1 : top + 1; /* the last takes every larger value */
		if (t->hist.bucket[i])
			fn(ctx, lo, hi, t->hist.bucket[i]);
		lo = top + 1;
	}
}

/* A capture lost bytes of this connection (DESIGN §6b): whatever was lost may have been the Return, Ack, Nack or
 * close that decides an outstanding publish, or (client side) publishes that shift every later confirm sequence
 * number. Every outstanding publish ends now with {"by":"capture_gap"} (verdict_of, TRK_EVENT_GAP). */
void tap_track_conn_gap(struct tap_track_conn *c, enum tap_track_gap_seq seq, int64_t now_us)
{
	static const struct trk_reason gap = {.by = "capture_gap"};
	uint32_t flags = seq == TAP_TRACK_GAP_SEQ_LOST ? TRK_FLAG_SEQ_LOST : 0; /* counted across lost publishes */
	if (c->retired)
		chan_end_waiting(c, c->retired, false, flags, &gap, now_us);
	for (uint32_t i = 0; i < c->n_chans; i++)
		chan_end_waiting(c, c->chans[i], false, flags, &gap, now_us);
}
