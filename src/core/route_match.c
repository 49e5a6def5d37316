/* Lookups in the routing model (route.h): where a publish goes, and why (explain). The topic trie is walked as an
 * NFA: the set of nodes reached after each word, each node once per word (rabbit_exchange_type_topic's trie_match
 * walks the same trie depth first and may meet a node many times; the answer is the same set). So a lookup costs
 * the words times the nodes alive at once, never the number of bindings. */
#include "amqptap/route.h"

#include "amqptap/status.h"
#include "route_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- header values: Erlang's == on what rabbit_binary_parser makes ------------------------------------------- */

static bool num_eq_float(const struct tap_route_value *i, double d)
{
	if (d != d || d != trunc(d))
		return false;
	if (i->big) {
		if (!(d >= 9223372036854775808.0 && d < 18446744073709551616.0))
			return false;
		return (uint64_t)d == (uint64_t)i->i && (double)(uint64_t)i->i == d;
	}
	if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0))
		return false;
	return (int64_t)d == i->i && (double)i->i == d;
}

static bool value_eq(const struct tap_route_value *a, const struct tap_route_value *b);

/* Inside arrays and tables the type atoms are compared too ({long, 1} is not {double, 1.0}). */
static bool typed_eq(const struct tap_route_value *a, const struct tap_route_value *b)
{
	char ta = a->type == 'L' ? 'l' : a->type, tb = b->type == 'L' ? 'l' : b->type;
	return ta == tb && value_eq(a, b);
}

static bool value_eq(const struct tap_route_value *a, const struct tap_route_value *b)
{
	/* an empty array and an empty table are both [] in Erlang */
	bool la = a->kind == TAP_RV_ARRAY || a->kind == TAP_RV_TABLE;
	bool lb = b->kind == TAP_RV_ARRAY || b->kind == TAP_RV_TABLE;
	if (la && lb && a->len == 0 && b->len == 0)
		return true;
	if (a->kind == TAP_RV_INT && b->kind == TAP_RV_FLOAT)
		return num_eq_float(a, b->d);
	if (a->kind == TAP_RV_FLOAT && b->kind == TAP_RV_INT)
		return num_eq_float(b, a->d);
	if (a->kind != b->kind)
		return false;
	switch (a->kind) {
	case TAP_RV_VOID:
		return true;
	case TAP_RV_BOOL:
		return a->b == b->b;
	case TAP_RV_INT:
		return a->big == b->big && a->i == b->i;
	case TAP_RV_FLOAT:
		return a->d == b->d;
	case TAP_RV_STR:
		return a->len == b->len && (a->len == 0 || !memcmp(a->s, b->s, a->len));
	case TAP_RV_DECIMAL:
		return a->scale == b->scale && a->i == b->i;
	case TAP_RV_ARRAY:
		if (a->len != b->len)
			return false;
		for (uint32_t i = 0; i < a->len; i++)
			if (!typed_eq(&a->items[i], &b->items[i]))
				return false;
		return true;
	case TAP_RV_TABLE:
		if (a->len != b->len)
			return false;
		for (uint32_t i = 0; i < a->len; i++) {
			const struct tap_route_field *fa = &a->fields[i], *fb = &b->fields[i];
			if (fa->key_len != fb->key_len || (fa->key_len && memcmp(fa->key, fb->key, fa->key_len)) ||
			    !typed_eq(&fa->v, &fb->v))
				return false;
		}
		return true;
	}
	return false;
}

static int cmp_key(const char *a, size_t al, const char *b, size_t bl)
{
	int c = memcmp(a, b, al < bl ? al : bl);
	return c ? c : (al < bl ? -1 : al > bl);
}

static bool is_x(const struct tap_route_field *f)
{
	return f->key_len >= 2 && f->key[0] == 'x' && f->key[1] == '-';
}

static void why(char *reason, size_t cap, const char *fmt, const char *k, size_t kl)
{
	if (reason && cap)
		snprintf(reason, cap, fmt, (int)(kl > 60 ? 60 : kl), k);
}

