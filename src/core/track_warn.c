/* The publisher anti-patterns of src/DESIGN.md §4 seen on the wire: each rule writes one `warning` record per channel
 * (channel_churn: per connection; a Return that matches no publish, or several, every time) the first time it
 * matches, and every warning is counted by rule in the tracker's stats. The rules read the events the wire-event
 * and lifecycle layers hand them and change no verdict. */
#include "track_warn.h"

#include "track_record.h"
#include "track_store.h"

#include <string.h>

static const char *const rule_names[TAP_TRACK_N_RULES] = {
    [TAP_TRACK_RULE_CONFIRM_WITHOUT_MANDATORY] = "confirm_without_mandatory",
    [TAP_TRACK_RULE_ACK_BEFORE_RETURN] = "ack_before_return",
    [TAP_TRACK_RULE_UNMATCHED_RETURN] = "unmatched_return",
    [TAP_TRACK_RULE_TRANSIENT_IN_CONFIRM_MODE] = "transient_in_confirm_mode",
    [TAP_TRACK_RULE_MISSING_MESSAGE_ID] = "missing_message_id",
    [TAP_TRACK_RULE_PUBLISH_AND_WAIT] = "publish_and_wait",
    [TAP_TRACK_RULE_CHANNEL_CHURN] = "channel_churn",
    [TAP_TRACK_RULE_DUPLICATE_MESSAGE_ID] = "duplicate_message_id",
    [TAP_TRACK_RULE_AMBIGUOUS_RETURN] = "ambiguous_return",
    [TAP_TRACK_RULE_DROPPED_BY_TOPOLOGY] = "dropped_by_topology",
    [TAP_TRACK_RULE_TOPOLOGY_MISMATCH] = "topology_mismatch",
    [TAP_TRACK_RULE_CONSUMER_STALLED] = "consumer_stalled",
    [TAP_TRACK_RULE_REQUEUE_LOOP] = "requeue_loop",
    [TAP_TRACK_RULE_UNBOUNDED_PREFETCH] = "unbounded_prefetch",
    [TAP_TRACK_RULE_GLOBAL_QOS] = "global_qos",
    [TAP_TRACK_RULE_UNACKED_NEAR_TIMEOUT] = "unacked_near_timeout",
};

const char *tap_track_rule_name(enum tap_track_rule rule)
{
	return rule < TAP_TRACK_N_RULES ? rule_names[rule] : "unknown";
}

/* The warning record of rule is in t->render: it is emitted and counted (the one place warnings are counted). */
static void warning_written(struct tap_track *t, enum tap_track_rule rule)
{
	trk_emit(t);
	t->st.warnings++;
	t->st.warnings_by_rule[rule]++;
}

void trk_warn_written(struct tap_track *t, enum tap_track_rule rule)
{
	warning_written(t, rule);
}

/* Writes the `warning` record of rule (seq 0: none). */
static void warn(struct tap_track_conn *c, uint16_t ch, enum tap_track_rule rule, uint64_t seq, int64_t now_us)
{
	trk_record_warning(&c->t->render, c, ch, rule_names[rule], seq, now_us);
	warning_written(c->t, rule);
}

void trk_warn_once(struct tap_track_conn *c, struct trk_chan *ch, enum tap_track_rule rule, uint64_t seq,
                   int64_t now_us)
{
	uint16_t bit = trk_warn_bit(rule);
	if (ch->warn.warned & bit)
		return;
	ch->warn.warned |= bit;
	warn(c, ch->id, rule, seq, now_us);
}

/* ---- the recent message ids of a connection ----
 *
 * A ring of the 64-bit hashes of the last `cap` distinct ids, oldest at `head`, and an open-addressing index
 * (linear probing, 2 * cap entries, so at most half full) from a hash to its ring position + 1 (0: empty). The
 * ring starts at 64 and doubles up to TAP_TRACK_RECENT_IDS: a connection costs what it has published, at most
 * 1,024 * (8 + 8 + 2 * 4) = 24 KiB, counted in the tracker's memory. Two ids are taken as equal when their hashes are.
 * An id forgotten early (its publish may be retransmitted) stays in the ring as DEAD_ID, in no index entry. */
