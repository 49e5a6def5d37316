/* TCP reassembly for the capture reader (RFC 9293 §3.4 sequence space): one ordered byte stream per direction of
 * every connection to the broker port, with out-of-order segments buffered (bounded), retransmissions and overlaps
 * dropped, and the number and lifetime of streams bounded (see struct stream). */
#include "reasm.h"

#include "amqptap/status.h"

#include <arpa/inet.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

struct stream_key {
	uint8_t client[16], server[16];
	uint16_t cport, sport;
	uint8_t v6;
	uint8_t pad[3];
};

struct ooo_seg {
	uint32_t seq;
	uint32_t len;
	uint32_t lost; /* bytes after data that the snap length cut off (tap_segment.lost) */
	bool fin;
	uint8_t *data;
};

/* One direction of a stream: `next` is the sequence number of the next byte to deliver. */
struct half {
	bool init;
	bool fin_done;
	bool syn;     /* isn is known */
	bool spoke;   /* delivered a byte */
	uint32_t isn;
	uint32_t next;
	struct ooo_seg *segs; /* sorted by distance from next */
	size_t n, cap;
	size_t bytes;
	/* The peer acknowledged up to `acked`. Bytes below it that the capture has not had yet are awaited (linked
	 * in tap_reasm's waits, oldest first) for TAP_CAPTURE_REORDER_US from wait_since, then given up on. */
	bool acked_set;
	bool waiting;
	uint32_t acked;
	uint32_t wait_seq;  /* awaited up to here: what was acknowledged at wait_since */
	int64_t wait_since;
	/* capture time of this direction's latest segment that reached `next`: bytes from `next` on were sent after
	 * it, so nothing they hold can have been sent before it */
	int64_t seen_ts;
	struct half *wprev, *wnext;
	struct stream *owner;
	enum tap_dir dir;
};

/* A stream stays in the table after it closed (so late packets of it are recognised and dropped) until it has
 * been closed for the idle time or the closed ones exceed max_streams; an open stream that carried nothing for
 * the idle time, or the least recently active one when a new stream would exceed max_streams, is closed
 * (TAP_CAPTURE_END_IDLE, _LIMIT) and dropped at once, so a later packet of it starts a mid-stream stream.
 *
 * A stream is opened for the caller (tap_capture_cb.open) only at its first byte, or first gap, or when a stream
 * whose handshake was seen both ways ends: until then it is quiet, costs its struct and nothing of the decoder or
 * the tracker, goes first when room is needed, and is dropped after TAP_CAPTURE_QUIET_IDLE_US without a packet. So a flood of SYNs (or of handshakes that never carry AMQP)
 * neither evicts a live connection, however idle, nor costs the decoder's state per flow. */
struct stream {
	struct stream_key key;
	uint64_t id;
	void *user;
	bool opened;    /* the caller's open was called (user is its); else the stream is quiet */
	bool midstream; /* its first packet was no handshake (for the caller's open) */
	bool closed;
	bool fin_seen;
	enum tap_dir first_fin; /* the direction of the first FIN, once fin_seen */
	struct half h[TAP_DIR_COUNT];
	int64_t last_ts; /* capture time of its last packet, or of its close once closed */
	int64_t open_ts; /* capture time of its first packet (for the caller's open) */
	struct stream *hnext; /* hash chain */
	struct stream_link {
		struct stream *prev, *next;
	} by_start, by_age; /* open streams in creation order; open streams by last packet, or closed ones by close */
	struct stream_link by_quiet; /* quiet streams, in creation order */
};

/* Eight bytes of the key at a time (looked up once or twice per packet: a byte at a time was 4 % of a replay). */
static size_t key_hash(const struct stream_key *k, size_t size)
{
	_Static_assert(sizeof *k % 8 == 0, "the key is hashed in whole words");
	uint64_t h = 0;
	const uint8_t *p = (const uint8_t *)k;
	for (size_t i = 0; i < sizeof *k; i += 8) {
		uint64_t w;
		memcpy(&w, p + i, sizeof w);
		h = (h ^ w) * 0x9E3779B97F4A7C15ull;
		h ^= h >> 32;
	}
	return (size_t)(h ^ (h >> 29)) & (size - 1);
}

