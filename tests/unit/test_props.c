/* Content headers: all 14 basic properties as rabbitmq-c encodes them (amqp_encode_properties), every
 * subset of flags, truncation at every offset, continuation words, bad flags, other classes. */
#include "amqptap/props.h"
#include "amqptap/status.h"
#include "amqptap/table.h"

#include <check.h>

#include "tap_check.h"
#include <stdlib.h>
#include <string.h>

#ifdef TAP_HAVE_RABBITMQ
#include <amqp.h>
#include <amqp_framing.h>
#endif

static size_t head(uint8_t *out, uint16_t class_id, uint64_t body_size)
{
	out[0] = (uint8_t)(class_id >> 8);
	out[1] = (uint8_t)class_id;
	out[2] = out[3] = 0;
	for (int i = 0; i < 8; i++)
		out[4 + i] = (uint8_t)(body_size >> (56 - 8 * i));
	return 12;
}

static bool slice_is(struct tap_slice s, const char *v)
{
	return s.len == strlen(v) && memcmp(s.ptr, v, s.len) == 0;
}

START_TEST(minimal_and_malformed)
{
	uint8_t b[64];
	struct tap_props p;
	size_t n = head(b, 60, 0x0102030405060708ull);
	b[n++] = 0;
	b[n++] = 0;
	ck_assert_int_eq(tap_props_decode(b, n, &p), 0);
	ck_assert_uint_eq(p.body_size, 0x0102030405060708ull);
	ck_assert_uint_eq(p.flags, 0);
	for (size_t cut = 0; cut < n; cut++)
		ck_assert_int_eq(tap_props_decode(b, cut, &p), TAP_E_TRUNCATED);
	/* delivery-mode only */
	b[12] = 0x10, b[13] = 0, b[14] = 2;
	ck_assert_int_eq(tap_props_decode(b, 15, &p), 0);
	ck_assert_uint_eq(p.flags, TAP_PROP_DELIVERY_MODE);
	ck_assert_uint_eq(p.delivery_mode, 2);
	ck_assert_int_eq(tap_props_decode(b, 14, &p), TAP_E_TRUNCATED);
	/* flag bit 1 has no property */
	b[12] = 0, b[13] = 0x02;
	ck_assert_int_eq(tap_props_decode(b, 14, &p), TAP_E_BAD_PROPERTY_FLAGS);
	/* continuation word, empty: accepted; with bits: rejected; missing: truncated */
	b[12] = 0x10, b[13] = 0x01, b[14] = 0, b[15] = 0, b[16] = 1;
	ck_assert_int_eq(tap_props_decode(b, 17, &p), 0);
	ck_assert_uint_eq(p.delivery_mode, 1);
	ck_assert_uint_eq(p.flags, TAP_PROP_DELIVERY_MODE);
	ck_assert_int_eq(tap_props_decode(b, 15, &p), TAP_E_TRUNCATED);
	b[14] = 0x80;
	ck_assert_int_eq(tap_props_decode(b, 17, &p), TAP_E_BAD_PROPERTY_FLAGS);
	/* another class */
	head(b, 10, 5);
	b[12] = b[13] = 0;
	ck_assert_int_eq(tap_props_decode(b, 14, &p), TAP_E_UNKNOWN_CLASS);
	ck_assert_uint_eq(p.class_id, 10);
	ck_assert_uint_eq(p.body_size, 5);
	/* headers with a bad type letter */
	n = head(b, 60, 1);
	b[n++] = 0x20, b[n++] = 0;
	const uint8_t tab[] = {0, 0, 0, 3, 1, 'k', '!'};
	memcpy(b + n, tab, sizeof tab);
	ck_assert_int_eq(tap_props_decode(b, n + sizeof tab, &p), TAP_E_BAD_FIELD_TYPE);
}
END_TEST


/* The decoder as it was before the fast path (memset, then every field in order): the reference that
 * tap_props_decode must match field for field on every input. */
static bool ref_u(const uint8_t **p, const uint8_t *end, unsigned n, uint64_t *v)
{
	if ((size_t)(end - *p) < n)
		return false;
	*v = 0;
	for (unsigned i = 0; i < n; i++)
		*v = *v << 8 | (*p)[i];
	*p += n;
	return true;
}

static bool ref_str(const uint8_t **p, const uint8_t *end, unsigned lw, struct tap_slice *s)
{
	const uint8_t *q = *p;
	uint64_t n;
	if (!ref_u(&q, end, lw, &n) || (size_t)(end - q) < n)
		return false;
	s->ptr = q;
	s->len = (size_t)n;
	*p = q + n;
	return true;
}

