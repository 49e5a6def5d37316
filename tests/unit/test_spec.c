/* Generated spec tables and tap_method_decode: every method rabbitmq-c knows is encoded by rabbitmq-c
 * (amqp_encode_method) with non-trivial values and every bit pattern, and decoded back; the methods it
 * lacks are hand-encoded; truncations and unknown ids fail cleanly. */
#include "amqptap/spec.h"
#include "amqptap/status.h"
#include "amqptap/table.h"

#include <check.h>

#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TAP_HAVE_RABBITMQ
#include <amqp.h>
#include <amqp_framing.h>
#endif

START_TEST(lookup_known_and_unknown)
{
	const struct tap_method_def *d = tap_spec_method(60, 40);
	ck_assert_ptr_nonnull(d);
	ck_assert_str_eq(d->name, "basic.publish");
	ck_assert_uint_eq(d->id, TAP_BASIC_PUBLISH);
	ck_assert(d->has_content);
	ck_assert_uint_eq(d->nargs, 5);
	ck_assert_str_eq(d->args[TAP_ARG_BASIC_PUBLISH_ROUTING_KEY].name, "routing-key");
	ck_assert_str_eq(d->args[TAP_ARG_BASIC_PUBLISH_ROUTING_KEY].json_name, "routing_key");
	ck_assert(d->args[0].reserved);
	ck_assert_int_eq(d->args[TAP_ARG_BASIC_PUBLISH_MANDATORY].type, TAP_ARG_BIT);
	ck_assert_str_eq(tap_spec_method(85, 10)->name, "confirm.select");
	ck_assert_str_eq(tap_spec_method(60, 120)->name, "basic.nack");
	ck_assert_str_eq(tap_spec_method(40, 30)->name, "exchange.bind");
	ck_assert_str_eq(tap_spec_method(40, 51)->name, "exchange.unbind-ok");
	ck_assert_str_eq(tap_spec_method(10, 60)->name, "connection.blocked");
	ck_assert_str_eq(tap_spec_method(10, 61)->name, "connection.unblocked");
	ck_assert_str_eq(tap_spec_method(10, 70)->name, "connection.update-secret");
	ck_assert_str_eq(tap_spec_method(10, 71)->name, "connection.update-secret-ok");
	ck_assert(tap_spec_method(60, 71)->has_content);
	ck_assert(!tap_spec_method(60, 80)->has_content);
	ck_assert_ptr_null(tap_spec_method(60, 41));
	ck_assert_ptr_null(tap_spec_method(30, 10)); /* access.request: gone in 0-9-1 */
	ck_assert_ptr_null(tap_spec_method(0, 0));
	ck_assert_str_eq(tap_spec_class_name(60), "basic");
	ck_assert_str_eq(tap_spec_class_name(85), "confirm");
	ck_assert_ptr_null(tap_spec_class_name(99));
	for (unsigned i = 0; i < TAP_SPEC_NUM_METHODS; i++) {
		const struct tap_method_def *m = &tap_spec_methods[i];
		ck_assert_ptr_eq(tap_spec_method(m->class_id, m->method_id), m);
		ck_assert_uint_eq(m->id, TAP_METHOD_ID(m->class_id, m->method_id));
		ck_assert_uint_le(m->nargs, TAP_SPEC_MAX_ARGS);
	}
}
END_TEST

START_TEST(unknown_and_short_payloads)
{
	struct tap_method m;
	const uint8_t unknown_class[] = {0, 30, 0, 10, 0, 0};
	const uint8_t unknown_method[] = {0, 60, 0, 41, 0, 0, 0};
	ck_assert_int_eq(tap_method_decode(unknown_class, sizeof unknown_class, &m), TAP_E_UNKNOWN_METHOD);
	ck_assert_uint_eq(m.class_id, 30);
	ck_assert_int_eq(tap_method_decode(unknown_method, sizeof unknown_method, &m), TAP_E_UNKNOWN_METHOD);
	ck_assert_uint_eq(m.method_id, 41);
	ck_assert_ptr_null(m.def);
	ck_assert_int_eq(tap_method_decode(unknown_class, 3, &m), TAP_E_TRUNCATED);
	ck_assert_int_eq(tap_method_decode(unknown_class, 0, &m), TAP_E_TRUNCATED);
	/* argument-less method: exactly the 4 id bytes */
	const uint8_t close_ok[] = {0, 20, 0, 41};
	ck_assert_int_eq(tap_method_decode(close_ok, sizeof close_ok, &m), 0);
	ck_assert_uint_eq(m.def->id, TAP_CHANNEL_CLOSE_OK);
}
END_TEST

