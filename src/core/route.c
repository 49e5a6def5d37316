/* The routing model (route.h): how RabbitMQ 3.10 routes a publish, from rabbit_exchange.erl (route/2: a work list of
 * exchanges, each visited once; the alternate exchange when an exchange's own route gives no destination at all),
 * rabbit_exchange_type_{direct,fanout,topic,headers}.erl and rabbit_policy.erl (the one matching policy of highest
 * priority; an exchange's own alternate-exchange argument wins over it). PROTOCOL §14 has the facts.
 *
 * Layout: one hash table maps (kind, owner id, bytes) to an id: vhosts, exchanges and queues by name within their
 * vhost, a direct exchange's keys, a topic trie's word edges. Strings and arguments live in a bump arena freed
 * with the model; the arrays grow by doubling. Every byte is counted against limits.max_bytes. */
#include "amqptap/route.h"

#include "amqptap/status.h"
#include "route_int.h"

#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tap_route_limits_default(struct tap_route_limits *l)
{
	*l = (struct tap_route_limits){
	    .max_bytes = UINT64_C(256) << 20,
	    .max_vhosts = 10000,
	    .max_exchanges = 1000000,
	    .max_queues = 1000000,
	    .max_bindings = 4000000,
	    .max_policies = 10000,
	    .max_name = 255,
	    .max_key = 4096,
	    .max_pattern = 1024,
	    .max_args = 1024,
	    .max_depth = 8,
	};
}

int route_fail(struct tap_route_model *m, int status, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m->err, sizeof m->err, fmt, ap);
	va_end(ap);
	m->broken = true;
	return status;
}

const char *tap_route_error(const struct tap_route_model *m)
{
	return m->err;
}

/* --- memory: counted, bounded -------------------------------------------------------------------------------- */

static bool charge(struct tap_route_model *m, uint64_t n)
{
	if (m->bytes + n > m->lim.max_bytes)
		return false;
	m->bytes += n;
	return true;
}

/* Grows *p (of *cap elements of size elem) to hold need elements. */
int route_grow(struct tap_route_model *m, void **p, uint32_t *cap, size_t elem, uint32_t need)
{
	if (need <= *cap)
		return 0;
	uint64_t ncap = *cap ? (uint64_t)*cap * 2 : 16;
	while (ncap < need)
		ncap *= 2;
	if (ncap > UINT32_MAX - 1)
		ncap = UINT32_MAX - 1;
	if (ncap < need)
		return route_fail(m, TAP_E_FULL, "model too large");
	uint64_t add = (ncap - *cap) * elem;
	if (!charge(m, add))
		return route_fail(m, TAP_E_FULL, "model larger than its limit of %llu bytes",
		                  (unsigned long long)m->lim.max_bytes);
	void *np = realloc(*p, (size_t)ncap * elem);
	if (!np) {
		m->bytes -= add;
		return route_fail(m, TAP_E_NOMEM, "out of memory");
	}
	memset((char *)np + (size_t)*cap * elem, 0, (size_t)(ncap - *cap) * elem);
	*p = np;
	*cap = (uint32_t)ncap;
	return 0;
}

#define ARENA_CHUNK 65536u

struct arena_chunk {
	struct arena_chunk *next;
	size_t used, cap;
	max_align_t data[];
};

void *route_alloc(struct tap_route_model *m, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	struct arena_chunk *c = m->chunks;
	if (!c || c->cap - c->used < n) {
		size_t cap = n > ARENA_CHUNK / 4 ? n : ARENA_CHUNK;
		if (!charge(m, sizeof *c + cap)) {
			route_fail(m, TAP_E_FULL, "model larger than its limit of %llu bytes",
			           (unsigned long long)m->lim.max_bytes);
			return NULL;
		}
		c = malloc(sizeof *c + cap);
		if (!c) {
			m->bytes -= sizeof *c + cap;
			route_fail(m, TAP_E_NOMEM, "out of memory");
			return NULL;
		}
		c->used = 0;
		c->cap = cap;
		if (n > ARENA_CHUNK / 4 && m->chunks) {
			/* a big one goes behind the current chunk, which keeps serving small ones */
			c->next = m->chunks->next;
			m->chunks->next = c;
		} else {
			c->next = m->chunks;
			m->chunks = c;
		}
	}
	void *p = (char *)c->data + c->used;
	c->used += n;
	return p;
}