static int ref_props_decode(const uint8_t *payload, size_t len, struct tap_props *p)
{
	const uint8_t *q = payload, *end = payload + len;
	uint64_t v, flags, more;
	memset(p, 0, sizeof *p);
	if (!ref_u(&q, end, 2, &v))
		return TAP_E_TRUNCATED;
	p->class_id = (uint16_t)v;
	if (!ref_u(&q, end, 2, &v))
		return TAP_E_TRUNCATED;
	p->weight = (uint16_t)v;
	if (!ref_u(&q, end, 8, &p->body_size) || !ref_u(&q, end, 2, &flags))
		return TAP_E_TRUNCATED;
	if (p->class_id != 60)
		return TAP_E_UNKNOWN_CLASS;
	if (flags & 2)
		return TAP_E_BAD_PROPERTY_FLAGS;
	for (more = flags; more & 1;) {
		if (!ref_u(&q, end, 2, &more))
			return TAP_E_TRUNCATED;
		if (more & ~1u)
			return TAP_E_BAD_PROPERTY_FLAGS;
	}
	flags &= ~1u;
	p->flags = (uint16_t)flags;
	struct tap_slice *shorts[16] = {
		[15] = &p->content_type, [14] = &p->content_encoding, [10] = &p->correlation_id, [9] = &p->reply_to,
		[8] = &p->expiration,    [7] = &p->message_id,        [5] = &p->type,            [4] = &p->user_id,
		[3] = &p->app_id,        [2] = &p->cluster_id,
	};
	for (int bit = 15; bit >= 2; bit--) {
		if (!(flags & (1u << bit)))
			continue;
		if (shorts[bit]) {
			if (!ref_str(&q, end, 1, shorts[bit]))
				return TAP_E_TRUNCATED;
		} else if (bit == 13) {
			if (!ref_str(&q, end, 4, &p->headers))
				return TAP_E_TRUNCATED;
			int rc = tap_table_validate(p->headers.ptr, p->headers.len);
			if (rc < 0)
				return rc;
		} else if (bit == 12 || bit == 11) {
			if (!ref_u(&q, end, 1, &v))
				return TAP_E_TRUNCATED;
			*(bit == 12 ? &p->delivery_mode : &p->priority) = (uint8_t)v;
		} else if (bit == 6 && !ref_u(&q, end, 8, &p->timestamp)) {
			return TAP_E_TRUNCATED;
		}
	}
	return TAP_OK;
}

static bool same_slice(struct tap_slice a, struct tap_slice b)
{
	return a.ptr == b.ptr && a.len == b.len;
}

static void assert_same_props(const struct tap_props *a, const struct tap_props *b, size_t len)
{
	ck_assert_msg(a->class_id == b->class_id && a->weight == b->weight && a->body_size == b->body_size &&
			      a->flags == b->flags && a->delivery_mode == b->delivery_mode &&
			      a->priority == b->priority && a->timestamp == b->timestamp,
		      "len %zu: scalar fields differ", len);
	ck_assert_msg(same_slice(a->content_type, b->content_type) && same_slice(a->content_encoding, b->content_encoding) &&
			      same_slice(a->headers, b->headers) && same_slice(a->correlation_id, b->correlation_id) &&
			      same_slice(a->reply_to, b->reply_to) && same_slice(a->expiration, b->expiration) &&
			      same_slice(a->message_id, b->message_id) && same_slice(a->type, b->type) &&
			      same_slice(a->user_id, b->user_id) && same_slice(a->app_id, b->app_id) &&
			      same_slice(a->cluster_id, b->cluster_id),
		      "len %zu: slices differ", len);
}

static unsigned rnd_state = 777;

static unsigned rnd(void)
{
	rnd_state = rnd_state * 1103515245u + 12345u;
	return rnd_state >> 8;
}

/* Random flag sets (sometimes with bit 1, continuation words, another class), random values (headers
 * sometimes a bad table), cut at every length and with bytes corrupted: the fast path and the header
 * table validated last give the reference's status and fields, absent and not-reached ones zero. */
