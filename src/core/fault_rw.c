/* The per-connection fault rewriter (include/amqptap/fault.h). Each direction is cut into frames by a push
 * parser that keeps only what it must: a frame's 7-byte header, and the payload of a method frame small enough to
 * matter (FAULT_SMALL bytes); content and larger frames pass through as they arrive.
 *
 *   client -> broker   forwarded unchanged; publishes counted per channel (confirm sequence numbers from
 *                      confirm.select), each matched against the rules; a selected one's tag is remembered
 *                      (nack, withhold, delay) or, for kill, the stream is cut at the end of its content
 *   broker -> client   a basic.ack/nack covering a remembered tag is rewritten:
 *                        ack M multiple over [lo, M] with tag N selected for nack
 *                          -> ack N-1 multiple (when lo < N), nack N, ack M multiple (when N < M)
 *                        withheld N: N is left out; from then on the channel's confirms go one tag at a time,
 *                          as a later `multiple` would confirm N in the client too
 *                        delayed N: everything from N's confirm on is held until it is due (order kept, so
 *                          Returns stay before their acks)
 *
 * Assumes what RabbitMQ does: confirms on a channel come in ascending tag order, so a `multiple` confirm covers
 * the tags after the channel's previous confirm up to its own. */
#include "fault_int.h"

#include "amqptap/props.h"
#include "amqptap/sasl.h"
#include "amqptap/table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t tap_fault_confirm_frame(uint8_t out[21], uint16_t ch, bool nack, uint64_t tag, bool multiple, bool requeue)
{
	out[0] = FRAME_METHOD;
	put16(out + 1, ch);
	put32(out + 3, 13);
	put16(out + 7, 60);
	put16(out + 9, nack ? 120 : 80);
	put64(out + 11, tag);
	out[19] = (uint8_t)((multiple ? 1 : 0) | (nack && requeue ? 2 : 0));
	out[20] = FRAME_END;
	return 21;
}

size_t tap_fault_close_method(uint8_t *out, size_t cap, uint16_t cls, uint16_t ch, uint16_t code, const char *text,
			      uint16_t cause_cls, uint16_t cause_m)
{
	size_t tl = strlen(text);
	if (tl > 255)
		tl = 255;
	size_t payload = 4 + 2 + 1 + tl + 4;
	if (cap < 7 + payload + 1)
		return 0;
	out[0] = FRAME_METHOD;
	put16(out + 1, ch);
	put32(out + 3, (uint32_t)payload);
	put16(out + 7, cls);
	put16(out + 9, cls == 10 ? 50 : 40);
	put16(out + 11, code);
	out[13] = (uint8_t)tl;
	memcpy(out + 14, text, tl);
	put16(out + 14 + tl, cause_cls);
	put16(out + 16 + tl, cause_m);
	out[7 + payload] = FRAME_END;
	return 7 + payload + 1;
}

size_t tap_fault_close_frame(uint8_t *out, size_t cap, const char *text)
{
	return tap_fault_close_method(out, cap, 10, 0, 320, text, 0, 0); /* class, method: none */
}

struct tap_fault_conn *tap_fault_conn_new(struct tap_fault_set *set, uint64_t conn_id, const char *client)
{
	struct tap_fault_conn *fc = calloc(1, sizeof *fc);
	if (!fc)
		return NULL;
	fc->set = set;
	fc->id = conn_id;
	fc->jitter_rng = conn_id * 0x9E3779B97F4A7C15u | 1; /* xorshift64 never leaves 0 */
	snprintf(fc->client, sizeof fc->client, "%s", client ? client : "");
	return fc;
}

void tap_fault_conn_free(struct tap_fault_conn *fc)
{
	if (!fc)
		return;
	while (fc->n_chans)
		fault_chan_drop(fc, fc->chans[0].id);
	free(fc->chans);
	free(fc->c2s_held);
	free(fc->c2s_wait);
	for (struct hold *h = fc->head, *next; h; h = next) {
		next = h->next;
		free(h);
	}
	fault_shape_free(fc);
	free(fc);
}

enum tap_fault_kill_mode tap_fault_kill_mode(const struct tap_fault_conn *fc)
{
	return fc->kill_mode;
}

int64_t tap_fault_due(const struct tap_fault_conn *fc)
{
	int64_t held = fc->head ? fc->head->due : INT64_MAX, shaped = fault_shape_due(fc);
	return held < shaped ? held : shaped;
}

size_t tap_fault_held(const struct tap_fault_conn *fc, enum tap_dir dir)
{
	if (dir == TAP_S2C)
		return fc->killing ? 0 : fc->shape[dir].held + fc->held; /* a killed client gets none of them */
	return fc->shape[dir].held;
}

