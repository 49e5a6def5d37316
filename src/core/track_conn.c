/* The tracker and its connections and channels as the wire shows them: what the client and broker said at open
 * and close, the records of those events, the end of a channel or connection, which ends every publish it left
 * outstanding (through the lifecycle of track_verdict.c), capture gaps, and the stats read back. */
#include "track_event.h"

#include "track_budget.h"
#include "track_ident.h"
#include "track_record.h"
#include "track_store.h"
#include "track_topo.h"
#include "track_verdict.h"
#include "track_warn.h"

#include "consume_int.h"
#include "mem.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- connections ---- */

struct tap_track *tap_track_new(const struct tap_track_conf *conf, tap_track_emit_fn emit_fn, void *ctx)
{
	struct tap_track *t = calloc(1, sizeof *t);
	if (!t)
		return NULL;
	if (conf)
		t->conf = *conf;
	if (t->conf.return_window_us <= 0)
		t->conf.return_window_us = TAP_TRACK_RETURN_WINDOW_US_DEFAULT;
	if (t->conf.topology_interval_us <= 0)
		t->conf.topology_interval_us = TAP_TRACK_TOPOLOGY_INTERVAL_US_DEFAULT;
	if (t->conf.late_return_us <= 0)
		t->conf.late_return_us = TAP_TRACK_LATE_RETURN_US_DEFAULT;
	if (t->conf.max_outstanding == 0)
		t->conf.max_outstanding = TAP_TRACK_MAX_OUTSTANDING_DEFAULT;
	if (t->conf.max_memory == 0)
		t->conf.max_memory = TAP_TRACK_MAX_MEMORY_DEFAULT;
	if (t->conf.resend_window_us <= 0)
		t->conf.resend_window_us = TAP_TRACK_RESEND_WINDOW_US_DEFAULT;
	if (t->conf.stall_after_us <= 0)
		t->conf.stall_after_us = TAP_TRACK_STALL_AFTER_US_DEFAULT;
	if (t->conf.consumer_timeout_us <= 0)
		t->conf.consumer_timeout_us = TAP_TRACK_CONSUMER_TIMEOUT_US_DEFAULT;
	t->csm_due = INT64_MAX;
	t->emit = emit_fn;
	t->ctx = ctx;
	tap_heap_init(&t->oldest, offsetof(struct trk_chan, oldest_idx), &t->mem);
	tap_heap_init(&t->due, offsetof(struct tap_track_conn, due_idx), &t->mem);
	trk_render_init(&t->render, &t->conf);
	tap_buf_init(&t->extra);
	return t;
}

const char *tap_track_run(const struct tap_track *t)
{
	return t->render.run;
}

void tap_track_set_verdict_hook(struct tap_track *t, tap_track_verdict_fn fn, void *ctx)
{
	t->verdict_hook = fn;
	t->verdict_ctx = ctx;
}

void tap_track_set_conn_hook(struct tap_track *t, tap_track_conn_event_fn fn, void *ctx)
{
	t->conn_hook = fn;
	t->conn_ctx = ctx;
}

void tap_track_set_missing_hook(struct tap_track *t, tap_track_missing_fn fn, void *ctx)
{
	t->missing_hook = fn;
	t->missing_ctx = ctx;
}

static void conn_event(struct tap_track *t, const struct tap_track_conn_event *e)
{
	if (t->conn_hook)
		t->conn_hook(t->conn_ctx, e);
}

static void conn_prefix_update(struct tap_track_conn *c)
{
	trk_render_prefix(&c->prefix, c);
	c->t->mem += c->prefix.cap - c->prefix_cost;
	c->prefix_cost = c->prefix.cap;
	trk_note_peak(c->t);
}

