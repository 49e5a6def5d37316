/* The tracker's records (src/DESIGN.md §4) as JSON: each function builds one record from the tracker's state into the
 * render buffer and changes no tracker state; the layers above decide, count and emit. Every record begins with
 * the header of amqptap/record.h. */
#include "track_record.h"

#include "amqptap/identity.h"
#include "amqptap/table.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Constant values, quoted once here: written as they are, not scanned for escapes (most of a publish record). */
struct json_lit {
	const char *json;
	size_t len;
};
#define LIT(s) {s, sizeof s - 1}
#define QUOTED(s) LIT("\"" s "\"")

static const struct json_lit route_json[] = {
    [TAP_TRACK_ROUTE_ROUTED] = QUOTED("routed"),
    [TAP_TRACK_ROUTE_RETURNED] = QUOTED("returned"),
    [TAP_TRACK_ROUTE_UNPROVEN] = QUOTED("unproven"),
    [TAP_TRACK_ROUTE_UNKNOWN] = QUOTED("unknown"),
};
static const struct json_lit confirm_json[] = {
    [TAP_TRACK_CONFIRM_ACK] = QUOTED("ack"),
    [TAP_TRACK_CONFIRM_NACK] = QUOTED("nack"),
    [TAP_TRACK_CONFIRM_NONE] = QUOTED("none"),
    [TAP_TRACK_CONFIRM_UNKNOWN] = QUOTED("unknown"),
};
static const struct json_lit order_json[] = {
    [TAP_TRACK_ORDER_NONE] = LIT("null"),
    [TAP_TRACK_ORDER_RETURN_BEFORE_ACK] = QUOTED("return_before_ack"),
    [TAP_TRACK_ORDER_ACK_BEFORE_RETURN] = QUOTED("ack_before_return"),
};
static const struct json_lit json_null = LIT("null"), json_true = LIT("true"), json_false = LIT("false");

static inline void kv_lit(struct tap_json *j, const char *key, struct json_lit v)
{
	tap_json_key(j, key);
	tap_json_raw(j, v.json, v.len);
}

void trk_render_init(struct trk_render *r, const struct tap_track_conf *conf)
{
	tap_buf_init(&r->rec);
	tap_record_head_init(&r->head, NULL);
	if (conf->run) {
		(void)snprintf(r->run, sizeof r->run, "%s", conf->run); /* longer ones are cut to TAP_TRACK_RUN_MAX */
		tap_record_head_init(&r->head, r->run);
		(void)snprintf(r->tap_id, sizeof r->tap_id, "%s", conf->tap_id ? conf->tap_id : "");
		r->started_us = conf->started_us;
	}
}

void trk_render_deinit(struct trk_render *r)
{
	tap_buf_deinit(&r->rec);
}

static void str_or_null(struct tap_json *j, const char *key, const char *s)
{
	if (s)
		tap_json_kv_str(j, key, s);
	else
		tap_json_kv_null(j, key);
}

static void rec_begin(struct trk_render *r, struct tap_json *j, const char *type, int64_t now_us)
{
	tap_buf_reset(&r->rec);
	tap_record_begin(j, &r->rec, &r->head, type, now_us);
}

static void write_reason(struct tap_json *j, const struct trk_reason *why)
{
	tap_json_key(j, "reason");
	tap_json_obj_begin(j);
	tap_json_kv_str(j, "by", why->by);
	if (why->has_code)
		tap_json_kv_uint(j, "code", why->code);
	if (why->text && why->text_len)
		tap_json_kv_strn(j, "text", why->text, why->text_len);
	tap_json_obj_end(j);
}

/* The "by", "code" and "text" of a channel or connection close record. */
static void write_close_reason(struct tap_json *j, const struct trk_reason *why)
{
	tap_json_kv_str(j, "by", why->by);
	if (why->has_code)
		tap_json_kv_uint(j, "code", why->code);
	else
		tap_json_kv_null(j, "code");
	if (why->text)
		tap_json_kv_strn(j, "text", why->text, why->text_len);
	else
		tap_json_kv_null(j, "text");
}

void trk_render_prefix(struct tap_buf *prefix, const struct tap_track_conn *c)
{
	struct tap_json j;
	tap_buf_reset(prefix);
	tap_json_init(&j, prefix);
	tap_json_obj_begin(&j);
	tap_json_kv_uint(&j, "conn", c->id);
	str_or_null(&j, "client", c->client);
	str_or_null(&j, "vhost", c->vhost);
	str_or_null(&j, "user", c->user);
}

/* The publish record is most of what the tap writes, so it is written straight into space reserved for its
 * longest form, without the general writer's comma tracking and bounds checks per member (half its instructions
 * when it went through them). Its keys, literals and numbers take under 600 bytes: */
#define PUBLISH_FIXED_MAX 1280

static inline char *put(char *p, const void *s, size_t n)
{
	memcpy(p, s, n);
	return p + n;
}
#define PUT(p, lit) put(p, lit, sizeof lit - 1)

static size_t cstr_escaped_max(const char *s)
{
	return s ? TAP_JSON_ESCAPED_MAX(strlen(s)) : 4;
}

