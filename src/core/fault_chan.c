/* close-channel (fault_int.h): the client is shown the broker closing the channel of the selected publish
 * (channel.close CODE TEXT, class and method of basic.publish), and the broker's side of it is closed too, so that
 * the protocol stays valid for both peers:
 *
 *   to the broker   channel.close 200 right after the publish's content; the broker's close-ok is swallowed, and
 *                   so is anything else it sends on the channel once the client was shown the close; should the
 *                   broker close the channel itself meanwhile (the closes crossed), the tap answers close-ok
 *   to the client   channel.close at the broker stream's next frame boundary; the client's close-ok is swallowed,
 *                   what it sent on the channel before it is dropped (the broker would ignore it after the close);
 *                   a close of its own crossing ours is answered close-ok
 *   reuse           a client frame on the channel after its close-ok but before the broker's (a channel.open of the
 *                   same number) waits, with everything the client sends after it: the relay stops reading the
 *                   client (TAP_FAULT_CLIENT_WAIT) until the broker's close-ok, then it goes on in order
 *
 * The client is shown channel_closed (mark) for every publish of the channel it had no confirm of when it was
 * shown the close, and for those it sent after it; the broker's own verdicts stay in the records (the observer
 * sees the broker's bytes as they came). */
#include "fault_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char to_broker[] = "amqptap fault injection: close-channel";

static bool both_done(struct tap_fault_conn *fc, struct fchan *c);

static void close_broker(struct tap_fault_conn *fc, struct fchan *c)
{
	uint8_t f[7 + 4 + 2 + 1 + sizeof to_broker + 4 + 1];
	size_t n = tap_fault_close_method(f, sizeof f, 20, c->id, 200, to_broker, 0, 0);
	fault_emit(fc, TAP_C2S, f, n);
}

/* What the broker is owed goes now when the client's stream is between frames, else at its next boundary. */
static void owe_broker(struct tap_fault_conn *fc, struct fchan *c, uint8_t bit)
{
	if (c->fclose & (FC_ANSWER_BROKER | FC_CLOSE_DUE)) {
		c->fclose |= bit;
		return; /* counted already */
	}
	c->fclose |= bit;
	fc->n_answer++;
	if (fc->p[TAP_C2S].n_hdr == 0 && !fc->killing)
		fault_close_answer(fc);
}

void fault_close_start(struct tap_fault_conn *fc, struct fchan *c)
{
	if (!c)
		return;
	c->fclose = FC_CLIENT | FC_BROKER | FC_SHOW;
	/* On a confirm channel the broker's close waits for its confirm of the publish (and so of every one before):
	 * each publish the broker got then has its verdict in the records, and the queues hold what they say. */
	if (c->confirm && c->last_tag < c->pub_seq)
		c->fclose |= FC_CLOSE_WAIT;
	else
		close_broker(fc, c); /* at the client stream's frame boundary: the caller's */
	c->close_seq = c->pub_seq;
	fc->n_fclosed++;
	fc->n_show++;
	char text[TAP_FAULT_CLOSE_TEXT_MAX + 64];
	const char *shown = c->close_text && c->close_text[0] ? c->close_text : text;
	snprintf(text, sizeof text, "%s - amqptap fault injection", tap_fault_close_code_name(c->close_code));
	struct tap_fault_act a = {.rule = c->close_rule, .action = TAP_FAULT_CLOSE_CHANNEL, .channel = c->id,
	                          .seq = c->pub_seq, .code = c->close_code, .text = shown};
	fault_act(fc, &a);
	if (fc->p[TAP_S2C].n_hdr == 0 && !fc->killing) /* the broker's stream is between frames: now */
		fault_close_show(fc);
}

