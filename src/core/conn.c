/* Per-connection observer: decode both directions, assemble publish and
 * return content (0-9-1 §4.2.6: method, header, body frames on one channel),
 * and turn methods into tracker events and frame-trace lines. */
#include "amqptap/conn.h"

#include "amqptap/dialect.h"
#include "amqptap/frame.h"
#include "amqptap/frames.h"
#include "amqptap/props.h"
#include "amqptap/record.h"
#include "amqptap/redact.h"
#include "amqptap/sasl.h"
#include "amqptap/spec.h"
#include "amqptap/status.h"
#include "amqptap/table.h"

#include <stdlib.h>
#include <string.h>

/* Content being assembled on one channel in one direction. */
enum pending_kind { PENDING_NONE, PENDING_PUBLISH, PENDING_RETURN };

/* Strings of the pending method and its header, copied into `store`
 * because the decoder's buffers are only valid until the next feed. */
struct pending {
	enum pending_kind kind;
	bool ended; /* a content just ended here: the next frame on the channel must be a method */
	bool have_header;
	bool mandatory, immediate;
	uint16_t reply_code;
	uint64_t body_size, body_got;
	struct tap_buf store;
	/* offsets into store */
	struct span {
		uint32_t off, len;
	} exchange, routing_key, reply_text, message_id, correlation_id, content_type, type, app_id, user_id, headers;
	uint32_t header_keys_off, n_header_keys;
	bool headers_cut; /* a header field the records want was too long to keep whole */
	bool has_message_id, has_correlation_id, has_user_id, has_delivery_mode, has_timestamp;
	uint8_t delivery_mode;
	uint64_t timestamp;
};

struct channel {
	uint16_t number;
	struct pending dir[TAP_DIR_COUNT];
};

struct direction {
	struct tap_frame_dec dec;
	bool stopped;
	bool gapped; /* the capture lost bytes of this direction: decoding stopped there (tap_conn_gap) */
	uint64_t fed;     /* bytes fed so far: the stream offset of the next chunk */
	uint64_t decoded; /* the stream offset after the last whole frame decoded */
	struct tap_buf body_prefix; /* first body_bytes of the current body frame, for the trace */
	bool bad_method_seen; /* a method that did not decode got its decode_error record */
};


struct tap_conn {
	struct tap_observer *o;
	uint64_t id;
	struct tap_track_conn *tc;
	struct direction dir[TAP_DIR_COUNT];
	struct channel *chans; /* in the order they were first seen */
	size_t n_chans, cap_chans;
	size_t last_chan;
	/* channel number -> 1 + its index in chans (0: free), open addressing, cap a power of two at most half full:
	 * a client with thousands of channels costs a lookup per frame, not a scan */
	uint32_t *chan_index;
	size_t index_cap;
	char vhost[256];
	size_t vhost_len;
	bool login_done; /* the client's tune-ok or connection.open was decoded: no SASL exchange can follow */
	bool midstream;  /* a capture that began mid-connection (tap_conn_start_unseen): no login to wait for */
	enum tap_amqp_version version; /* of the client's protocol header, and the tune-ok's frame_max: a decoder */
	uint32_t frame_max;            /* restarted after a capture gap needs them */
	uint32_t broker_frame_max;     /* the broker's connection.tune: 0, no limit */
	uint32_t client_frame_max;     /* the client's tune-ok: 0, no limit */
	bool broker_tuned;             /* the broker's connection.tune was seen */
	bool tuned;
	/* capture copy of the client stream: held bytes start at held_offset */
	void *capture;
	struct tap_buf held;
	uint64_t held_offset;
	struct tap_range redact[8]; /* stream offsets found while decoding the current chunk */
	size_t n_redact;
};

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
	struct tap_conn *c = calloc(1, sizeof *c);
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
	tap_buf_init(&c->held);
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

void tap_conn_held(struct tap_conn *c, bool held, int64_t now_us)
{
	if (c)
		tap_track_conn_held(c->tc, held, now_us);
}

static void pending_cut(struct tap_conn *c, uint16_t channel, struct pending *p, int64_t now_us);
static void store_free(const struct tap_conn *c, struct tap_buf *store);

