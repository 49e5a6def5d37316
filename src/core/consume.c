/* The consumer tracker (amqptap/consume.h): consumers and the deliveries they have not settled, per channel of a
 * connection of the publish tracker, and the one `delivery` record each delivery ends in: at its settle (ack,
 * nack, reject), at once (auto-ack, a content never finished), or unknown when its channel or connection ends, the
 * client asks for a recover, or it is evicted. Memory is counted in the tracker's budget (--max-tracking-memory). */
#include "consume_int.h"

#include "amqptap/identity.h"

#include "track_budget.h"
#include "track_record.h"
#include "track_store.h"

#include <string.h>

/* ---- state ---- */

static struct csm_chan *chan_find(const struct csm_conn *k, uint16_t id)
{
	if (!k)
		return NULL;
	uint32_t lo = 0, hi = k->n_chans;
	while (lo < hi) {
		uint32_t mid = (lo + hi) / 2;
		if (k->chans[mid]->id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < k->n_chans && k->chans[lo]->id == id ? k->chans[lo] : NULL;
}

uint64_t csm_link_key(uint8_t identity_kind, uint64_t identity, bool has_message_id, struct tap_slice message_id)
{
	uint64_t key;
	if (identity_kind)
		key = identity;
	else if (has_message_id && message_id.len)
		key = tap_identity_of_id(message_id.ptr, message_id.len);
	else
		return 0;
	return key ? key : 1; /* 0 marks a free slot */
}

void csm_link_publish(struct tap_track *t, uint64_t key, int64_t now_us)
{
	t->csm_links[key & (CSM_LINKS - 1)] = (struct csm_link){key, now_us};
}

/* When the publish of this key was seen, 0: not seen (or forgotten). */
static int64_t link_find(const struct tap_track *t, uint64_t key)
{
	if (!t->csm_links || !key)
		return 0;
	const struct csm_link *l = &t->csm_links[key & (CSM_LINKS - 1)];
	return l->key == key ? l->t_pub : 0;
}

/* The channel, created when new; NULL when out of memory. */
static struct csm_chan *chan_get(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	struct tap_track *t = c->t;
	/* from the first consumer on, publishes are remembered for their deliveries (unless that would take more
	 * than an eighth of the budget) */
	size_t links = CSM_LINKS * sizeof *t->csm_links;
	if (!t->csm_links && links <= t->conf.max_memory / 8 && trk_fits(t, links))
		t->csm_links = trk_alloc_in_budget(t, links, now_us);
	struct csm_chan *ch = chan_find(c->csm, id);
	if (ch)
		return ch;
	/* a new channel only within the budget (trk_alloc_in_budget would go past it once nothing is left to evict):
	 * thousands of channels with a delivery each must not grow the tap past it; its deliveries are then written at
	 * once (tap_consume_deliver) */
	uint32_t cap = c->csm ? c->csm->cap_chans : 0, n = c->csm ? c->csm->n_chans : 0;
	uint64_t need = tap_mem_cost(sizeof *ch) + (c->csm ? 0 : tap_mem_cost(sizeof *c->csm)) +
	                (n == cap ? tap_mem_cost((cap ? cap * 2 : CSM_CHANS_MIN) * sizeof ch) : 0);
	trk_make_room(t, need, now_us);
	if (!trk_fits(t, need))
		return NULL;
	if (!c->csm && !(c->csm = trk_alloc_in_budget(t, sizeof *c->csm, now_us)))
		return NULL;
	struct csm_conn *k = c->csm;
	if (k->n_chans == k->cap_chans) {
		cap = k->cap_chans ? k->cap_chans * 2 : CSM_CHANS_MIN;
		struct csm_chan **v = trk_alloc_in_budget(t, cap * sizeof *v, now_us);
		if (!v)
			return NULL;
		if (k->n_chans)
			memcpy(v, k->chans, k->n_chans * sizeof *v);
		trk_free(t, k->chans, k->cap_chans * sizeof *k->chans);
		k->chans = v;
		k->cap_chans = cap;
	}
	if (!(ch = trk_alloc_in_budget(t, sizeof *ch, now_us)))
		return NULL;
	ch->id = id;
	uint32_t at = 0;
	while (at < k->n_chans && k->chans[at]->id < id)
		at++;
	memmove(k->chans + at + 1, k->chans + at, (k->n_chans - at) * sizeof *k->chans);
	k->chans[at] = ch;
	k->n_chans++;
	return ch;
}

static size_t blob_len(const struct csm_dlv *d)
{
	return (size_t)d->ctag_len + d->queue_len + d->exchange_len + d->rk_len + d->mid_len;
}

static void consumer_free(struct tap_track *t, struct csm_consumer *k)
{
	if (k->tag)
		trk_free(t, k->tag, (size_t)k->tag_len + 1);
	if (k->queue)
		trk_free(t, k->queue, (size_t)k->queue_len + 1);
}

static void chan_free(struct tap_track_conn *c, struct csm_chan *ch)
{
	struct tap_track *t = c->t;
	struct csm_conn *k = c->csm;
	for (uint32_t i = ch->head; i < ch->len; i++) {
		struct csm_dlv *d = &ch->dlv[i];
		if (!(d->flags & CSM_FLAG_DONE) && d->blob)
			trk_free(t, d->blob, blob_len(d));
	}
	k->unacked -= ch->live;
	t->csm_st.unacked -= ch->live;
	trk_free(t, ch->dlv, ch->cap * sizeof *ch->dlv);
	for (uint32_t i = 0; i < ch->n_cons; i++)
		consumer_free(t, &ch->cons[i]);
	t->csm_st.consumers_open -= ch->n_cons_started;
	trk_free(t, ch->cons, ch->cap_cons * sizeof *ch->cons);
	for (uint8_t i = 0; i < ch->gets_len; i++) {
		struct csm_get *g = &ch->gets[(ch->gets_head + i) % TAP_CONSUME_GETS_MAX];
		if (g->queue)
			trk_free(t, g->queue, (size_t)g->queue_len + 1);
	}
	uint32_t at = 0;
	while (k->chans[at] != ch)
		at++;
	memmove(k->chans + at, k->chans + at + 1, (k->n_chans - at - 1) * sizeof *k->chans);
	k->n_chans--;
	trk_free(t, ch, sizeof *ch);
}

void csm_conn_free(struct tap_track_conn *c)
{
	struct csm_conn *k = c->csm;
	if (!k)
		return;
	while (k->n_chans)
		chan_free(c, k->chans[k->n_chans - 1]);
	trk_free(c->t, k->chans, k->cap_chans * sizeof *k->chans);
	trk_free(c->t, k, sizeof *k);
	c->csm = NULL;
}

/* ---- records ---- */

static void write_delivery(struct tap_track_conn *c, uint16_t ch, const struct csm_view *v,
                           const struct csm_outcome *o, int64_t now_us)
{
	struct tap_track *t = c->t;
	csm_record_delivery(&t->render, c, ch, v, o, now_us);
	trk_emit(t);
	t->csm_st.delivery_records++;
	t->csm_st.by_outcome[o->outcome]++;
	if (t->csm_hook) { /* a get-ok whose get the tap did not see names no queue */
		bool named = v->has_queue && !v->details_lost;
		struct tap_slice q = {named ? v->queue : NULL, named ? v->queue_len : 0};
		t->csm_hook(t->csm_hook_ctx, q, o->outcome);
	}
	if (o->outcome <= TAP_CONSUME_OUT_REJECT)
		tap_hist_add(&t->csm_hist, o->t_settle - v->t_dlv);
	if (o->requeue)
		t->csm_st.requeued++;
}

static void write_consumer(struct tap_track_conn *c, const struct csm_chan *ch, const struct csm_consumer *k,
                           const char *event, const char *by, int64_t now_us)
{
	csm_record_consumer(&c->t->render, c, ch, k, event, by, now_us);
	trk_emit(c->t);
}

/* ---- warnings (src/DESIGN.md §4): each consumer rule once per channel, counted with the publisher rules ---- */

static uint8_t rule_bit(enum tap_track_rule rule)
{
	return (uint8_t)(1u << (rule - TAP_TRACK_RULE_CONSUMER_STALLED));
}

static void warn_once(struct tap_track_conn *c, struct csm_chan *ch, enum tap_track_rule rule,
                      const struct csm_warn *w, int64_t now_us)
{
	struct tap_track *t = c->t;
	if (ch->warned & rule_bit(rule))
		return;
	ch->warned |= rule_bit(rule);
	csm_record_warning(&t->render, c, ch->id, tap_track_rule_name(rule), w, now_us);
	trk_emit(t);
	t->st.warnings++;
	t->st.warnings_by_rule[rule]++;
}

/* The unacked deliveries at which the channel's consumers get nothing more from the broker (0: no prefetch). */
static uint64_t stall_threshold(const struct csm_chan *ch)
{
	if (!ch->qos_seen || !ch->prefetch)
		return 0;
	uint64_t per = ch->global || ch->n_cons_started < 2 ? 1 : ch->n_cons_started;
	return (uint64_t)ch->prefetch * per;
}

/* The first delivery of ch still unacked (ch->live > 0). */
static const struct csm_dlv *oldest_unacked(const struct csm_chan *ch)
{
	for (uint32_t i = ch->head; i < ch->len; i++)
		if (!(ch->dlv[i].flags & CSM_FLAG_DONE))
			return &ch->dlv[i];
	return NULL;
}

static int64_t chan_tick(struct tap_track_conn *c, struct csm_chan *ch, int64_t now_us)
{
	const struct tap_track_conf *conf = &c->t->conf;
	int64_t next = INT64_MAX;
	const struct csm_dlv *d = ch->live ? oldest_unacked(ch) : NULL;
	if (!d)
		return next;
	struct csm_view v;
	csm_view_of(&v, d);
	if (!(ch->warned & rule_bit(TAP_TRACK_RULE_UNACKED_NEAR_TIMEOUT))) {
		int64_t at = d->t_dlv + conf->consumer_timeout_us / 10 * 8;
		if (now_us >= at) {
			struct csm_warn w = {.v = &v, .k1 = "unacked_us", .v1 = now_us - d->t_dlv,
			                     .k2 = "consumer_timeout_us", .v2 = conf->consumer_timeout_us};
			warn_once(c, ch, TAP_TRACK_RULE_UNACKED_NEAR_TIMEOUT, &w, now_us);
		} else if (at < next) {
			next = at;
		}
	}
	uint64_t full = stall_threshold(ch);
	if (full && ch->live >= full && !(ch->warned & rule_bit(TAP_TRACK_RULE_CONSUMER_STALLED))) {
		int64_t since = ch->t_full > ch->t_settle ? ch->t_full : ch->t_settle;
		int64_t at = since + conf->stall_after_us;
		if (now_us >= at) {
			struct csm_warn w = {.v = &v, .k1 = "unacked", .v1 = (int64_t)ch->live, .k2 = "stalled_us",
			                     .v2 = now_us - since};
			warn_once(c, ch, TAP_TRACK_RULE_CONSUMER_STALLED, &w, now_us);
		} else if (at < next) {
			next = at;
		}
	}
	return next;
}

int64_t csm_tick(struct tap_track *t, int64_t now_us)
{
	int64_t next = INT64_MAX;
	for (struct tap_track_conn *c = t->conns; c; c = c->next) {
		if (!c->csm)
			continue;
		for (uint32_t i = 0; i < c->csm->n_chans; i++) {
			int64_t d = chan_tick(c, c->csm->chans[i], now_us);
			if (d < next)
				next = d;
		}
	}
	return next;
}

/* A delivery was stored at now_us: the time rules may run out for it from then on. */
static void due_from(struct tap_track *t, int64_t now_us)
{
	int64_t near = t->conf.consumer_timeout_us / 10 * 8;
	int64_t soonest = t->conf.stall_after_us < near ? t->conf.stall_after_us : near;
	if (now_us + soonest < t->csm_due)
		t->csm_due = now_us + soonest;
}

static uint64_t loop_key(const struct csm_view *v)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325); /* FNV-1a */
	const uint8_t *parts[] = {v->mid, v->exchange, v->rk};
	size_t lens[] = {v->mid_len, v->exchange_len, v->rk_len};
	for (size_t k = 0; k < (v->has_message_id ? 1u : 3u); k++) {
		for (size_t i = 0; i < lens[k]; i++)
			h = (h ^ parts[k][i]) * UINT64_C(0x100000001b3);
		h = (h ^ 0xff) * UINT64_C(0x100000001b3);
	}
	if (!v->has_message_id)
		h ^= v->body_size * UINT64_C(0x9e3779b97f4a7c15);
	return h ? h : 1;
}