static struct stream *stream_find(struct tap_reasm *r, const struct stream_key *k)
{
	if (!r->tab)
		return NULL;
	for (struct stream *s = r->tab[key_hash(k, r->tab_size)]; s; s = s->hnext)
		if (memcmp(&s->key, k, sizeof *k) == 0)
			return s;
	return NULL;
}

static bool tab_grow(struct tap_reasm *r)
{
	size_t size = r->tab_size ? r->tab_size * 2 : 256;
	struct stream **tab = calloc(size, sizeof *tab);
	if (!tab)
		return false;
	for (size_t i = 0; i < r->tab_size; i++) {
		struct stream *s = r->tab[i];
		while (s) {
			struct stream *next = s->hnext;
			size_t h = key_hash(&s->key, size);
			s->hnext = tab[h];
			tab[h] = s;
			s = next;
		}
	}
	free(r->tab);
	r->tab = tab;
	r->tab_size = size;
	return true;
}

static struct stream_link *link_of(const struct stream_list *l, struct stream *s)
{
	return (struct stream_link *)((char *)s + l->link);
}

static void list_unlink(struct stream_list *l, struct stream *s)
{
	struct stream_link *k = link_of(l, s);
	if (k->prev)
		link_of(l, k->prev)->next = k->next;
	else
		l->head = k->next;
	if (k->next)
		link_of(l, k->next)->prev = k->prev;
	else
		l->tail = k->prev;
	*k = (struct stream_link){NULL, NULL};
	l->n--;
}

static void list_append(struct stream_list *l, struct stream *s)
{
	struct stream_link *k = link_of(l, s);
	*k = (struct stream_link){l->tail, NULL};
	if (l->tail)
		link_of(l, l->tail)->next = s;
	else
		l->head = s;
	l->tail = s;
	l->n++;
}

/* What a buffered segment of len bytes counts against TAP_CAPTURE_MAX_OOO_TOTAL: a sender of one-byte segments
 * must not hold more memory than one of full ones. */
static size_t ooo_cost(size_t len)
{
	return len + sizeof(struct ooo_seg) + 32;
}

static void wait_unlink(struct tap_reasm *r, struct half *h)
{
	if (!h->waiting)
		return;
	if (h->wprev)
		h->wprev->wnext = h->wnext;
	else
		r->wait_head = h->wnext;
	if (h->wnext)
		h->wnext->wprev = h->wprev;
	else
		r->wait_tail = h->wprev;
	h->wprev = h->wnext = NULL;
	h->waiting = false;
}

/* After `next` or `acked` of s's direction dir moved: a wait whose bytes came ends, and acknowledged bytes not yet
 * had start one (at the capture's clock, which never goes back, so the waits stay oldest first). */
static void wait_review(struct tap_reasm *r, struct stream *s, enum tap_dir dir)
{
	struct half *h = &s->h[dir];
	if (h->waiting && (int32_t)(h->wait_seq - h->next) <= 0)
		wait_unlink(r, h);
	if (h->waiting || !h->acked_set || h->fin_done || s->closed || (int32_t)(h->acked - h->next) <= 0)
		return;
	h->waiting = true;
	h->wait_seq = h->acked;
	h->wait_since = r->now;
	h->owner = s;
	h->dir = dir;
	h->wnext = NULL;
	h->wprev = r->wait_tail;
	if (r->wait_tail)
		r->wait_tail->wnext = h;
	else
		r->wait_head = h;
	r->wait_tail = h;
}

static void half_clear(struct tap_reasm *r, struct half *h)
{
	wait_unlink(r, h);
	for (size_t i = 0; i < h->n; i++) {
		r->ooo_held -= ooo_cost(h->segs[i].len);
		free(h->segs[i].data);
	}
	free(h->segs);
	memset(h, 0, sizeof *h);
}

static void addr_text(char out[64], bool v6, const uint8_t *addr, uint16_t port)
{
	char ip[INET6_ADDRSTRLEN];
	if (!inet_ntop(v6 ? AF_INET6 : AF_INET, addr, ip, sizeof ip))
		strcpy(ip, "?");
	snprintf(out, 64, v6 ? "[%s]:%u" : "%s:%u", ip, port);
}

static enum tap_capture_end fin_end(const struct stream *s)
{
	return s->first_fin == TAP_C2S ? TAP_CAPTURE_END_CLIENT_FIN : TAP_CAPTURE_END_SERVER_FIN;
}

