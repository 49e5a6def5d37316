/* The observer's own records: decode_error and capture_gap (about a stream offset of one direction), and the
 * frame trace's lines. */
#include "conn_int.h"

#include "amqptap/frames.h"
#include "amqptap/record.h"
#include "amqptap/status.h"

#include <string.h>

/* How many of the bytes at the error a decode_error record may show (data: from the error's offset on, len of
 * them here). Within the 8-byte protocol header, those: a peer that speaks something else (HTTP, TLS, AMQP 1.0)
 * shows what it speaks. Past it, only what says what the frame is, never what it carries: a method's arguments
 * may be a secret (update-secret), a content header holds header values, a body the message. So a frame's 7-byte
 * header, and for a method its class and method ids; the one end octet that was wrong; and nothing of the client's
 * frames before the login finished (where a frame header may not be where the decoder thinks). */
static size_t shown_bytes(const struct tap_conn *c, enum tap_dir dir, int status, uint64_t at, uint64_t data_offset,
			  const uint8_t *data, size_t len)
{
	size_t keep;
	if (data_offset < 8)
		keep = (size_t)(8 - data_offset);
	else if ((dir == TAP_C2S && !c->login_done) || data_offset != at) /* at: in an earlier chunk */
		keep = 0;
	else if (status == TAP_E_BAD_FRAME_END)
		keep = 1;
	else
		keep = len > 0 && data[0] == TAP_FRAME_METHOD ? 7 + 4 : 7;
	return len < keep ? len : keep;
}

/* A record about a stream offset of one direction (decode_error, capture_gap), begun in the observer's scratch
 * buffer: its type, ts, run, conn, dir and offset; the caller adds the rest and calls stream_record_emit. */
static void stream_record_begin(struct tap_conn *c, struct tap_json *j, const char *type, enum tap_dir dir,
				uint64_t offset, int64_t now_us)
{
	struct tap_observer *o = c->o;
	tap_buf_reset(&o->scratch);
	tap_record_begin_once(j, &o->scratch, type, now_us, tap_track_run(o->track));
	tap_json_kv_uint(j, "conn", c->id);
	tap_json_kv_str(j, "dir", tap_dir_name(dir));
	tap_json_kv_uint(j, "offset", offset);
}

static void stream_record_emit(struct tap_conn *c, struct tap_json *j)
{
	struct tap_observer *o = c->o;
	tap_json_obj_end(j);
	if (o->emit)
		o->emit(o->emit_ctx, o->scratch.data, o->scratch.len);
}

void conn_gap_record(struct tap_conn *c, enum tap_dir dir, uint64_t offset, uint64_t missing, int64_t now_us)
{
	struct tap_json j;
	c->o->capture_gaps++;
	c->o->gap_bytes += missing;
	stream_record_begin(c, &j, "capture_gap", dir, offset, now_us);
	tap_json_kv_uint(&j, "missing", missing);
	stream_record_emit(c, &j);
}

static void decode_error_record(struct tap_conn *c, enum tap_dir dir, int status, uint64_t at, const uint8_t *shown,
				size_t n_shown, int64_t now_us)
{
	struct tap_json j;
	c->o->decode_errors++;
	stream_record_begin(c, &j, "decode_error", dir, at, now_us);
	tap_json_kv_str(&j, "reason", tap_strerror(status));
	tap_json_kv_str(&j, "status", tap_status_name(status));
	tap_json_key(&j, "hex");
	tap_json_hex(&j, shown, n_shown);
	stream_record_emit(c, &j);
}

/* The record names the stream offset `at` of the error and shows some bytes from there (from the chunk start
 * when the error lies in an earlier chunk): see shown_bytes. Decoding of that direction stops. */
void conn_decode_error(struct tap_conn *c, enum tap_dir dir, int status, uint64_t at, const uint8_t *chunk,
			 size_t chunk_len, uint64_t chunk_offset, int64_t now_us)
{
	const uint8_t *data = chunk;
	size_t len = chunk_len;
	uint64_t data_offset = chunk_offset;
	if (at >= chunk_offset && at - chunk_offset < chunk_len) {
		data += at - chunk_offset;
		len -= (size_t)(at - chunk_offset);
		data_offset = at;
	}
	decode_error_record(c, dir, status, at, data, shown_bytes(c, dir, status, at, data_offset, data, len), now_us);
}

/* A whole method frame whose payload did not decode (a class or method this dialect does not have, arguments
 * cut short, a bad table): its frame boundaries hold, so decoding goes on. The first of each direction gets a
 * record showing the frame header and the class and method ids, as shown_bytes would; the peer usually ends
 * the connection at once (RabbitMQ closes the socket on a client's), and a broker's later ones would only
 * repeat it. */
void conn_bad_method(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev, int status, int64_t now_us)
{
	struct direction *d = &c->dir[dir];
	if (d->bad_method_seen)
		return;
	d->bad_method_seen = true;
	uint8_t shown[TAP_FRAME_HEADER_SIZE + 4] = {TAP_FRAME_METHOD, (uint8_t)(ev->channel >> 8), (uint8_t)ev->channel};
	for (int i = 0; i < 4; i++)
		shown[3 + i] = (uint8_t)(ev->len >> (24 - 8 * i));
	/* a client's "method" before the login may be its password in a frame of its own making: its header only */
	size_t ids = dir == TAP_C2S && !c->login_done ? 0 : ev->len < 4 ? ev->len : 4;
	memcpy(shown + TAP_FRAME_HEADER_SIZE, ev->data, ids);
	decode_error_record(c, dir, status, ev->offset, shown, TAP_FRAME_HEADER_SIZE + ids, now_us);
}

void conn_trace_frame(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev, int64_t now_us)
{
	struct tap_observer *o = c->o;
	struct direction *d = &c->dir[dir];
	if (!o->frames)
		return;
	if (ev->kind == TAP_EV_BODY) {
		if (d->body_prefix.len < o->body_bytes) {
			size_t want = o->body_bytes - d->body_prefix.len;
			tap_buf_append(&d->body_prefix, ev->data, ev->len < want ? ev->len : want);
		}
		if (!ev->frame_end)
			return;
	}
	tap_buf_reset(&o->scratch);
	tap_frames_line(&o->scratch, tap_track_run(o->track), c->id, dir, now_us, ev,
			(const uint8_t *)d->body_prefix.data, d->body_prefix.len);
	o->frames->line(o->frames->ctx, o->scratch.data, o->scratch.len);
	tap_buf_reset(&d->body_prefix);
}