/* A NUL-terminated copy (the NUL is not in the length). */
char *route_strdup(struct tap_route_model *m, const char *s, size_t len)
{
	char *p = route_alloc(m, len + 1);
	if (!p)
		return NULL;
	if (len)
		memcpy(p, s, len);
	p[len] = '\0';
	return p;
}

/* --- the hash table ------------------------------------------------------------------------------------------ */

static uint64_t hash_bytes(uint64_t owner, const char *s, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull ^ (owner * 0x9e3779b97f4a7c15ull);
	for (size_t i = 0; i < len; i++) {
		h ^= (unsigned char)s[i];
		h *= 0x100000001b3ull;
	}
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 32;
	return h;
}

uint32_t route_find(const struct tap_route_model *m, uint64_t owner, const char *s, size_t len)
{
	if (!m->ht_cap)
		return TAP_ROUTE_NONE;
	uint64_t h = hash_bytes(owner, s, len);
	uint32_t mask = m->ht_cap - 1;
	for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
		const struct route_slot *e = &m->ht[i];
		if (e->val == TAP_ROUTE_NONE)
			return TAP_ROUTE_NONE;
		if (e->hash == h && e->owner == owner && e->len == len && (len == 0 || !memcmp(e->s, s, len)))
			return e->val;
	}
}

static void ht_put_slot(struct route_slot *ht, uint32_t cap, const struct route_slot *e)
{
	uint32_t mask = cap - 1;
	uint32_t i = (uint32_t)e->hash & mask;
	while (ht[i].val != TAP_ROUTE_NONE)
		i = (i + 1) & mask;
	ht[i] = *e;
}

/* Maps (owner, s) to val; s must outlive the model (an arena copy). The key must not be there. */
int route_insert(struct tap_route_model *m, uint64_t owner, const char *s, size_t len, uint32_t val)
{
	if ((uint64_t)(m->ht_used + 1) * 2 > m->ht_cap) {
		uint32_t ncap = m->ht_cap ? m->ht_cap * 2 : 64;
		uint64_t add = (uint64_t)(ncap - m->ht_cap) * sizeof *m->ht;
		if (!charge(m, add))
			return route_fail(m, TAP_E_FULL, "model larger than its limit of %llu bytes",
			                  (unsigned long long)m->lim.max_bytes);
		struct route_slot *nht = malloc((size_t)ncap * sizeof *nht);
		if (!nht) {
			m->bytes -= add;
			return route_fail(m, TAP_E_NOMEM, "out of memory");
		}
		for (uint32_t i = 0; i < ncap; i++)
			nht[i].val = TAP_ROUTE_NONE;
		for (uint32_t i = 0; i < m->ht_cap; i++)
			if (m->ht[i].val != TAP_ROUTE_NONE)
				ht_put_slot(nht, ncap, &m->ht[i]);
		free(m->ht);
		m->ht = nht;
		m->ht_cap = ncap;
	}
	struct route_slot e = {
	    .hash = hash_bytes(owner, s, len), .owner = owner, .s = s, .len = (uint32_t)len, .val = val};
	ht_put_slot(m->ht, m->ht_cap, &e);
	m->ht_used++;
	return 0;
}

/* --- building ------------------------------------------------------------------------------------------------ */

struct tap_route_model *tap_route_model_new(const struct tap_route_limits *limits)
{
	struct tap_route_model *m = calloc(1, sizeof *m);
	if (!m)
		return NULL;
	if (limits)
		m->lim = *limits;
	else
		tap_route_limits_default(&m->lim);
	m->bytes = sizeof *m;
	m->gen = 1;
	m->stamp = 1;
	return m;
}

void tap_route_model_free(struct tap_route_model *m)
{
	if (!m)
		return;
	for (uint32_t i = 0; i < m->n_pol; i++)
		if (m->pol[i].re_ok)
			regfree(&m->pol[i].re);
	while (m->chunks) {
		struct arena_chunk *c = m->chunks;
		m->chunks = c->next;
		free(c);
	}
	free(m->vh);
	free(m->ex);
	free(m->q);
	free(m->b);
	free(m->nodes);
	free(m->pol);
	free(m->ht);
	free(m->work);
	free(m->out);
	free(m->cur);
	free(m->nxt);
	free(m->sorted);
	free(m);
}

