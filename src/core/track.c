/* Publish/confirm/return correlation (DESIGN §3-§4, PROTOCOL §7-§11): per connection, lazily allocated channel
 * state holding a ring of outstanding publishes indexed by an internal slot number, a byte arena for their
 * strings and interned exchange/routing-key pairs; every publish ends in exactly one `publish` record. */
#include "amqptap/track.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- confirm latency histogram: log-linear, 8 sub-buckets per power of two (the midpoint it reports is within
 * 1/16 of any value in its bucket) ---- */

#define HIST_SUB_BITS 3
#define HIST_SUB (1u << HIST_SUB_BITS)
/* Latencies from 2^36 µs (19 hours) on share the last bucket (max stays exact): 2.2 KB per histogram. */
#define HIST_TOP_BITS 36
#define HIST_BUCKETS (HIST_SUB + (HIST_TOP_BITS - HIST_SUB_BITS) * HIST_SUB)

struct trk_hist {
	uint64_t n, max;
	uint64_t b[HIST_BUCKETS];
};

static unsigned hist_index(uint64_t v)
{
	if (v < HIST_SUB)
		return (unsigned)v;
	if (v >> HIST_TOP_BITS)
		return HIST_BUCKETS - 1;
	unsigned e = 63u - (unsigned)__builtin_clzll(v);
	unsigned sub = (unsigned)(v >> (e - HIST_SUB_BITS)) & (HIST_SUB - 1);
	return HIST_SUB + (e - HIST_SUB_BITS) * HIST_SUB + sub;
}

static uint64_t hist_value(unsigned idx)
{
	if (idx < HIST_SUB)
		return idx;
	unsigned e = (idx - HIST_SUB) / HIST_SUB + HIST_SUB_BITS;
	uint64_t sub = (idx - HIST_SUB) % HIST_SUB;
	uint64_t lo = (HIST_SUB + sub) << (e - HIST_SUB_BITS);
	uint64_t width = UINT64_C(1) << (e - HIST_SUB_BITS);
	return lo + width / 2;
}

static void hist_add(struct trk_hist *h, int64_t v)
{
	uint64_t u = v < 0 ? 0 : (uint64_t)v;
	h->b[hist_index(u)]++;
	h->n++;
	if (u > h->max)
		h->max = u;
}

static uint64_t hist_quantile(const struct trk_hist *h, double q)
{
	if (h->n == 0)
		return 0;
	if (q <= 0)
		q = 0;
	if (q >= 1)
		return h->max;
	uint64_t rank = (uint64_t)(q * (double)h->n);
	if ((double)rank < q * (double)h->n)
		rank++;
	if (rank == 0)
		rank = 1;
	uint64_t seen = 0;
	for (unsigned i = 0; i < HIST_BUCKETS; i++) {
		seen += h->b[i];
		if (seen >= rank) {
			uint64_t v = hist_value(i);
			return v > h->max || i == HIST_BUCKETS - 1 ? h->max : v;
		}
	}
	return h->max;
}

/* ---- per-connection intern table of (exchange, routing key) pairs and reply texts ---- */

enum { KEY_ROUTE = 0, KEY_TEXT = 1, KEY_EXTRA = 2 };

struct trk_key {
	uint8_t *data; /* a bytes then b bytes; NULL: slot free */
	uint32_t hash;
	uint32_t refs;
	uint16_t alen, blen;
	uint8_t kind;
};

struct trk_intern {
	struct trk_key *keys;
	uint32_t n_keys, cap_keys; /* slots used so far (live, dead or free) */
	uint32_t *free_ids;
	uint32_t n_free;
	uint32_t *index; /* open addressing, id + 1, 0 empty */
	uint32_t index_cap;
	uint32_t n_indexed; /* keys with data, refs or not */
	uint32_t n_dead;    /* keys with data and refs == 0 */
};

#define NO_KEY UINT32_MAX

/* Mixes len bytes into h eight at a time (every publish hashes its exchange,
 * routing key and property JSON: a byte-at-a-time hash showed in profiles). */
static uint64_t hash_bytes(uint64_t h, const uint8_t *p, size_t len)
{
	const uint64_t k = UINT64_C(0x9E3779B97F4A7C15);
	for (; len >= 8; p += 8, len -= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		h = (h ^ w) * k;
		h ^= h >> 32;
	}
	if (len) {
		uint64_t w = 0;
		memcpy(&w, p, len);
		h = (h ^ w ^ ((uint64_t)len << 56)) * k;
		h ^= h >> 32;
	}
	return h;
}

static uint32_t key_hash(uint8_t kind, const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
	uint64_t h = hash_bytes(((uint64_t)kind << 32) ^ alen, a, alen);
	h = hash_bytes(h ^ blen, b, blen);
	h = (h ^ (h >> 29)) * UINT64_C(0xBF58476D1CE4E5B9);
	uint32_t r = (uint32_t)(h ^ (h >> 32));
	return r ? r : 1;
}

static bool key_eq(const struct trk_key *k, uint32_t hash, uint8_t kind, const uint8_t *a, size_t alen,
                   const uint8_t *b, size_t blen)
{
	return k->data && k->hash == hash && k->kind == kind && k->alen == alen && k->blen == blen &&
	       (alen == 0 || memcmp(k->data, a, alen) == 0) && (blen == 0 || memcmp(k->data + alen, b, blen) == 0);
}

static bool intern_rehash(struct trk_intern *in, uint32_t cap)
{
	uint32_t *idx = calloc(cap, sizeof *idx);
	if (!idx)
		return false;
	for (uint32_t id = 0; id < in->n_keys; id++) {
		if (!in->keys[id].data)
			continue;
		uint32_t s = in->keys[id].hash & (cap - 1);
		while (idx[s])
			s = (s + 1) & (cap - 1);
		idx[s] = id + 1;
	}
	free(in->index);
	in->index = idx;
	in->index_cap = cap;
	return true;
}

static uint32_t intern_find(const struct trk_intern *in, uint32_t hash, uint8_t kind, const uint8_t *a, size_t alen,
                            const uint8_t *b, size_t blen)
{
	if (!in->index_cap)
		return NO_KEY;
	uint32_t s = hash & (in->index_cap - 1);
	while (in->index[s]) {
		uint32_t id = in->index[s] - 1;
		if (key_eq(&in->keys[id], hash, kind, a, alen, b, blen))
			return id;
		s = (s + 1) & (in->index_cap - 1);
	}
	return NO_KEY;
}

static uint32_t intern_lookup(const struct trk_intern *in, uint8_t kind, const uint8_t *a, size_t alen,
                              const uint8_t *b, size_t blen)
{
	return intern_find(in, key_hash(kind, a, alen, b, blen), kind, a, alen, b, blen);
}

/* Frees every unreferenced key and rebuilds the index; ids of referenced keys do not change. */
static void intern_sweep(struct trk_intern *in)
{
	for (uint32_t id = 0; id < in->n_keys; id++) {
		struct trk_key *k = &in->keys[id];
		if (k->data && k->refs == 0) {
			free(k->data);
			k->data = NULL;
			in->free_ids[in->n_free++] = id;
			in->n_indexed--;
		}
	}
	in->n_dead = 0;
	if (!intern_rehash(in, in->index_cap)) {
		/* keep the old index: dead slots point at keys with data == NULL, which never compare equal */
	}
}

/* Returns the id with one more reference, or NO_KEY when out of memory. Strings longer than 65535 are cut. */
static uint32_t intern_get(struct trk_intern *in, uint8_t kind, const uint8_t *a, size_t alen, const uint8_t *b,
                           size_t blen)
{
	if (alen > UINT16_MAX)
		alen = UINT16_MAX;
	if (blen > UINT16_MAX)
		blen = UINT16_MAX;
	uint32_t hash = key_hash(kind, a, alen, b, blen);
	uint32_t id = intern_find(in, hash, kind, a, alen, b, blen);
	if (id != NO_KEY) {
		if (in->keys[id].refs++ == 0)
			in->n_dead--;
		return id;
	}
	if ((uint64_t)(in->n_indexed + 1) * 2 > in->index_cap) {
		uint32_t cap = in->index_cap ? in->index_cap * 2 : 64;
		if (!intern_rehash(in, cap))
			return NO_KEY;
	}
	if (in->n_free == 0 && in->n_keys == in->cap_keys) {
		uint32_t cap = in->cap_keys ? in->cap_keys * 2 : 32;
		struct trk_key *k = realloc(in->keys, cap * sizeof *k);
		if (!k)
			return NO_KEY;
		in->keys = k;
		uint32_t *f = realloc(in->free_ids, cap * sizeof *f);
		if (!f)
			return NO_KEY;
		in->free_ids = f;
		in->cap_keys = cap;
	}
	uint8_t *data = malloc(alen + blen + 1);
	if (!data)
		return NO_KEY;
	if (alen)
		memcpy(data, a, alen);
	if (blen)
		memcpy(data + alen, b, blen);
	id = in->n_free ? in->free_ids[--in->n_free] : in->n_keys++;
	struct trk_key *k = &in->keys[id];
	*k = (struct trk_key){
	    .data = data, .hash = hash, .refs = 1, .alen = (uint16_t)alen, .blen = (uint16_t)blen, .kind = kind};
	uint32_t s = hash & (in->index_cap - 1);
	while (in->index[s])
		s = (s + 1) & (in->index_cap - 1);
	in->index[s] = id + 1;
	in->n_indexed++;
	return id;
}