/* Bits pack into shared octets, LSB first, and a non-bit argument closes the octet (§4.2.5.2). */
START_TEST(bit_packing_by_hand)
{
	/* basic.nack: delivery-tag 7, multiple=1, requeue=0 -> one octet 0x01 */
	const uint8_t nack[] = {0, 60, 0, 120, 0, 0, 0, 0, 0, 0, 0, 7, 0x01};
	struct tap_method m;
	ck_assert_int_eq(tap_method_decode(nack, sizeof nack, &m), 0);
	ck_assert_uint_eq(m.args[TAP_ARG_BASIC_NACK_DELIVERY_TAG].u, 7);
	ck_assert_uint_eq(m.args[TAP_ARG_BASIC_NACK_MULTIPLE].u, 1);
	ck_assert_uint_eq(m.args[TAP_ARG_BASIC_NACK_REQUEUE].u, 0);
	/* queue.declare: 5 bits in one octet 0b10110 then an empty table */
	const uint8_t qd[] = {0, 50, 0, 10, 0, 0, 1, 'q', 0x16, 0, 0, 0, 0};
	ck_assert_int_eq(tap_method_decode(qd, sizeof qd, &m), 0);
	ck_assert_uint_eq(m.args[TAP_ARG_QUEUE_DECLARE_PASSIVE].u, 0);
	ck_assert_uint_eq(m.args[TAP_ARG_QUEUE_DECLARE_DURABLE].u, 1);
	ck_assert_uint_eq(m.args[TAP_ARG_QUEUE_DECLARE_EXCLUSIVE].u, 1);
	ck_assert_uint_eq(m.args[TAP_ARG_QUEUE_DECLARE_AUTO_DELETE].u, 0);
	ck_assert_uint_eq(m.args[TAP_ARG_QUEUE_DECLARE_NO_WAIT].u, 1);
	ck_assert_uint_eq(m.args[TAP_ARG_QUEUE_DECLARE_ARGUMENTS].len, 0);
	/* a malformed table argument is a clean error */
	const uint8_t badtab[] = {0, 50, 0, 10, 0, 0, 1, 'q', 0, 0, 0, 0, 3, 1, 'k', '?'};
	ck_assert_int_eq(tap_method_decode(badtab, sizeof badtab, &m), TAP_E_BAD_FIELD_TYPE);
}
END_TEST

/* The three methods the Debian XML lacks, hand-encoded. */
START_TEST(rabbit_extensions_by_hand)
{
	struct tap_method m;
	const uint8_t blocked[] = {0, 10, 0, 60, 13, 'l', 'o', 'w', ' ', 'o', 'n', ' ', 'm', 'e', 'm', 'o', 'r', 'y'};
	ck_assert_int_eq(tap_method_decode(blocked, sizeof blocked, &m), 0);
	ck_assert_uint_eq(m.args[TAP_ARG_CONNECTION_BLOCKED_REASON].len, 13);
	ck_assert_mem_eq(m.args[TAP_ARG_CONNECTION_BLOCKED_REASON].ptr, "low on memory", 13);
	const uint8_t unblocked[] = {0, 10, 0, 61};
	ck_assert_int_eq(tap_method_decode(unblocked, sizeof unblocked, &m), 0);
	ck_assert_uint_eq(m.def->id, TAP_CONNECTION_UNBLOCKED);
	const uint8_t us[] = {0, 10, 0, 70, 0, 0, 0, 5, 's', '3', 'c', 'r', 't', 3, 'e', 'x', 'p'};
	ck_assert_int_eq(tap_method_decode(us, sizeof us, &m), 0);
	ck_assert_mem_eq(m.args[TAP_ARG_CONNECTION_UPDATE_SECRET_NEW_SECRET].ptr, "s3crt", 5);
	ck_assert_mem_eq(m.args[TAP_ARG_CONNECTION_UPDATE_SECRET_REASON].ptr, "exp", 3);
	ck_assert_int_eq(tap_method_decode(us, sizeof us - 1, &m), TAP_E_TRUNCATED);
	const uint8_t us_ok[] = {0, 10, 0, 71};
	ck_assert_int_eq(tap_method_decode(us_ok, sizeof us_ok, &m), 0);
	ck_assert_uint_eq(m.def->id, TAP_CONNECTION_UPDATE_SECRET_OK);
}
END_TEST

