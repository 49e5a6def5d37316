/* Per-connection observer: the public tap_conn_* API. Feeds a copy of both directions to their decoders and hands
 * each decoded frame on: methods to conn_method.c, content to conn_content.c, the trace and decode errors to
 * conn_record.c, the capture copy to conn_capture.c (conn_int.h draws how the files call one way). */
#include "conn_int.h"

#include "amqptap/consume.h"
#include "amqptap/fault.h"
#include "amqptap/status.h"

#include <stdlib.h>
#include <string.h>

void tap_observer_init(struct tap_observer *o, struct tap_track *track, tap_track_emit_fn emit, void *emit_ctx,
		       const struct tap_frames_sink *frames, uint32_t body_bytes)
{
	memset(o, 0, sizeof *o);
	o->track = track;
	o->emit = emit;
	o->emit_ctx = emit_ctx;
	o->frames = frames;
	o->body_bytes = body_bytes;
	o->pending_max = TAP_OBSERVER_PENDING_MAX;
	tap_buf_init(&o->scratch);
}

void tap_observer_deinit(struct tap_observer *o)
{
	tap_buf_deinit(&o->scratch);
}

struct tap_conn *tap_conn_new(struct tap_observer *o, uint64_t id, const char *client, const char *upstream,
			      int64_t now_us)
{
	size_t copies = o->capture ? TAP_DIR_COUNT * sizeof(struct capture_copy) : 0;
	struct tap_conn *c = calloc(1, sizeof *c + copies);
	if (!c) {
		tap_track_conn_unfollowed(o->track);
		return NULL;
	}
	c->o = o;
	c->id = id;
	c->tc = tap_track_conn_new(o->track, id, client, upstream, now_us);
	if (!c->tc) { /* counted by the tracker */
		free(c);
		return NULL;
	}
	tap_frame_dec_init(&c->dir[TAP_S2C].dec);
	tap_frame_dec_init_client(&c->dir[TAP_C2S].dec);
	for (int d = 0; d < TAP_DIR_COUNT; d++)
		tap_buf_init(&c->dir[d].body_prefix);
	for (int d = 0; copies && d < TAP_DIR_COUNT; d++)
		tap_buf_init(&c->copy[d].held);
	if (o->capture && o->capture->open)
		c->capture = o->capture->open(o->capture->ctx, id, client, upstream, now_us);
	return c;
}

void tap_conn_note(struct tap_conn *c, const char *detail)
{
	if (c)
		tap_track_conn_detail(c->tc, detail);
}

void tap_conn_upstream(struct tap_conn *c, const char *addr)
{
	if (!c)
		return;
	tap_track_conn_upstream(c->tc, addr);
	if (c->capture && c->o->capture->server)
		c->o->capture->server(c->o->capture->ctx, c->capture, addr);
}

void tap_conn_upstream_local(struct tap_conn *c, const char *addr)
{
	if (c)
		tap_track_conn_upstream_local(c->tc, addr);
}

void tap_conn_held(struct tap_conn *c, enum tap_track_hold hold, int64_t now_us)
{
	if (c)
		tap_track_conn_held(c->tc, hold, now_us);
}

void tap_conn_fault_mark(struct tap_conn *c, uint16_t ch, uint64_t seq, enum tap_fault_saw saw, uint32_t rule)
{
	if (c)
		tap_track_fault_mark(c->tc, ch, seq, saw, rule);
}

void tap_conn_fault(struct tap_conn *c, const struct tap_fault_act *a, int64_t now_us)
{
	if (c)
		tap_track_fault(c->tc, a, now_us);
}

void tap_conn_end(struct tap_conn *c, const char *reason_by, int64_t now_us)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->n_chans; i++) {
		if (c->chans[i].dir[TAP_C2S].kind == PENDING_PUBLISH)
			conn_pending_cut(c, c->chans[i].number, &c->chans[i].dir[TAP_C2S], now_us);
		if (c->chans[i].dir[TAP_S2C].kind == PENDING_DELIVER) /* each delivery has its record too */
			conn_pending_cut(c, c->chans[i].number, &c->chans[i].dir[TAP_S2C], now_us);
	}
	tap_track_conn_uncharge(c->tc, c->chans_charged); /* the tracker's connection ends now */
	tap_track_conn_end(c->tc, reason_by, now_us);
	if (c->capture)
		conn_capture_close(c, reason_by, now_us);
	for (int d = 0; c->o->capture && d < TAP_DIR_COUNT; d++)
		tap_buf_deinit(&c->copy[d].held);
	for (int d = 0; d < TAP_DIR_COUNT; d++) {
		tap_frame_dec_deinit(&c->dir[d].dec);
		tap_buf_deinit(&c->dir[d].body_prefix);
	}
	for (size_t i = 0; i < c->n_chans; i++) {
		for (int d = 0; d < TAP_DIR_COUNT; d++)
			conn_store_free(c, &c->chans[i].dir[d].store);
		conn_fp_free(c, &c->chans[i]);
	}
	free(c->chans);
	free(c->chan_index);
	free(c->vhost);
	free(c);
}