static void conn_free(struct tap_track_conn *c)
{
	struct tap_track *t = c->t;
	csm_conn_free(c);
	while (c->n_chans > 0 || c->retired) {
		struct trk_chan *ch = c->retired ? c->retired : c->chans[c->n_chans - 1];
		t->st.outstanding -= ch->live;
		for (uint64_t n = ch->base; n < ch->next; n++)
			if (trk_slot(ch, n)->state == TRK_STATE_HELD)
				t->st.held--;
		trk_chan_free(c, ch);
	}
	trk_fault_free(c);
	trk_free(t, c->chans, c->cap_chans * sizeof *c->chans);
	trk_free(t, c->active, c->cap_active * sizeof *c->active);
	tap_heap_remove(&t->due, c);
	if (c->prev)
		c->prev->next = c->next;
	else
		t->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	t->st.connections_open--;
	tap_heap_fit(&t->due, (uint32_t)t->st.connections_open); /* the room tap_track_conn_new reserved stays */
	tap_intern_deinit(&c->keys);
	trk_warn_conn_free(c);
	t->mem -= c->prefix_cost;
	tap_buf_deinit(&c->prefix);
	trk_free_str(t, &c->client);
	trk_free_str(t, &c->upstream);
	trk_free_str(t, &c->upstream_local);
	trk_free_str(t, &c->user);
	trk_free_str(t, &c->vhost);
	trk_free_str(t, &c->product);
	trk_free_str(t, &c->version);
	trk_free_str(t, &c->platform);
	trk_free_str(t, &c->connection_name);
	trk_free_str(t, &c->end_detail);
	if (c->close_text)
		trk_free(t, c->close_text, c->close_text_len + 1);
	if (c->hist)
		trk_free(t, c->hist, tap_hist_span_size(c->hist->len));
	trk_free(t, c, sizeof *c);
}

void tap_track_free(struct tap_track *t)
{
	if (!t)
		return;
	while (t->conns)
		conn_free(t->conns);
	trk_ident_free(t);
	tap_heap_deinit(&t->oldest);
	tap_heap_deinit(&t->due);
	trk_topo_free(t);
	trk_free(t, t->csm_links, CSM_LINKS * sizeof *t->csm_links);
	trk_render_deinit(&t->render);
	tap_buf_deinit(&t->extra);
	free(t);
}

struct tap_track_conn *tap_track_conn_new(struct tap_track *t, uint64_t conn_id, const char *client_addr,
                                          const char *upstream_addr, int64_t now_us)
{
	/* room in the timer heap for every connection: a timer started later never fails for want of it */
	struct tap_track_conn *c = NULL;
	if (tap_heap_reserve(&t->due, (uint32_t)t->st.connections_open + 1))
		c = trk_alloc_in_budget(t, sizeof *c, now_us);
	if (!c) {
		tap_track_conn_unfollowed(t);
		return NULL;
	}
	c->t = t;
	c->id = conn_id;
	c->t_new = now_us;
	c->next_due = INT64_MAX;
	tap_intern_init(&c->keys, &t->mem);
	tap_buf_init(&c->prefix);
	bool client_kept = trk_set_cstr(t, &c->client, client_addr);
	c->prefix_lost = !client_kept;
	c->details_lost = !trk_set_cstr(t, &c->upstream, upstream_addr) || !client_kept;
	conn_prefix_update(c);
	c->next = t->conns;
	if (t->conns)
		t->conns->prev = c;
	t->conns = c;
	t->st.connections_open++;
	t->st.connections_total++;
	return c;
}

void tap_track_conn_unfollowed(struct tap_track *t)
{
	t->st.oom++;
	t->st.conns_unfollowed++;
}

void tap_track_conn_client_props(struct tap_track_conn *c, struct tap_slice product, struct tap_slice version,
                                 struct tap_slice platform)
{
	if (product.ptr && !trk_set_str(c->t, &c->product, product))
		c->details_lost = true;
	if (version.ptr && !trk_set_str(c->t, &c->version, version))
		c->details_lost = true;
	if (platform.ptr && !trk_set_str(c->t, &c->platform, platform))
		c->details_lost = true;
}

