/* Offline replay (src/DESIGN.md §6): TCP streams from a capture drive one tap_conn each, with capture time as the clock.
 * Streams seen without their SYN are resynchronised on the first plausible AMQP frame (0-9-1 §4.2.3) of each
 * direction; the client side then gets a synthetic protocol header so its decoder starts in frame state. After a
 * capture gap (src/DESIGN.md §6b) the client side is resynchronised the same way, the broker side is given up. */
#include "amqptap/replay.h"

#include "amqptap/capture.h"
#include "amqptap/frame.h"
#include "amqptap/spec.h"
#include "amqptap/status.h"
#include "rd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RESYNC_HOLD_MAX (1u << 20)
#define RESYNC_FRAME_MAX (TAP_FRAME_MAX_DEFAULT - TAP_FRAME_OVERHEAD)

struct rp_dir {
	bool synced;
	bool dead;      /* broker bytes were lost: nothing after them is decoded */
	bool after_gap; /* client bytes were lost: the decoder restarts at the next frame boundary */
	uint64_t pos;   /* the direction's bytes so far, delivered or lost: the stream offset of what comes next */
	struct tap_buf hold;
};

struct rp_stream {
	struct tap_conn *conn;
	struct rp_dir d[TAP_DIR_COUNT];
};

struct replay {
	struct tap_observer *obs;
	struct tap_track *track;
	int64_t now;
	int64_t next_deadline; /* the tracker is ticked only from then on (tap_track_tick's answer) */
	int64_t min_window_us; /* no deadline the tracker creates for new bytes is nearer than this */
	bool started;
	bool due; /* the clock moved: deadlines may have passed (settle_due) */
	int64_t read_at; /* wall clock when the last packet was read, if its time was then (a live capture), else 0 */
	int64_t lag_us;  /* how far behind the wall clock a live capture's clock goes on (on_idle) */
	uint64_t gaps, gap_bytes;
	const struct tap_replay_hooks *hooks;
	struct tap_capture *cap; /* asked what is known (tap_capture_known_until) before a deadline is settled */
};

/* A packet moved the clock on. The deadlines it passed are settled by what the packet brings (settle_due), not
 * here: a gap it shows (bytes missing before it) first ends what those bytes may have decided, `unknown`, so that
 * a Return the capture lost is not taken for a window that ran out (`unproven`); data comes after them. */
static void on_packet(void *ctx, int64_t ts)
{
	struct replay *r = ctx;
	if (!r->started || ts > r->now)
		r->now = ts;
	r->started = true;
	r->due = true;
	if (r->hooks && r->hooks->clock) {
		int64_t wall = r->hooks->clock(r->hooks->ctx);
		r->read_at = wall - ts < TAP_REPLAY_LIVE_US && ts - wall < TAP_REPLAY_LIVE_US ? wall : 0;
		if (r->read_at && wall - ts + TAP_REPLAY_LIVE_SLACK_US > r->lag_us)
			r->lag_us = wall - ts + TAP_REPLAY_LIVE_SLACK_US; /* the next may come as late */
	}
}

/* Deadlines are settled up to the packet's time, or only up to what the capture knows while bytes a peer
 * acknowledged are awaited (TAP_CAPTURE_REORDER_US): those may hold a Return that decides a publish whose window
 * ends meanwhile, and as a gap they end it `unknown`. The rest stays due for when they came or were given up. */
static void settle_due(struct replay *r)
{
	if (!r->due)
		return;
	int64_t until = r->now;
	int64_t known = r->cap ? tap_capture_known_until(r->cap) : INT64_MAX;
	if (known < until)
		until = known;
	else
		r->due = false;
	if (until >= r->next_deadline)
		r->next_deadline = tap_track_tick(r->track, until);
}

/* The tracker was handed something at r->now: a deadline it made is no nearer than the shortest window. */
static void fed(struct replay *r)
{
	if (r->now + r->min_window_us < r->next_deadline)
		r->next_deadline = r->now + r->min_window_us;
}