/* What put_conn_members writes at most. */
static size_t conn_members_max(const struct tap_track_conn *c)
{
	return 64 + cstr_escaped_max(c->client) + cstr_escaped_max(c->vhost) + cstr_escaped_max(c->user);
}

static char *put_cstr_or_null(char *p, const char *s)
{
	return s ? tap_json_escape_at(p, s, strlen(s)) : PUT(p, "null");
}

/* The members of trk_render_prefix, for a connection whose rendered prefix there was no memory to keep. */
static char *put_conn_members(char *p, const struct tap_track_conn *c)
{
	p = tap_json_uint_at(PUT(p, ",\"conn\":"), c->id);
	p = put_cstr_or_null(PUT(p, ",\"client\":"), c->client);
	p = put_cstr_or_null(PUT(p, ",\"vhost\":"), c->vhost);
	return put_cstr_or_null(PUT(p, ",\"user\":"), c->user);
}

static inline char *put_lit(char *p, struct json_lit v)
{
	return put(p, v.json, v.len);
}

static const struct json_lit repeat_json[] = {
    [TAP_REPEAT_RESEND] = QUOTED("resend"),
    [TAP_REPEAT_DUPLICATE] = QUOTED("duplicate"),
    [TAP_REPEAT_UNVERIFIED] = QUOTED("unverified"),
};

/* The members of a publish whose identity was seen before, "attempt", "repeat" and "previous" (at most about 200
 * bytes and the run: in PUBLISH_FIXED_MAX). Written the fast way too: a publisher that sends one message over
 * and over has them on every record. */
static char *put_repeat(const struct trk_render *r, char *p, const struct trk_repeat *rep)
{
	p = tap_json_uint_at(PUT(p, ",\"attempt\":"), rep->attempt);
	p = put_lit(PUT(p, ",\"repeat\":"), repeat_json[rep->repeat]);
	p = PUT(p, ",\"previous\":{\"run\":");
	p = r->head.run_json_len ? put(p, r->head.run_json, r->head.run_json_len) : put_lit(p, json_null);
	p = tap_json_uint_at(PUT(p, ",\"conn\":"), rep->conn);
	p = tap_json_uint_at(PUT(p, ",\"channel\":"), rep->channel);
	p = PUT(p, ",\"seq\":");
	p = rep->has_seq ? tap_json_uint_at(p, rep->seq) : put_lit(p, json_null);
	p = put_lit(PUT(p, ",\"confirm\":"), confirm_json[rep->confirm]);
	p = put_lit(PUT(p, ",\"route\":"), route_json[rep->route]);
	p = tap_json_int_at(PUT(p, ",\"ago_us\":"), rep->ago_us);
	return PUT(p, "}");
}

