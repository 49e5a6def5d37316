/* Content assembly (0-9-1 §4.2.6: method, header, body frames on one channel): a publish or return's properties and
 * wanted headers kept from its content header, its body counted to body-size, then handed to the tracker. */
#include "conn_int.h"

#include "amqptap/consume.h"
#include "amqptap/props.h"
#include "amqptap/status.h"
#include "amqptap/table.h"

#include <string.h>

/* A kept header field's encoding may take this much; a longer string is kept cut to it (the record shows far less
 * and says the value was cut), a longer field of another type is left out (and the value said cut). */
#define KEPT_FIELD_MAX 1024

/* Of the headers table, only the fields a record may show are kept (traceparent, the --header-values keys), as a
 * table of their own: a client's table can be as long as a frame, on every channel at once. */
static void keep_wanted_headers(const struct tap_conn *c, struct pending *p, struct tap_slice headers)
{
	struct tap_table_it it;
	struct tap_field f;
	uint32_t from = (uint32_t)p->store.len;
	tap_table_it_init(&it, headers.ptr, headers.len);
	for (const uint8_t *at = it.p; tap_table_next(&it, &f) > 0; at = it.p) {
		if (!tap_track_header_wanted(c->o->track, f.name, f.name_len))
			continue;
		size_t raw = (size_t)(it.p - at);
		if (raw <= KEPT_FIELD_MAX) {
			conn_store_put(c, p, at, raw);
		} else if (f.type == 'S' || f.type == 'x') {
			size_t head = 1 + (size_t)f.name_len + 1; /* name length, name, type */
			uint32_t keep_len = f.len < KEPT_FIELD_MAX ? f.len : KEPT_FIELD_MAX;
			uint8_t len_be[4] = {(uint8_t)(keep_len >> 24), (uint8_t)(keep_len >> 16), (uint8_t)(keep_len >> 8),
					     (uint8_t)keep_len};
			conn_store_put(c, p, at, head);
			conn_store_put(c, p, len_be, 4);
			conn_store_put(c, p, f.ptr, keep_len);
		} else {
			p->headers_cut = true;
		}
	}
	p->headers = (struct span){from, (uint32_t)p->store.len - from};
}

/* How a content ends: all of its body came, or it never will. */
enum pending_end { PENDING_COMPLETE, PENDING_CUT };

/* ---- identity (amqptap/identity.h): the message_id, else a fingerprint of what precedes the body and of the body,
 * hashed as its frames pass (the body is never kept). A publish's, and a delivery's: the broker delivers the
 * exchange, routing key, properties and body it was published with, so a delivery's identity is its publish's (the
 * consumer tracker links the two by it) ---- */

/* The fingerprint stream of p's direction of ch. */
static struct tap_identity_stream **fp_of(struct channel *ch, const struct pending *p)
{
	return &ch->fp[p == &ch->dir[TAP_S2C] ? TAP_S2C : TAP_C2S];
}

static void ident_begin(const struct tap_conn *c, struct pending *p, const struct tap_frame_ev *ev,
			const struct tap_props *props)
{
	enum tap_identity_mode mode = (enum tap_identity_mode)tap_track_identity_mode(c->o->track);
	if ((p->kind != PENDING_PUBLISH && p->kind != PENDING_DELIVER) || mode == TAP_IDENTITY_OFF)
		return;
	if (mode != TAP_IDENTITY_BODY && (props->flags & TAP_PROP_MESSAGE_ID) && props->message_id.len) {
		p->ident_kind = TAP_IDENTITY_ID;
		p->ident = tap_identity_of_id(props->message_id.ptr, props->message_id.len);
		return;
	}
	if (mode == TAP_IDENTITY_MESSAGE_ID || p->store.oom)
		return; /* no exchange and routing key kept: no fingerprint */
	p->ident = tap_identity_head(conn_span_slice(p, p->exchange), conn_span_slice(p, p->routing_key), ev->data,
				     ev->len, props);
	p->fp_on = true;
}