START_TEST(fast_path_matches_reference)
{
	uint8_t b[600];
	struct tap_props got, want;
	for (unsigned round = 0; round < 3000; round++) {
		size_t n = 0;
		uint16_t flags = (uint16_t)(rnd() & 0xFFFC);
		if (round % 3 == 0)
			flags &= 0x9080 | (uint16_t)rnd();
		if (round % 17 == 0)
			flags |= 2;
		unsigned conts = round % 11 == 0 ? 1 + rnd() % 2 : 0;
		uint16_t class_id = round % 29 == 0 ? 50 : 60;
		n += head(b, class_id, rnd());
		b[2] = (uint8_t)rnd();
		b[3] = (uint8_t)rnd();
		b[n++] = (uint8_t)((flags | (conts ? 1 : 0)) >> 8);
		b[n++] = (uint8_t)(flags | (conts ? 1 : 0));
		for (unsigned k = 0; k < conts; k++) {
			uint16_t w = (uint16_t)(k + 1 < conts ? 1 : (round % 5 == 0 ? 0x0100 : 0));
			b[n++] = (uint8_t)(w >> 8);
			b[n++] = (uint8_t)w;
		}
		for (int bit = 15; bit >= 2; bit--) {
			if (!(flags & (1u << bit)))
				continue;
			if (bit == 13) {
				static const uint8_t good[] = {0, 0, 0, 7, 1, 'k', 'I', 0, 0, 0, 9};
				static const uint8_t bad[] = {0, 0, 0, 4, 1, 'k', '?', 0};
				const uint8_t *t = rnd() % 3 == 0 ? bad : good;
				size_t tl = t == bad ? sizeof bad : sizeof good;
				memcpy(b + n, t, tl);
				n += tl;
			} else if (bit == 12 || bit == 11) {
				b[n++] = (uint8_t)rnd();
			} else if (bit == 6) {
				for (unsigned k = 0; k < 8; k++)
					b[n++] = (uint8_t)rnd();
			} else {
				unsigned sl = rnd() % 20;
				b[n++] = (uint8_t)sl;
				for (unsigned k = 0; k < sl; k++)
					b[n++] = (uint8_t)('a' + rnd() % 26);
			}
		}
		if (round % 7 == 6 && n > 14)
			b[14 + rnd() % (n - 14)] ^= (uint8_t)(1 + rnd() % 255);
		for (size_t len = 0; len <= n; len++) {
			memset(&got, 0xA5, sizeof got);
			memset(&want, 0xA5, sizeof want);
			int rw = ref_props_decode(b, len, &want);
			int rg = tap_props_decode(b, len, &got);
			ck_assert_msg(rg == rw, "round %u len %zu: %d, reference %d", round, len, rg, rw);
			assert_same_props(&got, &want, len);
		}
	}
}
END_TEST

#ifdef TAP_HAVE_RABBITMQ
static amqp_table_entry_t hdr_entries[2];

static void full_props(amqp_basic_properties_t *bp)
{
	memset(bp, 0, sizeof *bp);
	hdr_entries[0] = (amqp_table_entry_t){amqp_cstring_bytes("x-retry"), {.kind = 'I', .value.i32 = 3}};
	hdr_entries[1] =
		(amqp_table_entry_t){amqp_cstring_bytes("trace"), {.kind = 'S', .value.bytes = amqp_cstring_bytes("abc")}};
	bp->_flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_CONTENT_ENCODING_FLAG | AMQP_BASIC_HEADERS_FLAG |
		     AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_PRIORITY_FLAG | AMQP_BASIC_CORRELATION_ID_FLAG |
		     AMQP_BASIC_REPLY_TO_FLAG | AMQP_BASIC_EXPIRATION_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
		     AMQP_BASIC_TIMESTAMP_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_USER_ID_FLAG | AMQP_BASIC_APP_ID_FLAG |
		     AMQP_BASIC_CLUSTER_ID_FLAG;
	bp->content_type = amqp_cstring_bytes("application/json");
	bp->content_encoding = amqp_cstring_bytes("gzip");
	bp->headers = (amqp_table_t){2, hdr_entries};
	bp->delivery_mode = 2;
	bp->priority = 9;
	bp->correlation_id = amqp_cstring_bytes("corr-1");
	bp->reply_to = amqp_cstring_bytes("amq.rabbitmq.reply-to");
	bp->expiration = amqp_cstring_bytes("60000");
	bp->message_id = amqp_cstring_bytes("id-42");
	bp->timestamp = 1700000000123ull;
	bp->type = amqp_cstring_bytes("order.created");
	bp->user_id = amqp_cstring_bytes("guest");
	bp->app_id = amqp_cstring_bytes("billing");
	bp->cluster_id = amqp_cstring_bytes("c1");
}