/* Moves the capture clock to ts if that is later. */
static void clock_to(struct tap_reasm *r, int64_t ts)
{
	if (!r->now_set || ts > r->now) {
		r->now = ts;
		r->now_set = true;
	}
}

static void *stream_user(struct tap_reasm *r, struct stream *s);

static void stream_close(struct tap_reasm *r, struct stream *s, enum tap_capture_end how, int64_t ts)
{
	if (s->closed)
		return;
	if (!s->opened && s->h[TAP_C2S].syn && s->h[TAP_S2C].syn)
		(void)stream_user(r, s); /* a connection that ended before its first byte: one, as the proxy saw it */
	s->closed = true;
	r->st->one_way += s->h[TAP_C2S].spoke && !s->h[TAP_S2C].spoke;
	clock_to(r, ts);
	s->last_ts = r->now;
	list_unlink(&r->live, s);
	list_append(&r->dead, s);
	if (!s->opened)
		list_unlink(&r->quiet, s);
	else if (r->cb->close)
		r->cb->close(r->cb->ctx, s->user, how, ts);
	s->user = NULL;
	half_clear(r, &s->h[TAP_S2C]);
	half_clear(r, &s->h[TAP_C2S]);
	list_unlink(&r->open, s);
}

/* Takes a closed stream out of the table and frees it. */
static void stream_free(struct tap_reasm *r, struct stream *s)
{
	struct stream **pp = &r->tab[key_hash(&s->key, r->tab_size)];
	while (*pp != s)
		pp = &(*pp)->hnext;
	*pp = s->hnext;
	list_unlink(&r->dead, s);
	r->n_streams--;
	free(s);
}

/* A quiet stream dropped for room or for its quiet time: never a connection for the caller (see struct stream). */
static void quiet_drop(struct tap_reasm *r, struct stream *s)
{
	r->st->quiet_dropped++;
	s->closed = true;
	list_unlink(&r->quiet, s);
	list_unlink(&r->open, s);
	list_unlink(&r->live, s);
	list_append(&r->dead, s);
	half_clear(r, &s->h[TAP_S2C]);
	half_clear(r, &s->h[TAP_C2S]);
	stream_free(r, s);
}

static void flush_holes(struct tap_reasm *r, struct stream *s, int64_t ts);

/* Capture timestamps can be any value a file holds: compared without a signed subtraction that could overflow. */
static bool idle_for(int64_t ts, int64_t last_ts, int64_t idle_us)
{
	return ts > last_ts && (uint64_t)ts - (uint64_t)last_ts >= (uint64_t)idle_us;
}

static void forget_dead(struct tap_reasm *r, int64_t ts)
{
	struct stream *s;
	while ((s = r->dead.head) && idle_for(ts, s->last_ts, r->idle_us))
		stream_free(r, s);
}

/* Resolves a pending jump of the clock with the time of the packet after it. Nearer the time before the jump:
 * two clocks apart, not a silence; every stream older than the jump is moved with it, so none is idle for it
 * (clock_steps counts these). Else every stream was silent: the idle ones end at the jump, as without it. */
static void resolve_jump(struct tap_reasm *r, int64_t ts)
{
	r->jump_pending = false;
	bool old_clock = ts < r->jump_at && (uint64_t)r->jump_at - (uint64_t)ts > r->jump_step / 2;
	if (!old_clock) {
		tap_reasm_expire(r, r->jump_at);
		return;
	}
	r->st->clock_steps++;
	const struct stream_list *lists[] = {&r->live, &r->dead};
	for (size_t i = 0; i < 2; i++)
		for (struct stream *s = lists[i]->head; s; s = s->by_age.next)
			if (s->last_ts < r->jump_at)
				s->last_ts = (int64_t)((uint64_t)s->last_ts + r->jump_step);
}

void tap_reasm_packet_time(struct tap_reasm *r, int64_t ts)
{
	if (r->now_set && ts < r->now && (uint64_t)r->now - (uint64_t)ts >= 1000000)
		r->st->clock_back++; /* here, once per packet: the clock is looked at again for its segment */
	if (r->jump_pending)
		resolve_jump(r, ts);
	if (r->now_set && ts > r->now && r->idle_us > 0 && (uint64_t)ts - (uint64_t)r->now >= (uint64_t)r->idle_us) {
		r->jump_pending = true;
		r->jump_at = ts;
		r->jump_step = (uint64_t)ts - (uint64_t)r->now;
		clock_to(r, ts);
		forget_dead(r, ts); /* closed streams are forgotten either way */
		return; /* no open stream ends until the next packet says whether this was a silence */
	}
	tap_reasm_expire(r, ts);
}