/* ---- channels ---- */

struct fchan *fault_chan_find(struct tap_fault_conn *fc, uint16_t id)
{
	for (uint32_t i = 0; i < fc->n_chans; i++)
		if (fc->chans[i].id == id)
			return &fc->chans[i];
	return NULL;
}

static struct fchan *chan_find(struct tap_fault_conn *fc, uint16_t id)
{
	return fault_chan_find(fc, id);
}

/* The channel's state, made when missing (a client's channel_max bounds how many: RabbitMQ's default 2047). */
static struct fchan *chan_get(struct tap_fault_conn *fc, uint16_t id)
{
	struct fchan *c = chan_find(fc, id);
	if (c)
		return c;
	if (fc->n_chans == fc->cap_chans) {
		if (fc->cap_chans >= 65536)
			return NULL;
		uint32_t cap = fc->cap_chans ? fc->cap_chans * 2 : 4;
		struct fchan *n = realloc(fc->chans, cap * sizeof *n);
		if (!n)
			return NULL;
		fc->chans = n;
		fc->cap_chans = cap;
	}
	c = &fc->chans[fc->n_chans++];
	memset(c, 0, sizeof *c);
	c->id = id;
	return c;
}

void fault_chan_drop(struct tap_fault_conn *fc, uint16_t id)
{
	struct fchan *c = chan_find(fc, id);
	if (!c)
		return;
	fault_close_forget(fc, c);
	fault_return_forget(fc, c);
	for (uint32_t i = 0; i < c->n_tags; i++)
		fault_tag_free(fc, &c->tags[i]);
	fc->n_tags -= c->n_tags;
	free(c->tags);
	*c = fc->chans[--fc->n_chans];
}

static void chan_drop(struct tap_fault_conn *fc, uint16_t id)
{
	fault_chan_drop(fc, id);
}

static bool tag_add(struct tap_fault_conn *fc, struct fchan *c, const struct ftag *t)
{
	if (fc->n_tags >= TAP_FAULT_TAGS_MAX)
		return false;
	if (c->n_tags == c->cap_tags) {
		uint32_t cap = c->cap_tags ? c->cap_tags * 2 : 8;
		struct ftag *n = realloc(c->tags, cap * sizeof *n);
		if (!n)
			return false;
		c->tags = n;
		c->cap_tags = cap;
	}
	c->tags[c->n_tags++] = *t;
	fc->n_tags++;
	return true;
}

/* ---- the rules (which rule selects a publish: fault_select.c) ---- */

void fault_act(struct tap_fault_conn *fc, const struct tap_fault_act *a)
{
	if ((unsigned)a->action < TAP_FAULT_ACTIONS)
		fc->set->acted[a->action]++;
	for (size_t i = 0; i < fc->set->n; i++) /* a rule removed since it selected the publish is no longer counted */
		if (fc->set->rules[i].id == a->rule)
			fc->set->rule_acted[i]++;
	if (fc->io->act)
		fc->io->act(fc->io->ctx, a);
}

static void act(struct tap_fault_conn *fc, uint32_t rule, enum tap_fault_action a, uint16_t ch, uint64_t seq,
		uint64_t outstanding, uint32_t ms)
{
	struct tap_fault_act x = {
	    .rule = rule, .action = a, .channel = ch, .seq = seq, .outstanding = outstanding, .ms = ms};
	fault_act(fc, &x);
}

void fault_mark(struct tap_fault_conn *fc, uint16_t ch, uint64_t seq, enum tap_fault_saw saw, uint32_t rule)
{
	if (fc->io->mark)
		fc->io->mark(fc->io->ctx, ch, seq, saw, rule);
}

static void mark(struct tap_fault_conn *fc, uint16_t ch, uint64_t seq, enum tap_fault_saw saw, uint32_t rule)
{
	fault_mark(fc, ch, seq, saw, rule);
}

/* A broker heartbeat (kept whole): true when a stall-heartbeats rule keeps it from the client. */
static bool heartbeat_stalled(struct tap_fault_conn *fc)
{
	const struct tap_fault_rule *r = fault_stall_rule(fc);
	if (!r)
		return false;
	struct ctr *k = fault_counter(fc, r->id);
	if (k && k->acts++ == 0)
		act(fc, r->id, TAP_FAULT_STALL_HEARTBEATS, 0, 0, 0, 0);
	return true;
}

/* ---- output ---- */