/* A slice of the body (already counted in body_got). */
static void ident_body(struct tap_conn *c, struct channel *ch, struct pending *p, const struct tap_frame_ev *ev)
{
	if (!p->fp_stream) {
		if (p->body_got == ev->len && ev->len == p->body_size) { /* the whole body at once: no stream */
			p->ident = tap_identity_body(p->ident, ev->data, ev->len);
			p->ident_kind = TAP_IDENTITY_FINGERPRINT;
			p->fp_on = false;
			return;
		}
		struct tap_observer *o = c->o;
		struct tap_identity_stream **fp = fp_of(ch, p);
		if (!*fp) {
			size_t size = tap_identity_stream_size();
			if (o->pending_mem + size > o->pending_max || !(*fp = tap_identity_stream_new())) {
				p->fp_on = false; /* no room: no identity */
				return;
			}
			o->pending_mem += size;
		}
		tap_identity_stream_reset(*fp, p->ident);
		p->fp_stream = true;
	}
	tap_identity_stream_update(*fp_of(ch, p), ev->data, ev->len);
}

/* The content's identity into *kind and *ident (kind 0: none). A cut content keeps only one made of its message_id. */
static void ident_finish(struct tap_conn *c, uint16_t channel, struct pending *p, bool complete, uint8_t *kind,
			 uint64_t *ident)
{
	if (p->fp_on && complete) {
		if (p->fp_stream) {
			struct channel *ch = conn_channel_find(c, channel);
			if (ch && *fp_of(ch, p)) {
				p->ident = tap_identity_stream_digest(*fp_of(ch, p));
				p->ident_kind = TAP_IDENTITY_FINGERPRINT;
			}
		} else if (p->body_size == 0) {
			p->ident = tap_identity_body(p->ident, NULL, 0);
			p->ident_kind = TAP_IDENTITY_FINGERPRINT;
		}
	}
	*kind = p->ident_kind;
	*ident = p->ident_kind ? p->ident : 0;
}

static void pending_finish(struct tap_conn *c, uint16_t channel, struct pending *p, enum pending_end how,
			   int64_t now_us)
{
	bool cut = how == PENDING_CUT;
	if (p->kind == PENDING_PUBLISH) {
		struct tap_slice keys[TAP_TRACK_HEADER_KEYS_MAX + 1];
		size_t n = p->store.data ? p->n_header_keys : 0;
		const uint8_t *kp = n ? (const uint8_t *)p->store.data + p->header_keys_off : NULL;
		for (size_t i = 0; i < n && !p->store.oom; i++) { /* stored as u8 length + bytes */
			keys[i] = (struct tap_slice){kp + 1, kp[0]};
			kp += 1 + kp[0];
		}
		struct tap_publish pub = {
			.exchange = conn_span_slice(p, p->exchange),
			.routing_key = conn_span_slice(p, p->routing_key),
			.message_id = conn_span_slice(p, p->message_id),
			.correlation_id = conn_span_slice(p, p->correlation_id),
			.content_type = conn_span_slice(p, p->content_type),
			.type = conn_span_slice(p, p->type),
			.app_id = conn_span_slice(p, p->app_id),
			.user_id = conn_span_slice(p, p->user_id),
			.mandatory = p->mandatory,
			.immediate = p->immediate,
			.has_message_id = p->has_message_id,
			.has_user_id = p->has_user_id,
			.has_correlation_id = p->has_correlation_id,
			.has_delivery_mode = p->has_delivery_mode,
			.has_timestamp = p->has_timestamp,
			.delivery_mode = p->delivery_mode,
			.timestamp = p->timestamp,
			.body_size = p->body_size,
			.header_keys = keys,
			.n_header_keys = p->store.oom ? 0 : n,
			.headers = conn_span_slice(p, p->headers),
			.headers_cut = p->headers_cut,
			.details_lost = p->store.oom,
			.content_cut = cut,
			.header_lost = cut && !p->have_header,
		};
		ident_finish(c, channel, p, how == PENDING_COMPLETE, &pub.identity_kind, &pub.identity);
		tap_track_publish(c->tc, channel, &pub, now_us);
	} else if (p->kind == PENDING_RETURN) {
		struct tap_return r = {
			.reply_code = p->reply_code,
			.reply_text = conn_span_slice(p, p->reply_text),
			.exchange = conn_span_slice(p, p->exchange),
			.routing_key = conn_span_slice(p, p->routing_key),
			.message_id = conn_span_slice(p, p->message_id),
			.has_message_id = p->has_message_id,
			.body_size = p->body_size,
			.details_lost = p->store.oom,
		};
		tap_track_return(c->tc, channel, &r, now_us);
	} else if (p->kind == PENDING_DELIVER) {
		struct tap_delivery d = {
			.consumer_tag = conn_span_slice(p, p->reply_text),
			.exchange = conn_span_slice(p, p->exchange),
			.routing_key = conn_span_slice(p, p->routing_key),
			.message_id = conn_span_slice(p, p->message_id),
			.get = p->get,
			.redelivered = p->redelivered,
			.has_message_id = p->has_message_id,
			.has_delivery_count = p->has_delivery_count,
			.delivery_count = p->delivery_count,
			.delivery_tag = p->delivery_tag,
			.body_size = p->body_size,
			.details_lost = p->store.oom,
			.content_cut = cut,
			.header_lost = cut && !p->have_header,
		};
		ident_finish(c, channel, p, how == PENDING_COMPLETE, &d.identity_kind, &d.identity);
		tap_consume_deliver(c->tc, channel, &d, now_us);
	}
	conn_pending_reset(c, p, PENDING_NONE);
	p->ended = true;
}