/* headers_match/5 of rabbit_exchange_type_headers.erl, clause for clause, on key-sorted lists. */
static bool headers_match_sorted(const struct tap_route_field *p, size_t np, const struct tap_route_field *d, size_t nd,
                                 uint8_t kind, char *reason, size_t cap)
{
	bool all = true, any = false, want_all = kind == ROUTE_XM_ALL || kind == ROUTE_XM_ALL_X;
	bool with_x = kind == ROUTE_XM_ALL_X || kind == ROUTE_XM_ANY_X;
	size_t i = 0, j = 0;
	if (reason && cap)
		snprintf(reason, cap, want_all ? "every header matches" : "no header matches");
	for (;;) {
		if (want_all && !all)
			return false;
		if (!want_all && any) {
			if (reason && cap && i > 0)
				why(reason, cap, "header '%.*s' matches", p[i - 1].key, p[i - 1].key_len);
			return true;
		}
		if (i == np)
			return want_all ? all : any;
		const struct tap_route_field *pk = &p[i];
		if ((pk->key_len == 7 && !memcmp(pk->key, "x-match", 7)) || (is_x(pk) && !with_x)) {
			i++;
			continue;
		}
		if (j == nd) {
			if (want_all)
				why(reason, cap, "header '%.*s' is missing", pk->key, pk->key_len);
			all = false;
			i = np;
			continue;
		}
		int c = cmp_key(pk->key, pk->key_len, d[j].key, d[j].key_len);
		if (c > 0) {
			j++;
			continue;
		}
		if (c < 0) {
			if (want_all)
				why(reason, cap, "header '%.*s' is missing", pk->key, pk->key_len);
			i++;
			all = false;
			continue;
		}
		if (pk->v.kind == TAP_RV_VOID || value_eq(&pk->v, &d[j].v)) {
			any = true;
		} else {
			if (want_all)
				why(reason, cap, "header '%.*s' has another value", pk->key, pk->key_len);
			all = false;
		}
		i++;
		j++;
	}
}

/* A stable merge sort of the publish's headers into the model's scratch (lists:keysort). */
static void merge_sort(struct tap_route_field *a, struct tap_route_field *tmp, size_t n)
{
	if (n < 2)
		return;
	if (n <= 8) {
		for (size_t i = 1; i < n; i++) {
			struct tap_route_field t = a[i];
			size_t j = i;
			while (j > 0 && cmp_key(a[j - 1].key, a[j - 1].key_len, t.key, t.key_len) > 0) {
				a[j] = a[j - 1];
				j--;
			}
			a[j] = t;
		}
		return;
	}
	size_t h = n / 2;
	merge_sort(a, tmp, h);
	merge_sort(a + h, tmp, n - h);
	size_t i = 0, j = h, k = 0;
	while (i < h && j < n)
		tmp[k++] = cmp_key(a[j].key, a[j].key_len, a[i].key, a[i].key_len) < 0 ? a[j++] : a[i++];
	while (i < h)
		tmp[k++] = a[i++];
	while (j < n)
		tmp[k++] = a[j++];
	memcpy(a, tmp, n * sizeof *a);
}

static struct tap_route_field *sorted_copy(const struct tap_route_field *f, size_t n, struct tap_route_field *buf)
{
	if (n)
		memcpy(buf, f, n * sizeof *f);
	merge_sort(buf, buf + n, n);
	return buf;
}

bool tap_route_headers_match(const struct tap_route_field *args, size_t n_args, const struct tap_route_field *hdrs,
                             size_t n_hdrs, char *reason, size_t reason_cap)
{
	struct tap_route_field *pa = malloc((2 * n_args + 1) * sizeof *pa);
	struct tap_route_field *da = malloc((2 * n_hdrs + 1) * sizeof *da);
	bool r = false;
	if (pa && da) {
		uint8_t kind = ROUTE_XM_ALL;
		for (size_t i = 0; i < n_args; i++)
			if (args[i].key_len == 7 && !memcmp(args[i].key, "x-match", 7) &&
			    args[i].v.kind == TAP_RV_STR) {
				static const char *names[] = {"all", "any", "all-with-x", "any-with-x"};
				for (uint8_t k = 0; k < 4; k++)
					if (strlen(names[k]) == args[i].v.len &&
					    !memcmp(names[k], args[i].v.s, args[i].v.len))
						kind = k;
				break;
			}
		r = headers_match_sorted(sorted_copy(args, n_args, pa), n_args, sorted_copy(hdrs, n_hdrs, da), n_hdrs,
		                         kind, reason, reason_cap);
	}
	free(pa);
	free(da);
	return r;
}

