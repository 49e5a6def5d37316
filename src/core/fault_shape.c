/* latency and bandwidth (fault_int.h): byte-level faults, as a byte-level proxy (toxiproxy) makes them, after the
 * frame-level ones. Everything the rewriter emits in a direction goes through fault_emit: without a latency or
 * bandwidth rule on it, and nothing of it held, straight to io->emit; else it is appended to the direction's queue
 * of chunks and released by fault_shape_release (the relay's timer, at fault_shape_due) in the order it came:
 *
 *   latency:ms=M[,jitter=J]  a chunk is due M ms (+- up to J, uniform) after it was emitted, and never before the
 *                            chunk ahead of it (a jitter that would reorder bytes only holds them longer)
 *   bandwidth:kib=K          a due chunk goes as fast as a token bucket of K KiB/s lets it (tap_fault_pace_*), in
 *                            pieces: at most TAP_FAULT_PACE_MS worth at once
 *
 * Held bytes are bounded by the relay: past TAP_FAULT_SHAPE_MAX in a direction it stops reading that direction's
 * sender (TAP_FAULT_CLIENT_FULL, TAP_FAULT_FULL) until they are released. A rule that ends (for=, removed) leaves
 * what it held to go at its due time, unpaced. */
#include "fault_int.h"

#include <stdlib.h>
#include <string.h>

#define US_PER_S 1000000u

/* ---- the token bucket ---- */

void tap_fault_pace_init(struct tap_fault_pace *p, uint64_t rate, int64_t now_us)
{
	p->rate = rate;
	p->burst = rate * TAP_FAULT_PACE_MS / 1000;
	if (p->burst == 0)
		p->burst = 1;
	p->tokens = p->burst;
	p->frac = 0;
	p->last_us = now_us;
}

/* Earns the tokens of the time since last_us (a full bucket after a second or more: no overflow either). */
static void refill(struct tap_fault_pace *p, int64_t now_us)
{
	if (now_us <= p->last_us)
		return;
	int64_t gone = now_us - p->last_us;
	p->last_us = now_us;
	if (gone >= (int64_t)US_PER_S) {
		p->tokens = p->burst;
		p->frac = 0;
		return;
	}
	uint64_t earned = (uint64_t)gone * p->rate + p->frac; /* < 1e6 * 2^34: fits */
	p->tokens += earned / US_PER_S;
	p->frac = earned % US_PER_S;
	if (p->tokens >= p->burst) {
		p->tokens = p->burst;
		p->frac = 0;
	}
}

size_t tap_fault_pace_take(struct tap_fault_pace *p, int64_t now_us, size_t want)
{
	refill(p, now_us);
	size_t n = want < p->tokens ? want : (size_t)p->tokens;
	p->tokens -= n;
	return n;
}

int64_t tap_fault_pace_when(const struct tap_fault_pace *p, int64_t now_us, size_t want)
{
	struct tap_fault_pace q = *p;
	refill(&q, now_us);
	uint64_t need = want < q.burst ? want : q.burst;
	if (q.tokens >= need || q.rate == 0)
		return now_us;
	uint64_t owed = (need - q.tokens) * US_PER_S - q.frac; /* millionths of a token */
	return now_us + (int64_t)((owed + q.rate - 1) / q.rate);
}

/* ---- the rules acting on a direction ---- */