void trk_record_publish(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, const struct trk_view *v,
                        const struct trk_verdict *vd, const struct trk_repeat *rep,
                        const struct trk_fault_mark *fault, int64_t now_us)
{
	struct tap_buf *b = &r->rec;
	bool prefix = c->prefix.len > 1 && !c->prefix.oom;
	size_t most = PUBLISH_FIXED_MAX + r->head.run_json_len + (prefix ? c->prefix.len : conn_members_max(c)) +
	              v->extra_len + TAP_JSON_ESCAPED_MAX(v->exchange_len) + TAP_JSON_ESCAPED_MAX(v->routing_key_len) +
	              TAP_JSON_ESCAPED_MAX(v->message_id_len) + TAP_JSON_ESCAPED_MAX(v->correlation_id_len) +
	              TAP_JSON_ESCAPED_MAX(vd->reply_text_len);
	tap_buf_reset(b);
	if (!tap_buf_reserve(b, most))
		return; /* b->oom: counted as a record that could not be written */
	char *p = TAP_RECORD_HEAD_AT(&r->head, b->data, "publish", now_us);
	if (prefix) /* "conn", "client", "vhost", "user" without the brace */
		p = put(PUT(p, ","), c->prefix.data + 1, c->prefix.len - 1);
	else /* no memory kept the rendered prefix: the same members, written here */
		p = put_conn_members(p, c);
	p = tap_json_uint_at(PUT(p, ",\"channel\":"), ch);
	p = PUT(p, ",\"seq\":");
	p = v->confirm_mode ? tap_json_uint_at(p, v->seq) : put_lit(p, json_null);
	p = tap_record_ts_at(&r->head, PUT(p, ",\"published\":"), v->t_pub); /* its last frame seen: ts is the verdict's */
	if (v->route_lost) { /* never "": that names the default exchange */
		p = put_lit(PUT(p, ",\"exchange\":"), json_null);
		p = put_lit(PUT(p, ",\"routing_key\":"), json_null);
	} else {
		p = tap_json_escape_at(PUT(p, ",\"exchange\":"), v->exchange, v->exchange_len);
		p = tap_json_escape_at(PUT(p, ",\"routing_key\":"), v->routing_key, v->routing_key_len);
	}
	p = put_lit(PUT(p, ",\"mandatory\":"), v->mandatory ? json_true : json_false);
	p = PUT(p, ",\"message_id\":");
	p = v->has_message_id ? tap_json_escape_at(p, v->message_id, v->message_id_len) : put_lit(p, json_null);
	p = PUT(p, ",\"correlation_id\":");
	p = v->has_correlation_id ? tap_json_escape_at(p, v->correlation_id, v->correlation_id_len)
	                          : put_lit(p, json_null);
	p = PUT(p, ",\"delivery_mode\":");
	p = v->has_delivery_mode ? tap_json_uint_at(p, v->delivery_mode) : put_lit(p, json_null);
	if (v->extra_len) { /* the rendered properties, members without braces */
		p = PUT(p, ",");
		r->extra_at = (size_t)(p - b->data);
		p = put(p, v->extra, v->extra_len);
	}
	if (v->has_timestamp)
		p = tap_json_uint_at(PUT(p, ",\"timestamp\":"), v->timestamp);
	p = PUT(p, ",\"body_size\":");
	p = v->header_lost ? put_lit(p, json_null) : tap_json_uint_at(p, v->body_size);
	if (v->identity_kind) {
		char text[TAP_IDENTITY_TEXT_LEN + 1];
		tap_identity_format(text, (enum tap_identity_kind)v->identity_kind, v->identity);
		p = PUT(p, ",\"identity\":\"");
		p = put(p, text, TAP_IDENTITY_TEXT_LEN);
		p = PUT(p, "\"");
	}
	p = put_lit(PUT(p, ",\"route\":"), route_json[vd->route]);
	if (vd->route == TAP_TRACK_ROUTE_RETURNED) {
		p = tap_json_uint_at(PUT(p, ",\"reply_code\":"), vd->reply_code);
		p = tap_json_escape_at(PUT(p, ",\"reply_text\":"), vd->reply_text, vd->reply_text_len);
		p = tap_json_int_at(PUT(p, ",\"return_us\":"), vd->t_ret - v->t_pub);
	}
	p = put_lit(PUT(p, ",\"confirm\":"), confirm_json[vd->confirm]);
	if (vd->confirm == TAP_TRACK_CONFIRM_ACK || vd->confirm == TAP_TRACK_CONFIRM_NACK) {
		p = tap_json_int_at(PUT(p, ",\"confirm_us\":"), vd->t_ack - v->t_pub);
		p = put_lit(PUT(p, ",\"multiple\":"), vd->multiple ? json_true : json_false);
	}
	p = put_lit(PUT(p, ",\"order\":"), order_json[vd->order]);
	if (rep && rep->seen)
		p = put_repeat(r, p, rep);
	b->len = (size_t)(p - b->data);
	struct tap_json j; /* the members a few records have, and the brace */
	tap_json_init_in_object(&j, b);
	if (vd->reason)
		write_reason(&j, vd->reason);
	if (v->refused)
		tap_json_kv_str(&j, "refused", v->culprit ? "culprit" : v->refused_unnamed ? "candidate" : "after_culprit");
	if (v->tx)
		kv_lit(&j, "tx", json_true);
	if (v->blocked)
		kv_lit(&j, "blocked", json_true);
	if (v->details_lost || c->prefix_lost) /* a null above may stand for a value the tap had no memory to keep */
		kv_lit(&j, "details_lost", json_true);
	if (fault) { /* --fault: the client was shown something else than the verdict above */
		tap_json_kv_str(&j, "client_saw", tap_fault_saw_name((enum tap_fault_saw)fault->saw));
		tap_json_kv_uint(&j, "fault", fault->rule);
	}
	tap_json_obj_end(&j);
}