/* requeue_loop: a redelivered message seen TAP_CONSUME_LOOP_REDELIVERIES times within TAP_CONSUME_LOOP_WINDOW_US. */
static void note_redelivery(struct tap_track_conn *c, struct csm_chan *ch, const struct csm_view *v, int64_t now_us)
{
	if (ch->warned & rule_bit(TAP_TRACK_RULE_REQUEUE_LOOP) || v->details_lost)
		return;
	uint64_t key = loop_key(v);
	struct csm_redelivery *e = NULL, *victim = &ch->loop[0];
	for (int i = 0; i < CSM_LOOP_SLOTS; i++) {
		if (ch->loop[i].key == key)
			e = &ch->loop[i];
		else if (ch->loop[i].n < victim->n)
			victim = &ch->loop[i];
	}
	if (!e || now_us - e->t_first > TAP_CONSUME_LOOP_WINDOW_US) {
		e = e ? e : victim;
		*e = (struct csm_redelivery){.key = key, .n = 0, .t_first = now_us};
	}
	if (++e->n >= TAP_CONSUME_LOOP_REDELIVERIES) {
		struct csm_warn w = {.v = v, .k1 = "redeliveries", .v1 = e->n, .k2 = "within_us",
		                     .v2 = now_us - e->t_first};
		warn_once(c, ch, TAP_TRACK_RULE_REQUEUE_LOOP, &w, now_us);
	}
}