void tap_conn_end(struct tap_conn *c, const char *reason_by, int64_t now_us)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->n_chans; i++)
		if (c->chans[i].dir[TAP_C2S].kind == PENDING_PUBLISH)
			pending_cut(c, c->chans[i].number, &c->chans[i].dir[TAP_C2S], now_us);
	tap_track_conn_end(c->tc, reason_by, now_us);
	const struct tap_capture_sink *cap = c->o->capture;
	if (c->capture) {
		if (c->held.len) { /* an unfinished method frame: it may hold all of a password but its end octet */
			memset(c->held.data, TAP_REDACT_FILL, c->held.len);
			cap->data(cap->ctx, c->capture, TAP_C2S, (const uint8_t *)c->held.data, c->held.len, now_us);
		}
		cap->close(cap->ctx, c->capture, reason_by, now_us);
	}
	tap_buf_deinit(&c->held);
	for (int d = 0; d < TAP_DIR_COUNT; d++) {
		tap_frame_dec_deinit(&c->dir[d].dec);
		tap_buf_deinit(&c->dir[d].body_prefix);
	}
	for (size_t i = 0; i < c->n_chans; i++)
		for (int d = 0; d < TAP_DIR_COUNT; d++)
			store_free(c, &c->chans[i].dir[d].store);
	free(c->chans);
	free(c->chan_index);
	free(c);
}

static size_t index_home(size_t cap, uint16_t number)
{
	return ((uint32_t)number * 2654435761u) & (cap - 1);
}

/* Where channel number's entry is, or the free one it would take (linear probing from index_home). */
static size_t index_slot(const uint32_t *index, size_t cap, const struct channel *chans, uint16_t number)
{
	size_t i = index_home(cap, number);
	while (index[i] && chans[index[i] - 1].number != number)
		i = (i + 1) & (cap - 1);
	return i;
}

/* Makes room in the index for one more channel; false when out of memory. */
static bool index_reserve(struct tap_conn *c)
{
	if ((c->n_chans + 1) * 2 <= c->index_cap)
		return true;
	size_t cap = c->index_cap ? c->index_cap * 2 : 16;
	uint32_t *index = calloc(cap, sizeof *index);
	if (!index)
		return false;
	for (size_t k = 0; k < c->n_chans; k++)
		index[index_slot(index, cap, c->chans, c->chans[k].number)] = (uint32_t)k + 1;
	free(c->chan_index);
	c->chan_index = index;
	c->index_cap = cap;
	return true;
}

/* Forgets channel number at its close-ok (either side's), so that what a client makes the decoder keep follows the
 * channels open, not every number it ever used (cycling through 65,535 numbers kept 22 MB a connection). The close
 * and the close-ok ended any content on it (a method does); one in progress now belongs to the channel reopened
 * under that number before the close-ok, which keeps the entry. The index entry goes with the entries after it in
 * its probe run moved back; the last channel takes the freed place in chans. */
static void channel_drop(struct tap_conn *c, uint16_t number)
{
	if (!c->index_cap)
		return;
	size_t i = index_slot(c->chan_index, c->index_cap, c->chans, number), mask = c->index_cap - 1;
	uint32_t at = c->chan_index[i];
	if (!at)
		return;
	struct channel *ch = &c->chans[at - 1];
	if (ch->dir[TAP_C2S].kind != PENDING_NONE || ch->dir[TAP_S2C].kind != PENDING_NONE)
		return;
	for (int d = 0; d < TAP_DIR_COUNT; d++)
		store_free(c, &ch->dir[d].store);
	c->chan_index[i] = 0;
	for (size_t j = (i + 1) & mask; c->chan_index[j]; j = (j + 1) & mask) {
		size_t home = index_home(c->index_cap, c->chans[c->chan_index[j] - 1].number);
		bool stays = i <= j ? home > i && home <= j : home > i || home <= j; /* home in (i, j], cyclically */
		if (!stays) {
			c->chan_index[i] = c->chan_index[j];
			c->chan_index[j] = 0;
			i = j;
		}
	}
	size_t k = at - 1, last = c->n_chans - 1;
	if (k != last) { /* chans[last] still has its number: index_slot finds its entry */
		c->chans[k] = c->chans[last];
		c->chan_index[index_slot(c->chan_index, c->index_cap, c->chans, c->chans[k].number)] = (uint32_t)k + 1;
	}
	c->n_chans--;
	c->last_chan = SIZE_MAX;
}

