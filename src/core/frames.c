/* Frame-trace JSON lines (src/DESIGN.md §5). Redaction happens here, on the way out: the secret bytes are never copied
 * into the output buffer. */
#include "amqptap/frames.h"

#include "amqptap/dialect.h"
#include "amqptap/props.h"
#include "amqptap/redact.h"
#include "amqptap/sasl.h"
#include "amqptap/spec.h"
#include "amqptap/status.h"
#include "amqptap/table.h"

#include <stdio.h>
#include <string.h>

static void write_redacted(struct tap_json *j, size_t n)
{
	char s[48];
	int k = snprintf(s, sizeof s, "<redacted %zu bytes>", n);
	tap_json_strn(j, s, (size_t)k);
}

static void write_method(struct tap_json *j, const struct tap_frame_ev *ev)
{
	struct tap_method m;
	int rc = tap_dialect_method_decode(ev->version, ev->data, ev->len, &m);
	const struct tap_method_def *def = m.def ? m.def : tap_dialect_method(ev->version, m.class_id, m.method_id);
	if (def)
		tap_json_kv_str(j, "method", def->name);
	if (ev->len >= 4) {
		tap_json_kv_uint(j, "class_id", m.class_id);
		tap_json_kv_uint(j, "method_id", m.method_id);
	}
	if (rc < 0) {
		tap_json_kv_str(j, "error", tap_strerror(rc));
		return;
	}
	tap_json_key(j, "args");
	tap_json_obj_begin(j);
	for (unsigned i = 0; i < def->nargs; i++) {
		const struct tap_arg_def *ad = &def->args[i];
		const struct tap_arg *a = &m.args[i];
		if (ad->reserved)
			continue;
		tap_json_key(j, ad->json_name);
		if (tap_redact_is_secret(&m, i)) {
			write_redacted(j, a->len);
			continue;
		}
		switch (a->type) {
		case TAP_ARG_BIT: tap_json_bool(j, a->u != 0); break;
		case TAP_ARG_SHORTSTR:
		case TAP_ARG_LONGSTR: tap_json_strn(j, a->ptr, a->len); break;
		case TAP_ARG_TABLE: tap_table_to_json(j, a->ptr, a->len); break;
		default: tap_json_uint(j, a->u); break;
		}
	}
	tap_json_obj_end(j);
	if (def->id == TAP_CONNECTION_START_OK) {
		const struct tap_arg *mech = &m.args[TAP_ARG_CONNECTION_START_OK_MECHANISM];
		const struct tap_arg *resp = &m.args[TAP_ARG_CONNECTION_START_OK_RESPONSE];
		struct tap_sasl sasl;
		tap_sasl_parse((struct tap_slice){mech->ptr, mech->len}, (struct tap_slice){resp->ptr, resp->len}, &sasl);
		if (sasl.user.len)
			tap_json_kv_strn(j, "user", sasl.user.ptr, sasl.user.len);
	}
}

static void kv_slice(struct tap_json *j, uint16_t flags, uint16_t bit, const char *key, const struct tap_slice *s)
{
	if (flags & bit)
		tap_json_kv_strn(j, key, s->ptr, s->len);
}

static void write_header(struct tap_json *j, const struct tap_frame_ev *ev)
{
	struct tap_props p;
	int rc = tap_props_decode(ev->data, ev->len, &p);
	if (ev->len >= TAP_PROPS_MIN_SIZE - 2) {
		tap_json_kv_uint(j, "class_id", p.class_id);
		tap_json_kv_uint(j, "body_size", p.body_size);
	}
	if (rc < 0) {
		tap_json_kv_str(j, "error", tap_strerror(rc));
		return;
	}
	uint16_t f = p.flags;
	tap_json_key(j, "props");
	tap_json_obj_begin(j);
	kv_slice(j, f, TAP_PROP_CONTENT_TYPE, "content_type", &p.content_type);
	kv_slice(j, f, TAP_PROP_CONTENT_ENCODING, "content_encoding", &p.content_encoding);
	if (f & TAP_PROP_HEADERS) {
		tap_json_key(j, "headers");
		tap_table_to_json(j, p.headers.ptr, p.headers.len);
	}
	if (f & TAP_PROP_DELIVERY_MODE)
		tap_json_kv_uint(j, "delivery_mode", p.delivery_mode);
	if (f & TAP_PROP_PRIORITY)
		tap_json_kv_uint(j, "priority", p.priority);
	kv_slice(j, f, TAP_PROP_CORRELATION_ID, "correlation_id", &p.correlation_id);
	kv_slice(j, f, TAP_PROP_REPLY_TO, "reply_to", &p.reply_to);
	kv_slice(j, f, TAP_PROP_EXPIRATION, "expiration", &p.expiration);
	kv_slice(j, f, TAP_PROP_MESSAGE_ID, "message_id", &p.message_id);
	if (f & TAP_PROP_TIMESTAMP)
		tap_json_kv_uint(j, "timestamp", p.timestamp);
	kv_slice(j, f, TAP_PROP_TYPE, "type", &p.type);
	kv_slice(j, f, TAP_PROP_USER_ID, "user_id", &p.user_id);
	kv_slice(j, f, TAP_PROP_APP_ID, "app_id", &p.app_id);
	kv_slice(j, f, TAP_PROP_CLUSTER_ID, "cluster_id", &p.cluster_id);
	tap_json_obj_end(j);
}

void tap_frames_line(struct tap_buf *out, const char *run, uint64_t conn, enum tap_dir dir, int64_t ts_us,
		     const struct tap_frame_ev *ev, const uint8_t *body_prefix, size_t body_prefix_len)
{
	static const char *const names[] = {
		[TAP_EV_NONE] = "none",
		[TAP_EV_PROTOCOL_HEADER] = "protocol_header",
		[TAP_EV_METHOD] = "method",
		[TAP_EV_HEADER] = "header",
		[TAP_EV_BODY] = "body",
		[TAP_EV_HEARTBEAT] = "heartbeat",
	};
	struct tap_json j;
	tap_json_init(&j, out);
	tap_json_obj_begin(&j);
	tap_json_kv_ts(&j, "ts", ts_us);
	if (run && run[0])
		tap_json_kv_str(&j, "run", run);
	tap_json_kv_uint(&j, "conn", conn);
	tap_json_kv_str(&j, "dir", tap_dir_name(dir));
	tap_json_kv_uint(&j, "channel", ev->channel);
	tap_json_kv_str(&j, "frame", (unsigned)ev->kind <= TAP_EV_HEARTBEAT ? names[ev->kind] : "none");
	tap_json_kv_uint(&j, "size", ev->size);
	switch (ev->kind) {
	case TAP_EV_PROTOCOL_HEADER: {
		enum tap_amqp_version v;
		const char *name = ev->len == 8 ? tap_frame_protocol(ev->data, &v) : NULL;
		if (name) {
			tap_json_kv_str(&j, "protocol", name);
		} else {
			tap_json_key(&j, "protocol");
			tap_json_hex(&j, ev->data, ev->len);
		}
		break;
	}
	case TAP_EV_METHOD:
		write_method(&j, ev);
		break;
	case TAP_EV_HEADER:
		write_header(&j, ev);
		break;
	case TAP_EV_BODY:
		if (body_prefix_len > 0) {
			tap_json_key(&j, "body_hex");
			tap_json_hex(&j, body_prefix, body_prefix_len);
		}
		break;
	default:
		break;
	}
	tap_json_obj_end(&j);
}
