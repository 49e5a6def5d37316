/* --fault in the relay path: a session of a proxy with fault rules has a rewriter (src/core/fault_rw.c) that
 * every byte read from either leg goes through before it is forwarded; the observer still sees the bytes as they
 * were read (the records keep what the broker said; the rewriter tells the tracker what the client was shown).
 * A session without rules never comes here (relay.c tests s->fault once per read).
 *
 * The rewriter's asks: bytes held (delay-confirms, latency, bandwidth) are released by s->fault_hold at their due
 * time, with the broker not read while more than TAP_FAULT_HOLD_MAX (latency, bandwidth: TAP_FAULT_SHAPE_MAX)
 * are held for the client, and the client not read while more than TAP_FAULT_SHAPE_MAX are held for the broker;
 * a FIN waits for the bytes held before it (session.c); a kill stops reading the client and ends the
 * session through s->fault_kill, once the broker confirmed the publish it selected or TAP_FAULT_KILL_WAIT_MS
 * passed. Ending a session is never done inside a read (the relay's loop still uses the leg): the timers do it. */
#include "proxy_int.h"

#include "amqptap/log.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <stdlib.h>

static void emit(void *ctx, enum tap_dir dir, const uint8_t *p, size_t len)
{
	struct tap_session *s = ctx;
	tap_relay_forward(&s->leg[dir == TAP_C2S ? SIDE_UPSTREAM : SIDE_CLIENT], p, len);
}

static void mark(void *ctx, uint16_t ch, uint64_t seq, enum tap_fault_saw saw, uint32_t rule)
{
	struct tap_session *s = ctx;
	struct tap_proxy *px = s->px;
	if (px->hooks.fault_mark)
		px->hooks.fault_mark(px->hooks.ctx, s->obs, ch, seq, saw, rule);
}

static void act(void *ctx, const struct tap_fault_act *a)
{
	struct tap_session *s = ctx;
	struct tap_proxy *px = s->px;
	if (px->hooks.fault_act)
		px->hooks.fault_act(px->hooks.ctx, s->obs, s->id, a, tap_now_us());
}

static void io_of(struct tap_session *s, struct tap_fault_io *io)
{
	*io = (struct tap_fault_io){.ctx = s, .emit = emit, .mark = mark, .act = act};
}

/* latency, bandwidth: past TAP_FAULT_SHAPE_MAX of the client's bytes held the client is not read (relay.c's
 * set_reading keeps it so, whoever asks), and is read again once they went (unless something else stops it). */
static void hold_back_client(struct tap_session *s, bool full)
{
	struct leg *client = &s->leg[SIDE_CLIENT], *upstream = &s->leg[SIDE_UPSTREAM];
	bool was = s->fault_full[SIDE_CLIENT];
	s->fault_full[SIDE_CLIENT] = full;
	if (!client->out || full == was)
		return;
	if (full)
		tap_relay_stop_reading(client);
	else if (!client->eof && (!upstream->out || evbuffer_get_length(upstream->out) < TAP_PROXY_HIGH_WATER / 2))
		tap_relay_start_reading(client);
}

