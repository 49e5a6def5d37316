/* The consumer tracker's records (src/DESIGN.md §4, `delivery` and `consumer`) as JSON into the tracker's render
 * buffer: built from the consumer tracker's state, changing none of it; consume.c emits them. */
#include "consume_int.h"

#include "amqptap/json.h"

#include <string.h>

static const char *const outcome_names[TAP_CONSUME_N_OUTCOMES] = {
	[TAP_CONSUME_OUT_ACK] = "ack",
	[TAP_CONSUME_OUT_NACK] = "nack",
	[TAP_CONSUME_OUT_REJECT] = "reject",
	[TAP_CONSUME_OUT_AUTO_ACK] = "auto_ack",
	[TAP_CONSUME_OUT_UNKNOWN] = "unknown",
};

const char *tap_consume_outcome_name(enum tap_consume_outcome o)
{
	return o < TAP_CONSUME_N_OUTCOMES ? outcome_names[o] : "?";
}

static void begin(struct trk_render *r, struct tap_json *j, const struct tap_track_conn *c, const char *type,
                  int64_t now_us)
{
	tap_buf_reset(&r->rec);
	tap_record_begin(j, &r->rec, &r->head, type, now_us);
	if (c->prefix.len > 1 && !c->prefix.oom) { /* "conn", "client", "vhost", "user" as publish records have them */
		tap_buf_putc(&r->rec, ',');
		tap_buf_append(&r->rec, c->prefix.data + 1, c->prefix.len - 1);
	} else {
		tap_json_kv_uint(j, "conn", c->id);
	}
}

static void strn_or_null(struct tap_json *j, const char *key, bool has, const uint8_t *s, size_t len)
{
	if (has)
		tap_json_kv_strn(j, key, s, len);
	else
		tap_json_kv_null(j, key);
}

void csm_view_of(struct csm_view *v, const struct csm_dlv *d)
{
	const uint8_t *p = d->blob ? (const uint8_t *)d->blob : (const uint8_t *)"";
	bool lost = d->flags & CSM_FLAG_LOST;
	*v = (struct csm_view){
		.tag = d->tag,
		.body_size = d->body_size,
		.delivery_count = d->delivery_count,
		.t_dlv = d->t_dlv,
		.t_pub = d->t_pub,
		.redelivered = d->flags & CSM_FLAG_REDELIVERED,
		.get = d->flags & CSM_FLAG_GET,
		.has_message_id = (d->flags & CSM_FLAG_HAS_MESSAGE_ID) && !lost,
		.has_count = d->flags & CSM_FLAG_HAS_COUNT,
		.header_lost = d->flags & CSM_FLAG_NO_HEADER,
		.details_lost = lost,
	};
	if (lost)
		return;
	v->ctag = p, v->ctag_len = d->ctag_len, p += d->ctag_len;
	v->queue = p, v->queue_len = d->queue_len, p += d->queue_len;
	v->has_queue = !(d->flags & CSM_FLAG_NO_QUEUE);
	v->exchange = p, v->exchange_len = d->exchange_len, p += d->exchange_len;
	v->rk = p, v->rk_len = d->rk_len, p += d->rk_len;
	v->mid = p, v->mid_len = d->mid_len;
}

static inline char *put(char *p, const void *s, size_t n)
{
	memcpy(p, s, n);
	return p + n;
}
#define PUT(p, lit) put(p, lit, sizeof lit - 1)

static char *put_str_or_null(char *p, bool has, const uint8_t *s, size_t len)
{
	return has ? tap_json_escape_at(p, s, len) : PUT(p, "null");
}

static size_t cstr_max(const char *s)
{
	return s ? TAP_JSON_ESCAPED_MAX(strlen(s)) : 4;
}

/* The members a delivery record has at most, but for its strings and its reason's text. */
#define DELIVERY_FIXED_MAX 1024

/* One per delivery, so written straight into room reserved for its longest form, as the publish record is
 * (track_record.c): the general writer's comma tracking and bounds checks per member were a quarter of the
 * instructions of a delivery. */