/* Unreferenced keys stay cached (a recurring routing key costs no allocation) until they outnumber the live
 * ones, then one sweep frees them all: amortized O(1). */
static void intern_put(struct trk_intern *in, uint32_t id)
{
	if (id == NO_KEY)
		return;
	if (--in->keys[id].refs == 0) {
		in->n_dead++;
		if (in->n_dead > 256 && in->n_dead > in->n_indexed - in->n_dead)
			intern_sweep(in);
	}
}

static void intern_deinit(struct trk_intern *in)
{
	for (uint32_t id = 0; id < in->n_keys; id++)
		free(in->keys[id].data);
	free(in->keys);
	free(in->free_ids);
	free(in->index);
	memset(in, 0, sizeof *in);
}

/* ---- per-channel FIFO byte arena for the strings of outstanding publishes ----
 *
 *   logical offsets:  head ........ tail    (live bytes; a blob never straddles the physical end, the gap
 *   physical:         off & (cap - 1)        before a wrap is padding and is released with its successor)
 *
 * Blobs are allocated in publish order and released when the ring head moves past them, so releasing is
 * just moving head to the blob offset of the oldest live publish. */

struct trk_arena {
	uint8_t *buf;
	uint64_t cap; /* power of two or 0 */
	uint64_t head, tail;
};

static bool arena_grow(struct trk_arena *a, uint64_t need)
{
	uint64_t cap = a->cap ? a->cap : 1024;
	while (cap < need)
		cap *= 2;
	if (cap == a->cap)
		return true;
	uint8_t *nb = malloc(cap);
	if (!nb)
		return false;
	for (uint64_t off = a->head; off < a->tail;) {
		uint64_t p = off & (a->cap - 1);
		uint64_t run = a->cap - p;
		if (run > a->tail - off)
			run = a->tail - off;
		uint64_t q = off & (cap - 1);
		uint64_t qrun = cap - q;
		if (run > qrun)
			run = qrun;
		memcpy(nb + q, a->buf + p, run);
		off += run;
	}
	free(a->buf);
	a->buf = nb;
	a->cap = cap;
	return true;
}

/* Reserves n contiguous bytes; returns the logical offset, or UINT64_MAX when out of memory. */
static uint64_t arena_alloc(struct trk_arena *a, uint64_t n)
{
	if (n == 0)
		return a->tail;
	for (;;) {
		uint64_t start = a->tail;
		if (a->cap) {
			uint64_t p = start & (a->cap - 1);
			if (p + n > a->cap)
				start += a->cap - p;
			if (start + n - a->head <= a->cap) {
				a->tail = start + n;
				return start;
			}
		}
		/* growing keeps offsets; room for n more covers the padding before a wrap */
		if (!arena_grow(a, a->tail - a->head + 2 * n))
			return UINT64_MAX;
	}
}

static uint8_t *arena_ptr(const struct trk_arena *a, uint64_t off)
{
	return a->buf + (off & (a->cap - 1));
}

/* ---- state ---- */

enum trk_state { PUB_DONE = 0, PUB_WAIT = 1, PUB_HELD = 2 };

enum {
	PF_MANDATORY = 1 << 0,
	PF_CONFIRM = 1 << 1,
	PF_TX = 1 << 2,
	PF_HAS_MID = 1 << 3,
	PF_HAS_CID = 1 << 4,
	PF_HAS_DM = 1 << 5,
	PF_RETURNED = 1 << 6,
	PF_MULTIPLE = 1 << 7,
	PF_NACK = 1 << 8,
	PF_BLOB_OOM = 1 << 9,
	PF_HAS_TS = 1 << 10,
};

/* One outstanding publish (64 bytes). Its blob in the channel arena: [timestamp, 8 bytes, when present] then
 * message_id then correlation_id. Repeating strings are interned per connection. */
struct trk_pub {
	int64_t t_pub, t_ret, t_ack;
	uint64_t body_size;
	uint64_t blob;
	uint32_t key;   /* KEY_ROUTE id */
	uint32_t reply; /* KEY_TEXT id of the Return's reply text */
	uint32_t extra; /* KEY_EXTRA id of the pre-rendered optional members, or NO_KEY */
	uint16_t reply_code;
	uint16_t flags;
	uint8_t mid_len, cid_len;
	uint8_t state;
	uint8_t delivery_mode;
};
_Static_assert(sizeof(struct trk_pub) == 64, "keep outstanding publishes compact");

struct trk_fifo {
	uint64_t *v;
	uint32_t cap, head, len; /* cap power of two */
};

enum trk_mode { MODE_NONE = 0, MODE_CONFIRM = 1, MODE_TX = 2 };

struct trk_reason {
	const char *by; /* "broker", "client", "eof", ...; NULL: none */
	bool settled;   /* the broker answered everything before this end (close-ok to the client's close,
			   tx.commit-ok): a publish still waiting for a Return got none */
	bool has_code;
	uint16_t code;
	const uint8_t *text;
	size_t text_len;
};

struct trk_chan {
	uint16_t id;
	uint8_t mode;
	bool closing, close_by_broker, warned_cwm, warned_abr;
	uint16_t close_code;
	char *close_text;
	size_t close_text_len;
	uint64_t sel_off; /* slot n of confirm seq s is s + sel_off */
	/* ring of slots [base, next): slot n at ring[n & (cap - 1)]; the slot at base is always live */
	struct trk_pub *ring;
	uint64_t cap, base, next;
	uint64_t live;
	struct trk_arena arena;
	struct trk_fifo held_q; /* slots acked and held, in ack order */
	struct trk_fifo win_q;  /* non-confirm mandatory slots, in publish order */
	int32_t active_idx;     /* index in conn->active or -1 */
};

struct trk_counts {
	uint64_t publishes, routed, returned, unproven, unknown, acked, nacked;
};

struct tap_track_conn {
	struct tap_track *t;
	struct tap_track_conn *prev, *next;
	uint64_t id;
	char *client, *upstream, *user, *vhost, *product, *version, *platform;
	uint16_t channel_max, heartbeat;
	uint32_t frame_max;
	bool tuned, opened, blocked;
	int64_t blocked_since, t_new;
	bool closed, close_by_broker;
	bool settled; /* the broker's close-ok answered the client's connection.close */
	char *end_detail; /* why the TCP/TLS connection failed, when no close method says it */
	uint16_t close_code;
	char *close_text;
	size_t close_text_len;
	struct trk_chan **chans; /* sorted by id: a connection has a few, usually one */
	uint32_t n_chans, cap_chans;
	struct trk_chan **active;
	uint32_t n_active, cap_active;
	uint64_t outstanding;
	struct trk_intern keys;
	struct trk_counts counts;
	struct trk_hist *hist; /* allocated at the first confirm: most of a connection's memory otherwise */
	struct tap_buf prefix; /* "conn":..,"client":..,"vhost":..,"user":.. of publish records; empty: stale */
};

struct tap_track {
	struct tap_track_conf conf;
	tap_track_emit_fn emit;
	void *ctx;
	struct tap_track_conn *conns;
	struct tap_buf rec, scratch;
	struct tap_track_stats st;
	struct trk_counts closed_counts; /* of connections already ended */
	struct trk_hist hist;
	int64_t ts_sec; /* second of ts_str, INT64_MIN: none */
	char ts_str[32];
};

/* ---- small helpers ---- */

static char *dup_slice(struct tap_slice s)
{
	char *p = malloc(s.len + 1);
	if (!p)
		return NULL;
	if (s.len)
		memcpy(p, s.ptr, s.len);
	p[s.len] = '\0';
	return p;
}

static void set_str(char **dst, struct tap_slice s)
{
	free(*dst);
	*dst = dup_slice(s);
}

static void set_cstr(char **dst, const char *s)
{
	free(*dst);
	*dst = s ? strdup(s) : NULL;
}