void tap_track_conn_client_caps(struct tap_track_conn *c, struct tap_slice connection_name, bool has_caps,
                                unsigned present, unsigned caps)
{
	if (connection_name.ptr) {
		if (connection_name.len > TAP_TRACK_CONN_NAME_MAX) /* what the client sends does not decide the size */
			connection_name.len = TAP_TRACK_CONN_NAME_MAX;
		if (!trk_set_str(c->t, &c->connection_name, connection_name))
			c->details_lost = true;
	}
	c->has_caps = has_caps;
	c->caps_present = (uint8_t)present;
	c->caps = (uint8_t)(caps & present);
}

void tap_track_conn_user(struct tap_track_conn *c, struct tap_slice user)
{
	if (!trk_set_str(c->t, &c->user, user))
		c->details_lost = c->prefix_lost = true;
	conn_prefix_update(c);
}

void tap_track_conn_tune(struct tap_track_conn *c, uint16_t channel_max, uint32_t frame_max, uint16_t heartbeat)
{
	c->tuned = true;
	c->channel_max = channel_max;
	c->frame_max = frame_max;
	c->heartbeat = heartbeat;
}

void tap_track_conn_open(struct tap_track_conn *c, struct tap_slice vhost, int64_t now_us)
{
	if (c->opened)
		return;
	c->opened = true;
	if (!vhost.ptr || !trk_set_str(c->t, &c->vhost, vhost)) /* no ptr: the decoder could not keep it */
		c->details_lost = c->prefix_lost = true;
	conn_prefix_update(c);
	trk_record_conn_open(&c->t->render, c, now_us);
	trk_emit(c->t);
	struct tap_track_conn_event e = {.conn = c->id, .change = TAP_TRACK_CONN_OPENED, .now_us = now_us};
	conn_event(c->t, &e);
}

void tap_track_conn_blocked(struct tap_track_conn *c, struct tap_slice reason, int64_t now_us)
{
	trk_record_blocked(&c->t->render, c, TRK_RECORD_BLOCKED, reason, now_us);
	trk_emit(c->t);
	if (!c->blocked) {
		c->blocked_since = now_us;
		trk_mark_blocked(c); /* the publish that made the broker block it came before this, and waits as long */
	}
	c->blocked = true;
	struct tap_track_conn_event e = {.conn = c->id, .change = TAP_TRACK_CONN_BLOCKED, .now_us = now_us};
	conn_event(c->t, &e);
}

void tap_track_conn_unblocked(struct tap_track_conn *c, int64_t now_us)
{
	trk_record_blocked(&c->t->render, c, TRK_RECORD_UNBLOCKED, (struct tap_slice){NULL, 0}, now_us);
	trk_emit(c->t);
	if (c->blocked) {
		c->unblocked_at = now_us;
		trk_due_now(c, now_us); /* the paused windows run again */
	}
	c->blocked = false;
	struct tap_track_conn_event e = {.conn = c->id, .change = TAP_TRACK_CONN_UNBLOCKED, .now_us = now_us};
	conn_event(c->t, &e);
}

void tap_track_conn_close(struct tap_track_conn *c, enum tap_peer by, uint16_t code, struct tap_slice text,
                          int64_t now_us)
{
	(void)now_us;
	if (c->closed)
		return;
	c->closed = true;
	c->close_by_broker = by == TAP_BY_BROKER;
	c->close_code = code;
	c->close_text = trk_dup(c->t, text.ptr, text.len);
	c->close_text_len = c->close_text ? text.len : 0;
	if (!c->close_text) {
		c->t->st.oom++;
		c->details_lost = true;
	}
}

void tap_track_conn_held(struct tap_track_conn *c, enum tap_track_hold hold, int64_t now_us)
{
	bool held = hold == TAP_TRACK_HELD;
	if (held == c->held)
		return;
	c->held = held;
	if (!held) {
		c->unheld_at = now_us;
		trk_due_now(c, now_us); /* the paused windows run again */
	}
}

void tap_track_conn_detail(struct tap_track_conn *c, const char *detail)
{
	if (!trk_set_cstr(c->t, &c->end_detail, detail))
		c->details_lost = true;
}