void tap_reasm_expire(struct tap_reasm *r, int64_t ts)
{
	struct stream *s;
	if (r->jump_pending) { /* a time past the jump with no packet of the old clock between: a silence */
		if (ts <= r->jump_at)
			return;
		r->jump_pending = false;
		tap_reasm_expire(r, r->jump_at);
	}
	clock_to(r, ts);
	ts = r->now;
	tap_reasm_expire_acks(r, ts);
	int64_t quiet_us = r->idle_us < TAP_CAPTURE_QUIET_IDLE_US ? r->idle_us : TAP_CAPTURE_QUIET_IDLE_US;
	while ((s = r->quiet.head) && idle_for(ts, s->last_ts, quiet_us))
		quiet_drop(r, s);
	while ((s = r->live.head) && idle_for(ts, s->last_ts, r->idle_us)) {
		r->st->idle_closed++;
		flush_holes(r, s, ts);
		stream_close(r, s, TAP_CAPTURE_END_IDLE, ts);
		stream_free(r, s);
	}
	forget_dead(r, ts);
}

/* Room for one more stream under max_streams: the oldest closed one is forgotten, else the least recently active
 * open one is closed. */
static void make_room(struct tap_reasm *r, int64_t ts)
{
	if (r->jump_pending && r->dead.n + r->live.n >= r->max_streams) {
		r->jump_pending = false; /* no room to wait for the next packet: taken as a silence */
		tap_reasm_expire(r, r->jump_at);
	}
	while (r->dead.n > 0 && r->dead.n + r->live.n >= r->max_streams)
		stream_free(r, r->dead.head);
	while (r->quiet.n > 0 && r->live.n >= r->max_streams) /* quiet ones first: they cost nobody a record */
		quiet_drop(r, r->quiet.head);
	while (r->live.n > 0 && r->live.n >= r->max_streams) {
		struct stream *s = r->live.head;
		r->st->evicted++;
		flush_holes(r, s, ts);
		stream_close(r, s, TAP_CAPTURE_END_LIMIT, ts);
		stream_free(r, s);
	}
}

/* A new stream in place of a closed one with the same key, or a fresh one. */
static struct stream *stream_open(struct tap_reasm *r, struct stream *old, const struct stream_key *k, bool midstream,
				  int64_t ts)
{
	struct stream *s = old;
	if (!s) {
		make_room(r, ts);
		if (r->n_streams >= r->tab_size && !tab_grow(r))
			return NULL;
		s = calloc(1, sizeof *s);
		if (!s)
			return NULL;
		s->key = *k;
		size_t h = key_hash(k, r->tab_size);
		s->hnext = r->tab[h];
		r->tab[h] = s;
		r->n_streams++;
	} else {
		list_unlink(&r->dead, s);
		struct stream *hnext = s->hnext;
		memset(s, 0, sizeof *s);
		s->key = *k;
		s->hnext = hnext;
	}
	clock_to(r, ts);
	s->last_ts = r->now;
	s->open_ts = ts;
	s->midstream = midstream;
	list_append(&r->live, s);
	list_append(&r->open, s);
	list_append(&r->quiet, s);
	s->id = ++r->st->streams;
	return s;
}

/* The caller's handle of s, opening it for the caller at its first byte or gap (see struct stream). */
static void *stream_user(struct tap_reasm *r, struct stream *s)
{
	if (s->opened)
		return s->user;
	s->opened = true;
	list_unlink(&r->quiet, s);
	if (r->cb->open) {
		char client[64], server[64];
		addr_text(client, s->key.v6, s->key.client, s->key.cport);
		addr_text(server, s->key.v6, s->key.server, s->key.sport);
		s->user = r->cb->open(r->cb->ctx, s->id, client, server, s->midstream, s->open_ts);
	}
	return s->user;
}

static void emit(struct tap_reasm *r, struct stream *s, enum tap_dir dir, const uint8_t *data, size_t len,
		 int64_t ts)
{
	struct half *h = &s->h[dir];
	h->next += (uint32_t)len;
	h->spoke |= len > 0;
	r->st->bytes += len;
	if (h->waiting)
		wait_review(r, s, dir);
	if (len && r->cb->data)
		r->cb->data(r->cb->ctx, stream_user(r, s), dir, data, len, ts);
}