uint64_t tap_route_model_bytes(const struct tap_route_model *m)
{
	return m->bytes;
}

static int check_name(struct tap_route_model *m, const char *what, size_t len)
{
	if (len > m->lim.max_name)
		return route_fail(m, TAP_E_FULL, "%s name of %zu bytes (at most %u)", what, len, m->lim.max_name);
	return 0;
}

static int usable(struct tap_route_model *m)
{
	if (m->broken)
		return TAP_E_USAGE;
	if (m->finished)
		return route_fail(m, TAP_E_USAGE, "model already finished");
	return 0;
}

static uint32_t new_node(struct tap_route_model *m, bool is_hash)
{
	if (route_grow(m, (void **)&m->nodes, &m->cap_nodes, sizeof *m->nodes, m->n_nodes + 1))
		return TAP_ROUTE_NONE;
	uint32_t id = m->n_nodes++;
	m->nodes[id] = (struct route_node){.hash_child = TAP_ROUTE_NONE,
	                                   .star_child = TAP_ROUTE_NONE,
	                                   .bind_head = TAP_ROUTE_NONE,
	                                   .is_hash = is_hash};
	return id;
}

static enum tap_route_xtype parse_type(const char *t, size_t len)
{
	static const struct {
		const char *name;
		enum tap_route_xtype type;
	} types[] = {
	    {"direct", TAP_RX_DIRECT}, {"fanout", TAP_RX_FANOUT}, {"topic", TAP_RX_TOPIC}, {"headers", TAP_RX_HEADERS}};
	for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
		if (strlen(types[i].name) == len && !memcmp(types[i].name, t, len))
			return types[i].type;
	return TAP_RX_UNKNOWN;
}

static int ensure_vhost(struct tap_route_model *m, const char *vh, size_t vh_len, uint32_t *out);

static int add_exchange(struct tap_route_model *m, uint32_t v, const char *name, size_t name_len, const char *type,
                        size_t type_len, bool internal, const char *ae, size_t ae_len)
{
	if (check_name(m, "exchange", name_len) || (ae && check_name(m, "alternate exchange", ae_len)))
		return TAP_E_FULL;
	if (type_len > m->lim.max_name)
		return route_fail(m, TAP_E_FULL, "exchange type of %zu bytes", type_len);
	if (route_find(m, ROUTE_K(ROUTE_K_EX, v), name, name_len) != TAP_ROUTE_NONE)
		return 0;
	if (m->n_ex >= m->lim.max_exchanges)
		return route_fail(m, TAP_E_FULL, "more than %u exchanges", m->lim.max_exchanges);
	if (route_grow(m, (void **)&m->ex, &m->cap_ex, sizeof *m->ex, m->n_ex + 1))
		return TAP_E_FULL;
	struct route_ex x = {.vhost = v,
	                     .type = parse_type(type, type_len),
	                     .internal = internal,
	                     .root = TAP_ROUTE_NONE,
	                     .bind_head = TAP_ROUTE_NONE,
	                     .bind_tail = TAP_ROUTE_NONE,
	                     .ae = TAP_ROUTE_NONE};
	x.name = route_strdup(m, name, name_len);
	x.type_name = route_strdup(m, type, type_len);
	if (!x.name || !x.type_name)
		return TAP_E_FULL;
	x.name_len = (uint32_t)name_len;
	if (ae) {
		if (!(x.ae_arg = route_strdup(m, ae, ae_len)))
			return TAP_E_FULL;
		x.ae_arg_len = (uint32_t)ae_len;
		x.has_ae_arg = true;
	}
	if (x.type == TAP_RX_TOPIC && (x.root = new_node(m, false)) == TAP_ROUTE_NONE)
		return TAP_E_FULL;
	if (x.type == TAP_RX_UNKNOWN)
		m->n_unknown++;
	uint32_t id = m->n_ex;
	m->ex[id] = x;
	if (route_insert(m, ROUTE_K(ROUTE_K_EX, v), x.name, name_len, id))
		return TAP_E_FULL;
	m->n_ex++;
	return 0;
}