void tap_track_conn_upstream(struct tap_track_conn *c, const char *addr)
{
	if (!trk_set_cstr(c->t, &c->upstream, addr))
		c->details_lost = true;
	trk_free_str(c->t, &c->upstream_local); /* the last address's: the new one sets its own */
}

void tap_track_conn_upstream_local(struct tap_track_conn *c, const char *addr)
{
	c->proxied = true;
	if (!trk_set_cstr(c->t, &c->upstream_local, addr))
		c->details_lost = true;
}

void tap_track_conn_close_ok(struct tap_track_conn *c, int64_t now_us)
{
	(void)now_us;
	if (c->closed && !c->close_by_broker)
		c->settled = true;
}

static void chan_reason(const struct trk_chan *ch, struct trk_reason *r)
{
	*r = (struct trk_reason){.by = ch->close_by_broker ? "broker" : ch->close_by_fault ? "fault" : "client",
	                         .has_code = true,
	                         .code = ch->close_code,
	                         .text = (const uint8_t *)ch->close_text,
	                         .text_len = ch->close_text_len};
}

static void conn_reason(const struct tap_track_conn *c, const char *reason_by, struct trk_reason *r)
{
	if (c->closed)
		*r = (struct trk_reason){.by = c->close_by_broker ? "broker" : "client",
		                         .has_code = true,
		                         .code = c->close_code,
		                         .text = (const uint8_t *)c->close_text,
		                         .text_len = c->close_text_len};
	else
		*r = (struct trk_reason){.by = reason_by ? reason_by : "eof",
		                         .text = (const uint8_t *)c->end_detail,
		                         .text_len = c->end_detail ? strlen(c->end_detail) : 0};
}

/* Ends every outstanding publish of the channel, writes its close record and frees it. */
static void chan_end(struct tap_track_conn *c, struct trk_chan *ch, const struct trk_reason *fallback, int64_t now_us)
{
	struct trk_reason r;
	if (ch->closing) {
		chan_reason(ch, &r);
		r.settled = fallback->settled && !ch->close_by_broker; /* a close-ok to the client's own close only */
	} else {
		r = *fallback;
	}
	uint64_t unconfirmed = 0;
	ch->pinned = true;
	for (uint64_t n = ch->base; n < ch->next; n++) {
		struct trk_slot *e = trk_slot(ch, n);
		if (e->state == TRK_STATE_DONE)
			continue;
		if (e->state == TRK_STATE_WAIT && (e->flags & TRK_FLAG_CONFIRM))
			unconfirmed++;
		/* close-channel: the client was shown the channel closed before any confirm of what is still waiting. The
		 * rewriter marks what it sees after the tracker, so a publish the client sent with its close-ok may not
		 * be marked yet when that close-ok ends the channel. */
		if (ch->close_by_fault && (e->flags & TRK_FLAG_CONFIRM))
			(void)trk_fault_put(c, ch->id, n - ch->sel_off, TAP_FAULT_SAW_CHANNEL_CLOSED, ch->fault_rule, false);
		trk_slot_step(c, ch, n, TRK_EVENT_END, &r, now_us);
	}
	trk_record_channel_close(&c->t->render, c, ch->id, &r, unconfirmed, ch->culprit, ch->culprit_len, ch->timed_out,
	                         ch->timed_out_len, now_us);
	trk_emit(c->t);
	trk_warn_chan_end(c, ch, now_us);
	trk_chan_free(c, ch);
}

void tap_track_conn_end(struct tap_track_conn *c, const char *reason_by, int64_t now_us)
{
	struct tap_track *t = c->t;
	struct trk_reason r;
	conn_reason(c, reason_by, &r);
	r.settled = c->settled;
	csm_conn_end(c, &r, now_us); /* the consumer tracker's deliveries and consumers, before the close record */
	if (c->retired)
		chan_end(c, c->retired, &r, now_us);
	while (c->n_chans > 0) /* in channel order; chan_end frees each */
		chan_end(c, c->chans[0], &r, now_us);
	trk_record_conn_close(&t->render, c, &r, now_us);
	trk_emit(t);
	trk_counts_add(&t->closed_counts, &c->counts);
	/* r.by: a literal or reason_by, never c's memory */
	struct tap_track_conn_event e = {.conn = c->id, .change = TAP_TRACK_CONN_ENDED, .reason_by = r.by,
	                                 .opened = c->opened, .now_us = now_us};
	conn_free(c);
	conn_event(t, &e);
}