/* The decoder as it was before the generated per-method decoders (one generic loop over def->args): the
 * reference that tap_method_decode must match field for field on every input. */
static bool ref_take(const uint8_t **p, const uint8_t *end, size_t n)
{
	if ((size_t)(end - *p) < n)
		return false;
	*p += n;
	return true;
}

static uint64_t ref_be(const uint8_t *p, unsigned n)
{
	uint64_t v = 0;
	for (unsigned i = 0; i < n; i++)
		v = v << 8 | p[i];
	return v;
}

static int ref_method_decode(const uint8_t *payload, size_t len, struct tap_method *m)
{
	const uint8_t *p = payload, *end = payload + len;
	m->def = NULL;
	m->class_id = m->method_id = 0;
	if (!ref_take(&p, end, 2))
		return TAP_E_TRUNCATED;
	m->class_id = (uint16_t)ref_be(payload, 2);
	if (!ref_take(&p, end, 2))
		return TAP_E_TRUNCATED;
	m->method_id = (uint16_t)ref_be(payload + 2, 2);
	const struct tap_method_def *def = tap_spec_method(m->class_id, m->method_id);
	if (!def)
		return TAP_E_UNKNOWN_METHOD;
	unsigned bitpos = 8;
	uint8_t bits = 0;
	for (unsigned i = 0; i < def->nargs; i++) {
		struct tap_arg *a = &m->args[i];
		enum tap_arg_type t = def->args[i].type;
		const uint8_t *q = p;
		a->type = t;
		a->u = 0;
		a->ptr = NULL;
		a->len = 0;
		if (t == TAP_ARG_BIT) {
			if (bitpos == 8) {
				if (!ref_take(&p, end, 1))
					return TAP_E_TRUNCATED;
				bits = *q;
				bitpos = 0;
			}
			a->u = (bits >> bitpos++) & 1;
			continue;
		}
		bitpos = 8;
		static const unsigned width[] = {[TAP_ARG_OCTET] = 1, [TAP_ARG_SHORT] = 2, [TAP_ARG_LONG] = 4,
						 [TAP_ARG_LONGLONG] = 8, [TAP_ARG_TIMESTAMP] = 8};
		if (t == TAP_ARG_SHORTSTR || t == TAP_ARG_LONGSTR || t == TAP_ARG_TABLE) {
			unsigned lw = t == TAP_ARG_SHORTSTR ? 1 : 4;
			if (!ref_take(&p, end, lw))
				return TAP_E_TRUNCATED;
			uint32_t n = (uint32_t)ref_be(q, lw);
			if (!ref_take(&p, end, n)) {
				p = q;
				return TAP_E_TRUNCATED;
			}
			a->ptr = q + lw;
			a->len = n;
			if (t == TAP_ARG_TABLE) {
				int rc = tap_table_validate(a->ptr, a->len);
				if (rc < 0)
					return rc;
			}
		} else {
			if (!ref_take(&p, end, width[t]))
				return TAP_E_TRUNCATED;
			a->u = ref_be(q, width[t]);
		}
	}
	m->def = def;
	return TAP_OK;
}