/* The delivery at i of ch gets its record and leaves the unacked ones (a hole until the head passes it). */
static void dlv_end(struct tap_track_conn *c, struct csm_chan *ch, uint32_t i, const struct csm_outcome *o,
                    int64_t now_us)
{
	struct tap_track *t = c->t;
	struct csm_dlv *d = &ch->dlv[i];
	struct csm_view v;
	csm_view_of(&v, d);
	write_delivery(c, ch->id, &v, o, now_us);
	if (d->blob)
		trk_free(t, d->blob, blob_len(d));
	d->blob = NULL;
	d->flags |= CSM_FLAG_DONE;
	ch->live--;
	c->csm->unacked--;
	t->csm_st.unacked--;
}

/* Moves the head past settled deliveries; packs the ring when holes take most of it (a client that acks all but one
 * old delivery must not make it grow with every later one). */
static void chan_trim(struct tap_track *t, struct csm_chan *ch)
{
	while (ch->head < ch->len && (ch->dlv[ch->head].flags & CSM_FLAG_DONE))
		ch->head++;
	if (ch->head == ch->len) {
		ch->head = ch->len = 0;
		if (ch->cap > 64) { /* a burst is over: its room goes back */
			trk_free(t, ch->dlv, ch->cap * sizeof *ch->dlv);
			ch->dlv = NULL;
			ch->cap = 0;
		}
		return;
	}
	if (ch->len - ch->head > 2 * ch->live + 64) {
		uint32_t n = 0;
		for (uint32_t i = ch->head; i < ch->len; i++)
			if (!(ch->dlv[i].flags & CSM_FLAG_DONE))
				ch->dlv[n++] = ch->dlv[i];
		ch->head = 0;
		ch->len = n;
	}
}