/* channel.close CODE TEXT (basic.publish) to the client; from now on its confirms of the channel are not passed. */
static void show(struct tap_fault_conn *fc, struct fchan *c)
{
	char text[TAP_FAULT_CLOSE_TEXT_MAX + 64];
	if (c->close_text && c->close_text[0])
		snprintf(text, sizeof text, "%s", c->close_text);
	else
		snprintf(text, sizeof text, "%s - amqptap fault injection", tap_fault_close_code_name(c->close_code));
	uint8_t f[7 + 4 + 2 + 1 + 255 + 4 + 1];
	size_t n = tap_fault_close_method(f, sizeof f, 20, c->id, c->close_code, text, 60, 40);
	fault_out(fc, TAP_S2C, f, n);
	c->fclose = (uint8_t)((c->fclose & ~FC_SHOW) | FC_SHOWN);
	if (!c->confirm)
		return;
	for (uint64_t t = c->last_tag + 1; t < c->next_seq && t - c->last_tag <= TAP_FAULT_TAGS_MAX; t++)
		fault_mark(fc, c->id, t, TAP_FAULT_SAW_CHANNEL_CLOSED, c->close_rule);
}

static size_t close_ok(uint8_t f[12], uint16_t ch)
{
	f[0] = FRAME_METHOD;
	put16(f + 1, ch);
	put32(f + 3, 4);
	put16(f + 7, 20);
	put16(f + 9, 41);
	f[11] = FRAME_END;
	return 12;
}

void fault_close_show(struct tap_fault_conn *fc)
{
	fc->n_show = 0;
	for (uint32_t i = 0; i < fc->n_chans;) {
		struct fchan *c = &fc->chans[i];
		if (!(c->fclose & (FC_SHOW | FC_ANSWER_CLIENT))) {
			i++;
			continue;
		}
		if (c->fclose & FC_SHOW)
			show(fc, c);
		if (c->fclose & FC_ANSWER_CLIENT) {
			uint8_t f[12];
			fault_out(fc, TAP_S2C, f, close_ok(f, c->id));
			c->fclose &= (uint8_t)~FC_ANSWER_CLIENT;
		}
		if (!both_done(fc, c))
			i++;
	}
}

void fault_close_answer(struct tap_fault_conn *fc)
{
	fc->n_answer = 0;
	for (uint32_t i = 0; i < fc->n_chans;) {
		struct fchan *c = &fc->chans[i];
		if (!(c->fclose & (FC_ANSWER_BROKER | FC_CLOSE_DUE))) {
			i++;
			continue;
		}
		if (c->fclose & FC_ANSWER_BROKER) {
			uint8_t f[12];
			fault_emit(fc, TAP_C2S, f, close_ok(f, c->id));
		}
		if (c->fclose & FC_CLOSE_DUE)
			close_broker(fc, c);
		c->fclose &= (uint8_t)~(FC_ANSWER_BROKER | FC_CLOSE_DUE);
		if (!both_done(fc, c))
			i++;
	}
}

void fault_close_forget(struct tap_fault_conn *fc, struct fchan *c)
{
	if (c->fclose) {
		fc->n_fclosed--;
		if ((c->fclose & (FC_SHOW | FC_ANSWER_CLIENT)) && fc->n_show)
			fc->n_show--;
		if ((c->fclose & (FC_ANSWER_BROKER | FC_CLOSE_DUE)) && fc->n_answer)
			fc->n_answer--;
	}
	c->fclose = 0;
	free(c->close_text);
	c->close_text = NULL;
}

/* Both peers answered and neither is owed a frame: the channel number is free again, on both sides. True when
 * the channel's state is gone (c points at another channel's then). */
static bool both_done(struct tap_fault_conn *fc, struct fchan *c)
{
	if (c->fclose & (FC_CLIENT | FC_BROKER | FC_SHOW | FC_ANSWER_CLIENT | FC_ANSWER_BROKER | FC_CLOSE_WAIT |
			 FC_CLOSE_DUE))
		return false;
	fault_chan_drop(fc, c->id);
	return true;
}