static void reach_fin(struct tap_reasm *r, struct stream *s, enum tap_dir dir)
{
	struct half *h = &s->h[dir];
	h->fin_done = true;
	h->next++;
	wait_unlink(r, h);
	if (!s->fin_seen) {
		s->fin_seen = true;
		s->first_fin = dir;
	}
}

static void give_up_to(struct tap_reasm *r, struct stream *s, enum tap_dir dir, uint32_t upto, int64_t ts);

/* Delivers [seq, seq+len) (+FIN) if it starts at or before `next`; returns false when it lies ahead. The `lost`
 * bytes after the data (cut by the snap length) are given up on once the data before them is delivered: the
 * captured prefix still counts, and the next segment's sequence number follows the bytes on the wire. */
static bool deliver_inorder(struct tap_reasm *r, struct stream *s, enum tap_dir dir, uint32_t seq, const uint8_t *data,
			    size_t len, size_t lost, bool fin, int64_t ts)
{
	struct half *h = &s->h[dir];
	int32_t rel = (int32_t)(seq - h->next);
	if (rel > 0)
		return false;
	size_t old = (size_t)(-(int64_t)rel);
	uint32_t end = seq + (uint32_t)(len + lost); /* where the segment ends on the wire, before its FIN */
	if (old >= len + lost + (fin ? 1 : 0)) {
		if (len || lost || fin)
			r->st->retransmitted++;
		return true;
	}
	if (old > 0) {
		r->st->retransmitted++;
		if (old <= len) {
			data += old;
			len -= old;
		} else {
			len = 0; /* only the cut-off part is new */
		}
	}
	emit(r, s, dir, data, len, ts);
	if ((int32_t)(end - h->next) > 0)
		give_up_to(r, s, dir, end, ts);
	if (fin && !h->fin_done)
		reach_fin(r, s, dir);
	return true;
}

static void drain(struct tap_reasm *r, struct stream *s, enum tap_dir dir, int64_t ts)
{
	struct half *h = &s->h[dir];
	while (h->n > 0 && !h->fin_done && !s->closed) {
		struct ooo_seg g = h->segs[0];
		if ((int32_t)(g.seq - h->next) > 0)
			break;
		memmove(h->segs, h->segs + 1, (h->n - 1) * sizeof *h->segs);
		h->n--;
		h->bytes -= g.len;
		r->ooo_held -= ooo_cost(g.len);
		deliver_inorder(r, s, dir, g.seq, g.data, g.len, g.lost, g.fin, ts);
		free(g.data);
	}
}

/* Gives up on the bytes of `dir` before `upto`: a gap. */
static void give_up_to(struct tap_reasm *r, struct stream *s, enum tap_dir dir, uint32_t upto, int64_t ts)
{
	struct half *h = &s->h[dir];
	uint32_t missing = upto - h->next;
	r->st->gaps++;
	h->next = upto;
	wait_review(r, s, dir); /* before the callback: the caller may ask tap_reasm_known_until */
	if (r->cb->gap)
		r->cb->gap(r->cb->ctx, stream_user(r, s), dir, missing, ts);
}

/* Gives up on the hole before the first buffered segment. */
static void skip_hole(struct tap_reasm *r, struct stream *s, enum tap_dir dir, int64_t ts)
{
	give_up_to(r, s, dir, s->h[dir].segs[0].seq, ts);
	drain(r, s, dir, ts);
}

/* The stream ends with segments still buffered behind holes: the holes are given up on (gap callbacks) and what
 * follows them delivered, so the data and a FIN behind a lost segment are not lost with it; so are the bytes the
 * peer acknowledged that never came (the reorder allowance is moot when nothing more will be read). */
static void flush_holes(struct tap_reasm *r, struct stream *s, int64_t ts)
{
	for (int d = 0; d < TAP_DIR_COUNT; d++) {
		struct half *h = &s->h[d];
		while (h->n > 0 && !h->fin_done && !s->closed)
			skip_hole(r, s, (enum tap_dir)d, ts);
		if (h->acked_set && !h->fin_done && !s->closed && (int32_t)(h->acked - h->next) > 0)
			give_up_to(r, s, (enum tap_dir)d, h->acked, ts);
	}
}