static unsigned rnd_state = 12345;

static unsigned rnd(void)
{
	rnd_state = rnd_state * 1103515245u + 12345u;
	return rnd_state >> 8;
}

/* A payload for def: well-formed arguments with random values (tables valid, or with a bad type letter
 * once in a while), sometimes followed by junk. */
static size_t random_payload(const struct tap_method_def *def, uint8_t *out)
{
	uint8_t *p = out;
	*p++ = (uint8_t)(def->class_id >> 8);
	*p++ = (uint8_t)def->class_id;
	*p++ = (uint8_t)(def->method_id >> 8);
	*p++ = (uint8_t)def->method_id;
	for (unsigned i = 0; i < def->nargs; i++) {
		enum tap_arg_type t = def->args[i].type;
		unsigned n;
		switch (t) {
		case TAP_ARG_BIT:
			if (i == 0 || def->args[i - 1].type != TAP_ARG_BIT || rnd() % 8 == 0)
				*p++ = (uint8_t)rnd();
			break;
		case TAP_ARG_OCTET: *p++ = (uint8_t)rnd(); break;
		case TAP_ARG_SHORT: n = 2; goto fixed;
		case TAP_ARG_LONG: n = 4; goto fixed;
		case TAP_ARG_LONGLONG:
		case TAP_ARG_TIMESTAMP:
			n = 8;
		fixed:
			for (unsigned k = 0; k < n; k++)
				*p++ = (uint8_t)rnd();
			break;
		case TAP_ARG_SHORTSTR:
			n = rnd() % 12;
			*p++ = (uint8_t)n;
			for (unsigned k = 0; k < n; k++)
				*p++ = (uint8_t)('a' + rnd() % 26);
			break;
		case TAP_ARG_LONGSTR:
			n = rnd() % 20;
			p[0] = p[1] = p[2] = 0;
			p[3] = (uint8_t)n;
			p += 4;
			for (unsigned k = 0; k < n; k++)
				*p++ = (uint8_t)rnd();
			break;
		case TAP_ARG_TABLE: {
			/* {"k": I 7} or {"k": <bad letter>} or {} */
			static const uint8_t good[] = {1, 'k', 'I', 0, 0, 0, 7}, bad[] = {1, 'k', '?', 0};
			unsigned pick = rnd() % 4;
			const uint8_t *tb = pick == 0 ? bad : good;
			n = pick == 0 ? sizeof bad : pick == 1 ? 0 : sizeof good;
			p[0] = p[1] = p[2] = 0;
			p[3] = (uint8_t)n;
			p += 4;
			memcpy(p, tb, n);
			p += n;
			break;
		}
		}
	}
	for (unsigned k = rnd() % 3; k > 0; k--)
		*p++ = (uint8_t)rnd();
	return (size_t)(p - out);
}

static void assert_same_method(const struct tap_method *a, const struct tap_method *b, const char *what, size_t len)
{
	ck_assert_msg(a->def == b->def && a->class_id == b->class_id && a->method_id == b->method_id,
		      "%s len %zu: def/ids differ", what, len);
	for (unsigned i = 0; i < TAP_SPEC_MAX_ARGS; i++)
		ck_assert_msg(a->args[i].type == b->args[i].type && a->args[i].u == b->args[i].u &&
				      a->args[i].ptr == b->args[i].ptr && a->args[i].len == b->args[i].len,
			      "%s len %zu: arg %u differs", what, len, i);
}

/* Every method, random well-formed and junk-tailed payloads, cut at every length and with single bytes
 * corrupted: the generated decoders give the reference's status and leave *m exactly as it does
 * (including the argument that failed, and untouched ones after it). */