/* --- topic: the slow matcher, for explain and the tests ------------------------------------------------------ */

struct words {
	uint32_t n;
	uint32_t *off, *len;
};

static bool split(const char *k, size_t len, struct words *w)
{
	uint32_t n = len ? 1 : 0;
	for (size_t i = 0; i < len; i++)
		n += k[i] == '.';
	w->n = n;
	w->off = malloc((n + 1) * sizeof *w->off);
	w->len = malloc((n + 1) * sizeof *w->len);
	if (!w->off || !w->len)
		return false;
	uint32_t wi = 0, start = 0;
	for (size_t i = 0; len && i <= len; i++)
		if (i == len || k[i] == '.') {
			w->off[wi] = start;
			w->len[wi++] = (uint32_t)(i - start);
			start = (uint32_t)i + 1;
		}
	return true;
}

static bool word_is(const char *k, const struct words *w, uint32_t i, char c)
{
	return w->len[i] == 1 && k[w->off[i]] == c;
}

bool tap_route_topic_match(const char *bkey, size_t blen, const char *rkey, size_t rlen, char *reason,
                           size_t reason_cap)
{
	struct words bw = {0}, rw = {0};
	bool ok = false;
	uint8_t *row = NULL, *prev = NULL;
	if (!split(bkey, blen, &bw) || !split(rkey, rlen, &rw))
		goto out;
	/* prev[j]: the first i binding words match the first j key words */
	row = calloc(rw.n + 1, 1);
	prev = calloc(rw.n + 1, 1);
	if (!row || !prev)
		goto out;
	prev[0] = 1;
	uint32_t fixed = 0;
	bool has_hash = false;
	for (uint32_t i = 0; i < bw.n; i++) {
		bool hash = word_is(bkey, &bw, i, '#'), star = word_is(bkey, &bw, i, '*');
		has_hash |= hash;
		fixed += !hash;
		for (uint32_t j = 0; j <= rw.n; j++) {
			if (hash)
				row[j] = prev[j] || (j > 0 && row[j - 1]);
			else
				row[j] = j > 0 && prev[j - 1] &&
				         (star || (bw.len[i] == rw.len[j - 1] &&
				                   !memcmp(bkey + bw.off[i], rkey + rw.off[j - 1], bw.len[i])));
		}
		uint8_t *t = prev;
		prev = row;
		row = t;
	}
	ok = prev[rw.n];
	if (!reason || !reason_cap)
		goto out;
	if (ok) {
		snprintf(reason, reason_cap, "the words match");
	} else if (!has_hash && bw.n != rw.n) {
		snprintf(reason, reason_cap, "%u word%s against %u", bw.n, bw.n == 1 ? "" : "s", rw.n);
	} else if (has_hash && fixed > rw.n) {
		snprintf(reason, reason_cap, "needs at least %u word%s, the key has %u", fixed, fixed == 1 ? "" : "s",
		         rw.n);
	} else if (!has_hash) {
		for (uint32_t i = 0; i < bw.n; i++)
			if (!word_is(bkey, &bw, i, '*') &&
			    (bw.len[i] != rw.len[i] || memcmp(bkey + bw.off[i], rkey + rw.off[i], bw.len[i]))) {
				snprintf(reason, reason_cap, "word %u: '%.*s' against '%.*s'", i + 1,
				         (int)(bw.len[i] > 40 ? 40 : bw.len[i]), bkey + bw.off[i],
				         (int)(rw.len[i] > 40 ? 40 : rw.len[i]), rkey + rw.off[i]);
				break;
			}
	} else {
		snprintf(reason, reason_cap, "the words around '#' do not match (%u against %u)", bw.n, rw.n);
	}
out:
	free(bw.off);
	free(bw.len);
	free(rw.off);
	free(rw.len);
	free(row);
	free(prev);
	return ok;
}