struct trk_ids {
	uint32_t cap, n, head;
	uint64_t *ring;
	uint64_t *where; /* beside each ring entry: the channel (top 16 bits) and confirm seq (0: none) of its first
	                  * publish, which a duplicate_message_id warning names */
	uint32_t *index;
};

#define IDS_MIN_CAP 64u
#define DEAD_ID UINT64_C(0)

static uint64_t id_hash(const uint8_t *p, size_t len)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325); /* FNV-1a, then a splitmix64 finish for the low bits */
	for (size_t i = 0; i < len; i++)
		h = (h ^ p[i]) * UINT64_C(0x100000001b3);
	h = (h ^ (h >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	h = (h ^ (h >> 27)) * UINT64_C(0x94d049bb133111eb);
	h ^= h >> 31;
	return h == DEAD_ID ? 1 : h;
}

static uint32_t ids_mask(const struct trk_ids *ids)
{
	return ids->cap * 2 - 1;
}

/* The ring position of h, or UINT32_MAX. */
static uint32_t ids_find(const struct trk_ids *ids, uint64_t h)
{
	for (uint32_t i = (uint32_t)h & ids_mask(ids); ids->index[i]; i = (i + 1) & ids_mask(ids))
		if (ids->ring[ids->index[i] - 1] == h)
			return ids->index[i] - 1;
	return UINT32_MAX;
}

static void ids_index_put(struct trk_ids *ids, uint32_t pos)
{
	uint32_t i = (uint32_t)ids->ring[pos] & ids_mask(ids);
	while (ids->index[i])
		i = (i + 1) & ids_mask(ids);
	ids->index[i] = pos + 1;
}

/* Removes ring position pos from the index, shifting later entries of its probe run back (no tombstones). */
static void ids_index_drop(struct trk_ids *ids, uint32_t pos)
{
	uint32_t mask = ids_mask(ids);
	uint32_t i = (uint32_t)ids->ring[pos] & mask;
	while (ids->index[i] != pos + 1)
		i = (i + 1) & mask;
	for (uint32_t j = (i + 1) & mask; ids->index[j]; j = (j + 1) & mask) {
		uint32_t home = (uint32_t)ids->ring[ids->index[j] - 1] & mask;
		bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
		if (stays)
			continue;
		ids->index[i] = ids->index[j];
		i = j;
	}
	ids->index[i] = 0;
}

/* The ring and index at cap, the ids kept in order; false when out of memory (nothing changed). */
static bool ids_resize(struct tap_track *t, struct trk_ids *ids, uint32_t cap)
{
	uint64_t *ring = trk_alloc(t, cap * sizeof *ring);
	uint64_t *where = trk_alloc(t, cap * sizeof *where);
	uint32_t *index = trk_alloc(t, cap * 2 * sizeof *index);
	if (!ring || !index || !where) {
		if (ring)
			trk_free(t, ring, cap * sizeof *ring);
		if (where)
			trk_free(t, where, cap * sizeof *where);
		if (index)
			trk_free(t, index, cap * 2 * sizeof *index);
		return false;
	}
	for (uint32_t k = 0; k < ids->n; k++) {
		ring[k] = ids->ring[(ids->head + k) & (ids->cap - 1)];
		where[k] = ids->where[(ids->head + k) & (ids->cap - 1)];
	}
	if (ids->cap) {
		trk_free(t, ids->ring, ids->cap * sizeof *ids->ring);
		trk_free(t, ids->where, ids->cap * sizeof *ids->where);
		trk_free(t, ids->index, ids->cap * 2 * sizeof *ids->index);
	}
	ids->ring = ring;
	ids->where = where;
	ids->index = index;
	ids->cap = cap;
	ids->head = 0;
	memset(index, 0, cap * 2 * sizeof *index);
	for (uint32_t k = 0; k < ids->n; k++)
		if (ring[k] != DEAD_ID)
			ids_index_put(ids, k);
	return true;
}

static void ids_add(struct tap_track *t, struct trk_ids *ids, uint64_t h, uint64_t where)
{
	if (ids->n == ids->cap && (ids->cap >= TAP_TRACK_RECENT_IDS || !ids_resize(t, ids, ids->cap * 2))) {
		if (ids->ring[ids->head] != DEAD_ID)
			ids_index_drop(ids, ids->head); /* the oldest id leaves the window */
		ids->head = (ids->head + 1) & (ids->cap - 1);
		ids->n--;
	}
	uint32_t pos = (ids->head + ids->n) & (ids->cap - 1);
	ids->ring[pos] = h;
	ids->where[pos] = where;
	ids_index_put(ids, pos);
	ids->n++;
}

static struct trk_ids *ids_new(struct tap_track *t)
{
	struct trk_ids *ids = trk_alloc(t, sizeof *ids);
	if (!ids)
		return NULL;
	memset(ids, 0, sizeof *ids);
	if (!ids_resize(t, ids, IDS_MIN_CAP)) {
		trk_free(t, ids, sizeof *ids);
		return NULL;
	}
	return ids;
}

void trk_warn_conn_free(struct tap_track_conn *c)
{
	struct trk_ids *ids = c->ids;
	if (!ids)
		return;
	trk_free(c->t, ids->ring, ids->cap * sizeof *ids->ring);
	trk_free(c->t, ids->where, ids->cap * sizeof *ids->where);
	trk_free(c->t, ids->index, ids->cap * 2 * sizeof *ids->index);
	trk_free(c->t, ids, sizeof *ids);
	c->ids = NULL;
}

#define WHERE_SEQ_MASK ((UINT64_C(1) << 48) - 1)

/* Whether the id was among the connection's recent ones (*first then says where it was published first, channel
 * in the top 16 bits, seq below); it is one of them afterwards. */
static bool seen_recently(struct tap_track_conn *c, struct tap_slice id, uint16_t channel, uint64_t seq,
                          uint64_t *first)
{
	if (!c->ids)
		c->ids = ids_new(c->t);
	if (!c->ids)
		return false; /* no memory: the rule is blind, nothing else changes */
	uint64_t h = id_hash(id.ptr, id.len);
	uint32_t pos = ids_find(c->ids, h);
	if (pos != UINT32_MAX) {
		*first = c->ids->where[pos];
		return true;
	}
	ids_add(c->t, c->ids, h, (uint64_t)channel << 48 | (seq & WHERE_SEQ_MASK));
	return false;
}

void trk_warn_done(struct tap_track_conn *c, const struct trk_view *v, const struct trk_verdict *vd)
{
	bool resend = vd->confirm == TAP_TRACK_CONFIRM_NACK || vd->confirm == TAP_TRACK_CONFIRM_UNKNOWN ||
	              vd->route == TAP_TRACK_ROUTE_RETURNED || vd->route == TAP_TRACK_ROUTE_UNKNOWN;
	if (!resend || !c->ids || !v->has_message_id || !v->message_id || !v->message_id_len)
		return;
	uint32_t pos = ids_find(c->ids, id_hash(v->message_id, v->message_id_len));
	if (pos == UINT32_MAX)
		return;
	ids_index_drop(c->ids, pos);
	c->ids->ring[pos] = DEAD_ID;
}

/* ---- the rules ---- */


void trk_warn_unmatched_return(struct tap_track_conn *c, uint16_t id, const struct tap_return *r, int64_t now_us)
{
	struct tap_track *t = c->t;
	enum tap_track_rule rule = TAP_TRACK_RULE_UNMATCHED_RETURN;
	trk_record_return_warning(&t->render, c, id, r, rule_names[rule], 0, 0, 0, now_us);
	warning_written(t, rule);
	t->st.unmatched_returns++;
}

void trk_warn_ambiguous_return(struct tap_track_conn *c, const struct trk_chan *ch, const struct tap_return *r,
                               uint64_t n, uint64_t first, uint64_t last, int64_t now_us)
{
	struct tap_track *t = c->t;
	enum tap_track_rule rule = TAP_TRACK_RULE_AMBIGUOUS_RETURN;
	bool confirm_mode = trk_slot(ch, first)->flags & TRK_FLAG_CONFIRM;
	trk_record_return_warning(&t->render, c, ch->id, r, rule_names[rule], n, confirm_mode ? first - ch->sel_off : 0,
	                          confirm_mode ? last - ch->sel_off : 0, now_us);
	warning_written(t, rule);
}

/* duplicate_message_id, once per channel: it names the id and where the connection published it first. */
static void warn_duplicate(struct tap_track_conn *c, struct trk_chan *ch, struct tap_slice id, uint64_t seq,
                           uint64_t first, int64_t now_us)
{
	enum tap_track_rule rule = TAP_TRACK_RULE_DUPLICATE_MESSAGE_ID;
	uint16_t bit = trk_warn_bit(rule);
	if (ch->warn.warned & bit)
		return;
	ch->warn.warned |= bit;
	trk_record_duplicate_warning(&c->t->render, c, ch->id, rule_names[rule], seq, id, (uint16_t)(first >> 48),
	                             first & WHERE_SEQ_MASK, now_us);
	warning_written(c->t, rule);
}

void trk_warn_publish(struct tap_track_conn *c, struct trk_chan *ch, const struct tap_publish *p, int64_t now_us)
{
	if (!ch)
		return; /* no memory for the channel: nothing to remember the rules by */
	struct trk_warn_chan *w = &ch->warn;
	bool confirm_mode = ch->mode == TRK_MODE_CONFIRM;
	uint64_t seq = confirm_mode ? ch->next - ch->sel_off : 0;
	uint64_t first;
	w->publishes++;

	if (!p->header_lost) { /* its properties never came: absent is not known to be missing */
		if (confirm_mode && !(p->has_delivery_mode && p->delivery_mode == 2))
			trk_warn_once(c, ch, TAP_TRACK_RULE_TRANSIENT_IN_CONFIRM_MODE, seq, now_us);
		bool has_id = p->has_message_id && p->message_id.len;
		if (!has_id)
			trk_warn_once(c, ch, TAP_TRACK_RULE_MISSING_MESSAGE_ID, seq, now_us);
		else if (seen_recently(c, p->message_id, ch->id, seq, &first))
			warn_duplicate(c, ch, p->message_id, seq, first, now_us);
	}

	if (confirm_mode) {
		/* A client that waits for each confirm never has two publishes in flight. One that has had is
		 * pipelining: when it is slow to write (a loaded machine) its publishes can still reach the wire one
		 * per answer. */
		if (w->unanswered)
			w->pipelined = true;
		bool waited = !w->pipelined && w->confirm_publishes && !w->unanswered &&
		              now_us - w->t_answer <= TAP_TRACK_WAIT_GAP_US;
		w->waited_run = waited ? w->waited_run + 1 : 0;
		if (w->waited_run >= TAP_TRACK_WAIT_RUN)
			trk_warn_once(c, ch, TAP_TRACK_RULE_PUBLISH_AND_WAIT, seq, now_us);
		w->confirm_publishes++;
		w->unanswered++;
	}
}

void trk_warn_settled(struct trk_chan *ch, const struct trk_slot *e, enum trk_event ev, int64_t now_us)
{
	if (e->state != TRK_STATE_WAIT || !(e->flags & TRK_FLAG_CONFIRM))
		return;
	if (ch->warn.unanswered)
		ch->warn.unanswered--;
	if (ev == TRK_EVENT_ACK || ev == TRK_EVENT_NACK)
		ch->warn.t_answer = now_us;
}

void trk_warn_chan_end(struct tap_track_conn *c, struct trk_chan *ch, int64_t now_us)
{
	if (!ch->closing || ch->warn.publishes != 1 || c->warned_churn)
		return;
	if (++c->one_publish_channels < TAP_TRACK_CHURN_CHANNELS)
		return;
	c->warned_churn = true;
	uint64_t seq = ch->mode == TRK_MODE_CONFIRM && ch->next > ch->sel_off ? ch->next - 1 - ch->sel_off : 0;
	warn(c, ch->id, TAP_TRACK_RULE_CHANNEL_CHURN, seq, now_us);
}