static void *on_open(void *ctx, uint64_t id, const char *client, const char *server, bool midstream, int64_t ts)
{
	struct replay *r = ctx;
	settle_due(r);
	struct rp_stream *s = calloc(1, sizeof *s);
	if (!s) {
		tap_track_conn_unfollowed(r->track);
		return NULL;
	}
	/* at its first packet's time: the capture opens a stream for us at its first byte (the SYN came earlier) */
	s->conn = tap_conn_new(r->obs, id, client, server, ts < r->now ? ts : r->now);
	if (!s->conn) { /* counted unfollowed; its packets are read and left */
		free(s);
		return NULL;
	}
	if (midstream)
		tap_conn_start_unseen(s->conn, r->now);
	fed(r);
	for (int d = 0; d < TAP_DIR_COUNT; d++) {
		s->d[d].synced = !midstream;
		tap_buf_init(&s->d[d].hold);
	}
	return s;
}

static bool known_class(uint16_t cls)
{
	switch (cls) {
	case TAP_CLASS_CONNECTION:
	case TAP_CLASS_CHANNEL:
	case TAP_CLASS_EXCHANGE:
	case TAP_CLASS_QUEUE:
	case TAP_CLASS_BASIC:
	case TAP_CLASS_CONFIRM:
	case TAP_CLASS_TX:
		return true;
	default:
		return false;
	}
}

/* Offset of the first plausible frame start (§4.2.3: a method frame of a known class, or a heartbeat, whose end
 * octet is in place and whose successor, when already here, has a valid type); -1 when none is certain yet. */
static long find_frame(const uint8_t *p, size_t len, enum tap_dir dir, size_t *keep_from)
{
	if (dir == TAP_C2S && len >= 4 && memcmp(p, "AMQP", 4) == 0)
		return 0;
	size_t i;
	for (i = 0; i + TAP_FRAME_HEADER_SIZE <= len; i++) {
		uint8_t type = p[i];
		uint16_t ch = tap_be16(p + i + 1);
		uint32_t size = tap_be32(p + i + 3);
		if (type == TAP_FRAME_HEARTBEAT) {
			if (ch != 0 || size != 0)
				continue;
		} else if (type != TAP_FRAME_METHOD || size < 4 || size > RESYNC_FRAME_MAX) {
			continue;
		}
		size_t end = i + TAP_FRAME_HEADER_SIZE + size;
		if (end >= len)
			break; /* a candidate we cannot check yet */
		if (type == TAP_FRAME_METHOD && !known_class(tap_be16(p + i + 7)))
			continue;
		if (p[end] != TAP_FRAME_END)
			continue;
		if (end + 1 < len) {
			uint8_t next = p[end + 1];
			if (next != TAP_FRAME_METHOD && next != TAP_FRAME_HEADER && next != TAP_FRAME_BODY &&
			    next != TAP_FRAME_HEARTBEAT)
				continue;
		}
		return (long)i;
	}
	*keep_from = i;
	return -1;
}

static void resync(struct rp_stream *s, enum tap_dir dir, const uint8_t *data, size_t len, int64_t now)
{
	struct rp_dir *d = &s->d[dir];
	tap_buf_append(&d->hold, data, len);
	size_t keep_from = 0;
	long at = find_frame((const uint8_t *)d->hold.data, d->hold.len, dir, &keep_from);
	if (at < 0) {
		if (d->hold.len > RESYNC_HOLD_MAX || d->hold.oom)
			keep_from = d->hold.len; /* nothing plausible in a megabyte: drop it and keep looking */
		memmove(d->hold.data, d->hold.data + keep_from, d->hold.len - keep_from);
		d->hold.len -= keep_from;
		d->hold.oom = false;
		return;
	}
	d->synced = true;
	const uint8_t *p = (const uint8_t *)d->hold.data + at;
	size_t n = d->hold.len - (size_t)at;
	if (dir == TAP_C2S && !d->after_gap && (n < 4 || memcmp(p, "AMQP", 4) != 0))
		tap_conn_feed(s->conn, TAP_C2S, (const uint8_t *)"AMQP\0\0\x09\x01", 8, now);
	tap_conn_feed(s->conn, dir, p, n, now);
	tap_buf_deinit(&d->hold);
}