/* Every unacked delivery of ch ends unknown with reason r. */
static void chan_end_unacked(struct tap_track_conn *c, struct csm_chan *ch, const struct csm_reason *r,
                             int64_t now_us)
{
	struct csm_outcome o = {.outcome = TAP_CONSUME_OUT_UNKNOWN, .reason = r};
	for (uint32_t i = ch->head; i < ch->len && ch->live; i++)
		if (!(ch->dlv[i].flags & CSM_FLAG_DONE))
			dlv_end(c, ch, i, &o, now_us);
	chan_trim(c->t, ch);
}

/* The channel is gone: its unacked deliveries end unknown (r), its consumers end (by), its state is freed. */
static void chan_end(struct tap_track_conn *c, struct csm_chan *ch, const struct csm_reason *r, const char *by,
                     int64_t now_us)
{
	chan_end_unacked(c, ch, r, now_us);
	for (uint32_t i = 0; i < ch->n_cons; i++)
		if (ch->cons[i].started)
			write_consumer(c, ch, &ch->cons[i], "cancel", by, now_us);
	chan_free(c, ch);
}

void csm_conn_end(struct tap_track_conn *c, const struct trk_reason *r, int64_t now_us)
{
	if (!c->csm)
		return;
	struct csm_reason why = {.by = "connection_closed", .peer = r->by, .has_code = r->has_code, .code = r->code,
	                         .text = r->text, .text_len = r->text_len};
	while (c->csm->n_chans)
		chan_end(c, c->csm->chans[0], &why, "connection_closed", now_us);
	csm_conn_free(c);
}

/* ---- consumers ---- */

static struct csm_consumer *consumer_find(struct csm_chan *ch, struct tap_slice tag, bool started)
{
	for (uint32_t i = 0; i < ch->n_cons; i++) {
		struct csm_consumer *k = &ch->cons[i];
		if (k->started == started && k->tag && k->tag_len == tag.len && !memcmp(k->tag, tag.ptr, tag.len))
			return k;
	}
	return NULL;
}

static void consumer_remove(struct tap_track *t, struct csm_chan *ch, struct csm_consumer *k)
{
	if (k->started) {
		ch->n_cons_started--;
		t->csm_st.consumers_open--;
	}
	consumer_free(t, k);
	uint32_t at = (uint32_t)(k - ch->cons);
	memmove(ch->cons + at, ch->cons + at + 1, (ch->n_cons - at - 1) * sizeof *ch->cons);
	ch->n_cons--;
}

static void consumer_start(struct tap_track_conn *c, struct csm_chan *ch, struct csm_consumer *k, int64_t now_us)
{
	k->started = true;
	k->t_start = now_us;
	ch->n_cons_started++;
	c->t->csm_st.consumers_open++;
	c->t->csm_st.consumers_total++;
	write_consumer(c, ch, k, "consume", NULL, now_us);
	if (!k->no_ack && (!ch->qos_seen || !ch->prefetch)) {
		struct csm_warn w = {.has_consumer = true};
		if (k->tag)
			w.ctag = (struct tap_slice){(const uint8_t *)k->tag, k->tag_len};
		if (k->queue)
			w.queue = (struct tap_slice){(const uint8_t *)k->queue, k->queue_len};
		warn_once(c, ch, TAP_TRACK_RULE_UNBOUNDED_PREFETCH, &w, now_us);
	}
}

/* A copy of s (at most 255 bytes, a short string) into *dst; false when out of memory. */
static bool keep_short(struct tap_track_conn *c, char **dst, uint8_t *len, struct tap_slice s, int64_t now_us)
{
	size_t n = s.len > 255 ? 255 : s.len;
	trk_make_room(c->t, tap_mem_cost(n + 1), now_us);
	*dst = trk_dup(c->t, s.ptr, n);
	*len = *dst ? (uint8_t)n : 0;
	if (!*dst)
		c->t->st.oom++;
	return *dst != NULL;
}