START_TEST(generated_decoders_match_reference)
{
	uint8_t buf[512];
	struct tap_method got, want;
	for (unsigned i = 0; i < TAP_SPEC_NUM_METHODS; i++) {
		const struct tap_method_def *def = &tap_spec_methods[i];
		for (unsigned round = 0; round < 40; round++) {
			size_t n = random_payload(def, buf);
			ck_assert_uint_le(n, sizeof buf);
			if (round % 4 == 3)
				buf[4 + rnd() % (n > 4 ? n - 4 : 1)] ^= (uint8_t)(1 + rnd() % 255);
			for (size_t len = 0; len <= n; len++) {
				memset(&got, 0xA5, sizeof got);
				memset(&want, 0xA5, sizeof want);
				int rw = ref_method_decode(buf, len, &want);
				int rg = tap_method_decode(buf, len, &got);
				ck_assert_msg(rg == rw, "%s len %zu: %d, reference %d", def->name, len, rg, rw);
				assert_same_method(&got, &want, def->name, len);
			}
		}
	}
}
END_TEST

START_TEST(lookup_tables_cover_every_id)
{
	for (unsigned c = 0; c <= 0xFFFF; c += (c < 256 ? 1 : 251)) {
		for (unsigned mid = 0; mid <= 256; mid++) {
			const struct tap_method_def *d = tap_spec_method((uint16_t)c, (uint16_t)mid);
			const struct tap_method_def *want = NULL;
			for (unsigned i = 0; i < TAP_SPEC_NUM_METHODS; i++)
				if (tap_spec_methods[i].class_id == c && tap_spec_methods[i].method_id == mid)
					want = &tap_spec_methods[i];
			ck_assert_ptr_eq(d, want);
			ck_assert_ptr_eq(tap_spec_method_find((uint16_t)c, (uint16_t)mid), want);
		}
	}
}
END_TEST


#ifdef TAP_HAVE_RABBITMQ

/* rabbitmq-c's decoded method structs hold the arguments in XML order with these C types; a struct is
 * laid out here from our argument table, so a mismatch in order or type shows up as wrong values. */
static size_t arg_csize(enum tap_arg_type t)
{
	switch (t) {
	case TAP_ARG_BIT: return sizeof(amqp_boolean_t);
	case TAP_ARG_OCTET: return 1;
	case TAP_ARG_SHORT: return 2;
	case TAP_ARG_LONG: return 4;
	case TAP_ARG_LONGLONG:
	case TAP_ARG_TIMESTAMP: return 8;
	case TAP_ARG_SHORTSTR:
	case TAP_ARG_LONGSTR: return sizeof(amqp_bytes_t);
	case TAP_ARG_TABLE: return sizeof(amqp_table_t);
	}
	return 0;
}

static size_t arg_calign(enum tap_arg_type t)
{
	switch (t) {
	case TAP_ARG_SHORTSTR:
	case TAP_ARG_LONGSTR: return _Alignof(amqp_bytes_t);
	case TAP_ARG_TABLE: return _Alignof(amqp_table_t);
	default: return arg_csize(t);
	}
}

static amqp_table_entry_t nested_entries[2];
static amqp_table_entry_t table_entries[6];
static amqp_table_t test_table;

static void build_table(void)
{
	nested_entries[0] = (amqp_table_entry_t){amqp_cstring_bytes("depth"), {.kind = 'b', .value.i8 = -2}};
	nested_entries[1] = (amqp_table_entry_t){amqp_cstring_bytes("u"), {.kind = 'u', .value.u16 = 65000}};
	table_entries[0] = (amqp_table_entry_t){amqp_cstring_bytes("x-max-length"), {.kind = 'l', .value.i64 = -5}};
	table_entries[1] =
		(amqp_table_entry_t){amqp_cstring_bytes("x-overflow"), {.kind = 'S', .value.bytes = amqp_cstring_bytes("reject-publish")}};
	table_entries[2] = (amqp_table_entry_t){amqp_cstring_bytes("flag"), {.kind = 't', .value.boolean = 1}};
	table_entries[3] = (amqp_table_entry_t){amqp_cstring_bytes("n"), {.kind = 'I', .value.i32 = -70000}};
	table_entries[4] = (amqp_table_entry_t){amqp_cstring_bytes("nested"),
						{.kind = 'F', .value.table = {2, nested_entries}}};
	table_entries[5] = (amqp_table_entry_t){amqp_cstring_bytes("d"), {.kind = 'd', .value.f64 = 2.5}};
	test_table = (amqp_table_t){6, table_entries};
}

