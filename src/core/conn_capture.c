/* The capture copy of a connection's streams (tap_capture_sink): the client's held back while a frame may carry a
 * secret and overwritten where one lies (src/DESIGN.md names the rules); the broker's passed on as it comes once the
 * client has logged in, and until then treated as the client's: a peer that echoes what it is sent (no broker)
 * would otherwise put the client's password in the capture. */
#include "conn_int.h"

#include "amqptap/status.h"

#include <string.h>

/* Stream offsets to overwrite in the capture copy of this chunk. When the array is full the last range grows
 * over the new one: more is hidden, never less. */
static void redact_add(struct capture_copy *k, uint64_t off, size_t len)
{
	const size_t cap = sizeof k->redact / sizeof k->redact[0];
	if (k->n_redact == cap) {
		struct tap_range *last = &k->redact[cap - 1];
		if (off + len > last->off)
			last->len = (size_t)(off + len - last->off);
		return;
	}
	k->redact[k->n_redact++] = (struct tap_range){(size_t)off, len};
}

/* The secrets of a method in the capture copy: its secret bytes when it decoded, the whole payload when it did not
 * and it could be part of the login (channel 0, or anything before the login finished). */
void conn_redact_method(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev,
			const struct tap_method *m, int rc)
{
	struct capture_copy *k = &c->copy[dir];
	uint64_t payload = ev->offset + TAP_FRAME_HEADER_SIZE;
	if (rc != TAP_OK || !m->def) {
		if (ev->channel == 0 || !c->login_done || m->class_id == TAP_CLASS_CONNECTION)
			redact_add(k, payload, ev->len);
		return;
	}
	if (m->def->class_id != TAP_CLASS_CONNECTION) /* every secret argument is in a connection method */
		return;
	struct tap_range r[TAP_REDACT_MAX_RANGES];
	size_t n = tap_redact_ranges(m, ev->data, r);
	for (size_t i = 0; i < n; i++)
		redact_add(k, payload + r[i].off, r[i].len);
}

/* Where the bytes that must still be held start: the first byte of an unfinished frame that may carry a secret
 * (any frame before the login; after it, one whose header is incomplete, or a method on channel 0 or of class
 * connection, or of a class not known yet), else the end of what was decoded. */
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

/* The capture copy of one stream. Bytes are held back while they may belong to an unfinished method, overwritten
 * where redact[] says, and after a decode error everything from the first byte that was not decoded is
 * overwritten: the tap cannot tell where a secret lies in bytes it does not understand. The broker's stream takes
 * this path only while the client logs in (and to pass on what it held then). */
void conn_capture_chunk(struct tap_conn *c, enum tap_dir dir, const uint8_t *data, size_t len, uint64_t chunk_offset,
			  int64_t now_us)
{
	const struct tap_capture_sink *cap = c->o->capture;
	struct capture_copy *k = &c->copy[dir];
	if (dir == TAP_S2C && k->held.len == 0 && k->n_redact == 0 && !conn_logging_in(c)) {
		cap->data(cap->ctx, c->capture, TAP_S2C, data, len, now_us); /* the broker's, logged in: as it comes */
		return;
	}
	const struct direction *d = &c->dir[dir];
	if (d->gapped) /* the decoder restarted mid-stream: it cannot say where a secret lies, leave a hole */
		return;
	uint64_t end = chunk_offset + len;
	uint64_t release = d->stopped ? end : hold_from(c, &d->dec);
	if (release > end)
		release = end;
	bool mask_tail = d->stopped && d->decoded < end;
	if (k->held.len == 0 && k->n_redact == 0 && release == end && !mask_tail) {
		cap->data(cap->ctx, c->capture, dir, data, len, now_us); /* the common case: no copy */
		return;
	}
	if (k->held.len == 0)
		k->held_offset = chunk_offset;
	tap_buf_append(&k->held, data, len);
	if (k->held.oom) { /* cannot hold: leave a gap in the capture rather than risk a secret */
		tap_buf_reset(&k->held);
		k->n_redact = 0;
		return;
	}
	for (size_t i = 0; i < k->n_redact; i++) {
		const struct tap_range *r = &k->redact[i];
		for (size_t j = 0; j < r->len; j++) {
			uint64_t at = r->off + j;
			if (at >= k->held_offset && at < k->held_offset + k->held.len)
				k->held.data[at - k->held_offset] = TAP_REDACT_FILL;
		}
	}
	k->n_redact = 0;
	if (mask_tail) {
		size_t from = d->decoded > k->held_offset ? (size_t)(d->decoded - k->held_offset) : 0;
		memset(k->held.data + from, TAP_REDACT_FILL, k->held.len - from);
	}
	size_t out = release > k->held_offset ? (size_t)(release - k->held_offset) : 0;
	if (out > 0) {
		cap->data(cap->ctx, c->capture, dir, (const uint8_t *)k->held.data, out, now_us);
		memmove(k->held.data, k->held.data + out, k->held.len - out);
		k->held.len -= out;
		k->held_offset += out;
	}
}

void conn_capture_close(struct tap_conn *c, const char *reason_by, int64_t now_us)
{
	const struct tap_capture_sink *cap = c->o->capture;
	for (int dir = 0; dir < TAP_DIR_COUNT; dir++) {
		struct capture_copy *k = &c->copy[dir];
		if (k->held.len) { /* an unfinished method frame: it may hold all of a password but its end octet */
			memset(k->held.data, TAP_REDACT_FILL, k->held.len);
			cap->data(cap->ctx, c->capture, (enum tap_dir)dir, (const uint8_t *)k->held.data, k->held.len,
				  now_us);
		}
	}
	cap->close(cap->ctx, c->capture, reason_by, now_us);
}