/* ---- channel events ---- */

static void chan_event(struct tap_track_conn *c, uint16_t ch, const char *event, int64_t now_us)
{
	trk_record_channel(&c->t->render, c, ch, event, now_us);
	trk_emit(c->t);
}

/* No memory to store a channel as it opened or chose its mode: channels first seen at a publish from now on have
 * an unknown mode (a confirm channel's publishes would otherwise be written as unconfirmed). */
static void chan_lost(struct tap_track_conn *c)
{
	c->chans_lost = true;
	c->t->st.oom++;
}

/* The client opened a channel it had not seen closed: its close-ok is still to come (a client that does not wait for
 * it), or it never closed it. The broker's answers to what was published on it come before it looks at the new
 * open, so the channel is retired, not ended: they still find their publishes, and the new channel's publishes
 * never take them (the broker answers such an open with a connection error, or, had it finished the close, with
 * open-ok). */
static void chan_retire(struct tap_track_conn *c, struct trk_chan *ch, int64_t now_us)
{
	static const struct trk_reason reopen = {.by = "reopen"};
	if (c->retired)
		chan_end(c, c->retired, &reopen, now_us); /* a third open before the broker answered: no more to keep */
	trk_chan_retire(c, ch);
}

void tap_track_channel_open(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	struct trk_chan *ch = trk_chan_find(c, id);
	if (ch) {
		if (ch->close_by_fault) /* a close-channel's close the client took as done without its close-ok */
			ch->fault_ok_by[TAP_BY_CLIENT] = true;
		chan_retire(c, ch, now_us);
	}
	bool followed = trk_chan_in_budget(c, id, now_us) || trk_chan_beyond_max(c);
	if (!followed) {
		chan_lost(c); /* it is created by its first publish, in an unknown mode, or never */
		c->t->st.chans_unfollowed++;
	}
	trk_record_channel_open(&c->t->render, c, id, followed, now_us);
	trk_emit(c->t);
}

void tap_track_channel_open_ok(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	static const struct trk_reason reopen = {.by = "reopen"};
	/* the broker took the new open: it had nothing more to say about the channel before it */
	if (c->retired && c->retired->id == id)
		chan_end(c, c->retired, &reopen, now_us);
}

void tap_track_conn_unseen(struct tap_track_conn *c, const char *by, int64_t now_us)
{
	if (!c->unseen_by)
		c->unseen_by = by;
	for (uint32_t i = 0; i < c->n_chans; i++) {
		if (c->chans[i]->mode != TRK_MODE_NONE)
			continue;
		c->chans[i]->mode = TRK_MODE_UNKNOWN;
		chan_event(c, c->chans[i]->id, "mode_unknown", now_us);
	}
}


/* A capture lost bytes of this connection (src/DESIGN.md §6b): whatever was lost may have been the Return, Ack, Nack or
 * close that decides an outstanding publish, or (client side) publishes that shift every later confirm sequence
 * number. Every outstanding publish ends now with {"by":"capture_gap"} (verdict_of, TRK_EVENT_GAP). */
void tap_track_conn_gap(struct tap_track_conn *c, enum tap_track_gap_seq seq, int64_t now_us)
{
	static const struct trk_reason gap = {.by = "capture_gap"};
	uint32_t flags = seq == TAP_TRACK_GAP_SEQ_LOST ? TRK_FLAG_SEQ_LOST : 0; /* counted across lost publishes */
	if (c->retired)
		trk_chan_end_all_waiting(c, c->retired, flags, &gap, now_us);
	for (uint32_t i = 0; i < c->n_chans; i++)
		trk_chan_end_all_waiting(c, c->chans[i], flags, &gap, now_us);
}