static const char test_table_json[] =
	"{\"x-max-length\":{\"l\":-5},\"x-overflow\":{\"S\":\"reject-publish\"},\"flag\":{\"t\":true},"
	"\"n\":{\"I\":-70000},\"nested\":{\"F\":{\"depth\":{\"b\":-2},\"u\":{\"u\":65000}}},\"d\":{\"d\":2.5}}";

struct expect {
	uint64_t u[TAP_SPEC_MAX_ARGS];
	char str[TAP_SPEC_MAX_ARGS][64];
	size_t slen[TAP_SPEC_MAX_ARGS];
};

/* Fills a rabbitmq-c struct image for def with values derived from the argument index and round. */
static void fill(const struct tap_method_def *def, unsigned round, unsigned char *image, struct expect *e)
{
	size_t off = 0;
	unsigned nbit = 0;
	for (unsigned i = 0; i < def->nargs; i++) {
		enum tap_arg_type t = def->args[i].type;
		size_t al = arg_calign(t);
		off = (off + al - 1) / al * al;
		unsigned char *f = image + off;
		switch (t) {
		case TAP_ARG_BIT: {
			amqp_boolean_t b = (round >> nbit++) & 1;
			memcpy(f, &b, sizeof b);
			e->u[i] = (uint64_t)b;
			break;
		}
		case TAP_ARG_OCTET: {
			uint8_t v = (uint8_t)(0xA0 + i + round);
			memcpy(f, &v, 1);
			e->u[i] = v;
			break;
		}
		case TAP_ARG_SHORT: {
			uint16_t v = (uint16_t)(0xF123 + i * 7 + round);
			memcpy(f, &v, 2);
			e->u[i] = v;
			break;
		}
		case TAP_ARG_LONG: {
			uint32_t v = 0x89ABCDE0u + i + round;
			memcpy(f, &v, 4);
			e->u[i] = v;
			break;
		}
		case TAP_ARG_LONGLONG:
		case TAP_ARG_TIMESTAMP: {
			uint64_t v = UINT64_C(0xF123456789ABCDE0) + i + round;
			memcpy(f, &v, 8);
			e->u[i] = v;
			break;
		}
		case TAP_ARG_SHORTSTR:
		case TAP_ARG_LONGSTR: {
			int n = snprintf(e->str[i], sizeof e->str[i], "%s/%s#%u-\xc3\xa9", def->name, def->args[i].name, round);
			e->slen[i] = (size_t)n;
			if (t == TAP_ARG_LONGSTR && e->slen[i] > 2)
				e->str[i][1] = '\0'; /* longstr is binary-safe */
			amqp_bytes_t b = {e->slen[i], e->str[i]};
			memcpy(f, &b, sizeof b);
			break;
		}
		case TAP_ARG_TABLE:
			memcpy(f, &test_table, sizeof test_table);
			break;
		}
		off += arg_csize(t);
	}
}

static unsigned count_bits(const struct tap_method_def *def)
{
	unsigned n = 0;
	for (unsigned i = 0; i < def->nargs; i++)
		n += def->args[i].type == TAP_ARG_BIT;
	return n;
}

