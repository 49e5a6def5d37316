/* return and return-after-ack (fault_int.h): a publish the rule selected (mandatory, on a confirm channel) is shown
 * returned although the broker routed it. Its basic.return (312 NO_ROUTE, its exchange and routing key) is made
 * when it is published, and its content frames (header and bodies, as the client framed them: they fit the
 * connection's frame_max) are kept as they pass, up to TAP_FAULT_RETURN_CONTENT_MAX for one publish and
 * TAP_FAULT_RETURN_HELD_MAX for the connection. At the broker's ack of it the Return goes to the client before the
 * ack (return: the order RabbitMQ keeps) or right after it (return-after-ack: the order a client may wrongly rely
 * on never seeing). Shown nothing else after all (and the fault record says why in "skipped"): content over the
 * limits, no memory, a nack from the broker, or a Return of the broker's own on the channel since the publish
 * (the client must never see two Returns of one publish, and which publish the broker's was is not known here). */
#include "fault_int.h"

#include <stdlib.h>
#include <string.h>

static const char *skip_name(uint8_t s)
{
	switch (s) {
	case FSKIP_TOO_LARGE: return "too_large";
	case FSKIP_NO_MEMORY: return "no_memory";
	case FSKIP_BROKER_RETURNED: return "broker_returned";
	case FSKIP_BROKER_NACKED: return "broker_nacked";
	case FSKIP_INCOMPLETE: return "incomplete";
	}
	return NULL;
}

static void ret_free(struct tap_fault_conn *fc, struct fchan *c)
{
	fc->ret_held -= c->ret_len;
	free(c->ret);
	c->ret = NULL;
	c->ret_len = c->ret_cap = 0;
}

/* Room for need more bytes in c->ret within the limits; false (and why in ret_skip) when there is none. */
static bool ret_room(struct tap_fault_conn *fc, struct fchan *c, size_t need)
{
	if (c->ret_skip)
		return false;
	if (c->ret_len + need > TAP_FAULT_RETURN_CONTENT_MAX || fc->ret_held + need > TAP_FAULT_RETURN_HELD_MAX) {
		c->ret_skip = FSKIP_TOO_LARGE;
		ret_free(fc, c);
		return false;
	}
	if (c->ret_len + need > c->ret_cap) {
		size_t cap = c->ret_cap ? c->ret_cap : 256;
		while (cap < c->ret_len + need)
			cap *= 2;
		if (cap > TAP_FAULT_RETURN_CONTENT_MAX)
			cap = TAP_FAULT_RETURN_CONTENT_MAX;
		uint8_t *n = realloc(c->ret, cap);
		if (!n) {
			c->ret_skip = FSKIP_NO_MEMORY;
			ret_free(fc, c);
			return false;
		}
		c->ret = n;
		c->ret_cap = (uint32_t)cap;
	}
	return true;
}

static void ret_put(struct tap_fault_conn *fc, struct fchan *c, const uint8_t *p, size_t len)
{
	memcpy(c->ret + c->ret_len, p, len);
	c->ret_len += (uint32_t)len;
	fc->ret_held += len;
}

void fault_return_select(struct tap_fault_conn *fc, struct fchan *c, const struct tap_fault_rule *r,
			 const uint8_t *ex, size_t ex_len, const uint8_t *rk, size_t rk_len)
{
	(void)r;
	static const char text[] = "NO_ROUTE";
	if (c->pub_return)
		fault_return_done(fc, c, false);
	c->pub_return = true;
	c->ret_skip = FSKIP_NONE;
	fc->n_capturing++;
	size_t payload = 4 + 2 + 1 + (sizeof text - 1) + 1 + ex_len + 1 + rk_len;
	if (!ret_room(fc, c, 7 + payload + 1))
		return;
	uint8_t *f = c->ret;
	f[0] = FRAME_METHOD;
	put16(f + 1, c->id);
	put32(f + 3, (uint32_t)payload);
	put16(f + 7, 60);
	put16(f + 9, 50);
	put16(f + 11, 312);
	uint8_t *q = f + 13;
	*q++ = sizeof text - 1;
	memcpy(q, text, sizeof text - 1);
	q += sizeof text - 1;
	*q++ = (uint8_t)ex_len;
	memcpy(q, ex, ex_len);
	q += ex_len;
	*q++ = (uint8_t)rk_len;
	memcpy(q, rk, rk_len);
	q += rk_len;
	*q++ = FRAME_END;
	c->ret_len = (uint32_t)(q - f);
	fc->ret_held += c->ret_len;
}

void fault_return_frame(struct tap_fault_conn *fc, struct fchan *c, struct fparse *p)
{
	if (!c->pub_open || !ret_room(fc, c, 7 + (size_t)p->size + 1))
		return;
	ret_put(fc, c, p->hdr, 7);
	p->capture = true;
}

void fault_return_bytes(struct tap_fault_conn *fc, uint16_t ch, const uint8_t *data, size_t len)
{
	struct fchan *c = fault_chan_find(fc, ch);
	if (c && c->pub_return && c->ret && !c->ret_skip) /* room was made for the whole frame */
		ret_put(fc, c, data, len);
}

void fault_return_done(struct tap_fault_conn *fc, struct fchan *c, bool complete)
{
	c->pub_return = false;
	fc->n_capturing--;
	if (!complete && !c->ret_skip) {
		c->ret_skip = FSKIP_INCOMPLETE;
		ret_free(fc, c);
	}
	struct ftag *t = NULL;
	for (uint32_t i = c->n_tags; i-- > 0 && !t;)
		if (c->tags[i].tag == c->pub_seq)
			t = &c->tags[i];
	if (!t) {
		ret_free(fc, c);
		return;
	}
	t->skip = c->ret_skip;
	t->content = c->ret; /* its bytes stay counted in ret_held until the tag is freed */
	t->content_len = c->ret_len;
	c->ret = NULL;
	c->ret_len = c->ret_cap = 0;
}

void fault_tag_free(struct tap_fault_conn *fc, struct ftag *t)
{
	if (!t->content)
		return;
	fc->ret_held -= t->content_len;
	free(t->content);
	t->content = NULL;
	t->content_len = 0;
}

void fault_return_forget(struct tap_fault_conn *fc, struct fchan *c)
{
	if (c->pub_return) {
		c->pub_return = false;
		fc->n_capturing--;
	}
	ret_free(fc, c);
}

void fault_return_emit(struct tap_fault_conn *fc, struct fchan *c, uint32_t first, uint32_t last, bool nack,
		       int phase)
{
	enum tap_fault_action want = phase == 0 ? TAP_FAULT_RETURN : TAP_FAULT_RETURN_AFTER_ACK;
	for (uint32_t i = first; i < last; i++) {
		struct ftag *t = &c->tags[i];
		if (t->action != want)
			continue;
		uint8_t skip = t->skip;
		if (!skip && !t->content)
			skip = FSKIP_NO_MEMORY;
		if (!skip && nack)
			skip = FSKIP_BROKER_NACKED;
		if (!skip && c->returns != t->returns_at)
			skip = FSKIP_BROKER_RETURNED;
		if (!skip) {
			fault_out(fc, TAP_S2C, t->content, t->content_len);
			fault_mark(fc, c->id, t->tag,
				   phase == 0 ? TAP_FAULT_SAW_RETURN : TAP_FAULT_SAW_ACK_THEN_RETURN, t->rule);
		}
		struct tap_fault_act a = {.rule = t->rule, .action = want, .channel = c->id, .seq = t->tag,
		                          .skipped = skip_name(skip)};
		fault_act(fc, &a);
		fault_tag_free(fc, t);
	}
}