static void on_data(void *ctx, void *user, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts)
{
	struct replay *r = ctx;
	struct rp_stream *s = user;
	(void)ts;
	settle_due(r);
	if (!s)
		return;
	s->d[dir].pos += len;
	if (!s->conn || s->d[dir].dead)
		return;
	if (s->d[dir].synced)
		tap_conn_feed(s->conn, dir, data, len, r->now);
	else
		resync(s, dir, data, len, r->now);
	fed(r);
}

static void on_gap(void *ctx, void *user, enum tap_dir dir, uint64_t missing, int64_t ts)
{
	struct replay *r = ctx;
	struct rp_stream *s = user;
	(void)ts;
	if (!s) {
		settle_due(r);
		return;
	}
	r->gaps++;
	r->gap_bytes += missing;
	struct rp_dir *d = &s->d[dir];
	tap_conn_gap(s->conn, dir, d->pos, missing, r->now);
	d->pos += missing;
	fed(r);
	settle_due(r); /* after the gap: see on_packet */
	if (dir == TAP_S2C) {
		d->dead = true;
		return;
	}
	d->synced = false;
	d->after_gap = true;
	tap_buf_reset(&d->hold);
}

static void on_close(void *ctx, void *user, enum tap_capture_end how, int64_t ts)
{
	static const char *const reason[] = {
		[TAP_CAPTURE_END_CLIENT_FIN] = "client_eof",   [TAP_CAPTURE_END_SERVER_FIN] = "broker_eof",
		[TAP_CAPTURE_END_CLIENT_RST] = "client_reset", [TAP_CAPTURE_END_SERVER_RST] = "broker_reset",
		[TAP_CAPTURE_END_CAPTURE] = "capture_end",     [TAP_CAPTURE_END_IDLE] = "capture_idle",
		[TAP_CAPTURE_END_LIMIT] = "capture_limit",
	};
	struct replay *r = ctx;
	struct rp_stream *s = user;
	(void)ts;
	settle_due(r);
	if (!s)
		return;
	if (s->conn)
		tap_conn_end(s->conn, reason[how], r->now);
	fed(r);
	for (int d = 0; d < TAP_DIR_COUNT; d++)
		tap_buf_deinit(&s->d[d].hold);
	free(s);
}

/* A pipe waits for packets. One from a live capture (`tcpdump -U -w - | amqptap replay -`: its packets are read
 * when they are captured) has its clock go on meanwhile, lag_us behind the wall clock (TAP_REPLAY_LIVE_LAG_US or
 * more), so that a verdict held for a window is written once the window is over, not at the next packet, which on a
 * quiet link may be the next heartbeat. An old capture through a pipe keeps its own time. */
static void on_idle(void *ctx)
{
	struct replay *r = ctx;
	if (r->read_at) {
		int64_t now = r->now + (r->hooks->clock(r->hooks->ctx) - r->read_at) - r->lag_us;
		if (now > r->now) {
			r->read_at += now - r->now;
			r->now = now;
			r->due = true;
			tap_capture_advance(r->cap, now); /* awaited bytes still missing by now are a gap first */
			settle_due(r);
		}
	}
	if (r->hooks && r->hooks->idle)
		r->hooks->idle(r->hooks->ctx);
}

static bool on_stop(void *ctx)
{
	struct replay *r = ctx;
	return r->hooks && r->hooks->stop && r->hooks->stop(r->hooks->ctx);
}

