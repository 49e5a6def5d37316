/* The topology judge (track_topo.h): --definitions' model asked about every publish. Its tables are made at
 * tap_track_set_topology (about 260 KB, fixed, so not counted in the tracking budget; the exchange names are): the
 * publish's headers converted for the model (at most TOPO_VALUES values: a longer table is not judged), the last
 * warning time per rule, vhost, exchange and key (TOPO_SEEN entries addressed by a 64-bit hash: a key pushed out by
 * another may warn again early), and the count of dropped publishes per exchange (TAP_TRACK_TOPOLOGY_EXCHANGES
 * names, the rest together). */
#include "track_topo.h"

#include "amqptap/route.h"
#include "amqptap/status.h"
#include "amqptap/table.h"

#include "track_record.h"
#include "track_warn.h"

#include <stdlib.h>
#include <string.h>

#define TOPO_VALUES 1024u
#define TOPO_SEEN 4096u
#define TOPO_DROP_SLOTS (2 * TAP_TRACK_TOPOLOGY_EXCHANGES)
#define TOPO_SHOWN 8u /* queue names a record shows */

struct topo_drop {
	char *name; /* NULL: empty slot */
	uint32_t len;
	uint64_t count;
};

struct trk_topo {
	struct tap_route_model *m;
	uint32_t n_vals, n_fields;
	struct tap_route_value vals[TOPO_VALUES];
	struct tap_route_field fields[TOPO_VALUES];
	struct {
		uint64_t hash;
		int64_t at;
	} seen[TOPO_SEEN];
	struct topo_drop drops[TOPO_DROP_SLOTS];
	uint32_t n_drops;
	uint64_t drops_other;
};

static uint64_t hash_mix(uint64_t h, const void *p, size_t len)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < len; i++)
		h = (h ^ b[i]) * UINT64_C(0x100000001b3);
	return (h ^ (len + 1)) * UINT64_C(0x100000001b3);
}

int tap_track_set_topology(struct tap_track *t, struct tap_route_model *m)
{
	if (!m) {
		if (t->topo)
			t->topo->m = NULL; /* the counts by exchange stay */
		t->topo_on = false;
		return 0;
	}
	/* the fixed tables are not counted in the budget (their size is the tap's, not the clients'); the exchange
	 * names of the counts are */
	if (!t->topo && !(t->topo = calloc(1, sizeof *t->topo)))
		return TAP_E_NOMEM;
	t->topo->m = m;
	t->topo_on = true;
	return 0;
}

void trk_topo_free(struct tap_track *t)
{
	struct trk_topo *s = t->topo;
	if (!s)
		return;
	for (uint32_t i = 0; i < TOPO_DROP_SLOTS; i++)
		tap_mem_free(&t->mem, s->drops[i].name, s->drops[i].len + 1);
	free(s);
	t->topo = NULL;
}

void tap_track_each_topology_drop(const struct tap_track *t, tap_track_drop_fn fn, void *ctx)
{
	const struct trk_topo *s = t->topo;
	if (!s)
		return;
	for (uint32_t i = 0; i < TOPO_DROP_SLOTS; i++)
		if (s->drops[i].name)
			fn(ctx, s->drops[i].name, s->drops[i].len, s->drops[i].count);
	if (s->drops_other)
		fn(ctx, NULL, 0, s->drops_other);
}

static void count_drop(struct tap_track *t, const struct tap_slice *x)
{
	struct trk_topo *s = t->topo;
	uint32_t i = (uint32_t)hash_mix(UINT64_C(0xcbf29ce484222325), x->ptr, x->len) % TOPO_DROP_SLOTS;
	for (;; i = (i + 1) % TOPO_DROP_SLOTS) {
		struct topo_drop *d = &s->drops[i];
		if (!d->name)
			break;
		if (d->len == x->len && !memcmp(d->name, x->ptr, x->len)) {
			d->count++;
			return;
		}
	}
	char *name = s->n_drops < TAP_TRACK_TOPOLOGY_EXCHANGES ? tap_mem_alloc(&t->mem, x->len + 1) : NULL;
	if (!name) {
		s->drops_other++;
		return;
	}
	memcpy(name, x->ptr, x->len);
	name[x->len] = '\0';
	s->drops[i] = (struct topo_drop){.name = name, .len = (uint32_t)x->len, .count = 1};
	s->n_drops++;
}

/* --- the publish's headers as the model's values -------------------------------------------------------------- */

static bool conv_level(struct trk_topo *s, const uint8_t *p, size_t len, bool array, uint32_t *first, uint32_t *n,
                       int depth);

