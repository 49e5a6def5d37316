/* The lifecycle of an outstanding publish (src/DESIGN.md §3-§4, src/PROTOCOL.md §7-§11): the wire events and the budget hand
 * each slot the events that move it through the states drawn in track_int.h; verdict_of() alone decides its
 * route, confirm and order, and every publish ends in exactly one `publish` record, counted here and rendered by
 * track_record.c. */
#include "track_verdict.h"

#include "track_ident.h"
#include "track_record.h"
#include "track_store.h"
#include "track_topo.h"
#include "track_warn.h"

static const struct trk_reason ambiguous_return = {.by = "ambiguous_return"};

/* ---- the verdict ---- */

/* trk_verdict_of before the ambiguous Returns (see the drawing above enum trk_state). */
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
enum trk_state trk_verdict_of(const struct trk_slot *e, enum trk_event ev, const struct trk_reason *why,
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

/* Adds a confirm latency to the connection's run of buckets, made or widened to hold it: toward the new value by
 * one more power of two, so that a spread of latencies widens it a few times, not at every new bucket. Counted in
 * the budget but never evicting for it (the verdict is being written; the run is at most 2.2 KB, the connections
 * are bounded in number); without memory the value goes to the nearest bucket it has, or nowhere. */
static void conn_hist_add(struct tap_track_conn *c, int64_t us)
{
	struct tap_hist_span *h = c->hist;
	unsigned b = tap_hist_bucket(us);
	if (!h || b < h->lo || b >= (unsigned)h->lo + h->len) {
		unsigned lo = b, hi = b + 1;
		if (h && b < h->lo) {
			lo = b > TAP_HIST_SUB ? b - TAP_HIST_SUB : 0;
			hi = h->lo + h->len;
		} else if (h) {
			lo = h->lo;
			hi = b + 1 + TAP_HIST_SUB < TAP_HIST_BUCKETS ? b + 1 + TAP_HIST_SUB : TAP_HIST_BUCKETS;
		}
		struct tap_hist_span *n = trk_alloc(c->t, tap_hist_span_size(hi - lo));
		if (n) {
			tap_hist_span_move(n, lo, hi - lo, h);
			if (h)
				trk_free(c->t, h, tap_hist_span_size(h->len));
			c->hist = h = n;
			trk_note_peak(c->t);
		} else if (!h) {
			return;
		}
	}
	tap_hist_span_add(h, us);
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
		if (c->confirms)
			conn_hist_add(c, vd->t_ack - v->t_pub);
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

/* Where the record just rendered from v holds its header values, with the comma before them (values that come first
 * among the properties take the comma written before those): h's values_at and values_len. */
static void values_in_record(const struct tap_track *t, const struct trk_view *v, struct tap_track_verdict *h)
{
	if (t->render.rec.oom || !v->extra_len || !v->values.len)
		return;
	bool first = v->values.at == 0;
	h->values_at = t->render.extra_at + v->values.at - first;
	h->values_len = v->values.len + first;
}

static void call_verdict_hook(struct tap_track_conn *c, uint16_t ch, const struct trk_view *v,
                              const struct trk_verdict *vd, const struct trk_repeat *rep, int64_t now_us)
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
	    .dropped_by_topology = !v->mandatory && (v->topo & TRK_FLAG_TOPO_NONE),
	    .record = {t->render.rec.oom ? NULL : (const uint8_t *)t->render.rec.data,
	               t->render.rec.oom ? 0 : t->render.rec.len},
	    .repeat = rep->seen ? (int)rep->repeat : -1,
	    .repeat_ago_us = rep->seen ? rep->ago_us : 0,
	};
	values_in_record(t, v, &h);
	t->verdict_hook(t->verdict_ctx, &h);
}

/* The verdict hook sees the record while the render buffer still holds it: a warning may be written next. */
void trk_publish_done(struct tap_track_conn *c, uint16_t id, const struct trk_view *v, const struct trk_verdict *vd,
                      int64_t now_us)
{
	struct tap_track *t = c->t;
	struct trk_repeat rep;
	trk_ident_publish(t, c, id, v, vd, now_us, &rep);
	struct trk_fault_mark fm, *fault = NULL;
	if (c->n_fault_marks && v->confirm_mode && trk_fault_take(c, id, v->seq, &fm))
		fault = &fm;
	trk_record_publish(&t->render, c, id, v, vd, &rep, fault, now_us);
	trk_emit(t);
	count_verdict(c, v, vd);
	if (t->verdict_hook)
		call_verdict_hook(c, id, v, vd, &rep, now_us);
	trk_warn_done(c, v, vd);
}

void trk_slot_step(struct tap_track_conn *c, struct trk_chan *ch, uint64_t n, enum trk_event ev,
                   const struct trk_reason *why, int64_t stamp_us)
{
	struct tap_track *t = c->t;
	struct trk_slot *e = trk_slot(ch, n);
	struct trk_verdict vd;
	enum trk_state next = trk_verdict_of(e, ev, why, &vd);
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
			trk_due_at(c, e->t_ack, t->conf.late_return_us);
			return;
		}
		t->st.oom++; /* no room to hold it: written now, as if its hold were over */
		next = trk_verdict_of(e, TRK_EVENT_TIMEOUT, NULL, &vd);
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
	trk_publish_done(c, ch->id, &v, &vd, stamp_us);
	if (v.topo) /* --definitions; before the release: v's strings are the slot's */
		trk_topo_verdict(c, ch->id, &v, &vd, stamp_us);
	trk_slot_release(c, ch, n);
	trk_warn_verdict(c, ch, &v, &vd, stamp_us);
}

/* ---- what decided the waiting publishes was lost ---- */

/* Which of the publishes a channel still waits for end. */
enum waiting {
	WAITING_ALL,
	WAITING_MANDATORY, /* the mandatory ones not returned yet */
};

static void chan_end_waiting(struct tap_track_conn *c, struct trk_chan *ch, enum waiting which, uint32_t flags,
                             const struct trk_reason *why, int64_t now_us)
{
	ch->pinned = true;
	for (uint64_t n = ch->base; n < ch->next; n++) {
		if (n < ch->base)
			n = ch->base; /* ending the head moved it past slots ended earlier */
		if (n >= ch->next)
			break;
		struct trk_slot *e = trk_slot(ch, n);
		bool unreturned_mandatory = (e->flags & (TRK_FLAG_MANDATORY | TRK_FLAG_RETURNED)) == TRK_FLAG_MANDATORY;
		if (e->state == TRK_STATE_DONE || (which == WAITING_MANDATORY && !unreturned_mandatory))
			continue;
		e->flags |= flags;
		trk_slot_step(c, ch, n, TRK_EVENT_GAP, why, now_us);
	}
	trk_chan_unpin(c->t, ch);
}

void trk_chan_end_all_waiting(struct tap_track_conn *c, struct trk_chan *ch, uint32_t flags,
                              const struct trk_reason *why, int64_t now_us)
{
	chan_end_waiting(c, ch, WAITING_ALL, flags, why, now_us);
}

void trk_chan_end_mandatory_waiting(struct tap_track_conn *c, struct trk_chan *ch, const struct trk_reason *why,
                                    int64_t now_us)
{
	chan_end_waiting(c, ch, WAITING_MANDATORY, 0, why, now_us);
}