void tap_consume_consume(struct tap_track_conn *c, uint16_t id, struct tap_slice tag, struct tap_slice queue,
                         bool no_ack, bool exclusive, bool nowait, int64_t now_us)
{
	struct tap_track *t = c->t;
	struct csm_chan *ch = chan_get(c, id, now_us);
	if (!ch || ch->n_cons >= TAP_CONSUME_CONSUMERS_MAX)
		return; /* its deliveries are then taken as needing acks, from an unknown queue */
	if (ch->n_cons == ch->cap_cons) {
		uint32_t cap = ch->cap_cons ? ch->cap_cons * 2 : 2;
		struct csm_consumer *v = trk_alloc_in_budget(t, cap * sizeof *v, now_us);
		if (!v)
			return;
		if (ch->n_cons)
			memcpy(v, ch->cons, ch->n_cons * sizeof *v);
		trk_free(t, ch->cons, ch->cap_cons * sizeof *ch->cons);
		ch->cons = v;
		ch->cap_cons = cap;
	}
	struct csm_consumer *k = &ch->cons[ch->n_cons++];
	*k = (struct csm_consumer){.no_ack = no_ack, .exclusive = exclusive};
	(void)keep_short(c, &k->tag, &k->tag_len, tag, now_us);
	(void)keep_short(c, &k->queue, &k->queue_len, queue, now_us);
	if (nowait)
		consumer_start(c, ch, k, now_us);
}

void tap_consume_consume_ok(struct tap_track_conn *c, uint16_t id, struct tap_slice tag, int64_t now_us)
{
	struct csm_chan *ch = chan_find(c->csm, id);
	if (!ch)
		return;
	for (uint32_t i = 0; i < ch->n_cons; i++) { /* the broker answers consumes in order */
		struct csm_consumer *k = &ch->cons[i];
		if (k->started)
			continue;
		if (!k->tag || k->tag_len != tag.len || memcmp(k->tag, tag.ptr, tag.len)) {
			if (k->tag)
				trk_free(c->t, k->tag, (size_t)k->tag_len + 1);
			(void)keep_short(c, &k->tag, &k->tag_len, tag, now_us); /* the broker named it */
		}
		consumer_start(c, ch, k, now_us);
		return;
	}
}

void tap_consume_cancel(struct tap_track_conn *c, uint16_t id, struct tap_slice tag, enum tap_peer by, bool nowait,
                        int64_t now_us)
{
	struct csm_chan *ch = chan_find(c->csm, id);
	struct csm_consumer *k = ch ? consumer_find(ch, tag, true) : NULL;
	if (!k)
		return;
	if (by == TAP_BY_CLIENT && !nowait) {
		k->cancelling = true;
		return;
	}
	write_consumer(c, ch, k, "cancel", by == TAP_BY_BROKER ? "broker" : "client", now_us);
	consumer_remove(c->t, ch, k);
}

void tap_consume_cancel_ok(struct tap_track_conn *c, uint16_t id, struct tap_slice tag, int64_t now_us)
{
	struct csm_chan *ch = chan_find(c->csm, id);
	struct csm_consumer *k = ch ? consumer_find(ch, tag, true) : NULL;
	if (!k)
		return;
	write_consumer(c, ch, k, "cancel", "client", now_us);
	consumer_remove(c->t, ch, k);
}

void tap_consume_qos(struct tap_track_conn *c, uint16_t id, uint16_t prefetch, bool global, int64_t now_us)
{
	struct csm_chan *ch = chan_get(c, id, now_us);
	if (!ch)
		return;
	ch->qos_seen = true;
	ch->prefetch = prefetch;
	ch->global = ch->global || global;
	if (global) {
		struct csm_warn w = {.k1 = "prefetch", .v1 = prefetch};
		warn_once(c, ch, TAP_TRACK_RULE_GLOBAL_QOS, &w, now_us);
	}
}

/* ---- basic.get ---- */

void tap_consume_get(struct tap_track_conn *c, uint16_t id, struct tap_slice queue, bool no_ack, int64_t now_us)
{
	struct csm_chan *ch = chan_get(c, id, now_us);
	if (!ch)
		return;
	if (ch->gets_len == TAP_CONSUME_GETS_MAX) /* a client that never waits: the oldest answer finds no queue */
		tap_consume_get_empty(c, id, now_us);
	struct csm_get *g = &ch->gets[(ch->gets_head + ch->gets_len++) % TAP_CONSUME_GETS_MAX];
	*g = (struct csm_get){.no_ack = no_ack};
	(void)keep_short(c, &g->queue, &g->queue_len, queue, now_us);
}

/* The oldest basic.get waiting is answered: *g takes it (its queue is the caller's to free); false when none. */
static bool get_pop(struct csm_chan *ch, struct csm_get *g)
{
	if (!ch->gets_len)
		return false;
	*g = ch->gets[ch->gets_head];
	ch->gets_head = (uint8_t)((ch->gets_head + 1) % TAP_CONSUME_GETS_MAX);
	ch->gets_len--;
	return true;
}

void tap_consume_get_empty(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	(void)now_us;
	struct csm_chan *ch = chan_find(c->csm, id);
	struct csm_get g;
	if (ch && get_pop(ch, &g) && g.queue)
		trk_free(c->t, g.queue, (size_t)g.queue_len + 1);
}

/* ---- deliveries ---- */