static uint64_t xorshift(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

/* One `fault` record per rule and connection, when it begins acting (a rule with dir=both: one). */
static void began(struct tap_fault_conn *fc, const struct tap_fault_rule *r)
{
	struct ctr *k = fault_counter(fc, r->id);
	if (!k || k->acts++ > 0)
		return;
	struct tap_fault_act x = {.rule = r->id, .action = r->action, .ms = r->ms, .jitter_ms = r->jitter_ms,
				  .kib = r->kib, .way = r->way};
	fault_act(fc, &x);
}

void fault_shape_select(struct tap_fault_conn *fc)
{
	for (int d = 0; d < TAP_DIR_COUNT; d++) {
		struct fshape *sh = &fc->shape[d];
		const struct tap_fault_rule *lat = fault_way_rule(fc, TAP_FAULT_LATENCY, (enum tap_dir)d);
		const struct tap_fault_rule *bw = fault_way_rule(fc, TAP_FAULT_BANDWIDTH, (enum tap_dir)d);
		sh->lat_rule = lat ? lat->id : 0;
		sh->ms = lat ? lat->ms : 0;
		sh->jitter_ms = lat ? lat->jitter_ms : 0;
		if (lat)
			began(fc, lat);
		if (bw && (bw->id != sh->bw_rule || bw->kib != sh->kib)) /* a new rate starts with a full bucket */
			tap_fault_pace_init(&sh->pace, (uint64_t)bw->kib * 1024, fc->now);
		if (bw)
			began(fc, bw);
		else
			sh->pace.rate = 0;
		sh->bw_rule = bw ? bw->id : 0;
		sh->kib = bw ? bw->kib : 0;
	}
}

/* ---- holding and releasing ---- */

/* When a chunk emitted now is due: now plus the latency and its jitter, never before the chunk ahead of it. */
static int64_t due_of(struct tap_fault_conn *fc, struct fshape *sh)
{
	int64_t due = fc->now;
	if (sh->lat_rule) {
		due += (int64_t)sh->ms * 1000;
		if (sh->jitter_ms) {
			uint64_t span = (uint64_t)sh->jitter_ms * 2000 + 1; /* [-jitter, +jitter] in microseconds */
			due += (int64_t)(xorshift(&fc->jitter_rng) % span) - (int64_t)sh->jitter_ms * 1000;
		}
	}
	if (due < fc->now)
		due = fc->now;
	if (due < sh->last_due)
		due = sh->last_due;
	sh->last_due = due;
	return due;
}

/* The next time release has something to do in this direction. */
static void plan(struct tap_fault_conn *fc, struct fshape *sh)
{
	if (!sh->head)
		sh->next = INT64_MAX;
	else if (sh->head->due > fc->now || !sh->pace.rate)
		sh->next = sh->head->due > fc->now ? sh->head->due : fc->now;
	else
		sh->next = tap_fault_pace_when(&sh->pace, fc->now, sh->head->len - sh->head->off);
}

static void pass(struct tap_fault_conn *fc, enum tap_dir dir, const uint8_t *p, size_t len)
{
	if (len && !(dir == TAP_S2C && fc->killing)) /* the client of a connection being killed sees nothing more */
		fc->io->emit(fc->io->ctx, dir, p, len);
}

static void drop_head(struct fshape *sh)
{
	struct chunk *c = sh->head;
	sh->head = c->next;
	if (!sh->head)
		sh->tail = NULL;
	sh->held -= c->len - c->off;
	free(c);
}

/* Emits the direction's chunks that are due, as far as its rate allows. */
static void release_dir(struct tap_fault_conn *fc, enum tap_dir dir)
{
	struct fshape *sh = &fc->shape[dir];
	while (sh->head && sh->head->due <= fc->now) {
		struct chunk *c = sh->head;
		size_t left = c->len - c->off;
		size_t n = sh->pace.rate ? tap_fault_pace_take(&sh->pace, fc->now, left) : left;
		pass(fc, dir, c->data + c->off, n);
		c->off += n;
		sh->held -= n;
		if (n < left)
			break;
		drop_head(sh);
	}
	plan(fc, sh);
}

void fault_emit(struct tap_fault_conn *fc, enum tap_dir dir, const uint8_t *p, size_t len)
{
	struct fshape *sh = &fc->shape[dir];
	if (len == 0)
		return;
	if (!sh->head && !sh->lat_rule && !sh->pace.rate) { /* nothing to shape: as without these rules */
		fc->io->emit(fc->io->ctx, dir, p, len);
		return;
	}
	if (!sh->head && !sh->lat_rule) { /* bandwidth alone: what the bucket holds goes now, uncopied */
		size_t n = tap_fault_pace_take(&sh->pace, fc->now, len);
		if (n)
			fc->io->emit(fc->io->ctx, dir, p, n);
		p += n;
		len -= n;
		if (len == 0)
			return;
	}
	struct chunk *c = malloc(sizeof *c + len);
	if (!c) { /* no memory to hold them: everything held goes now, then these (early, but in order) */
		while (sh->head) {
			pass(fc, dir, sh->head->data + sh->head->off, sh->head->len - sh->head->off);
			drop_head(sh);
		}
		fc->io->emit(fc->io->ctx, dir, p, len);
		plan(fc, sh);
		return;
	}
	c->next = NULL;
	c->due = due_of(fc, sh);
	c->len = len;
	c->off = 0;
	memcpy(c->data, p, len);
	if (sh->tail)
		sh->tail->next = c;
	else
		sh->head = c;
	sh->tail = c;
	sh->held += len;
	plan(fc, sh);
}

void fault_shape_release(struct tap_fault_conn *fc)
{
	release_dir(fc, TAP_C2S);
	release_dir(fc, TAP_S2C);
}

int64_t fault_shape_due(const struct tap_fault_conn *fc)
{
	int64_t a = fc->shape[TAP_C2S].head ? fc->shape[TAP_C2S].next : INT64_MAX;
	int64_t b = fc->shape[TAP_S2C].head ? fc->shape[TAP_S2C].next : INT64_MAX;
	return a < b ? a : b;
}

void fault_shape_free(struct tap_fault_conn *fc)
{
	for (int d = 0; d < TAP_DIR_COUNT; d++)
		while (fc->shape[d].head)
			drop_head(&fc->shape[d]);
}
