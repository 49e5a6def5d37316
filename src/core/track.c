/* The publishes as the wire shows them (src/DESIGN.md §3-§4, src/PROTOCOL.md §7-§8): each basic.publish is stored in a slot of
 * its channel (or written at once when there is nothing to wait for), the broker's basic.ack and basic.nack
 * answer them, and the tick runs out their return windows and late-return holds. The lifecycle below
 * (track_verdict.c) decides and writes each one's record. */
#include "track_event.h"

#include "consume_int.h"

#include "track_budget.h"
#include "track_ident.h"
#include "track_record.h"
#include "track_store.h"
#include "track_topo.h"
#include "track_verdict.h"
#include "track_warn.h"

#include "amqptap/identity.h"

#include "mem.h"

#include <string.h>

static const struct trk_reason no_memory = {.by = "no_memory"};
static const struct trk_reason beyond_channel_max = {.by = "channel_max"};

/* ---- publishes ---- */

/* Why a publish is written at once. */
enum untracked {
	UNTRACKED_NOTHING_TO_WAIT_FOR, /* or no memory for its channel, or its channel's mode is unknown */
	UNTRACKED_NO_ROOM,             /* it had something to wait for, and no memory to wait */
};

static void publish_untracked(struct tap_track_conn *c, uint16_t id, struct trk_chan *ch, const struct tap_publish *p,
                              enum untracked why, int64_t now_us)
{
	bool no_room = why == UNTRACKED_NO_ROOM;
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
		/* nothing it is answered with can be placed (src/DESIGN.md §6b), no memory to know its channel's mode, or a
		 * channel the broker refuses (no state is kept for it) */
		vd = (struct trk_verdict){.route = TAP_TRACK_ROUTE_UNKNOWN,
		                          .confirm = TAP_TRACK_CONFIRM_UNKNOWN,
		                          .reason = ch ? &unseen : beyond ? &beyond_channel_max : &no_memory};
	} else {
		(void)trk_verdict_of(&e, no_room ? TRK_EVENT_END : TRK_EVENT_UNTRACKED, &no_memory, &vd);
	}
	if ((no_room || !ch) && !beyond)
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
	    .values = t->extra_values,
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
	    .topo = t->topo_on ? t->topo_flags : 0,
	    .timestamp = p->timestamp,
	    .t_pub = now_us,
	    .identity_kind = p->identity_kind,
	    .identity = p->identity,
	};
	if (confirm_mode) {
		/* the ring is empty here: the sequence number is used up with nothing stored */
		v.seq = ch->next - ch->sel_off;
		ch->next++;
		ch->base = ch->next;
	}
	trk_publish_done(c, id, &v, &vd, now_us);
}

/* What a stored publish keeps in its channel's arena: [timestamp] message_id correlation_id [identity] (each id
 * cut to 255 bytes). */
struct blob_lens {
	size_t timestamp, message_id, correlation_id, identity;
	uint64_t total;
};

static struct blob_lens blob_lens_of(const struct tap_publish *p)
{
	struct blob_lens l = {
	    .timestamp = p->has_timestamp ? sizeof p->timestamp : 0,
	    .message_id = p->has_message_id ? (p->message_id.len > 255 ? 255 : p->message_id.len) : 0,
	    .correlation_id = p->has_correlation_id ? (p->correlation_id.len > 255 ? 255 : p->correlation_id.len) : 0,
	    .identity = p->identity_kind ? sizeof p->identity : 0,
	};
	l.total = l.timestamp + l.message_id + l.correlation_id + l.identity;
	return l;
}

/* The bytes the header values' place adds to the interned properties: none without header values. */
static size_t extra_values_len(const struct tap_track *t)
{
	return t->extra_values.len ? sizeof t->extra_values : 0;
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
	uint64_t strings = t->extra.len + p->exchange.len + p->routing_key.len; /* the slack covers the values' place */
	if (trk_fits(t, 2 * t->mem + 4096 + 4 * blob_len + strings))
		return ROOM_AMPLE;
	uint64_t worst = trk_ring_growth(ch) + tap_arena_growth(&ch->arena, blob_len) +
	                 tap_intern_cost_bound(&c->keys, t->extra.len + extra_values_len(t)) +
	                 tap_intern_cost_bound(&c->keys, p->exchange.len + p->routing_key.len);
	return trk_fits(t, worst) ? ROOM_AMPLE : ROOM_TIGHT;
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
	                      (refusable(c, p) ? TRK_FLAG_REFUSABLE : 0) | (t->topo_on ? t->topo_flags : 0));
	uint64_t need;
	while (room == ROOM_TIGHT && (need = tap_arena_growth(&ch->arena, len->total)) && !trk_fits(t, need)) {
		if (!trk_evict_for_memory(t, now_us)) /* the oldest go first: this channel's own free arena space */
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
		if (len->identity) {
			memcpy(b + len->timestamp + len->message_id + len->correlation_id, &p->identity, len->identity);
			e->flags |= p->identity_kind == TAP_IDENTITY_ID ? TRK_FLAG_IDENT_ID : TRK_FLAG_IDENT_FP;
		}
	}
	const uint8_t *extra = (const uint8_t *)t->extra.data;
	const uint8_t *values = (const uint8_t *)&t->extra_values; /* interned with the properties, after them */
	size_t values_len = extra_values_len(t);
	if (t->extra.len)
		e->extra = room == ROOM_TIGHT
		               ? trk_intern_in_budget(c, TRK_TAG_EXTRA, extra, t->extra.len, values, values_len, now_us)
		               : tap_intern_get(&c->keys, TRK_TAG_EXTRA, extra, t->extra.len, values, values_len);
	const struct tap_slice *x = &p->exchange, *rk = &p->routing_key;
	if (p->details_lost)
		e->route_key = TAP_INTERN_NONE; /* written null, never "" (the default exchange) */
	else if (room == ROOM_TIGHT)
		e->route_key = trk_intern_in_budget(c, TRK_TAG_ROUTE, x->ptr, x->len, rk->ptr, rk->len, now_us);
	else
		e->route_key = tap_intern_get(&c->keys, TRK_TAG_ROUTE, x->ptr, x->len, rk->ptr, rk->len);
	ch->next++;
	trk_slot_stored(c, ch, n);
	if (!confirm_mode && ch->mode != TRK_MODE_TX && p->mandatory && !ch->closing) {
		if (trk_fifo_push(t, &ch->win_q, n))
			trk_due_at(c, now_us, t->conf.return_window_us);
		else
			t->st.oom++; /* written when the channel ends instead of at the window's end */
	}
	if (plain) {
		if (trk_fifo_push(t, &ch->plain_q, n))
			trk_due_at(c, now_us, t->conf.late_return_us);
		else
			t->st.oom++; /* written when the channel ends instead of at the hold's end */
	}
}