/* Where the delivery of this tag is in ch, or where it would go. */
static uint32_t dlv_lower_bound(const struct csm_chan *ch, uint64_t tag)
{
	uint32_t lo = ch->head, hi = ch->len;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (ch->dlv[mid].tag < tag)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* How many unacked deliveries ch keeps (consume.h). */
static uint32_t chan_bound(const struct csm_chan *ch)
{
	if (!ch->qos_seen || !ch->prefetch)
		return TAP_CONSUME_UNACKED_CAP;
	uint64_t per = ch->n_cons_started > 1 ? ch->n_cons_started : 1;
	uint64_t b = (uint64_t)ch->prefetch * per + TAP_CONSUME_GET_SLACK;
	return b < TAP_CONSUME_UNACKED_CAP ? (uint32_t)b : TAP_CONSUME_UNACKED_CAP;
}

static void evict_oldest(struct tap_track_conn *c, struct csm_chan *ch, const char *text, int64_t now_us)
{
	const struct csm_reason r = {.by = "evicted", .text = (const uint8_t *)text, .text_len = strlen(text)};
	struct csm_outcome o = {.outcome = TAP_CONSUME_OUT_UNKNOWN, .reason = &r};
	uint32_t i = ch->head;
	while (i < ch->len && (ch->dlv[i].flags & CSM_FLAG_DONE))
		i++;
	if (i == ch->len)
		return;
	dlv_end(c, ch, i, &o, now_us);
	c->t->csm_st.evicted++;
	chan_trim(c->t, ch);
}

#define CSM_RING_MIN 8u /* a channel's first ring of unacked deliveries */

/* Room in ch's ring for one more at its end; false when out of memory. */
static bool ring_reserve(struct tap_track_conn *c, struct csm_chan *ch, int64_t now_us)
{
	if (ch->len < ch->cap)
		return true;
	if (ch->head > ch->cap / 2) { /* half of it is settled: slide down */
		memmove(ch->dlv, ch->dlv + ch->head, (ch->len - ch->head) * sizeof *ch->dlv);
		ch->len -= ch->head;
		ch->head = 0;
		return true;
	}
	struct tap_track *t = c->t;
	uint32_t cap = ch->cap ? ch->cap * 2 : CSM_RING_MIN;
	struct csm_dlv *v = trk_alloc_in_budget(t, cap * sizeof *v, now_us);
	if (!v)
		return false;
	if (ch->len > ch->head)
		memcpy(v, ch->dlv + ch->head, (ch->len - ch->head) * sizeof *v);
	trk_free(t, ch->dlv, ch->cap * sizeof *ch->dlv);
	ch->len -= ch->head;
	ch->head = 0;
	ch->dlv = v;
	ch->cap = cap;
	return true;
}

static uint8_t short_len(size_t n)
{
	return n > 255 ? 255 : (uint8_t)n;
}

void tap_consume_deliver(struct tap_track_conn *c, uint16_t id, const struct tap_delivery *d, int64_t now_us)
{
	struct tap_track *t = c->t;
	t->csm_st.deliveries++;
	if (d->redelivered)
		t->csm_st.redelivered++;
	struct csm_chan *ch = chan_get(c, id, now_us);
	struct tap_slice queue = {NULL, 0};
	bool no_ack = false, has_queue = false;
	struct csm_get g = {0};
	if (ch && d->get) {
		if (get_pop(ch, &g)) {
			no_ack = g.no_ack;
			has_queue = g.queue != NULL;
			queue = (struct tap_slice){(const uint8_t *)g.queue, g.queue_len};
		}
	} else if (ch) {
		struct csm_consumer *k = consumer_find(ch, d->consumer_tag, true);
		if (k) {
			k->deliveries++;
			no_ack = k->no_ack;
			has_queue = k->queue != NULL;
			queue = (struct tap_slice){(const uint8_t *)k->queue, k->queue_len};
		}
	}
	struct csm_view v = {
		.ctag = d->consumer_tag.ptr, .ctag_len = short_len(d->consumer_tag.len),
		.queue = queue.ptr, .queue_len = queue.len, .has_queue = has_queue,
		.exchange = d->exchange.ptr, .exchange_len = short_len(d->exchange.len),
		.rk = d->routing_key.ptr, .rk_len = short_len(d->routing_key.len),
		.mid = d->message_id.ptr, .mid_len = short_len(d->message_id.len),
		.redelivered = d->redelivered, .get = d->get, .has_message_id = d->has_message_id && !d->details_lost,
		.has_count = d->has_delivery_count, .details_lost = d->details_lost, .header_lost = d->header_lost,
		.tag = d->delivery_tag, .body_size = d->body_size, .delivery_count = d->delivery_count, .t_dlv = now_us,
		.props_lost = d->unfollowed,
	};
	if (!d->details_lost)
		v.t_pub = link_find(t, csm_link_key(d->identity_kind, d->identity, d->has_message_id, d->message_id));
	if (v.t_pub) /* counted as it is delivered, not when its record is written */
		tap_hist_add(&t->csm_queue_hist, now_us - v.t_pub);
	static const struct csm_reason cut = {.by = "content_cut"}, no_memory = {.by = "no_memory"};
	static const char not_followed[] = "channel not followed";
	static const struct csm_reason unfollowed = {.by = "no_memory", .text = (const uint8_t *)not_followed,
	                                             .text_len = sizeof not_followed - 1};
	struct csm_outcome o = {.outcome = TAP_CONSUME_OUT_UNKNOWN};
	if (d->content_cut || no_ack || !ch || d->unfollowed) {
		/* nothing to wait for, or no state to wait in: its one record now (the client's settle of it is then
		 * a stray one) */
		if (!d->content_cut && no_ack)
			o.outcome = TAP_CONSUME_OUT_AUTO_ACK;
		else
			o.reason = d->content_cut ? &cut : d->unfollowed ? &unfollowed : &no_memory;
		if (!ch || d->unfollowed)
			t->csm_st.unfollowed++;
		write_delivery(c, id, &v, &o, now_us);
		goto out;
	}
	if (ch->len > ch->head && ch->dlv[ch->len - 1].tag >= d->delivery_tag) {
		/* tags only grow on a channel: this one was reopened unseen (a capture) */
		static const struct csm_reason reused = {.by = "tag_reused"};
		chan_end_unacked(c, ch, &reused, now_us);
	}
	if (ch->live >= chan_bound(ch))
		evict_oldest(c, ch, "unacked bound", now_us);
	size_t blen = (size_t)v.ctag_len + v.queue_len + v.exchange_len + v.rk_len + v.mid_len;
	uint64_t grow = ch->cap ? ch->cap * 2 : CSM_RING_MIN;
	uint64_t need = tap_mem_cost(blen) + (ch->len == ch->cap ? tap_mem_cost(grow * sizeof *ch->dlv) : 0);
	while (!trk_fits(t, need) && ch->live)
		evict_oldest(c, ch, "max-tracking-memory", now_us);
	trk_make_room(t, need, now_us); /* the channel had none left: the oldest publishes go */
	if (!trk_fits(t, need)) { /* other channels hold the budget: this one is not kept */
		static const char spent[] = "max-tracking-memory";
		static const struct csm_reason over = {.by = "no_memory", .text = (const uint8_t *)spent,
		                                       .text_len = sizeof spent - 1};
		o.reason = &over;
		t->csm_st.unfollowed++;
		write_delivery(c, id, &v, &o, now_us);
		goto out;
	}
	if (!ring_reserve(c, ch, now_us)) {
		o.reason = &no_memory;
		t->st.oom++;
		write_delivery(c, id, &v, &o, now_us);
		goto out;
	}
	struct csm_dlv *e = &ch->dlv[ch->len++];
	*e = (struct csm_dlv){.tag = d->delivery_tag, .t_dlv = now_us, .t_pub = v.t_pub, .body_size = d->body_size,
	                      .delivery_count = d->delivery_count, .ctag_len = v.ctag_len,
	                      .queue_len = (uint8_t)v.queue_len, .exchange_len = v.exchange_len, .rk_len = v.rk_len,
	                      .mid_len = v.mid_len};
	unsigned flags = (d->redelivered ? CSM_FLAG_REDELIVERED : 0) | (d->get ? CSM_FLAG_GET : 0);
	flags |= (v.has_message_id ? CSM_FLAG_HAS_MESSAGE_ID : 0) | (d->has_delivery_count ? CSM_FLAG_HAS_COUNT : 0);
	flags |= (d->header_lost ? CSM_FLAG_NO_HEADER : 0) | (has_queue ? 0 : CSM_FLAG_NO_QUEUE);
	e->flags = (uint8_t)flags;
	e->blob = d->details_lost || !blen ? NULL : trk_alloc(t, blen);
	if (e->blob) {
		char *p = e->blob;
		const struct tap_slice parts[] = {{v.ctag, v.ctag_len}, {v.queue, v.queue_len},
		                                  {v.exchange, v.exchange_len}, {v.rk, v.rk_len}, {v.mid, v.mid_len}};
		for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
			if (parts[i].len)
				memcpy(p, parts[i].ptr, parts[i].len);
			p += parts[i].len;
		}
	}
	if (!e->blob && (blen || d->details_lost)) {
		e->flags |= CSM_FLAG_LOST;
		e->ctag_len = e->queue_len = e->exchange_len = e->rk_len = e->mid_len = 0;
		if (!d->details_lost)
			t->st.oom++;
	}
	ch->live++;
	c->csm->unacked++;
	t->csm_st.unacked++;
	trk_note_peak(t);
	uint64_t full = stall_threshold(ch);
	if (full && ch->live == full)
		ch->t_full = now_us;
	due_from(t, now_us);
out:
	if (d->redelivered && ch)
		note_redelivery(c, ch, &v, now_us);
	if (g.queue)
		trk_free(t, g.queue, (size_t)g.queue_len + 1);
}