static int ensure_vhost(struct tap_route_model *m, const char *vh, size_t vh_len, uint32_t *out)
{
	uint32_t v = route_find(m, ROUTE_K(ROUTE_K_VH, 0), vh, vh_len);
	if (v != TAP_ROUTE_NONE) {
		*out = v;
		return 0;
	}
	if (check_name(m, "vhost", vh_len))
		return TAP_E_FULL;
	if (m->n_vh >= m->lim.max_vhosts)
		return route_fail(m, TAP_E_FULL, "more than %u vhosts", m->lim.max_vhosts);
	if (route_grow(m, (void **)&m->vh, &m->cap_vh, sizeof *m->vh, m->n_vh + 1))
		return TAP_E_FULL;
	v = m->n_vh;
	char *name = route_strdup(m, vh, vh_len);
	if (!name || route_insert(m, ROUTE_K(ROUTE_K_VH, 0), name, vh_len, v))
		return TAP_E_FULL;
	m->vh[v] = (struct route_vhost){.name = name, .name_len = (uint32_t)vh_len};
	m->n_vh++;
	/* RabbitMQ declares these in every vhost (rabbit_vhost:do_add); definitions exports leave them out */
	static const struct {
		const char *name, *type;
		bool internal;
	} amq[] = {{"amq.direct", "direct", false}, {"amq.fanout", "fanout", false},
	           {"amq.topic", "topic", false},   {"amq.headers", "headers", false},
	           {"amq.match", "headers", false}, {"amq.rabbitmq.trace", "topic", true}};
	for (size_t i = 0; i < sizeof amq / sizeof amq[0]; i++)
		if (add_exchange(m, v, amq[i].name, strlen(amq[i].name), amq[i].type, strlen(amq[i].type),
		                 amq[i].internal, NULL, 0))
			return TAP_E_FULL;
	*out = v;
	return 0;
}

int tap_route_add_vhost(struct tap_route_model *m, const char *vh, size_t vh_len)
{
	uint32_t v;
	int rc = usable(m);
	return rc ? rc : ensure_vhost(m, vh, vh_len, &v);
}

int tap_route_add_exchange(struct tap_route_model *m, const char *vh, size_t vh_len, const char *name, size_t name_len,
                           const char *type, size_t type_len, bool internal, const char *ae, size_t ae_len)
{
	uint32_t v;
	int rc = usable(m);
	if (rc || (rc = ensure_vhost(m, vh, vh_len, &v)))
		return rc;
	if (name_len == 0)
		return 0; /* the default exchange is not declared */
	return add_exchange(m, v, name, name_len, type, type_len, internal, ae, ae_len);
}

int tap_route_add_queue(struct tap_route_model *m, const char *vh, size_t vh_len, const char *name, size_t name_len)
{
	uint32_t v;
	int rc = usable(m);
	if (rc || (rc = ensure_vhost(m, vh, vh_len, &v)))
		return rc;
	if (check_name(m, "queue", name_len))
		return TAP_E_FULL;
	if (route_find(m, ROUTE_K(ROUTE_K_Q, v), name, name_len) != TAP_ROUTE_NONE)
		return 0;
	if (m->n_q >= m->lim.max_queues)
		return route_fail(m, TAP_E_FULL, "more than %u queues", m->lim.max_queues);
	if (route_grow(m, (void **)&m->q, &m->cap_q, sizeof *m->q, m->n_q + 1))
		return TAP_E_FULL;
	char *n = route_strdup(m, name, name_len);
	if (!n || route_insert(m, ROUTE_K(ROUTE_K_Q, v), n, name_len, m->n_q))
		return TAP_E_FULL;
	m->q[m->n_q++] = (struct route_queue){.vhost = v, .name = n, .name_len = (uint32_t)name_len};
	return 0;
}

/* Copies n values (recursively) into the arena, counting them against max_args and their depth. */
static int copy_value(struct tap_route_model *m, struct tap_route_value *dst, const struct tap_route_value *src,
                      uint32_t depth, uint32_t *count);

static int copy_fields(struct tap_route_model *m, struct tap_route_field **dst, const struct tap_route_field *src,
                       size_t n, uint32_t depth, uint32_t *count)
{
	*dst = NULL;
	if (!n)
		return 0;
	struct tap_route_field *f = route_alloc(m, n * sizeof *f);
	if (!f)
		return TAP_E_FULL;
	for (size_t i = 0; i < n; i++) {
		if (src[i].key_len > m->lim.max_name)
			return route_fail(m, TAP_E_FULL, "argument name of %u bytes", src[i].key_len);
		if (!(f[i].key = route_strdup(m, src[i].key, src[i].key_len)))
			return TAP_E_FULL;
		f[i].key_len = src[i].key_len;
		int rc = copy_value(m, &f[i].v, &src[i].v, depth, count);
		if (rc)
			return rc;
	}
	*dst = f;
	return 0;
}