void fault_out(struct tap_fault_conn *fc, enum tap_dir dir, const uint8_t *p, size_t len)
{
	if (len == 0)
		return;
	if (dir == TAP_S2C && (fc->head || fc->floor > fc->now)) {
		struct hold *h = malloc(sizeof *h + len);
		if (!h) { /* no memory to hold it: it goes now (late is better than lost or reordered... it is early) */
			fault_emit(fc, dir, p, len);
			return;
		}
		h->next = NULL;
		h->due = fc->tail && fc->tail->due > fc->floor ? fc->tail->due : fc->floor;
		h->len = len;
		memcpy(h->data, p, len);
		if (fc->tail)
			fc->tail->next = h;
		else
			fc->head = h;
		fc->tail = h;
		fc->held += len;
		return;
	}
	fault_emit(fc, dir, p, len);
}

static void out(struct tap_fault_conn *fc, enum tap_dir dir, const uint8_t *p, size_t len)
{
	fault_out(fc, dir, p, len);
}

static unsigned status(const struct tap_fault_conn *fc)
{
	unsigned st = 0;
	if (fc->blocking)
		st |= TAP_FAULT_BLOCKED;
	if (fc->killing)
		st |= TAP_FAULT_KILL_ARMED;
	if (fc->kill_now)
		st |= TAP_FAULT_KILL_NOW;
	if (fc->head || fc->shape[TAP_C2S].head || fc->shape[TAP_S2C].head)
		st |= TAP_FAULT_HOLDING;
	if (fc->held > TAP_FAULT_HOLD_MAX || fc->shape[TAP_S2C].held > TAP_FAULT_SHAPE_MAX)
		st |= TAP_FAULT_FULL;
	if (fc->shape[TAP_C2S].held > TAP_FAULT_SHAPE_MAX)
		st |= TAP_FAULT_CLIENT_FULL;
	if (fc->waiting)
		st |= TAP_FAULT_CLIENT_WAIT;
	return st;
}

unsigned tap_fault_release(struct tap_fault_conn *fc, int64_t now_us, const struct tap_fault_io *io)
{
	fc->now = now_us;
	fc->io = io;
	fault_shape_select(fc);
	while (fc->head && fc->head->due <= now_us) {
		struct hold *h = fc->head;
		fc->head = h->next;
		if (!fc->head)
			fc->tail = NULL;
		fc->held -= h->len;
		if (!fc->killing)
			fault_emit(fc, TAP_S2C, h->data, h->len);
		free(h);
	}
	fault_shape_release(fc);
	return status(fc);
}

/* Emits confirms of tags [a, b] as the broker's frame said them (nack: with its requeue bit): one `multiple`
 * frame, or one frame per tag once a tag of the channel was withheld. */
static void emit_range(struct tap_fault_conn *fc, const struct fchan *c, bool nack, bool requeue, bool multiple,
		       uint64_t a, uint64_t b)
{
	uint8_t f[21];
	if (a > b)
		return;
	if (!c->withheld) {
		tap_fault_confirm_frame(f, c->id, nack, b, multiple || a < b, requeue);
		out(fc, TAP_S2C, f, sizeof f);
		return;
	}
	for (uint64_t t = a; t <= b; t++) {
		tap_fault_confirm_frame(f, c->id, nack, t, false, requeue);
		out(fc, TAP_S2C, f, sizeof f);
	}
}

/* The broker's basic.ack or basic.nack (frame: the whole frame, 21 bytes): passed on, or rewritten around the
 * selected tags it covers. */