/* ---- settles ---- */

void tap_consume_settle(struct tap_track_conn *c, uint16_t id, enum tap_consume_settle how, uint64_t tag,
                        bool multiple, bool requeue, int64_t now_us)
{
	struct tap_track *t = c->t;
	struct csm_chan *ch = chan_find(c->csm, id);
	if (!ch)
		return; /* a settle crossing the channel's close: its deliveries were written at the close */
	static const enum tap_consume_outcome of[] = {
		[TAP_CONSUME_ACK] = TAP_CONSUME_OUT_ACK,
		[TAP_CONSUME_NACK] = TAP_CONSUME_OUT_NACK,
		[TAP_CONSUME_REJECT] = TAP_CONSUME_OUT_REJECT,
	};
	struct csm_outcome o = {.outcome = of[how], .requeue = how != TAP_CONSUME_ACK && requeue,
	                        .multiple = multiple, .t_settle = now_us};
	uint64_t n = 0;
	if (multiple) {
		uint32_t end = tag == 0 ? ch->len : dlv_lower_bound(ch, tag);
		if (tag && end < ch->len && ch->dlv[end].tag == tag)
			end++;
		for (uint32_t i = ch->head; i < end && ch->live; i++) {
			if (!(ch->dlv[i].flags & CSM_FLAG_DONE)) {
				dlv_end(c, ch, i, &o, now_us);
				n++;
			}
		}
	} else {
		uint32_t i = dlv_lower_bound(ch, tag);
		if (i < ch->len && ch->dlv[i].tag == tag && !(ch->dlv[i].flags & CSM_FLAG_DONE)) {
			dlv_end(c, ch, i, &o, now_us);
			n++;
		}
	}
	if (!n)
		t->csm_st.stray_settles++;
	else
		ch->t_settle = now_us;
	chan_trim(t, ch);
}

