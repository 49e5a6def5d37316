/* Frame-trace JSON lines (DESIGN §5) and SASL user extraction. Redaction happens here, on the way out:
 * the secret bytes are never copied into the output buffer. */
#include "amqptap/frames.h"

#include "amqptap/props.h"
#include "amqptap/redact.h"
#include "amqptap/spec.h"
#include "amqptap/status.h"
#include "amqptap/table.h"

#include <stdio.h>
#include <string.h>

#define SASL_USER_MAX 256


static void write_redacted(struct tap_json *j, size_t n)
{
	char s[48];
	int k = snprintf(s, sizeof s, "<redacted %zu bytes>", n);
	tap_json_strn(j, s, (size_t)k);
}

static void write_method(struct tap_json *j, const struct tap_frame_ev *ev)
{
	struct tap_method m;
	int rc = tap_method_decode(ev->data, ev->len, &m);
	const struct tap_method_def *def = m.def ? m.def : tap_spec_method(m.class_id, m.method_id);
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
		if (tap_redact_is_secret(def->id, i)) {
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
		char user[SASL_USER_MAX];
		if (tap_sasl_user(mech->ptr, mech->len, resp->ptr, resp->len, user, sizeof user))
			tap_json_kv_str(j, "user", user);
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

void tap_frames_line(struct tap_buf *out, uint64_t conn, enum tap_dir dir, int64_t ts_us, const struct tap_frame_ev *ev,
		     const uint8_t *body_prefix, size_t body_prefix_len)
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
	tap_json_kv_uint(&j, "conn", conn);
	tap_json_kv_str(&j, "dir", tap_dir_name(dir));
	tap_json_kv_uint(&j, "channel", ev->channel);
	tap_json_kv_str(&j, "frame", (unsigned)ev->kind <= TAP_EV_HEARTBEAT ? names[ev->kind] : "none");
	tap_json_kv_uint(&j, "size", ev->size);
	switch (ev->kind) {
	case TAP_EV_PROTOCOL_HEADER:
		if (ev->len == 8 && memcmp(ev->data, "AMQP\0\0\x09\x01", 8) == 0)
			tap_json_kv_str(&j, "protocol", "0-9-1");
		else if (ev->len == 8 && memcmp(ev->data, "AMQP\x01\x01\x00\x09", 8) == 0)
			tap_json_kv_str(&j, "protocol", "0-9-1 (AMQP 1 1 0 9)");
		else {
			tap_json_key(&j, "protocol");
			tap_json_hex(&j, ev->data, ev->len);
		}
		break;
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

static void copy_user(char *user, size_t cap, const uint8_t *p, size_t len)
{
	if (len >= cap)
		len = cap - 1;
	memcpy(user, p, len);
	user[len] = '\0';
}

bool tap_sasl_user(const uint8_t *mechanism, size_t mech_len, const uint8_t *resp, size_t resp_len, char *user,
		   size_t cap)
{
	if (!user || cap == 0 || !mechanism || !resp)
		return false;
	user[0] = '\0';
	if (mech_len == 5 && memcmp(mechanism, "PLAIN", 5) == 0) {
		/* RFC 4616: [authzid] NUL authcid NUL passwd */
		const uint8_t *nul1 = memchr(resp, 0, resp_len);
		if (!nul1)
			return false;
		const uint8_t *u = nul1 + 1;
		size_t rest = resp_len - (size_t)(u - resp);
		const uint8_t *nul2 = memchr(u, 0, rest);
		if (!nul2 || nul2 == u)
			return false;
		copy_user(user, cap, u, (size_t)(nul2 - u));
		return true;
	}
	if (mech_len == 8 && memcmp(mechanism, "AMQPLAIN", 8) == 0) {
		struct tap_field f;
		if (!tap_table_find(resp, resp_len, "LOGIN", &f) || (f.type != 'S' && f.type != 'x'))
			return false;
		copy_user(user, cap, f.ptr, f.len);
		return true;
	}
	return false;
}