void csm_record_delivery(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch,
                         const struct csm_view *v, const struct csm_outcome *o, int64_t now_us)
{
	struct tap_buf *b = &r->rec;
	bool prefix = c->prefix.len > 1 && !c->prefix.oom;
	const struct csm_reason *why = o->reason;
	size_t most = DELIVERY_FIXED_MAX + r->head.run_json_len +
	              (prefix ? c->prefix.len : 64 + cstr_max(c->client) + cstr_max(c->vhost) + cstr_max(c->user)) +
	              TAP_JSON_ESCAPED_MAX(v->ctag_len) + TAP_JSON_ESCAPED_MAX(v->queue_len) +
	              TAP_JSON_ESCAPED_MAX(v->exchange_len) + TAP_JSON_ESCAPED_MAX(v->rk_len) +
	              TAP_JSON_ESCAPED_MAX(v->mid_len) +
	              (why ? TAP_JSON_ESCAPED_MAX(why->text_len) + cstr_max(why->by) + cstr_max(why->peer) : 0);
	tap_buf_reset(b);
	if (!tap_buf_reserve(b, most))
		return; /* b->oom: counted as a record that could not be written */
	char *p = TAP_RECORD_HEAD_AT(&r->head, b->data, "delivery", now_us);
	if (prefix) { /* "conn", "client", "vhost", "user" as publish records have them */
		p = put(PUT(p, ","), c->prefix.data + 1, c->prefix.len - 1);
	} else {
		p = tap_json_uint_at(PUT(p, ",\"conn\":"), c->id);
		p = put_str_or_null(PUT(p, ",\"client\":"), c->client, (const uint8_t *)c->client,
		                    c->client ? strlen(c->client) : 0);
		p = put_str_or_null(PUT(p, ",\"vhost\":"), c->vhost, (const uint8_t *)c->vhost,
		                    c->vhost ? strlen(c->vhost) : 0);
		p = put_str_or_null(PUT(p, ",\"user\":"), c->user, (const uint8_t *)c->user,
		                    c->user ? strlen(c->user) : 0);
	}
	bool lost = v->details_lost;
	p = tap_json_uint_at(PUT(p, ",\"channel\":"), ch);
	p = put_str_or_null(PUT(p, ",\"consumer_tag\":"), !v->get && !lost, v->ctag, v->ctag_len);
	p = put_str_or_null(PUT(p, ",\"queue\":"), v->has_queue && !lost, v->queue, v->queue_len);
	p = tap_json_uint_at(PUT(p, ",\"delivery_tag\":"), v->tag);
	p = v->redelivered ? PUT(p, ",\"redelivered\":true") : PUT(p, ",\"redelivered\":false");
	if (v->get)
		p = PUT(p, ",\"get\":true");
	p = put_str_or_null(PUT(p, ",\"exchange\":"), !lost, v->exchange, v->exchange_len);
	p = put_str_or_null(PUT(p, ",\"routing_key\":"), !lost, v->rk, v->rk_len);
	p = put_str_or_null(PUT(p, ",\"message_id\":"), v->has_message_id, v->mid, v->mid_len);
	p = PUT(p, ",\"body_size\":");
	p = v->header_lost ? PUT(p, "null") : tap_json_uint_at(p, v->body_size);
	p = PUT(p, ",\"delivery_count\":");
	p = v->has_count ? tap_json_int_at(p, v->delivery_count) : PUT(p, "null");
	const char *outcome = tap_consume_outcome_name(o->outcome);
	p = put(PUT(p, ",\"outcome\":\""), outcome, strlen(outcome));
	p = PUT(p, "\"");
	if (o->outcome == TAP_CONSUME_OUT_NACK || o->outcome == TAP_CONSUME_OUT_REJECT)
		p = o->requeue ? PUT(p, ",\"requeue\":true") : PUT(p, ",\"requeue\":false");
	bool settled = o->outcome <= TAP_CONSUME_OUT_REJECT;
	if (settled) {
		p = tap_json_int_at(PUT(p, ",\"settle_us\":"), o->t_settle - v->t_dlv);
		p = o->multiple ? PUT(p, ",\"multiple\":true") : PUT(p, ",\"multiple\":false");
	}
	if (v->t_pub) { /* its publish passed this tap too (linked by message id) */
		p = tap_json_int_at(PUT(p, ",\"queue_us\":"), v->t_dlv - v->t_pub);
		if (settled)
			p = tap_json_int_at(PUT(p, ",\"end_to_end_us\":"), o->t_settle - v->t_pub);
	}
	if (why) {
		p = tap_json_escape_at(PUT(p, ",\"reason\":{\"by\":"), why->by, strlen(why->by));
		if (why->peer)
			p = tap_json_escape_at(PUT(p, ",\"peer\":"), why->peer, strlen(why->peer));
		if (why->has_code)
			p = tap_json_uint_at(PUT(p, ",\"code\":"), why->code);
		if (why->text && why->text_len)
			p = tap_json_escape_at(PUT(p, ",\"text\":"), why->text, why->text_len);
		p = PUT(p, "}");
	}
	if (lost || v->props_lost || c->prefix_lost)
		p = PUT(p, ",\"details_lost\":true");
	p = PUT(p, "}");
	b->len = (size_t)(p - b->data);
}

