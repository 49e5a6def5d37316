/* What the broker sends back about publishes besides their confirms (src/PROTOCOL.md §9-§11): a basic.return is paired
 * with the outstanding mandatory publish it is for (or written as a warning when none or several may be), and a
 * publish-caused channel or connection close names the publish it refused. */
#include "track_event.h"

#include "track_record.h"
#include "track_store.h"
#include "track_verdict.h"
#include "track_warn.h"

#include <string.h>

static const struct trk_reason no_memory = {.by = "no_memory"};

/* ---- Returns ---- */

/* Which outstanding mandatory publishes of ch the Return may be for: those not returned yet with its exchange,
 * routing key and body size, and its message_id when it has one. RabbitMQ sends a publish's Return before its
 * Ack (src/PROTOCOL.md §9), so those not yet acked (WAIT) come first; only when none is left do the acked ones held
 * for a late Return (HELD: the broker would have broken that order) count. Of the first kind found, n and the
 * first and last slot. */
struct return_match {
	uint32_t key; /* the interned exchange and routing key */
	enum trk_state state;
	uint64_t n, first, last;
};

static bool slot_may_be(const struct trk_chan *ch, const struct trk_slot *e, uint32_t key, const struct tap_return *r)
{
	if (e->state == TRK_STATE_DONE || e->route_key != key || e->body_size != r->body_size ||
	    (e->flags & (TRK_FLAG_MANDATORY | TRK_FLAG_RETURNED)) != TRK_FLAG_MANDATORY)
		return false;
	if (!r->has_message_id)
		return true;
	if (!(e->flags & TRK_FLAG_HAS_MESSAGE_ID) || (e->flags & TRK_FLAG_NO_BLOB) || e->message_id_len != r->message_id.len)
		return false;
	const uint8_t *mid = tap_arena_ptr(&ch->arena, e->blob) + ((e->flags & TRK_FLAG_HAS_TIMESTAMP) ? sizeof(uint64_t) : 0);
	return e->message_id_len == 0 || memcmp(mid, r->message_id.ptr, e->message_id_len) == 0;
}

static bool return_match(const struct tap_track_conn *c, const struct trk_chan *ch, const struct tap_return *r,
                         struct return_match *m)
{
	uint32_t key = tap_intern_find(&c->keys, TRK_TAG_ROUTE, r->exchange.ptr, r->exchange.len, r->routing_key.ptr,
	                               r->routing_key.len);
	if (key == TAP_INTERN_NONE)
		return false;
	struct return_match held = {.key = key, .state = TRK_STATE_HELD};
	*m = (struct return_match){.key = key, .state = TRK_STATE_WAIT};
	for (uint64_t n = ch->base; n < ch->next; n++) {
		const struct trk_slot *e = trk_slot(ch, n);
		if (!slot_may_be(ch, e, key, r))
			continue;
		struct return_match *k = e->state == TRK_STATE_WAIT ? m : &held;
		if (k->n++ == 0)
			k->first = n;
		k->last = n;
	}
	if (m->n == 0)
		*m = held;
	return m->n > 0;
}

/* A Return more than one publish may be for: each of them is flagged (its record will say unknown unless a
 * Return of its own comes), and one ambiguous_return warning names them. */
static void return_ambiguous(struct tap_track_conn *c, struct trk_chan *ch, const struct tap_return *r,
                             const struct return_match *m, int64_t now_us)
{
	for (uint64_t n = m->first; n <= m->last; n++) {
		struct trk_slot *e = trk_slot(ch, n);
		if (e->state == m->state && slot_may_be(ch, e, m->key, r))
			e->flags |= TRK_FLAG_AMBIGUOUS;
	}
	trk_warn_ambiguous_return(c, ch, r, m->n, m->first, m->last, now_us);
}