/* --- the lookup ---------------------------------------------------------------------------------------------- */

static void next_gen(struct tap_route_model *m)
{
	if (++m->gen == 0) {
		for (uint32_t i = 0; i < m->n_ex; i++)
			m->ex[i].mark = 0;
		for (uint32_t i = 0; i < m->n_q; i++)
			m->q[i].mark = 0;
		m->gen = 1;
	}
}

static void next_stamp(struct tap_route_model *m)
{
	if (++m->stamp == 0) {
		for (uint32_t i = 0; i < m->n_nodes; i++)
			m->nodes[i].mark = 0;
		m->stamp = 1;
	}
}

/* Adds node c and the '#' children below it (a '#' takes zero words) to set s. */
static inline void add_closure(struct tap_route_model *m, uint32_t *s, uint32_t *n, uint32_t c)
{
	while (c != TAP_ROUTE_NONE && m->nodes[c].mark != m->stamp) {
		m->nodes[c].mark = m->stamp;
		s[(*n)++] = c;
		c = m->nodes[c].hash_child;
	}
}

struct walk {
	struct tap_route_model *m;
	uint32_t n_work, n_out;
	bool alternate;
	bool unknown;
};

static inline void take(struct walk *w, const struct route_binding *b)
{
	struct tap_route_model *m = w->m;
	if (b->to_ex) {
		struct route_ex *x = &m->ex[b->dest];
		if (x->mark != m->gen) {
			x->mark = m->gen;
			m->work[w->n_work++] = b->dest;
		}
	} else {
		struct route_queue *q = &m->q[b->dest];
		if (q->mark != m->gen) {
			q->mark = m->gen;
			m->out[w->n_out++] = b->dest;
		}
	}
}

static uint32_t take_list(struct walk *w, uint32_t head)
{
	uint32_t n = 0;
	for (uint32_t b = head; b != TAP_ROUTE_NONE; b = w->m->b[b].next_node, n++)
		take(w, &w->m->b[b]);
	return n;
}

static uint32_t route_topic(struct walk *w, const struct route_ex *x, const char *key, size_t len)
{
	struct tap_route_model *m = w->m;
	uint32_t *cur = m->cur, *nxt = m->nxt, nc = 0, nn;
	next_stamp(m);
	add_closure(m, cur, &nc, x->root);
	size_t start = 0;
	for (size_t i = 0; len && i <= len && nc; i++) {
		if (i < len && key[i] != '.')
			continue;
		const char *word = key + start;
		size_t wl = i - start;
		start = i + 1;
		next_stamp(m);
		nn = 0;
		for (uint32_t k = 0; k < nc; k++) {
			const struct route_node *n = &m->nodes[cur[k]];
			if (n->is_hash)
				add_closure(m, nxt, &nn, cur[k]);
			if (n->star_child != TAP_ROUTE_NONE)
				add_closure(m, nxt, &nn, n->star_child);
			uint32_t c = route_find(m, ROUTE_K(ROUTE_K_EDGE, cur[k]), word, wl);
			if (c != TAP_ROUTE_NONE)
				add_closure(m, nxt, &nn, c);
		}
		uint32_t *t = cur;
		cur = nxt;
		nxt = t;
		nc = nn;
	}
	uint32_t taken = 0;
	for (uint32_t k = 0; k < nc; k++)
		taken += take_list(w, m->nodes[cur[k]].bind_head);
	return taken;
}