START_TEST(every_method_against_rabbitmq_c)
{
	static unsigned char out[4096];
	_Alignas(16) unsigned char image[512];
	unsigned char table_wire[1024];
	size_t table_off = 0;
	amqp_bytes_t tb = {sizeof table_wire, table_wire};
	build_table();
	ck_assert_int_eq(amqp_encode_table(tb, &test_table, &table_off), 0);
	unsigned checked = 0, rounds_total = 0;
	for (unsigned k = 0; k < TAP_SPEC_NUM_METHODS; k++) {
		const struct tap_method_def *def = &tap_spec_methods[k];
		amqp_method_number_t id = def->id;
		if (!amqp_method_name(id))
			continue; /* update-secret(-ok): covered by rabbit_extensions_by_hand */
		unsigned rounds = 1u << count_bits(def);
		for (unsigned round = 0; round < (rounds < 3 ? 3 : rounds); round++) {
			struct expect e;
			memset(image, 0, sizeof image);
			memset(&e, 0, sizeof e);
			fill(def, round, image, &e);
			out[0] = (uint8_t)(def->class_id >> 8);
			out[1] = (uint8_t)def->class_id;
			out[2] = (uint8_t)(def->method_id >> 8);
			out[3] = (uint8_t)def->method_id;
			int n = amqp_encode_method(id, image, (amqp_bytes_t){sizeof out - 4, out + 4});
			ck_assert_msg(n >= 0, "rabbitmq-c failed to encode %s", def->name);
			size_t len = 4 + (size_t)n;
			struct tap_method m;
			int rc = tap_method_decode(out, len, &m);
			ck_assert_msg(rc == 0, "%s: %s", def->name, tap_strerror(rc));
			ck_assert_ptr_eq(m.def, def);
			for (unsigned i = 0; i < def->nargs; i++) {
				const struct tap_arg *a = &m.args[i];
				ck_assert_int_eq(a->type, def->args[i].type);
				switch (a->type) {
				case TAP_ARG_SHORTSTR:
				case TAP_ARG_LONGSTR:
					ck_assert_msg(a->len == e.slen[i] && memcmp(a->ptr, e.str[i], a->len) == 0,
						      "%s arg %s", def->name, def->args[i].name);
					break;
				case TAP_ARG_TABLE:
					ck_assert_uint_eq(a->len, table_off - 4);
					ck_assert_mem_eq(a->ptr, table_wire + 4, a->len);
					break;
				default:
					ck_assert_msg(a->u == e.u[i], "%s arg %s round %u: %llu != %llu", def->name,
						      def->args[i].name, round, (unsigned long long)a->u,
						      (unsigned long long)e.u[i]);
				}
			}
			/* every strict prefix is truncated (every argument takes at least one byte) */
			if (round == 0)
				for (size_t cut = 4; cut < len; cut++)
					ck_assert_msg(tap_method_decode(out, cut, &m) == TAP_E_TRUNCATED, "%s cut at %zu",
						      def->name, cut);
			rounds_total++;
		}
		checked++;
	}
	ck_assert_uint_eq(checked, TAP_SPEC_NUM_METHODS - 2);
	ck_assert_uint_ge(rounds_total, checked * 3);
}
END_TEST

/* Our spec knows every 0-9-1 method rabbitmq-c knows (access.* was removed from 0-9-1). */
START_TEST(spec_covers_rabbitmq_c)
{
	unsigned n = 0;
	for (unsigned c = 0; c <= 100; c++)
		for (unsigned mth = 0; mth <= 200; mth++) {
			amqp_method_number_t id = (amqp_method_number_t)TAP_METHOD_ID(c, mth);
			const char *name = amqp_method_name(id);
			if (!name || c == 30)
				continue;
			const struct tap_method_def *d = tap_spec_method((uint16_t)c, (uint16_t)mth);
			ck_assert_msg(d != NULL, "missing %s", name);
			ck_assert_int_eq(d->has_content, amqp_method_has_content(id));
			n++;
		}
	ck_assert_uint_eq(n, TAP_SPEC_NUM_METHODS - 2);
}
END_TEST