static void broker_confirm(struct tap_fault_conn *fc, struct fchan *c, const uint8_t *frame, bool nack)
{
	uint64_t tag = get64(frame + 11);
	bool multiple = frame[19] & 1, requeue = frame[19] & 2;
	if (tag == 0 || tag >= c->next_seq) { /* no tag the client published: not the rewriter's to split (a range of */
		if (!fc->killing)              /* singles is bounded by the client's publishes, never by this tag) */
			out(fc, TAP_S2C, frame, 21);
		return;
	}
	uint64_t lo = multiple ? c->last_tag + 1 : tag;
	if (tag > c->last_tag)
		c->last_tag = tag;
	if (fc->killing) { /* the client sees nothing more; the kill waited for this confirm */
		if (c->id == fc->kill_ch && fc->kill_tag && tag >= fc->kill_tag)
			fc->kill_now = true;
		for (uint64_t t = lo; t <= tag && t - lo < TAP_FAULT_TAGS_MAX; t++)
			mark(fc, c->id, t, TAP_FAULT_SAW_NONE, fc->kill_rule);
		return;
	}
	uint32_t first = 0;
	while (first < c->n_tags && c->tags[first].tag < lo)
		first++; /* confirmed earlier (out of order): nothing to do for them any more */
	uint32_t last = first;
	while (last < c->n_tags && c->tags[last].tag <= tag)
		last++;
	fault_return_emit(fc, c, first, last, nack, 0); /* a Return comes before its ack */
	if (first == last && !c->withheld) {
		out(fc, TAP_S2C, frame, 21);
	} else {
		uint64_t cur = lo;
		for (uint32_t i = first; i < last; i++) {
			const struct ftag *t = &c->tags[i];
			if (t->action == TAP_FAULT_RETURN || t->action == TAP_FAULT_RETURN_AFTER_ACK)
				continue; /* the broker's confirm of it goes as it came */
			emit_range(fc, c, nack, requeue, multiple, cur, t->tag - 1);
			uint8_t f[21];
			switch (t->action) {
			case TAP_FAULT_NACK:
				tap_fault_confirm_frame(f, c->id, true, t->tag, false, false);
				out(fc, TAP_S2C, f, sizeof f);
				mark(fc, c->id, t->tag, TAP_FAULT_SAW_NACK, t->rule);
				act(fc, t->rule, TAP_FAULT_NACK, c->id, t->tag, 0, 0);
				break;
			case TAP_FAULT_WITHHOLD:
				c->withheld++;
				mark(fc, c->id, t->tag, TAP_FAULT_SAW_NONE, t->rule);
				act(fc, t->rule, TAP_FAULT_WITHHOLD, c->id, t->tag, 0, 0);
				break;
			case TAP_FAULT_DELAY: {
				int64_t due = fc->now + (int64_t)t->ms * 1000;
				if (due > fc->floor)
					fc->floor = due;
				tap_fault_confirm_frame(f, c->id, nack, t->tag, false, requeue);
				out(fc, TAP_S2C, f, sizeof f);
				mark(fc, c->id, t->tag, nack ? TAP_FAULT_SAW_NACK : TAP_FAULT_SAW_ACK, t->rule);
				act(fc, t->rule, TAP_FAULT_DELAY, c->id, t->tag, 0, t->ms);
				break;
			}
			}
			cur = t->tag + 1;
		}
		emit_range(fc, c, nack, requeue, multiple, cur, tag);
	}
	fault_return_emit(fc, c, first, last, nack, 1); /* return-after-ack */
	uint32_t gone = last; /* tags up to here are settled */
	for (uint32_t i = 0; i < gone; i++)
		fault_tag_free(fc, &c->tags[i]);
	if (gone) {
		memmove(c->tags, c->tags + gone, (c->n_tags - gone) * sizeof c->tags[0]);
		c->n_tags -= gone;
		fc->n_tags -= gone;
	}
}

/* ---- the client's methods ---- */

/* A short string at *p of [*p, end): false when it does not fit. */
static bool shortstr(const uint8_t **p, const uint8_t *end, const uint8_t **s, size_t *len)
{
	if (*p >= end || (size_t)(end - *p) < 1u + **p)
		return false;
	*len = **p;
	*s = *p + 1;
	*p += 1 + *len;
	return true;
}

static void copy_ident(char *dst, size_t cap, const uint8_t *s, size_t len)
{
	if (len >= cap)
		len = cap - 1;
	memcpy(dst, s, len);
	dst[len] = '\0';
}

static void start_ok(struct tap_fault_conn *fc, const uint8_t *a, const uint8_t *end)
{
	if (end - a < 4)
		return;
	uint32_t tl = get32(a);
	if ((size_t)(end - a - 4) < tl)
		return;
	struct tap_field f;
	if (tap_table_find(a + 4, tl, "connection_name", &f) && f.type == 'S')
		copy_ident(fc->name, sizeof fc->name, f.ptr, f.len);
	struct tap_field caps, b;
	if (tap_table_find(a + 4, tl, "capabilities", &caps) && caps.type == 'F' &&
	    tap_table_find(caps.ptr, caps.len, "connection.blocked", &b) && b.type == 't')
		fc->blocked_cap = b.i || b.u;
	const uint8_t *p = a + 4 + tl, *mech, *resp;
	size_t mech_len;
	if (!shortstr(&p, end, &mech, &mech_len) || end - p < 4)
		return;
	uint32_t rl = get32(p);
	if ((size_t)(end - p - 4) < rl)
		return;
	resp = p + 4;
	struct tap_sasl s;
	tap_sasl_parse((struct tap_slice){mech, mech_len}, (struct tap_slice){resp, rl}, &s);
	if (s.user.len)
		copy_ident(fc->user, sizeof fc->user, s.user.ptr, s.user.len);
}