/* A publish on a channel not seen before, after tap_track_conn_unseen: it may have selected a mode unseen. */
void trk_chan_first_publish(struct tap_track_conn *c, struct trk_chan *ch, int64_t now_us)
{
	if ((!c->unseen_by && !c->chans_lost) || ch->mode != TRK_MODE_NONE)
		return;
	ch->mode = TRK_MODE_UNKNOWN;
	chan_event(c, ch->id, "mode_unknown", now_us);
}

void tap_track_confirm_select(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	struct trk_chan *ch = trk_chan_in_budget(c, id, now_us);
	if (!ch && !trk_chan_beyond_max(c))
		chan_lost(c);
	if (ch && (ch->mode == TRK_MODE_NONE || ch->mode == TRK_MODE_UNKNOWN)) {
		ch->mode = TRK_MODE_CONFIRM;
		ch->sel_off = ch->next - 1;
	}
	c->confirms = true;
	chan_event(c, id, "confirm_select", now_us);
}

void tap_track_tx_select(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	struct trk_chan *ch = trk_chan_in_budget(c, id, now_us);
	if (!ch && !trk_chan_beyond_max(c))
		chan_lost(c);
	if (ch && (ch->mode == TRK_MODE_NONE || ch->mode == TRK_MODE_UNKNOWN))
		ch->mode = TRK_MODE_TX;
	chan_event(c, id, "tx_select", now_us);
}

void tap_track_channel_close(struct tap_track_conn *c, uint16_t id, enum tap_peer by, uint16_t code,
                             struct tap_slice text, int64_t now_us)
{
	struct trk_chan *ch = by == TAP_BY_BROKER ? trk_chan_answering(c, id) : NULL;
	if (!ch)
		ch = trk_chan_in_budget(c, id, now_us);
	if (!ch)
		return;
	/* Closes can cross: the client closes while the broker's 404 is on its way. The broker's close says why
	 * the publishes went unanswered, so it wins over the client's; otherwise the first close stands. */
	if (ch->closing && (ch->close_by_broker || by == TAP_BY_CLIENT)) {
		if (ch->close_by_fault && by == TAP_BY_CLIENT) /* its own close crossed the one it was shown: the tap */
			ch->fault_ok_by[TAP_BY_CLIENT] = true; /* answers it, and the client is done with the channel */
		return;
	}
	if (ch->close_text)
		trk_free(c->t, ch->close_text, ch->close_text_len + 1);
	ch->closing = true;
	ch->close_by_broker = by == TAP_BY_BROKER;
	ch->close_code = code;
	ch->close_text = text.len ? trk_dup(c->t, text.ptr, text.len) : NULL;
	ch->close_text_len = ch->close_text ? text.len : 0;
	if (text.len && !ch->close_text) { /* its reasons say no text, and no culprit is named by it */
		c->t->st.oom++;
		c->details_lost = true;
	}
}

void tap_track_channel_close_ok(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	struct trk_chan *ch = trk_chan_answering(c, id);
	if (!ch)
		return;
	/* the broker's close-ok to the client's close comes after everything the broker had to say */
	struct trk_reason r = {.by = "close_ok", .settled = ch->closing && !ch->close_by_broker};
	chan_end(c, ch, &r, now_us);
}

void tap_track_tx_end(struct tap_track_conn *c, uint16_t id, enum tap_track_tx_end how, int64_t now_us)
{
	struct trk_chan *ch = trk_chan_find(c, id);
	uint64_t mark = how == TAP_TRACK_TX_ROLLBACK ? TRK_TX_ROLLBACK : 0;
	if (ch && ch->mode == TRK_MODE_TX && !trk_fifo_push(c->t, &ch->tx_q, ch->next | mark))
		c->t->st.oom++; /* its answer then ends every publish still waiting */
	(void)now_us;
}

