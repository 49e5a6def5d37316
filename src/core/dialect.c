/* AMQP 0-8 method payloads as RabbitMQ decodes them (rabbit_framing_amqp_0_8), compared field by field with
 * 0-9-1 (the 0-8 and 0-9-1-rabbit XML under /usr/share/amqp/specs and RabbitMQ 3.10.8's framing modules):
 * everything not listed in overrides[] has the same id and layout in both. */
#include "amqptap/dialect.h"

#include "amqptap/status.h"
#include "amqptap/table.h"
#include "rd.h"

static void arg_num(struct tap_arg *a, enum tap_arg_type t, uint64_t u)
{
	*a = (struct tap_arg){.type = t, .u = u};
}

static bool arg_short(struct tap_rd *r, struct tap_arg *a)
{
	uint16_t v;
	if (!tap_rd_u16(r, &v))
		return false;
	arg_num(a, TAP_ARG_SHORT, v);
	return true;
}

static bool arg_shortstr(struct tap_rd *r, struct tap_arg *a)
{
	const uint8_t *s;
	uint32_t n;
	if (!tap_rd_shortstr(r, &s, &n))
		return false;
	*a = (struct tap_arg){.type = TAP_ARG_SHORTSTR, .ptr = s, .len = n};
	return true;
}

/* n bits packed from the least significant bit of one octet (0-9-1 §4.2.5.2, the same in 0-8). */
static bool arg_bits(struct tap_rd *r, struct tap_arg *a, unsigned n)
{
	uint8_t v;
	if (!tap_rd_u8(r, &v))
		return false;
	for (unsigned i = 0; i < n; i++)
		arg_num(&a[i], TAP_ARG_BIT, (v >> i) & 1u);
	return true;
}

static const struct tap_method_def defs_0_8[];

enum { DEF_REDIRECT, DEF_OPEN_OK, DEF_ALERT, DEF_ACCESS_REQUEST, DEF_ACCESS_REQUEST_OK, DEF_CONSUME };

static int decode_redirect(const uint8_t *p, const uint8_t *end, struct tap_method *m)
{
	struct tap_rd r = {p, end};
	if (!arg_shortstr(&r, &m->args[0]) || !arg_shortstr(&r, &m->args[1]))
		return TAP_E_TRUNCATED;
	m->def = &defs_0_8[DEF_REDIRECT];
	return TAP_OK;
}

static int decode_open_ok(const uint8_t *p, const uint8_t *end, struct tap_method *m)
{
	(void)p;
	(void)end;
	m->def = &defs_0_8[DEF_OPEN_OK];
	return TAP_OK;
}

static int decode_alert(const uint8_t *p, const uint8_t *end, struct tap_method *m)
{
	struct tap_rd r = {p, end};
	const uint8_t *t;
	uint32_t n;
	if (!arg_short(&r, &m->args[0]) || !arg_shortstr(&r, &m->args[1]) || !tap_rd_longstr(&r, &t, &n))
		return TAP_E_TRUNCATED;
	m->args[2] = (struct tap_arg){.type = TAP_ARG_TABLE, .ptr = t, .len = n};
	int rc = tap_table_validate(t, n);
	if (rc < 0)
		return rc;
	m->def = &defs_0_8[DEF_ALERT];
	return TAP_OK;
}

static int decode_access_request(const uint8_t *p, const uint8_t *end, struct tap_method *m)
{
	struct tap_rd r = {p, end};
	if (!arg_shortstr(&r, &m->args[0]) || !arg_bits(&r, &m->args[1], 5))
		return TAP_E_TRUNCATED;
	m->def = &defs_0_8[DEF_ACCESS_REQUEST];
	return TAP_OK;
}

static int decode_access_request_ok(const uint8_t *p, const uint8_t *end, struct tap_method *m)
{
	struct tap_rd r = {p, end};
	if (!arg_short(&r, &m->args[0]))
		return TAP_E_TRUNCATED;
	m->def = &defs_0_8[DEF_ACCESS_REQUEST_OK];
	return TAP_OK;
}

static int decode_consume(const uint8_t *p, const uint8_t *end, struct tap_method *m)
{
	struct tap_rd r = {p, end};
	if (!arg_short(&r, &m->args[0]) || !arg_shortstr(&r, &m->args[1]) || !arg_shortstr(&r, &m->args[2]) ||
	    !arg_bits(&r, &m->args[3], 4))
		return TAP_E_TRUNCATED;
	m->def = &defs_0_8[DEF_CONSUME];
	return TAP_OK;
}