/* A hole of `dir` below what the peer acknowledged, with later bytes of `dir` captured after it: the hole was
 * delivered on the wire and lost only by the capture (a capture keeps each direction's order, even a merge of two
 * one-direction taps), so it will never come; it is given up on at once instead of when the buffer fills. */
static void skip_acked_holes(struct tap_reasm *r, struct stream *s, enum tap_dir dir, int64_t ts)
{
	struct half *h = &s->h[dir];
	while (h->acked_set && h->n > 0 && !h->fin_done && !s->closed && (int32_t)(h->acked - h->next) > 0)
		skip_hole(r, s, dir, ts);
}

/* The peer acknowledged bytes of `dir` up to `ack`. Acknowledged bytes nothing after them was captured yet are a
 * gap too (without that the hole would show only with the next segment of `dir`, perhaps after a return window
 * ran out and took a lost Return for none: `unproven`), but not at once: an ACK can be captured before the segment
 * it acknowledges (two one-direction taps merged, their clocks apart), so they are awaited for
 * TAP_CAPTURE_REORDER_US (tap_reasm_expire_acks), or until a later segment of `dir` shows them lost. */
static void peer_acked(struct tap_reasm *r, struct stream *s, enum tap_dir dir, uint32_t ack, int64_t ts)
{
	struct half *h = &s->h[dir];
	if (!h->init)
		return;
	if (!h->acked_set || (int32_t)(ack - h->acked) > 0) {
		h->acked = ack;
		h->acked_set = true;
	}
	skip_acked_holes(r, s, dir, ts);
	if (!s->closed)
		wait_review(r, s, dir);
}

static bool waited(int64_t now, int64_t since)
{
	return now >= since && (uint64_t)now - (uint64_t)since >= (uint64_t)TAP_CAPTURE_REORDER_US;
}

void tap_reasm_expire_acks(struct tap_reasm *r, int64_t now)
{
	struct half *h;
	while ((h = r->wait_head) != NULL && waited(now, h->wait_since)) {
		struct stream *s = h->owner;
		uint32_t upto = h->wait_seq;
		wait_unlink(r, h);
		if (!s->closed && !h->fin_done && (int32_t)(upto - h->next) > 0) {
			give_up_to(r, s, h->dir, upto, now);
			drain(r, s, h->dir, now);
		}
	}
}

int64_t tap_reasm_known_until(const struct tap_reasm *r)
{
	int64_t until = INT64_MAX;
	for (const struct half *h = r->wait_head; h; h = h->wnext)
		if (h->seen_ts - 1 < until)
			until = h->seen_ts - 1;
	return until;
}

static bool over_total(const struct tap_reasm *r, size_t len)
{
	return r->ooo_held + ooo_cost(len) > TAP_CAPTURE_MAX_OOO_TOTAL;
}

/* Room for len more bytes under TAP_CAPTURE_MAX_OOO_TOTAL, taken from the streams other than s that were active
 * least recently: each gives up its first hole, as if its own bound had been reached. */
static void make_ooo_room(struct tap_reasm *r, const struct stream *s, size_t len, int64_t ts)
{
	struct stream *v = r->live.head;
	while (v && over_total(r, len)) {
		int d = v->h[TAP_C2S].n > 0 ? TAP_C2S : TAP_S2C;
		if (v == s || v->h[d].n == 0 || v->h[d].fin_done) {
			v = v->by_age.next;
			continue;
		}
		skip_hole(r, v, (enum tap_dir)d, ts);
	}
}