static void pending_complete(struct tap_conn *c, uint16_t channel, struct pending *p, int64_t now_us)
{
	pending_finish(c, channel, p, PENDING_COMPLETE, now_us);
}

/* Content that will never be finished (another method on its channel, or
 * the connection ended). A publish still counts: the client sent its
 * basic.publish, so it gets its record (the broker cannot have taken it,
 * and the connection or channel end will say so); so does a delivery. A return is dropped. */
void conn_pending_cut(struct tap_conn *c, uint16_t channel, struct pending *p, int64_t now_us)
{
	if (p->kind == PENDING_PUBLISH || p->kind == PENDING_DELIVER)
		pending_finish(c, channel, p, PENDING_CUT, now_us);
	else
		conn_pending_reset(c, p, PENDING_NONE);
}

/* A delivery's content header: of its properties only the message id and the x-delivery-count header (quorum
 * queues) are kept. */
static void deliver_header(struct tap_conn *c, uint16_t channel, struct pending *p, const struct tap_frame_ev *ev,
			   int64_t now_us)
{
	struct tap_props props;
	int rc = tap_props_decode(ev->data, ev->len, &props);
	p->have_header = true;
	p->body_size = props.body_size;
	if (rc == TAP_OK) {
		if (props.flags & TAP_PROP_MESSAGE_ID) {
			p->has_message_id = true;
			p->message_id = conn_keep(c, p, props.message_id.ptr, props.message_id.len);
		}
		ident_begin(c, p, ev, &props); /* a header the broker adds (x-death, x-delivery-count) makes another */
		struct tap_field f;
		if ((props.flags & TAP_PROP_HEADERS) &&
		    tap_table_find(props.headers.ptr, props.headers.len, "x-delivery-count", &f)) {
			switch (f.type) {
			case 'b': case 's': case 'I': case 'l': case 'L':
				p->has_delivery_count = true;
				p->delivery_count = f.i;
				break;
			case 'B': case 'u': case 'i': case 'T':
				p->has_delivery_count = true;
				p->delivery_count = f.u > INT64_MAX ? INT64_MAX : (int64_t)f.u;
				break;
			default:
				break;
			}
		}
	}
	if (p->body_size == 0)
		pending_complete(c, channel, p, now_us);
}