void trk_record_fault(struct trk_render *r, const struct tap_track_conn *c, const struct tap_fault_act *a,
                      int64_t now_us)
{
	struct tap_json j;
	rec_begin(r, &j, "fault", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	str_or_null(&j, "client", c->client);
	tap_json_kv_uint(&j, "rule", a->rule);
	tap_json_kv_str(&j, "action", tap_fault_action_name(a->action));
	tap_json_kv_uint(&j, "channel", a->channel);
	if (a->seq)
		tap_json_kv_uint(&j, "seq", a->seq);
	else
		kv_lit(&j, "seq", json_null);
	if (a->action == TAP_FAULT_KILL)
		tap_json_kv_uint(&j, "outstanding", a->outstanding);
	if (a->action == TAP_FAULT_DELAY || a->action == TAP_FAULT_BLOCK || a->action == TAP_FAULT_LATENCY)
		tap_json_kv_uint(&j, "ms", a->ms);
	if (a->action == TAP_FAULT_LATENCY)
		tap_json_kv_uint(&j, "jitter_ms", a->jitter_ms);
	if (a->action == TAP_FAULT_BANDWIDTH)
		tap_json_kv_uint(&j, "kib", a->kib);
	if (a->action == TAP_FAULT_LATENCY || a->action == TAP_FAULT_BANDWIDTH)
		tap_json_kv_str(&j, "dir", tap_fault_way_name(a->way));
	tap_json_obj_end(&j);
}

void trk_record_resend_missing(struct trk_render *r, const struct trk_ident_entry *e, int64_t window_us,
                               bool window_over, int64_t now_us)
{
	struct tap_json j;
	char text[TAP_IDENTITY_TEXT_LEN + 1];
	rec_begin(r, &j, "resend_missing", now_us);
	tap_json_kv_uint(&j, "conn", e->conn);
	tap_json_kv_uint(&j, "channel", e->channel);
	if (e->seq)
		tap_json_kv_uint(&j, "seq", e->seq);
	else
		kv_lit(&j, "seq", json_null);
	tap_identity_format(text, (enum tap_identity_kind)e->kind, e->key);
	tap_json_kv_str(&j, "identity", text);
	if (e->message_id)
		tap_json_kv_strn(&j, "message_id", (const uint8_t *)e->message_id, e->message_id_len);
	else
		kv_lit(&j, "message_id", json_null);
	tap_json_kv_ts(&j, "published", e->t_pub);
	tap_json_kv_uint(&j, "attempt", e->attempt);
	tap_json_kv_int(&j, "window_us", window_us);
	kv_lit(&j, "window_over", window_over ? json_true : json_false);
	tap_json_obj_end(&j);
}

/* The longest prefix of an escaped JSON string's contents (no quotes) of at most limit bytes that ends between
 * two characters: never inside an escape or a UTF-8 sequence (tap_json_escape writes only whole ones). */
static size_t escaped_cut(const char *s, size_t len, size_t limit)
{
	size_t i = 0;
	while (i < len) {
		unsigned char c = (unsigned char)s[i];
		size_t step = 1;
		if (c == '\\')
			step = i + 1 < len && s[i + 1] == 'u' ? 6 : 2;
		else if (c >= 0xF0)
			step = 4;
		else if (c >= 0xE0)
			step = 3;
		else if (c >= 0x80)
			step = 2;
		if (i + step > limit)
			break;
		i += step;
	}
	return i;
}

/* The keys of the headers table, at most TAP_TRACK_HEADER_KEYS_MAX and TAP_TRACK_HEADER_BYTES_MAX bytes between
 * the brackets; a key that does not fit is kept as far as whole characters fit. Returns whether any was cut. */
static bool write_header_keys(struct tap_json *j, const struct tap_slice *keys, size_t n_keys)
{
	struct tap_buf *b = j->b;
	bool cut = n_keys > TAP_TRACK_HEADER_KEYS_MAX;
	if (cut)
		n_keys = TAP_TRACK_HEADER_KEYS_MAX;
	tap_json_key(j, "headers");
	tap_json_arr_begin(j);
	size_t start = b->len;
	for (size_t i = 0; i < n_keys; i++) {
		size_t mark = b->len;
		tap_json_strn(j, keys[i].ptr, keys[i].len);
		if (b->oom || b->len - start <= TAP_TRACK_HEADER_BYTES_MAX)
			continue;
		cut = true;
		size_t open = mark + (mark > start) + 1; /* after the comma and the opening quote */
		size_t room = start + TAP_TRACK_HEADER_BYTES_MAX; /* where the closing quote must end */
		size_t keep = room > open + 1 ? escaped_cut(b->data + open, b->len - 1 - open, room - 1 - open) : 0;
		if (keep) {
			b->len = open + keep;
			tap_buf_putc(b, '"');
		} else {
			b->len = mark;
		}
		break;
	}
	tap_json_arr_end(j);
	return cut;
}

static bool is_lower_hex(const uint8_t *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	}
	return true;
}

static bool all_zero(const uint8_t *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (s[i] != '0')
			return false;
	}
	return true;
}

/* A W3C traceparent: version-traceid-parentid-flags, 2-32-16-2 lowercase hex, ids not all zero, version not ff;
 * version 00 is exactly 55 bytes, a later version may append "-..." (W3C Trace Context §3.2.4). */
static bool traceparent_ok(const uint8_t *s, size_t n)
{
	if (n < 55 || s[2] != '-' || s[35] != '-' || s[52] != '-')
		return false;
	if (!is_lower_hex(s, 2) || !is_lower_hex(s + 3, 32) || !is_lower_hex(s + 36, 16) || !is_lower_hex(s + 53, 2))
		return false;
	if ((s[0] == 'f' && s[1] == 'f') || all_zero(s + 3, 32) || all_zero(s + 36, 16))
		return false;
	if (s[0] == '0' && s[1] == '0')
		return n == 55;
	return n == 55 || s[55] == '-';
}

/* trace_id and span_id of a string traceparent header; whether one was there but malformed. */
static bool write_trace(struct tap_json *j, struct tap_slice headers)
{
	struct tap_field f;
	if (!headers.len || !tap_table_find(headers.ptr, headers.len, "traceparent", &f))
		return false;
	if ((f.type != 'S' && f.type != 'x') || !traceparent_ok(f.ptr, f.len))
		return true;
	tap_json_kv_strn(j, "trace_id", f.ptr + 3, 32);
	tap_json_kv_strn(j, "span_id", f.ptr + 36, 16);
	return false;
}

/* One header value as JSON into out (strings as strings, numbers as numbers, booleans, void as null, tables and
 * arrays as tap_table_to_json writes them), at most TAP_TRACK_HEADER_VALUE_BYTES_MAX bytes; returns whether it
 * was cut. */