static bool fifo_push(struct trk_fifo *f, uint64_t v)
{
	if (f->len == f->cap) {
		uint32_t cap = f->cap ? f->cap * 2 : 64;
		uint64_t *nv = malloc((size_t)cap * sizeof *nv);
		if (!nv)
			return false;
		for (uint32_t i = 0; i < f->len; i++)
			nv[i] = f->v[(f->head + i) & (f->cap - 1)];
		free(f->v);
		f->v = nv;
		f->cap = cap;
		f->head = 0;
	}
	f->v[(f->head + f->len) & (f->cap - 1)] = v;
	f->len++;
	return true;
}

static uint64_t fifo_front(const struct trk_fifo *f)
{
	return f->v[f->head];
}

static void fifo_pop(struct trk_fifo *f)
{
	f->head = (f->head + 1) & (f->cap - 1);
	f->len--;
}

static struct trk_pub *slot(const struct trk_chan *ch, uint64_t n)
{
	return &ch->ring[n & (ch->cap - 1)];
}

static void str_or_null(struct tap_json *j, const char *key, const char *s)
{
	if (s)
		tap_json_kv_str(j, key, s);
	else
		tap_json_kv_null(j, key);
}

/* Integers and timestamps are formatted here rather than through printf: they are most of a publish record. */
/* "ts" as tap_json_kv_ts writes it; the date part is formatted once per second. */
static void kv_ts(struct tap_track *t, struct tap_json *j, int64_t now_us)
{
	int64_t sec = now_us / 1000000, us = now_us % 1000000;
	if (us < 0) {
		us += 1000000;
		sec--;
	}
	if (sec != t->ts_sec) {
		tap_format_ts(t->ts_str, sec * 1000000);
		t->ts_sec = sec;
	}
	char q[34];
	size_t len = strlen(t->ts_str);
	if (len != 27 || t->ts_str[19] != '.') {
		tap_json_kv_ts(j, "ts", now_us);
		return;
	}
	q[0] = '"';
	memcpy(q + 1, t->ts_str, len);
	for (int i = 6; i > 0; i--, us /= 10)
		q[20 + i] = (char)('0' + us % 10);
	q[len + 1] = '"';
	tap_json_key(j, "ts");
	tap_json_raw(j, q, len + 2);
}

static void rec_begin(struct tap_track *t, struct tap_json *j, const char *type, int64_t now_us)
{
	tap_buf_reset(&t->rec);
	tap_json_init(j, &t->rec);
	tap_json_obj_begin(j);
	tap_json_kv_str(j, "type", type);
	kv_ts(t, j, now_us);
}

static void rec_end(struct tap_track *t, struct tap_json *j)
{
	tap_json_obj_end(j);
	t->st.records++;
	if (t->rec.oom) {
		t->st.oom++;
		return;
	}
	t->emit(t->ctx, t->rec.data, t->rec.len);
}

static void write_reason(struct tap_json *j, const struct trk_reason *r)
{
	tap_json_key(j, "reason");
	tap_json_obj_begin(j);
	tap_json_kv_str(j, "by", r->by);
	if (r->has_code)
		tap_json_kv_uint(j, "code", r->code);
	if (r->text && r->text_len)
		tap_json_kv_strn(j, "text", r->text, r->text_len);
	tap_json_obj_end(j);
}