/* Channel state, created on first use. NULL only when out of memory. */
static struct channel *channel_get(struct tap_conn *c, uint16_t number)
{
	if (c->last_chan < c->n_chans && c->chans[c->last_chan].number == number)
		return &c->chans[c->last_chan];
	if (c->index_cap) {
		uint32_t at = c->chan_index[index_slot(c->chan_index, c->index_cap, c->chans, number)];
		if (at) {
			c->last_chan = at - 1;
			return &c->chans[at - 1];
		}
	}
	if (!index_reserve(c))
		return NULL;
	if (c->n_chans == c->cap_chans) {
		size_t cap = c->cap_chans ? c->cap_chans * 2 : 4;
		struct channel *p = realloc(c->chans, cap * sizeof *p);
		if (!p)
			return NULL;
		c->chans = p;
		c->cap_chans = cap;
	}
	struct channel *ch = &c->chans[c->n_chans];
	memset(ch, 0, sizeof *ch);
	ch->number = number;
	tap_buf_init(&ch->dir[TAP_S2C].store);
	tap_buf_init(&ch->dir[TAP_C2S].store);
	c->chan_index[index_slot(c->chan_index, c->index_cap, c->chans, number)] = (uint32_t)c->n_chans + 1;
	c->last_chan = c->n_chans++;
	return ch;
}

static struct tap_slice arg_slice(const struct tap_method *m, int idx)
{
	return (struct tap_slice){m->args[idx].ptr, m->args[idx].len};
}

/* Appends to a channel's store, counted in the observer's pending_mem. Past its pending_max a store does
 * not grow: its content keeps nothing (as when out of memory: the record says details_lost), so that clients with
 * thousands of channels, each with a content in progress, cannot grow the tap without bound. */
static void store_put(const struct tap_conn *c, struct pending *p, const void *data, size_t len)
{
	struct tap_observer *o = c->o;
	size_t cap = p->store.cap;
	if (p->store.len + len > cap && o->pending_mem >= o->pending_max) {
		if (!p->store.oom)
			o->pending_over++;
		p->store.oom = true;
		return;
	}
	tap_buf_append(&p->store, data, len);
	o->pending_mem += p->store.cap - cap;
}

static void store_free(const struct tap_conn *c, struct tap_buf *store)
{
	c->o->pending_mem -= store->cap;
	tap_buf_deinit(store);
}

static struct span keep(const struct tap_conn *c, struct pending *p, const uint8_t *s, size_t len)
{
	struct span sp = {(uint32_t)p->store.len, (uint32_t)len};
	store_put(c, p, s, len);
	return sp;
}

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
			store_put(c, p, at, raw);
		} else if (f.type == 'S' || f.type == 'x') {
			size_t head = 1 + (size_t)f.name_len + 1; /* name length, name, type */
			uint32_t keep_len = f.len < KEPT_FIELD_MAX ? f.len : KEPT_FIELD_MAX;
			uint8_t len_be[4] = {(uint8_t)(keep_len >> 24), (uint8_t)(keep_len >> 16), (uint8_t)(keep_len >> 8),
					     (uint8_t)keep_len};
			store_put(c, p, at, head);
			store_put(c, p, len_be, 4);
			store_put(c, p, f.ptr, keep_len);
		} else {
			p->headers_cut = true;
		}
	}
	p->headers = (struct span){from, (uint32_t)p->store.len - from};
}

static struct tap_slice span_slice(const struct pending *p, struct span sp)
{
	if (p->store.oom || !p->store.data)
		return (struct tap_slice){(const uint8_t *)"", 0};
	return (struct tap_slice){(const uint8_t *)p->store.data + sp.off, sp.len};
}

/* A channel's store keeps its room for the next content, up to this (a typical publish's strings fit): one content
 * with long strings must not hold memory on every channel it was sent on, nor fill the observer's pending_max with
 * room kept on thousands of idle channels. */
#define PENDING_STORE_KEEP 512

static void pending_reset(const struct tap_conn *c, struct pending *p, enum pending_kind kind)
{
	struct tap_buf store = p->store;
	if (store.cap > PENDING_STORE_KEEP)
		store_free(c, &store);
	tap_buf_reset(&store);
	memset(p, 0, sizeof *p);
	p->store = store;
	p->kind = kind;
}