void tap_track_tx_end_ok(struct tap_track_conn *c, uint16_t id, enum tap_track_tx_end how, int64_t now_us)
{
	static const struct trk_reason rolled_back = {.by = "tx_rollback"};
	struct trk_chan *ch = trk_chan_answering(c, id);
	if (!ch)
		return;
	uint64_t end = ch->next;
	if (ch->tx_q.len) {
		end = trk_fifo_front(&ch->tx_q) & ~TRK_TX_ROLLBACK;
		trk_fifo_pop(&ch->tx_q);
	}
	/* Returns of the committed publishes precede commit-ok: the ones still waiting got none. */
	ch->pinned = true;
	for (uint64_t n = ch->base; n < end; n++) {
		if (n < ch->base)
			n = ch->base; /* ending the head moved it past slots ended earlier */
		if (n >= end || n >= ch->next)
			break;
		struct trk_slot *e = trk_slot(ch, n);
		if (e->state != TRK_STATE_WAIT || !(e->flags & TRK_FLAG_TX))
			continue;
		if (how == TAP_TRACK_TX_ROLLBACK)
			trk_slot_step(c, ch, n, TRK_EVENT_END, &rolled_back, now_us);
		else
			trk_slot_step(c, ch, n, TRK_EVENT_COMMIT, NULL, now_us);
	}
	trk_chan_unpin(c->t, ch);
}

void tap_track_shutdown(struct tap_track *t, int64_t now_us)
{
	while (t->conns)
		tap_track_conn_end(t->conns, "shutdown", now_us);
	trk_ident_shutdown(t, now_us);
}

unsigned tap_track_identity_mode(const struct tap_track *t)
{
	return t->conf.identity_mode;
}

/* ---- summary and stats ---- */

void tap_track_summary(struct tap_track *t, struct tap_buf *out)
{
	trk_summary(t, out);
}

void tap_track_get_stats(const struct tap_track *t, struct tap_track_stats *s)
{
	*s = t->st;
	s->ident_memory = t->ident.mem;
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

/* ---- read access for the metrics endpoint ---- */

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

void tap_track_fault_mark(struct tap_track_conn *c, uint16_t ch, uint64_t seq, enum tap_fault_saw saw, uint32_t rule)
{
	if (c && seq)
		(void)trk_fault_put(c, ch, seq, (uint8_t)saw, rule, true); /* without memory the record lacks client_saw */
}

void tap_track_fault(struct tap_track_conn *c, const struct tap_fault_act *a, int64_t now_us)
{
	if (!c)
		return;
	trk_record_fault(&c->t->render, c, a, now_us);
	trk_emit(c->t);
	if (a->action != TAP_FAULT_CLOSE_CHANNEL)
		return;
	/* the tap's channel.close to the broker: a client's close as far as the broker's answers go (what it had
	 * routed before it is still acked), with the code and text the client was shown */
	const char *text = a->text ? a->text : "";
	tap_track_channel_close(c, a->channel, TAP_BY_CLIENT, a->code,
	                        (struct tap_slice){(const uint8_t *)text, strlen(text)}, now_us);
	struct trk_chan *ch = trk_chan_find(c, a->channel);
	if (ch && ch->closing && !ch->close_by_broker) {
		ch->close_by_fault = true;
		ch->fault_rule = a->rule;
		ch->fault_ok_by[TAP_BY_CLIENT] = ch->fault_ok_by[TAP_BY_BROKER] = false;
	}
}

bool tap_track_channel_fault_close_wait(struct tap_track_conn *c, uint16_t id, enum tap_peer by)
{
	struct trk_chan *ch = by == TAP_BY_BROKER ? trk_chan_answering(c, id) : trk_chan_find(c, id);
	if (!ch || !ch->closing || !ch->close_by_fault)
		return false;
	ch->fault_ok_by[by] = true;
	return !(ch->fault_ok_by[TAP_BY_CLIENT] && ch->fault_ok_by[TAP_BY_BROKER]);
}