void conn_on_header(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev, int64_t now_us)
{
	struct channel *ch = conn_channel_find(c, ev->channel);
	if (!ch)
		return;
	struct pending *p = &ch->dir[dir];
	if (p->kind == PENDING_NONE || p->have_header)
		return; /* out of sequence: not ours to track */
	if (p->kind == PENDING_DELIVER) {
		deliver_header(c, ev->channel, p, ev, now_us);
		return;
	}
	struct tap_props props;
	int rc = tap_props_decode(ev->data, ev->len, &props);
	p->have_header = true;
	p->body_size = props.body_size;
	if (rc == TAP_OK) {
		if (props.flags & TAP_PROP_MESSAGE_ID) {
			p->has_message_id = true;
			p->message_id = conn_keep(c, p, props.message_id.ptr, props.message_id.len);
		}
		if (props.flags & TAP_PROP_CORRELATION_ID) {
			p->has_correlation_id = true;
			p->correlation_id = conn_keep(c, p, props.correlation_id.ptr, props.correlation_id.len);
		}
		if (props.flags & TAP_PROP_CONTENT_TYPE)
			p->content_type = conn_keep(c, p, props.content_type.ptr, props.content_type.len);
		if (props.flags & TAP_PROP_TYPE)
			p->type = conn_keep(c, p, props.type.ptr, props.type.len);
		if (props.flags & TAP_PROP_APP_ID)
			p->app_id = conn_keep(c, p, props.app_id.ptr, props.app_id.len);
		if (props.flags & TAP_PROP_USER_ID) {
			p->has_user_id = true;
			p->user_id = conn_keep(c, p, props.user_id.ptr, props.user_id.len);
		}
		p->has_delivery_mode = (props.flags & TAP_PROP_DELIVERY_MODE) != 0;
		p->delivery_mode = props.delivery_mode;
		p->has_timestamp = (props.flags & TAP_PROP_TIMESTAMP) != 0;
		p->timestamp = props.timestamp;
		ident_begin(c, p, ev, &props);
		if (props.flags & TAP_PROP_HEADERS) {
			struct tap_table_it it;
			struct tap_field f;
			keep_wanted_headers(c, p, props.headers);
			p->header_keys_off = (uint32_t)p->store.len;
			tap_table_it_init(&it, props.headers.ptr, props.headers.len);
			/* one key more than a record shows, so that it says the list was cut */
			size_t key_bytes = 0;
			while (p->n_header_keys <= TAP_TRACK_HEADER_KEYS_MAX && key_bytes <= TAP_TRACK_HEADER_BYTES_MAX &&
			       tap_table_next(&it, &f) > 0) {
				uint8_t len = (uint8_t)f.name_len;
				conn_store_put(c, p, &len, 1);
				conn_store_put(c, p, f.name, f.name_len);
				key_bytes += f.name_len;
				p->n_header_keys++;
			}
		}
	}
	if (p->body_size == 0)
		pending_complete(c, ev->channel, p, now_us);
}

/* Body frames until body-size is reached (PROTOCOL.md §4). More body is TAP_E_BODY_TOO_LONG, as RabbitMQ
 * 3.10 treats it (checked against the broker): a frame that crosses the size leaves the content unfinished for
 * good (the broker waits for more body and closes the connection with 505 UNEXPECTED_FRAME at the next other
 * frame on that channel), so the publish stays unfinished and is cut when the connection ends; a body frame after
 * the content ended is itself that 505. */
int conn_on_body(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev, int64_t now_us)
{
	struct channel *ch = conn_channel_find(c, ev->channel);
	if (!ch)
		return TAP_OK;
	struct pending *p = &ch->dir[dir];
	if (p->kind == PENDING_NONE)
		return p->ended ? TAP_E_BODY_TOO_LONG : TAP_OK;
	if (!p->have_header)
		return TAP_OK;
	p->body_got += ev->len;
	if (p->body_got > p->body_size)
		return TAP_E_BODY_TOO_LONG;
	if (p->fp_on)
		ident_body(c, ch, p, ev);
	if (ev->frame_end && p->body_got == p->body_size)
		pending_complete(c, ev->channel, p, now_us);
	return TAP_OK;
}
