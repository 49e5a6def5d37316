/* The capture copy of a connection's streams (tap_capture_sink): the broker's passed on as it comes, the client's
 * held back while a frame may carry a secret and overwritten where one lies (src/DESIGN.md names the rules). */
#include "conn_int.h"

#include "amqptap/status.h"

#include <string.h>

/* Stream offsets to overwrite in the capture copy of this chunk. When the array is full the last range grows
 * over the new one: more is hidden, never less. */
static void redact_add(struct tap_conn *c, uint64_t off, size_t len)
{
	const size_t cap = sizeof c->redact / sizeof c->redact[0];
	if (c->n_redact == cap) {
		struct tap_range *last = &c->redact[cap - 1];
		if (off + len > last->off)
			last->len = (size_t)(off + len - last->off);
		return;
	}
	c->redact[c->n_redact++] = (struct tap_range){(size_t)off, len};
}

/* The secrets of a client method in the capture copy: its secret bytes when it decoded, the whole payload when
 * it did not and it could be part of the login (channel 0, or anything before the login finished). */
void conn_redact_method(struct tap_conn *c, const struct tap_frame_ev *ev, const struct tap_method *m, int rc)
{
	uint64_t payload = ev->offset + TAP_FRAME_HEADER_SIZE;
	if (rc != TAP_OK || !m->def) {
		if (ev->channel == 0 || !c->login_done || m->class_id == TAP_CLASS_CONNECTION)
			redact_add(c, payload, ev->len);
		return;
	}
	if (m->def->class_id != TAP_CLASS_CONNECTION) /* every secret argument is in a connection method */
		return;
	struct tap_range r[TAP_REDACT_MAX_RANGES];
	size_t n = tap_redact_ranges(m, ev->data, r);
	for (size_t i = 0; i < n; i++)
		redact_add(c, payload + r[i].off, r[i].len);
}

/* Where the client bytes that must still be held start: the first byte of an unfinished frame that may carry a
 * secret (any frame before the login; after it, one whose header is incomplete, or a method on channel 0 or of
 * class connection, or of a class not known yet), else the end of what was decoded. */
static uint64_t hold_from(const struct tap_conn *c, const struct tap_frame_dec *d)
{
	struct tap_frame_partial f;
	if (!tap_frame_dec_partial(d, &f))
		return tap_frame_dec_offset(d);
	if (conn_logging_in(c) || f.type == 0 ||
	    (f.type == TAP_FRAME_METHOD && (f.channel == 0 || f.class_id == 0 || f.class_id == TAP_CLASS_CONNECTION)))
		return f.offset;
	return tap_frame_dec_offset(d);
}

/* The capture copy of the client stream. Bytes are held back while they may belong to an unfinished method,
 * overwritten where redact[] says, and after a client-side decode error everything from the first byte that
 * was not decoded is overwritten: the tap cannot tell where a secret lies in bytes it does not understand. */
void conn_capture_chunk(struct tap_conn *c, enum tap_dir dir, const uint8_t *data, size_t len, uint64_t chunk_offset,
			  int64_t now_us)
{
	const struct tap_capture_sink *cap = c->o->capture;
	if (dir == TAP_S2C) {
		cap->data(cap->ctx, c->capture, TAP_S2C, data, len, now_us);
		return;
	}
	const struct direction *d = &c->dir[TAP_C2S];
	if (d->gapped) /* the decoder restarted mid-stream: it cannot say where a secret lies, leave a hole */
		return;
	uint64_t end = chunk_offset + len;
	uint64_t release = d->stopped ? end : hold_from(c, &d->dec);
	if (release > end)
		release = end;
	bool mask_tail = d->stopped && d->decoded < end;
	if (c->held.len == 0 && c->n_redact == 0 && release == end && !mask_tail) {
		cap->data(cap->ctx, c->capture, TAP_C2S, data, len, now_us); /* the common case: no copy */
		return;
	}
	if (c->held.len == 0)
		c->held_offset = chunk_offset;
	tap_buf_append(&c->held, data, len);
	if (c->held.oom) { /* cannot hold: leave a gap in the capture rather than risk a secret */
		tap_buf_reset(&c->held);
		c->n_redact = 0;
		return;
	}
	for (size_t i = 0; i < c->n_redact; i++) {
		const struct tap_range *r = &c->redact[i];
		for (size_t k = 0; k < r->len; k++) {
			uint64_t at = r->off + k;
			if (at >= c->held_offset && at < c->held_offset + c->held.len)
				c->held.data[at - c->held_offset] = TAP_REDACT_FILL;
		}
	}
	c->n_redact = 0;
	if (mask_tail) {
		size_t from = d->decoded > c->held_offset ? (size_t)(d->decoded - c->held_offset) : 0;
		memset(c->held.data + from, TAP_REDACT_FILL, c->held.len - from);
	}
	size_t out = release > c->held_offset ? (size_t)(release - c->held_offset) : 0;
	if (out > 0) {
		cap->data(cap->ctx, c->capture, TAP_C2S, (const uint8_t *)c->held.data, out, now_us);
		memmove(c->held.data, c->held.data + out, c->held.len - out);
		c->held.len -= out;
		c->held_offset += out;
	}
}

void conn_capture_close(struct tap_conn *c, const char *reason_by, int64_t now_us)
{
	const struct tap_capture_sink *cap = c->o->capture;
	if (c->held.len) { /* an unfinished method frame: it may hold all of a password but its end octet */
		memset(c->held.data, TAP_REDACT_FILL, c->held.len);
		cap->data(cap->ctx, c->capture, TAP_C2S, (const uint8_t *)c->held.data, c->held.len, now_us);
	}
	cap->close(cap->ctx, c->capture, reason_by, now_us);
}