static void write_warning(struct tap_track_conn *c, uint16_t ch, const char *rule, bool has_seq, uint64_t seq,
                          int64_t now_us)
{
	struct tap_track *t = c->t;
	struct tap_json j;
	rec_begin(t, &j, "warning", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	tap_json_kv_uint(&j, "channel", ch);
	tap_json_kv_str(&j, "rule", rule);
	if (has_seq)
		tap_json_kv_uint(&j, "seq", seq);
	rec_end(t, &j);
	t->st.warnings++;
}

/* ---- the publish record ---- */

enum trk_route { ROUTE_ROUTED, ROUTE_RETURNED, ROUTE_UNPROVEN, ROUTE_UNKNOWN };
enum trk_confirm { CONF_ACK, CONF_NACK, CONF_NONE, CONF_UNKNOWN };
static const char *const route_names[] = {"routed", "returned", "unproven", "unknown"};
static const char *const confirm_names[] = {"ack", "nack", "none", "unknown"};

/* What a publish record is written from: a stored slot or the caller's tap_publish. */
struct trk_view {
	const uint8_t *x, *rk, *mid, *cid, *extra;
	size_t xlen, rklen, mid_len, cid_len, extra_len;
	bool mandatory, has_mid, has_cid, has_dm, has_ts, confirm_mode, tx;
	uint8_t dm;
	uint64_t body_size, seq, timestamp;
	int64_t t_pub;
};

struct trk_verdict {
	enum trk_route route;
	enum trk_confirm confirm;
	bool multiple, ack_before_return;
	int64_t t_ack, t_ret; /* valid for ack/nack, returned */
	uint16_t reply_code;
	const uint8_t *reply_text;
	size_t reply_text_len;
	const struct trk_reason *reason;
};

static void write_publish(struct tap_track_conn *c, uint16_t ch, const struct trk_view *v, const struct trk_verdict *vd,
                          int64_t now_us)
{
	struct tap_track *t = c->t;
	struct tap_json j;
	rec_begin(t, &j, "publish", now_us);
	if (!c->prefix.len) {
		struct tap_json pj;
		tap_json_init(&pj, &c->prefix);
		tap_json_obj_begin(&pj);
		tap_json_kv_uint(&pj, "conn", c->id);
		str_or_null(&pj, "client", c->client);
		str_or_null(&pj, "vhost", c->vhost);
		str_or_null(&pj, "user", c->user);
	}
	if (c->prefix.len > 1 && !c->prefix.oom)
		tap_json_raw(&j, c->prefix.data + 1, c->prefix.len - 1);
	tap_json_kv_uint(&j, "channel", ch);
	if (v->confirm_mode)
		tap_json_kv_uint(&j, "seq", v->seq);
	else
		tap_json_kv_null(&j, "seq");
	tap_json_kv_strn(&j, "exchange", v->x, v->xlen);
	tap_json_kv_strn(&j, "routing_key", v->rk, v->rklen);
	tap_json_kv_bool(&j, "mandatory", v->mandatory);
	if (v->has_mid)
		tap_json_kv_strn(&j, "message_id", v->mid, v->mid_len);
	else
		tap_json_kv_null(&j, "message_id");
	if (v->has_cid)
		tap_json_kv_strn(&j, "correlation_id", v->cid, v->cid_len);
	else
		tap_json_kv_null(&j, "correlation_id");
	if (v->has_dm)
		tap_json_kv_uint(&j, "delivery_mode", v->dm);
	else
		tap_json_kv_null(&j, "delivery_mode");
	if (v->extra_len)
		tap_json_raw(&j, (const char *)v->extra, v->extra_len);
	if (v->has_ts)
		tap_json_kv_uint(&j, "timestamp", v->timestamp);
	tap_json_kv_uint(&j, "body_size", v->body_size);
	tap_json_kv_str(&j, "route", route_names[vd->route]);
	if (vd->route == ROUTE_RETURNED) {
		tap_json_kv_uint(&j, "reply_code", vd->reply_code);
		tap_json_kv_strn(&j, "reply_text", vd->reply_text, vd->reply_text_len);
		tap_json_kv_int(&j, "return_us", vd->t_ret - v->t_pub);
	}
	tap_json_kv_str(&j, "confirm", confirm_names[vd->confirm]);
	if (vd->confirm == CONF_ACK || vd->confirm == CONF_NACK) {
		tap_json_kv_int(&j, "confirm_us", vd->t_ack - v->t_pub);
		tap_json_kv_bool(&j, "multiple", vd->multiple);
	}
	if (vd->route == ROUTE_RETURNED && (vd->confirm == CONF_ACK || vd->confirm == CONF_NACK))
		tap_json_kv_str(&j, "order", vd->ack_before_return ? "ack_before_return" : "return_before_ack");
	else
		tap_json_kv_null(&j, "order");
	if (vd->reason)
		write_reason(&j, vd->reason);
	if (v->tx)
		tap_json_kv_bool(&j, "tx", true);
	rec_end(t, &j);

	t->st.publish_records++;
	struct trk_counts *k = &c->counts;
	switch (vd->route) {
	case ROUTE_ROUTED:
		k->routed++;
		t->st.routed++;
		break;
	case ROUTE_RETURNED:
		k->returned++;
		t->st.returned++;
		break;
	case ROUTE_UNPROVEN:
		k->unproven++;
		t->st.unproven++;
		break;
	case ROUTE_UNKNOWN:
		k->unknown++;
		t->st.unknown++;
		break;
	}
	switch (vd->confirm) {
	case CONF_ACK:
	case CONF_NACK:
		if (vd->confirm == CONF_ACK) {
			k->acked++;
			t->st.acked++;
		} else {
			k->nacked++;
			t->st.nacked++;
		}
		if (c->hist || (c->hist = calloc(1, sizeof *c->hist)) != NULL)
			hist_add(c->hist, vd->t_ack - v->t_pub);
		hist_add(&t->hist, vd->t_ack - v->t_pub);
		break;
	case CONF_NONE:
		t->st.confirm_none++;
		break;
	case CONF_UNKNOWN:
		t->st.confirm_unknown++;
		break;
	}
}

/* Optional members rendered once at publish time: content_type, message_type (the AMQP `type` property; the
 * record's own "type" key is taken), app_id, headers (the keys of the headers table). */
static void render_extra(struct tap_buf *b, const struct tap_publish *p)
{
	struct tap_json j;
	tap_buf_reset(b);
	tap_json_init(&j, b);
	tap_json_obj_begin(&j); /* written so commas are tracked; the brace is cut off below */
	if (p->content_type.len)
		tap_json_kv_strn(&j, "content_type", p->content_type.ptr, p->content_type.len);
	if (p->type.len)
		tap_json_kv_strn(&j, "message_type", p->type.ptr, p->type.len);
	if (p->app_id.len)
		tap_json_kv_strn(&j, "app_id", p->app_id.ptr, p->app_id.len);
	if (p->n_header_keys) {
		tap_json_key(&j, "headers");
		tap_json_arr_begin(&j);
		for (size_t i = 0; i < p->n_header_keys; i++)
			tap_json_strn(&j, p->header_keys[i].ptr, p->header_keys[i].len);
		tap_json_arr_end(&j);
	}
	/* drop the leading '{' */
	if (b->len > 1)
		memmove(b->data, b->data + 1, b->len - 1);
	b->len = b->len ? b->len - 1 : 0;
}

static void view_of_publish(struct trk_view *v, const struct tap_publish *p, const struct tap_buf *extra)
{
	*v = (struct trk_view){
	    .x = p->exchange.ptr,
	    .xlen = p->exchange.len,
	    .rk = p->routing_key.ptr,
	    .rklen = p->routing_key.len,
	    .mid = p->message_id.ptr,
	    .mid_len = p->message_id.len,
	    .cid = p->correlation_id.ptr,
	    .cid_len = p->correlation_id.len,
	    .extra = (const uint8_t *)extra->data,
	    .extra_len = extra->len,
	    .mandatory = p->mandatory,
	    .has_mid = p->has_message_id,
	    .has_cid = p->has_correlation_id,
	    .has_dm = p->has_delivery_mode,
	    .has_ts = p->has_timestamp,
	    .dm = p->delivery_mode,
	    .body_size = p->body_size,
	    .timestamp = p->timestamp,
	};
}

static void view_of_slot(struct trk_view *v, struct tap_track_conn *c, struct trk_chan *ch, uint64_t n)
{
	const struct trk_pub *e = slot(ch, n);
	const struct trk_key *k = e->key != NO_KEY ? &c->keys.keys[e->key] : NULL;
	const struct trk_key *x = e->extra != NO_KEY ? &c->keys.keys[e->extra] : NULL;
	const uint8_t *blob = (e->flags & PF_BLOB_OOM) || !ch->arena.cap ? NULL : arena_ptr(&ch->arena, e->blob);
	uint64_t ts = 0;
	if (blob && (e->flags & PF_HAS_TS)) {
		memcpy(&ts, blob, sizeof ts);
		blob += sizeof ts;
	}
	*v = (struct trk_view){
	    .x = k ? k->data : NULL,
	    .xlen = k ? k->alen : 0,
	    .rk = k ? k->data + k->alen : NULL,
	    .rklen = k ? k->blen : 0,
	    .mid = blob,
	    .mid_len = blob ? e->mid_len : 0,
	    .cid = blob ? blob + e->mid_len : NULL,
	    .cid_len = blob ? e->cid_len : 0,
	    .extra = x ? x->data : NULL,
	    .extra_len = x ? x->alen : 0,
	    .mandatory = e->flags & PF_MANDATORY,
	    .has_mid = e->flags & PF_HAS_MID,
	    .has_cid = e->flags & PF_HAS_CID,
	    .has_dm = e->flags & PF_HAS_DM,
	    .has_ts = blob && (e->flags & PF_HAS_TS),
	    .timestamp = ts,
	    .confirm_mode = e->flags & PF_CONFIRM,
	    .tx = e->flags & PF_TX,
	    .dm = e->delivery_mode,
	    .body_size = e->body_size,
	    .seq = n - ch->sel_off,
	    .t_pub = e->t_pub,
	};
}

/* ---- channels ---- */

/* Where channel id is in c->chans, or where it would go. */
static uint32_t chan_pos(const struct tap_track_conn *c, uint16_t id)
{
	uint32_t lo = 0, hi = c->n_chans;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (c->chans[mid]->id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static struct trk_chan *chan_find(const struct tap_track_conn *c, uint16_t id)
{
	uint32_t i = chan_pos(c, id);
	return i < c->n_chans && c->chans[i]->id == id ? c->chans[i] : NULL;
}

static struct trk_chan *chan_get(struct tap_track_conn *c, uint16_t id)
{
	uint32_t i = chan_pos(c, id);
	if (i < c->n_chans && c->chans[i]->id == id)
		return c->chans[i];
	if (c->n_chans == c->cap_chans) {
		uint32_t cap = c->cap_chans ? c->cap_chans * 2 : 4;
		struct trk_chan **a = realloc(c->chans, cap * sizeof *a);
		if (!a)
			return NULL;
		c->chans = a;
		c->cap_chans = cap;
	}
	struct trk_chan *ch = calloc(1, sizeof *ch);
	if (!ch)
		return NULL;
	ch->id = id;
	ch->base = ch->next = 1;
	ch->active_idx = -1;
	memmove(&c->chans[i + 1], &c->chans[i], (c->n_chans - i) * sizeof *c->chans);
	c->chans[i] = ch;
	c->n_chans++;
	return ch;
}

static void chan_free(struct tap_track_conn *c, struct trk_chan *ch)
{
	uint32_t i = chan_pos(c, ch->id);
	memmove(&c->chans[i], &c->chans[i + 1], (c->n_chans - i - 1) * sizeof *c->chans);
	c->n_chans--;
	free(ch->close_text);
	free(ch->ring);
	free(ch->arena.buf);
	free(ch->held_q.v);
	free(ch->win_q.v);
	free(ch);
}

static void active_add(struct tap_track_conn *c, struct trk_chan *ch)
{
	if (ch->active_idx >= 0)
		return;
	if (c->n_active == c->cap_active) {
		uint32_t cap = c->cap_active ? c->cap_active * 2 : 8;
		struct trk_chan **a = realloc(c->active, cap * sizeof *a);
		if (!a)
			return; /* not in the list: tick and eviction do not see it, its end still writes it */
		c->active = a;
		c->cap_active = cap;
	}
	ch->active_idx = (int32_t)c->n_active;
	c->active[c->n_active++] = ch;
}

static void active_remove(struct tap_track_conn *c, struct trk_chan *ch)
{
	if (ch->active_idx < 0)
		return;
	struct trk_chan *last = c->active[--c->n_active];
	c->active[ch->active_idx] = last;
	last->active_idx = ch->active_idx;
	ch->active_idx = -1;
}

static bool ring_reserve(struct trk_chan *ch)
{
	if (ch->next - ch->base < ch->cap)
		return true;
	uint64_t cap = ch->cap ? ch->cap * 2 : 16;
	struct trk_pub *r = malloc(cap * sizeof *r);
	if (!r)
		return false;
	for (uint64_t n = ch->base; n < ch->next; n++)
		r[n & (cap - 1)] = ch->ring[n & (ch->cap - 1)];
	free(ch->ring);
	ch->ring = r;
	ch->cap = cap;
	return true;
}

/* The slot's record has been written (or is being dropped): release what it holds, move the head. */
static void slot_done(struct tap_track_conn *c, struct trk_chan *ch, uint64_t n)
{
	struct trk_pub *e = slot(ch, n);
	if (e->state == PUB_HELD)
		c->t->st.held--;
	e->state = PUB_DONE;
	intern_put(&c->keys, e->key);
	intern_put(&c->keys, e->extra);
	if (e->flags & PF_RETURNED)
		intern_put(&c->keys, e->reply);
	ch->live--;
	c->outstanding--;
	c->t->st.outstanding--;
	while (ch->base < ch->next && slot(ch, ch->base)->state == PUB_DONE)
		ch->base++;
	if (ch->base == ch->next) {
		ch->arena.head = ch->arena.tail;
		ch->held_q.len = ch->win_q.len = 0;
		active_remove(c, ch);
	} else {
		const struct trk_pub *h = slot(ch, ch->base);
		if (!(h->flags & PF_BLOB_OOM))
			ch->arena.head = h->blob;
	}
}

static void reply_of_slot(const struct tap_track_conn *c, const struct trk_pub *e, struct trk_verdict *vd)
{
	vd->t_ret = e->t_ret;
	vd->reply_code = e->reply_code;
	if (e->reply != NO_KEY) {
		vd->reply_text = c->keys.keys[e->reply].data;
		vd->reply_text_len = c->keys.keys[e->reply].alen;
	}
}

/* Writes the record of slot n and releases it. For a slot still waiting, `reason` says why it ends now. */
static void slot_finish(struct tap_track_conn *c, struct trk_chan *ch, uint64_t n, const struct trk_reason *reason,
                        int64_t now_us)
{
	struct trk_pub *e = slot(ch, n);
	struct trk_view v;
	struct trk_verdict vd = {.t_ack = e->t_ack, .multiple = e->flags & PF_MULTIPLE};
	view_of_slot(&v, c, ch, n);
	if (e->flags & PF_RETURNED)
		reply_of_slot(c, e, &vd);
	if (e->state == PUB_HELD) {
		vd.route = (e->flags & PF_RETURNED) ? ROUTE_RETURNED : ROUTE_ROUTED;
		vd.confirm = CONF_ACK;
	} else if (e->flags & PF_RETURNED) {
		vd.route = ROUTE_RETURNED;
		vd.confirm = (e->flags & PF_CONFIRM) ? CONF_UNKNOWN : CONF_NONE;
		if (vd.confirm == CONF_UNKNOWN)
			vd.reason = reason;
	} else if (reason && reason->settled && !(e->flags & PF_CONFIRM)) {
		vd.route = ROUTE_UNPROVEN; /* its return window closed early: no Return came */
		vd.confirm = CONF_NONE;
	} else {
		vd.route = ROUTE_UNKNOWN;
		vd.confirm = (e->flags & PF_CONFIRM) ? CONF_UNKNOWN : CONF_NONE;
		vd.reason = reason;
	}
	write_publish(c, ch->id, &v, &vd, now_us);
	slot_done(c, ch, n);
}

/* The "by", "code" and "text" of a channel or connection close record. */
static void write_close_reason(struct tap_json *j, const struct trk_reason *r)
{
	tap_json_kv_str(j, "by", r->by);
	if (r->has_code)
		tap_json_kv_uint(j, "code", r->code);
	else
		tap_json_kv_null(j, "code");
	if (r->text)
		tap_json_kv_strn(j, "text", r->text, r->text_len);
	else
		tap_json_kv_null(j, "text");
}

static void chan_reason(const struct trk_chan *ch, struct trk_reason *r)
{
	*r = (struct trk_reason){.by = ch->close_by_broker ? "broker" : "client",
	                         .has_code = true,
	                         .code = ch->close_code,
	                         .text = (const uint8_t *)ch->close_text,
	                         .text_len = ch->close_text_len};
}

static void conn_reason(const struct tap_track_conn *c, const char *reason_by, struct trk_reason *r)
{
	if (c->closed)
		*r = (struct trk_reason){.by = c->close_by_broker ? "broker" : "client",
		                         .has_code = true,
		                         .code = c->close_code,
		                         .text = (const uint8_t *)c->close_text,
		                         .text_len = c->close_text_len};
	else
		*r = (struct trk_reason){.by = reason_by ? reason_by : "eof",
		                         .text = (const uint8_t *)c->end_detail,
		                         .text_len = c->end_detail ? strlen(c->end_detail) : 0};
}

/* Ends every outstanding publish of the channel, writes its close record and frees it. */
static void chan_end(struct tap_track_conn *c, struct trk_chan *ch, const struct trk_reason *fallback, int64_t now_us)
{
	struct trk_reason r;
	if (ch->closing) {
		chan_reason(ch, &r);
		r.settled = fallback->settled;
	} else {
		r = *fallback;
	}
	uint64_t unconfirmed = 0;
	for (uint64_t n = ch->base; n < ch->next; n++) {
		struct trk_pub *e = slot(ch, n);
		if (e->state == PUB_DONE)
			continue;
		if (e->state == PUB_WAIT && (e->flags & PF_CONFIRM))
			unconfirmed++;
		slot_finish(c, ch, n, &r, now_us);
	}
	struct tap_track *t = c->t;
	struct tap_json j;
	rec_begin(t, &j, "channel", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	tap_json_kv_uint(&j, "channel", ch->id);
	tap_json_kv_str(&j, "event", "close");
	write_close_reason(&j, &r);
	tap_json_kv_uint(&j, "unconfirmed", unconfirmed);
	rec_end(t, &j);
	active_remove(c, ch);
	chan_free(c, ch);
}

static void chan_event(struct tap_track_conn *c, uint16_t ch, const char *event, int64_t now_us)
{
	struct tap_track *t = c->t;
	struct tap_json j;
	rec_begin(t, &j, "channel", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	tap_json_kv_uint(&j, "channel", ch);
	tap_json_kv_str(&j, "event", event);
	rec_end(t, &j);
}

/* ---- connections ---- */

struct tap_track *tap_track_new(const struct tap_track_conf *conf, tap_track_emit_fn emit, void *ctx)
{
	struct tap_track *t = calloc(1, sizeof *t);
	if (!t)
		return NULL;
	if (conf)
		t->conf = *conf;
	if (t->conf.return_window_us <= 0)
		t->conf.return_window_us = TAP_TRACK_RETURN_WINDOW_US_DEFAULT;
	if (t->conf.late_return_us <= 0)
		t->conf.late_return_us = TAP_TRACK_LATE_RETURN_US_DEFAULT;
	if (t->conf.max_outstanding == 0)
		t->conf.max_outstanding = TAP_TRACK_MAX_OUTSTANDING_DEFAULT;
	t->emit = emit;
	t->ctx = ctx;
	t->ts_sec = INT64_MIN;
	tap_buf_init(&t->rec);
	tap_buf_init(&t->scratch);
	return t;
}

static void conn_free(struct tap_track_conn *c)
{
	struct tap_track *t = c->t;
	while (c->n_chans > 0) {
		struct trk_chan *ch = c->chans[c->n_chans - 1];
		t->st.outstanding -= ch->live;
		for (uint64_t n = ch->base; n < ch->next; n++)
			if (slot(ch, n)->state == PUB_HELD)
				t->st.held--;
		chan_free(c, ch);
	}
	free(c->chans);
	if (c->prev)
		c->prev->next = c->next;
	else
		t->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	t->st.connections_open--;
	intern_deinit(&c->keys);
	tap_buf_deinit(&c->prefix);
	free(c->active);
	free(c->client);
	free(c->upstream);
	free(c->user);
	free(c->vhost);
	free(c->product);
	free(c->version);
	free(c->platform);
	free(c->close_text);
	free(c->end_detail);
	free(c->hist);
	free(c);
}

void tap_track_free(struct tap_track *t)
{
	if (!t)
		return;
	while (t->conns)
		conn_free(t->conns);
	tap_buf_deinit(&t->rec);
	tap_buf_deinit(&t->scratch);
	free(t);
}

struct tap_track_conn *tap_track_conn_new(struct tap_track *t, uint64_t conn_id, const char *client_addr,
                                          const char *upstream_addr, int64_t now_us)
{
	struct tap_track_conn *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->t = t;
	c->id = conn_id;
	c->t_new = now_us;
	set_cstr(&c->client, client_addr);
	set_cstr(&c->upstream, upstream_addr);
	c->next = t->conns;
	if (t->conns)
		t->conns->prev = c;
	t->conns = c;
	t->st.connections_open++;
	t->st.connections_total++;
	return c;
}

void tap_track_conn_client_props(struct tap_track_conn *c, struct tap_slice product, struct tap_slice version,
                                 struct tap_slice platform)
{
	if (product.ptr)
		set_str(&c->product, product);
	if (version.ptr)
		set_str(&c->version, version);
	if (platform.ptr)
		set_str(&c->platform, platform);
}

void tap_track_conn_user(struct tap_track_conn *c, struct tap_slice user)
{
	set_str(&c->user, user);
	tap_buf_reset(&c->prefix);
}

void tap_track_conn_tune(struct tap_track_conn *c, uint16_t channel_max, uint32_t frame_max, uint16_t heartbeat)
{
	c->tuned = true;
	c->channel_max = channel_max;
	c->frame_max = frame_max;
	c->heartbeat = heartbeat;
}

void tap_track_conn_open(struct tap_track_conn *c, struct tap_slice vhost, int64_t now_us)
{
	if (c->opened)
		return;
	c->opened = true;
	set_str(&c->vhost, vhost);
	tap_buf_reset(&c->prefix);
	struct tap_track *t = c->t;
	struct tap_json j;
	rec_begin(t, &j, "connection", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	tap_json_kv_str(&j, "event", "open");
	str_or_null(&j, "client", c->client);
	str_or_null(&j, "upstream", c->upstream);
	str_or_null(&j, "user", c->user);
	str_or_null(&j, "vhost", c->vhost);
	str_or_null(&j, "product", c->product);
	str_or_null(&j, "version", c->version);
	str_or_null(&j, "platform", c->platform);
	if (c->tuned) {
		tap_json_kv_uint(&j, "frame_max", c->frame_max);
		tap_json_kv_uint(&j, "heartbeat", c->heartbeat);
		tap_json_kv_uint(&j, "channel_max", c->channel_max);
	} else {
		tap_json_kv_null(&j, "frame_max");
		tap_json_kv_null(&j, "heartbeat");
		tap_json_kv_null(&j, "channel_max");
	}
	rec_end(t, &j);
}

void tap_track_conn_blocked(struct tap_track_conn *c, bool blocked, struct tap_slice reason, int64_t now_us)
{
	struct tap_track *t = c->t;
	struct tap_json j;
	rec_begin(t, &j, blocked ? "blocked" : "unblocked", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	if (blocked) {
		tap_json_kv_strn(&j, "reason", reason.ptr, reason.len);
		if (!c->blocked)
			c->blocked_since = now_us;
	} else if (c->blocked) {
		tap_json_kv_int(&j, "blocked_us", now_us - c->blocked_since);
	}
	rec_end(t, &j);
	c->blocked = blocked;
}

void tap_track_conn_close(struct tap_track_conn *c, enum tap_peer by, uint16_t code, struct tap_slice text,
                          int64_t now_us)
{
	(void)now_us;
	if (c->closed)
		return;
	c->closed = true;
	c->close_by_broker = by == TAP_BY_BROKER;
	c->close_code = code;
	set_str(&c->close_text, text);
	c->close_text_len = c->close_text ? text.len : 0;
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

void tap_track_conn_end(struct tap_track_conn *c, const char *reason_by, int64_t now_us)
{
	struct tap_track *t = c->t;
	struct trk_reason r;
	conn_reason(c, reason_by, &r);
	r.settled = c->settled;
	while (c->n_chans > 0) /* in channel order; chan_end frees each */
		chan_end(c, c->chans[0], &r, now_us);
	struct tap_json j;
	rec_begin(t, &j, "connection", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	tap_json_kv_str(&j, "event", "close");
	str_or_null(&j, "client", c->client);
	write_close_reason(&j, &r);
	tap_json_kv_int(&j, "duration_us", now_us - c->t_new);
	write_counts(&j, &c->counts);
	rec_end(t, &j);

	struct trk_counts *k = &t->closed_counts;
	k->publishes += c->counts.publishes;
	k->routed += c->counts.routed;
	k->returned += c->counts.returned;
	k->unproven += c->counts.unproven;
	k->unknown += c->counts.unknown;
	k->acked += c->counts.acked;
	k->nacked += c->counts.nacked;
	conn_free(c);
}

/* ---- channel events ---- */

void tap_track_channel_open(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	struct trk_chan *ch = chan_find(c, id);
	if (ch) {
		struct trk_reason r = {.by = "reopen"};
		chan_end(c, ch, &r, now_us);
	}
	chan_get(c, id);
	chan_event(c, id, "open", now_us);
}

void tap_track_confirm_select(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	struct trk_chan *ch = chan_get(c, id);
	if (ch && ch->mode == MODE_NONE) {
		ch->mode = MODE_CONFIRM;
		ch->sel_off = ch->next - 1;
	}
	chan_event(c, id, "confirm_select", now_us);
}

void tap_track_tx_select(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	struct trk_chan *ch = chan_get(c, id);
	if (ch && ch->mode == MODE_NONE)
		ch->mode = MODE_TX;
	chan_event(c, id, "tx_select", now_us);
}

void tap_track_channel_close(struct tap_track_conn *c, uint16_t id, enum tap_peer by, uint16_t code,
                             struct tap_slice text, int64_t now_us)
{
	(void)now_us;
	struct trk_chan *ch = chan_get(c, id);
	if (!ch)
		return;
	/* Closes can cross: the client closes while the broker's 404 is on its way. The broker's close says why
	 * the publishes went unanswered, so it wins over the client's; otherwise the first close stands. */
	if (ch->closing && (ch->close_by_broker || by == TAP_BY_CLIENT))
		return;
	free(ch->close_text);
	ch->closing = true;
	ch->close_by_broker = by == TAP_BY_BROKER;
	ch->close_code = code;
	ch->close_text = text.len ? dup_slice(text) : NULL;
	ch->close_text_len = ch->close_text ? text.len : 0;
}

void tap_track_channel_close_ok(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	struct trk_chan *ch = chan_find(c, id);
	if (!ch)
		return;
	/* the broker's close-ok to the client's close comes after everything the broker had to say */
	struct trk_reason r = {.by = "close_ok", .settled = ch->closing && !ch->close_by_broker};
	chan_end(c, ch, &r, now_us);
}

void tap_track_conn_detail(struct tap_track_conn *c, const char *detail)
{
	free(c->end_detail);
	c->end_detail = detail ? strdup(detail) : NULL;
}

void tap_track_conn_close_ok(struct tap_track_conn *c, int64_t now_us)
{
	(void)now_us;
	if (c->closed && !c->close_by_broker)
		c->settled = true;
}

void tap_track_tx_commit_ok(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	struct trk_chan *ch = chan_find(c, id);
	if (!ch)
		return;
	/* Returns of the committed publishes precede commit-ok: the ones still waiting got none. */
	struct trk_reason r = {.by = "tx_commit_ok", .settled = true};
	for (uint64_t n = ch->base; n < ch->next; n++) {
		struct trk_pub *e = slot(ch, n);
		if (e->state == PUB_WAIT && !(e->flags & PF_CONFIRM))
			slot_finish(c, ch, n, &r, now_us);
	}
}

/* ---- publishes ---- */

/* The oldest outstanding publish of the connection is written now as evicted. */
static void evict_oldest(struct tap_track_conn *c, int64_t now_us)
{
	struct trk_chan *best = NULL;
	for (uint32_t i = 0; i < c->n_active; i++) {
		struct trk_chan *ch = c->active[i];
		if (ch->base < ch->next && (!best || slot(ch, ch->base)->t_pub < slot(best, best->base)->t_pub))
			best = ch;
	}
	if (!best)
		return;
	struct trk_reason r = {.by = "evicted"};
	c->t->st.evicted++;
	slot_finish(c, best, best->base, &r, now_us);
}

void tap_track_publish(struct tap_track_conn *c, uint16_t id, const struct tap_publish *p, int64_t now_us)
{
	struct tap_track *t = c->t;
	struct trk_chan *ch = chan_get(c, id);
	c->counts.publishes++;
	t->st.publishes++;
	render_extra(&t->scratch, p);
	bool confirm = ch && ch->mode == MODE_CONFIRM;
	bool tx = ch && ch->mode == MODE_TX;
	/* a publish after a channel.close is dropped by the broker: it waits for close-ok like the others */
	bool want = confirm || p->mandatory || (ch && ch->closing);
	bool wait = want && ch;
	struct trk_reason oom = {.by = "no_memory"};
	if (wait) {
		while (!ring_reserve(ch) && ch->base < ch->next) {
			t->st.oom++;
			slot_finish(c, ch, ch->base, &oom, now_us);
		}
		wait = ch->next - ch->base < ch->cap;
	}
	if (!wait) {
		/* written at once: not in confirm mode and nothing to wait for, or no memory to wait */
		struct trk_view v;
		view_of_publish(&v, p, &t->scratch);
		v.confirm_mode = confirm;
		v.tx = tx;
		struct trk_verdict vd = {.route = ROUTE_UNPROVEN, .confirm = CONF_NONE};
		if (confirm) {
			v.seq = ch->next - ch->sel_off;
			ch->base = ++ch->next; /* the ring is empty here */
		}
		if (want) {
			vd.route = ROUTE_UNKNOWN;
			vd.confirm = confirm ? CONF_UNKNOWN : CONF_NONE;
			vd.reason = &oom;
			t->st.oom++;
		}
		write_publish(c, id, &v, &vd, now_us);
		return;
	}

	uint64_t n = ch->next++;
	struct trk_pub *e = slot(ch, n);
	size_t mid_len = p->has_message_id ? (p->message_id.len > 255 ? 255 : p->message_id.len) : 0;
	size_t cid_len = p->has_correlation_id ? (p->correlation_id.len > 255 ? 255 : p->correlation_id.len) : 0;
	size_t ts_len = p->has_timestamp ? sizeof p->timestamp : 0;
	uint64_t blob_len = ts_len + mid_len + cid_len;
	*e = (struct trk_pub){
	    .t_pub = now_us,
	    .body_size = p->body_size,
	    .reply = NO_KEY,
	    .extra = NO_KEY,
	    .mid_len = (uint8_t)mid_len,
	    .cid_len = (uint8_t)cid_len,
	    .state = PUB_WAIT,
	    .delivery_mode = p->delivery_mode,
	};
	e->flags = (p->mandatory ? PF_MANDATORY : 0) | (confirm ? PF_CONFIRM : 0) | (tx ? PF_TX : 0) |
	           (p->has_message_id ? PF_HAS_MID : 0) | (p->has_correlation_id ? PF_HAS_CID : 0) |
	           (p->has_delivery_mode ? PF_HAS_DM : 0) | (p->has_timestamp ? PF_HAS_TS : 0);
	e->blob = arena_alloc(&ch->arena, blob_len);
	if (e->blob == UINT64_MAX) {
		e->flags |= PF_BLOB_OOM;
		t->st.oom++;
	} else if (blob_len) {
		uint8_t *b = arena_ptr(&ch->arena, e->blob);
		if (ts_len)
			memcpy(b, &p->timestamp, ts_len);
		if (mid_len)
			memcpy(b + ts_len, p->message_id.ptr, mid_len);
		if (cid_len)
			memcpy(b + ts_len + mid_len, p->correlation_id.ptr, cid_len);
	}
	if (t->scratch.len)
		e->extra = intern_get(&c->keys, KEY_EXTRA, (const uint8_t *)t->scratch.data, t->scratch.len, NULL, 0);
	e->key =
	    intern_get(&c->keys, KEY_ROUTE, p->exchange.ptr, p->exchange.len, p->routing_key.ptr, p->routing_key.len);
	if (ch->live++ == 0) {
		active_add(c, ch);
		if (!(e->flags & PF_BLOB_OOM))
			ch->arena.head = e->blob;
	}
	c->outstanding++;
	t->st.outstanding++;
	if (!confirm && p->mandatory && !ch->closing && !fifo_push(&ch->win_q, n))
		t->st.oom++; /* written when the channel ends instead of at the window's end */

	if (c->outstanding > t->conf.max_outstanding)
		evict_oldest(c, now_us);
	if (ch->next - ch->base > (uint64_t)t->conf.max_outstanding * 2)
		slot_finish(c, ch, ch->base, &(struct trk_reason){.by = "evicted"}, now_us), t->st.evicted++;
}

/* An ack or nack reached outstanding slot n. */
static void slot_answer(struct tap_track_conn *c, struct trk_chan *ch, uint64_t n, bool multiple, bool nack,
                        int64_t now_us)
{
	struct tap_track *t = c->t;
	struct trk_pub *e = slot(ch, n);
	e->t_ack = now_us;
	if (multiple)
		e->flags |= PF_MULTIPLE;
	if (!nack && (e->flags & PF_MANDATORY) && !(e->flags & PF_RETURNED)) {
		if (fifo_push(&ch->held_q, n)) {
			e->state = PUB_HELD;
			t->st.held++;
			return;
		}
		t->st.oom++;
	}
	struct trk_view v;
	view_of_slot(&v, c, ch, n);
	struct trk_verdict vd = {.confirm = nack ? CONF_NACK : CONF_ACK, .multiple = multiple, .t_ack = now_us};
	if (e->flags & PF_RETURNED) {
		vd.route = ROUTE_RETURNED;
		reply_of_slot(c, e, &vd);
	} else {
		vd.route = (e->flags & PF_MANDATORY) && !nack ? ROUTE_ROUTED : ROUTE_UNPROVEN;
	}
	bool warn = !nack && !(e->flags & PF_MANDATORY) && !ch->warned_cwm;
	uint64_t seq = v.seq;
	write_publish(c, ch->id, &v, &vd, now_us);
	slot_done(c, ch, n);
	if (warn) {
		ch->warned_cwm = true;
		write_warning(c, ch->id, "confirm_without_mandatory", true, seq, now_us);
	}
}

enum trk_answer { ANSWER_ACK, ANSWER_NACK };

static void confirm(struct tap_track_conn *c, uint16_t id, uint64_t tag, bool multiple, enum trk_answer answer,
                    int64_t now_us)
{
	struct trk_chan *ch = chan_find(c, id);
	if (!ch || ch->mode != MODE_CONFIRM || (tag == 0 && !multiple) || tag > UINT64_MAX - ch->sel_off) {
		c->t->st.stray_confirms++;
		return;
	}
	uint64_t lo = ch->base > ch->sel_off ? ch->base : ch->sel_off + 1;
	uint64_t hi = tag == 0 ? ch->next - 1 : tag + ch->sel_off; /* multiple with tag 0: everything outstanding */
	if (!multiple)
		lo = hi;
	if (hi >= ch->next)
		hi = ch->next - 1;
	uint64_t answered = 0;
	for (uint64_t n = lo; n <= hi; n++) {
		if (n < ch->base)
			n = ch->base; /* answering the head moved it past slots answered earlier */
		if (n > hi || n >= ch->next)
			break;
		struct trk_pub *e = slot(ch, n);
		if (e->state != PUB_WAIT || !(e->flags & PF_CONFIRM))
			continue;
		slot_answer(c, ch, n, multiple, answer == ANSWER_NACK, now_us);
		answered++;
	}
	if (!answered)
		c->t->st.stray_confirms++;
}

void tap_track_ack(struct tap_track_conn *c, uint16_t ch, uint64_t tag, bool multiple, int64_t now_us)
{
	confirm(c, ch, tag, multiple, ANSWER_ACK, now_us);
}

void tap_track_nack(struct tap_track_conn *c, uint16_t ch, uint64_t tag, bool multiple, int64_t now_us)
{
	confirm(c, ch, tag, multiple, ANSWER_NACK, now_us);
}

static void write_unmatched_return(struct tap_track_conn *c, uint16_t ch, const struct tap_return *r, int64_t now_us)
{
	struct tap_track *t = c->t;
	struct tap_json j;
	rec_begin(t, &j, "warning", now_us);
	tap_json_kv_uint(&j, "conn", c->id);
	tap_json_kv_uint(&j, "channel", ch);
	tap_json_kv_str(&j, "rule", "unmatched_return");
	tap_json_kv_strn(&j, "exchange", r->exchange.ptr, r->exchange.len);
	tap_json_kv_strn(&j, "routing_key", r->routing_key.ptr, r->routing_key.len);
	if (r->has_message_id)
		tap_json_kv_strn(&j, "message_id", r->message_id.ptr, r->message_id.len);
	else
		tap_json_kv_null(&j, "message_id");
	tap_json_kv_uint(&j, "body_size", r->body_size);
	tap_json_kv_uint(&j, "reply_code", r->reply_code);
	tap_json_kv_strn(&j, "reply_text", r->reply_text.ptr, r->reply_text.len);
	rec_end(t, &j);
	t->st.warnings++;
	t->st.unmatched_returns++;
}

void tap_track_return(struct tap_track_conn *c, uint16_t id, const struct tap_return *r, int64_t now_us)
{
	struct trk_chan *ch = chan_find(c, id);
	uint32_t key = NO_KEY;
	if (ch && ch->live)
		key = intern_lookup(&c->keys, KEY_ROUTE, r->exchange.ptr, r->exchange.len, r->routing_key.ptr,
		                    r->routing_key.len);
	uint64_t n = 0;
	bool found = false;
	if (key != NO_KEY) {
		for (n = ch->base; n < ch->next; n++) {
			const struct trk_pub *e = slot(ch, n);
			if (e->state == PUB_DONE || e->key != key || e->body_size != r->body_size ||
			    (e->flags & (PF_MANDATORY | PF_RETURNED)) != PF_MANDATORY)
				continue;
			if (r->has_message_id &&
			    (!(e->flags & PF_HAS_MID) || (e->flags & PF_BLOB_OOM) || e->mid_len != r->message_id.len ||
			     (e->mid_len && memcmp(arena_ptr(&ch->arena, e->blob) + ((e->flags & PF_HAS_TS) ? 8 : 0),
			                           r->message_id.ptr, e->mid_len))))
				continue;
			found = true;
			break;
		}
	}
	if (!found) {
		write_unmatched_return(c, id, r, now_us);
		return;
	}
	struct trk_pub *e = slot(ch, n);
	e->flags |= PF_RETURNED;
	e->t_ret = now_us;
	e->reply_code = r->reply_code;
	e->reply = intern_get(&c->keys, KEY_TEXT, r->reply_text.ptr, r->reply_text.len, NULL, 0);
	if (e->state == PUB_WAIT && (e->flags & PF_CONFIRM))
		return; /* the ack follows (PROTOCOL §9) */
	struct trk_view v;
	view_of_slot(&v, c, ch, n);
	struct trk_verdict vd = {.route = ROUTE_RETURNED, .t_ack = e->t_ack, .multiple = e->flags & PF_MULTIPLE};
	reply_of_slot(c, e, &vd);
	bool abr = e->state == PUB_HELD;
	if (abr) {
		vd.confirm = CONF_ACK;
		vd.ack_before_return = true;
	} else {
		vd.confirm = CONF_NONE;
	}
	uint64_t seq = v.seq;
	write_publish(c, id, &v, &vd, now_us);
	slot_done(c, ch, n);
	if (abr && !ch->warned_abr) {
		ch->warned_abr = true;
		write_warning(c, id, "ack_before_return", true, seq, now_us);
	}
}

/* ---- timers ---- */

static int64_t chan_tick(struct tap_track_conn *c, struct trk_chan *ch, int64_t now_us)
{
	struct tap_track *t = c->t;
	int64_t next = INT64_MAX;
	while (ch->held_q.len) {
		uint64_t n = fifo_front(&ch->held_q);
		if (n < ch->base || n >= ch->next || slot(ch, n)->state != PUB_HELD) {
			fifo_pop(&ch->held_q);
			continue;
		}
		int64_t due = slot(ch, n)->t_ack + t->conf.late_return_us;
		if (due > now_us) {
			next = due;
			break;
		}
		fifo_pop(&ch->held_q);
		/* stamped with its deadline, not with whenever the timer ran: live and replay agree */
		slot_finish(c, ch, n, NULL, due);
		if (!ch->live)
			return INT64_MAX;
	}
	while (ch->win_q.len) {
		uint64_t n = fifo_front(&ch->win_q);
		const struct trk_pub *e = n >= ch->base && n < ch->next ? slot(ch, n) : NULL;
		if (!e || e->state != PUB_WAIT || (e->flags & PF_CONFIRM)) {
			fifo_pop(&ch->win_q);
			continue;
		}
		int64_t due = e->t_pub + t->conf.return_window_us;
		if (due > now_us) {
			if (due < next)
				next = due;
			break;
		}
		fifo_pop(&ch->win_q);
		struct trk_view v;
		view_of_slot(&v, c, ch, n);
		struct trk_verdict vd = {.route = ROUTE_UNPROVEN, .confirm = CONF_NONE};
		write_publish(c, ch->id, &v, &vd, due);
		slot_done(c, ch, n);
		if (!ch->live)
			return INT64_MAX;
	}
	return next;
}

int64_t tap_track_tick(struct tap_track *t, int64_t now_us)
{
	int64_t next = INT64_MAX;
	for (struct tap_track_conn *c = t->conns; c; c = c->next) {
		for (uint32_t i = 0; i < c->n_active;) {
			struct trk_chan *ch = c->active[i];
			int64_t d = chan_tick(c, ch, now_us);
			if (d < next)
				next = d;
			if (i < c->n_active && c->active[i] == ch)
				i++;
		}
	}
	return next;
}

void tap_track_shutdown(struct tap_track *t, int64_t now_us)
{
	while (t->conns)
		tap_track_conn_end(t->conns, "shutdown", now_us);
}

/* ---- summary and stats ---- */

static const struct trk_hist no_confirms;

static void summary_line(struct tap_buf *out, const struct trk_counts *k, const struct trk_hist *h)
{
	tap_buf_printf(out,
	               " publishes=%" PRIu64 " routed=%" PRIu64 " returned=%" PRIu64 " unproven=%" PRIu64
	               " unknown=%" PRIu64 " acked=%" PRIu64 " nacked=%" PRIu64,
	               k->publishes, k->routed, k->returned, k->unproven, k->unknown, k->acked, k->nacked);
	tap_buf_printf(out, " confirm_us p50=%" PRIu64 " p99=%" PRIu64 " max=%" PRIu64 "\n", hist_quantile(h, 0.5),
	               hist_quantile(h, 0.99), h->max);
}

void tap_track_summary(struct tap_track *t, struct tap_buf *out)
{
	struct trk_counts total = t->closed_counts;
	tap_buf_printf(out, "amqptap summary: %" PRIu64 " connections open, %" PRIu64 " in total\n",
	               t->st.connections_open, t->st.connections_total);
	for (struct tap_track_conn *c = t->conns; c; c = c->next) {
		tap_buf_printf(out, "conn %" PRIu64 " %s", c->id, c->client ? c->client : "-");
		tap_buf_printf(out, " outstanding=%" PRIu64, c->outstanding);
		summary_line(out, &c->counts, c->hist ? c->hist : &no_confirms);
		total.publishes += c->counts.publishes;
		total.routed += c->counts.routed;
		total.returned += c->counts.returned;
		total.unproven += c->counts.unproven;
		total.unknown += c->counts.unknown;
		total.acked += c->counts.acked;
		total.nacked += c->counts.nacked;
	}
	tap_buf_printf(out, "total outstanding=%" PRIu64, t->st.outstanding);
	summary_line(out, &total, &t->hist);
}

void tap_track_get_stats(const struct tap_track *t, struct tap_track_stats *s)
{
	*s = t->st;
}

uint64_t tap_track_confirm_quantile(const struct tap_track *t, double q)
{
	return hist_quantile(&t->hist, q);
}

/* ---- read access for the metrics endpoint (issue 16) ---- */

void tap_track_each_conn(const struct tap_track *t, tap_track_conn_fn fn, void *ctx)
{
	for (const struct tap_track_conn *c = t->conns; c; c = c->next) {
		struct tap_track_conn_info info = {
			.id = c->id,
			.client = c->client,
			.product = c->product,
			.user = c->user,
			.vhost = c->vhost,
			.publishes = c->counts.publishes,
			.routed = c->counts.routed,
			.returned = c->counts.returned,
			.unproven = c->counts.unproven,
			.unknown = c->counts.unknown,
			.acked = c->counts.acked,
			.nacked = c->counts.nacked,
			.outstanding = c->outstanding,
			.channels = c->n_chans,
			.blocked = c->blocked,
			.since_us = c->t_new,
		};
		fn(ctx, &info);
	}
}

void tap_track_each_confirm_bucket(const struct tap_track *t, tap_track_bucket_fn fn, void *ctx)
{
	for (unsigned i = 0; i < HIST_BUCKETS; i++) {
		if (!t->hist.b[i])
			continue;
		uint64_t width = i < HIST_SUB ? 1 : UINT64_C(1) << ((i - HIST_SUB) / HIST_SUB);
		uint64_t lo = i < HIST_SUB ? i : hist_value(i) - width / 2;
		uint64_t hi = i == HIST_BUCKETS - 1 ? t->hist.max + 1 : lo + width; /* the last bucket takes every larger value */
		fn(ctx, lo, hi, t->hist.b[i]);
	}
}

/* A capture lost bytes of this connection (DESIGN §6b): whatever was lost may have been the Return, Ack, Nack or
 * close that decides an outstanding publish, or (client side) publishes that shift every later confirm sequence
 * number. Every outstanding publish ends now with {"by":"capture_gap"}: route unknown unless its Return was seen,
 * confirm ack when its ack was seen, else unknown (none outside confirm mode). */
void tap_track_conn_gap(struct tap_track_conn *c, enum tap_track_gap_seq seq, int64_t now_us)
{
	const struct trk_reason gap = {.by = "capture_gap"};
	for (uint32_t i = 0; i < c->n_chans; i++) {
		struct trk_chan *ch = c->chans[i];
		for (uint64_t n = ch->base; n < ch->next; n++) {
			struct trk_pub *e = slot(ch, n);
			if (e->state == PUB_DONE)
				continue;
			struct trk_view v;
			struct trk_verdict vd = {.route = ROUTE_UNKNOWN, .reason = &gap};
			view_of_slot(&v, c, ch, n);
			if (seq == TAP_TRACK_GAP_SEQ_LOST)
				v.confirm_mode = false; /* its sequence number was counted across lost publishes */
			if (e->flags & PF_RETURNED) {
				vd.route = ROUTE_RETURNED;
				reply_of_slot(c, e, &vd);
			}
			if (e->state == PUB_HELD) {
				vd.confirm = CONF_ACK;
				vd.t_ack = e->t_ack;
				vd.multiple = e->flags & PF_MULTIPLE;
			} else {
				vd.confirm = (e->flags & PF_CONFIRM) ? CONF_UNKNOWN : CONF_NONE;
			}
			write_publish(c, ch->id, &v, &vd, now_us);
			slot_done(c, ch, n);
		}
	}
}