static int buffer_ahead(struct tap_reasm *r, struct stream *s, enum tap_dir dir, uint32_t seq, const uint8_t *data,
			size_t len, size_t lost, bool fin, int64_t ts)
{
	struct half *h = &s->h[dir];
	if (over_total(r, len))
		make_ooo_room(r, s, len, ts);
	while (h->n > 0 && (h->n >= TAP_CAPTURE_MAX_OOO_SEGS || h->bytes + len > TAP_CAPTURE_MAX_OOO_BYTES ||
			    over_total(r, len))) {
		skip_hole(r, s, dir, ts);
		if (h->fin_done)
			return TAP_OK;
		if (deliver_inorder(r, s, dir, seq, data, len, lost, fin, ts)) {
			drain(r, s, dir, ts);
			return TAP_OK;
		}
	}
	if (len > TAP_CAPTURE_MAX_OOO_BYTES) { /* cannot be buffered at all: jump to it */
		r->st->gaps++;
		uint32_t missing = seq - h->next;
		h->next = seq;
		if (r->cb->gap)
			r->cb->gap(r->cb->ctx, stream_user(r, s), dir, missing, ts);
		deliver_inorder(r, s, dir, seq, data, len, lost, fin, ts);
		return TAP_OK;
	}
	if (h->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 8;
		struct ooo_seg *p = realloc(h->segs, cap * sizeof *p);
		if (!p)
			return TAP_E_NOMEM;
		h->segs = p;
		h->cap = cap;
	}
	struct ooo_seg g = {seq, (uint32_t)len, (uint32_t)lost, fin, NULL};
	if (len) {
		g.data = malloc(len);
		if (!g.data)
			return TAP_E_NOMEM;
		memcpy(g.data, data, len);
	}
	uint32_t rel = seq - h->next;
	size_t i = h->n;
	while (i > 0 && h->segs[i - 1].seq - h->next > rel)
		i--;
	memmove(h->segs + i + 1, h->segs + i, (h->n - i) * sizeof *h->segs);
	h->segs[i] = g;
	h->n++;
	h->bytes += len;
	r->ooo_held += ooo_cost(len);
	r->st->out_of_order++;
	return TAP_OK;
}

/* A segment of no broker port: counted under the port its server likely has. */
static void count_other_port(struct tap_capture_stats *st, const struct tap_segment *g)
{
	st->other_tcp++;
	bool syn_only = (g->flags & (TCP_SYN | TCP_ACK)) == TCP_SYN;
	uint16_t port = syn_only || g->dport < g->sport ? g->dport : g->sport;
	for (size_t i = 0; i < TAP_CAPTURE_OTHER_PORTS; i++) {
		if (st->other_ports[i].segments == 0)
			st->other_ports[i].port = port;
		if (st->other_ports[i].port == port) {
			st->other_ports[i].segments++;
			return;
		}
	}
}

static bool broker_port(const struct tap_reasm *r, uint16_t port)
{
	for (size_t i = 0; i < r->n_ports; i++)
		if (r->ports[i] == port)
			return true;
	return false;
}