static void pending_finish(struct tap_conn *c, uint16_t channel, struct pending *p, bool cut, int64_t now_us)
{
	if (p->kind == PENDING_PUBLISH) {
		struct tap_slice keys[TAP_TRACK_HEADER_KEYS_MAX + 1];
		size_t n = p->store.data ? p->n_header_keys : 0;
		const uint8_t *kp = n ? (const uint8_t *)p->store.data + p->header_keys_off : NULL;
		for (size_t i = 0; i < n && !p->store.oom; i++) { /* stored as u8 length + bytes */
			keys[i] = (struct tap_slice){kp + 1, kp[0]};
			kp += 1 + kp[0];
		}
		struct tap_publish pub = {
			.exchange = span_slice(p, p->exchange),
			.routing_key = span_slice(p, p->routing_key),
			.message_id = span_slice(p, p->message_id),
			.correlation_id = span_slice(p, p->correlation_id),
			.content_type = span_slice(p, p->content_type),
			.type = span_slice(p, p->type),
			.app_id = span_slice(p, p->app_id),
			.user_id = span_slice(p, p->user_id),
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
			.headers = span_slice(p, p->headers),
			.headers_cut = p->headers_cut,
			.details_lost = p->store.oom,
			.content_cut = cut,
			.header_lost = cut && !p->have_header,
		};
		tap_track_publish(c->tc, channel, &pub, now_us);
	} else if (p->kind == PENDING_RETURN) {
		struct tap_return r = {
			.reply_code = p->reply_code,
			.reply_text = span_slice(p, p->reply_text),
			.exchange = span_slice(p, p->exchange),
			.routing_key = span_slice(p, p->routing_key),
			.message_id = span_slice(p, p->message_id),
			.has_message_id = p->has_message_id,
			.body_size = p->body_size,
			.details_lost = p->store.oom,
		};
		tap_track_return(c->tc, channel, &r, now_us);
	}
	pending_reset(c, p, PENDING_NONE);
	p->ended = true;
}

static void pending_complete(struct tap_conn *c, uint16_t channel, struct pending *p, int64_t now_us)
{
	pending_finish(c, channel, p, false, now_us);
}

/* Content that will never be finished (another method on its channel, or
 * the connection ended). A publish still counts: the client sent its
 * basic.publish, so it gets its record (the broker cannot have taken it,
 * and the connection or channel end will say so). A return is dropped. */
static void pending_cut(struct tap_conn *c, uint16_t channel, struct pending *p, int64_t now_us)
{
	if (p->kind == PENDING_PUBLISH)
		pending_finish(c, channel, p, true, now_us);
	else
		pending_reset(c, p, PENDING_NONE);
}