void csm_record_consumer(struct trk_render *r, const struct tap_track_conn *c, const struct csm_chan *ch,
                         const struct csm_consumer *k, const char *event, const char *by, int64_t now_us)
{
	struct tap_json j;
	begin(r, &j, c, "consumer", now_us);
	tap_json_kv_uint(&j, "channel", ch->id);
	tap_json_kv_str(&j, "event", event);
	strn_or_null(&j, "consumer_tag", k->tag != NULL, (const uint8_t *)k->tag, k->tag_len);
	strn_or_null(&j, "queue", k->queue != NULL, (const uint8_t *)k->queue, k->queue_len);
	tap_json_kv_bool(&j, "no_ack", k->no_ack);
	tap_json_kv_bool(&j, "exclusive", k->exclusive);
	if (ch->qos_seen)
		tap_json_kv_uint(&j, "prefetch", ch->prefetch);
	else
		tap_json_kv_null(&j, "prefetch");
	tap_json_kv_bool(&j, "global_qos", ch->global);
	if (by) {
		tap_json_kv_str(&j, "by", by);
		tap_json_kv_uint(&j, "deliveries", k->deliveries);
		tap_json_kv_int(&j, "duration_us", now_us - k->t_start);
	}
	tap_json_obj_end(&j);
}

void csm_record_warning(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, const char *rule,
                        const struct csm_warn *w, int64_t now_us)
{
	struct tap_json j;
	tap_buf_reset(&r->rec);
	tap_record_begin(&j, &r->rec, &r->head, "warning", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	tap_json_kv_uint(&j, "channel", ch);
	tap_json_kv_str(&j, "rule", rule);
	tap_json_kv_null(&j, "seq"); /* the members publish warnings have: consumer rules name no publish */
	const struct csm_view *v = w->v;
	if (v) {
		strn_or_null(&j, "consumer_tag", !v->get && !v->details_lost, v->ctag, v->ctag_len);
		strn_or_null(&j, "queue", v->has_queue && !v->details_lost, v->queue, v->queue_len);
		tap_json_kv_uint(&j, "delivery_tag", v->tag);
		strn_or_null(&j, "message_id", v->has_message_id, v->mid, v->mid_len);
	} else if (w->has_consumer) {
		strn_or_null(&j, "consumer_tag", w->ctag.ptr != NULL, w->ctag.ptr, w->ctag.len);
		strn_or_null(&j, "queue", w->queue.ptr != NULL, w->queue.ptr, w->queue.len);
	}
	if (w->k1)
		tap_json_kv_int(&j, w->k1, w->v1);
	if (w->k2)
		tap_json_kv_int(&j, w->k2, w->v2);
	tap_json_obj_end(&j);
}