static bool header_value_json(struct tap_buf *out, const struct tap_field *f)
{
	static const char ellipsis[] = "\xe2\x80\xa6";
	struct tap_json j;
	tap_buf_reset(out);
	tap_json_init(&j, out);
	switch (f->type) {
	case 't': tap_json_bool(&j, f->i != 0); break;
	case 'b': case 's': case 'I': case 'l': case 'L': tap_json_int(&j, f->i); break;
	case 'B': case 'u': case 'i': case 'T': tap_json_uint(&j, f->u); break;
	case 'f': case 'd': tap_json_double(&j, f->f); break;
	case 'S': case 'x': tap_json_strn(&j, f->ptr, f->len); break;
	case 'F': (void)tap_table_to_json(&j, f->ptr, f->len); break; /* a malformed table is null */
	case 'A': (void)tap_array_to_json(&j, f->ptr, f->len); break;
	default: tap_json_null(&j); break;
	}
	if (out->oom || out->len <= TAP_TRACK_HEADER_VALUE_BYTES_MAX)
		return false;
	if (f->type == 'S' || f->type == 'x') {
		size_t keep = escaped_cut(out->data + 1, out->len - 2, TAP_TRACK_HEADER_VALUE_BYTES_MAX - 2 - 3);
		out->len = 1 + keep;
		tap_buf_append(out, ellipsis, 3);
		tap_buf_putc(out, '"');
	} else {
		tap_buf_reset(out);
		tap_buf_append(out, "null", 4);
	}
	return true;
}

/* "header_values":{key:value,...} of the keys in the comma-separated list that the headers table has; returns
 * whether anything was cut. */
static bool write_header_values(struct tap_json *j, struct tap_slice headers, const char *list)
{
	struct tap_buf v, all;
	tap_buf_init(&v);
	tap_buf_init(&all);
	bool cut = false;
	size_t n = 0;
	struct tap_json o;
	tap_json_init(&o, &all);
	tap_json_obj_begin(&o);
	for (const char *k = list; *k;) {
		const char *end = strchr(k, ',');
		size_t klen = end ? (size_t)(end - k) : strlen(k);
		char name[256];
		if (klen && klen < sizeof name) {
			memcpy(name, k, klen);
			name[klen] = '\0';
			struct tap_field f;
			if (tap_table_find(headers.ptr, headers.len, name, &f)) {
				if (n == TAP_TRACK_HEADER_VALUES_KEYS_MAX) {
					cut = true;
					break;
				}
				cut |= header_value_json(&v, &f);
				size_t before = all.len;
				tap_json_strn(&o, name, klen); /* a key given by the user: escaped like a value */
				tap_buf_putc(&all, ':');
				o.after_key = true;
				tap_json_raw(&o, v.data, v.len);
				if (all.len + 1 > TAP_TRACK_HEADER_VALUES_BYTES_MAX) {
					all.len = before; /* this one does not fit: the ones after it are left out */
					cut = true;
					break;
				}
				n++;
			}
		}
		if (!end)
			break;
		k = end + 1;
	}
	if (n && !all.oom && !v.oom) {
		tap_buf_putc(&all, '}');
		tap_json_key(j, "header_values");
		tap_json_raw(j, all.data, all.len);
	}
	tap_buf_deinit(&v);
	tap_buf_deinit(&all);
	return cut;
}

unsigned trk_render_extra(struct tap_buf *out, struct trk_values *values, const struct tap_publish *p,
                          const char *header_values)
{
	struct tap_json j;
	unsigned notes = 0;
	tap_buf_reset(out);
	tap_json_init(&j, out);
	tap_json_obj_begin(&j); /* written so commas are tracked; the brace is cut off below */
	if (p->content_type.len)
		tap_json_kv_strn(&j, "content_type", p->content_type.ptr, p->content_type.len);
	if (p->type.len) /* the AMQP `type` property: the record's own "type" key is taken */
		tap_json_kv_strn(&j, "message_type", p->type.ptr, p->type.len);
	if (p->app_id.len)
		tap_json_kv_strn(&j, "app_id", p->app_id.ptr, p->app_id.len);
	if (p->n_header_keys) {
		if (write_header_keys(&j, p->header_keys, p->n_header_keys)) {
			notes |= TRK_EXTRA_KEYS_CUT;
			kv_lit(&j, "headers_truncated", json_true);
		}
	}
	*values = (struct trk_values){0, 0};
	if (header_values) {
		size_t from = out->len; /* 1 past the brace: values that come first have no comma */
		bool values_cut = p->headers_cut;
		if (p->headers.len && write_header_values(&j, p->headers, header_values))
			values_cut = true;
		if (values_cut) {
			notes |= TRK_EXTRA_VALUES_CUT;
			kv_lit(&j, "header_values_truncated", json_true);
		}
		*values = (struct trk_values){(uint16_t)(from - 1), (uint16_t)(out->len - from)};
	}
	if (write_trace(&j, p->headers))
		notes |= TRK_EXTRA_TRACE_BAD;
	if (out->len > 1)
		memmove(out->data, out->data + 1, out->len - 1);
	out->len = out->len ? out->len - 1 : 0;
	return notes;
}