static void on_header(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev, int64_t now_us)
{
	struct channel *ch = channel_get(c, ev->channel);
	if (!ch)
		return;
	struct pending *p = &ch->dir[dir];
	if (p->kind == PENDING_NONE || p->have_header)
		return; /* content of a deliver/get-ok, or out of sequence: not ours to track */
	struct tap_props props;
	int rc = tap_props_decode(ev->data, ev->len, &props);
	p->have_header = true;
	p->body_size = props.body_size;
	if (rc == TAP_OK) {
		if (props.flags & TAP_PROP_MESSAGE_ID) {
			p->has_message_id = true;
			p->message_id = keep(c, p, props.message_id.ptr, props.message_id.len);
		}
		if (props.flags & TAP_PROP_CORRELATION_ID) {
			p->has_correlation_id = true;
			p->correlation_id = keep(c, p, props.correlation_id.ptr, props.correlation_id.len);
		}
		if (props.flags & TAP_PROP_CONTENT_TYPE)
			p->content_type = keep(c, p, props.content_type.ptr, props.content_type.len);
		if (props.flags & TAP_PROP_TYPE)
			p->type = keep(c, p, props.type.ptr, props.type.len);
		if (props.flags & TAP_PROP_APP_ID)
			p->app_id = keep(c, p, props.app_id.ptr, props.app_id.len);
		if (props.flags & TAP_PROP_USER_ID) {
			p->has_user_id = true;
			p->user_id = keep(c, p, props.user_id.ptr, props.user_id.len);
		}
		p->has_delivery_mode = (props.flags & TAP_PROP_DELIVERY_MODE) != 0;
		p->delivery_mode = props.delivery_mode;
		p->has_timestamp = (props.flags & TAP_PROP_TIMESTAMP) != 0;
		p->timestamp = props.timestamp;
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
				store_put(c, p, &len, 1);
				store_put(c, p, f.name, f.name_len);
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
static int on_body(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev, int64_t now_us)
{
	struct channel *ch = channel_get(c, ev->channel);
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
	if (ev->frame_end && p->body_got == p->body_size)
		pending_complete(c, ev->channel, p, now_us);
	return TAP_OK;
}

/* The tune-ok's frame_max, but never above the broker's: it refuses bigger frames (a connection error), so a
 * client that asks for more (0, no limit) cannot make the decoder buffer frames the broker will not take. */
/* The frame_max both decoders apply once the client's tune-ok came: its value, never above the broker's tune, nor
 * above TAP_FRAME_MAX_DEFAULT while that tune was not seen (a client that sends its tune-ok before the broker asked
 * is not to size the tap's buffers: it is applied again when the tune comes). */
static void set_frame_max(struct tap_conn *c)
{
	uint32_t frame_max = c->client_frame_max;
	uint32_t ceiling = c->broker_tuned ? c->broker_frame_max : TAP_FRAME_MAX_DEFAULT;
	if (ceiling && (frame_max == 0 || frame_max > ceiling))
		frame_max = ceiling;
	c->frame_max = frame_max;
	c->tuned = true;
	tap_frame_dec_set_frame_max(&c->dir[TAP_S2C].dec, frame_max);
	tap_frame_dec_set_frame_max(&c->dir[TAP_C2S].dec, frame_max);
}

/* A client property that is a string (S, or x as RabbitMQ's clients never send it); empty otherwise. */
static struct tap_slice client_prop(struct tap_slice props, const char *key)
{
	struct tap_field f;
	if (!tap_table_find(props.ptr, props.len, key, &f) || (f.type != 'S' && f.type != 'x'))
		return (struct tap_slice){NULL, 0};
	return (struct tap_slice){f.ptr, f.len};
}

static void on_start_ok(struct tap_conn *c, const struct tap_method *m)
{
	struct tap_slice props = arg_slice(m, TAP_ARG_CONNECTION_START_OK_CLIENT_PROPERTIES);
	struct tap_slice version = client_prop(props, "version");
	if (!version.ptr) /* py-amqp (Celery, kombu) names it product_version */
		version = client_prop(props, "product_version");
	tap_track_conn_client_props(c->tc, client_prop(props, "product"), version, client_prop(props, "platform"));
	struct tap_sasl sasl;
	tap_sasl_parse(arg_slice(m, TAP_ARG_CONNECTION_START_OK_MECHANISM),
		       arg_slice(m, TAP_ARG_CONNECTION_START_OK_RESPONSE), &sasl);
	if (sasl.user.len)
		tap_track_conn_user(c->tc, sasl.user);
}

/* Client -> broker methods (0-9-1 §4.2.4 and the class sections). */
static void on_client_method(struct tap_conn *c, uint16_t channel, const struct tap_method *m, int64_t now_us)
{
	struct tap_track_conn *tc = c->tc;
	switch (m->def->id) {
	case TAP_CONNECTION_START_OK:
		on_start_ok(c, m);
		break;
	case TAP_CONNECTION_TUNE_OK:
		c->login_done = true;
		tap_track_conn_tune(tc, (uint16_t)m->args[TAP_ARG_CONNECTION_TUNE_OK_CHANNEL_MAX].u,
				    (uint32_t)m->args[TAP_ARG_CONNECTION_TUNE_OK_FRAME_MAX].u,
				    (uint16_t)m->args[TAP_ARG_CONNECTION_TUNE_OK_HEARTBEAT].u);
		c->client_frame_max = (uint32_t)m->args[TAP_ARG_CONNECTION_TUNE_OK_FRAME_MAX].u;
		set_frame_max(c);
		break;
	case TAP_CONNECTION_OPEN: {
		c->login_done = true;
		struct tap_slice v = arg_slice(m, TAP_ARG_CONNECTION_OPEN_VIRTUAL_HOST);
		c->vhost_len = v.len < sizeof c->vhost ? v.len : sizeof c->vhost;
		memcpy(c->vhost, v.ptr, c->vhost_len);
		break;
	}
	case TAP_CONNECTION_CLOSE:
		tap_track_conn_close(tc, TAP_BY_CLIENT, (uint16_t)m->args[TAP_ARG_CONNECTION_CLOSE_REPLY_CODE].u,
				     arg_slice(m, TAP_ARG_CONNECTION_CLOSE_REPLY_TEXT), now_us);
		break;
	case TAP_CHANNEL_OPEN:
		tap_track_channel_open(tc, channel, now_us);
		break;
	case TAP_CHANNEL_CLOSE:
		tap_track_channel_close(tc, channel, TAP_BY_CLIENT, (uint16_t)m->args[TAP_ARG_CHANNEL_CLOSE_REPLY_CODE].u,
					arg_slice(m, TAP_ARG_CHANNEL_CLOSE_REPLY_TEXT), now_us);
		break;
	case TAP_CHANNEL_CLOSE_OK:
		tap_track_channel_close_ok(tc, channel, now_us);
		channel_drop(c, channel);
		break;
	case TAP_CONFIRM_SELECT:
		tap_track_confirm_select(tc, channel, now_us);
		break;
	case TAP_TX_SELECT:
		tap_track_tx_select(tc, channel, now_us);
		break;
	case TAP_TX_COMMIT:
	case TAP_TX_ROLLBACK:
		tap_track_tx_end(tc, channel, m->def->id == TAP_TX_ROLLBACK, now_us);
		break;
	case TAP_BASIC_PUBLISH: {
		struct channel *ch = channel_get(c, channel);
		if (!ch)
			break;
		struct pending *p = &ch->dir[TAP_C2S];
		pending_reset(c, p, PENDING_PUBLISH);
		struct tap_slice x = arg_slice(m, TAP_ARG_BASIC_PUBLISH_EXCHANGE);
		struct tap_slice rk = arg_slice(m, TAP_ARG_BASIC_PUBLISH_ROUTING_KEY);
		p->exchange = keep(c, p, x.ptr, x.len);
		p->routing_key = keep(c, p, rk.ptr, rk.len);
		p->mandatory = m->args[TAP_ARG_BASIC_PUBLISH_MANDATORY].u != 0;
		p->immediate = m->args[TAP_ARG_BASIC_PUBLISH_IMMEDIATE].u != 0;
		break;
	}
	default:
		break;
	}
}

/* Broker -> client methods. */
static void on_broker_method(struct tap_conn *c, uint16_t channel, const struct tap_method *m, int64_t now_us)
{
	struct tap_track_conn *tc = c->tc;
	switch (m->def->id) {
	case TAP_CONNECTION_TUNE:
		c->broker_frame_max = (uint32_t)m->args[TAP_ARG_CONNECTION_TUNE_FRAME_MAX].u;
		c->broker_tuned = true;
		if (c->tuned) /* the client answered first */
			set_frame_max(c);
		break;
	case TAP_CONNECTION_OPEN_OK:
		tap_track_conn_open(tc, (struct tap_slice){(const uint8_t *)c->vhost, c->vhost_len}, now_us);
		break;
	case TAP_CONNECTION_CLOSE_OK:
		tap_track_conn_close_ok(tc, now_us);
		break;
	case TAP_CONNECTION_CLOSE:
		tap_track_conn_close(tc, TAP_BY_BROKER, (uint16_t)m->args[TAP_ARG_CONNECTION_CLOSE_REPLY_CODE].u,
				     arg_slice(m, TAP_ARG_CONNECTION_CLOSE_REPLY_TEXT), now_us);
		if (m->args[TAP_ARG_CONNECTION_CLOSE_CLASS_ID].u == TAP_CLASS_BASIC &&
		    m->args[TAP_ARG_CONNECTION_CLOSE_METHOD_ID].u == (TAP_BASIC_PUBLISH & 0xFFFF))
			tap_track_publish_refused(tc, 0, now_us);
		break;
	case TAP_CONNECTION_BLOCKED:
		tap_track_conn_blocked(tc, true, arg_slice(m, TAP_ARG_CONNECTION_BLOCKED_REASON), now_us);
		break;
	case TAP_CONNECTION_UNBLOCKED:
		tap_track_conn_blocked(tc, false, (struct tap_slice){NULL, 0}, now_us);
		break;
	case TAP_CHANNEL_CLOSE:
		tap_track_channel_close(tc, channel, TAP_BY_BROKER, (uint16_t)m->args[TAP_ARG_CHANNEL_CLOSE_REPLY_CODE].u,
					arg_slice(m, TAP_ARG_CHANNEL_CLOSE_REPLY_TEXT), now_us);
		if (m->args[TAP_ARG_CHANNEL_CLOSE_CLASS_ID].u == TAP_CLASS_BASIC &&
		    m->args[TAP_ARG_CHANNEL_CLOSE_METHOD_ID].u == (TAP_BASIC_PUBLISH & 0xFFFF))
			tap_track_publish_refused(tc, channel, now_us);
		break;
	case TAP_CHANNEL_OPEN_OK:
		tap_track_channel_open_ok(tc, channel, now_us);
		break;
	case TAP_CHANNEL_CLOSE_OK:
		tap_track_channel_close_ok(tc, channel, now_us);
		channel_drop(c, channel);
		break;
	case TAP_TX_COMMIT_OK:
	case TAP_TX_ROLLBACK_OK:
		tap_track_tx_end_ok(tc, channel, m->def->id == TAP_TX_ROLLBACK_OK, now_us);
		break;
	case TAP_BASIC_ACK:
		tap_track_ack(tc, channel, m->args[TAP_ARG_BASIC_ACK_DELIVERY_TAG].u, m->args[TAP_ARG_BASIC_ACK_MULTIPLE].u != 0, now_us);
		break;
	case TAP_BASIC_NACK:
		tap_track_nack(tc, channel, m->args[TAP_ARG_BASIC_NACK_DELIVERY_TAG].u, m->args[TAP_ARG_BASIC_NACK_MULTIPLE].u != 0, now_us);
		break;
	case TAP_BASIC_RETURN: {
		struct channel *ch = channel_get(c, channel);
		if (!ch)
			break;
		struct pending *p = &ch->dir[TAP_S2C];
		pending_reset(c, p, PENDING_RETURN);
		struct tap_slice text = arg_slice(m, TAP_ARG_BASIC_RETURN_REPLY_TEXT);
		struct tap_slice x = arg_slice(m, TAP_ARG_BASIC_RETURN_EXCHANGE);
		struct tap_slice rk = arg_slice(m, TAP_ARG_BASIC_RETURN_ROUTING_KEY);
		p->reply_code = (uint16_t)m->args[TAP_ARG_BASIC_RETURN_REPLY_CODE].u;
		p->reply_text = keep(c, p, text.ptr, text.len);
		p->exchange = keep(c, p, x.ptr, x.len);
		p->routing_key = keep(c, p, rk.ptr, rk.len);
		break;
	}
	default:
		break;
	}
}

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
static void decode_error(struct tap_conn *c, enum tap_dir dir, int status, uint64_t at, const uint8_t *chunk,
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
static void bad_method(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev, int status, int64_t now_us)
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
static void redact_method(struct tap_conn *c, const struct tap_frame_ev *ev, const struct tap_method *m, int rc)
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

static void on_method(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev, int64_t now_us)
{
	struct tap_method m;
	int rc = tap_dialect_method_decode(ev->version, ev->data, ev->len, &m);
	if (dir == TAP_C2S && c->capture)
		redact_method(c, ev, &m, rc);
	if (rc != TAP_OK || !m.def) {
		bad_method(c, dir, ev, rc != TAP_OK ? rc : TAP_E_UNKNOWN_METHOD, now_us);
		return; /* tracking has nothing to act on */
	}
	if (ev->channel != 0) {
		struct channel *ch = channel_get(c, ev->channel);
		if (ch && ch->dir[dir].kind != PENDING_NONE)
			pending_cut(c, ev->channel, &ch->dir[dir], now_us); /* a method ends any unfinished content */
		if (ch)
			ch->dir[dir].ended = false;
	}
	if (dir == TAP_C2S)
		on_client_method(c, ev->channel, &m, now_us);
	else
		on_broker_method(c, ev->channel, &m, now_us);
}

static void conn_decode(struct tap_conn *c, enum tap_dir dir, const uint8_t *data, size_t len, int64_t now_us);

static void trace_frame(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev, int64_t now_us)
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

/* Whether the client may still be logging in: its tune-ok or connection.open not decoded, in a stream followed from
 * its start with nothing lost (a capture begun mid-connection, or a client-side gap, may have had the login in
 * what the tap never saw). */
static bool logging_in(const struct tap_conn *c)
{
	return !c->login_done && !c->midstream && !c->dir[TAP_C2S].gapped;
}

/* Where the client bytes that must still be held start: the first byte of an unfinished frame that may carry a
 * secret (any frame before the login; after it, one whose header is incomplete, or a method on channel 0 or of
 * class connection, or of a class not known yet), else the end of what was decoded. */
static uint64_t hold_from(const struct tap_conn *c, const struct tap_frame_dec *d)
{
	struct tap_frame_partial f;
	if (!tap_frame_dec_partial(d, &f))
		return tap_frame_dec_offset(d);
	if (logging_in(c) || f.type == 0 ||
	    (f.type == TAP_FRAME_METHOD && (f.channel == 0 || f.class_id == 0 || f.class_id == TAP_CLASS_CONNECTION)))
		return f.offset;
	return tap_frame_dec_offset(d);
}

/* The capture copy of the client stream. Bytes are held back while they may belong to an unfinished method,
 * overwritten where redact[] says, and after a client-side decode error everything from the first byte that
 * was not decoded is overwritten: the tap cannot tell where a secret lies in bytes it does not understand. */
static void capture_chunk(struct tap_conn *c, enum tap_dir dir, const uint8_t *data, size_t len, uint64_t chunk_offset,
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

void tap_conn_feed(struct tap_conn *c, enum tap_dir dir, const uint8_t *data, size_t len, int64_t now_us)
{
	uint64_t chunk_offset = c->dir[dir].fed;
	c->dir[dir].fed += len;
	conn_decode(c, dir, data, len, now_us);
	if (c->capture)
		capture_chunk(c, dir, data, len, chunk_offset, now_us);
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
			decode_error(c, dir, (int)n, tap_frame_dec_error_offset(&d->dec), chunk, chunk_len,
				     chunk_offset, now_us);
			return;
		}
		data += n;
		len -= (size_t)n;
		int rc = TAP_OK;
		if (dir == TAP_C2S && logging_in(c) && (ev.kind == TAP_EV_HEADER || ev.kind == TAP_EV_BODY)) {
			/* nothing but methods comes before the login: bytes that claim to be content then are not
			 * understood, and whatever they hold (a password framed as a body) is shown nowhere */
			d->stopped = true;
			decode_error(c, dir, TAP_E_UNEXPECTED_FRAME, ev.offset, chunk, chunk_len, chunk_offset, now_us);
			return;
		}
		switch (ev.kind) {
		case TAP_EV_METHOD:
			trace_frame(c, dir, &ev, now_us);
			on_method(c, dir, &ev, now_us);
			break;
		case TAP_EV_HEADER:
			trace_frame(c, dir, &ev, now_us);
			on_header(c, dir, &ev, now_us);
			break;
		case TAP_EV_BODY:
			trace_frame(c, dir, &ev, now_us);
			rc = on_body(c, dir, &ev, now_us);
			break;
		case TAP_EV_PROTOCOL_HEADER:
			if (dir == TAP_C2S) {
				c->version = ev.version;
				tap_frame_dec_set_version(&c->dir[TAP_S2C].dec, ev.version);
			}
			trace_frame(c, dir, &ev, now_us);
			break;
		case TAP_EV_HEARTBEAT:
			trace_frame(c, dir, &ev, now_us);
			break;
		case TAP_EV_NONE:
			break;
		}
		if (rc < 0) {
			d->stopped = true;
			decode_error(c, dir, rc, ev.offset, chunk, chunk_len, chunk_offset, now_us);
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
	struct tap_observer *o = c->o;
	struct tap_json j;
	o->capture_gaps++;
	o->gap_bytes += missing;
	stream_record_begin(c, &j, "capture_gap", dir, offset, now_us);
	tap_json_kv_uint(&j, "missing", missing);
	stream_record_emit(c, &j);
	for (size_t i = 0; i < c->n_chans; i++) /* a content cut by the gap can never finish */
		pending_cut(c, c->chans[i].number, &c->chans[i].dir[dir], now_us);
	tap_track_conn_gap(c->tc, d->gapped && dir == TAP_C2S ? TAP_TRACK_GAP_SEQ_LOST : TAP_TRACK_GAP_SEQ_KNOWN,
			   now_us);
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