static int copy_value(struct tap_route_model *m, struct tap_route_value *dst, const struct tap_route_value *src,
                      uint32_t depth, uint32_t *count)
{
	if (++*count > m->lim.max_args)
		return route_fail(m, TAP_E_FULL, "more than %u values in a binding's arguments", m->lim.max_args);
	*dst = *src;
	if (dst->type == 'L')
		dst->type = 'l';
	switch (src->kind) {
	case TAP_RV_STR:
		if (src->len > m->lim.max_key)
			return route_fail(m, TAP_E_FULL, "argument string of %u bytes (at most %u)", src->len,
			                  m->lim.max_key);
		return (dst->s = route_strdup(m, src->s, src->len)) ? 0 : TAP_E_FULL;
	case TAP_RV_ARRAY: {
		if (depth + 1 > m->lim.max_depth)
			return route_fail(m, TAP_E_FULL, "arguments nested deeper than %u", m->lim.max_depth);
		struct tap_route_value *items = NULL;
		if (src->len && !(items = route_alloc(m, (size_t)src->len * sizeof *items)))
			return TAP_E_FULL;
		for (uint32_t i = 0; i < src->len; i++) {
			int rc = copy_value(m, &items[i], &src->items[i], depth + 1, count);
			if (rc)
				return rc;
		}
		dst->items = items;
		return 0;
	}
	case TAP_RV_TABLE: {
		if (depth + 1 > m->lim.max_depth)
			return route_fail(m, TAP_E_FULL, "arguments nested deeper than %u", m->lim.max_depth);
		struct tap_route_field *f;
		int rc = copy_fields(m, &f, src->fields, src->len, depth + 1, count);
		dst->fields = f;
		return rc;
	}
	default:
		return 0;
	}
}

/* x-match as rabbit_exchange_type_headers validates it: a longstr all, any, all-with-x or any-with-x, or none. */
static int parse_xmatch(struct tap_route_model *m, const struct tap_route_field *args, size_t n, uint8_t *out)
{
	*out = ROUTE_XM_ALL;
	for (size_t i = 0; i < n; i++) {
		if (args[i].key_len != 7 || memcmp(args[i].key, "x-match", 7))
			continue;
		const struct tap_route_value *v = &args[i].v;
		if (v->kind != TAP_RV_STR)
			return route_fail(m, TAP_E_BAD_NUMBER, "x-match is not a string");
		static const char *names[] = {"all", "any", "all-with-x", "any-with-x"};
		for (uint8_t k = 0; k < 4; k++)
			if (strlen(names[k]) == v->len && !memcmp(names[k], v->s, v->len)) {
				*out = k;
				return 0;
			}
		return route_fail(m, TAP_E_BAD_NUMBER, "x-match '%.*s' (expected all, any, all-with-x or any-with-x)",
		                  (int)(v->len > 40 ? 40 : v->len), v->s);
	}
	return 0;
}

/* The topic trie node for a binding key, made as needed: one edge per word, '#' and '*' in their own links. */
static uint32_t topic_node(struct tap_route_model *m, uint32_t root, const char *key, size_t len)
{
	uint32_t n = root;
	if (len == 0)
		return n; /* zero words */
	size_t start = 0;
	for (size_t i = 0; i <= len; i++) {
		if (i < len && key[i] != '.')
			continue;
		const char *w = key + start;
		size_t wl = i - start;
		start = i + 1;
		uint32_t next;
		if (wl == 1 && (w[0] == '#' || w[0] == '*')) {
			bool hash = w[0] == '#';
			next = hash ? m->nodes[n].hash_child : m->nodes[n].star_child;
			if (next == TAP_ROUTE_NONE) {
				if ((next = new_node(m, hash)) == TAP_ROUTE_NONE)
					return TAP_ROUTE_NONE;
				if (hash)
					m->nodes[n].hash_child = next;
				else
					m->nodes[n].star_child = next;
			}
		} else {
			next = route_find(m, ROUTE_K(ROUTE_K_EDGE, n), w, wl);
			if (next == TAP_ROUTE_NONE) {
				char *ws = route_strdup(m, w, wl);
				if (!ws || (next = new_node(m, false)) == TAP_ROUTE_NONE ||
				    route_insert(m, ROUTE_K(ROUTE_K_EDGE, n), ws, wl, next))
					return TAP_ROUTE_NONE;
			}
		}
		n = next;
	}
	return n;
}