/* What the warnings with a publish's seq begin with: conn, channel, rule and seq (null off confirm mode). */
static void warning_head(struct trk_render *r, struct tap_json *j, const struct tap_track_conn *c, uint16_t ch,
                         const char *rule, uint64_t seq, int64_t now_us)
{
	rec_begin(r, j, "warning", now_us);
	tap_json_kv_uint(j, "conn", c->id);
	tap_json_kv_uint(j, "channel", ch);
	tap_json_kv_str(j, "rule", rule);
	if (seq) /* confirm sequence numbers start at 1 */
		tap_json_kv_uint(j, "seq", seq);
	else
		kv_lit(j, "seq", json_null);
}

void trk_record_warning(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, const char *rule,
                        uint64_t seq, int64_t now_us)
{
	struct tap_json j;
	warning_head(r, &j, c, ch, rule, seq, now_us);
	tap_json_obj_end(&j);
}

/* --definitions (track_topo.c): dropped_by_topology, and topology_mismatch with what the broker said (broker). */
void trk_record_topology_warning(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, const char *rule,
                                 uint64_t seq, struct tap_slice exchange, struct tap_slice routing_key,
                                 const char *broker, int64_t now_us)
{
	struct tap_json j;
	warning_head(r, &j, c, ch, rule, seq, now_us);
	tap_json_kv_strn(&j, "exchange", exchange.ptr, exchange.len);
	tap_json_kv_strn(&j, "routing_key", routing_key.ptr, routing_key.len);
	if (broker) {
		tap_json_kv_str(&j, "route", broker);
		tap_json_kv_bool(&j, "model_routes", strcmp(broker, "returned") == 0);
	}
	tap_json_obj_end(&j);
}

void trk_record_duplicate_warning(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, const char *rule,
                                  uint64_t seq, struct tap_slice message_id, uint16_t first_channel,
                                  uint64_t first_seq, int64_t now_us)
{
	struct tap_json j;
	warning_head(r, &j, c, ch, rule, seq, now_us);
	size_t id_len = message_id.len > TAP_TRACK_DUP_ID_MAX ? TAP_TRACK_DUP_ID_MAX : message_id.len;
	tap_json_kv_strn(&j, "message_id", message_id.ptr, id_len);
	tap_json_key(&j, "first");
	tap_json_obj_begin(&j);
	tap_json_kv_uint(&j, "conn", c->id);
	tap_json_kv_uint(&j, "channel", first_channel);
	if (first_seq)
		tap_json_kv_uint(&j, "seq", first_seq);
	else
		kv_lit(&j, "seq", json_null);
	tap_json_obj_end(&j);
	tap_json_obj_end(&j);
}