static void client_publish(struct tap_fault_conn *fc, struct fchan *c, const uint8_t *a, const uint8_t *end)
{
	const uint8_t *p = a + 2, *ex = NULL, *rk = NULL; /* reserved short */
	size_t ex_len = 0, rk_len = 0;
	if (end - a < 2 || !shortstr(&p, end, &ex, &ex_len) || !shortstr(&p, end, &rk, &rk_len))
		ex = rk = NULL; /* malformed: the broker will close; nothing is selected */
	bool mandatory = ex && p < end && (*p & 1);
	uint64_t seq = c->confirm ? c->next_seq++ : 0;
	c->pub_open = true;
	c->pub_header = false;
	c->pub_kill = false;
	c->pub_block = false;
	c->pub_close = false;
	c->pub_seq = seq;
	if (c->pub_return)
		fault_return_done(fc, c, false); /* the last one's content never ended: the broker closes */
	if (!ex || fc->killing || c->fclose)
		return;
	int i = fault_select_rule(fc, c, ex, ex_len, rk, rk_len, mandatory);
	if (i < 0)
		return;
	const struct tap_fault_rule *r = &fc->set->rules[i];
	if (r->action == TAP_FAULT_CLOSE_CHANNEL) {
		c->pub_close = true;
		c->close_rule = r->id;
		c->close_code = r->close_code;
		free(c->close_text);
		c->close_text = strdup(r->close_text); /* NULL: the code's own text */
		return;
	}
	if (r->action == TAP_FAULT_BLOCK) {
		c->pub_block = true;
		c->block_rule = r->id;
		c->block_s = r->seconds;
		return;
	}
	if (r->action == TAP_FAULT_KILL) {
		c->pub_kill = true;
		c->kill_rule = r->id;
		fc->kill_mode = r->kill_mode;
		return;
	}
	struct ftag t = {.tag = seq, .rule = r->id, .ms = r->ms, .action = (uint8_t)r->action, .returns_at = c->returns};
	if (!tag_add(fc, c, &t)) /* past TAP_FAULT_TAGS_MAX the publish goes unharmed */
		return;
	if (r->action == TAP_FAULT_RETURN || r->action == TAP_FAULT_RETURN_AFTER_ACK)
		fault_return_select(fc, c, r, ex, ex_len, rk, rk_len);
}

/* A client method frame (payload [a, end), after class and method). */
static void client_method(struct tap_fault_conn *fc, uint16_t ch, uint16_t cls, uint16_t m, const uint8_t *a,
			  const uint8_t *end, const uint8_t *frame)
{
	uint32_t cm = (uint32_t)cls << 16 | m;
	struct fchan *fcl = fc->n_fclosed && ch ? chan_find(fc, ch) : NULL;
	if (fcl && (fcl->fclose & FC_CLIENT)) { /* a channel a rule closed: the client has not answered yet */
		if (cm == (60u << 16 | 40))
			client_publish(fc, fcl, a, end); /* counted (its number), never selected */
		fault_close_client_method(fc, fcl, cls, m, frame, (size_t)(end - frame) + 1);
		return;
	}
	switch (cm) {
	case 10u << 16 | 11: /* connection.start-ok */
		start_ok(fc, a, end);
		return;
	case 10u << 16 | 40: { /* connection.open */
		const uint8_t *p = a, *s;
		size_t len;
		if (shortstr(&p, end, &s, &len))
			copy_ident(fc->vhost, sizeof fc->vhost, s, len);
		return;
	}
	case 20u << 16 | 10: /* channel.open: a channel number used again starts afresh */
		chan_drop(fc, ch);
		(void)chan_get(fc, ch);
		return;
	case 20u << 16 | 41: /* channel.close-ok to the broker's close */
		chan_drop(fc, ch);
		return;
	case 85u << 16 | 10: { /* confirm.select */
		struct fchan *c = chan_get(fc, ch);
		if (c && !c->confirm) {
			c->confirm = true;
			c->next_seq = 1;
		}
		return;
	}
	case 60u << 16 | 40: { /* basic.publish */
		struct fchan *c = chan_get(fc, ch);
		if (c)
			client_publish(fc, c, a, end);
		return;
	}
	}
}

/* ---- frames ---- */

/* The complete frame kept in p->small (method frames up to FAULT_SMALL). Client frames were forwarded already;
 * a broker frame is passed on here, or rewritten. */