static int cmp_key(const char *a, size_t al, const char *b, size_t bl)
{
	int c = memcmp(a, b, al < bl ? al : bl);
	return c ? c : (al < bl ? -1 : al > bl);
}

/* Stable (lists:keysort): insertion sort, as binding arguments are few. */
static void sort_fields(struct tap_route_field *f, size_t n)
{
	for (size_t i = 1; i < n; i++) {
		struct tap_route_field t = f[i];
		size_t j = i;
		while (j > 0 && cmp_key(f[j - 1].key, f[j - 1].key_len, t.key, t.key_len) > 0) {
			f[j] = f[j - 1];
			j--;
		}
		f[j] = t;
	}
}

int tap_route_add_binding(struct tap_route_model *m, const char *vh, size_t vh_len, const char *src, size_t src_len,
                          bool to_exchange, const char *dest, size_t dest_len, const char *key, size_t key_len,
                          const struct tap_route_field *args, size_t n_args)
{
	uint32_t v;
	int rc = usable(m);
	if (rc || (rc = ensure_vhost(m, vh, vh_len, &v)))
		return rc;
	if (key_len > m->lim.max_key)
		return route_fail(m, TAP_E_FULL, "binding key of %zu bytes (at most %u)", key_len, m->lim.max_key);
	uint32_t x = route_find(m, ROUTE_K(ROUTE_K_EX, v), src, src_len);
	if (x == TAP_ROUTE_NONE)
		return route_fail(m, TAP_E_USAGE, "binding from exchange '%.*s', which is not declared",
		                  (int)(src_len > 80 ? 80 : src_len), src);
	uint32_t d = route_find(m, ROUTE_K(to_exchange ? ROUTE_K_EX : ROUTE_K_Q, v), dest, dest_len);
	if (d == TAP_ROUTE_NONE)
		return route_fail(m, TAP_E_USAGE, "binding to %s '%.*s', which is not declared",
		                  to_exchange ? "exchange" : "queue", (int)(dest_len > 80 ? 80 : dest_len), dest);
	if (m->n_b >= m->lim.max_bindings)
		return route_fail(m, TAP_E_FULL, "more than %u bindings", m->lim.max_bindings);
	if (route_grow(m, (void **)&m->b, &m->cap_b, sizeof *m->b, m->n_b + 1))
		return TAP_E_FULL;
	struct route_binding b = {
	    .ex = x, .dest = d, .to_ex = to_exchange, .next_ex = TAP_ROUTE_NONE, .next_node = TAP_ROUTE_NONE};
	if (!(b.key = route_strdup(m, key, key_len)))
		return TAP_E_FULL;
	b.key_len = (uint32_t)key_len;
	uint32_t count = 0;
	if ((rc = copy_fields(m, &b.args, args, n_args, 1, &count)))
		return rc;
	b.n_args = (uint32_t)n_args;
	sort_fields(b.args, n_args);
	uint32_t id = m->n_b;
	struct route_ex *xe = &m->ex[x];
	uint32_t node = TAP_ROUTE_NONE;
	switch (xe->type) {
	case TAP_RX_DIRECT:
		node = route_find(m, ROUTE_K(ROUTE_K_DIRECT, x), key, key_len);
		if (node == TAP_ROUTE_NONE) {
			if ((node = new_node(m, false)) == TAP_ROUTE_NONE ||
			    route_insert(m, ROUTE_K(ROUTE_K_DIRECT, x), b.key, key_len, node))
				return TAP_E_FULL;
		}
		break;
	case TAP_RX_TOPIC:
		if ((node = topic_node(m, xe->root, key, key_len)) == TAP_ROUTE_NONE)
			return TAP_E_FULL;
		break;
	case TAP_RX_HEADERS:
		if ((rc = parse_xmatch(m, b.args, b.n_args, &b.xmatch)))
			return rc;
		break;
	default:
		break;
	}
	if (node != TAP_ROUTE_NONE) {
		b.next_node = m->nodes[node].bind_head;
		m->nodes[node].bind_head = id;
	}
	xe = &m->ex[x];
	if (xe->bind_tail == TAP_ROUTE_NONE)
		xe->bind_head = id;
	else
		m->b[xe->bind_tail].next_ex = id;
	xe->bind_tail = id;
	m->b[id] = b;
	m->n_b++;
	return 0;
}