int tap_replay_capture(struct tap_capture *c, uint16_t port, struct tap_observer *obs, struct tap_track *track,
		       const struct tap_replay_hooks *hooks, struct tap_replay_stats *stats, char *err, size_t cap)
{
	if (stats)
		*stats = (struct tap_replay_stats){0};
	struct replay r = {.obs = obs, .track = track, .hooks = hooks, .min_window_us = hooks ? hooks->min_window_us : 0,
	                   .lag_us = TAP_REPLAY_LIVE_LAG_US, .cap = c};
	struct tap_capture_cb cb = {
		.ctx = &r, .packet = on_packet, .open = on_open, .data = on_data, .gap = on_gap, .close = on_close,
		.idle = on_idle, .stop = on_stop,
	};
	for (size_t i = 0; hooks && i < hooks->n_ports; i++) {
		if (tap_capture_add_port(c, hooks->ports[i]) < 0) {
			snprintf(err, cap, "more than %u --port", TAP_CAPTURE_MAX_PORTS);
			return TAP_E_USAGE;
		}
	}
	int rc = tap_capture_run(c, port, &cb, err, cap);
	tap_track_tick(track, r.now);
	tap_track_shutdown(track, r.now);
	if (stats) {
		*stats = (struct tap_replay_stats){.gaps = r.gaps, .gap_bytes = r.gap_bytes};
		tap_capture_get_stats(c, &stats->capture);
	}
	return rc;
}

int tap_replay_run_mem(const void *data, size_t len, const char *name, uint16_t port, struct tap_observer *obs,
		       struct tap_track *track, struct tap_replay_stats *stats, char *err, size_t cap)
{
	struct tap_capture *c;
	if (stats)
		*stats = (struct tap_replay_stats){0};
	int rc = tap_capture_open_mem(&c, data, len, name, err, cap);
	if (rc < 0)
		return rc;
	rc = tap_replay_capture(c, port, obs, track, NULL, stats, err, cap);
	tap_capture_free(c);
	return rc;
}

struct tap_replay_live {
	struct replay r;
	struct tap_capture_cb cb;
	struct tap_capture *c;
};

int tap_replay_live_new(struct tap_replay_live **out, const uint16_t *ports, size_t n_ports, int64_t min_window_us,
			struct tap_observer *obs, struct tap_track *track)
{
	*out = NULL;
	struct tap_replay_live *l = calloc(1, sizeof *l);
	if (!l)
		return TAP_E_NOMEM;
	l->r = (struct replay){.obs = obs, .track = track, .min_window_us = min_window_us, .lag_us = TAP_REPLAY_LIVE_LAG_US};
	l->cb = (struct tap_capture_cb){
		.ctx = &l->r, .packet = on_packet, .open = on_open, .data = on_data, .gap = on_gap, .close = on_close,
	};
	if (n_ports == 0 || n_ports > TAP_CAPTURE_MAX_PORTS) {
		free(l);
		return TAP_E_USAGE;
	}
	int rc = tap_capture_new_push(&l->c, ports[0], &l->cb);
	if (rc < 0) {
		free(l);
		return rc;
	}
	l->r.cap = l->c;
	for (size_t i = 1; i < n_ports; i++)
		(void)tap_capture_add_port(l->c, ports[i]); /* within TAP_CAPTURE_MAX_PORTS: checked above */
	*out = l;
	return TAP_OK;
}

int tap_replay_live_packet(struct tap_replay_live *l, uint32_t linktype, int64_t ts_us, const uint8_t *packet,
			   size_t caplen, size_t wire_len)
{
	return tap_capture_push(l->c, linktype, ts_us, packet, caplen, wire_len);
}

void tap_replay_live_advance(struct tap_replay_live *l, int64_t now_us)
{
	if (l && l->r.started) {
		on_packet(&l->r, now_us);
		tap_capture_advance(l->c, l->r.now);
		settle_due(&l->r);
	}
}

void tap_replay_live_end(struct tap_replay_live *l, int64_t now_us, struct tap_replay_stats *stats)
{
	if (stats)
		*stats = (struct tap_replay_stats){0};
	if (!l)
		return;
	if (now_us > l->r.now)
		l->r.now = now_us;
	tap_capture_end_all(l->c);
	tap_track_tick(l->r.track, l->r.now);
	tap_track_shutdown(l->r.track, l->r.now);
	tap_capture_free(l->c);
	if (stats)
		*stats = (struct tap_replay_stats){.gaps = l->r.gaps, .gap_bytes = l->r.gap_bytes};
	free(l);
}