/* The generic struct image above matches rabbitmq-c's real structs: same bytes on the wire. */
START_TEST(generic_image_matches_real_structs)
{
	unsigned char a[512], b[512];
	_Alignas(16) unsigned char image[512];
	struct expect e;
	build_table();

	const struct tap_method_def *pub = tap_spec_method(60, 40);
	memset(image, 0, sizeof image);
	fill(pub, 2, image, &e);
	amqp_basic_publish_t p = {.ticket = (uint16_t)e.u[0],
				  .exchange = {e.slen[1], e.str[1]},
				  .routing_key = {e.slen[2], e.str[2]},
				  .mandatory = (amqp_boolean_t)e.u[3],
				  .immediate = (amqp_boolean_t)e.u[4]};
	int na = amqp_encode_method(AMQP_BASIC_PUBLISH_METHOD, image, (amqp_bytes_t){sizeof a, a});
	int nb = amqp_encode_method(AMQP_BASIC_PUBLISH_METHOD, &p, (amqp_bytes_t){sizeof b, b});
	ck_assert_int_eq(na, nb);
	ck_assert_mem_eq(a, b, (size_t)na);

	const struct tap_method_def *ed = tap_spec_method(40, 10);
	memset(image, 0, sizeof image);
	fill(ed, 21, image, &e);
	amqp_exchange_declare_t x = {.ticket = (uint16_t)e.u[0],
				     .exchange = {e.slen[1], e.str[1]},
				     .type = {e.slen[2], e.str[2]},
				     .passive = (amqp_boolean_t)e.u[3],
				     .durable = (amqp_boolean_t)e.u[4],
				     .auto_delete = (amqp_boolean_t)e.u[5],
				     .internal = (amqp_boolean_t)e.u[6],
				     .nowait = (amqp_boolean_t)e.u[7],
				     .arguments = test_table};
	na = amqp_encode_method(AMQP_EXCHANGE_DECLARE_METHOD, image, (amqp_bytes_t){sizeof a, a});
	nb = amqp_encode_method(AMQP_EXCHANGE_DECLARE_METHOD, &x, (amqp_bytes_t){sizeof b, b});
	ck_assert_int_eq(na, nb);
	ck_assert_mem_eq(a, b, (size_t)na);

	const struct tap_method_def *st = tap_spec_method(10, 10);
	memset(image, 0, sizeof image);
	fill(st, 1, image, &e);
	amqp_connection_start_t s = {.version_major = (uint8_t)e.u[0],
				     .version_minor = (uint8_t)e.u[1],
				     .server_properties = test_table,
				     .mechanisms = {e.slen[3], e.str[3]},
				     .locales = {e.slen[4], e.str[4]}};
	na = amqp_encode_method(AMQP_CONNECTION_START_METHOD, image, (amqp_bytes_t){sizeof a, a});
	nb = amqp_encode_method(AMQP_CONNECTION_START_METHOD, &s, (amqp_bytes_t){sizeof b, b});
	ck_assert_int_eq(na, nb);
	ck_assert_mem_eq(a, b, (size_t)na);
}
END_TEST

/* A table encoded by rabbitmq-c renders with its type letters. */
START_TEST(rabbitmq_c_table_to_json)
{
	unsigned char wire[1024];
	size_t off = 0;
	build_table();
	ck_assert_int_eq(amqp_encode_table((amqp_bytes_t){sizeof wire, wire}, &test_table, &off), 0);
	struct tap_buf b;
	struct tap_json j;
	tap_buf_init(&b);
	tap_json_init(&j, &b);
	ck_assert_int_eq(tap_table_to_json(&j, wire + 4, off - 4), 0);
	tap_buf_putc(&b, 0);
	ck_assert_str_eq(b.data, test_table_json);
	tap_buf_deinit(&b);
}
END_TEST
#endif

int main(void)
{
	Suite *s = suite_create("spec");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, lookup_known_and_unknown);
	tcase_add_test(tc, unknown_and_short_payloads);
	tcase_add_test(tc, bit_packing_by_hand);
	tcase_add_test(tc, rabbit_extensions_by_hand);
	tcase_add_test(tc, generated_decoders_match_reference);
	tcase_add_test(tc, lookup_tables_cover_every_id);
#ifdef TAP_HAVE_RABBITMQ
	tcase_add_test(tc, every_method_against_rabbitmq_c);
	tcase_add_test(tc, spec_covers_rabbitmq_c);
	tcase_add_test(tc, generic_image_matches_real_structs);
	tcase_add_test(tc, rabbitmq_c_table_to_json);
#endif
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