/* Every subset of the 14 properties (2^14 headers), encoded by rabbitmq-c. */
START_TEST(all_subsets_against_rabbitmq_c)
{
	static const amqp_flags_t rc_flags[14] = {
		AMQP_BASIC_CONTENT_TYPE_FLAG, AMQP_BASIC_CONTENT_ENCODING_FLAG, AMQP_BASIC_HEADERS_FLAG,
		AMQP_BASIC_DELIVERY_MODE_FLAG, AMQP_BASIC_PRIORITY_FLAG, AMQP_BASIC_CORRELATION_ID_FLAG,
		AMQP_BASIC_REPLY_TO_FLAG, AMQP_BASIC_EXPIRATION_FLAG, AMQP_BASIC_MESSAGE_ID_FLAG,
		AMQP_BASIC_TIMESTAMP_FLAG, AMQP_BASIC_TYPE_FLAG, AMQP_BASIC_USER_ID_FLAG, AMQP_BASIC_APP_ID_FLAG,
		AMQP_BASIC_CLUSTER_ID_FLAG};
	amqp_basic_properties_t all;
	full_props(&all);
	uint8_t b[1024];
	for (unsigned mask = 0; mask < (1u << 14); mask++) {
		amqp_basic_properties_t bp = all;
		bp._flags = 0;
		uint16_t want = 0;
		for (int i = 0; i < 14; i++)
			if (mask & (1u << i)) {
				bp._flags |= rc_flags[i];
				want |= (uint16_t)(1u << (15 - i));
			}
		size_t n = head(b, 60, mask * 1000ull);
		int enc = amqp_encode_properties(60, &bp, (amqp_bytes_t){sizeof b - n, b + n});
		ck_assert_int_ge(enc, 2);
		n += (size_t)enc;
		struct tap_props p;
		ck_assert_int_eq(tap_props_decode(b, n, &p), 0);
		ck_assert_uint_eq(p.flags, want);
		ck_assert_uint_eq(p.body_size, mask * 1000ull);
		if (want & TAP_PROP_CONTENT_TYPE)
			ck_assert(slice_is(p.content_type, "application/json"));
		if (want & TAP_PROP_CONTENT_ENCODING)
			ck_assert(slice_is(p.content_encoding, "gzip"));
		if (want & TAP_PROP_HEADERS) {
			struct tap_field f;
			ck_assert(tap_table_find(p.headers.ptr, p.headers.len, "x-retry", &f));
			ck_assert_int_eq(f.i, 3);
			ck_assert(tap_table_find(p.headers.ptr, p.headers.len, "trace", &f));
			ck_assert_mem_eq(f.ptr, "abc", 3);
		} else {
			ck_assert_uint_eq(p.headers.len, 0);
		}
		ck_assert_uint_eq(p.delivery_mode, (want & TAP_PROP_DELIVERY_MODE) ? 2 : 0);
		ck_assert_uint_eq(p.priority, (want & TAP_PROP_PRIORITY) ? 9 : 0);
		if (want & TAP_PROP_CORRELATION_ID)
			ck_assert(slice_is(p.correlation_id, "corr-1"));
		if (want & TAP_PROP_REPLY_TO)
			ck_assert(slice_is(p.reply_to, "amq.rabbitmq.reply-to"));
		if (want & TAP_PROP_EXPIRATION)
			ck_assert(slice_is(p.expiration, "60000"));
		if (want & TAP_PROP_MESSAGE_ID)
			ck_assert(slice_is(p.message_id, "id-42"));
		else
			ck_assert_uint_eq(p.message_id.len, 0);
		ck_assert_uint_eq(p.timestamp, (want & TAP_PROP_TIMESTAMP) ? 1700000000123ull : 0);
		if (want & TAP_PROP_TYPE)
			ck_assert(slice_is(p.type, "order.created"));
		if (want & TAP_PROP_USER_ID)
			ck_assert(slice_is(p.user_id, "guest"));
		if (want & TAP_PROP_APP_ID)
			ck_assert(slice_is(p.app_id, "billing"));
		if (want & TAP_PROP_CLUSTER_ID)
			ck_assert(slice_is(p.cluster_id, "c1"));
		if (mask == (1u << 14) - 1)
			for (size_t cut = 0; cut < n; cut++)
				ck_assert_msg(tap_props_decode(b, cut, &p) == TAP_E_TRUNCATED, "cut %zu", cut);
	}
}
END_TEST
#endif

int main(void)
{
	Suite *s = suite_create("props");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 60); /* every flag subset at every cut: about 4 s alone, more on a loaded machine */
	tcase_add_test(tc, minimal_and_malformed);
	tcase_add_test(tc, fast_path_matches_reference);
#ifdef TAP_HAVE_RABBITMQ
	tcase_add_test(tc, all_subsets_against_rabbitmq_c);
#endif
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