static void conn_decode(struct tap_conn *c, enum tap_dir dir, const uint8_t *data, size_t len, int64_t now_us)
{
	struct direction *d = &c->dir[dir];
	const uint8_t *chunk = data;
	size_t chunk_len = len;
	uint64_t chunk_offset = d->fed - len;
	while (len > 0 && !d->stopped) {
		struct tap_frame_ev ev;
		ssize_t n = tap_frame_feed(&d->dec, data, len, &ev);
		if (n < 0) {
			d->stopped = true;
			conn_decode_error(c, dir, (int)n, tap_frame_dec_error_offset(&d->dec), chunk, chunk_len,
				     chunk_offset, now_us);
			return;
		}
		data += n;
		len -= (size_t)n;
		int rc = TAP_OK;
		if (dir == TAP_C2S && conn_logging_in(c) && (ev.kind == TAP_EV_HEADER || ev.kind == TAP_EV_BODY)) {
			/* nothing but methods comes before the login: bytes that claim to be content then are not
			 * understood, and whatever they hold (a password framed as a body) is shown nowhere */
			d->stopped = true;
			conn_decode_error(c, dir, TAP_E_UNEXPECTED_FRAME, ev.offset, chunk, chunk_len, chunk_offset, now_us);
			return;
		}
		switch (ev.kind) {
		case TAP_EV_METHOD:
			conn_trace_frame(c, dir, &ev, now_us);
			conn_on_method(c, dir, &ev, now_us);
			break;
		case TAP_EV_HEADER:
			conn_trace_frame(c, dir, &ev, now_us);
			conn_on_header(c, dir, &ev, now_us);
			break;
		case TAP_EV_BODY:
			conn_trace_frame(c, dir, &ev, now_us);
			rc = conn_on_body(c, dir, &ev, now_us);
			break;
		case TAP_EV_PROTOCOL_HEADER:
			if (dir == TAP_C2S) {
				c->version = ev.version;
				tap_frame_dec_set_version(&c->dir[TAP_S2C].dec, ev.version);
			}
			conn_trace_frame(c, dir, &ev, now_us);
			break;
		case TAP_EV_HEARTBEAT:
			conn_trace_frame(c, dir, &ev, now_us);
			break;
		case TAP_EV_NONE:
			break;
		}
		if (rc < 0) {
			d->stopped = true;
			conn_decode_error(c, dir, rc, ev.offset, chunk, chunk_len, chunk_offset, now_us);
			return;
		}
		if (ev.kind != TAP_EV_NONE && (ev.kind != TAP_EV_BODY || ev.frame_end))
			d->decoded = chunk_offset + (size_t)(data - chunk);
		/* after a broker-side gap no answer can be seen; after a client-side one no sequence number is known */
		if (dir == TAP_C2S && d->gapped)
			tap_track_conn_gap(c->tc, TAP_TRACK_GAP_SEQ_LOST, now_us);
		else if (dir == TAP_C2S && c->dir[TAP_S2C].gapped)
			tap_track_conn_gap(c->tc, TAP_TRACK_GAP_SEQ_KNOWN, now_us);
	}
}

void tap_conn_feed(struct tap_conn *c, enum tap_dir dir, const uint8_t *data, size_t len, int64_t now_us)
{
	uint64_t chunk_offset = c->dir[dir].fed;
	c->dir[dir].fed += len;
	conn_decode(c, dir, data, len, now_us);
	if (c->capture)
		conn_capture_chunk(c, dir, data, len, chunk_offset, now_us);
}

void tap_conn_start_unseen(struct tap_conn *c, int64_t now_us)
{
	if (!c)
		return;
	c->midstream = true;
	tap_track_conn_unseen(c->tc, "capture_start", now_us);
}

void tap_conn_gap(struct tap_conn *c, enum tap_dir dir, uint64_t offset, uint64_t missing, int64_t now_us)
{
	if (!c)
		return;
	struct direction *d = &c->dir[dir];
	conn_gap_record(c, dir, offset, missing, now_us);
	for (size_t i = 0; i < c->n_chans; i++) /* a content cut by the gap can never finish */
		conn_pending_cut(c, c->chans[i].number, &c->chans[i].dir[dir], now_us);
	tap_track_conn_gap(c->tc, d->gapped && dir == TAP_C2S ? TAP_TRACK_GAP_SEQ_LOST : TAP_TRACK_GAP_SEQ_KNOWN,
			   now_us);
	tap_consume_conn_gap(c->tc, now_us); /* a settle or a delivery may have been lost */
	if (dir == TAP_C2S)
		tap_track_conn_unseen(c->tc, "capture_gap", now_us);
	d->gapped = true;
	if (dir == TAP_S2C || d->stopped) {
		d->stopped = true;
		return;
	}
	/* the caller feeds the client side again from a frame boundary */
	tap_frame_dec_deinit(&d->dec);
	tap_frame_dec_init(&d->dec);
	tap_frame_dec_set_version(&d->dec, c->version);
	if (c->tuned)
		tap_frame_dec_set_frame_max(&d->dec, c->frame_max);
}
