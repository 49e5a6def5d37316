/* Message identity (src/DESIGN.md §4b): XXH3 from libxxhash, a well-kept fast non-cryptographic hash. An identity is
 * only as good as what it hashes: two messages a publisher means to be distinct but sends with the same exchange,
 * routing key, properties and body have one fingerprint (README, "Identity"). */
#include "amqptap/identity.h"

#include "rd.h"

#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* the state's size, for counting it; it is still made by XXH3_createState */
#include <xxhash.h>

/* Seeds that keep the two kinds (and each member of the head) apart: "id" and "fp" in ASCII, and a tag per field so
 * that ("ab", "") and ("a", "b") do not hash alike (the length goes in too). */
#define SEED_ID UINT64_C(0x6964)
#define SEED_FP UINT64_C(0x6670)

uint64_t tap_identity_of_id(const uint8_t *id, size_t len)
{
	return XXH3_64bits_withSeed(id, len, SEED_ID);
}

static uint64_t mix(uint64_t h, unsigned tag, struct tap_slice s)
{
	return XXH3_64bits_withSeed(s.ptr, s.len, h ^ ((uint64_t)tag << 56) ^ ((uint64_t)s.len << 8));
}

/* What precedes the body, laid out as tag, 4-byte length, bytes for each member, hashed in one call while it fits
 * the buffer (a typical publish's: one short hash instead of one per member); a longer member is mixed in alone. */
#define HEAD_BUF 512

struct head {
	uint8_t buf[HEAD_BUF];
	size_t len;
	uint64_t h;
};

static void head_put(struct head *hd, unsigned tag, struct tap_slice s)
{
	if (s.len > HEAD_BUF - 5) {
		hd->h = mix(hd->h, tag, s);
		return;
	}
	if (hd->len + 5 + s.len > HEAD_BUF) {
		hd->h = XXH3_64bits_withSeed(hd->buf, hd->len, hd->h);
		hd->len = 0;
	}
	uint8_t *p = hd->buf + hd->len;
	p[0] = (uint8_t)tag;
	p[1] = (uint8_t)(s.len >> 24);
	p[2] = (uint8_t)(s.len >> 16);
	p[3] = (uint8_t)(s.len >> 8);
	p[4] = (uint8_t)s.len;
	if (s.len)
		memcpy(p + 5, s.ptr, s.len);
	hd->len += 5 + s.len;
}

/* Exchange and routing key (short strings: 255 bytes each at most) as one string, the exchange's length in the
 * seed: hashed where they lie when they lie together (the decoder keeps them so), else copied together first. */
static uint64_t route_hash(struct tap_slice exchange, struct tap_slice routing_key)
{
	uint64_t seed = SEED_FP ^ ((uint64_t)exchange.len << 8);
	if (exchange.len > 255 || routing_key.len > 255)
		return mix(mix(seed, 1, exchange), 2, routing_key);
	if (!routing_key.len || exchange.ptr + exchange.len == routing_key.ptr)
		return XXH3_64bits_withSeed(exchange.ptr, exchange.len + routing_key.len, seed);
	uint8_t both[510];
	if (exchange.len)
		memcpy(both, exchange.ptr, exchange.len);
	memcpy(both + exchange.len, routing_key.ptr, routing_key.len);
	return XXH3_64bits_withSeed(both, exchange.len + routing_key.len, seed);
}

/* The field by field form, for a content header whose flags take more than one word (no client sends one). */
static uint64_t head_by_field(uint64_t seed, const struct tap_props *props)
{
	uint8_t fixed[2] = {props->delivery_mode, props->priority};
	struct head hd; /* not zeroed: only its first len bytes are read */
	hd.len = 0;
	hd.h = seed;
	head_put(&hd, 3, (struct tap_slice){fixed, sizeof fixed});
	const struct tap_slice *fields[] = {&props->content_type, &props->content_encoding, &props->headers,
	                                    &props->correlation_id, &props->reply_to, &props->expiration,
	                                    &props->message_id, &props->type, &props->user_id, &props->app_id,
	                                    &props->cluster_id};
	for (unsigned i = 0; i < sizeof fields / sizeof fields[0]; i++)
		if (fields[i]->len)
			head_put(&hd, 4 + i, *fields[i]);
	return XXH3_64bits_withSeed(hd.buf, hd.len, hd.h);
}

uint64_t tap_identity_head(struct tap_slice exchange, struct tap_slice routing_key, const uint8_t *payload,
                           size_t len, const struct tap_props *props)
{
	/* which properties are set goes in, timestamp's bit left out: a resend may stamp it anew */
	uint64_t h = route_hash(exchange, routing_key) ^ ((uint64_t)(props->flags & ~TAP_PROP_TIMESTAMP) << 40);
	if (len < TAP_PROPS_MIN_SIZE || (tap_be16(payload + 12) & TAP_PROP_CONTINUATION))
		return head_by_field(h, props);
	/* the property list as sent, in one or two pieces around the timestamp's 8 bytes: the timestamp ends where
	 * the first string property after it begins (its length octet), or with the payload */
	const uint8_t *list = payload + TAP_PROPS_MIN_SIZE, *end = payload + len;
	if (!(props->flags & TAP_PROP_TIMESTAMP))
		return XXH3_64bits_withSeed(list, (size_t)(end - list), h);
	const uint8_t *ts_end = (props->flags & TAP_PROP_TYPE)         ? props->type.ptr - 1
	                        : (props->flags & TAP_PROP_USER_ID)    ? props->user_id.ptr - 1
	                        : (props->flags & TAP_PROP_APP_ID)     ? props->app_id.ptr - 1
	                        : (props->flags & TAP_PROP_CLUSTER_ID) ? props->cluster_id.ptr - 1
	                                                               : end;
	if (ts_end - list < 8)
		return head_by_field(h, props); /* not where the decoder read it: never with a decoded header */
	h = XXH3_64bits_withSeed(list, (size_t)(ts_end - 8 - list), h);
	return XXH3_64bits_withSeed(ts_end, (size_t)(end - ts_end), h);
}