static uint32_t route_exchange(struct walk *w, const struct route_ex *x, const struct tap_route_msg *msg,
                               const struct tap_route_field *hdrs, size_t n_hdrs)
{
	struct tap_route_model *m = w->m;
	uint32_t taken = 0;
	uint32_t xid = (uint32_t)(x - m->ex);
	switch (x->type) {
	case TAP_RX_DIRECT: {
		uint32_t node = route_find(m, ROUTE_K(ROUTE_K_DIRECT, xid), msg->key, msg->key_len);
		return node == TAP_ROUTE_NONE ? 0 : take_list(w, m->nodes[node].bind_head);
	}
	case TAP_RX_FANOUT:
		for (uint32_t b = x->bind_head; b != TAP_ROUTE_NONE; b = m->b[b].next_ex, taken++)
			take(w, &m->b[b]);
		return taken;
	case TAP_RX_TOPIC:
		return route_topic(w, x, msg->key, msg->key_len);
	case TAP_RX_HEADERS:
		for (uint32_t b = x->bind_head; b != TAP_ROUTE_NONE; b = m->b[b].next_ex) {
			const struct route_binding *bd = &m->b[b];
			if (headers_match_sorted(bd->args, bd->n_args, hdrs, n_hdrs, bd->xmatch, NULL, 0)) {
				take(w, bd);
				taken++;
			}
		}
		return taken;
	case TAP_RX_UNKNOWN:
		w->unknown = true;
		return 1; /* not nothing: no alternate is tried for it */
	}
	return 0;
}

static void explain_exchange(struct tap_route_model *m, const struct route_ex *x, const struct tap_route_msg *msg,
                             const struct tap_route_field *hdrs, size_t n_hdrs, tap_route_why_fn fn, void *arg)
{
	char reason[200];
	for (uint32_t bi = x->bind_head; bi != TAP_ROUTE_NONE; bi = m->b[bi].next_ex) {
		const struct route_binding *b = &m->b[bi];
		bool ok = false;
		switch (x->type) {
		case TAP_RX_DIRECT:
			ok = b->key_len == msg->key_len && (!b->key_len || !memcmp(b->key, msg->key, b->key_len));
			snprintf(reason, sizeof reason, ok ? "the key equals the binding key" : "the key is another");
			break;
		case TAP_RX_FANOUT:
			ok = true;
			snprintf(reason, sizeof reason, "a fanout exchange takes every message");
			break;
		case TAP_RX_TOPIC:
			ok = tap_route_topic_match(b->key, b->key_len, msg->key, msg->key_len, reason, sizeof reason);
			break;
		case TAP_RX_HEADERS:
			ok = headers_match_sorted(b->args, b->n_args, hdrs, n_hdrs, b->xmatch, reason, sizeof reason);
			break;
		case TAP_RX_UNKNOWN:
			snprintf(reason, sizeof reason,
				 strcmp(x->type_name, TAP_ROUTE_OMITTED)
				     ? "exchange type '%s' is not modelled"
				     : "%s (rabbitmqctl export_definitions omits internal exchanges): not judged",
				 x->type_name);
			break;
		}
		const char *dn = b->to_ex ? m->ex[b->dest].name : m->q[b->dest].name;
		uint32_t dl = b->to_ex ? m->ex[b->dest].name_len : m->q[b->dest].name_len;
		struct tap_route_why wy = {.exchange = x->name,
		                           .exchange_len = x->name_len,
		                           .type = x->type,
		                           .key = b->key,
		                           .key_len = b->key_len,
		                           .to_exchange = b->to_ex,
		                           .dest = dn,
		                           .dest_len = dl,
		                           .matched = ok,
		                           .reason = reason};
		fn(arg, &wy);
	}
}