/* Acts on what the rewriter asked (tap_fault_feed's and tap_fault_release's bits). */
static void follow(struct tap_session *s, unsigned st, int64_t now)
{
	struct leg *upstream = &s->leg[SIDE_UPSTREAM];
	if ((st & TAP_FAULT_KILL_ARMED) && !s->fault_kill_armed) {
		s->fault_kill_armed = true;
		tap_relay_stop_reading(&s->leg[SIDE_CLIENT]);
		struct timeval wait = {TAP_FAULT_KILL_WAIT_MS / 1000, (TAP_FAULT_KILL_WAIT_MS % 1000) * 1000};
		evtimer_add(s->fault_kill, &wait);
	}
	if ((st & TAP_FAULT_BLOCKED) && !s->fault_blocked && !s->fault_kill_armed) {
		s->fault_blocked = true;
		tap_relay_stop_reading(&s->leg[SIDE_CLIENT]);
		uint32_t ms = tap_fault_block_ms(s->fault);
		struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
		evtimer_add(s->fault_block, &tv);
	}
	if (st & TAP_FAULT_KILL_NOW)
		event_active(s->fault_kill, EV_TIMEOUT, 1); /* after this read: the relay still uses the leg */
	if (st & TAP_FAULT_HOLDING) {
		int64_t due = tap_fault_due(s->fault), in = due > now ? due - now : 0;
		struct timeval tv = {(time_t)(in / 1000000), (suseconds_t)(in % 1000000)};
		evtimer_add(s->fault_hold, &tv);
	}
	s->fault_full[SIDE_UPSTREAM] = st & TAP_FAULT_FULL;
	hold_back_client(s, st & TAP_FAULT_CLIENT_FULL);
	if (upstream->out && !s->closing) {
		if (st & TAP_FAULT_FULL)
			tap_relay_stop_reading(upstream);
		else if (!upstream->reading && !upstream->eof && !s->fault_kill_armed &&
			 (!s->leg[SIDE_CLIENT].out ||
			  evbuffer_get_length(s->leg[SIDE_CLIENT].out) < TAP_PROXY_HIGH_WATER / 2))
			tap_relay_start_reading(upstream); /* the hold was what stopped it */
	}
}

void tap_fault_pass_on(struct leg *from, const void *data, size_t len, int64_t now)
{
	struct tap_session *s = from->s;
	struct tap_fault_io io;
	io_of(s, &io);
	unsigned st = tap_fault_feed(s->fault, from->from_here, data, len, now, &io);
	tap_relay_account_observe(from, data, len, now);
	if (st)
		follow(s, st, now);
}

static void on_hold(evutil_socket_t fd, short what, void *arg)
{
	struct tap_session *s = arg;
	(void)fd;
	(void)what;
	struct tap_fault_io io;
	io_of(s, &io);
	int64_t now = tap_now_us();
	unsigned st = tap_fault_release(s->fault, now, &io);
	follow(s, st, now);
	/* a FIN to pass on, or a closing session, waited for what was held (session.c's drained): it may go now */
	struct leg *client = &s->leg[SIDE_CLIENT];
	if (s->closing || client->eof || s->leg[SIDE_UPSTREAM].eof)
		s->px->up->written(client->eof ? &s->leg[SIDE_UPSTREAM] : client); /* the session may be gone */
}

static void on_block(evutil_socket_t fd, short what, void *arg)
{
	struct tap_session *s = arg;
	(void)fd;
	(void)what;
	struct tap_fault_io io;
	io_of(s, &io);
	int64_t now = tap_now_us();
	unsigned st = tap_fault_unblock(s->fault, now, &io);
	s->fault_blocked = false;
	if (!(st & TAP_FAULT_BLOCKED) && !s->fault_kill_armed && !s->closing)
		tap_relay_start_reading(&s->leg[SIDE_CLIENT]);
	follow(s, st, now);
}

static void on_kill(evutil_socket_t fd, short what, void *arg)
{
	struct tap_session *s = arg;
	(void)fd;
	(void)what;
	tap_session_fault_kill(s, tap_fault_kill_mode(s->fault), 0);
}

bool tap_fault_session_open(struct tap_session *s, const char *client)
{
	struct tap_proxy *px = s->px;
	if (!px->faults)
		return true;
	s->fault = tap_fault_conn_new(px->faults, s->id, client);
	s->fault_hold = evtimer_new(px->base, on_hold, s);
	s->fault_kill = evtimer_new(px->base, on_kill, s);
	s->fault_block = evtimer_new(px->base, on_block, s);
	if (!s->fault || !s->fault_hold || !s->fault_kill || !s->fault_block) {
		tap_fault_session_free(s);
		return false;
	}
	return true;
}

void tap_fault_session_free(struct tap_session *s)
{
	if (s->fault_hold)
		event_free(s->fault_hold);
	if (s->fault_kill)
		event_free(s->fault_kill);
	if (s->fault_block)
		event_free(s->fault_block);
	tap_fault_conn_free(s->fault);
	s->fault = NULL;
	s->fault_hold = s->fault_kill = s->fault_block = NULL;
}