static const struct tap_arg_def args_redirect[] = {
	{"host", "host", TAP_ARG_SHORTSTR, false},
	{"known-hosts", "known_hosts", TAP_ARG_SHORTSTR, false},
};
static const struct tap_arg_def args_alert[] = {
	{"reply-code", "reply_code", TAP_ARG_SHORT, false},
	{"reply-text", "reply_text", TAP_ARG_SHORTSTR, false},
	{"details", "details", TAP_ARG_TABLE, false},
};
static const struct tap_arg_def args_access_request[] = {
	{"realm", "realm", TAP_ARG_SHORTSTR, false}, {"exclusive", "exclusive", TAP_ARG_BIT, false},
	{"passive", "passive", TAP_ARG_BIT, false},  {"active", "active", TAP_ARG_BIT, false},
	{"write", "write", TAP_ARG_BIT, false},      {"read", "read", TAP_ARG_BIT, false},
};
static const struct tap_arg_def args_access_request_ok[] = {
	{"ticket", "ticket", TAP_ARG_SHORT, false},
};
static const struct tap_arg_def args_consume[] = {
	{"ticket", "ticket", TAP_ARG_SHORT, true},
	{"queue", "queue", TAP_ARG_SHORTSTR, false},
	{"consumer-tag", "consumer_tag", TAP_ARG_SHORTSTR, false},
	{"no-local", "no_local", TAP_ARG_BIT, false},
	{"no-ack", "no_ack", TAP_ARG_BIT, false},
	{"exclusive", "exclusive", TAP_ARG_BIT, false},
	{"no-wait", "no_wait", TAP_ARG_BIT, false},
};

#define NARGS(a) ((uint8_t)(sizeof(a) / sizeof(a)[0]))

static const struct tap_method_def defs_0_8[] = {
	[DEF_REDIRECT] = {TAP_0_8_CONNECTION_REDIRECT, 10, 50, "connection.redirect", false, NARGS(args_redirect),
			  args_redirect, decode_redirect},
	[DEF_OPEN_OK] = {TAP_0_8_CHANNEL_OPEN_OK, 20, 11, "channel.open-ok", false, 0, NULL, decode_open_ok},
	[DEF_ALERT] = {TAP_0_8_CHANNEL_ALERT, 20, 30, "channel.alert", false, NARGS(args_alert), args_alert,
		       decode_alert},
	[DEF_ACCESS_REQUEST] = {TAP_0_8_ACCESS_REQUEST, 30, 10, "access.request", false, NARGS(args_access_request),
				args_access_request, decode_access_request},
	[DEF_ACCESS_REQUEST_OK] = {TAP_0_8_ACCESS_REQUEST_OK, 30, 11, "access.request-ok", false,
				   NARGS(args_access_request_ok), args_access_request_ok, decode_access_request_ok},
	[DEF_CONSUME] = {TAP_0_8_BASIC_CONSUME, 60, 20, "basic.consume", false, NARGS(args_consume), args_consume,
			 decode_consume},
};

/* Where 0-8 differs from 0-9-1: a 0-8 definition, a 0-9-1 definition under another id, or nothing (def NULL and
 * id 0: the method does not exist in 0-8). */
static const struct override {
	uint16_t class_id, method_id;
	const struct tap_method_def *def; /* NULL: look up the 0-9-1 method `as` */
	uint32_t as;
} overrides[] = {
	{10, 50, &defs_0_8[DEF_REDIRECT], 0},
	{10, 51, NULL, 0},
	{10, 60, NULL, TAP_CONNECTION_CLOSE},
	{10, 61, NULL, TAP_CONNECTION_CLOSE_OK},
	{10, 70, NULL, 0},
	{10, 71, NULL, 0},
	{20, 11, &defs_0_8[DEF_OPEN_OK], 0},
	{20, 30, &defs_0_8[DEF_ALERT], 0},
	{30, 10, &defs_0_8[DEF_ACCESS_REQUEST], 0},
	{30, 11, &defs_0_8[DEF_ACCESS_REQUEST_OK], 0},
	{40, 30, NULL, 0},
	{40, 31, NULL, 0},
	{40, 40, NULL, 0},
	{40, 51, NULL, 0},
	{60, 20, &defs_0_8[DEF_CONSUME], 0},
	{60, 120, NULL, 0},
};

const struct tap_method_def *tap_dialect_method(enum tap_amqp_version v, uint16_t class_id, uint16_t method_id)
{
	if (v == TAP_AMQP_0_8) {
		if (class_id == TAP_CLASS_CONFIRM)
			return NULL;
		for (size_t i = 0; i < sizeof overrides / sizeof overrides[0]; i++) {
			const struct override *o = &overrides[i];
			if (o->class_id != class_id || o->method_id != method_id)
				continue;
			if (o->def || o->as == 0)
				return o->def;
			return tap_spec_method((uint16_t)(o->as >> 16), (uint16_t)o->as);
		}
	}
	return tap_spec_method(class_id, method_id);
}

int tap_dialect_method_decode(enum tap_amqp_version v, const uint8_t *payload, size_t len, struct tap_method *m)
{
	if (v == TAP_AMQP_0_9_1 || len < 4)
		return tap_method_decode(payload, len, m);
	m->def = NULL;
	m->class_id = tap_be16(payload);
	m->method_id = tap_be16(payload + 2);
	const struct tap_method_def *def = tap_dialect_method(v, m->class_id, m->method_id);
	if (!def)
		return TAP_E_UNKNOWN_METHOD;
	return def->decode_args(payload + 4, payload + len, m);
}