static int do_route(struct tap_route_model *m, const struct tap_route_msg *msg, struct tap_route_result *r,
                    tap_route_why_fn fn, void *arg)
{
	*r = (struct tap_route_result){.outcome = TAP_ROUTE_OK, .queues = m->out};
	if (!m->finished)
		return TAP_E_USAGE;
	next_gen(m);
	uint32_t v = route_find(m, ROUTE_K(ROUTE_K_VH, 0), msg->vhost, msg->vhost_len);
	if (v == TAP_ROUTE_NONE) {
		r->outcome = TAP_ROUTE_NO_VHOST;
		return 0;
	}
	if (msg->exchange_len == 0) {
		/* the default exchange: the queue named by the key; a direct reply-to is no queue */
		static const char reply[] = "amq.rabbitmq.reply-to.";
		if (msg->key_len >= sizeof reply - 1 && !memcmp(msg->key, reply, sizeof reply - 1))
			return 0;
		uint32_t q = route_find(m, ROUTE_K(ROUTE_K_Q, v), msg->key, msg->key_len);
		if (q != TAP_ROUTE_NONE)
			m->out[r->n_queues++] = q;
		if (fn) {
			struct tap_route_why wy = {.exchange = "",
			                           .type = TAP_RX_DIRECT,
			                           .key = msg->key,
			                           .key_len = msg->key_len,
			                           .dest = msg->key,
			                           .dest_len = msg->key_len,
			                           .matched = q != TAP_ROUTE_NONE,
			                           .reason = q != TAP_ROUTE_NONE
			                                         ? "the default exchange: the queue of "
			                                           "that name"
			                                         : "the default exchange: no queue of that "
			                                           "name"};
			fn(arg, &wy);
		}
		return 0;
	}
	uint32_t x0 = route_find(m, ROUTE_K(ROUTE_K_EX, v), msg->exchange, msg->exchange_len);
	if (x0 == TAP_ROUTE_NONE) {
		r->outcome = TAP_ROUTE_NO_EXCHANGE;
		return 0;
	}
	if (m->ex[x0].internal) {
		r->outcome = TAP_ROUTE_INTERNAL;
		return 0;
	}
	const struct tap_route_field *hdrs = NULL;
	size_t n_hdrs = msg->n_headers;
	if (n_hdrs) {
		if (n_hdrs > (UINT32_MAX - 1) / 2)
			return TAP_E_NOMEM;
		if (route_grow(m, (void **)&m->sorted, &m->cap_sorted, sizeof *m->sorted, (uint32_t)(2 * n_hdrs))) {
			m->broken = false; /* a lookup's scratch: the model stays good */
			return TAP_E_NOMEM;
		}
		hdrs = sorted_copy(msg->headers, n_hdrs, m->sorted);
	}
	struct walk w = {.m = m};
	m->ex[x0].mark = m->gen;
	m->work[w.n_work++] = x0;
	while (w.n_work) {
		const struct route_ex *x = &m->ex[m->work[--w.n_work]];
		if (fn)
			explain_exchange(m, x, msg, hdrs, n_hdrs, fn, arg);
		uint32_t taken = route_exchange(&w, x, msg, hdrs, n_hdrs);
		if (taken || !x->has_ae || x->ae == TAP_ROUTE_NONE || m->ex[x->ae].mark == m->gen)
			continue;
		struct route_ex *ae = &m->ex[x->ae];
		ae->mark = m->gen;
		m->work[w.n_work++] = x->ae;
		w.alternate = true;
		if (fn) {
			struct tap_route_why wy = {.exchange = x->name,
			                           .exchange_len = x->name_len,
			                           .type = x->type,
			                           .to_exchange = true,
			                           .dest = ae->name,
			                           .dest_len = ae->name_len,
			                           .matched = true,
			                           .reason = x->has_ae_arg
			                                         ? "no binding matched: its alternate-exchange "
			                                           "argument"
			                                         : "no binding matched: the alternate-exchange "
			                                           "of a policy",
			                           .alternate = ae->name,
			                           .alternate_len = ae->name_len};
			fn(arg, &wy);
		}
	}
	r->n_queues = w.n_out;
	r->alternate = w.alternate;
	if (w.unknown)
		r->outcome = TAP_ROUTE_UNKNOWN_TYPE;
	return 0;
}

int tap_route(struct tap_route_model *m, const struct tap_route_msg *msg, struct tap_route_result *r)
{
	return do_route(m, msg, r, NULL, NULL);
}

int tap_route_explain(struct tap_route_model *m, const struct tap_route_msg *msg, struct tap_route_result *r,
                      tap_route_why_fn why, void *arg)
{
	return do_route(m, msg, r, why, arg);
}