/* Whether a quantifier (*, +, ?, {n}) outside a bracket expression and not escaped is followed by * + or {: "e+++"
 * (found by fuzz_route_defs) made regcomp copy the tree once per '+', hundreds of MB for a 200-byte pattern. */
static bool stacked_quantifier(const char *p, size_t n)
{
	bool after_quantifier = false, in_bracket = false;
	for (size_t i = 0; i < n; i++) {
		char ch = p[i];
		if (in_bracket) {
			if (ch == ']' && p[i - 1] != '[' && !(i >= 2 && p[i - 1] == '^' && p[i - 2] == '['))
				in_bracket = false;
			continue;
		}
		if (ch == '\\') {
			i++;
			after_quantifier = false;
			continue;
		}
		if (after_quantifier && (ch == '*' || ch == '+' || ch == '{'))
			return true;
		after_quantifier = ch == '*' || ch == '+' || ch == '?' || ch == '}';
		in_bracket = ch == '[';
	}
	return false;
}

int tap_route_add_policy(struct tap_route_model *m, const char *vh, size_t vh_len, const char *name, size_t name_len,
                         const char *pattern, size_t pattern_len, const char *apply_to, int64_t priority,
                         const char *ae, size_t ae_len)
{
	uint32_t v;
	int rc = usable(m);
	if (rc || (rc = ensure_vhost(m, vh, vh_len, &v)))
		return rc;
	if (check_name(m, "policy", name_len) || (ae && check_name(m, "alternate exchange", ae_len)))
		return TAP_E_FULL;
	if (pattern_len > m->lim.max_pattern)
		return route_fail(m, TAP_E_FULL, "policy '%.*s': pattern of %zu bytes (at most %u)", (int)name_len,
		                  name, pattern_len, m->lim.max_pattern);
	if (memchr(pattern, '\0', pattern_len))
		return route_fail(m, TAP_E_USAGE, "policy '%.*s': pattern holds a NUL", (int)name_len, name);
	static const char *pcre_only[] = {"\\d", "\\D", "(?", "*?", "+?", "??", "}?", "\\h", "\\R", "\\p"};
	for (size_t i = 0; i < sizeof pcre_only / sizeof pcre_only[0]; i++)
		if (memmem(pattern, pattern_len, pcre_only[i], strlen(pcre_only[i])))
			return route_fail(m, TAP_E_USAGE,
			                  "policy '%.*s': pattern uses '%s', PCRE syntax the model does not take "
			                  "(POSIX extended regular expressions only)",
			                  (int)name_len, name, pcre_only[i]);
	if (stacked_quantifier(pattern, pattern_len))
		return route_fail(m, TAP_E_USAGE,
		                  "policy '%.*s': pattern repeats a repetition (as in 'a++'): PCRE refuses or reads it "
		                  "as possessive, and glibc's regcomp copies the expression for each one",
		                  (int)name_len, name);
	uint8_t apply;
	if (!strcmp(apply_to, "exchanges"))
		apply = ROUTE_APPLY_EXCHANGES;
	else if (!strcmp(apply_to, "all"))
		apply = ROUTE_APPLY_EXCHANGES | ROUTE_APPLY_QUEUES;
	else
		apply = ROUTE_APPLY_QUEUES; /* queues, classic_queues, quorum_queues, streams: not for exchanges */
	if (m->n_pol >= m->lim.max_policies)
		return route_fail(m, TAP_E_FULL, "more than %u policies", m->lim.max_policies);
	if (route_grow(m, (void **)&m->pol, &m->cap_pol, sizeof *m->pol, m->n_pol + 1))
		return TAP_E_FULL;
	/* regcomp's own memory is not counted: a pattern's length bounds it, and this charge stands for it */
	if (!charge(m, 64 * (uint64_t)pattern_len + 1024))
		return route_fail(m, TAP_E_FULL, "model larger than its limit of %llu bytes",
		                  (unsigned long long)m->lim.max_bytes);
	struct route_policy *p = &m->pol[m->n_pol];
	*p = (struct route_policy){.vhost = v, .apply = apply, .priority = priority};
	char *pat = route_strdup(m, pattern, pattern_len);
	if (!pat || !(p->name = route_strdup(m, name, name_len)))
		return TAP_E_FULL;
	p->name_len = (uint32_t)name_len;
	if (ae) {
		if (!(p->ae = route_strdup(m, ae, ae_len)))
			return TAP_E_FULL;
		p->ae_len = (uint32_t)ae_len;
		p->has_ae = true;
	}
	int err = regcomp(&p->re, pat, REG_EXTENDED | REG_NOSUB);
	if (err) {
		char msg[128];
		regerror(err, &p->re, msg, sizeof msg);
		return route_fail(m, TAP_E_USAGE, "policy '%.*s': pattern '%.*s': %s", (int)name_len, name,
		                  (int)(pattern_len > 80 ? 80 : pattern_len), pattern, msg);
	}
	p->re_ok = true;
	m->n_pol++;
	return 0;
}