void tap_track_return(struct tap_track_conn *c, uint16_t id, const struct tap_return *r, int64_t now_us)
{
	struct trk_chan *ch = trk_chan_answering(c, id);
	struct return_match m;
	if (r->details_lost) { /* any mandatory publish waiting on the channel may be the one: none is routed for sure */
		c->t->st.oom++;
		if (ch)
			trk_chan_end_mandatory_waiting(c, ch, &no_memory, now_us);
		return;
	}
	if (!ch || !ch->live || !return_match(c, ch, r, &m)) {
		trk_warn_unmatched_return(c, id, r, now_us);
		return;
	}
	if (m.n > 1) {
		return_ambiguous(c, ch, r, &m, now_us);
		return;
	}
	uint64_t n = m.first;
	struct trk_slot *e = trk_slot(ch, n);
	e->flags |= TRK_FLAG_RETURNED;
	e->t_ret = now_us;
	e->reply_code = r->reply_code;
	e->reply_text = tap_intern_get(&c->keys, TRK_TAG_TEXT, r->reply_text.ptr, r->reply_text.len, NULL, 0);
	trk_slot_step(c, ch, n, TRK_EVENT_RETURN, NULL, now_us);
}

/* ---- publish-caused closes ---- */

/* Whether the close text names the publish's exchange ('X'; the default exchange is 'amq.default'), as the
 * broker's 404, 403 and 540 texts do. */
static bool names_exchange(const struct tap_intern_key *k, const uint8_t *text, size_t text_len)
{
	const uint8_t *x = k->data;
	size_t xlen = k->alen;
	if (xlen == 0) {
		x = (const uint8_t *)"amq.default";
		xlen = sizeof "amq.default" - 1;
	}
	for (size_t i = 0; i + xlen + 2 <= text_len; i++) {
		if (text[i] == '\'' && text[i + xlen + 1] == '\'' && memcmp(text + i + 1, x, xlen) == 0)
			return true;
	}
	return false;
}

static bool text_has(const uint8_t *text, size_t text_len, const char *word)
{
	return memmem(text, text_len, word, strlen(word)) != NULL;
}

/* The message size a 406 text gives ("message size N is larger than configured max size M"), or -1. */
static int64_t message_size_in(const uint8_t *text, size_t text_len)
{
	static const char lead[] = "message size ";
	const uint8_t *at = memmem(text, text_len, lead, sizeof lead - 1);
	if (!at)
		return -1;
	const uint8_t *d = at + sizeof lead - 1, *end = text + text_len;
	int64_t n = 0;
	if (d == end || *d < '0' || *d > '9')
		return -1;
	for (; d < end && *d >= '0' && *d <= '9'; d++) {
		if (n > (INT64_MAX - 9) / 10)
			return -1;
		n = n * 10 + (*d - '0');
	}
	return n;
}

/* How many waiting publishes of ch the close text points at: 0, 1 (the culprit) or 2 (several: a publish the
 * broker routed before it refused a later one to the same exchange looks the same, so none is named). *found
 * is the first of them (see tap_track_publish_refused). */
static unsigned culprit_of(const struct tap_track_conn *c, const struct trk_chan *ch, const uint8_t *text,
                           size_t text_len, uint64_t *found)
{
	bool about_content = text_has(text, text_len, "user_id") || text_has(text, text_len, "immediate");
	int64_t size = message_size_in(text, text_len);
	unsigned matches = 0;
	for (uint64_t n = ch->base; n < ch->next && matches < 2; n++) {
		const struct trk_slot *e = trk_slot(ch, n);
		if (e->state != TRK_STATE_WAIT || (e->flags & (TRK_FLAG_RETURNED | TRK_FLAG_REFUSED)))
			continue;
		bool named = e->route_key != TAP_INTERN_NONE &&
		             names_exchange(tap_intern_key(&c->keys, e->route_key), text, text_len);
		if (named || (about_content && (e->flags & TRK_FLAG_REFUSABLE)) ||
		    (size >= 0 && e->body_size == (uint64_t)size)) {
			if (matches++ == 0)
				*found = n;
		}
	}
	return matches;
}