static void frame_done(struct tap_fault_conn *fc, enum tap_dir dir, struct fparse *p)
{
	const uint8_t *f = p->small;
	const uint8_t *end = f + 7 + p->size;
	bool is_method = p->type == FRAME_METHOD && p->size >= 4;
	uint16_t cls = is_method ? get16(f + 7) : 0, m = is_method ? get16(f + 9) : 0;
	if (dir == TAP_C2S) {
		if (is_method)
			client_method(fc, p->ch, cls, m, f + 11, end, f);
		return;
	}
	if (fc->n_fclosed && p->ch) { /* close-channel: the broker's frames on a channel a rule closed */
		struct fchan *fcl = chan_find(fc, p->ch);
		if (fcl && (fcl->fclose & FC_BROKER) && is_method && fault_close_broker_method(fc, fcl, cls, m, f, p->size))
			return; /* its close-ok, or its own close: answered by the tap */
		if (p->drop)
			return; /* the client saw the channel closed */
	}
	if (is_method && cls == 60 && m == 50) { /* the broker's own Return: a return rule must not add one */
		struct fchan *rc = chan_find(fc, p->ch);
		if (rc)
			rc->returns++;
	}
	bool confirm = is_method && cls == 60 && (m == 80 || m == 120) && p->size == 13;
	struct fchan *c = confirm ? chan_find(fc, p->ch) : NULL;
	if (c && c->confirm) {
		broker_confirm(fc, c, f, m == 120);
		return;
	}
	if (is_method && cls == 20 && (m == 40 || m == 41)) /* the broker closes the channel, or answers the close */
		chan_drop(fc, p->ch);
	if (p->type == FRAME_HEARTBEAT && heartbeat_stalled(fc))
		return;
	if (!fc->killing)
		out(fc, dir, f, 7 + p->size + 1);
}

/* What the end of a client's content frame asks of the feed. */
enum content_end {
	CE_ON,    /* nothing: go on */
	CE_STOP,  /* a kill or a block: what follows is not passed on now */
	CE_CLOSE, /* a close-channel's publish ended: channel.close to the broker right after it */
};

/* The client's content frame just ended (header or body). */
static enum content_end content_done(struct tap_fault_conn *fc, struct fparse *p)
{
	struct fchan *c = chan_find(fc, p->ch);
	if (!c || !c->pub_open)
		return CE_ON;
	if (p->type == FRAME_HEADER) {
		c->pub_header = true;
		if (c->body_left > 0)
			return CE_ON;
	} else if (p->type == FRAME_BODY) {
		if (!c->pub_header || p->size > c->body_left) {
			c->pub_open = false;
			return CE_ON;
		}
		c->body_left -= p->size;
		if (c->body_left > 0)
			return CE_ON;
	} else {
		return CE_ON;
	}
	c->pub_open = false;
	if (c->pub_return)
		fault_return_done(fc, c, true);
	if (c->pub_close && !c->fclose) { /* channel.close to the broker after this publish, to the client soon */
		c->pub_close = false;
		return CE_CLOSE;
	}
	if (c->pub_block && !fc->blocking) { /* the client is not read from the end of this publish on */
		fc->blocking = true;
		fc->block_ms = c->block_s * 1000;
		fc->inject_blocked = fc->blocked_cap;
		act(fc, c->block_rule, TAP_FAULT_BLOCK, c->id, c->pub_seq, 0, fc->block_ms);
		return CE_STOP;
	}
	if (!c->pub_kill)
		return CE_ON;
	fc->killing = true;
	fc->kill_ch = c->id;
	fc->kill_tag = c->pub_seq;
	fc->kill_rule = c->kill_rule;
	uint64_t outstanding = c->confirm ? c->next_seq - 1 - c->last_tag : 0;
	act(fc, c->kill_rule, TAP_FAULT_KILL, c->id, c->pub_seq, outstanding, 0);
	return CE_STOP;
}

/* connection.blocked (reason: "amqptap fault injection") or connection.unblocked, to the client. */
static void inject(struct tap_fault_conn *fc)
{
	static const char reason[] = "amqptap fault injection";
	uint8_t f[8 + 4 + 1 + sizeof reason];
	if (fc->killing)
		fc->inject_blocked = fc->inject_unblocked = false;
	if (fc->n_show && !fc->killing)
		fault_close_show(fc);
	if (fc->inject_blocked) {
		size_t rl = sizeof reason - 1;
		f[0] = FRAME_METHOD;
		put16(f + 1, 0);
		put32(f + 3, (uint32_t)(4 + 1 + rl));
		put16(f + 7, 10);
		put16(f + 9, 60);
		f[11] = (uint8_t)rl;
		memcpy(f + 12, reason, rl);
		f[12 + rl] = FRAME_END;
		out(fc, TAP_S2C, f, 13 + rl);
		fc->inject_blocked = false;
	}
	if (fc->inject_unblocked) {
		f[0] = FRAME_METHOD;
		put16(f + 1, 0);
		put32(f + 3, 4);
		put16(f + 7, 10);
		put16(f + 9, 61);
		f[11] = FRAME_END;
		out(fc, TAP_S2C, f, 12);
		fc->inject_unblocked = false;
	}
}

uint32_t tap_fault_block_ms(const struct tap_fault_conn *fc)
{
	return fc->block_ms;
}