void fault_close_client_method(struct tap_fault_conn *fc, struct fchan *c, uint16_t cls, uint16_t m,
			       const uint8_t *frame, size_t frame_len)
{
	uint32_t cm = (uint32_t)cls << 16 | m;
	switch (cm) {
	case 20u << 16 | 41: /* its close-ok to the close it was shown: swallowed (the broker had the tap's) */
		c->fclose &= (uint8_t)~FC_CLIENT;
		(void)both_done(fc, c);
		return;
	case 20u << 16 | 40: /* its own close crossed the one it was shown: answered */
		if (!(c->fclose & FC_ANSWER_CLIENT)) {
			if (!(c->fclose & FC_SHOW))
				fc->n_show++;
			c->fclose |= FC_ANSWER_CLIENT;
		}
		if (fc->p[TAP_S2C].n_hdr == 0 && !fc->killing)
			fault_close_show(fc);
		return;
	case 20u << 16 | 10: /* reopened without a close-ok (it took its own close's answer for the end) */
		c->fclose &= (uint8_t)~FC_CLIENT;
		if (c->fclose & FC_BROKER) {
			fc->waiting = fault_keep(&fc->c2s_wait, &fc->c2s_wait_len, frame, frame_len) || fc->waiting;
			return;
		}
		fault_chan_drop(fc, c->id);
		fault_emit(fc, TAP_C2S, frame, frame_len); /* in order: it was not passed, nothing after it */
		return;
	case 60u << 16 | 40: /* a publish the broker never gets: counted by the caller, shown closed */
		c->pub_open = false;
		if (c->pub_seq)
			fault_mark(fc, c->id, c->pub_seq, TAP_FAULT_SAW_CHANNEL_CLOSED, c->close_rule);
		return;
	}
}

bool fault_close_broker_method(struct tap_fault_conn *fc, struct fchan *c, uint16_t cls, uint16_t m,
			       const uint8_t *frame, uint32_t size)
{
	uint32_t cm = (uint32_t)cls << 16 | m;
	if ((cm == (60u << 16 | 80) || cm == (60u << 16 | 120)) && size == 13 && c->confirm) {
		uint64_t tag = get64(frame + 11), top = tag > c->last_tag && tag < c->next_seq ? tag : c->last_tag;
		if (c->fclose & FC_SHOWN) /* dropped: broker_confirm does not see it */
			c->last_tag = top;
		if ((c->fclose & FC_CLOSE_WAIT) && top >= c->close_seq) { /* the publish has its verdict: close now */
			c->fclose &= (uint8_t)~FC_CLOSE_WAIT;
			owe_broker(fc, c, FC_CLOSE_DUE);
		}
		return false;
	}
	if (cm == (20u << 16 | 41)) { /* its close-ok to the tap's close */
		c->fclose &= (uint8_t)~FC_BROKER;
		if (fc->waiting)
			fc->release_wait = true;
		(void)both_done(fc, c);
		return true;
	}
	if (cm == (20u << 16 | 40)) { /* it closed the channel itself (the publish failed): the tap answers */
		bool sent = !(c->fclose & (FC_CLOSE_WAIT | FC_CLOSE_DUE));
		if (!sent) { /* the tap's close is not needed any more: its close-ok ends the broker's side */
			c->fclose &= (uint8_t)~(FC_CLOSE_WAIT | FC_CLOSE_DUE | FC_BROKER);
			if (fc->waiting)
				fc->release_wait = true;
			uint16_t id = c->id;
			owe_broker(fc, c, FC_ANSWER_BROKER); /* may free channels: c is looked up again */
			c = fault_chan_find(fc, id);
			if (c)
				(void)both_done(fc, c);
			return true;
		}
		/* its close-ok to the tap's close is still to come (RabbitMQ answers a close while closing) */
		owe_broker(fc, c, FC_ANSWER_BROKER);
		return true;
	}
	return false;
}

bool fault_close_drops(struct tap_fault_conn *fc, enum tap_dir dir, uint16_t ch)
{
	struct fchan *c = fault_chan_find(fc, ch);
	if (!c || !c->fclose)
		return false;
	if (dir == TAP_S2C)
		return (c->fclose & FC_BROKER) && (c->fclose & FC_SHOWN);
	if (c->fclose & FC_CLIENT)
		return true;
	if (c->fclose & FC_BROKER) {
		fc->waiting = true; /* the client reuses the channel before the broker is done with it */
		return true;
	}
	return false;
}