static bool conv_field(struct trk_topo *s, const struct tap_field *f, struct tap_route_value *v, int depth)
{
	*v = (struct tap_route_value){.type = f->type};
	switch (f->type) {
	case 't':
		v->kind = TAP_RV_BOOL;
		v->b = f->i != 0;
		return true;
	case 'b':
	case 'B':
	case 's':
	case 'u':
	case 'I':
	case 'i':
	case 'l':
	case 'L':
		v->kind = TAP_RV_INT;
		v->i = f->i;
		return true;
	case 'T':
		v->kind = TAP_RV_INT;
		v->i = (int64_t)f->u;
		v->big = f->u > (uint64_t)INT64_MAX;
		return true;
	case 'f':
	case 'd':
		v->kind = TAP_RV_FLOAT;
		v->d = f->f;
		return true;
	case 'D':
		v->kind = TAP_RV_DECIMAL;
		v->scale = f->scale;
		v->i = f->i;
		return true;
	case 'S':
	case 'x':
		v->kind = TAP_RV_STR;
		v->s = (const char *)f->ptr;
		v->len = f->len;
		return true;
	case 'V':
		v->kind = TAP_RV_VOID;
		return true;
	case 'A':
	case 'F': {
		uint32_t first, n;
		if (!conv_level(s, f->ptr, f->len, f->type == 'A', &first, &n, depth + 1))
			return false;
		v->kind = f->type == 'A' ? TAP_RV_ARRAY : TAP_RV_TABLE;
		v->len = n;
		if (f->type == 'A')
			v->items = &s->vals[first];
		else
			v->fields = &s->fields[first];
		return true;
	}
	}
	return false;
}

/* One table or array: its entries take n consecutive places (fields for a table, values for an array) from *first,
 * reserved before the nested ones are converted. */
static bool conv_level(struct trk_topo *s, const uint8_t *p, size_t len, bool array, uint32_t *first, uint32_t *n,
                       int depth)
{
	if (depth > TAP_TABLE_MAX_DEPTH)
		return false;
	struct tap_table_it it;
	struct tap_field f;
	int rc;
	uint32_t count = 0;
	if (array)
		tap_array_it_init(&it, p, len);
	else
		tap_table_it_init(&it, p, len);
	while ((rc = tap_table_next(&it, &f)) == 1)
		count++;
	if (rc < 0)
		return false;
	uint32_t *used = array ? &s->n_vals : &s->n_fields;
	if (count > TOPO_VALUES - *used)
		return false;
	*first = *used;
	*n = count;
	*used += count;
	if (array)
		tap_array_it_init(&it, p, len);
	else
		tap_table_it_init(&it, p, len);
	for (uint32_t i = 0; i < count && tap_table_next(&it, &f) == 1; i++) {
		if (array) {
			if (!conv_field(s, &f, &s->vals[*first + i], depth))
				return false;
		} else {
			struct tap_route_field *rf = &s->fields[*first + i];
			rf->key = (const char *)f.name;
			rf->key_len = f.name_len;
			if (!conv_field(s, &f, &rf->v, depth))
				return false;
		}
	}
	return true;
}

/* --- judging ---------------------------------------------------------------------------------------------------- */

/* Whether rule may be written for this vhost, exchange and key now (at most once per interval). */
static bool due(struct tap_track *t, const struct tap_track_conn *c, enum tap_track_rule rule,
                const struct tap_slice *x, const struct tap_slice *rk, int64_t now_us)
{
	struct trk_topo *s = t->topo;
	uint64_t h = hash_mix(UINT64_C(0xcbf29ce484222325) + rule, c->vhost, strlen(c->vhost));
	h = hash_mix(hash_mix(h, x->ptr, x->len), rk->ptr, rk->len);
	uint32_t i = (uint32_t)(h >> 40) % TOPO_SEEN;
	int64_t every = t->conf.topology_interval_us;
	if (s->seen[i].hash == h && now_us - s->seen[i].at < every)
		return false;
	s->seen[i].hash = h;
	s->seen[i].at = now_us;
	return true;
}

static int cmp_name(const char *a, size_t al, const char *b, size_t bl)
{
	int r = memcmp(a, b, al < bl ? al : bl);
	return r ? r : (al < bl ? -1 : al > bl);
}