unsigned tap_fault_unblock(struct tap_fault_conn *fc, int64_t now_us, const struct tap_fault_io *io)
{
	fc->now = now_us;
	fc->io = io;
	if (!fc->blocking)
		return status(fc);
	fc->blocking = false;
	fc->inject_unblocked = fc->blocked_cap;
	if (fc->p[TAP_S2C].n_hdr == 0)
		inject(fc);
	uint8_t *held = fc->c2s_held;
	size_t len = fc->c2s_held_len;
	fc->c2s_held = NULL;
	fc->c2s_held_len = 0;
	unsigned st = len ? tap_fault_feed(fc, TAP_C2S, held, len, now_us, io) : status(fc);
	free(held);
	return st;
}

bool fault_keep(uint8_t **buf, size_t *buf_len, const uint8_t *data, size_t len)
{
	if (len == 0)
		return true;
	uint8_t *n = realloc(*buf, *buf_len + len);
	if (!n)
		return false;
	memcpy(n + *buf_len, data, len);
	*buf = n;
	*buf_len += len;
	return true;
}

/* While blocked, what the client sent waits (a read or two: the relay does not read it meanwhile). Without memory
 * it is lost to the broker, as a connection cut there would lose it. */
static void hold_client(struct tap_fault_conn *fc, const uint8_t *data, size_t len)
{
	(void)fault_keep(&fc->c2s_held, &fc->c2s_held_len, data, len);
}

/* While a channel's close waits for the broker's close-ok, what the client sent from its next frame on that
 * channel waits (close-channel). */
static void wait_client(struct tap_fault_conn *fc, const uint8_t *data, size_t len)
{
	(void)fault_keep(&fc->c2s_wait, &fc->c2s_wait_len, data, len);
}

/* The broker answered the close the client was waiting for: what it sent since goes on. */
static unsigned release_wait(struct tap_fault_conn *fc, int64_t now_us, const struct tap_fault_io *io)
{
	fc->release_wait = false;
	fc->waiting = false;
	if (fc->n_answer) /* the wait began at a frame boundary: what the broker is owed goes before it */
		fault_close_answer(fc);
	uint8_t *held = fc->c2s_wait;
	size_t len = fc->c2s_wait_len;
	fc->c2s_wait = NULL;
	fc->c2s_wait_len = 0;
	unsigned st = len ? tap_fault_feed(fc, TAP_C2S, held, len, now_us, io) : status(fc);
	free(held);
	return st;
}

/* The frame whose 7-byte header just completed: whether it is kept whole (collect), not passed on (drop), kept for
 * a Return (capture). False when the client is to wait from this frame on (fc->waiting). */
static bool frame_begins(struct tap_fault_conn *fc, enum tap_dir dir, struct fparse *p)
{
	p->type = p->hdr[0];
	p->ch = get16(p->hdr + 1);
	p->size = get32(p->hdr + 3);
	p->left = (uint64_t)p->size + 1;
	p->collect = (p->type == FRAME_METHOD && p->size <= FAULT_SMALL) ||
		     (dir == TAP_S2C && p->type == FRAME_HEARTBEAT && p->size == 0) ||
		     (dir == TAP_C2S && p->type == FRAME_HEADER); /* its body size, at least */
	p->drop = false;
	p->capture = false;
	if (p->collect) {
		memcpy(p->small, p->hdr, 7);
		p->n_small = 7;
	}
	if (fc->n_fclosed && p->ch) {
		p->drop = fault_close_drops(fc, dir, p->ch);
		if (dir == TAP_C2S && fc->waiting)
			return false;
	}
	if (dir == TAP_C2S && fc->n_capturing && !p->drop && (p->type == FRAME_HEADER || p->type == FRAME_BODY)) {
		struct fchan *c = chan_find(fc, p->ch);
		if (c && c->pub_return)
			fault_return_frame(fc, c, p);
	}
	return true;
}