/* Marks the publishes of the channel from slot `at` on as refused (those still waiting, and any sent later);
 * the ones before it that wait for nothing but the close are written with the verdict they would have had. */
static void refuse_from(struct tap_track_conn *c, struct trk_chan *ch, uint64_t at, enum trk_refusal how,
                        int64_t now_us)
{
	static const struct trk_reason before = {.by = "publish_close", .settled = true};
	ch->refusal = (uint8_t)how;
	ch->pinned = true;
	for (uint64_t n = at; n < ch->next; n++) {
		struct trk_slot *e = trk_slot(ch, n);
		if (e->state == TRK_STATE_WAIT)
			e->flags |= TRK_FLAG_REFUSED;
	}
	for (uint64_t n = ch->base; n < at; n++) { /* an uncommitted transaction is lost with its channel */
		struct trk_slot *e = trk_slot(ch, n);
		if (e->state == TRK_STATE_WAIT && !(e->flags & (TRK_FLAG_CONFIRM | TRK_FLAG_TX)))
			trk_slot_step(c, ch, n, TRK_EVENT_END, &before, now_us);
	}
	trk_chan_unpin(c->t, ch);
}

/* The culprit at slot `at`: it and those after it are refused (they end with the channel: unknown, the broker's
 * reason), and the channel remembers it for its close record. */
static void refuse_culprit(struct tap_track_conn *c, struct trk_chan *ch, uint64_t at, int64_t now_us)
{
	struct trk_view v;
	trk_view_of_slot(&v, c, ch, at);
	struct tap_buf b;
	tap_buf_init(&b);
	trk_render_culprit(&b, c, ch->id, &v);
	if (!b.oom && !ch->culprit) {
		ch->culprit = trk_dup(c->t, (const uint8_t *)b.data, b.len);
		ch->culprit_len = ch->culprit ? b.len : 0;
	}
	tap_buf_deinit(&b);
	trk_slot(ch, at)->flags |= TRK_FLAG_CULPRIT;
	refuse_from(c, ch, at, TRK_REFUSAL_NAMED, now_us);
}

/* The close points at one publish of ch: it is the culprit. At several: each from the first on is a candidate. */
static void refuse_matched(struct tap_track_conn *c, struct trk_chan *ch, unsigned matches, uint64_t first,
                           int64_t now_us)
{
	if (matches == 1)
		refuse_culprit(c, ch, first, now_us);
	else
		refuse_from(c, ch, first, TRK_REFUSAL_UNNAMED, now_us);
}

void tap_track_publish_refused(struct tap_track_conn *c, uint16_t id, int64_t now_us)
{
	uint64_t n;
	if (id == 0) {
		if (!c->closed)
			return;
		for (uint32_t i = 0; i < c->n_chans; i++) {
			struct trk_chan *ch = c->chans[i];
			unsigned matches = culprit_of(c, ch, (const uint8_t *)c->close_text, c->close_text_len, &n);
			if (matches) {
				refuse_matched(c, ch, matches, n, now_us);
				return;
			}
		}
		for (uint32_t i = 0; i < c->n_chans; i++)
			if (c->chans[i]->base < c->chans[i]->next)
				refuse_from(c, c->chans[i], c->chans[i]->base, TRK_REFUSAL_UNNAMED, now_us);
		return;
	}
	struct trk_chan *ch = trk_chan_answering(c, id);
	if (!ch || !ch->closing || !ch->close_by_broker || ch->refusal)
		return;
	unsigned matches = culprit_of(c, ch, (const uint8_t *)ch->close_text, ch->close_text_len, &n);
	if (matches)
		refuse_matched(c, ch, matches, n, now_us);
	else
		refuse_from(c, ch, ch->base, TRK_REFUSAL_UNNAMED, now_us);
}