void tap_consume_recover(struct tap_track_conn *c, uint16_t id, bool requeue, int64_t now_us)
{
	(void)requeue; /* RabbitMQ requeues either way (requeue false is not implemented) */
	static const struct csm_reason r = {.by = "recover"};
	struct csm_chan *ch = chan_find(c->csm, id);
	if (ch)
		chan_end_unacked(c, ch, &r, now_us);
}

/* ---- ends ---- */

static bool mentions(struct tap_slice text, const char *word)
{
	size_t n = strlen(word);
	for (size_t i = 0; i + n <= text.len; i++)
		if (!memcmp(text.ptr + i, word, n))
			return true;
	return false;
}

/* The broker closed the channel 406 because a delivery went unacked past its consumer_timeout ("delivery
 * acknowledgement on channel 1 timed out"): RabbitMQ times out the oldest one, which the channel close record
 * names. */
static void name_timed_out(struct tap_track_conn *c, struct csm_chan *ch, int64_t now_us)
{
	struct trk_chan *tch = trk_chan_answering(c, ch->id);
	const struct csm_dlv *d = oldest_unacked(ch);
	if (!tch || !d || tch->timed_out)
		return;
	struct csm_view v;
	csm_view_of(&v, d);
	struct tap_buf b;
	struct tap_json j;
	tap_buf_init(&b);
	tap_json_init(&j, &b);
	tap_json_obj_begin(&j);
	tap_json_kv_uint(&j, "delivery_tag", v.tag);
	if (v.details_lost) {
		tap_json_kv_null(&j, "consumer_tag");
		tap_json_kv_null(&j, "queue");
	} else {
		tap_json_kv_strn(&j, "consumer_tag", v.ctag, v.ctag_len);
		tap_json_kv_strn(&j, "queue", v.queue, v.queue_len);
	}
	if (v.has_message_id)
		tap_json_kv_strn(&j, "message_id", v.mid, v.mid_len);
	else
		tap_json_kv_null(&j, "message_id");
	tap_json_kv_int(&j, "unacked_us", now_us - v.t_dlv);
	tap_json_obj_end(&j);
	if (!b.oom) {
		tch->timed_out = trk_dup(c->t, (const uint8_t *)b.data, b.len);
		tch->timed_out_len = tch->timed_out ? b.len : 0;
	}
	tap_buf_deinit(&b);
}

void tap_consume_channel_close(struct tap_track_conn *c, uint16_t id, enum tap_peer by, uint16_t code,
                               struct tap_slice text, int64_t now_us)
{
	struct csm_chan *ch = chan_find(c->csm, id);
	if (!ch)
		return;
	const char *peer = by == TAP_BY_BROKER ? "broker" : "client";
	struct csm_reason r = {.by = "channel_closed", .peer = peer, .has_code = code != 0, .code = code,
	                       .text = text.ptr, .text_len = text.len};
	if (by == TAP_BY_BROKER && code == 406 && ch->live && mentions(text, "acknowledgement") &&
	    mentions(text, "timed out"))
		name_timed_out(c, ch, now_us);
	chan_end(c, ch, &r, "channel_closed", now_us);
}

void tap_consume_conn_gap(struct tap_track_conn *c, int64_t now_us)
{
	static const struct csm_reason r = {.by = "capture_gap"};
	if (!c->csm)
		return;
	for (uint32_t i = 0; i < c->csm->n_chans; i++)
		chan_end_unacked(c, c->csm->chans[i], &r, now_us);
}