void trk_record_return_warning(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch,
                               const struct tap_return *ret, const char *rule, uint64_t n, uint64_t seq_first,
                               uint64_t seq_last, int64_t now_us)
{
	struct tap_json j;
	rec_begin(r, &j, "warning", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	tap_json_kv_uint(&j, "channel", ch);
	tap_json_kv_str(&j, "rule", rule);
	if (n) {
		tap_json_kv_uint(&j, "candidates", n);
		if (seq_first) {
			tap_json_kv_uint(&j, "seq_first", seq_first);
			tap_json_kv_uint(&j, "seq_last", seq_last);
		} else {
			tap_json_kv_null(&j, "seq_first");
			tap_json_kv_null(&j, "seq_last");
		}
	}
	tap_json_kv_strn(&j, "exchange", ret->exchange.ptr, ret->exchange.len);
	tap_json_kv_strn(&j, "routing_key", ret->routing_key.ptr, ret->routing_key.len);
	if (ret->has_message_id)
		tap_json_kv_strn(&j, "message_id", ret->message_id.ptr, ret->message_id.len);
	else
		tap_json_kv_null(&j, "message_id");
	tap_json_kv_uint(&j, "body_size", ret->body_size);
	tap_json_kv_uint(&j, "reply_code", ret->reply_code);
	tap_json_kv_strn(&j, "reply_text", ret->reply_text.ptr, ret->reply_text.len);
	tap_json_obj_end(&j);
}

void trk_record_channel(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, const char *event,
                        int64_t now_us)
{
	struct tap_json j;
	rec_begin(r, &j, "channel", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	tap_json_kv_uint(&j, "channel", ch);
	tap_json_kv_str(&j, "event", event);
	tap_json_obj_end(&j);
}

void trk_record_channel_open(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, bool followed,
                             int64_t now_us)
{
	struct tap_json j;
	rec_begin(r, &j, "channel", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	tap_json_kv_uint(&j, "channel", ch);
	tap_json_kv_str(&j, "event", "open");
	if (!followed)
		kv_lit(&j, "followed", json_false);
	tap_json_obj_end(&j);
}

void trk_record_channel_close(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch,
                              const struct trk_reason *why, uint64_t unconfirmed, const char *culprit,
                              size_t culprit_len, const char *extra, size_t extra_len, int64_t now_us)
{
	struct tap_json j;
	rec_begin(r, &j, "channel", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	tap_json_kv_uint(&j, "channel", ch);
	tap_json_kv_str(&j, "event", "close");
	write_close_reason(&j, why);
	tap_json_kv_uint(&j, "unconfirmed", unconfirmed);
	if (culprit) {
		tap_json_key(&j, "culprit");
		tap_json_raw(&j, culprit, culprit_len);
	}
	if (extra) { /* members the consumer tracker gave the channel (consume.c) */
		tap_json_key(&j, "timed_out_delivery");
		tap_json_raw(&j, extra, extra_len);
	}
	tap_json_obj_end(&j);
}

void trk_render_culprit(struct tap_buf *out, const struct tap_track_conn *c, uint16_t ch, const struct trk_view *v)
{
	struct tap_json j;
	tap_buf_reset(out);
	tap_json_init(&j, out);
	tap_json_obj_begin(&j);
	tap_json_kv_uint(&j, "conn", c->id);
	tap_json_kv_uint(&j, "channel", ch);
	if (v->confirm_mode)
		tap_json_kv_uint(&j, "seq", v->seq);
	else
		kv_lit(&j, "seq", json_null);
	if (v->has_message_id)
		tap_json_kv_strn(&j, "message_id", v->message_id, v->message_id_len);
	else
		kv_lit(&j, "message_id", json_null);
	tap_json_kv_strn(&j, "exchange", v->exchange, v->exchange_len);
	tap_json_kv_strn(&j, "routing_key", v->routing_key, v->routing_key_len);
	tap_json_obj_end(&j);
}

/* Which tap made the record, for merged logs: on the open record, or on the close of a connection that had none. */
static void write_tap(const struct trk_render *r, struct tap_json *j)
{
	if (r->run[0]) {
		tap_json_kv_str(j, "tap", r->tap_id);
		tap_json_kv_ts(j, "started", r->started_us);
		tap_json_kv_uint(j, "schema", TAP_TRACK_SCHEMA);
	}
}

/* The client's capabilities as it named them ({"publisher_confirms":true,...}); null when it sent no table. */
static void write_caps(struct tap_json *j, const struct tap_track_conn *c)
{
	static const struct {
		const char *key;
		unsigned bit;
	} keys[] = {
	    {"connection.blocked", TAP_TRACK_CAP_CONNECTION_BLOCKED},
	    {"publisher_confirms", TAP_TRACK_CAP_PUBLISHER_CONFIRMS},
	    {"consumer_cancel_notify", TAP_TRACK_CAP_CONSUMER_CANCEL_NOTIFY},
	    {"basic.nack", TAP_TRACK_CAP_BASIC_NACK},
	};
	if (!c->has_caps) {
		tap_json_kv_null(j, "capabilities");
		return;
	}
	tap_json_key(j, "capabilities");
	tap_json_obj_begin(j);
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
		if (c->caps_present & keys[i].bit)
			kv_lit(j, keys[i].key, c->caps & keys[i].bit ? json_true : json_false);
	}
	tap_json_obj_end(j);
}

void trk_record_conn_open(struct trk_render *r, const struct tap_track_conn *c, int64_t now_us)
{
	struct tap_json j;
	rec_begin(r, &j, "connection", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	tap_json_kv_str(&j, "event", "open");
	write_tap(r, &j);
	str_or_null(&j, "client", c->client);
	str_or_null(&j, "upstream", c->upstream);
	if (c->proxied) /* the proxy's: replay and sniff see the broker's client directly */
		str_or_null(&j, "upstream_local", c->upstream_local);
	str_or_null(&j, "user", c->user);
	str_or_null(&j, "vhost", c->vhost);
	str_or_null(&j, "product", c->product);
	str_or_null(&j, "version", c->version);
	str_or_null(&j, "platform", c->platform);
	str_or_null(&j, "connection_name", c->connection_name);
	write_caps(&j, c);
	if (c->tuned) {
		tap_json_kv_uint(&j, "frame_max", c->frame_max);
		tap_json_kv_uint(&j, "heartbeat", c->heartbeat);
		tap_json_kv_uint(&j, "channel_max", c->channel_max);
	} else {
		tap_json_kv_null(&j, "frame_max");
		tap_json_kv_null(&j, "heartbeat");
		tap_json_kv_null(&j, "channel_max");
	}
	if (c->details_lost) /* a null above may stand for a value the tap had no memory to keep */
		kv_lit(&j, "details_lost", json_true);
	tap_json_obj_end(&j);
}

static void write_counts(struct tap_json *j, const struct trk_counts *k)
{
	tap_json_kv_uint(j, "publishes", k->publishes);
	tap_json_kv_uint(j, "routed", k->routed);
	tap_json_kv_uint(j, "returned", k->returned);
	tap_json_kv_uint(j, "unproven", k->unproven);
	tap_json_kv_uint(j, "unknown", k->unknown);
	tap_json_kv_uint(j, "acked", k->acked);
	tap_json_kv_uint(j, "nacked", k->nacked);
}

void trk_record_conn_close(struct trk_render *r, const struct tap_track_conn *c, const struct trk_reason *why,
                           int64_t now_us)
{
	struct tap_json j;
	rec_begin(r, &j, "connection", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	tap_json_kv_str(&j, "event", "close");
	/* No open record says who and where (an unreachable broker, TLS or a login that failed): the close does. A
	 * proxy's end towards the broker is on every close (a broker that refused the login saw it too), so a long
	 * connection whose open record was rotated away can still be joined to a sniffer's or the broker's view. */
	bool alone = !c->opened;
	if (alone)
		write_tap(r, &j);
	str_or_null(&j, "client", c->client);
	if (alone)
		str_or_null(&j, "upstream", c->upstream);
	if (c->proxied)
		str_or_null(&j, "upstream_local", c->upstream_local);
	if (alone)
		str_or_null(&j, "user", c->user);
	write_close_reason(&j, why);
	tap_json_kv_int(&j, "duration_us", now_us - c->t_new);
	write_counts(&j, &c->counts);
	if (c->details_lost)
		kv_lit(&j, "details_lost", json_true);
	tap_json_obj_end(&j);
}

void trk_record_blocked(struct trk_render *r, const struct tap_track_conn *c, enum trk_blocked_record which,
                        struct tap_slice reason, int64_t now_us)
{
	bool blocked = which == TRK_RECORD_BLOCKED;
	struct tap_json j;
	rec_begin(r, &j, blocked ? "blocked" : "unblocked", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	if (blocked)
		tap_json_kv_strn(&j, "reason", reason.ptr, reason.len);
	else if (c->blocked)
		tap_json_kv_int(&j, "blocked_us", now_us - c->blocked_since);
	tap_json_obj_end(&j);
}

/* ---- the human summary (SIGUSR1) ---- */

static void summary_line(struct tap_buf *out, const struct trk_counts *k, uint64_t p50, uint64_t p99, uint64_t max)
{
	tap_buf_printf(out,
	               " publishes=%" PRIu64 " routed=%" PRIu64 " returned=%" PRIu64 " unproven=%" PRIu64
	               " unknown=%" PRIu64 " acked=%" PRIu64 " nacked=%" PRIu64,
	               k->publishes, k->routed, k->returned, k->unproven, k->unknown, k->acked, k->nacked);
	tap_buf_printf(out, " confirm_us p50=%" PRIu64 " p99=%" PRIu64 " max=%" PRIu64 "\n", p50, p99, max);
}

/* Whether connection a goes before b in the summary: more publishes outstanding first, then the older. */
static bool summary_before(const struct tap_track_conn *a, const struct tap_track_conn *b)
{
	return a->outstanding != b->outstanding ? a->outstanding > b->outstanding : a->id < b->id;
}

/* The summary names at most TAP_TRACK_SUMMARY_CONNS connections, those with the most publishes outstanding: it is
 * made on the event loop and goes into the log's backlog, and a line for each of thousands of connections held the
 * loop up and did not fit. The total counts them all. */
void trk_summary(const struct tap_track *t, struct tap_buf *out)
{
	struct trk_counts total = t->closed_counts;
	const struct tap_track_conn *top[TAP_TRACK_SUMMARY_CONNS];
	size_t n_top = 0, n_conns = 0;
	for (const struct tap_track_conn *c = t->conns; c; c = c->next, n_conns++) {
		trk_counts_add(&total, &c->counts);
		if (n_top == TAP_TRACK_SUMMARY_CONNS && !summary_before(c, top[n_top - 1]))
			continue;
		size_t i = n_top < TAP_TRACK_SUMMARY_CONNS ? n_top++ : n_top - 1; /* a full list drops its last */
		for (; i > 0 && summary_before(c, top[i - 1]); i--)
			top[i] = top[i - 1];
		top[i] = c;
	}
	tap_buf_printf(out, "amqptap summary: %" PRIu64 " connections open, %" PRIu64 " in total\n",
	               t->st.connections_open, t->st.connections_total);
	for (size_t i = 0; i < n_top; i++) {
		const struct tap_track_conn *c = top[i];
		tap_buf_printf(out, "conn %" PRIu64 " %s", c->id, c->client ? c->client : "-");
		tap_buf_printf(out, " outstanding=%" PRIu64, c->outstanding);
		summary_line(out, &c->counts, tap_hist_span_quantile(c->hist, 0.5), tap_hist_span_quantile(c->hist, 0.99),
		             c->hist ? c->hist->max : 0);
	}
	if (n_conns > n_top)
		tap_buf_printf(out, "and %zu more connections (in the total below)\n", n_conns - n_top);
	tap_buf_printf(out, "total outstanding=%" PRIu64, t->st.outstanding);
	summary_line(out, &total, tap_hist_quantile(&t->hist, 0.5), tap_hist_quantile(&t->hist, 0.99), t->hist.max);
	tap_buf_printf(out,
	               "tracking memory %" PRIu64 " bytes (peak %" PRIu64 ", budget %" PRIu64 "), evicted %" PRIu64
	               " (%" PRIu64 " for memory), headers truncated %" PRIu64 ", header values truncated %" PRIu64
	               ", malformed traceparent %" PRIu64 ", short of memory %" PRIu64 " times (records lost %" PRIu64
	               ", connections not followed %" PRIu64 ", channels not followed %" PRIu64
	               ", deliveries not followed %" PRIu64 ")\n",
	               t->mem, trk_memory_peak(t), t->conf.max_memory, t->st.evicted, t->st.evicted_memory,
	               t->st.headers_truncated, t->st.header_values_truncated, t->st.traceparent_malformed, t->st.oom,
	               t->st.records_oom, t->st.conns_unfollowed, t->st.chans_unfollowed, t->csm_st.unfollowed);
}