unsigned tap_fault_feed(struct tap_fault_conn *fc, enum tap_dir dir, const uint8_t *data, size_t len, int64_t now_us,
			const struct tap_fault_io *io)
{
	struct fparse *p = &fc->p[dir];
	fc->now = now_us;
	fc->io = io;
	fault_shape_select(fc);
	size_t i = 0;
	if (dir == TAP_C2S && fc->killing)
		return status(fc); /* what the client sends after the kill's publish never reaches the broker */
	if (dir == TAP_C2S && fc->blocking) {
		hold_client(fc, data, len);
		return status(fc);
	}
	if (dir == TAP_C2S && fc->waiting) {
		wait_client(fc, data, len);
		return status(fc);
	}
	if (dir == TAP_C2S && !fc->header_seen) { /* "AMQP" 0 0 9 1 */
		size_t take = 8u - fc->n_proto < len ? 8u - fc->n_proto : len;
		fc->n_proto = (uint8_t)(fc->n_proto + take);
		i = take;
		fc->header_seen = fc->n_proto == 8;
	}
	/* Bytes go on in runs [run, i) of frames passed as they stream. A broker frame kept whole is passed on (or
	 * rewritten) by frame_done; a client frame kept whole was passed in its run already. A frame not passed on
	 * (drop) ends the run before it. A frame header that began in an earlier chunk (prior bytes of it) was not
	 * passed on: what becomes of its frame was not known yet. */
	size_t run = dir == TAP_C2S ? 0 : i;
	size_t fstart = 0;
	uint8_t prior = p->n_hdr;
	bool emit_now = dir == TAP_C2S || !fc->killing;
	while (i < len) {
		if (p->n_hdr < 7) {
			if (p->n_hdr == 0) {
				fstart = i;
				prior = 0;
			}
			size_t take = 7u - p->n_hdr < len - i ? 7u - p->n_hdr : len - i;
			memcpy(p->hdr + p->n_hdr, data + i, take);
			p->n_hdr = (uint8_t)(p->n_hdr + take);
			i += take;
			if (p->n_hdr < 7)
				break;
			if (!frame_begins(fc, dir, p)) { /* the client waits from this frame on, its header included */
				out(fc, dir, data + run, fstart - run);
				wait_client(fc, p->hdr, 7);
				wait_client(fc, data + i, len - i);
				p->n_hdr = 0;
				return status(fc);
			}
			bool held = (dir == TAP_S2C && p->collect) || p->drop;
			if (held) {
				if (emit_now)
					out(fc, dir, data + run, fstart - run);
				run = i;
			} else if (prior) {
				if (emit_now)
					out(fc, dir, p->hdr, prior);
			}
			continue;
		}
		size_t take = p->left < len - i ? (size_t)p->left : len - i;
		if (p->collect) { /* a client's large content header: its first FAULT_SMALL bytes */
			size_t room = sizeof p->small - p->n_small, copy = take < room ? take : room;
			memcpy(p->small + p->n_small, data + i, copy);
			p->n_small += (uint32_t)copy;
		}
		if (p->capture)
			fault_return_bytes(fc, p->ch, data + i, take);
		i += take;
		p->left -= take;
		if ((p->collect && dir == TAP_S2C) || p->drop)
			run = i;
		if (p->left > 0)
			break;
		p->n_hdr = 0; /* the frame is complete */
		if (dir == TAP_S2C) {
			if (p->collect)
				frame_done(fc, dir, p);
			if (fc->inject_blocked || fc->inject_unblocked || fc->n_show) { /* a frame boundary: inject now */
				if (!p->collect && !p->drop && !fc->killing)
					out(fc, dir, data + run, i - run);
				run = i;
				inject(fc);
			}
			continue;
		}
		if (p->type == FRAME_HEADER && p->size >= 12 && !p->drop) {
			struct fchan *c = chan_find(fc, p->ch);
			if (c && c->pub_open)
				c->body_left = get64(p->small + 7 + 4);
		}
		if (p->collect && p->type == FRAME_METHOD)
			frame_done(fc, dir, p);
		if (fc->waiting) { /* a channel.open crossed the close: it (kept already) and what follows wait */
			fault_emit(fc, dir, data + run, i - run);
			wait_client(fc, data + i, len - i);
			return status(fc);
		}
		enum content_end ce = p->drop ? CE_ON : content_done(fc, p);
		if (ce == CE_STOP) {
			fault_emit(fc, dir, data + run, i - run);
			if (fc->blocking) {
				hold_client(fc, data + i, len - i);
				if (fc->p[TAP_S2C].n_hdr == 0)
					inject(fc);
			}
			return status(fc);
		}
		if (ce == CE_CLOSE || fc->n_answer) { /* a frame boundary: the tap's own frames to the broker */
			fault_emit(fc, dir, data + run, i - run);
			run = i;
			if (ce == CE_CLOSE)
				fault_close_start(fc, chan_find(fc, p->ch));
			if (fc->n_answer)
				fault_close_answer(fc);
		}
	}
	size_t stop = p->n_hdr > 0 && p->n_hdr < 7 ? fstart : i; /* a header not complete waits */
	if (dir == TAP_C2S) {
		if (stop > run)
			fault_emit(fc, dir, data + run, stop - run);
	} else if (!fc->killing) {
		if (stop > run)
			out(fc, dir, data + run, stop - run);
	}
	unsigned st = status(fc);
	if (dir == TAP_S2C && fc->release_wait)
		st = release_wait(fc, now_us, io);
	return st;
}