/* "topology":{"queues":[the first TOPO_SHOWN names, sorted],"count":N[,"alternate":true]} or {"outcome":O}. */
static void render(struct tap_buf *out, const struct tap_route_model *m, const struct tap_route_result *r)
{
	struct tap_json j;
	if (out->len)
		tap_buf_putc(out, ',');
	tap_buf_puts(out, "\"topology\":");
	tap_json_init(&j, out);
	tap_json_obj_begin(&j);
	if (r->outcome != TAP_ROUTE_OK) {
		tap_json_kv_str(&j, "outcome", tap_route_outcome_name(r->outcome));
		tap_json_obj_end(&j);
		return;
	}
	/* the smallest names, by selection: TOPO_SHOWN passes at most */
	tap_json_key(&j, "queues");
	tap_json_arr_begin(&j);
	const char *last = NULL;
	size_t last_len = 0;
	for (uint32_t k = 0; k < TOPO_SHOWN && k < r->n_queues; k++) {
		const char *best = NULL;
		size_t best_len = 0;
		for (uint32_t i = 0; i < r->n_queues; i++) {
			size_t l;
			const char *nm = tap_route_queue_name(m, r->queues[i], &l);
			if (last && cmp_name(nm, l, last, last_len) <= 0)
				continue;
			if (!best || cmp_name(nm, l, best, best_len) < 0) {
				best = nm;
				best_len = l;
			}
		}
		tap_json_strn(&j, best, best_len);
		last = best;
		last_len = best_len;
	}
	tap_json_arr_end(&j);
	tap_json_kv_uint(&j, "count", r->n_queues);
	if (r->alternate)
		tap_json_kv_bool(&j, "alternate", true);
	tap_json_obj_end(&j);
}

void trk_topo_publish(struct tap_track_conn *c, uint16_t id, const struct trk_chan *ch, const struct tap_publish *p,
                      int64_t now_us)
{
	struct tap_track *t = c->t;
	struct trk_topo *s = t->topo;
	t->topo_flags = 0;
	/* not judged: no memory kept its route, the login was not seen, or its headers were cut */
	if (!s->m || p->details_lost || !c->vhost || p->headers_cut)
		return;
	s->n_vals = s->n_fields = 0;
	uint32_t first = 0, n = 0;
	if (p->headers.len && !conv_level(s, p->headers.ptr, p->headers.len, false, &first, &n, 1))
		return;
	struct tap_route_msg msg = {.vhost = c->vhost,
	                            .vhost_len = strlen(c->vhost),
	                            .exchange = (const char *)p->exchange.ptr,
	                            .exchange_len = p->exchange.len,
	                            .key = (const char *)p->routing_key.ptr,
	                            .key_len = p->routing_key.len,
	                            .headers = n ? &s->fields[first] : NULL,
	                            .n_headers = n};
	struct tap_route_result r;
	if (tap_route(s->m, &msg, &r))
		return;
	t->st.topology_judged++;
	size_t before = t->extra.len;
	render(&t->extra, s->m, &r);
	if (t->extra.oom) { /* a cut member is no JSON: left out, as the other optional members are */
		t->extra.len = before;
		t->extra.oom = false;
		t->st.oom++;
	}
	if (r.outcome != TAP_ROUTE_OK)
		return;
	t->topo_flags = r.n_queues ? TRK_FLAG_TOPO_SOME : TRK_FLAG_TOPO_NONE;
	if (r.n_queues || p->mandatory)
		return;
	t->st.dropped_by_topology++;
	count_drop(t, &p->exchange);
	if (!due(t, c, TAP_TRACK_RULE_DROPPED_BY_TOPOLOGY, &p->exchange, &p->routing_key, now_us))
		return;
	uint64_t seq = ch && ch->mode == TRK_MODE_CONFIRM ? ch->next - ch->sel_off : 0;
	trk_record_topology_warning(&t->render, c, id, tap_track_rule_name(TAP_TRACK_RULE_DROPPED_BY_TOPOLOGY), seq,
	                            p->exchange, p->routing_key, NULL, now_us);
	trk_warn_written(t, TAP_TRACK_RULE_DROPPED_BY_TOPOLOGY);
}

void trk_topo_verdict(struct tap_track_conn *c, uint16_t ch, const struct trk_view *v, const struct trk_verdict *vd,
                      int64_t now_us)
{
	struct tap_track *t = c->t;
	const char *broker;
	if (vd->route == TAP_TRACK_ROUTE_RETURNED && (v->topo & TRK_FLAG_TOPO_SOME))
		broker = "returned";
	else if (vd->route == TAP_TRACK_ROUTE_ROUTED && (v->topo & TRK_FLAG_TOPO_NONE))
		broker = "routed";
	else
		return;
	if (!t->topo || v->route_lost)
		return;
	struct tap_slice x = {v->exchange, v->exchange_len}, rk = {v->routing_key, v->routing_key_len};
	if (!due(t, c, TAP_TRACK_RULE_TOPOLOGY_MISMATCH, &x, &rk, now_us))
		return;
	trk_record_topology_warning(&t->render, c, ch, tap_track_rule_name(TAP_TRACK_RULE_TOPOLOGY_MISMATCH),
	                            v->confirm_mode ? v->seq : 0, x, rk, broker, now_us);
	trk_warn_written(t, TAP_TRACK_RULE_TOPOLOGY_MISMATCH);
}