static bool policy_matches(const struct route_policy *p, const struct route_ex *x)
{
	regmatch_t rm[1] = {{.rm_so = 0, .rm_eo = (regoff_t)x->name_len}};
	return regexec(&p->re, x->name, 1, rm, REG_STARTEND) == 0;
}

int tap_route_finish(struct tap_route_model *m)
{
	int rc = usable(m);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < m->n_ex; i++) {
		struct route_ex *x = &m->ex[i];
		const char *ae = NULL;
		size_t ae_len = 0;
		if (x->has_ae_arg) {
			ae = x->ae_arg;
			ae_len = x->ae_arg_len;
		} else {
			/* the highest priority wins; among equals the first declared (the broker's order is its
			 * table's: unspecified) */
			const struct route_policy *best = NULL;
			for (uint32_t k = 0; k < m->n_pol; k++) {
				const struct route_policy *p = &m->pol[k];
				if (p->vhost != x->vhost || !(p->apply & ROUTE_APPLY_EXCHANGES) ||
				    (best && p->priority <= best->priority) || !policy_matches(p, x))
					continue;
				best = p;
			}
			if (best && best->has_ae) {
				ae = best->ae;
				ae_len = best->ae_len;
				x->ae_policy = (uint32_t)(best - m->pol);
			}
		}
		if (ae) {
			x->has_ae = true;
			x->ae_name = ae;
			x->ae_name_len = (uint32_t)ae_len;
			x->ae = route_find(m, ROUTE_K(ROUTE_K_EX, x->vhost), ae, ae_len);
		}
	}
	uint32_t need = m->n_nodes + 1;
	if (route_grow(m, (void **)&m->work, &m->cap_work, sizeof *m->work, m->n_ex + 1) ||
	    route_grow(m, (void **)&m->out, &m->cap_out, sizeof *m->out, m->n_q + 1) ||
	    route_grow(m, (void **)&m->cur, &m->cap_cur, sizeof *m->cur, need) ||
	    route_grow(m, (void **)&m->nxt, &m->cap_nxt, sizeof *m->nxt, need))
		return TAP_E_FULL;
	m->finished = true;
	return 0;
}

void tap_route_counts(const struct tap_route_model *m, struct tap_route_counts *c)
{
	*c = (struct tap_route_counts){.vhosts = m->n_vh,
	                               .exchanges = m->n_ex,
	                               .queues = m->n_q,
	                               .bindings = m->n_b,
	                               .policies = m->n_pol,
	                               .unknown_type = m->n_unknown};
}

const char *tap_route_queue_name(const struct tap_route_model *m, uint32_t q, size_t *len)
{
	*len = m->q[q].name_len;
	return m->q[q].name;
}

const char *tap_route_outcome_name(enum tap_route_outcome o)
{
	switch (o) {
	case TAP_ROUTE_OK:
		return "ok";
	case TAP_ROUTE_NO_VHOST:
		return "no_vhost";
	case TAP_ROUTE_NO_EXCHANGE:
		return "no_exchange";
	case TAP_ROUTE_INTERNAL:
		return "internal";
	case TAP_ROUTE_UNKNOWN_TYPE:
		return "unknown_type";
	}
	return "?";
}