int tap_reasm_segment(struct tap_reasm *r, const struct tap_segment *g, int64_t ts)
{
	struct stream_key k;
	memset(&k, 0, sizeof k);
	k.v6 = g->v6;
	size_t alen = g->v6 ? 16 : 4;
	bool to_server = broker_port(r, g->dport), from_server = broker_port(r, g->sport);
	if (!to_server && !from_server) {
		count_other_port(r->st, g);
		return TAP_OK;
	}
	r->st->tcp_packets++;
	bool syn_only = (g->flags & (TCP_SYN | TCP_ACK)) == TCP_SYN;
	enum tap_dir dir;
	struct stream *s = NULL;
	/* c2s orientation: sender is the client. */
	struct stream_key kc = k, ks = k;
	memcpy(kc.client, g->src, alen);
	memcpy(kc.server, g->dst, alen);
	kc.cport = g->sport;
	kc.sport = g->dport;
	memcpy(ks.client, g->dst, alen);
	memcpy(ks.server, g->src, alen);
	ks.cport = g->dport;
	ks.sport = g->sport;
	if (to_server && from_server) {
		if ((s = stream_find(r, &kc)) != NULL)
			dir = TAP_C2S;
		else if ((s = stream_find(r, &ks)) != NULL)
			dir = TAP_S2C;
		else
			dir = TAP_C2S;
	} else {
		dir = to_server ? TAP_C2S : TAP_S2C;
		s = stream_find(r, dir == TAP_C2S ? &kc : &ks);
	}
	const struct stream_key *key = dir == TAP_C2S ? &kc : &ks;

	if (!s || s->closed) {
		bool handshake = (g->flags & TCP_SYN) != 0;
		if (syn_only && dir == TAP_S2C && !(to_server && from_server))
			return TAP_OK; /* a SYN from the broker port: not a connection to the broker */
		if (!handshake && (g->len + g->lost == 0 || (g->flags & TCP_RST)))
			return TAP_OK; /* teardown or keepalive of a stream we never saw: nothing to deliver */
		if (s && !handshake)
			return TAP_OK; /* late packets of a closed stream */
		s = stream_open(r, s, key, !handshake, ts);
		if (!s)
			return TAP_E_NOMEM;
	} else if (syn_only && dir == TAP_C2S && (!s->h[TAP_C2S].syn || s->h[TAP_C2S].isn != g->seq)) {
		/* a new connection on the 4-tuple of one whose end was not captured */
		flush_holes(r, s, ts);
		stream_close(r, s, s->fin_seen ? fin_end(s) : TAP_CAPTURE_END_CAPTURE, ts);
		s = stream_open(r, s, key, false, ts);
		if (!s)
			return TAP_E_NOMEM;
	} else {
		clock_to(r, ts);
		s->last_ts = r->now;
		list_unlink(&r->live, s);
		list_append(&r->live, s);
	}
	struct half *h = &s->h[dir];
	uint32_t seq = g->seq;
	if (g->flags & TCP_SYN) {
		if (!h->init) {
			h->init = true;
			h->next = seq + 1;
			h->syn = true;
			h->isn = seq;
		}
		seq++;
		struct half *back = &s->h[tap_dir_reverse(dir)];
		if ((g->flags & TCP_ACK) && !back->init) {
			back->init = true;
			back->next = g->ack;
			back->seen_ts = r->now;
		}
	}
	if (!h->init) {
		h->init = true;
		h->next = seq;
	}
	if ((int32_t)(seq - h->next) <= 0 && (int32_t)(seq + (uint32_t)(g->len + g->lost) - h->next) >= 0)
		h->seen_ts = r->now; /* sent after every byte before `next`, before any after it */
	if ((g->flags & TCP_ACK) && !(g->flags & TCP_SYN))
		peer_acked(r, s, tap_dir_reverse(dir), g->ack, ts);
	if (s->closed)
		return TAP_OK;
	if (g->flags & TCP_RST) {
		drain(r, s, dir, ts);
		flush_holes(r, s, ts);
		enum tap_capture_end how = dir == TAP_C2S ? TAP_CAPTURE_END_CLIENT_RST : TAP_CAPTURE_END_SERVER_RST;
		if (s->fin_seen) /* a reset answering a FIN: the FIN ended the connection */
			how = fin_end(s);
		stream_close(r, s, how, ts);
		return TAP_OK;
	}
	bool fin = (g->flags & TCP_FIN) != 0;
	if (h->fin_done || (g->len + g->lost == 0 && !fin))
		return TAP_OK;
	if (deliver_inorder(r, s, dir, seq, g->payload, g->len, g->lost, fin, ts)) {
		drain(r, s, dir, ts);
	} else {
		int rc = buffer_ahead(r, s, dir, seq, g->payload, g->len, g->lost, fin, ts);
		if (rc < 0)
			return rc;
		skip_acked_holes(r, s, dir, ts); /* a later segment shows acknowledged bytes lost */
	}
	if (s->h[TAP_S2C].fin_done && s->h[TAP_C2S].fin_done)
		stream_close(r, s, fin_end(s), ts);
	return TAP_OK;
}

void tap_reasm_init(struct tap_reasm *r, struct tap_capture_stats *st)
{
	memset(r, 0, sizeof *r);
	r->st = st;
	r->n_ports = 1;
	r->open.link = offsetof(struct stream, by_start);
	r->live.link = offsetof(struct stream, by_age);
	r->dead.link = offsetof(struct stream, by_age);
	r->quiet.link = offsetof(struct stream, by_quiet);
}

void tap_reasm_close_all(struct tap_reasm *r, int64_t ts)
{
	while (r->open.head) {
		struct stream *s = r->open.head;
		flush_holes(r, s, ts);
		stream_close(r, s, s->fin_seen ? fin_end(s) : TAP_CAPTURE_END_CAPTURE, ts);
	}
}

void tap_reasm_deinit(struct tap_reasm *r)
{
	for (size_t i = 0; i < r->tab_size; i++) {
		struct stream *s = r->tab[i];
		while (s) {
			struct stream *next = s->hnext;
			half_clear(r, &s->h[TAP_S2C]);
			half_clear(r, &s->h[TAP_C2S]);
			free(s);
			s = next;
		}
	}
	free(r->tab);
	r->tab = NULL;
	r->wait_head = r->wait_tail = NULL;
}