uint64_t tap_identity_body(uint64_t head, const uint8_t *body, size_t len)
{
	return XXH3_64bits_withSeed(body, len, head);
}

struct tap_identity_stream {
	XXH3_state_t *st;
};

size_t tap_identity_stream_size(void)
{
	return sizeof(struct tap_identity_stream) + sizeof(XXH3_state_t);
}

struct tap_identity_stream *tap_identity_stream_new(void)
{
	struct tap_identity_stream *s = malloc(sizeof *s);
	if (!s)
		return NULL;
	s->st = XXH3_createState();
	if (!s->st) {
		free(s);
		return NULL;
	}
	return s;
}

void tap_identity_stream_free(struct tap_identity_stream *s)
{
	if (!s)
		return;
	XXH3_freeState(s->st);
	free(s);
}

void tap_identity_stream_reset(struct tap_identity_stream *s, uint64_t head)
{
	(void)XXH3_64bits_reset_withSeed(s->st, head);
}

void tap_identity_stream_update(struct tap_identity_stream *s, const uint8_t *p, size_t len)
{
	if (len)
		(void)XXH3_64bits_update(s->st, p, len);
}

uint64_t tap_identity_stream_digest(const struct tap_identity_stream *s)
{
	return XXH3_64bits_digest(s->st);
}

/* Two hex digits per byte value, in one table: a record's identity is eight lookups. */
static const char hex2[256][2] = {
#define H4(x) {"0123456789abcdef"[(x) >> 4], "0123456789abcdef"[(x) & 15]}
#define R16(h) H4(h + 0), H4(h + 1), H4(h + 2), H4(h + 3), H4(h + 4), H4(h + 5), H4(h + 6), H4(h + 7), H4(h + 8), \
	H4(h + 9), H4(h + 10), H4(h + 11), H4(h + 12), H4(h + 13), H4(h + 14), H4(h + 15)
    R16(0x00), R16(0x10), R16(0x20), R16(0x30), R16(0x40), R16(0x50), R16(0x60), R16(0x70),
    R16(0x80), R16(0x90), R16(0xa0), R16(0xb0), R16(0xc0), R16(0xd0), R16(0xe0), R16(0xf0),
#undef R16
#undef H4
};

void tap_identity_format(char out[TAP_IDENTITY_TEXT_LEN + 1], enum tap_identity_kind kind, uint64_t h)
{
	memcpy(out, kind == TAP_IDENTITY_ID ? "id:" : "fp:", 3);
	for (int i = 7; i >= 0; i--, h >>= 8) /* lowest byte last */
		memcpy(out + 3 + 2 * i, hex2[h & 0xff], 2);
	out[TAP_IDENTITY_TEXT_LEN] = '\0';
}

bool tap_identity_parse(const char *s, size_t len, enum tap_identity_kind *kind, uint64_t *h)
{
	if (len != TAP_IDENTITY_TEXT_LEN || s[2] != ':')
		return false;
	if (!memcmp(s, "id", 2))
		*kind = TAP_IDENTITY_ID;
	else if (!memcmp(s, "fp", 2))
		*kind = TAP_IDENTITY_FINGERPRINT;
	else
		return false;
	uint64_t v = 0;
	for (size_t i = 3; i < len; i++) {
		char c = s[i];
		unsigned d;
		if (c >= '0' && c <= '9')
			d = (unsigned)(c - '0');
		else if (c >= 'a' && c <= 'f')
			d = (unsigned)(c - 'a' + 10);
		else
			return false;
		v = v << 4 | d;
	}
	*h = v;
	return true;
}

enum tap_identity_repeat tap_identity_classify(enum tap_track_route prev_route, enum tap_track_confirm prev_confirm)
{
	/* acked: the broker took it (a queue, or no queue when it was not mandatory: either way not for a resend) */
	if (prev_confirm == TAP_TRACK_CONFIRM_ACK || prev_route == TAP_TRACK_ROUTE_ROUTED)
		return TAP_REPEAT_DUPLICATE;
	if (prev_confirm == TAP_TRACK_CONFIRM_NACK || prev_confirm == TAP_TRACK_CONFIRM_UNKNOWN ||
	    prev_route == TAP_TRACK_ROUTE_UNKNOWN || prev_route == TAP_TRACK_ROUTE_RETURNED)
		return TAP_REPEAT_RESEND;
	return TAP_REPEAT_UNVERIFIED; /* unproven/none: a plain publish, nothing said what became of it */
}

const char *tap_identity_repeat_name(enum tap_identity_repeat r)
{
	switch (r) {
	case TAP_REPEAT_RESEND: return "resend";
	case TAP_REPEAT_DUPLICATE: return "duplicate";
	case TAP_REPEAT_UNVERIFIED: return "unverified";
	}
	return "unverified";
}

bool tap_identity_wants_resend(enum tap_track_confirm confirm, const char *reason_by)
{
	if (confirm != TAP_TRACK_CONFIRM_UNKNOWN)
		return false;
	return !reason_by || (strcmp(reason_by, "evicted") != 0 && strcmp(reason_by, "no_memory") != 0);
}