bool tap_track_header_wanted(const struct tap_track *t, const uint8_t *name, size_t len)
{
	if (len == sizeof "traceparent" - 1 && memcmp(name, "traceparent", len) == 0)
		return true;
	if (t->topo_on) /* --definitions: a headers exchange's bindings may look at any of them */
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
	if (t->csm_links) { /* a consumer seen: its deliveries may link */
		uint64_t key = csm_link_key(p->identity_kind, p->identity, p->has_message_id, p->message_id);
		if (key)
			csm_link_publish(t, key, now_us);
	}
	if (p->details_lost)
		t->st.oom++;
	trk_warn_publish(c, ch, p, now_us);
	unsigned notes = trk_render_extra(&t->extra, &t->extra_values, p, t->conf.header_values);
	if (notes & TRK_EXTRA_KEYS_CUT)
		t->st.headers_truncated++;
	if (notes & TRK_EXTRA_VALUES_CUT)
		t->st.header_values_truncated++;
	if (notes & TRK_EXTRA_TRACE_BAD)
		t->st.traceparent_malformed++;
	if (t->extra.oom) {
		t->extra.len = 0; /* a cut rendering is no JSON: the optional members are left out */
		t->extra_values = (struct trk_values){0, 0};
		t->st.oom++;
	}
	if (t->topo_on) /* --definitions */
		trk_topo_publish(c, id, ch, p, now_us);
	/* a publish after a channel.close is dropped by the broker: it waits for close-ok like the others; one in a
	 * transaction waits for its commit or rollback */
	bool want = p->mandatory || (ch && (ch->mode == TRK_MODE_CONFIRM || ch->mode == TRK_MODE_TX || ch->closing));
	/* a plain publish is held conf.late_return_us: the broker's close, if it refuses it, comes within that */
	bool plain = !want && ch && t->conf.late_return_us > 0;
	if (!ch || ch->mode == TRK_MODE_UNKNOWN) {
		/* nothing it is answered with can be placed, or no memory for its channel: written at once, unknown */
		publish_untracked(c, id, ch, p, UNTRACKED_NOTHING_TO_WAIT_FOR, now_us);
		return;
	}
	if (!(want || plain)) {
		publish_untracked(c, id, ch, p, UNTRACKED_NOTHING_TO_WAIT_FOR, now_us);
		return;
	}
	ch->pinned = true;
	struct blob_lens len = blob_lens_of(p);
	enum room room = room_for(c, ch, p, len.total);
	uint64_t need;
	while (room == ROOM_TIGHT && (need = trk_ring_growth(ch)) && !trk_fits(t, need)) {
		if (!trk_evict_for_memory(t, now_us)) /* the oldest go first: once one of this channel's goes, it has room */
			break;
	}
	while (!trk_ring_reserve(c, ch) && ch->base < ch->next) {
		t->st.oom++;
		trk_slot_step(c, ch, ch->base, TRK_EVENT_END, &no_memory, now_us);
	}
	if (ch->next - ch->base >= ch->cap) {
		trk_chan_unpin(t, ch);
		/* no room in the ring: a publish that waits for an answer is counted short of memory, a plain one not */
		publish_untracked(c, id, ch, p, want ? UNTRACKED_NO_ROOM : UNTRACKED_NOTHING_TO_WAIT_FOR, now_us);
		return;
	}
	publish_store(c, ch, p, &len, room, plain, now_us);
	trk_chan_unpin(t, ch);
	trk_bound_outstanding(c, ch, now_us);
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
	    /* mandatory, no confirms; one a broker's close refused ends with its channel, however late the close-ok */
	    {&ch->win_q, TRK_STATE_WAIT, TRK_FLAG_CONFIRM | TRK_FLAG_REFUSED, false, conf->return_window_us},
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
	int64_t ident_next = t->ident.cap ? trk_ident_tick(t, now_us) : INT64_MAX;
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
	if (now_us >= t->csm_due)
		t->csm_due = csm_tick(t, now_us);
	int64_t next = tap_heap_top_key(&t->due);
	if (t->csm_due < next)
		next = t->csm_due;
	return ident_next < next ? ident_next : next;
}

